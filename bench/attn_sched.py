#!/usr/bin/env python3
"""bench/attn_sched.py — a model of the causal attention kernels' block order
(src/ops/cuda/attn_sched.cuh): list scheduling of a launch's blocks, in the
order the GPU dispatches them (blockIdx.x fastest), on SMS x BLOCKS slots.

A block's time is its tiles of work plus a fixed part (loading its own tile,
writing its output: OVERHEAD tiles): the forward's query tile i does i + 1
key tiles. The makespan is printed over the ideal (all work / slots):

    python3 bench/attn_sched.py [--sms 132] [--l2-mib 50]

Rows: the benchmarks' attention forward launches (v3/v4: 128 query rows a
block) for the old order (the tile fastest, pair after pair), the new one
(groups of pairs within a third of the L2, longest tile first inside a
group) and longest first over the whole grid (no groups; the L2 ignored).
A model, not a measurement: equal tiles, no L2, in-order dispatch; the next
GPU's kernel times say how much of the difference is real.
"""
import argparse
import heapq


def makespan(order, slots):
    """list scheduling: each block starts on the first slot that frees"""
    free = [0.0] * slots
    end = 0.0
    for d in order:
        t = heapq.heappop(free) + d
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def group_pairs(pairs, pair_bytes, budget):
    """attn_sched.cuh's mt_attn_group_pairs: the largest divisor of pairs within the budget"""
    most = min(pairs, budget // pair_bytes) if pair_bytes > 0 else pairs
    for g in range(int(most), 1, -1):
        if pairs % g == 0:
            return g
    return 1


OVERHEAD = 0.5


def orders(B, H, n_tiles, G):
    work = [i + 1 + OVERHEAD for i in range(n_tiles)]   # tile i's work (forward: i + 1 key tiles)
    P = B * H
    old = [work[i] for p in range(P) for i in reversed(range(n_tiles))]
    new = [work[n_tiles - 1 - r] for z in range(P // G) for r in range(n_tiles) for x in range(G)]
    lpt = [work[i] for i in reversed(range(n_tiles)) for p in range(P)]
    return old, new, lpt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--l2-mib", type=float, default=50)
    a = ap.parse_args()
    budget = int(a.l2_mib * (1 << 20)) // 3
    configs = [   # name, B, H (query heads), T, head dim
        ("gpu_d2048_dense (hd 128)", 4, 16, 2048, 128),
        ("gpu_c_gpt2_124m (hd 64)", 16, 12, 1024, 64),
        ("T 8192, B 1, H 32 (hd 128)", 1, 32, 8192, 128),
    ]
    print("%-28s %6s %3s %6s %6s %6s %6s" % ("forward, 128-row tiles", "blocks", "G", "an SM", "old", "new", "lpt"))
    for name, B, H, T, hd in configs:
        n_tiles = (T + 127) // 128
        G = group_pairs(B * H, 4 * T * hd, budget)
        old, new, lpt = orders(B, H, n_tiles, G)
        assert sorted(old) == sorted(new) == sorted(lpt)
        for per_sm in (1, 2):
            slots = a.sms * per_sm
            ideal = sum(old) / slots
            print("%-28s %6d %3d %6d %6.3f %6.3f %6.3f" % (name, len(old), G, per_sm, makespan(old, slots) / ideal,
                                                        makespan(new, slots) / ideal, makespan(lpt, slots) / ideal))


if __name__ == "__main__":
    main()
