/*
 * embed.cu — token embedding lookup and its scatter-add backward.
 *
 * Backward without float atomics, in the cpu backend's order:
 *   1. keys[i] = (idx[i] << 32) | i, padded with ~0 to a power of two P,
 *      bitonic-sorted ascending (log2(P)(log2(P)+1)/2 compare-exchange
 *      passes): tokens grouped, positions increasing inside a group. Where
 *      the P keys fit in one block's shared memory (P <= 16384 on an H100:
 *      the GPT-2 and d2048 batches) one block runs every pass there
 *      (bitonic_smem_k: one launch, a barrier a pass); else a launch a pass
 *      over global memory (105 launches at P 16384). The same passes, so
 *      the same sorted keys (they are distinct: the position is in them);
 *   2. one block per sorted position that starts a group (and a column
 *      slice): acc = dwte[v][c]; acc += dout[n][c] for the group's n in
 *      increasing order; dwte[v][c] = acc. The group's rows are loaded
 *      EMB_AHEAD at a time before they are added (a frequent token's
 *      group is hundreds of rows: one memory round trip a row otherwise).
 * Every dwte element is thus summed in token order exactly as the cpu loop
 * does ((dwte + g_n1) + g_n2) + ... : bit-identical sums, deterministic.
 */
#include "cuda_impl.cuh"

#define THREADS 256

static __global__ void embed_fwd_k(float *out, const int32_t *idx, const float *wte, int N, int C)
{
    int n = blockIdx.x;
    const float *src = wte + (size_t)idx[n] * (size_t)C;
    float *dst = out + (size_t)n * (size_t)C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
}

static __global__ void keys_k(uint64_t *keys, const int32_t *idx, int N, size_t P)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < P; i += (size_t)gridDim.x * blockDim.x)
        keys[i] = i < (size_t)N ? ((uint64_t)(uint32_t)idx[i] << 32) | (uint64_t)i : ~(uint64_t)0;
}

/* one bitonic compare-exchange pass (stage k, distance j) */
static __global__ void bitonic_k(uint64_t *keys, size_t P, size_t j, size_t k)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < P; i += (size_t)gridDim.x * blockDim.x) {
        size_t l = i ^ j;
        if (l <= i) continue;
        uint64_t a = keys[i], b = keys[l];
        int up = (i & k) == 0;
        if ((up && a > b) || (!up && a < b)) {
            keys[i] = b;
            keys[l] = a;
        }
    }
}

/* the whole sort in one block's shared memory (P keys): keys_k's keys, then
 * bitonic_k's passes in its order, a barrier after each */
#define SORT_THREADS 1024
static __global__ void bitonic_smem_k(uint64_t *keys, const int32_t *idx, int N, size_t P)
{
    MT_DYN_SMEM(uint64_t, sk);
    for (size_t i = threadIdx.x; i < P; i += blockDim.x)
        sk[i] = i < (size_t)N ? ((uint64_t)(uint32_t)idx[i] << 32) | (uint64_t)i : ~(uint64_t)0;
    __syncthreads();
    for (size_t k = 2; k <= P; k <<= 1)
        for (size_t j = k >> 1; j > 0; j >>= 1) {
            for (size_t i = threadIdx.x; i < P; i += blockDim.x) {
                const size_t l = i ^ j;
                if (l <= i) continue;
                const uint64_t a = sk[i], b = sk[l];
                const int up = (i & k) == 0;
                if ((up && a > b) || (!up && a < b)) {
                    sk[i] = b;
                    sk[l] = a;
                }
            }
            __syncthreads();
        }
    for (size_t i = threadIdx.x; i < P; i += blockDim.x) keys[i] = sk[i];
}

#define EMB_AHEAD 8
static __global__ void embed_bwd_k(float *dwte, const float *dout, const uint64_t *keys, int N, int C)
{
    int i = blockIdx.x;
    uint32_t tok = (uint32_t)(keys[i] >> 32);
    if (i > 0 && (uint32_t)(keys[i - 1] >> 32) == tok) return;  /* not the start of a group */
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float *d = dwte + (size_t)tok * (size_t)C + c;
    float acc = *d;
    /* the group is a run of the sorted keys: a row's key matching means every
     * one before it in the run matched, so adding the taken ones in order is
     * the plain loop's order */
    for (int m = i;; m += EMB_AHEAD) {
        float v[EMB_AHEAD];
        int take[EMB_AHEAD];
#pragma unroll
        for (int u = 0; u < EMB_AHEAD; u++) {
            const uint64_t key = m + u < N ? keys[m + u] : ~(uint64_t)0;
            take[u] = (uint32_t)(key >> 32) == tok;
            v[u] = take[u] ? dout[(size_t)(key & 0xffffffffu) * (size_t)C + c] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < EMB_AHEAD; u++)
            if (take[u]) acc += v[u];
        if (!take[EMB_AHEAD - 1]) break;
    }
    *d = acc;
}

/* out (N,C) = wte (V,C) [idx[n]]   (=) */
extern "C" void mt_cuda_embed_forward(void *be, float *out, const int32_t *idx, const float *wte, int N, int C)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    if (N <= 0 || C <= 0) return;
    MT_LAUNCH(embed_fwd_k, N, THREADS, 0)(out, idx, wte, N, C);
    MT_CUDA_KCHECK();
}

/* dwte[idx[n], :] += dout[n, :]   (+=, token order) */
extern "C" void mt_cuda_embed_backward(void *be, float *dwte, const float *dout, const int32_t *idx, int N, int C, int V)
{
    MT_CUDA_BIND(be);   /* this call acts on its own instance (docs/cuda.md, "The backend handle") */
    (void)V;
    if (N <= 0 || C <= 0) return;
    size_t P = 1;
    while (P < (size_t)N) P <<= 1;
    uint64_t *keys = (uint64_t *)mt_cuda_workspace(P * sizeof(uint64_t));
    if (!keys) return;
    const size_t smem = P * sizeof(uint64_t);
    if (smem <= (size_t)mt_cuda_be->smem_optin_bytes && mt_cuda_smem_opt_in(bitonic_smem_k, smem)) {
        MT_LAUNCH(bitonic_smem_k, 1, SORT_THREADS, smem)(keys, idx, N, P);
        MT_CUDA_KCHECK();
    } else {
        unsigned nb = mt_cuda_blocks(P, THREADS);
        MT_LAUNCH(keys_k, nb, THREADS, 0)(keys, idx, N, P);
        MT_CUDA_KCHECK();
        for (size_t k = 2; k <= P; k <<= 1)
            for (size_t j = k >> 1; j > 0; j >>= 1) {
                MT_LAUNCH(bitonic_k, nb, THREADS, 0)(keys, P, j, k);
                MT_CUDA_KCHECK();
            }
    }
    dim3 grid((unsigned)N, (unsigned)((C + THREADS - 1) / THREADS));
    MT_LAUNCH(embed_bwd_k, grid, THREADS, 0)(dwte, dout, keys, N, C);
    MT_CUDA_KCHECK();
}
