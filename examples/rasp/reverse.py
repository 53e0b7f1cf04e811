"""reverse: each position gets the value at the mirrored position (tracr's lib.make_reverse).

length (SelectorWidth: L0H0 + L0MLP) → opp_idx = length − indices (L1MLP) → opp_idx − 1 (L2MLP) → Aggregate over
Select(indices, opp_idx − 1, ==) of tokens (L3H0). At the last position the answer is the first value.
"""

from tracr.compiler import lib
from tracr.rasp import rasp

program = lib.make_reverse(rasp.tokens)
vocab = {0, 1, 2, 3}
max_seq_len = 5
