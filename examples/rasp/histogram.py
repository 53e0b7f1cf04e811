"""histogram: at each position, how many positions hold the same value (tracr's lib.make_hist).

One SelectorWidth over Select(tokens, tokens, ==): an attention head (L0H0) and the MLP reading its output (L0MLP).
"""

from tracr.compiler import lib

program = lib.make_hist()
vocab = {"a", "b", "c"}
max_seq_len = 5
