"""two branches: the first value plus the previous value, two heads in one layer feeding one MLP.

first = Aggregate(Select(indices, indices, k == 0), tokens) and prev (as in previous_sum) are two heads of layer 0;
out = first + prev is the MLP of layer 0.
"""

from tracr.rasp import rasp

at_first = rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == 0).named("at_first")
previous = rasp.Select(rasp.indices, rasp.indices, lambda k, q: k == q - 1 or (q == 0 and k == 0)).named("previous")
first = rasp.categorical(rasp.Aggregate(at_first, rasp.tokens)).named("first")
prev = rasp.categorical(rasp.Aggregate(previous, rasp.tokens)).named("prev")
program = rasp.categorical(rasp.SequenceMap(lambda a, b: a + b, first, prev)).named("first_plus_prev")
vocab = {0, 1, 2, 3}
max_seq_len = 5
