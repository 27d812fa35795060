/* test_pairs.c — host tests of lossfuse.h's scalar pair losses (section 3c) against naive
 * long-double formulas, their derivatives against the analytic long-double derivatives, and
 * those against finite differences (so that the test's own formulas are checked too).
 *
 * Build and run:
 *     gcc -std=c99 -O2 -Wall -Wextra -pedantic -Werror -I. tests/test_pairs.c -o test_pairs -lm
 *     ./test_pairs [seed]
 * Tolerances: the float functions round their inputs' product z = scale * x once (relative
 * 2^-24) and then evaluate exp / log1p to about 1 ulp, so a loss or derivative is within
 *     2^-20 (|want| + |z| |dwant/dz|) + 1e-37
 * of the exact value; a wrong formula or a lost digit (e.g. log(1 + e^x) for x << 0) is off by
 * far more. Finite differences of the long-double model: central, h = 2^-20 (1 + |x|), bound
 * 1e-6 (1 + |d|).
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "lossfuse.h"

#include "host_check.h"

typedef long double ld;

static ld n_softplus(ld x) { return x > 0 ? x + log1pl(expl(-x)) : log1pl(expl(x)); }
static ld n_sigmoid(ld x) { return 1.0L / (1.0L + expl(-x)); }

/* The losses as functions of their first argument, parameters in p[] (naive, long double). */
enum { F_SOFTPLUS, F_LOGSIG, F_SIGMOID, F_DPO, F_HINGE, F_IPO, F_SIMPO, F_BT, F_HMARGIN, NF };
static const char *fname[NF] = {"softplus", "log_sigmoid", "sigmoid", "dpo_sigmoid", "dpo_hinge",
                                "dpo_ipo", "simpo", "bt", "hinge_margin"};

static ld naive(int f, ld x, const float *p)
{
    switch (f) {
    case F_SOFTPLUS: return n_softplus(x);
    case F_LOGSIG: return -n_softplus(-x);
    case F_SIGMOID: return n_sigmoid(x);
    case F_DPO: return (1.0L - p[1]) * n_softplus(-(ld)p[0] * x) + (ld)p[1] * n_softplus((ld)p[0] * x);
    case F_HINGE: { ld z = 1.0L - (ld)p[0] * x; return z > 0 ? z : 0.0L; }
    case F_IPO: { ld r = x - 0.5L / (ld)p[0]; return r * r; }
    case F_SIMPO: return n_softplus(-((ld)p[0] * x - (ld)p[1]));
    case F_BT: return (ld)p[1] * n_softplus(-(ld)p[0] * x) + (1.0L - p[1]) * n_softplus((ld)p[0] * x);
    default: { ld z = (ld)p[2] - (ld)p[1] * (ld)p[0] * x; return z > 0 ? z : 0.0L; }
    }
}

static ld naive_d(int f, ld x, const float *p)
{
    switch (f) {
    case F_SOFTPLUS: return n_sigmoid(x);
    case F_LOGSIG: return n_sigmoid(-x);
    case F_SIGMOID: return n_sigmoid(x) * n_sigmoid(-x);
    case F_DPO: return (ld)p[0] * (n_sigmoid((ld)p[0] * x) - (1.0L - p[1]));
    case F_HINGE: return 1.0L - (ld)p[0] * x > 0 ? -(ld)p[0] : 0.0L;
    case F_IPO: return 2.0L * (x - 0.5L / (ld)p[0]);
    case F_SIMPO: return -(ld)p[0] * n_sigmoid(-((ld)p[0] * x - (ld)p[1]));
    case F_BT: return (ld)p[0] * (n_sigmoid((ld)p[0] * x) - (ld)p[1]);
    default: return (ld)p[2] - (ld)p[1] * (ld)p[0] * x > 0 ? -(ld)p[1] * (ld)p[0] : 0.0L;
    }
}

/* The library's, with its derivative (NAN where a function has none in the library). */
static float lib(int f, float x, const float *p, float *d)
{
    switch (f) {
    case F_SOFTPLUS: *d = lf_sigmoid(x); return lf_softplus(x);
    case F_LOGSIG: *d = lf_sigmoid(-x); return lf_log_sigmoid(x);
    case F_SIGMOID: *d = lf_sigmoid(x) * lf_sigmoid(-x); return lf_sigmoid(x);
    case F_DPO: return lf_dpo_sigmoid(x, p[0], p[1], d);
    case F_HINGE: return lf_dpo_hinge(x, p[0], d);
    case F_IPO: return lf_dpo_ipo(x, p[0], d);
    case F_SIMPO: return lf_simpo(x, p[0], p[1], d);
    case F_BT: return lf_bt(x, p[1], p[0], d);
    default: return lf_hinge_margin(x, p[1], p[2], p[0], d);
    }
}

/* the scale of z = (product in the function) for the tolerance */
static ld zscale(int f, float x, const float *p)
{
    switch (f) {
    case F_SOFTPLUS: case F_LOGSIG: case F_SIGMOID: return fabsl((ld)x);
    case F_IPO: return fabsl((ld)x) + 0.5L / fabsl((ld)p[0]);
    case F_SIMPO: return fabsl((ld)p[0] * x) + fabsl((ld)p[1]);
    case F_HMARGIN: return fabsl((ld)p[1] * p[0] * x) + fabsl((ld)p[2]);
    default: return fabsl((ld)p[0] * x) + 1.0L;
    }
}

static void check_point(int f, float x, const float *p)
{
    float d, got = lib(f, x, p, &d);
    ld want = naive(f, (ld)x, p), dwant = naive_d(f, (ld)x, p);
    /* the scalar functions of x alone (softplus, log-sigmoid, sigmoid): relative bounds, as the
     * header says (an absolute term of 2^-20 |x| had let a softplus of 0 pass at x = -20, where
     * the true value is 2e-9); the losses with parameters keep the looser form (their naive
     * derivatives cancel in the tails, even in long double) */
    const int plain = f == F_SOFTPLUS || f == F_LOGSIG || f == F_SIGMOID;
    ld zs = zscale(f, x, p), dz = plain ? fabsl(dwant) : fabsl(dwant) + fabsl((ld)p[0]) + 1.0L;
    ld tol = ldexpl(1.0L, -20) * (fabsl(want) + zs * dz) + 1e-37L;
    ld dtol = plain ? ldexpl(1.0L, -20) * fabsl(dwant) * (1.0L + fabsl((ld)x)) + 1e-37L
                    : ldexpl(1.0L, -20) * (fabsl(dwant) + (ld)(fabsf(p[0]) + 1.0f) * (zs + 1.0L) * ldexpl(1.0L, -4)) + 1e-37L;
    int corner = (f == F_HINGE && 1.0L - (ld)p[0] * x == 0) || (f == F_HMARGIN && (ld)p[2] - (ld)p[1] * p[0] * x == 0);
    if (f == F_IPO) dtol = ldexpl(1.0L, -20) * (fabsl(dwant) + zs) + 1e-37L;
    if (fabsl(want) > (ld)FLT_MAX) /* beyond float: the right answer is the infinity */
        CHECK((ld)got == (want > 0 ? (ld)INFINITY : -(ld)INFINITY), "%s(%.9g; %g %g %g) = %.9g want %.12Lg (overflow)",
              fname[f], x, p[0], p[1], p[2], got, want);
    else
        CHECK(fabsl((ld)got - want) <= tol, "%s(%.9g; %g %g %g) = %.9g want %.12Lg (tol %.3Lg)", fname[f], x, p[0], p[1],
              p[2], got, want, tol);
    if (!corner)
        CHECK(fabsl((ld)d - dwant) <= dtol, "%s'(%.9g; %g %g %g) = %.9g want %.12Lg (tol %.3Lg)", fname[f], x, p[0], p[1],
              p[2], d, dwant, dtol);
}

static void test_values(void)
{
    static const float xs[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 1e-7f, 0.5f, -0.5f, 1.0f, -1.0f, 3.0f, -3.0f, 15.0f, -15.0f,
                               20.0f, -20.0f, 40.0f, -40.0f, 88.0f, -88.0f, 89.0f, -89.0f, 104.0f, -104.0f, 200.0f,
                               -200.0f, 1e4f, -1e4f, 3e38f, -3e38f};
    float p[3];
    int f, i, rep;
    for (f = 0; f < NF; ++f)
        for (rep = 0; rep < 60; ++rep) {
            /* parameters: beta / scale in (0.01, 10), eps / target in [0, 1], gamma / margin, y */
            p[0] = (float)exp(log(0.01) + rng_unif() * log(1000.0));
            p[1] = rep % 5 == 0 ? 0.0f : rep % 5 == 1 ? 1.0f : (float)rng_unif();
            p[2] = (float)(2.0 * rng_unif());
            if (f == F_SIMPO) p[1] = (float)(3.0 * rng_unif()); /* gamma */
            if (f == F_HMARGIN) p[1] = rep % 2 ? 1.0f : -1.0f;  /* y */
            for (i = 0; i < (int)(sizeof xs / sizeof xs[0]); ++i) {
                if (fabsf(xs[i]) > 1e30f && (f == F_IPO || f == F_HINGE || f == F_HMARGIN)) continue; /* squares overflow */
                /* a product scale * x beyond float overflows by contract (documented) */
                if ((f == F_DPO || f == F_BT || f == F_SIMPO) && fabs((double)p[0] * xs[i]) > 1e38) continue;
                check_point(f, xs[i], p);
            }
            for (i = 0; i < 40; ++i) check_point(f, (float)(rng_normal() * exp(6.0 * rng_unif())), p);
        }
}

/* the test's own derivatives vs finite differences of its own losses */
static void test_model_fd(void)
{
    float p[3];
    int f, i;
    for (f = 0; f < NF; ++f)
        for (i = 0; i < 200; ++i) {
            ld x = (ld)(rng_normal() * 10.0), h = ldexpl(1.0L, -20) * (1.0L + fabsl(x)), fd, d;
            p[0] = (float)exp(log(0.05) + rng_unif() * log(100.0));
            p[1] = (float)rng_unif();
            p[2] = (float)(2.0 * rng_unif());
            if (f == F_HMARGIN) p[1] = i % 2 ? 1.0f : -1.0f;
            if ((f == F_HINGE && fabsl(1.0L - (ld)p[0] * x) < 2 * h * p[0]) ||
                (f == F_HMARGIN && fabsl((ld)p[2] - (ld)p[1] * p[0] * x) < 2 * h * p[0]))
                continue; /* the corner */
            fd = (naive(f, x + h, p) - naive(f, x - h, p)) / (2.0L * h);
            d = naive_d(f, x, p);
            CHECK(fabsl(fd - d) <= 1e-6L * (1.0L + fabsl(d)), "%s model: d %.12Lg, fd %.12Lg at %.9Lg", fname[f], d, fd, x);
        }
}

static void test_special(void)
{
    float d, p[3] = {0.5f, 0.1f, 1.0f};
    int f;
    for (f = 0; f < NF; ++f) {
        float v = lib(f, NAN, p, &d);
        CHECK(v != v && d != d, "%s(NaN) = %g, d %g: want NaN", fname[f], v, d);
    }
    CHECK(lf_softplus(INFINITY) == INFINITY && lf_softplus(-INFINITY) == 0.0f, "softplus(+-inf)");
    CHECK(lf_log_sigmoid(INFINITY) == 0.0f && lf_log_sigmoid(-INFINITY) == -INFINITY, "log_sigmoid(+-inf)");
    CHECK(lf_sigmoid(INFINITY) == 1.0f && lf_sigmoid(-INFINITY) == 0.0f, "sigmoid(+-inf)");
    /* far in the tails: exact limits, no overflow */
    CHECK(lf_softplus(-200.0f) == 0.0f && lf_softplus(200.0f) == 200.0f, "softplus tails");
    CHECK(lf_dpo_sigmoid(1e4f, 1.0f, 0.0f, &d) == 0.0f && d == 0.0f, "dpo far right: %g", d);
    CHECK(lf_dpo_sigmoid(-1e4f, 1.0f, 0.0f, &d) == 1e4f && d == -1.0f, "dpo far left: %g", d);
    /* label smoothing 1/2: symmetric, minimum at h = 0 with value log 2 */
    CHECK(fabsf(lf_dpo_sigmoid(0.0f, 2.0f, 0.5f, &d) - 0.69314718f) < 1e-7f && d == 0.0f, "cDPO(0), eps 1/2");
    CHECK(lf_dpo_hinge(2.0f, 0.5f, &d) == 0.0f && d == 0.0f, "hinge at the corner: 0, derivative 0");
    CHECK(lf_dpo_ipo(1.0f, 0.5f, &d) == 0.0f && d == 0.0f, "ipo minimum at 1 / (2 beta)");
    CHECK(lf_bt(0.0f, 0.25f, 3.0f, &d) == lf_bt(0.0f, 0.25f, 1.0f, NULL) && fabsf(d - 0.75f) < 1e-7f, "bt at 0");
    CHECK(lf_hinge_margin(1.0f, -1.0f, 0.5f, 2.0f, &d) == 2.5f && d == 2.0f, "hinge margin, y = -1");
}

static void run_all(unsigned long long seed)
{
    g_seed = seed;
    g_rng = seed;
    test_values();
    test_model_fd();
    test_special();
}

int main(int argc, char **argv) { return host_check_main(argc, argv, "test_pairs", 0x9a1f5ull, run_all); }
