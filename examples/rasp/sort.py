"""sort: the values in increasing order (tracr's lib.make_sort_unique; the values are their own keys).

smaller = SelectorWidth(Select(tokens, tokens, <)) (L0H0 + L0MLP), target_pos = smaller; the output at position i is
the value whose target position is i (Aggregate, L1H0). At the last position: the largest value, when all differ.
"""

from tracr.compiler import lib
from tracr.rasp import rasp

program = lib.make_sort_unique(rasp.tokens, rasp.tokens)
vocab = {0, 1, 2, 3, 4, 5, 6}
max_seq_len = 4
