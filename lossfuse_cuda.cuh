/* lossfuse_cuda.cuh — CUDA collectives for fused LLM-training loss kernels
 *
 * Version 0.1.0 (matches lossfuse.h).  Licence: MIT (see LICENSE).
 *
 * What this is
 *   Device-only `static __forceinline__` building blocks that you compose inside your own
 *   kernel: warp/block reductions of the lossfuse.h states, 16-byte vectorized row access with
 *   misaligned heads and tails, the one-read online-softmax row pass (lse, entropy, argmax,
 *   weighted logit sum), the cross-entropy gradient writer (in place or to another buffer),
 *   and on sm_90 the cluster merge that lets 2..16 CTAs share one vocabulary row through
 *   distributed shared memory so that a 256K-wide row is read from HBM exactly once.
 *   Nothing here launches a kernel, allocates, or hides __shared__ arrays: scratch is yours.
 *
 * Quick start — one CTA of 256 threads per row, forward only, the row in shared memory
 * (see examples/cross_entropy.cu for the pipelined, clustered, fused forward+backward):
 *     __global__ void row_lse(const __nv_bfloat16 *x, int64_t V, int64_t stride, float *out) {
 *         extern __shared__ uint4 buf[];                   // ceil(V / 8) vectors
 *         __shared__ lf_row_stats red[256 / 32];
 *         const __nv_bfloat16 *row = x + blockIdx.x * stride;
 *         const lf_row_span sp = lf_row_span_make(row, V);  // head | 16-byte body | tail
 *         const lf_xform t = lf_xform_make(1.0f, 0.0f);     // scale 1, no softcap
 *         lf_piece_load<256>(buf, row, sp, 0, sp.nvec);     // this thread's cp.async copies
 *         lf_cp_async_commit();
 *         const lf_edge e = lf_row_edge_load(row, sp);      // the <= 14 unaligned elements
 *         lf_cp_async_wait<0>();                             // own copies landed: no barrier
 *         lf_row_stats st = lf_row_stats_init();
 *         lf_edge_stats<false, false>(st, e, t, NULL);
 *         lf_piece_stats<256, __nv_bfloat16, false, false>(st, buf, sp, 0, sp.nvec, t, NULL);
 *         st = lf_block_row_stats<256>(st, red);            // same value in every thread
 *         if (threadIdx.x == 0) out[blockIdx.x] = lf_lse_final(st.lse);
 *     }
 *
 * Contents (in file order)
 *   1. Configuration, fast exp2, element types (lf_elem<T>: unpack/pack, get, packed max)
 *   2. Warp reductions (lf_warp_*): results broadcast to all 32 lanes
 *   3. Block reductions (lf_block_*): caller-owned scratch, results broadcast to all threads;
 *      lf_block_lse_fast (one barrier) and its halves lf_block_lse_post / _merge around a
 *      shared-memory mbarrier (lf_mbar_init / _arrive / _wait)
 *   4. Vectorized row access: lf_row_span (head / 16-byte body / tail), 16-byte loads/stores
 *   5. Shared-memory pieces and the online-softmax row pass: cp.async, lf_row_slice,
 *      lf_piece_load, lf_row_edge_load (or _issue + lf_edge_resolve), lf_piece_stats (every
 *      option), lf_piece_stats_fast (no softcap / class weights: about half the instructions,
 *      lazy argmax), lf_edge_stats
 *   6. Cross-entropy gradient writer: lf_grad_coef_make, lf_ce_grad_elem, lf_ce_label_grad,
 *      lf_piece_grad_store, lf_piece_grad_fast (coefficient folded into the exponent),
 *      lf_edge_grad_store, lf_row_zero
 *   7. Clusters (sm_90): lf_cluster_row_stats, lf_cluster_sync (= lf_cluster_arrive + _wait)
 *
 * Configuration macros: those of lossfuse.h (LF_HD, LF_USE_EXP2, LF_ASSERT). Nothing else.
 *
 * Rules kept throughout
 *   - Every function is static; no __device__ or __constant__ variables; no hidden __shared__.
 *   - Each collective says which threads hold its result and which barrier you owe before
 *     reusing its scratch.
 *   - Reductions combine in a fixed order and the merges are commutative bit for bit, so the
 *     same launch configuration gives bit-identical results run to run.
 *   - Element indices within a row are int32 (vocabularies < 2^31); row offsets are int64.
 */
#ifndef LOSSFUSE_CUDA_CUH
#define LOSSFUSE_CUDA_CUH

#include "lossfuse.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <float.h>

/* ============================================================================================
 * 1. Configuration, fast exp2, element types
 * ========================================================================================== */

/* 2^x with the MUFU.EX2 unit; flushes subnormal results to zero (harmless for probabilities:
 * p < 2^-126 contributes nothing representable to a sum of order 1). Max relative error
 * ~2^-22 over the range we use, well inside the 1e-5 tolerance of the examples. */
static __device__ __forceinline__ float lf_ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* How raw logits x become the softmax's logits z: z = softcap(scale * x) (lossfuse.h §4).
 * scale_l2e = scale * log2(e) is precomputed so that exp(z - m) is one FFMA + EX2. */
typedef struct lf_xform {
    float scale;
    float softcap;   /* 0: off */
    float inv_cap;   /* 1 / softcap, or 0 */
    float scale_l2e; /* scale * log2(e) */
} lf_xform;

static __host__ __device__ __forceinline__ lf_xform lf_xform_make(float scale, float softcap)
{
    lf_xform t;
    t.scale = scale;
    t.softcap = softcap > 0.0f ? softcap : 0.0f;
    t.inv_cap = softcap > 0.0f ? 1.0f / softcap : 0.0f;
    t.scale_l2e = scale * LF_LOG2E;
    return t;
}

/* z of a raw logit; SOFTCAP must match (t.softcap > 0) — it is a template parameter so that the
 * common no-cap case carries no branch in the inner loops. */
template <bool SOFTCAP>
static __device__ __forceinline__ float lf_xform_apply(float x, const lf_xform &t)
{
    return SOFTCAP ? lf_softcap(x * t.scale, t.softcap) : x * t.scale;
}

/* Element types: how a 16-byte vector (uint4) unpacks to floats and packs back.
 *   lf_elem<T>::per_vec   elements per 16 bytes (4 for float, 8 for bf16 / fp16)
 *   lf_elem<T>::unpack    uint4 -> float[per_vec];  pack: float[per_vec] -> uint4 (RNE)
 *   lf_elem<T>::to_f32 / from_f32  for single elements (heads, tails, label logits);
 *       get(vector, e): element e of a vector, selected in registers.
 *   lf_elem<T>::mx_t, mx_init, mx_push, mx_final: a running maximum of whole vectors kept in the
 *       element type, so that a 16-bit row costs one packed max (max.bf16x2 / max.f16x2, sm_80+)
 *       per TWO elements and nothing to unpack. The max of bf16/fp16 values is exact in any
 *       width. NaN is ignored (as fmaxf), -inf is the identity. */
template <typename T> struct lf_elem;

static __device__ __forceinline__ unsigned lf_impl_max_bf16x2(unsigned a, unsigned b)
{
    unsigned d;
    asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
static __device__ __forceinline__ unsigned lf_impl_max_f16x2(unsigned a, unsigned b)
{
    unsigned d;
    asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

template <> struct lf_elem<float> {
    enum { per_vec = 4 };
    static __device__ __forceinline__ float to_f32(float v) { return v; }
    static __device__ __forceinline__ float from_f32(float v) { return v; }
    static __device__ __forceinline__ void unpack(const uint4 &r, float *f)
    {
        f[0] = __uint_as_float(r.x);
        f[1] = __uint_as_float(r.y);
        f[2] = __uint_as_float(r.z);
        f[3] = __uint_as_float(r.w);
    }
    static __device__ __forceinline__ uint4 pack(const float *f)
    {
        return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                          __float_as_uint(f[3]));
    }
    /* element e (runtime, < per_vec) of a vector, in registers (no local-memory array) */
    static __device__ __forceinline__ float get(const uint4 &r, int e)
    {
        return __uint_as_float(e == 0 ? r.x : e == 1 ? r.y : e == 2 ? r.z : r.w);
    }
    typedef float mx_t;
    static __device__ __forceinline__ mx_t mx_init(void) { return -LF_INF_F; }
    static __device__ __forceinline__ mx_t mx_push(mx_t a, const uint4 &r)
    {
        return fmaxf(a, fmaxf(fmaxf(__uint_as_float(r.x), __uint_as_float(r.y)),
                              fmaxf(__uint_as_float(r.z), __uint_as_float(r.w))));
    }
    static __device__ __forceinline__ float mx_final(mx_t a) { return a; }
};

template <> struct lf_elem<__nv_bfloat16> {
    enum { per_vec = 8 };
    static __device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
    static __device__ __forceinline__ __nv_bfloat16 from_f32(float v) { return __float2bfloat16_rn(v); }
    static __device__ __forceinline__ void unpack(const uint4 &r, float *f)
    {
        /* A bf16 is the top half of a float: two shifts/masks per pair, no conversion unit. */
        const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f[2 * i] = __uint_as_float(w[i] << 16);
            f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
    static __device__ __forceinline__ unsigned pack2(float a, float b)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<unsigned *>(&h);
    }
    static __device__ __forceinline__ uint4 pack(const float *f)
    {
        return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
    }
    static __device__ __forceinline__ float get(const uint4 &r, int e)
    {
        const int k = e >> 1;
        const unsigned w = k == 0 ? r.x : k == 1 ? r.y : k == 2 ? r.z : r.w;
        return __uint_as_float((e & 1) ? (w & 0xffff0000u) : (w << 16));
    }
    typedef unsigned mx_t; /* two bf16 lanes: even and odd elements */
    static __device__ __forceinline__ mx_t mx_init(void) { return 0xff80ff80u; }
    static __device__ __forceinline__ mx_t mx_push(mx_t a, const uint4 &r)
    {
        return lf_impl_max_bf16x2(a, lf_impl_max_bf16x2(lf_impl_max_bf16x2(r.x, r.y), lf_impl_max_bf16x2(r.z, r.w)));
    }
    static __device__ __forceinline__ float mx_final(mx_t a)
    {
        return fmaxf(__uint_as_float(a << 16), __uint_as_float(a & 0xffff0000u));
    }
};

template <> struct lf_elem<__half> {
    enum { per_vec = 8 };
    static __device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
    static __device__ __forceinline__ __half from_f32(float v) { return __float2half_rn(v); }
    static __device__ __forceinline__ void unpack(const uint4 &r, float *f)
    {
        const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            __half2 h = *reinterpret_cast<const __half2 *>(&w[i]);
            float2 v = __half22float2(h);
            f[2 * i] = v.x;
            f[2 * i + 1] = v.y;
        }
    }
    static __device__ __forceinline__ unsigned pack2(float a, float b)
    {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<unsigned *>(&h);
    }
    static __device__ __forceinline__ uint4 pack(const float *f)
    {
        return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]), pack2(f[6], f[7]));
    }
    static __device__ __forceinline__ float get(const uint4 &r, int e)
    {
        const int k = e >> 1;
        const unsigned w = k == 0 ? r.x : k == 1 ? r.y : k == 2 ? r.z : r.w;
        const unsigned short h = (unsigned short)((e & 1) ? (w >> 16) : (w & 0xffffu));
        return __half2float(__ushort_as_half(h));
    }
    typedef unsigned mx_t;
    static __device__ __forceinline__ mx_t mx_init(void) { return 0xfc00fc00u; }
    static __device__ __forceinline__ mx_t mx_push(mx_t a, const uint4 &r)
    {
        return lf_impl_max_f16x2(a, lf_impl_max_f16x2(lf_impl_max_f16x2(r.x, r.y), lf_impl_max_f16x2(r.z, r.w)));
    }
    static __device__ __forceinline__ float mx_final(mx_t a)
    {
        const __half2 h = *reinterpret_cast<const __half2 *>(&a);
        const float2 f = __half22float2(h);
        return fmaxf(f.x, f.y);
    }
};

/* ============================================================================================
 * 2. Warp reductions
 *    Usage:  float s = lf_warp_sum_f32(v);           // every lane of a full warp gets the sum
 *    All 32 lanes must call (full mask). The xor butterfly with a commutative combine leaves
 *    the bit-identical value in every lane, so no broadcast is needed afterwards.
 * ========================================================================================== */

static __device__ __forceinline__ float lf_impl_shfl(float v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
static __device__ __forceinline__ double lf_impl_shfl(double v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
static __device__ __forceinline__ int32_t lf_impl_shfl(int32_t v, int o) { return __shfl_xor_sync(0xffffffffu, v, o); }
static __device__ __forceinline__ lf_lse lf_impl_shfl(lf_lse v, int o)
{
    v.m = lf_impl_shfl(v.m, o);
    v.s = lf_impl_shfl(v.s, o);
    v.u = lf_impl_shfl(v.u, o);
    return v;
}
static __device__ __forceinline__ lf_argmax lf_impl_shfl(lf_argmax v, int o)
{
    v.v = lf_impl_shfl(v.v, o);
    v.i = lf_impl_shfl(v.i, o);
    return v;
}
static __device__ __forceinline__ lf_row_stats lf_impl_shfl(lf_row_stats v, int o)
{
    v.lse = lf_impl_shfl(v.lse, o);
    v.am = lf_impl_shfl(v.am, o);
    v.wz = lf_impl_shfl(v.wz, o);
    v.w = lf_impl_shfl(v.w, o);
    return v;
}

/* Combine functors: internal, so that one butterfly and one block pattern serve every type. */
struct lf_impl_op_sum {
    template <typename X> __device__ __forceinline__ X operator()(X a, X b) const { return a + b; }
};
struct lf_impl_op_max {
    __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct lf_impl_op_lse {
    __device__ __forceinline__ lf_lse operator()(lf_lse a, lf_lse b) const { return lf_lse_merge(a, b); }
};
struct lf_impl_op_argmax {
    __device__ __forceinline__ lf_argmax operator()(lf_argmax a, lf_argmax b) const { return lf_argmax_merge(a, b); }
};
struct lf_impl_op_stats {
    __device__ __forceinline__ lf_row_stats operator()(lf_row_stats a, lf_row_stats b) const
    {
        return lf_row_stats_merge(a, b);
    }
};

template <typename S, typename Op>
static __device__ __forceinline__ S lf_impl_warp_allreduce(S v, Op op)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, lf_impl_shfl(v, o));
    return v;
}

static __device__ __forceinline__ float lf_warp_sum_f32(float v) { return lf_impl_warp_allreduce(v, lf_impl_op_sum()); }
static __device__ __forceinline__ double lf_warp_sum_f64(double v) { return lf_impl_warp_allreduce(v, lf_impl_op_sum()); }
/* fmaxf semantics: NaN inputs are ignored unless every lane holds NaN. */
static __device__ __forceinline__ float lf_warp_max_f32(float v) { return lf_impl_warp_allreduce(v, lf_impl_op_max()); }
static __device__ __forceinline__ lf_lse lf_warp_lse(lf_lse v) { return lf_impl_warp_allreduce(v, lf_impl_op_lse()); }
static __device__ __forceinline__ lf_argmax lf_warp_argmax(lf_argmax v) { return lf_impl_warp_allreduce(v, lf_impl_op_argmax()); }
static __device__ __forceinline__ lf_row_stats lf_warp_row_stats(lf_row_stats v)
{
    return lf_impl_warp_allreduce(v, lf_impl_op_stats());
}

/* ============================================================================================
 * 3. Block reductions
 *    Usage:
 *        __shared__ float scratch[THREADS / 32];
 *        float total = lf_block_sum_f32<THREADS>(v, scratch);   // every thread gets the sum
 *    THREADS = blockDim.x, a multiple of 32 (checked at compile time), at most 1024.
 *    Scratch holds THREADS/32 values of the reduced type. The call contains one __syncthreads;
 *    before the same scratch is passed to another call, the caller owes one more __syncthreads
 *    (a thread may still be reading it). Every thread reads the warp partials in the same order,
 *    so every thread holds the bit-identical result.
 * ========================================================================================== */

template <int THREADS, typename S, typename Op>
static __device__ __forceinline__ S lf_impl_block_allreduce(S v, S *scratch, Op op)
{
    static_assert(THREADS % 32 == 0 && THREADS >= 32 && THREADS <= 1024, "THREADS: multiple of 32 in [32, 1024]");
    v = lf_impl_warp_allreduce(v, op);
    if (THREADS == 32) return v;
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    S r = scratch[0];
#pragma unroll
    for (int w = 1; w < THREADS / 32; ++w) r = op(r, scratch[w]);
    return r;
}

template <int THREADS> static __device__ __forceinline__ float lf_block_sum_f32(float v, float *scratch)
{
    return lf_impl_block_allreduce<THREADS>(v, scratch, lf_impl_op_sum());
}
template <int THREADS> static __device__ __forceinline__ double lf_block_sum_f64(double v, double *scratch)
{
    return lf_impl_block_allreduce<THREADS>(v, scratch, lf_impl_op_sum());
}
template <int THREADS> static __device__ __forceinline__ float lf_block_max_f32(float v, float *scratch)
{
    return lf_impl_block_allreduce<THREADS>(v, scratch, lf_impl_op_max());
}
template <int THREADS> static __device__ __forceinline__ lf_lse lf_block_lse(lf_lse v, lf_lse *scratch)
{
    return lf_impl_block_allreduce<THREADS>(v, scratch, lf_impl_op_lse());
}
template <int THREADS>
static __device__ __forceinline__ lf_row_stats lf_block_row_stats(lf_row_stats v, lf_row_stats *scratch)
{
    return lf_impl_block_allreduce<THREADS>(v, scratch, lf_impl_op_stats());
}

/* lf_block_lse_fast (= lf_block_lse_post, __syncthreads, lf_block_lse_merge).
 * Block merge of per-thread lse states for hot loops, with ONE barrier: each warp moves its
 * lanes onto the warp's max and sums them (shuffles), lane 0 leaves one partial per warp, and
 * after the barrier lanes 0..W-1 of every warp merge the W partials the same way. A barrier
 * costs the skew of the slowest warp; lf_block_lse pays one too but an lse merge (two exps and
 * the NaN / -0 rules) at every level of its tree. Same contract: every thread gets the
 * bit-identical state, combined in a fixed order.
 *   FULL: also u (entropy), and alongside: the block max of *xmax with, in *xidx, the smallest
 *   *xidx >= 0 among the threads whose *xmax is that max (-1 if none: an argmax, first index
 *   on ties), and the block sum of *xsum.
 *   Neither m nor *xmax may be NaN (NaN lives in s; true for lf_lse_push and
 *   lf_piece_stats_fast states).
 *   scratch: 6 * THREADS / 32 floats; the caller owes a __syncthreads before reusing it. */
template <int THREADS, bool FULL>
static __device__ __forceinline__ void lf_block_lse_post(lf_lse v, float xmax, int32_t xidx, float xsum, float *scratch)
{
    static_assert(THREADS % 32 == 0 && THREADS >= 32 && THREADS <= 1024, "THREADS: multiple of 32 in [32, 1024]");
    const int W = THREADS / 32, lane = (int)(threadIdx.x & 31u), warp = (int)(threadIdx.x >> 5);
    /* the warp's partial, relative to the warp's max */
    float m = lf_warp_max_f32(v.m);
    if (m == 0.0f) m = 0.0f; /* one zero for every lane */
    lf_impl_lse_rescale(v.m, m, &v.s, &v.u);
    const float s = lf_warp_sum_f32(v.s);
    float u = 0.0f, xs = 0.0f, xm = 0.0f;
    int32_t xi = 0;
    if (FULL) {
        u = lf_warp_sum_f32(v.u);
        xs = lf_warp_sum_f32(xsum);
        xm = lf_warp_max_f32(xmax);
        xi = __reduce_min_sync(0xffffffffu, (xmax == xm && xidx >= 0) ? xidx : INT32_MAX);
    }
    if (lane == 0) {
        scratch[warp] = m;
        scratch[W + warp] = s;
        if (FULL) {
            scratch[2 * W + warp] = u;
            scratch[3 * W + warp] = xs;
            scratch[4 * W + warp] = xm;
            reinterpret_cast<int32_t *>(scratch)[5 * W + warp] = xi;
        }
    }
}

template <int THREADS, bool FULL>
static __device__ __forceinline__ lf_lse lf_block_lse_merge(float *xmax, int32_t *xidx, float *xsum, const float *scratch)
{
    const int W = THREADS / 32, lane = (int)(threadIdx.x & 31u);
    /* lane w of every warp takes partial w; the same shuffles everywhere: identical results */
    float pm = -LF_INF_F, ps = 0.0f, pu = 0.0f, px = 0.0f, pxm = -LF_INF_F;
    int32_t pxi = INT32_MAX;
    if (lane < W) {
        pm = scratch[lane];
        ps = scratch[W + lane];
        if (FULL) {
            pu = scratch[2 * W + lane];
            px = scratch[3 * W + lane];
            pxm = scratch[4 * W + lane];
            pxi = reinterpret_cast<const int32_t *>(scratch)[5 * W + lane];
        }
    }
    lf_lse v;
    float M = lf_warp_max_f32(pm);
    if (M == 0.0f) M = 0.0f;
    lf_impl_lse_rescale(pm, M, &ps, &pu);
    v.m = M;
    v.s = lf_warp_sum_f32(ps);
    v.u = FULL ? lf_warp_sum_f32(pu) : 0.0f;
    if (FULL) {
        *xsum = lf_warp_sum_f32(px);
        const float XM = lf_warp_max_f32(pxm);
        const int32_t XI = __reduce_min_sync(0xffffffffu, pxm == XM ? pxi : INT32_MAX);
        *xmax = XM;
        *xidx = XI == INT32_MAX ? -1 : XI;
    }
    return v;
}

/* post + barrier + merge. Split, the two halves let a kernel arrive on an mbarrier after
 * lf_block_lse_post and merge later, after more work, instead of waiting for the slowest warp
 * (lf_mbar_*; examples/cross_entropy.cu does this for the forward-only statistics). */
template <int THREADS, bool FULL>
static __device__ __forceinline__ lf_lse lf_block_lse_fast(lf_lse v, float *xmax, int32_t *xidx, float *xsum,
                                                           float *scratch)
{
    lf_block_lse_post<THREADS, FULL>(v, FULL ? *xmax : 0.0f, FULL ? *xidx : 0, FULL ? *xsum : 0.0f, scratch);
    __syncthreads();
    return lf_block_lse_merge<THREADS, FULL>(xmax, xidx, xsum, scratch);
}

/* Shared-memory mbarriers (sm_80+): a barrier whose arrive and wait are separate, so a thread
 * can announce "my part is written" and go on. Init by one thread, then a __syncthreads before
 * use; each phase completes after `count` arrivals; lf_mbar_wait(bar, parity) waits for the
 * completion of the phase with that parity (phases alternate 0, 1, 0, ...). Arrive releases
 * and wait acquires (CTA scope): shared-memory writes before an arrive are seen after the wait. */
static __device__ __forceinline__ void lf_mbar_init(uint64_t *bar, unsigned count)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.init.shared.b64 [%0], %1;" ::"r"(a), "r"(count) : "memory");
}
static __device__ __forceinline__ void lf_mbar_arrive(uint64_t *bar)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.shared.b64 st, [%0];\n\t}" ::"r"(a) : "memory");
}
static __device__ __forceinline__ void lf_mbar_wait(uint64_t *bar, unsigned parity)
{
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(bar);
    uint32_t done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.test_wait.parity.shared.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}

/* ============================================================================================
 * 4. Vectorized row access
 *    A row of V elements starting at any element-aligned address splits into
 *        head: elements before the first 16-byte boundary (< per_vec of them),
 *        body: nvec whole 16-byte vectors,
 *        tail: the elements after the last whole vector (< per_vec).
 *    So V not a multiple of 8 and rows of a strided view (stride not a multiple of 8) still get
 *    16-byte loads for all but at most 2*(per_vec-1) elements per row.
 * ========================================================================================== */

typedef struct lf_row_span {
    int32_t head;  /* scalar elements before the body */
    int32_t tail;  /* scalar elements after the body */
    int32_t nvec;  /* 16-byte vectors in the body (V < 2^31, so in-row indices are 32-bit) */
    int32_t phase; /* row address mod 16: two rows with equal phase vectorize identically */
} lf_row_span;

template <typename T>
static __device__ __forceinline__ lf_row_span lf_row_span_make(const T *row, int64_t V)
{
    const int pv = lf_elem<T>::per_vec;
    lf_row_span sp;
    sp.phase = (int32_t)((uintptr_t)row & 15u);
    int64_t head = (int64_t)(((16 - sp.phase) & 15) / (int)sizeof(T));
    if (head > V) head = V;
    sp.head = (int32_t)head;
    sp.nvec = (int32_t)((V - head) / pv);
    sp.tail = (int32_t)(V - head - sp.nvec * pv);
    return sp;
}

/* 16-byte store of data nobody reads in this kernel (streaming, evict-first). */
static __device__ __forceinline__ void lf_st16(uint4 *p, uint4 v) { __stcs(p, v); }

/* ============================================================================================
 * 5. Shared-memory pieces and the online-softmax row pass
 *
 *    A piece is a range [vbeg, vend) of a row's 16-byte body vectors staged in shared memory.
 *    Thread t owns vectors vbeg + t + k*THREADS, stored at buf[t + k*THREADS] (consecutive
 *    threads, consecutive 16 bytes: coalesced in global memory, conflict-free in shared). The
 *    owner copies them in with cp.async and is the only thread that reads them back, so
 *    cp.async.wait_group — per thread — is all the synchronisation a piece needs.
 *    Why shared memory and not registers: a kernel can then issue the copies of the NEXT piece
 *    (or row) before it computes on the current one, keeping HBM busy while it reduces and
 *    writes; and a row that is cached in shared memory is read from HBM once even when its
 *    gradient can only be written after a reduction over the whole row.
 *    Rows too large for one CTA's shared memory are split over the CTAs of a cluster
 *    (lf_row_slice) or streamed in several pieces.
 * ========================================================================================== */

/* 16-byte asynchronous copy global -> shared (sm_80+), cached in L2 only (.cg): the data is
 * streamed, L1 would only be polluted. Completion: lf_cp_async_commit closes a group of this
 * thread's copies; lf_cp_async_wait<N> waits until at most N of its groups are in flight. */
static __device__ __forceinline__ void lf_cp_async16(void *smem, const void *gmem)
{
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}
static __device__ __forceinline__ void lf_cp_async_commit(void) { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> static __device__ __forceinline__ void lf_cp_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* The share of a row's body that CTA `rank` of `nranks` (a cluster) takes: vectors
 * [*beg, *end), contiguous, equal to within one vector. */
static __device__ __forceinline__ void lf_row_slice(const lf_row_span &sp, int rank, int nranks, int *beg, int *end)
{
    const int per = (sp.nvec + nranks - 1) / nranks;
    *beg = min(sp.nvec, rank * per);
    *end = min(sp.nvec, *beg + per);
}

/* Which rank holds element y (rank 0 for head and tail elements). */
template <typename T>
static __device__ __forceinline__ int lf_row_owner_rank(int64_t y, const lf_row_span &sp, int nranks)
{
    const int64_t body_end = sp.head + (int64_t)sp.nvec * lf_elem<T>::per_vec;
    if (y < sp.head || y >= body_end) return 0;
    const int per = (sp.nvec + nranks - 1) / nranks;
    return (int)(((y - sp.head) / lf_elem<T>::per_vec) / per);
}

/* Issue this thread's copies of body vectors [vbeg, vend) of `row` into `buf` (no commit). */
template <int THREADS, typename T>
static __device__ __forceinline__ void lf_piece_load(uint4 *buf, const T *row, const lf_row_span &sp, int vbeg, int vend)
{
    const uint4 *body = reinterpret_cast<const uint4 *>(row + sp.head);
    for (int v = vbeg + (int)threadIdx.x; v < vend; v += THREADS) lf_cp_async16(buf + (v - vbeg), body + v);
}

/* The head/tail elements that do not fill a 16-byte vector: thread i < 8 takes head element i,
 * thread 8 + i tail element i (j = -1: none). Load them early — e.g. with the piece copies — and
 * the latency of these scalar loads hides behind the piece's. */
typedef struct lf_edge {
    float x;
    int32_t j;
} lf_edge;

/* In two halves, for loading a job ahead of its use: lf_row_edge_issue only loads the raw
 * element (nothing consumes the register, so the thread does not wait for it), and
 * lf_edge_resolve converts it when it is needed. Converting right after the load — as the
 * one-call form lf_row_edge_load does — stalls the warp for a full memory latency. */
typedef struct lf_edge_raw {
    uint32_t bits; /* the element's bits (zero-extended) */
    int32_t j;
} lf_edge_raw;

template <typename T>
static __device__ __forceinline__ lf_edge_raw lf_row_edge_issue(const T *row, const lf_row_span &sp)
{
    lf_edge_raw r;
    const int i = (int)threadIdx.x;
    r.j = -1;
    r.bits = 0u;
    if (i < sp.head) r.j = i;
    else if (i >= 8 && i - 8 < sp.tail) r.j = sp.head + sp.nvec * lf_elem<T>::per_vec + (i - 8);
    if (r.j >= 0) {
        if (sizeof(T) == 4) r.bits = reinterpret_cast<const uint32_t *>(row)[r.j];
        else r.bits = reinterpret_cast<const unsigned short *>(row)[r.j];
    }
    return r;
}

template <typename T>
static __device__ __forceinline__ lf_edge lf_edge_resolve(const lf_edge_raw &r)
{
    lf_edge e;
    e.j = r.j;
    if (sizeof(T) == 4) {
        e.x = __uint_as_float(r.bits);
    } else {
        const unsigned short h = (unsigned short)r.bits;
        e.x = lf_elem<T>::to_f32(*reinterpret_cast<const T *>(&h));
    }
    if (r.j < 0) e.x = 0.0f;
    return e;
}

template <typename T>
static __device__ __forceinline__ lf_edge lf_row_edge_load(const T *row, const lf_row_span &sp)
{
    return lf_edge_resolve<T>(lf_row_edge_issue(row, sp));
}

/* Statistics of this thread's vectors of a piece, pushed into st (its partial of the row).
 *   FULL = false: only the lse state's m and s (what the cross-entropy loss and gradient need).
 *   FULL = true : also entropy (u), argmax of x, and sum_j w_j z_j, sum_j w_j with w_j from
 *                 class_w; without class weights only sum_j z_j (st.w is left alone: W = V).
 * Two sweeps over the thread's vectors: the max first, so the running sum is rescaled once per
 * piece instead of once per element; then exp(z - m) as one FFMA + EX2 per element,
 * exp2(x * scale*log2e - m*log2e). All terms share the one rounded shift m*log2e, so the
 * rounding of that product cancels in lse = m + log(s) up to ~1 ulp of m. No barrier. */
template <int THREADS, typename T, bool FULL, bool SOFTCAP>
static __device__ __forceinline__ void lf_piece_stats(lf_row_stats &st, const uint4 *buf, const lf_row_span &sp,
                                                      int vbeg, int vend, const lf_xform &t, const float *class_w)
{
    const int PV = lf_elem<T>::per_vec;
    float xmax = -LF_INF_F;
    lf_argmax am = lf_argmax_init(); /* this piece's: indices rise along the sweep, so ">" keeps the first */
#pragma unroll 4
    for (int v = vbeg + (int)threadIdx.x; v < vend; v += THREADS) {
        float x[PV];
        lf_elem<T>::unpack(buf[v - vbeg], x);
#pragma unroll
        for (int e = 0; e < PV; ++e) {
            xmax = fmaxf(xmax, x[e]);
            /* NaN beats every number and the first NaN stays (lf_argmax's rule, inlined cheaply) */
            if (FULL && (x[e] > am.v || am.i < 0 || (x[e] != x[e] && am.v == am.v))) {
                am.v = x[e];
                am.i = sp.head + v * PV + e;
            }
        }
    }
    if (FULL) st.am = lf_argmax_merge(st.am, am);
    /* z is increasing in x (scale > 0, tanh increasing), so max z = z(max x). */
    const float m_new = fmaxf(st.lse.m, lf_xform_apply<SOFTCAP>(xmax, t));
    lf_impl_lse_rescale(st.lse.m, m_new, &st.lse.s, &st.lse.u);
    st.lse.m = m_new;
    const float shift = (m_new == -LF_INF_F) ? 0.0f : m_new;
    const float shift_l2e = shift * LF_LOG2E;
    float s0 = 0.0f, s1 = 0.0f; /* two chains halve the FADD dependency latency */
#pragma unroll 4
    for (int v = vbeg + (int)threadIdx.x; v < vend; v += THREADS) {
        float x[PV];
        lf_elem<T>::unpack(buf[v - vbeg], x);
#pragma unroll
        for (int e = 0; e < PV; ++e) {
            const float z = lf_xform_apply<SOFTCAP>(x[e], t);
            const float p = lf_ex2(SOFTCAP ? fmaf(z, LF_LOG2E, -shift_l2e) : fmaf(x[e], t.scale_l2e, -shift_l2e));
            if (e & 1) s1 += p;
            else s0 += p;
            if (FULL) {
                st.lse.u = fmaf(p, fmaxf(z - shift, -FLT_MAX), st.lse.u);
                if (class_w) {
                    const float w = __ldg(class_w + (sp.head + v * PV + e));
                    st.wz += (w != 0.0f) ? w * z : 0.0f;
                    st.w += w;
                } else {
                    st.wz += z; /* st.w is not counted without weights: W = V */
                }
            }
        }
    }
    st.lse.s += s0 + s1;
}

/* The fast row pass (no softcap, no class weights): the same statistics as lf_piece_stats with
 * about half the instructions per element, which is what decides whether a row pass keeps up
 * with HBM (bench/RESULTS.md):
 *   sweep 1  the thread's maximum in the element type (lf_elem::mx_push: a packed max per two
 *            bf16/fp16 elements, nothing unpacked);
 *   sweep 2  p = exp2(x * scale*log2e - m*log2e): unpack + FFMA + EX2 + FADD per element; with
 *            FULL also u += p * t (t, the exponent, is (z - m) log2 e: entropy in log2 units,
 *            converted once per piece) and optionally sum x (label smoothing: sum z = scale sum x).
 * The argmax is found lazily (lf_lazy_argmax): sweep 1 only yields the thread's maximum; when
 * that improves on the thread's row maximum so far and is its warp's largest such value, it is
 * offered to a CTA-wide running maximum in shared memory (one shared atomicMax per warp and
 * piece), and only if it is at least that running maximum — so it may still be the row's — does
 * the thread look for its first index in the piece (lf_piece_find, from shared memory). In a
 * random order only ~ln(warps) warps per row set a new running maximum, so the scans cost next
 * to nothing, need no barrier and no second read; lf_block_lse_fast then picks the first index
 * among the threads holding the maximum. All 32 lanes of each warp must make the call.
 * The states have a non-NaN m (a NaN element lands in s), as lf_block_lse_fast
 * requires; a NaN row's argmax (the first NaN) is the caller's to find (s is NaN).
 * Per row: *best_key = lf_argmax_key(-inf) and la = lf_lazy_argmax_init() before the first piece
 * (with a barrier between the reset of best_key and the first piece of any thread). */
typedef struct lf_lazy_argmax {
    float v;   /* the thread's largest raw logit of the row so far (never NaN: see mx_push) */
    int32_t i; /* its first index; -1: not located (v is below the CTA's maximum); -2: no element */
} lf_lazy_argmax;

static __device__ __forceinline__ lf_lazy_argmax lf_lazy_argmax_init(void)
{
    lf_lazy_argmax a;
    a.v = -LF_INF_F;
    a.i = -2;
    return a;
}

/* An unsigned key with the order of the (non-NaN) floats: for atomicMax on shared memory. */
static __device__ __forceinline__ unsigned lf_argmax_key(float x)
{
    const unsigned b = __float_as_uint(x == 0.0f ? 0.0f : x); /* -0 ties with +0, as in lf_argmax */
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* The first index j among this thread's vectors of [vbeg, vend) whose raw logit is M (with
 * nan: the first NaN), or -1. src[k] is vector vbeg + k: a shared-memory piece, or the row's
 * body in global memory offset by vbeg (generic loads: either works). */
template <int THREADS, typename T>
static __device__ __noinline__ int32_t lf_piece_find(const uint4 *src, const lf_row_span &sp, int vbeg, int vend, float M,
                                                     bool nan)
{
    const int PV = lf_elem<T>::per_vec;
    for (int v = vbeg + (int)threadIdx.x; v < vend; v += THREADS) {
        float x[PV];
        lf_elem<T>::unpack(src[v - vbeg], x);
#pragma unroll
        for (int e = 0; e < PV; ++e)
            if (nan ? x[e] != x[e] : x[e] == M) return sp.head + v * PV + e;
    }
    return -1;
}

template <int THREADS, typename T>
static __device__ __forceinline__ float lf_piece_xmax(const uint4 *buf, int vbeg, int vend)
{
    typename lf_elem<T>::mx_t a = lf_elem<T>::mx_init();
#pragma unroll 4
    for (int v = vbeg + (int)threadIdx.x; v < vend; v += THREADS) a = lf_elem<T>::mx_push(a, buf[v - vbeg]);
    return lf_elem<T>::mx_final(a);
}

template <int THREADS, typename T, bool ENT, bool SUMX>
static __device__ __forceinline__ void lf_piece_sumexp(const uint4 *buf, int vbeg, int vend, float c, float sh, float *s,
                                                       float *u2, float *sx)
{
    const int PV = lf_elem<T>::per_vec;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f; /* four chains: the adds' latency hides */
    float u0 = 0.0f, u1 = 0.0f, x0 = 0.0f, x1 = 0.0f;
#pragma unroll 4
    for (int v = vbeg + (int)threadIdx.x; v < vend; v += THREADS) {
        float x[PV];
        lf_elem<T>::unpack(buf[v - vbeg], x);
#pragma unroll
        for (int e = 0; e < PV; ++e) {
            const float t = fmaf(x[e], c, -sh);
            const float q = lf_ex2(t);
            switch (e & 3) {
            case 0: s0 += q; break;
            case 1: s1 += q; break;
            case 2: s2 += q; break;
            default: s3 += q; break;
            }
            if (ENT) {
                /* q = 0 below t = -126 (EX2 flushes), so clamping t there changes no term but
                 * keeps 0 * -inf (a masked -inf logit) from forming. */
                if (e & 1) u1 = fmaf(q, fmaxf(t, -127.0f), u1);
                else u0 = fmaf(q, fmaxf(t, -127.0f), u0);
            }
            if (SUMX) {
                if (e & 1) x1 += x[e];
                else x0 += x[e];
            }
        }
    }
    *s += (s0 + s1) + (s2 + s3);
    if (ENT) *u2 += u0 + u1;
    if (SUMX) *sx += x0 + x1;
}

/* One piece of the fast pass, pushed into st (lse; with FULL also u and, when sumx, wz = sum z)
 * and, with FULL, la (best_key: the CTA's running maximum, see above). */
template <int THREADS, typename T, bool FULL>
static __device__ __forceinline__ void lf_piece_stats_fast(lf_row_stats &st, lf_lazy_argmax &la, unsigned *best_key,
                                                           const uint4 *buf, const lf_row_span &sp, int vbeg, int vend,
                                                           const lf_xform &t, bool sumx)
{
    const float xm = lf_piece_xmax<THREADS, T>(buf, vbeg, vend);
    if (FULL) {
        /* warp-aggregated: one shared atomic per warp (32 on one address would serialise);
         * only the warp's maximum can be the row's, so only it is compared and located */
        const bool improved = vbeg + (int)threadIdx.x < vend && (xm > la.v || la.i == -2);
        const unsigned key = improved ? lf_argmax_key(xm) : 0u;
        const unsigned wkey = __reduce_max_sync(0xffffffffu, key);
        unsigned old = 0u;
        if ((threadIdx.x & 31u) == 0) old = atomicMax(best_key, wkey);
        old = __shfl_sync(0xffffffffu, old, 0);
        if (improved) {
            la.v = xm;
            la.i = (key == wkey && key >= old) ? lf_piece_find<THREADS, T>(buf, sp, vbeg, vend, xm, false) : -1;
        }
    }
    const float m_new = fmaxf(st.lse.m, xm * t.scale);
    lf_impl_lse_rescale(st.lse.m, m_new, &st.lse.s, &st.lse.u);
    st.lse.m = m_new;
    const float sh = (m_new == -LF_INF_F ? 0.0f : m_new) * LF_LOG2E;
    float s = 0.0f, u2 = 0.0f, sx = 0.0f;
    if (!FULL) lf_piece_sumexp<THREADS, T, false, false>(buf, vbeg, vend, t.scale_l2e, sh, &s, &u2, &sx);
    else if (sumx) lf_piece_sumexp<THREADS, T, true, true>(buf, vbeg, vend, t.scale_l2e, sh, &s, &u2, &sx);
    else lf_piece_sumexp<THREADS, T, true, false>(buf, vbeg, vend, t.scale_l2e, sh, &s, &u2, &sx);
    st.lse.s += s;
    if (FULL) {
        st.lse.u += u2 * LF_LN2;
        st.wz += sx * t.scale;
    }
}

/* Push this thread's edge element (if any) into st. */
template <bool FULL, bool SOFTCAP>
static __device__ __forceinline__ void lf_edge_stats(lf_row_stats &st, const lf_edge &e, const lf_xform &t,
                                                     const float *class_w)
{
    if (e.j < 0) return;
    const float z = lf_xform_apply<SOFTCAP>(e.x, t);
    if (FULL) {
        lf_row_stats_push(&st, e.x, z, class_w ? __ldg(class_w + e.j) : 1.0f, e.j);
        if (!class_w) st.w -= 1.0f; /* as lf_piece_stats: W is not counted without weights */
    } else {
        lf_lse_push(&st.lse, z);
    }
}

/* ============================================================================================
 * 6. Cross-entropy gradient writer
 *    With p_j = exp(z_j - lse), the gradient of the (scaled) cross-entropy family is
 *        g_j = dz_j/dx_j * (a p_j - e w_j)          for j != y
 *        g_y = dz_y/dx_y * (a p_y - e w_y - b)
 *    where lf_grad_coef_make folds the upstream scale, label smoothing, class weights, z-loss
 *    and logit scale into a, b, e. The writers produce the dense part; the label element is
 *    patched afterwards (lf_ce_label_grad) by the thread that wrote its dense value — cheaper
 *    than comparing every index with y, and one thread's program order makes the patch the
 *    value that remains, with no barrier (thread t writes vectors vbeg + t + k*THREADS).
 *    In place (out_row == the row the piece was copied from) is safe: a piece is in shared
 *    memory before any of its elements is overwritten.
 * ========================================================================================== */

typedef struct lf_grad_coef {
    float a;       /* multiplies p_j */
    float b;       /* subtracted at the label */
    float e;       /* multiplies w_j, subtracted everywhere (label smoothing) */
    float lse_l2e; /* lse * log2(e): p_j = exp2(z_j log2e - lse_l2e) */
} lf_grad_coef;

/* Coefficients for loss_i = (1-eps) w_y (lse - z_y) + eps (W lse - sum w z)/V + lam lse^2,
 * scaled by g (upstream gradient x 1/divisor ...). Non-finite lse gives a NaN gradient row
 * (lossfuse.h §7). wsum = W = sum_j w_j (= V without class weights). */
static __device__ __forceinline__ lf_grad_coef lf_grad_coef_make(float g, float lse, float eps, float lam, float w_y,
                                                                 float wsum, int64_t V, const lf_xform &t)
{
    lf_grad_coef c;
    const float gs = g * t.scale; /* dz/dx = scale (times the cap's factor, applied per element) */
    const float invV = 1.0f / (float)V;
    c.a = gs * ((1.0f - eps) * w_y + eps * wsum * invV + 2.0f * lam * lse);
    c.b = gs * (1.0f - eps) * w_y;
    c.e = gs * eps * invV;
    c.lse_l2e = lse * LF_LOG2E;
    if (!(fabsf(lse) < LF_INF_F)) c.a = NAN;
    return c;
}

/* g_j for one element (the dense part: without the label's -b). */
template <bool FULL, bool SOFTCAP>
static __device__ __forceinline__ float lf_ce_grad_elem(float x, int32_t j, const lf_grad_coef &c, const lf_xform &t,
                                                        const float *class_w)
{
    const float z = lf_xform_apply<SOFTCAP>(x, t);
    const float p = lf_ex2(SOFTCAP ? fmaf(z, LF_LOG2E, -c.lse_l2e) : fmaf(x, t.scale_l2e, -c.lse_l2e));
    float g = c.a * p;
    if (FULL) g -= c.e * (class_w ? __ldg(class_w + j) : 1.0f);
    if (SOFTCAP) {
        const float tt = fmaxf(z * t.inv_cap, -1.0f); /* tanh; -1 at a masked -inf entry */
        g *= 1.0f - tt * tt;
    }
    return g;
}

/* The label element's complete gradient: the dense part minus b through the same chain factor. */
template <bool FULL, bool SOFTCAP>
static __device__ __forceinline__ float lf_ce_label_grad(float x_y, int32_t y, const lf_grad_coef &c, const lf_xform &t,
                                                         const float *class_w)
{
    float chain = 1.0f;
    if (SOFTCAP) {
        const float tt = fmaxf(lf_xform_apply<SOFTCAP>(x_y, t) * t.inv_cap, -1.0f);
        chain = 1.0f - tt * tt;
    }
    return lf_ce_grad_elem<FULL, SOFTCAP>(x_y, y, c, t, class_w) - c.b * chain;
}

/* Write the gradient of this thread's vectors of a piece. vec_ok: the output row has the input
 * row's phase (true in place), so 16-byte stores line up; otherwise elements go one by one. */
template <int THREADS, bool FULL, bool SOFTCAP, typename T>
static __device__ __forceinline__ void lf_piece_grad_store(T *out_row, bool vec_ok, const uint4 *buf, const lf_row_span &sp,
                                                           int vbeg, int vend, const lf_grad_coef &c, const lf_xform &t,
                                                           const float *class_w)
{
    const int PV = lf_elem<T>::per_vec;
    uint4 *body = reinterpret_cast<uint4 *>(out_row + sp.head);
#pragma unroll 4
    for (int v = vbeg + (int)threadIdx.x; v < vend; v += THREADS) {
        float x[PV], g[PV];
        lf_elem<T>::unpack(buf[v - vbeg], x);
#pragma unroll
        for (int e = 0; e < PV; ++e) g[e] = lf_ce_grad_elem<FULL, SOFTCAP>(x[e], sp.head + v * PV + e, c, t, class_w);
        if (vec_ok) {
            lf_st16(body + v, lf_elem<T>::pack(g));
        } else {
#pragma unroll
            for (int e = 0; e < PV; ++e) out_row[sp.head + v * PV + e] = lf_elem<T>::from_f32(g[e]);
        }
    }
}

/* The dense gradient of the plain loss (no softcap, no class weights, no smoothing) with the
 * coefficient folded into the exponent: a p_j = sgn(a) exp2(x_j scale log2e - k), with
 * k = lse log2e - log2|a| (lf_grad_fast_k). Unpack + FFMA + EX2 + half a pack per element: no
 * multiply. a = 0 gives k = +inf and zeros; a NaN row gives NaN. The label element is patched
 * afterwards as with lf_piece_grad_store. 16-byte stores: the output row must have the input
 * row's phase (vec_ok). */
static __device__ __forceinline__ float lf_grad_fast_k(const lf_grad_coef &c) { return c.lse_l2e - log2f(fabsf(c.a)); }

template <int THREADS, typename T, bool NEG>
static __device__ __forceinline__ void lf_piece_grad_fast(T *out_row, const uint4 *buf, const lf_row_span &sp, int vbeg,
                                                          int vend, float c, float k)
{
    const int PV = lf_elem<T>::per_vec;
    uint4 *body = reinterpret_cast<uint4 *>(out_row + sp.head);
#pragma unroll 4
    for (int v = vbeg + (int)threadIdx.x; v < vend; v += THREADS) {
        float x[PV], g[PV];
        lf_elem<T>::unpack(buf[v - vbeg], x);
#pragma unroll
        for (int e = 0; e < PV; ++e) {
            const float q = lf_ex2(fmaf(x[e], c, -k));
            g[e] = NEG ? -q : q;
        }
        lf_st16(body + v, lf_elem<T>::pack(g));
    }
}

/* Write the gradient of this thread's edge element (if any). */
template <bool FULL, bool SOFTCAP, typename T>
static __device__ __forceinline__ void lf_edge_grad_store(T *out_row, const lf_edge &e, const lf_grad_coef &c,
                                                          const lf_xform &t, const float *class_w)
{
    if (e.j >= 0) out_row[e.j] = lf_elem<T>::from_f32(lf_ce_grad_elem<FULL, SOFTCAP>(e.x, e.j, c, t, class_w));
}

/* Zero this CTA's slice of an output row (and, on rank 0, its edges): the gradient of an
 * ignored or bad row. */
template <int THREADS, typename T>
static __device__ __forceinline__ void lf_row_zero(T *out_row, int64_t V, int rank, int nranks)
{
    const lf_row_span sp = lf_row_span_make(out_row, V);
    int beg, end;
    lf_row_slice(sp, rank, nranks, &beg, &end);
    uint4 *body = reinterpret_cast<uint4 *>(out_row + sp.head);
    for (int v = beg + (int)threadIdx.x; v < end; v += THREADS) lf_st16(body + v, make_uint4(0, 0, 0, 0));
    if (rank == 0) {
        const int i = (int)threadIdx.x;
        if (i < sp.head) out_row[i] = lf_elem<T>::from_f32(0.0f);
        else if (i >= 8 && i - 8 < sp.tail) out_row[sp.head + sp.nvec * lf_elem<T>::per_vec + (i - 8)] = lf_elem<T>::from_f32(0.0f);
    }
}

/* ============================================================================================
 * 7. Clusters (sm_90)
 *    Launch with a cluster of `nranks` CTAs along x (cudaLaunchAttributeClusterDimension); the
 *    CTAs of a cluster share one row, each its lf_row_slice. After each CTA has reduced its
 *    partial statistics with lf_block_row_stats:
 *        __shared__ lf_row_stats xchg[2];                  // yours; alternate per row
 *        st = lf_cluster_row_stats(st, &xchg[parity]);     // whole-row stats, every thread, every CTA
 *        parity ^= 1;
 *        ... write the gradient, go on to the next row ...
 *        lf_cluster_sync();                                 // once, before the kernel exits
 *    One cluster barrier per row is enough with two slots: a CTA writes slot k again only after
 *    the barrier of the next row, which no CTA passes before it has finished reading slot k.
 *    The final lf_cluster_sync keeps every CTA alive until all have read its slots (distributed
 *    shared memory of an exited CTA is gone). lf_cluster_arrive / lf_cluster_wait are the two
 *    halves of that barrier, for callers that want to overlap work with it.
 *    The merge happens in lane order = rank order, identically in every warp of every CTA.
 *    Compiled for an architecture below sm_90 these return their input / do nothing: launch
 *    with nranks = 1 there.
 * ========================================================================================== */

static __device__ __forceinline__ lf_row_stats lf_cluster_row_stats(lf_row_stats cta, lf_row_stats *xchg)
{
    static_assert(sizeof(lf_row_stats) % 4 == 0, "lf_row_stats is read from remote CTAs word by word");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned n;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    if (threadIdx.x == 0) *xchg = cta;
    /* barrier.cluster with release/acquire: the write above is visible to every CTA after it,
     * and every CTA of the cluster has started (a precondition of touching its shared memory). */
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    const unsigned lane = threadIdx.x & 31u;
    lf_row_stats v = lf_row_stats_init();
    if (lane < n) {
        /* map our xchg address into CTA `lane`'s shared memory window and read 24 bytes */
        uint32_t local = (uint32_t)__cvta_generic_to_shared(xchg), remote;
        uint32_t words[sizeof(lf_row_stats) / 4];
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(lane));
#pragma unroll
        for (int i = 0; i < (int)(sizeof(lf_row_stats) / 4); ++i)
            asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(words[i]) : "r"(remote + 4u * i));
        memcpy(&v, words, sizeof v);
    }
    return lf_warp_row_stats(v);
#else
    (void)xchg;
    return cta;
#endif
}

static __device__ __forceinline__ void lf_cluster_arrive(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}

static __device__ __forceinline__ void lf_cluster_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}

static __device__ __forceinline__ void lf_cluster_sync(void)
{
    lf_cluster_arrive();
    lf_cluster_wait();
}

#endif /* LOSSFUSE_CUDA_CUH */
