"""shift by two: the value two positions back, through two attention layers (a previous-token head read by another).

prev = Aggregate(previous, tokens) (L0H0); prev2 = Aggregate(previous, prev) (L1H0). Positions 0 and 1 read
position 0.
"""

from tracr.rasp import rasp

previous = rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == q - 1 or (q == 0 and k == 0)).named("previous")
prev = rasp.categorical(rasp.Aggregate(previous, rasp.tokens)).named("prev")
program = rasp.categorical(rasp.Aggregate(previous, prev)).named("prev2")
vocab = {0, 1, 2, 3}
max_seq_len = 5
