/*
 * attn_sched.cuh — the order the causal attention kernels' blocks run in:
 * longest tiles first, in groups of (batch, head) pairs sized to the L2.
 *
 * Causal blocks do unequal work: the forward's (and dQ's) query tile i sees
 * i + 1 key tiles, the dK/dV kernels' key tile j sees n - j query tiles. On a
 * grid (tile, head, batch), the tile fastest, each pair ran its tiles longest
 * first but the pairs one after another, so the last pairs' longest tiles
 * were dispatched near the grid's end and ran on alone after the other SMs
 * had finished. List scheduling of d2048's forward (B 4, H 16, T 2048, 16
 * tiles of 128 rows) on 132 SMs: 1.14x the ideal makespan at one block an
 * SM, 1.30x at two (bench/attn_sched.py prints the benchmarks' shapes).
 * Longest first over the whole grid (every pair's tile n - 1, then every
 * pair's n - 2, ...) ends within ~3%, but keeps every pair's operands in
 * flight at once (d2048's K and V: 64 MB; an H100's L2 holds 50), where the
 * old order re-read a few pairs' from the L2. So the pairs go in groups whose
 * re-read operands (pair_bytes: K and V for the forward) total at most a
 * third of the device's L2 (MT_CUDA_ATTN_GROUP_KIB overrides), longest tile
 * first within a group, the groups one after the other: 1.00-1.03x the ideal
 * in the model at the benchmarks' shapes.
 *
 * The grid is (G, n_tiles, pairs / G): the block's pair is blockIdx.z G +
 * blockIdx.x and its rank blockIdx.y (0: the pair's longest tile), so the
 * dispatch order (x fastest) is the one above. (y's limit of 65535 tiles is
 * T of 4 Mi tokens at 64 rows a tile; the old grid's x allowed more, no run
 * here comes near: its dS tiles alone would be T^2 bytes a head.) G is the
 * largest divisor of pairs within the budget (no padding blocks; a prime
 * count of pairs over the budget gets groups of one pair, the old order). A 1-D grid decoded
 * by divisions cost ptxas up to 5 registers more (v3's dQ at hd 128: 167 ->
 * 172, a block an SM less); this costs ~1. Every (rank, pair) runs once and
 * computes what the same tile computed before: the same bits
 * (test_attn_bf16 runs again with groups of a few pairs; the logs compare).
 */
#ifndef MT_ATTN_SCHED_CUH
#define MT_ATTN_SCHED_CUH

/* G: the largest divisor of pairs with G pair_bytes <= budget (at least 1;
 * larger where pairs / G would pass a grid's z limit of 65535) */
static inline int mt_attn_group_pairs(int pairs, long long pair_bytes, long long budget)
{
    long long most = pair_bytes > 0 ? budget / pair_bytes : pairs;
    if (most > pairs) most = pairs;
    int G = 1;
    for (int g = (int)most; g > 1; g--)
        if (pairs % g == 0) {
            G = g;
            break;
        }
    while (pairs / G > 65535)
        for (G++; pairs % G; G++) {}
    return G;
}

struct mt_attn_slot {
    int rank;   /* 0: the pair's longest tile */
    int pair;   /* b x (heads) + head */
};

/* this block's slot on a grid made by mt_attn_grid */
static __device__ __forceinline__ struct mt_attn_slot mt_attn_block_slot(void)
{
    struct mt_attn_slot s;
    s.rank = (int)blockIdx.y;
    s.pair = (int)(blockIdx.z * gridDim.x + blockIdx.x);
    return s;
}

/* the grid of a launch over n_tiles x pairs blocks, each pair re-reading
 * pair_bytes (the budget: the backend's attn_group_bytes, set at creation) */
static inline dim3 mt_attn_grid(int n_tiles, int pairs, long long pair_bytes)
{
    const int G = mt_attn_group_pairs(pairs, pair_bytes, mt_cuda_be->attn_group_bytes);
    return dim3((unsigned)G, (unsigned)n_tiles, (unsigned)(pairs / G));
}

#endif
