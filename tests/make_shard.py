#!/usr/bin/env python3
"""Write an llm.c token shard for tests: make_shard.py OUT N VOCAB [pattern|random] [magic] [version] [count_delta]."""
import random, struct, sys

out, n, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
kind = sys.argv[4] if len(sys.argv) > 4 else "pattern"
magic = int(sys.argv[5]) if len(sys.argv) > 5 else 20240520
version = int(sys.argv[6]) if len(sys.argv) > 6 else 1
count_delta = int(sys.argv[7]) if len(sys.argv) > 7 else 0
rng = random.Random(1234)
if kind == "pattern":      # a short repeated phrase: loss must fall fast
    phrase = [rng.randrange(1, vocab) for _ in range(11)]
    toks = [phrase[i % len(phrase)] for i in range(n)]
else:
    toks = [rng.randrange(0, vocab) for _ in range(n)]
header = [0] * 256
header[0], header[1], header[2] = magic, version, n + count_delta
with open(out, "wb") as f:
    f.write(struct.pack("<256i", *header))
    f.write(struct.pack("<%dH" % n, *toks))
