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
 *   4. Logit transform (scale, softcap)
 *   5. Packed sequences: segment lookup, next-token label shift
 *   6. Host validation (labels, cu_seqlens, options)
 *   7. Host references: cross-entropy (lf_ref_ce_row, lf_ref_cross_entropy)
 *
 * Configuration macros (define before including; each is #ifndef-guarded)
 *   LF_HD        function qualifiers of the portable functions.
 *                Default: `static inline`, plus `__host__ __device__` under nvcc.
 *   LF_USE_EXP2  1 (default): lf_exp_diff(a, b) = exp(a - b) is evaluated as
 *                exp2((a - b) * log2(e)), one FADD + FMUL + MUFU.EX2 on NVIDIA GPUs, accurate
 *                relative to a - b. 0: plain expf(a - b). The state's meaning is the same.
 *                (The device row passes go one step further — see lf_frag_stats in
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
    LF_ERR_DEVICE = 6   /* a CUDA call failed (used by the examples' launchers) */
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
 *        m = max_j x_j                    (-inf when empty)
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

/* Push one value x. */
LF_HD void lf_lse_push(lf_lse *st, float x)
{
    float m_new = fmaxf(st->m, x); /* fmaxf ignores a NaN x: the NaN reaches s below */
    float shift = (m_new == -LF_INF_F) ? 0.0f : m_new;
    float e, d;
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
        else if (z > m) m = z;
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

#endif /* LOSSFUSE_H */
