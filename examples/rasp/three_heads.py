"""three heads in one layer, combined by MLPs in two layers.

first (k == 0), second (k == 1) and prev (k == q − 1) are three heads of layer 0; a = first + prev is layer 0's MLP;
out = a · second mod 5 needs a, so it is the MLP of layer 1.
"""

from tracr.rasp import rasp

idx = rasp.indices
first = rasp.categorical(rasp.Aggregate(rasp.Select(idx, idx, lambda k, q: k == 0), rasp.tokens)).named("first")
second = rasp.categorical(rasp.Aggregate(rasp.Select(idx, idx, lambda k, q: k == 1), rasp.tokens)).named("second")
previous = rasp.Select(idx, idx, lambda k, q: k == q - 1 or (q == 0 and k == 0)).named("previous")
prev = rasp.categorical(rasp.Aggregate(previous, rasp.tokens)).named("prev")
a = rasp.categorical(rasp.SequenceMap(lambda x, y: x + y, first, prev)).named("first_plus_prev")
program = rasp.categorical(rasp.SequenceMap(lambda x, y: (x * y) % 5, a, second)).named("three_heads")
vocab = {0, 1, 2, 3}
max_seq_len = 5
