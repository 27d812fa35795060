/* examples/pairwise_preference.cu — a Bradley-Terry / hinge preference loss over flat pairs with
 * histogram budget and coverage penalties, built only from lossfuse's two headers.
 *
 * Build and run (from the repository root; meson does the same, see README.md):
 *     nvcc -O3 -std=c++17 -arch=sm_90 -I. examples/pairwise_preference.cu -o pairwise_preference
 *     ./pairwise_preference [items=2000] [pairs=20000] [bt|hinge] [fast|det]
 *
 * What it does (the loss of lossfuse.h section 9c, lf_ref_pairwise_preference)
 *   Scores s [S] of items (spans, variants, candidates); pairs (i, j) with a target (Bradley-
 *   Terry: P(i preferred), in [0, 1]; hinge: +1 / -1), an optional weight and scale per pair;
 *   items put m_i sigmoid(s_i) (or m_i s_i) into a bin each, and a bin's total above its budget
 *   or below its coverage floor costs a quadratic hinge. Forward and the gradient with respect
 *   to the scores in a handful of small launches, no host synchronisation, nothing per pair on
 *   the host: the Python-loop version of this loss took ~2.9 s per step (the seed report).
 *
 * Launches (all on the caller's stream; CUDA-graph capturable)
 *   fast mode (the default): a memset and two kernels (with single_launch: ONE cooperative
 *     launch, pref_coop_kernel, the three steps separated by grid barriers):
 *     1. clear the workspace's accumulators (item gradient sums, bin totals, a counter); with
 *        workspace_zeroed this step is skipped (two graph nodes, or one grid barrier fewer):
 *        every call leaves them zeroed (step 3)
 *     2. pairs and items, grid-stride: each pair's check, weighted loss term and gradient term
 *        w dl/dd, added +- into the two items' accumulators with float atomics (warp-
 *        aggregated with PREF_AGGREGATE); each item's gated mass into a per-CTA shared-memory histogram, then one
 *        atomic per bin and CTA; per-CTA double partial sums of the loss terms and weights
 *     3. items: every CTA sums the partials in a fixed order (the divisor, the pair loss),
 *        then grad_i = acc_i / divisor + d penalty / d s_i (acc_i is cleared as it is read);
 *        CTA 0 writes the loss and the histogram: loss[0] = pair loss + penalty, loss[1] pair
 *        loss, loss[2] penalty; the last CTA to finish clears the bin totals. Launched with
 *        programmatic dependent launch (sm_90): it loads each item's bin, score, mass, budget
 *        and coverage while step 2 still runs, and waits only for what step 2 writes
 *   deterministic mode: no float atomics. The sum of the valid weights (one CTA); pairs write
 *     (i, +g_p), (j, -g_p) entries, sorted by item with a stable radix sort (CUB) and each
 *     item's run summed in pair order (lossfuse_cuda.cuh section 9); the histogram likewise
 *     (with item_bin given and n_bins == 0: only a kernel that counts the bad bin ids); the
 *     penalties' gradient; the loss in a fixed order (one CTA).
 * Deterministic mode gives bit-identical losses and gradients run to run; fast mode only the
 * pair part of the loss (fixed-order partial sums); its histogram, hence the penalty, and its
 * gradient are float-atomic sums and may differ in the last bits.
 *
 * Bad input: a pair with an item outside [0, S), i == j, or a target outside [0, 1]
 *   (Bradley-Terry) / other than +1 and -1 (hinge), and an item with a bin outside
 *   [-1, n_bins) (also when n_bins == 0: with item_bin given, every bin id but -1 is bad),
 *   each add 1 to *n_errors (once per pair or item, however many of its values are bad) and
 *   contribute nothing: a bad pair has weight 0 (it is not in the default divisor) and no
 *   gradient, an item with a bad bin is in no bin — never an out-of-bounds access. A NaN score
 *   or a NaN target makes the loss NaN (a NaN target does not make a pair bad). n_bins above
 *   2^31 - 1 is LF_ERR_SIZE (nothing is launched).
 *
 * Sections: 1. API   2. kernels   3. launcher   4. main (make data, check, time)
 */
#include "lossfuse_cuda.cuh"

#include <cooperative_groups.h>
#include <cub/device/device_radix_sort.cuh>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ============================================================================================
 * 1. API
 * ========================================================================================== */

typedef struct pref_args {
    int64_t n_items;
    const float *scores;       /* [S] */
    int64_t n_pairs;
    const int32_t *pairs;      /* [P][2] */
    const float *target;       /* [P]: in [0, 1] (Bradley-Terry); +1 or -1 (hinge) */
    const float *pair_weight;  /* [P] or NULL (all 1) */
    const float *pair_scale;   /* [P] or NULL (opts.scale) */
    lf_pref_opts opts;
    const int32_t *item_bin;   /* [S] or NULL (no penalties); -1: in no bin */
    const float *item_mass;    /* [S] or NULL (all 1) */
    int64_t n_bins;            /* <= 2^31 - 1 */
    const float *budget, *coverage; /* [n_bins] each (NULL when its weight is 0) */
    const float *divisor;      /* device scalar, or NULL: the sum of the valid pairs' weights */
    int deterministic;         /* 1: no float atomics anywhere (bit-identical gradient) */
    int single_launch;         /* fast mode: 0 (default) a memset and two kernels (the second
                                * started early by programmatic dependent launch on sm_90); 1 one
                                * cooperative launch (all CTAs resident, grid barriers) where the
                                * device supports it: one graph node instead of three, but ~1 us
                                * slower than the default on an H200 (bench/RESULTS.md) */
    float *loss;               /* [3] device: total, pair part, penalty part */
    float *grad;               /* [S] device, or NULL (forward only) */
    float *hist;               /* [n_bins] device, or NULL */
    unsigned int *n_errors;    /* optional device counter */
    void *workspace;           /* pref_workspace_bytes(...) bytes; no zeroing needed (but see
                                * workspace_zeroed) */
    size_t workspace_bytes;
    int workspace_zeroed;      /* fast mode: 1 = the workspace's accumulators are known to be zero,
                                * so the launch skips clearing them (one graph node or one grid
                                * barrier fewer). True when the workspace was zeroed (cudaMemset)
                                * and has been used since only by fast-mode calls with the same
                                * n_items and n_bins: every fast-mode call leaves it zeroed, the
                                * first one too. 0 (default): no assumption. */
} pref_args;

static pref_args pref_args_default(void)
{
    pref_args a;
    memset(&a, 0, sizeof a);
    a.opts = lf_pref_opts_default();
    return a;
}

/* Workspace layout (256-byte aligned parts). Fast mode: the item accumulators [S] and the bin
 * totals [B] (cleared by the launch's memset), per-CTA partial sums. Deterministic mode: per
 * pair loss term and weight; per bin penalty and histogram; the divisor; 2P + S sort entries
 * (keys, values, sorted copies) and CUB's temporary storage. */
#define PREF_FUSED_MAX_GRID 1024 /* CTAs of the fast mode's pair kernel */
#define PREF_SMEM_BINS 4096
/* PREF_AGGREGATE 1: the fast mode groups the lanes of a warp that add into the same item
 * (lf_atomic_add_aggregated, __match_any_sync) — worth it when a few items take most pairs;
 * 0 (default): one plain atomic per pair end, ~1 us faster on random pairs (H100, 50K pairs) */
#ifndef PREF_AGGREGATE
#define PREF_AGGREGATE 0
#endif      /* bins counted in shared memory first (more: global atomics) */
typedef struct pref_ws {
    float *pair_loss, *pair_w, *bin_pen, *hist, *div;
    float *acc;       /* fast mode: [S] item gradient sums, then hist and done follow it (one memset) */
    unsigned *done;   /* fast mode: CTAs of the item step that are done (the last clears hist) */
    double *partial;  /* fast mode: [2][PREF_FUSED_MAX_GRID] per-CTA loss and weight sums */
    int32_t *keys, *keys_sorted;
    float *vals, *vals_sorted;
    void *cub_tmp;
    size_t cub_bytes, total;
} pref_ws;

static size_t pref_align(size_t x) { return (x + 255) & ~(size_t)255; }

static pref_ws pref_ws_layout(void *base, int64_t S, int64_t P, int64_t B, int det)
{
    pref_ws w;
    memset(&w, 0, sizeof w);
    char *p = (char *)base;
    size_t off = 0;
    auto take = [&](size_t bytes) -> void * {
        void *r = p ? p + off : nullptr;
        off += pref_align(bytes);
        return r;
    };
    if (!det) { /* acc, hist and done adjacent: one memset clears them */
        w.acc = (float *)take(4 * (size_t)(S > 0 ? S : 1));
        w.hist = (float *)take(4 * (size_t)(B > 0 ? B : 1));
        w.done = (unsigned *)take(4);
        w.partial = (double *)take(2 * 8 * (size_t)PREF_FUSED_MAX_GRID);
        w.total = off;
        return w;
    }
    w.pair_loss = (float *)take(4 * (size_t)(P > 0 ? P : 1));
    w.pair_w = (float *)take(4 * (size_t)(P > 0 ? P : 1));
    w.bin_pen = (float *)take(4 * (size_t)(B > 0 ? B : 1));
    w.hist = (float *)take(4 * (size_t)(B > 0 ? B : 1));
    w.div = (float *)take(4);
    {
        const int64_t n = 2 * P > S ? 2 * P : S;
        w.keys = (int32_t *)take(4 * (size_t)(n > 0 ? n : 1));
        w.keys_sorted = (int32_t *)take(4 * (size_t)(n > 0 ? n : 1));
        w.vals = (float *)take(4 * (size_t)(n > 0 ? n : 1));
        w.vals_sorted = (float *)take(4 * (size_t)(n > 0 ? n : 1));
        size_t tmp = 0;
        cub::DeviceRadixSort::SortPairs(nullptr, tmp, (const int32_t *)nullptr, (int32_t *)nullptr, (const float *)nullptr,
                                        (float *)nullptr, (int)(n > 0 ? n : 1));
        w.cub_bytes = tmp;
        w.cub_tmp = take(tmp);
    }
    w.total = off;
    return w;
}

static size_t pref_workspace_bytes(int64_t n_items, int64_t n_pairs, int64_t n_bins, int deterministic)
{
    return pref_ws_layout(nullptr, n_items, n_pairs, n_bins, deterministic).total;
}

/* ============================================================================================
 * 2. Kernels
 * ========================================================================================== */

#define PREF_THREADS 256

typedef struct pref_kparams {
    int64_t S, P, B;
    const float *scores, *target, *pair_weight, *pair_scale, *item_mass, *budget, *coverage, *divisor;
    const int32_t *pairs, *item_bin;
    lf_pref_opts o;
    int det;
    float *grad, *loss, *hist_out;
    unsigned int *n_errors;
    pref_ws ws;
} pref_kparams;

/* pair p's items *i, *j, and whether the pair is good: both items in [0, S), i != j, and its
 * target t (loaded by the caller) in [0, 1] (Bradley-Terry) or +1 / -1 (hinge). A NaN target
 * is not bad: it goes on to make the loss NaN. */
static __device__ __forceinline__ bool pref_pair_ok(const pref_kparams &k, int64_t p, float t, int32_t *i, int32_t *j)
{
    *i = k.pairs[2 * p];
    *j = k.pairs[2 * p + 1];
    return *i >= 0 && *i < k.S && *j >= 0 && *j < k.S && *i != *j && lf_pref_target_ok(k.o.kind, t);
}

/* deterministic mode, 1. the default divisor: the weights of the valid pairs, in a fixed order */
__global__ void __launch_bounds__(1024) pref_divisor_kernel(const pref_kparams k)
{
    __shared__ double scratch[32];
    double a = 0.0;
    for (int64_t p = threadIdx.x; p < k.P; p += 1024) {
        int32_t i, j;
        if (pref_pair_ok(k, p, k.target[p], &i, &j)) a += k.pair_weight ? (double)k.pair_weight[p] : 1.0;
    }
    a = lf_block_sum_f64<1024>(a, scratch);
    if (threadIdx.x == 0) *k.ws.div = (float)a;
}

static __device__ __forceinline__ float pref_inv_div(const pref_kparams &k)
{
    const float d = k.divisor ? *k.divisor : *k.ws.div;
    return d == 0.0f ? 0.0f : 1.0f / d;
}

/* pair p: false for a bad pair (bad items or a bad target: counted, i = j = -1); else its
 * weighted loss term *l, weight *w and gradient term *g = w dl/dd (not yet divided by the
 * divisor) */
static __device__ __forceinline__ bool pref_pair_term(const pref_kparams &k, int64_t p, int32_t *i, int32_t *j, float *l, float *w,
                                                      float *g)
{
    *l = *w = *g = 0.0f;
    /* the per-pair values are loaded with the pair's items, not after them: one fewer memory
     * latency on the chain pair -> scores (the loss is a few microseconds of such chains); the
     * target is checked with the items */
    const float tp = k.target[p], sc = k.pair_scale ? k.pair_scale[p] : k.o.scale, wp = k.pair_weight ? k.pair_weight[p] : 1.0f;
    if (!pref_pair_ok(k, p, tp, i, j)) {
        if (k.n_errors) atomicAdd(k.n_errors, 1u);
        *i = *j = -1;
        return false;
    }
    const float d = k.scores[*i] - k.scores[*j];
    float dd = 0.0f;
    *w = wp;
    const float lt = k.o.kind == LF_PREF_HINGE ? lf_hinge_margin(d, tp, k.o.margin, sc, &dd) : lf_bt(d, tp, sc, &dd);
    *l = *w == 0.0f ? 0.0f : *w * lt; /* a zero weight drops the term, even an infinite one */
    *g = *w == 0.0f ? 0.0f : *w * dd;
    return true;
}

/* the bin of item i, or -1 (none, or a bad bin id: counted once, by the caller that says so) */
static __device__ __forceinline__ int32_t pref_item_bin(const pref_kparams &k, int64_t i, bool count)
{
    const int32_t b = k.item_bin[i];
    if (b < -1 || b >= k.B) {
        if (count && k.n_errors) atomicAdd(k.n_errors, 1u);
        return -1;
    }
    return b;
}

/* d penalty / d h_b at a bin total h, the bin's budget and coverage given (read only where
 * their weights are on) */
static __device__ __forceinline__ float pref_dpen_at(const pref_kparams &k, float h, float budget, float coverage)
{
    float dh = 0.0f;
    if (k.o.budget_weight > 0.0f && h > budget) dh += 2.0f * k.o.budget_weight * (h - budget);
    if (k.o.coverage_weight > 0.0f && h < coverage) dh -= 2.0f * k.o.coverage_weight * (coverage - h);
    return dh;
}
static __device__ __forceinline__ float pref_dpen(const pref_kparams &k, int32_t b, float h)
{
    return pref_dpen_at(k, h, k.o.budget_weight > 0.0f ? k.budget[b] : 0.0f, k.o.coverage_weight > 0.0f ? k.coverage[b] : 0.0f);
}

/* the penalty of bin b at total h */
static __device__ __forceinline__ float pref_bin_pen(const pref_kparams &k, int32_t b, float h)
{
    const float over = k.o.budget_weight > 0.0f && h > k.budget[b] ? h - k.budget[b] : 0.0f;
    const float under = k.o.coverage_weight > 0.0f && h < k.coverage[b] ? k.coverage[b] - h : 0.0f;
    return k.o.budget_weight * over * over + k.o.coverage_weight * under * under;
}

/* deterministic mode, 2. pairs: loss terms, gradient terms as sort entries */
__global__ void __launch_bounds__(PREF_THREADS) pref_pair_kernel(const pref_kparams k)
{
    const int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool in = p < k.P;
    int32_t i = -1, j = -1;
    float l = 0.0f, g = 0.0f, w = 0.0f;
    if (in) {
        pref_pair_term(k, p, &i, &j, &l, &w, &g);
        g *= pref_inv_div(k);
        k.ws.pair_loss[p] = l;
        k.ws.pair_w[p] = w;
    }
    if (k.grad && in) { /* a bad pair's entries go to key -1: sorted first, summed into nothing */
        k.ws.keys[2 * p] = i;
        k.ws.vals[2 * p] = g;
        k.ws.keys[2 * p + 1] = j;
        k.ws.vals[2 * p + 1] = -g;
    }
}

__global__ void pref_run_sum_kernel(const int32_t *keys, const float *vals, int64_t n, int64_t nkeys, float *out)
{
    lf_sorted_run_sum_grid(keys, vals, n, nkeys, out);
}

static __device__ __forceinline__ float pref_gate(const pref_kparams &k, float s, float *dg)
{
    if (k.o.gate == LF_GATE_NONE) {
        *dg = 1.0f;
        return s;
    }
    const float g = lf_sigmoid(s);
    *dg = g * (1.0f - g);
    return g;
}

/* deterministic mode, 3. items: the histogram of gated masses as sort entries (summed by
 * pref_run_sum_kernel); the bad bin ids counted */
__global__ void __launch_bounds__(PREF_THREADS) pref_hist_kernel(const pref_kparams k)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int32_t b = -1;
    float v = 0.0f;
    if (i < k.S) {
        b = pref_item_bin(k, i, true);
        float dg;
        v = b >= 0 ? (k.item_mass ? k.item_mass[i] : 1.0f) * pref_gate(k, k.scores[i], &dg) : 0.0f;
        k.ws.keys[i] = b;
        k.ws.vals[i] = v;
    }
}

/* deterministic mode, 3 with item_bin given and no bins (n_bins == 0): only the bad bin ids
 * (every id but -1) counted */
__global__ void __launch_bounds__(PREF_THREADS) pref_count_bins_kernel(const pref_kparams k)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < k.S) pref_item_bin(k, i, true);
}

/* two block sums in one pass (both shuffle chains interleave); the totals in thread 0 */
static __device__ __forceinline__ void pref_block_sum2(double *x, double *y, double *scratch)
{
    double a = lf_warp_sum_f64(*x), c = lf_warp_sum_f64(*y);
    const int w = (int)(threadIdx.x >> 5), W = PREF_THREADS / 32;
    if ((threadIdx.x & 31u) == 0) {
        scratch[w] = a;
        scratch[W + w] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        a = c = 0.0;
        for (int q = 0; q < W; ++q) { /* fixed order */
            a += scratch[q];
            c += scratch[W + q];
        }
        *x = a;
        *y = c;
    }
}

/* fast mode, 2. pairs and items together, grid-stride by whole warps (the aggregated atomics
 * are warp collectives): index n is pair n and item n, so every load of an iteration is issued
 * before the first use. Pair terms go into ws.acc unscaled (the divisor is not known yet). */
static __device__ __forceinline__ void pref_fused_pairs(const pref_kparams &k, float *shist, double *scratch)
{
    lf_pdl_trigger(); /* step 3 may start (it waits for this step's results itself) */
    const bool smem_hist = k.B <= PREF_SMEM_BINS;
    if (smem_hist)
        for (int64_t b = threadIdx.x; b < k.B; b += PREF_THREADS) shist[b] = 0.0f;
    if (k.B > 0) __syncthreads(); /* shist cleared */
    const int64_t stride = (int64_t)gridDim.x * PREF_THREADS, n_end = k.P > k.S ? k.P : k.S;
    double lsum = 0.0, wsum = 0.0;
    for (int64_t n0 = (int64_t)blockIdx.x * PREF_THREADS; n0 < n_end; n0 += stride) {
        const int64_t n = n0 + threadIdx.x;
        /* the item's bin, mass and score first: independent of the pair's loads. The bin is
         * read (and a bad one counted) whenever item_bin is given, n_bins == 0 too */
        int32_t b = -1;
        float mass = 1.0f, sco = 0.0f;
        if (k.item_bin && n < k.S) {
            b = pref_item_bin(k, n, true);
            if (k.B > 0) {
                if (k.item_mass) mass = k.item_mass[n];
                sco = k.scores[n];
            }
        }
        int32_t i = -1, j = -1;
        float g = 0.0f;
        if (n < k.P) {
            float l, w;
            pref_pair_term(k, n, &i, &j, &l, &w, &g);
            lsum += (double)l;
            wsum += (double)w;
        }
        if (k.grad) {
#if PREF_AGGREGATE
            lf_atomic_add_aggregated(k.ws.acc, i, g); /* slot -1 adds nothing */
            lf_atomic_add_aggregated(k.ws.acc, j, -g);
#else
            if (i >= 0) atomicAdd(k.ws.acc + i, g);
            if (j >= 0) atomicAdd(k.ws.acc + j, -g);
#endif
        }
        if (k.B > 0) {
            float dg;
            const float v = b >= 0 ? mass * pref_gate(k, sco, &dg) : 0.0f;
            if (smem_hist) {
                if (b >= 0) atomicAdd(&shist[b], v);
            } else {
                lf_atomic_add_aggregated(k.ws.hist, b, v);
            }
        }
    }
    if (smem_hist && k.B > 0) {
        __syncthreads();
        for (int64_t b = threadIdx.x; b < k.B; b += PREF_THREADS)
            if (shist[b] != 0.0f) atomicAdd(&k.ws.hist[b], shist[b]);
    }
    pref_block_sum2(&lsum, &wsum, scratch);
    if (threadIdx.x == 0) {
        k.ws.partial[blockIdx.x] = lsum;
        k.ws.partial[PREF_FUSED_MAX_GRID + blockIdx.x] = wsum;
    }
}

__global__ void __launch_bounds__(PREF_THREADS) pref_fused_pairs_kernel(const pref_kparams k)
{
    __shared__ float shist[PREF_SMEM_BINS];
    __shared__ double scratch[2 * (PREF_THREADS / 32)];
    pref_fused_pairs(k, shist, scratch);
}

/* fast mode, 3. items: the partials summed in a fixed order by every CTA (the same bits in
 * each), then each item's gradient; CTA 0 writes the loss and the histogram. */
/* What item i needs that step 2 does not write (loaded before lf_pdl_wait): its bin, mass,
 * gate derivative and its bin's budget and coverage. */
typedef struct pref_item_pre {
    int32_t b; /* -1: no bin (or no penalties) */
    float mass, dg, budget, coverage;
} pref_item_pre;

static __device__ __forceinline__ pref_item_pre pref_item_load(const pref_kparams &k, int64_t i)
{
    pref_item_pre r;
    r.b = k.B > 0 ? pref_item_bin(k, i, false) : -1;
    r.mass = k.B > 0 && k.item_mass ? k.item_mass[i] : 1.0f;
    r.dg = 0.0f;
    r.budget = r.coverage = 0.0f;
    if (r.b >= 0) {
        pref_gate(k, k.scores[i], &r.dg);
        if (k.o.budget_weight > 0.0f) r.budget = k.budget[r.b];
        if (k.o.coverage_weight > 0.0f) r.coverage = k.coverage[r.b];
    }
    return r;
}

/* item i's accumulated pair terms (not yet divided; the accumulator is cleared for the next
 * call) and its penalty gradient, after step 2 */
static __device__ __forceinline__ void pref_item_terms(const pref_kparams &k, int64_t i, const pref_item_pre &r, float *acc, float *pen)
{
    *acc = k.ws.acc[i];
    k.ws.acc[i] = 0.0f;
    *pen = 0.0f;
    if (r.b >= 0) {
        const float dh = pref_dpen_at(k, k.ws.hist[r.b], r.budget, r.coverage);
        if (dh != 0.0f) *pen = dh * r.mass * r.dg;
    }
}

static __device__ __forceinline__ void pref_fused_items(const pref_kparams &k, int nparts, double *scratch, double *scratch2)
{
    /* this thread's first item's own inputs are loaded before waiting for step 2 (with
     * programmatic dependent launch, while it still runs); its results after */
    const int64_t i0 = (int64_t)blockIdx.x * PREF_THREADS + threadIdx.x, istride = (int64_t)gridDim.x * PREF_THREADS;
    const bool items = k.grad && i0 < k.S;
    pref_item_pre r0;
    r0.b = -1;
    if (items) r0 = pref_item_load(k, i0);
    lf_pdl_wait();
    float a0 = 0.0f, p0 = 0.0f;
    if (items) pref_item_terms(k, i0, r0, &a0, &p0);
    double lsum = 0.0, wsum = 0.0;
    for (int q = threadIdx.x; q < nparts; q += PREF_THREADS) {
        lsum += k.ws.partial[q];
        wsum += k.ws.partial[PREF_FUSED_MAX_GRID + q];
    }
    pref_block_sum2(&lsum, &wsum, scratch2);
    if (threadIdx.x == 0) {
        scratch2[0] = lsum;
        scratch2[1] = wsum;
    }
    __syncthreads();
    const double s_l = scratch2[0], s_w = scratch2[1];
    const float d = k.divisor ? *k.divisor : (float)s_w, inv = d == 0.0f ? 0.0f : 1.0f / d;
    if (items) {
        k.grad[i0] = a0 * inv + p0;
        for (int64_t i = i0 + istride; i < k.S; i += istride) {
            float a, pn;
            pref_item_terms(k, i, pref_item_load(k, i), &a, &pn);
            k.grad[i] = a * inv + pn;
        }
    }
    if (blockIdx.x == 0) {
        double pen = 0.0;
        for (int64_t b = threadIdx.x; b < k.B; b += PREF_THREADS) {
            const float h = k.ws.hist[b];
            pen += (double)pref_bin_pen(k, (int32_t)b, h);
            if (k.hist_out) k.hist_out[b] = h;
        }
        __syncthreads(); /* scratch reuse */
        pen = lf_block_sum_f64<PREF_THREADS>(pen, scratch);
        if (threadIdx.x == 0) {
            const double dd = k.divisor ? (double)*k.divisor : s_w;
            const double pl = dd == 0.0 ? s_l * 0.0 : s_l / dd; /* 0, or NaN from a NaN: never hidden */
            k.loss[0] = (float)(pl + pen);
            k.loss[1] = (float)pl;
            k.loss[2] = (float)pen;
        }
    }
    /* The bin totals are read by every CTA: the last one to get here clears them (and the
     * count) for the next call. This CTA's reads of them are done: their values were used
     * before the barrier. */
    if (k.B > 0) {
        __shared__ int last;
        __syncthreads();
        if (threadIdx.x == 0) last = atomicAdd(k.ws.done, 1u) == gridDim.x - 1;
        __syncthreads();
        if (last) {
            for (int64_t b = threadIdx.x; b < k.B; b += PREF_THREADS) k.ws.hist[b] = 0.0f;
            if (threadIdx.x == 0) *k.ws.done = 0u;
        }
    }
}

__global__ void __launch_bounds__(PREF_THREADS) pref_fused_items_kernel(const pref_kparams k, int nparts)
{
    __shared__ double scratch[PREF_THREADS / 32], scratch2[2 * (PREF_THREADS / 32)];
    pref_fused_items(k, nparts, scratch, scratch2);
}

/* fast mode in ONE launch (cooperative: every CTA resident, so the grid can wait for itself):
 * clear the accumulators (n_clear > 0: not workspace_zeroed), grid barrier, pairs and items,
 * grid barrier, item gradients and the loss. One graph node instead of three. */
__global__ void __launch_bounds__(PREF_THREADS) pref_coop_kernel(const pref_kparams k, int64_t n_clear)
{
    __shared__ float shist[PREF_SMEM_BINS];
    __shared__ double scratch[2 * (PREF_THREADS / 32)], scratch2[2 * (PREF_THREADS / 32)];
    cooperative_groups::grid_group grid = cooperative_groups::this_grid();
    if (n_clear > 0) {
        for (int64_t i = (int64_t)blockIdx.x * PREF_THREADS + threadIdx.x; i < n_clear; i += (int64_t)gridDim.x * PREF_THREADS)
            k.ws.acc[i] = 0.0f; /* acc, hist and done, adjacent */
        grid.sync();
    }
    pref_fused_pairs(k, shist, scratch);
    grid.sync();
    pref_fused_items(k, (int)gridDim.x, scratch, scratch2);
}

/* deterministic mode, 4a. items: d penalty / d s_i added to the gradient (one thread per item: no atomics); bins:
 * their penalty terms */
__global__ void __launch_bounds__(PREF_THREADS) pref_penalty_kernel(const pref_kparams k)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t < k.B) {
        const float h = k.ws.hist[t];
        k.ws.bin_pen[t] = pref_bin_pen(k, (int32_t)t, h);
        if (k.hist_out) k.hist_out[t] = h;
    }
    if (t < k.S && k.grad) {
        const int32_t b = pref_item_bin(k, t, false);
        if (b < 0) return;
        float dg;
        pref_gate(k, k.scores[t], &dg);
        k.grad[t] += pref_dpen(k, b, k.ws.hist[b]) * (k.item_mass ? k.item_mass[t] : 1.0f) * dg;
    }
}

/* deterministic mode, 4b. the loss, summed in a fixed order by one CTA */
__global__ void __launch_bounds__(1024) pref_loss_kernel(const pref_kparams k)
{
    __shared__ double scratch[32];
    double a = 0.0, pen = 0.0;
    for (int64_t p = threadIdx.x; p < k.P; p += 1024) a += (double)k.ws.pair_loss[p];
    a = lf_block_sum_f64<1024>(a, scratch);
    __syncthreads();
    if (k.item_bin)
        for (int64_t b = threadIdx.x; b < k.B; b += 1024) pen += (double)k.ws.bin_pen[b];
    pen = lf_block_sum_f64<1024>(pen, scratch);
    if (threadIdx.x == 0) {
        const double d = (double)(k.divisor ? *k.divisor : *k.ws.div);
        const double pl = d == 0.0 ? a * 0.0 : a / d; /* 0, or NaN from a NaN: never hidden */
        k.loss[0] = (float)(pl + pen);
        k.loss[1] = (float)pl;
        k.loss[2] = (float)pen;
    }
}

/* ============================================================================================
 * 3. Launcher
 * ========================================================================================== */

#define PREF_CHECK(call)                                                                            \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            if (cuda_err) *cuda_err = e_;                                                           \
            return LF_ERR_DEVICE;                                                                   \
        }                                                                                           \
    } while (0)

static unsigned pref_blocks(int64_t n) { return (unsigned)((n + PREF_THREADS - 1) / PREF_THREADS > 0 ? (n + PREF_THREADS - 1) / PREF_THREADS : 1); }

static lf_status pref_launch(const pref_args *a, cudaStream_t stream, cudaError_t *cuda_err)
{
    if (cuda_err) *cuda_err = cudaSuccess;
    if (!a) return LF_ERR_NULL;
    lf_status st = lf_check_pref_opts(&a->opts);
    if (st != LF_OK) return st;
    if (a->n_items < 0 || a->n_pairs < 0 || a->n_bins < 0 || a->n_items > 0x7fffffff || 2 * a->n_pairs > 0x7fffffff ||
        a->n_bins > 0x7fffffff) /* bin ids are int32 (item_bin), bins indexed as int32 */
        return LF_ERR_SIZE;
    if (!a->loss || !a->workspace || (a->n_items > 0 && !a->scores) || (a->n_pairs > 0 && (!a->pairs || !a->target)))
        return LF_ERR_NULL;
    if (a->item_bin && ((a->opts.budget_weight > 0.0f && !a->budget) || (a->opts.coverage_weight > 0.0f && !a->coverage)))
        return LF_ERR_NULL;
    const int det = a->deterministic != 0;
    if (a->workspace_bytes < pref_workspace_bytes(a->n_items, a->n_pairs, a->n_bins, det)) return LF_ERR_SIZE;

    pref_kparams k;
    memset(&k, 0, sizeof k);
    k.S = a->n_items;
    k.P = a->n_pairs;
    k.B = a->item_bin ? a->n_bins : 0;
    k.scores = a->scores;
    k.target = a->target;
    k.pair_weight = a->pair_weight;
    k.pair_scale = a->pair_scale;
    k.item_mass = a->item_mass;
    k.budget = a->budget;
    k.coverage = a->coverage;
    k.divisor = a->divisor;
    k.pairs = a->pairs;
    k.item_bin = a->item_bin;
    k.o = a->opts;
    k.det = det;
    k.grad = a->grad;
    k.loss = a->loss;
    k.hist_out = a->hist;
    k.n_errors = a->n_errors;
    k.ws = pref_ws_layout(a->workspace, k.S, k.P, k.B, det);

    if (!det) {
        int dev = 0, sms = 0;
        PREF_CHECK(cudaGetDevice(&dev));
        PREF_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        const int64_t want = (k.P > k.S ? k.P : k.S) / PREF_THREADS + 1, cap = (int64_t)sms * 4 < PREF_FUSED_MAX_GRID ? (int64_t)sms * 4 : PREF_FUSED_MAX_GRID;
        const int grid1 = (int)(want < cap ? want : cap);
        /* acc [S], hist [B] and done are adjacent in the workspace: one memset */
        const size_t clear = (size_t)((char *)k.ws.done - (char *)k.ws.acc) + 4;
        const bool zeroed = a->workspace_zeroed != 0;
        int coop = 0, per_sm = 0;
        if (a->single_launch) {
            PREF_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
            if (coop) PREF_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, pref_coop_kernel, PREF_THREADS, 0));
        }
        if (coop && per_sm > 0) {
            const int g = grid1 < per_sm * sms ? grid1 : per_sm * sms;
            const int64_t n_clear = zeroed ? 0 : (int64_t)(clear / 4);
            cudaLaunchConfig_t cfg = {};
            cudaLaunchAttribute at[1] = {};
            at[0].id = cudaLaunchAttributeCooperative;
            at[0].val.cooperative = 1;
            cfg.gridDim = dim3((unsigned)g);
            cfg.blockDim = dim3(PREF_THREADS);
            cfg.stream = stream;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            PREF_CHECK(cudaLaunchKernelEx(&cfg, pref_coop_kernel, k, n_clear));
            return LF_OK;
        }
        if (!zeroed) PREF_CHECK(cudaMemsetAsync(k.ws.acc, 0, clear, stream));
        pref_fused_pairs_kernel<<<grid1, PREF_THREADS, 0, stream>>>(k);
        PREF_CHECK(cudaGetLastError());
        /* programmatic dependent launch where the device has it (sm_90): step 3 loads its own
         * inputs while step 2 runs */
        int cc = 0;
        PREF_CHECK(cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, dev));
        PREF_CHECK(lf_launch_clusters(pref_fused_items_kernel, (int64_t)pref_blocks(k.S), 1, dim3(PREF_THREADS), 0, stream, cc >= 9, k,
                                      grid1));
        return LF_OK;
    }
    if (!a->divisor) {
        pref_divisor_kernel<<<1, 1024, 0, stream>>>(k);
        PREF_CHECK(cudaGetLastError());
    }
    if (k.P > 0) {
        pref_pair_kernel<<<pref_blocks(k.P), PREF_THREADS, 0, stream>>>(k);
        PREF_CHECK(cudaGetLastError());
    }
    if (a->grad && k.S > 0) {
        size_t tmp = k.ws.cub_bytes;
        if (k.P > 0)
            PREF_CHECK(cub::DeviceRadixSort::SortPairs(k.ws.cub_tmp, tmp, k.ws.keys, k.ws.keys_sorted, k.ws.vals, k.ws.vals_sorted,
                                                       (int)(2 * k.P), 0, 32, stream));
        pref_run_sum_kernel<<<pref_blocks(k.S), PREF_THREADS, 0, stream>>>(k.ws.keys_sorted, k.ws.vals_sorted, 2 * k.P, k.S, a->grad);
        PREF_CHECK(cudaGetLastError());
    }
    if (k.B > 0) {
        if (k.S > 0) {
            pref_hist_kernel<<<pref_blocks(k.S), PREF_THREADS, 0, stream>>>(k);
            PREF_CHECK(cudaGetLastError());
            size_t tmp = k.ws.cub_bytes;
            PREF_CHECK(cub::DeviceRadixSort::SortPairs(k.ws.cub_tmp, tmp, k.ws.keys, k.ws.keys_sorted, k.ws.vals,
                                                       k.ws.vals_sorted, (int)k.S, 0, 32, stream));
        }
        pref_run_sum_kernel<<<pref_blocks(k.B), PREF_THREADS, 0, stream>>>(k.ws.keys_sorted, k.ws.vals_sorted, k.S, k.B, k.ws.hist);
        PREF_CHECK(cudaGetLastError());
        pref_penalty_kernel<<<pref_blocks(k.S > k.B ? k.S : k.B), PREF_THREADS, 0, stream>>>(k);
        PREF_CHECK(cudaGetLastError());
    } else if (k.item_bin && k.S > 0) { /* no bins: only count the bad bin ids */
        pref_count_bins_kernel<<<pref_blocks(k.S), PREF_THREADS, 0, stream>>>(k);
        PREF_CHECK(cudaGetLastError());
    }
    pref_loss_kernel<<<1, 1024, 0, stream>>>(k);
    PREF_CHECK(cudaGetLastError());
    return LF_OK;
}

#undef PREF_CHECK

/* ============================================================================================
 * 4. main: random items, pairs and bins; both modes; check against lf_ref_pairwise_preference;
 *    time the whole loss (forward + gradient).
 * ========================================================================================== */
#ifndef PREF_NO_MAIN

#define CHECK_CUDA(call)                                                                            \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));  \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

static uint64_t rng_state = 0x853c49e6748fea9bull;
static double rng_uniform(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0);
}

int main(int argc, char **argv)
{
    const int64_t S = argc > 1 ? atoll(argv[1]) : 2000, P = argc > 2 ? atoll(argv[2]) : 20000, B = 64;
    lf_pref_opts o = lf_pref_opts_default();
    o.kind = argc > 3 && !strcmp(argv[3], "hinge") ? LF_PREF_HINGE : LF_PREF_BT;
    o.budget_weight = 0.5f;
    o.coverage_weight = 0.5f;
    const int det = argc > 4 && !strcmp(argv[4], "det");
    if (S < 2) {
        fprintf(stderr, "need at least 2 items\n");
        return 1;
    }

    float *s = (float *)malloc(4 * S), *t = (float *)malloc(4 * P), *w = (float *)malloc(4 * P), *mass = (float *)malloc(4 * S);
    float *budget = (float *)malloc(4 * B), *cov = (float *)malloc(4 * B);
    int32_t *pairs = (int32_t *)malloc(8 * P), *bin = (int32_t *)malloc(4 * S);
    for (int64_t i = 0; i < S; ++i) {
        s[i] = (float)(3.0 * (rng_uniform() - 0.5));
        bin[i] = (int32_t)(rng_uniform() * (B + 1)) - 1;
        mass[i] = (float)(0.5 + rng_uniform());
    }
    for (int64_t b = 0; b < B; ++b) { /* about S/(B+1) items per bin, gated mass ~0.5 each */
        budget[b] = (float)(0.52 * S / (B + 1));
        cov[b] = (float)(0.45 * S / (B + 1));
    }
    for (int64_t p = 0; p < P; ++p) {
        int32_t a = (int32_t)(rng_uniform() * S), c = (int32_t)(rng_uniform() * (S - 1));
        if (c >= a) ++c;
        pairs[2 * p] = a;
        pairs[2 * p + 1] = c;
        t[p] = o.kind == LF_PREF_BT ? (float)rng_uniform() : (rng_uniform() < 0.5 ? -1.0f : 1.0f);
        w[p] = (float)(0.5 + rng_uniform());
    }
    double ref[3] = {0.0, 0.0, 0.0}, *refg = (double *)malloc(8 * S), *refh = (double *)malloc(8 * B);
    const lf_status rs = lf_ref_pairwise_preference(S, s, P, pairs, t, w, NULL, bin, mass, B, budget, cov, &o, -1.0, ref, refh, refg);

    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device found: ran the host reference only\n");
        printf("lf_ref_pairwise_preference S=%lld P=%lld %s: status=%s loss=%.6f (pairs %.6f, penalty %.6f)\n", (long long)S,
               (long long)P, o.kind == LF_PREF_BT ? "bt" : "hinge", lf_status_str(rs), ref[0], ref[1], ref[2]);
        return rs == LF_OK ? 0 : 1;
    }
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s  S=%lld P=%lld bins=%lld %s %s\n", prop.name, (long long)S, (long long)P, (long long)B,
           o.kind == LF_PREF_BT ? "bt" : "hinge", det ? "deterministic" : "fast");

    float *sd, *td, *wd, *md, *bd_budget, *bd_cov, *loss, *grad;
    int32_t *pd, *bind;
    unsigned *err;
    void *ws;
    const size_t wsb = pref_workspace_bytes(S, P, B, det);
    CHECK_CUDA(cudaMalloc(&sd, 4 * S));
    CHECK_CUDA(cudaMalloc(&td, 4 * P));
    CHECK_CUDA(cudaMalloc(&wd, 4 * P));
    CHECK_CUDA(cudaMalloc(&md, 4 * S));
    CHECK_CUDA(cudaMalloc(&bd_budget, 4 * B));
    CHECK_CUDA(cudaMalloc(&bd_cov, 4 * B));
    CHECK_CUDA(cudaMalloc(&loss, 12));
    CHECK_CUDA(cudaMalloc(&grad, 4 * S));
    CHECK_CUDA(cudaMalloc(&pd, 8 * P));
    CHECK_CUDA(cudaMalloc(&bind, 4 * S));
    CHECK_CUDA(cudaMalloc(&err, 4));
    CHECK_CUDA(cudaMalloc(&ws, wsb));
    CHECK_CUDA(cudaMemcpy(sd, s, 4 * S, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(td, t, 4 * P, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(wd, w, 4 * P, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(md, mass, 4 * S, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(bd_budget, budget, 4 * B, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(bd_cov, cov, 4 * B, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(pd, pairs, 8 * P, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(bind, bin, 4 * S, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(err, 0, 4));

    pref_args a = pref_args_default();
    a.n_items = S;
    a.scores = sd;
    a.n_pairs = P;
    a.pairs = pd;
    a.target = td;
    a.pair_weight = wd;
    a.opts = o;
    a.item_bin = bind;
    a.item_mass = md;
    a.n_bins = B;
    a.budget = bd_budget;
    a.coverage = bd_cov;
    a.deterministic = det;
    a.loss = loss;
    a.grad = grad;
    a.n_errors = err;
    a.workspace = ws;
    a.workspace_bytes = wsb;
    cudaError_t ce;
    lf_status st = pref_launch(&a, 0, &ce);
    if (st != LF_OK) {
        fprintf(stderr, "pref_launch: %s (%s)\n", lf_status_str(st), cudaGetErrorString(ce));
        return 1;
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    float lh[3], *gh = (float *)malloc(4 * S);
    CHECK_CUDA(cudaMemcpy(lh, loss, 12, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(gh, grad, 4 * S, cudaMemcpyDeviceToHost));
    /* float arithmetic per pair and per bin, double reductions: 1e-5 of the loss's scale; the
     * gradient within 1e-5 of the largest entry plus 1e-4 relative */
    double gmax = 0.0, gerr = 0.0;
    for (int64_t i = 0; i < S; ++i) gmax = fmax(gmax, fabs(refg[i]));
    for (int64_t i = 0; i < S; ++i) gerr = fmax(gerr, fabs(gh[i] - refg[i]) / (1e-4 * fabs(refg[i]) + 1e-5 * gmax + 1e-30));
    const double lerr = fabs(lh[0] - ref[0]) / (1e-5 * (1.0 + fabs(ref[0])));

    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int it = 0; it < 20; ++it) {
        CHECK_CUDA(cudaEventRecord(e0));
        st = pref_launch(&a, 0, &ce);
        CHECK_CUDA(cudaEventRecord(e1));
        CHECK_CUDA(cudaEventSynchronize(e1));
        if (st != LF_OK) return 1;
        float ms;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (it > 2 && ms < best) best = ms;
    }
    /* the same launches captured in a CUDA graph and replayed back to back: what a training
     * step that captures its loss pays (no per-launch CPU cost) */
    cudaStream_t cs;
    cudaGraph_t graph;
    cudaGraphExec_t gexec;
    CHECK_CUDA(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CHECK_CUDA(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
    st = pref_launch(&a, cs, &ce);
    CHECK_CUDA(cudaStreamEndCapture(cs, &graph));
    if (st != LF_OK) return 1;
    CHECK_CUDA(cudaGraphInstantiate(&gexec, graph, 0));
    const int reps = 200;
    for (int it = 0; it < 10; ++it) CHECK_CUDA(cudaGraphLaunch(gexec, cs));
    CHECK_CUDA(cudaEventRecord(e0, cs));
    for (int it = 0; it < reps; ++it) CHECK_CUDA(cudaGraphLaunch(gexec, cs));
    CHECK_CUDA(cudaEventRecord(e1, cs));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float gms;
    CHECK_CUDA(cudaEventElapsedTime(&gms, e0, e1));
    CHECK_CUDA(cudaGraphExecDestroy(gexec));
    CHECK_CUDA(cudaGraphDestroy(graph));
    CHECK_CUDA(cudaStreamDestroy(cs));
    unsigned errs;
    CHECK_CUDA(cudaMemcpy(&errs, err, 4, cudaMemcpyDeviceToHost));
    printf("loss         : %.6f (pairs %.6f, penalty %.6f); reference %.6f: error %.3f of tolerance\n", lh[0], lh[1], lh[2], ref[0], lerr);
    printf("gradient     : max error %.3f of tolerance over %lld items\n", gerr, (long long)S);
    printf("time         : %.1f us for forward + gradient (all launches, best of 17)\n", best * 1e3);
    printf("graph replay : %.2f us per loss (mean of %d back-to-back replays)\n", gms * 1e3 / reps, reps);
    printf("bad pairs    : %u\n", errs);
    const int ok = rs == LF_OK && lerr <= 1.0 && gerr <= 1.0 && errs == 0;
    printf("%s\n", ok ? "OK" : "MISMATCH");
    return ok ? 0 : 1;
}
#endif /* PREF_NO_MAIN */
