/* examples/dpo_packed.cu — the DPO family straight from packed logits, built from lossfuse's
 * two headers and examples/cross_entropy.cu's fused kernel (which writes the gradient):
 * no [T, V] fp32 copy, no host split of the pack, no host sync.
 *
 * Build and run (from the repository root; meson does the same, see README.md):
 *     nvcc -O3 -std=c++17 -arch=sm_90 -I. examples/dpo_packed.cu -o dpo_packed
 *     ./dpo_packed [pairs=64] [V=32768] [sigmoid|hinge|ipo|simpo] [bf16|fp16|fp32] [deferred]
 *   (deferred: the deferred-scale gradient, dpo_args.tok_scale, checked as s_t G_t)
 *
 * What it does (the loss of lossfuse.h section 9b, lf_ref_dpo_packed)
 *   Chosen and rejected responses packed in one logits buffer [T, V] by cu_seqlens; a pair
 *   table (chosen sequence, rejected sequence); per-token next-token labels with ignore_index
 *   on prompt tokens (or the input ids, shifted within each sequence on the device); optional
 *   per-sequence reference log-probabilities; beta; sigmoid (with label smoothing: cDPO),
 *   hinge, IPO or SimPO; an optional NLL (SFT) term on the chosen responses. Outputs the mean
 *   loss over pairs (divisor: a device scalar, or the number of valid pairs), per-sequence
 *   log-probabilities, and per pair the loss, both rewards and the reward accuracy — what
 *   trainers log — and the gradient written over the logits in place (or to another buffer).
 *
 * Launches (all on the caller's stream; CUDA-graph capturable):
 *   1. cu_seqlens checked on the device (lf_seq_bad): a bad one is one error, loss 0, grad 0
 *   2. token rows: lse and the label's log-probability (one read of the logits; its own
 *      kernel: cross_entropy.cu's forward-only kernel there, the labels put in the workspace
 *      first, made the whole loss 1.5-2.5% slower on an H100 even with the one-launch tail
 *      below: bench/RESULTS.md, session 28)
 *   3. per-sequence sums of log-probabilities and of labelled tokens (lf_seg_sum_grid:
 *      deterministic, one warp per sequence)
 *   4. pairs: loss, metrics, d loss / d h; 5. sequences: d loss / d logp_k, summed over the
 *      pairs in pair order (deterministic); 6. the loss, summed in a fixed order (one CTA)
 *   7. per token s_t = -coef_k of its sequence (0 unlabelled), and the label again (ignored
 *      where s_t = 0: that row's gradient is 0, written without a read)
 *   3-7 are ONE cooperative launch (grid barriers between them) where the device allows it:
 *      they are a few microseconds of work each, and as six kernels they took 7-11 us more at
 *      T = 8192 on an H100 (bench/RESULTS.md, session 28); dpo_args.separate_launches makes
 *      them six kernels, with the same bits, as does a cooperative launch the driver refuses
 *      (a process given part of the SMs: the fallback is automatic)
 *   8. token rows again: cross_entropy.cu's fused kernel with reduction none and s_t as each
 *      row's upstream gradient, so it writes s_t (softmax(x_t) - onehot(y)) = coef_k
 *      (onehot(y) - softmax(x_t)), the DPO gradient, over the row in the read that gives its
 *      lse (the lse of launch 2 is not kept: recomputing it costs nothing in that read). A DPO
 *      gradient IS a cross-entropy gradient with a per-token upstream weight.
 *   Traffic: the logits are read twice and written once (the issue's "one extra read at
 *   most"); workspace 20 B per token, cross_entropy.cu's (672 B + 8 B per token), 20 B per
 *   sequence and 12 B per pair.
 *   Why twice: coef_k needs every token of both sequences of k's pairs, so no element of the
 *   gradient can be written in the read that gives the statistics.
 *
 * The deferred scale (dpo_args.tok_scale): the gradient of the loss is s_t G_t with
 *   G_t = softmax(x_t) - onehot(y_t) and s_t = -coef_k of t's sequence. G_t needs only the row,
 *   so cross_entropy.cu's fused kernel writes it in the same read that gives the row's lse and
 *   label log-probability (launch 2 becomes: labels into the workspace, then ce_launch with
 *   reduction none), launch 7 writes s_t to the caller's [T] vector, and launch 8 is not made:
 *   the logits are read once and written once (4 B/elem in bf16, the issue's floor). The caller
 *   applies s_t where it is cheap: with logits = H W^T (the LM head), dH = diag(s) (G W) and
 *   dW = G^T (diag(s) H), [T, d] scalings instead of a [T, V] pass. The same workspace.
 *
 * Bad input: a label outside [0, V) that is not ignore_index, a pair with a sequence outside
 *   [0, n_seqs) or chosen == rejected: one error each, that token / pair contributes nothing
 *   (its metrics 0). A bad cu_seqlens (cu[0] != 0, a decrease, or cu[n_seqs] != T): one error
 *   for the launch and nothing else looked at: loss 0, gradient 0 (tok_scale 0), every
 *   per-sequence log-probability and pair metric 0. NaN / +inf logits in a labelled token: NaN
 *   log-probability, NaN loss.
 *
 * Sections: 1. API   2. kernels   3. launcher   4. main (make data, check, time)
 */
#include "lossfuse_cuda.cuh"

#include <cooperative_groups.h>
#ifndef CE_NO_MAIN
#define CE_NO_MAIN
#endif
#include "examples/cross_entropy.cu" /* ce_launch: the gradient pass (and the deferred scale's one read) */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ============================================================================================
 * 1. API
 * ========================================================================================== */

typedef struct dpo_args {
    const void *logits;       /* [T, V], row stride `stride` */
    lf_dtype dtype;           /* of logits and grad */
    int64_t n_tokens, vocab, stride;
    const void *labels;       /* [T] int32/int64 next-token labels, or input ids (ids_shift) */
    int labels_i64;
    int ids_shift;            /* 1: `labels` holds input ids; the label of t is ids[t+1] within its sequence */
    const int32_t *cu_seqlens; /* [n_seqs + 1] */
    int64_t n_seqs;
    const int32_t *pairs;     /* [n_pairs][2]: chosen, rejected */
    int64_t n_pairs;
    const float *ref_logps;   /* [n_seqs] or NULL (reference-free) */
    lf_dpo_opts opts;
    const float *divisor;     /* device scalar, or NULL: the number of valid pairs */
    const float *dloss;       /* device upstream gradient [1], or NULL (1) */
    void *grad;               /* NULL: forward only; == logits: in place */
    int64_t grad_stride;
    float *tok_scale;         /* optional [T] (needs grad): the deferred scale. grad then receives
                               * G_t = softmax(x_t) - onehot(y_t) (0 for unlabelled tokens) and
                               * tok_scale[t] = s_t (0 for unlabelled tokens and for a bad cu_seqlens),
                               * so that d loss / d x_t = s_t G_t; the logits are read once, not
                               * twice (see the header) */
    float *loss;              /* [1] */
    float *seq_logps;         /* optional [n_seqs] */
    float *pair_metrics;      /* optional [n_pairs][LF_DPO_METRICS]: loss, chosen reward, rejected
                               * reward, accuracy (1: chosen reward > rejected), reward margin
                               * (chosen - rejected, from the margin in double) */
    unsigned int *n_errors;   /* optional device counter */
    void *workspace;          /* dpo_workspace_bytes(T, n_seqs, n_pairs); no zeroing needed */
    size_t workspace_bytes;
    int separate_launches;    /* 0 (default): launches 3-7 as ONE cooperative launch where the
                               * device allows it (else as below); 1: one kernel each. The same
                               * bits either way; bench/RESULTS.md has the two times. A
                               * cooperative launch the driver refuses because its grid (sized
                               * from the whole device's SMs) cannot be co-resident, as for a
                               * process given only part of the SMs (MPS, green contexts), falls
                               * back to the six kernels by itself (the refusal is cleared, not
                               * left for cudaGetLastError); under stream capture a refused
                               * launch may invalidate the capture, so set 1 there if refusal is
                               * possible */
    int *tail_cooperative;    /* optional HOST int: set to 1 if launches 3-7 ran as one
                               * cooperative launch, 0 if as separate kernels */
    int coop_refuse_test;     /* tests only: size the cooperative grid one CTA over what fits, so
                               * that the driver refuses it and the fallback runs */
} dpo_args;

static dpo_args dpo_args_default(void)
{
    dpo_args a;
    memset(&a, 0, sizeof a);
    a.dtype = LF_BF16;
    a.opts = lf_dpo_opts_default();
    return a;
}

typedef struct dpo_ws {
    float *tok_aux, *tok_lp, *tok_valid;     /* [T]; aux: s_t in place (launch 8's upstream
                                              * gradient), the deferred pass's unused losses */
    double *seq_lp, *seq_n;                  /* [nseq]: double, since a margin is a difference of two long sums */
    float *seq_coef;                         /* [nseq] */
    float *pair_loss, *pair_dh, *pair_ok;    /* [P] */
    float *div;                              /* [1] */
    int *bad;                                /* [1] */
    int64_t *tok_label;                      /* [T] labels for ce_launch */
    void *ce_ws;                             /* cross_entropy.cu's workspace */
    size_t ce_ws_bytes;
    size_t total;
} dpo_ws;

static dpo_ws dpo_ws_layout(void *base, int64_t T, int64_t nseq, int64_t P)
{
    dpo_ws w;
    char *p = (char *)base;
    size_t off = 0;
    auto take = [&](size_t n) -> float * {
        float *r = p ? (float *)(p + off) : nullptr;
        off += ((4 * (n > 0 ? n : 1)) + 255) & ~(size_t)255;
        return r;
    };
    w.tok_aux = take((size_t)T);
    w.tok_lp = take((size_t)T);
    w.tok_valid = take((size_t)T);
    w.seq_lp = (double *)take(2 * (size_t)nseq);
    w.seq_n = (double *)take(2 * (size_t)nseq);
    w.seq_coef = take((size_t)nseq);
    w.pair_loss = take((size_t)P);
    w.pair_dh = take((size_t)P);
    w.pair_ok = take((size_t)P);
    w.div = take(1);
    w.bad = (int *)take(1);
    w.tok_label = (int64_t *)take(2 * (size_t)T);
    w.ce_ws_bytes = ce_workspace_bytes(T);
    w.ce_ws = take((w.ce_ws_bytes + 3) / 4);
    w.total = off;
    return w;
}

/* The workspace of a launch, forward only or either gradient form (the header's sizes). */
static size_t dpo_workspace_bytes(int64_t n_tokens, int64_t n_seqs, int64_t n_pairs)
{
    return dpo_ws_layout(nullptr, n_tokens, n_seqs, n_pairs).total;
}

/* ============================================================================================
 * 2. Kernels
 * ========================================================================================== */

#define DPO_THREADS 256

typedef struct dpo_kparams {
    const void *logits;
    int64_t T, V, stride, nseq, P;
    const void *labels;
    int labels_i64, ids_shift;
    const int32_t *cu, *pairs;
    const float *ref, *divisor, *dloss;
    lf_dpo_opts o;
    void *grad;
    int64_t grad_stride;
    float *tok_scale;  /* the caller's s_t (the deferred scale) or NULL */
    float *tok_s;      /* where launch 7 writes s_t: tok_scale, or in place the workspace's */
    float *loss, *seq_logps, *pair_metrics;
    unsigned int *n_errors;
    dpo_ws ws;
} dpo_kparams;

__global__ void dpo_check_kernel(const dpo_kparams k)
{
    lf_seq_bad(k.cu, k.nseq, k.T, k.ws.bad);
}

static __device__ __forceinline__ int64_t dpo_label(const dpo_kparams &k, int64_t t)
{
    if (k.ids_shift) {
        /* the next input id within t's sequence (lossfuse.h lf_packed_next_label, on int32 or int64 ids) */
        const int64_t s = lf_seq_find(k.cu, k.nseq, t);
        if (s < 0 || t + 1 >= k.cu[s + 1]) return k.o.ignore_index;
        return k.labels_i64 ? ((const int64_t *)k.labels)[t + 1] : (int64_t)((const int32_t *)k.labels)[t + 1];
    }
    return k.labels_i64 ? ((const int64_t *)k.labels)[t] : (int64_t)((const int32_t *)k.labels)[t];
}

/* this thread's share of a row body: an online lse over groups of DPO_UNROLL vectors loaded
 * together (DPO_UNROLL x 16 bytes in flight per thread), one rescale per group */
#define DPO_UNROLL 4
template <typename T>
static __device__ __forceinline__ void dpo_body_lse(const uint4 *body, int nvec, float *m, float *s)
{
    const int PV = lf_elem<T>::per_vec;
    float u = 0.0f;
    int v = threadIdx.x;
    for (; v < nvec; v += DPO_UNROLL * DPO_THREADS) {
        uint4 r[DPO_UNROLL];
#pragma unroll
        for (int q = 0; q < DPO_UNROLL; ++q) {
            const int vq = v + q * DPO_THREADS;
            r[q] = vq < nvec ? __ldg(body + vq) : make_uint4(0xff80ff80u, 0xff80ff80u, 0xff80ff80u, 0xff80ff80u);
        }
        float f[DPO_UNROLL][PV], xm = -LF_INF_F;
#pragma unroll
        for (int q = 0; q < DPO_UNROLL; ++q) {
            if (v + q * DPO_THREADS < nvec) lf_elem<T>::unpack(r[q], f[q]);
            else
#pragma unroll
                for (int e = 0; e < PV; ++e) f[q][e] = -LF_INF_F;
#pragma unroll
            for (int e = 0; e < PV; ++e) xm = fmaxf(xm, f[q][e]);
        }
        const float m_new = fmaxf(*m, xm);
        lf_impl_lse_rescale(*m, m_new, s, &u);
        *m = m_new;
        const float sh = lf_shift_l2e(m_new);
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int q = 0; q < DPO_UNROLL; ++q)
#pragma unroll
            for (int e = 0; e < PV; ++e) {
                const float t = lf_ex2(fmaf(f[q][e], LF_LOG2E, -sh));
                if (e & 1) s1 += t;
                else s0 += t;
            }
        *s = fmaf(s0 + s1, lf_ex2(-lf_shift_err(m_new, sh)), *s); /* onto m itself (lf_shift_err) */
    }
}

/* 2. one CTA per token row (grid-stride): the row's lse (16-byte loads, several in flight per
 * thread, an online lse per thread, a block merge) and the label's log-probability. (Taking the
 * rows from the last to the first, so that the rows read last would still be in L2 when launch 8
 * starts from the first, was slower on an H100: 0-0.5% at V = 32768 and 3% at 151936 for the
 * whole loss, even with the one-launch tail; session 28.) */
template <typename T>
__global__ void __launch_bounds__(DPO_THREADS) dpo_row_kernel(const dpo_kparams k)
{
    __shared__ lf_lse red[DPO_THREADS / 32];
    if (*k.ws.bad) return;
    for (int64_t t = blockIdx.x; t < k.T; t += gridDim.x) {
        const int64_t y = dpo_label(k, t);
        const bool valid = y != k.o.ignore_index && y >= 0 && y < k.V;
        if (!valid) {
            if (threadIdx.x == 0) {
                if (y != k.o.ignore_index && k.n_errors) atomicAdd(k.n_errors, 1u);
                k.ws.tok_lp[t] = 0.0f;
                k.ws.tok_valid[t] = 0.0f;
            }
            continue;
        }
        const T *x = (const T *)k.logits + t * k.stride;
        const lf_row_span sp = lf_row_span_make(x, k.V);
        const float xy = threadIdx.x == 0 ? lf_elem<T>::to_f32(x[y]) : 0.0f; /* issued early */
        lf_lse st = lf_lse_init();
        dpo_body_lse<T>(reinterpret_cast<const uint4 *>(x + sp.head), sp.nvec, &st.m, &st.s);
        const int nedge = sp.head + sp.tail;
        for (int e = threadIdx.x; e < nedge; e += DPO_THREADS) {
            const int64_t j = e < sp.head ? e : sp.head + (int64_t)sp.nvec * lf_elem<T>::per_vec + (e - sp.head);
            lf_lse_push(&st, lf_elem<T>::to_f32(x[j]));
        }
        st = lf_block_lse<DPO_THREADS>(st, red);
        if (threadIdx.x == 0) {
            const float lse = lf_lse_final(st);
            /* x_y - lse as (x_y - m) - log(s), s relative to m itself (lf_shift_err): no
             * cancellation of lse's rounding against x_y (a few 2^-24 where the label is the max) */
            float lp = (xy - st.m) - logf(st.s);
            if (!(fabsf(lse) < LF_INF_F)) lp = NAN;
            k.ws.tok_lp[t] = lp;
            k.ws.tok_valid[t] = 1.0f;
        }
        __syncthreads(); /* red is reused by the next row */
    }
}

/* 2'. deferred scale, before ce_launch: every token's label (the input-ids shift done here) and
 * whether it counts; with a bad cu_seqlens every token unlabelled (ce_launch then writes zero
 * rows and counts nothing). Bad labels are passed on as they are: ce_launch counts them. */
__global__ void dpo_prep_kernel(const dpo_kparams k)
{
    const bool bad = *k.ws.bad != 0;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < k.T; t += (int64_t)gridDim.x * blockDim.x) {
        const int64_t y = bad ? k.o.ignore_index : dpo_label(k, t);
        k.ws.tok_label[t] = y;
        k.ws.tok_valid[t] = y != k.o.ignore_index && y >= 0 && y < k.V ? 1.0f : 0.0f;
    }
}

/* 3-7, the tail: small work over sequences, pairs and tokens between the row pass and the
 * gradient pass. Each phase is a device function over the whole grid (grid-stride loops: the
 * bits of every result do not depend on the grid) or over one CTA of DPO_TAIL_THREADS (the
 * fixed-order sums), run either by ONE cooperative launch (dpo_tail_kernel, grid barriers
 * between the phases: one node instead of six) or, with dpo_args.separate_launches or where the
 * device cannot co-schedule the grid, by one kernel per phase. The two give the same bits. */
#define DPO_TAIL_THREADS 1024

/* 3. per-sequence sums (deterministic) */
static __device__ __forceinline__ void dpo_tail_sums(const dpo_kparams &k)
{
    if (*k.ws.bad) return;
    lf_seg_sum_grid(k.cu, k.nseq, k.ws.tok_lp, k.ws.seq_lp);
    lf_seg_sum_grid(k.cu, k.nseq, k.ws.tok_valid, k.ws.seq_n);
}

static __device__ __forceinline__ bool dpo_pair_ok(const dpo_kparams &k, int64_t p, int32_t *c, int32_t *r)
{
    *c = k.pairs[2 * p];
    *r = k.pairs[2 * p + 1];
    return *c >= 0 && *c < k.nseq && *r >= 0 && *r < k.nseq && *c != *r;
}

/* the default divisor: the number of valid pairs (one CTA, fixed order; every thread calls) */
static __device__ __forceinline__ void dpo_tail_divisor(const dpo_kparams &k, double *scratch)
{
    double a = 0.0;
    for (int64_t p = threadIdx.x; p < k.P; p += DPO_TAIL_THREADS) {
        int32_t c, r;
        a += dpo_pair_ok(k, p, &c, &r) ? 1.0 : 0.0;
    }
    a = lf_block_sum_f64<DPO_TAIL_THREADS>(a, scratch);
    if (threadIdx.x == 0) *k.ws.div = (float)a;
}

static __device__ __forceinline__ double dpo_score(const dpo_kparams &k, int32_t s, bool norm, double v)
{
    const double n = k.ws.seq_n[s];
    return norm ? (n > 0.0 ? v / n : 0.0) : v;
}

/* 4. pairs: loss, metrics, d loss / d h. The margin h is formed in double from the double
 * sums (two sums of hundreds of log-probabilities differ by little), then the float loss. */
static __device__ __forceinline__ void dpo_tail_pairs(const dpo_kparams &k)
{
    const bool bad = *k.ws.bad != 0;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < k.P; p += (int64_t)gridDim.x * blockDim.x) {
        int32_t c, r;
        const bool ok = !bad && dpo_pair_ok(k, p, &c, &r);
        if (!ok && !bad && k.n_errors) atomicAdd(k.n_errors, 1u);
        float l = 0.0f, dh = 0.0f, rwc = 0.0f, rwr = 0.0f, mg = 0.0f;
        if (ok) {
            const bool norm = k.o.length_normalize || k.o.kind == LF_DPO_SIMPO;
            const double sc = dpo_score(k, c, norm, k.ws.seq_lp[c]), sr = dpo_score(k, r, norm, k.ws.seq_lp[r]);
            double rc = 0.0, rr = 0.0;
            if (k.ref && k.o.kind != LF_DPO_SIMPO) {
                rc = dpo_score(k, c, norm, (double)k.ref[c]);
                rr = dpo_score(k, r, norm, (double)k.ref[r]);
            }
            const double hd = (sc - rc) - (sr - rr);
            const float h = (float)hd;
            switch (k.o.kind) {
            case LF_DPO_HINGE: l = lf_dpo_hinge(h, k.o.beta, &dh); break;
            case LF_DPO_IPO: { /* h - 1 / (2 beta) in double: near the target margin it cancels, and in float
                                * the roundings of h and of 1 / (2 beta) would be all of its derivative */
                const double rd = hd - 0.5 / (double)k.o.beta;
                l = (float)(rd * rd);
                dh = (float)(2.0 * rd);
                break;
            }
            case LF_DPO_SIMPO: l = lf_simpo(h, k.o.beta, k.o.gamma, &dh); break;
            default: l = lf_dpo_sigmoid(h, k.o.beta, k.o.label_smoothing, &dh); break;
            }
            const double nc = k.ws.seq_n[c];
            if (k.o.nll_weight > 0.0f && nc > 0.0) l += (float)((double)k.o.nll_weight * (-k.ws.seq_lp[c] / nc));
            rwc = (float)((double)k.o.beta * (sc - rc));
            rwr = (float)((double)k.o.beta * (sr - rr));
            mg = (float)((double)k.o.beta * hd);
        }
        k.ws.pair_loss[p] = l;
        k.ws.pair_dh[p] = dh;
        k.ws.pair_ok[p] = ok ? 1.0f : 0.0f;
        if (k.pair_metrics) { /* a bad pair, or every pair after a bad cu_seqlens: all 0 */
            float *m = k.pair_metrics + LF_DPO_METRICS * p;
            m[0] = l;
            m[1] = rwc;
            m[2] = rwr;
            m[3] = ok && rwc > rwr ? 1.0f : 0.0f;
            m[4] = mg;
        }
    }
}

static __device__ __forceinline__ float dpo_scale(const dpo_kparams &k)
{
    const float d = k.divisor ? *k.divisor : *k.ws.div;
    return (d == 0.0f ? 0.0f : 1.0f / d) * (k.dloss ? *k.dloss : 1.0f);
}

/* 5. sequences: c_k = d loss / d logp_k, over all pairs in pair order (no atomics) */
static __device__ __forceinline__ void dpo_tail_coef(const dpo_kparams &k)
{
    if (*k.ws.bad) { /* no coefficient is read (every s_t is 0); the log-probabilities are 0 */
        if (k.seq_logps)
            for (int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; s < k.nseq; s += (int64_t)gridDim.x * blockDim.x)
                k.seq_logps[s] = 0.0f;
        return;
    }
    const bool norm = k.o.length_normalize || k.o.kind == LF_DPO_SIMPO;
    for (int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; s < k.nseq; s += (int64_t)gridDim.x * blockDim.x) {
        const float n = (float)k.ws.seq_n[s], dn = norm ? (n > 0.0f ? 1.0f / n : 0.0f) : 1.0f;
        float a = 0.0f;
        for (int64_t p = 0; p < k.P; ++p) {
            if (k.ws.pair_ok[p] == 0.0f) continue;
            const int32_t c = k.pairs[2 * p], r = k.pairs[2 * p + 1];
            if (c == s) {
                a += k.ws.pair_dh[p] * dn;
                if (k.o.nll_weight > 0.0f && n > 0.0f) a -= k.o.nll_weight / n;
            }
            if (r == s) a -= k.ws.pair_dh[p] * dn;
        }
        k.ws.seq_coef[s] = a * dpo_scale(k);
        if (k.seq_logps) k.seq_logps[s] = (float)k.ws.seq_lp[s];
    }
}

/* 6. the loss, summed in a fixed order (one CTA; every thread calls), and a bad cu_seqlens
 * (flagged by dpo_check_kernel) counted as one error */
static __device__ __forceinline__ void dpo_tail_loss(const dpo_kparams &k, double *scratch)
{
    double a = 0.0;
    if (!*k.ws.bad)
        for (int64_t p = threadIdx.x; p < k.P; p += DPO_TAIL_THREADS) a += (double)k.ws.pair_loss[p];
    a = lf_block_sum_f64<DPO_TAIL_THREADS>(a, scratch);
    if (threadIdx.x == 0) {
        const double d = (double)(k.divisor ? *k.divisor : *k.ws.div);
        k.loss[0] = *k.ws.bad ? 0.0f : (float)(d == 0.0 ? a * 0.0 : a / d);
        if (*k.ws.bad && k.n_errors) atomicAdd(k.n_errors, 1u);
    }
}

/* 7. s_t = -c_k of t's sequence (0 unlabelled): the deferred scale, or in place launch 8's
 * upstream gradient, with the label it takes (ignore_index where s_t = 0: a zero row, not read;
 * a NaN s_t keeps the label, so a NaN coefficient still gives a NaN gradient) */
static __device__ __forceinline__ void dpo_tail_scale(const dpo_kparams &k)
{
    const bool bad = *k.ws.bad != 0, in_place = k.tok_scale == nullptr;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < k.T; t += (int64_t)gridDim.x * blockDim.x) {
        float s = 0.0f;
        if (!bad && k.ws.tok_valid[t] != 0.0f) s = -k.ws.seq_coef[lf_seq_find(k.cu, k.nseq, t)];
        k.tok_s[t] = s;
        if (in_place) k.ws.tok_label[t] = s != 0.0f ? dpo_label(k, t) : k.o.ignore_index;
    }
}

/* the tail in one cooperative launch: sums (and the divisor) | pairs | coefficients and the
 * loss | the scale, each | a grid barrier */
__global__ void __launch_bounds__(DPO_TAIL_THREADS) dpo_tail_kernel(const dpo_kparams k)
{
    __shared__ double scratch[DPO_TAIL_THREADS / 32];
    cooperative_groups::grid_group grid = cooperative_groups::this_grid();
    dpo_tail_sums(k);
    if (!k.divisor && blockIdx.x == gridDim.x - 1) dpo_tail_divisor(k, scratch);
    grid.sync();
    dpo_tail_pairs(k);
    grid.sync();
    dpo_tail_coef(k);
    if (blockIdx.x == 0) dpo_tail_loss(k, scratch); /* scratch: a barrier (the grid's) since the divisor */
    if (k.grad && k.T > 0) {
        grid.sync();
        dpo_tail_scale(k);
    }
}

/* the same phases one kernel each (dpo_args.separate_launches, or no cooperative launch) */
__global__ void __launch_bounds__(DPO_TAIL_THREADS) dpo_sums_kernel(const dpo_kparams k) { dpo_tail_sums(k); }
__global__ void __launch_bounds__(DPO_TAIL_THREADS) dpo_divisor_kernel(const dpo_kparams k)
{
    __shared__ double scratch[DPO_TAIL_THREADS / 32];
    dpo_tail_divisor(k, scratch);
}
__global__ void __launch_bounds__(DPO_TAIL_THREADS) dpo_pairs_kernel(const dpo_kparams k) { dpo_tail_pairs(k); }
__global__ void __launch_bounds__(DPO_TAIL_THREADS) dpo_coef_kernel(const dpo_kparams k) { dpo_tail_coef(k); }
__global__ void __launch_bounds__(DPO_TAIL_THREADS) dpo_loss_kernel(const dpo_kparams k)
{
    __shared__ double scratch[DPO_TAIL_THREADS / 32];
    dpo_tail_loss(k, scratch);
}
__global__ void __launch_bounds__(DPO_TAIL_THREADS) dpo_scale_kernel(const dpo_kparams k) { dpo_tail_scale(k); }

/* ============================================================================================
 * 3. Launcher
 * ========================================================================================== */

#define DPO_CHECK(call)                                                                             \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            if (cuda_err) *cuda_err = e_;                                                           \
            return LF_ERR_DEVICE;                                                                   \
        }                                                                                           \
    } while (0)

/* cross_entropy.cu's fused kernel over the token rows, reduction none, on the workspace's labels
 * (launch 2 of the deferred scale: G_t and the log-probabilities; launch 8 in place: the
 * gradient, each row's upstream gradient s_t) */
static lf_status dpo_ce_pass(const dpo_kparams &k, lf_dtype dtype, const float *dloss, float *loss, float *logprob,
                             unsigned int *n_errors, cudaStream_t stream, cudaError_t *cuda_err)
{
    DPO_CHECK(cudaMemsetAsync(k.ws.ce_ws, 0, sizeof(ce_ws_header), stream)); /* its counters start at 0 */
    ce_args c = ce_args_default();
    c.logits = k.logits;
    c.dtype = dtype;
    c.n_rows = k.T;
    c.vocab = k.V;
    c.stride = k.stride;
    c.labels = k.ws.tok_label;
    c.labels_i64 = 1;
    c.opts.ignore_index = k.o.ignore_index;
    c.reduction = LF_REDUCE_NONE;
    c.dloss = dloss;
    c.grad = k.grad;
    c.grad_stride = k.grad_stride;
    c.loss = loss;
    c.logprob = logprob;
    c.n_errors = n_errors;
    c.workspace = k.ws.ce_ws;
    c.workspace_bytes = k.ws.ce_ws_bytes;
    return ce_launch(&c, stream, cuda_err);
}

/* The device of a launch, asked once per dpo_launch. */
typedef struct dpo_dev {
    int dev, sms;
} dpo_dev;

/* launches 3-7, the tail: one cooperative launch where the device co-schedules its grid,
 * else (or with separate, or where the driver refuses the grid) one kernel per phase; *coop
 * (optional) says which ran. refuse_test: the grid one CTA over what fits (the fallback's test). */
static lf_status dpo_tail_launch(const dpo_kparams &k, const dpo_dev &dv, bool separate, bool refuse_test, int *coop_out,
                                 cudaStream_t stream, cudaError_t *cuda_err)
{
    const int64_t NT = DPO_TAIL_THREADS, tok = k.grad ? k.T : 0;
    auto blocks = [&](int64_t threads, int64_t cap) { /* at least one CTA */
        const int64_t b = (threads + NT - 1) / NT;
        return (unsigned)(b < 1 ? 1 : b < cap ? b : cap);
    };
    int64_t work = 32 * k.nseq; /* a warp per sequence for the sums */
    if (k.P > work) work = k.P;
    if (tok > work) work = tok;
    if (coop_out) *coop_out = 0;
    if (!separate) {
        /* per device, asked once: whether it launches cooperatively, and the tail CTAs an SM holds
         * (0: no cooperative launch) */
        static int ready_d[CE_MAX_DEVICES], per_sm_d[CE_MAX_DEVICES];
        if (dv.dev < 0 || dv.dev >= CE_MAX_DEVICES) return LF_ERR_DEVICE;
        if (!ready_d[dv.dev]) {
            int coop = 0, per_sm = 0;
            DPO_CHECK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dv.dev));
            if (coop) DPO_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, dpo_tail_kernel, DPO_TAIL_THREADS, 0));
            per_sm_d[dv.dev] = per_sm;
            ready_d[dv.dev] = 1;
        }
        const int per_sm = per_sm_d[dv.dev];
        if (per_sm > 0) {
            const int64_t fit = (int64_t)per_sm * dv.sms;
            cudaLaunchConfig_t cfg = {};
            cudaLaunchAttribute at[1] = {};
            at[0].id = cudaLaunchAttributeCooperative;
            at[0].val.cooperative = 1;
            cfg.gridDim = dim3(refuse_test ? (unsigned)(fit + 1) : blocks(work, fit)); /* grid-stride phases: any grid */
            cfg.blockDim = dim3(DPO_TAIL_THREADS);
            cfg.stream = stream;
            cfg.attrs = at;
            cfg.numAttrs = 1;
            const cudaError_t e = cudaLaunchKernelEx(&cfg, dpo_tail_kernel, k);
            if (e == cudaSuccess) {
                if (coop_out) *coop_out = 1;
                return LF_OK;
            }
            /* refused: the grid cannot be co-resident here (fewer SMs than the device reports to
             * this process, or the test's grid). Not sticky: clear it and take the six kernels */
            if (e != cudaErrorCooperativeLaunchTooLarge) DPO_CHECK(e);
            (void)cudaGetLastError();
        }
    }
    if (k.nseq > 0) {
        dpo_sums_kernel<<<blocks(32 * k.nseq, 1024), DPO_TAIL_THREADS, 0, stream>>>(k);
        DPO_CHECK(cudaGetLastError());
    }
    if (!k.divisor) {
        dpo_divisor_kernel<<<1, DPO_TAIL_THREADS, 0, stream>>>(k);
        DPO_CHECK(cudaGetLastError());
    }
    if (k.P > 0) {
        dpo_pairs_kernel<<<blocks(k.P, 4096), DPO_TAIL_THREADS, 0, stream>>>(k);
        DPO_CHECK(cudaGetLastError());
    }
    if (k.nseq > 0) {
        dpo_coef_kernel<<<blocks(k.nseq, 4096), DPO_TAIL_THREADS, 0, stream>>>(k);
        DPO_CHECK(cudaGetLastError());
    }
    dpo_loss_kernel<<<1, DPO_TAIL_THREADS, 0, stream>>>(k);
    DPO_CHECK(cudaGetLastError());
    if (tok > 0) {
        dpo_scale_kernel<<<blocks(tok, 4096), DPO_TAIL_THREADS, 0, stream>>>(k);
        DPO_CHECK(cudaGetLastError());
    }
    return LF_OK;
}

template <typename T>
static lf_status dpo_launch_t(const dpo_kparams &k, const dpo_args *a, const dpo_dev &dv, int rows_grid, cudaStream_t stream,
                              cudaError_t *cuda_err)
{
    const lf_dtype dtype = a->dtype;
    const bool deferred = k.tok_scale != nullptr;
    if (k.T > 0 && !deferred) {
        dpo_row_kernel<T><<<rows_grid, DPO_THREADS, 0, stream>>>(k);
        DPO_CHECK(cudaGetLastError());
    }
    if (k.T > 0 && deferred) { /* the labels, then one read of the logits: lse, log-probability, G_t */
        const unsigned tok_grid = (unsigned)((k.T + 255) / 256 < 4096 ? (k.T + 255) / 256 : 4096);
        dpo_prep_kernel<<<tok_grid, 256, 0, stream>>>(k);
        DPO_CHECK(cudaGetLastError());
        /* its losses -log p(y) are not used: the log-probability is taken directly; it counts
         * the bad labels */
        const lf_status st = dpo_ce_pass(k, dtype, nullptr, k.ws.tok_aux, k.ws.tok_lp, k.n_errors, stream, cuda_err);
        if (st != LF_OK) return st;
    }
    const lf_status st = dpo_tail_launch(k, dv, a->separate_launches != 0, a->coop_refuse_test != 0, a->tail_cooperative, stream, cuda_err);
    if (st != LF_OK || !k.grad || k.T == 0 || deferred) return st;
    /* launch 8: the gradient; its losses go over the log-probabilities, summed already, and the
     * bad labels were counted by launch 2 */
    return dpo_ce_pass(k, dtype, k.tok_s, k.ws.tok_lp, nullptr, nullptr, stream, cuda_err);
}

static lf_status dpo_launch(const dpo_args *a, cudaStream_t stream, cudaError_t *cuda_err)
{
    if (cuda_err) *cuda_err = cudaSuccess;
    if (!a) return LF_ERR_NULL;
    lf_status st = lf_check_dpo_opts(&a->opts);
    if (st != LF_OK) return st;
    if (a->n_tokens < 0 || a->n_seqs < 0 || a->n_pairs < 0 || a->vocab < 1 || a->vocab > 0x7fffffff || a->stride < a->vocab)
        return LF_ERR_SIZE;
    if (a->dtype != LF_F32 && a->dtype != LF_BF16 && a->dtype != LF_F16) return LF_ERR_ARG;
    if (a->grad && a->grad_stride < a->vocab) return LF_ERR_SIZE;
    if (a->grad && a->n_tokens > 0) {
        const size_t esz = (size_t)lf_dtype_size(a->dtype);
        const char *x0 = (const char *)a->logits, *g0 = (const char *)a->grad;
        const char *x1 = x0 + ((size_t)(a->n_tokens - 1) * a->stride + a->vocab) * esz;
        const char *g1 = g0 + ((size_t)(a->n_tokens - 1) * a->grad_stride + a->vocab) * esz;
        const bool same = a->grad == a->logits && a->grad_stride == a->stride;
        if (!same && g0 < x1 && x0 < g1) return LF_ERR_ARG;
    }
    if (!a->loss || !a->workspace || !a->cu_seqlens || (a->n_tokens > 0 && (!a->logits || !a->labels)) ||
        (a->n_pairs > 0 && !a->pairs))
        return LF_ERR_NULL;
    if (a->tok_scale && !a->grad) return LF_ERR_ARG; /* the deferred scale is a form of the gradient */
    if (a->workspace_bytes < dpo_workspace_bytes(a->n_tokens, a->n_seqs, a->n_pairs)) return LF_ERR_SIZE;

    dpo_kparams k;
    memset(&k, 0, sizeof k);
    k.logits = a->logits;
    k.T = a->n_tokens;
    k.V = a->vocab;
    k.stride = a->stride;
    k.nseq = a->n_seqs;
    k.P = a->n_pairs;
    k.labels = a->labels;
    k.labels_i64 = a->labels_i64;
    k.ids_shift = a->ids_shift;
    k.cu = a->cu_seqlens;
    k.pairs = a->pairs;
    k.ref = a->ref_logps;
    k.divisor = a->divisor;
    k.dloss = a->dloss;
    k.o = a->opts;
    k.grad = a->grad;
    k.grad_stride = a->grad_stride;
    k.tok_scale = a->tok_scale;
    k.loss = a->loss;
    k.seq_logps = a->seq_logps;
    k.pair_metrics = a->pair_metrics;
    k.n_errors = a->n_errors;
    k.ws = dpo_ws_layout(a->workspace, k.T, k.nseq, k.P);
    k.tok_s = a->tok_scale ? a->tok_scale : k.ws.tok_aux;

    /* 1. cu_seqlens on the device: a bad one is counted once and stops everything after */
    DPO_CHECK(cudaMemsetAsync(k.ws.bad, 0, sizeof(int), stream));
    dpo_check_kernel<<<(unsigned)((k.nseq + 1 + 255) / 256 < 64 ? (k.nseq + 1 + 255) / 256 : 64), 256, 0, stream>>>(k);
    DPO_CHECK(cudaGetLastError());
    dpo_dev dv;
    DPO_CHECK(cudaGetDevice(&dv.dev));
    DPO_CHECK(cudaDeviceGetAttribute(&dv.sms, cudaDevAttrMultiProcessorCount, dv.dev));
    const int rows_grid = (int)(k.T < (int64_t)dv.sms * 8 ? (k.T > 0 ? k.T : 1) : (int64_t)dv.sms * 8);
    switch (a->dtype) {
    case LF_F32: return dpo_launch_t<float>(k, a, dv, rows_grid, stream, cuda_err);
    case LF_BF16: return dpo_launch_t<__nv_bfloat16>(k, a, dv, rows_grid, stream, cuda_err);
    default: return dpo_launch_t<__half>(k, a, dv, rows_grid, stream, cuda_err);
    }
}

#undef DPO_CHECK

/* ============================================================================================
 * 4. main: packed chosen / rejected responses, forward + backward in place, checked against
 *    lf_ref_dpo_packed, timed.
 * ========================================================================================== */
#ifndef DPO_NO_MAIN

#define CHECK_CUDA(call)                                                                            \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));  \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

static uint64_t rng_state = 0xd1b54a32d192ed03ull;
static double rng_uniform(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0);
}

int main(int argc, char **argv)
{
    const int64_t npairs = argc > 1 ? atoll(argv[1]) : 8, V = argc > 2 ? atoll(argv[2]) : 32768;
    lf_dpo_opts o = lf_dpo_opts_default();
    const char *kn = argc > 3 ? argv[3] : "sigmoid";
    o.kind = !strcmp(kn, "hinge") ? LF_DPO_HINGE : !strcmp(kn, "ipo") ? LF_DPO_IPO : !strcmp(kn, "simpo") ? LF_DPO_SIMPO : LF_DPO_SIGMOID;
    if (o.kind == LF_DPO_IPO) o.length_normalize = 1;
    if (o.kind == LF_DPO_SIMPO) o.beta = 2.0f;
    lf_dtype dt = LF_BF16;
    if (argc > 4) dt = !strcmp(argv[4], "fp32") ? LF_F32 : !strcmp(argv[4], "fp16") ? LF_F16 : LF_BF16;
    const int esz = lf_dtype_size(dt);
    const bool deferred = argc > 5 && !strcmp(argv[5], "deferred");

    /* sequences 2p (chosen) and 2p+1 (rejected): a prompt of 8-40 tokens (no labels), a
     * response of 16-96 */
    const int64_t nseq = 2 * npairs;
    int32_t *cu = (int32_t *)malloc(4 * (nseq + 1)), *pairs = (int32_t *)malloc(8 * npairs);
    cu[0] = 0;
    for (int64_t k = 0; k < nseq; ++k) cu[k + 1] = cu[k] + 24 + (int32_t)(rng_uniform() * 112);
    const int64_t T = cu[nseq];
    int64_t *labels = (int64_t *)malloc(8 * T);
    for (int64_t k = 0; k < nseq; ++k) {
        const int64_t prompt = 8 + (int64_t)(rng_uniform() * 32);
        for (int64_t t = cu[k]; t < cu[k + 1]; ++t)
            labels[t] = (t - cu[k] < prompt || t + 1 == cu[k + 1]) ? o.ignore_index : (int64_t)(rng_uniform() * V);
    }
    for (int64_t p = 0; p < npairs; ++p) {
        pairs[2 * p] = (int32_t)(2 * p);
        pairs[2 * p + 1] = (int32_t)(2 * p + 1);
    }
    const size_t nel = (size_t)T * V;
    float *xf = (float *)malloc(4 * nel), *ref = (float *)malloc(4 * nseq);
    void *xh = malloc(esz * nel);
    for (size_t i = 0; i < nel; ++i) {
        double n = 0.0;
        for (int q = 0; q < 4; ++q) n += rng_uniform() - 0.5;
        float v = (float)(3.0 * n);
        if (dt == LF_F32) ((float *)xh)[i] = v;
        else {
            const uint16_t h = dt == LF_BF16 ? lf_f32_to_bf16(v) : lf_f32_to_f16(v);
            ((uint16_t *)xh)[i] = h;
            v = dt == LF_BF16 ? lf_bf16_to_f32(h) : lf_f16_to_f32(h);
        }
        xf[i] = v; /* the reference sees exactly what the kernel sees */
    }
    /* reference log-probabilities near the policy's (about -log V per labelled token) */
    for (int64_t k = 0; k < nseq; ++k) {
        int64_t n = 0;
        for (int64_t t = cu[k]; t < cu[k + 1]; ++t) n += labels[t] >= 0;
        ref[k] = (float)(-(double)n * (log((double)V) + 0.5) * (0.98 + 0.04 * rng_uniform()));
    }

    double ref_loss = 0.0, *seq = (double *)malloc(8 * 3 * nseq), *pm = (double *)malloc(sizeof(double) * LF_DPO_METRICS * npairs);
    double *rg = (double *)malloc(8 * nel);
    const lf_status rs = lf_ref_dpo_packed(T, V, xf, V, labels, cu, nseq, pairs, npairs, ref, &o, -1.0, &ref_loss, seq, pm, rg, NULL);
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("no CUDA device found: ran the host reference only\n");
        printf("lf_ref_dpo_packed pairs=%lld tokens=%lld V=%lld %s: status=%s loss=%.6f, pair 0 rewards %.4f / %.4f\n",
               (long long)npairs, (long long)T, (long long)V, kn, lf_status_str(rs), ref_loss, pm[1], pm[2]);
        return rs == LF_OK ? 0 : 1;
    }
    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s  pairs=%lld tokens=%lld V=%lld %s %s\n", prop.name, (long long)npairs, (long long)T, (long long)V, kn,
           dt == LF_F32 ? "fp32" : dt == LF_F16 ? "fp16" : "bf16");

    void *xd, *ws, *pristine;
    int64_t *yd;
    int32_t *cud, *pd;
    float *refd, *loss, *seqd, *pmd, *scale = NULL;
    unsigned *err;
    const size_t wsb = dpo_workspace_bytes(T, nseq, npairs);
    if (deferred) CHECK_CUDA(cudaMalloc(&scale, 4 * T));
    CHECK_CUDA(cudaMalloc(&xd, esz * nel));
    CHECK_CUDA(cudaMalloc(&pristine, esz * nel));
    CHECK_CUDA(cudaMalloc(&yd, 8 * T));
    CHECK_CUDA(cudaMalloc(&cud, 4 * (nseq + 1)));
    CHECK_CUDA(cudaMalloc(&pd, 8 * npairs));
    CHECK_CUDA(cudaMalloc(&refd, 4 * nseq));
    CHECK_CUDA(cudaMalloc(&loss, 4));
    CHECK_CUDA(cudaMalloc(&seqd, 4 * nseq));
    CHECK_CUDA(cudaMalloc(&pmd, sizeof(float) * LF_DPO_METRICS * npairs));
    CHECK_CUDA(cudaMalloc(&err, 4));
    CHECK_CUDA(cudaMalloc(&ws, wsb));
    CHECK_CUDA(cudaMemcpy(xd, xh, esz * nel, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(pristine, xh, esz * nel, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(yd, labels, 8 * T, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(cud, cu, 4 * (nseq + 1), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(pd, pairs, 8 * npairs, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(refd, ref, 4 * nseq, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(err, 0, 4));

    dpo_args a = dpo_args_default();
    a.logits = xd;
    a.dtype = dt;
    a.n_tokens = T;
    a.vocab = V;
    a.stride = V;
    a.labels = yd;
    a.labels_i64 = 1;
    a.cu_seqlens = cud;
    a.n_seqs = nseq;
    a.pairs = pd;
    a.n_pairs = npairs;
    a.ref_logps = refd;
    a.opts = o;
    a.grad = xd; /* in place */
    a.grad_stride = V;
    a.tok_scale = scale; /* deferred: grad gets G_t, scale s_t; the gradient is s_t G_t */
    a.loss = loss;
    a.seq_logps = seqd;
    a.pair_metrics = pmd;
    a.n_errors = err;
    a.workspace = ws;
    a.workspace_bytes = wsb;
    cudaError_t ce;
    lf_status st = dpo_launch(&a, 0, &ce);
    if (st != LF_OK) {
        fprintf(stderr, "dpo_launch: %s (%s)\n", lf_status_str(st), cudaGetErrorString(ce));
        return 1;
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    float lh;
    CHECK_CUDA(cudaMemcpy(&lh, loss, 4, cudaMemcpyDeviceToHost));
    void *gh = malloc(esz * nel);
    float *sh = (float *)malloc(4 * T);
    CHECK_CUDA(cudaMemcpy(gh, xd, esz * nel, cudaMemcpyDeviceToHost));
    for (int64_t t = 0; t < T; ++t) sh[t] = 1.0f;
    if (deferred) CHECK_CUDA(cudaMemcpy(sh, scale, 4 * T, cudaMemcpyDeviceToHost));
    /* loss: fp32 per-token log-probabilities summed per sequence, float pair losses: 1e-4
     * relative. Gradient: the dtype's rounding of each entry plus 1e-5 of the row's largest. */
    const double unit = dt == LF_BF16 ? 0x1p-8 : dt == LF_F16 ? 0x1p-11 : 0x1p-17;
    double gerr = 0.0;
    for (int64_t t = 0; t < T; ++t) {
        double rmax = 0.0;
        for (int64_t j = 0; j < V; ++j) rmax = fmax(rmax, fabs(rg[(size_t)t * V + j]));
        for (int64_t j = 0; j < V; ++j) {
            const size_t i = (size_t)t * V + j;
            const double g = (double)sh[t] * (dt == LF_F32 ? ((float *)gh)[i]
                                                           : (dt == LF_BF16 ? lf_bf16_to_f32(((uint16_t *)gh)[i])
                                                                            : lf_f16_to_f32(((uint16_t *)gh)[i])));
            gerr = fmax(gerr, fabs(g - rg[i]) / (unit * fabs(rg[i]) + 1e-5 * rmax + 1e-30));
        }
    }
    const double lerr = fabs(lh - ref_loss) / (1e-4 * (1.0 + fabs(ref_loss)));

    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int it = 0; it < 8; ++it) {
        CHECK_CUDA(cudaMemcpy(xd, pristine, esz * nel, cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaEventRecord(e0));
        st = dpo_launch(&a, 0, &ce);
        CHECK_CUDA(cudaEventRecord(e1));
        CHECK_CUDA(cudaEventSynchronize(e1));
        if (st != LF_OK) return 1;
        float ms;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (it > 0 && ms < best) best = ms;
    }
    unsigned errs;
    CHECK_CUDA(cudaMemcpy(&errs, err, 4, cudaMemcpyDeviceToHost));
    printf("loss         : %.6f, reference %.6f: error %.3f of tolerance\n", lh, ref_loss, lerr);
    printf("gradient     : max error %.3f of tolerance (in place over the logits%s)\n", gerr,
           deferred ? "; s_t G_t, the deferred scale" : "");
    const int reads = deferred ? 1 : 2;
    printf("time         : %.3f ms, %.1f GB/s (logits read %s, gradient written once = %d B/elem)\n", best,
           (reads + 1.0) * esz * nel / (best * 1e6), deferred ? "once" : "twice", (reads + 1) * esz);
    printf("errors       : %u\n", errs);
    const int ok = rs == LF_OK && lerr <= 1.0 && gerr <= 1.0 && errs == 0;
    printf("%s\n", ok ? "OK" : "MISMATCH");
    return ok ? 0 : 1;
}
#endif /* DPO_NO_MAIN */
