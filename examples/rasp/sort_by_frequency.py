"""sort by frequency: the values ordered by how often they occur, most frequent first (tracr's lib.make_sort_freq).

hist (SelectorWidth: L0H0 + L0MLP) → the sort key −hist (L1MLP) → smaller = SelectorWidth over the keys (L2H0 + L2MLP)
with ties broken by position → Aggregate of tokens by target position (L3H0).
"""

from tracr.compiler import lib

max_seq_len = 4
program = lib.make_sort_freq(max_seq_len)
vocab = {"a", "b", "c"}
