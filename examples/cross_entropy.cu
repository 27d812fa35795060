/* examples/cross_entropy.cu — a fused cross-entropy built only from lossfuse's two headers.
 *
 * Build and run (from the repository root; meson does the same, see README.md):
 *     nvcc -O3 -std=c++17 -arch=sm_90 -I. examples/cross_entropy.cu -o cross_entropy
 *     ./cross_entropy [N=4096] [V=32768] [bf16|fp16|fp32]
 *
 * What it does
 *   Forward + backward in ONE launch: each row of logits is read from HBM once, its lse (and
 *   whatever else is asked for) is reduced, and the gradient is written — in place over the
 *   logits, or to another buffer. 4 bytes of traffic per bf16 element, the floor.
 *   Forward only: per-token label log-prob, lse, entropy, argmax / accuracy (RL, eval), 2 B/elem.
 *   Options: ignore_index, label smoothing, z-loss (returned separately too), tanh softcap,
 *   logit scale (1/temperature), per-class weights, reduction none / sum / mean with the mean's
 *   divisor a DEVICE scalar (e.g. a token count all-reduced over ranks: no host sync), an
 *   upstream gradient (device scalar or per row) and a host gradient scale.
 *   Logits bf16 / fp16 / fp32 with any row stride; labels int32 or int64; fp32 loss outputs.
 *
 * How a row is read once, whatever V is: two schedules (ce_args.schedule; see ce_schedule)
 *   Row-resident (sm_90; the automatic choice for forward + backward): one persistent CTA per SM
 *   keeps a ring of three or more shared-memory stages, each a whole row slice loaded by ONE bulk
 *   copy of the copy engine (lf_bulk_load) and completing on an mbarrier; the row after the ring
 *   is prefetched into L2 (lf_bulk_prefetch_l2). Two warp groups take alternate rows, so one
 *   computes while the other reduces or waits. Rows wider than a stage are split over a cluster
 *   of 2..16 CTAs, which exchange their 28-byte statistics through distributed shared memory
 *   without a cluster barrier (lf_cluster_stats_post / _collect). Every element is read from HBM
 *   once, then from shared memory, never again from L2. The rows are handed out by an atomic
 *   counter (ce_args.static_rows = 0, the default; in a cluster rank 0 draws and posts the row to
 *   its peers with its statistics), so that CTAs on faster SMs take more of them; the batch sum is
 *   exact and order-free, so the bits do not change.
 *   Streamed (any GPU; forward only over few rows, and rows too short for the resident ring):
 *   persistent CTAs of 256 threads (three per SM) stage rows in shared memory with cp.async: two
 *   32 KB buffers each, so the copies of the next piece are in flight while the current one is reduced
 *   and its gradient written (each thread copies and reads back only its own 16-byte vectors: the
 *   pipeline needs no barrier). A row larger than 32 KB may be split over a cluster on sm_90
 *   (lf_cluster_row_stats, one cluster barrier per row). Where a CTA's slice is larger than a buffer
 *   (always without clusters, e.g. on sm_80) it streams the slice in pieces, writes the last piece's
 *   gradient while it is still staged and reads the others a second time, last first (from L2 when
 *   they are still there): correct for any V.
 *   Warp per row (sm_80+; the automatic choice for forward only over many rows): each warp of a
 *   persistent grid reads its rows straight from global memory into registers (lf_warp_row_pass),
 *   two batches of 16-byte loads in flight per lane; no shared memory and no per-row block merge,
 *   which is what a short row (V = 32K: 64 KB) costs the streamed CTAs.
 *   Measured (bench/RESULTS.md, bf16, gradient in place): the resident schedule reaches 88-93% of
 *   the device-to-device copy bandwidth on an H100 (before the dynamic rows) and 86-95% on an
 *   H200 (session 16), against 76-93% and 69-79% streamed (earlier runs). Forward only, one
 *   warp per row: 95-105% on an H100, 89-102% on an H200 (89% at 4096 x 32768, one wave of one
 *   row per warp; a read-only pass can beat the copy's rate).

 * What keeps it near the bandwidth limit (measured, bench/RESULTS.md): per element the fast
 *   path (no softcap, no class weights) spends a packed max (two bf16 per instruction), one
 *   FFMA + EX2 + FADD for the sum, and one FFMA + EX2 + half a pack for the gradient (the
 *   coefficient folded into the exponent); the argmax is located lazily; streamed forward only,
 *   the row's merge is deferred a job through an mbarrier so that no warp waits for the slowest
 *   at the end of each row.

 * Contract (as DESIGN.md)
 *   - A label outside [0, V) that is not ignore_index adds 1 to *n_errors; that row, like an
 *     ignored row, has loss 0, zero gradient and weight 0. All rows ignored: loss 0, grad 0.
 *   - A NaN or +inf logit in a valid row makes that row's loss NaN and its gradient NaN.
 *   - -inf entries (masked vocabulary) weigh nothing, and so do entries at the dtype's lowest
 *     finite value (masking with torch.finfo(dtype).min: -3.39e38 in bf16, whose exp2 argument
 *     overflows to -inf): their share of the mass is exactly the reference's 0. Only a row with
 *     nothing else is different: no mass, as an all -inf row (NaN loss and gradient, lse -inf),
 *     not uniform as in PyTorch -- lossfuse.h lf_massless, the one rule of the body's one-FFMA
 *     exponent, the edge elements' pushes and the references. fp16's finfo.min (-65504) has mass:
 *     a row of nothing else is uniform, loss log V.
 *   - Accuracy: the loss is (m - z_y) + log(s), m the row's maximum and s the sum of exp(z - m)
 *     made exact relative to m (lossfuse_cuda.cuh lf_shift_err: the rounding of the one shift
 *     m log2 e that every exponent shares is taken out of each piece's sum), so it is good to
 *     fp32 rounding of its own terms for |m| up to ~1e7 (without label smoothing, at
 *     logit_scale 1 or a power of 2, without softcap; the smoothing term W lse - sum w z and a
 *     scale's rounding carry ~1 ulp of |m|, the cap's tanhf ~cap 2^-22). lse itself is a float:
 *     ~half an ulp of |lse|. An fp32 gradient takes p_j against m too, p_j = exp2(x log2 e -
 *     sh) 2^-c / s with the row's factor 2^-c / s in the coefficient (lossfuse_cuda.cuh
 *     lf_grad_coef_onto_max), so it has no error of ~2^-24 |lse| (1.7e-4 relative at |lse| =
 *     4000, as exp2(x log2 e - lse log2 e) had): p_j's error is relative to |z_j - m|, same
 *     conditions as the loss. A 16-bit gradient does the same only where |lse log2 e| >= 256,
 *     and keeps the fast form (the coefficient in the exponent: one rounded k) while |k| < 256:
 *     what those roundings add is at most ~2.4 2^-17 relative, 1/27 of fp16's rounding and
 *     1/200 of bf16's. Beyond |m| ~ 1e7 the shift's rounding is no longer a fraction of one
 *     (e.g. a row masked with -1e9 and nothing else): the loss and gradient of such a row are
 *     not meaningful.
 *   - The batch loss never depends on timing: per-row values in the workspace summed in a fixed
 *     order by the last CTA to finish, or in the row-resident schedule an exact, order-free sum
 *     (lossfuse.h lf_xsum: integer buckets, integer atomics) that is the same bits whichever CTA
 *     took which row. Bit-identical run to run on one device. No float atomics.
 *   - No host synchronisation; CUDA-graph capturable; N = 0 launches no kernel.
 *
 * Sections: 1. API   2. kernels   3. launcher   4. main (make data, check, time)
 */
#ifndef LOSSFUSE_EXAMPLE_CROSS_ENTROPY_CU /* the other examples include this file */
#define LOSSFUSE_EXAMPLE_CROSS_ENTROPY_CU
#include "lossfuse_cuda.cuh"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>

/* ============================================================================================
 * 1. API
 * ========================================================================================== */

typedef struct ce_args {
    /* inputs */
    const void *logits;  /* [N, V] with row stride `stride` (elements) */
    lf_dtype dtype;      /* of logits and grad */
    int64_t n_rows, vocab, stride;
    const void *labels;  /* [N] int32 or int64 */
    int labels_i64;
    lf_ce_opts opts;     /* class_weights, when set, is a DEVICE pointer to V floats */
    lf_reduction reduction;
    const float *divisor; /* device scalar for LF_REDUCE_MEAN, or NULL: sum of w_y over valid rows */
    const float *dloss;   /* device upstream gradient: [1] for sum/mean, [N] for none; NULL = 1 */
    float grad_scale;     /* host multiplier of the gradient (1 = plain gradient) */
    /* outputs (device pointers) */
    void *grad;           /* NULL: forward only; == logits: in place */
    int64_t grad_stride;
    float *loss;          /* [N] for none, [1] otherwise; required */
    float *z_loss_out;    /* optional, shaped like loss: the lam*lse^2 part of it */
    float *logprob, *lse, *entropy; /* optional [N]; 0 for ignored/bad rows */
    int32_t *argmax;      /* optional [N]; -1 for ignored/bad rows */
    unsigned int *n_correct; /* optional: += valid rows with argmax == label */
    unsigned int *n_errors;  /* optional: += rows with a bad label */
    void *workspace;      /* ce_workspace_bytes(n_rows) bytes, zeroed once before first use */
    size_t workspace_bytes;
    int max_cluster;      /* 0: automatic; n: at most n CTAs per cluster (1: none); the device's
                           * limit applies either way */
    int schedule;         /* CE_SCHED_AUTO (0), _STREAM, _RESIDENT or _WARP: see ce_schedule */
    int stages;           /* row-resident schedule: shared-memory stages per CTA, 3..8 (more than its
                           * two warp groups); 0 automatic */
    int static_rows;      /* row-resident schedule: 0 (default) hands the rows out from an atomic
                           * counter, so that a CTA (or cluster) on faster SMs takes more of
                           * them; 1: cluster c takes rows c, c + clusters, ...
                           * The results are the same bits either way (the batch sum is order-free,
                           * lossfuse.h lf_xsum) */
    struct ce_plan *plan; /* optional host out: the launch configuration chosen */
} ce_args;

/* How rows are read (the kernels' comments say more).
 *   CE_SCHED_STREAM   any GPU: persistent CTAs (three per SM) stream 32 KB pieces with per-thread
 *                     cp.async; a row larger than a piece is split over a cluster (sm_90) and/or
 *                     streamed in pieces whose gradients re-read them (from L2 when still there).
 *   CE_SCHED_RESIDENT sm_90: one CTA per SM holds whole row slices in a ring of stages filled by
 *                     the copy engine (one bulk copy per slice); rows too wide for three stages
 *                     are split over a cluster. Each element is read from HBM exactly once.
 *   CE_SCHED_WARP     forward only, sm_80+: one warp per row, straight from global memory into
 *                     registers (lf_warp_row_pass); no shared memory, no per-row block merge.
 *                     With a gradient it is an argument error (LF_ERR_ARG): a row held by one
 *                     warp would have to be read twice.
 *   CE_SCHED_AUTO     the fused forward + backward resident where the device and the shape
 *                     allow it (sm_90, a slice of at least CE_RES_MIN_SLICE bytes), else
 *                     streamed; forward only by warps when there are at least
 *                     CE_WARP_MIN_ROWS_PER_SM rows per SM, else streamed (bench/RESULTS.md). */
enum ce_schedule { CE_SCHED_AUTO = 0, CE_SCHED_STREAM = 1, CE_SCHED_RESIDENT = 2, CE_SCHED_WARP = 3 };

/* What ce_launch chose (for benchmarks, tests, and the curious). */
typedef struct ce_plan {
    int schedule;  /* CE_SCHED_STREAM, CE_SCHED_RESIDENT or CE_SCHED_WARP */
    int cluster;   /* CTAs per cluster sharing a row (1: none) */
    int pieces;    /* pieces per CTA slice; 1 = each row read from HBM once */
    int stages;    /* resident: row slices staged per CTA (0 when streamed) */
    int clusters;  /* persistent clusters (or CTAs) launched */
    int ctas;      /* CTAs launched */
    int dynamic;   /* resident: rows handed out by an atomic counter (else a fixed share per CTA) */
} ce_plan;

/* Arguments with every option at its default: the caller sets pointers and sizes. */
[[maybe_unused]] static ce_args ce_args_default(void)
{
    ce_args a;
    memset(&a, 0, sizeof a);
    a.dtype = LF_BF16;
    a.opts = lf_ce_opts_default();
    a.reduction = LF_REDUCE_MEAN;
    a.grad_scale = 1.0f;
    return a;
}

/* Workspace: a 672-byte header (completion counters, the default divisor and its partial sums,
 * the row-resident schedule's row counter and order-free batch sums) and two floats per row.
 * Zero it once after allocating (cudaMemsetAsync); every launch leaves the counter at zero
 * again, so graph replays need nothing. One workspace per launch in flight. */
#define CE_DIV_MAX_CTAS 6
typedef struct ce_ws_header {
    unsigned long long rows_done;
    float divisor;
    unsigned div_done;                /* the divisor kernel's CTAs done (back to 0 by the last) */
    double div_part[CE_DIV_MAX_CTAS]; /* their partial sums */
    unsigned long long row_next;      /* row-resident, dynamic: the next row to hand out (back to 0 by the last CTA) */
    unsigned long long pad_[7];
    lf_xsum xs[2];                    /* row-resident: the batch's loss and z sums (back to 0 by the last CTA) */
} ce_ws_header;
static_assert(sizeof(ce_ws_header) == 672, "the workspace header is 672 bytes");

static size_t ce_workspace_bytes(int64_t n_rows)
{
    return sizeof(ce_ws_header) + 2 * sizeof(float) * (size_t)(n_rows > 0 ? n_rows : 0);
}

/* ============================================================================================
 * 2. Kernels
 * ========================================================================================== */

/* Tile shape (overridable with -D for tuning experiments; the defaults are what bench/RESULTS.md
 * measured best). */
#ifndef CE_THREADS
#define CE_THREADS 256     /* threads per CTA; three CTAs per SM (persistent) */
#endif
#ifndef CE_CTAS_PER_SM
#define CE_CTAS_PER_SM 3   /* so that one CTA's reductions overlap the others' streaming */
#endif
#ifndef CE_PIECE_VECS
#define CE_PIECE_VECS 2048 /* 16-byte vectors per shared-memory buffer: 32 KB, two buffers */
#endif
#ifndef CE_LABEL_CACHE
#define CE_LABEL_CACHE 512
#endif
#define CE_AUTO_CLUSTER_MAX 4 /* see ce_launch_kernel */
#define CE_SLOTS 3
#define CE_SMEM_BYTES (2 * CE_PIECE_VECS * 16 + CE_LABEL_CACHE * 8)

/* What the kernels read from the launcher: ce_args resolved to device-side values. */
typedef struct ce_kparams {
    const void *logits;
    int64_t stride, n_rows, vocab;
    const void *labels;
    int labels_i64;
    int64_t ignore_index;
    const float *class_w;
    float eps, lam;
    lf_xform xf;
    int reduction;
    const float *divisor, *dloss;
    float grad_scale;
    void *grad;
    int64_t grad_stride;
    float *loss, *z_out, *logprob, *lse, *entropy;
    int32_t *argmax;
    unsigned int *n_correct, *n_errors;
    ce_ws_header *ws;
    float *ws_loss, *ws_z;
} ce_kparams;

static __device__ __forceinline__ int64_t ce_label(const ce_kparams &p, int64_t row)
{
    return p.labels_i64 ? ((const int64_t *)p.labels)[row] : (int64_t)((const int32_t *)p.labels)[row];
}

static __device__ __forceinline__ float ce_mean_divisor(const ce_kparams &p)
{
    return p.divisor ? *p.divisor : p.ws->divisor;
}

/* The default mean divisor, sum of w_y over valid rows, in a fixed order: launched before the
 * main kernel only for reduction mean without a caller-provided divisor. The row-resident kernel
 * starts at once and waits for it only where it first needs the divisor, its first gradient, so
 * this is on the launch's critical path and is built for latency: up to CE_DIV_MAX_CTAS CTAs of
 * 256 threads (small enough to fit on an SM beside a resident CTA), each thread with CE_DIV_U
 * label loads in flight together; each CTA sums a fixed share of the rows, and the CTA that
 * completes the count adds the shares in order. (Measured on an H200 at 16384 x 32768, fwd+bwd:
 * one CTA taking one label at a time cost 0.594 ms against 0.564 ms for reduction none.) */
#define CE_DIV_THREADS 256
#define CE_DIV_U 16 /* labels per thread with their loads in flight together */
[[maybe_unused]] static int ce_divisor_ctas(int64_t n_rows)
{
    const int64_t per = (int64_t)CE_DIV_THREADS * CE_DIV_U;
    const int64_t c = (n_rows + per - 1) / per;
    return (int)(c < 1 ? 1 : c > CE_DIV_MAX_CTAS ? CE_DIV_MAX_CTAS : c);
}
__global__ void __launch_bounds__(CE_DIV_THREADS) ce_divisor_kernel(const ce_kparams p)
{
    __shared__ double scratch[CE_DIV_THREADS / 32];
    lf_pdl_trigger();
    const int64_t step = (int64_t)gridDim.x * CE_DIV_THREADS;
    double acc = 0.0;
    for (int64_t i0 = (int64_t)blockIdx.x * CE_DIV_THREADS + threadIdx.x; i0 < p.n_rows; i0 += CE_DIV_U * step) {
        int64_t y[CE_DIV_U];
#pragma unroll
        for (int u = 0; u < CE_DIV_U; ++u) {
            const int64_t i = i0 + u * step;
            y[u] = i < p.n_rows ? ce_label(p, i) : p.ignore_index;
        }
#pragma unroll
        for (int u = 0; u < CE_DIV_U; ++u)
            if (y[u] != p.ignore_index && y[u] >= 0 && y[u] < p.vocab) acc += p.class_w ? (double)__ldg(p.class_w + y[u]) : 1.0;
    }
    acc = lf_block_sum_f64<CE_DIV_THREADS>(acc, scratch);
    if (gridDim.x == 1) {
        if (threadIdx.x == 0) p.ws->divisor = (float)acc;
        return;
    }
    if (threadIdx.x == 0) {
        p.ws->div_part[blockIdx.x] = acc;
        __threadfence();
        if (atomicAdd(&p.ws->div_done, 1u) == gridDim.x - 1) {
            __threadfence();
            double d = 0.0;
            for (unsigned b = 0; b < gridDim.x; ++b) d += __ldcg(&p.ws->div_part[b]);
            p.ws->divisor = (float)d;
            p.ws->div_done = 0; /* ready for the next launch */
        }
    }
}

/* A row's loss and z term, where the reduction finds them: the outputs (reduction none) or the
 * workspace's per-row values that ce_batch_reduce sums. P: any parameter block with these
 * fields (vocab_parallel_ce.cu's too). */
template <typename P>
static __device__ __forceinline__ void ce_store_row_loss(const P &p, int64_t row, float loss, float zterm)
{
    if (p.reduction == LF_REDUCE_NONE) {
        p.loss[row] = loss;
        if (p.z_out) p.z_out[row] = zterm;
    } else {
        p.ws_loss[row] = loss;
        p.ws_z[row] = zterm;
    }
}

/* A valid row's lse (with_lse) and its loss and z term, by one thread, where the reduction finds
 * them (as ce_row_outputs says). */
static __device__ __forceinline__ void ce_row_loss_out(const ce_kparams &p, int64_t row, float lse, float loss, float zterm,
                                                       lf_xsum *acc, lf_xsum_cache *cache, bool with_lse = true)
{
    if (with_lse && p.lse) p.lse[row] = lse;
    if (acc) {
        lf_xsum_cached_add(&acc[0], &cache[0], loss);
        if (p.z_out) lf_xsum_cached_add(&acc[1], &cache[1], zterm);
    } else {
        ce_store_row_loss(p, row, loss, zterm);
    }
}

/* The outputs of a valid row, by one thread: per-row values, and the row's loss (and z term)
 * where the reduction finds them: in the workspace per row, or added to the order-free sums
 * acc[0] and acc[1] in global memory through the thread's caches cache[0], cache[1]
 * (lf_xsum_cached_add: integer reductions when a bucket changes; the thread flushes them after
 * its rows; see ce_batch_reduce_xsum). x_y is the label's raw logit. */
template <bool FULL, bool SOFTCAP>
static __device__ __forceinline__ void ce_row_outputs(const ce_kparams &p, int64_t row, int64_t y, const lf_row_stats &rs,
                                                      float x_y, lf_xsum *acc = nullptr, lf_xsum_cache *cache = nullptr)
{
    const float lse = lf_lse_final(rs.lse);
    const float w_y = p.class_w ? __ldg(p.class_w + y) : 1.0f;
    const float wsum = (FULL && p.class_w) ? rs.w : (float)p.vocab;
    const float z_y = lf_xform_apply<SOFTCAP>(x_y, p.xf);
    /* lse - z_y as (m - z_y) + log(s), s relative to m itself (lf_shift_err): without the
     * cancellation of lse's rounding against z_y; at the label the max, log of a sum ~1, good
     * to a few 2^-24 even at |x| ~ 1e4 */
    const float nll = (rs.lse.m - z_y) + logf(rs.lse.s);
    const float smooth = (FULL && p.eps > 0.0f) ? (wsum * lse - rs.wz) / (float)p.vocab : 0.0f;
    const float zterm = p.lam * lse * lse;
    float loss = (1.0f - p.eps) * w_y * nll + p.eps * smooth + zterm;
    if (!(fabsf(lse) < LF_INF_F)) loss = NAN;
    if (p.logprob) p.logprob[row] = -nll;
    if (p.lse) p.lse[row] = lse;
    if (FULL && p.entropy) p.entropy[row] = lf_lse_entropy(rs.lse);
    if (FULL && p.argmax) p.argmax[row] = rs.am.i;
    if (FULL && p.n_correct && rs.am.i == (int32_t)y) atomicAdd(p.n_correct, 1u);
    ce_row_loss_out(p, row, lse, loss, zterm, acc, cache, false);
}

/* The outputs of an ignored row (status 1) or a bad label (status 2, counted), by one thread
 * (acc: as ce_row_outputs; the row adds nothing). */
static __device__ __forceinline__ void ce_row_outputs_zero(const ce_kparams &p, int64_t row, int status, bool acc = false)
{
    if (status == 2 && p.n_errors) atomicAdd(p.n_errors, 1u);
    if (p.logprob) p.logprob[row] = 0.0f;
    if (p.lse) p.lse[row] = 0.0f;
    if (p.entropy) p.entropy[row] = 0.0f;
    if (p.argmax) p.argmax[row] = -1;
    if (!acc) ce_store_row_loss(p, row, 0.0f, 0.0f);
}

/* The batch's loss and z term from their sums (a, bz), by one thread: divided by the mean's
 * divisor (0 when it is 0; a NaN sum stays NaN: never hidden) and written. */
static __device__ __forceinline__ void ce_write_batch_loss(const ce_kparams &p, double a, double bz)
{
    if (p.reduction == LF_REDUCE_MEAN) {
        const double d = (double)ce_mean_divisor(p);
        a = d == 0.0 ? a * 0.0 : a / d;
        bz = d == 0.0 ? bz * 0.0 : bz / d;
    }
    p.loss[0] = (float)a;
    if (p.z_out) p.z_out[0] = (float)bz;
}

/* Last-CTA-done batch sum (sum / mean), called by every thread of each of the `ncount` CTAs that
 * wrote per-row losses, after their last write: each publishes its rows and counts itself; the CTA
 * that completes the count sums all rows in a fixed order, so the total never depends on timing.
 * fin: THREADS/32 doubles of scratch; bar: the threads' barrier (lf_block_bar). */
template <int THREADS>
static __device__ __forceinline__ void ce_batch_reduce(const ce_kparams &p, unsigned long long ncount, double *fin,
                                                       int *is_last, int bar = 0)
{
    if (threadIdx.x == 0) {
        __threadfence();
        *is_last = atomicAdd(&p.ws->rows_done, 1ull) == ncount - 1;
    }
    lf_block_bar<THREADS>(bar);
    if (!*is_last) return;
    __threadfence();
    double a = 0.0, bz = 0.0;
    /* eight rows per step, their loads issued together: the tail of the launch waits for this */
    const bool zs = p.z_out != nullptr;
    for (int64_t i = threadIdx.x; i < p.n_rows; i += 8 * THREADS) {
        float l[8], z[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int64_t r = i + u * THREADS;
            l[u] = r < p.n_rows ? __ldcg(p.ws_loss + r) : 0.0f; /* L2 reads: other SMs wrote these */
            z[u] = zs && r < p.n_rows ? __ldcg(p.ws_z + r) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            a += (double)l[u];
            bz += (double)z[u];
        }
    }
    a = lf_block_sum_f64<THREADS>(a, fin, bar);
    lf_block_bar<THREADS>(bar); /* fin is reused below */
    bz = lf_block_sum_f64<THREADS>(bz, fin, bar);
    if (threadIdx.x == 0) {
        ce_write_batch_loss(p, a, bz);
        p.ws->rows_done = 0; /* ready for the next launch (or graph replay) */
    }
}

/* The row-resident kernel's end, by every thread of one group (THREADS, barrier bar) of each of
 * the `ncount` CTAs, after all its rows: the rows' losses and z terms have been added to the
 * workspace's order-free sums p.ws->xs (lf_xsum_cached_add by the thread that wrote each row,
 * its caches flushed before this); the CTA counts itself, and the CTA that completes the count
 * turns the sums into the loss (the same bits whichever CTA took which row: the dynamic row
 * counter needs that) and leaves the workspace ready for the next launch: sums, counters and
 * the row counter back to 0. With reduction none only the counters (the dynamic schedule's row
 * counter must be reset).
 * xf: 2 lf_xsum of shared scratch, 8-byte aligned. */
template <int THREADS>
static __device__ __forceinline__ void ce_batch_reduce_xsum(const ce_kparams &p, unsigned long long ncount, lf_xsum *xf,
                                                            int *is_last, int bar)
{
    if (threadIdx.x == 0) {
        __threadfence(); /* after the CTA's barrier: every thread's reductions before the count */
        *is_last = atomicAdd(&p.ws->rows_done, 1ull) == ncount - 1;
    }
    lf_block_bar<THREADS>(bar);
    if (!*is_last) return;
    __threadfence();
    constexpr int W = (int)(sizeof(lf_xsum) / 8);
    const bool red = p.reduction != LF_REDUCE_NONE;
    for (int i = (int)threadIdx.x; red && i < 2 * W; i += THREADS) { /* read (from L2, where the atomics landed) and clear */
        unsigned long long *g = reinterpret_cast<unsigned long long *>(p.ws->xs) + i;
        reinterpret_cast<unsigned long long *>(xf)[i] = __ldcg(g);
        *g = 0ull;
    }
    lf_block_bar<THREADS>(bar);
    if (threadIdx.x != 0) return;
    if (red) ce_write_batch_loss(p, lf_xsum_value(&xf[0]), lf_xsum_value(&xf[1]));
    p.ws->row_next = 0ull;
    p.ws->rows_done = 0; /* ready for the next launch (or graph replay) */
}

/* Whether this thread holds the label's raw logit, and then *x_y: as its edge element (head or
 * tail; only in the piece that carries the edges, edge_piece) or in its staged vectors [pb, pe)
 * of buffer b (thread t holds vectors pb + t + k*THREADS at b[t + k*THREADS]). */
template <int THREADS, typename T>
static __device__ __forceinline__ bool ce_label_held(const uint4 *b, const lf_row_span &sp, int pb, int pe,
                                                     const lf_edge &edge, bool edge_piece, int64_t y, float *x_y)
{
    const int PV = lf_elem<T>::per_vec;
    const int64_t yb = y - sp.head;
    if (yb < 0 || yb >= (int64_t)sp.nvec * PV) {
        if (!edge_piece || edge.j != (int32_t)y) return false;
        *x_y = edge.x;
        return true;
    }
    const int vy = (int)(yb / PV);
    if (vy < pb || vy >= pe || (int)threadIdx.x != (vy - pb) % THREADS) return false;
    *x_y = lf_elem<T>::get(b[vy - pb], (int)(yb % PV));
    return true;
}

/* The label element's gradient, written by the thread that has just written its dense value
 * (program order of one thread: no barrier), from the staged x_y. */
template <int THREADS, typename T, bool FULL, bool SOFTCAP>
static __device__ __forceinline__ void ce_label_grad_patch(T *out, const uint4 *b, const lf_row_span &sp, int pb, int pe,
                                                           const lf_edge &edge, bool edge_piece, int64_t y,
                                                           const lf_grad_coef &coef, const ce_kparams &p)
{
    float x_y;
    if (ce_label_held<THREADS, T>(b, sp, pb, pe, edge, edge_piece, y, &x_y))
        out[y] = lf_elem<T>::from_f32(lf_ce_label_grad<FULL, SOFTCAP>(x_y, (int32_t)y, coef, p.xf, p.class_w));
}

/* One job = one piece of one row for this CTA. Everything the row needs that comes from a
 * scalar load (label, edge elements, label logit, per-row upstream gradient) is loaded when
 * the job is *issued* — one job ahead of its use — so that latency hides behind the pieces. */
typedef struct ce_job {
    int64_t row, y;
    int64_t lr;     /* the row's index among this CTA's rows */
    int status;     /* 0 valid, 1 ignored, 2 bad label */
    int k;          /* job index within the row */
    int sbeg, send; /* this CTA's slice of the row's body vectors */
    lf_row_span sp;
    lf_edge_raw edge_raw; /* this thread's head/tail element (rank 0), as loaded */
    lf_edge edge;   /* ... converted when the job starts (lf_edge_resolve) */
    float dl;       /* reduction none: the row's upstream gradient, as loaded */
    float x_y;      /* with GRAD: the label logit, loaded by thread 0 (see the stats pass) */
} ce_job;

/* The persistent fused kernel. A cluster of `nranks` CTAs (1: no cluster) takes rows cid,
 * cid + nclusters, ...; CTA `rank` takes slice `rank` of each row, in `npieces` pieces of at
 * most CE_PIECE_VECS vectors. With one piece (the row slice fits in one 32 KB buffer) the
 * row is read from HBM once: statistics, cluster merge, then the gradient from shared memory.
 * With several, the statistics stream through the buffers; the last piece's gradient is
 * written while it is still staged, and the others are read again (last first). Either way the copies of the next job are in flight while the current one is
 * reduced and written: two 32 KB buffers, per-thread cp.async, no barrier for the pipeline, and
 * three CTAs per SM so that one CTA's reductions and barriers overlap the others' streaming.
 *   GRAD    : write the gradient (else forward only)
 *   FULL    : entropy, argmax, weighted logit sums (label smoothing, stats outputs)
 *   SOFTCAP : the tanh cap is on */
template <typename T, bool GRAD, bool FULL, bool SOFTCAP>
__global__ void __launch_bounds__(CE_THREADS, CE_CTAS_PER_SM) ce_kernel(const ce_kparams p, int nranks, int npieces, int nclusters)
{
    extern __shared__ uint4 ce_smem[]; /* [2][CE_PIECE_VECS] pieces, then the label cache */
    /* Per-row slots, used in turn by consecutive rows (CE_SLOTS of them: with the deferred
     * forward-only merge a slot is reused three rows later, see below) */
    __shared__ lf_row_stats red[CE_SLOTS][CE_THREADS / 32];
    __shared__ lf_row_stats xchg[CE_SLOTS];
    __shared__ unsigned am_key[CE_SLOTS]; /* lazy argmax: the CTA's running maximum */
    __shared__ int am_nan[CE_SLOTS];      /* the first NaN of a NaN row */
    __shared__ float xy_s[CE_SLOTS];      /* the label logit, from the thread that staged it */
    __shared__ uint64_t row_bar[CE_SLOTS]; /* forward only: the row's warp partials are posted */
    __shared__ double fin[CE_THREADS / 32];
    __shared__ int is_last;
    uint4 *const buf0 = ce_smem, *const buf1 = ce_smem + CE_PIECE_VECS;
    int64_t *const ycache = reinterpret_cast<int64_t *>(ce_smem + 2 * CE_PIECE_VECS);

    const int rank = (int)(blockIdx.x % nranks); /* the cluster spans consecutive x: = cluster rank */
    const int64_t cid = blockIdx.x / nranks, N = p.n_rows, V = p.vocab;
    const int64_t my_rows = cid < N ? (N - 1 - cid) / nclusters + 1 : 0;
    /* Jobs of a row: the statistics of pieces 0..n-1; with GRAD the last piece's gradient is
     * written in the same job (it is still in shared memory), then pieces n-2..0 are read again
     * (most recent first: the likeliest still in L2) for theirs. */
    const int J = GRAD ? 2 * npieces - 1 : npieces;
    const int64_t njobs = my_rows * J;
    float inv_div = 1.0f;
    /* upstream gradient of sum / mean (one scalar: loaded once) */
    const float dl_all = (GRAD && p.dloss && p.reduction != LF_REDUCE_NONE) ? p.dloss[0] : 1.0f;
    if (GRAD && p.reduction == LF_REDUCE_MEAN) {
        const float d = ce_mean_divisor(p);
        inv_div = d == 0.0f ? 0.0f : 1.0f / d;
    }

    /* Job jj of this CTA; k > 0 continues the row of `prev`. Called by all threads alike. */
    auto start_job = [&](int64_t jj, const ce_job &prev) -> ce_job {
        ce_job j = prev;
        /* counted on from the previous job: no 64-bit division by J per job */
        if (jj == 0) {
            j.k = 0;
            j.lr = 0;
        } else if (prev.k + 1 < J) {
            j.k = prev.k + 1;
            return j;
        } else {
            j.k = 0;
            j.lr = prev.lr + 1;
        }
        const int64_t lr = j.lr;
        if (lr % CE_LABEL_CACHE == 0) { /* labels of the next CE_LABEL_CACHE rows, one parallel load */
            __syncthreads();
            for (int64_t i = threadIdx.x; i < CE_LABEL_CACHE && lr + i < my_rows; i += CE_THREADS)
                ycache[i] = ce_label(p, cid + (lr + i) * nclusters);
            __syncthreads();
        }
        j.row = cid + lr * nclusters;
        j.y = ycache[lr % CE_LABEL_CACHE];
        j.status = j.y == p.ignore_index ? 1 : (j.y < 0 || j.y >= V) ? 2 : 0;
        if (j.status) return j;
        const T *x = (const T *)p.logits + j.row * p.stride;
        j.sp = lf_row_span_make(x, V);
        lf_row_slice(j.sp, rank, nranks, &j.sbeg, &j.send);
        /* Loads issued here are consumed a job later: nothing may use their registers before
         * (a conversion right after the load would stall the warp for a memory latency). */
        j.edge_raw.j = -1;
        if (rank == 0) j.edge_raw = lf_row_edge_issue(x, j.sp);
        j.dl = (GRAD && p.dloss && p.reduction == LF_REDUCE_NONE) ? p.dloss[j.row] : 1.0f;
        j.x_y = (GRAD && threadIdx.x == 0) ? lf_elem<T>::to_f32(x[j.y]) : 0.0f;
        return j;
    };
    auto piece_range = [&](const ce_job &j, int *pb, int *pe) {
        const int piece = j.k < npieces ? j.k : 2 * npieces - 2 - j.k;
        *pb = min(j.send, j.sbeg + piece * CE_PIECE_VECS);
        *pe = min(j.send, *pb + CE_PIECE_VECS);
    };
    auto issue = [&](const ce_job &j, uint4 *b) {
        if (j.status) return;
        int pb, pe;
        piece_range(j, &pb, &pe);
        lf_piece_load<CE_THREADS>(b, (const T *)p.logits + j.row * p.stride, j.sp, pb, pe);
    };

    /* The fast path (lf_piece_stats_fast, lf_piece_grad_fast) serves everything but the softcap
     * and class weights; its gradient also needs no label smoothing. */
    const bool fast = !SOFTCAP && p.class_w == nullptr;
    const bool fast_grad = fast && p.eps == 0.0f;
    lf_row_stats st = lf_row_stats_init();
    lf_lazy_argmax la = lf_lazy_argmax_init();
    lf_grad_coef coef;
    memset(&coef, 0, sizeof coef);
    if (threadIdx.x < CE_SLOTS) { /* published by start_job's barrier */
        am_key[threadIdx.x] = lf_argmax_key(-LF_INF_F);
        am_nan[threadIdx.x] = INT_MAX;
        lf_mbar_init(&row_bar[threadIdx.x], CE_THREADS);
    }
    unsigned bar_phase = 0; /* bit q: parity of row_bar[q]'s next phase */
    /* Forward only (fast path, no cluster): a row's statistics are merged one job late. Each
     * thread posts its warp's partial and arrives on row_bar; the merge and the outputs follow
     * after the next job's piece, by when the other warps have long arrived: no thread waits
     * for the slowest warp at the end of every row (measured: that wait cost ~2.5 us per row). */
    const bool defer = !GRAD && fast && nranks == 1;
    struct pending_row { int64_t row, y; int slot; int64_t jj; lf_edge edge; } pend;
    bool pending = false;
    pend.row = pend.y = pend.jj = 0;
    pend.slot = 0;
    pend.edge.j = -1;
    pend.edge.x = 0.0f;
    float fast_k = 0.0f;

    /* A NaN or +inf in the row (s is NaN): the first NaN, if any, is the argmax (lf_argmax's
     * rule). Rare: scan the CTA's slice in global memory. Called by all threads alike. */
    auto nan_argmax = [&](int64_t row, const lf_edge &edge, int slot, lf_argmax &am) {
        const T *x = (const T *)p.logits + row * p.stride;
        const lf_row_span sp = lf_row_span_make(x, V);
        int sbeg, send;
        lf_row_slice(sp, rank, nranks, &sbeg, &send);
        const uint4 *xbody = reinterpret_cast<const uint4 *>(x + sp.head);
        int32_t found = INT_MAX;
        if (edge.j >= 0 && edge.x != edge.x) found = edge.j;
        const int32_t j = lf_piece_find<CE_THREADS, T>(xbody + sbeg, sp, sbeg, send, 0.0f, true);
        if (j >= 0) found = min(found, j);
        if (found != INT_MAX) atomicMin(&am_nan[slot], found);
        __syncthreads();
        if (am_nan[slot] != INT_MAX) {
            am.v = NAN;
            am.i = am_nan[slot];
        }
    };

    /* The deferred forward-only merge of a posted row (all threads). */
    auto finish_pending = [&]() {
        const int q = pend.slot;
        lf_mbar_wait(&row_bar[q], (bar_phase >> q) & 1u);
        bar_phase ^= 1u << q;
        lf_row_stats rs = lf_row_stats_init();
        rs.am.v = 0.0f;
        rs.lse = lf_block_lse_merge<CE_THREADS, FULL>(&rs.am.v, &rs.am.i, &rs.wz, reinterpret_cast<const float *>(red[q]));
        if (FULL && rs.lse.s != rs.lse.s) { /* uniform: every thread holds the same s */
            nan_argmax(pend.row, pend.edge, q, rs.am);
            __syncthreads(); /* all have read am_nan[q] before thread 0 resets it below */
        }
        if (threadIdx.x == 0) {
            ce_row_outputs<FULL, SOFTCAP>(p, pend.row, pend.y, rs, xy_s[q]);
            /* every thread has arrived (so is past this row's atomics), and the slot's next row
             * is three rows on: reset it now */
            am_key[q] = lf_argmax_key(-LF_INF_F);
            am_nan[q] = INT_MAX;
        }
        pending = false;
    };
    int par = 0;
    ce_job cur;
    memset(&cur, 0, sizeof cur);
    if (njobs > 0) {
        cur = start_job(0, cur);
        issue(cur, buf0);
    }
    lf_cp_async_commit();
    for (int64_t jj = 0; jj < njobs; ++jj) {
        uint4 *const b = (jj & 1) ? buf1 : buf0;
        if (cur.k == 0) cur.edge = lf_edge_resolve<T>(cur.edge_raw); /* loaded a job ago */
        ce_job nxt = cur;
        if (jj + 1 < njobs) {
            nxt = start_job(jj + 1, cur);
            issue(nxt, (jj & 1) ? buf0 : buf1); /* that buffer held job jj-1: already consumed */
        }
        lf_cp_async_commit();
        lf_cp_async_wait<1>(); /* job jj's copies (this thread's) have landed */

        const int64_t row = cur.row;
        T *out = GRAD ? (T *)p.grad + row * p.grad_stride : nullptr;
        if (cur.status) {
            if (cur.k == 0) {
                if (GRAD) lf_row_zero<CE_THREADS>(out, V, rank, nranks);
                if (rank == 0 && threadIdx.x == 0) ce_row_outputs_zero(p, row, cur.status);
            }
        } else {
            int pb, pe;
            piece_range(cur, &pb, &pe);
            const int piece = cur.k < npieces ? cur.k : 2 * npieces - 2 - cur.k;
            bool write_now = false;
            if (cur.k < npieces) { /* statistics pass */
                if (piece == 0) {
                    st = lf_row_stats_init();
                    la = lf_lazy_argmax_init();
                    lf_edge_stats<FULL, SOFTCAP>(st, cur.edge, p.xf, p.class_w);
                }
                if (fast) lf_piece_stats_fast<CE_THREADS, T, FULL>(st, la, &am_key[par], b, cur.sp, pb, pe, p.xf, p.eps > 0.0f);
                else lf_piece_stats<CE_THREADS, T, FULL, SOFTCAP>(st, b, cur.sp, pb, pe, p.xf, p.class_w);
                if (!GRAD) {
                    /* The label logit: the thread that staged it (or holds it as an edge element)
                     * leaves it for the row's output thread; the reduction's barrier orders the
                     * two. Forward only: there a load of x[y] by thread 0 (converted at once, so
                     * warp 0 waits a memory latency per row) measured 8-11% slower; with the
                     * gradient the reverse was measured (thread 0's load 8-15% faster than this
                     * block; bench/RESULTS.md), so GRAD kernels keep the load. */
                    float xv;
                    if (ce_label_held<CE_THREADS, T>(b, cur.sp, pb, pe, cur.edge, piece == 0, cur.y, &xv)) xy_s[par] = xv;
                }
                if (piece == npieces - 1) {
                    lf_argmax cand = st.am;
                    if (fast) {
                        /* the thread's argmax candidate: its edge element (exact) or its body's */
                        if (la.v > cand.v || (la.v == cand.v && la.i >= 0 && (cand.i < 0 || la.i < cand.i))) {
                            cand.v = la.v;
                            cand.i = la.i;
                        }
                    }
                    if (defer) {
                        if (pending) finish_pending(); /* the previous row's (one-piece rows) */
                        lf_block_lse_post<CE_THREADS, FULL>(st.lse, cand.v, cand.i, st.wz, reinterpret_cast<float *>(red[par]));
                        lf_mbar_arrive(&row_bar[par]);
                        pending = true;
                        pend.row = row;
                        pend.y = cur.y;
                        pend.slot = par;
                        pend.jj = jj;
                        pend.edge = cur.edge;
                        par = par == CE_SLOTS - 1 ? 0 : par + 1;
                    } else {
                        if (fast) {
                            /* The next slot's row-state is free (its last row was three rows
                             * ago: every thread is past its barrier) and nobody uses it before
                             * the next row, which starts after the barrier below: reset it. */
                            const int nx = par == CE_SLOTS - 1 ? 0 : par + 1;
                            if (FULL && threadIdx.x == 0) {
                                am_key[nx] = lf_argmax_key(-LF_INF_F);
                                am_nan[nx] = INT_MAX;
                            }
                            st.lse = lf_block_lse_fast<CE_THREADS, FULL>(st.lse, &cand.v, &cand.i, &st.wz,
                                                                         reinterpret_cast<float *>(red[par]));
                            if (FULL) {
                                if (st.lse.s != st.lse.s) nan_argmax(row, cur.edge, par, cand);
                                st.am = cand;
                            }
                        } else if (FULL) {
                            st = lf_block_row_stats<CE_THREADS>(st, red[par]);
                        } else {
                            /* the plain loss needs only (m, s): a 3-word merge instead of the 7-word one */
                            st.lse = lf_block_lse<CE_THREADS>(st.lse, reinterpret_cast<lf_lse *>(red[par]));
                        }
                        if (nranks > 1) st = lf_cluster_row_stats(st, &xchg[par]);
                        const int rpar = par;
                        par = par == CE_SLOTS - 1 ? 0 : par + 1;
                        if (GRAD) {
                            const float lse = lf_lse_final(st.lse);
                            const float w_y = p.class_w ? __ldg(p.class_w + cur.y) : 1.0f;
                            const float wsum = (FULL && p.class_w) ? st.w : (float)V;
                            const float g = p.grad_scale * (p.reduction == LF_REDUCE_NONE ? cur.dl : dl_all);
                            coef = lf_grad_coef_make(g * inv_div, lse, p.eps, p.lam, w_y, wsum, V, p.xf);
                            lf_grad_coef_onto_max_for<T>(coef, st.lse.m, st.lse.s); /* p_j against m: no lse rounding */
                            fast_k = lf_grad_fast_k(coef);
                        }
                        /* the row's outputs: thread 0 (forward only: of the CTA that holds the label) */
                        if (threadIdx.x == 0 && rank == (GRAD ? 0 : lf_row_owner_rank<T>(cur.y, cur.sp, nranks)))
                            ce_row_outputs<FULL, SOFTCAP>(p, row, cur.y, st, GRAD ? cur.x_y : xy_s[rpar]);
                    }
                    write_now = GRAD; /* the last piece is still here */
                }
            } else {
                write_now = true; /* pieces n-2..0 of a row streamed in several pieces, read again */
            }
            if (GRAD && write_now) {
                const bool vec_ok = ((uintptr_t)out & 15u) == (uintptr_t)cur.sp.phase;
                if (piece == 0 && rank == 0) lf_edge_grad_store<FULL, SOFTCAP>(out, cur.edge, coef, p.xf, p.class_w);
                if (!(fast_grad && vec_ok &&
                      lf_piece_grad_fast_if_ok<CE_THREADS, T>(out, b, cur.sp, pb, pe, coef, fast_k, p.xf.scale_l2e)))
                    lf_piece_grad_store<CE_THREADS, FULL, SOFTCAP>(out, vec_ok, b, cur.sp, pb, pe, coef, p.xf, p.class_w);
                /* the label element, with x_y from the staged piece */
                ce_label_grad_patch<CE_THREADS, T, FULL, SOFTCAP>(out, b, cur.sp, pb, pe, cur.edge, piece == 0 && rank == 0, cur.y,
                                                                 coef, p);
            }
        }
        if (defer && pending && pend.jj < jj) finish_pending(); /* posted a job ago */
        cur = nxt;
    }
    if (defer && pending) finish_pending();
    lf_cp_async_wait<0>();
    if (nranks > 1) lf_cluster_sync(); /* no CTA leaves while another may still read its xchg */
    if (rank != 0 || p.reduction == LF_REDUCE_NONE) return;

    /* Rank 0 of each cluster wrote its rows' losses (the others wrote none): it counts. */
    ce_batch_reduce<CE_THREADS>(p, (unsigned long long)nclusters, fin, &is_last);
}

/* ---- The row-resident schedule (sm_90) ----------------------------------------------------
 * Each CTA (or CTA of a cluster: its slice of the row) holds a ring of `nstages` shared-memory
 * stages, each one whole row slice, loaded by ONE bulk copy (lf_bulk_load: the copy engine, no
 * per-thread copies or address arithmetic) that completes on the stage's mbarrier. So every
 * element is read from HBM once, then from shared memory two or three times, never from L2.
 *   Two warp groups (blockDim = (CE_RES_GROUP, 2)) take alternate rows of the CTA and share the
 * ring: while one reduces, waits on its barriers or exchanges statistics with the cluster, the
 * other computes, so the SM's pipes stay busy although each group's row pass is a chain of
 * dependent phases (measured: one group of 512 threads left a third of the time idle). Each group
 * reduces with its own named barrier (lf_block_* with bar = 1 + group) and, in a cluster,
 * exchanges its rows' statistics with the same group of the other CTAs through its own mbarriers
 * (lf_cluster_stats_post / _collect): no cluster barrier per row.
 *   Per row: wait for the stage, statistics, block merge (+ cluster merge), gradient from the
 * stage, a group barrier, then the group's thread 0 reloads the stage with the row nstages
 * further on (its label was loaded at the row's start). A stage is used by both groups in turn,
 * so before waiting on its mbarrier a group checks the stage's ticket (stage_k: the local row it
 * was last loaded with): a parity wait must not start before the stage's previous use has
 * completed, or it would return at once on that older phase.
 *   One CTA per SM (the ring takes most of the shared memory); a cluster takes consecutive
 * blockIdx.x and processes the same rows; every CTA counts itself for the batch sum.
 *   Which rows a CTA takes: static, a fixed share per cluster (cid, cid + nclusters, ...). Dynamic
 * (dyn, the default) the ring's first rows are that share, then the rows are handed out by an
 * atomic counter in the workspace when a stage is reloaded (drawn after the stage's row is known
 * to be valid, its label loaded and its slice prefetched into L2 during the statistics pass, so
 * that nothing waits for the draw): measured on an H200, CTAs with a fixed share each finished up
 * to 17% apart (some SMs get more of the memory bandwidth), and the launch lasts as long as the
 * slowest. In a cluster rank 0 draws, and its exchange (lf_ring_next, on the same mbarrier phase)
 * carries the row and its label to the peers, which prefetch their slices and reload the stage
 * with them after the collect (an ignored row, which has no statistics, still exchanges). A
 * draw past the last row ends the group: it passes the end on to its stage's next user and
 * stops (every CTA of a cluster meets it at the same local row). The batch sums are the
 * CTAs' order-free sums (ce_batch_reduce_xsum), so the results do not depend on who took what. */
#ifndef CE_RES_GROUP
#define CE_RES_GROUP 256 /* threads per warp group */
#endif
#ifndef CE_RES_GROUPS
#define CE_RES_GROUPS 2 /* warp groups per CTA: rows in flight per SM (the ring needs one stage more) */
#endif
#define CE_RES_THREADS (CE_RES_GROUPS * CE_RES_GROUP)
#ifndef CE_RES_MIN_STAGES
#define CE_RES_MIN_STAGES 3 /* the automatic plan needs this many stages of a row slice */
#endif
#ifndef CE_RES_MIN_SLICE
#define CE_RES_MIN_SLICE 8192 /* bytes: smaller rows stay with the streaming schedule */
#endif
#ifndef CE_RES_MAX_STAGES
#define CE_RES_MAX_STAGES 8 /* the ring's stages at most (static arrays of this size per CTA) */
#endif
#ifndef CE_RES_PREFETCH
#define CE_RES_PREFETCH 1 /* rows beyond the ring prefetched into L2 (0: none; measured: 1 best) */
#endif
#ifndef CE_RES_POLY
#define CE_RES_POLY 0 /* of each 8 elements, exponentials on the FMA pipe (lf_ex2_fma), fast path */
#endif

/* CE_RES_TRACE (a diagnostic build, off by default): thread 0 of each group adds the SM cycles
 * of each phase of its rows to ce_res_trace[] (0 waiting for the stage, 1 statistics, 2 block
 * merge, 3 cluster exchange, 4 gradient and outputs, 5 the group barrier and the reload, 6 rows,
 * 7 cycles from the start to the end of the row loop); bench_ce prints the shares. */
#ifdef CE_RES_TRACE
__device__ unsigned long long ce_res_trace[8];
/* and per CTA (the first 1024), %globaltimer ns at: entry, its first stage landed, the end of its
 * row loop (the later group), its exit (sum / mean) */
__device__ unsigned long long ce_res_times[1024][4];
static __device__ __forceinline__ unsigned long long ce_gtime(void) { return lf_globaltimer_ns(); }
#define CE_TR(i)                                                                                   \
    do {                                                                                           \
        if (threadIdx.x == 0) {                                                                    \
            const long long t_ = clock64();                                                        \
            tr_[i] += (unsigned long long)(t_ - tl_);                                              \
            tl_ = t_;                                                                              \
        }                                                                                          \
    } while (0)
#else
#define CE_TR(i) \
    do {         \
    } while (0)
#endif

/* What rank 0 of a cluster hands its peers with a row's exchange where rows are handed out
 * dynamically (lf_ring_next): the row its stage takes next and, as the tag, that row's label as
 * far as the peers use it: a valid label, -1 ignored, -2 bad (a peer only needs which; rank 0,
 * which writes the row's outputs and counts bad labels, keeps its own). Two words: this rides on
 * every row's exchange, and the ring's shared memory is tight (at V = 151936 in bf16, three
 * stages of a cluster of 4 leave 0-48 bytes). */
static __device__ __forceinline__ lf_ring_next ce_next_pack(const ce_kparams &p, int64_t yv, int64_t row, int64_t y)
{
    return lf_ring_next_make(row, y == p.ignore_index ? -1 : (y < 0 || y >= yv) ? -2 : (int32_t)y);
}
/* a label with the tag's status: the label, the ignore index, or some bad label */
static __device__ __forceinline__ int64_t ce_next_label(const ce_kparams &p, int64_t yv, const lf_ring_next &n)
{
    if (n.tag >= 0) return n.tag;
    if (n.tag == -1) return p.ignore_index;
    return p.ignore_index == yv ? yv + 1 : yv; /* outside [0, yv), not the ignore index */
}

/* The row-resident kernel's exchange hook (its template parameter X, argument xc): what a row
 * waits for between its statistics and its gradient while it stays in its stage, so that it is
 * still read from HBM once. Cross-entropy waits for nothing: ce_xchg_none, compiled out.
 * examples/vocab_parallel_ce.cu's tp_res_xchg (X::on) runs the vocabulary-parallel exchange:
 * the kernel's rows are then one rank's SHARDS of wider rows (p.vocab their width), the labels
 * are global (valid in [0, xc.V), the shard holding [xc.v0, xc.v0 + p.vocab)), every thread
 *   reads the launch's generation once, g = xc.generation() (a replay of a captured launch
 *   takes a new one on the device), and per row
 *   - every CTA makes this rank's share of the row from the cluster-merged statistics,
 *     xc.share(stats, has_y, z_y, w_y) (has_y only in the CTA that holds the label's logit,
 *     else the cluster's rank 0: the publisher, which also writes the row's outputs), and one
 *     thread of the publisher sends it to the other ranks: xc.publish(row, share, g);
 *   - every warp of the group takes the other ranks' shares and merges them with its own, the
 *     same bits everywhere: xc.collect(row, y, w_y, share, &merged, g) (false: the launch gave up:
 *     NaN outputs; the lse, from the shares' m and s, is whole in every CTA, the loss only in
 *     the publisher);
 *   - the gradient and the outputs use the merged lse and loss, the label's global weight
 *     xc.label_weight(y) and the global weight sum xc.wsum();
 * and the launch's last CTA calls xc.end(g) after its batch sum (the hook's own end-of-launch
 * protocol, e.g. a barrier with the other ranks before its slots are reused). X::groups: the
 * warp groups of a CTA (the CTA keeps CE_RES_THREADS threads: more groups, smaller ones, more
 * rows in flight to hide what a row waits for); X::min_stages: the least ring the automatic plan
 * takes (deeper rings keep loads in flight while rows wait). */
struct ce_xchg_none {
    static constexpr bool on = false;
    static constexpr int groups = CE_RES_GROUPS;
    static constexpr int min_stages = CE_RES_MIN_STAGES; /* the automatic plan's least ring */
};

/* ---- A sparse soft target instead of a label (the hook ce_soft) -----------------------------
 * examples/kl_distill.cu's sparse teacher (top-k pairs) runs here: it is cross-entropy against a
 * target distribution q that is one value, rest[row], everywhere except at k listed entries,
 *     q_j = rest[row]                                   j not listed
 *     q_j = exp(lq[row * ld + i] * lq_scale - shift[row])   j = idx[row * ld + i], i < k
 * (distinct indices in [0, V): the caller checks them). Per row whose label is not ignore_index
 * (the label's value is not used otherwise), with FULL:
 *     ce   = lse - sum_j q_j z_j                soft-target cross-entropy
 *     loss = (ce, or ce - H(q) with sub_ent: the KL to the target) * loss_scale * w[row]
 *     grad = g (p_j - q_j) dz/dx                g: as for a label (grad_scale, dloss, 1 / divisor,
 *                                               p.xf.scale), times w[row]
 * (loss_scale is not in g: a caller that scales both folds it into grad_scale too), reduced as
 * p.reduction says, and per row, where asked, ce - H(q), H(p) and H(q) (kl_out, ent_p_out,
 * ent_q_out: without scale or weight; NaN where p or q has no finite lse, 0 for ignored rows).
 * It is label smoothing with a per-row mass (the gradient writer's e = g q_rest) and k labels.
 * The row is still read from HBM once:
 *   - the statistics pass sums z, as for label smoothing; each thread takes q_rest times its
 *     own sum, and for the listed pairs i = t, t + TH, ... (t its index in the group) whose
 *     column its CTA holds, (q_i - q_rest) z_i, read from the staged slice (rank 0 reads the row's
 *     edge elements from global memory: nothing of the row has been written yet). All of it goes
 *     into the statistics' wz before the block merge, so the merges sum it;
 *   - the gradient is written as for smoothing, and after the row's end barrier each thread
 *     patches the listed entries it read (their logits kept in registers, CE_SOFT_PAIRS each: k
 *     <= CE_SOFT_PAIRS x CE_RES_GROUP) to g (p_i - q_i): the barrier orders its store after the
 *     dense one of whichever thread wrote that element.
 * 0 x (-inf) is 0: a student -inf entry where the target has no mass adds nothing; where it has
 * some, the loss is +inf, even where fp32 flushes that mass to 0 (as lossfuse.h's reference:
 * the target's log-value decides): for a listed entry a finite lq, for the others rest > 0 (a
 * caller whose rest underflows passes FLT_TRUE_MIN). A thread whose own z sum came out -inf
 * sums q_rest z over its finite elements again (no overflow at finfo.min masks) and looks its
 * -inf ones up in the list: rare, masked vocabularies. A NaN shift or rest makes the row NaN.
 *
 * ce_soft_rev (the same fields; rest then holds log q_rest: -inf where the other entries have no
 * mass, NaN for a bad row) takes the reverse KL(p || q) instead, still one read of the row:
 *     KL   = sum_j p_j (z_j - lse - log q_j) = u / s - log s
 *            over the row's merged state (m, s, u) (lossfuse.h lf_lse), once each entry's term
 *            e^{z_j - m} (z_j - m) in u carries its - e^{z_j - m} log q_j as well (u moves with m
 *            as e^{z - m} does, so the merges carry it exactly). Where q_rest > 0 the listed
 *            entries leave the statistics pass (ce_soft_mark_rev: -inf in the staged slice, an
 *            edge element flagged, one more barrier of the group per row), each thread takes
 *            log q_rest s off its own u, and the pairs' holders add their entries with their
 *            own log q_i (ce_soft_terms_rev). So the unlisted mass is summed, never found as
 *            1 minus the listed (which, times a log q_rest of hundreds of nats at temperature
 *            0.05, cost 0.002-0.004 nats in fp32: session 51). Where q_rest = 0 nothing is
 *            marked: the pass sums every entry and the holders take e^{z_i - m} log q_i off u.
 *     loss = KL * loss_scale * w[row]
 *     grad = g p_j (z_j - lse - log q_j - KL) dz/dx   (lf_ce_grad_elem's RKL form: for the
 *            entries not listed one zc per row, the listed ones patched after the row's end)
 * +inf where p has mass that q lacks: a listed pair at log q_i = -inf under a student entry that
 * is not -inf, or, where q_rest = 0, a student entry that is not -inf off the list (counted:
 * each thread's elements that are not -inf, minus its listed pairs', summed by the merges in
 * wz, which holds that count instead of the z sum; the z sum's -inf tells a thread to count its
 * elements one by one); and, as kl_distill.cu's dense kernels (lf_kl_rev_fit), a finite KL past
 * FLT_MAX ln 2 (a listed log q_i near -FLT_MAX under the student's mass). An infinite or NaN KL
 * gives a NaN gradient row (lossfuse.h's reference).
 * H(p) is not available (u holds the pairs' terms): ent_p_out must be NULL. */
#ifndef CE_SOFT_PAIRS
#define CE_SOFT_PAIRS 2
#endif
struct ce_soft {
    static constexpr bool on = false;
    static constexpr bool rev = false; /* the reverse KL (ce_soft_rev) */
    static constexpr int groups = CE_RES_GROUPS;
    static constexpr int min_stages = CE_RES_MIN_STAGES;
    const int32_t *idx;  /* [N, ld]: the listed columns */
    const float *lq;     /* [N, ld]: their target log-probabilities, up to lq_scale and the row's shift */
    int64_t k, ld;       /* 0 <= k <= CE_SOFT_PAIRS * CE_RES_GROUP */
    float lq_scale;
    const float *shift;  /* [N] */
    const float *rest;   /* [N]: q of every entry not listed (0: none; where it has mass, at least FLT_TRUE_MIN) */
    const float *ent_q;  /* [N]: H(q), NaN where q has no finite lse (the row is NaN then); NULL: taken as 0
                          * (then sub_ent and ent_q_out mean nothing) */
    const float *w;      /* [N] row weights, or NULL */
    int sub_ent;         /* the loss is ce - H(q) */
    float loss_scale;
    float *kl_out, *ent_p_out, *ent_q_out; /* optional [N] */
};
struct ce_soft_rev : ce_soft {
    static constexpr bool rev = true;
};
template <class X>
struct ce_is_soft {
    static constexpr bool value = false;
};
template <>
struct ce_is_soft<ce_soft> {
    static constexpr bool value = true;
};
template <>
struct ce_is_soft<ce_soft_rev> {
    static constexpr bool value = true;
};
template <class X> /* (a trait: the other hooks, ce_xchg_none and the exchanges, have no rev) */
struct ce_is_soft_rev {
    static constexpr bool value = false;
};
template <>
struct ce_is_soft_rev<ce_soft_rev> {
    static constexpr bool value = true;
};

/* a listed entry a thread read (j < 0: none): its column, raw logit and target probability */
typedef struct ce_soft_pair {
    int32_t j;
    float x, q;
} ce_soft_pair;

/* Whether this CTA holds column j of the row (its body slice [sb, se) staged in b; the edge
 * elements for rank 0, read from the row x in global memory), and then *xv, its raw logit. */
template <typename T>
static __device__ __forceinline__ bool ce_soft_held(const T *x, const uint4 *b, const lf_row_span &sp, int sb, int se,
                                                    bool edges, int64_t j, float *xv)
{
    const int PV = lf_elem<T>::per_vec;
    const int64_t jb = j - sp.head;
    if (jb < 0 || jb >= (int64_t)sp.nvec * PV) {
        if (!edges) return false;
        *xv = lf_elem<T>::to_f32(x[j]);
        return true;
    }
    const int v = (int)(jb / PV);
    if (v < sb || v >= se) return false;
    *xv = lf_elem<T>::get(b[v - sb], (int)(jb % PV));
    return true;
}

/* The rare case: this thread's own z sum is -inf (one of its elements is -inf, or finfo.min
 * entries overflowed it). Its part of q_rest sum_{j not listed} z_j again: q_rest z summed over
 * its finite elements (each term first: finfo.min entries stay finite), or -inf where one of
 * its -inf elements is not listed while q_rest > 0 (a listed one is its pair's term: lq_i
 * decides). k compares per -inf element. */
template <int TH, typename T, bool SOFTCAP>
static __device__ __noinline__ float ce_soft_own_rare(const uint4 *b, const lf_row_span &sp, int sb, int se, const lf_edge &edge,
                                                      const int32_t *ix, int64_t k, float q_rest, const lf_xform t)
{
    const int PV = lf_elem<T>::per_vec;
    float s = 0.0f;
    bool inf = false;
    auto one = [&](float xv, int64_t j) {
        const float z = lf_xform_apply<SOFTCAP>(xv, t);
        if (z != -LF_INF_F) {
            s = fmaf(q_rest, z, s);
            return;
        }
        if (inf || !(q_rest > 0.0f)) return;
        for (int64_t i = 0; i < k; ++i)
            if (__ldg(ix + i) == (int32_t)j) return;
        inf = true;
    };
    for (int v = sb + (int)threadIdx.x; v < se; v += TH) {
        float xs[PV];
        lf_elem<T>::unpack(b[v - sb], xs);
        for (int e = 0; e < PV; ++e) one(xs[e], sp.head + (int64_t)v * PV + e);
    }
    if (edge.j >= 0) one(edge.x, edge.j);
    if (q_rest != q_rest) return q_rest; /* a NaN target: the row is NaN */
    return inf ? -LF_INF_F : q_rest > 0.0f ? s : 0.0f;
}

/* The thread's listed pairs i = t, t + TH, ... (t its index in the group) of the row, loaded
 * at the row's start: pr[u].j the column (-1: none), pr[u].q the raw lq for now. */
template <int TH>
static __device__ __forceinline__ void ce_soft_pairs_load(ce_soft_pair *pr, const ce_soft &xc, int64_t row)
{
#pragma unroll
    for (int u = 0; u < CE_SOFT_PAIRS; ++u) {
        const int64_t i = (int64_t)threadIdx.x + (int64_t)u * TH;
        pr[u].j = i < xc.k ? __ldg(xc.idx + row * xc.ld + i) : -1;
        pr[u].q = i < xc.k ? __ldg(xc.lq + row * xc.ld + i) : 0.0f;
    }
}

/* This thread's part of sum_j q_j z_j, into st.wz (which held its own sum of z) before the block
 * merge: q_rest times that sum, and (q_i - q_rest) z_i for its pairs (ce_soft_pairs_load) whose
 * columns this CTA holds, which keep their raw logit and q_i in pr[] for the gradient's patch
 * (the others: j = -1). */
template <int TH, typename T, bool SOFTCAP>
static __device__ __forceinline__ void ce_soft_terms(lf_row_stats &st, ce_soft_pair *pr, const ce_soft &xc, int64_t row,
                                                     float q_rest, float shift, const T *x, const uint4 *b,
                                                     const lf_row_span &sp, int sb, int se, const lf_edge &edge, bool edges,
                                                     const lf_xform &t)
{
    float acc = st.wz == -LF_INF_F ? ce_soft_own_rare<TH, T, SOFTCAP>(b, sp, sb, se, edge, xc.idx + row * xc.ld, xc.k, q_rest, t)
                                   : q_rest * st.wz;
#pragma unroll
    for (int u = 0; u < CE_SOFT_PAIRS; ++u) {
        float xv;
        if (pr[u].j < 0) continue;
        if (!ce_soft_held<T>(x, b, sp, sb, se, edges, pr[u].j, &xv)) {
            pr[u].j = -1; /* another CTA's column */
            continue;
        }
        const float lq = pr[u].q, q = expf(fmaf(lq, xc.lq_scale, -shift));
        const float z = lf_xform_apply<SOFTCAP>(xv, t);
        if (z == -LF_INF_F) {
            if (lq > -LF_INF_F) acc = -LF_INF_F; /* mass (if only below fp32's range) where the student has none */
        } else {
            acc = fmaf(q - q_rest, z, acc);
        }
        pr[u].x = xv;
        pr[u].q = q;
    }
    st.wz = acc;
}

/* The elements of this thread's part of the row (its body vectors, its edge element) that are not
 * -inf, one by one: where its z sum came out -inf (an element -inf, or finfo.min ones overflowed
 * it). Rare: masked vocabularies. */
template <int TH, typename T, bool SOFTCAP>
static __device__ __noinline__ float ce_soft_rev_count_rare(const uint4 *b, int sb, int se, const lf_edge &edge, const lf_xform t)
{
    const int PV = lf_elem<T>::per_vec;
    int n = 0;
    for (int v = sb + (int)threadIdx.x; v < se; v += TH) {
        float xs[PV];
        lf_elem<T>::unpack(b[v - sb], xs);
        for (int e = 0; e < PV; ++e) n += lf_xform_apply<SOFTCAP>(xs[e], t) != -LF_INF_F;
    }
    if (edge.j >= 0) n += lf_xform_apply<SOFTCAP>(edge.x, t) != -LF_INF_F;
    return (float)n;
}

/* ce_soft_rev where q_rest > 0 (lr finite), before the statistics pass: this thread's listed
 * pairs that the CTA holds take their raw logit (pr[u].x) and log q_i (pr[u].q), and their entries
 * leave the pass: a body entry becomes -inf in the staged slice b (then lf_fence_proxy_async_smem:
 * the stage's next bulk load is the async proxy's write over it), an edge element (rank 0's, read
 * from x) is flagged in *emask, bit = its thread (lf_row_edge_issue: threads 0..7 the head,
 * 8..15 the tail). The pairs of other CTAs: pr[u].j = -1. The group's barrier follows. */
template <typename T>
static __device__ __forceinline__ void ce_soft_mark_rev(ce_soft_pair *pr, const ce_soft &xc, float shift, const T *x, uint4 *b,
                                                        const lf_row_span &sp, int sb, int se, bool edges, unsigned *emask)
{
    const int PV = lf_elem<T>::per_vec;
    bool wrote = false;
#pragma unroll
    for (int u = 0; u < CE_SOFT_PAIRS; ++u) {
        if (pr[u].j < 0) continue;
        const int32_t j = pr[u].j;
        const int64_t jb = (int64_t)j - sp.head;
        if (jb < 0 || jb >= (int64_t)sp.nvec * PV) {
            if (!edges) {
                pr[u].j = -1;
                continue;
            }
            pr[u].x = lf_elem<T>::to_f32(x[j]);
            atomicOr(emask, 1u << (jb < 0 ? j : 8 + (int)(jb - (int64_t)sp.nvec * PV)));
        } else {
            const int v = (int)(jb / PV);
            if (v < sb || v >= se) {
                pr[u].j = -1;
                continue;
            }
            T *e = reinterpret_cast<T *>(b + (v - sb)) + (int)(jb % PV);
            pr[u].x = lf_elem<T>::to_f32(*e);
            *e = lf_elem<T>::from_f32(-LF_INF_F);
            wrote = true;
        }
        pr[u].q = fmaf(pr[u].q, xc.lq_scale, -shift);
    }
    if (wrote) lf_fence_proxy_async_smem();
}

/* ce_soft_rev's part of ce_soft_terms, by each thread before the block merge: its listed pairs'
 * terms into st.lse, and in st.wz (its z sum until now) the entries where p has mass that q
 * lacks, counted (see ce_soft_rev). lr = log q_rest. marked: ce_soft_mark_rev ran (lr finite;
 * pr[] holds the raw logits and log q_i already, the pass left the pairs out): u takes lr s off,
 * and each pair adds e^{z_i - m} to s and e^{z_i - m} (z_i - m - log q_i) to u. Not marked
 * (lr -inf or NaN): the pass summed the pairs, whose - e^{z_i - m} log q_i joins u. The pairs
 * it holds keep their raw logit and log q_i in pr[] for the gradient's patch. */
template <int TH, typename T, bool SOFTCAP>
static __device__ __forceinline__ void ce_soft_terms_rev(lf_row_stats &st, ce_soft_pair *pr, const ce_soft &xc, float lr,
                                                         float shift, bool marked, const T *x, const uint4 *b,
                                                         const lf_row_span &sp, int sb, int se, const lf_edge &edge,
                                                         bool edges, const lf_xform &t)
{
    const bool none_off = lr == -LF_INF_F; /* q has no mass off the list */
    float bad = 0.0f;
    if (none_off) { /* this thread's elements not -inf, less (below) its listed ones not -inf */
        if (st.wz == -LF_INF_F) {
            bad = ce_soft_rev_count_rare<TH, T, SOFTCAP>(b, sb, se, edge, t);
        } else {
            const int nv = (int)threadIdx.x < se - sb ? (se - sb - 1 - (int)threadIdx.x) / TH + 1 : 0;
            bad = (float)(nv * lf_elem<T>::per_vec + (edge.j >= 0));
        }
    }
    if (marked) st.lse.u = fmaf(-lr, st.lse.s, st.lse.u); /* e^{z_j - m} (z_j - m - log q_rest) */
#pragma unroll
    for (int u = 0; u < CE_SOFT_PAIRS; ++u) {
        if (pr[u].j < 0) continue;
        if (!marked) {
            float xv;
            if (!ce_soft_held<T>(x, b, sp, sb, se, edges, pr[u].j, &xv)) {
                pr[u].j = -1; /* another CTA's column */
                continue;
            }
            pr[u].x = xv;
            pr[u].q = fmaf(pr[u].q, xc.lq_scale, -shift); /* log q_i */
        }
        const float lq = pr[u].q;
        const float z = lf_xform_apply<SOFTCAP>(pr[u].x, t);
        if (z == -LF_INF_F) continue; /* no mass, and not counted above */
        if (none_off) bad -= 1.0f;
        if (marked && !(z < LF_INF_F)) { /* a NaN or +inf the pass did not see: the row is NaN */
            st.lse.s = NAN;
            continue;
        }
        if (lq == -LF_INF_F) {
            bad += 1.0f; /* q_i = 0 under p_i's (if only below fp32's range) mass */
            continue;
        }
        if (lf_massless(z)) continue; /* finfo.min: no mass (lossfuse.h's reference) */
        if (z > st.lse.m) { /* (another thread summed it, or nobody did: this one's maximum may lie below) */
            lf_impl_lse_rescale(st.lse.m, z, &st.lse.s, &st.lse.u);
            st.lse.m = z;
        }
        const float e = lf_exp_diff(z, st.lse.m);
        if (marked) {
            st.lse.s += e;
            st.lse.u = fmaf(e, fmaxf(z - st.lse.m, -3.402823466e38f) - lq, st.lse.u); /* (as lf_lse_push) */
        } else {
            st.lse.u = fmaf(-e, lq, st.lse.u);
        }
    }
    st.wz = bad;
}

/* ce_soft_rev: the row's KL from its merged statistics (rs.wz: the count of ce_soft_terms_rev)
 * and lr = log q_rest; NaN where p has no finite lse or the target is bad (lr NaN); +inf for a
 * support mismatch, or a KL past FLT_MAX ln 2 (as lf_kl_rev_fit). */
static __device__ __forceinline__ float ce_soft_rev_kl(const lf_row_stats &rs, float lr)
{
    if (!(fabsf(lf_lse_final(rs.lse)) < LF_INF_F) || lr != lr) return NAN;
    if (rs.wz > 0.0f) return LF_INF_F;
    const float kl = rs.lse.u / rs.lse.s - logf(rs.lse.s);
    return kl < LF_INF_F && !(__fmul_rn(kl, LF_LOG2E) < LF_INF_F) ? LF_INF_F : kl;
}

/* A soft-target row's outputs, by one thread: its loss where the reduction finds it (acc, cache:
 * as ce_row_outputs) and the per-row values asked for. */
template <class S> /* (S = ce_soft: a template, so that a file without soft targets compiles none) */
static __device__ __forceinline__ void ce_soft_row_outputs(const ce_kparams &p, const S &xc, int64_t row, const lf_row_stats &rs,
                                                           lf_xsum *acc, lf_xsum_cache *cache)
{
    const float lse = lf_lse_final(rs.lse);
    const float h = xc.ent_q ? xc.ent_q[row] : 0.0f;
    const bool ok = fabsf(lse) < LF_INF_F && h == h;
    if constexpr (S::rev) { /* (the row's lr is NaN where h is: kl_topk_prep_kernel) */
        const float kl = ce_soft_rev_kl(rs, __ldg(xc.rest + row));
        if (xc.kl_out) xc.kl_out[row] = kl;
        if (xc.ent_q_out) xc.ent_q_out[row] = ok ? h : NAN;
        if (p.lse) p.lse[row] = lse;
        ce_row_loss_out(p, row, lse, kl * xc.loss_scale * (xc.w ? xc.w[row] : 1.0f), 0.0f, acc, cache, false);
        return;
    }
    float ce = (rs.lse.m - rs.wz) + logf(rs.lse.s); /* lse - sum q z, without lse's rounding */
    if (!(fabsf(lse) < LF_INF_F)) ce = NAN;
    const float kl = ce - h;
    if (xc.kl_out) xc.kl_out[row] = kl;
    if (xc.ent_p_out) xc.ent_p_out[row] = ok ? lf_lse_entropy(rs.lse) : NAN;
    if (xc.ent_q_out) xc.ent_q_out[row] = ok ? h : NAN;
    if (p.lse) p.lse[row] = lse;
    const float loss = (xc.sub_ent ? kl : ce) * xc.loss_scale * (xc.w ? xc.w[row] : 1.0f);
    ce_row_loss_out(p, row, lse, loss, 0.0f, acc, cache, false);
}

/* ... and an ignored row's per-row values: 0 (its loss: ce_row_outputs_zero) */
template <class S>
static __device__ __forceinline__ void ce_soft_row_zero(const S &xc, int64_t row)
{
    if (xc.kl_out) xc.kl_out[row] = 0.0f;
    if (xc.ent_p_out) xc.ent_p_out[row] = 0.0f;
    if (xc.ent_q_out) xc.ent_q_out[row] = 0.0f;
}

template <typename T, bool GRAD, bool FULL, bool SOFTCAP, bool DYN, class X = ce_xchg_none>
__global__ void __launch_bounds__(CE_RES_THREADS, 1)
    ce_resident_kernel(const ce_kparams p, int nranks, int nstages, int stage_vecs, int nclusters, const X xc)
{
    /* DYN, a template parameter: measured on an H200, the dynamic code compiled into the kernel
     * but not taken (a runtime flag) made the clustered rows 3% slower (bench/RESULTS.md) */
    constexpr bool dyn = DYN;
    constexpr int G = X::groups, TH = CE_RES_THREADS / G; /* the collectives run per group */
    constexpr bool SOFT = ce_is_soft<X>::value; /* a sparse soft target per row (ce_soft) */
    static_assert(!SOFT || FULL, "a soft target sums z as label smoothing does: FULL");
#ifdef CE_RES_TRACE
    unsigned long long tr_[6] = {0, 0, 0, 0, 0, 0};
    const long long t0_ = clock64();
    long long tl_ = t0_;
    unsigned long long rows_ = 0;
    if (threadIdx.x == 0 && threadIdx.y == 0 && blockIdx.x < 1024) ce_res_times[blockIdx.x][0] = ce_gtime();
    bool first_ = true;
#endif
    /* TH >= 64: a one-warp group's block merge has no barrier, which the label logit hand-off
     * (xy_s) relies on */
    static_assert(G >= 1 && G <= 8 && TH % 32 == 0 && TH >= 64 && TH * G == CE_RES_THREADS,
                  "CE_RES_GROUPS in 1..8, CE_RES_GROUP a multiple of 32, >= 64");
    static_assert(CE_RES_MAX_STAGES + CE_RES_PREFETCH <= TH, "the first rows' labels: a thread of one group each");
    /* A row's outputs (ce_row_outputs: a log, the order-free sums) are written by out_t, lane 0
     * of warp 1, after the barrier that ends the row, while thread 0 (of warp 0) reloads the
     * stage: the reload does not wait for them (measured on an H200: 0.3-1.2% faster at every
     * shape of the benchmark, most at V = 32K, than thread 0 writing them before the barrier). */
    constexpr int out_t = 32;
    /* [nstages][stage_vecs]. Aligned to 128 bytes: where the static variables above leave the
     * dynamic part matters. Measured on an H200 (bench/RESULTS.md, session 17), the same kernel
     * with its stages at 80 bytes past a 128-byte line was 4-6% slower at V = 131072 / 262144
     * than at 16 or 0; at V = 151936, 0 was 4-6% faster than 16. */
    extern __shared__ __align__(128) uint4 ce_res_smem[];
    __shared__ uint64_t full[CE_RES_MAX_STAGES];   /* a stage's slice has landed (phase per use) */
    __shared__ int64_t stage_y[CE_RES_MAX_STAGES + CE_RES_PREFETCH]; /* the label of the row in the stage;
                                                                   * first, those of the first rows */
    __shared__ uint32_t stage_row[CE_RES_MAX_STAGES]; /* dynamic: the row in the stage (< 2^32), UINT32_MAX:
                                                       * no more rows */
    __shared__ int64_t stage_k[CE_RES_MAX_STAGES];  /* the ticket: local row last loaded, -1 none */
    __shared__ __align__(16) lf_row_stats red[G][CE_SLOTS][TH / 32];
    __shared__ lf_row_stats xs[G][2][16];           /* cluster exchange: per group, two sets */
    __shared__ lf_ring_next xnx[G][2];              /* ... and rank 0's next row (dynamic) */
    __shared__ uint64_t xbar[G][2];
    __shared__ unsigned am_key[G][CE_SLOTS];
    __shared__ int am_nan[G][CE_SLOTS];
    __shared__ float xy_s[G][CE_SLOTS];
    __shared__ unsigned emask[G]; /* ce_soft_rev: the listed edge elements of the group's row (ce_soft_mark_rev) */
    __shared__ int is_last;

    const int grp = (int)threadIdx.y, bar = 1 + grp;
    const int rank = (int)(blockIdx.x % nranks);
    const int64_t cid = blockIdx.x / nranks, N = p.n_rows, V = p.vocab;
    int64_t YV = V; /* labels are valid in [0, YV): the row's width, or with an exchange the full row's */
    [[maybe_unused]] unsigned xgen = 0u; /* the exchange's launch generation, read once (xc.generation) */
    if constexpr (X::on) {
        YV = xc.V;
        xgen = xc.generation();
    }
    /* Rows: static, this cluster's cid, cid + nclusters, ... (local row k is the k-th); dynamic
     * (dyn, at most two groups), the first nstages the same, then whichever row the workspace's
     * counter hands out (from nclusters * nstages on) when a stage is reloaded, until it passes N.
     * In a cluster rank 0 draws and posts the row with its statistics (lf_ring_next). */
    const int64_t my_rows = dyn ? INT64_MAX : cid < N ? (N - 1 - cid) / nclusters + 1 : 0;
    const int64_t drawn0 = (int64_t)nclusters * nstages; /* dynamic: the counter's first row */
    /* sum / mean: the thread that writes a row's outputs adds its loss to the workspace's
     * order-free sums (ce_batch_reduce_xsum) */
    const bool sums = p.reduction != LF_REDUCE_NONE;
    lf_xsum_cache xcache[2] = {lf_xsum_cache_init(), lf_xsum_cache_init()}; /* the output thread's: loss, z term */
    if (threadIdx.x == 0 && grp == 0) {
        for (int q = 0; q < nstages; ++q) {
            lf_mbar_init(&full[q], 1);
            stage_k[q] = -1;
        }
        for (int g = 0; g < G; ++g) {
            lf_mbar_init(&xbar[g][0], 1u); /* lf_cluster_post: one arrival, nranks records of bytes */
            lf_mbar_init(&xbar[g][1], 1u);
        }
        lf_mbar_init_fence();
    }
    if (threadIdx.x == 0) emask[grp] = 0u;
    if (threadIdx.x < CE_SLOTS) {
        am_key[grp][threadIdx.x] = lf_argmax_key(-LF_INF_F);
        am_nan[grp][threadIdx.x] = INT_MAX;
    }
    /* local row kk's row while it is known in advance (static: all; dynamic: the ring's first
     * nstages), -1 past the rows */
    auto row_of = [&](int64_t kk) -> int64_t {
        const int64_t r = cid + kk * nclusters;
        return kk < my_rows && r < N ? r : -1;
    };
    /* the first rows' labels (the ring's, then, static, the prefetched ones), in parallel */
    if (grp == G - 1 && (int)threadIdx.x < nstages + (dyn ? 0 : CE_RES_PREFETCH) && row_of(threadIdx.x) >= 0)
        stage_y[threadIdx.x] = ce_label(p, row_of(threadIdx.x));
    __syncthreads();
    if (nranks > 1) lf_cluster_sync(); /* every CTA's mbarriers exist before any post */

    /* 1 / the mean's divisor: read at the first row that needs it (the divisor kernel may still be
     * running: programmatic dependent launch, see ce_launch_resident) */
    float inv_div = GRAD && p.reduction == LF_REDUCE_MEAN ? -1.0f : 1.0f;
    const float dl_all = (GRAD && p.dloss && p.reduction != LF_REDUCE_NONE) ? p.dloss[0] : 1.0f;

    /* The body slice of `row` this CTA takes: its address and bytes (0: an ignored or bad row,
     * nothing to load). */
    auto slice_of = [&](int64_t row, int64_t y, const uint4 **src) -> uint32_t {
        const T *x = (const T *)p.logits + row * p.stride;
        const lf_row_span sp = lf_row_span_make(x, V);
        int sb = 0, se = 0;
        if (y != p.ignore_index && y >= 0 && y < YV) lf_row_slice(sp, rank, nranks, &sb, &se);
        *src = reinterpret_cast<const uint4 *>(x + sp.head) + sb;
        return (uint32_t)(se - sb) * 16u;
    };
    /* Load `row` (label y; -1: none, no more rows) into stage q as local row kk: by one thread. */
    auto load = [&](int q, int64_t kk, int64_t row, int64_t y) {
        stage_y[q] = y; /* published by the arrive (release) */
        stage_row[q] = row < 0 ? UINT32_MAX : (uint32_t)row;
        lf_ticket_store(&stage_k[q], kk); /* release: ordered after this stage's previous phase */
        const uint4 *src;
        const uint32_t bytes = row >= 0 ? slice_of(row, y, &src) : 0u;
        if (bytes == 0) {
            lf_mbar_arrive(&full[q]);
        } else {
            lf_mbar_arrive_tx(&full[q], bytes);
            lf_bulk_load(ce_res_smem + (size_t)q * stage_vecs, src, bytes, &full[q]);
        }
    };
    /* Prefetch this CTA's slice of `row` (label y) into L2, if it exists and is valid: by one
     * thread. */
    auto prefetch = [&](int64_t row, int64_t y) {
        if (CE_RES_PREFETCH == 0 || row < 0 || row >= N) return;
        const uint4 *src;
        const uint32_t bytes = slice_of(row, y, &src);
        if (bytes) lf_bulk_prefetch_l2(src, bytes);
    };
    if (threadIdx.x == 0 && grp == 0) {
        if (dyn) { /* the ring's first rows as a fixed share (nothing to agree on in a cluster); every stage
                    * is loaded, past the last row with the end */
            for (int q = 0; q < nstages; ++q) load(q, q, row_of(q), row_of(q) >= 0 ? stage_y[q] : 0);
        } else {
            for (int q = 0; q < nstages && q < my_rows; ++q) load(q, q, row_of(q), stage_y[q]);
            for (int j = 0; j < CE_RES_PREFETCH; ++j)
                prefetch(row_of(nstages + j), row_of(nstages + j) >= 0 ? stage_y[nstages + j] : 0);
        }
    }

    const bool fast = !SOFTCAP && p.class_w == nullptr;
    const bool fast_grad = fast && p.eps == 0.0f;
    unsigned x_phase = 0; /* bit q: parity of xbar[grp][q]'s next phase */
    int xq = 0, par = 0;
    int q = grp;          /* stage of local row k: k mod nstages (nstages > G) */
    unsigned use_par = 0; /* parity of k / nstages: the stage's phase for row k */
    for (int64_t k = grp; k < my_rows; k += G) {
        int64_t row = cid + k * nclusters;         /* static; dynamic: known once the stage has landed */
        const int64_t k_next = k + nstages;         /* the local row this stage takes next */
        /* Static: loads consumed after the statistics pass (nothing waits for them before),
         * issued before the waits: the row's edge elements, the next row's label, and that of the
         * row after it, prefetched into L2 with the reload. */
        lf_edge_raw eraw;
        eraw.j = -1;
        eraw.bits = 0u;
        if (!dyn && rank == 0) {
            const T *x0 = (const T *)p.logits + row * p.stride;
            eraw = lf_row_edge_issue(x0, lf_row_span_make(x0, V));
        }
        const int64_t y_next = (!dyn && threadIdx.x == 0 && k_next < my_rows) ? ce_label(p, row_of(k_next)) : 0;
        const int64_t k_pf = k_next + CE_RES_PREFETCH;
        const int64_t y_pf = (!dyn && CE_RES_PREFETCH && threadIdx.x == 0 && k_pf < my_rows) ? ce_label(p, row_of(k_pf)) : 0;

        /* the stage's previous use is over: lane 0 of each warp checks the ticket (acquire; one
         * atomic per warp, not per thread: 256 on one address serialise), __syncwarp orders the
         * warp's lanes after it */
        if ((threadIdx.x & 31u) == 0)
            while (lf_ticket_load(&stage_k[q]) != k) {
            }
        __syncwarp();
        lf_mbar_wait(&full[q], use_par);
#ifdef CE_RES_TRACE
        if (first_ && threadIdx.x == 0 && grp == 0 && blockIdx.x < 1024) ce_res_times[blockIdx.x][1] = ce_gtime();
        first_ = false;
#endif
        CE_TR(0);
        int64_t r_next = -1; /* dynamic: the row this stage takes next */
        if (dyn) {
            row = stage_row[q] == UINT32_MAX ? -1 : (int64_t)stage_row[q];
            if (row < 0) {
                /* No more rows. This stage's next user (local row k_next, of the other group when
                 * nstages is odd) must not wait for a load that never comes: the stage passes the
                 * end on (after the group's barrier: no thread is still waiting on its phase), and
                 * the group stops. With at most two groups every group meets the end this way
                 * before it could wait on a stage that an exited group should have reloaded. */
                lf_block_bar<TH>(bar);
                if (threadIdx.x == 0) load(q, k_next, -1, 0);
                break;
            }
            /* the next row drawn now (rank 0), once this one is known to exist (so every draw is
             * used): its label is loaded after the statistics pass and its slice prefetched into
             * L2 then; in a cluster it goes to the peers with the exchange; it is loaded into the
             * stage at the reload */
            if (threadIdx.x == 0 && rank == 0) {
                r_next = lf_ring_draw(&p.ws->row_next, drawn0, N);
            }
            if (rank == 0) {
                const T *x0 = (const T *)p.logits + row * p.stride;
                eraw = lf_row_edge_issue(x0, lf_row_span_make(x0, V));
            }
        }
        const T *x = (const T *)p.logits + row * p.stride;
        T *out = GRAD ? (T *)p.grad + row * p.grad_stride : nullptr;
        const lf_row_span sp = lf_row_span_make(x, V);
        const float dl = (GRAD && p.dloss && p.reduction == LF_REDUCE_NONE) ? p.dloss[row] : 1.0f;
        int64_t y_dyn = 0;
        auto draw_label = [&]() { /* dynamic, thread 0 of rank 0: the drawn row's label, its slice's L2 prefetch */
            if (dyn && threadIdx.x == 0 && rank == 0 && r_next >= 0) {
                y_dyn = ce_label(p, r_next);
                prefetch(r_next, y_dyn);
            }
        };
        /* The cluster exchange's post. Dynamic: rank 0 also stores the drawn row and its label
         * (thread 0's, to the posting lanes 0 .. nranks-1 of warp 0) into every CTA's xnx, on
         * the same phase of its mbarrier, which each CTA expects before its own post. */
        auto post = [&](const lf_row_stats &st) {
            if (dyn) {
                const int64_t rn = __shfl_sync(0xffffffffu, r_next, 0), yn = __shfl_sync(0xffffffffu, y_dyn, 0);
                if ((int)threadIdx.x == rank) lf_mbar_expect_tx(&xbar[grp][xq], (uint32_t)sizeof(lf_ring_next));
                if (rank == 0 && (int)threadIdx.x < nranks)
                    lf_cluster_store(ce_next_pack(p, YV, rn, yn), &xnx[grp][xq], &xbar[grp][xq], (int)threadIdx.x);
            }
            lf_cluster_stats_post(st, xs[grp][xq], &xbar[grp][xq], rank, nranks);
        };
        /* ... and after the collect every CTA's thread 0 takes rank 0's next row */
        auto take_next = [&]() {
            if (dyn && threadIdx.x == 0) {
                const lf_ring_next nx = xnx[grp][xq];
                r_next = lf_ring_next_row(nx);
                if (rank != 0) y_dyn = ce_next_label(p, YV, nx); /* rank 0 keeps the label itself */
                if (rank != 0) prefetch(r_next, y_dyn); /* measured: better than rank 0 prefetching all slices */
            }
            x_phase ^= 1u << xq;
            xq ^= 1;
        };
        const int64_t y = stage_y[q];
        const int status = y == p.ignore_index ? 1 : (y < 0 || y >= YV) ? 2 : 0;
        /* the label's column in this row (with an exchange: in this shard where y_here) */
        int64_t yl = y;
        bool y_here = !SOFT; /* a soft target has no label */
        if constexpr (X::on) {
            yl = y - xc.v0;
            y_here = status == 0 && yl >= 0 && yl < V;
        }
        const uint4 *b = ce_res_smem + (size_t)q * stage_vecs;
        /* the row's outputs, by out_t (of rank 0 for an ignored or bad row, of the label's owner
         * for a valid one): written at the row's end, after the reload barrier */
        lf_row_stats st_out;
        int out_slot = -1; /* -1: none here; else the slot of the label logit xy_s */
        float o_lse = 0.0f, o_loss = 0.0f; /* X::on: the merged lse and loss, for the outputs */
        /* SOFT: the listed entries this thread read, patched after the row's end barrier with
         * the row's coefficients */
        [[maybe_unused]] ce_soft_pair pr[SOFT ? CE_SOFT_PAIRS : 1];
        [[maybe_unused]] lf_grad_coef s_coef;
        [[maybe_unused]] float q_rest = 0.0f, s_gs = 0.0f; /* (ce_soft_rev: q_rest holds log q_rest) */
        [[maybe_unused]] float s_zc = 0.0f;                /* ce_soft_rev: lse + KL, for the patch */
        if constexpr (SOFT) {
#pragma unroll
            for (int u = 0; u < CE_SOFT_PAIRS; ++u) pr[u].j = -1;
        }
        if (status) {
            draw_label();
            if (GRAD) lf_row_zero<TH, T>(out, V, rank, nranks);
            if (dyn && nranks > 1) { /* no statistics, but the next row to hand on (no barrier needed:
                                      * the row-end barrier lies between the last collect and this post) */
                post(lf_row_stats_init());
                (void)lf_cluster_stats_collect<false>(xs[grp][xq], &xbar[grp][xq], (x_phase >> xq) & 1u, nranks);
                take_next();
            }
        } else {
            int sb, se;
            lf_row_slice(sp, rank, nranks, &sb, &se);
            lf_row_stats st = lf_row_stats_init();
            lf_lazy_argmax la = lf_lazy_argmax_init();
            [[maybe_unused]] float shift = 0.0f; /* SOFT: the row's target, loaded ahead of the pass */
            if constexpr (SOFT) { /* (the thread's pairs too: their loads' latency hides behind the pass) */
                q_rest = __ldg(xc.rest + row);
                shift = __ldg(xc.shift + row);
                ce_soft_pairs_load<TH>(pr, xc, row);
            }
            [[maybe_unused]] bool marked = false; /* ce_soft_rev: the pairs left the pass (ce_soft_mark_rev) */
            if constexpr (ce_is_soft_rev<X>::value) {
                marked = q_rest > -LF_INF_F; /* (the row's, so the group's barrier is uniform) */
                if (marked) {
                    ce_soft_mark_rev<T>(pr, xc, shift, x, const_cast<uint4 *>(b), sp, sb, se, rank == 0, &emask[grp]);
                    lf_block_bar<TH>(bar);
                }
            }
            if (fast)
                lf_piece_stats_fast<TH, T, FULL, CE_RES_POLY, !SOFT>(st, la, &am_key[grp][par], b, sp, sb, se, p.xf,
                                                                     SOFT || p.eps > 0.0f); /* (no argmax for a soft target) */
            else lf_piece_stats<TH, T, FULL, SOFTCAP>(st, b, sp, sb, se, p.xf, p.class_w);
            const lf_edge edge = lf_edge_resolve<T>(eraw);
            if constexpr (ce_is_soft_rev<X>::value) {
                lf_edge es = edge; /* a listed edge element, flagged, is its holder's to add */
                if (marked && edge.j >= 0 && (emask[grp] >> threadIdx.x & 1u)) {
                    es.j = -1;
                    atomicAnd(&emask[grp], ~(1u << threadIdx.x)); /* (read and cleared by this thread only) */
                }
                lf_edge_stats<FULL, SOFTCAP>(st, es, p.xf, p.class_w);
                ce_soft_terms_rev<TH, T, SOFTCAP>(st, pr, xc, q_rest, shift, marked, x, b, sp, sb, se, edge, rank == 0, p.xf);
            } else {
                lf_edge_stats<FULL, SOFTCAP>(st, edge, p.xf, p.class_w);
            }
            if constexpr (SOFT && !ce_is_soft_rev<X>::value)
                ce_soft_terms<TH, T, SOFTCAP>(st, pr, xc, row, q_rest, shift, x, b, sp, sb, se, edge, rank == 0, p.xf);
            draw_label();
            CE_TR(1);
            {
                float xv; /* the label's logit, from the thread that holds it; read after the barrier */
                if (y_here && ce_label_held<TH, T>(b, sp, sb, se, edge, true, yl, &xv)) xy_s[grp][par] = xv;
            }
            /* the block merge (the group's barrier) */
            if (fast) {
                lf_argmax cand = st.am;
                if (FULL && (la.v > cand.v || (la.v == cand.v && la.i >= 0 && (cand.i < 0 || la.i < cand.i)))) {
                    cand.v = la.v; /* the thread's candidate: its edge element (exact) or its body's */
                    cand.i = la.i;
                }
                /* the next slot is free (its last row was three rows ago) and first used after
                 * the barrier below: reset it */
                const int nx = par == CE_SLOTS - 1 ? 0 : par + 1;
                if (FULL && threadIdx.x == 0) {
                    am_key[grp][nx] = lf_argmax_key(-LF_INF_F);
                    am_nan[grp][nx] = INT_MAX;
                }
                st.lse = lf_block_lse_fast<TH, FULL>(st.lse, &cand.v, &cand.i, &st.wz, reinterpret_cast<float *>(red[grp][par]), bar);
                if (FULL && st.lse.s != st.lse.s) { /* a NaN or +inf: the first NaN is the argmax */
                    int32_t found = INT_MAX;
                    if (edge.j >= 0 && edge.x != edge.x) found = edge.j;
                    const int32_t j = lf_piece_find<TH, T>(b, sp, sb, se, 0.0f, true);
                    if (j >= 0) found = min(found, j);
                    if (found != INT_MAX) atomicMin(&am_nan[grp][par], found);
                    lf_block_bar<TH>(bar);
                    if (am_nan[grp][par] != INT_MAX) {
                        cand.v = NAN;
                        cand.i = am_nan[grp][par];
                    }
                }
                if (FULL) st.am = cand;
            } else if (FULL) {
                st = lf_block_row_stats<TH>(st, red[grp][par], bar);
            } else {
                st.lse = lf_block_lse<TH>(st.lse, reinterpret_cast<lf_lse *>(red[grp][par]), bar);
            }
            CE_TR(2);
            if (nranks > 1) {
                post(st);
                st = lf_cluster_stats_collect<FULL>(xs[grp][xq], &xbar[grp][xq], (x_phase >> xq) & 1u, nranks);
                take_next();
            }
            /* The exchange (X::on): the shard's statistics out, the row's global lse and loss back,
             * while the row stays staged. The label's logit (xy_s, written before the block merge's
             * barrier) goes out from the CTA that holds it. */
            float x_lse = 0.0f, x_loss = 0.0f, x_m = 0.0f, x_s = 1.0f; /* x_m, x_s: the merged maximum and sum */
            int pub = 0; /* X::on: the CTA that holds the label's logit (or rank 0) publishes and writes the outputs */
            if constexpr (X::on) {
                const float wy = xc.label_weight(y);
                pub = y_here ? lf_row_owner_rank<T>(yl, sp, nranks) : 0;
                /* This rank's share: the cluster-merged statistics are the same bits in every CTA
                 * of the cluster, so each uses its own copy instead of polling it back; only the
                 * publishing CTA has the label's logit, so only its share's t (and the loss) is
                 * whole: it writes the row's outputs. The lse, which the gradient needs, comes
                 * from the shares' (m, s) alone. */
                const bool has_y = y_here && rank == pub;
                const lf_tp_share own = xc.share(st, has_y, has_y ? lf_xform_apply<SOFTCAP>(xy_s[grp][par], p.xf) : 0.0f, wy);
                if (threadIdx.x == 0 && rank == pub) xc.publish(row, own, xgen);
                /* Every warp waits for the other ranks' shares and merges them itself (the same
                 * bits in each), then goes on to its part of the gradient: no barrier of the
                 * group on the row's path (measured on two H200s, session 32, against warp 0
                 * collecting for the group, which then took the result from shared memory after a
                 * barrier: 2-3% faster at tp = 2 and 4096 x 151936, the same within noise at the
                 * other shapes; bench/RESULTS.md). */
                lf_tp_merged mg = {0.0f, 0.0f, 0.0f, 0.0f};
                const bool ok = xc.collect(row, y, wy, own, &mg, xgen);
                x_loss = lf_tp_loss(mg, p.lam, &x_lse);
                x_m = mg.M;
                x_s = mg.S;
                if (!ok) x_lse = x_loss = NAN;
            }
            CE_TR(3);
            const int rpar = par;
            par = par == CE_SLOTS - 1 ? 0 : par + 1;
            if (GRAD) {
                float lse, w_y, wsum, mx, sx;
                if constexpr (X::on) { /* (p.class_w is the shard's: y is global) */
                    lse = x_lse;
                    mx = x_m;
                    sx = x_s;
                    w_y = xc.label_weight(y);
                    wsum = xc.wsum();
                } else {
                    lse = lf_lse_final(st.lse);
                    mx = st.lse.m;
                    sx = st.lse.s;
                    w_y = p.class_w ? __ldg(p.class_w + y) : 1.0f;
                    wsum = (FULL && p.class_w) ? st.w : (float)V;
                }
                float g = p.grad_scale * (p.reduction == LF_REDUCE_NONE ? dl : dl_all);
                if constexpr (SOFT) {
                    if (xc.w) g *= __ldg(xc.w + row);
                }
                if (inv_div < 0.0f) {
                    lf_pdl_wait();
                    const float d = ce_mean_divisor(p);
                    inv_div = d == 0.0f ? 0.0f : 1.0f / d;
                }
                lf_grad_coef coef = lf_grad_coef_make(g * inv_div, lse, p.eps, p.lam, w_y, wsum, YV, p.xf);
                constexpr bool RKL = ce_is_soft_rev<X>::value; /* a p_j (z_j - zc) (ce_soft_rev) */
                [[maybe_unused]] float zc = 0.0f;
                if constexpr (RKL) { /* zc = lse + KL + log q_rest for the entries not listed */
                    const float kl = ce_soft_rev_kl(st, q_rest);
                    if (!(fabsf(kl) < LF_INF_F)) coef.a = NAN; /* an infinite KL has no gradient */
                    coef.e = 0.0f;
                    s_zc = lse + kl;
                    zc = s_zc + (q_rest == -LF_INF_F ? 0.0f : q_rest); /* (none there: p_j = 0, any zc) */
                } else if constexpr (SOFT) { /* (eps and lam 0, w_y 1: a = g scale) the rest's mass everywhere */
                    s_gs = coef.a;
                    coef.e = coef.a * q_rest;
                }
                lf_grad_coef_onto_max_for<T>(coef, mx, sx); /* p_j against m: no lse rounding */
                const bool vec_ok = ((uintptr_t)out & 15u) == (uintptr_t)sp.phase;
                if (rank == 0) lf_edge_grad_store<FULL, SOFTCAP, T, RKL>(out, edge, coef, p.xf, p.class_w, zc);
                if constexpr (SOFT) s_coef = coef;
                if (!((SOFT ? fast : fast_grad) && vec_ok &&
                      lf_piece_grad_fast_if_ok<TH, T, CE_RES_POLY, SOFT && !RKL, RKL>(
                          out, b, sp, sb, se, coef, lf_grad_fast_k(coef), p.xf.scale_l2e, p.xf.scale, zc)))
                    lf_piece_grad_store<TH, FULL, SOFTCAP, T, RKL>(out, vec_ok, b, sp, sb, se, coef, p.xf, p.class_w, zc);
                if (y_here) ce_label_grad_patch<TH, T, FULL, SOFTCAP>(out, b, sp, sb, se, edge, rank == 0, yl, coef, p);
            }
            /* the CTA that writes the row's outputs: the label's (its logit is there); with an
             * exchange the publisher (the label's CTA, else rank 0: only its loss is whole) */
            if ((int)threadIdx.x == out_t && rank == (X::on ? pub : lf_row_owner_rank<T>(y, sp, nranks))) {
                st_out = st;
                out_slot = rpar;
                o_lse = x_lse;
                o_loss = x_loss;
            }
        }
        CE_TR(4);
        /* The whole group is done with the stage: its thread 0 reloads it. (Measured: letting the
         * last warp to finish reload it instead, counted with a shared atomic, is no faster; with a
         * fence before the count it is 9% slower, the fence waiting for the gradient stores.) */
        lf_block_bar<TH>(bar);
        if constexpr (SOFT && GRAD) { /* the listed entries: g (p_i - q_i), after every thread's dense stores
                                       * (ce_soft_rev: g p_i (z_i - lse - KL - log q_i)) */
#pragma unroll
            for (int u = 0; u < CE_SOFT_PAIRS; ++u) {
                if (pr[u].j < 0) continue;
                if constexpr (ce_is_soft_rev<X>::value) {
                    out[pr[u].j] = lf_elem<T>::from_f32(
                        lf_ce_grad_elem<FULL, SOFTCAP, true>(pr[u].x, pr[u].j, s_coef, p.xf, nullptr, s_zc + pr[u].q));
                } else {
                    lf_grad_coef ck = s_coef;
                    ck.b = s_gs * (pr[u].q - q_rest);
                    out[pr[u].j] = lf_elem<T>::from_f32(lf_ce_label_grad<FULL, SOFTCAP>(pr[u].x, pr[u].j, ck, p.xf, nullptr));
                }
            }
        }
        if (threadIdx.x == 0 && dyn) {
            load(q, k_next, r_next, y_dyn);
        } else if (threadIdx.x == 0 && k_next < my_rows) {
            load(q, k_next, row_of(k_next), y_next);
            prefetch(row_of(k_pf), y_pf);
        }
        /* the row's outputs (xy_s[grp][out_slot] is next written in the group's third row from here) */
        if (status) {
            if (rank == 0 && (int)threadIdx.x == out_t) {
                ce_row_outputs_zero(p, row, status, sums);
                if constexpr (SOFT) ce_soft_row_zero(xc, row);
            }
        } else if (out_slot >= 0) {
            if constexpr (SOFT)
                ce_soft_row_outputs(p, xc, row, st_out, sums ? p.ws->xs : nullptr, xcache);
            else if constexpr (X::on)
                ce_row_loss_out(p, row, o_lse, o_loss, p.lam * o_lse * o_lse, sums ? p.ws->xs : nullptr, xcache);
            else
                ce_row_outputs<FULL, SOFTCAP>(p, row, y, st_out, xy_s[grp][out_slot], sums ? p.ws->xs : nullptr, xcache);
        }
        CE_TR(5);
#ifdef CE_RES_TRACE
        ++rows_;
#endif
        /* the group's next row, k + G */
        q += G;
        if (q >= nstages) {
            q -= nstages;
            use_par ^= 1u;
        }
    }
#ifdef CE_RES_TRACE
    if (threadIdx.x == 0 && blockIdx.x < 1024) atomicMax(&ce_res_times[blockIdx.x][2], ce_gtime());
    if (threadIdx.x == 0) {
        for (int j = 0; j < 6; ++j) atomicAdd(&ce_res_trace[j], tr_[j]);
        atomicAdd(&ce_res_trace[6], rows_);
        atomicAdd(&ce_res_trace[7], (unsigned long long)(clock64() - t0_));
    }
#endif
    /* each group's output thread made the group's reductions into p.ws->xs (the rest of them
     * now, from its caches): ordered before the count that ce_batch_reduce_xsum takes (besides
     * the barrier below and its own fence) */
    if ((int)threadIdx.x == out_t && sums) {
        lf_xsum_cache_flush(&p.ws->xs[0], &xcache[0]);
        lf_xsum_cache_flush(&p.ws->xs[1], &xcache[1]);
        __threadfence();
    }
    __syncthreads();
    if (nranks > 1) lf_cluster_sync(); /* no CTA leaves while a peer may still post to it */
    if (grp != 0 || (!sums && !dyn && !X::on)) return; /* (an exchange's end() is below) */
    lf_pdl_wait(); /* the divisor is read below (a no-op when waited for already) */
    /* every CTA may have rows (the label's owner adds their losses): all count */
    /* scratch: the block merge's (dead by now; the ring's stages can be smaller than this) */
    static_assert(sizeof red >= 2 * sizeof(lf_xsum), "red holds two lf_xsum (it is 16-byte aligned)");
    ce_batch_reduce_xsum<TH>(p, (unsigned long long)gridDim.x, reinterpret_cast<lf_xsum *>(&red[0][0][0]), &is_last, bar);
    if constexpr (X::on) {
        if (is_last && threadIdx.x == 0) xc.end(xgen); /* every CTA is past its rows */
    }
#ifdef CE_RES_TRACE
    if (threadIdx.x == 0 && blockIdx.x < 1024) ce_res_times[blockIdx.x][3] = ce_gtime();
#endif
}

/* ---- The warp-per-row schedule (forward only) ----------------------------------------------
 * One warp per row (lf_warp_row_pass; sm_80+): each warp of a persistent grid takes rows w,
 * w + W, ... (W warps in all) and reads each row once from global memory through registers,
 * 2 x U 16-byte loads per lane in flight (U = CE_WARP_U; CE_WARP_U_SHORT for one short row per
 * warp); lane 0 writes the row's outputs. No shared memory, no barrier per row, no per-row block
 * merge: what the streamed CTAs pay per row (a merge across 8 warps, ~2 us per row and CTA,
 * measured) is 5 shuffle steps here, which short rows feel most (measured on an H100: 79 -> 86%
 * of copy at 4096 x 32768, 92 -> 95% at 16384 x 32768; bench/RESULTS.md). The automatic plan takes it for forward-only passes over at least
 * CE_WARP_MIN_ROWS_PER_SM rows per SM; with fewer rows there are fewer warps, each with only its
 * own loads in flight, where the streamed CTAs put 256 threads on a row. Every option of the
 * forward pass (softcap, scale, class weights, smoothing, z-loss, statistics, reductions) is
 * served. */
#ifndef CE_WARP_THREADS
#define CE_WARP_THREADS 256 /* 8 warps per CTA */
#endif
#ifndef CE_WARP_U
#define CE_WARP_U 4 /* 16-byte vectors per lane and batch: 2 x 4 x 512 B in flight per warp */
#endif
#ifndef CE_WARP_U_SHORT
#define CE_WARP_U_SHORT 2 /* the same when each warp has at most one row of at most
                           * CE_WARP_SHORT_ROW bytes (one wave: less queued at the start) */
#endif
#ifndef CE_WARP_SHORT_ROW
#define CE_WARP_SHORT_ROW 131072 /* bytes. Measured at 4096 rows (one per warp; bf16, same runs): 64 KB
                                  * rows 5-6% faster with U = 2 than 4 (H200 0.0705 vs 0.0748 ms, H100
                                  * 0.0933 vs 0.0979 in two runs of one machine), rows of 256 KB 1.5%
                                  * slower; between them not measured. With 4 rows per warp
                                  * (16384 x 32768) no consistent gain: kept at U = 4 */
#endif
#ifndef CE_WARP_CTAS_PER_SM
#define CE_WARP_CTAS_PER_SM 4 /* 32 warps per SM: 64 registers, no spills in the plain and smoothing
                               * loops (the class-weights loop spills ~40 words); with the softcap 2 */
#endif
#ifndef CE_WARP_MIN_ROWS_PER_SM
#define CE_WARP_MIN_ROWS_PER_SM 7 /* the automatic plan's threshold: rows >= this x SMs (measured on an
                                   * H100 at 1024 rows, 7.8 per SM: warps 18% faster at V = 32K, 5% at
                                   * 256K; fewer rows not measured) */
#endif

template <typename T, bool SOFTCAP, int U>
__global__ void __launch_bounds__(CE_WARP_THREADS, SOFTCAP ? 2 : CE_WARP_CTAS_PER_SM)
    ce_warp_kernel(const ce_kparams p)
{
    __shared__ double fin[CE_WARP_THREADS / 32];
    __shared__ int is_last;
    const int lane = (int)(threadIdx.x & 31u);
    const int64_t nwarps = (int64_t)gridDim.x * (CE_WARP_THREADS / 32), N = p.n_rows, V = p.vocab;
    const int64_t w0 = ((int64_t)blockIdx.x * CE_WARP_THREADS + threadIdx.x) / 32;
    /* the label of the warp's next row is loaded a row ahead (one uniform load per lane) */
    int64_t y_next = w0 < N ? ce_label(p, w0) : 0;
    for (int64_t row = w0; row < N; row += nwarps) {
        const int64_t y = y_next;
        if (row + nwarps < N) y_next = ce_label(p, row + nwarps);
        const int status = y == p.ignore_index ? 1 : (y < 0 || y >= V) ? 2 : 0;
        if (status) {
            if (lane == 0) ce_row_outputs_zero(p, row, status);
            continue;
        }
        const T *x = (const T *)p.logits + row * p.stride;
        /* the label's raw logit: loaded before the row, converted after it (lane 0) */
        lf_edge_raw xy;
        xy.j = (int32_t)y;
        xy.bits = 0u;
        if (lane == 0)
            xy.bits = sizeof(T) == 4 ? __ldg(reinterpret_cast<const unsigned *>(x) + y)
                                     : (unsigned)__ldg(reinterpret_cast<const unsigned short *>(x) + y);
        const lf_row_stats rs = lf_warp_row_pass<T, true, SOFTCAP, U>(x, V, p.xf, p.class_w, p.eps > 0.0f);
        if (lane == 0) ce_row_outputs<true, SOFTCAP>(p, row, y, rs, lf_edge_resolve<T>(xy).x);
    }
    if (p.reduction == LF_REDUCE_NONE) return;
    __syncthreads(); /* every warp's row losses are written before thread 0 counts the CTA */
    ce_batch_reduce<CE_WARP_THREADS>(p, (unsigned long long)gridDim.x, fin, &is_last);
}

/* ============================================================================================
 * 3. Launcher
 * ========================================================================================== */

#define CE_CHECK(call)                                                                              \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            if (cuda_err) *cuda_err = e_;                                                           \
            return LF_ERR_DEVICE;                                                                   \
        }                                                                                           \
    } while (0)

/* How many clusters of `c` CTAs (c = 1: CTAs) of this kernel the device runs at once; 0 if a
 * cluster of c cannot be scheduled. */
template <typename K>
static int ce_active_groups(K kernel, int c)
{
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 0;
    if (c == 1) {
        int sms = 0, per_sm = 0;
        if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, CE_THREADS, CE_SMEM_BYTES) != cudaSuccess)
            return 0;
        return sms * per_sm;
    }
    return lf_max_active_clusters(kernel, c, dim3(CE_THREADS, 1, 1), CE_SMEM_BYTES);
}

#ifndef CE_MAX_DEVICES
#define CE_MAX_DEVICES 64 /* devices a process may launch on (per-device launch setup) */
#endif

/* The row-resident schedule, if the device and the shape allow it (else *launched = false and
 * nothing happens). Plan (lossfuse_cuda.cuh, lf_ring_plan_make): among cluster sizes 1, 2, 3, ...
 * up to the cap, those whose slice fits `stages` stages (automatic: at least CE_RES_MIN_STAGES,
 * as many as fit, at most CE_RES_MAX_STAGES); of those the one that keeps the most CTAs
 * resident, the smaller cluster on a tie (each CTA of a cluster exchanges 28 bytes per row with
 * the others). xc: the kernel's exchange hook (ce_xchg_none: none); max_ctas > 0 caps the CTAs
 * launched (a kernel that waits on other kernels' progress must leave them room); dry: plan only
 * (*launched says whether it would launch; nothing is launched); plan_cols > 0: plan the ring for
 * rows that wide (>= p.vocab), so that launches over rows of slightly different widths (the
 * shards of vocab_parallel_ce.cu) get the same plan. */
template <typename T, bool GRAD, bool FULL, bool SOFTCAP, class X = ce_xchg_none>
static lf_status ce_launch_resident(const ce_kparams &p, int max_cluster, int stages, int static_rows, bool forced,
                                    bool after_divisor, ce_plan *plan, cudaStream_t stream, cudaError_t *cuda_err, bool *launched,
                                    const X &xc = X(), int64_t max_ctas = 0, bool dry = false, int64_t plan_cols = 0)
{
    auto kernel = ce_resident_kernel<T, GRAD, FULL, SOFTCAP, false, X>;
    /* with an exchange hook rows are never handed out dynamically (each rank would draw its own,
     * and the waits chain: vocab_parallel_ce.cu, tp_res_dispatch): no dynamic kernel compiled */
    auto kernel_dyn = ce_resident_kernel<T, GRAD, FULL, SOFTCAP, !X::on, X>;
    static lf_ring_device ring_d[CE_MAX_DEVICES], ring_dyn_d[CE_MAX_DEVICES]; /* per instantiation and device: set up once */
    *launched = false;
    int dev = 0;
    CE_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= CE_MAX_DEVICES) return LF_ERR_DEVICE;
    CE_CHECK(lf_ring_setup(kernel, dev, &ring_d[dev]));
    if (ring_d[dev].dyn_max <= 0) return forced ? LF_ERR_DEVICE : LF_OK;
    if (p.n_rows >= ((int64_t)1 << 32)) return forced ? LF_ERR_SIZE : LF_OK; /* the order-free sums take < 2^32 rows */
    const int64_t cols = plan_cols > p.vocab ? plan_cols : p.vocab;
    lf_ring_req r = lf_ring_req_make((cols + lf_elem<T>::per_vec - 1) / lf_elem<T>::per_vec, 16, p.n_rows);
    r.max_cluster = max_cluster;
    r.stages = stages;
    r.min_stages = X::min_stages;
    r.max_stages = CE_RES_MAX_STAGES;
    r.groups_per_cta = X::groups;
    r.min_slice = forced ? 0 : CE_RES_MIN_SLICE; /* short rows: streamed */
    const dim3 block(CE_RES_THREADS / X::groups, X::groups, 1);
    lf_ring_plan pl;
    CE_CHECK(lf_ring_plan_make(kernel, block, dev, &ring_d[dev], r, &pl));
    if (pl.cluster == 0) return forced ? LF_ERR_SIZE : LF_OK;
    /* Rows handed out dynamically where the ring has at most two groups (ce_resident_kernel's
     * end-of-rows hand-off): every streaming cluster (lf_ring_plan) starts, and the ones on faster
     * SMs take more rows. Measured on an H200 (bench/RESULTS.md): with a fixed share each, the
     * CTAs of one launch finished up to 17% apart. */
    bool dyn = !X::on && !static_rows && X::groups <= 2;
    if (dyn) { /* the dynamic kernel's own shared-memory opt-in; the plan's stages must fit it too */
        CE_CHECK(lf_ring_setup(kernel_dyn, dev, &ring_dyn_d[dev]));
        dyn = ring_dyn_d[dev].dyn_max >= (int)pl.dyn_bytes;
    }
    /* dynamic rows: as many clusters as stream the memory's bandwidth (lf_ring_plan) */
    int64_t nclusters = dyn ? pl.streaming : pl.clusters;
    if (max_ctas > 0 && nclusters * pl.cluster > max_ctas) nclusters = max_ctas / pl.cluster;
    if (nclusters < 1) return forced ? LF_ERR_SIZE : LF_OK;
    const int64_t ctas = nclusters * pl.cluster;
    if (plan) {
        plan->schedule = CE_SCHED_RESIDENT;
        plan->cluster = pl.cluster;
        plan->pieces = 1;
        plan->stages = pl.stages;
        plan->clusters = (int)nclusters;
        plan->ctas = (int)ctas;
        plan->dynamic = dyn;
    }
    *launched = true;
    if (dry) return LF_OK;
    /* after_divisor: start while ce_divisor_kernel runs; the kernel waits where it reads it */
    CE_CHECK(lf_launch_clusters(dyn ? kernel_dyn : kernel, ctas, pl.cluster, block, pl.dyn_bytes, stream, after_divisor, p,
                                pl.cluster, pl.stages, (int)pl.slice_units, (int)nclusters, xc));
    return LF_OK;
}

/* The warp-per-row schedule (forward only), if forced or if there are at least
 * CE_WARP_MIN_ROWS_PER_SM rows per SM (else *launched = false and nothing happens): as many
 * CTAs as the device runs at once, fewer when there are fewer rows than warps; batches of
 * CE_WARP_U_SHORT vectors where every warp has at most one row of at most CE_WARP_SHORT_ROW
 * bytes, else CE_WARP_U. */
template <typename T, bool SOFTCAP>
static lf_status ce_launch_warp(const ce_kparams &p, bool forced, ce_plan *plan, cudaStream_t stream, cudaError_t *cuda_err,
                                bool *launched)
{
    static int ready_d[CE_MAX_DEVICES], sms_d[CE_MAX_DEVICES], per_sm_d[CE_MAX_DEVICES][2]; /* once per device */
    *launched = false;
    int dev = 0;
    CE_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= CE_MAX_DEVICES) return LF_ERR_DEVICE;
    if (!ready_d[dev]) {
        CE_CHECK(cudaDeviceGetAttribute(&sms_d[dev], cudaDevAttrMultiProcessorCount, dev));
        CE_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_d[dev][0], ce_warp_kernel<T, SOFTCAP, CE_WARP_U>,
                                                               CE_WARP_THREADS, 0));
        CE_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm_d[dev][1], ce_warp_kernel<T, SOFTCAP, CE_WARP_U_SHORT>,
                                                               CE_WARP_THREADS, 0));
        ready_d[dev] = 1;
    }
    const int64_t wpc = CE_WARP_THREADS / 32;
    const bool short_rows = p.vocab * (int64_t)sizeof(T) <= CE_WARP_SHORT_ROW &&
                            p.n_rows <= (int64_t)sms_d[dev] * per_sm_d[dev][1] * wpc;
    auto kernel = short_rows ? ce_warp_kernel<T, SOFTCAP, CE_WARP_U_SHORT> : ce_warp_kernel<T, SOFTCAP, CE_WARP_U>;
    const int per_sm = per_sm_d[dev][short_rows ? 1 : 0];
    if (per_sm < 1) return forced ? LF_ERR_DEVICE : LF_OK; /* automatic: streamed instead */
    if (!forced && p.n_rows < (int64_t)CE_WARP_MIN_ROWS_PER_SM * sms_d[dev]) return LF_OK;
    const int64_t ctas = std::min<int64_t>((p.n_rows + wpc - 1) / wpc, (int64_t)sms_d[dev] * per_sm);
    if (plan) {
        plan->schedule = CE_SCHED_WARP;
        plan->cluster = 1;
        plan->pieces = 1;
        plan->stages = 0;
        plan->clusters = (int)ctas;
        plan->ctas = (int)ctas;
        plan->dynamic = 0;
    }
    kernel<<<(unsigned)ctas, CE_WARP_THREADS, 0, stream>>>(p);
    CE_CHECK(cudaGetLastError());
    *launched = true;
    return LF_OK;
}

/* CE_RESIDENT_ONLY: a file that includes this one for ce_launch_resident alone (kl_distill.cu's
 * soft-target path) leaves out the launcher of ce_args and the kernels only it launches: they
 * would be compiled for nothing. */
#ifndef CE_RESIDENT_ONLY
template <typename T, bool GRAD, bool FULL, bool SOFTCAP>
static lf_status ce_launch_kernel(const ce_kparams &p, int max_cluster, int schedule, int stages, int static_rows,
                                  ce_plan *plan, cudaStream_t stream, cudaError_t *cuda_err)
{
    if (!GRAD && (schedule == CE_SCHED_WARP || schedule == CE_SCHED_AUTO)) {
        bool launched = false;
        const lf_status st = ce_launch_warp<T, SOFTCAP>(p, schedule == CE_SCHED_WARP, plan, stream, cuda_err, &launched);
        if (st != LF_OK || launched) return st;
    }
    /* Automatically the row-resident schedule serves the fused forward + backward; a forward-only
     * pass needs no residency: warps (above) over many rows, else streamed (bench/RESULTS.md). */
    if (schedule == CE_SCHED_RESIDENT || (schedule == CE_SCHED_AUTO && GRAD)) {
        bool launched = false;
        /* ce_launch launched the divisor kernel just before for mean without a divisor */
        const bool after_divisor = p.reduction == LF_REDUCE_MEAN && p.divisor == nullptr;
        const lf_status st = ce_launch_resident<T, GRAD, FULL, SOFTCAP>(
            p, max_cluster, stages, static_rows, schedule == CE_SCHED_RESIDENT, after_divisor, plan, stream, cuda_err, &launched);
        if (st != LF_OK || launched) return st;
    }
    auto kernel = ce_kernel<T, GRAD, FULL, SOFTCAP>;
    /* Per instantiation and per device, once: the shared-memory opt-in (cudaFuncSetAttribute
     * holds for the current device only: a process driving several GPUs sets it on each),
     * whether clusters exist, and how many groups of each cluster size fit (host-side queries
     * only: safe under graph capture). */
    static int ready_d[CE_MAX_DEVICES], cluster_max_d[CE_MAX_DEVICES], active_d[CE_MAX_DEVICES][17];
    int dev = 0;
    CE_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= CE_MAX_DEVICES) return LF_ERR_DEVICE;
    int &cluster_max = cluster_max_d[dev], *const active = active_d[dev];
    if (!ready_d[dev]) {
        int cc = 0;
        cluster_max = 1;
        CE_CHECK(cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, dev));
        CE_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, CE_SMEM_BYTES));
        cudaFuncAttributes fa;
        CE_CHECK(cudaFuncGetAttributes(&fa, kernel));
        if (cc >= 9 && fa.ptxVersion >= 90) { /* the cluster merge is compiled out below sm_90 code */
            cluster_max = 8;
            if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) cluster_max = 16;
            else (void)cudaGetLastError();
        }
        for (int c = 0; c <= 16; ++c) active[c] = c >= 1 && c <= cluster_max ? ce_active_groups(kernel, c) : 0;
        if (active[1] == 0) return LF_ERR_DEVICE;
        ready_d[dev] = 1;
    }
    /* Cluster size: the smallest power of two whose slices fit one 32 KB buffer (then each row is
     * read once), capped by the caller and by what the device can schedule; past that, pieces.
     * Automatic cap, measured on an H200 (bench_ce --clusters, 2026-11-21): the per-row cluster
     * exchange costs more than it saves beyond 4 CTAs (V = 152K: 0.90 ms at 4, 1.35 at 8, 2.86 at
     * 16; without clusters 0.96), and a forward-only pass, which needs no residency, is fastest
     * without clusters at every V. */
    const int64_t nvec_max = (p.vocab + lf_elem<T>::per_vec - 1) / lf_elem<T>::per_vec;
    int c = 1;
    while ((nvec_max + c - 1) / c > CE_PIECE_VECS && c < 16) c *= 2;
    /* ... and where a CTA would stream only 1 or 2 pieces, re-reading the second from L2 beats a
     * 2-CTA cluster (V = 32K, N = 16384: 0.70 ms streamed, 0.79 ms clustered). */
    const bool streams_cheaply = (nvec_max + CE_PIECE_VECS - 1) / CE_PIECE_VECS <= 2;
    const int cap = max_cluster > 0 ? max_cluster : (GRAD && !streams_cheaply ? CE_AUTO_CLUSTER_MAX : 1);
    if (c > cap) c = cap;
    while (c > 1 && (c > cluster_max || active[c] == 0)) --c;
    const int64_t slice = (nvec_max + c - 1) / c;
    const int npieces = (int)((slice + CE_PIECE_VECS - 1) / CE_PIECE_VECS);
    const int64_t nclusters = p.n_rows < active[c] ? p.n_rows : active[c];
    if (plan) {
        plan->schedule = CE_SCHED_STREAM;
        plan->stages = 0;
        plan->cluster = c;
        plan->pieces = npieces;
        plan->clusters = (int)nclusters;
        plan->ctas = (int)(nclusters * c);
        plan->dynamic = 0;
    }
    CE_CHECK(lf_launch_clusters(kernel, nclusters * c, c, dim3(CE_THREADS, 1, 1), CE_SMEM_BYTES, stream, false, p, c, npieces,
                                (int)nclusters));
    return LF_OK;
}

template <typename T>
static lf_status ce_dispatch(const ce_kparams &p, bool grad, bool full, bool softcap, const ce_args *a, cudaStream_t s,
                             cudaError_t *e)
{
    const int mc = a->max_cluster, sc = a->schedule, ns = a->stages, sr = a->static_rows;
    ce_plan *const pl = a->plan;
    if (!grad) return softcap ? ce_launch_kernel<T, false, true, true>(p, mc, sc, ns, sr, pl, s, e)
                              : ce_launch_kernel<T, false, true, false>(p, mc, sc, ns, sr, pl, s, e);
    if (full) return softcap ? ce_launch_kernel<T, true, true, true>(p, mc, sc, ns, sr, pl, s, e)
                             : ce_launch_kernel<T, true, true, false>(p, mc, sc, ns, sr, pl, s, e);
    return softcap ? ce_launch_kernel<T, true, false, true>(p, mc, sc, ns, sr, pl, s, e)
                   : ce_launch_kernel<T, true, false, false>(p, mc, sc, ns, sr, pl, s, e);
}

/* Whether a gradient buffer overlaps the logits other than in place (the same rows, the same
 * stride): that would race. n_rows >= 1 rows of `cols` elements. The other examples use it too. */
static bool ce_grad_overlaps(const void *logits, int64_t stride, const void *grad, int64_t grad_stride, int64_t n_rows,
                             int64_t cols, lf_dtype dt)
{
    const size_t esz = (size_t)lf_dtype_size(dt);
    const char *x0 = (const char *)logits, *g0 = (const char *)grad;
    const char *x1 = x0 + ((size_t)(n_rows - 1) * stride + cols) * esz;
    const char *g1 = g0 + ((size_t)(n_rows - 1) * grad_stride + cols) * esz;
    const bool same = grad == logits && grad_stride == stride;
    return !same && g0 < x1 && x0 < g1;
}

/* The arguments ce_launch refuses, checked on the host without touching the device (a caller
 * that must fail before some collective, as cp_local_ce.cu's phase A, asks this first). */
static lf_status ce_check_args(const ce_args *a)
{
    if (!a) return LF_ERR_NULL;
    lf_status st = lf_check_ce_opts(&a->opts);
    if (st != LF_OK) return st;
    if (a->n_rows < 0 || a->vocab < 1 || a->vocab > 0x7fffffff || a->stride < a->vocab) return LF_ERR_SIZE;
    if (a->dtype != LF_F32 && a->dtype != LF_BF16 && a->dtype != LF_F16) return LF_ERR_ARG;
    if ((int)a->reduction < 0 || (int)a->reduction > 2) return LF_ERR_ARG;
    /* stages: more than the warp groups (each holds a stage while another loads; see
     * ce_resident_kernel); the warp-per-row schedule serves forward only */
    if (a->schedule < CE_SCHED_AUTO || a->schedule > CE_SCHED_WARP || (a->schedule == CE_SCHED_WARP && a->grad) ||
        a->stages < 0 ||
        (a->stages > 0 && a->stages <= CE_RES_GROUPS) || a->stages > CE_RES_MAX_STAGES || a->max_cluster < 0)
        return LF_ERR_ARG;
    if (a->grad && a->grad_stride < a->vocab) return LF_ERR_SIZE;
    if (a->grad && a->n_rows > 0) {
        if (ce_grad_overlaps(a->logits, a->stride, a->grad, a->grad_stride, a->n_rows, a->vocab, a->dtype)) return LF_ERR_ARG;
    }
    if (a->n_rows > 0) {
        if (!a->logits || !a->labels || !a->loss || !a->workspace) return LF_ERR_NULL;
        if (a->workspace_bytes < ce_workspace_bytes(a->n_rows)) return LF_ERR_SIZE;
    }
    return LF_OK;
}

/* Validate, then launch (one kernel; two for reduction mean without a divisor). Returns LF_OK,
 * LF_ERR_* for bad arguments (nothing launched), or LF_ERR_DEVICE with *cuda_err set. */
[[maybe_unused]] static lf_status ce_launch(const ce_args *a, cudaStream_t stream, cudaError_t *cuda_err)
{
    if (cuda_err) *cuda_err = cudaSuccess;
    const lf_status st = ce_check_args(a);
    if (st != LF_OK) return st;
    if (a->n_rows == 0) {
        /* nothing to launch; a reduced loss of no rows is 0 */
        if (a->reduction != LF_REDUCE_NONE && a->loss) CE_CHECK(cudaMemsetAsync(a->loss, 0, sizeof(float), stream));
        if (a->reduction != LF_REDUCE_NONE && a->z_loss_out) CE_CHECK(cudaMemsetAsync(a->z_loss_out, 0, sizeof(float), stream));
        return LF_OK;
    }

    ce_kparams p;
    memset(&p, 0, sizeof p);
    p.logits = a->logits;
    p.stride = a->stride;
    p.n_rows = a->n_rows;
    p.vocab = a->vocab;
    p.labels = a->labels;
    p.labels_i64 = a->labels_i64;
    p.ignore_index = a->opts.ignore_index;
    p.class_w = a->opts.class_weights;
    p.eps = a->opts.label_smoothing;
    p.lam = a->opts.z_loss;
    p.xf = lf_xform_make(a->opts.logit_scale, a->opts.softcap);
    p.reduction = (int)a->reduction;
    p.divisor = a->divisor;
    p.dloss = a->dloss;
    p.grad_scale = a->grad_scale;
    p.grad = a->grad;
    p.grad_stride = a->grad_stride;
    p.loss = a->loss;
    p.z_out = a->z_loss_out;
    p.logprob = a->logprob;
    p.lse = a->lse;
    p.entropy = a->entropy;
    p.argmax = a->argmax;
    p.n_correct = a->n_correct;
    p.n_errors = a->n_errors;
    p.ws = (ce_ws_header *)a->workspace;
    p.ws_loss = (float *)((char *)a->workspace + sizeof(ce_ws_header));
    p.ws_z = p.ws_loss + a->n_rows;

    if (a->reduction == LF_REDUCE_MEAN && !a->divisor) {
        ce_divisor_kernel<<<ce_divisor_ctas(a->n_rows), CE_DIV_THREADS, 0, stream>>>(p);
        CE_CHECK(cudaGetLastError());
    }
    const bool grad = a->grad != NULL;
    const bool full = !grad || p.eps > 0.0f || a->entropy || a->argmax || a->n_correct;
    const bool softcap = p.xf.softcap > 0.0f;
    switch (a->dtype) {
    case LF_F32: return ce_dispatch<float>(p, grad, full, softcap, a, stream, cuda_err);
    case LF_BF16: return ce_dispatch<__nv_bfloat16>(p, grad, full, softcap, a, stream, cuda_err);
    default: return ce_dispatch<__half>(p, grad, full, softcap, a, stream, cuda_err);
    }
}
#endif /* CE_RESIDENT_ONLY */

/* CE_CHECK stays defined: cp_local_ce.cu and vocab_parallel_ce.cu, which include this file, use it */

/* The median time in ms of `iters` calls of step() (an lf_status-returning callable that
 * launches on the legacy stream), after two untimed ones: what the other examples' timings use. */
template <typename F>
static lf_status ce_time_median(F &&step, int iters, double *ms)
{
    cudaEvent_t e0, e1;
    if (iters < 1 || cudaEventCreate(&e0) != cudaSuccess) return LF_ERR_DEVICE;
    if (cudaEventCreate(&e1) != cudaSuccess) {
        cudaEventDestroy(e0);
        return LF_ERR_DEVICE;
    }
    lf_status st = LF_OK;
    float *t = (float *)malloc(sizeof(float) * (size_t)iters);
    for (int it = 0; t && st == LF_OK && it < iters + 2; ++it) {
        float m = 0.0f;
        if (cudaEventRecord(e0) != cudaSuccess) st = LF_ERR_DEVICE;
        if (st == LF_OK) st = step();
        if (st == LF_OK && (cudaEventRecord(e1) != cudaSuccess || cudaEventSynchronize(e1) != cudaSuccess ||
                            cudaEventElapsedTime(&m, e0, e1) != cudaSuccess))
            st = LF_ERR_DEVICE;
        if (st == LF_OK && it >= 2) t[it - 2] = m;
    }
    if (!t) st = LF_ERR_DEVICE;
    if (st == LF_OK) { /* insertion sort: a handful of values */
        for (int i = 1; i < iters; ++i)
            for (int j = i; j > 0 && t[j - 1] > t[j]; --j) {
                const float x = t[j];
                t[j] = t[j - 1];
                t[j - 1] = x;
            }
        *ms = t[iters / 2];
    }
    free(t);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return st;
}

/* ============================================================================================
 * 4. main: make data with outliers, run forward-only and forward+backward, check rows against
 *    lf_ref_ce_row, time the fused forward+backward in place.
 * ========================================================================================== */
#ifndef CE_NO_MAIN

#define CHECK_CUDA(call)                                                                            \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));  \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double rng_uniform(void) /* splitmix64 -> [0, 1) */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0);
}

/* Logits like a language model's: a normal bulk, a few strong candidates, rare large outliers. */
static float make_logit(void)
{
    double u = rng_uniform(), n = 0.0;
    for (int k = 0; k < 4; ++k) n += rng_uniform() - 0.5;
    if (u < 1e-4) return (float)(40.0 * (rng_uniform() - 0.3));
    if (u < 1e-2) return (float)(8.0 + 4.0 * n);
    return (float)(2.0 * n * 1.7);
}

static uint16_t to_half_bits(float v, lf_dtype t) { return t == LF_BF16 ? lf_f32_to_bf16(v) : lf_f32_to_f16(v); }
static float from_half_bits(uint16_t h, lf_dtype t) { return t == LF_BF16 ? lf_bf16_to_f32(h) : lf_f16_to_f32(h); }

int main(int argc, char **argv)
{
    int64_t N = argc > 1 ? atoll(argv[1]) : 4096;
    int64_t V = argc > 2 ? atoll(argv[2]) : 32768;
    lf_dtype dt = LF_BF16;
    if (argc > 3) dt = !strcmp(argv[3], "fp32") ? LF_F32 : !strcmp(argv[3], "fp16") ? LF_F16 : LF_BF16;
    const char *dname = dt == LF_F32 ? "fp32" : dt == LF_F16 ? "fp16" : "bf16";
    const int esz = lf_dtype_size(dt);

    lf_ce_opts o = lf_ce_opts_default();
    o.label_smoothing = 0.1f;
    o.z_loss = 1e-4f;

    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        /* Say so plainly, and still show the host reference at work. */
        const int64_t n = 8, v = 1000;
        float *xh = (float *)malloc(sizeof(float) * n * v);
        int64_t *yh = (int64_t *)malloc(sizeof(int64_t) * n);
        for (int64_t i = 0; i < n * v; ++i) xh[i] = make_logit();
        for (int64_t i = 0; i < n; ++i) yh[i] = i == 3 ? o.ignore_index : (int64_t)(rng_uniform() * v);
        double loss = 0.0, z = 0.0;
        lf_status st = lf_ref_cross_entropy(n, v, xh, v, yh, &o, LF_REDUCE_MEAN, -1.0, &loss, &z, NULL, NULL);
        printf("no CUDA device found: ran the host reference only\n");
        printf("lf_ref_cross_entropy N=%lld V=%lld smoothing=0.1 z_loss=1e-4: status=%s mean loss=%.6f (z part %.3g)\n",
               (long long)n, (long long)v, lf_status_str(st), loss, z);
        free(xh);
        free(yh);
        return st == LF_OK ? 0 : 1;
    }

    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d)  N=%lld V=%lld %s  smoothing=0.1 z_loss=1e-4\n", prop.name, prop.major, prop.minor,
           (long long)N, (long long)V, dname);

    /* host data */
    const size_t nel = (size_t)N * (size_t)V;
    float *xf = (float *)malloc(nel * sizeof(float));
    void *xh = malloc(nel * esz);
    int64_t *yh = (int64_t *)malloc(N * sizeof(int64_t));
    for (size_t i = 0; i < nel; ++i) {
        float v = make_logit();
        if (dt == LF_F32) ((float *)xh)[i] = v;
        else v = from_half_bits(((uint16_t *)xh)[i] = to_half_bits(v, dt), dt);
        xf[i] = v; /* the reference sees exactly what the kernel sees */
    }
    for (int64_t i = 0; i < N; ++i) yh[i] = rng_uniform() < 0.05 ? o.ignore_index : (int64_t)(rng_uniform() * V);

    void *xd, *wsd;
    int64_t *yd;
    float *loss_d, *lp_d, *lse_d, *ent_d;
    int32_t *am_d;
    unsigned *cnt_d;
    const size_t wsb = ce_workspace_bytes(N);
    CHECK_CUDA(cudaMalloc(&xd, nel * esz));
    CHECK_CUDA(cudaMalloc(&yd, N * sizeof(int64_t)));
    CHECK_CUDA(cudaMalloc(&loss_d, N * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&lp_d, N * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&lse_d, N * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&ent_d, N * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&am_d, N * sizeof(int32_t)));
    CHECK_CUDA(cudaMalloc(&cnt_d, 2 * sizeof(unsigned)));
    CHECK_CUDA(cudaMalloc(&wsd, wsb));
    CHECK_CUDA(cudaMemset(wsd, 0, wsb));
    CHECK_CUDA(cudaMemset(cnt_d, 0, 2 * sizeof(unsigned)));
    CHECK_CUDA(cudaMemcpy(xd, xh, nel * esz, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(yd, yh, N * sizeof(int64_t), cudaMemcpyHostToDevice));

    /* forward only: per-row statistics */
    ce_args a = ce_args_default();
    a.logits = xd;
    a.dtype = dt;
    a.n_rows = N;
    a.vocab = V;
    a.stride = V;
    a.labels = yd;
    a.labels_i64 = 1;
    a.opts = o;
    a.reduction = LF_REDUCE_NONE;
    a.loss = loss_d;
    a.logprob = lp_d;
    a.lse = lse_d;
    a.entropy = ent_d;
    a.argmax = am_d;
    a.n_correct = cnt_d;
    a.n_errors = cnt_d + 1;
    a.workspace = wsd;
    a.workspace_bytes = wsb;
    cudaError_t ce;
    lf_status st = ce_launch(&a, 0, &ce);
    if (st != LF_OK) {
        fprintf(stderr, "ce_launch: %s (%s)\n", lf_status_str(st), cudaGetErrorString(ce));
        return 1;
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    float *lossh = (float *)malloc(N * sizeof(float)), *lph = (float *)malloc(N * sizeof(float));
    float *entrh = (float *)malloc(N * sizeof(float));
    CHECK_CUDA(cudaMemcpy(lossh, loss_d, N * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(lph, lp_d, N * sizeof(float), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(entrh, ent_d, N * sizeof(float), cudaMemcpyDeviceToHost));

    /* forward + backward in place, mean over valid tokens */
    a.reduction = LF_REDUCE_MEAN;
    a.logprob = a.lse = a.entropy = NULL;
    a.argmax = NULL;
    a.n_correct = NULL;
    a.grad = xd;
    a.grad_stride = V;
    st = ce_launch(&a, 0, &ce);
    if (st != LF_OK) {
        fprintf(stderr, "ce_launch: %s (%s)\n", lf_status_str(st), cudaGetErrorString(ce));
        return 1;
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    float mean_loss;
    CHECK_CUDA(cudaMemcpy(&mean_loss, loss_d, sizeof(float), cudaMemcpyDeviceToHost));

    /* check 16 rows (first, last, random) against the double reference */
    double *dx = (double *)malloc(V * sizeof(double)), max_rel_loss = 0.0, max_grad_err = 0.0;
    double wsum = 0.0;
    for (int64_t i = 0; i < N; ++i) wsum += yh[i] != o.ignore_index ? 1.0 : 0.0;
    /* A bf16 / fp16 gradient can differ from the exact one by its rounding, 2^-8 / 2^-11 relative;
     * fp32 by the kernel's own arithmetic (ex2.approx, fp32 sums): 2^-17. Plus 1e-6 of the row's
     * largest entry for the cancellation in a p_j - eps/V. Error 1.0 = exactly at tolerance. */
    const double unit = dt == LF_BF16 ? 0x1p-8 : dt == LF_F16 ? 0x1p-11 : 0x1p-17;
    void *grow = malloc(V * esz);
    for (int k = 0; k < 16; ++k) {
        int64_t i = k == 0 ? 0 : k == 1 ? N - 1 : (int64_t)(rng_uniform() * N);
        lf_ce_row r = lf_ref_ce_row(xf + i * V, V, yh[i], &o, dx);
        double e = fabs(lossh[i] - r.loss) / fmax(1.0, fabs(r.loss));
        if (r.status == LF_ROW_OK) e = fmax(e, fabs(lph[i] - r.logprob) / fmax(1.0, fabs(r.logprob)));
        max_rel_loss = fmax(max_rel_loss, e);
        CHECK_CUDA(cudaMemcpy(grow, (char *)xd + (size_t)i * V * esz, V * esz, cudaMemcpyDeviceToHost));
        double rowmax = 0.0;
        for (int64_t j = 0; j < V; ++j) rowmax = fmax(rowmax, fabs(dx[j] / wsum));
        for (int64_t j = 0; j < V; ++j) {
            double g = dt == LF_F32 ? ((float *)grow)[j] : from_half_bits(((uint16_t *)grow)[j], dt);
            double want = dx[j] / wsum;
            max_grad_err = fmax(max_grad_err, fabs(g - want) / (fabs(want) * unit + 1e-6 * rowmax + 1e-30));
        }
    }

    /* time the fused forward + backward in place (input restored before every run, untimed) */
    void *pristine;
    CHECK_CUDA(cudaMalloc(&pristine, nel * esz));
    CHECK_CUDA(cudaMemcpy(pristine, xh, nel * esz, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int it = 0; it < 6; ++it) {
        CHECK_CUDA(cudaMemcpy(xd, pristine, nel * esz, cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaEventRecord(e0));
        st = ce_launch(&a, 0, &ce);
        CHECK_CUDA(cudaEventRecord(e1));
        CHECK_CUDA(cudaEventSynchronize(e1));
        if (st != LF_OK) return 1;
        float ms;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (it > 0 && ms < best) best = ms;
    }
    unsigned cnt[2];
    CHECK_CUDA(cudaMemcpy(cnt, cnt_d, sizeof cnt, cudaMemcpyDeviceToHost));

    printf("forward only : accuracy %.4f, entropy[0] %.4f, 16 rows vs lf_ref: max rel err %.2e\n",
           (double)cnt[0] / wsum, entrh[0], max_rel_loss);
    printf("fwd+bwd      : mean loss %.6f, gradient vs lf_ref: max err %.3f of tolerance (%s)\n", mean_loss,
           max_grad_err, dname);
    printf("fwd+bwd time : %.3f ms, %.1f GB/s (read logits once + write gradient once = %d B/elem)\n", best,
           2.0 * nel * esz / (best * 1e6), 2 * esz);
    printf("bad labels   : %u\n", cnt[1]);
    const int ok = max_rel_loss < 1e-5 && max_grad_err <= 1.0;
    printf("%s\n", ok ? "OK" : "MISMATCH");
    return ok ? 0 : 1;
}
#endif /* CE_NO_MAIN */
#endif /* LOSSFUSE_EXAMPLE_CROSS_ENTROPY_CU */
