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
 * (tests/test_ce_gpu.cu runs it against the reference; section 6's intro ends with the same
 * kernel plus the gradient; examples/cross_entropy.cu is the pipelined, clustered, fused
 * forward+backward):
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
 *   1. Configuration, fast exp2 (lf_ex2 on MUFU, lf_ex2_fma on the FMA pipe), element types
 *      (lf_elem<T>: unpack/pack, get, packed max)
 *   2. Warp reductions (lf_warp_*): results broadcast to all 32 lanes
 *   3. Block reductions (lf_block_*): caller-owned scratch, results broadcast to all threads;
 *      lf_block_lse_fast (one barrier) and its halves lf_block_lse_post / _merge around a
 *      shared-memory mbarrier (lf_mbar_init / _arrive / _wait; sm_90: _arrive_tx, _expect_tx,
 *      _init_fence); stage tickets for rings shared by warp groups (lf_ticket_store / _load);
 *      rows handed out dynamically (lf_ring_draw, lf_ring_next)
 *   4. Vectorized row access: lf_row_span (head / 16-byte body / tail), 16-byte loads/stores
 *   5. Shared-memory pieces and the online-softmax row pass: cp.async, lf_bulk_load (sm_90:
 *      the copy engine, one instruction per row slice; lf_bulk_prefetch_l2; lf_fence_proxy_async_smem
 *      before a stage edited in place is loaded again), lf_row_slice,
 *      lf_piece_load, lf_row_edge_load (or _issue + lf_edge_resolve), lf_piece_stats (every
 *      option), lf_piece_stats_fast (no softcap / class weights: about half the instructions,
 *      lazy argmax), lf_edge_stats; lf_warp_row_pass (one warp reads a row straight from global
 *      memory through registers: no shared memory, no barrier; lf_ld16_stream)
 *   6. Cross-entropy gradient writer: lf_grad_coef_make, lf_grad_coef_onto_max(_for) (p_j
 *      against the row maximum: no lse rounding), lf_ce_grad_elem, lf_ce_label_grad,
 *      lf_piece_grad_store, lf_piece_grad_fast (coefficient folded into the exponent),
 *      lf_piece_grad_fast_if_ok (there where its one rounded k is harmless), lf_edge_grad_store,
 *      lf_row_zero
 *   7. Clusters (sm_90): lf_cluster_row_stats, lf_cluster_sync (= lf_cluster_arrive + _wait), and
 *      the barrier-free exchange lf_cluster_stats_post / _collect (mbarriers, one per row set),
 *      for any record lf_cluster_post / _posts_wait, and one CTA's extra bytes on the same phase
 *      (lf_cluster_store, the receiver's lf_mbar_expect_tx)
 *   8. Dual-softmax row pass (student and teacher rows, any dtype each) and the KL-family
 *      gradient: lf_dual_span, lf_dual_piece_load, lf_dual_piece_stats (pass 1), lf_block_dual
 *      (or the one-barrier lf_block_dual_acc; lf_dual_acc_merge_warp for a cluster's states),
 *      lf_kl_piece_stats2 (pass 2 of JSD / TVD), lf_kl_coef_make, lf_kl_coef_onto_max (each
 *      side's lse taken apart at its maximum: no rounding of the whole lse in p_j),
 *      lf_kl_piece_grad, and the edge-element forms lf_dual_edge_stats / lf_kl_edge_stats2 /
 *      lf_kl_edge_grad; a sparse top-k teacher built in shared memory: lf_dual_part_load /
 *      _fill / _scatter and the _xe edge forms
 *   9. Segmented sums, pair scatter-add, histograms: lf_warp_seg_scan_f32, the fast
 *      lf_atomic_add_aggregated, the deterministic lf_seg_sum_grid (per-sequence sums over
 *      cu_seqlens, a warp per sequence) and lf_seg_sum_chunked (the same at the bandwidth limit
 *      for long buffers: equal token chunks per warp, a small workspace), lf_sorted_run_sum_grid
 *      (after a stable sort by slot), lf_seq_bad; lf_xsum_atomic_add (an order-free sum in
 *      global memory, lossfuse.h section 3d: the same bits whatever order the adds come in) and
 *      lf_xsum_cached_add / _cache_flush (the same, one bucket held in registers)
 *  10. Context parallelism: lf_cp_local_labels_grid (a rank's labels and positions from the
 *      global ids under the zigzag layout, lossfuse.h section 10)
 *  11. Tensor (vocabulary) parallelism: lf_tp_merge_warp (a row's all-gathered 12-byte shares
 *      merged by one warp, the P loads in parallel, in lossfuse.h's lf_tp_merge order),
 *      lf_tp_merge_lanes (the same from shares the lanes hold), and flagged slots that carry a
 *      share into another GPU's memory with no fence (lf_tp_slot_put / lf_tp_slot_get)
 *  12. Host: launching clusters (lf_launch_clusters, lf_max_active_clusters; the device side of
 *      programmatic dependent launch, lf_pdl_trigger / lf_pdl_wait) and planning a persistent
 *      grid whose CTAs stage row slices in a ring (lf_ring_setup, lf_ring_plan_make)
 *
 * Configuration macros: those of lossfuse.h (LF_HD, LF_USE_EXP2, LF_ASSERT), and
 *   LF_SEG_CHUNK   512     section 9: tokens per chunk of lf_seg_sum_chunked (a multiple of
 *                          128); it fixes the sums' order, hence their bits
 *   LF_RING_CTA_BW 33.5e9  section 12: bytes/s of the device's memory peak given to one
 *                          streaming CTA by lf_ring_plan_make with dynamic rows
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

/* 2^x on the FMA pipe: the same function as lf_ex2 for x in [-126, 127.5) (max relative error
 * 2.2e-7 = 2^-22.1 against ex2.approx's ~2^-22), exactly 0 below -126 (lf_ex2 flushes there), +inf
 * from 127.5 on (true values from 2.4e38; lf_ex2 is finite up to 128), NaN stays NaN; in 3 FADD +
 * 5 FFMA + IMAD + FMUL + 2 selects instead of one MUFU.EX2. A row pass that computes an
 * exponential per element saturates the MUFU unit (16 per clock per SM: a warp's EX2 holds it 8
 * cycles) while the FMA pipe idles; computing some of the elements' exponentials here shortens
 * those phases (examples/cross_entropy.cu, CE_RES_POLY; measured in bench/RESULTS.md).
 * How: rint(x) by the 1.5*2^23 trick, 2^f for f = x - rint(x) in [-1/2, 1/2] by a degree-5
 * minimax polynomial (fitted for relative error), rint(x) added to the exponent field. */
static __device__ __forceinline__ float lf_ex2_fma(float x)
{
    const float t = x + 12582912.0f;       /* rint(x) in the low mantissa bits of t */
    const float f = x - (t - 12582912.0f); /* exact */
    float p = 1.327644452e-03f;
    p = fmaf(p, f, 9.675535373e-03f);
    p = fmaf(p, f, 5.550713465e-02f);
    p = fmaf(p, f, 2.402212024e-01f);
    p = fmaf(p, f, 6.931469440e-01f);
    p = fmaf(p, f, 1.000000119e+00f);
    /* 2^rint(x) built from its exponent field (rint(x) + 127) << 23: t's low 9 bits are rint(x)
     * in two's complement, so one IMAD makes it for rint(x) in [-126, 127]; multiplying (not
     * adding to p's bits) lets a NaN through, whatever its payload (the GPU's 0x7fffffff has low
     * bits set). Outside that range the field wraps: the selects give 0 and +inf there (NaN
     * fails both compares and passes). */
    const float scale = __int_as_float((int)((unsigned)__float_as_int(t) * 8388608u + 1065353216u));
    return x < -126.0f ? 0.0f : (x >= 127.5f ? LF_INF_F : p * scale);
}

/* Elements e < NPOLY * per_vec / 8 of each 16-byte vector take lf_ex2_fma, the others lf_ex2
 * (compile-time: the loops over e are unrolled). */
template <int NPOLY, int PV>
static __device__ __forceinline__ float lf_impl_ex2_mix(float x, int e)
{
    return e < NPOLY * PV / 8 ? lf_ex2_fma(x) : lf_ex2(x);
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
 *       width. NaN is ignored (as fmaxf), -inf is the identity.
 *   lf_elem<T>::ninf_word  a 32-bit word whose elements are all -inf (a constant: padding). */
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
    static const unsigned ninf_word = 0xff800000u; /* a 32-bit word of -inf elements */
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
    static const unsigned ninf_word = 0xff80ff80u;
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
    static const unsigned ninf_word = 0xfc00fc00u;
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
    __device__ __forceinline__ double operator()(double a, double b) const { return fmax(a, b); }
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
static __device__ __forceinline__ double lf_warp_max_f64(double v) { return lf_impl_warp_allreduce(v, lf_impl_op_max()); }
/* The same maximum in one redux.sync (sm_80+) instead of five shuffle levels: the floats as
 * order-preserving integers (negative ones with their magnitude bits flipped), NaN lanes as
 * -inf, and NaN (0x7fffffff, as fmaxf gives) where every lane holds NaN. Every lane gets the
 * same bits; the result is lf_warp_max_f32's (a maximum is exact), up to the sign of a zero
 * (+0 wins over -0 here). All 32 lanes must call it. */
static __device__ __forceinline__ float lf_warp_max_f32_redux(float v)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const bool nan = lf_isnan_f32(v);
    int k = __float_as_int(nan ? -LF_INF_F : v);
    k ^= (k >> 31) & 0x7fffffff;
    int m = __reduce_max_sync(0xffffffffu, k);
    m ^= (m >> 31) & 0x7fffffff;
    return __all_sync(0xffffffffu, nan) ? __int_as_float(0x7fffffff) : __int_as_float(m);
#else
    return lf_warp_max_f32(v);
#endif
}
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
 *    Warp groups: with blockDim = (THREADS, G) the G groups (threadIdx.y) can run collectives of
 *    their own, each on its own scratch, by passing bar = 1 + threadIdx.y (a named barrier of
 *    THREADS threads, lf_block_bar) instead of the default 0 (__syncthreads); the barrier owed
 *    before reusing scratch is then that named barrier. Ids 1..15.
 * ========================================================================================== */

/* The barrier of a block collective: 0 = __syncthreads; k in 1..15 = named barrier k of THREADS
 * threads (all the threads of one group must arrive, and only they). */
template <int THREADS> static __device__ __forceinline__ void lf_block_bar(int bar)
{
    if (bar == 0) __syncthreads();
    else asm volatile("bar.sync %0, %1;" ::"r"(bar), "n"(THREADS) : "memory");
}

template <int THREADS, typename S, typename Op>
static __device__ __forceinline__ S lf_impl_block_allreduce(S v, S *scratch, Op op, int bar)
{
    static_assert(THREADS % 32 == 0 && THREADS >= 32 && THREADS <= 1024, "THREADS: multiple of 32 in [32, 1024]");
    v = lf_impl_warp_allreduce(v, op);
    if (THREADS == 32) return v;
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    lf_block_bar<THREADS>(bar);
    S r = scratch[0];
#pragma unroll
    for (int w = 1; w < THREADS / 32; ++w) r = op(r, scratch[w]);
    return r;
}

template <int THREADS> static __device__ __forceinline__ float lf_block_sum_f32(float v, float *scratch, int bar = 0)
{
    return lf_impl_block_allreduce<THREADS>(v, scratch, lf_impl_op_sum(), bar);
}
template <int THREADS> static __device__ __forceinline__ double lf_block_sum_f64(double v, double *scratch, int bar = 0)
{
    return lf_impl_block_allreduce<THREADS>(v, scratch, lf_impl_op_sum(), bar);
}
template <int THREADS> static __device__ __forceinline__ float lf_block_max_f32(float v, float *scratch, int bar = 0)
{
    return lf_impl_block_allreduce<THREADS>(v, scratch, lf_impl_op_max(), bar);
}
template <int THREADS> static __device__ __forceinline__ lf_lse lf_block_lse(lf_lse v, lf_lse *scratch, int bar = 0)
{
    return lf_impl_block_allreduce<THREADS>(v, scratch, lf_impl_op_lse(), bar);
}
template <int THREADS>
static __device__ __forceinline__ lf_row_stats lf_block_row_stats(lf_row_stats v, lf_row_stats *scratch, int bar = 0)
{
    return lf_impl_block_allreduce<THREADS>(v, scratch, lf_impl_op_stats(), bar);
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
                                                           float *scratch, int bar = 0)
{
    lf_block_lse_post<THREADS, FULL>(v, FULL ? *xmax : 0.0f, FULL ? *xidx : 0, FULL ? *xsum : 0.0f, scratch);
    lf_block_bar<THREADS>(bar);
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

/* sm_90 (trap below): lf_mbar_arrive that also adds `bytes` to the transaction count of the
 * current phase, which then completes only when that many bytes of bulk copies issued on this
 * barrier (lf_bulk_load) have landed as well. Bytes outstanding on one phase: < 2^20. */
static __device__ __forceinline__ void lf_mbar_arrive_tx(uint64_t *bar, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("{\n\t.reg .b64 st;\n\tmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n\t}" ::"r"(a), "r"(bytes)
                 : "memory");
#else
    (void)bar;
    (void)bytes;
    __trap();
#endif
}

/* sm_90 (trap below): add `bytes` to the transaction count of the current phase without
 * arriving (the phase then also waits for them). Made before this thread's own arrival on the
 * phase, it cannot come too late: a phase completes only after its arrivals. */
static __device__ __forceinline__ void lf_mbar_expect_tx(uint64_t *bar, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(bytes) : "memory");
#else
    (void)bar;
    (void)bytes;
    __trap();
#endif
}

/* After lf_mbar_init and before the barrier that publishes the mbarriers: makes the
 * initialisation visible to the bulk-copy engine and to the other CTAs of a cluster (sm_90;
 * nothing to do below). */
static __device__ __forceinline__ void lf_mbar_init_fence(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

/* A stage ticket: which use of a shared buffer its mbarrier's next phase belongs to, for rings
 * whose stages are taken by several warp groups in turn (examples/cross_entropy.cu,
 * kl_distill.cu). The loading thread stores the use's number (release, CTA scope) before it
 * arrives; a consumer spins on lf_ticket_load (acquire) until the ticket shows its use and only
 * then waits on the mbarrier's parity: it is then ordered after the completion of the previous
 * phase, which the loader waited for, so the parity wait cannot return on that older phase.
 * Atomics, so that compute-sanitizer's racecheck sees the spin for what it is. One lane per
 * warp should spin (then __syncwarp): a whole warp's atomics on one address serialise. */
static __device__ __forceinline__ void lf_ticket_store(int64_t *t, int64_t v)
{
    asm volatile("{\n\t.reg .b64 old;\n\tatom.release.cta.shared.exch.b64 old, [%0], %1;\n\t}" ::"r"(
                     (uint32_t)__cvta_generic_to_shared(t)),
                 "l"(v)
                 : "memory");
}
static __device__ __forceinline__ int64_t lf_ticket_load(int64_t *t)
{
    int64_t v;
    asm volatile("atom.acquire.cta.shared.add.u64 %0, [%1], 0;" : "=l"(v) : "r"((uint32_t)__cvta_generic_to_shared(t)) : "memory");
    return v;
}

/* Rows handed out dynamically to the CTAs (or clusters) of a ring (examples/cross_entropy.cu,
 * kl_distill.cu): the first `first` rows are fixed shares (the rings' first stages), the rest
 * come from a counter in the caller's workspace, zero before a launch and set back to zero by
 * the launch's last CTA (so graph replays and the next launch find it ready). lf_ring_draw: the
 * next row, -1 once the n rows are out; each draw must be used (a row drawn is a row owed).
 * In a cluster one CTA draws and hands the row to its peers with an exchange it makes anyway
 * (lf_cluster_store on the exchange's phase): an lf_ring_next, the row (UINT32_MAX: none left;
 * so fewer than 2^32 rows) and a 32-bit tag of the kernel's, what the peers must know of the
 * row before they read it (its label's status, its mask). */
typedef struct lf_ring_next {
    uint32_t row;
    int32_t tag;
} lf_ring_next;
static __device__ __forceinline__ int64_t lf_ring_draw(unsigned long long *counter, int64_t first, int64_t n)
{
    const unsigned long long d = atomicAdd(counter, 1ull);
    return (int64_t)d < n - first ? first + (int64_t)d : -1;
}
static __device__ __forceinline__ lf_ring_next lf_ring_next_make(int64_t row, int32_t tag)
{
    lf_ring_next n;
    n.row = row < 0 ? UINT32_MAX : (uint32_t)row;
    n.tag = tag;
    return n;
}
static __device__ __forceinline__ int64_t lf_ring_next_row(const lf_ring_next &n)
{
    return n.row == UINT32_MAX ? -1 : (int64_t)n.row;
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

/* An online softmax's shift in log2 units from its maximum m so far (z units): 0 for an empty
 * state (m = -inf), and held at -FLT_MAX or above. A state whose every entry so far is a 16-bit
 * type's lowest finite value (masking with torch.finfo(bf16).min, or an fp32 -FLT_MAX) has
 * m log2(e) = -inf, and fmaf(x, log2(e), -shift) would be -inf + inf = NaN; held, those entries
 * add 2^-huge = 0, as a masked entry does, and their state weighs nothing once merged with any
 * entry above -FLT_MAX / log2(e). */
static __device__ __forceinline__ float lf_shift_l2e(float m) { return m == -LF_INF_F ? 0.0f : fmaxf(m * LF_LOG2E, -FLT_MAX); }

/* The rounding of that shift, c = m log2(e) - sh (sh = lf_shift_l2e(m)), recovered exactly by one
 * FFMA (the product is exact inside it): a sum of exp2(z log2(e) - sh) is the sum against m
 * itself times 2^c, so lse = m + log(s) would carry c ln 2 nats, c being up to half an ulp of
 * m log2(e) (so c ln 2 up to 1.3e-6 nats at |m| = 40, 3.4e-4 at |m| = 1e4), and so would the loss
 * (m - z_y) + log(s). A pass multiplies its sums by 2^-c (lf_ex2(-c)) before they join a state
 * (whose s is relative to m): an FFMA, an EX2 and an FMUL per thread and piece, and the loss is
 * then good to fp32 rounding of its own terms for |m| up to ~1.2e7 (|m log2 e| < 2^24, where
 * |c| <= 1/2 always). 0 (no correction) where |c| is not below 1: only beyond that, where it
 * depends on m's bits (the contract promises nothing there); m = -inf (an empty state,
 * sh = 0); a shift held at -FLT_MAX (a massless maximum); NaN. The exponents of the fast passes are
 * x (scale log2 e) - sh, so with a logit scale whose product with log2(e) is not exact in fp32
 * (a scale that is not a power of 2) an error of ~2^-24 |m| remains: the scale's rounding. */
static __device__ __forceinline__ float lf_shift_err(float m, float sh, float k = LF_LOG2E)
{
    const float c = fmaf(m, k, -sh); /* k: the units' factor (the dual state's cs = log2(e) / tau) */
    return fabsf(c) < 1.0f ? c : 0.0f;
}

/* Add to st a piece's sums taken against the rounded shift sh = lf_shift_l2e(st.m): s = sum q and,
 * with FULL, u2 = sum q t (t = x c - sh, the exponent in log2 units), moved onto st.m itself:
 * s 2^-c and u = ln 2 2^-c (u2 - c s), c = lf_shift_err(st.m, sh). For the passes whose entropy
 * term is in the exponent's units (lf_piece_stats_fast, the warp pass). */
template <bool FULL>
static __device__ __forceinline__ void lf_lse_add_shifted(lf_lse &st, float sh, float s, float u2)
{
    const float c = lf_shift_err(st.m, sh), fix = lf_ex2(-c);
    st.s = fmaf(s, fix, st.s);
    if (FULL) st.u = fmaf(fmaf(-c, s, u2), fix * LF_LN2, st.u);
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

/* Bulk copy global -> shared by the copy engine (sm_90; trap below): `bytes` (a multiple of 16,
 * < 2^20) from a 16-byte aligned global address to a 16-byte aligned shared address, issued by
 * ONE thread, completing on `bar` (an lf_mbar_arrive_tx of the same phase declares the bytes).
 * No register or instruction per element: a whole row slice is one instruction, so the threads
 * compute while the next rows stream in. Usage (one stage of a ring; all threads wait):
 *     if (threadIdx.x == 0) { lf_mbar_arrive_tx(&full[s], n * 16); lf_bulk_load(buf[s], src, n * 16, &full[s]); }
 *     lf_mbar_wait(&full[s], phase);                      // the bytes are visible to every thread
 * Before the buffer is loaded again every thread must be done reading it (a barrier). */
static __device__ __forceinline__ void lf_bulk_load(void *smem, const void *gmem, uint32_t bytes, uint64_t *bar)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(smem), b = (uint32_t)__cvta_generic_to_shared(bar);
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(s),
                 "l"(gmem), "r"(bytes), "r"(b)
                 : "memory");
#else
    (void)smem;
    (void)gmem;
    (void)bytes;
    (void)bar;
    __trap();
#endif
}

/* After this thread's ordinary stores into a shared-memory buffer that a bulk load (the async
 * proxy) will fill again: orders them before that load's writes (fence.proxy.async; the barrier
 * before the reload still orders the threads). E.g. a stage edited in place before its pass
 * (examples/cross_entropy.cu, ce_soft_mark_rev). sm_90; a no-op below. */
static __device__ __forceinline__ void lf_fence_proxy_async_smem(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/* Ask the copy engine to bring `bytes` (a multiple of 16) from a 16-byte aligned global address
 * into L2, by one thread, nothing to wait for (sm_90; nothing below). For a ring of shared-memory
 * stages that is too small to keep enough reads in flight on its own: rows prefetched beyond the
 * ring are then loaded into a stage from L2. */
static __device__ __forceinline__ void lf_bulk_prefetch_l2(const void *gmem, uint32_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(gmem), "r"(bytes) : "memory");
#else
    (void)gmem;
    (void)bytes;
#endif
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

/* (i: the taker's index, threadIdx.x by default; lf_warp_row_pass passes the lane) */
template <typename T>
static __device__ __forceinline__ lf_edge_raw lf_row_edge_issue(const T *row, const lf_row_span &sp, int i)
{
    lf_edge_raw r;
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
static __device__ __forceinline__ lf_edge_raw lf_row_edge_issue(const T *row, const lf_row_span &sp)
{
    return lf_row_edge_issue(row, sp, (int)threadIdx.x);
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
 * exp2(x * scale*log2e - m*log2e). All terms share the one rounded shift m*log2e, whose
 * rounding is taken out of the piece's sums (lf_shift_err), so s is relative to m itself. No
 * barrier. */
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
    const float shift_l2e = lf_shift_l2e(m_new);
    float s0 = 0.0f, s1 = 0.0f; /* two chains halve the FADD dependency latency */
    float u = 0.0f;
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
                u = fmaf(p, fmaxf(z - shift, -FLT_MAX), u);
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
    /* onto m itself (lf_shift_err); u is relative to m already, its terms p carry the factor */
    const float fix = lf_ex2(-lf_shift_err(m_new, shift_l2e));
    st.lse.s = fmaf(s0 + s1, fix, st.lse.s);
    if (FULL) st.lse.u = fmaf(u, fix, st.lse.u);
}

/* The fast row pass (no softcap, no class weights): the same statistics as lf_piece_stats with
 * about half the instructions per element, which is what decides whether a row pass keeps up
 * with HBM (bench/RESULTS.md):
 *   sweep 1  the thread's maximum in the element type (lf_elem::mx_push: a packed max per two
 *            bf16/fp16 elements, nothing unpacked);
 *   sweep 2  p = exp2(x * scale*log2e - m*log2e): unpack + FFMA + EX2 + FADD per element; with
 *            FULL also u += p * t (t, the exponent, is (z - m) log2 e + c, c the shift's rounding,
 *            lf_shift_err: entropy in log2 units, converted once per piece, c s taken off) and
 *            optionally sum x (label smoothing: sum z = scale sum x).
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
                                                     bool nan, int i)
{
    const int PV = lf_elem<T>::per_vec;
    for (int v = vbeg + i; v < vend; v += THREADS) {
        float x[PV];
        lf_elem<T>::unpack(src[v - vbeg], x);
#pragma unroll
        for (int e = 0; e < PV; ++e)
            if (nan ? x[e] != x[e] : x[e] == M) return sp.head + v * PV + e;
    }
    return -1;
}

/* (i: the taker's index among the THREADS, threadIdx.x by default; lf_warp_row_pass passes the lane) */
template <int THREADS, typename T>
static __device__ __forceinline__ int32_t lf_piece_find(const uint4 *src, const lf_row_span &sp, int vbeg, int vend, float M,
                                                        bool nan)
{
    return lf_piece_find<THREADS, T>(src, sp, vbeg, vend, M, nan, (int)threadIdx.x);
}

template <int THREADS, typename T>
static __device__ __forceinline__ float lf_piece_xmax(const uint4 *buf, int vbeg, int vend)
{
    typename lf_elem<T>::mx_t a = lf_elem<T>::mx_init();
#pragma unroll 4
    for (int v = vbeg + (int)threadIdx.x; v < vend; v += THREADS) a = lf_elem<T>::mx_push(a, buf[v - vbeg]);
    return lf_elem<T>::mx_final(a);
}

template <int THREADS, typename T, bool ENT, bool SUMX, int NPOLY = 0>
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
            const float q = lf_impl_ex2_mix<NPOLY, PV>(t, e);
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
 * and, with FULL, la (best_key: the CTA's running maximum, see above). NPOLY (0..8): of each 8
 * elements, that many exponentials on the FMA pipe (lf_ex2_fma), the rest on MUFU. AMAX =
 * false (with FULL): no argmax (la and best_key untouched): the lazy search's scans, a few
 * warps' per row, hold the whole group at the block merge's barrier (measured on an H200:
 * examples/cross_entropy.cu's soft-target rows, ~4000 of ~21700 cycles per row and group). */
template <int THREADS, typename T, bool FULL, int NPOLY = 0, bool AMAX = FULL>
static __device__ __forceinline__ void lf_piece_stats_fast(lf_row_stats &st, lf_lazy_argmax &la, unsigned *best_key,
                                                           const uint4 *buf, const lf_row_span &sp, int vbeg, int vend,
                                                           const lf_xform &t, bool sumx)
{
    const float xm = lf_piece_xmax<THREADS, T>(buf, vbeg, vend);
    if (FULL && AMAX) {
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
    const float sh = lf_shift_l2e(m_new);
    float s = 0.0f, u2 = 0.0f, sx = 0.0f;
    if (!FULL) lf_piece_sumexp<THREADS, T, false, false, NPOLY>(buf, vbeg, vend, t.scale_l2e, sh, &s, &u2, &sx);
    else if (sumx) lf_piece_sumexp<THREADS, T, true, true, NPOLY>(buf, vbeg, vend, t.scale_l2e, sh, &s, &u2, &sx);
    else lf_piece_sumexp<THREADS, T, true, false, NPOLY>(buf, vbeg, vend, t.scale_l2e, sh, &s, &u2, &sx);
    lf_lse_add_shifted<FULL>(st.lse, sh, s, u2); /* onto m itself (st.lse.m is m_new) */
    if (FULL) st.wz += sx * t.scale;
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

/* ---- A row by one warp, straight from global memory ------------------------------------------
 * lf_warp_row_pass: one warp reads a row of V logits once, through registers, and returns the
 * row's statistics in every lane — the same lf_row_stats that lf_piece_stats + lf_block_row_stats
 * give (lse state with entropy, argmax of the raw logits with the first index on ties and the
 * first NaN winning, the weighted logit sums) — with no shared memory, no barrier, no workspace.
 * Usage (one warp per row; all 32 lanes call, the row uniform across the warp):
 *     const int64_t row = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32;
 *     if (row < N) {
 *         const lf_xform t = lf_xform_make(1.0f, 0.0f);                  // scale 1, no softcap
 *         const lf_row_stats st = lf_warp_row_pass<__nv_bfloat16, true, false, 4>(x + row * stride, V, t, NULL, false);
 *         if ((threadIdx.x & 31) == 0) { lse[row] = lf_lse_final(st.lse); amax[row] = st.am.i; }
 *     }
 * How: lane l reads the 16-byte body vectors l, l + 32, l + 64, ... in batches of U per lane, and
 * issues the loads of batch b + 1 before it reduces batch b, so each warp keeps up to 2 U 16-byte
 * loads per lane in flight; the head and tail elements that do not fill a vector (lf_row_span)
 * are scalar loads of lanes 0..7 and 8..15. Per batch the maximum is a packed max over the raw
 * vectors (lf_elem::mx_push), the running sum moves onto it once (when it grows), and each element
 * costs one FFMA + EX2 + FADD (FULL: + the entropy FFMA). The argmax costs nothing per element:
 * each lane remembers the first batch in which its maximum appeared; at the end the lanes holding
 * the warp's maximum re-read that one batch (U vectors, from L2) for the first index.
 * When to use it: many rows, each warp on its own (a forward-only pass over N rows with N at
 * least the number of warps resident, roughly; examples/cross_entropy.cu's CE_SCHED_WARP). The
 * block and cluster passes above put more threads on one row: they suit few long rows, and rows
 * whose gradient must be written from a copy kept in shared memory.
 *   FULL = false: only st.lse.m and st.lse.s (what a loss or its gradient needs);
 *   FULL = true : also st.lse.u (entropy), st.am (argmax), and st.wz = sum_j w_j z_j with
 *                 st.w = sum_j w_j when class_w is given, st.wz = sum_j z_j when sumx (else 0;
 *                 without class_w st.w stays 0: W = V), as lf_piece_stats.
 *   SOFTCAP must match t.softcap > 0; class_w: device pointer to V floats, or NULL (FULL only).
 *   U: 16-byte vectors per lane per batch (1 .. 8); registers grow by 8 U. sm_80+ (packed max,
 *   __reduce_*_sync). row: a global-memory address (the loads are ld.global).
 * The row is read with non-coherent loads (ld.global.nc): it must not be written during the
 * kernel before this pass has read it (a gradient written over it afterwards is fine).
 * Bits: the order of every sum depends only on V and the row's address mod 16, so the same row
 * gives the same bits in any kernel, run to run. */

/* 16-byte load of read-only data streamed once: not kept in L1, and L2 asked for the whole
 * 256-byte line it falls in (the lanes of a warp cover 512 consecutive bytes). */
static __device__ __forceinline__ uint4 lf_ld16_stream(const uint4 *p)
{
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* A 16-byte vector of -inf elements (the identity of the packed max). */
template <typename T> static __device__ __forceinline__ uint4 lf_impl_ninf_vec(void)
{
    const unsigned w = lf_elem<T>::ninf_word;
    return make_uint4(w, w, w, w);
}

/* Batch b of a lane: U vectors, v0 + 32 u (u < U), v0 = 32 U b + lane. TAIL: the row's last,
 * partial batch (vectors >= nvec are not loaded: their registers hold -inf). */
template <int U, bool TAIL, typename T>
static __device__ __forceinline__ void lf_impl_warp_load(uint4 (&r)[U], const uint4 *body, int v0, int nvec)
{
#pragma unroll
    for (int u = 0; u < U; ++u) {
        if (!TAIL || v0 + 32 * u < nvec) r[u] = lf_ld16_stream(body + v0 + 32 * u);
        else r[u] = lf_impl_ninf_vec<T>();
    }
}

/* Reduce one batch into the lane's state. MODE: 0 no weighted sums, 1 sum of z (sumx),
 * 2 class weights. bv / bb: the lane's largest raw logit so far and the first batch holding it. */
template <typename T, bool FULL, bool SOFTCAP, int MODE, bool TAIL, int U>
static __device__ __forceinline__ void lf_impl_warp_batch(lf_row_stats &st, float &bv, int &bb, const uint4 (&r)[U], int b,
                                                          int v0, int nvec, int head, const lf_xform &t,
                                                          const float *class_w)
{
    const int PV = lf_elem<T>::per_vec;
    typename lf_elem<T>::mx_t mx = lf_elem<T>::mx_init();
#pragma unroll
    for (int u = 0; u < U; ++u) mx = lf_elem<T>::mx_push(mx, r[u]); /* -inf padding: the identity */
    const float xm = lf_elem<T>::mx_final(mx); /* NaN elements are ignored here; they reach s below */
    /* strictly larger only: an equal maximum in a later batch has a larger index */
    if (FULL && (!TAIL || v0 < nvec) && (xm > bv || bb < 0)) {
        bv = xm;
        bb = b;
    }
    /* z is increasing in x (scale > 0, tanh increasing): the batch's max z is z(max x) */
    const float m_new = fmaxf(st.lse.m, lf_xform_apply<SOFTCAP>(xm, t));
    if (m_new > st.lse.m) {
        lf_impl_lse_rescale(st.lse.m, m_new, &st.lse.s, &st.lse.u);
        st.lse.m = m_new;
    }
    const float sh = lf_shift_l2e(st.lse.m);
    float s0 = 0.0f, s1 = 0.0f, u0 = 0.0f, u1 = 0.0f, a0 = 0.0f, a1 = 0.0f;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        if (TAIL && v0 + 32 * u >= nvec) continue;
        float x[PV];
        lf_elem<T>::unpack(r[u], x);
#pragma unroll
        for (int e = 0; e < PV; ++e) {
            const float z = lf_xform_apply<SOFTCAP>(x[e], t);
            /* exponent in log2 units: (z - m) log2 e, one FFMA without the cap */
            const float tt = SOFTCAP ? fmaf(z, LF_LOG2E, -sh) : fmaf(x[e], t.scale_l2e, -sh);
            const float q = lf_ex2(tt);
            if (e & 1) s1 += q;
            else s0 += q;
            if (FULL) {
                /* q = 0 below tt = -126 (EX2 flushes): the clamp changes no term, but keeps
                 * 0 * -inf (a -inf logit) from forming */
                if (e & 1) u1 = fmaf(q, fmaxf(tt, -127.0f), u1);
                else u0 = fmaf(q, fmaxf(tt, -127.0f), u0);
                if (MODE == 1) {
                    if (e & 1) a1 += SOFTCAP ? z : x[e];
                    else a0 += SOFTCAP ? z : x[e];
                } else if (MODE == 2) {
                    const float w = __ldg(class_w + (head + (v0 + 32 * u) * PV + e));
                    if (w != 0.0f) a0 += w * z;
                    a1 += w;
                }
            }
        }
    }
    lf_lse_add_shifted<FULL>(st.lse, sh, s0 + s1, u0 + u1); /* onto m itself */
    if (FULL) {
        if (MODE == 1) st.wz += SOFTCAP ? a0 + a1 : (a0 + a1) * t.scale;
        if (MODE == 2) {
            st.wz += a0;
            st.w += a1;
        }
    }
}

/* The order-preserving key of lf_argmax_key, back to the float (-0 comes back as +0). */
static __device__ __forceinline__ float lf_impl_argmax_unkey(unsigned k)
{
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

template <typename T, bool FULL, bool SOFTCAP, int MODE, int U>
static __device__ __forceinline__ lf_row_stats lf_impl_warp_row_pass(const T *row, int64_t V, const lf_xform &t,
                                                                     const float *class_w)
{
    unsigned lane_u;
    asm("mov.u32 %0, %%laneid;" : "=r"(lane_u)); /* any block shape */
    const int lane = (int)lane_u;
    const lf_row_span sp = lf_row_span_make(row, V);
    const uint4 *body = reinterpret_cast<const uint4 *>(row + sp.head);
    /* the head / tail element of this lane: loaded now, converted after the body (a conversion
     * right after the load would stall the warp for a memory latency before the body's loads) */
    const lf_edge_raw er = lf_row_edge_issue(row, sp, lane);

    lf_row_stats st = lf_row_stats_init();
    float bv = -LF_INF_F;
    int bb = -1;
    const int nvec = sp.nvec, nfull = nvec / (32 * U);
    uint4 ra[U], rb[U];
    if (nfull > 0) lf_impl_warp_load<U, false, T>(ra, body, lane, nvec);
    int b = 0;
    /* two register sets: batch b + 1 is in flight while batch b is reduced */
    for (; b + 1 < nfull; b += 2) {
        lf_impl_warp_load<U, false, T>(rb, body, 32 * U * (b + 1) + lane, nvec);
        lf_impl_warp_batch<T, FULL, SOFTCAP, MODE, false, U>(st, bv, bb, ra, b, 32 * U * b + lane, nvec, sp.head, t, class_w);
        if (b + 2 < nfull) lf_impl_warp_load<U, false, T>(ra, body, 32 * U * (b + 2) + lane, nvec);
        lf_impl_warp_batch<T, FULL, SOFTCAP, MODE, false, U>(st, bv, bb, rb, b + 1, 32 * U * (b + 1) + lane, nvec, sp.head,
                                                             t, class_w);
    }
    if (b < nfull) { /* an odd count: the last whole batch is already in ra */
        lf_impl_warp_batch<T, FULL, SOFTCAP, MODE, false, U>(st, bv, bb, ra, b, 32 * U * b + lane, nvec, sp.head, t, class_w);
        ++b;
    }
    if (32 * U * nfull < nvec) { /* the partial last batch */
        lf_impl_warp_load<U, true, T>(ra, body, 32 * U * nfull + lane, nvec);
        lf_impl_warp_batch<T, FULL, SOFTCAP, MODE, true, U>(st, bv, bb, ra, nfull, 32 * U * nfull + lane, nvec, sp.head, t,
                                                            class_w);
    }
    /* the edge elements, exactly (st.am holds only these until the body's argmax joins below) */
    const lf_edge e = lf_edge_resolve<T>(er);
    lf_edge_stats<FULL, SOFTCAP>(st, e, t, MODE == 2 ? class_w : NULL);
    if (!FULL) {
        st.lse = lf_warp_lse(st.lse);
        return st;
    }
    st = lf_warp_row_stats(st);
    /* the body's argmax: the warp's largest lane maximum, and the first index holding it among
     * the lanes that hold it (each re-reads the one batch where its maximum first appeared) */
    const unsigned key = bb >= 0 ? lf_argmax_key(bv) : 0u;
    const unsigned wkey = __reduce_max_sync(0xffffffffu, key);
    int32_t idx = INT_MAX;
    if (bb >= 0 && key == wkey) {
        const int vb = 32 * U * bb, ve = min(nvec, 32 * U * (bb + 1)); /* batch bb; the lane's are vb + lane + 32 u */
        const int32_t j = lf_piece_find<32, T>(body + vb, sp, vb, ve, bv, false, lane);
        if (j >= 0) idx = j;
    }
    idx = __reduce_min_sync(0xffffffffu, idx);
    if (idx != INT_MAX) {
        lf_argmax am;
        am.v = lf_impl_argmax_unkey(wkey);
        am.i = idx;
        st.am = lf_argmax_merge(st.am, am);
    }
    /* a NaN or +inf element made s NaN (uniform): the first NaN, if any, is the argmax */
    if (st.lse.s != st.lse.s) {
        int32_t nidx = (e.j >= 0 && e.x != e.x) ? e.j : INT_MAX;
        const int32_t j = lf_piece_find<32, T>(body, sp, 0, nvec, 0.0f, true, lane); /* all the lane's vectors */
        if (j >= 0) nidx = min(nidx, j);
        nidx = __reduce_min_sync(0xffffffffu, nidx);
        if (nidx != INT_MAX) {
            st.am.v = NAN;
            st.am.i = nidx;
        }
    }
    return st;
}

template <typename T, bool FULL, bool SOFTCAP, int U>
static __device__ __forceinline__ lf_row_stats lf_warp_row_pass(const T *row, int64_t V, const lf_xform &t,
                                                                const float *class_w, bool sumx)
{
    static_assert(U >= 1 && U <= 8, "lf_warp_row_pass: U is 1..8 vectors per lane and batch");
    if (FULL && class_w) return lf_impl_warp_row_pass<T, FULL, SOFTCAP, 2, U>(row, V, t, class_w);
    if (FULL && sumx) return lf_impl_warp_row_pass<T, FULL, SOFTCAP, 1, U>(row, V, t, NULL);
    return lf_impl_warp_row_pass<T, FULL, SOFTCAP, 0, U>(row, V, t, NULL);
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
 *    Usage: cross-entropy forward + backward of bf16 logits, one CTA of 256 threads per row, the
 *    row staged once (the quick start at the top, plus the gradient in place; every label in
 *    [0, V); tests/test_ce_gpu.cu runs this kernel against lf_ref_ce_row):
 *        typedef __nv_bfloat16 bf;
 *        __global__ void row_ce(bf *x, const int64_t *labels, int64_t V, float *loss)
 *        {
 *            extern __shared__ uint4 buf[];
 *            __shared__ lf_row_stats red[256 / 32];
 *            bf *row = x + blockIdx.x * V;
 *            const int64_t y = labels[blockIdx.x];
 *            const float x_y = lf_elem<bf>::to_f32(row[y]);  // before any thread overwrites it
 *            const lf_row_span sp = lf_row_span_make(row, V);
 *            const lf_xform t = lf_xform_make(1.0f, 0.0f);
 *            lf_piece_load<256>(buf, row, sp, 0, sp.nvec);
 *            lf_cp_async_commit();
 *            const lf_edge e = lf_row_edge_load(row, sp);
 *            lf_cp_async_wait<0>();
 *            lf_row_stats st = lf_row_stats_init();
 *            lf_edge_stats<false, false>(st, e, t, NULL);
 *            lf_piece_stats<256, bf, false, false>(st, buf, sp, 0, sp.nvec, t, NULL);
 *            st = lf_block_row_stats<256>(st, red);       // a barrier: every x_y is read
 *            const float lse = lf_lse_final(st.lse);
 *            const lf_grad_coef c = lf_grad_coef_make(1.0f, lse, 0.0f, 0.0f, 1.0f, (float)V, V, t);
 *            lf_piece_grad_store<256, false, false>(row, true, buf, sp, 0, sp.nvec, c, t, NULL);
 *            lf_edge_grad_store<false, false>(row, e, c, t, NULL);
 *            __syncthreads();                              // the dense write of y, then its patch
 *            if (threadIdx.x == 0) {
 *                row[y] = lf_elem<bf>::from_f32(lf_ce_label_grad<false, false>(x_y, (int32_t)y, c, t, NULL));
 *                loss[blockIdx.x] = lse - x_y;
 *            }
 *        }
 *    launched as row_ce<<<N, 256, 16 * (V / 8 + 1)>>>(...), with the shared-memory opt-in past
 *    48 KB (V >= 24576): V up to ~116K on sm_90, ~83K on sm_80. (The examples patch the label
 *    without that barrier: the thread that wrote its dense value writes it, as said above.)
 * ========================================================================================== */

typedef struct lf_grad_coef {
    float a;  /* multiplies exp2(z_j log2e - sh): a p_j */
    float b;  /* subtracted at the label */
    float e;  /* multiplies w_j, subtracted everywhere (label smoothing) */
    float sh; /* the exponent's shift in log2 units: lse log2(e) (lf_grad_coef_make), or the row
               * maximum's m log2(e) with 2^-c / s folded into a (lf_grad_coef_onto_max) */
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
    c.sh = lse * LF_LOG2E;
    if (!(fabsf(lse) < LF_INF_F)) c.a = NAN;
    return c;
}

/* The same coefficients with p_j taken against the row's maximum m instead of its lse: m and s
 * are the row's merged state (s = sum exp(z - m), relative to m itself, as the passes leave it:
 * lf_shift_err). exp2(z log2e - lse log2e) carries the rounding of the one float lse log2(e) in
 * every p_j: ~2^-24 |lse| relative (up to 1.7e-4 at |lse| = 4000), which fp32 gradients show and
 * cancels badly at a confident label (a p_y - b). Against the maximum instead, p_j = exp2(z
 * log2e - sh) 2^-c / s with sh = lf_shift_l2e(m) and c its exact rounding, and the per-row
 * factor 2^-c / s goes into a: the exponent's own error is then relative to |z - m|, small
 * wherever p_j is not. Free per element (the general writer multiplies by a anyway; the fast
 * form's k = sh - log2|a| is still one rounded float: lf_grad_fast_ok). Where c.a is NaN (a
 * non-finite lse) nothing changes. */
static __device__ __forceinline__ void lf_grad_coef_onto_max(lf_grad_coef &c, float m, float s)
{
    if (c.a != c.a) return;
    const float sh = lf_shift_l2e(m);
    c.a *= __fdividef(lf_ex2(-lf_shift_err(m, sh)), s); /* s <= V sqrt 2: far below __fdividef's 2^126 */
    c.sh = sh;
}

/* lf_grad_coef_onto_max where a gradient of T would show the lse's rounding: always for fp32;
 * for bf16 / fp16 only where |lse log2 e| >= 256 (below, the lse's rounding and that of lse
 * log2 e add up to ~1.7 2^-17 relative at most: 1/38 of fp16's unit roundoff). It puts an EX2
 * and a division on each row's path before its gradient (on an H200 a bf16 fused
 * forward+backward was 0.4-1.8% slower with it on every row and a second inlined copy of the
 * general writer, both since removed), so the 16-bit rows that gain nothing from it skip it. */
template <typename T>
static __device__ __forceinline__ void lf_grad_coef_onto_max_for(lf_grad_coef &c, float m, float s)
{
    if (sizeof(T) == 4 || !(fabsf(c.sh) < 256.0f)) lf_grad_coef_onto_max(c, m, s);
}

/* g_j for one element (the dense part: without the label's -b). RKL: a p_j (z_j - zc) instead,
 * the gradient of a reverse KL (p || q) whose log q_j is one value over the entries written
 * (zc = lse + log q_j + KL; a NaN a for an infinite KL); z_j - zc is held at -FLT_MAX or above, so
 * that an entry without mass (z_j = -inf, or an fp32 z_j whose p_j is 0) gives 0, not 0 x -inf. */
template <bool FULL, bool SOFTCAP, bool RKL = false>
static __device__ __forceinline__ float lf_ce_grad_elem(float x, int32_t j, const lf_grad_coef &c, const lf_xform &t,
                                                        const float *class_w, float zc = 0.0f)
{
    const float z = lf_xform_apply<SOFTCAP>(x, t);
    const float p = lf_ex2(SOFTCAP ? fmaf(z, LF_LOG2E, -c.sh) : fmaf(x, t.scale_l2e, -c.sh));
    float g = c.a * p;
    if (RKL) g *= fmaxf(z - zc, -3.402823466e38f);
    else if (FULL) g -= c.e * (class_w ? __ldg(class_w + j) : 1.0f);
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
 * row's phase (true in place), so 16-byte stores line up; otherwise elements go one by one.
 * RKL, zc: lf_ce_grad_elem's reverse-KL form. */
template <int THREADS, bool FULL, bool SOFTCAP, typename T, bool RKL = false>
static __device__ __forceinline__ void lf_piece_grad_store(T *out_row, bool vec_ok, const uint4 *buf, const lf_row_span &sp,
                                                           int vbeg, int vend, const lf_grad_coef &c, const lf_xform &t,
                                                           const float *class_w, float zc = 0.0f)
{
    const int PV = lf_elem<T>::per_vec;
    uint4 *body = reinterpret_cast<uint4 *>(out_row + sp.head);
#pragma unroll 4
    for (int v = vbeg + (int)threadIdx.x; v < vend; v += THREADS) {
        float x[PV], g[PV];
        lf_elem<T>::unpack(buf[v - vbeg], x);
#pragma unroll
        for (int e = 0; e < PV; ++e) g[e] = lf_ce_grad_elem<FULL, SOFTCAP, RKL>(x[e], sp.head + v * PV + e, c, t, class_w, zc);
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
 * k = sh - log2|a| (lf_grad_fast_k; sh = lse log2e, or m log2e after lf_grad_coef_onto_max).
 * Unpack + FFMA + EX2 + half a pack per element: no multiply. a = 0 gives k = +inf and zeros;
 * a NaN row gives NaN (lf_piece_grad_fast_if_ok sends it to the general writer). The label
 * element is patched afterwards as with lf_piece_grad_store. 16-byte stores: the output row must have the input
 * row's phase (vec_ok). NPOLY: as lf_piece_stats_fast (its x c - k <= log2|a|: |a| >= 2^127.5
 * gives +inf where lf_ex2 is finite up to 2^128). */
static __device__ __forceinline__ float lf_grad_fast_k(const lf_grad_coef &c) { return c.sh - log2f(fabsf(c.a)); }

/* Whether the fast form may write a row of T: its k is one float, so every p_j carries up to
 * half an ulp of k (relative: that times ln 2; 1.7e-4 at |k| ~ 6000). With 16-bit outputs and
 * |k| < 256 that is under ln 2 2^-17 (with the lse's own rounding and that of lse log2 e, which
 * lf_grad_coef_onto_max_for leaves below |lse log2 e| = 256, at most ~2.4 2^-17 in all: 1/27 of
 * fp16's unit roundoff 2^-11, 1/200 of bf16's 2^-8). k = +inf (a = 0) too: zeros either way. An
 * fp32 output, or a row beyond that, takes a p_j with a's multiply instead
 * (lf_piece_grad_fast_if_ok, then lf_piece_grad_store). */
template <typename T> static __device__ __forceinline__ bool lf_grad_fast_ok(float k)
{
    return sizeof(T) == 2 && (fabsf(k) < 256.0f || k == LF_INF_F);
}

template <int THREADS, typename T, bool NEG, int NPOLY = 0, bool SUB = false, bool RKL = false>
static __device__ __forceinline__ void lf_piece_grad_fast(T *out_row, const uint4 *buf, const lf_row_span &sp, int vbeg,
                                                          int vend, float c, float k, float sub = 0.0f, float zs = 0.0f,
                                                          float zc = 0.0f)
{
    const int PV = lf_elem<T>::per_vec;
    uint4 *body = reinterpret_cast<uint4 *>(out_row + sp.head);
#pragma unroll 4
    for (int v = vbeg + (int)threadIdx.x; v < vend; v += THREADS) {
        float x[PV], g[PV];
        lf_elem<T>::unpack(buf[v - vbeg], x);
#pragma unroll
        for (int e = 0; e < PV; ++e) {
            const float q = lf_impl_ex2_mix<NPOLY, PV>(fmaf(x[e], c, -k), e);
            g[e] = NEG ? -q : q;
            if (SUB) g[e] -= sub;
            if (RKL) g[e] *= fmaxf(fmaf(x[e], zs, -zc), -3.402823466e38f); /* (z_j - zc: lf_ce_grad_elem) */
        }
        lf_st16(body + v, lf_elem<T>::pack(g));
    }
}

/* The fast form of the plain loss's dense gradient (no softcap, class weights or smoothing),
 * its sign taken from c.a, where lf_grad_fast_ok(k) allows it (k = lf_grad_fast_k(c), passed in
 * so a caller can take it once per row): true when written; false, nothing written, for the
 * caller's lf_piece_grad_store (a p_j with a's multiply, as exact as c: lf_grad_coef_onto_max).
 * One call site of each writer per kernel: a second inlined copy of the general writer cost a
 * bf16 fused forward+backward up to 1% on an H200. 16-byte stores (vec_ok). SUB: label
 * smoothing without class weights too, a p_j - c.e (one FADD more per element). RKL: a p_j
 * (z_j - zc) with z_j = x_j scale (lf_ce_grad_elem's reverse-KL form; an FFMA, an FMNMX and an
 * FMUL more per element). */
template <int THREADS, typename T, int NPOLY = 0, bool SUB = false, bool RKL = false>
static __device__ __forceinline__ bool lf_piece_grad_fast_if_ok(T *out_row, const uint4 *buf, const lf_row_span &sp,
                                                                int vbeg, int vend, const lf_grad_coef &c, float k,
                                                                float scale_l2e, float scale = 0.0f, float zc = 0.0f)
{
    if (!lf_grad_fast_ok<T>(k)) return false;
    if (c.a < 0.0f) lf_piece_grad_fast<THREADS, T, true, NPOLY, SUB, RKL>(out_row, buf, sp, vbeg, vend, scale_l2e, k, c.e, scale, zc);
    else lf_piece_grad_fast<THREADS, T, false, NPOLY, SUB, RKL>(out_row, buf, sp, vbeg, vend, scale_l2e, k, c.e, scale, zc);
    return true;
}

/* Write the gradient of this thread's edge element (if any). */
template <bool FULL, bool SOFTCAP, typename T, bool RKL = false>
static __device__ __forceinline__ void lf_edge_grad_store(T *out_row, const lf_edge &e, const lf_grad_coef &c,
                                                          const lf_xform &t, const float *class_w, float zc = 0.0f)
{
    if (e.j >= 0) out_row[e.j] = lf_elem<T>::from_f32(lf_ce_grad_elem<FULL, SOFTCAP, RKL>(e.x, e.j, c, t, class_w, zc));
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

/* The same merge without a cluster barrier (sm_90): each CTA posts its statistics into slot
 * [rank] of every CTA's exchange array with asynchronous stores that count their bytes on that
 * CTA's mbarrier (st.async ... mbarrier::complete_tx), and arrives once on its own mbarrier,
 * expecting the bytes of nranks records; each CTA then waits for its own mbarrier only. A CTA
 * waits for the data it needs and no longer for the slowest CTA to reach a barrier; nothing
 * waits for the reads of the slots to finish either, and no fence waits for the poster's
 * earlier stores (a release at cluster scope would wait for the previous row's gradient
 * stores to drain; st.async's completion is tracked by the receiver's mbarrier instead).
 *     __shared__ lf_row_stats xs[2][16];    // yours, two sets used by alternate rows
 *     __shared__ uint64_t xbar[2];          // lf_mbar_init(&xbar[k], 1) by one thread, then
 *                                            // lf_mbar_init_fence and a cluster barrier
 *     lf_cluster_stats_post(st, xs[q], &xbar[q], rank, nranks);        // after a block reduction
 *     st = lf_cluster_stats_collect<FULL>(xs[q], &xbar[q], phase[q], nranks); phase[q] ^= 1; q ^= 1;
 *     ...
 *     lf_cluster_sync();                    // once, before the kernel exits
 * The post is made by threads 0 .. nranks-1 (thread d writes to CTA d) from `cta`, which must hold
 * the same value in each of them. Two sets are enough when a CTA barrier lies between every
 * collect and the next post (the block reduction that precedes a post): a CTA posts to a set
 * again only after it has collected the next row, which needs the posts of every CTA, each made
 * after that CTA has finished reading the set. (A peer's bytes may land before this CTA's own
 * arrival sets the phase's expectation: the transaction count goes below zero meanwhile, and
 * the phase cannot complete without that arrival.) Every thread of every CTA gets the
 * bit-identical result: lanes 0 .. nranks-1 of every warp merge the ranks' values in the same
 * butterfly. FULL = false merges only the lse state (m, s, u); the rest is that of rank 0. */
/* Store `v` into `slot` (this CTA's shared address of it) of cluster CTA `dst`, asynchronously,
 * counting its bytes on that CTA's `bar` (the same shared address), word by word (st.async ...
 * mbarrier::complete_tx). The receiver's phase must expect the bytes (lf_mbar_arrive_tx or
 * lf_mbar_expect_tx); its wait (lf_cluster_posts_wait) then also acquires v. sm_90. */
template <typename S>
static __device__ __forceinline__ void lf_cluster_store(const S &v, S *slot, uint64_t *bar, int dst)
{
    static_assert(sizeof(S) % 4 == 0, "a posted record is stored to remote CTAs word by word");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint32_t words[sizeof(S) / 4];
    memcpy(words, &v, sizeof v);
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(slot), b = (uint32_t)__cvta_generic_to_shared(bar);
    uint32_t rs, rb;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rs) : "r"(s), "r"(dst));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(b), "r"(dst));
#pragma unroll
    for (int i = 0; i < (int)(sizeof(S) / 4); ++i)
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(rs + 4u * i),
                     "r"(words[i]), "r"(rb)
                     : "memory");
#else
    (void)v;
    (void)slot;
    (void)bar;
    (void)dst;
#endif
}

/* The same two steps for any record S of 32-bit words (a loss's own statistics, e.g.
 * lf_dual_acc): lf_cluster_post writes `cta` into slot [rank] of every CTA's xs (threads
 * 0 .. nranks-1, as above; the mbarrier made with count 1); after lf_cluster_posts_wait every
 * thread reads the nranks slots of its own xs and merges them (the same bits in every CTA).
 * More bytes may ride on the same phase: the receiver adds them with lf_mbar_expect_tx before
 * its post (by its thread `rank`), the sender stores them with lf_cluster_store
 * (examples/cross_entropy.cu: rank 0 hands its peers the next row so). */
template <typename S>
static __device__ __forceinline__ void lf_cluster_post(const S &cta, S *xs, uint64_t *bar, int rank, int nranks)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int d = (int)threadIdx.x;
    if (d >= nranks) return;
    if (d == rank) lf_mbar_arrive_tx(bar, (uint32_t)(nranks * sizeof(S))); /* this phase: nranks records */
    lf_cluster_store(cta, xs + rank, bar, d);
#else
    (void)cta;
    (void)xs;
    (void)bar;
    (void)rank;
    (void)nranks;
#endif
}

/* Wait (acquire, cluster scope) until every CTA has posted to this CTA's set (phase `parity`). */
static __device__ __forceinline__ void lf_cluster_posts_wait(uint64_t *bar, unsigned parity)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t b = (uint32_t)__cvta_generic_to_shared(bar);
    uint32_t done;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(b), "r"(parity)
                     : "memory");
    } while (!done);
#else
    (void)bar;
    (void)parity;
#endif
}

static __device__ __forceinline__ void lf_cluster_stats_post(const lf_row_stats &cta, lf_row_stats *xs, uint64_t *bar,
                                                             int rank, int nranks)
{
    lf_cluster_post(cta, xs, bar, rank, nranks);
}

template <bool FULL>
static __device__ __forceinline__ lf_row_stats lf_cluster_stats_collect(const lf_row_stats *xs, uint64_t *bar,
                                                                        unsigned parity, int nranks)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    lf_cluster_posts_wait(bar, parity);
    const int lane = (int)(threadIdx.x & 31u);
    lf_row_stats v = lf_row_stats_init();
    if (lane < nranks) v = xs[lane];
    if (FULL) return lf_warp_row_stats(v);
    lf_row_stats r = xs[0];
    r.lse = lf_warp_lse(v.lse);
    return r;
#else
    (void)bar;
    (void)parity;
    (void)nranks;
    return xs[0];
#endif
}

/* ============================================================================================
 * 8. Dual-softmax row pass and the KL-family gradient (student s, teacher t; lossfuse.h §3b, §8)
 *
 *    Usage: forward KL(q || p) of bf16 logits, one CTA of 256 threads per row pair, the whole
 *    pair staged once (4 bytes of dynamic shared memory per element: V up to ~58K on sm_90,
 *    ~41K on sm_80), the loss
 *    per row and the gradient in place over the student (tests/test_kl_gpu.cu runs this kernel
 *    against lf_ref_kl_row; examples/kl_distill.cu is the same pattern with pieces, a ring of
 *    stages, clusters and every option):
 *        typedef __nv_bfloat16 bf;
 *        __global__ void row_kl_fwd(bf *xs_all, const bf *xt_all, int64_t V, float tau, float *loss)
 *        {
 *            extern __shared__ uint4 buf[];
 *            __shared__ lf_dual_acc red[256 / 32];
 *            bf *xs = xs_all + blockIdx.x * V;
 *            const bf *xt = xt_all + blockIdx.x * V;
 *            const lf_kl_xf xf = lf_kl_xf_make(tau, LF_SIDE_LOGITS, 0.0f, LF_SIDE_LOGITS, 0.0f, true);
 *            const lf_dual_span sp = lf_dual_span_make(xs, xt, V);
 *            const int nu = sp.nunit;                  // one piece of every unit of the row
 *            uint4 *bs = buf, *bt = buf + lf_dual_part_vecs<bf>(nu);
 *            lf_dual_piece_load<256, bf, bf>(bs, bt, xs, xt, sp, 0, nu, nu);
 *            lf_cp_async_commit();
 *            lf_cp_async_wait<0>();                    // a thread reads back only its own copies
 *            lf_dual_acc acc = lf_dual_acc_init();
 *            lf_dual_edge_stats<256, bf, bf, true, LF_DUAL_FULL>(acc, xs, xt, sp, xf);
 *            lf_dual_piece_stats<256, bf, bf, true, LF_DUAL_FULL>(acc, bs, bt, nu, nu, xf);
 *            acc = lf_block_dual_acc<256>(acc, xf.cs, red);   // the row's state, in every thread
 *            const lf_dual_out o = lf_dual_final(lf_dual_acc_final(acc, xf));
 *            const lf_kl_coef c = lf_kl_coef_make(LF_KL_FORWARD, 0.0f, 1.0f, o, xf, true);
 *            lf_kl_piece_grad<256, bf, bf, true>(xs, true, bs, bt, sp, 0, nu, nu, xf, c);
 *            lf_kl_edge_grad<256, bf, bf, true>(xs, xs, xt, sp, xf, c);   // each element: one owner
 *            if (threadIdx.x == 0) loss[blockIdx.x] = o.kl_fwd;
 *        }
 *    launched as row_kl_fwd<<<N, 256, 32 * (V / 8 + 1)>>>(...) (with the shared-memory opt-in
 *    past 48 KB). The gradient is d KL / d x_s = (p - q) / tau; scale it (c's g) for a mean.
 *    LF_DUAL_FULL keeps every statistic (both entropies, both KLs); forward KL alone needs only
 *    LF_DUAL_RB (in pass 1 and the merge), which sums without the entropy terms' per-piece
 *    maximum sweep: faster, and what examples/kl_distill.cu uses.
 *
 *    Both rows of a pair are staged piece by piece in shared memory, like section 5, but a
 *    piece is a range of 8-element UNITS that covers the same elements of both rows, whatever
 *    each side's dtype (one 16-byte vector of a bf16/fp16 side, two of an fp32 side):
 *        lf_dual_span      the row pair: head elements | nunit units | tail elements, where the
 *                          head is chosen so that BOTH rows are 16-byte aligned at the body.
 *                          Rows that can never be aligned together (say a bf16 student at an
 *                          odd element offset and an fp32 teacher) get nunit = 0: every element
 *                          is an "edge" element, loaded one by one (correct, not fast).
 *        piece layout      [student part][teacher part]; a 16-bit side holds unit i at vector
 *                          i, an fp32 side at vectors i (elements 0..3) and PU + i (4..7), PU
 *                          the piece's capacity in units: conflict-free 16-byte reads.
 *        lf_dual_piece_load   this thread's cp.async copies of units [ub, ue) (owner reads back)
 *    How each side's raw values x become softmax logits z (lf_kl_side):
 *        LF_SIDE_LOGITS    z = softcap_c(x) / tau      (c = 0: no cap)
 *        LF_SIDE_LOGPROBS  z = x / tau                 (softmax(log q / tau) = softmax(x_t / tau))
 *        LF_SIDE_PROBS     z = log(x) / tau            (0 is a masked entry)
 *    The loops work on w: w = x when both sides are linear (LIN: logits without a cap, or
 *    log-probabilities) and z = w / tau, so that exp(z - m) is one FFMA + EX2; otherwise w = z.
 *
 *    Pass 1, statistics (lf_dual_piece_stats, lf_dual_edge_push): per thread an lf_dual_acc of
 *    both shifts (maxima so far), sums, entropy terms and the cross terms of lossfuse.h §3b; a
 *    piece is summed against the shifts it has (on a thread's first piece of a row, the maxima
 *    of its first unit), and its maximum (packed bf16/fp16 max) is only looked for when a sum
 *    passes 2^64, so sums are rarely rescaled; a piece's sums, taken against the shifts' rounded
 *    products m cs, join the state relative to the maxima themselves (lf_impl_acc_fold). The fast
 *    sweep does no special-value tests: a -inf entry turns a cross term NaN, and then (only
 *    then) the thread's share of the piece is summed again with the exact conventions (0 log 0
 *    = 0, +inf KL on a support mismatch). lf_dual_acc_final gives the thread's lf_dual (z
 *    units); lf_block_dual merges them (lf_block_dual_acc: the same on the w-unit states, one
 *    barrier, the warps' records merged by each warp's lanes, lf_dual_acc_merge_warp);
 *    lf_dual_final (lossfuse.h) gives lse, entropies, KLs.
 *    Pass 2 (JSD and TVD only: they need both lse first): lf_kl_piece_stats2 / lf_kl_edge_stats2
 *        JSD   k_p = sum_j p_j (log p_j - log M_j),  k_q = sum_j q_j (log q_j - log M_j)
 *        TVD   sum_j |p_j - q_j|,  sum_j sgn(p_j - q_j) p_j
 *    JSD's pass 2 is first swept without tests (M held at FLT_MIN or above, the log on MUFU
 *    with subnormals flushed); a thread whose share then sums to a non-finite value (a -inf
 *    entry) sums it again exactly. Each pass 1 and 2 tells its caller whether the thread's
 *    share held special values; where neither did, the gradient of reverse KL and JSD runs
 *    without tests too (lf_kl_piece_grad's `exact`). The tests had compiled to a branch per
 *    pair: JSD's pass 2 went from 31 to 15 instructions per pair, its gradient from 27 to 17
 *    (sm_90 SASS; bench/RESULTS.md, design log 64).
 *    Gradient (lf_kl_coef_make, lf_kl_coef_onto_max, lf_kl_piece_grad, lf_kl_edge_grad):
 *    d loss / d x_s,j =
 *        forward KL, soft CE   a (p_j - q_j)
 *        reverse KL            a p_j (log p_j - log q_j - KL(p || q))
 *        JSD                   a (1 - beta) p_j (log p_j - log M_j - k_p)
 *        TVD                   a p_j (sgn(p_j - q_j) - sum_k sgn(p_k - q_k) p_k) / 2
 *    times dz/dx of the student (1/tau, with the cap (1 - tanh^2(x/c)) / tau); a is the row's
 *    upstream scale. A row whose loss is NaN (or reverse KL +inf) gets an all-NaN gradient.
 *    Every element of a pair is owned by one thread in every pass (unit i by thread i mod
 *    THREADS, edge element e by thread e mod THREADS), so writing the gradient in place over
 *    the student needs no barrier.
 * ========================================================================================== */

enum { LF_SIDE_LOGITS = 0, LF_SIDE_LOGPROBS = 1, LF_SIDE_PROBS = 2 };

typedef struct lf_kl_side {
    int mode;      /* LF_SIDE_* */
    float cap;     /* softcap c (LF_SIDE_LOGITS only; 0: off) */
    float inv_cap; /* 1 / c, or 0 */
} lf_kl_side;

typedef struct lf_kl_xf {
    lf_kl_side s, t;
    float inv_tau;
    float kappa; /* z = kappa * w: inv_tau when LIN, else 1 */
    float cs;    /* kappa * log2(e): w -> log2 units */
} lf_kl_xf;

/* LIN: both sides linear (no cap, no probabilities), the fast form; it must match what the
 * kernel was instantiated with (lf_kl_xf_lin tells). */
static __host__ __device__ __forceinline__ lf_kl_xf lf_kl_xf_make(float tau, int s_mode, float s_cap, int t_mode,
                                                                 float t_cap, bool lin)
{
    lf_kl_xf x;
    x.s.mode = s_mode;
    x.s.cap = s_mode == LF_SIDE_LOGITS && s_cap > 0.0f ? s_cap : 0.0f;
    x.s.inv_cap = x.s.cap > 0.0f ? 1.0f / x.s.cap : 0.0f;
    x.t.mode = t_mode;
    x.t.cap = t_mode == LF_SIDE_LOGITS && t_cap > 0.0f ? t_cap : 0.0f;
    x.t.inv_cap = x.t.cap > 0.0f ? 1.0f / x.t.cap : 0.0f;
    x.inv_tau = 1.0f / tau;
    x.kappa = lin ? x.inv_tau : 1.0f;
    x.cs = x.kappa * LF_LOG2E;
    return x;
}

static __host__ __device__ __forceinline__ bool lf_kl_side_lin(const lf_kl_side &s)
{
    return s.mode == LF_SIDE_LOGPROBS || (s.mode == LF_SIDE_LOGITS && !(s.cap > 0.0f));
}

/* z of one raw value on one side (the exact transform, whatever LIN). Not inlined: the capped
 * and probability forms are the slow path, and inlining tanhf / logf into every unrolled
 * unit loop multiplies the code (and compile time) for nothing. */
static __device__ __noinline__ float lf_kl_z(float x, const lf_kl_side &s, float inv_tau)
{
    if (s.mode == LF_SIDE_PROBS) return logf(x) * inv_tau;
    if (s.cap > 0.0f) return lf_softcap(x, s.cap) * inv_tau;
    return x * inv_tau;
}

/* w of one raw value (see above). */
template <bool LIN>
static __device__ __forceinline__ float lf_kl_w(float x, const lf_kl_side &s, const lf_kl_xf &xf)
{
    return LIN ? x : lf_kl_z(x, s, xf.inv_tau);
}

/* dz/dx of the student at raw x (0 at a masked -inf under the cap). */
static __device__ __noinline__ float lf_kl_dzdx(float x, const lf_kl_xf &xf)
{
    if (!(xf.s.cap > 0.0f)) return xf.inv_tau;
    if (x == -LF_INF_F) return 0.0f;
    const float t = tanhf(x * xf.s.inv_cap);
    return (1.0f - t * t) * xf.inv_tau;
}

/* ---- the span of a row pair ---- */

typedef struct lf_dual_span {
    int32_t head;  /* elements before the body */
    int32_t nunit; /* 8-element units in the body */
    int32_t nedge; /* head + tail elements (all V when the pair cannot be aligned) */
} lf_dual_span;

template <typename TS, typename TT>
static __device__ __forceinline__ lf_dual_span lf_dual_span_make(const TS *xs, const TT *xt, int64_t V)
{
    lf_dual_span sp;
    const uintptr_t as = (uintptr_t)xs, at = (uintptr_t)xt;
    int h = -1;
#pragma unroll
    for (int k = 7; k >= 0; --k)
        if (((as + sizeof(TS) * k) & 15u) == 0 && ((at + sizeof(TT) * k) & 15u) == 0) h = k;
    if (h < 0 || (int64_t)h + 8 > V) {
        sp.head = (int32_t)V; /* no body: every element is an edge element */
        sp.nunit = 0;
        sp.nedge = (int32_t)V;
        return sp;
    }
    sp.head = h;
    sp.nunit = (int32_t)((V - h) / 8);
    sp.nedge = (int32_t)(V - 8 * (int64_t)sp.nunit);
    return sp;
}

/* Element index of edge element e < nedge. */
static __device__ __forceinline__ int32_t lf_dual_edge_index(const lf_dual_span &sp, int32_t e)
{
    return e < sp.head ? e : e + 8 * sp.nunit;
}

/* ---- units in shared memory ---- */

/* 16-byte vectors of one side's part of a piece of PU units. */
template <typename T> static __device__ __forceinline__ int lf_dual_part_vecs(int PU) { return PU * (int)sizeof(T) / 2; }

template <typename T>
static __device__ __forceinline__ void lf_impl_unit_copy(uint4 *part, int i, int PU, const T *src)
{
    lf_cp_async16(part + i, src);
    if (sizeof(T) == 4) lf_cp_async16(part + PU + i, src + 4);
}

template <typename T>
static __device__ __forceinline__ void lf_impl_unit_get(const uint4 *part, int i, int PU, float *f)
{
    lf_elem<T>::unpack(part[i], f);
    if (sizeof(T) == 4) lf_elem<T>::unpack(part[PU + i], f + 4);
}

template <typename T>
static __device__ __forceinline__ typename lf_elem<T>::mx_t lf_impl_unit_mx(typename lf_elem<T>::mx_t m, const uint4 *part,
                                                                             int i, int PU)
{
    m = lf_elem<T>::mx_push(m, part[i]);
    if (sizeof(T) == 4) m = lf_elem<T>::mx_push(m, part[PU + i]);
    return m;
}

/* Issue this thread's copies of units [ub, ue) of both rows (no commit). bs, bt: the piece's
 * student and teacher parts (bt = bs + lf_dual_part_vecs<TS>(PU)). Addresses advance by
 * increments (no 64-bit multiply per unit). */
template <int THREADS, typename TS, typename TT>
static __device__ __forceinline__ void lf_dual_piece_load(uint4 *bs, uint4 *bt, const TS *xs, const TT *xt,
                                                          const lf_dual_span &sp, int ub, int ue, int PU)
{
    const int t0 = (int)threadIdx.x;
    if (ub + t0 >= ue) return;
    const char *gs = reinterpret_cast<const char *>(xs + sp.head + 8 * (int64_t)(ub + t0));
    const char *gt = reinterpret_cast<const char *>(xt + sp.head + 8 * (int64_t)(ub + t0));
    uint32_t ss = (uint32_t)__cvta_generic_to_shared(bs + t0), st = (uint32_t)__cvta_generic_to_shared(bt + t0);
    const uint32_t s2 = 16u * (uint32_t)PU; /* an fp32 side's second half */
    for (int u = ub + t0; u < ue; u += THREADS) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(ss), "l"(gs) : "memory");
        if (sizeof(TS) == 4) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(ss + s2), "l"(gs + 16) : "memory");
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(st), "l"(gt) : "memory");
        if (sizeof(TT) == 4) asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(st + s2), "l"(gt + 16) : "memory");
        ss += 16u * THREADS;
        st += 16u * THREADS;
        gs += 8 * sizeof(TS) * THREADS;
        gt += 8 * sizeof(TT) * THREADS;
    }
}

/* ---- a teacher that is not a row in memory: sparse top-k (examples/kl_distill.cu) ----
 *
 * Offline distillation stores per token only the teacher's top-k (index, log-probability)
 * pairs; the other V - k entries share one value (the spread rest mass, or -inf when it is
 * dropped; lossfuse.h lf_ref_kl_sparse_teacher). Such a teacher is built in the teacher part
 * of a piece (fp32 layout, TT = float, raw values) instead of being copied:
 *     lf_dual_part_load<THREADS, TS>   the student's copies alone (cp.async, owner threads)
 *     lf_dual_part_fill<THREADS>       every unit of the teacher part = the rest value (owners)
 *     __syncthreads()                  the piece's previous readers gone (the fill needs no
 *                                      barrier: a unit's filler is its only reader, as for
 *                                      the copies), and the pair list staged
 *     lf_dual_part_scatter<THREADS>    the top-k entries that fall in the piece (any thread)
 *     __syncthreads() before reading   (a barrier the next job's fill supplies in a pipeline)
 * Edge elements have no unit: keep their teacher values in a small array instead, xt_edge[e]
 * for edge element e (at most 14 of them for a student-only span, lf_dual_span_make(xs, xs,
 * V), whose rows must be element-aligned), filled by the same pair of calls with edge != NULL, and use the _xe forms of the edge
 * functions below. The sweeps then see a dense teacher; nothing else changes. */

/* This thread's cp.async copies of units [ub, ue) of ONE side (no commit). */
template <int THREADS, typename T>
static __device__ __forceinline__ void lf_dual_part_load(uint4 *part, const T *x, const lf_dual_span &sp, int ub, int ue,
                                                         int PU)
{
    for (int u = ub + (int)threadIdx.x; u < ue; u += THREADS) lf_impl_unit_copy<T>(part, u - ub, PU, x + sp.head + 8 * (int64_t)u);
}

/* Units [ub, ue) of an fp32 part set to v, each by its owner thread; edge (if not NULL): its
 * first nedge entries set to v by threads 0 .. nedge - 1. */
template <int THREADS>
static __device__ __forceinline__ void lf_dual_part_fill(uint4 *part, int ub, int ue, float v, int PU, float *edge, int nedge)
{
    const uint4 q = make_uint4(__float_as_uint(v), __float_as_uint(v), __float_as_uint(v), __float_as_uint(v));
    for (int u = ub + (int)threadIdx.x; u < ue; u += THREADS) {
        part[u - ub] = q;
        part[PU + u - ub] = q;
    }
    if (edge)
        for (int e = (int)threadIdx.x; e < nedge; e += THREADS) edge[e] = v;
}

/* The k entries (idx[i], x[i]) that fall in units [ub, ue) written into the fp32 part (and,
 * with edge, those at edge elements into edge[e]); idx must be in [0, V) and distinct. Any
 * thread writes any slot: a barrier must separate it from the fill and from the readers. */
template <int THREADS>
static __device__ __forceinline__ void lf_dual_part_scatter(uint4 *part, int ub, int ue, int PU, const lf_dual_span &sp,
                                                            const int32_t *idx, const float *x, int k, float *edge)
{
    float *f = reinterpret_cast<float *>(part);
    const int32_t body = 8 * sp.nunit;
    for (int i = (int)threadIdx.x; i < k; i += THREADS) {
        const int32_t j = idx[i] - sp.head;
        if (j >= 0 && j < body) {
            const int u = j >> 3, e = j & 7;
            if (u >= ub && u < ue) f[4 * ((e < 4 ? 0 : PU) + u - ub) + (e & 3)] = x[i];
        } else if (edge) {
            edge[j < 0 ? j + sp.head : j - body + sp.head] = x[i];
        }
    }
}

/* ---- pass 1: statistics ---- */

/* A thread's running state, in w units: maxima, sums relative to them, entropy terms
 * u = sum e (w - m), cross terms ra = sum e_s (w_s - w_t), rb = sum e_t (w_t - w_s). */
typedef struct lf_dual_acc {
    float ms, ss, us, ra;
    float mt, st, ut, rb;
} lf_dual_acc;

static __device__ __forceinline__ lf_dual_acc lf_dual_acc_init(void)
{
    lf_dual_acc a;
    a.ms = a.mt = -LF_INF_F;
    a.ss = a.us = a.ra = a.st = a.ut = a.rb = 0.0f;
    return a;
}

/* Move one side's state from maximum *m to m_new >= *m (w units). */
template <bool U = true, bool R = true> /* false: that term is not tracked (left as it is) */
static __device__ __forceinline__ void lf_impl_acc_move(float *m, float *s, float *u, float *r, float m_new, float cs)
{
    if (!(m_new > *m)) return; /* also NaN: the NaN reaches the sums through the terms */
    if (*m == -LF_INF_F) {
        *m = m_new; /* the sums are empty (or hold only masked terms, which are 0) */
        return;
    }
    const float f = m_new == LF_INF_F ? 0.0f : lf_ex2((*m - m_new) * cs);
    const float fs = f * *s; /* scaled first: s (up to 2^128 against a low shift) times the gap
                              * would overflow */
    if (U) *u = fmaf(fs, fmaxf(*m - m_new, -FLT_MAX), f * *u);
    *s = fs;
    if (R) *r = (*r == LF_INF_F || *r == 0.0f) ? *r : *r * f; /* +inf (support mismatch) stays */
    *m = m_new;
}

/* A state's shift in log2 units, held at -FLT_MAX or above: a state whose maximum so far is a
 * 16-bit side's lowest finite value (a finfo.min mask) has m cs = -inf below tau ~1.44, and
 * fmaf(w, cs, -shift) would be -inf + inf = NaN. Held, its entries' terms are 2^-huge = 0, as a
 * masked entry's: their share of the row's mass is below 2^-126 whenever the row has an entry
 * above -FLT_MAX / cs. */
static __device__ __forceinline__ float lf_impl_acc_shift(float m, float cs) { return m == -LF_INF_F ? 0.0f : fmaxf(m * cs, -FLT_MAX); }

/* The rounding of that shift, c = m cs - sh (sh = lf_impl_acc_shift(m, cs)), exact in one FFMA,
 * 0 where |c| is not below 1 (lf_shift_err's rule: an empty side, a held -FLT_MAX shift, NaN,
 * and where |m cs| is 2^24 or more, where half an ulp of it reaches 1). A sum of
 * exp2(w cs - sh) is the sum against m itself times 2^c. */
static __device__ __forceinline__ float lf_impl_acc_shift_err(float m, float cs)
{
    return lf_shift_err(m, lf_impl_acc_shift(m, cs), cs);
}

/* A piece's sums q[0..5] = ss, st, us, ut, ra, rb, taken against the held shifts of a's maxima
 * (lf_impl_acc_shift), added to a, whose sums are relative to its maxima themselves: each side's
 * sums times 2^-c first (lf_impl_acc_shift_err), so that lse = m + log s and the KLs' (ms - mt) +
 * (log ss - log st) do not carry the two shifts' roundings (up to half an ulp of m cs each: 1.3e-6
 * nats at |m| = 40, 3.4e-4 at 1e4, where a KL between close rows may be 1e-3). An FFMA, an EX2 and
 * a few FFMAs per side and piece; in lf_dual_edge_push per edge element (2 EX2 more per element
 * where a pair is read element by element: not measured). +inf cross terms (a support mismatch)
 * stay +inf. */
template <bool ENT>
static __device__ __forceinline__ void lf_impl_acc_fold(lf_dual_acc &a, const float *q, float cs)
{
    const float fs = lf_ex2(-lf_impl_acc_shift_err(a.ms, cs)), ft = lf_ex2(-lf_impl_acc_shift_err(a.mt, cs));
    a.ss = fmaf(q[0], fs, a.ss);
    a.st = fmaf(q[1], ft, a.st);
    if (ENT) {
        a.us = fmaf(q[2], fs, a.us);
        a.ut = fmaf(q[3], ft, a.ut);
    }
    a.ra = (a.ra == LF_INF_F || q[4] == LF_INF_F) ? LF_INF_F : fmaf(q[4], fs, a.ra);
    a.rb = (a.rb == LF_INF_F || q[5] == LF_INF_F) ? LF_INF_F : fmaf(q[5], ft, a.rb);
}

/* Which pass-1 terms a loss needs (the fast sweep computes only those):
 *   LF_DUAL_LSE   neither cross term: the two lse alone (JSD and TVD, whose pass 2 needs only
 *                 those; 2 of pass 1's ~10 instructions per pair fewer than LF_DUAL_RB)
 *   LF_DUAL_RB    rb (forward KL)
 *   LF_DUAL_RA    ra (reverse KL)
 *   LF_DUAL_FULL  both cross terms and both entropy terms (soft CE, or every output wanted)
 * The terms not computed are left 0: the lf_dual_out fields built on them are meaningless.
 * lf_dual_piece_stats's `true` (the share held special values) comes from the terms computed:
 * without a cross term a -inf entry (whose exponential is 0, exactly what the lse needs) is
 * not seen, so a caller of LF_DUAL_LSE must learn of -inf entries elsewhere before it takes a
 * fast gradient form (JSD's fast pass 2 does: lf_kl_piece_stats2 returns true for them). */
enum { LF_DUAL_LSE = 0, LF_DUAL_RB = 1, LF_DUAL_RA = 2, LF_DUAL_FULL = 3 };

/* Both sides of a state moved onto (Ms, Mt), only the terms TERMS tracks (the others stay 0). */
template <int TERMS>
static __device__ __forceinline__ void lf_impl_acc_move2(lf_dual_acc &a, float Ms, float Mt, float cs)
{
    constexpr bool ENT = TERMS == LF_DUAL_FULL;
    lf_impl_acc_move<ENT, (TERMS & LF_DUAL_RA) != 0>(&a.ms, &a.ss, &a.us, &a.ra, Ms, cs);
    lf_impl_acc_move<ENT, (TERMS & LF_DUAL_RB) != 0>(&a.mt, &a.st, &a.ut, &a.rb, Mt, cs);
}

/* One pair with the exact conventions (lossfuse.h §3b), maxima already covering it. */
template <bool ENT>
static __device__ __forceinline__ void lf_impl_dual_terms(float ws, float wt, float ms, float mt, float shs, float sht,
                                                          float cs, float *ss, float *st, float *us, float *ut, float *ra,
                                                          float *rb)
{
    const float es = lf_ex2(fmaf(ws, cs, -shs)), et = lf_ex2(fmaf(wt, cs, -sht));
    *ss += es;
    *st += et;
    if (ENT) {
        *us += ws > -LF_INF_F ? es * (ws - ms) : 0.0f;
        *ut += wt > -LF_INF_F ? et * (wt - mt) : 0.0f;
    }
    *ra += ws > -LF_INF_F ? (wt == -LF_INF_F ? LF_INF_F : es * (ws - wt)) : 0.0f;
    *rb += wt > -LF_INF_F ? (ws == -LF_INF_F ? LF_INF_F : et * (wt - ws)) : 0.0f;
}

/* Push one pair (an edge element): w values of student and teacher. */
template <bool ENT>
static __device__ __forceinline__ void lf_dual_edge_push(lf_dual_acc &a, float ws, float wt, float cs)
{
    lf_impl_acc_move(&a.ms, &a.ss, &a.us, &a.ra, fmaxf(a.ms, ws), cs);
    lf_impl_acc_move(&a.mt, &a.st, &a.ut, &a.rb, fmaxf(a.mt, wt), cs);
    float q[6] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    lf_impl_dual_terms<ENT>(ws, wt, a.ms, a.mt, lf_impl_acc_shift(a.ms, cs), lf_impl_acc_shift(a.mt, cs), cs, &q[0],
                            &q[1], &q[2], &q[3], &q[4], &q[5]);
    lf_impl_acc_fold<ENT>(a, q, cs); /* onto the maxima themselves */
}

/* Internal: the sums of this thread's units of a piece with the shifts a.ms, a.mt (w units),
 * the fast way (no special-value tests), into p[0..5] = ss, st, us, ut, ra, rb. */
template <int THREADS, typename TS, typename TT, bool LIN, int TERMS>
static __device__ __forceinline__ void lf_impl_dual_sweep(const lf_dual_acc &a, const uint4 *bs, const uint4 *bt, int n,
                                                          int PU, const lf_kl_xf &xf, float *p)
{
    constexpr bool ENT = TERMS == LF_DUAL_FULL, RA = (TERMS & LF_DUAL_RA) != 0, RB = (TERMS & LF_DUAL_RB) != 0;
    const float cs = xf.cs, shs = lf_impl_acc_shift(a.ms, cs), sht = lf_impl_acc_shift(a.mt, cs);
    float ss = 0.0f, st = 0.0f, us = 0.0f, ut = 0.0f, ra = 0.0f, rb = 0.0f;
#pragma unroll 2
    for (int i = (int)threadIdx.x; i < n; i += THREADS) {
        float fs[8], ft[8];
        lf_impl_unit_get<TS>(bs, i, PU, fs);
        lf_impl_unit_get<TT>(bt, i, PU, ft);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const float ws = lf_kl_w<LIN>(fs[e], xf.s, xf), wt = lf_kl_w<LIN>(ft[e], xf.t, xf);
            const float es = lf_ex2(fmaf(ws, cs, -shs)), et = lf_ex2(fmaf(wt, cs, -sht));
            const float d = wt - ws;
            ss += es;
            st += et;
            if (RA) ra = fmaf(-es, d, ra);
            if (RB) rb = fmaf(et, d, rb);
            if (ENT) {
                us = fmaf(es, ws - a.ms, us);
                ut = fmaf(et, wt - a.mt, ut);
            }
        }
    }
    p[0] = ss;
    p[1] = st;
    p[2] = us;
    p[3] = ut;
    p[4] = ra;
    p[5] = rb;
}

/* This thread's units of a staged piece of n units, no barrier. TERMS: LF_DUAL_LSE, _RB, _RA
 * or _FULL (above). The sums need a shift per side that no element exceeds by more than ~88 nats
 * (2^127 in exp2 units). Without the entropy terms the shifts are lazy: a thread's maxima so
 * far serve, and on its first piece of a row the maxima of its first unit (8 elements: a
 * packed max, no sweep); the piece is summed in one sweep. Only if a sum then passes 2^64 (an
 * element that far above the shift, or totals grown against a shift far below the row's
 * maximum), or a term is not finite, is the piece's maximum found (packed max over its
 * units), the state moved onto it, and the piece summed again. A shift below a piece's
 * maximum is exact (the state's m is a shift, not necessarily the maximum; lf_dual_final does
 * not care). The 2^64 bound keeps the merges exact enough: a state whose shift lies more than
 * 126 exp2 units below the row's maximum is flushed to 0 when it is moved there (EX2 flushes
 * subnormals), and what it held is then below 2^(64 - 126) of the maximum's own term.
 * Returns true when the share went the long way (the entropy terms, a large sum, or special
 * values: a -inf entry or a NaN); false means every entry of the share is finite, which the
 * fast gradient forms need (lf_kl_piece_grad's `exact`) -- except with LF_DUAL_LSE, whose sums
 * take a -inf entry as the 0 it weighs (no cross term shows it): false then says only that no
 * entry is NaN or +inf (its caller learns of -inf entries from JSD's pass 2). */
template <int THREADS, typename TS, typename TT, bool LIN, int TERMS>
static __device__ __forceinline__ bool lf_dual_piece_stats(lf_dual_acc &a, const uint4 *bs, const uint4 *bt, int n, int PU,
                                                           const lf_kl_xf &xf)
{
    constexpr bool ENT = TERMS == LF_DUAL_FULL, RA = (TERMS & LF_DUAL_RA) != 0, RB = (TERMS & LF_DUAL_RB) != 0;
    const int t0 = (int)threadIdx.x;
    if (t0 >= n) return false;
    const float cs = xf.cs;
    float q[6];
    bool done = false;
    /* Lazy shifts only without the entropy terms: u = sum e (w - m) against a shift m below the
     * maximum by up to 127 / cs makes log s and u / s both ~88 nats, and the entropy, their
     * difference, loses ~88 times the sums' relative error (3.5e-3 nats seen at tau 0.05, an
     * H100, tests/test_kl_gpu --seed 1795323400). With ENT every piece moves the state onto its
     * maximum first, and the cross terms (w_s - w_t, not against a shift) stay lazy-safe. */
    if (!ENT && (a.ms == -LF_INF_F || a.mt == -LF_INF_F)) { /* a first piece: seed from unit t0 */
        const float s0 = lf_kl_w<LIN>(lf_elem<TS>::mx_final(lf_impl_unit_mx<TS>(lf_elem<TS>::mx_init(), bs, t0, PU)), xf.s, xf);
        const float u0 = lf_kl_w<LIN>(lf_elem<TT>::mx_final(lf_impl_unit_mx<TT>(lf_elem<TT>::mx_init(), bt, t0, PU)), xf.t, xf);
        lf_impl_acc_move2<TERMS>(a, fmaxf(a.ms, s0), fmaxf(a.mt, u0), cs);
    }
    if (!ENT && fabsf(a.ms) < LF_INF_F && fabsf(a.mt) < LF_INF_F) {
        lf_impl_dual_sweep<THREADS, TS, TT, LIN, TERMS>(a, bs, bt, n, PU, xf, q);
        /* every new total finite and both sums below 2^64: accepted. A larger sum, an overflow,
         * or a -inf / NaN input, goes the long way. */
        done = a.ss + q[0] < 0x1p64f && a.st + q[1] < 0x1p64f && /* false on NaN */
               fabsf(a.us + q[2]) + fabsf(a.ut + q[3]) + fabsf(a.ra + q[4]) + fabsf(a.rb + q[5]) < LF_INF_F;
    }
    if (!done) {
        typename lf_elem<TS>::mx_t mxs = lf_elem<TS>::mx_init();
        typename lf_elem<TT>::mx_t mxt = lf_elem<TT>::mx_init();
        for (int i = t0; i < n; i += THREADS) {
            mxs = lf_impl_unit_mx<TS>(mxs, bs, i, PU);
            mxt = lf_impl_unit_mx<TT>(mxt, bt, i, PU);
        }
        /* the transforms are non-decreasing: the max of w is w of the max */
        lf_impl_acc_move2<TERMS>(a, fmaxf(a.ms, lf_kl_w<LIN>(lf_elem<TS>::mx_final(mxs), xf.s, xf)),
                                 fmaxf(a.mt, lf_kl_w<LIN>(lf_elem<TT>::mx_final(mxt), xf.t, xf)), cs);
        lf_impl_dual_sweep<THREADS, TS, TT, LIN, TERMS>(a, bs, bt, n, PU, xf, q);
        /* a -inf entry (or an empty side) made a term 0 * inf: sum this share again, exactly.
         * NaN or +inf inputs make the sums NaN, which is the answer anyway. */
        if (lf_isnan_f32(q[2] + q[3] + q[4] + q[5]) && !lf_isnan_f32(q[0] + q[1])) {
            const float shs = lf_impl_acc_shift(a.ms, cs), sht = lf_impl_acc_shift(a.mt, cs);
            q[0] = q[1] = q[2] = q[3] = q[4] = q[5] = 0.0f;
            for (int i = t0; i < n; i += THREADS) {
                float fs[8], ft[8];
                lf_impl_unit_get<TS>(bs, i, PU, fs);
                lf_impl_unit_get<TT>(bt, i, PU, ft);
                for (int e = 0; e < 8; ++e)
                    lf_impl_dual_terms<ENT>(lf_kl_w<LIN>(fs[e], xf.s, xf), lf_kl_w<LIN>(ft[e], xf.t, xf), a.ms, a.mt,
                                            shs, sht, cs, &q[0], &q[1], &q[2], &q[3], &q[4], &q[5]);
            }
            if (!RA) q[4] = 0.0f;
            if (!RB) q[5] = 0.0f;
        }
    }
    lf_impl_acc_fold<ENT>(a, q, cs); /* onto the maxima themselves */
    return !done;
}

/* The thread's state as an lf_dual of z (lossfuse.h §3b). */
static __device__ __forceinline__ lf_dual lf_dual_acc_final(const lf_dual_acc &a, const lf_kl_xf &xf)
{
    const float k = xf.kappa;
    lf_dual d;
    d.a.m = a.ms * k;
    d.a.s = a.ss;
    d.a.u = a.us * k;
    d.b.m = a.mt * k;
    d.b.s = a.st;
    d.b.u = a.ut * k;
    d.ra = a.ra * k;
    d.rb = a.rb * k;
    return d;
}

static __device__ __forceinline__ lf_dual lf_impl_shfl(lf_dual v, int o)
{
    v.a = lf_impl_shfl(v.a, o);
    v.b = lf_impl_shfl(v.b, o);
    v.ra = lf_impl_shfl(v.ra, o);
    v.rb = lf_impl_shfl(v.rb, o);
    return v;
}
struct lf_impl_op_dual {
    __device__ __forceinline__ lf_dual operator()(lf_dual a, lf_dual b) const { return lf_dual_merge(a, b); }
};
static __device__ __forceinline__ float2 lf_impl_shfl(float2 v, int o)
{
    v.x = lf_impl_shfl(v.x, o);
    v.y = lf_impl_shfl(v.y, o);
    return v;
}
struct lf_impl_op_sum2 {
    __device__ __forceinline__ float2 operator()(float2 a, float2 b) const { return make_float2(a.x + b.x, a.y + b.y); }
};

/* Block merge of the threads' lf_dual (section 3's barrier rule; scratch: THREADS/32). */
template <int THREADS> static __device__ __forceinline__ lf_dual lf_block_dual(lf_dual v, lf_dual *scratch)
{
    return lf_impl_block_allreduce<THREADS>(v, scratch, lf_impl_op_dual(), 0);
}
/* The dual merges' maxima (lf_dual_acc_merge_warp, lf_block_dual_acc) are one redux.sync each
 * (lf_warp_max_f32_redux), not shuffle butterflies: the same bits, and 1-3 points of copy off
 * forward / reverse KL's row path on an H200 (bench/RESULTS.md, design log 74). */

/* n <= 32 states (w units) merged by one warp, every lane ending with the same bits: lane i
 * takes record i mod W (W: n rounded up to a power of two; lanes past n within W take an empty
 * record), the warp finds the common maxima (redux.sync), each lane moves its record onto
 * them (one EX2 per side) and the sums meet in a butterfly. Each level adds the same two
 * values in both lanes of a pair, and float addition is commutative, so every lane has the
 * same result, run to run, whatever the warp's timing. A cross term that is +inf (a support
 * mismatch) stays +inf. All 32 lanes of the warp must call it, with the same r and n. TERMS
 * (LF_DUAL_RB, _RA, _FULL): only the sums that set tracks are merged; a term outside it is
 * left as the lane's own record had it (meaningless, as in lf_dual_piece_stats). */
template <int TERMS = LF_DUAL_FULL>
static __device__ __forceinline__ lf_dual_acc lf_dual_acc_merge_warp(const lf_dual_acc *r, int n, float cs)
{
    constexpr bool ENT = TERMS == LF_DUAL_FULL, RA = (TERMS & LF_DUAL_RA) != 0, RB = (TERMS & LF_DUAL_RB) != 0;
    int w = 1;
    while (w < n) w <<= 1;
    const int i = (int)(threadIdx.x & 31u) & (w - 1);
    lf_dual_acc v = i < n ? r[i] : lf_dual_acc_init();
    /* the maxima over all 32 lanes: lane l holds record l mod W, so that is the W records' */
    const float Ms = lf_warp_max_f32_redux(v.ms);
    const float Mt = lf_warp_max_f32_redux(v.mt);
    lf_impl_acc_move2<TERMS>(v, Ms, Mt, cs);
    v.ms = Ms; /* also where a move had nothing to do (an empty record, a NaN maximum) */
    v.mt = Mt;
    for (int o = w >> 1; o > 0; o >>= 1) {
        v.ss += lf_impl_shfl(v.ss, o);
        v.st += lf_impl_shfl(v.st, o);
        if (ENT) {
            v.us += lf_impl_shfl(v.us, o);
            v.ut += lf_impl_shfl(v.ut, o);
        }
        if (RA) {
            const float ra = lf_impl_shfl(v.ra, o);
            v.ra = (v.ra == LF_INF_F || ra == LF_INF_F) ? LF_INF_F : v.ra + ra;
        }
        if (RB) {
            const float rb = lf_impl_shfl(v.rb, o);
            v.rb = (v.rb == LF_INF_F || rb == LF_INF_F) ? LF_INF_F : v.rb + rb;
        }
    }
    return v;
}

/* The same merge for a block, on the threads' lf_dual_acc (w units), one barrier: each warp
 * takes its maxima (redux.sync), moves its lanes' sums onto them (one EX2 per side) and sums
 * them (shuffles); lane 0 posts the warp's record; after the barrier each warp merges the
 * warps' records (lf_dual_acc_merge_warp) — the same bits in every thread, run to run.
 * scratch: THREADS/32 records; the caller owes a barrier before reusing it (or alternates
 * two). bar: as section 3 (0: __syncthreads; k: named barrier k of THREADS threads, for a warp
 * group). Returns the block's state in w units (the terms of TERMS, as lf_dual_acc_merge_warp). */
template <int THREADS, int TERMS = LF_DUAL_FULL>
static __device__ __forceinline__ lf_dual_acc lf_block_dual_acc(lf_dual_acc a, float cs, lf_dual_acc *scratch, int bar = 0)
{
    constexpr bool ENT = TERMS == LF_DUAL_FULL, RA = (TERMS & LF_DUAL_RA) != 0, RB = (TERMS & LF_DUAL_RB) != 0;
    const float ms = lf_warp_max_f32_redux(a.ms);
    const float mt = lf_warp_max_f32_redux(a.mt);
    lf_impl_acc_move2<TERMS>(a, ms, mt, cs);
    a.ms = ms; /* the warp's maxima (also where a move had nothing to do) */
    a.mt = mt;
    a.ss = lf_warp_sum_f32(a.ss);
    a.st = lf_warp_sum_f32(a.st);
    if (ENT) {
        a.us = lf_warp_sum_f32(a.us);
        a.ut = lf_warp_sum_f32(a.ut);
    }
    if (RA) a.ra = lf_warp_sum_f32(a.ra);
    if (RB) a.rb = lf_warp_sum_f32(a.rb);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = a;
    lf_block_bar<THREADS>(bar);
    return lf_dual_acc_merge_warp<TERMS>(scratch, THREADS / 32, cs);
}

/* Block sum of two floats at once (pass 2's pair of sums); bar as lf_block_dual_acc. */
template <int THREADS> static __device__ __forceinline__ float2 lf_block_sum2_f32(float2 v, float2 *scratch, int bar = 0)
{
    return lf_impl_block_allreduce<THREADS>(v, scratch, lf_impl_op_sum2(), bar);
}

/* ---- the per-row coefficients, pass 2, the gradient ---- */

typedef struct lf_kl_coef {
    int kind;     /* lf_kl_kind (JSD with beta 0 / 1 already mapped to forward / reverse) */
    float beta;   /* JSD */
    float cs;     /* w -> log2 units */
    float ks, kt; /* lse_s, lse_t in log2 units: p_j = 2^(w_j cs - ks) (the 16-bit students' form) */
    float hs, ls; /* ks as two floats, ks = hs + ls: hs the student maximum's shift moved up by
                   * its sum's binary exponent, |ls| < ~1.5 (lf_impl_kl_lse_split), so that p_j =
                   * 2^((w_j cs - hs) - ls) (the fp32 students' form, lf_kl_split; hs = ks, ls = 0
                   * until lf_kl_coef_onto_max) */
    float ht, lt; /* the same for the teacher's kt */
    float c3;     /* reverse: KL(p||q) log2(e); JSD: k_p log2(e) (after pass 2); TVD: sum sgn(p-q) p */
    float a;      /* gradient scale, times the kind's constant (ln 2, (1 - beta) ln 2, 1/2) and,
                   * when LIN, 1/tau; NaN poisons the row */
} lf_kl_coef;

/* g: the row's upstream scale (reduction, weight, tau^2 ...), o: the merged pass-1 result.
 * Pass 2's c3 is filled in later (lf_kl_coef_set_stats2). The lse are taken as one float each
 * (ks, kt); lf_kl_coef_onto_max (below) takes them apart at the maxima, which an fp32 student's
 * gradient needs. */
static __device__ __forceinline__ lf_kl_coef lf_kl_coef_make(int kind, float beta, float g, const lf_dual_out &o,
                                                             const lf_kl_xf &xf, bool lin)
{
    lf_kl_coef c;
    c.kind = kind;
    c.beta = beta;
    c.cs = xf.cs;
    /* rounded products (__fmul_rn): where the compiler sees them it may fuse one with a later
     * subtraction (FMA contraction) in one kernel and not in another, and a row gets different
     * bits in the cluster and side kernels. Seen once reverse KL's fast gradient used
     * c.kt - c.ks - c.c3 (test_kl_gpu's side-CTA determinism checks failed until it was
     * computed with __fsub_rn); rounding the products here covers every use. */
    c.ks = __fmul_rn(o.lse_a, LF_LOG2E);
    c.kt = __fmul_rn(o.lse_b, LF_LOG2E);
    c.hs = c.ks;
    c.ht = c.kt;
    c.ls = c.lt = 0.0f;
    c.c3 = kind == LF_KL_REVERSE ? __fmul_rn(o.kl_rev, LF_LOG2E) : 0.0f;
    float k = kind == LF_KL_REVERSE ? LF_LN2 : kind == LF_KL_JSD ? (1.0f - beta) * LF_LN2 : kind == LF_KL_TVD ? 0.5f : 1.0f;
    c.a = g * k * (lin ? xf.inv_tau : 1.0f);
    /* reverse KL: a KL of +inf (a support mismatch), or one whose log2 form c3 overflows (past
     * FLT_MAX ln 2 nats: the gradient's log-ratio terms, in log2 units, cannot hold it; every
     * element would be -p_j FLT_MAX), poisons the row (c3 is 0 for the other kinds); the loss
     * the caller takes from o.kl_rev is made +inf as well by lf_kl_rev_fit (below) */
    const bool bad = !(fabsf(o.lse_a) < LF_INF_F) || !(fabsf(o.lse_b) < LF_INF_F) || !(c.c3 < LF_INF_F) ||
                     lf_isnan_f32(o.kl_fwd);
    if (bad) c.a = NAN;
    return c;
}

/* Reverse KL where the teacher alone is at its floor under the student's mass: a finite KL past
 * FLT_MAX ln 2 (~2.36e38 nats) cannot be carried by the gradient, whose log-ratio terms are in
 * log2 units (c3 = KL log2 e would be +inf, and every element of the row -p_j FLT_MAX: finite
 * and wrong). Such a row is a support mismatch: +inf loss here, NaN gradient (lf_kl_coef_make's
 * check of c3). Apply it to a reverse-KL launch's row statistics before the loss is taken from
 * them; a per-row kl_rev output of another kind's launch keeps the finite value. */
static __device__ __forceinline__ void lf_kl_rev_fit(int kind, lf_dual_out &d)
{
    if (kind == LF_KL_REVERSE && d.kl_rev < LF_INF_F && !(__fmul_rn(d.kl_rev, LF_LOG2E) < LF_INF_F)) d.kl_rev = LF_INF_F;
}

/* One side's lse in log2 units as hi + lo: hi the maximum's shift h moved up by the exponent e
 * of its sum s = f 2^e (f in [0.5, 1): frexpf), lo = log2 f + (m cs - h) + the rounding of h + e
 * (a two-sum: hi + r = h + e exactly). So |lo| < ~1.5 whatever s, and log2 s (up to ~64 where a
 * pass kept a lazy shift below the maximum) adds no rounding of its own size. */
static __device__ __forceinline__ void lf_impl_kl_lse_split(float m, float s, float cs, float *hi, float *lo)
{
    const float h = lf_impl_acc_shift(m, cs);
    int e;
    const float f = frexpf(s, &e), E = (float)e;
    const float H = __fadd_rn(h, E), b = __fsub_rn(H, h);
    const float r = __fadd_rn(__fsub_rn(h, __fsub_rn(H, b)), __fsub_rn(E, b));
    *hi = H;
    *lo = __fadd_rn(__fadd_rn(log2f(f), lf_shift_err(m, h, cs)), r);
}

/* The coefficients' lse taken apart at each side's maximum, from the row's merged pass-1 state
 * a (w units, its sums relative to the maxima themselves: lf_impl_acc_fold): ks = hs + ls, kt
 * = ht + lt (lf_impl_kl_lse_split: hs the shift of ms moved up by ss's binary exponent, |ls| <
 * ~1.5). One float ks = lse log2(e) carries ~2^-24 |ks| of rounding into every p_j =
 * 2^(w_j cs - ks): 2^-24 |lse| relative (6e-4 at |lse| = 1e4), shown by an fp32 student's
 * gradient (and by JSD's and TVD's second pass) and, in reverse KL's log2 p_j - log2 q_j,
 * absolute. Taken apart, p_j = 2^((w_j cs - hs) - ls) has an exponent error of ~2^-24 (|log2
 * p_j| + 2), small wherever p_j is not, whatever the shift the passes kept (the maximum, or up
 * to ~64 log2 units below it where a pass without the entropy terms kept a lazy shift: ss, summed
 * against it, carries that shift's ~2^-24 64 itself). The form of the passes and gradients for
 * an fp32 student (lf_kl_split; one FADD per side and pair more than the 16-bit students' form,
 * which takes ks = hs + ls as one float, below their rounding for |ks| up to ~2^14). Per row:
 * two frexpf, two log2f and a dozen FADDs. Call it after lf_kl_coef_make (and before
 * lf_kl_coef_set_stats2 is given pass 2's sums); a side without a distribution (ss not above 0,
 * a maximum not finite) leaves the coefficients as they are (c.a is NaN there). */
static __device__ __forceinline__ void lf_kl_coef_onto_max(lf_kl_coef &c, const lf_dual_acc &a)
{
    /* on the state, not on c.a: a row whose scale alone is NaN (a NaN dloss) keeps the split form
     * of its JSD / TVD pass 2, as the forward-only launch of the same row does */
    if (!(a.ss > 0.0f) || !(a.st > 0.0f) || !(fabsf(a.ms) < LF_INF_F) || !(fabsf(a.mt) < LF_INF_F)) return;
    lf_impl_kl_lse_split(a.ms, a.ss, c.cs, &c.hs, &c.ls);
    lf_impl_kl_lse_split(a.mt, a.st, c.cs, &c.ht, &c.lt);
    c.ks = c.hs + c.ls;
    c.kt = c.ht + c.lt;
}

/* Whether the passes and gradients of a student of type TS take p_j and q_j in the split form
 * (lf_kl_coef_onto_max): an fp32 student, whose gradient would show the one-float lse's
 * rounding. */
template <typename TS> struct lf_kl_split {
    static constexpr bool value = sizeof(TS) == 4;
};

/* log2 p_j and log2 q_j of one pair (w values), in the split form or the one-float form */
template <bool SPLIT> static __device__ __forceinline__ float lf_impl_kl_l2s(const lf_kl_coef &c, float ws)
{
    return SPLIT ? fmaf(ws, c.cs, -c.hs) - c.ls : fmaf(ws, c.cs, -c.ks);
}
template <bool SPLIT> static __device__ __forceinline__ float lf_impl_kl_l2t(const lf_kl_coef &c, float wt)
{
    return SPLIT ? fmaf(wt, c.cs, -c.ht) - c.lt : fmaf(wt, c.cs, -c.kt);
}

/* p and q of one pair (w values) with their log2: lp2, lq2. (q on the FMA pipe, lf_ex2_fma, for
 * part of JSD's pairs did not pay: bench/RESULTS.md, design log 65.) */
template <bool SPLIT>
static __device__ __forceinline__ void lf_impl_kl_pq(const lf_kl_coef &c, float ws, float wt, float *lp2, float *lq2,
                                                     float *p, float *q)
{
    *lp2 = lf_impl_kl_l2s<SPLIT>(c, ws);
    *lq2 = lf_impl_kl_l2t<SPLIT>(c, wt);
    *p = lf_ex2(*lp2);
    *q = lf_ex2(*lq2);
}

/* log2 on MUFU with subnormal inputs flushed (log2 of 0 or a subnormal is -inf). */
static __device__ __forceinline__ float lf_lg2(float x)
{
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* Pass 2 terms of one pair, added to (x, y): JSD (k_p, k_q) in log2 units, TVD (|p-q|, sgn p),
 * with the exact conventions (0 log 0 = 0; a masked entry adds nothing). */
template <int KIND, bool SPLIT>
static __device__ __forceinline__ void lf_impl_kl_stats2_exact(const lf_kl_coef &c, float ws, float wt, float *x, float *y)
{
    float lp2, lq2, p, q;
    lf_impl_kl_pq<SPLIT>(c, ws, wt, &lp2, &lq2, &p, &q);
    if (KIND == LF_KL_JSD) {
        const float lm2 = __log2f(fmaf(c.beta, q - p, p)); /* beta q + (1 - beta) p */
        *x += p > 0.0f ? p * (lp2 - lm2) : 0.0f;
        *y += q > 0.0f ? q * (lq2 - lm2) : 0.0f;
    } else {
        const float d = p - q;
        *x += fabsf(d);
        *y += d > 0.0f ? p : d < 0.0f ? -p : 0.0f;
    }
}

template <bool SPLIT>
static __device__ __forceinline__ void lf_impl_kl_stats2(const lf_kl_coef &c, float ws, float wt, float *x, float *y)
{
    if (c.kind == LF_KL_JSD) lf_impl_kl_stats2_exact<LF_KL_JSD, SPLIT>(c, ws, wt, x, y);
    else lf_impl_kl_stats2_exact<LF_KL_TVD, SPLIT>(c, ws, wt, x, y);
}

/* log2 M_j = log2(beta q_j + (1 - beta) p_j) without tests, for finite w: M is held at or above
 * FLT_MIN, so the log is finite where both p and q flushed to 0 (p (lp2 - lm2) is then 0, not
 * 0 * inf). Only pairs with M below FLT_MIN change: then p < FLT_MIN / (1 - beta), and its term
 * moves by at most p log2(1 / (1 - beta)) (q's likewise with beta): ~2^-125 at beta = 0.5. */
static __device__ __forceinline__ float lf_impl_kl_lm2_fast(const lf_kl_coef &c, float p, float q)
{
    return lf_lg2(fmaxf(fmaf(c.beta, q - p, p), FLT_MIN));
}

/* JSD's kept differences (lf_kl_piece_stats2 / lf_kl_piece_grad, `keep`): for units i < nkeep
 * of a piece, the 8 values log2 p_j - log2 M_j of pass 2 as fp32, in two planes of nkeep 16-byte
 * vectors (pairs 0-3 of unit i at keep[i], 4-7 at keep[nkeep + i]: a warp's accesses are
 * consecutive vectors, no bank conflict). The thread that sums unit i in pass 2 is the one that
 * writes its gradient (both loops give unit i to thread i mod THREADS), so no barrier is needed
 * between the two. */
static __device__ __forceinline__ void lf_impl_kept_put(uint4 *keep, int i, int nkeep, const float *d)
{
    keep[i] = make_uint4(__float_as_uint(d[0]), __float_as_uint(d[1]), __float_as_uint(d[2]), __float_as_uint(d[3]));
    keep[nkeep + i] = make_uint4(__float_as_uint(d[4]), __float_as_uint(d[5]), __float_as_uint(d[6]), __float_as_uint(d[7]));
}
static __device__ __forceinline__ void lf_impl_kept_get(const uint4 *keep, int i, int nkeep, float *d)
{
    const uint4 a = keep[i], b = keep[nkeep + i];
    d[0] = __uint_as_float(a.x), d[1] = __uint_as_float(a.y), d[2] = __uint_as_float(a.z), d[3] = __uint_as_float(a.w);
    d[4] = __uint_as_float(b.x), d[5] = __uint_as_float(b.y), d[6] = __uint_as_float(b.z), d[7] = __uint_as_float(b.w);
}

/* The fast JSD sweep of this thread's units: no tests (2 EX2, 1 LG2, 9 FP32 operations per pair
 * against the exact form's 4 tests, 2 selects and the subnormal handling of __log2f, which the
 * compiler makes a branch per pair). A -inf entry makes a term 0 * -inf = NaN: the caller then
 * sums the share again exactly. Units i < nkeep also store their log2 p - log2 M into keep. */
template <int THREADS, typename TS, typename TT, bool LIN>
static __device__ __forceinline__ void lf_impl_jsd_sweep2(float2 &s, const uint4 *bs, const uint4 *bt, int n, int PU,
                                                          const lf_kl_xf &xf, const lf_kl_coef &c, uint4 *keep, int nkeep)
{
    constexpr bool SPLIT = lf_kl_split<TS>::value;
    /* two loops, so that the units not kept run the loop without the stores (a test per unit
     * and 8 more live values cost JSD 1-2 points of copy on an H100, design log 73) */
    int i = (int)threadIdx.x;
    for (const int nk = min(n, nkeep); i < nk; i += THREADS) {
        float fs[8], ft[8], d[8];
        lf_impl_unit_get<TS>(bs, i, PU, fs);
        lf_impl_unit_get<TT>(bt, i, PU, ft);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            float lp2, lq2, p, q;
            lf_impl_kl_pq<SPLIT>(c, lf_kl_w<LIN>(fs[e], xf.s, xf), lf_kl_w<LIN>(ft[e], xf.t, xf), &lp2, &lq2, &p, &q);
            const float lm2 = lf_impl_kl_lm2_fast(c, p, q);
            d[e] = lp2 - lm2;
            s.x = fmaf(p, d[e], s.x);
            s.y = fmaf(q, lq2 - lm2, s.y);
        }
        lf_impl_kept_put(keep, i, nkeep, d);
    }
    for (; i < n; i += THREADS) {
        float fs[8], ft[8];
        lf_impl_unit_get<TS>(bs, i, PU, fs);
        lf_impl_unit_get<TT>(bt, i, PU, ft);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            float lp2, lq2, p, q;
            lf_impl_kl_pq<SPLIT>(c, lf_kl_w<LIN>(fs[e], xf.s, xf), lf_kl_w<LIN>(ft[e], xf.t, xf), &lp2, &lq2, &p, &q);
            const float lm2 = lf_impl_kl_lm2_fast(c, p, q);
            s.x = fmaf(p, lp2 - lm2, s.x);
            s.y = fmaf(q, lq2 - lm2, s.y);
        }
    }
}

/* Pass 2 over this thread's units of a staged piece (JSD or TVD), added to acc. Returns true
 * when the share holds special values (a -inf entry, a NaN): JSD's fast sweep then gave a
 * non-finite sum and the share was summed again with the exact conventions. A caller that
 * keeps the flag for the same units (every pass gives a unit to the same thread) may pass it
 * on to lf_kl_piece_grad (its `exact`), whose fast form needs finite entries. keep / nkeep
 * (JSD; optional, shared memory of 32 x nkeep bytes): the sweep also keeps units i < nkeep's
 * log2 p - log2 M for lf_kl_piece_grad, whose fast form then takes them instead of computing q
 * and log2 M again (2 MUFU operations and ~8 others per pair less; the same bits). */
template <int THREADS, typename TS, typename TT, bool LIN>
static __device__ __forceinline__ bool lf_kl_piece_stats2(float2 &acc, const uint4 *bs, const uint4 *bt, int n, int PU,
                                                          const lf_kl_xf &xf, const lf_kl_coef &c, uint4 *keep = nullptr,
                                                          int nkeep = 0)
{
    constexpr bool SPLIT = lf_kl_split<TS>::value;
    float2 s = make_float2(0.0f, 0.0f);
    bool special = false;
    if (c.kind == LF_KL_JSD) {
        lf_impl_jsd_sweep2<THREADS, TS, TT, LIN>(s, bs, bt, n, PU, xf, c, keep, keep ? nkeep : 0);
        special = !(fabsf(s.x) + fabsf(s.y) < LF_INF_F); /* also NaN */
    }
    if (c.kind != LF_KL_JSD || special) {
        s = make_float2(0.0f, 0.0f);
        for (int i = (int)threadIdx.x; i < n; i += THREADS) {
            float fs[8], ft[8];
            lf_impl_unit_get<TS>(bs, i, PU, fs);
            lf_impl_unit_get<TT>(bt, i, PU, ft);
            if (c.kind == LF_KL_JSD) {
                for (int e = 0; e < 8; ++e)
                    lf_impl_kl_stats2_exact<LF_KL_JSD, SPLIT>(c, lf_kl_w<LIN>(fs[e], xf.s, xf), lf_kl_w<LIN>(ft[e], xf.t, xf),
                                                              &s.x, &s.y);
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e)
                    lf_impl_kl_stats2_exact<LF_KL_TVD, SPLIT>(c, lf_kl_w<LIN>(fs[e], xf.s, xf), lf_kl_w<LIN>(ft[e], xf.t, xf),
                                                              &s.x, &s.y);
            }
        }
    }
    acc.x += s.x;
    acc.y += s.y;
    return special;
}

/* Pass 2's merged sums into the coefficients (and the loss they give: JSD in nats, TVD). */
static __device__ __forceinline__ float lf_kl_coef_set_stats2(lf_kl_coef &c, float2 sums)
{
    if (c.kind == LF_KL_JSD) {
        c.c3 = sums.x;
        return LF_LN2 * fmaf(c.beta, sums.y - sums.x, sums.x); /* beta k_q + (1 - beta) k_p */
    }
    c.c3 = sums.y;
    return 0.5f * sums.x;
}

/* d loss / d w_s of one pair, before the scale a and dz/dx; KIND a compile-time lf_kl_kind so
 * that the unit loops carry no per-element switch (lf_kl_piece_grad dispatches once). EXACT:
 * the conventions for -inf entries (a masked student entry has gradient 0, not 0 * -inf); the
 * fast form (EXACT false) has no tests and needs finite entries. */
template <int KIND, bool EXACT, bool SPLIT>
static __device__ __forceinline__ float lf_impl_kl_grad(const lf_kl_coef &c, float ws, float wt)
{
    float lp2, lq2, p, q;
    lf_impl_kl_pq<SPLIT>(c, ws, wt, &lp2, &lq2, &p, &q);
    /* the fast form (no test per pair): an entry at a side's lowest finite value (a finfo.min
     * mask) overflows w log2(e) / tau, and p = 0 times an infinite bracket would be NaN: where
     * the student is at it (p = 0, bracket -inf), and where the teacher is at it with the
     * student's p_j flushed to 0 (far below its maximum: bf16 rows at tau 1 from ~87 nats).
     * A 16-bit student takes the bracket from ws - wt (two 16-bit values: exact unless far
     * apart) and the row's k = kt - ks - c3 (formed here, not per row: a per-row term for every
     * kind cost forward KL 0.7-1.9% on an H200, where these kernels serve every kind), each
     * multiplied by p before they join: p (ws - wt) is finite, 0 where p is, and so is p k (c3
     * finite: lf_kl_coef_make). As many operations as the bracket held at -FLT_MAX and then
     * multiplied (a select on p > 0 instead cost reverse KL 2.6-3.3% on an H200). Where the
     * teacher alone is at the floor under the student's mass, this gives the reference's finite
     * value where it fits a float (the exact form: +inf). An fp32 student never takes this form
     * (lf_kl_piece_grad): ws - wt of two fp32 values rounds by 2^-24 |ws - wt|, which would bring
     * back the distance of the two maxima that the split form takes out. */
    if (KIND == LF_KL_REVERSE) {
        if (EXACT || SPLIT) return p > 0.0f ? p * (lp2 - lq2 - c.c3) : 0.0f;
        return fmaf(__fmul_rn(p, ws - wt), c.cs, __fmul_rn(p, c.kt - c.ks - c.c3)); /* (rounded: never contracted) */
    }
    if (KIND == LF_KL_JSD) {
        if (!EXACT) return p * (lp2 - lf_impl_kl_lm2_fast(c, p, q) - c.c3);
        const float lm2 = __log2f(fmaf(c.beta, q - p, p));
        return p > 0.0f ? p * (lp2 - lm2 - c.c3) : 0.0f;
    }
    if (KIND == LF_KL_TVD) {
        const float d = p - q;
        return p * ((d > 0.0f ? 1.0f : d < 0.0f ? -1.0f : 0.0f) - c.c3);
    }
    return p - q; /* forward KL, soft CE */
}

template <bool SPLIT>
static __device__ __forceinline__ float lf_impl_kl_grad_any(const lf_kl_coef &c, float ws, float wt)
{
    switch (c.kind) {
    case LF_KL_REVERSE: return lf_impl_kl_grad<LF_KL_REVERSE, true, SPLIT>(c, ws, wt);
    case LF_KL_JSD: return lf_impl_kl_grad<LF_KL_JSD, true, SPLIT>(c, ws, wt);
    case LF_KL_TVD: return lf_impl_kl_grad<LF_KL_TVD, true, SPLIT>(c, ws, wt);
    default: return lf_impl_kl_grad<LF_KL_FORWARD, true, SPLIT>(c, ws, wt);
    }
}

/* Store unit i's 8 gradient values (16-byte stores when vec_ok). */
template <typename TS>
static __device__ __forceinline__ void lf_impl_kl_unit_store(TS *out, bool vec_ok, const lf_dual_span &sp, int ub, int i,
                                                             const float *g)
{
    TS *dst = out + sp.head + 8 * (int64_t)(ub + i);
    if (vec_ok) {
        lf_st16(reinterpret_cast<uint4 *>(dst), lf_elem<TS>::pack(g));
        if (sizeof(TS) == 4) lf_st16(reinterpret_cast<uint4 *>(dst) + 1, lf_elem<TS>::pack(g + 4));
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) dst[e] = lf_elem<TS>::from_f32(g[e]);
    }
}

template <int THREADS, typename TS, typename TT, bool LIN, int KIND, bool EXACT>
static __device__ __forceinline__ void lf_impl_kl_piece_grad(TS *out, bool vec_ok, const uint4 *bs, const uint4 *bt,
                                                             const lf_dual_span &sp, int ub, int n, int PU,
                                                             const lf_kl_xf &xf, const lf_kl_coef &c,
                                                             const uint4 *keep = nullptr, int nkeep = 0)
{
    constexpr bool SPLIT = lf_kl_split<TS>::value;
    auto unit = [&](int i) { /* the gradient of unit i from the staged pair */
        float fs[8], ft[8], g[8];
        lf_impl_unit_get<TS>(bs, i, PU, fs);
        lf_impl_unit_get<TT>(bt, i, PU, ft);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const float d = lf_impl_kl_grad<KIND, EXACT, SPLIT>(c, lf_kl_w<LIN>(fs[e], xf.s, xf), lf_kl_w<LIN>(ft[e], xf.t, xf));
            g[e] = LIN ? c.a * d : c.a * d * lf_kl_dzdx(fs[e], xf);
        }
        lf_impl_kl_unit_store<TS>(out, vec_ok, sp, ub, i, g);
    };
    if (KIND == LF_KL_JSD && !EXACT && nkeep > 0) {
        /* units with pass 2's log2 p - log2 M kept: p alone; then the others */
        int i = (int)threadIdx.x;
        for (const int nk = min(n, nkeep); i < nk; i += THREADS) {
            float fs[8], dk[8], g[8];
            lf_impl_unit_get<TS>(bs, i, PU, fs);
            lf_impl_kept_get(keep, i, nkeep, dk);
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                /* lf_impl_kl_grad's fast JSD form, p (lp2 - lm2 - c3), with lp2 - lm2 kept */
                const float p = lf_ex2(lf_impl_kl_l2s<SPLIT>(c, lf_kl_w<LIN>(fs[e], xf.s, xf))), d = p * (dk[e] - c.c3);
                g[e] = LIN ? c.a * d : c.a * d * lf_kl_dzdx(fs[e], xf);
            }
            lf_impl_kl_unit_store<TS>(out, vec_ok, sp, ub, i, g);
        }
        for (; i < n; i += THREADS) unit(i);
    } else {
        /* (the loop as it was before the kept values: a shared loop cost JSD ~1 point of copy
         * on an H100 at V >= 152K, design log 73) */
        for (int i = (int)threadIdx.x; i < n; i += THREADS) unit(i);
    }
}

/* Gradient of this thread's units [ub, ub + n) of a staged piece, stored to out: the student's
 * row (in place) or another row with the same element alignment when vec_ok (16-byte stores),
 * element by element otherwise. exact = false takes the fast forms of reverse KL and JSD (no
 * tests per pair): only for units known to hold finite entries, i.e. those for which this
 * thread's lf_dual_piece_stats and lf_kl_piece_stats2 both returned false. An fp32 student
 * (lf_kl_split) always takes the exact forms: its log-ratio from the split log2s, as tested.
 * keep / nkeep: what this piece's lf_kl_piece_stats2 kept (JSD's fast form only; the exact
 * form computes all). */
template <int THREADS, typename TS, typename TT, bool LIN>
static __device__ __forceinline__ void lf_kl_piece_grad(TS *out, bool vec_ok, const uint4 *bs, const uint4 *bt,
                                                        const lf_dual_span &sp, int ub, int n, int PU, const lf_kl_xf &xf,
                                                        const lf_kl_coef &c, bool exact = true, const uint4 *keep = nullptr,
                                                        int nkeep = 0)
{
    if (lf_kl_split<TS>::value) exact = true;
    switch (c.kind) {
    case LF_KL_REVERSE:
        if (exact) lf_impl_kl_piece_grad<THREADS, TS, TT, LIN, LF_KL_REVERSE, true>(out, vec_ok, bs, bt, sp, ub, n, PU, xf, c);
        else lf_impl_kl_piece_grad<THREADS, TS, TT, LIN, LF_KL_REVERSE, false>(out, vec_ok, bs, bt, sp, ub, n, PU, xf, c);
        break;
    case LF_KL_JSD:
        if (exact) lf_impl_kl_piece_grad<THREADS, TS, TT, LIN, LF_KL_JSD, true>(out, vec_ok, bs, bt, sp, ub, n, PU, xf, c);
        else lf_impl_kl_piece_grad<THREADS, TS, TT, LIN, LF_KL_JSD, false>(out, vec_ok, bs, bt, sp, ub, n, PU, xf, c, keep,
                                                                                keep ? nkeep : 0);
        break;
    case LF_KL_TVD: lf_impl_kl_piece_grad<THREADS, TS, TT, LIN, LF_KL_TVD, true>(out, vec_ok, bs, bt, sp, ub, n, PU, xf, c); break;
    default: lf_impl_kl_piece_grad<THREADS, TS, TT, LIN, LF_KL_FORWARD, true>(out, vec_ok, bs, bt, sp, ub, n, PU, xf, c); break;
    }
}

/* The edge elements (head, tail, or the whole row of an unaligned pair): thread t takes edge
 * elements t, t + THREADS, ... The teacher's raw value of edge element e (element j) comes
 * from tx(e, j): xt[j] from global memory in the plain forms, xe[e] in the _xe forms (a
 * teacher built in shared memory, above). Pass 1: */
template <int THREADS, typename TS, bool LIN, int TERMS, typename TX>
static __device__ __forceinline__ void lf_impl_dual_edge_stats(lf_dual_acc &a, const TS *xs, TX tx, const lf_dual_span &sp,
                                                               const lf_kl_xf &xf)
{
    for (int e = (int)threadIdx.x; e < sp.nedge; e += THREADS) {
        const int32_t j = lf_dual_edge_index(sp, e);
        lf_dual_edge_push<TERMS == LF_DUAL_FULL>(a, lf_kl_w<LIN>(lf_elem<TS>::to_f32(xs[j]), xf.s, xf),
                                                 lf_kl_w<LIN>(tx(e, j), xf.t, xf), xf.cs);
    }
}

/* ... pass 2: */
template <int THREADS, typename TS, bool LIN, typename TX>
static __device__ __forceinline__ void lf_impl_kl_edge_stats2(float2 &acc, const TS *xs, TX tx, const lf_dual_span &sp,
                                                              const lf_kl_xf &xf, const lf_kl_coef &c)
{
    for (int e = (int)threadIdx.x; e < sp.nedge; e += THREADS) {
        const int32_t j = lf_dual_edge_index(sp, e);
        lf_impl_kl_stats2<lf_kl_split<TS>::value>(c, lf_kl_w<LIN>(lf_elem<TS>::to_f32(xs[j]), xf.s, xf),
                                                  lf_kl_w<LIN>(tx(e, j), xf.t, xf), &acc.x, &acc.y);
    }
}

/* ... and the gradient (out may be xs: each element is read before it is written, by its owner). */
template <int THREADS, typename TS, bool LIN, typename TX>
static __device__ __forceinline__ void lf_impl_kl_edge_grad(TS *out, const TS *xs, TX tx, const lf_dual_span &sp,
                                                            const lf_kl_xf &xf, const lf_kl_coef &c)
{
    for (int e = (int)threadIdx.x; e < sp.nedge; e += THREADS) {
        const int32_t j = lf_dual_edge_index(sp, e);
        const float x = lf_elem<TS>::to_f32(xs[j]);
        const float d = lf_impl_kl_grad_any<lf_kl_split<TS>::value>(c, lf_kl_w<LIN>(x, xf.s, xf), lf_kl_w<LIN>(tx(e, j), xf.t, xf));
        out[j] = lf_elem<TS>::from_f32(LIN ? c.a * d : c.a * d * lf_kl_dzdx(x, xf));
    }
}

template <typename TT> struct lf_impl_tx_row { /* teacher element j of a row in memory */
    const TT *xt;
    __device__ __forceinline__ float operator()(int, int32_t j) const { return lf_elem<TT>::to_f32(xt[j]); }
};
struct lf_impl_tx_edge { /* teacher value of edge element e, kept aside */
    const float *xe;
    __device__ __forceinline__ float operator()(int e, int32_t) const { return xe[e]; }
};

template <int THREADS, typename TS, typename TT, bool LIN, int TERMS>
static __device__ __forceinline__ void lf_dual_edge_stats(lf_dual_acc &a, const TS *xs, const TT *xt,
                                                          const lf_dual_span &sp, const lf_kl_xf &xf)
{
    lf_impl_dual_edge_stats<THREADS, TS, LIN, TERMS>(a, xs, lf_impl_tx_row<TT>{xt}, sp, xf);
}
template <int THREADS, typename TS, typename TT, bool LIN>
static __device__ __forceinline__ void lf_kl_edge_stats2(float2 &acc, const TS *xs, const TT *xt, const lf_dual_span &sp,
                                                         const lf_kl_xf &xf, const lf_kl_coef &c)
{
    lf_impl_kl_edge_stats2<THREADS, TS, LIN>(acc, xs, lf_impl_tx_row<TT>{xt}, sp, xf, c);
}
template <int THREADS, typename TS, typename TT, bool LIN>
static __device__ __forceinline__ void lf_kl_edge_grad(TS *out, const TS *xs, const TT *xt, const lf_dual_span &sp,
                                                       const lf_kl_xf &xf, const lf_kl_coef &c)
{
    lf_impl_kl_edge_grad<THREADS, TS, LIN>(out, xs, lf_impl_tx_row<TT>{xt}, sp, xf, c);
}

/* The _xe forms: the teacher's edge values xe[e] (raw, as in the piece) instead of a row. */
template <int THREADS, typename TS, bool LIN, int TERMS>
static __device__ __forceinline__ void lf_dual_edge_stats_xe(lf_dual_acc &a, const TS *xs, const float *xe,
                                                             const lf_dual_span &sp, const lf_kl_xf &xf)
{
    lf_impl_dual_edge_stats<THREADS, TS, LIN, TERMS>(a, xs, lf_impl_tx_edge{xe}, sp, xf);
}
template <int THREADS, typename TS, bool LIN>
static __device__ __forceinline__ void lf_kl_edge_stats2_xe(float2 &acc, const TS *xs, const float *xe, const lf_dual_span &sp,
                                                            const lf_kl_xf &xf, const lf_kl_coef &c)
{
    lf_impl_kl_edge_stats2<THREADS, TS, LIN>(acc, xs, lf_impl_tx_edge{xe}, sp, xf, c);
}
template <int THREADS, typename TS, bool LIN>
static __device__ __forceinline__ void lf_kl_edge_grad_xe(TS *out, const TS *xs, const float *xe, const lf_dual_span &sp,
                                                          const lf_kl_xf &xf, const lf_kl_coef &c)
{
    lf_impl_kl_edge_grad<THREADS, TS, LIN>(out, xs, lf_impl_tx_edge{xe}, sp, xf, c);
}

/* ============================================================================================
 * 9. Segmented sums, pair scatter-add, histograms (packed sequences, preference losses)
 *
 *    All three are "add values into slots": per-token values into their sequence (cu_seqlens),
 *    per-pair gradient terms into two items (+g into i, -g into j), item masses into bins. Each
 *    comes in two modes (lossfuse.h section 9 has the host references):
 *      fast           lf_atomic_add_aggregated: lanes that add into the same slot are grouped
 *                     (__match_any_sync), their values summed in lane order, one atomicAdd per
 *                     group. Float atomics: the total is exact to rounding but its bits depend
 *                     on the order the atomics land in.
 *      deterministic  no float atomics. Per-sequence sums: lf_seg_sum_grid, one warp per
 *                     sequence, lanes stride its tokens in order, a fixed butterfly (no
 *                     workspace; for short buffers, or inside a kernel that does more); or
 *                     lf_seg_sum_chunked, equal chunks of tokens per warp and a workspace of
 *                     0.04 B per token (for 10^7+ tokens: balanced whatever the lengths,
 *                     bandwidth-bound). Scatter-add
 *                     and histograms: sort the (slot, value) entries by slot with a STABLE sort
 *                     (cub::DeviceRadixSort::SortPairs keeps the input order within a slot),
 *                     then lf_sorted_run_sum_grid sums each slot's run in that order. Bit-
 *                     identical run to run, and the same bits whatever the launch shape.
 *      lf_warp_seg_scan_f32: the segmented inclusive scan within a warp, for kernels that hold
 *                     one token per lane and want one atomic (or one store) per sequence run.
 *    Accumulation in double where the result is a sum over many values (per-lane partials of
 *    lf_seg_sum_grid, lf_seg_sum_chunked and lf_sorted_run_sum_grid); results are float (or
 *    double where the function takes an output type).
 * ========================================================================================== */

/* Inclusive segmented scan over the 32 lanes, segments = runs of equal `seg` in lane order:
 * every lane gets the sum of v over its run up to itself; *last = this lane ends its run (so
 * holds the run's total). Fixed order of additions: deterministic. All 32 lanes must call. */
static __device__ __forceinline__ float lf_warp_seg_scan_f32(float v, int64_t seg, bool *last)
{
    const int lane = (int)(threadIdx.x & 31u);
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float u = __shfl_up_sync(0xffffffffu, v, o);
        const long long s = __shfl_up_sync(0xffffffffu, (long long)seg, o);
        /* a lane o back in the same run: runs are contiguous, so everything between is too */
        if (lane >= o && s == (long long)seg) v += u;
    }
    const long long nxt = __shfl_down_sync(0xffffffffu, (long long)seg, 1);
    *last = lane == 31 || nxt != (long long)seg;
    return v;
}

/* base[slot] += v, one atomicAdd per group of lanes with the same slot (slot < 0: nothing).
 * The lanes of a group need not be adjacent. All 32 lanes must call (v = 0, slot = -1 for a
 * lane with nothing to add). Fast mode: not bit-reproducible (float atomics). */
static __device__ __forceinline__ void lf_atomic_add_aggregated(float *base, int64_t slot, float v)
{
    const unsigned grp = __match_any_sync(0xffffffffu, (unsigned long long)slot);
    const int lane = (int)(threadIdx.x & 31u);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < 32; ++k) {
        const float u = __shfl_sync(0xffffffffu, v, k);
        if ((grp >> k) & 1u) s += u; /* the group's values, in lane order */
    }
    if (slot >= 0 && lane == __ffs((int)grp) - 1) atomicAdd(base + slot, s);
}

/* Adds to the order-free sum *dst (lossfuse.h section 3d, lf_xsum) in global memory, by any
 * thread of any CTA, in any order: the sum's bits do not depend on it. One bucket is held in the
 * thread's registers: adds that fall in the held bucket are summed there (integers: exact,
 * order-free) and reach *dst only when another bucket comes, after 2^30 adds, or at
 * lf_xsum_cache_flush, which the thread must call before the total is read.
 * Values of one magnitude share a bucket (it spans a factor of 256), so a thread that adds many
 * (a row loss per row) makes a few global reductions instead of one each: measured on an H200,
 * one 64-bit reduction per row on one address from every SM cost the row-resident cross-entropy
 * 3-5% at V = 32K (examples/cross_entropy.cu, bench/RESULTS.md). NaN and infinities are counted
 * in *dst at once. The reductions are red.global.add (nothing returned: the thread does not
 * wait). A kernel reads the total after all adds are ordered before it (each thread's flush, a
 * __threadfence and a completion count, as ce_batch_reduce_xsum in examples/cross_entropy.cu). */
typedef struct lf_xsum_cache {
    long long t; /* the held bucket's sum */
    int b;       /* the held bucket, -1 none */
    int n;       /* adds held */
} lf_xsum_cache;

static __device__ __forceinline__ lf_xsum_cache lf_xsum_cache_init(void)
{
    lf_xsum_cache c;
    c.t = 0;
    c.b = -1;
    c.n = 0;
    return c;
}

static __device__ __forceinline__ void lf_xsum_cache_flush(lf_xsum *dst, lf_xsum_cache *c)
{
    if (c->b >= 0 && c->t != 0) atomicAdd(reinterpret_cast<unsigned long long *>(&dst->b[c->b]), (unsigned long long)c->t);
    *c = lf_xsum_cache_init();
}

static __device__ __forceinline__ void lf_xsum_cached_add(lf_xsum *dst, lf_xsum_cache *c, float v)
{
    int b, sp;
    const long long t = lf_xsum_term(v, &b, &sp);
    if (sp == 1) atomicAdd(&dst->nan, 1u);
    else if (sp == 2) atomicAdd(&dst->pinf, 1u);
    else if (sp == 3) atomicAdd(&dst->ninf, 1u);
    if (t == 0) return;
    /* each term is below 2^32 in magnitude: 2^30 of them fit the 64-bit sum */
    if (b != c->b || c->n == (1 << 30)) {
        lf_xsum_cache_flush(dst, c);
        c->b = b;
    }
    c->t += t;
    ++c->n;
}

/* One add straight to *dst (as lf_xsum_cached_add followed by lf_xsum_cache_flush): for a
 * thread that adds once or rarely. */
static __device__ __forceinline__ void lf_xsum_atomic_add(lf_xsum *dst, float v)
{
    lf_xsum_cache c = lf_xsum_cache_init();
    lf_xsum_cached_add(dst, &c, v);
    lf_xsum_cache_flush(dst, &c);
}

/* out[k] = sum of v[t] over t in [cu_seqlens[k], cu_seqlens[k+1]) for k < nseq, computed by
 * every thread of the grid together (call it from all threads; no barrier inside): warp w of
 * the grid takes sequences w, w + W, ... (W = warps in the grid); lane l adds tokens l, l+32,
 * ... in double; a fixed butterfly. Empty sequences give 0. The bits do not depend on the
 * grid's shape. out: float, or double to keep the sums' digits (a difference of two long
 * sums, as a DPO margin, needs them). cu_seqlens must be valid (lossfuse.h lf_check_cu_seqlens; on the device see
 * lf_seq_bad). */
template <typename O>
static __device__ __forceinline__ void lf_seg_sum_grid(const int32_t *cu_seqlens, int64_t nseq, const float *v, O *out)
{
    const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    const int64_t w0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = (int)(threadIdx.x & 31u);
    for (int64_t k = w0; k < nseq; k += warps) {
        const int64_t b = cu_seqlens[k], e = cu_seqlens[k + 1];
        double a = 0.0;
        /* eight loads in flight per lane; the lane adds its elements b + lane + 32 i in order of
         * i, so the bits do not depend on the unrolling (a padding 0 changes no sum: a starts at
         * +0, so it is never -0) */
        for (int64_t t = b + lane; t < e; t += 8 * 32) {
            float x[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) x[u] = t + 32 * u < e ? v[t + 32 * u] : 0.0f;
#pragma unroll
            for (int u = 0; u < 8; ++u) a += (double)x[u];
        }
        a = lf_warp_sum_f64(a);
        if (lane == 0) out[k] = (O)a;
    }
}

/* Per-sequence sums at the bandwidth limit, for long packed buffers (10^8 tokens in 10^5
 * sequences, say). lf_seg_sum_grid gives a whole sequence to one warp: with random lengths
 * some warps get several times the average, and a long sequence keeps one warp busy after the
 * others are done. Here the tokens are cut into chunks of LF_SEG_CHUNK (512) and every warp of
 * the grid takes an equal run of consecutive chunks, whatever the sequences. A chunk is read
 * once with 16-byte loads: lane l holds tokens 128 i + 4 l + j (i < 4, j < 4).
 *   The order of the additions, which fixes the bits: the part of a sequence inside a chunk (a
 *   piece) is summed by each lane in four doubles, one per j, adding its tokens of the piece in
 *   order of i; then (a0 + a1) + (a2 + a3) and a fixed butterfly. A sequence over chunks c0..c1
 *   is then lane l adding pieces l, l + 32, ... in order (double), and the butterfly. Inside a
 *   warp's run of chunks the lanes keep that sum in a register; a sequence that crosses the
 *   edge of a warp's run leaves its pieces in the workspace, each warp adds how many it left to
 *   an atomic counter (once), and the warp that completes the count adds them up, writes the
 *   sum and clears the counter. Bits depend on the data and LF_SEG_CHUNK only: the same for
 *   any grid, any run, any GPU, and v aligned or not (they differ from lf_seg_sum_grid's,
 *   which adds in another order).
 *   Workspace: lf_seg_chunk_ws_bytes(total) bytes (20 B per chunk: 0.04 B per token), zeroed
 *   once before its first use; every call leaves it ready for the next (graph replays too).
 *   One workspace per call in flight.
 *   cu_seqlens must be valid with cu_seqlens[nseq] == total (lf_check_cu_seqlens; lf_seq_bad on
 *   the device); total < 2^31 (cu_seqlens is int32). Empty sequences give 0; NaN / inf reach
 *   only the sequences they are in. v: any alignment (16-byte aligned: vector loads); it must
 *   not change during the call.
 *   Call from every thread of the grid (no barrier inside). ~64 registers: a kernel that only
 *   does this runs best with 256-thread CTAs, 4 per SM (bench_packed, 10^8 values in 10^5
 *   sequences: 82% of the copy bandwidth on an H200, where a plain read of the same bytes
 *   reaches 90%; lf_seg_sum_grid 75%). Its limit is the instructions per chunk, not the loads
 *   in flight: chunks staged ahead through shared memory (cp.async per lane, or a bulk copy
 *   per warp) were slower (bench/RESULTS.md). */
#ifndef LF_SEG_CHUNK
#define LF_SEG_CHUNK 512 /* tokens per chunk, a multiple of 128 (32 lanes x groups of 4); it fixes the bits */
#endif

LF_HD size_t lf_seg_chunk_ws_bytes(int64_t total)
{
    const int64_t nch = (total > 0 ? total : 0) / LF_SEG_CHUNK + 1; /* + the chunk at `total` (its empty sequences) */
    return (size_t)nch * (2 * sizeof(double) + sizeof(unsigned));
}

template <typename O>
static __device__ __forceinline__ void lf_seg_sum_chunked(const int32_t *cu_seqlens, int64_t nseq, int64_t total, const float *v,
                                                          O *out, void *workspace)
{
    static_assert(LF_SEG_CHUNK % 128 == 0 && LF_SEG_CHUNK > 0, "LF_SEG_CHUNK: a positive multiple of 128");
    const int C = LF_SEG_CHUNK, G = LF_SEG_CHUNK / 128; /* groups of 4 tokens per lane */
    const int lane = (int)(threadIdx.x & 31u);
    /* Token, chunk and sequence indices fit in 32 bits (total < 2^31): 32-bit arithmetic
     * throughout (the bookkeeping per chunk is most of the instructions); sums of an index and
     * a length that could pass 2^31 - 1 near the end are written as differences. */
    const int T = (int)total, NS = (int)nseq;
    const int nch = T / C + 1;
    double *const head = static_cast<double *>(workspace); /* piece of the sequence entering chunk c */
    double *const tail = head + nch;                       /* piece of the sequence leaving chunk c */
    unsigned *const cnt = reinterpret_cast<unsigned *>(tail + nch); /* pieces done, by start chunk */
    int c_beg, c_end;
    {
        const int64_t warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
        const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
        c_beg = (int)((int64_t)nch * w / warps);
        c_end = (int)((int64_t)nch * (w + 1) / warps);
    }
    if (NS <= 0 || c_beg >= c_end) return; /* warp-uniform */

    const bool vec = ((uintptr_t)v & 15u) == 0;
    auto load_chunk = [&](int c, float4 (&x)[G]) {
        const int b = c * C;
        if (vec && b <= T - C) {
            const float4 *p = reinterpret_cast<const float4 *>(v + b) + lane;
#pragma unroll
            for (int i = 0; i < G; ++i) x[i] = __ldcs(p + 32 * i);
        } else { /* the last chunk, or v not 16-byte aligned: the same tokens per lane */
#pragma unroll
            for (int i = 0; i < G; ++i) {
                const int64_t t = (int64_t)b + 128 * i + 4 * lane;
                x[i].x = t < total ? v[t] : 0.0f;
                x[i].y = t + 1 < total ? v[t + 1] : 0.0f;
                x[i].z = t + 2 < total ? v[t + 2] : 0.0f;
                x[i].w = t + 3 < total ? v[t + 3] : 0.0f;
            }
        }
    };

    float4 x[G];
    load_chunk(c_beg, x); /* in flight during the search below */

    /* The first sequence with a piece in chunk c_beg: i0 = first index with cu[i0] >= base (a
     * 32-way search: ~4 dependent loads for 10^5 sequences); the sequence starting exactly
     * there, or else the one that holds token `base`. The last probe's 32 values are the
     * first window of cu_seqlens (below). */
    int k, slo = 0;
    int32_t pr;
    {
        const int base = c_beg * C;
        int hi = NS; /* i0 in [slo, hi]; cu[nseq] = total >= base */
        while (hi - slo >= 32) {
            const int step = (hi - slo + 31) / 32, q = slo + (lane + 1) * step;
            const bool ge = q >= hi || cu_seqlens[q] >= base;
            const int f = __ffs((int)__ballot_sync(0xffffffffu, ge)) - 1; /* lane 31 probes >= hi */
            const int qf = slo + (f + 1) * step;
            slo = f == 0 ? slo : slo + f * step + 1;
            hi = qf < hi ? qf : hi;
        }
        pr = slo + lane <= NS ? cu_seqlens[slo + lane] : INT32_MAX;
        const bool ge = slo + lane >= hi || pr >= base;
        const int f = __ffs((int)__ballot_sync(0xffffffffu, ge)) - 1;
        k = __shfl_sync(0xffffffffu, pr, f) == base ? slo + f : slo + f - 1;
    }
    /* cu_seqlens[kw + lane] in `win`, the next 32 in `win_nx` (loaded a window ahead), passed
     * around by shuffles */
    int kw = k >= slo ? slo : k;
    int32_t win = k >= slo ? pr : (kw + lane <= NS ? cu_seqlens[kw + lane] : INT32_MAX);
    int32_t win_nx = kw + 32 + lane <= NS ? cu_seqlens[kw + 32 + lane] : INT32_MAX;
    auto cu_at = [&](int i) -> int { /* warp-uniform; i >= kw - 1, i <= kw + 32 */
        if (i - kw >= 32) {
            kw += 32;
            win = win_nx;
            win_nx = kw + 32 + lane <= NS ? cu_seqlens[kw + 32 + lane] : INT32_MAX;
        } else if (i < kw) { /* a sequence whose end shifted the window goes on in the next chunk */
            kw = i;
            win = kw + lane <= NS ? cu_seqlens[kw + lane] : INT32_MAX;
            win_nx = kw + 32 + lane <= NS ? cu_seqlens[kw + 32 + lane] : INT32_MAX;
        }
        return __shfl_sync(0xffffffffu, win, i - kw);
    };

    double run = 0.0;  /* lane-strided sum of the pieces so far of a sequence inside this warp's chunks */
    unsigned mine = 0; /* pieces of an edge-crossing sequence this warp has left in the workspace */

    /* The end of a piece of sequence k = [s, e) in chunk c (aj: this lane's sums of its tokens in
     * it, one per j; cleared here). Warp-uniform. */
    auto finish = [&](int c, int s, int e, double (&aj)[4]) {
        const int b = c * C;
        const double a = lf_warp_sum_f64((aj[0] + aj[1]) + (aj[2] + aj[3]));
        aj[0] = aj[1] = aj[2] = aj[3] = 0.0;
        const bool starts = s >= b, ends = e - b <= C;
        if (starts && ends) { /* the whole sequence */
            if (lane == 0) out[k] = (O)a;
            return;
        }
        /* Piece q = c - c0 of a sequence over chunks c0..c1 (e > s here). Its sum is, by
         * definition, lane l adding the pieces q = l, l + 32, ... in order, then the butterfly.
         * Inside this warp's chunks the lanes do exactly that in a register; a sequence that
         * crosses the edge of this warp's chunks leaves its pieces in the workspace, and the
         * warp with the last of them (one counter update per warp) adds them the same way. */
        const int c0 = s / C, c1 = (e - 1) / C, q = c - c0;
        if (c0 >= c_beg && c1 < c_end) {
            if (lane == (q & 31)) run += a;
            if (ends) {
                run = lf_warp_sum_f64(run);
                if (lane == 0) out[k] = (O)run;
                run = 0.0;
            }
            return;
        }
        if (lane == 0) (starts ? tail : head)[c] = a;
        ++mine;
        if (!ends && c + 1 < c_end) return; /* not yet this warp's last piece of it */
        unsigned last = 0;
        if (lane == 0) {
            __threadfence();
            last = atomicAdd(cnt + c0, mine) + mine == (unsigned)(c1 - c0 + 1);
        }
        mine = 0;
        if (__shfl_sync(0xffffffffu, last, 0)) {
            __threadfence();
            double t = 0.0;
            for (int r = lane; r <= c1 - c0; r += 32) t += __ldcg(r == 0 ? tail + c0 : head + c0 + r);
            t = lf_warp_sum_f64(t);
            if (lane == 0) {
                out[k] = (O)t;
                cnt[c0] = 0; /* ready for the next call */
            }
        }
    };

    /* The piece of sequence k in the chunk at b, if k starts before the chunk ends: its bounds
     * [lo, hi) relative to b. Warp-uniform. */
    int s = 0, e = 0;
    int lo = 0, hi = 0;
    auto open_piece = [&](int b) -> bool {
        if (k >= NS) return false;
        s = cu_at(k);
        if (s - b >= C) return false;
        e = cu_at(k + 1);
        lo = s > b ? s - b : 0;
        hi = e - b < C ? e - b : C;
        return true;
    };

    for (int c = c_beg; c < c_end; ++c) {
        const int b = c * C;
        /* The chunk's pieces in token order, a group of 128 tokens (4 per lane) at a time: a
         * group inside the current piece is four adds per lane; a group where pieces end adds
         * its tokens piece by piece (masked) and finishes each. Each lane adds its tokens j of
         * a piece into aj[j] in order of i, from +0 (so the masked-out +0s change no bit). */
        bool open = open_piece(b);
        double aj[4] = {0.0, 0.0, 0.0, 0.0}; /* this lane's sums of its tokens j = 0..3 of each group */
#pragma unroll
        for (int i = 0; i < G; ++i) {
            const int g0 = 128 * i, o = g0 + 4 * lane;
            if (open && hi >= g0 + 128) { /* the whole group is in the current piece (and lo <= g0) */
                aj[0] += (double)x[i].x;
                aj[1] += (double)x[i].y;
                aj[2] += (double)x[i].z;
                aj[3] += (double)x[i].w;
                continue;
            }
            while (open && hi < g0 + 128) { /* pieces that end in this group */
                aj[0] += (double)(o >= lo && o < hi ? x[i].x : 0.0f);
                aj[1] += (double)(o + 1 >= lo && o + 1 < hi ? x[i].y : 0.0f);
                aj[2] += (double)(o + 2 >= lo && o + 2 < hi ? x[i].z : 0.0f);
                aj[3] += (double)(o + 3 >= lo && o + 3 < hi ? x[i].w : 0.0f);
                finish(c, s, e, aj);
                ++k;
                open = open_piece(b);
            }
            if (open) { /* the rest of the group is in the piece that starts in it */
                aj[0] += (double)(o >= lo ? x[i].x : 0.0f);
                aj[1] += (double)(o + 1 >= lo ? x[i].y : 0.0f);
                aj[2] += (double)(o + 2 >= lo ? x[i].z : 0.0f);
                aj[3] += (double)(o + 3 >= lo ? x[i].w : 0.0f);
            }
        }
        if (open) { /* the piece that reaches the end of the chunk */
            finish(c, s, e, aj);
            if (e - b <= C) ++k; /* else it goes on in the next chunk, which starts with it */
        }
        if (c + 1 < c_end) load_chunk(c + 1, x);
    }
}

/* A device-side cu_seqlens check (the host one reads the array): 1 when cu_seqlens[0] != 0,
 * cu_seqlens[k+1] < cu_seqlens[k] for some k, or cu_seqlens[nseq] != total. Every thread of
 * the grid may call it; each checks a strided share and ORs into *flag (an int in global
 * memory, zeroed by the caller), so a kernel can refuse bad input without a host round trip. */
static __device__ __forceinline__ void lf_seq_bad(const int32_t *cu_seqlens, int64_t nseq, int64_t total, int *flag)
{
    const int64_t n = (int64_t)gridDim.x * blockDim.x, i0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    bool bad = false;
    for (int64_t k = i0; k <= nseq; k += n) {
        if (k == 0 && cu_seqlens[0] != 0) bad = true;
        if (k > 0 && cu_seqlens[k] < cu_seqlens[k - 1]) bad = true;
        if (k == nseq && cu_seqlens[nseq] != total) bad = true;
    }
    if (bad) atomicOr(flag, 1);
}

/* The deterministic scatter: keys[0..n) sorted ascending by a STABLE sort (entries of one key
 * keep their original order), vals permuted alike; out[k] = sum of the vals of key k in that
 * order, for k < nkeys (keys outside [0, nkeys) are skipped; a key with no entry gives 0).
 * One thread per key finds its run by binary search and sums it in double. All threads of
 * the grid call it; no barrier. */
static __device__ __forceinline__ void lf_sorted_run_sum_grid(const int32_t *keys, const float *vals, int64_t n, int64_t nkeys,
                                                             float *out)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < nkeys; k += stride) {
        int64_t lo = 0, hi = n; /* first index with keys[i] >= k */
        while (lo < hi) {
            const int64_t mid = lo + ((hi - lo) >> 1);
            if (keys[mid] < k) lo = mid + 1;
            else hi = mid;
        }
        double a = 0.0;
        for (int64_t i = lo; i < n && keys[i] == k; ++i) a += (double)vals[i];
        out[k] = (float)a;
    }
}

/* ============================================================================================
 * 10. Context parallelism (the zigzag layout of lossfuse.h section 10)
 *
 *    Each rank of a CP group holds its zigzag share of every sequence of a packed batch; its
 *    labels must be the next tokens of the FULL sequences (the target of a chunk's last token
 *    is on another rank). lf_cp_local_labels_grid builds them on the device from the global
 *    ids, which every rank has: one binary search per local token, no host work, no barrier.
 *    The cross-entropy of the local logits with these labels, summed over the ranks, is the
 *    unsharded loss; the mean divides by the global count of valid labels (examples/
 *    cp_local_ce.cu all-reduces (sum, count) with NCCL).
 * ========================================================================================== */

/* Usage: the labels of CP rank `rank` for its local logits, from the global batch (which every
 * rank of the group has), in one launch before the loss kernel:
 *     __global__ void cp_labels(const int32_t *cu, int64_t nseq, int cp, int rank,
 *                               const int64_t *ids, const uint8_t *loss_mask, int64_t *labels) {
 *         lf_cp_local_labels_grid(cu, nseq, cp, rank, ids, loss_mask, -100, labels, (int64_t *)NULL);
 *     }
 *     cp_labels<<<(total / cp + 255) / 256, 256>>>(...);   // any grid shape
 * (examples/cp_local_ce.cu does this, then the cross-entropy with the global count as divisor.)
 *
 * Rank `rank`'s local labels (cu_seqlens[nseq] / cp of them) by every thread of the grid:
 * labels[t] = ids[g + 1] for local token t at global token g when g + 1 is in the same
 * sequence and target_mask[g + 1] != 0 (target_mask NULL: all on), else ignore_index; gpos (if
 * not NULL) gets g (position ids: g - cu_seqlens[k]). I, L: integer types of ids and labels.
 * The layout must be valid (lf_cp_check on the host, once per batch). */
template <typename I, typename L>
static __device__ __forceinline__ void lf_cp_local_labels_grid(const int32_t *cu_seqlens, int64_t nseq, int cp, int rank,
                                                               const I *ids, const uint8_t *target_mask,
                                                               int64_t ignore_index, L *labels, int64_t *gpos)
{
    const int64_t n = nseq > 0 ? (int64_t)(cu_seqlens[nseq] / cp) : 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += stride) {
        const int64_t k = lf_cp_seq_find(cu_seqlens, nseq, cp, t);
        const int64_t b = cu_seqlens[k], e = cu_seqlens[k + 1];
        const int64_t g = b + lf_cp_to_global(t - b / cp, e - b, cp, rank);
        const bool has = g + 1 < e && (!target_mask || target_mask[g + 1]);
        labels[t] = (L)(has ? (int64_t)ids[g + 1] : ignore_index);
        if (gpos) gpos[t] = g;
    }
}

/* ============================================================================================
 * 11. Tensor (vocabulary) parallelism
 *     lossfuse.h section 11 is LF_HD: a kernel builds its row's share from its statistics
 *     (lf_tp_share_from) and turns the merged shares into the loss and the gradient coefficient
 *     (lf_tp_loss, lf_tp_grad_coef). The merge itself reads P shares of 12 bytes (one per rank),
 *     a chain of P dependent loads when one thread walks them: lf_tp_merge_warp loads them in
 *     parallel, one lane per rank, and every lane then merges them from registers in rank order
 *     with lf_tp_merge's arithmetic — the same bits on every lane and every rank (and as
 *     lf_tp_merge compiled for the device; a host build may round a contracted product
 *     differently in the last bit). lf_tp_merge_lanes is the same merge of shares the lanes
 *     already hold (P <= 32), e.g. polled from flagged slots.
 *     Usage (examples/vocab_parallel_ce.cu), by all 32 lanes of one warp:
 *         const lf_tp_merged mg = lf_tp_merge_warp(shares, n_rows, P, i, y, w_y, Wr, V, eps);
 *         float lse; const float loss = lf_tp_loss(mg, lam, &lse);
 *
 *     Flagged slots (lf_tp_slot_put / lf_tp_slot_get): one row's share sent straight into
 *     another GPU's memory (a peer pointer over NVLink, e.g. NCCL's ncclGetPeerPointer) with no
 *     fence and no flag of its own. The 32-byte slot holds three 64-bit words {value, gen}: the
 *     share's m, s and t, each beside the sender's generation (a launch counter the sender and
 *     the reader agree on, never 0). A naturally aligned 64-bit access is single-copy atomic in
 *     the PTX memory model, so a reader that sees gen in all three words has seen the three
 *     values of that generation, whatever order they arrived in (NCCL's LL protocol rests on
 *     the same property). The writer's two 16-byte stores and the reader's 16- and 8-byte loads
 *     are volatile (relaxed, system scope): nothing is cached in L1, and the poll sees the
 *     remote stores as they land. One store per slot and generation; the reader polls its own
 *     memory (the writer stores into it), so a wait costs the reader an L2 round trip per try.
 *     Reuse of a slot is the caller's protocol: a slot may be written with generation g + k only
 *     once every reader is done with generation g (examples/vocab_parallel_ce.cu alternates two
 *     sets of slots by generation parity and ends each launch with a barrier of the ranks).
 *         // sender, one thread:  lf_tp_slot_put(peer_slots + (row * P + rank), sh, gen);
 *         // receiver, lane q < P: while (!lf_tp_slot_get(my_slots + (row * P + q), gen, &sh)) {}
 *     (A rank that already holds its own share needs no slot for it: vocab_parallel_ce.cu's
 *     windows hold P - 1 slots a row, the senders in rank order without the receiver.)
 * ========================================================================================== */

/* The lse states of ranks base .. base + n - 1, held by lanes 0 .. n - 1 (mine), merged into st
 * in rank order by every lane. */
static __device__ __forceinline__ void lf_impl_tp_merge_lse(lf_lse &st, const lf_tp_share &mine, int n)
{
    for (int k = 0; k < n; ++k) {
        lf_lse b;
        b.m = __shfl_sync(0xffffffffu, mine.m, k);
        b.s = __shfl_sync(0xffffffffu, mine.s, k);
        b.u = 0.0f;
        st = lf_lse_merge(st, b);
    }
}

/* Their t terms moved to the merged max mg.M and added in rank order (A_r: lane k's rank's
 * target mass), with their masses. */
static __device__ __forceinline__ void lf_impl_tp_merge_t(lf_tp_merged &mg, const lf_tp_share &mine, float A_r, int n)
{
    for (int k = 0; k < n; ++k) {
        lf_tp_share sh;
        sh.m = __shfl_sync(0xffffffffu, mine.m, k);
        sh.s = 0.0f;
        sh.t = __shfl_sync(0xffffffffu, mine.t, k);
        const float a = __shfl_sync(0xffffffffu, A_r, k);
        mg.A += a;
        mg.T = lf_tp_move(mg.T, sh, a, mg.M);
    }
}

static __device__ __forceinline__ lf_tp_merged lf_tp_merge_warp(const lf_tp_share *g, int64_t n_rows, int P, int64_t i,
                                                                int64_t y, float wy, const float *Wr, int64_t V, float eps)
{
    const int lane = (int)(threadIdx.x & 31);
    const int owner = lf_tp_owner(V, P, y);
    lf_tp_merged mg;
    lf_lse st;
    st.m = -LF_INF_F;
    st.s = st.u = 0.0f;
    mg.T = mg.A = 0.0f;
    for (int base = 0; base < P; base += 32) { /* pass 1: the lse states, rank order */
        lf_tp_share mine = {-LF_INF_F, 0.0f, 0.0f};
        if (base + lane < P) mine = g[(int64_t)(base + lane) * n_rows + i];
        lf_impl_tp_merge_lse(st, mine, P - base < 32 ? P - base : 32);
    }
    mg.M = st.m;
    mg.S = st.s;
    for (int base = 0; base < P; base += 32) { /* pass 2: T and A, rank order */
        lf_tp_share mine = {-LF_INF_F, 0.0f, 0.0f};
        float A_r = 0.0f;
        if (base + lane < P) {
            mine = g[(int64_t)(base + lane) * n_rows + i]; /* again: an L1 hit */
            A_r = lf_tp_mass(base + lane, owner, wy, lf_tp_wsum(Wr, V, P, base + lane), V, eps);
        }
        lf_impl_tp_merge_t(mg, mine, A_r, P - base < 32 ? P - base : 32);
    }
    return mg;
}

/* The same merge where lane q (< P <= 32) already holds rank q's share `mine` (the other lanes'
 * values are not used): the bits of lf_tp_merge_warp. By all 32 lanes; every lane gets the result. */
static __device__ __forceinline__ lf_tp_merged lf_tp_merge_lanes(const lf_tp_share &mine, int P, int64_t y, float wy,
                                                                 const float *Wr, int64_t V, float eps)
{
    const int lane = (int)(threadIdx.x & 31);
    lf_tp_merged mg;
    lf_lse st;
    st.m = -LF_INF_F;
    st.s = st.u = 0.0f;
    mg.T = mg.A = 0.0f;
    lf_impl_tp_merge_lse(st, mine, P);
    mg.M = st.m;
    mg.S = st.s;
    const float A_r = lane < P ? lf_tp_mass(lane, lf_tp_owner(V, P, y), wy, lf_tp_wsum(Wr, V, P, lane), V, eps) : 0.0f;
    lf_impl_tp_merge_t(mg, mine, A_r, P);
    return mg;
}

/* A flagged slot: three 64-bit words {value bits, generation} and one of padding (32 bytes, 16-byte
 * aligned: two vector accesses). */
typedef struct __align__(16) lf_tp_slot {
    unsigned long long w[4];
} lf_tp_slot;

/* Write share sh with generation gen (!= 0) into slot d (any GPU's memory this one can store to),
 * by one thread: two 16-byte volatile stores, no fence. */
static __device__ __forceinline__ void lf_tp_slot_put(lf_tp_slot *d, const lf_tp_share &sh, unsigned gen)
{
    const unsigned long long g = (unsigned long long)gen << 32;
    const unsigned long long a = g | __float_as_uint(sh.m), b = g | __float_as_uint(sh.s), c = g | __float_as_uint(sh.t);
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(d->w), "l"(a), "l"(b) : "memory");
    asm volatile("st.volatile.global.v2.u64 [%0], {%1, %2};" ::"l"(d->w + 2), "l"(c), "l"(g) : "memory");
}

/* Whether slot s holds generation gen in all three words, and then *sh (one try: poll it, and
 * gently: examples/vocab_parallel_ce.cu measured what hard polling costs, tp_lsa_spin). */
static __device__ __forceinline__ bool lf_tp_slot_get(const lf_tp_slot *s, unsigned gen, lf_tp_share *sh)
{
    unsigned long long a, b, c;
    asm volatile("ld.volatile.global.v2.u64 {%0, %1}, [%2];" : "=l"(a), "=l"(b) : "l"(s->w) : "memory");
    asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(c) : "l"(s->w + 2) : "memory");
    if ((unsigned)(a >> 32) != gen || (unsigned)(b >> 32) != gen || (unsigned)(c >> 32) != gen) return false;
    sh->m = __uint_as_float((unsigned)a);
    sh->s = __uint_as_float((unsigned)b);
    sh->t = __uint_as_float((unsigned)c);
    return true;
}

/* ============================================================================================
 * 12. Host: launching clusters and planning a ring of staged row slices (sm_90)
 *    Host functions (queries and launches only: safe during graph capture) for kernels built
 *    like examples/cross_entropy.cu's ce_resident_kernel and kl_distill.cu's kl_res_kernel: one
 *    CTA per SM, persistent, each holding `stages` slices of a row (or row pair) in dynamic
 *    shared memory, a row split over a cluster of c CTAs when one slice of it would not leave
 *    room for enough stages.
 *        static lf_ring_device ring[MAX_DEVICES];                // per kernel, zero-initialised
 *        lf_ring_setup(kernel, dev, &ring[dev]);                 // once: shared-memory opt-in
 *        lf_ring_req r = lf_ring_req_make(units, unit_bytes, n_rows);  // then the options
 *        lf_ring_plan pl;
 *        lf_ring_plan_make(kernel, block, dev, &ring[dev], r, &pl);    // pl.cluster 0: none fits
 *        lf_launch_clusters(kernel, pl.ctas, pl.cluster, block, pl.dyn_bytes, stream, false, args...);
 * ========================================================================================== */

/* Host: how many clusters of c CTAs (blocks of `block`, `dyn` bytes of dynamic shared memory)
 * of `kernel` the current device runs at once (cudaOccupancyMaxActiveClusters); 0 when a
 * cluster of c cannot be scheduled (the error is cleared). A query only: safe during graph
 * capture. For planning a persistent grid of clusters. */
template <typename K>
static inline int lf_max_active_clusters(K kernel, int c, dim3 block, size_t dyn)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr = {};
    int n = 0;
    cfg.gridDim = dim3((unsigned)c, 1, 1);
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = dyn;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = (unsigned)c;
    attr.val.clusterDim.y = 1;
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

/* Programmatic dependent launch (sm_90), the device side: a kernel launched with the
 * programmatic-serialization attribute (lf_launch_clusters' pdl) may start while the kernel
 * before it in the stream still runs, once every CTA of that one has called lf_pdl_trigger (or
 * exited); lf_pdl_wait then blocks until that kernel has completed and its writes are visible.
 * So a dependent kernel does its independent work (loads of its own inputs) before
 * lf_pdl_wait and everything that reads the previous kernel's results after it. Both are
 * no-ops below sm_90 and in a kernel launched without the attribute. */
static __device__ __forceinline__ void lf_pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
static __device__ __forceinline__ void lf_pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* The device's global timer in ns (%globaltimer: one clock for every SM, so the times of
 * different CTAs compare; its resolution is ~1 us on some GPUs, 32 ns on H100 / H200). For
 * diagnostic builds that time the phases of a launch (e.g. kl_distill.cu's KL_RES_TRACE). */
static __device__ __forceinline__ unsigned long long lf_globaltimer_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* Launch `kernel` on `ctas` CTAs in clusters of `cluster` (1: none) along x, with programmatic
 * dependent launch when `pdl` (the kernel may start while the previous one on the stream
 * finishes; it must wait for that one's results itself, griddepcontrol.wait). */
template <typename K, typename... A>
static inline cudaError_t lf_launch_clusters(K kernel, int64_t ctas, int cluster, dim3 block, size_t dyn, cudaStream_t stream,
                                             bool pdl, A... args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[2] = {};
    cfg.gridDim = dim3((unsigned)ctas, 1, 1);
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = dyn;
    cfg.stream = stream;
    cfg.attrs = attr;
    if (cluster > 1) {
        attr[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
        attr[cfg.numAttrs].val.clusterDim.x = (unsigned)cluster;
        attr[cfg.numAttrs].val.clusterDim.y = 1;
        attr[cfg.numAttrs].val.clusterDim.z = 1;
        ++cfg.numAttrs;
    }
    if (pdl) {
        attr[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
        ++cfg.numAttrs;
    }
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, args...);
    return e != cudaSuccess ? e : cudaGetLastError();
}

/* What a ring kernel may use on one device: dyn_max, the dynamic shared memory a CTA can have
 * (0: the device or the kernel's code is not sm_90: the bulk copies would trap), cmax, the
 * largest cluster (8, or 16 where non-portable sizes are allowed); peak_bw, the memory's peak
 * bandwidth in bytes/s from its clock and bus width (0: not reported); and a cache of the last
 * occupancy query per cluster size (a training loop asks the same every step; host threads
 * launching at once may interleave its writes: the worst outcome is a grid of the wrong size
 * for one launch, which still computes the right result). */
typedef struct lf_ring_device {
    int ready, dyn_max, cmax;
    double peak_bw;
    int q_dyn[17], q_groups[17];
} lf_ring_device;

/* The memory bandwidth (bytes/s of the device's peak) that one streaming CTA of a ring kernel
 * is given when rows are handed out dynamically: lf_ring_plan's `streaming` launches about
 * peak / LF_RING_CTA_BW CTAs, at most as many as are resident. Measured with the fused
 * cross-entropy (bench/RESULTS.md, session 18): on an H100 SXM (3.35 TB/s peak, 132 SMs) the
 * best of 96-104 CTAs streamed 0.7-8% faster than 120-132 at every benchmark shape, while on an
 * H200 (4.8 TB/s) every CTA fewer than 132 was slower (96: 19%). */
#ifndef LF_RING_CTA_BW
#define LF_RING_CTA_BW 33.5e9
#endif

/* Once per kernel and device (d zero-initialised): the shared-memory opt-in and the cluster
 * limit. The code that runs must be sm_90's: a build for compute_80 only, JIT-compiled on a
 * Hopper, has the bulk copies compiled out. */
template <typename K> static inline cudaError_t lf_ring_setup(K kernel, int dev, lf_ring_device *d)
{
    if (d->ready) return cudaSuccess;
    int cc = 0, optin = 0;
    cudaError_t e = cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, dev);
    if (e != cudaSuccess) return e;
    d->dyn_max = 0;
    d->cmax = 1;
    cudaFuncAttributes fa;
    if ((e = cudaFuncGetAttributes(&fa, kernel)) != cudaSuccess) return e;
    if (cc >= 9 && fa.ptxVersion >= 90) {
        if ((e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) != cudaSuccess) return e;
        d->dyn_max = optin - (int)fa.sharedSizeBytes;
        if ((e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, d->dyn_max)) != cudaSuccess) return e;
        d->cmax = 8;
        if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) d->cmax = 16;
        else (void)cudaGetLastError();
    }
    int khz = 0, bits = 0;
    d->peak_bw = 0.0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess)
        d->peak_bw = 2.0 * (double)khz * 1e3 * (double)bits / 8.0; /* double data rate */
    else
        (void)cudaGetLastError();
    d->ready = 1;
    return cudaSuccess;
}

/* What to plan: a row is `units` units of `unit_bytes` (16: a 16-byte vector; 32: a 16-bit
 * row pair's unit), `rows` rows; at most max_cluster CTAs per cluster (0: the device's limit);
 * stages forced (> 0) or automatic (as many as fit, min_stages .. max_stages); each CTA's
 * groups_per_cta warp groups each hold a stage, so more stages than that; without clusters a
 * slice below min_slice bytes is no plan (such short rows suit another schedule; 0: any). */
typedef struct lf_ring_req {
    int64_t units, rows;
    int unit_bytes, max_cluster, stages, min_stages, max_stages, groups_per_cta;
    int64_t min_slice;
} lf_ring_req;

static inline lf_ring_req lf_ring_req_make(int64_t units, int unit_bytes, int64_t rows)
{
    lf_ring_req r;
    r.units = units;
    r.rows = rows;
    r.unit_bytes = unit_bytes;
    r.max_cluster = 0;
    r.stages = 0;
    r.min_stages = 3;
    r.max_stages = 8;
    r.groups_per_cta = 2;
    r.min_slice = 0;
    return r;
}

/* The plan: clusters of `cluster` CTAs (0: nothing fits), `stages` slices of slice_units
 * units each (dyn_bytes of shared memory), `clusters` clusters (ctas CTAs): as few as give the
 * busiest its row count, for a fixed share of rows each; `resident`: how many such clusters the
 * device runs at once; `streaming`: how many a kernel that hands rows out dynamically launches
 * (resident, or fewer where the memory's peak bandwidth is less than LF_RING_CTA_BW per CTA;
 * at most the rows). */
typedef struct lf_ring_plan {
    int cluster, stages;
    int64_t slice_units, clusters, ctas, resident, streaming;
    size_t dyn_bytes;
} lf_ring_plan;

/* Among cluster sizes 1, 2, 3, ... up to the cap, those whose slice fits the stages; of those
 * the one that keeps the most CTAs resident, the smaller cluster on a tie. Every size is tried,
 * not only powers of two: a cluster lives in one GPC, and at one CTA per SM the size that packs
 * the GPCs best depends on the chip (an H100 or H200 runs 30 clusters of 4 = 120 of its 132 SMs,
 * 16 of 8 = 128). The grid: as few clusters as give the busiest one its row count, each then
 * with a larger share of the bandwidth (4096 rows on 132 SMs: 128 CTAs of 32 rows, not 4 of 32
 * and 128 of 31). */
template <typename K>
static inline cudaError_t lf_ring_plan_make(K kernel, dim3 block, int dev, lf_ring_device *d, const lf_ring_req &r,
                                            lf_ring_plan *out)
{
    memset(out, 0, sizeof *out);
    if (d->dyn_max <= 0 || r.rows <= 0) return cudaSuccess;
    const int cap = (r.max_cluster > 0 && r.max_cluster < d->cmax) ? r.max_cluster : d->cmax;
    int best_groups = 0;
    for (int c = 1; c <= cap && c <= 16; ++c) {
        const int64_t su = r.units > 0 ? (r.units + c - 1) / c : 1, bytes = su * r.unit_bytes;
        int64_t ns = d->dyn_max / bytes;
        if (ns > r.max_stages) ns = r.max_stages;
        if (r.stages > 0) {
            if (ns < r.stages) continue;
            ns = r.stages;
        } else if (ns < r.min_stages) {
            continue;
        }
        if (ns <= r.groups_per_cta) continue; /* each group holds a stage: one more is loading */
        if (c == 1 && bytes < r.min_slice) break;
        const int dyn = (int)(ns * bytes);
        int groups = 0;
        if (d->q_dyn[c] == dyn) {
            groups = d->q_groups[c];
        } else if (c == 1) {
            int sms = 0, per_sm = 0;
            cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
            if (e == cudaSuccess)
                e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, (int)(block.x * block.y * block.z), (size_t)dyn);
            if (e != cudaSuccess) return e;
            groups = sms * per_sm;
        } else {
            groups = lf_max_active_clusters(kernel, c, block, (size_t)dyn);
        }
        d->q_dyn[c] = dyn;
        d->q_groups[c] = groups;
        if (groups > 0 && (int64_t)groups * c > (int64_t)best_groups * out->cluster) {
            out->cluster = c;
            out->stages = (int)ns;
            out->slice_units = su;
            out->dyn_bytes = (size_t)dyn;
            best_groups = groups;
        }
    }
    if (out->cluster == 0) return cudaSuccess;
    const int64_t most = (r.rows + best_groups - 1) / best_groups; /* the busiest cluster's rows */
    out->clusters = (r.rows + most - 1) / most;
    out->ctas = out->clusters * out->cluster;
    out->resident = best_groups;
    int64_t s = best_groups;
    if (d->peak_bw > 0.0) {
        const double want = d->peak_bw / (LF_RING_CTA_BW * (double)out->cluster);
        if (want < (double)s) s = want < 1.0 ? 1 : (int64_t)ceil(want);
    }
    out->streaming = s < r.rows ? s : r.rows;
    return cudaSuccess;
}

#endif /* LOSSFUSE_CUDA_CUH */
