/* lossfuse.h — portable building blocks of LLM-training loss kernels (C99, C++, CUDA)
 *
 * Version 0.1.0.  Licence: MIT (see LICENSE at the end of this file's project).
 *
 * What this is
 *   The scalar math that every fused loss kernel needs — an online log-sum-exp state with
 *   entropy, argmax tracking, bf16/fp16 conversions, the packed-sequence label shift, input
 *   validation — written once as `static inline` functions usable from host C, C++ and CUDA
 *   device code (`LF_HD`), plus double-precision host references (`lf_ref_*`) of every loss in
 *   examples/, so that a kernel you compose can be checked with one include.
 *   The CUDA collectives built on this file live in lossfuse_cuda.cuh.
 *
 * Quick start (host):
 *     #include "lossfuse.h"
 *     lf_lse st = lf_lse_init();
 *     for (int j = 0; j < V; ++j) lf_lse_push(&st, x[j]);
 *     float lse = lf_lse_final(st);              // log(sum(exp(x))), -inf if V == 0
 *     float H   = lf_lse_entropy(st);            // entropy of softmax(x), in nats
 *
 *     lf_ce_opts o = lf_ce_opts_default();       // ignore_index -100, no smoothing, ...
 *     o.label_smoothing = 0.1f;
 *     double loss;
 *     lf_ref_cross_entropy(N, V, logits, V, labels, &o, LF_REDUCE_MEAN, -1.0,
 *                          &loss, NULL, grad, NULL);
 *
 * Contents (in file order)
 *   1. Configuration, status codes
 *   2. bf16 / fp16 <-> float (bit exact, round-to-nearest-even)
 *   3. Online log-sum-exp state with entropy (lf_lse), argmax (lf_argmax), row statistics
 *      (lf_row_stats: both plus the weighted logit sum for label smoothing)
 *   3b. Dual state of two distributions (lf_dual): both lse, entropies, forward and reverse KL
 *   3c. Scalar pair losses with derivatives: softplus, log-sigmoid, DPO (sigmoid / cDPO, hinge,
 *       IPO), SimPO, Bradley-Terry with a soft target, hinge with margin
 *   3d. Order-free sums of floats (lf_xsum): exact, bit-identical in any order
 *   4. Logit transform (scale, softcap)
 *   5. Packed sequences: segment lookup, next-token label shift
 *   6. Host validation (labels, cu_seqlens, options)
 *   7. Host references: cross-entropy (lf_ref_ce_row, lf_ref_cross_entropy); lf_check_err, a
 *      result against its reference in units of a tolerance
 *   8. Host references: distillation (lf_ref_kl_row, lf_ref_kl: forward / reverse KL, JSD,
 *      soft-target cross-entropy, total variation; a teacher as log-probabilities or sparse
 *      top-k: lf_ref_kl_row_lq, lf_ref_kl_sparse_teacher)
 *   9. Host references: packed sequences and preferences (lf_check_pairs, lf_ref_seg_sum,
 *      lf_ref_pair_scatter, lf_ref_histogram, lf_ref_dpo_packed: the DPO family from packed
 *      logits, lf_ref_pairwise_preference: Bradley-Terry / hinge over flat pairs with
 *      histogram budget and coverage penalties)
 *  10. Context parallelism: the zigzag layout of packed sequences (lf_cp_check, lf_cp_local_cu,
 *      lf_cp_seq_find, lf_cp_to_global / lf_cp_to_local, lf_cp_global_token, lf_cp_label,
 *      lf_ref_cp_labels)
 *  11. Tensor (vocabulary) parallelism: 12-byte per-shard row shares and their merge
 *      (lf_tp_shard, lf_tp_owner, lf_tp_acc_push, lf_tp_share_make, lf_tp_merge, lf_tp_loss,
 *      lf_tp_grad_coef)
 *
 * Configuration macros (define before including; each is #ifndef-guarded)
 *   LF_HD        function qualifiers of the portable functions.
 *                Default: `static inline`, plus `__host__ __device__` under nvcc.
 *   LF_USE_EXP2  1 (default): lf_exp_diff(a, b) = exp(a - b) is evaluated as
 *                exp2((a - b) * log2(e)), one FADD + FMUL + MUFU.EX2 on NVIDIA GPUs, accurate
 *                relative to a - b. 0: plain expf(a - b). The state's meaning is the same.
 *                (The device row passes go one step further — see lf_piece_stats in
 *                lossfuse_cuda.cuh — because there one shift is shared by many terms.)
 *   LF_ASSERT(c) used by nothing on the fast path; host helpers never abort. Default: no-op.
 *
 * Conventions
 *   - Nothing here allocates, prints or aborts. Host helpers return an lf_status.
 *   - Rows of logits are indexed with int64_t: rows * V may exceed 2^31.
 *   - -inf logits are masked entries (probability 0). NaN or +inf anywhere in a row makes
 *     that row's log-sum-exp (and so its loss) NaN: bad numbers are never hidden.
 */
#ifndef LOSSFUSE_H
#define LOSSFUSE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ============================================================================================
 * 1. Configuration, status codes
 * ========================================================================================== */

#define LF_VERSION_MAJOR 0
#define LF_VERSION_MINOR 1
#define LF_VERSION_PATCH 0

#ifndef LF_HD
#if defined(__CUDACC__)
#define LF_HD static inline __host__ __device__
#else
#define LF_HD static inline
#endif
#endif

#ifndef LF_USE_EXP2
#define LF_USE_EXP2 1
#endif

#ifndef LF_ASSERT
#define LF_ASSERT(c) ((void)0)
#endif

#define LF_LOG2E 1.4426950408889634f
#define LF_LN2 0.6931471805599453f
#define LF_INF_F (INFINITY)

/* Status codes returned by host helpers (and counted, where noted, by kernels). */
typedef enum lf_status {
    LF_OK = 0,
    LF_ERR_NULL = 1,    /* a required pointer is NULL */
    LF_ERR_SIZE = 2,    /* a size is negative or too large */
    LF_ERR_LABEL = 3,   /* a label outside [0, V) that is not the ignore index */
    LF_ERR_SEQLENS = 4, /* cu_seqlens not starting at 0, decreasing, or not ending at N */
    LF_ERR_ARG = 5,     /* an option out of its domain (negative smoothing, scale <= 0, ...) */
    LF_ERR_DEVICE = 6,  /* a CUDA call failed (used by the examples' launchers) */
    LF_ERR_PAIR = 7,    /* a pair whose items are out of range or the same item */
    LF_ERR_CP = 8       /* context parallelism: cp < 1, rank outside [0, cp), or a sequence
                         * length not a multiple of 2 * cp */
} lf_status;

/* Element types of logits and gradients, for launchers that take untyped pointers. */
typedef enum lf_dtype { LF_F32 = 0, LF_BF16 = 1, LF_F16 = 2 } lf_dtype;

LF_HD int lf_dtype_size(lf_dtype t) { return t == LF_F32 ? 4 : 2; }

/* A constant string naming a status code. */
static inline const char *lf_status_str(int s)
{
    switch (s) {
    case LF_OK: return "ok";
    case LF_ERR_NULL: return "required pointer is NULL";
    case LF_ERR_SIZE: return "size out of range";
    case LF_ERR_LABEL: return "label outside [0, V) and not the ignore index";
    case LF_ERR_SEQLENS: return "cu_seqlens not monotonic from 0 to N";
    case LF_ERR_ARG: return "option out of its domain";
    case LF_ERR_DEVICE: return "CUDA call failed";
    case LF_ERR_PAIR: return "pair index out of range, or a pair of one item with itself";
    case LF_ERR_CP: return "context parallelism: cp < 1, rank out of range, or a sequence length not a multiple of 2*cp";
    default: return "unknown status";
    }
}

/* Internal: bit casts without aliasing undefined behaviour, valid in C, C++ and device code. */
LF_HD uint32_t lf_impl_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
LF_HD float lf_impl_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
LF_HD int lf_isnan_f32(float x) { return x != x; }

/* ============================================================================================
 * 2. bf16 / fp16 <-> float
 *    Storage is the raw uint16_t bit pattern, so these work in plain C host code. Conversions
 *    to 16 bits round to nearest, ties to even; NaN stays NaN (quiet); overflow goes to inf.
 * ========================================================================================== */

LF_HD float lf_bf16_to_f32(uint16_t h) { return lf_impl_bits_f32((uint32_t)h << 16); }

LF_HD uint16_t lf_f32_to_bf16(float f)
{
    uint32_t u = lf_impl_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even; carries into the exponent */
    return (uint16_t)(u >> 16);
}

LF_HD float lf_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1fu) return lf_impl_bits_f32(sign | 0x7f800000u | (man << 13)); /* inf, NaN */
    if (exp == 0) {
        /* zero or subnormal: value = man * 2^-24, exact in float */
        float v = (float)man * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return lf_impl_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

LF_HD uint16_t lf_f32_to_f16(float f)
{
    uint32_t u = lf_impl_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
    if (a < 0x38800000u) {
        /* result is subnormal or zero: round a * 2^24 to an integer, ties to even */
        float v = lf_impl_bits_f32(a) * 16777216.0f; /* exact: a < 2^-14 so v < 2^10 */
        uint32_t i = (uint32_t)v;
        float frac = v - (float)i;
        if (frac > 0.5f || (frac == 0.5f && (i & 1u))) ++i;
        return (uint16_t)(sign | i); /* i == 0x400 becomes the smallest normal, correctly */
    }
    {
        uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* round mantissa to 10 bits, ties even */
        return (uint16_t)(sign | (((r >> 13) - (112u << 10)) & 0x7fffu));
    }
}

/* ============================================================================================
 * 3. Online log-sum-exp state
 *
 *    lf_lse holds, for the values x_j pushed so far,
 *        m = max_j x_j                    (-inf when empty; massless x_j, lf_massless, left out)
 *        s = sum_j exp(x_j - m)           (0 when empty)
 *        u = sum_j exp(x_j - m) (x_j - m) (for the entropy; 0 when empty)
 *    so that   lse = m + log(s)   and   entropy(softmax(x)) = log(s) - u / s.
 *    Keeping u relative to m (not sum p*x) avoids cancelling two large numbers when |x| ~ 1e4.
 *    u is dead code on the device when you never read it, so the lse-only cost is m and s.
 *
 *    -inf values contribute nothing (masked entries). NaN or +inf makes s NaN, and so the lse
 *    NaN, whatever else is pushed or merged later. Merge is commutative bit for bit, which is
 *    what lets a xor-butterfly leave the identical state in every lane.
 * ========================================================================================== */

typedef struct lf_lse {
    float m; /* running maximum */
    float s; /* sum of exp(x - m) */
    float u; /* sum of exp(x - m) * (x - m) */
} lf_lse;

LF_HD lf_lse lf_lse_init(void)
{
    lf_lse st;
    st.m = -LF_INF_F;
    st.s = 0.0f;
    st.u = 0.0f;
    return st;
}

/* exp(a - b) for finite b. Exactly 1 when a == b, so pushing values below the running max
 * never drifts the sum. (A one-FFMA form exp2(a*L - round(b*L)) would multiply every rescale by
 * the same 1 + O(|b| 2^-24) factor; that is only harmless when all terms share one shift.) */
LF_HD float lf_exp_diff(float a, float b)
{
#if LF_USE_EXP2
    return exp2f((a - b) * LF_LOG2E);
#else
    return expf(a - b);
#endif
}

/* Internal: the factor that moves a sum taken relative to `m_old` onto `m_new` (>= m_old),
 * and the matching update of u. The shift is 0 when m_new is -inf so that -inf - -inf never
 * forms; deltas are clamped to -FLT_MAX so that 0 * -inf never forms either. */
LF_HD void lf_impl_lse_rescale(float m_old, float m_new, float *s, float *u)
{
    float shift = (m_new == -LF_INF_F) ? 0.0f : m_new;
    float d = fmaxf(m_old - shift, -3.402823466e38f);
    float a = lf_exp_diff(m_old, shift);
    float s_new = a * *s;
    *u = fmaf(s_new, d, a * *u); /* not a * (u + s d): s d overflows for |d| > FLT_MAX / s */
    *s = s_new;
}

/* True for a value with no mass: z log2(e) overflows fp32 to -inf, which is z below about
 * -2.3587e38 (-FLT_MAX / log2 e) -- bf16's and fp32's finfo.min are (-3.39e38, -3.40e38); fp16's
 * -65504 is not. The kernels take exp(z - m) as exp2(z log2 e - m log2 e), so such an entry
 * weighs exactly 0 there, as -inf does, whatever else is in the row: a row with nothing else has
 * no mass (lse -inf, NaN loss), not a uniform distribution. The same rule is followed by
 * lf_lse_push, the cross-entropy and DPO references, the KL reference's log-sum-exp of each side
 * (lf_ref_kl_row: a side of nothing else has no distribution, both KLs NaN, as the dual-softmax
 * kernels' held shift gives) and the tensor-parallel shares (lf_tp_share_from), so every path of
 * those kernels gives one answer (at logit_scale 1 and temperature 1; another scale moves the
 * body's threshold by up to an ulp, inside the |m| > 1e7 range where cross_entropy.cu's contract
 * promises nothing). NaN is not massless. */
LF_HD int lf_massless(float z)
{
    return (float)(z * LF_LOG2E) < -3.402823466e38f; /* the cast rounds where the product has more precision */
}

/* Push one value x (a massless x, lf_massless, counts as -inf). */
LF_HD void lf_lse_push(lf_lse *st, float x)
{
    float m_new, shift, e, d;
    if (lf_massless(x)) x = -LF_INF_F;
    m_new = fmaxf(st->m, x); /* fmaxf ignores a NaN x: the NaN reaches s below */
    shift = (m_new == -LF_INF_F) ? 0.0f : m_new;
    lf_impl_lse_rescale(st->m, m_new, &st->s, &st->u);
    e = lf_exp_diff(x, shift); /* NaN for x NaN, and for x == +inf (inf - inf) */
    d = fmaxf(x - shift, -3.402823466e38f);
    st->s += e;
    st->u = fmaf(e, d, st->u);
    st->m = m_new;
}

/* Merge two states (order does not matter, bit for bit). */
LF_HD lf_lse lf_lse_merge(lf_lse a, lf_lse b)
{
    lf_lse r;
    r.m = fmaxf(a.m, b.m);
    if (r.m == 0.0f) r.m = 0.0f; /* fmaxf(+0, -0) may return either zero: pick +0 */
    if (lf_isnan_f32(a.m) || lf_isnan_f32(b.m)) r.m = a.m + b.m; /* keep NaN sticky */
    lf_impl_lse_rescale(a.m, r.m, &a.s, &a.u);
    lf_impl_lse_rescale(b.m, r.m, &b.s, &b.u);
    r.s = a.s + b.s;
    r.u = a.u + b.u;
    return r;
}

/* log(sum(exp(x))): -inf for an empty or all -inf state, NaN if a NaN or +inf was pushed. */
LF_HD float lf_lse_final(lf_lse st)
{
    if (st.s == 0.0f) return -LF_INF_F;
    return st.m + logf(st.s);
}

/* Entropy of softmax(x) in nats: log(s) - u/s. NaN for an empty state (no distribution). */
LF_HD float lf_lse_entropy(lf_lse st)
{
    if (st.s == 0.0f) return NAN;
    return logf(st.s) - st.u / st.s;
}

/* Argmax tracking: the largest value and its index; the first index on ties; NaN counts as
 * larger than any number (as torch.argmax does), the first NaN wins. Empty: index -1. */
typedef struct lf_argmax {
    float v;
    int32_t i;
} lf_argmax;

LF_HD lf_argmax lf_argmax_init(void)
{
    lf_argmax a;
    a.v = -LF_INF_F;
    a.i = -1;
    return a;
}

/* True when (v, i) should replace (best, best_i). */
LF_HD int lf_impl_argmax_better(float v, int32_t i, float best, int32_t best_i)
{
    int vn = lf_isnan_f32(v), bn = lf_isnan_f32(best);
    if (i < 0) return 0;      /* an empty state never replaces anything (not even on a -inf tie) */
    if (best_i < 0) return 1;
    if (vn || bn) return vn && (!bn || i < best_i);
    return v > best || (v == best && i < best_i);
}

LF_HD void lf_argmax_push(lf_argmax *a, float v, int32_t i)
{
    if (lf_impl_argmax_better(v, i, a->v, a->i)) {
        a->v = v;
        a->i = i;
    }
}

LF_HD lf_argmax lf_argmax_merge(lf_argmax a, lf_argmax b)
{
    return lf_impl_argmax_better(b.v, b.i, a.v, a.i) ? b : a;
}

/* Everything a single read of a logits row can produce: the lse state of the transformed
 * logits z (with entropy), the argmax of the raw logits x, and for label smoothing the
 * weighted sum sum_j w_j z_j and sum_j w_j (w_j = 1 without class weights). A zero weight
 * contributes nothing, even against a -inf logit. Merge is commutative bit for bit. */
typedef struct lf_row_stats {
    lf_lse lse;
    lf_argmax am;
    float wz;
    float w;
} lf_row_stats;

LF_HD lf_row_stats lf_row_stats_init(void)
{
    lf_row_stats r;
    r.lse = lf_lse_init();
    r.am = lf_argmax_init();
    r.wz = 0.0f;
    r.w = 0.0f;
    return r;
}

/* Push element j with raw logit x, transformed logit z and class weight w. */
LF_HD void lf_row_stats_push(lf_row_stats *r, float x, float z, float w, int32_t j)
{
    lf_lse_push(&r->lse, z);
    lf_argmax_push(&r->am, x, j);
    r->wz += (w != 0.0f) ? w * z : 0.0f;
    r->w += w;
}

LF_HD lf_row_stats lf_row_stats_merge(lf_row_stats a, lf_row_stats b)
{
    lf_row_stats r;
    r.lse = lf_lse_merge(a.lse, b.lse);
    r.am = lf_argmax_merge(a.am, b.am);
    r.wz = a.wz + b.wz;
    r.w = a.w + b.w;
    return r;
}

/* ============================================================================================
 * 3b. Dual log-sum-exp state: two distributions over one vocabulary, one pass
 *    For a student row a (logits already transformed: temperature, cap) and a teacher row b,
 *    one sweep of (a_j, b_j) pairs gives both log-sum-exps, both entropies and the cross terms
 *        ra = sum_j exp(a_j - ma) (a_j - b_j)      rb = sum_j exp(b_j - mb) (b_j - a_j)
 *    from which (p = softmax(a), q = softmax(b))
 *        KL(q || p) = rb / sb + (lse_a - lse_b)          forward KL (teacher || student)
 *        KL(p || q) = ra / sa + (lse_b - lse_a)          reverse KL (student || teacher)
 *        -sum_j q_j log p_j = KL(q || p) + H(q)          soft-target cross-entropy
 *    The cross terms only scale when a maximum moves (a_j - b_j does not depend on it).
 *    Usage:
 *        lf_dual st = lf_dual_init();
 *        for (j = 0; j < V; ++j) lf_dual_push(&st, a[j], b[j]);
 *        lf_dual_out o = lf_dual_final(st);   // o.kl_fwd, o.kl_rev, o.lse_a, o.ent_b, ...
 *    Conventions: a -inf entry has probability 0 and 0 log 0 = 0, so an entry masked on both
 *    sides contributes nothing. An entry with mass on one side only makes the KL that needs it
 *    +inf: KL(q || p) when b_j > -inf = a_j (even if q_j underflows), KL(p || q) in the mirror
 *    case. A side with no mass at all (every entry -inf, or V = 0) has no distribution: both
 *    KLs are NaN. NaN or +inf on a side makes that side's lse and both KLs NaN.
 *    Merge is commutative bit for bit, like lf_lse_merge.
 * ========================================================================================== */

typedef struct lf_dual {
    lf_lse a, b;  /* student and teacher: max, sum, entropy term (as lf_lse) */
    float ra, rb; /* cross terms above, relative to a.m and b.m */
} lf_dual;

typedef struct lf_dual_out {
    float lse_a, lse_b; /* log-sum-exps */
    float ent_a, ent_b; /* entropies in nats (NaN for a side without mass) */
    float kl_fwd;       /* KL(q || p): teacher || student */
    float kl_rev;       /* KL(p || q): student || teacher */
} lf_dual_out;

LF_HD lf_dual lf_dual_init(void)
{
    lf_dual d;
    d.a = lf_lse_init();
    d.b = lf_lse_init();
    d.ra = 0.0f;
    d.rb = 0.0f;
    return d;
}

/* Internal: the factor that moves a sum taken relative to m_old onto m_new >= m_old (0 when
 * the old sum is empty; NaN when both are +inf: the +inf itself poisons the sum). */
LF_HD float lf_impl_lse_factor(float m_old, float m_new)
{
    float shift = (m_new == -LF_INF_F) ? 0.0f : m_new;
    return lf_exp_diff(m_old, shift);
}

/* Internal: one side's cross term e (x - y) for an element with weight e = exp(x - m). */
LF_HD float lf_impl_dual_term(float e, float x, float y)
{
    if (x > -LF_INF_F && y == -LF_INF_F) return LF_INF_F; /* mass here, none there */
    return e == 0.0f ? 0.0f : e * (x - y);                /* 0 log 0 = 0 */
}

/* Internal: a cross term moved by factor f: 0 and +inf (a support mismatch) stay what they
 * are — an underflowing f must not turn +inf into NaN — and a NaN f poisons it. */
LF_HD float lf_impl_dual_scale(float r, float f)
{
    if (f != f) return f;
    return (r == 0.0f || r == LF_INF_F) ? r : r * f;
}

/* Push one pair: student logit a, teacher logit b (both transformed). */
LF_HD void lf_dual_push(lf_dual *d, float a, float b)
{
    float fa = lf_impl_lse_factor(d->a.m, fmaxf(d->a.m, a));
    float fb = lf_impl_lse_factor(d->b.m, fmaxf(d->b.m, b));
    float ea, eb;
    d->ra = lf_impl_dual_scale(d->ra, fa);
    d->rb = lf_impl_dual_scale(d->rb, fb);
    lf_lse_push(&d->a, a);
    lf_lse_push(&d->b, b);
    ea = lf_exp_diff(a, d->a.m == -LF_INF_F ? 0.0f : d->a.m);
    eb = lf_exp_diff(b, d->b.m == -LF_INF_F ? 0.0f : d->b.m);
    d->ra += lf_impl_dual_term(ea, a, b);
    d->rb += lf_impl_dual_term(eb, b, a);
}

/* Merge two states over disjoint parts of the same pair of rows (order does not matter, bit
 * for bit). */
LF_HD lf_dual lf_dual_merge(lf_dual x, lf_dual y)
{
    lf_dual r;
    float ma = fmaxf(x.a.m, y.a.m), mb = fmaxf(x.b.m, y.b.m);
    float xa = lf_impl_lse_factor(x.a.m, ma), ya = lf_impl_lse_factor(y.a.m, ma);
    float xb = lf_impl_lse_factor(x.b.m, mb), yb = lf_impl_lse_factor(y.b.m, mb);
    r.a = lf_lse_merge(x.a, y.a);
    r.b = lf_lse_merge(x.b, y.b);
    r.ra = lf_impl_dual_scale(x.ra, xa) + lf_impl_dual_scale(y.ra, ya);
    r.rb = lf_impl_dual_scale(x.rb, xb) + lf_impl_dual_scale(y.rb, yb);
    return r;
}

/* Internal: lf_dual_final where a caller that tracked only some terms says which (ent: the
 * entropy terms u, fwd: rb, rev: ra); an untracked term is taken as 0 (its division skipped),
 * which gives the bits lf_dual_final gives on a state whose term is 0. */
LF_HD lf_dual_out lf_impl_dual_final(lf_dual d, int ent, int fwd, int rev)
{
    /* lf_lse_final and lf_lse_entropy of both sides, written out so that each log is taken
     * once (the same values: logf(0) = -inf is never used) */
    const float la = logf(d.a.s), lb = logf(d.b.s);
    lf_dual_out o;
    o.lse_a = d.a.s == 0.0f ? -LF_INF_F : d.a.m + la;
    o.lse_b = d.b.s == 0.0f ? -LF_INF_F : d.b.m + lb;
    o.ent_a = d.a.s == 0.0f ? NAN : la - (ent ? d.a.u / d.a.s : 0.0f);
    o.ent_b = d.b.s == 0.0f ? NAN : lb - (ent ? d.b.u / d.b.s : 0.0f);
    if (!(d.a.s > 0.0f) || !(d.b.s > 0.0f) || o.lse_a != o.lse_a || o.lse_b != o.lse_b) {
        o.kl_fwd = NAN; /* a side without a distribution, or poisoned */
        o.kl_rev = NAN;
        return o;
    }
    {
        /* lse_a - lse_b as (ma - mb) + (log sa - log sb): the maxima cancel before rounding, so a
         * small KL between rows of logits ~1e4 keeps its digits */
        float dl = (d.a.m - d.b.m) + (la - lb);
        o.kl_fwd = !fwd ? dl : d.rb == LF_INF_F ? LF_INF_F : d.rb / d.b.s + dl;
        o.kl_rev = !rev ? -dl : d.ra == LF_INF_F ? LF_INF_F : d.ra / d.a.s - dl;
    }
    return o;
}

LF_HD lf_dual_out lf_dual_final(lf_dual d) { return lf_impl_dual_final(d, 1, 1, 1); }

/* ============================================================================================
 * 3c. Scalar pair losses (preference optimisation, ranking), each with its derivative
 *    All float, host and device, NaN in -> NaN out; a finite input gives a finite result
 *    but for the exceptions listed at the end of this comment.
 *    The derivative goes to *d (may be NULL) with respect to the function's first argument.
 *        lf_softplus(x)       log(1 + e^x)             lf_log_sigmoid(x)  log sigma(x) = -softplus(-x)
 *        lf_sigmoid(x)        1 / (1 + e^-x)
 *    DPO family, on the log-ratio margin h = (log pi(y_c) - log ref(y_c)) - (log pi(y_r) -
 *    log ref(y_r)) in nats (sums over each response's tokens):
 *        lf_dpo_sigmoid(h, beta, eps)  -(1 - eps) log sigma(beta h) - eps log sigma(-beta h)
 *                                      (eps = label smoothing: conservative DPO; eps = 0: DPO)
 *        lf_dpo_hinge(h, beta)         max(0, 1 - beta h)                 (SLiC / RSO hinge)
 *        lf_dpo_ipo(h, beta)           (h - 1 / (2 beta))^2              (IPO; h averaged per
 *                                                                       token by the caller if wanted)
 *        lf_simpo(m, beta, gamma)      -log sigma(beta m - gamma), m = mean log pi(y_c) - mean
 *                                      log pi(y_r) (length-normalised, no reference)
 *    Pairwise ranking on a score difference d = s_i - s_j:
 *        lf_bt(d, t, scale)            -t log sigma(scale d) - (1 - t) log sigma(-scale d)
 *                                      (Bradley-Terry with a soft target t = P(i beats j))
 *        lf_hinge_margin(d, y, margin, scale)  max(0, margin - y scale d), y = +1 or -1
 *    At a hinge's corner the derivative is taken as 0 (the loss is 0 there). A zero weight
 *    (eps, t, 1 - eps, 1 - t) drops its term, even an infinite one. Exceptions to "finite in,
 *    finite out": inputs whose product with beta / scale overflows float give infinite losses,
 *    and IPO's square overflows (+inf loss, infinite derivative) once |h - 1 / (2 beta)| passes
 *    ~1.8e19. lf_bt takes t in [0, 1] and lf_hinge_margin y = +-1; other values are not checked
 *    here (lf_pref_target_ok judges them; lf_ref_pairwise_preference refuses them with
 *    LF_ERR_PAIR; examples/pairwise_preference.cu counts them as bad pairs).
 * ========================================================================================== */

LF_HD float lf_softplus(float x)
{
    /* max(x, 0) + log1p(e^-|x|): exact to rounding for every x, e^x for x << 0 */
    return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
}

LF_HD float lf_log_sigmoid(float x) { return -lf_softplus(-x); }

LF_HD float lf_sigmoid(float x)
{
    /* the form that never divides inf by inf: e^x / (1 + e^x) for x < 0 */
    float e = expf(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

/* Internal: wa a + wb b where a zero weight drops its term (0 * inf is 0 here, not NaN). */
LF_HD float lf_impl_wsum(float wa, float a, float wb, float b)
{
    return (wa == 0.0f ? 0.0f : wa * a) + (wb == 0.0f ? 0.0f : wb * b);
}

LF_HD float lf_dpo_sigmoid(float h, float beta, float eps, float *d)
{
    float z = beta * h;
    /* sigma(z) - (1 - eps) written as eps - sigma(-z): no cancellation when z >> 0 (where
     * sigma(z) rounds to 1 and the true derivative is ~ -beta e^-z) */
    if (d) *d = beta * (eps - lf_sigmoid(-z));
    return lf_impl_wsum(1.0f - eps, lf_softplus(-z), eps, lf_softplus(z));
}

LF_HD float lf_dpo_hinge(float h, float beta, float *d)
{
    float z = 1.0f - beta * h;
    if (d) *d = z > 0.0f ? -beta : (z == z ? 0.0f : z);
    return z > 0.0f ? z : (z == z ? 0.0f : z);
}

LF_HD float lf_dpo_ipo(float h, float beta, float *d)
{
    float r = h - 0.5f / beta;
    if (d) *d = 2.0f * r;
    return r * r;
}

LF_HD float lf_simpo(float m, float beta, float gamma, float *d)
{
    float z = beta * m - gamma;
    if (d) *d = -beta * lf_sigmoid(-z);
    return lf_softplus(-z);
}

LF_HD float lf_bt(float diff, float t, float scale, float *d)
{
    float z = scale * diff;
    /* sigma(z) - t, or the same as (1 - t) - sigma(-z) when t >= 1/2: no cancellation for a
     * confident target and a large margin */
    if (d) *d = scale * (t >= 0.5f ? (1.0f - t) - lf_sigmoid(-z) : lf_sigmoid(z) - t);
    return lf_impl_wsum(t, lf_softplus(-z), 1.0f - t, lf_softplus(z));
}

LF_HD float lf_hinge_margin(float diff, float y, float margin, float scale, float *d)
{
    float z = margin - y * scale * diff;
    if (d) *d = z > 0.0f ? -y * scale : (z == z ? 0.0f : z);
    return z > 0.0f ? z : (z == z ? 0.0f : z);
}

/* ============================================================================================
 * 3d. Order-free sums of floats (lf_xsum)
 *    A finite float is exactly M 2^(E - 150): M < 2^24 an integer (the significand with its
 *    hidden bit), E = max(biased exponent, 1). lf_xsum holds the EXACT sum of any set of finite
 *    floats as LF_XSUM_BUCKETS signed 64-bit integers: bucket E >> 3 counts in units of
 *    2^(8 (E >> 3) - 150), and a value adds M << (E & 7) (below 2^31 in magnitude) to it, so a
 *    bucket takes 2^32 adds without overflow; NaN, +inf and -inf are counted apart. Integer
 *    addition commutes and associates: the buckets, and lf_xsum_value's double made from them,
 *    are the same bits whatever order the values came in and however the sums were split and
 *    merged. That is what lets a kernel hand its rows out dynamically (whichever CTA is free
 *    takes the next row) and still report a batch sum bit-identical run to run, which a double
 *    running sum per CTA is not (its rounding depends on which rows the CTA got).
 *      lf_xsum s; lf_xsum_init(&s);  lf_xsum_add(&s, v) ...  lf_xsum_merge(&s, &t);
 *      double total = lf_xsum_value(&s);   NaN if any NaN or both infinities, else +-inf if one
 *    lf_xsum_value rounds each bucket to double and adds them from the largest: relative error
 *    ~1e-15 of the sum of magnitudes, a fixed function of the buckets. At most 2^32 adds (and
 *    merged adds) in all. On the device, lossfuse_cuda.cuh's lf_xsum_atomic_add adds a value to
 *    a sum in global memory with one integer reduction, from any thread in any order.
 * ========================================================================================== */

#define LF_XSUM_BUCKETS 32
typedef struct lf_xsum {
    long long b[LF_XSUM_BUCKETS]; /* bucket i: units of 2^(8 i - 150) */
    unsigned int nan, pinf, ninf, pad;
} lf_xsum;

LF_HD void lf_xsum_init(lf_xsum *s) { memset(s, 0, sizeof *s); }

/* The bucket and the signed integer a finite float adds there; 0 for NaN / inf (whose kind is
 * *special: 1 NaN, 2 +inf, 3 -inf). */
LF_HD long long lf_xsum_term(float v, int *bucket, int *special)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    const uint32_t e = (u >> 23) & 255u, mant = u & 0x7fffffu;
    if (e == 255u) {
        *special = mant ? 1 : (u >> 31) ? 3 : 2;
        *bucket = 0;
        return 0;
    }
    const uint32_t ee = e ? e : 1u; /* subnormals: M = mant, E = 1 */
    const long long m = (long long)((e ? 0x800000u : 0u) | mant) << (ee & 7u);
    *special = 0;
    *bucket = (int)(ee >> 3);
    return (u >> 31) ? -m : m;
}

LF_HD void lf_xsum_add(lf_xsum *s, float v)
{
    int b, sp;
    const long long t = lf_xsum_term(v, &b, &sp);
    if (sp == 1) ++s->nan;
    else if (sp == 2) ++s->pinf;
    else if (sp == 3) ++s->ninf;
    else s->b[b] += t;
}

LF_HD void lf_xsum_merge(lf_xsum *s, const lf_xsum *t)
{
    for (int i = 0; i < LF_XSUM_BUCKETS; ++i) s->b[i] += t->b[i];
    s->nan += t->nan;
    s->pinf += t->pinf;
    s->ninf += t->ninf;
}

LF_HD double lf_xsum_value(const lf_xsum *s)
{
    if (s->nan || (s->pinf && s->ninf)) return (double)NAN;
    if (s->pinf) return (double)INFINITY;
    if (s->ninf) return -(double)INFINITY;
    double r = 0.0;
    for (int i = LF_XSUM_BUCKETS - 1; i >= 0; --i) {
        if (s->b[i] == 0) continue;
        /* 2^(8 i - 150), a normal double: built from its bits (ldexp is a call on the device) */
        const uint64_t bits = (uint64_t)(8 * i - 150 + 1023) << 52;
        double scale;
        memcpy(&scale, &bits, sizeof scale);
        r += (double)s->b[i] * scale;
    }
    return r;
}

/* ============================================================================================
 * 4. Logit transform
 *    z = softcap(scale * x), softcap(y) = c * tanh(y / c) when c > 0 (Gemma-style).
 *    -inf stays -inf (a masked entry stays masked under the softcap); +inf becomes NaN so that
 *    the softcap cannot turn an overflowed logit into a finite one. NaN stays NaN.
 *    dz/dx = scale * (1 - (z/c)^2) under the softcap, scale without it.
 * ========================================================================================== */

LF_HD float lf_softcap(float y, float c)
{
    if (y == -LF_INF_F) return y;
    if (y == LF_INF_F) return NAN;
    return c * tanhf(y / c);
}

/* The transform applied to every logit before the softmax. softcap <= 0 disables the cap. */
LF_HD float lf_logit_xform(float x, float scale, float softcap)
{
    float y = x * scale;
    return softcap > 0.0f ? lf_softcap(y, softcap) : y;
}

/* dz/dx of lf_logit_xform at x (0 at a masked -inf entry under the softcap). */
LF_HD float lf_logit_xform_grad(float x, float scale, float softcap)
{
    if (softcap > 0.0f) {
        float t = tanhf(x * scale / softcap);
        return scale * (1.0f - t * t);
    }
    return scale;
}

/* ============================================================================================
 * 5. Packed sequences
 *    A packed buffer holds `nseq` sequences back to back; cu_seqlens[0] = 0 and sequence k
 *    occupies tokens [cu_seqlens[k], cu_seqlens[k+1]). Empty sequences are allowed.
 * ========================================================================================== */

/* The sequence that token t belongs to (binary search; the non-empty one when empty sequences
 * share its start), or -1 when t is outside [0, cu_seqlens[nseq]). O(log nseq). */
LF_HD int64_t lf_seq_find(const int32_t *cu_seqlens, int64_t nseq, int64_t t)
{
    int64_t lo = 0, hi = nseq; /* invariant: cu[lo] <= t < cu[hi] */
    if (nseq <= 0 || t < cu_seqlens[0] || t >= cu_seqlens[nseq]) return -1;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (cu_seqlens[mid] <= t) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Next-token label of position t: ids[t + 1] when t + 1 is in the same sequence, else
 * `ignore_index` (the last token of a sequence has no target; the label never crosses a
 * boundary). Also `ignore_index` for t outside the buffer. */
LF_HD int64_t lf_packed_next_label(const int32_t *cu_seqlens, int64_t nseq, const int64_t *ids,
                                   int64_t t, int64_t ignore_index)
{
    int64_t k = lf_seq_find(cu_seqlens, nseq, t);
    if (k < 0 || t + 1 >= cu_seqlens[k + 1]) return ignore_index;
    return ids[t + 1];
}

/* ============================================================================================
 * 6. Host validation. Each returns LF_OK or an error code, never aborts.
 * ========================================================================================== */

/* Labels (int32 when is_i64 == 0, else int64): each in [0, V) or equal to ignore_index.
 * *n_bad (if not NULL) receives the number of bad labels, *first_bad (if not NULL) the index
 * of the first one or -1. */
static inline lf_status lf_check_labels(const void *labels, int is_i64, int64_t n, int64_t V,
                                        int64_t ignore_index, int64_t *n_bad, int64_t *first_bad)
{
    int64_t bad = 0, first = -1, i;
    if (n_bad) *n_bad = 0;
    if (first_bad) *first_bad = -1;
    if (n < 0 || V < 0) return LF_ERR_SIZE;
    if (n > 0 && !labels) return LF_ERR_NULL;
    for (i = 0; i < n; ++i) {
        int64_t y = is_i64 ? ((const int64_t *)labels)[i] : (int64_t)((const int32_t *)labels)[i];
        if (y != ignore_index && (y < 0 || y >= V)) {
            if (first < 0) first = i;
            ++bad;
        }
    }
    if (n_bad) *n_bad = bad;
    if (first_bad) *first_bad = first;
    return bad ? LF_ERR_LABEL : LF_OK;
}

/* cu_seqlens[0] == 0, non-decreasing, cu_seqlens[nseq] == total. */
static inline lf_status lf_check_cu_seqlens(const int32_t *cu_seqlens, int64_t nseq, int64_t total)
{
    int64_t k;
    if (nseq < 0 || total < 0) return LF_ERR_SIZE;
    if (!cu_seqlens) return LF_ERR_NULL;
    if (cu_seqlens[0] != 0) return LF_ERR_SEQLENS;
    for (k = 0; k < nseq; ++k)
        if (cu_seqlens[k + 1] < cu_seqlens[k]) return LF_ERR_SEQLENS;
    return cu_seqlens[nseq] == total ? LF_OK : LF_ERR_SEQLENS;
}

/* ============================================================================================
 * 7. Host references: cross-entropy
 *
 *    Per row i with label y (z = lf_logit_xform(x), lse = log sum_j exp z_j, w = class weights
 *    or all ones, W = sum_j w_j, eps = label smoothing, lam = z-loss scale):
 *        ce_i     = w_y (lse - z_y)
 *        smooth_i = (W lse - sum_j w_j z_j) / V        (= sum_j w_j (-log p_j) / V)
 *        z_i      = lam lse^2
 *        loss_i   = (1 - eps) ce_i + eps smooth_i + z_i
 *    as in torch.nn.functional.cross_entropy(weight, label_smoothing) plus PaLM's z-loss.
 *    Ignored rows (y == ignore_index) and bad rows (y outside [0, V)) have loss 0, gradient 0
 *    and weight 0. reduction mean divides by `divisor`, or by sum_i w_{y_i} over valid rows when
 *    divisor < 0; a zero divisor gives loss 0 and gradient 0 — unless a valid row is NaN, which
 *    stays NaN (the mean of nothing is 0, but a NaN is never hidden).
 *    The gradient with respect to z_j is
 *        p_j ((1-eps) w_y + eps W / V + 2 lam lse) - (1-eps) w_y [j == y] - eps w_j / V
 *    times dz_j/dx_j (lf_logit_xform_grad). A valid row whose lse is not finite (a NaN or +inf
 *    logit, or every logit -inf) has NaN loss and an all-NaN gradient.
 * ========================================================================================== */

/* A result against its reference, for the checks of tests and examples: how far `got` is from
 * `want` in units of `tol`. 0 where both are NaN, or equal (the same infinity included); +inf
 * where exactly one is NaN, where one is infinite and the other is not the same infinity, or
 * where they differ and tol is 0 or NaN; else |got - want| / tol. Never NaN: a check that
 * keeps the worst error with fmax drops a NaN, and could not fail on the very values (a
 * non-finite output) it exists to catch. */
static inline double lf_check_err(double got, double want, double tol)
{
    const double inf = (double)LF_INF_F;
    double e;
    if (got != got || want != want) return (got != got && want != want) ? 0.0 : inf;
    if (got == want) return 0.0;
    if (fabs(got) == inf || fabs(want) == inf) return inf;
    e = fabs(got - want) / tol;
    return e == e ? e : inf;
}

typedef enum lf_reduction { LF_REDUCE_NONE = 0, LF_REDUCE_SUM = 1, LF_REDUCE_MEAN = 2 } lf_reduction;

typedef struct lf_ce_opts {
    int64_t ignore_index;       /* default -100 */
    float label_smoothing;      /* eps in [0, 1]; default 0 */
    float z_loss;               /* lam >= 0; default 0 */
    float softcap;              /* c > 0 enables the tanh cap; default 0 (off) */
    float logit_scale;          /* scale > 0 applied before the cap (1/temperature); default 1 */
    const float *class_weights; /* [V] per-class weights or NULL */
} lf_ce_opts;

static inline lf_ce_opts lf_ce_opts_default(void)
{
    lf_ce_opts o;
    o.ignore_index = -100;
    o.label_smoothing = 0.0f;
    o.z_loss = 0.0f;
    o.softcap = 0.0f;
    o.logit_scale = 1.0f;
    o.class_weights = NULL;
    return o;
}

/* LF_OK, or LF_ERR_ARG when an option is outside its domain (NaN included). */
static inline lf_status lf_check_ce_opts(const lf_ce_opts *o)
{
    if (!o) return LF_ERR_NULL;
    if (!(o->label_smoothing >= 0.0f && o->label_smoothing <= 1.0f)) return LF_ERR_ARG;
    if (!(o->z_loss >= 0.0f) || o->z_loss == LF_INF_F || !(o->softcap >= 0.0f)) return LF_ERR_ARG;
    if (!(o->logit_scale > 0.0f) || o->logit_scale == LF_INF_F) return LF_ERR_ARG;
    if (o->softcap == LF_INF_F) return LF_ERR_ARG;
    return LF_OK;
}

/* Row status reported by the references (and by the kernels' error counter for BAD). */
enum { LF_ROW_OK = 0, LF_ROW_IGNORED = 1, LF_ROW_BAD_LABEL = 2 };

/* Everything the references know about one row, in double. */
typedef struct lf_ce_row {
    double loss;     /* loss_i as above (0 for ignored / bad rows) */
    double z_term;   /* lam lse^2 (0 for ignored / bad rows) */
    double lse;      /* log-sum-exp of z (computed for every row) */
    double logprob;  /* z_y - lse, the label's log-probability (0 for ignored / bad rows) */
    double entropy;  /* entropy of softmax(z) in nats */
    double weight;   /* w_y for valid rows, 0 otherwise (the mean's default divisor term) */
    int64_t argmax;  /* argmax of the raw logits x: first index on ties, NaN counts as largest */
    int status;      /* LF_ROW_OK, LF_ROW_IGNORED or LF_ROW_BAD_LABEL */
} lf_ce_row;

/* Internal: z_j of the reference in double. The same special cases as lf_logit_xform. */
static inline double lf_impl_ref_xform(float x, const lf_ce_opts *o)
{
    double y = (double)x * (double)o->logit_scale;
    double c = (double)o->softcap;
    if (c <= 0.0) return y;
    if (y == -(double)LF_INF_F) return y;
    if (y == (double)LF_INF_F || y != y) return (double)NAN;
    return c * tanh(y / c);
}

static inline double lf_impl_ref_xform_grad(float x, const lf_ce_opts *o)
{
    double c = (double)o->softcap, s = (double)o->logit_scale;
    if (c > 0.0) {
        double t = tanh((double)x * s / c);
        return s * (1.0 - t * t);
    }
    return s;
}

/* One row of the cross-entropy reference. x: V raw logits. dx (if not NULL, V doubles) gets
 * d loss_i / d x_j (unreduced, unscaled); it is all zeros for ignored and bad rows. */
static inline lf_ce_row lf_ref_ce_row(const float *x, int64_t V, int64_t label, const lf_ce_opts *o,
                                      double *dx)
{
    lf_ce_row r;
    double m = -(double)LF_INF_F, s = 0.0, spz = 0.0, wz = 0.0, W = 0.0, lse, wy, eps, lam;
    int bad_num = 0;
    int64_t j;
    lf_argmax am = lf_argmax_init();
    memset(&r, 0, sizeof r);
    for (j = 0; j < V; ++j) {
        double z = lf_impl_ref_xform(x[j], o);
        if (z != z || z == (double)LF_INF_F) bad_num = 1;
        else if (z > m && !lf_massless((float)z)) m = z; /* as the kernels: no massless maximum */
        lf_argmax_push(&am, x[j], (int32_t)j);
    }
    r.argmax = am.i;
    if (bad_num) lse = (double)NAN;
    else if (m == -(double)LF_INF_F) lse = -(double)LF_INF_F;
    else {
        for (j = 0; j < V; ++j) {
            double z = lf_impl_ref_xform(x[j], o);
            if (z != -(double)LF_INF_F) s += exp(z - m);
        }
        lse = m + log(s);
        for (j = 0; j < V; ++j) {
            double z = lf_impl_ref_xform(x[j], o);
            if (z != -(double)LF_INF_F) spz += exp(z - lse) * (lse - z);
        }
    }
    r.lse = lse;
    r.entropy = (bad_num || m == -(double)LF_INF_F) ? (double)NAN : spz;
    if (dx)
        for (j = 0; j < V; ++j) dx[j] = 0.0;
    if (label == o->ignore_index) {
        r.status = LF_ROW_IGNORED;
        return r;
    }
    if (label < 0 || label >= V) {
        r.status = LF_ROW_BAD_LABEL;
        return r;
    }
    eps = (double)o->label_smoothing;
    lam = (double)o->z_loss;
    wy = o->class_weights ? (double)o->class_weights[label] : 1.0;
    for (j = 0; j < V; ++j) {
        double w = o->class_weights ? (double)o->class_weights[j] : 1.0;
        W += w;
        if (eps > 0.0 && w != 0.0) wz += w * lf_impl_ref_xform(x[j], o);
    }
    {
        double zy = lf_impl_ref_xform(x[label], o);
        double ce = wy * (lse - zy);
        double sm = eps > 0.0 ? (W * lse - wz) / (double)V : 0.0;
        r.z_term = lam * lse * lse;
        r.loss = (1.0 - eps) * ce + eps * sm + r.z_term;
        r.logprob = zy - lse;
        r.weight = wy;
    }
    if (dx && !(lse > -(double)LF_INF_F && lse < (double)LF_INF_F)) {
        for (j = 0; j < V; ++j) dx[j] = (double)NAN; /* no distribution: NaN, never a guess */
    } else if (dx) {
        double a = (1.0 - eps) * wy + eps * W / (double)V + 2.0 * lam * lse;
        for (j = 0; j < V; ++j) {
            double z = lf_impl_ref_xform(x[j], o);
            double w = o->class_weights ? (double)o->class_weights[j] : 1.0;
            double p = (z == -(double)LF_INF_F) ? 0.0 : exp(z - lse);
            double g = a * p - eps * w / (double)V - (j == label ? (1.0 - eps) * wy : 0.0);
            dx[j] = g * lf_impl_ref_xform_grad(x[j], o);
        }
    }
    return r;
}

/* The whole cross-entropy reference over N rows of `logits` (row i at logits + i * stride).
 *   loss_out : N doubles for LF_REDUCE_NONE, else 1 (may be NULL)
 *   z_out    : the z-loss term reduced the same way (may be NULL)
 *   grad     : N * V doubles (row stride V) or NULL: the gradient of the reduced loss
 *              (of sum_i loss_i for LF_REDUCE_NONE) with respect to the raw logits
 *   n_bad    : number of rows with a bad label (may be NULL)
 * divisor < 0 means the default mean divisor (sum of w_y over valid rows).
 * Returns LF_OK, or LF_ERR_* for bad arguments; bad labels are counted, not an error. */
static inline lf_status lf_ref_cross_entropy(int64_t N, int64_t V, const float *logits, int64_t stride,
                                             const int64_t *labels, const lf_ce_opts *o,
                                             lf_reduction red, double divisor, double *loss_out,
                                             double *z_out, double *grad, int64_t *n_bad)
{
    double sum = 0.0, zsum = 0.0, wsum = 0.0, inv;
    int64_t i, j, bad = 0;
    lf_status st = lf_check_ce_opts(o);
    if (st != LF_OK) return st;
    if (N < 0 || V < 0 || stride < V) return LF_ERR_SIZE;
    if (N > 0 && (!logits || !labels)) return LF_ERR_NULL;
    for (i = 0; i < N; ++i) {
        lf_ce_row r = lf_ref_ce_row(logits + i * stride, V, labels[i], o, grad ? grad + i * V : NULL);
        if (r.status == LF_ROW_BAD_LABEL) ++bad;
        if (red == LF_REDUCE_NONE) {
            if (loss_out) loss_out[i] = r.loss;
            if (z_out) z_out[i] = r.z_term;
        }
        sum += r.loss;
        zsum += r.z_term;
        wsum += r.weight;
    }
    if (n_bad) *n_bad = bad;
    if (red == LF_REDUCE_NONE) return LF_OK;
    inv = 1.0;
    if (red == LF_REDUCE_MEAN) {
        double d = divisor < 0.0 ? wsum : divisor;
        inv = d == 0.0 ? 0.0 : 1.0 / d;
    }
    if (loss_out) loss_out[0] = sum * inv;
    if (z_out) z_out[0] = zsum * inv;
    if (grad && inv != 1.0)
        for (i = 0; i < N; ++i)
            for (j = 0; j < V; ++j) grad[i * V + j] *= inv;
    return LF_OK;
}

/* ============================================================================================
 * 8. Host references: distillation (the KL family)
 *    Student raw logits x_s, teacher raw logits x_t, rows of V. Both sides are transformed alike:
 *        z = softcap_c(x) / tau     (c = 0: no cap; the cap first, as the model applies it,
 *                                    then the distillation temperature)
 *    p = softmax(z_s) (student), q = softmax(z_t) (teacher), per row:
 *        LF_KL_FORWARD  KL(q || p) = sum_j q_j (log q_j - log p_j)
 *        LF_KL_REVERSE  KL(p || q)
 *        LF_KL_JSD      beta KL(q || M) + (1 - beta) KL(p || M),  M = beta q + (1 - beta) p;
 *                       beta = 0 is LF_KL_FORWARD and beta = 1 is LF_KL_REVERSE, as in the
 *                       generalised JSD of GKD / TRL (those ends are the limits of
 *                       JSD / (beta (1 - beta)) as beta -> 0 and 1).
 *        LF_KL_SOFT_CE  -sum_j q_j log p_j  (= KL(q || p) + H(q))
 *        LF_KL_TVD      1/2 sum_j |p_j - q_j|
 *    Gradient with respect to z_s,j (times dz/dx = (1 - tanh^2(x / c)) / tau to get d/dx_s,j):
 *        forward, soft CE   p_j - q_j
 *        reverse            p_j (log p_j - log q_j - KL(p || q))
 *        JSD, 0 < beta < 1  (1 - beta) p_j (log p_j - log M_j - KL(p || M))
 *        TVD                1/2 p_j (s_j - sum_k s_k p_k),  s = sign(p - q) (0 on a tie)
 *    tau2 = 1 multiplies loss and gradient by tau^2 (keeps gradient sizes comparable across
 *    temperatures, as in Hinton et al.). The teacher gets no gradient.
 *    Masks and weights: a row with mask 0 has loss 0, gradient 0, weight 0; weights (optional)
 *    multiply the row's loss. reduction mean divides by `divisor`, or when divisor < 0 by the sum
 *    of the weights of unmasked rows (their count without weights); a zero divisor gives the sum
 *    times 0: 0, or NaN where the sum is NaN or infinite (a NaN row, a +inf KL, or a +inf loss
 *    times a zero weight).
 *    Edge cases (section 3b's conventions): a -inf logit is a masked entry, 0 log 0 = 0. NaN or
 *    +inf on either side: NaN loss and an all-NaN gradient row; so is a side without mass.
 *    Support: forward KL and soft CE are +inf where q_j > 0 = p_j (their gradient p - q stays
 *    finite); reverse KL is +inf where p_j > 0 = q_j and its gradient is NaN there (undefined).
 *    JSD and TVD are always finite.
 * ========================================================================================== */

typedef enum lf_kl_kind {
    LF_KL_FORWARD = 0,
    LF_KL_REVERSE = 1,
    LF_KL_JSD = 2,
    LF_KL_SOFT_CE = 3,
    LF_KL_TVD = 4
} lf_kl_kind;

typedef struct lf_kl_opts {
    lf_kl_kind kind;   /* default LF_KL_FORWARD */
    float beta;        /* JSD mixing weight in [0, 1]; default 0.5 */
    float temperature; /* tau > 0; default 1 */
    int tau2;          /* 1: loss and gradient times tau^2; default 0 */
    float softcap;     /* c > 0 enables the tanh cap on both sides; default 0 (off) */
} lf_kl_opts;

static inline lf_kl_opts lf_kl_opts_default(void)
{
    lf_kl_opts o;
    o.kind = LF_KL_FORWARD;
    o.beta = 0.5f;
    o.temperature = 1.0f;
    o.tau2 = 0;
    o.softcap = 0.0f;
    return o;
}

/* LF_OK, or LF_ERR_ARG when an option is outside its domain (NaN included). */
static inline lf_status lf_check_kl_opts(const lf_kl_opts *o)
{
    if (!o) return LF_ERR_NULL;
    if ((int)o->kind < (int)LF_KL_FORWARD || (int)o->kind > (int)LF_KL_TVD) return LF_ERR_ARG;
    if (!(o->beta >= 0.0f && o->beta <= 1.0f)) return LF_ERR_ARG;
    if (!(o->temperature > 0.0f) || o->temperature == LF_INF_F) return LF_ERR_ARG;
    if (!(o->softcap >= 0.0f) || o->softcap == LF_INF_F) return LF_ERR_ARG;
    return LF_OK;
}

/* Everything the reference knows about one row, in double. */
typedef struct lf_kl_row {
    double loss;           /* the kind's loss (times tau^2 with tau2), before any row weight */
    double kl_fwd, kl_rev; /* KL(q || p) and KL(p || q), for logging (no tau^2) */
    double lse_s, lse_t;   /* log-sum-exps of z_s and z_t */
    double ent_s, ent_t;   /* entropies of p and q in nats */
} lf_kl_row;

/* Internal: z of one raw logit (the cap's special cases as lf_logit_xform), and dz/dx. */
static inline double lf_impl_ref_kl_z(float x, const lf_kl_opts *o)
{
    double c = (double)o->softcap, y = (double)x;
    if (c > 0.0) {
        if (y == (double)LF_INF_F || y != y) return (double)NAN;
        if (y != -(double)LF_INF_F) y = c * tanh(y / c);
    }
    return y / (double)o->temperature;
}

static inline double lf_impl_ref_kl_dz(float x, const lf_kl_opts *o)
{
    double c = (double)o->softcap;
    double t = c > 0.0 ? tanh((double)x / c) : 0.0;
    return (c > 0.0 ? 1.0 - t * t : 1.0) / (double)o->temperature;
}

/* Internal: log-sum-exp of one side: NaN for a NaN or +inf, -inf for no mass (every entry -inf
 * or massless, lf_massless: as the kernels' exponent z log2 e, such a side has no distribution). */
static inline double lf_impl_ref_kl_lse(const float *x, int64_t V, const lf_kl_opts *o)
{
    double m = -(double)LF_INF_F, s = 0.0;
    int64_t j;
    for (j = 0; j < V; ++j) {
        double z = lf_impl_ref_kl_z(x[j], o);
        if (z != z || z == (double)LF_INF_F) return (double)NAN;
        if (z > m && !lf_massless((float)z)) m = z;
    }
    if (m == -(double)LF_INF_F) return m;
    for (j = 0; j < V; ++j) {
        double z = lf_impl_ref_kl_z(x[j], o);
        if (z != -(double)LF_INF_F) s += exp(z - m);
    }
    return m + log(s);
}

/* Internal: log p_j (-inf for a masked entry). */
static inline double lf_impl_ref_kl_lp(float x, double lse, const lf_kl_opts *o)
{
    double z = lf_impl_ref_kl_z(x, o);
    return z == -(double)LF_INF_F ? z : z - lse;
}

/* Internal: log M_j = log(beta e^lq + (1 - beta) e^lp), exactly -inf where both are. */
static inline double lf_impl_ref_kl_lm(double lq, double lp, double beta)
{
    double u = log(beta) + lq, v = log(1.0 - beta) + lp, hi = u > v ? u : v, lo = u > v ? v : u;
    return hi == -(double)LF_INF_F ? hi : hi + log1p(exp(lo - hi));
}

static inline double lf_impl_ref_sign(double d) { return d > 0.0 ? 1.0 : d < 0.0 ? -1.0 : 0.0; }

/* Internal: the teacher's log q_j, from raw logits xt or from dense log-probabilities lqd. */
static inline double lf_impl_ref_kl_lq(const float *xt, const double *lqd, int64_t j, double lse, const lf_kl_opts *o)
{
    if (lqd) return lqd[j] == -(double)LF_INF_F ? lqd[j] : lqd[j] - lse;
    return lf_impl_ref_kl_lp(xt[j], lse, o);
}

/* Internal: log-sum-exp of dense log-probabilities (NaN for a NaN or +inf, -inf for no mass). */
static inline double lf_impl_ref_lse_dense(const double *l, int64_t V)
{
    double m = -(double)LF_INF_F, s = 0.0;
    int64_t j;
    for (j = 0; j < V; ++j) {
        if (l[j] != l[j] || l[j] == (double)LF_INF_F) return (double)NAN;
        if (l[j] > m) m = l[j];
    }
    if (m == -(double)LF_INF_F) return m;
    for (j = 0; j < V; ++j)
        if (l[j] != -(double)LF_INF_F) s += exp(l[j] - m);
    return m + log(s);
}

/* Internal: the row reference with the teacher given either as raw logits xt (transformed
 * like the student's) or as dense log-probabilities lqd (used as they are, renormalised). */
static inline lf_kl_row lf_impl_ref_kl_core(const float *xs, const float *xt, const double *lqd, int64_t V,
                                            const lf_kl_opts *o, double *dx)
{
    lf_kl_row r;
    const double NINF = -(double)LF_INF_F;
    double scale = o->tau2 ? (double)o->temperature * (double)o->temperature : 1.0;
    double beta = (double)o->beta, kq = 0.0, kp = 0.0, tv = 0.0, ssum = 0.0;
    int64_t j;
    int kind = (int)o->kind, inf_fwd = 0, inf_rev = 0;
    memset(&r, 0, sizeof r);
    if (kind == LF_KL_JSD && beta == 0.0) kind = LF_KL_FORWARD;
    if (kind == LF_KL_JSD && beta == 1.0) kind = LF_KL_REVERSE;
    r.lse_s = lf_impl_ref_kl_lse(xs, V, o);
    r.lse_t = lqd ? lf_impl_ref_lse_dense(lqd, V) : lf_impl_ref_kl_lse(xt, V, o);
    if (!(fabs(r.lse_s) < (double)LF_INF_F) || !(fabs(r.lse_t) < (double)LF_INF_F)) {
        /* NaN / +inf on a side, or a side without mass: no loss, never a guess */
        r.kl_fwd = r.kl_rev = r.loss = r.ent_s = r.ent_t = (double)NAN;
        if (dx)
            for (j = 0; j < V; ++j) dx[j] = (double)NAN;
        return r;
    }
    for (j = 0; j < V; ++j) {
        double lp = lf_impl_ref_kl_lp(xs[j], r.lse_s, o), lq = lf_impl_ref_kl_lq(xt, lqd, j, r.lse_t, o);
        double p = exp(lp), q = exp(lq);
        if (lp != NINF) r.ent_s -= p * lp;
        if (lq != NINF) r.ent_t -= q * lq;
        if (lq != NINF) {
            if (lp == NINF) inf_fwd = 1;
            else r.kl_fwd += q * (lq - lp);
        }
        if (lp != NINF) {
            if (lq == NINF) inf_rev = 1;
            else r.kl_rev += p * (lp - lq);
        }
        tv += 0.5 * fabs(p - q);
        ssum += lf_impl_ref_sign(p - q) * p;
        if (kind == LF_KL_JSD) {
            double lm = lf_impl_ref_kl_lm(lq, lp, beta);
            if (lq != NINF) kq += q * (lq - lm);
            if (lp != NINF) kp += p * (lp - lm);
        }
    }
    if (inf_fwd) r.kl_fwd = (double)LF_INF_F;
    if (inf_rev) r.kl_rev = (double)LF_INF_F;
    if (kind == LF_KL_FORWARD) r.loss = r.kl_fwd;
    else if (kind == LF_KL_REVERSE) r.loss = r.kl_rev;
    else if (kind == LF_KL_SOFT_CE) r.loss = r.kl_fwd + r.ent_t;
    else if (kind == LF_KL_TVD) r.loss = tv;
    else r.loss = beta * kq + (1.0 - beta) * kp;
    r.loss *= scale;
    if (dx)
        for (j = 0; j < V; ++j) {
            double lp = lf_impl_ref_kl_lp(xs[j], r.lse_s, o), lq = lf_impl_ref_kl_lq(xt, lqd, j, r.lse_t, o);
            double p = exp(lp), q = exp(lq), g;
            if (kind == LF_KL_REVERSE) {
                if (inf_rev) g = (double)NAN; /* +inf loss: no gradient */
                else g = lp == NINF ? 0.0 : p * (lp - lq - r.kl_rev);
            } else if (kind == LF_KL_JSD) {
                g = lp == NINF ? 0.0 : (1.0 - beta) * p * (lp - lf_impl_ref_kl_lm(lq, lp, beta) - kp);
            } else if (kind == LF_KL_TVD) {
                g = 0.5 * p * (lf_impl_ref_sign(p - q) - ssum);
            } else {
                g = p - q; /* forward KL, soft CE */
            }
            dx[j] = scale * g * lf_impl_ref_kl_dz(xs[j], o);
        }
    return r;
}

/* One row of the distillation reference. xs, xt: V raw student / teacher logits. dx (if not
 * NULL, V doubles) gets d loss / d x_s,j (unweighted, unreduced). */
static inline lf_kl_row lf_ref_kl_row(const float *xs, const float *xt, int64_t V, const lf_kl_opts *o, double *dx)
{
    return lf_impl_ref_kl_core(xs, xt, NULL, V, o, dx);
}

/* The same with the teacher given as V log-probabilities lq (e.g. from
 * lf_ref_kl_sparse_teacher): used as they are — no cap, no temperature — and renormalised;
 * -inf entries have no mass. lse_t in the result is log sum_j exp(lq_j) (0 if normalised). */
static inline lf_kl_row lf_ref_kl_row_lq(const float *xs, const double *lq, int64_t V, const lf_kl_opts *o, double *dx)
{
    return lf_impl_ref_kl_core(xs, NULL, lq, V, o, dx);
}

/* A sparse teacher (offline distillation): per token only the top-k (index, log-probability)
 * pairs were stored. The dense teacher log-probabilities lq (V doubles) they stand for:
 *   LF_KL_REST_DROP    the top-k only, q_i proportional to exp(lp_i / tau); the others -inf
 *                      (no mass: then the reverse KL is +inf wherever the student has mass);
 *   LF_KL_REST_SPREAD  the untracked mass r = 1 - sum_i exp(lp_i) (0 if negative) spread evenly
 *                      over the V - k others, as if each had log-probability log(r / (V - k));
 *                      then every entry tempered alike, q_j proportional to exp(l_j / tau).
 *                      At tau = 1: q_i = exp(lp_i) and q_j = r / (V - k), a distribution when
 *                      sum_i exp(lp_i) <= 1.
 * Returns LF_ERR_ARG for an index outside [0, V) or repeated, k > V, or tau not > 0; a NaN or
 * +inf log-probability makes lq all NaN (the row's loss NaN, as for dense input). A mode other
 * than LF_KL_REST_SPREAD is taken as LF_KL_REST_DROP here (kl_distill.cu's launcher refuses it:
 * LF_ERR_ARG; and k > V there is LF_ERR_SIZE); k = 0 needs no idx / lp here, the launcher
 * wants them set (not read). */
typedef enum lf_kl_rest { LF_KL_REST_DROP = 0, LF_KL_REST_SPREAD = 1 } lf_kl_rest;

static inline lf_status lf_ref_kl_sparse_teacher(int64_t V, const int32_t *idx, const float *lp, int64_t k,
                                                 lf_kl_rest mode, float tau, double *lq)
{
    double in = 0.0, lrest = -(double)LF_INF_F, t = (double)tau;
    int64_t i, j;
    if (!lq || (k > 0 && (!idx || !lp))) return LF_ERR_NULL;
    if (k < 0 || k > V || !(tau > 0.0f) || tau == LF_INF_F) return LF_ERR_ARG;
    for (j = 0; j < V; ++j) lq[j] = (double)NAN; /* marks "not set" while checking */
    for (i = 0; i < k; ++i) {
        if (idx[i] < 0 || idx[i] >= V || lq[idx[i]] == lq[idx[i]]) return LF_ERR_ARG;
        lq[idx[i]] = 0.0;
    }
    for (i = 0; i < k; ++i) {
        if (lp[i] != lp[i] || lp[i] == LF_INF_F) {
            for (j = 0; j < V; ++j) lq[j] = (double)NAN;
            return LF_OK;
        }
        in += exp((double)lp[i]);
    }
    if (mode == LF_KL_REST_SPREAD && V > k && in < 1.0) lrest = log((1.0 - in) / (double)(V - k));
    for (j = 0; j < V; ++j) lq[j] = lrest == -(double)LF_INF_F ? lrest : lrest / t;
    for (i = 0; i < k; ++i) lq[idx[i]] = lp[i] == -LF_INF_F ? -(double)LF_INF_F : (double)lp[i] / t;
    return LF_OK;
}

/* The whole distillation reference over N rows (student row i at xs + i * s_stride, teacher
 * row i at xt + i * t_stride).
 *   mask     : N bytes or NULL (all rows on); weights: N floats or NULL (all 1)
 *   loss_out : N doubles for LF_REDUCE_NONE (weighted, 0 for masked rows), else 1 (may be NULL)
 *   grad     : N * V doubles (row stride V) or NULL: the gradient of the reduced loss (of
 *              sum_i w_i loss_i for LF_REDUCE_NONE) with respect to the student's raw logits
 * divisor < 0 means the default mean divisor (sum of weights of unmasked rows).
 * Returns LF_OK, or LF_ERR_* for bad arguments. */
static inline lf_status lf_ref_kl(int64_t N, int64_t V, const float *xs, int64_t s_stride, const float *xt,
                                  int64_t t_stride, const uint8_t *mask, const float *weights, const lf_kl_opts *o,
                                  lf_reduction red, double divisor, double *loss_out, double *grad)
{
    double sum = 0.0, wsum = 0.0, inv;
    int64_t i, j;
    lf_status st = lf_check_kl_opts(o);
    if (st != LF_OK) return st;
    if (N < 0 || V < 0 || s_stride < V || t_stride < V) return LF_ERR_SIZE;
    if (N > 0 && (!xs || !xt)) return LF_ERR_NULL;
    for (i = 0; i < N; ++i) {
        double w = weights ? (double)weights[i] : 1.0, *g = grad ? grad + i * V : NULL;
        lf_kl_row r;
        if (mask && !mask[i]) {
            if (loss_out && red == LF_REDUCE_NONE) loss_out[i] = 0.0;
            if (g)
                for (j = 0; j < V; ++j) g[j] = 0.0;
            continue;
        }
        r = lf_ref_kl_row(xs + i * s_stride, xt + i * t_stride, V, o, g);
        if (g && w != 1.0)
            for (j = 0; j < V; ++j) g[j] *= w;
        if (loss_out && red == LF_REDUCE_NONE) loss_out[i] = w * r.loss;
        sum += w * r.loss;
        wsum += w;
    }
    if (red == LF_REDUCE_NONE) return LF_OK;
    inv = 1.0;
    if (red == LF_REDUCE_MEAN) {
        double d = divisor < 0.0 ? wsum : divisor;
        inv = d == 0.0 ? 0.0 : 1.0 / d;
    }
    if (loss_out) loss_out[0] = inv == 0.0 ? sum * 0.0 : sum * inv; /* 0, or NaN: never hidden */
    if (grad && inv != 1.0)
        for (i = 0; i < N; ++i)
            for (j = 0; j < V; ++j) grad[i * V + j] *= inv;
    return LF_OK;
}

/* ============================================================================================
 * 9. Host references: packed sequences and preferences
 *
 *    Building blocks (what the device reductions of lossfuse_cuda.cuh compute):
 *        lf_ref_seg_sum       out[k] = sum of v[t] over the tokens t of sequence k (cu_seqlens)
 *        lf_ref_pair_scatter  acc[i] += g[p], acc[j] -= g[p] for every pair p = (i, j): the
 *                             gradient of a pairwise loss with respect to the items' scores
 *        lf_ref_histogram     hist[b] = sum of mass[i] over the items i with bin[i] = b
 *    A pair table is int32 [n_pairs][2]; lf_check_pairs says whether every pair names two
 *    different items in [0, n_items). All sums in double.
 * ========================================================================================== */

/* LF_OK, or LF_ERR_PAIR with *n_bad / *first_bad (if not NULL) set. */
static inline lf_status lf_check_pairs(const int32_t *pairs, int64_t n_pairs, int64_t n_items, int64_t *n_bad,
                                       int64_t *first_bad)
{
    int64_t p, bad = 0, first = -1;
    if (n_bad) *n_bad = 0;
    if (first_bad) *first_bad = -1;
    if (n_pairs < 0 || n_items < 0) return LF_ERR_SIZE;
    if (n_pairs > 0 && !pairs) return LF_ERR_NULL;
    for (p = 0; p < n_pairs; ++p) {
        int32_t i = pairs[2 * p], j = pairs[2 * p + 1];
        if (i < 0 || i >= n_items || j < 0 || j >= n_items || i == j) {
            if (first < 0) first = p;
            ++bad;
        }
    }
    if (n_bad) *n_bad = bad;
    if (first_bad) *first_bad = first;
    return bad ? LF_ERR_PAIR : LF_OK;
}

static inline lf_status lf_ref_seg_sum(const int32_t *cu_seqlens, int64_t nseq, const float *v, double *out)
{
    int64_t k, t;
    lf_status st = lf_check_cu_seqlens(cu_seqlens, nseq, nseq >= 0 && cu_seqlens ? cu_seqlens[nseq] : 0);
    if (st != LF_OK) return st;
    if (!out || (cu_seqlens[nseq] > 0 && !v)) return LF_ERR_NULL;
    for (k = 0; k < nseq; ++k) {
        double a = 0.0;
        for (t = cu_seqlens[k]; t < cu_seqlens[k + 1]; ++t) a += (double)v[t];
        out[k] = a;
    }
    return LF_OK;
}

/* acc (n_items doubles) is added to, not cleared. */
static inline lf_status lf_ref_pair_scatter(const int32_t *pairs, int64_t n_pairs, const float *g, int64_t n_items,
                                            double *acc)
{
    int64_t p;
    lf_status st = lf_check_pairs(pairs, n_pairs, n_items, NULL, NULL);
    if (st != LF_OK) return st;
    if ((n_pairs > 0 && !g) || (n_items > 0 && !acc)) return LF_ERR_NULL;
    for (p = 0; p < n_pairs; ++p) {
        acc[pairs[2 * p]] += (double)g[p];
        acc[pairs[2 * p + 1]] -= (double)g[p];
    }
    return LF_OK;
}

/* bin[i] == -1: the item is in no bin. Any other value outside [0, n_bins): LF_ERR_ARG.
 * mass NULL: every item weighs 1. hist (n_bins doubles) is overwritten. */
static inline lf_status lf_ref_histogram(const int32_t *bin, const float *mass, int64_t n_items, int64_t n_bins,
                                         double *hist)
{
    int64_t i, b;
    if (n_items < 0 || n_bins < 0) return LF_ERR_SIZE;
    if ((n_items > 0 && !bin) || (n_bins > 0 && !hist)) return LF_ERR_NULL;
    for (i = 0; i < n_items; ++i)
        if (bin[i] < -1 || bin[i] >= n_bins) return LF_ERR_ARG;
    for (b = 0; b < n_bins; ++b) hist[b] = 0.0;
    for (i = 0; i < n_items; ++i)
        if (bin[i] >= 0) hist[bin[i]] += mass ? (double)mass[i] : 1.0;
    return LF_OK;
}

/* ============================================================================================
 * 9b. The DPO family from packed logits (lf_ref_dpo_packed)
 *    Sequences k = 0..nseq-1 are packed in logits [T, V] by cu_seqlens; labels[t] is token t's
 *    next-token target (shifted within its sequence, lf_packed_next_label) or ignore_index
 *    (prompt tokens, the last token). Per sequence:
 *        logp_k = sum over its tokens t with a label of log softmax(x_t)[labels[t]],  n_k = their
 *        number; the score s_k = logp_k, or logp_k / n_k with length_normalize (0 when n_k = 0)
 *    With reference log-probabilities ref_k (NULL: 0; divided by n_k alike when normalised),
 *    for each pair (c, r) = (chosen, rejected):
 *        h = (s_c - ref_c) - (s_r - ref_r)      rewards beta (s_c - ref_c), beta (s_r - ref_r)
 *        loss_p = lf_dpo_sigmoid(h, beta, eps) | lf_dpo_hinge(h, beta) | lf_dpo_ipo(h, beta)
 *               | lf_simpo(s_c - s_r, beta, gamma)   (SimPO: length-normalised, no reference;
 *                                                    its rewards are beta s)
 *               (the formulas of section 3c, evaluated here in double)
 *               + nll_weight * (-logp_c / n_c)      (an SFT term on the chosen response)
 *    loss = sum_p loss_p / D, D = divisor, or n_pairs when divisor < 0 (D = 0: loss 0, NaN
 *    kept). A sequence in several pairs (or in none) is fine. The gradient with respect to the
 *    logits of token t of sequence k with label y is c_k (onehot(y) - softmax(x_t)), c_k the sum
 *    over the pairs of d loss / d logp_k; tokens without a label get 0. Labels outside [0, V)
 *    that are not ignore_index are counted in *n_bad and treated as ignored.
 *    Per-pair metrics (trainer logs), LF_DPO_METRICS of them, in pair_out[LF_DPO_METRICS p +
 *    0..4]: loss_p, chosen reward beta (s_c - r_c), rejected reward beta (s_r - r_r), 1 if chosen
 *    reward > rejected reward else 0, and the reward margin beta h (the chosen reward minus the
 *    rejected one, formed from h, not from the two rounded rewards); s, r: the scores and
 *    reference scores above (length-normalised where the loss normalises; SimPO: no
 *    reference). The IPO of the paper and TRL uses length-normalised scores: set
 *    length_normalize.
 *    seq (3 nseq doubles, required: nothing here allocates) receives per sequence logp_k in
 *    [0, nseq), n_k in [nseq, 2 nseq) and c_k = d loss / d logp_k in [2 nseq, 3 nseq).
 * ========================================================================================== */

typedef enum lf_dpo_kind { LF_DPO_SIGMOID = 0, LF_DPO_HINGE = 1, LF_DPO_IPO = 2, LF_DPO_SIMPO = 3 } lf_dpo_kind;

/* per-pair metrics: loss, chosen reward, rejected reward, accuracy, reward margin */
#define LF_DPO_METRICS 5

typedef struct lf_dpo_opts {
    lf_dpo_kind kind;      /* default LF_DPO_SIGMOID */
    float beta;            /* > 0; default 0.1 */
    float label_smoothing; /* sigmoid only, in [0, 0.5] (conservative DPO); default 0 */
    float gamma;           /* SimPO target margin; default 0.5 */
    int length_normalize;  /* 1: per-token mean log-probabilities (forced for SimPO); default 0 */
    float nll_weight;      /* >= 0; default 0 */
    int64_t ignore_index;  /* default -100 */
} lf_dpo_opts;

static inline lf_dpo_opts lf_dpo_opts_default(void)
{
    lf_dpo_opts o;
    o.kind = LF_DPO_SIGMOID;
    o.beta = 0.1f;
    o.label_smoothing = 0.0f;
    o.gamma = 0.5f;
    o.length_normalize = 0;
    o.nll_weight = 0.0f;
    o.ignore_index = -100;
    return o;
}

static inline lf_status lf_check_dpo_opts(const lf_dpo_opts *o)
{
    if (!o) return LF_ERR_NULL;
    if ((int)o->kind < (int)LF_DPO_SIGMOID || (int)o->kind > (int)LF_DPO_SIMPO) return LF_ERR_ARG;
    if (!(o->beta > 0.0f) || o->beta == LF_INF_F) return LF_ERR_ARG;
    if (!(o->label_smoothing >= 0.0f && o->label_smoothing <= 0.5f)) return LF_ERR_ARG;
    if (!(fabsf(o->gamma) < LF_INF_F)) return LF_ERR_ARG;
    if (!(o->nll_weight >= 0.0f) || o->nll_weight == LF_INF_F) return LF_ERR_ARG;
    return LF_OK;
}

/* Internal: the pair losses of section 3c again in double, for the references. */
static inline double lf_impl_softplus_d(double x) { return (x > 0.0 ? x : 0.0) + log1p(exp(-fabs(x))); }
static inline double lf_impl_sigmoid_d(double x)
{
    double e = exp(-fabs(x));
    return x >= 0.0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

/* Internal: one pair's loss from h = (s_c - ref_c) - (s_r - ref_r) (SimPO: s_c - s_r), and its
 * derivative d loss / d h in *d (double). */
static inline double lf_impl_dpo_pair(const lf_dpo_opts *o, double h, double *d)
{
    double beta = (double)o->beta, z;
    switch (o->kind) {
    case LF_DPO_HINGE:
        z = 1.0 - beta * h;
        *d = z > 0.0 ? -beta : 0.0;
        return z > 0.0 ? z : 0.0;
    case LF_DPO_IPO:
        z = h - 0.5 / beta;
        *d = 2.0 * z;
        return z * z;
    case LF_DPO_SIMPO:
        z = beta * h - (double)o->gamma;
        *d = -beta * lf_impl_sigmoid_d(-z);
        return lf_impl_softplus_d(-z);
    default: {
        double eps = (double)o->label_smoothing;
        z = beta * h;
        *d = beta * (eps - lf_impl_sigmoid_d(-z)); /* not sigma(z) - (1 - eps): that cancels for z >> 0 */
        return (1.0 - eps) * lf_impl_softplus_d(-z) + (eps == 0.0 ? 0.0 : eps * lf_impl_softplus_d(z));
    }
    }
}

/* Internal: a raw logits row's maximum m over the entries with mass (lf_massless) and, in *s,
 * sum_j exp(x_j - m), in double. m -inf (no mass) makes *s NaN: no distribution. */
static inline double lf_impl_ref_row_ms(const float *x, int64_t V, double *s)
{
    double m = -(double)LF_INF_F, acc = 0.0;
    int64_t j;
    for (j = 0; j < V; ++j) m = (double)x[j] > m && !lf_massless(x[j]) ? (double)x[j] : m;
    for (j = 0; j < V; ++j) acc += exp((double)x[j] - m);
    *s = acc;
    return m;
}

static inline lf_status lf_ref_dpo_packed(int64_t T, int64_t V, const float *logits, int64_t stride,
                                          const int64_t *labels, const int32_t *cu_seqlens, int64_t nseq,
                                          const int32_t *pairs, int64_t n_pairs, const float *ref_logps,
                                          const lf_dpo_opts *o, double divisor, double *loss, double *seq,
                                          double *pair_out, double *grad, int64_t *n_bad)
{
    double *lp = seq, *nt, *coef, inv, sum = 0.0;
    int64_t k, p, t, j, bad = 0;
    int norm;
    lf_status st = lf_check_dpo_opts(o);
    if (n_bad) *n_bad = 0;
    if (st != LF_OK) return st;
    if (T < 0 || V < 1 || stride < V) return LF_ERR_SIZE;
    if ((st = lf_check_cu_seqlens(cu_seqlens, nseq, T)) != LF_OK) return st;
    if ((st = lf_check_pairs(pairs, n_pairs, nseq, NULL, NULL)) != LF_OK) return st;
    if ((T > 0 && (!logits || !labels)) || (nseq > 0 && !seq)) return LF_ERR_NULL;
    for (k = 0; k < 3 * nseq; ++k) seq[k] = 0.0;
    nt = lp + nseq;
    coef = nt + nseq;
    norm = o->length_normalize || o->kind == LF_DPO_SIMPO;
    /* per-token label log-probabilities, summed per sequence */
    for (k = 0; k < nseq; ++k)
        for (t = cu_seqlens[k]; t < cu_seqlens[k + 1]; ++t) {
            const float *x = logits + t * stride;
            int64_t y = labels[t];
            double m, s;
            if (y == o->ignore_index) continue;
            if (y < 0 || y >= V) {
                ++bad;
                continue;
            }
            m = lf_impl_ref_row_ms(x, V, &s);
            lp[k] += (double)x[y] - m - log(s);
            nt[k] += 1.0;
        }
    /* pairs: losses, metrics, d loss / d logp per sequence */
    inv = divisor < 0.0 ? (n_pairs ? 1.0 / (double)n_pairs : 0.0) : divisor == 0.0 ? 0.0 : 1.0 / divisor;
    for (p = 0; p < n_pairs; ++p) {
        int32_t c = pairs[2 * p], r = pairs[2 * p + 1];
        double sc = norm ? (nt[c] > 0.0 ? lp[c] / nt[c] : 0.0) : lp[c];
        double sr = norm ? (nt[r] > 0.0 ? lp[r] / nt[r] : 0.0) : lp[r];
        double rc = 0.0, rr = 0.0, dc, dr, l;
        if (ref_logps && o->kind != LF_DPO_SIMPO) {
            rc = norm ? (nt[c] > 0.0 ? (double)ref_logps[c] / nt[c] : 0.0) : (double)ref_logps[c];
            rr = norm ? (nt[r] > 0.0 ? (double)ref_logps[r] / nt[r] : 0.0) : (double)ref_logps[r];
        }
        const double h = (sc - rc) - (sr - rr);
        l = lf_impl_dpo_pair(o, h, &dc);
        dr = -dc;
        if (o->nll_weight > 0.0f && nt[c] > 0.0) {
            l += (double)o->nll_weight * (-lp[c] / nt[c]);
            coef[c] += inv * (-(double)o->nll_weight / nt[c]);
        }
        coef[c] += inv * dc * (norm ? (nt[c] > 0.0 ? 1.0 / nt[c] : 0.0) : 1.0);
        coef[r] += inv * dr * (norm ? (nt[r] > 0.0 ? 1.0 / nt[r] : 0.0) : 1.0);
        sum += l;
        if (pair_out) {
            double *m = pair_out + LF_DPO_METRICS * p;
            m[0] = l;
            m[1] = (double)o->beta * (sc - rc);
            m[2] = (double)o->beta * (sr - rr);
            m[3] = m[1] > m[2] ? 1.0 : 0.0;
            m[4] = (double)o->beta * h;
        }
    }
    if (loss) *loss = inv == 0.0 ? sum * 0.0 : sum * inv;
    if (grad)
        for (k = 0; k < nseq; ++k)
            for (t = cu_seqlens[k]; t < cu_seqlens[k + 1]; ++t) {
                const float *x = logits + t * stride;
                double *g = grad + t * V, m, s;
                int64_t y = labels[t];
                for (j = 0; j < V; ++j) g[j] = 0.0;
                if (y == o->ignore_index || y < 0 || y >= V) continue;
                m = lf_impl_ref_row_ms(x, V, &s);
                for (j = 0; j < V; ++j) g[j] = -coef[k] * exp((double)x[j] - m) / s;
                g[y] += coef[k];
            }
    if (n_bad) *n_bad = bad;
    return LF_OK;
}

/* ============================================================================================
 * 9c. Pairwise preference over flat pairs with histogram penalties (lf_ref_pairwise_preference)
 *    Scores s [S] (fp32); pairs (i, j) [P][2]; per pair a target, a weight w_p (NULL: 1) and a
 *    scale a_p (NULL: opts.scale). With d = s_i - s_j:
 *        LF_PREF_BT     lf_bt(d, t_p, a_p)                t_p = P(i preferred over j), in [0, 1]
 *        LF_PREF_HINGE  lf_hinge_margin(d, t_p, margin, a_p)   t_p = +1 (i over j) or -1
 *    (the formulas of section 3c, evaluated here in double)
 *    pair loss = sum_p w_p loss_p / D, D = divisor, or sum_p w_p when divisor < 0.
 *    Penalties on a histogram of the items: item i (bin b_i >= 0, mass m_i, NULL: 1) puts
 *    m_i g(s_i) into bin b_i, g = sigmoid (LF_GATE_SIGMOID: the item's probability of being
 *    kept) or the identity (LF_GATE_NONE); with budget B_b and coverage floor F_b per bin,
 *        penalty = budget_weight sum_b max(0, h_b - B_b)^2 + coverage_weight sum_b max(0, F_b - h_b)^2
 *    (not divided by D). loss_out[0] = pair loss + penalty, [1] the pair loss, [2] the penalty.
 *    hist (n_bins doubles; required with item_bin) receives h. grad (S doubles, may be NULL)
 *    = d loss / d s. Bad pairs (an item outside [0, S), i == j, or a target outside [0, 1] for
 *    LF_PREF_BT / other than +-1 for LF_PREF_HINGE; a NaN target is not bad, it makes the loss
 *    NaN): LF_ERR_PAIR; a bin outside [-1, n_bins): LF_ERR_ARG; budget / coverage may be NULL
 *    when their weight is 0.
 * ========================================================================================== */

typedef enum lf_pref_kind { LF_PREF_BT = 0, LF_PREF_HINGE = 1 } lf_pref_kind;
typedef enum lf_pref_gate { LF_GATE_SIGMOID = 0, LF_GATE_NONE = 1 } lf_pref_gate;

typedef struct lf_pref_opts {
    lf_pref_kind kind;     /* default LF_PREF_BT */
    float scale;           /* default 1 (when no per-pair scale is given) */
    float margin;          /* hinge margin; default 1 */
    lf_pref_gate gate;     /* default LF_GATE_SIGMOID */
    float budget_weight;   /* >= 0; default 0 (off) */
    float coverage_weight; /* >= 0; default 0 (off) */
} lf_pref_opts;

static inline lf_pref_opts lf_pref_opts_default(void)
{
    lf_pref_opts o;
    o.kind = LF_PREF_BT;
    o.scale = 1.0f;
    o.margin = 1.0f;
    o.gate = LF_GATE_SIGMOID;
    o.budget_weight = 0.0f;
    o.coverage_weight = 0.0f;
    return o;
}

/* Whether a pair's target suits the loss: in [0, 1] for LF_PREF_BT, +1 or -1 for LF_PREF_HINGE.
 * A NaN target passes (it makes the loss NaN: NaN in, NaN out). The reference and
 * examples/pairwise_preference.cu's kernels both judge a pair by it. */
LF_HD int lf_pref_target_ok(lf_pref_kind kind, float t)
{
    return kind == LF_PREF_HINGE ? !(t == t && t != 1.0f && t != -1.0f) : !(t < 0.0f || t > 1.0f);
}

static inline lf_status lf_check_pref_opts(const lf_pref_opts *o)
{
    if (!o) return LF_ERR_NULL;
    if ((int)o->kind < (int)LF_PREF_BT || (int)o->kind > (int)LF_PREF_HINGE) return LF_ERR_ARG;
    if ((int)o->gate < (int)LF_GATE_SIGMOID || (int)o->gate > (int)LF_GATE_NONE) return LF_ERR_ARG;
    if (!(fabsf(o->scale) < LF_INF_F) || !(fabsf(o->margin) < LF_INF_F)) return LF_ERR_ARG;
    if (!(o->budget_weight >= 0.0f) || !(o->coverage_weight >= 0.0f)) return LF_ERR_ARG;
    if (o->budget_weight == LF_INF_F || o->coverage_weight == LF_INF_F) return LF_ERR_ARG;
    return LF_OK;
}

static inline lf_status lf_ref_pairwise_preference(int64_t S, const float *scores, int64_t P, const int32_t *pairs,
                                                   const float *target, const float *pair_weight,
                                                   const float *pair_scale, const int32_t *item_bin,
                                                   const float *item_mass, int64_t n_bins, const float *budget,
                                                   const float *coverage, const lf_pref_opts *o, double divisor,
                                                   double *loss_out, double *hist, double *grad)
{
    double wsum = 0.0, sum = 0.0, pen = 0.0, inv, *h = hist;
    int64_t p, i, b;
    lf_status st = lf_check_pref_opts(o);
    if (st != LF_OK) return st;
    if (S < 0 || P < 0 || n_bins < 0) return LF_ERR_SIZE;
    if ((st = lf_check_pairs(pairs, P, S, NULL, NULL)) != LF_OK) return st;
    if ((S > 0 && !scores) || (P > 0 && !target)) return LF_ERR_NULL;
    for (p = 0; p < P; ++p)
        if (!lf_pref_target_ok(o->kind, target[p])) return LF_ERR_PAIR;
    if (item_bin) {
        if ((o->budget_weight > 0.0f && !budget) || (o->coverage_weight > 0.0f && !coverage)) return LF_ERR_NULL;
        if (n_bins > 0 && !hist) return LF_ERR_NULL;
        for (i = 0; i < S; ++i)
            if (item_bin[i] < -1 || item_bin[i] >= n_bins) return LF_ERR_ARG;
    }
    if (grad)
        for (i = 0; i < S; ++i) grad[i] = 0.0;
    for (p = 0; p < P; ++p) wsum += pair_weight ? (double)pair_weight[p] : 1.0;
    inv = divisor < 0.0 ? (wsum == 0.0 ? 0.0 : 1.0 / wsum) : divisor == 0.0 ? 0.0 : 1.0 / divisor;
    for (p = 0; p < P; ++p) {
        int32_t a = pairs[2 * p], c = pairs[2 * p + 1];
        double d = (double)scores[a] - (double)scores[c], sc = pair_scale ? (double)pair_scale[p] : (double)o->scale;
        double w = pair_weight ? (double)pair_weight[p] : 1.0, tp = (double)target[p], l, dd, z;
        if (o->kind == LF_PREF_HINGE) {
            z = (double)o->margin - tp * sc * d;
            l = z > 0.0 ? z : (z == z ? 0.0 : z); /* NaN in, NaN out, as lf_hinge_margin */
            dd = z > 0.0 ? -tp * sc : (z == z ? 0.0 : z);
        } else {
            z = sc * d;
            l = (tp == 0.0 ? 0.0 : tp * lf_impl_softplus_d(-z)) + (tp == 1.0 ? 0.0 : (1.0 - tp) * lf_impl_softplus_d(z));
            dd = sc * (tp >= 0.5 ? (1.0 - tp) - lf_impl_sigmoid_d(-z) : lf_impl_sigmoid_d(z) - tp); /* no cancellation */
        }
        sum += w == 0.0 ? 0.0 : w * l;
        if (grad && w != 0.0) {
            grad[a] += inv * w * dd;
            grad[c] -= inv * w * dd;
        }
    }
    if (item_bin && n_bins > 0) {
        for (b = 0; b < n_bins; ++b) h[b] = 0.0;
        for (i = 0; i < S; ++i) {
            double m = item_mass ? (double)item_mass[i] : 1.0, s = (double)scores[i];
            double g = o->gate == LF_GATE_SIGMOID ? 1.0 / (1.0 + exp(-s)) : s;
            if (item_bin[i] >= 0) h[item_bin[i]] += m * g;
        }
        for (b = 0; b < n_bins; ++b) {
            double over = o->budget_weight > 0.0f && h[b] > (double)budget[b] ? h[b] - (double)budget[b] : 0.0;
            double under = o->coverage_weight > 0.0f && h[b] < (double)coverage[b] ? (double)coverage[b] - h[b] : 0.0;
            pen += (double)o->budget_weight * over * over + (double)o->coverage_weight * under * under;
        }
        if (grad)
            for (i = 0; i < S; ++i) {
                int32_t bi = item_bin[i];
                double m = item_mass ? (double)item_mass[i] : 1.0, s = (double)scores[i], dg, dh = 0.0;
                if (bi < 0) continue;
                dg = o->gate == LF_GATE_SIGMOID ? 1.0 / (1.0 + exp(-s)) * (1.0 - 1.0 / (1.0 + exp(-s))) : 1.0;
                if (o->budget_weight > 0.0f && h[bi] > (double)budget[bi]) dh += 2.0 * (double)o->budget_weight * (h[bi] - (double)budget[bi]);
                if (o->coverage_weight > 0.0f && h[bi] < (double)coverage[bi]) dh -= 2.0 * (double)o->coverage_weight * ((double)coverage[bi] - h[bi]);
                grad[i] += dh * m * dg;
            }
    }
    if (loss_out) {
        loss_out[1] = inv == 0.0 ? sum * 0.0 : sum * inv;
        loss_out[2] = pen;
        loss_out[0] = loss_out[1] + pen;
    }
    return LF_OK;
}

/* ============================================================================================
 * 10. Context parallelism: the zigzag layout of packed sequences
 *
 *    Under context parallelism over cp ranks, every sequence of length L (a multiple of 2 cp;
 *    0 allowed) is cut into 2 cp chunks of C = L / (2 cp) tokens, and rank r holds chunks r and
 *    2 cp - 1 - r, in that order: with causal attention each rank then has the same work. A
 *    rank's local buffer packs its 2C tokens of every sequence in sequence order, so its
 *    cu_seqlens are the global ones divided by cp (lf_cp_local_cu).
 *    Labels are shifted on the FULL sequence, before the split: the target of the last token of
 *    chunk r is the first token of chunk r + 1, which another rank holds. lf_cp_label reads it
 *    from the global ids (which every rank of a CP group has: they are a few bytes a token).
 *        lf_cp_check         cp >= 1, every length a multiple of 2 cp (LF_ERR_CP otherwise)
 *        lf_cp_local_cu      the local cu_seqlens (global / cp), for the rank's attention
 *        lf_cp_seq_find      the sequence of a local token (searches cu_seqlens / cp directly)
 *        lf_cp_to_global     (rank, offset in the rank's part of a sequence) -> offset in it
 *        lf_cp_to_local      offset in a sequence -> (rank, local offset)
 *        lf_cp_global_token  rank r's local packed index -> the global packed index
 *        lf_cp_label         the next-token target of one local token, from the global ids and
 *                            an optional target mask (0: token not predicted, e.g. a prompt)
 *        lf_ref_cp_labels    host reference: a rank's whole local label / position arrays
 *    The loss of a CP-sharded batch is then the plain cross-entropy of each rank's local logits
 *    and labels, summed over ranks; the mean divides by the global count of valid labels (an
 *    all-reduce of (sum, count); examples/cp_local_ce.cu).
 * ========================================================================================== */

/* Offset in a sequence of length len of local offset l (in [0, len / cp)) on rank r. */
LF_HD int64_t lf_cp_to_global(int64_t l, int64_t len, int cp, int rank)
{
    const int64_t c = len / (2 * (int64_t)cp);
    return l < c ? (int64_t)rank * c + l : (2 * (int64_t)cp - 1 - rank) * c + (l - c);
}

/* The rank holding offset g (in [0, len)) of a sequence of length len > 0, and its local offset. */
LF_HD int64_t lf_cp_to_local(int64_t g, int64_t len, int cp, int *rank)
{
    const int64_t c = len / (2 * (int64_t)cp), chunk = g / c;
    if (chunk < cp) {
        *rank = (int)chunk;
        return g - chunk * c;
    }
    *rank = (int)(2 * (int64_t)cp - 1 - chunk);
    return c + (g - chunk * c);
}

/* cu_local[k] = cu_seqlens[k] / cp for k = 0 .. nseq (valid after lf_cp_check). */
LF_HD void lf_cp_local_cu(const int32_t *cu_seqlens, int64_t nseq, int cp, int32_t *cu_local)
{
    int64_t k;
    for (k = 0; k <= nseq; ++k) cu_local[k] = (int32_t)(cu_seqlens[k] / cp);
}

/* The sequence of a rank's local token t: lf_seq_find on the local cu_seqlens (cu_seqlens / cp)
 * without forming them. -1 for t outside the local buffer. O(log nseq). */
LF_HD int64_t lf_cp_seq_find(const int32_t *cu_seqlens, int64_t nseq, int cp, int64_t t)
{
    int64_t lo = 0, hi = nseq; /* invariant: cu[lo] / cp <= t < cu[hi] / cp */
    if (nseq <= 0 || t < cu_seqlens[0] / cp || t >= cu_seqlens[nseq] / cp) return -1;
    while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        if (cu_seqlens[mid] / cp <= t) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* Global packed index of rank r's local token t (t in [0, total / cp)), -1 outside. */
LF_HD int64_t lf_cp_global_token(const int32_t *cu_seqlens, int64_t nseq, int cp, int rank, int64_t t)
{
    const int64_t k = lf_cp_seq_find(cu_seqlens, nseq, cp, t);
    if (k < 0) return -1;
    return cu_seqlens[k] + lf_cp_to_global(t - cu_seqlens[k] / cp, (int64_t)cu_seqlens[k + 1] - cu_seqlens[k], cp, rank);
}

/* Next-token target of rank r's local token t: ids[g + 1] for its global token g when g + 1 is in
 * the same sequence and target_mask (NULL: all on) is non-zero there; else ignore_index. The
 * ids (and the mask) are the GLOBAL ones. */
LF_HD int64_t lf_cp_label(const int32_t *cu_seqlens, int64_t nseq, int cp, int rank, const int64_t *ids,
                          const uint8_t *target_mask, int64_t t, int64_t ignore_index)
{
    const int64_t k = lf_cp_seq_find(cu_seqlens, nseq, cp, t);
    int64_t g;
    if (k < 0) return ignore_index;
    g = cu_seqlens[k] + lf_cp_to_global(t - cu_seqlens[k] / cp, (int64_t)cu_seqlens[k + 1] - cu_seqlens[k], cp, rank);
    if (g + 1 >= cu_seqlens[k + 1] || (target_mask && !target_mask[g + 1])) return ignore_index;
    return ids[g + 1];
}

/* cp >= 1 and every sequence length a multiple of 2 cp (cu_seqlens valid for total tokens).
 * *bad_seq (if not NULL) receives the first sequence that is not, or -1. */
static inline lf_status lf_cp_check(const int32_t *cu_seqlens, int64_t nseq, int64_t total, int cp, int64_t *bad_seq)
{
    int64_t k;
    lf_status st;
    if (bad_seq) *bad_seq = -1;
    if (cp < 1) return LF_ERR_CP;
    if ((st = lf_check_cu_seqlens(cu_seqlens, nseq, total)) != LF_OK) return st;
    for (k = 0; k < nseq; ++k)
        if ((cu_seqlens[k + 1] - cu_seqlens[k]) % (2 * (int64_t)cp) != 0) {
            if (bad_seq) *bad_seq = k;
            return LF_ERR_CP;
        }
    return LF_OK;
}

/* Host reference: rank r's local labels (total / cp of them) and, if gpos is not NULL, the
 * global packed index of each local token. Built chunk by chunk, independently of the
 * functions above (which the tests check against it). */
static inline lf_status lf_ref_cp_labels(const int64_t *ids, const uint8_t *target_mask, const int32_t *cu_seqlens,
                                         int64_t nseq, int64_t total, int cp, int rank, int64_t ignore_index,
                                         int64_t *labels, int64_t *gpos)
{
    int64_t k, n = 0, h, j;
    lf_status st = lf_cp_check(cu_seqlens, nseq, total, cp, NULL);
    if (st != LF_OK) return st;
    if (rank < 0 || rank >= cp) return LF_ERR_CP;
    if (total > 0 && (!ids || !labels)) return LF_ERR_NULL;
    for (k = 0; k < nseq; ++k) {
        const int64_t b = cu_seqlens[k], e = cu_seqlens[k + 1], c = (e - b) / (2 * (int64_t)cp);
        for (h = 0; h < 2; ++h) {
            const int64_t chunk = h == 0 ? rank : 2 * (int64_t)cp - 1 - rank;
            for (j = 0; j < c; ++j, ++n) {
                const int64_t g = b + chunk * c + j;
                labels[n] = g + 1 < e && (!target_mask || target_mask[g + 1]) ? ids[g + 1] : ignore_index;
                if (gpos) gpos[n] = g;
            }
        }
    }
    return LF_OK;
}

/* ============================================================================================
 * 11. Tensor (vocabulary) parallelism: the cross-entropy of a row split over P ranks
 *
 *    Rank r holds columns [v0, v1) of every row (lf_tp_shard: contiguous, as even as V allows;
 *    lf_tp_owner: the rank holding a column). The loss and the gradient need three numbers of
 *    the whole row; each rank contributes its 12-byte share lf_tp_share of them, and the ranks
 *    exchange the shares (an all-gather of [P][N] shares, never the logits). Notation as in
 *    section 7, with the target weights q_j = (1 - eps) w_y [j == y] + eps w_j / V (so that
 *    loss = sum_j q_j (lse - z_j) + lam lse^2), the shard's mass A_r = sum_{j in r} q_j and
 *    W_r = sum_{j in r} w_j:
 *        m, s   the lse state of the shard (lse = M + log S after the merge)
 *        t      sum_{j in r} q_j (m - z_j): the target's logit sum RELATIVE TO THE SHARD'S MAX,
 *               = (1 - eps) w_y (m - z_y) [y held here] + eps (W_r m - sum w_j z_j) / V
 *    After the all-gather every rank merges the P shares of a row IN RANK ORDER (lf_tp_merge:
 *    the same bits on every rank, whatever order they arrived in), moving each t to the global
 *    max M with its A_r: T = sum_r t_r + A_r (M - m_r) = sum_j q_j (M - z_j). Then
 *        loss = A log S + T + lam lse^2,      A = sum_r A_r = (1 - eps) w_y + eps W / V
 *    (lf_tp_loss), and each rank writes the gradient of its columns with section 7's formula,
 *        g_j = a p_j - eps w_j / V - [j == y] (1 - eps) w_y,   p_j = exp(z_j - lse),
 *        a = A + 2 lam lse (lf_tp_grad_coef).
 *    Why relative to the max: without smoothing the loss is then log S + (M - z_y), exact when
 *    the label is the row's max even for |z| ~ 1e4 (as the single-GPU kernel's), where
 *    A lse - sum q z would lose ulp(lse) to cancellation.
 *    Edge cases as section 7: a -inf z_y, or smoothing weight on a -inf column, gives +inf (NaN
 *    when the label's coefficient (1 - eps) w_y is 0: 0 * inf, as the reference);
 *    NaN / +inf z make s NaN; a row without mass (lse = -inf) or a NaN lse has NaN loss. An
 *    empty shard (v0 == v1) sends the identity (m = -inf, s = 0, t = 0). A label outside
 *    [0, V) (not the ignore index) is bad on every rank alike: count it on one (rank 0).
 *    Usage, row i on rank r of P (columns [v0, v1) held here as x[0 .. v1 - v0)):
 *        lf_tp_acc acc = lf_tp_acc_init();
 *        for (j = v0; j < v1; ++j)
 *            lf_tp_acc_push(&acc, lf_logit_xform(x[j - v0], scale, cap), w ? w[j] : 1.0f, j == y, eps > 0);
 *        g[r * n_rows + i] = lf_tp_share_make(acc, w_y, W_r, V, eps);   // then ncclAllGather
 *        mg = lf_tp_merge(g, n_rows, P, i, y, w_y, Wr, V, eps);        // Wr: [P] or NULL (no weights)
 *        loss = lf_tp_loss(mg, lam, &lse);                             // the same bits on every rank
 *        a = lf_tp_grad_coef(mg, lse, lam);                            // then write columns [v0, v1)
 * ========================================================================================== */

/* Columns [*v0, *v1) of rank r of P over V columns: the first V % P ranks get one more. */
LF_HD void lf_tp_shard(int64_t V, int P, int r, int64_t *v0, int64_t *v1)
{
    const int64_t q = V / P, e = V % P;
    *v0 = r * q + (r < e ? r : e);
    *v1 = *v0 + q + (r < e ? 1 : 0);
}

/* The rank whose shard holds column y (0 <= y < V). */
LF_HD int lf_tp_owner(int64_t V, int P, int64_t y)
{
    const int64_t q = V / P, e = V % P;
    if (y < e * (q + 1)) return (int)(y / (q + 1));
    return (int)(e + (y - e * (q + 1)) / q);
}

/* What a rank sends per row: 12 bytes. */
typedef struct lf_tp_share {
    float m, s; /* lse state of the shard */
    float t;    /* sum over the shard of q_j (m - z_j) */
} lf_tp_share;

/* A rank's running statistics of a row's shard (not exchanged). */
typedef struct lf_tp_acc {
    float m, s;  /* lse state */
    float zy;    /* z of the label, if held here */
    float wz;    /* sum of w_j z_j over columns with w_j != 0 (label smoothing only) */
    int has_y;   /* the label is in this shard */
} lf_tp_acc;

LF_HD lf_tp_acc lf_tp_acc_init(void)
{
    lf_tp_acc a;
    a.m = -LF_INF_F;
    a.s = a.zy = a.wz = 0.0f;
    a.has_y = 0;
    return a;
}

/* Push column j's z (its weight w; is_label: j is the row's label; smoothing: eps > 0). A -inf
 * z (a masked column) adds nothing to s, but makes wz -inf when smoothing gives it weight;
 * NaN / +inf make s NaN as in lf_lse_push. */
LF_HD void lf_tp_acc_push(lf_tp_acc *a, float z, float w, int is_label, int smoothing)
{
    lf_lse st;
    st.m = a->m;
    st.s = a->s;
    st.u = 0.0f;
    lf_lse_push(&st, z);
    a->m = st.m;
    a->s = st.s;
    if (is_label) {
        a->zy = z;
        a->has_y = 1;
    }
    if (smoothing && w != 0.0f) a->wz += w * z;
}

/* The share from a shard's statistics: m, s its lse state, wz = sum of w_j z_j over its columns
 * with w_j != 0 (used only when eps > 0), Wr = sum of its w_j (its column count without
 * weights), has_y / zy: the label's z if held here, wy the label's weight. */
LF_HD lf_tp_share lf_tp_share_from(float m, float s, int has_y, float zy, float wy, float wz, float Wr, int64_t V,
                                   float eps)
{
    lf_tp_share sh;
    int moved = 0;
    /* A shard with no mass (every column -inf or massless, lf_massless) whose label z_y is finite
     * is taken at m = z_y: t's m - z_y is then 0 instead of -inf - z_y, and lf_tp_move adds the
     * label's A_r (M - z_y), so the loss is the full row's (M - z_y) + log S, finite, as the
     * single-GPU kernel's. (A shard read as body vectors holds its largest massless column as m,
     * one read as edge elements -inf: both give this loss.) */
    if (has_y && m == -LF_INF_F && zy > -LF_INF_F && zy < LF_INF_F) {
        m = zy;
        moved = 1;
    }
    sh.m = m;
    sh.s = s;
    sh.t = 0.0f;
    if (has_y) /* (1 - eps) w_y (m - z_y); a -inf z_y is +inf (0 * inf = NaN as in section 7) */
        sh.t = (1.0f - eps) * wy * (zy == -LF_INF_F ? LF_INF_F : m - zy);
    if (eps > 0.0f) {
        /* eps (W_r m - sum w z) / V; with m = -inf every column is masked: +inf if any has weight.
         * W_r m and wz both -inf (a shard of columns near the float floor, e.g. masked at
         * torch.finfo.min: both sums overflow) would give -inf - -inf = NaN from finite logits;
         * the term is then +inf, what examples/cross_entropy.cu's (W lse - wz) / V gives on the
         * full row (the double reference's ~1e37-1e38 is out of a float sum's reach). With m
         * moved to z_y (not the shard's maximum) W_r m may overflow where wz does not (class
         * weights): one rounding, fmaf, then, and +inf only where wz itself overflowed */
        const float wm = Wr * m;
        const float sm = moved                 ? (wz == -LF_INF_F ? LF_INF_F : fmaf(Wr, m, -wz))
                       : m == -LF_INF_F        ? (wz != 0.0f ? LF_INF_F : 0.0f)
                       : wm == -LF_INF_F && wz == -LF_INF_F ? LF_INF_F
                                               : wm - wz;
        sh.t += eps * sm / (float)V;
    }
    return sh;
}

LF_HD lf_tp_share lf_tp_share_make(lf_tp_acc a, float wy, float Wr, int64_t V, float eps)
{
    return lf_tp_share_from(a.m, a.s, a.has_y, a.zy, wy, a.wz, Wr, V, eps);
}

/* A row's shares merged: the global lse state (M, S), T = sum_j q_j (M - z_j), A = sum_j q_j. */
typedef struct lf_tp_merged {
    float M, S, T, A;
} lf_tp_merged;

/* Shard r's target mass A_r = (1 - eps) w_y [r holds y] + eps W_r / V. */
LF_HD float lf_tp_mass(int r, int owner, float wy, float W_r, int64_t V, float eps)
{
    return (r == owner ? (1.0f - eps) * wy : 0.0f) + eps * W_r / (float)V;
}

/* Shard r's weight sum: Wr[r], or its column count without class weights (Wr NULL). */
LF_HD float lf_tp_wsum(const float *Wr, int64_t V, int P, int r)
{
    int64_t v0, v1;
    if (Wr) return Wr[r];
    lf_tp_shard(V, P, r, &v0, &v1);
    return (float)(v1 - v0);
}

/* Add share sh (of a shard with mass A_r) to T, with M the merged max: T += t + A_r (M - m). */
LF_HD float lf_tp_move(float T, lf_tp_share sh, float A_r, float M)
{
    T += sh.t;
    if (A_r != 0.0f) T += sh.m == -LF_INF_F ? LF_INF_F : A_r * (M - sh.m);
    return T;
}

/* Row i's P shares in an all-gathered buffer g[r * n_rows + i], merged in rank order. y: the
 * row's label (valid), wy its weight, Wr: [P] per-shard weight sums (NULL without class
 * weights: the shard sizes), V the full vocabulary, eps the label smoothing. (In a kernel,
 * lf_tp_merge_warp of lossfuse_cuda.cuh gives the same bits with the P loads in parallel.) */
LF_HD lf_tp_merged lf_tp_merge(const lf_tp_share *g, int64_t n_rows, int P, int64_t i, int64_t y, float wy,
                               const float *Wr, int64_t V, float eps)
{
    lf_tp_merged mg;
    lf_lse st;
    const int owner = lf_tp_owner(V, P, y);
    int r;
    st.m = -LF_INF_F;
    st.s = st.u = 0.0f;
    for (r = 0; r < P; ++r) {
        lf_lse b;
        const lf_tp_share sh = g[(int64_t)r * n_rows + i];
        b.m = sh.m;
        b.s = sh.s;
        b.u = 0.0f;
        st = lf_lse_merge(st, b);
    }
    mg.M = st.m;
    mg.S = st.s;
    mg.T = 0.0f;
    mg.A = 0.0f;
    for (r = 0; r < P; ++r) {
        const float A_r = lf_tp_mass(r, owner, wy, lf_tp_wsum(Wr, V, P, r), V, eps);
        mg.A += A_r;
        mg.T = lf_tp_move(mg.T, g[(int64_t)r * n_rows + i], A_r, mg.M);
    }
    return mg;
}

/* The row's loss A log S + T + lam lse^2 (section 7's, label valid); NaN when the lse is not
 * finite. *lse_out (if not NULL) gets the lse. */
LF_HD float lf_tp_loss(lf_tp_merged mg, float lam, float *lse_out)
{
    const float lse = mg.S == 0.0f ? -LF_INF_F : mg.M + logf(mg.S);
    if (lse_out) *lse_out = lse;
    if (!(lse > -LF_INF_F && lse < LF_INF_F)) return NAN;
    return mg.A * logf(mg.S) + mg.T + lam * lse * lse;
}

/* The coefficient a of p_j in the gradient (section 7): A + 2 lam lse. */
LF_HD float lf_tp_grad_coef(lf_tp_merged mg, float lse, float lam)
{
    return mg.A + 2.0f * lam * lse;
}

#endif /* LOSSFUSE_H */
