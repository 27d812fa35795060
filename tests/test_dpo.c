/* test_dpo.c — host tests of lossfuse.h section 9: the packed-sequence building blocks
 * (lf_check_pairs, lf_ref_seg_sum, lf_ref_pair_scatter, lf_ref_histogram), the DPO family from
 * packed logits (lf_ref_dpo_packed) and the pairwise preference loss with histogram penalties
 * (lf_ref_pairwise_preference), against independent long-double formulas written here, and
 * their gradients against central finite differences of the references themselves.
 *
 * Build and run:
 *     gcc -std=c99 -O2 -Wall -Wextra -pedantic -Werror -I. tests/test_dpo.c -o test_dpo -lm
 *     ./test_dpo [seed]
 * Tolerances: the references work in double from float inputs; against long double a loss is
 * within 1e-12 (1 + |loss| + |beta h|) (a few hundred double roundings of terms of that size).
 * Finite differences: inputs moved by +-2^-6 (DPO logits) or +-2^-8 (scores), exact in float,
 * central; the O(delta^2) error of the smooth losses stays below 2e-3 |g| + 2e-5. Hinges are
 * not differenced within 0.05 of their corner.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lossfuse.h"

#include "host_check.h"

typedef long double ld;

static ld n_softplus(ld x) { return x > 0 ? x + log1pl(expl(-x)) : log1pl(expl(x)); }
static ld n_sigmoid(ld x) { return 1.0L / (1.0L + expl(-x)); }

/* ------------------------------------------------------------------ building blocks ------ */

static void test_blocks(void)
{
    int32_t cu[10];
    float v[64];
    double out[9];
    int32_t pairs[2 * 12], bins[40];
    float g[12], mass[40];
    double acc[20], want[20], hist[7];
    int64_t nb, fb, k, t, i;
    /* cu_seqlens with empty sequences at the start, middle and end, and a length-1 one */
    int lens[9] = {0, 5, 1, 0, 17, 3, 0, 20, 0};
    cu[0] = 0;
    for (k = 0; k < 9; ++k) cu[k + 1] = cu[k] + lens[k];
    for (t = 0; t < cu[9]; ++t) v[t] = (float)rng_normal() * 10.0f;
    CHECK(lf_ref_seg_sum(cu, 9, v, out) == LF_OK, "seg_sum status");
    for (k = 0; k < 9; ++k) {
        ld a = 0;
        for (t = cu[k]; t < cu[k + 1]; ++t) a += v[t];
        CHECK(fabs(out[k] - (double)a) <= 1e-12 * (1.0 + fabs((double)a)), "seg %lld sum %.17g want %.17Lg", (long long)k, out[k], a);
    }
    cu[4] = cu[3] - 1; /* decreasing */
    CHECK(lf_ref_seg_sum(cu, 9, v, out) == LF_ERR_SEQLENS, "non-monotonic cu_seqlens accepted");

    /* pairs: repeated items, both orders */
    for (i = 0; i < 12; ++i) {
        int32_t a = (int32_t)rng_int(20), b = (int32_t)rng_int(19);
        if (b >= a) ++b;
        pairs[2 * i] = a;
        pairs[2 * i + 1] = b;
        g[i] = (float)rng_normal();
    }
    pairs[2 * 3] = pairs[2 * 5]; /* a repeated item */
    pairs[2 * 3 + 1] = pairs[2 * 5 + 1] == pairs[2 * 3] ? (pairs[2 * 3] + 1) % 20 : pairs[2 * 5 + 1];
    for (i = 0; i < 20; ++i) acc[i] = want[i] = 0.5 * (double)i;
    CHECK(lf_ref_pair_scatter(pairs, 12, g, 20, acc) == LF_OK, "pair_scatter status");
    for (i = 0; i < 12; ++i) {
        want[pairs[2 * i]] += g[i];
        want[pairs[2 * i + 1]] -= g[i];
    }
    for (i = 0; i < 20; ++i) CHECK(fabs(acc[i] - want[i]) <= 1e-12, "scatter item %lld: %.17g want %.17g", (long long)i, acc[i], want[i]);
    CHECK(lf_check_pairs(pairs, 12, 20, &nb, &fb) == LF_OK && nb == 0 && fb == -1, "good pairs rejected");
    pairs[2 * 7 + 1] = pairs[2 * 7]; /* i == j */
    pairs[2 * 9] = 20;               /* out of range */
    CHECK(lf_check_pairs(pairs, 12, 20, &nb, &fb) == LF_ERR_PAIR && nb == 2 && fb == 7, "bad pairs: %lld first %lld", (long long)nb, (long long)fb);
    CHECK(lf_ref_pair_scatter(pairs, 12, g, 20, acc) == LF_ERR_PAIR, "scatter accepted bad pairs");

    /* histogram: bins -1 (none) .. 6 */
    for (i = 0; i < 40; ++i) {
        bins[i] = (int32_t)rng_int(8) - 1;
        mass[i] = (float)rng_unif();
    }
    CHECK(lf_ref_histogram(bins, mass, 40, 7, hist) == LF_OK, "histogram status");
    for (k = 0; k < 7; ++k) {
        ld a = 0;
        for (i = 0; i < 40; ++i) a += bins[i] == k ? mass[i] : 0.0f;
        CHECK(fabs(hist[k] - (double)a) <= 1e-12, "bin %lld %.17g want %.17Lg", (long long)k, hist[k], a);
    }
    bins[11] = 7;
    CHECK(lf_ref_histogram(bins, mass, 40, 7, hist) == LF_ERR_ARG, "bin 7 of 7 accepted");
}

/* ------------------------------------------------------------------ DPO ------------------ */

/* The references' pair derivatives stay relative where the loss saturates (d ~ e^-z for
 * z >> 0), as the float device forms do: sigma(z) - 1 in double would round to 0 at z = 40
 * and carry an error of 1e-16 absolute long before (the GPU test compares c_k relatively). */
static void test_saturated_derivatives(void)
{
    const double zs[6] = {5.0, 20.0, 36.5, 40.0, 60.0, 300.0};
    int i;
    for (i = 0; i < 6; ++i) {
        lf_dpo_opts o = lf_dpo_opts_default();
        double d = 0.0;
        ld want;
        o.kind = LF_DPO_SIGMOID;
        o.beta = 0.5f;
        (void)lf_impl_dpo_pair(&o, zs[i] / 0.5, &d);
        want = -0.5L * n_sigmoid(-(ld)zs[i]);
        CHECK(fabs(d - (double)want) <= 1e-13 * fabs((double)want), "dpo sigmoid d at z=%g: %.17g want %.17Lg", zs[i], d, want);
        {
            float df = 0.0f;
            const ld wf = -0.5L * n_sigmoid(-(ld)(float)zs[i]);
            (void)lf_dpo_sigmoid((float)(zs[i] / 0.5), 0.5f, 0.0f, &df);
            if (zs[i] < 80.0) /* float: e^-z representable */
                CHECK(fabs(df - (double)wf) <= 1e-5 * fabs((double)wf), "float dpo sigmoid d at z=%g: %.9g want %.9Lg", zs[i], df, wf);
        }
        {
            /* Bradley-Terry with a hard target 1 over one pair, scale 1: d loss / d s_i = -sigma(-z) */
            const float sc[2] = {(float)zs[i], 0.0f};
            const int32_t pr[2] = {0, 1};
            const float tg = 1.0f;
            double loss[3], g[2] = {0.0, 0.0};
            lf_pref_opts po = lf_pref_opts_default();
            const ld wb = -n_sigmoid(-(ld)(float)zs[i]);
            CHECK(lf_ref_pairwise_preference(2, sc, 1, pr, &tg, NULL, NULL, NULL, NULL, 0, NULL, NULL, &po, 1.0, loss, NULL, g) == LF_OK,
                  "pairwise status");
            CHECK(fabs(g[0] - (double)wb) <= 1e-13 * fabs((double)wb), "bt d at z=%g: %.17g want %.17Lg", zs[i], g[0], wb);
        }
    }
}

#define T_MAX 80 /* 8 sequences of at most 9 tokens, one of 1, one empty: T <= 73 */
#define V_DPO 37
#define S_MAX 12

struct dpo_case {
    int64_t T, nseq, npairs;
    int32_t cu[S_MAX + 1];
    int64_t labels[T_MAX];
    float x[T_MAX * V_DPO];
    int32_t pairs[2 * 16];
    float ref[S_MAX];
    int use_ref;
};

static void make_dpo_case(struct dpo_case *c)
{
    int64_t k, t, j, p;
    /* sequences: one empty, one of length 1, one fully masked (prompt only), the rest random */
    int lens[S_MAX];
    c->nseq = 10;
    for (k = 0; k < c->nseq; ++k) lens[k] = 2 + (int)rng_int(8);
    lens[2] = 0;
    lens[5] = 1;
    c->cu[0] = 0;
    for (k = 0; k < c->nseq; ++k) c->cu[k + 1] = c->cu[k] + lens[k];
    c->T = c->cu[c->nseq];
    if (c->T > T_MAX) { /* the arrays are sized for the lengths above */
        fprintf(stderr, "make_dpo_case: T = %lld > T_MAX\n", (long long)c->T);
        exit(2);
    }
    for (t = 0; t < c->T * V_DPO; ++t) c->x[t] = (float)(2.0 * rng_normal());
    for (k = 0; k < c->nseq; ++k) {
        int64_t prompt = 1 + rng_int(3);
        for (t = c->cu[k]; t < c->cu[k + 1]; ++t) {
            const int64_t pos = t - c->cu[k];
            c->labels[t] = (pos < prompt || t + 1 == c->cu[k + 1] || k == 7) ? -100 : rng_int(V_DPO);
        }
        /* make some labels likely (large positive logit) so that log-probs vary in size */
        for (t = c->cu[k]; t < c->cu[k + 1]; ++t)
            if (c->labels[t] >= 0 && rng_unif() < 0.3) c->x[t * V_DPO + c->labels[t]] += 6.0f;
    }
    c->labels[c->cu[5]] = 3; /* the length-1 sequence has one labelled token */
    /* pairs: chosen / rejected, repeated sequences, the empty and the masked sequence included */
    c->npairs = 8;
    for (p = 0; p < c->npairs; ++p) {
        int32_t a = (int32_t)rng_int(c->nseq), b = (int32_t)rng_int(c->nseq - 1);
        if (b >= a) ++b;
        c->pairs[2 * p] = a;
        c->pairs[2 * p + 1] = b;
    }
    c->pairs[0] = 2; /* empty chosen */
    c->pairs[1] = 4;
    c->pairs[2] = 7; /* all-masked chosen */
    c->pairs[3] = 5;
    c->pairs[4] = 0;
    c->pairs[5] = 5;
    for (k = 0; k < c->nseq; ++k) c->ref[k] = (float)(-20.0 * rng_unif() - 1.0);
    (void)j;
}

/* The naive loss of a case (long double throughout; independent of lossfuse.h). */
static ld naive_dpo(const struct dpo_case *c, const lf_dpo_opts *o, int use_ref, ld *lp_out, ld *metrics)
{
    ld lp[S_MAX], nt[S_MAX], sum = 0;
    int64_t k, t, j, p;
    int norm = o->length_normalize || o->kind == LF_DPO_SIMPO;
    for (k = 0; k < c->nseq; ++k) {
        lp[k] = nt[k] = 0;
        for (t = c->cu[k]; t < c->cu[k + 1]; ++t) {
            ld s = 0;
            if (c->labels[t] < 0) continue;
            for (j = 0; j < V_DPO; ++j) s += expl((ld)c->x[t * V_DPO + j]);
            lp[k] += (ld)c->x[t * V_DPO + c->labels[t]] - logl(s);
            nt[k] += 1;
        }
        if (lp_out) lp_out[k] = lp[k];
    }
    for (p = 0; p < c->npairs; ++p) {
        int32_t a = c->pairs[2 * p], b = c->pairs[2 * p + 1];
        ld sa = norm ? (nt[a] > 0 ? lp[a] / nt[a] : 0) : lp[a], sb = norm ? (nt[b] > 0 ? lp[b] / nt[b] : 0) : lp[b];
        ld ra = 0, rb = 0, h, beta = o->beta, l;
        if (use_ref && o->kind != LF_DPO_SIMPO) {
            ra = norm ? (nt[a] > 0 ? c->ref[a] / nt[a] : 0) : c->ref[a];
            rb = norm ? (nt[b] > 0 ? c->ref[b] / nt[b] : 0) : c->ref[b];
        }
        h = (sa - ra) - (sb - rb);
        switch (o->kind) {
        case LF_DPO_HINGE: l = 1 - beta * h > 0 ? 1 - beta * h : 0; break;
        case LF_DPO_IPO: l = (h - 1 / (2 * beta)) * (h - 1 / (2 * beta)); break;
        case LF_DPO_SIMPO: l = n_softplus(-(beta * h - (ld)o->gamma)); break;
        default: l = (1 - (ld)o->label_smoothing) * n_softplus(-beta * h) + (ld)o->label_smoothing * n_softplus(beta * h); break;
        }
        if (o->nll_weight > 0 && nt[a] > 0) l += (ld)o->nll_weight * (-lp[a] / nt[a]);
        if (metrics) { /* accuracy and margin from the long-double scores, not from the reference's rewards */
            ld *m = metrics + LF_DPO_METRICS * p;
            m[0] = l;
            m[1] = beta * (sa - ra);
            m[2] = beta * (sb - rb);
            m[3] = sa - ra > sb - rb ? 1 : 0;
            m[4] = beta * h;
        }
        sum += l;
    }
    return c->npairs ? sum / c->npairs : 0;
}

static void test_dpo(void)
{
    static struct dpo_case c;
    static double grad[T_MAX * V_DPO], pout[LF_DPO_METRICS * 16], seq[3 * S_MAX];
    ld lp_n[S_MAX], met[LF_DPO_METRICS * 16];
    int kind, variant;
    for (kind = 0; kind < 4; ++kind)
        for (variant = 0; variant < 4; ++variant) {
            lf_dpo_opts o = lf_dpo_opts_default();
            double loss = 0.0, lplus = 0.0, lminus = 0.0;
            int64_t nbad = -1, k, p, n;
            int use_ref = variant != 1;
            ld want;
            make_dpo_case(&c);
            o.kind = (lf_dpo_kind)kind;
            o.beta = variant == 3 ? 2.0f : 0.1f + (float)rng_unif();
            o.label_smoothing = variant == 2 && kind == LF_DPO_SIGMOID ? 0.1f : 0.0f;
            o.length_normalize = variant == 2;
            o.nll_weight = variant == 3 ? 0.3f : 0.0f;
            o.gamma = 0.7f;
            c.labels[c.cu[1] + 1] = variant == 0 ? 1000 : c.labels[c.cu[1] + 1]; /* a bad label */
            CHECK(lf_ref_dpo_packed(c.T, V_DPO, c.x, V_DPO, c.labels, c.cu, c.nseq, c.pairs, c.npairs,
                                    use_ref ? c.ref : NULL, &o, -1.0, &loss, seq, pout, grad, &nbad) == LF_OK,
                  "dpo kind %d status", kind);
            /* the bad label counts and is ignored (the naive model sees it as ignored too) */
            if (variant == 0) {
                CHECK(nbad == 1, "dpo n_bad %lld want 1", (long long)nbad);
                c.labels[c.cu[1] + 1] = -100;
            } else {
                CHECK(nbad == 0, "dpo n_bad %lld want 0", (long long)nbad);
            }
            want = naive_dpo(&c, &o, use_ref, lp_n, met);
            CHECK(fabsl((ld)loss - want) <= 1e-12L * (1 + fabsl(want) + 100 * o.beta), "dpo kind %d v%d loss %.12g want %.12Lg", kind,
                  variant, loss, want);
            for (k = 0; k < c.nseq; ++k)
                CHECK(fabsl((ld)seq[k] - lp_n[k]) <= 1e-12L * (1 + fabsl(lp_n[k])), "seq %lld logp %.15g want %.15Lg", (long long)k, seq[k], lp_n[k]);
            CHECK(seq[2] == 0.0 && seq[c.nseq + 2] == 0.0 && seq[7] == 0.0, "empty / masked sequences have logp 0, n 0");
            for (p = 0; p < c.npairs; ++p) {
                const double *po = pout + LF_DPO_METRICS * p;
                const ld *mt = met + LF_DPO_METRICS * p;
                CHECK(fabsl((ld)po[0] - mt[0]) <= 1e-12L * (1 + fabsl(mt[0]) + 100 * o.beta), "kind %d v%d pair %lld loss %.15g want %.15Lg", kind, variant, (long long)p, po[0], mt[0]);
                CHECK(fabsl((ld)po[1] - mt[1]) <= 1e-9L * (1 + fabsl(mt[1])), "pair %lld chosen reward %.15g want %.15Lg", (long long)p, po[1], mt[1]);
                CHECK(fabsl((ld)po[2] - mt[2]) <= 1e-9L * (1 + fabsl(mt[2])), "pair %lld rejected reward %.15g want %.15Lg", (long long)p, po[2], mt[2]);
                /* the margin within the rewards' own error; the accuracy where the margin is not within it of 0 */
                CHECK(fabsl((ld)po[4] - mt[4]) <= 1e-9L * (1 + fabsl(mt[1]) + fabsl(mt[2])), "pair %lld margin %.15g want %.15Lg", (long long)p, po[4], mt[4]);
                if (fabsl(mt[4]) > 1e-6L * (1 + fabsl(mt[1]) + fabsl(mt[2])))
                    CHECK(po[3] == (double)mt[3], "pair %lld accuracy %g want %g", (long long)p, po[3], (double)mt[3]);
                CHECK(po[3] == (po[1] > po[2] ? 1.0 : 0.0), "pair %lld accuracy against its own rewards", (long long)p);
            }
            /* tokens without a label have a zero gradient row */
            for (n = 0; n < c.T; ++n)
                if (c.labels[n] < 0)
                    for (k = 0; k < V_DPO; ++k) CHECK(grad[n * V_DPO + k] == 0.0, "token %lld (no label) grad %g", (long long)n, grad[n * V_DPO + k]);
            /* finite differences at random logits of labelled tokens of paired sequences (the hinge
             * away from its corner): a token without a label or outside every pair has a zero
             * gradient on both sides, which checks nothing. Absolute slack 1e-10 only: the
             * differences agree to ~4e-5 relative, and an absolute 2e-5 had let a zero gradient
             * pass at most non-label entries. */
            for (n = 0; n < 24; ++n) {
                int64_t t = -1, j, tries;
                for (tries = 0; tries < 10000 && t < 0; ++tries) {
                    const int64_t u = rng_int(c.T);
                    int64_t k = 0, q;
                    int paired = 0;
                    if (c.labels[u] < 0) continue;
                    while (k + 1 < c.nseq && c.cu[k + 1] <= u) ++k;
                    for (q = 0; q < c.npairs; ++q) paired |= c.pairs[2 * q] == k || c.pairs[2 * q + 1] == k;
                    if (paired) t = u;
                }
                if (t < 0) break; /* no labelled token in a pair */
                j = rng_unif() < 0.3 ? c.labels[t] : rng_int(V_DPO);
                const float x0 = c.x[t * V_DPO + j];
                double fdh[2], fd;
                int near_kink = 0, h;
                if (kind == LF_DPO_HINGE)
                    for (p = 0; p < c.npairs; ++p) near_kink |= fabsl(1 - met[LF_DPO_METRICS * p + 4]) < 0.05L;
                if (near_kink) continue;
                /* central differences at steps 2^-6 and 2^-7, extrapolated (Richardson): the
                 * step's own error, ~h^2 f''' / 6, is not small against the gradient where a
                 * token's sequence sits in pairs on both sides and their terms nearly cancel
                 * (2.8e-3 relative seen at step 2^-6 alone, seed 1796021744) */
                for (h = 0; h < 2; ++h) {
                    const float d = h ? 0x1p-7f : 0x1p-6f, xp = x0 + d, xm = x0 - d;
                    c.x[t * V_DPO + j] = xp;
                    lf_ref_dpo_packed(c.T, V_DPO, c.x, V_DPO, c.labels, c.cu, c.nseq, c.pairs, c.npairs, use_ref ? c.ref : NULL, &o,
                                      -1.0, &lplus, seq, NULL, NULL, NULL);
                    c.x[t * V_DPO + j] = xm;
                    lf_ref_dpo_packed(c.T, V_DPO, c.x, V_DPO, c.labels, c.cu, c.nseq, c.pairs, c.npairs, use_ref ? c.ref : NULL, &o,
                                      -1.0, &lminus, seq, NULL, NULL, NULL);
                    c.x[t * V_DPO + j] = x0;
                    fdh[h] = (lplus - lminus) / ((double)xp - (double)xm);
                }
                fd = fdh[1] + (fdh[1] - fdh[0]) / 3.0;
                CHECK(fabs(fd - grad[t * V_DPO + j]) <= 2e-3 * fabs(grad[t * V_DPO + j]) + 1e-10,
                      "dpo kind %d v%d grad[%lld][%lld] %.9g, finite difference %.9g", kind, variant, (long long)t, (long long)j,
                      grad[t * V_DPO + j], fd);
            }
        }
    /* bad input */
    {
        lf_dpo_opts o = lf_dpo_opts_default();
        double loss = 0.0;
        make_dpo_case(&c);
        c.pairs[3] = (int32_t)c.nseq; /* out of range */
        CHECK(lf_ref_dpo_packed(c.T, V_DPO, c.x, V_DPO, c.labels, c.cu, c.nseq, c.pairs, c.npairs, NULL, &o, -1.0, &loss, seq, NULL,
                                NULL, NULL) == LF_ERR_PAIR,
              "pair out of range accepted");
        c.pairs[3] = c.pairs[2]; /* chosen == rejected */
        CHECK(lf_ref_dpo_packed(c.T, V_DPO, c.x, V_DPO, c.labels, c.cu, c.nseq, c.pairs, c.npairs, NULL, &o, -1.0, &loss, seq, NULL,
                                NULL, NULL) == LF_ERR_PAIR,
              "pair (k, k) accepted");
        make_dpo_case(&c);
        c.cu[c.nseq] -= 1; /* does not end at T */
        CHECK(lf_ref_dpo_packed(c.T, V_DPO, c.x, V_DPO, c.labels, c.cu, c.nseq, c.pairs, c.npairs, NULL, &o, -1.0, &loss, seq, NULL,
                                NULL, NULL) == LF_ERR_SEQLENS,
              "cu_seqlens not ending at T accepted");
        make_dpo_case(&c);
        o.beta = 0.0f;
        CHECK(lf_ref_dpo_packed(c.T, V_DPO, c.x, V_DPO, c.labels, c.cu, c.nseq, c.pairs, c.npairs, NULL, &o, -1.0, &loss, seq, NULL,
                                NULL, NULL) == LF_ERR_ARG,
              "beta 0 accepted");
        o = lf_dpo_opts_default();
        o.label_smoothing = 0.6f;
        CHECK(lf_check_dpo_opts(&o) == LF_ERR_ARG, "label smoothing 0.6 accepted");
        /* divisor 0: loss 0; a device-style divisor is used as given */
        o = lf_dpo_opts_default();
        CHECK(lf_ref_dpo_packed(c.T, V_DPO, c.x, V_DPO, c.labels, c.cu, c.nseq, c.pairs, c.npairs, NULL, &o, 0.0, &loss, seq, NULL, grad,
                                NULL) == LF_OK && loss == 0.0,
              "divisor 0: loss %g", loss);
    }
    /* a labelled token whose row is entirely at bf16's / fp32's finfo.min (lf_massless): no
     * distribution, so its sequence's log-probability and the loss are NaN, as in the kernels
     * (not the uniform row's -log V); fp16's -65504 is an ordinary uniform row */
    {
        static const float floors[3] = {-3.3895314e38f, -3.402823466e38f, -65504.0f};
        lf_dpo_opts o = lf_dpo_opts_default();
        int f;
        for (f = 0; f < 3; ++f) {
            int64_t k = -1, t = -1, tt, j, p;
            double loss = 0.0;
            make_dpo_case(&c);
            /* either side of a pair: make_dpo_case's chosen sides may all lack labelled tokens
             * (random lengths and prompts; seed 1795926716 drew that), its length-1 sequence 5,
             * always a rejected side, has one */
            for (p = 0; p < 2 * c.npairs && t < 0; ++p)
                for (k = c.pairs[p], tt = c.cu[k]; tt < c.cu[k + 1] && t < 0; ++tt)
                    if (c.labels[tt] >= 0 && c.labels[tt] < V_DPO) t = tt;
            CHECK(t >= 0, "no labelled token in a paired sequence");
            if (t < 0) continue;
            for (j = 0; j < V_DPO; ++j) c.x[t * V_DPO + j] = floors[f];
            CHECK(lf_ref_dpo_packed(c.T, V_DPO, c.x, V_DPO, c.labels, c.cu, c.nseq, c.pairs, c.npairs, NULL, &o, -1.0, &loss, seq, NULL,
                                    grad, NULL) == LF_OK,
                  "row at the floor: status");
            if (f < 2)
                CHECK(isnan(seq[k]) && isnan(loss) && isnan(grad[t * V_DPO]), "token row at %g: sequence logp %g, loss %g, grad %g",
                      floors[f], seq[k], loss, grad[t * V_DPO]);
            else
                CHECK(isfinite(seq[k]) && isfinite(loss) && isfinite(grad[t * V_DPO]),
                      "token row at fp16's floor: sequence logp %g, loss %g, grad %g", seq[k], loss, grad[t * V_DPO]);
        }
    }
}

/* ------------------------------------------------------------------ pairwise preference -- */

static void test_pairwise(void)
{
    enum { S = 30, P = 40, B = 5 };
    float s[S], t[P], w[P], sc[P], mass[S], budget[B], cov[B];
    int32_t pairs[2 * P], bin[S];
    double loss[3] = {0.0, 0.0, 0.0}, hist[B], grad[S];
    int kind, variant;
    for (kind = 0; kind < 2; ++kind)
        for (variant = 0; variant < 4; ++variant) {
            lf_pref_opts o = lf_pref_opts_default();
            int64_t i, p, b;
            ld lpair = 0, lpen = 0, wsum = 0, h[B];
            o.kind = (lf_pref_kind)kind;
            o.gate = variant == 3 ? LF_GATE_NONE : LF_GATE_SIGMOID;
            o.budget_weight = variant >= 2 ? 0.7f : 0.0f;
            o.coverage_weight = variant >= 2 ? 1.3f : 0.0f;
            o.margin = 0.5f;
            for (i = 0; i < S; ++i) {
                s[i] = (float)(2.0 * rng_normal());
                bin[i] = (int32_t)rng_int(B + 1) - 1;
                mass[i] = (float)(0.5 + rng_unif());
            }
            for (b = 0; b < B; ++b) {
                budget[b] = (float)(1.0 + 2.0 * rng_unif());
                cov[b] = (float)(0.5 + rng_unif());
            }
            for (p = 0; p < P; ++p) {
                int32_t a = (int32_t)rng_int(S), c = (int32_t)rng_int(S - 1);
                if (c >= a) ++c;
                pairs[2 * p] = a;
                pairs[2 * p + 1] = c;
                t[p] = kind == LF_PREF_BT ? (float)rng_unif() : (rng_unif() < 0.5 ? -1.0f : 1.0f);
                w[p] = variant == 0 ? 1.0f : (float)(rng_unif() < 0.1 ? 0.0 : rng_unif());
                sc[p] = (float)(0.5 + 2.0 * rng_unif());
            }
            CHECK(lf_ref_pairwise_preference(S, s, P, pairs, t, variant ? w : NULL, variant == 1 ? sc : NULL, variant >= 2 ? bin : NULL,
                                             mass, B, budget, cov, &o, -1.0, loss, hist, grad) == LF_OK,
                  "pairwise status");
            for (p = 0; p < P; ++p) {
                ld d = (ld)s[pairs[2 * p]] - s[pairs[2 * p + 1]], a = variant == 1 ? sc[p] : o.scale, l, ww = variant ? w[p] : 1.0f;
                if (kind == LF_PREF_BT) l = (ld)t[p] * n_softplus(-a * d) + (1 - (ld)t[p]) * n_softplus(a * d);
                else l = o.margin - t[p] * a * d > 0 ? o.margin - t[p] * a * d : 0;
                lpair += ww * l;
                wsum += ww;
            }
            lpair = wsum > 0 ? lpair / wsum : 0;
            if (variant >= 2) {
                for (b = 0; b < B; ++b) h[b] = 0;
                for (i = 0; i < S; ++i)
                    if (bin[i] >= 0) h[bin[i]] += mass[i] * (o.gate == LF_GATE_SIGMOID ? n_sigmoid(s[i]) : (ld)s[i]);
                for (b = 0; b < B; ++b) {
                    ld over = h[b] > budget[b] ? h[b] - budget[b] : 0, under = h[b] < cov[b] ? cov[b] - h[b] : 0;
                    lpen += (ld)o.budget_weight * over * over + (ld)o.coverage_weight * under * under;
                    CHECK(fabsl((ld)hist[b] - h[b]) <= 1e-12L * (1 + fabsl(h[b])), "hist %lld", (long long)b);
                }
            }
            CHECK(fabsl((ld)loss[1] - lpair) <= 1e-12L * (1 + fabsl(lpair) + 10), "pair loss %.12g want %.12Lg (kind %d v%d)", loss[1], lpair,
                  kind, variant);
            CHECK(fabsl((ld)loss[2] - lpen) <= 1e-12L * (1 + fabsl(lpen)), "penalty %.15g want %.15Lg", loss[2], lpen);
            CHECK(loss[0] == loss[1] + loss[2], "total = pair + penalty");
            for (i = 0; i < S; ++i) {
                const float x0 = s[i];
                double lp[3] = {0.0, 0.0, 0.0}, lm[3] = {0.0, 0.0, 0.0}, fdh[2], fd;
                int kink = 0, hh;
                if (kind == LF_PREF_HINGE)
                    for (p = 0; p < P; ++p) {
                        ld dd = (ld)s[pairs[2 * p]] - s[pairs[2 * p + 1]], a = variant == 1 ? sc[p] : o.scale;
                        if ((pairs[2 * p] == i || pairs[2 * p + 1] == i) && fabsl(o.margin - t[p] * a * dd) < 0.05L) kink = 1;
                    }
                if (variant >= 2 && bin[i] >= 0) {
                    b = bin[i]; /* the penalty's own corners */
                    if (fabs(hist[b] - budget[b]) < 0.02 || fabs(hist[b] - cov[b]) < 0.02) kink = 1;
                }
                if (kink) continue;
                /* central differences at steps 2^-8 and 2^-9, extrapolated (Richardson), as for DPO
                 * above: where an item's pairs pull both ways their terms nearly cancel, and the
                 * step's own error, ~h^2 f''' / 6 of each term, is not small against the sum (up
                 * to 13% seen at step 2^-8 alone, e.g. seed 1817710348) */
                for (hh = 0; hh < 2; ++hh) {
                    const float d = hh ? 0x1p-9f : 0x1p-8f;
                    s[i] = x0 + d;
                    lf_ref_pairwise_preference(S, s, P, pairs, t, variant ? w : NULL, variant == 1 ? sc : NULL, variant >= 2 ? bin : NULL,
                                               mass, B, budget, cov, &o, -1.0, lp, hist, NULL);
                    s[i] = x0 - d;
                    lf_ref_pairwise_preference(S, s, P, pairs, t, variant ? w : NULL, variant == 1 ? sc : NULL, variant >= 2 ? bin : NULL,
                                               mass, B, budget, cov, &o, -1.0, lm, hist, NULL);
                    s[i] = x0;
                    fdh[hh] = (lp[0] - lm[0]) / (2.0 * d);
                }
                fd = fdh[1] + (fdh[1] - fdh[0]) / 3.0;
                CHECK(fabs(fd - grad[i]) <= 2e-3 * fabs(grad[i]) + 1e-10, "pairwise kind %d v%d grad[%lld] %.9g, finite difference %.9g", kind,
                      variant, (long long)i, grad[i], fd);
            }
            /* bad input */
            pairs[2 * 5 + 1] = pairs[2 * 5];
            CHECK(lf_ref_pairwise_preference(S, s, P, pairs, t, NULL, NULL, NULL, NULL, 0, NULL, NULL, &o, -1.0, loss, NULL, grad) == LF_ERR_PAIR,
                  "pair (i, i) accepted");
            pairs[2 * 5 + 1] = (pairs[2 * 5] + 1) % S;
            { /* targets: Bradley-Terry in [0, 1], the hinge +-1; a NaN target is not refused (NaN loss) */
                const float t5 = t[5], badt[3] = {1.5f, -0.25f, 0.0f}, nan = (float)NAN;
                int q;
                for (q = 0; q < 3; ++q) {
                    if (kind == LF_PREF_BT && q == 2) continue; /* 0 is a valid Bradley-Terry target */
                    t[5] = kind == LF_PREF_BT ? badt[q] : (q == 0 ? 0.5f : q == 1 ? -0.25f : 0.0f);
                    CHECK(lf_ref_pairwise_preference(S, s, P, pairs, t, NULL, NULL, NULL, NULL, 0, NULL, NULL, &o, -1.0, loss, NULL, grad) == LF_ERR_PAIR,
                          "kind %d target %g accepted", kind, (double)t[5]);
                }
                t[5] = nan;
                CHECK(lf_ref_pairwise_preference(S, s, P, pairs, t, NULL, NULL, NULL, NULL, 0, NULL, NULL, &o, -1.0, loss, NULL, grad) == LF_OK &&
                          loss[1] != loss[1],
                      "kind %d NaN target: status or loss %g", kind, loss[1]);
                t[5] = t5;
            }
            bin[3] = B;
            CHECK(lf_ref_pairwise_preference(S, s, P, pairs, t, NULL, NULL, bin, NULL, B, budget, cov, &o, -1.0, loss, hist, grad) == LF_ERR_ARG,
                  "bin out of range accepted");
        }
}

static void run_all(unsigned long long seed)
{
    g_seed = seed;
    g_rng = seed;
    test_blocks();
    test_saturated_derivatives();
    test_dpo();
    test_pairwise();
}

int main(int argc, char **argv) { return host_check_main(argc, argv, "test_dpo", 20261122ull, run_all); }
