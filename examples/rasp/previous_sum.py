"""previous-token sum: each value plus the one before it (the first position adds itself).

prev = Aggregate(Select(indices, indices, k == q − 1, or k == q at 0), tokens) (L0H0); out = tokens + prev (L0MLP).
"""

from tracr.rasp import rasp

previous = rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == q - 1 or (q == 0 and k == 0)).named("previous")
prev = rasp.categorical(rasp.Aggregate(previous, rasp.tokens)).named("prev")
program = rasp.categorical(rasp.SequenceMap(lambda x, y: x + y, rasp.tokens, prev)).named("prev_sum")
vocab = {0, 1, 2, 3}
max_seq_len = 5
