/* test_distill.c — host tests of lossfuse.h's distillation pieces: the dual log-sum-exp state
 * (section 3b: lf_dual) and the double-precision references of the KL family (section 8:
 * lf_ref_kl_row, lf_ref_kl), each against a naive model written here.
 *
 * Build and run:
 *     gcc -std=c99 -O2 -Wall -Wextra -pedantic -Werror -I. tests/test_distill.c -o test_distill -lm
 *     ./test_distill [seed]
 * Every random test runs twice: once with a fixed seed, once with a fresh seed (time(), or
 * argv[1] to reproduce a failure). One line per failed check, then a summary line; exit 0 when
 * every check passed, 1 otherwise.
 *
 * The naive model is the textbook one, in long double: p and q as explicit softmax vectors,
 * KL(u || v) = sum_j u_j log(u_j / v_j), the mixture M as a vector.
 * Tolerances:
 *   dual state (float): each term carries a few float roundings, and the sums of V terms a
 *     relative error ~ sqrt(V) 2^-24 (random rounding), so
 *         |err| <= 1e-5 |want| + (1e-6 + 3e-7 sqrt(V)) (1 + |ma - mb| + D + log(V + 1))
 *     with D the largest |a_j - b_j| that carries weight. A wrong formula is off by O(1).
 *   references (double) vs the long-double model: 1e-11 (1 + |L| + magnitude of the terms).
 *   gradients: as test_ref.c — a Richardson-extrapolated central difference of the naive model
 *     at the same float-valued points, h = 1e-4 (1 + |x|), bound 1e-8 (1 + |g|) +
 *     1e-13 (1 + |L|) / h (x 1e3 at tau < 1: the loss's size is then ~1 / tau larger and its
 *     roundings with it), on rows within +-60; rows with entries masked on both sides, and for
 *     JSD at beta 0.5 on one side only.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lossfuse.h"

#include "host_check.h"

static int same_or_close(double got, double want, double tol)
{
    if (want != want) return got != got;
    if (isinf(want)) return got == want;
    return fabs(got - want) <= tol;
}

/* ---------------------------------------------------------------------------------------- */
/* Naive model (long double)                                                                */

typedef struct naive {
    long double lse_a, lse_b, ent_a, ent_b, kl_fwd, kl_rev;
} naive;

/* log-softmax of z into lz (-inf where z is); returns lse (NaN: NaN/+inf; -inf: no mass) */
static long double naive_logsoftmax(const double *z, int V, long double *lz, long double *ent)
{
    long double m = -INFINITY, s = 0.0L, h = 0.0L, lse;
    int j;
    for (j = 0; j < V; ++j) {
        if (z[j] != z[j] || z[j] == INFINITY) {
            *ent = NAN;
            return NAN;
        }
        if (z[j] > m) m = z[j];
    }
    *ent = NAN;
    if (m == -INFINITY) return m;
    for (j = 0; j < V; ++j) s += z[j] == -INFINITY ? 0.0L : expl((long double)z[j] - m);
    lse = m + logl(s);
    for (j = 0; j < V; ++j) {
        lz[j] = z[j] == -INFINITY ? -INFINITY : (long double)z[j] - lse;
        if (z[j] != -INFINITY) h -= expl(lz[j]) * lz[j];
    }
    *ent = h;
    return lse;
}

static long double naive_kl(const long double *lu, const long double *lv, int V)
{
    long double k = 0.0L;
    int j;
    for (j = 0; j < V; ++j) {
        if (lu[j] == -INFINITY) continue;
        if (lv[j] == -INFINITY) return INFINITY;
        k += expl(lu[j]) * (lu[j] - lv[j]); /* u log(u / v), in logs: no underflow */
    }
    return k;
}

static naive naive_dual(const double *a, const double *b, int V, long double *la, long double *lb)
{
    naive n;
    n.lse_a = naive_logsoftmax(a, V, la, &n.ent_a);
    n.lse_b = naive_logsoftmax(b, V, lb, &n.ent_b);
    if (!(fabsl(n.lse_a) < INFINITY) || !(fabsl(n.lse_b) < INFINITY)) {
        n.kl_fwd = n.kl_rev = NAN;
        return n;
    }
    n.kl_fwd = naive_kl(lb, la, V);
    n.kl_rev = naive_kl(la, lb, V);
    return n;
}

/* The loss of the KL family in the naive model, student raw logits xs (double) */
static double model_z(double x, const lf_kl_opts *o)
{
    double c = o->softcap;
    if (c > 0.0 && (x == INFINITY || x != x)) return NAN;
    if (c > 0.0 && x != -INFINITY) x = c * tanh(x / c);
    return x / o->temperature;
}

static double model_loss(const double *xs, const float *xt, int V, const lf_kl_opts *o, double *kf, double *kr)
{
    long double la[64], lb[64], loss = 0.0L;
    double zs[64], zt[64], beta = o->beta, scale = o->tau2 ? (double)o->temperature * o->temperature : 1.0;
    int j, kind = (int)o->kind;
    naive n;
    for (j = 0; j < V; ++j) {
        zs[j] = model_z(xs[j], o);
        zt[j] = model_z(xt[j], o);
    }
    n = naive_dual(zs, zt, V, la, lb);
    if (kf) *kf = (double)n.kl_fwd;
    if (kr) *kr = (double)n.kl_rev;
    if (n.kl_fwd != n.kl_fwd) return NAN;
    if (kind == LF_KL_FORWARD || (kind == LF_KL_JSD && beta == 0.0)) loss = n.kl_fwd;
    else if (kind == LF_KL_REVERSE || (kind == LF_KL_JSD && beta == 1.0)) loss = n.kl_rev;
    else if (kind == LF_KL_SOFT_CE) {
        for (j = 0; j < V; ++j)
            if (lb[j] != -INFINITY) loss -= expl(lb[j]) * la[j]; /* -inf * q: +inf, as it should */
    } else if (kind == LF_KL_TVD) {
        for (j = 0; j < V; ++j) loss += 0.5L * fabsl(expl(la[j]) - expl(lb[j]));
    } else {
        long double lm[64];
        for (j = 0; j < V; ++j) {
            long double m = (long double)beta * expl(lb[j]) + (1.0L - beta) * expl(la[j]);
            lm[j] = m == 0.0L ? -INFINITY : logl(m);
        }
        loss = beta * naive_kl(lb, lm, V) + (1.0L - beta) * naive_kl(la, lm, V);
    }
    return (double)(loss * scale);
}

/* ---------------------------------------------------------------------------------------- */
/* 1. the dual state vs the naive model                                                      */

static double dual_tol(double want, const double *a, const double *b, int V, double dm)
{
    double D = 0.0;
    int j;
    for (j = 0; j < V; ++j)
        if (a[j] > -INFINITY && b[j] > -INFINITY && fabs(a[j] - b[j]) > D) D = fabs(a[j] - b[j]);
    return 1e-5 * fabs(want) + (1e-6 + 3e-7 * sqrt((double)V)) * (1.0 + fabs(dm) + D + log(V + 1.0));
}

static void check_dual(const float *af, const float *bf, int V, const char *what)
{
    static double a[60000], b[60000];
    static long double la[60000], lb[60000];
    lf_dual st = lf_dual_init();
    lf_dual_out o;
    naive n;
    int j;
    for (j = 0; j < V; ++j) {
        a[j] = af[j];
        b[j] = bf[j];
        lf_dual_push(&st, af[j], bf[j]);
    }
    o = lf_dual_final(st);
    n = naive_dual(a, b, V, la, lb);
    {
        double dm = (fabsl(n.lse_a) < INFINITY && fabsl(n.lse_b) < INFINITY) ? (double)(n.lse_a - n.lse_b) : 0.0;
        /* the pushes add V float terms one after another: a walk of V roundings of <= 2^-24 of
         * the running sum each, allowed 8 sqrt(V) 2^-24 (3.5e-5 was seen at V = 50257, tau 20,
         * where every term is ~1/2 and the sum reaches ~2.5e4: seed 791611815) */
        double tl = 1e-6 * (1.0 + (isfinite((double)n.lse_a) ? fabs((double)n.lse_a) : 0.0) +
                            (isfinite((double)n.lse_b) ? fabs((double)n.lse_b) : 0.0) + log(V + 1.0)) +
                    8.0 * sqrt((double)V) * 0x1p-24;
        CHECK(same_or_close(o.lse_a, (double)n.lse_a, tl), "%s V=%d: lse_a %.9g want %.12Lg", what, V, o.lse_a, n.lse_a);
        CHECK(same_or_close(o.lse_b, (double)n.lse_b, tl), "%s V=%d: lse_b %.9g want %.12Lg", what, V, o.lse_b, n.lse_b);
        CHECK(same_or_close(o.kl_fwd, (double)n.kl_fwd, dual_tol((double)n.kl_fwd, a, b, V, dm)),
              "%s V=%d: kl_fwd %.9g want %.12Lg", what, V, o.kl_fwd, n.kl_fwd);
        CHECK(same_or_close(o.kl_rev, (double)n.kl_rev, dual_tol((double)n.kl_rev, a, b, V, dm)),
              "%s V=%d: kl_rev %.9g want %.12Lg", what, V, o.kl_rev, n.kl_rev);
        if (fabsl(n.lse_a) < INFINITY)
            CHECK(same_or_close(o.ent_a, (double)n.ent_a, 1e-5 * fabs((double)n.ent_a) + tl * 10.0),
                  "%s V=%d: ent_a %.9g want %.12Lg", what, V, o.ent_a, n.ent_a);
        if (fabsl(n.lse_b) < INFINITY)
            CHECK(same_or_close(o.ent_b, (double)n.ent_b, 1e-5 * fabs((double)n.ent_b) + tl * 10.0),
                  "%s V=%d: ent_b %.9g want %.12Lg", what, V, o.ent_b, n.ent_b);
        /* a finite KL is never negative beyond rounding */
        if (isfinite(o.kl_fwd)) CHECK(o.kl_fwd >= -dual_tol(0.0, a, b, V, dm), "%s: kl_fwd %g < 0", what, o.kl_fwd);
        if (isfinite(o.kl_rev)) CHECK(o.kl_rev >= -dual_tol(0.0, a, b, V, dm), "%s: kl_rev %g < 0", what, o.kl_rev);
    }
}

static void test_dual(void)
{
    static const int Vs[] = {1, 2, 7, 100, 1000, 50257};
    static float a[60000], b[60000];
    static const float taus[] = {1.0f, 0.05f, 20.0f};
    int vi, rep, j, ti;
    for (vi = 0; vi < 6; ++vi)
        for (ti = 0; ti < 3; ++ti)
            for (rep = 0; rep < (Vs[vi] > 1000 ? 2 : 8); ++rep) {
                int V = Vs[vi];
                double big = rep % 4 == 3 ? 1e4 : 40.0;
                double pa = rep % 3 == 1 ? 0.2 : 0.0, pb = rep % 3 == 2 ? 0.2 : 0.0;
                for (j = 0; j < V; ++j) {
                    a[j] = gen_logit(big, pa) / taus[ti];
                    /* the teacher: correlated with the student, or independent */
                    b[j] = rep % 2 ? gen_logit(big, pb) / taus[ti] : a[j] + (float)(0.5 * rng_normal()) / taus[ti];
                    if (pb > 0.0 && rng_unif() < pb) b[j] = -INFINITY;
                }
                check_dual(a, b, V, taus[ti] == 1.0f ? "random" : taus[ti] < 1.0f ? "tau 0.05" : "tau 20");
                /* identical rows: both KLs exactly 0 */
                {
                    lf_dual st = lf_dual_init();
                    lf_dual_out o;
                    for (j = 0; j < V; ++j) lf_dual_push(&st, a[j], a[j]);
                    o = lf_dual_final(st);
                    if (isfinite(o.lse_a))
                        CHECK(o.kl_fwd == 0.0f && o.kl_rev == 0.0f, "identical rows V=%d: KL %g %g", V, o.kl_fwd, o.kl_rev);
                }
            }
    /* special rows */
    {
        float x[4], y[4];
        lf_dual st;
        lf_dual_out o;
        int k;
        /* disjoint supports: both KLs +inf */
        x[0] = 1.0f; x[1] = -INFINITY; x[2] = 2.0f;      x[3] = -INFINITY;
        y[0] = -INFINITY; y[1] = 0.5f; y[2] = -INFINITY; y[3] = 3.0f;
        check_dual(x, y, 4, "disjoint");
        st = lf_dual_init();
        for (k = 0; k < 4; ++k) lf_dual_push(&st, x[k], y[k]);
        o = lf_dual_final(st);
        CHECK(o.kl_fwd == INFINITY && o.kl_rev == INFINITY, "disjoint: KL %g %g", o.kl_fwd, o.kl_rev);
        /* the student's support inside the teacher's: forward +inf, reverse finite */
        x[0] = 1.0f; x[1] = -INFINITY; x[2] = 2.0f; x[3] = -INFINITY;
        y[0] = 0.0f; y[1] = 0.5f;      y[2] = 1.0f; y[3] = -INFINITY;
        check_dual(x, y, 4, "nested");
        st = lf_dual_init();
        for (k = 0; k < 4; ++k) lf_dual_push(&st, x[k], y[k]);
        o = lf_dual_final(st);
        CHECK(o.kl_fwd == INFINITY && isfinite(o.kl_rev), "nested: KL %g %g", o.kl_fwd, o.kl_rev);
        /* +inf survives a later, much larger maximum (the rescale factor underflows to 0) */
        st = lf_dual_init();
        lf_dual_push(&st, 0.0f, -INFINITY);
        lf_dual_push(&st, 500.0f, 500.0f);
        o = lf_dual_final(st);
        CHECK(o.kl_rev == INFINITY && isfinite(o.kl_fwd), "underflowing mismatch: KL %g %g", o.kl_fwd, o.kl_rev);
        /* a side without mass: NaN; NaN and +inf: NaN */
        x[0] = x[1] = x[2] = x[3] = -INFINITY;
        y[0] = 1.0f; y[1] = 2.0f; y[2] = 3.0f; y[3] = 4.0f;
        check_dual(x, y, 4, "student all -inf");
        check_dual(y, x, 4, "teacher all -inf");
        { /* a side with every entry at bf16's / fp32's finfo.min (lf_massless) has no mass either:
           * lf_dual and lf_ref_kl_row give NaN KLs, as the kernels do (their shift held at -FLT_MAX
           * makes every term 0); fp16's -65504 is an ordinary uniform side */
            static const float floors[3] = {-3.3895314e38f, -3.402823466e38f, -65504.0f};
            lf_kl_opts ko = lf_kl_opts_default();
            lf_kl_row kr;
            double g4[4];
            int f, side;
            for (f = 0; f < 3; ++f)
                for (side = 0; side < 2; ++side) {
                    float fl[4];
                    for (k = 0; k < 4; ++k) fl[k] = floors[f];
                    st = lf_dual_init();
                    for (k = 0; k < 4; ++k) lf_dual_push(&st, side ? y[k] : fl[k], side ? fl[k] : y[k]);
                    o = lf_dual_final(st);
                    kr = lf_ref_kl_row(side ? y : fl, side ? fl : y, 4, &ko, g4);
                    if (f < 2)
                        CHECK(isnan(o.kl_fwd) && isnan(o.kl_rev) && isnan(kr.kl_fwd) && isnan(kr.kl_rev) && isnan(kr.loss),
                              "%s all at %g: dual KL %g %g, reference %g %g loss %g", side ? "teacher" : "student", floors[f],
                              o.kl_fwd, o.kl_rev, kr.kl_fwd, kr.kl_rev, kr.loss);
                    else
                        CHECK(isfinite(o.kl_fwd) && isfinite(kr.kl_fwd) && isfinite(kr.loss),
                              "%s all at fp16's floor: dual KL %g, reference %g loss %g", side ? "teacher" : "student",
                              o.kl_fwd, kr.kl_fwd, kr.loss);
                }
        }
        x[0] = 1.0f; x[1] = NAN; x[2] = 0.0f; x[3] = 0.0f;
        check_dual(x, y, 4, "NaN student");
        check_dual(y, x, 4, "NaN teacher");
        x[1] = INFINITY;
        check_dual(x, y, 4, "+inf student");
        check_dual(y, x, 4, "+inf teacher");
        st = lf_dual_init();
        o = lf_dual_final(st);
        CHECK(o.lse_a == -INFINITY && o.kl_fwd != o.kl_fwd, "empty: lse %g KL %g", o.lse_a, o.kl_fwd);
    }
}

/* 2. merge: any split, any order, bit-commutative                                           */

static void test_merge(void)
{
    static float a[3000], b[3000];
    int rep, j;
    for (rep = 0; rep < 40; ++rep) {
        int V = 1 + (int)rng_int(3000), k, nparts = 2 + (int)rng_int(6), cut[9];
        double pinf = rep % 4 == 0 ? 0.3 : 0.0;
        lf_dual whole = lf_dual_init(), parts[8], seq, tree;
        lf_dual_out ow, os, ot;
        double dm;
        static double ad[3000], bd[3000];
        for (j = 0; j < V; ++j) {
            a[j] = gen_logit(rep % 5 == 0 ? 1e4 : 40.0, pinf);
            b[j] = gen_logit(rep % 5 == 0 ? 1e4 : 40.0, pinf);
            ad[j] = a[j];
            bd[j] = b[j];
            lf_dual_push(&whole, a[j], b[j]);
        }
        cut[0] = 0;
        cut[nparts] = V;
        for (k = 1; k < nparts; ++k) cut[k] = (int)rng_int(V + 1);
        for (k = 1; k < nparts; ++k) /* sort the cuts */
            for (j = k; j > 1 && cut[j] < cut[j - 1]; --j) {
                int t = cut[j];
                cut[j] = cut[j - 1];
                cut[j - 1] = t;
            }
        for (k = 0; k < nparts; ++k) {
            parts[k] = lf_dual_init();
            for (j = cut[k]; j < cut[k + 1] && j < V; ++j) lf_dual_push(&parts[k], a[j], b[j]);
        }
        for (k = 0; k + 1 < nparts; ++k) {
            lf_dual x = lf_dual_merge(parts[k], parts[k + 1]), y = lf_dual_merge(parts[k + 1], parts[k]);
            CHECK(memcmp(&x, &y, sizeof x) == 0, "merge not bit-commutative (rep %d, part %d)", rep, k);
        }
        seq = parts[0];
        for (k = 1; k < nparts; ++k) seq = lf_dual_merge(seq, parts[k]);
        tree = parts[nparts - 1];
        for (k = nparts - 2; k >= 0; --k) tree = lf_dual_merge(parts[k], tree);
        ow = lf_dual_final(whole);
        os = lf_dual_final(seq);
        ot = lf_dual_final(tree);
        dm = isfinite(ow.lse_a) && isfinite(ow.lse_b) ? ow.lse_a - ow.lse_b : 0.0;
        CHECK(same_or_close(os.kl_fwd, ow.kl_fwd, 2.0 * dual_tol(ow.kl_fwd, ad, bd, V, dm)),
              "merged kl_fwd %.9g, one pass %.9g (V=%d, %d parts)", os.kl_fwd, ow.kl_fwd, V, nparts);
        CHECK(same_or_close(ot.kl_rev, ow.kl_rev, 2.0 * dual_tol(ow.kl_rev, ad, bd, V, dm)),
              "merged kl_rev %.9g, one pass %.9g (V=%d, %d parts)", ot.kl_rev, ow.kl_rev, V, nparts);
        CHECK(same_or_close(os.lse_b, ow.lse_b, 1e-6 * (1.0 + fabs(ow.lse_b))), "merged lse_b %.9g vs %.9g", os.lse_b,
              ow.lse_b);
    }
}

/* 3. the references vs the naive model, and their gradients vs finite differences          */

static const char *kind_name[] = {"forward", "reverse", "jsd", "soft-ce", "tvd"};

static void test_ref_rows(void)
{
    static const int Vs[] = {1, 3, 10, 40};
    static const float betas[] = {0.0f, 0.3f, 0.5f, 1.0f};
    static const float taus[] = {1.0f, 0.05f, 20.0f, 2.0f};
    float xs[40], xt[40];
    double x[40], dx[40];
    int kind, vi, rep, j;
    for (kind = 0; kind <= LF_KL_TVD; ++kind)
        for (vi = 0; vi < 4; ++vi)
            for (rep = 0; rep < 16; ++rep) {
                int V = Vs[vi];
                lf_kl_opts o = lf_kl_opts_default();
                lf_kl_row r;
                double L, kf, kr, mag = 0.0;
                int masked = rep % 4 == 1;
                /* JSD at beta 0.5: entries masked on ONE side only (its loss stays finite whatever
                 * the supports), so that its gradient meets the finite differences there too */
                int onesided = kind == LF_KL_JSD && rep % 4 == 2 && V > 1;
                o.kind = (lf_kl_kind)kind;
                o.beta = betas[rep % 4];
                o.temperature = taus[(rep / 4) % 4];
                o.tau2 = rep % 2;
                o.softcap = rep % 8 >= 6 ? 30.0f : 0.0f;
                for (j = 0; j < V; ++j) {
                    xs[j] = gen_logit(60.0, 0.0);
                    xt[j] = rep % 3 ? gen_logit(60.0, 0.0) : xs[j] + (float)rng_normal();
                    /* masked entries on both sides: the supports agree, every loss stays finite */
                    if (masked && V > 1 && rng_unif() < 0.25) xs[j] = xt[j] = -INFINITY;
                    if (onesided && rng_unif() < 0.3) {
                        if (j & 1) xt[j] = -INFINITY;
                        else xs[j] = -INFINITY;
                    }
                    x[j] = xs[j];
                    mag += isfinite(x[j]) ? fabs(x[j]) : 0.0; /* (a masked entry must not make the bound infinite) */
                }
                if ((masked || onesided) && V > 1 && (xs[0] == -INFINITY || xt[0] == -INFINITY))
                    xs[0] = xt[0] = 1.0f, x[0] = 1.0; /* keep some mass on both sides */
                r = lf_ref_kl_row(xs, xt, V, &o, dx);
                L = model_loss(x, xt, V, &o, &kf, &kr);
                mag = 1.0 + fabs(L) + mag / o.temperature;
                CHECK(fabs(r.loss - L) <= 1e-11 * mag, "%s beta %g tau %g tau2 %d cap %g V=%d: loss %.17g, model %.17g",
                      kind_name[kind], o.beta, o.temperature, o.tau2, o.softcap, V, r.loss, L);
                /* (one-sided masks make a KL +inf: then equal) */
                CHECK((r.kl_fwd == kf || fabs(r.kl_fwd - kf) <= 1e-11 * mag) && (r.kl_rev == kr || fabs(r.kl_rev - kr) <= 1e-11 * mag),
                      "%s: KLs %.17g %.17g, model %.17g %.17g", kind_name[kind], r.kl_fwd, r.kl_rev, kf, kr);
                for (j = 0; j < V; ++j) {
                    double h, x0, d1, d2, fd, tol;
                    if (xs[j] == -INFINITY) {
                        CHECK(dx[j] == 0.0, "%s: gradient at a masked logit %g", kind_name[kind], dx[j]);
                        continue;
                    }
                    if (kind == LF_KL_TVD) continue; /* not differentiable at ties; checked below */
                    h = 1e-4 * (1.0 + fabs(x[j]));
                    x0 = x[j];
                    x[j] = x0 + h;
                    d1 = model_loss(x, xt, V, &o, NULL, NULL);
                    x[j] = x0 - h;
                    d1 = (d1 - model_loss(x, xt, V, &o, NULL, NULL)) / (2.0 * h);
                    x[j] = x0 + h / 2;
                    d2 = model_loss(x, xt, V, &o, NULL, NULL);
                    x[j] = x0 - h / 2;
                    d2 = (d2 - model_loss(x, xt, V, &o, NULL, NULL)) / h;
                    x[j] = x0;
                    fd = (4.0 * d2 - d1) / 3.0;
                    tol = 1e-8 * (1.0 + fabs(dx[j])) + 1e-13 * (1.0 + fabs(L)) / h * (o.temperature < 1.0f ? 1e3 : 1.0);
                    CHECK(fabs(dx[j] - fd) <= tol, "%s beta %g tau %g cap %g V=%d j=%d x=%.9g: dx %.17g, fd %.17g (tol %.3g)",
                          kind_name[kind], o.beta, o.temperature, o.softcap, V, j, xs[j], dx[j], fd, tol);
                }
                /* the gradient in z sums to 0: every loss here is shift-invariant in z_s */
                if (o.softcap == 0.0f) { /* terms up to |log p - log q| ~ 120 / tau cancel in the sum */
                    double sum = 0.0, asum = 0.0;
                    for (j = 0; j < V; ++j) {
                        sum += dx[j];
                        asum += fabs(dx[j]);
                    }
                    /* plus the loss times the rounding of lse_s (sum p = 1 only to ~2^-52 (1 + |lse_s|), and
                     * the sum of the gradient is L dz (1 - sum p)): 3.5e-10 at L = 666, lse_s = 261,
                     * tau 0.05 (seed 1795326350) */
                    const double tol_sum = 1e-13 * (1.0 + asum) * (1.0 + fabs(L) + 120.0 / o.temperature) +
                                           4.0 * 0x1p-52 * (1.0 + fabs(r.lse_s)) * fabs(L) / o.temperature;
                    CHECK(fabs(sum) <= tol_sum,
                          "%s: gradient sums to %.3g (asum %.3g, L %.3g, tau %g, V %d)", kind_name[kind], sum, asum, L, o.temperature, V);
                }
            }
}

/* JSD's ends: beta = 0 and 1 are the two KLs, and the interior tends to them after division by
 * beta (1 - beta); beta = 1/2 is symmetric in student and teacher. */
static void test_jsd_ends(void)
{
    float xs[50], xt[50];
    double g0[50], g1[50];
    int rep, j;
    for (rep = 0; rep < 20; ++rep) {
        int V = 2 + (int)rng_int(49);
        lf_kl_opts o = lf_kl_opts_default(), f = lf_kl_opts_default(), rv = lf_kl_opts_default();
        lf_kl_row a, b, c, d;
        /* The limits need beta << min q/p (and 1 - beta << min p/q): logits within +-1.5 keep
         * those ratios above e^-6, so beta = 1e-7 (and float's 1 - 6e-8) is within 4e-5. */
        double eps = 1e-7;
        for (j = 0; j < V; ++j) {
            xs[j] = (float)fmax(-1.5, fmin(1.5, 0.5 * rng_normal()));
            xt[j] = (float)fmax(-1.5, fmin(1.5, 0.5 * rng_normal()));
        }
        o.kind = LF_KL_JSD;
        f.kind = LF_KL_FORWARD;
        rv.kind = LF_KL_REVERSE;
        o.beta = 0.0f;
        a = lf_ref_kl_row(xs, xt, V, &o, g0);
        b = lf_ref_kl_row(xs, xt, V, &f, g1);
        CHECK(a.loss == b.loss && memcmp(g0, g1, sizeof(double) * V) == 0, "JSD beta 0 %.17g != forward KL %.17g", a.loss, b.loss);
        o.beta = 1.0f;
        a = lf_ref_kl_row(xs, xt, V, &o, g0);
        b = lf_ref_kl_row(xs, xt, V, &rv, g1);
        CHECK(a.loss == b.loss && memcmp(g0, g1, sizeof(double) * V) == 0, "JSD beta 1 %.17g != reverse KL %.17g", a.loss, b.loss);
        o.beta = (float)eps;
        c = lf_ref_kl_row(xs, xt, V, &o, NULL);
        CHECK(fabs(c.loss / ((double)o.beta * (1.0 - o.beta)) - c.kl_fwd) <= 1e-3 * c.kl_fwd + 1e-9,
              "JSD(beta=%g) / (beta (1-beta)) = %.9g, forward KL %.9g", (double)o.beta,
              c.loss / ((double)o.beta * (1.0 - o.beta)), c.kl_fwd);
        o.beta = 1.0f - 0x1p-24f; /* the largest float below 1 */
        c = lf_ref_kl_row(xs, xt, V, &o, NULL);
        CHECK(fabs(c.loss / ((double)o.beta * (1.0 - o.beta)) - c.kl_rev) <= 1e-3 * c.kl_rev + 1e-9,
              "JSD(beta=%.9g) / (beta (1-beta)) = %.9g, reverse KL %.9g", (double)o.beta,
              c.loss / ((double)o.beta * (1.0 - o.beta)), c.kl_rev);
        o.beta = 0.5f;
        c = lf_ref_kl_row(xs, xt, V, &o, NULL);
        d = lf_ref_kl_row(xt, xs, V, &o, NULL);
        CHECK(fabs(c.loss - d.loss) <= 1e-14 * (1.0 + c.loss) && c.loss >= 0.0 && c.loss <= log(2.0) + 1e-14,
              "JSD(1/2) not symmetric or outside [0, log 2]: %.17g %.17g", c.loss, d.loss);
    }
}

/* Total variation: its subgradient vs a one-sided difference away from ties. */
static void test_tvd(void)
{
    float xs[20], xt[20];
    double x[20], dx[20];
    int rep, j;
    lf_kl_opts o = lf_kl_opts_default();
    o.kind = LF_KL_TVD;
    for (rep = 0; rep < 30; ++rep) {
        int V = 2 + (int)rng_int(19);
        double L;
        for (j = 0; j < V; ++j) {
            xs[j] = (float)(2.0 * rng_normal());
            xt[j] = (float)(2.0 * rng_normal());
            x[j] = xs[j];
        }
        (void)lf_ref_kl_row(xs, xt, V, &o, dx);
        L = model_loss(x, xt, V, &o, NULL, NULL);
        for (j = 0; j < V; ++j) { /* h small enough that no p_k - q_k changes sign (random rows) */
            double h = 1e-7, x0 = x[j], fd;
            x[j] = x0 + h;
            fd = (model_loss(x, xt, V, &o, NULL, NULL) - L) / h;
            x[j] = x0 - h;
            fd = 0.5 * (fd + (L - model_loss(x, xt, V, &o, NULL, NULL)) / h);
            x[j] = x0;
            CHECK(fabs(dx[j] - fd) <= 1e-6 * (1.0 + fabs(dx[j])), "tvd j=%d: dx %.12g fd %.12g", j, dx[j], fd);
        }
    }
}

/* Support mismatch, non-finite, all masked, options */
static void test_ref_edges(void)
{
    float xs[4] = {1.0f, -INFINITY, 2.0f, 0.0f}, xt[4] = {0.0f, 1.0f, 2.0f, -INFINITY};
    double dx[4];
    lf_kl_opts o = lf_kl_opts_default();
    lf_kl_row r;
    int k, j;
    /* teacher mass where the student has none: forward KL and soft CE +inf, gradient finite */
    for (k = 0; k <= LF_KL_TVD; ++k) {
        o.kind = (lf_kl_kind)k;
        o.beta = 0.5f;
        r = lf_ref_kl_row(xs, xt, 4, &o, dx);
        if (k == LF_KL_FORWARD || k == LF_KL_SOFT_CE) CHECK(r.loss == INFINITY, "%s: loss %g, want +inf", kind_name[k], r.loss);
        if (k == LF_KL_REVERSE) CHECK(r.loss == INFINITY, "reverse: loss %g, want +inf", r.loss);
        if (k == LF_KL_JSD || k == LF_KL_TVD) CHECK(isfinite(r.loss) && r.loss > 0.0, "%s: loss %g", kind_name[k], r.loss);
        for (j = 0; j < 4; ++j) {
            if (k == LF_KL_REVERSE) CHECK(dx[j] != dx[j], "reverse +inf: gradient %g, want NaN", dx[j]);
            else CHECK(isfinite(dx[j]), "%s: gradient %g", kind_name[k], dx[j]);
        }
        /* the student's masked entry (p = 0, q > 0): forward KL and soft CE push it up with -q
         * (their gradient p - q); JSD and TVD give it 0 (both carry a factor p) */
        if (k == LF_KL_FORWARD || k == LF_KL_SOFT_CE)
            CHECK(dx[1] < 0.0 && fabs(dx[1] + exp(1.0 - r.lse_t)) <= 1e-15, "%s: masked entry %g", kind_name[k], dx[1]);
        if (k == LF_KL_JSD || k == LF_KL_TVD) CHECK(dx[1] == 0.0, "%s: gradient at the masked entry %g", kind_name[k], dx[1]);
    }
    /* NaN or +inf on either side, or a side without mass: NaN loss, NaN gradient */
    for (k = 0; k < 6; ++k) {
        float s[3] = {0.5f, 1.0f, -1.0f}, t[3] = {0.0f, 2.0f, 1.0f};
        float bad = k < 2 ? NAN : k < 4 ? INFINITY : -INFINITY;
        if (k % 2) t[1] = bad;
        else s[1] = bad;
        if (k >= 4) { /* the whole side */
            if (k % 2) t[0] = t[2] = bad;
            else s[0] = s[2] = bad;
        }
        o.kind = LF_KL_FORWARD;
        o.softcap = k == 2 ? 30.0f : 0.0f; /* the cap must not turn +inf into 30 */
        r = lf_ref_kl_row(s, t, 3, &o, dx);
        CHECK(r.loss != r.loss && dx[0] != dx[0] && dx[2] != dx[2], "bad input %d: loss %g dx %g", k, r.loss, dx[0]);
    }
    o = lf_kl_opts_default();
    CHECK(lf_check_kl_opts(&o) == LF_OK, "default options rejected");
    o.beta = -0.1f;
    CHECK(lf_check_kl_opts(&o) == LF_ERR_ARG, "beta -0.1 accepted");
    o.beta = NAN;
    CHECK(lf_check_kl_opts(&o) == LF_ERR_ARG, "beta NaN accepted");
    o = lf_kl_opts_default();
    o.temperature = 0.0f;
    CHECK(lf_check_kl_opts(&o) == LF_ERR_ARG, "temperature 0 accepted");
    o.temperature = INFINITY;
    CHECK(lf_check_kl_opts(&o) == LF_ERR_ARG, "temperature inf accepted");
    o = lf_kl_opts_default();
    o.softcap = -1.0f;
    CHECK(lf_check_kl_opts(&o) == LF_ERR_ARG, "softcap -1 accepted");
    o = lf_kl_opts_default();
    o.kind = (lf_kl_kind)7;
    CHECK(lf_check_kl_opts(&o) == LF_ERR_ARG, "kind 7 accepted");
    CHECK(lf_check_kl_opts(NULL) == LF_ERR_NULL, "NULL options accepted");
}

/* 4. the batch reference: masks, weights, reductions */

static void test_batch(void)
{
    enum { N = 9, V = 17, S = 20 };
    static float xs[N * S], xt[N * S];
    uint8_t mask[N];
    float w[N];
    double g[N * V], gn[N * V], lo[N], l1, want = 0.0, wsum = 0.0;
    lf_kl_opts o = lf_kl_opts_default();
    int i, j;
    o.kind = LF_KL_REVERSE;
    o.temperature = 2.0f;
    o.tau2 = 1;
    for (i = 0; i < N * S; ++i) {
        xs[i] = gen_logit(30.0, 0.0);
        xt[i] = gen_logit(30.0, 0.0);
    }
    for (i = 0; i < N; ++i) {
        mask[i] = (uint8_t)(i % 3 != 1);
        w[i] = (float)(0.5 + rng_unif());
    }
    xs[1 * S + 3] = NAN; /* in a masked row: changes nothing */
    CHECK(lf_ref_kl(N, V, xs, S, xt, S, mask, w, &o, LF_REDUCE_NONE, -1.0, lo, gn) == LF_OK, "none failed");
    for (i = 0; i < N; ++i) {
        lf_kl_row r = lf_ref_kl_row(xs + i * S, xt + i * S, V, &o, NULL);
        double wi = mask[i] ? w[i] : 0.0;
        CHECK(mask[i] ? fabs(lo[i] - w[i] * r.loss) <= 1e-13 * (1.0 + fabs(lo[i])) : lo[i] == 0.0, "row %d loss %g", i,
              lo[i]);
        want += wi * (mask[i] ? r.loss : 0.0);
        wsum += wi;
        for (j = 0; j < V && !mask[i]; ++j) CHECK(gn[i * V + j] == 0.0, "masked row %d gradient %g", i, gn[i * V + j]);
    }
    CHECK(lf_ref_kl(N, V, xs, S, xt, S, mask, w, &o, LF_REDUCE_MEAN, -1.0, &l1, g) == LF_OK, "mean failed");
    CHECK(fabs(l1 - want / wsum) <= 1e-13 * (1.0 + fabs(l1)), "mean %.17g want %.17g", l1, want / wsum);
    for (i = 0; i < N * V; ++i) CHECK(fabs(g[i] - gn[i] / wsum) <= 1e-15 * (1.0 + fabs(g[i])), "mean gradient %d", i);
    CHECK(lf_ref_kl(N, V, xs, S, xt, S, mask, w, &o, LF_REDUCE_SUM, -1.0, &l1, NULL) == LF_OK, "sum failed");
    CHECK(fabs(l1 - want) <= 1e-13 * (1.0 + fabs(want)), "sum %.17g want %.17g", l1, want);
    CHECK(lf_ref_kl(N, V, xs, S, xt, S, mask, w, &o, LF_REDUCE_MEAN, 4.0, &l1, NULL) == LF_OK, "divisor failed");
    CHECK(fabs(l1 - want / 4.0) <= 1e-13 * (1.0 + fabs(l1)), "mean over 4: %.17g want %.17g", l1, want / 4.0);
    /* zero divisor: 0, but a NaN row is never hidden */
    CHECK(lf_ref_kl(N, V, xs, S, xt, S, mask, w, &o, LF_REDUCE_MEAN, 0.0, &l1, g) == LF_OK && l1 == 0.0, "zero divisor %g", l1);
    for (i = 0; i < N * V; ++i) CHECK(g[i] == 0.0, "zero divisor: gradient %d = %g, not 0", i, g[i]);
    xs[0 * S + 2] = NAN;
    CHECK(lf_ref_kl(N, V, xs, S, xt, S, mask, w, &o, LF_REDUCE_MEAN, 0.0, &l1, NULL) == LF_OK && l1 != l1,
          "zero divisor with a NaN row: %g", l1);
    /* every row masked: 0 and zero gradient */
    memset(mask, 0, sizeof mask);
    CHECK(lf_ref_kl(N, V, xs, S, xt, S, mask, NULL, &o, LF_REDUCE_MEAN, -1.0, &l1, g) == LF_OK && l1 == 0.0, "all masked %g", l1);
    for (i = 0; i < N * V; ++i) CHECK(g[i] == 0.0, "all masked: gradient %g", g[i]);
    CHECK(lf_ref_kl(2, V, xs, V - 1, xt, S, NULL, NULL, &o, LF_REDUCE_SUM, -1.0, &l1, NULL) == LF_ERR_SIZE, "stride < V accepted");
    CHECK(lf_ref_kl(2, V, NULL, S, xt, S, NULL, NULL, &o, LF_REDUCE_SUM, -1.0, &l1, NULL) == LF_ERR_NULL, "NULL accepted");
    CHECK(lf_ref_kl(0, V, NULL, S, NULL, S, NULL, NULL, &o, LF_REDUCE_MEAN, -1.0, &l1, NULL) == LF_OK && l1 == 0.0, "N = 0: %g", l1);
}

/* 5. sparse (top-k) teachers: DROP and SPREAD against their dense equivalents */

static void test_sparse(void)
{
    enum { V = 37 };
    float xs[V], xt[V], lpk[V];
    int32_t idx[V];
    double lq[V], dx1[V], dx2[V];
    static const float taus[] = {1.0f, 0.5f, 3.0f};
    int rep, j, ti, kind;
    for (rep = 0; rep < 30; ++rep)
        for (ti = 0; ti < 3; ++ti) {
            int k = 1 + (int)rng_int(V), mode;
            double lse = 0.0, m = -INFINITY, in = 0.0;
            float zt[V];
            for (j = 0; j < V; ++j) {
                xs[j] = gen_logit(30.0, 0.0);
                zt[j] = (float)(2.0 * rng_normal());
                if (zt[j] > m) m = zt[j];
            }
            for (j = 0; j < V; ++j) lse += exp(zt[j] - m);
            lse = m + log(lse);
            /* a random k-subset (partial Fisher-Yates) with the teacher's true log-probabilities */
            for (j = 0; j < V; ++j) idx[j] = j;
            for (j = 0; j < k; ++j) {
                int r = j + (int)rng_int(V - j);
                int32_t t = idx[j];
                idx[j] = idx[r];
                idx[r] = t;
                lpk[j] = (float)(zt[idx[j]] - lse);
                in += exp((double)lpk[j]);
            }
            for (mode = 0; mode < 2; ++mode) {
                double lrest = (mode == 1 && k < V && in < 1.0) ? log((1.0 - in) / (V - k)) : -INFINITY;
                CHECK(lf_ref_kl_sparse_teacher(V, idx, lpk, k, (lf_kl_rest)mode, taus[ti], lq) == LF_OK, "sparse build");
                /* the dense equivalent: raw teacher logits lp_i on the top-k, the rest's level elsewhere */
                for (j = 0; j < V; ++j) xt[j] = (float)lrest;
                for (j = 0; j < k; ++j) xt[idx[j]] = lpk[j];
                for (kind = 0; kind <= LF_KL_TVD; ++kind) {
                    lf_kl_opts o = lf_kl_opts_default();
                    lf_kl_row a, b;
                    o.kind = (lf_kl_kind)kind;
                    o.temperature = taus[ti];
                    a = lf_ref_kl_row_lq(xs, lq, V, &o, dx1);
                    b = lf_ref_kl_row(xs, xt, V, &o, dx2);
                    /* lrest rounded to float in xt: compare at float resolution of the teacher */
                    CHECK(same_or_close(a.loss, b.loss, 1e-6 * (1.0 + fabs(b.loss))),
                          "sparse %s mode %d tau %g k=%d: loss %.12g, dense %.12g", kind_name[kind], mode, taus[ti], k, a.loss, b.loss);
                    for (j = 0; j < V; ++j)
                        CHECK(same_or_close(dx1[j], dx2[j], 1e-6 * (1.0 + fabs(dx2[j]))), "sparse %s: dx[%d] %.12g dense %.12g",
                              kind_name[kind], j, dx1[j], dx2[j]);
                }
                if (taus[ti] == 1.0f) { /* q_i = exp(lp_i) exactly, the rest r / (V - k) */
                    double sum = 0.0;
                    for (j = 0; j < V; ++j) sum += exp(lq[j]);
                    for (j = 0; j < k; ++j) CHECK(lq[idx[j]] == (double)lpk[j], "sparse: lq %g want %g", lq[idx[j]], lpk[j]);
                    if (mode == 1 && k < V) CHECK(fabs(sum - 1.0) <= 1e-12, "spread: q sums to %.17g", sum);
                    if (mode == 0) CHECK(fabs(sum - in) <= 1e-12, "drop: mass %.17g want %.17g", sum, in);
                }
            }
        }
    /* bad input */
    idx[0] = 3;
    idx[1] = 3;
    lpk[0] = lpk[1] = -1.0f;
    CHECK(lf_ref_kl_sparse_teacher(V, idx, lpk, 2, LF_KL_REST_DROP, 1.0f, lq) == LF_ERR_ARG, "repeated index accepted");
    idx[1] = V;
    CHECK(lf_ref_kl_sparse_teacher(V, idx, lpk, 2, LF_KL_REST_DROP, 1.0f, lq) == LF_ERR_ARG, "index V accepted");
    idx[1] = -1;
    CHECK(lf_ref_kl_sparse_teacher(V, idx, lpk, 2, LF_KL_REST_DROP, 1.0f, lq) == LF_ERR_ARG, "index -1 accepted");
    idx[1] = 4;
    CHECK(lf_ref_kl_sparse_teacher(V, idx, lpk, V + 1, LF_KL_REST_DROP, 1.0f, lq) == LF_ERR_ARG, "k > V accepted");
    CHECK(lf_ref_kl_sparse_teacher(V, idx, lpk, 2, LF_KL_REST_DROP, 0.0f, lq) == LF_ERR_ARG, "tau 0 accepted");
    CHECK(lf_ref_kl_sparse_teacher(V, NULL, lpk, 2, LF_KL_REST_DROP, 1.0f, lq) == LF_ERR_NULL, "NULL accepted");
    lpk[1] = NAN;
    CHECK(lf_ref_kl_sparse_teacher(V, idx, lpk, 2, LF_KL_REST_SPREAD, 1.0f, lq) == LF_OK, "NaN logprob: build");
    {
        lf_kl_opts o = lf_kl_opts_default();
        lf_kl_row r = lf_ref_kl_row_lq(xs, lq, V, &o, dx1);
        CHECK(r.loss != r.loss && dx1[0] != dx1[0], "NaN logprob: loss %g", r.loss);
    }
    /* DROP: the student's mass outside the top-k makes the reverse KL +inf */
    lpk[1] = -2.0f;
    CHECK(lf_ref_kl_sparse_teacher(V, idx, lpk, 2, LF_KL_REST_DROP, 1.0f, lq) == LF_OK, "drop build");
    {
        lf_kl_opts o = lf_kl_opts_default();
        lf_kl_row r;
        for (j = 0; j < V; ++j) xs[j] = 0.0f;
        o.kind = LF_KL_REVERSE;
        r = lf_ref_kl_row_lq(xs, lq, V, &o, NULL);
        CHECK(r.loss == INFINITY && isfinite(r.kl_fwd), "drop: reverse KL %g, forward %g", r.loss, r.kl_fwd);
    }
}

static void run_all(unsigned long long seed)
{
    g_seed = seed;
    g_rng = seed;
    test_dual();
    test_merge();
    test_ref_rows();
    test_jsd_ends();
    test_tvd();
    test_ref_edges();
    test_batch();
    test_sparse();
}

int main(int argc, char **argv) { return host_check_main(argc, argv, "test_distill", 0x0d157111ull, run_all); }
