/* test_ref.c — host tests of the double-precision cross-entropy references of lossfuse.h
 * (lf_ref_ce_row, lf_ref_cross_entropy) against a naive model written here.
 *
 * Build and run:
 *     gcc -std=c99 -O2 -Wall -Wextra -pedantic -Werror -I. tests/test_ref.c -o test_ref -lm
 *     ./test_ref [seed]
 * Every random test runs twice: once with a fixed seed, once with a fresh seed (time(), or
 * argv[1] to reproduce a failure). One line per failed check, then a summary line; exit 0 when
 * every check passed, 1 otherwise.
 *
 * The naive model is torch's definition, not section 7's rearrangement of it:
 *     loss = -sum_j q_j w_j log p_j + lam lse^2,  q = (1 - eps) onehot(y) + eps / V,
 *     p = softmax(z), z_j = softcap(scale x_j), lse = log sum_j exp z_j.
 * Tolerances:
 *   loss     |err| <= 1e-11 (1 + sum_j q_j w_j (|z_j| + |lse|) + lam lse^2): both sides are
 *            double; the bound is ~1e5 double ulps of the magnitudes summed, so only a wrong
 *            formula (not a different summation order) can exceed it.
 *   gradient The reference takes float logits, so finite differences of it would need h >~ 1e-3
 *            (the float spacing) and a loose bound. Instead the gradient is compared with a
 *            Richardson-extrapolated central difference of the naive double model at the same
 *            (float-valued) points, the model having first been checked against the reference's
 *            loss there. h_j = 1e-4 (1 + |x_j|); truncation is O(h^4) and rounding about
 *            4 eps_double |L| / h, so the bound is 1e-8 (1 + |g|) + 1e-13 (1 + |L|) / h
 *            (observed maxima: 3e-10 (1 + |g|) and 5e-15 (1 + |L|) / h). A wrong term of the
 *            gradient is off by O(p_j) or more.
 *            Those rows use logits within +-60 (large enough to give p ~ e^-100); the +-1e4
 *            outliers are covered by the loss checks, where FD truncation error would be O(1).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>

#include "lossfuse.h"

/* ---------------------------------------------------------------------------------------- */
/* Checks, RNG                                                                               */

#include "host_check.h"

/* ---------------------------------------------------------------------------------------- */
/* Naive model                                                                               */

static double model_z(double x, const lf_ce_opts *o)
{
    double y = x * (double)o->logit_scale, c = (double)o->softcap;
    if (c <= 0.0) return y;
    if (y == -INFINITY) return y;
    if (y == INFINITY || y != y) return NAN;
    return c * tanh(y / c);
}

typedef struct naive_row {
    double loss, lse, entropy, logprob, zterm, weight, mag; /* mag: scale of the loss terms */
    int argmax;
} naive_row;

static naive_row naive_ce(const double *x, int V, int64_t y, const lf_ce_opts *o)
{
    naive_row r;
    double m = -INFINITY, s = 0.0, eps = o->label_smoothing, lam = o->z_loss;
    int j, bad = 0;
    double *z = (double *)malloc(sizeof(double) * (size_t)(V > 0 ? V : 1));
    memset(&r, 0, sizeof r);
    r.argmax = -1;
    for (j = 0; j < V; ++j) {
        z[j] = model_z(x[j], o);
        if (isnan(z[j]) || z[j] == INFINITY) bad = 1;
        else if (z[j] > m) m = z[j];
        /* argmax of the raw logits: first index on ties, NaN largest, first NaN wins */
        if (r.argmax < 0) r.argmax = j;
        else if (isnan(x[j])) {
            if (!isnan(x[r.argmax])) r.argmax = j;
        } else if (!isnan(x[r.argmax]) && x[j] > x[r.argmax])
            r.argmax = j;
    }
    if (bad) r.lse = NAN;
    else if (m == -INFINITY) r.lse = -INFINITY;
    else {
        for (j = 0; j < V; ++j) s += exp(z[j] - m);
        r.lse = m + log(s);
    }
    /* entropy = -sum p log p */
    if (bad || m == -INFINITY) r.entropy = NAN;
    else
        for (j = 0; j < V; ++j)
            if (z[j] != -INFINITY) {
                double lp = z[j] - r.lse;
                r.entropy -= exp(lp) * lp;
            }
    if (y >= 0 && y < V && y != o->ignore_index) {
        r.mag = 1.0;
        for (j = 0; j < V; ++j) {
            double q = (j == y ? 1.0 - eps : 0.0) + eps / V;
            double w = o->class_weights ? o->class_weights[j] : 1.0;
            if (q * w != 0.0) {
                r.loss -= q * w * (z[j] - r.lse);
                r.mag += fabs(q * w) * (fabs(z[j]) + fabs(r.lse));
            }
        }
        if (!isfinite(r.lse)) r.loss = NAN; /* no distribution */
        r.zterm = lam * r.lse * r.lse;
        r.loss += r.zterm;
        r.mag += fabs(r.zterm);
        r.logprob = z[y] - r.lse;
        r.weight = o->class_weights ? o->class_weights[y] : 1.0;
    }
    free(z);
    return r;
}

static int same_or_close(double got, double want, double tol)
{
    if (isnan(want)) return isnan(got);
    if (isinf(want)) return got == want;
    return fabs(got - want) <= tol;
}

/* ---------------------------------------------------------------------------------------- */
/* Option sets                                                                               */

enum { NSETS = 9 };
static const char *set_name[NSETS] = {"default",  "smoothing", "smoothing=1", "z_loss",
                                      "softcap",  "scale",     "weights",     "weights+smoothing",
                                      "everything"};

static lf_ce_opts make_opts(int set, float *w, int V)
{
    lf_ce_opts o = lf_ce_opts_default();
    int j;
    for (j = 0; j < V; ++j) w[j] = rng_unif() < 0.2 ? 0.0f : (float)(2.0 * rng_unif());
    switch (set) {
    case 1: o.label_smoothing = 0.1f; break;
    case 2: o.label_smoothing = 1.0f; break;
    case 3: o.z_loss = 1e-2f; break;
    case 4: o.softcap = 30.0f; break;
    case 5: o.logit_scale = rng_unif() < 0.5 ? 0.7f : 2.0f; break;
    case 6: o.class_weights = w; break;
    case 7:
        o.class_weights = w;
        o.label_smoothing = 0.2f;
        break;
    case 8:
        o.class_weights = w;
        o.label_smoothing = 0.15f;
        o.z_loss = 1e-3f;
        o.softcap = 20.0f;
        o.logit_scale = 1.5f;
        o.ignore_index = 3;
        break;
    default: break;
    }
    return o;
}

/* ---------------------------------------------------------------------------------------- */
/* 1. lf_ref_ce_row: loss and fields vs the naive model                                       */

static void check_row(const float *xf, int V, int64_t y, const lf_ce_opts *o, const char *what)
{
    double *x = (double *)malloc(sizeof(double) * (size_t)V), *dx = (double *)malloc(sizeof(double) * (size_t)V);
    lf_ce_row r;
    naive_row n;
    int j, valid = y >= 0 && y < V && y != o->ignore_index;
    for (j = 0; j < V; ++j) x[j] = xf[j];
    for (j = 0; j < V; ++j) dx[j] = 12345.0;
    r = lf_ref_ce_row(xf, V, y, o, dx);
    n = naive_ce(x, V, y, o);
    CHECK(same_or_close(r.lse, n.lse, 1e-13 * (1.0 + fabs(n.lse))), "%s V=%d: lse %.17g want %.17g",
          what, V, r.lse, n.lse);
    CHECK(same_or_close(r.entropy, n.entropy, 1e-12 * (1.0 + fabs(n.entropy)) + 1e-13 * fabs(n.lse)),
          "%s V=%d: entropy %.17g want %.17g", what, V, r.entropy, n.entropy);
    CHECK(r.argmax == n.argmax, "%s V=%d: argmax %lld want %d", what, V, (long long)r.argmax,
          n.argmax);
    if (valid) {
        CHECK(r.status == LF_ROW_OK, "%s: status %d for a valid label", what, r.status);
        CHECK(same_or_close(r.loss, n.loss, 1e-11 * n.mag), "%s V=%d y=%lld: loss %.17g want %.17g",
              what, V, (long long)y, r.loss, n.loss);
        CHECK(same_or_close(r.z_term, n.zterm, 1e-12 * (1.0 + n.zterm)), "%s: z_term %.17g want %.17g",
              what, r.z_term, n.zterm);
        CHECK(same_or_close(r.logprob, n.logprob, 1e-12 * (1.0 + fabs(n.lse) + fabs(n.logprob))),
              "%s: logprob %.17g want %.17g", what, r.logprob, n.logprob);
        CHECK(r.weight == n.weight, "%s: weight %.17g want %.17g", what, r.weight, n.weight);
        if (!isfinite(n.lse)) {
            int allnan = 1;
            for (j = 0; j < V; ++j) allnan &= isnan(dx[j]) != 0;
            CHECK(isnan(r.loss) && allnan, "%s: non-finite lse %g: loss %g, gradient not all NaN",
                  what, n.lse, r.loss);
        }
    } else {
        int zero = 1;
        for (j = 0; j < V; ++j) zero &= dx[j] == 0.0;
        CHECK(r.status == (y == o->ignore_index ? LF_ROW_IGNORED : LF_ROW_BAD_LABEL),
              "%s: status %d for label %lld", what, r.status, (long long)y);
        CHECK(r.loss == 0.0 && r.z_term == 0.0 && r.logprob == 0.0 && r.weight == 0.0 && zero,
              "%s: label %lld: loss %g z %g logprob %g weight %g, gradient zero %d", what,
              (long long)y, r.loss, r.z_term, r.logprob, r.weight, zero);
    }
    free(x);
    free(dx);
}

static void test_rows(void)
{
    static const int Vs[] = {1, 2, 3, 17, 100, 1000};
    float xf[1000], w[1000];
    int set, vi, rep, j;
    for (set = 0; set < NSETS; ++set)
        for (vi = 0; vi < 6; ++vi)
            for (rep = 0; rep < 30; ++rep) {
                int V = Vs[vi];
                lf_ce_opts o = make_opts(set, w, V);
                int64_t y = rng_int(V);
                double pinf = (rep % 3 == 0) ? 0.1 : 0.0;
                for (j = 0; j < V; ++j) xf[j] = gen_logit(1e4, pinf);
                if (o.softcap > 0.0f && rep % 2)
                    for (j = 0; j < V; ++j) xf[j] *= 3.0f; /* into the saturated part of tanh */
                /* a masked label whose ce coefficient (1 - eps) w_y is 0 makes 0 * inf: see the
                 * explicit checks in the special rows below */
                if (xf[y] == -INFINITY &&
                    (o.label_smoothing == 1.0f || (o.class_weights && o.class_weights[y] == 0.0f)))
                    xf[y] = 0.0f;
                check_row(xf, V, y, &o, set_name[set]);
                /* ignored and bad labels on the same row */
                check_row(xf, V, o.ignore_index, &o, set_name[set]);
                check_row(xf, V, V, &o, set_name[set]);
                check_row(xf, V, -1, &o, set_name[set]);
            }
    /* special rows */
    {
        lf_ce_opts o = lf_ce_opts_default();
        float x[5] = {1.0f, 2.0f, 3.0f, 2.0f, 0.5f};
        lf_ce_row r;
        double dx[5];
        x[2] = NAN; /* NaN in a valid row */
        check_row(x, 5, 1, &o, "NaN row");
        r = lf_ref_ce_row(x, 5, 1, &o, dx);
        CHECK(isnan(r.loss) && isnan(r.lse) && isnan(dx[0]) && isnan(dx[4]) && r.argmax == 2,
              "NaN row: loss %g lse %g dx0 %g argmax %lld", r.loss, r.lse, dx[0], (long long)r.argmax);
        x[2] = INFINITY; /* +inf in a valid row */
        check_row(x, 5, 1, &o, "+inf row");
        r = lf_ref_ce_row(x, 5, 1, &o, dx);
        CHECK(isnan(r.loss) && isnan(dx[1]), "+inf row: loss %g dx1 %g", r.loss, dx[1]);
        o.softcap = 10.0f; /* the cap must not turn +inf into a finite 10 */
        r = lf_ref_ce_row(x, 5, 1, &o, dx);
        CHECK(isnan(r.loss) && isnan(dx[1]), "+inf row under softcap: loss %g dx1 %g", r.loss, dx[1]);
        o.softcap = 0.0f;
        for (j = 0; j < 5; ++j) x[j] = -INFINITY; /* all masked, valid label */
        check_row(x, 5, 3, &o, "all -inf row");
        r = lf_ref_ce_row(x, 5, 3, &o, dx);
        CHECK(isnan(r.loss) && isnan(dx[3]) && r.lse == -INFINITY && r.argmax == 0,
              "all -inf row: loss %g lse %g dx3 %g argmax %lld", r.loss, r.lse, dx[3],
              (long long)r.argmax);
        /* a masked label: loss +inf, gradient finite (-1 at the label, p elsewhere) */
        x[0] = 0.0f;
        x[1] = 0.0f;
        r = lf_ref_ce_row(x, 5, 3, &o, dx);
        CHECK(r.loss == INFINITY && dx[3] == -1.0 && fabs(dx[0] - 0.5) < 1e-15 && dx[4] == 0.0,
              "masked label: loss %g dx %g %g %g", r.loss, dx[3], dx[0], dx[4]);
        /* smoothing against a masked class: -log p_j = inf, so the loss is +inf */
        o.label_smoothing = 0.1f;
        check_row(x, 5, 0, &o, "smoothing with -inf");
        r = lf_ref_ce_row(x, 5, 0, &o, NULL);
        CHECK(r.loss == INFINITY, "smoothing with a -inf class: loss %g, want +inf", r.loss);
        /* ... unless that class has weight 0 */
        {
            static const float cw[5] = {1.0f, 1.0f, 0.0f, 0.0f, 0.0f};
            o.class_weights = cw;
            check_row(x, 5, 0, &o, "smoothing, -inf class weight 0");
            r = lf_ref_ce_row(x, 5, 0, &o, NULL);
            CHECK(isfinite(r.loss), "smoothing, -inf classes of weight 0: loss %g", r.loss);
        }
        /* 0 * inf: a masked label whose ce coefficient (1 - eps) w_y is 0. Section 7 evaluates
         * (1 - eps) w_y (lse - z_y) = 0 * inf = NaN (as torch's own implementation does),
         * where the q-weighted sum -sum_j q_j w_j log p_j has the limit +inf (eps = 1: the
         * smoothing term still sees log p_y = -inf) or a finite value (w_y = 0). This pins
         * the current, documented IEEE evaluation. */
        {
            static const float cw0[5] = {0.0f, 1.0f, 1.0f, 1.0f, 1.0f};
            float xm[5] = {-INFINITY, 1.0f, 2.0f, 0.0f, -1.0f};
            lf_ce_opts e1 = lf_ce_opts_default(), w0 = lf_ce_opts_default();
            e1.label_smoothing = 1.0f;
            w0.class_weights = cw0;
            r = lf_ref_ce_row(xm, 5, 0, &e1, NULL);
            CHECK(isnan(r.loss), "eps = 1, masked label: loss %g (documented: NaN)", r.loss);
            r = lf_ref_ce_row(xm, 5, 0, &w0, NULL);
            CHECK(isnan(r.loss), "w_y = 0, masked label: loss %g (documented: NaN)", r.loss);
            xm[0] = 0.5f; /* unmasked: eps = 1 gives exactly the smoothing term */
            r = lf_ref_ce_row(xm, 5, 0, &e1, NULL);
            {
                double xd[5];
                for (j = 0; j < 5; ++j) xd[j] = xm[j];
                CHECK(fabs(r.loss - naive_ce(xd, 5, 0, &e1).loss) < 1e-13,
                      "eps = 1: loss %.17g want %.17g", r.loss, naive_ce(xd, 5, 0, &e1).loss);
            }
        }
        /* one-hot: V = 1 gives loss 0 and gradient 0 */
        {
            lf_ce_opts d = lf_ce_opts_default();
            float one = 7.5f;
            double g = 1.0;
            r = lf_ref_ce_row(&one, 1, 0, &d, &g);
            CHECK(r.loss == 0.0 && g == 0.0 && r.entropy == 0.0 && r.lse == 7.5,
                  "V=1: loss %g grad %g entropy %g lse %g", r.loss, g, r.entropy, r.lse);
        }
        /* lse = log(V) for equal logits, entropy too */
        o = lf_ce_opts_default();
        {
            float e[100];
            for (j = 0; j < 100; ++j) e[j] = -3.0f;
            r = lf_ref_ce_row(e, 100, 5, &o, NULL);
            CHECK(fabs(r.lse - (log(100.0) - 3.0)) < 1e-13 && fabs(r.entropy - log(100.0)) < 1e-13,
                  "equal logits: lse %.17g entropy %.17g", r.lse, r.entropy);
        }
        /* massless entries (lf_massless), as the kernels take them: a row with every entry at
         * bf16's or fp32's finfo.min has no mass (NaN loss and gradient, lse -inf: not the
         * uniform row, not the 0 that log V absorbed into |m| = 3.4e38 had given); beside one
         * finite entry they weigh exactly 0, a label among them is finite (3.4e38); fp16's
         * finfo.min (-65504) has mass: a row of it is uniform */
        {
            static const float floors[2] = {-3.3895314e38f, -3.402823466e38f};
            float e[100];
            double dx[100];
            int f;
            for (f = 0; f < 2; ++f) {
                for (j = 0; j < 100; ++j) e[j] = floors[f];
                r = lf_ref_ce_row(e, 100, 5, &o, dx);
                CHECK(isnan(r.loss) && r.lse == -INFINITY && isnan(r.entropy) && isnan(dx[0]) && isnan(dx[5]) &&
                          r.argmax == 0 && r.status == LF_ROW_OK,
                      "row at floor %g: loss %g lse %g entropy %g dx %g %g argmax %lld", floors[f], r.loss, r.lse,
                      r.entropy, dx[0], dx[5], (long long)r.argmax);
                e[7] = 2.0f;
                r = lf_ref_ce_row(e, 100, 7, &o, dx);
                CHECK(r.loss == 0.0 && r.lse == 2.0 && dx[7] == 0.0 && dx[0] == 0.0 && dx[99] == 0.0,
                      "one entry above floor %g: loss %g lse %g dx %g %g", floors[f], r.loss, r.lse, dx[7], dx[0]);
                r = lf_ref_ce_row(e, 100, 5, &o, dx);
                CHECK(r.loss == 2.0 - (double)floors[f] && dx[5] == -1.0 && dx[7] == 1.0 && dx[6] == 0.0,
                      "label at floor %g: loss %g dx %g %g", floors[f], r.loss, dx[5], dx[7]);
            }
            for (j = 0; j < 100; ++j) e[j] = -65504.0f;
            r = lf_ref_ce_row(e, 100, 5, &o, dx);
            CHECK(fabs(r.loss - log(100.0)) < 1e-9 && fabs(dx[5] - (0.01 - 1.0)) < 1e-12 && fabs(dx[0] - 0.01) < 1e-12,
                  "row at fp16's floor: loss %.17g want log 100, dx %g %g", r.loss, dx[5], dx[0]);
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* 2. gradient of lf_ref_ce_row vs finite differences of the naive model                      */

static double model_loss(const double *x, int V, int64_t y, const lf_ce_opts *o)
{
    return naive_ce(x, V, y, o).loss;
}

static void test_grad_fd(void)
{
    static const int Vs[] = {2, 3, 10, 40};
    float xf[40], w[40];
    double x[40], dx[40];
    int set, vi, rep, j;
    for (set = 0; set < NSETS; ++set)
        for (vi = 0; vi < 4; ++vi)
            for (rep = 0; rep < 15; ++rep) {
                int V = Vs[vi];
                lf_ce_opts o = make_opts(set, w, V);
                int64_t y = rng_int(V);
                lf_ce_row r;
                double L;
                if (y == o.ignore_index) y = (y + 1) % V;
                for (j = 0; j < V; ++j) {
                    /* masked entries only where they cost nothing: eps = 0 or weight 0 */
                    int can_mask = j != y && (o.label_smoothing == 0.0f ||
                                              (o.class_weights && o.class_weights[j] == 0.0f));
                    xf[j] = gen_logit(60.0, 0.0);
                    if (can_mask && rng_unif() < 0.15) xf[j] = -INFINITY;
                    if (o.softcap > 0.0f && rep % 2) xf[j] *= 2.0f;
                    x[j] = xf[j];
                }
                r = lf_ref_ce_row(xf, V, y, &o, dx);
                L = model_loss(x, V, y, &o);
                CHECK(fabs(r.loss - L) <= 1e-11 * (1.0 + fabs(L) + naive_ce(x, V, y, &o).mag),
                      "%s: loss %.17g, model %.17g", set_name[set], r.loss, L);
                for (j = 0; j < V; ++j) {
                    double h, xs, d1, d2, fd, tol;
                    if (xf[j] == -INFINITY) {
                        /* p_j = 0 and the smoothing term's w_j = 0 (or eps = 0): exactly 0 */
                        CHECK(dx[j] == 0.0, "%s: gradient at a masked logit %g", set_name[set], dx[j]);
                        continue;
                    }
                    h = 1e-4 * (1.0 + fabs(x[j]));
                    xs = x[j];
                    x[j] = xs + h;
                    d1 = model_loss(x, V, y, &o);
                    x[j] = xs - h;
                    d1 = (d1 - model_loss(x, V, y, &o)) / (2.0 * h);
                    x[j] = xs + h / 2;
                    d2 = model_loss(x, V, y, &o);
                    x[j] = xs - h / 2;
                    d2 = (d2 - model_loss(x, V, y, &o)) / h;
                    x[j] = xs;
                    fd = (4.0 * d2 - d1) / 3.0;
                    tol = 1e-8 * (1.0 + fabs(dx[j])) + 1e-13 * (1.0 + fabs(L)) / h;
                    CHECK(fabs(dx[j] - fd) <= tol,
                          "%s V=%d y=%lld j=%d x=%.9g: dx %.17g, finite difference %.17g (tol %.3g)",
                          set_name[set], V, (long long)y, j, xf[j], dx[j], fd, tol);
                }
                /* the gradient of a row sums to (1-eps) w_y ... in z: check sum_j dL/dz_j
                 * = 2 lam lse (sum_j p_j = 1) when no class weights and no cap */
                if (!o.class_weights && o.softcap == 0.0f) {
                    double sum = 0.0, want = 2.0 * o.z_loss * r.lse;
                    for (j = 0; j < V; ++j) sum += dx[j] / o.logit_scale;
                    CHECK(fabs(sum - want) <= 1e-12 * (1.0 + V + fabs(want)),
                          "%s: sum of dL/dz %.17g want %.17g", set_name[set], sum, want);
                }
            }
}

/* ---------------------------------------------------------------------------------------- */
/* 3. lf_ref_cross_entropy: reductions, divisors, special rows                                */

typedef struct batch {
    int N, V, stride;
    float *x;   /* N * stride, padding NaN / huge */
    int64_t *y; /* N */
} batch;

static batch make_batch(int N, int V, int pad, const lf_ce_opts *o)
{
    batch b;
    int i, j;
    b.N = N;
    b.V = V;
    b.stride = V + pad;
    b.x = (float *)malloc(sizeof(float) * (size_t)(N * b.stride + 1));
    b.y = (int64_t *)malloc(sizeof(int64_t) * (size_t)(N + 1));
    for (i = 0; i < N; ++i) {
        double r = rng_unif();
        for (j = 0; j < b.stride; ++j)
            b.x[i * b.stride + j] = j < V ? gen_logit(1e3, 0.0) : (j % 2 ? NAN : 3e38f);
        b.y[i] = r < 0.15 ? o->ignore_index : r < 0.22 ? (rng_unif() < 0.5 ? (int64_t)V : -7) : rng_int(V);
        if (b.y[i] == -7 && o->ignore_index == -7) b.y[i] = V + 1;
    }
    return b;
}

static void free_batch(batch *b)
{
    free(b->x);
    free(b->y);
}

/* Reference sums over the batch with the naive model. */
typedef struct batch_naive {
    double sum, zsum, wsum, mag;
    int64_t nbad;
    double *loss; /* per row */
    double *z;
} batch_naive;

static batch_naive naive_batch(const batch *b, const lf_ce_opts *o)
{
    batch_naive n;
    int i, j;
    double *x = (double *)malloc(sizeof(double) * (size_t)(b->V > 0 ? b->V : 1));
    memset(&n, 0, sizeof n);
    n.loss = (double *)calloc((size_t)b->N + 1, sizeof(double));
    n.z = (double *)calloc((size_t)b->N + 1, sizeof(double));
    for (i = 0; i < b->N; ++i) {
        naive_row r;
        int64_t y = b->y[i];
        for (j = 0; j < b->V; ++j) x[j] = b->x[i * b->stride + j];
        if (y != o->ignore_index && (y < 0 || y >= b->V)) ++n.nbad;
        r = naive_ce(x, b->V, y, o);
        n.loss[i] = r.loss;
        n.z[i] = r.zterm;
        n.sum += r.loss;
        n.zsum += r.zterm;
        n.wsum += r.weight;
        n.mag += r.mag;
    }
    free(x);
    return n;
}

static void free_naive(batch_naive *n)
{
    free(n->loss);
    free(n->z);
}

/* Per-row gradients from lf_ref_ce_row (validated by test_grad_fd), row stride V. */
static double *row_grads(const batch *b, const lf_ce_opts *o)
{
    double *g = (double *)malloc(sizeof(double) * (size_t)(b->N * b->V + 1));
    int i;
    for (i = 0; i < b->N; ++i) (void)lf_ref_ce_row(b->x + i * b->stride, b->V, b->y[i], o, g + i * b->V);
    return g;
}

static int grad_matches(const double *got, const double *rows, const batch *b, double scale)
{
    int i, j;
    for (i = 0; i < b->N; ++i)
        for (j = 0; j < b->V; ++j) {
            double want = rows[i * b->V + j] * scale, v = got[i * b->V + j];
            if (isnan(want) ? !isnan(v) : fabs(v - want) > 1e-14 * fabs(want)) return 0;
        }
    return 1;
}

static int all_zero(const double *g, int n)
{
    int i;
    for (i = 0; i < n; ++i)
        if (g[i] != 0.0) return 0;
    return 1;
}

static void test_reductions(void)
{
    int rep;
    for (rep = 0; rep < 400; ++rep) {
        int N = 1 + (int)rng_int(30), V = 1 + (int)rng_int(60), pad = (int)rng_int(4), i, set = rep % NSETS;
        float w[64];
        lf_ce_opts o = make_opts(set, w, V);
        batch b = make_batch(N, V, pad, &o);
        batch_naive n = naive_batch(&b, &o);
        double *g = (double *)malloc(sizeof(double) * (size_t)(N * V));
        double *rows = row_grads(&b, &o);
        double *lv = (double *)malloc(sizeof(double) * (size_t)N), *zv = (double *)malloc(sizeof(double) * (size_t)N);
        double loss = NAN, zl = NAN, tol = 1e-11 * (1.0 + n.mag), divs[3];
        int64_t nbad = -1;
        lf_status st;
        int k;
        const char *name = set_name[set];

        /* none */
        st = lf_ref_cross_entropy(N, V, b.x, b.stride, b.y, &o, LF_REDUCE_NONE, -1.0, lv, zv, g, &nbad);
        CHECK(st == LF_OK && nbad == n.nbad, "%s none: status %d n_bad %lld want %lld", name, (int)st,
              (long long)nbad, (long long)n.nbad);
        for (i = 0; i < N; ++i) {
            CHECK(same_or_close(lv[i], n.loss[i], tol), "%s none row %d: loss %.17g want %.17g",
                  name, i, lv[i], n.loss[i]);
            CHECK(same_or_close(zv[i], n.z[i], tol), "%s none row %d: z %.17g want %.17g", name, i,
                  zv[i], n.z[i]);
            if (b.y[i] == o.ignore_index || b.y[i] < 0 || b.y[i] >= V)
                CHECK(lv[i] == 0.0 && all_zero(g + i * V, V),
                      "%s none: ignored/bad row %d (label %lld) loss %g or gradient nonzero", name,
                      i, (long long)b.y[i], lv[i]);
        }
        CHECK(grad_matches(g, rows, &b, 1.0), "%s none: gradient differs from the row gradients", name);
        /* sum */
        st = lf_ref_cross_entropy(N, V, b.x, b.stride, b.y, &o, LF_REDUCE_SUM, -1.0, &loss, &zl, g, NULL);
        CHECK(st == LF_OK && same_or_close(loss, n.sum, tol) && same_or_close(zl, n.zsum, tol),
              "%s sum: loss %.17g want %.17g, z %.17g want %.17g", name, loss, n.sum, zl, n.zsum);
        CHECK(grad_matches(g, rows, &b, 1.0), "%s sum: gradient differs from the row gradients", name);
        /* mean: default divisor (sum of w_y over valid rows), explicit divisors */
        divs[0] = -1.0;
        divs[1] = 7.5;
        divs[2] = (double)N;
        for (k = 0; k < 3; ++k) {
            double d = divs[k] < 0 ? n.wsum : divs[k];
            double want = d == 0.0 ? 0.0 : n.sum / d, wantz = d == 0.0 ? 0.0 : n.zsum / d;
            st = lf_ref_cross_entropy(N, V, b.x, b.stride, b.y, &o, LF_REDUCE_MEAN, divs[k], &loss, &zl,
                                      g, &nbad);
            CHECK(st == LF_OK && nbad == n.nbad, "%s mean: status %d nbad %lld", name, (int)st,
                  (long long)nbad);
            CHECK(same_or_close(loss, want, tol / (d > 0 ? d : 1.0)) &&
                      same_or_close(zl, wantz, tol / (d > 0 ? d : 1.0)),
                  "%s mean (divisor %g -> %.17g): loss %.17g want %.17g, z %.17g want %.17g", name,
                  divs[k], d, loss, want, zl, wantz);
            if (d != 0.0)
                CHECK(grad_matches(g, rows, &b, 1.0 / d), "%s mean divisor %g: gradient not rows / %g",
                      name, divs[k], d);
            else
                CHECK(all_zero(g, N * V), "%s mean, zero default divisor: gradient nonzero", name);
        }
        /* divisor 0: loss 0 and gradient 0, never NaN */
        st = lf_ref_cross_entropy(N, V, b.x, b.stride, b.y, &o, LF_REDUCE_MEAN, 0.0, &loss, &zl, g, NULL);
        CHECK(st == LF_OK && loss == 0.0 && zl == 0.0 && all_zero(g, N * V),
              "%s divisor 0: loss %g z %g, gradient zero %d", name, loss, zl, all_zero(g, N * V));
        /* NULL outputs are allowed */
        st = lf_ref_cross_entropy(N, V, b.x, b.stride, b.y, &o, LF_REDUCE_MEAN, -1.0, NULL, NULL, NULL, NULL);
        CHECK(st == LF_OK, "%s: NULL outputs gave status %d", name, (int)st);

        /* a NaN in one valid row: that row NaN (loss and whole gradient row), others unchanged */
        {
            int bad_row = -1;
            for (i = 0; i < N; ++i)
                if (b.y[i] >= 0 && b.y[i] < V && b.y[i] != o.ignore_index) bad_row = i;
            if (bad_row >= 0) {
                batch one_row;
                int col = (int)rng_int(V);
                float keep = b.x[bad_row * b.stride + col];
                one_row.N = 1;
                one_row.V = one_row.stride = V;
                one_row.x = NULL;
                one_row.y = NULL;
                b.x[bad_row * b.stride + col] = rep % 2 ? NAN : INFINITY;
                st = lf_ref_cross_entropy(N, V, b.x, b.stride, b.y, &o, LF_REDUCE_NONE, -1.0, lv, NULL, g, NULL);
                for (i = 0; i < N; ++i) {
                    if (i == bad_row) {
                        int j, nan_all = 1;
                        for (j = 0; j < V; ++j) nan_all &= isnan(g[i * V + j]) != 0;
                        CHECK(isnan(lv[i]) && nan_all, "%s: %s row %d: loss %g, gradient all NaN %d",
                              name, rep % 2 ? "NaN" : "+inf", i, lv[i], nan_all);
                    } else {
                        CHECK(same_or_close(lv[i], n.loss[i], tol) &&
                                  grad_matches(g + i * V, rows + i * V, &one_row, 1.0),
                              "%s: row %d changed by a NaN in row %d: %.17g vs %.17g", name, i,
                              bad_row, lv[i], n.loss[i]);
                    }
                }
                st = lf_ref_cross_entropy(N, V, b.x, b.stride, b.y, &o, LF_REDUCE_MEAN, -1.0, &loss, NULL, NULL, NULL);
                CHECK(isnan(loss), "%s: mean with a NaN row = %g", name, loss);
                /* the same non-finite value in an ignored row changes nothing */
                b.x[bad_row * b.stride + col] = keep;
                b.y[bad_row] = o.ignore_index;
                n.sum -= n.loss[bad_row];
                for (i = 0; i < V; ++i) b.x[bad_row * b.stride + i] = NAN;
                st = lf_ref_cross_entropy(N, V, b.x, b.stride, b.y, &o, LF_REDUCE_SUM, -1.0, &loss, NULL, g, NULL);
                CHECK(same_or_close(loss, n.sum, tol) && all_zero(g + bad_row * V, V),
                      "%s: NaN row ignored: loss %.17g want %.17g", name, loss, n.sum);
            }
        }
        free(g);
        free(rows);
        free(lv);
        free(zv);
        free_naive(&n);
        free_batch(&b);
    }
}

static void test_reduction_edges(void)
{
    lf_ce_opts o = lf_ce_opts_default();
    float x[4 * 6];
    int64_t y[4];
    double g[4 * 5], loss = 123.0, lv[4];
    int64_t nbad = -1;
    lf_status st;
    int i;
    for (i = 0; i < 4 * 6; ++i) x[i] = (float)rng_normal();
    /* all rows ignored */
    for (i = 0; i < 4; ++i) y[i] = -100;
    for (i = 0; i < 20; ++i) g[i] = 1.0;
    st = lf_ref_cross_entropy(4, 5, x, 6, y, &o, LF_REDUCE_MEAN, -1.0, &loss, NULL, g, &nbad);
    CHECK(st == LF_OK && loss == 0.0 && all_zero(g, 20) && nbad == 0,
          "all ignored, mean: loss %g nbad %lld", loss, (long long)nbad);
    st = lf_ref_cross_entropy(4, 5, x, 6, y, &o, LF_REDUCE_SUM, -1.0, &loss, NULL, g, &nbad);
    CHECK(st == LF_OK && loss == 0.0 && all_zero(g, 20), "all ignored, sum: loss %g", loss);
    st = lf_ref_cross_entropy(4, 5, x, 6, y, &o, LF_REDUCE_NONE, -1.0, lv, NULL, g, &nbad);
    CHECK(st == LF_OK && lv[0] == 0.0 && lv[3] == 0.0 && all_zero(g, 20), "all ignored, none");
    /* all labels bad: counted, loss 0 */
    y[0] = 5;
    y[1] = -1;
    y[2] = 1000000000000LL;
    y[3] = -101;
    st = lf_ref_cross_entropy(4, 5, x, 6, y, &o, LF_REDUCE_MEAN, -1.0, &loss, NULL, g, &nbad);
    CHECK(st == LF_OK && loss == 0.0 && all_zero(g, 20) && nbad == 4,
          "all bad: status %d loss %g nbad %lld", (int)st, loss, (long long)nbad);
    /* all class weights of the labels zero: default divisor 0 -> loss 0, gradient 0 */
    {
        static const float cw[5] = {0.0f, 1.0f, 1.0f, 1.0f, 1.0f};
        lf_ce_opts c = o;
        c.class_weights = cw;
        for (i = 0; i < 4; ++i) y[i] = 0;
        st = lf_ref_cross_entropy(4, 5, x, 6, y, &c, LF_REDUCE_MEAN, -1.0, &loss, NULL, g, &nbad);
        CHECK(st == LF_OK && loss == 0.0 && all_zero(g, 20), "zero-weight labels, mean: loss %g", loss);
    }
    /* all -inf valid row -> NaN loss */
    for (i = 0; i < 5; ++i) x[6 + i] = -INFINITY;
    y[0] = -100;
    y[1] = 2;
    y[2] = -100;
    y[3] = -100;
    st = lf_ref_cross_entropy(4, 5, x, 6, y, &o, LF_REDUCE_NONE, -1.0, lv, NULL, g, NULL);
    CHECK(st == LF_OK && isnan(lv[1]) && isnan(g[5]) && lv[0] == 0.0, "all -inf row: loss %g", lv[1]);
    /* N = 0 */
    st = lf_ref_cross_entropy(0, 5, NULL, 5, NULL, &o, LF_REDUCE_MEAN, -1.0, &loss, NULL, NULL, &nbad);
    CHECK(st == LF_OK && loss == 0.0 && nbad == 0, "N = 0: status %d loss %g", (int)st, loss);
    /* argument errors */
    CHECK(lf_ref_cross_entropy(4, 5, x, 4, y, &o, LF_REDUCE_SUM, -1.0, &loss, NULL, NULL, NULL) == LF_ERR_SIZE,
          "stride < V accepted");
    CHECK(lf_ref_cross_entropy(-1, 5, x, 5, y, &o, LF_REDUCE_SUM, -1.0, &loss, NULL, NULL, NULL) == LF_ERR_SIZE,
          "N < 0 accepted");
    CHECK(lf_ref_cross_entropy(4, -1, x, 5, y, &o, LF_REDUCE_SUM, -1.0, &loss, NULL, NULL, NULL) == LF_ERR_SIZE,
          "V < 0 accepted");
    CHECK(lf_ref_cross_entropy(4, 5, NULL, 5, y, &o, LF_REDUCE_SUM, -1.0, &loss, NULL, NULL, NULL) == LF_ERR_NULL,
          "NULL logits accepted");
    CHECK(lf_ref_cross_entropy(4, 5, x, 5, NULL, &o, LF_REDUCE_SUM, -1.0, &loss, NULL, NULL, NULL) == LF_ERR_NULL,
          "NULL labels accepted");
    CHECK(lf_ref_cross_entropy(4, 5, x, 5, y, NULL, LF_REDUCE_SUM, -1.0, &loss, NULL, NULL, NULL) == LF_ERR_NULL,
          "NULL opts accepted");
    {
        lf_ce_opts bad = o;
        bad.label_smoothing = NAN;
        CHECK(lf_ref_cross_entropy(4, 5, x, 5, y, &bad, LF_REDUCE_SUM, -1.0, &loss, NULL, NULL, NULL) == LF_ERR_ARG,
              "NaN smoothing accepted");
        bad = o;
        bad.logit_scale = 0.0f;
        CHECK(lf_ref_cross_entropy(4, 5, x, 5, y, &bad, LF_REDUCE_SUM, -1.0, &loss, NULL, NULL, NULL) == LF_ERR_ARG,
              "zero scale accepted");
    }
}

/* ---------------------------------------------------------------------------------------- */

static void run_all(unsigned long long seed, int edges)
{
    g_seed = seed;
    g_rng = seed;
    test_rows();
    test_grad_fd();
    test_reductions();
    if (edges) test_reduction_edges();
}

int main(int argc, char **argv)
{
    const unsigned long long fixed = 0x5eed5678ef01ull;
    unsigned long long seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (unsigned long long)time(NULL);
    printf("test_ref: seeds %llu (fixed) and %llu (this run; pass it as argv[1] to reproduce)\n", fixed,
           seed);
    run_all(fixed, 1);
    run_all(seed, 0);
    printf("test_ref: %ld checks, %ld failed\n", g_checks, g_failed);
    return g_failed ? 1 : 0;
}
