/* test_math.c — host tests of the portable math of lossfuse.h against naive double formulas.
 *
 * Build and run:
 *     gcc -std=c99 -O2 -Wall -Wextra -pedantic -Werror -I. tests/test_math.c -o test_math -lm
 *     ./test_math [seed]
 * Every random test runs twice: once with a fixed seed, once with a fresh seed (time(), or
 * argv[1] to reproduce a failure). One line per failed check, then a summary line; exit 0 when
 * every check passed, 1 otherwise.
 *
 * Tolerances (u = 2^-24, the unit roundoff of fp32):
 *   lse      |err| <= u (2|lse| + 8 + N). Recursive fp32 summation of N same-sign terms has
 *            relative error <= (N-1) u (Higham, "Accuracy and Stability of Numerical
 *            Algorithms", 4.2), which is the absolute error of log(s); exp2f/logf add a few u and
 *            m + logf(s) rounds to u|lse|. Observed worst case over many seeds: ~0.1 N u.
 *   entropy  |err| <= u ((N + 8)(1 + A) + 2|H|), A = sum_j p_j (m - x_j) = -u_state/s: H =
 *            log s - u/s, and both sums carry the (N-1)u summation bound; A is the magnitude of
 *            u/s. It is relative to the spread of x about its max, not to |x| (which reaches
 *            1e4), so a form that cancels sum p x against lse (error ~ u |x|) fails it.
 *            Observed worst case: ~0.06 N u (1 + A).
 *   near one-hot entropy (V = 1000, one logit `gap` above the rest, base 0 or +-1e4):
 *            tol_H as above when the max comes first (each tiny term added to s ~ 1 is lost,
 *            an error of up to the whole non-max mass, which tol_H covers); when the max is
 *            pushed last the small terms are summed among themselves first, and the bound is
 *            u (8 + 2H + (V + 8) E), E = 1 - p_max + A the mass outside the max; and the same
 *            row shifted by 1e4 must give the same entropy to 4u (1 + H).
 *   10^5 equal x: |lse - (x + log 1e5)| <= 2 ulp(lse) + 2 ulp(11.6), entropy within 4e-6:
 *            s is an exact integer sum, so only logf and the final add round.
 *   bf16/fp16 conversions, argmax, packed sequences, validation: exact.
 *   softcap: 8u relative (tanhf <= 2 ulp, plus two roundings; observed 4.2u); logit
 *            transform 10u (one more rounding, x * scale); without a cap: bit exact.
 *   transform gradient: u s (8 + 2|x s / c|) vs the analytic double (1 - t^2 cancels near
 *            |t| = 1, and the argument x s / c rounds); vs a central difference of the double
 *            model 1e-5 s more; vs a central difference of the float function with h = c/(16 s)
 *            s/700 + 64 u s + 4 u c / h (truncation h^2 s^3 / (3 c^2) = s / 768).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <math.h>
#include <float.h>

#include "lossfuse.h"

/* ---------------------------------------------------------------------------------------- */
/* Checks, RNG                                                                               */

#include "host_check.h"

static const double U = 1.0 / 16777216.0; /* 2^-24 */

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
/* Distance in ulps between two non-NaN floats (ordered integer representation). */
static int64_t ulp_dist(float a, float b)
{
    int64_t ia = (int32_t)f2u(a), ib = (int32_t)f2u(b);
    if (ia < 0) ia = (int64_t)INT32_MIN - ia;
    if (ib < 0) ib = (int64_t)INT32_MIN - ib;
    return ia > ib ? ia - ib : ib - ia;
}

/* Logit generators. Profiles:
 *   0 unit normal          1 mixture: normals, x8 normals, log-uniform outliers up to +-1e4, small ints
 *   2 profile 1 with 10% -inf (masked)          3 profile 1 sorted ascending (a rescale per push)
 *   4 1e4 + 5 N(0,1) (cancellation)             5 uniform [-100, 100]
 *   6 small integers (many exact ties) */
static float gen_profile_logit(int profile)
{
    double r = rng_unif();
    switch (profile) {
    case 0: return (float)rng_normal();
    case 1:
    case 3:
        if (r < 0.6) return (float)rng_normal();
        if (r < 0.8) return (float)(8.0 * rng_normal());
        if (r < 0.9) return (float)((rng_unif() < 0.5 ? -1.0 : 1.0) * exp(rng_unif() * log(1e4)));
        return (float)floor(3.0 * rng_normal());
    case 2: return r < 0.1 ? -INFINITY : gen_profile_logit(1);
    case 4: return (float)(1e4 + 5.0 * rng_normal());
    case 5: return (float)(200.0 * rng_unif() - 100.0);
    default: return r < 0.1 ? -0.0f : (float)floor(2.0 * rng_normal()); /* ties, signed zeros */
    }
}
static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}
static void gen_vec(float *x, int64_t n, int profile)
{
    int64_t j;
    for (j = 0; j < n; ++j) x[j] = gen_profile_logit(profile);
    if (profile == 3) qsort(x, (size_t)n, sizeof *x, cmp_float);
}

/* ---------------------------------------------------------------------------------------- */
/* Naive references                                                                          */

typedef struct naive_lse {
    double lse, H, A; /* log-sum-exp, entropy, A = sum p (m - x) */
} naive_lse;

static naive_lse naive_lse_of(const float *x, int64_t n)
{
    naive_lse r;
    double m = -INFINITY, s = 0.0;
    int64_t j;
    r.H = NAN;
    r.A = 0.0;
    for (j = 0; j < n; ++j)
        if ((double)x[j] > m) m = x[j];
    if (m == -INFINITY) {
        r.lse = -INFINITY;
        return r;
    }
    for (j = 0; j < n; ++j)
        if (x[j] != -INFINITY) s += exp((double)x[j] - m);
    r.lse = m + log(s);
    r.H = 0.0;
    for (j = 0; j < n; ++j)
        if (x[j] != -INFINITY) {
            double p = exp((double)x[j] - r.lse);
            r.H += p * (r.lse - x[j]);
            r.A += p * (m - x[j]);
        }
    return r;
}
static double tol_lse(int64_t n, double lse) { return U * (2.0 * fabs(lse) + 8.0 + (double)n); }
static double tol_H(int64_t n, double H, double A)
{
    return U * (((double)n + 8.0) * (1.0 + A) + 2.0 * fabs(H));
}

/* Commutativity is checked through volatile function pointers: the merges then run as the one
 * compiled function body, as on a device, instead of letting the optimizer treat fmaxf as
 * commutative and fold merge(a, b) and merge(b, a) into one computation. */
static lf_lse (*volatile p_lse_merge)(lf_lse, lf_lse) = lf_lse_merge;
static lf_argmax (*volatile p_argmax_merge)(lf_argmax, lf_argmax) = lf_argmax_merge;
static lf_row_stats (*volatile p_row_stats_merge)(lf_row_stats, lf_row_stats) = lf_row_stats_merge;

static lf_lse push_all(const float *x, int64_t n)
{
    lf_lse st = lf_lse_init();
    int64_t j;
    for (j = 0; j < n; ++j) lf_lse_push(&st, x[j]);
    return st;
}

/* ---------------------------------------------------------------------------------------- */
/* 1. lse and entropy vs naive double                                                         */

static void test_lse_accuracy(void)
{
    static const int64_t lens[] = {1, 2, 7, 100, 5000};
    float *x = (float *)malloc(5000 * sizeof *x);
    size_t li;
    int profile, rep;
    for (li = 0; li < sizeof lens / sizeof lens[0]; ++li) {
        int64_t n = lens[li];
        int reps = n >= 5000 ? 10 : 40;
        for (profile = 0; profile < 7; ++profile)
            for (rep = 0; rep < reps; ++rep) {
                naive_lse ref;
                lf_lse st;
                float l, H;
                gen_vec(x, n, profile);
                ref = naive_lse_of(x, n);
                st = push_all(x, n);
                l = lf_lse_final(st);
                H = lf_lse_entropy(st);
                if (ref.lse == -INFINITY) {
                    CHECK(l == -INFINITY && isnan(H), "all -inf n=%lld: lse %g H %g", (long long)n,
                          l, H);
                    continue;
                }
                CHECK(fabs(l - ref.lse) <= tol_lse(n, ref.lse),
                      "lse n=%lld profile %d: got %.9g want %.17g (err %.3g tol %.3g)",
                      (long long)n, profile, l, ref.lse, fabs(l - ref.lse), tol_lse(n, ref.lse));
                CHECK(fabs(H - ref.H) <= tol_H(n, ref.H, ref.A),
                      "entropy n=%lld profile %d: got %.9g want %.17g (err %.3g tol %.3g)",
                      (long long)n, profile, H, ref.H, fabs(H - ref.H), tol_H(n, ref.H, ref.A));
            }
    }
    free(x);
}

/* ---------------------------------------------------------------------------------------- */
/* 2. order independence, merge trees, bitwise commutativity                                 */

/* Merge states[0..k) as a random binary tree (random adjacent pairs, random operand order). */
static lf_lse merge_random_tree(lf_lse *st, int k)
{
    while (k > 1) {
        int i = (int)rng_int(k - 1), j;
        st[i] = rng_unif() < 0.5 ? lf_lse_merge(st[i], st[i + 1]) : lf_lse_merge(st[i + 1], st[i]);
        for (j = i + 1; j + 1 < k; ++j) st[j] = st[j + 1];
        --k;
    }
    return st[0];
}

static void test_lse_order_merge(void)
{
    enum { NMAX = 1000, KMAX = 40 };
    float x[NMAX], y[NMAX];
    lf_lse st[KMAX], st2[KMAX];
    int cut[KMAX + 1];
    int rep, i, j;
    for (rep = 0; rep < 60; ++rep) {
        int n = 1 + (int)rng_int(NMAX), profile = rep % 7, k;
        naive_lse ref;
        float results[6];
        double tol;
        lf_lse acc;
        gen_vec(x, n, profile);
        ref = naive_lse_of(x, n);
        tol = tol_lse(n, ref.lse);
        /* push order: forward, reverse, random permutation */
        results[0] = lf_lse_final(push_all(x, n));
        for (i = 0; i < n; ++i) y[i] = x[n - 1 - i];
        results[1] = lf_lse_final(push_all(y, n));
        memcpy(y, x, sizeof(float) * (size_t)n);
        for (i = n - 1; i > 0; --i) {
            int r = (int)rng_int(i + 1);
            float t = y[i];
            y[i] = y[r];
            y[r] = t;
        }
        results[2] = lf_lse_final(push_all(y, n));
        /* random chunks (empty ones allowed), merged left fold, right fold, random tree */
        k = 1 + (int)rng_int(KMAX);
        cut[0] = 0;
        cut[k] = n;
        for (i = 1; i < k; ++i) cut[i] = (int)rng_int(n + 1);
        for (i = 1; i < k; ++i) /* insertion sort of the cuts */
            for (j = i; j > 1 && cut[j - 1] > cut[j]; --j) {
                int t = cut[j];
                cut[j] = cut[j - 1];
                cut[j - 1] = t;
            }
        for (i = 0; i < k; ++i) st[i] = push_all(x + cut[i], cut[i + 1] - cut[i]);
        acc = lf_lse_init();
        for (i = 0; i < k; ++i) acc = lf_lse_merge(acc, st[i]);
        results[3] = lf_lse_final(acc);
        acc = lf_lse_init();
        for (i = k - 1; i >= 0; --i) acc = lf_lse_merge(st[i], acc);
        results[4] = lf_lse_final(acc);
        memcpy(st2, st, sizeof(lf_lse) * (size_t)k);
        results[5] = lf_lse_final(merge_random_tree(st2, k));
        for (i = 0; i < 6; ++i) {
            if (ref.lse == -INFINITY) {
                CHECK(results[i] == -INFINITY, "order variant %d: all -inf gave %g", i, results[i]);
                continue;
            }
            CHECK(fabs(results[i] - ref.lse) <= tol,
                  "order variant %d (n=%d, %d chunks, profile %d): got %.9g want %.17g tol %.3g", i,
                  n, k, profile, results[i], ref.lse, tol);
            CHECK(fabs(results[i] - results[0]) <= 2.0 * tol,
                  "order variant %d vs forward push: %.9g vs %.9g", i, results[i], results[0]);
        }
        /* associativity within tolerance: (a b) c vs a (b c) */
        if (k >= 3) {
            float l1 = lf_lse_final(lf_lse_merge(lf_lse_merge(st[0], st[1]), st[2]));
            float l2 = lf_lse_final(lf_lse_merge(st[0], lf_lse_merge(st[1], st[2])));
            naive_lse r3 = naive_lse_of(x, cut[3]);
            if (r3.lse == -INFINITY)
                CHECK(l1 == -INFINITY && l2 == -INFINITY, "assoc all -inf: %g %g", l1, l2);
            else
                CHECK(fabs(l1 - l2) <= 2.0 * tol_lse(cut[3], r3.lse) &&
                          fabs(l1 - r3.lse) <= tol_lse(cut[3], r3.lse),
                      "associativity: (ab)c %.9g a(bc) %.9g naive %.17g", l1, l2, r3.lse);
        }
        /* commutativity bit for bit, for every pair of chunk states */
        for (i = 0; i < k; ++i)
            for (j = 0; j < k; ++j) {
                lf_lse ab = p_lse_merge(st[i], st[j]), ba = p_lse_merge(st[j], st[i]);
                CHECK(memcmp(&ab, &ba, sizeof ab) == 0,
                      "merge not commutative bitwise: (%a %a %a) vs (%a %a %a)", ab.m, ab.s, ab.u,
                      ba.m, ba.s, ba.u);
            }
    }
    /* hand-made states that stress commutativity: equal maxima, +0 / -0 maxima, empty, -inf */
    {
        static const float vals[][3] = {{0.0f, 0.0f, 0.0f},       {-0.0f, -0.0f, -0.0f},
                                        {0.0f, -1.0f, -2.0f},     {-0.0f, -1.0f, -2.5f},
                                        {1.0f, 1.0f, 1.0f},       {1.0f, 0.5f, -3.0f},
                                        {-INFINITY, -INFINITY, -INFINITY}, {1e4f, -1e4f, 9999.0f},
                                        {-1e30f, -1e30f, -1e30f}, {3.0f, -INFINITY, 3.0f}};
        enum { NV = sizeof vals / sizeof vals[0] };
        lf_lse s[NV + 1];
        int a, b;
        volatile float one = 1.0f; /* runtime values: no constant folding of fmaxf(+0, -0) */
        for (a = 0; a < NV; ++a) {
            float v[3];
            for (b = 0; b < 3; ++b) v[b] = vals[a][b] * one;
            s[a] = push_all(v, 1 + a % 3);
        }
        s[NV] = lf_lse_init();
        for (a = 0; a <= NV; ++a)
            for (b = 0; b <= NV; ++b) {
                lf_lse ab = p_lse_merge(s[a], s[b]), ba = p_lse_merge(s[b], s[a]);
                CHECK(memcmp(&ab, &ba, sizeof ab) == 0,
                      "merge(%d,%d) not commutative bitwise: (%a %a %a) vs (%a %a %a)", a, b, ab.m,
                      ab.s, ab.u, ba.m, ba.s, ba.u);
            }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* 3. special values                                                                          */

static void test_lse_special(void)
{
    lf_lse e = lf_lse_init(), st;
    float x[64], l0, l1;
    int n, i, pos, rep;
    CHECK(lf_lse_final(e) == -INFINITY, "empty lse %g", lf_lse_final(e));
    CHECK(isnan(lf_lse_entropy(e)), "empty entropy %g", lf_lse_entropy(e));
    for (n = 1; n <= 5; n += 4) {
        for (i = 0; i < n; ++i) x[i] = -INFINITY;
        st = push_all(x, n);
        CHECK(lf_lse_final(st) == -INFINITY, "all -inf (n=%d) lse %g", n, lf_lse_final(st));
        CHECK(isnan(lf_lse_entropy(st)), "all -inf (n=%d) entropy %g", n, lf_lse_entropy(st));
        st = lf_lse_merge(st, e);
        CHECK(lf_lse_final(st) == -INFINITY, "all -inf merged with empty: %g", lf_lse_final(st));
    }
    for (rep = 0; rep < 200; ++rep) {
        float y[65];
        lf_lse a, b;
        n = 1 + (int)rng_int(40);
        gen_vec(x, n, rep % 2 ? 1 : 5);
        for (i = 0; i < n; ++i)
            if (x[i] == -INFINITY) x[i] = 0.0f;
        l0 = lf_lse_final(push_all(x, n));
        /* -inf inserted at a random position (first and last included) contributes nothing */
        pos = (int)rng_int(n + 1);
        for (i = 0; i < pos; ++i) y[i] = x[i];
        y[pos] = -INFINITY;
        for (i = pos; i < n; ++i) y[i + 1] = x[i];
        l1 = lf_lse_final(push_all(y, n + 1));
        CHECK(ulp_dist(l0, l1) <= 1, "-inf at %d of %d: %.9g vs without %.9g", pos, n + 1, l1, l0);
        /* merged in: an all -inf state */
        a = push_all(x, n);
        b = lf_lse_init();
        lf_lse_push(&b, -INFINITY);
        l1 = lf_lse_final(lf_lse_merge(b, a));
        CHECK(ulp_dist(l0, l1) <= 1, "merged all -inf state: %.9g vs %.9g", l1, l0);
        /* NaN at a random position (first included), or merged in later, poisons the lse */
        for (i = 0; i < pos; ++i) y[i] = x[i];
        y[pos] = NAN;
        for (i = pos; i < n; ++i) y[i + 1] = x[i];
        st = push_all(y, n + 1);
        CHECK(isnan(lf_lse_final(st)), "NaN at %d of %d: lse %g", pos, n + 1, lf_lse_final(st));
        CHECK(isnan(lf_lse_entropy(st)), "NaN at %d: entropy %g", pos, lf_lse_entropy(st));
        lf_lse_push(&st, 1e4f); /* more values after the NaN, a larger max included */
        lf_lse_push(&st, -INFINITY);
        CHECK(isnan(lf_lse_final(st)), "NaN then 1e4 pushed: lse %g", lf_lse_final(st));
        b = lf_lse_init();
        lf_lse_push(&b, NAN);
        CHECK(isnan(lf_lse_final(lf_lse_merge(a, b))), "NaN state merged: %g",
              lf_lse_final(lf_lse_merge(a, b)));
        CHECK(isnan(lf_lse_final(lf_lse_merge(b, a))), "NaN state merged first: %g",
              lf_lse_final(lf_lse_merge(b, a)));
        CHECK(isnan(lf_lse_final(lf_lse_merge(b, e))), "NaN state merged with empty: %g",
              lf_lse_final(lf_lse_merge(b, e)));
        /* +inf anywhere -> NaN (documented rule), in a push or in a merge */
        y[pos] = INFINITY;
        st = push_all(y, n + 1);
        CHECK(isnan(lf_lse_final(st)), "+inf at %d of %d: lse %g", pos, n + 1, lf_lse_final(st));
        lf_lse_push(&st, 5.0f);
        CHECK(isnan(lf_lse_final(st)), "+inf then 5 pushed: lse %g", lf_lse_final(st));
        b = lf_lse_init();
        lf_lse_push(&b, INFINITY);
        CHECK(isnan(lf_lse_final(lf_lse_merge(a, b))), "+inf state merged: %g",
              lf_lse_final(lf_lse_merge(a, b)));
        CHECK(isnan(lf_lse_final(lf_lse_merge(b, a))), "+inf state merged first: %g",
              lf_lse_final(lf_lse_merge(b, a)));
    }
    /* massless values (lf_massless: x log2 e overflows fp32) count as -inf: a state of only
     * bf16's / fp32's finfo.min is empty (lse -inf, as the kernels' one-FFMA exponent gives),
     * beside a finite value they add exactly 0; fp16's -65504 and NaN are not massless */
    {
        static const float fl[3] = {-3.3895314e38f, -3.402823466e38f, -2.4e38f};
        lf_lse st = lf_lse_init();
        for (i = 0; i < 3; ++i) lf_lse_push(&st, fl[i]);
        CHECK(lf_lse_final(st) == -INFINITY && st.s == 0.0f, "massless state: lse %g s %g", lf_lse_final(st), st.s);
        lf_lse_push(&st, 1.5f);
        lf_lse_push(&st, fl[0]);
        CHECK(lf_lse_final(st) == 1.5f && st.s == 1.0f, "massless beside 1.5: lse %.9g s %.9g", lf_lse_final(st), st.s);
        CHECK(lf_massless(-2.4e38f) && !lf_massless(-2.3e38f) && !lf_massless(-65504.0f) && !lf_massless(NAN) &&
                  lf_massless(-INFINITY) && !lf_massless(INFINITY),
              "lf_massless at -2.4e38 / -2.3e38 / -65504 / NaN / -inf / +inf");
    }
    /* +inf after -inf only, NaN alone, +inf alone, NaN in both halves */
    {
        static const float c1[] = {-INFINITY, INFINITY}, c2[] = {NAN}, c3[] = {INFINITY},
                           c4[] = {INFINITY, INFINITY}, c5[] = {INFINITY, -INFINITY};
        CHECK(isnan(lf_lse_final(push_all(c1, 2))), "[-inf, +inf] lse not NaN");
        CHECK(isnan(lf_lse_final(push_all(c2, 1))), "[NaN] lse not NaN");
        CHECK(isnan(lf_lse_final(push_all(c3, 1))), "[+inf] lse not NaN");
        CHECK(isnan(lf_lse_final(push_all(c4, 2))), "[+inf, +inf] lse not NaN");
        CHECK(isnan(lf_lse_final(push_all(c5, 2))), "[+inf, -inf] lse not NaN");
        CHECK(isnan(lf_lse_final(lf_lse_merge(push_all(c2, 1), push_all(c2, 1)))),
              "NaN merged with NaN not NaN");
    }
}

/* ---------------------------------------------------------------------------------------- */
/* 4. large magnitudes, one-hot entropy, no drift                                             */

static void test_lse_extremes(void)
{
    {
        static const float v[] = {1e4f, 1e4f - 1.0f, -1e4f};
        naive_lse r = naive_lse_of(v, 3);
        lf_lse st = push_all(v, 3);
        double want = 1e4 + log(1.0 + exp(-1.0));
        CHECK(fabs(r.lse - want) < 1e-9, "naive reference itself: %.17g vs %.17g", r.lse, want);
        CHECK(fabs(lf_lse_final(st) - want) <= tol_lse(3, want), "lse[1e4,1e4-1,-1e4] %.9g want %.17g",
              lf_lse_final(st), want);
        CHECK(fabs(lf_lse_entropy(st) - r.H) <= tol_H(3, r.H, r.A),
              "entropy[1e4,1e4-1,-1e4] %.9g want %.17g", lf_lse_entropy(st), r.H);
        st = push_all(v + 2, 1);
        CHECK(lf_lse_final(st) == -1e4f, "lse[-1e4] %.9g", lf_lse_final(st));
    }
    /* near one-hot: one logit d above V-1 equal others, in both the 0 and the 1e4 range. The
     * entropy is tiny; fp32 loses log(s) ~ (V-1)e^-d once it is below u, so the bound is
     * absolute (a few u), plus the tol_H form. */
    {
        static const float gaps[] = {5.0f, 10.0f, 20.0f, 30.0f, 80.0f, 200.0f};
        static const float bases[] = {0.0f, 1e4f, -1e4f, 123.25f};
        float x[1000], y[1000];
        lf_lse st0;
        size_t gi, bi;
        int j, V = 1000;
        for (bi = 0; bi < 4; ++bi)
            for (gi = 0; gi < 6; ++gi) {
                naive_lse r;
                lf_lse st;
                for (j = 0; j < V; ++j) x[j] = bases[bi] - gaps[gi];
                x[V / 3] = bases[bi];
                r = naive_lse_of(x, V);
                st = push_all(x, V);
                CHECK(fabs(lf_lse_entropy(st) - r.H) <= tol_H(V, r.H, r.A),
                      "near one-hot entropy base %g gap %g: got %.9g want %.17g", bases[bi],
                      gaps[gi], lf_lse_entropy(st), r.H);
                /* shift invariance: the same row 1e4 higher or lower gives the same entropy to a
                 * few u (sum p x - lse would lose ~u 1e4 = 6e-4 to cancellation) */
                for (j = 0; j < V; ++j) y[j] = x[j] - bases[bi];
                st0 = push_all(y, V);
                CHECK(fabs(lf_lse_entropy(st) - lf_lse_entropy(st0)) <= 4.0 * U * (1.0 + r.H),
                      "entropy not shift invariant: base %g gap %g: %.9g vs %.9g at base 0",
                      bases[bi], gaps[gi], lf_lse_entropy(st), lf_lse_entropy(st0));
                /* max pushed last: the small terms are summed among themselves first, so the
                 * summation error is relative to their mass E = 1 - p_max + A, not to 1: the
                 * bound is a few u plus (V + 8) u E (the (N-1)u bound applied to that part). */
                for (j = 0; j < V; ++j) y[j] = x[j];
                y[V / 3] = x[V - 1];
                y[V - 1] = x[V / 3];
                st0 = push_all(y, V);
                {
                    double E = 1.0 - exp((double)bases[bi] - r.lse) + r.A;
                    double tol = U * (8.0 + 2.0 * r.H + (V + 8.0) * E);
                    CHECK(fabs(lf_lse_entropy(st0) - r.H) <= tol,
                          "near one-hot, max last: base %g gap %g: got %.9g want %.17g (err %.3g tol %.3g)",
                          bases[bi], gaps[gi], lf_lse_entropy(st0), r.H,
                          fabs(lf_lse_entropy(st0) - r.H), tol);
                }
                CHECK(fabs(lf_lse_final(st) - r.lse) <= tol_lse(V, r.lse),
                      "near one-hot lse base %g gap %g: got %.9g want %.17g", bases[bi], gaps[gi],
                      lf_lse_final(st), r.lse);
                /* exactly one-hot once the others are masked */
                for (j = 0; j < V; ++j) x[j] = (j == V / 2) ? bases[bi] : -INFINITY;
                st = push_all(x, V);
                CHECK(lf_lse_entropy(st) == 0.0f && lf_lse_final(st) == bases[bi],
                      "one-hot base %g: entropy %g lse %.9g", bases[bi], lf_lse_entropy(st),
                      lf_lse_final(st));
            }
    }
    /* finite but huge logits: the lse and the entropy stay finite */
    {
        static const float v[] = {-1e38f, -1e38f, 1e38f, -3e38f, 3e38f, 3e38f};
        lf_lse st = push_all(v, 3);
        CHECK(lf_lse_final(st) == 1e38f && lf_lse_entropy(st) == 0.0f,
              "[-1e38,-1e38,1e38]: lse %g entropy %g (want 1e38, 0)", lf_lse_final(st),
              lf_lse_entropy(st));
        st = lf_lse_merge(push_all(v, 2), push_all(v + 2, 1));
        CHECK(lf_lse_final(st) == 1e38f && lf_lse_entropy(st) == 0.0f,
              "merge [-1e38,-1e38] [1e38]: lse %g entropy %g", lf_lse_final(st), lf_lse_entropy(st));
        st = push_all(v + 3, 3);
        CHECK(lf_lse_final(st) == 3e38f && fabs(lf_lse_entropy(st) - log(2.0)) <= 4.0 * U,
              "[-3e38,3e38,3e38]: lse %g entropy %g (want 3e38, log 2)", lf_lse_final(st),
              lf_lse_entropy(st));
    }
    /* 10^5 equal values: lse = x + log(1e5). exp_diff(x, x) must be exactly 1, else every push
     * rescales the sum by 1 + O(|x| u) and the error grows with the count. The bound is 2 ulp of
     * the result plus 2 ulp of logf(1e5). */
    {
        static const float xs[] = {0.0f, 1.0f, -3.5f, 7.25f, 12345.678f, 1e4f, -1e4f, 1e-3f, 3e4f};
        size_t k;
        for (k = 0; k < sizeof xs / sizeof xs[0]; ++k) {
            lf_lse st = lf_lse_init(), mt = lf_lse_init();
            int i;
            float l, lm, H;
            double want = (double)xs[k] + log(1e5);
            double tol = 2.0 * (nextafterf((float)fabs(want), INFINITY) - (float)fabs(want)) +
                         2.0 * (nextafterf(11.6f, INFINITY) - 11.6f);
            for (i = 0; i < 100000; ++i) {
                lf_lse one = lf_lse_init();
                lf_lse_push(&st, xs[k]);
                lf_lse_push(&one, xs[k]);
                mt = lf_lse_merge(mt, one);
            }
            l = lf_lse_final(st);
            lm = lf_lse_final(mt);
            H = lf_lse_entropy(st);
            CHECK(fabs(l - want) <= tol, "1e5 x %g pushed: lse %.9g want %.17g (err %.3g tol %.3g)",
                  xs[k], l, want, fabs(l - want), tol);
            CHECK(fabs(lm - want) <= tol, "1e5 x %g merged: lse %.9g want %.17g (err %.3g)", xs[k],
                  lm, want, fabs(lm - want));
            CHECK(fabs(H - log(1e5)) <= 4e-6, "1e5 x %g: entropy %.9g want %.9g", xs[k], H,
                  log(1e5));
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* 5. row stats                                                                              */

static void test_row_stats(void)
{
    int rep;
    for (rep = 0; rep < 200; ++rep) {
        float x[300], z[300], w[300];
        int n = 1 + (int)rng_int(300), j, cut = (int)rng_int(n + 1);
        lf_row_stats a = lf_row_stats_init(), b = lf_row_stats_init(), all = lf_row_stats_init(), ab,
                     ba;
        double wz = 0, ws = 0, wzabs = 0;
        naive_lse r;
        gen_vec(x, n, 2);
        for (j = 0; j < n; ++j) {
            z[j] = 0.5f * x[j];
            w[j] = rng_unif() < 0.2 ? 0.0f : (float)(2.0 * rng_unif());
            if (z[j] == -INFINITY) w[j] = rng_unif() < 0.5 ? 0.0f : w[j];
            if (w[j] != 0.0f) {
                wz += (double)w[j] * z[j];
                wzabs += fabs((double)w[j] * z[j]);
            }
            ws += w[j];
            lf_row_stats_push(&all, x[j], z[j], w[j], j);
            lf_row_stats_push(j < cut ? &a : &b, x[j], z[j], w[j], j);
        }
        r = naive_lse_of(z, n);
        ab = p_row_stats_merge(a, b);
        ba = p_row_stats_merge(b, a);
        CHECK(memcmp(&ab, &ba, sizeof ab) == 0, "row_stats merge not commutative bitwise");
        if (isinf(wz))
            CHECK(all.wz == (float)wz && ab.wz == (float)wz, "row_stats wz %g %g want %g", all.wz,
                  ab.wz, wz);
        else
            CHECK(fabs(all.wz - wz) <= U * (n + 2) * wzabs && fabs(ab.wz - wz) <= U * (n + 2) * wzabs,
                  "row_stats wz %.9g / %.9g want %.17g", all.wz, ab.wz, wz);
        CHECK(fabs(all.w - ws) <= U * (n + 2) * ws && fabs(ab.w - ws) <= U * (n + 2) * ws,
              "row_stats w %.9g want %.17g", all.w, ws);
        if (r.lse == -INFINITY)
            CHECK(lf_lse_final(all.lse) == -INFINITY, "row_stats lse %g", lf_lse_final(all.lse));
        else
            CHECK(fabs(lf_lse_final(ab.lse) - r.lse) <= tol_lse(n, r.lse),
                  "row_stats lse %.9g want %.17g", lf_lse_final(ab.lse), r.lse);
        {
            int best = 0;
            for (j = 1; j < n; ++j)
                if (x[j] > x[best]) best = j;
            CHECK(all.am.i == best && ab.am.i == best, "row_stats argmax %d / %d want %d",
                  (int)all.am.i, (int)ab.am.i, best);
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* 6. bf16 / fp16                                                                             */

/* Naive decoders from the format definitions. */
static double naive_bf16_decode(uint16_t h)
{
    int s = h >> 15, E = (h >> 7) & 0xff, M = h & 0x7f;
    double v;
    if (E == 0xff) v = M ? NAN : INFINITY;
    else if (E == 0) v = ldexp((double)M, -133);
    else v = ldexp(1.0 + M / 128.0, E - 127);
    return s ? -v : v;
}
static double naive_f16_decode(uint16_t h)
{
    int s = h >> 15, E = (h >> 10) & 0x1f, M = h & 0x3ff;
    double v;
    if (E == 0x1f) v = M ? NAN : INFINITY;
    else if (E == 0) v = ldexp((double)M, -24);
    else v = ldexp(1.0 + M / 1024.0, E - 15);
    return s ? -v : v;
}
/* Round a finite magnitude a >= 0 to a binary format with p significand bits, smallest normal
 * 2^emin and largest finite maxv: the two neighbours lo = k*spacing and hi, the nearer one,
 * ties to even k; inf when the result exceeds maxv. Everything here is exact in double. */
static double naive_round_mag(double a, int p, int emin, double maxv)
{
    int e;
    double spacing, k, rem, r;
    if (a == 0.0) return 0.0;
    (void)frexp(a, &e);
    e -= 1; /* a in [2^e, 2^(e+1)) */
    if (e < emin) e = emin;
    spacing = ldexp(1.0, e - (p - 1));
    k = floor(a / spacing);
    rem = a - k * spacing;
    if (rem > spacing / 2 || (rem == spacing / 2 && fmod(k, 2.0) != 0.0)) k += 1.0;
    r = k * spacing;
    return r > maxv ? INFINITY : r;
}
static double naive_to_bf16(float f)
{
    double a = fabs((double)f), r;
    if (isnan(f)) return NAN;
    r = isinf(f) ? INFINITY : naive_round_mag(a, 8, -126, ldexp(255.0, 120));
    return signbit(f) ? -r : r;
}
static double naive_to_f16(float f)
{
    double a = fabs((double)f), r;
    if (isnan(f)) return NAN;
    r = isinf(f) ? INFINITY : naive_round_mag(a, 11, -14, 65504.0);
    return signbit(f) ? -r : r;
}
static int same_value(double a, double b)
{
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return a == b && !signbit(a) == !signbit(b);
}

static void check_bf16_round(float f)
{
    uint16_t h = lf_f32_to_bf16(f);
    double got = naive_bf16_decode(h), want = naive_to_bf16(f);
    CHECK(same_value(got, want), "f32_to_bf16(%a = 0x%08lx) = 0x%04x (%.9g), want %.9g", f,
          (unsigned long)f2u(f), h, got, want);
    if (isnan(f)) CHECK(((h >> 15) & 1) == (f2u(f) >> 31), "bf16 NaN sign lost: 0x%04x", h);
}
static void check_f16_round(float f)
{
    uint16_t h = lf_f32_to_f16(f);
    double got = naive_f16_decode(h), want = naive_to_f16(f);
    CHECK(same_value(got, want), "f32_to_f16(%a = %.9g) = 0x%04x (%.9g), want %.9g", f, f, h, got,
          want);
    if (isnan(f)) CHECK(((h >> 15) & 1) == (f2u(f) >> 31), "f16 NaN sign lost: 0x%04x", h);
}

static void test_bf16(int exhaustive)
{
    int i;
    if (exhaustive) {
        uint32_t h;
        long bad_dec = 0, bad_rt = 0;
        for (h = 0; h < 65536u; ++h) {
            float f = lf_bf16_to_f32((uint16_t)h);
            double want = naive_bf16_decode((uint16_t)h);
            uint16_t back = lf_f32_to_bf16(f);
            if (!same_value(f, want)) {
                if (++bad_dec <= 5) CHECK(0, "bf16_to_f32(0x%04x) = %.9g want %.9g", h, f, want);
            }
            if (isnan(want)) {
                if (!(isnan(lf_bf16_to_f32(back)) && (back & 0x8000u) == (h & 0x8000u)))
                    if (++bad_rt <= 5) CHECK(0, "bf16 NaN 0x%04x round trip gave 0x%04x", h, back);
            } else if (back != h) {
                if (++bad_rt <= 5) CHECK(0, "bf16 round trip 0x%04x -> %.9g -> 0x%04x", h, f, back);
            }
        }
        CHECK(bad_dec == 0, "bf16 decode: %ld of 65536 patterns wrong", bad_dec);
        CHECK(bad_rt == 0, "bf16 round trip: %ld of 65536 patterns wrong", bad_rt);
        /* specific cases */
        {
            static const struct {
                uint32_t in;
                uint16_t out;
            } c[] = {
                {0x3f808000u, 0x3f80u}, /* 1 + 2^-8: tie, down to even */
                {0x3f818000u, 0x3f82u}, /* 1 + 3*2^-8: tie, up to even */
                {0xbf808000u, 0xbf80u}, /* negative tie down */
                {0xbf818000u, 0xbf82u}, /* negative tie up */
                {0x3f808001u, 0x3f81u}, /* just above a tie */
                {0x3f817fffu, 0x3f81u}, /* just below a tie */
                {0x7f7fffffu, 0x7f80u}, /* FLT_MAX -> inf */
                {0x7f7f8000u, 0x7f80u}, /* tie between the largest bf16 and 2^128 -> inf */
                {0x7f7f7fffu, 0x7f7fu}, /* just below it: largest finite */
                {0xff7fffffu, 0xff80u}, /* -FLT_MAX -> -inf */
                {0x80000000u, 0x8000u}, /* -0 */
                {0x00000000u, 0x0000u}, /* +0 */
                {0x00000001u, 0x0000u}, /* smallest denormal -> 0 */
                {0x80000001u, 0x8000u}, /* -smallest denormal -> -0 */
                {0x00008000u, 0x0000u}, /* denormal tie -> even (0) */
                {0x00018000u, 0x0002u}, /* denormal tie -> even (2) */
                {0x00008001u, 0x0001u}, /* denormal above the tie */
                {0x007fffffu, 0x0080u}, /* largest denormal -> smallest normal */
                {0x00800000u, 0x0080u}, /* smallest normal */
                {0x7f800000u, 0x7f80u}, /* inf */
                {0xff800000u, 0xff80u}, /* -inf */
            };
            size_t k;
            for (k = 0; k < sizeof c / sizeof c[0]; ++k) {
                uint16_t got = lf_f32_to_bf16(u2f(c[k].in));
                CHECK(got == c[k].out, "f32_to_bf16(0x%08lx) = 0x%04x want 0x%04x",
                      (unsigned long)c[k].in, got, c[k].out);
                check_bf16_round(u2f(c[k].in));
            }
            CHECK(lf_f32_to_bf16(3.4e38f) == 0x7f80u, "3.4e38 -> 0x%04x, want inf 0x7f80",
                  lf_f32_to_bf16(3.4e38f));
            CHECK(lf_f32_to_bf16(-3.4e38f) == 0xff80u, "-3.4e38 -> 0x%04x", lf_f32_to_bf16(-3.4e38f));
            /* NaNs, signalling ones included, stay NaN (never inf) */
            CHECK(isnan(lf_bf16_to_f32(lf_f32_to_bf16(u2f(0x7f800001u)))), "sNaN 0x7f800001 -> 0x%04x",
                  lf_f32_to_bf16(u2f(0x7f800001u)));
            CHECK(isnan(lf_bf16_to_f32(lf_f32_to_bf16(u2f(0xff800001u)))), "sNaN 0xff800001 -> 0x%04x",
                  lf_f32_to_bf16(u2f(0xff800001u)));
            CHECK(isnan(lf_bf16_to_f32(lf_f32_to_bf16(u2f(0x7fffffffu)))), "NaN 0x7fffffff -> 0x%04x",
                  lf_f32_to_bf16(u2f(0x7fffffffu)));
        }
    }
    /* random bit patterns (every exponent, NaN and inf included) */
    for (i = 0; i < 200000; ++i) check_bf16_round(u2f((uint32_t)rng_u64()));
    /* random values of moderate size with outliers */
    for (i = 0; i < 50000; ++i) check_bf16_round(gen_profile_logit(1));
    /* exact ties between neighbouring bf16 values, and one float ulp either side */
    for (i = 0; i < 50000; ++i) {
        uint16_t h = (uint16_t)(rng_u64() & 0x7f7fu), h2;
        float lo, hi, mid;
        if (((h >> 7) & 0xffu) == 0xffu) continue;
        h2 = (uint16_t)(h + 1u);
        if (rng_unif() < 0.5) {
            h |= 0x8000u;
            h2 |= 0x8000u;
        }
        lo = lf_bf16_to_f32(h);
        hi = lf_bf16_to_f32(h2);
        mid = (float)(((double)lo + (double)hi) / 2.0); /* exact: 9 significant bits */
        if (isinf(hi)) continue;
        CHECK((double)mid == ((double)lo + (double)hi) / 2.0, "midpoint not exact");
        check_bf16_round(mid);
        check_bf16_round(nextafterf(mid, INFINITY));
        check_bf16_round(nextafterf(mid, -INFINITY));
    }
}

static void test_f16(int exhaustive)
{
    int i;
    if (exhaustive) {
        uint32_t h;
        long bad_dec = 0, bad_rt = 0;
        for (h = 0; h < 65536u; ++h) {
            float f = lf_f16_to_f32((uint16_t)h);
            double want = naive_f16_decode((uint16_t)h);
            uint16_t back = lf_f32_to_f16(f);
            if (!same_value(f, want)) {
                if (++bad_dec <= 5) CHECK(0, "f16_to_f32(0x%04x) = %.9g want %.9g", h, f, want);
            }
            if (isnan(want)) {
                if (!(isnan(lf_f16_to_f32(back)) && (back & 0x8000u) == (h & 0x8000u)))
                    if (++bad_rt <= 5) CHECK(0, "f16 NaN 0x%04x round trip gave 0x%04x", h, back);
            } else if (back != h) {
                if (++bad_rt <= 5) CHECK(0, "f16 round trip 0x%04x -> %.9g -> 0x%04x", h, f, back);
            }
        }
        CHECK(bad_dec == 0, "f16 decode: %ld of 65536 patterns wrong", bad_dec);
        CHECK(bad_rt == 0, "f16 round trip: %ld of 65536 patterns wrong", bad_rt);
        {
            static const struct {
                float in;
                uint16_t out;
            } c[] = {
                {65504.0f, 0x7bffu},     /* largest finite */
                {65519.99f, 0x7bffu},    /* just below the overflow tie */
                {65520.0f, 0x7c00u},     /* the tie rounds to even = 2^16 = inf */
                {-65520.0f, 0xfc00u},    {1e5f, 0x7c00u},        {3.4e38f, 0x7c00u},
                {1.0f, 0x3c00u},         {1.00048828125f, 0x3c00u}, /* 1 + 2^-11 tie down */
                {1.00146484375f, 0x3c02u},                          /* 1 + 3*2^-11 tie up */
                {5.9604644775390625e-08f, 0x0001u},                 /* 2^-24 smallest subnormal */
                {2.98023223876953125e-08f, 0x0000u},                /* 2^-25 tie -> 0 */
                {8.94069671630859375e-08f, 0x0002u},                /* 3*2^-25 tie -> 2 */
                {6.103515625e-05f, 0x0400u},                        /* 2^-14 smallest normal */
                {6.1005353927612305e-05f, 0x0400u},                 /* 2^-14 - 2^-25 tie -> even */
                {-0.0f, 0x8000u},        {0.0f, 0x0000u},        {1e-10f, 0x0000u},
                {-1e-10f, 0x8000u},      {1e-45f, 0x0000u} /* float denormal */
            };
            size_t k;
            for (k = 0; k < sizeof c / sizeof c[0]; ++k) {
                uint16_t got = lf_f32_to_f16(c[k].in);
                CHECK(got == c[k].out, "f32_to_f16(%.9g) = 0x%04x want 0x%04x", c[k].in, got,
                      c[k].out);
                check_f16_round(c[k].in);
            }
            CHECK(lf_f32_to_f16(INFINITY) == 0x7c00u && lf_f32_to_f16(-INFINITY) == 0xfc00u,
                  "f16 inf: 0x%04x 0x%04x", lf_f32_to_f16(INFINITY), lf_f32_to_f16(-INFINITY));
            CHECK(isnan(lf_f16_to_f32(lf_f32_to_f16(u2f(0x7f800001u)))), "sNaN -> 0x%04x",
                  lf_f32_to_f16(u2f(0x7f800001u)));
            CHECK(isnan(lf_f16_to_f32(lf_f32_to_f16(NAN))), "NaN -> 0x%04x", lf_f32_to_f16(NAN));
        }
    }
    for (i = 0; i < 200000; ++i) check_f16_round(u2f((uint32_t)rng_u64()));
    for (i = 0; i < 50000; ++i) check_f16_round(gen_profile_logit(1));
    /* subnormal range 1e-8 .. 6e-5 and the overflow range 6e4 .. 7e4, both signs */
    for (i = 0; i < 50000; ++i) {
        float sgn = rng_unif() < 0.5 ? -1.0f : 1.0f;
        check_f16_round(sgn * (float)exp(log(1e-8) + rng_unif() * (log(6e-5) - log(1e-8))));
        check_f16_round(sgn * (float)(6e4 + 1e4 * rng_unif()));
    }
    /* exact ties between neighbouring fp16 values (subnormals included), and one ulp either side */
    for (i = 0; i < 50000; ++i) {
        uint16_t h = (uint16_t)(rng_u64() & 0x7bfeu), h2 = (uint16_t)(h + 1u);
        float lo = lf_f16_to_f32(h), hi = lf_f16_to_f32(h2), mid;
        mid = (float)(((double)lo + (double)hi) / 2.0);
        CHECK((double)mid == ((double)lo + (double)hi) / 2.0, "f16 midpoint not exact");
        if (rng_unif() < 0.5) mid = -mid;
        check_f16_round(mid);
        check_f16_round(nextafterf(mid, INFINITY));
        check_f16_round(nextafterf(mid, -INFINITY));
    }
}

/* ---------------------------------------------------------------------------------------- */
/* 7. argmax                                                                                  */

static int naive_argmax(const float *x, int n)
{
    int best = -1, j;
    for (j = 0; j < n; ++j) {
        if (best < 0) best = j;
        else if (isnan(x[j])) {
            if (!isnan(x[best])) best = j;
        } else if (!isnan(x[best]) && x[j] > x[best])
            best = j;
    }
    return best;
}

static void test_argmax(void)
{
    int rep;
    {
        lf_argmax a = lf_argmax_init(), b;
        static const float z[] = {-0.0f, 0.0f}, t[] = {2.0f, 5.0f, 5.0f, NAN, 7.0f, NAN};
        CHECK(a.i == -1, "empty argmax index %d", (int)a.i);
        b = lf_argmax_init();
        lf_argmax_push(&b, -INFINITY, 3);
        CHECK(lf_argmax_merge(a, b).i == 3 && lf_argmax_merge(b, a).i == 3,
              "empty merged with [-inf at 3]");
        CHECK(naive_argmax(z, 2) == 0, "naive argmax of [-0, +0]");
        a = lf_argmax_init();
        lf_argmax_push(&a, z[0], 0);
        lf_argmax_push(&a, z[1], 1);
        CHECK(a.i == 0, "argmax [-0, +0] = %d, want 0 (equal values)", (int)a.i);
        a = lf_argmax_init();
        lf_argmax_push(&a, t[5], 5); /* pushed out of order */
        lf_argmax_push(&a, t[1], 1);
        lf_argmax_push(&a, t[3], 3);
        lf_argmax_push(&a, t[2], 2);
        CHECK(a.i == 3 && isnan(a.v), "first NaN should win: %d", (int)a.i);
    }
    for (rep = 0; rep < 3000; ++rep) {
        float x[64];
        int n = 1 + (int)rng_int(64), j, perm[64], k, cuts[9];
        lf_argmax a = lf_argmax_init(), parts[8], acc;
        int want;
        for (j = 0; j < n; ++j) {
            double r = rng_unif();
            x[j] = r < 0.04 ? NAN
                 : r < 0.08 ? -INFINITY
                 : r < 0.10 ? INFINITY
                 : r < 0.15 ? (rng_unif() < 0.5 ? -0.0f : 0.0f)
                 : r < 0.7  ? (float)rng_int(5)
                            : gen_profile_logit(1);
        }
        if (rep % 3 == 0) /* NaN-free rows too */
            for (j = 0; j < n; ++j)
                if (isnan(x[j])) x[j] = 4.0f;
        want = naive_argmax(x, n);
        for (j = 0; j < n; ++j) lf_argmax_push(&a, x[j], j);
        CHECK(a.i == want, "argmax in order = %d want %d (n=%d)", (int)a.i, want, n);
        /* any push order gives the same result: ties are broken by index, not by arrival */
        for (j = 0; j < n; ++j) perm[j] = j;
        for (j = n - 1; j > 0; --j) {
            int r = (int)rng_int(j + 1), t = perm[j];
            perm[j] = perm[r];
            perm[r] = t;
        }
        a = lf_argmax_init();
        for (j = 0; j < n; ++j) lf_argmax_push(&a, x[perm[j]], perm[j]);
        CHECK(a.i == want, "argmax shuffled = %d want %d", (int)a.i, want);
        /* random partition of the permuted indices, merged in both orders */
        k = 1 + (int)rng_int(8);
        cuts[0] = 0;
        cuts[k] = n;
        for (j = 1; j < k; ++j) cuts[j] = cuts[j - 1] + (int)rng_int(n - cuts[j - 1] + 1);
        for (j = 0; j < k; ++j) {
            int t;
            parts[j] = lf_argmax_init();
            for (t = cuts[j]; t < cuts[j + 1]; ++t) lf_argmax_push(&parts[j], x[perm[t]], perm[t]);
        }
        acc = lf_argmax_init();
        for (j = 0; j < k; ++j) acc = lf_argmax_merge(acc, parts[j]);
        CHECK(acc.i == want, "argmax merged forward = %d want %d", (int)acc.i, want);
        acc = lf_argmax_init();
        for (j = k - 1; j >= 0; --j) acc = lf_argmax_merge(parts[j], acc);
        CHECK(acc.i == want, "argmax merged backward = %d want %d", (int)acc.i, want);
        for (j = 0; j + 1 < k; ++j) {
            lf_argmax ab = p_argmax_merge(parts[j], parts[j + 1]),
                      ba = p_argmax_merge(parts[j + 1], parts[j]);
            CHECK(memcmp(&ab, &ba, sizeof ab) == 0, "argmax merge not commutative: %d vs %d",
                  (int)ab.i, (int)ba.i);
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* 8. logit transform                                                                         */

static void test_xform(void)
{
    static const float caps[] = {1.0f, 5.0f, 30.0f, 50.0f};
    static const float scales[] = {1.0f, 0.5f, 2.0f, 1.4285715f, 0.1f};
    size_t ci, si;
    int i;
    for (ci = 0; ci < 4; ++ci) {
        float c = caps[ci];
        CHECK(lf_softcap(-INFINITY, c) == -INFINITY, "softcap(-inf, %g) = %g", c,
              lf_softcap(-INFINITY, c));
        CHECK(isnan(lf_softcap(INFINITY, c)), "softcap(+inf, %g) = %g", c, lf_softcap(INFINITY, c));
        CHECK(isnan(lf_softcap(NAN, c)), "softcap(NaN, %g) = %g", c, lf_softcap(NAN, c));
        for (i = 0; i < 20000; ++i) {
            float y = i % 2 ? gen_profile_logit(1) : (float)(c * 4.0 * rng_normal());
            double want = (double)c * tanh((double)y / c), got = lf_softcap(y, c);
            /* tanhf <= 2 ulp (<= 4u relative), y/c and c*t one rounding each: 8u relative
             * (observed max 4.2u) */
            CHECK(fabs(got - want) <= 8.0 * U * fabs(want) + 1e-40, "softcap(%.9g, %g) = %.9g want %.17g",
                  y, c, got, want);
            CHECK(fabs(got) <= c, "softcap(%.9g, %g) = %.9g exceeds the cap", y, c, got);
        }
    }
    for (si = 0; si < 5; ++si)
        for (ci = 0; ci < 5; ++ci) {
            float s = scales[si], c = ci < 4 ? caps[ci] : 0.0f;
            CHECK(lf_logit_xform(-INFINITY, s, c) == -INFINITY, "xform(-inf, %g, %g) = %g", s, c,
                  lf_logit_xform(-INFINITY, s, c));
            CHECK(c > 0.0f ? isnan(lf_logit_xform(INFINITY, s, c))
                           : lf_logit_xform(INFINITY, s, c) == INFINITY,
                  "xform(+inf, %g, %g) = %g", s, c, lf_logit_xform(INFINITY, s, c));
            CHECK(isnan(lf_logit_xform(NAN, s, c)), "xform(NaN) not NaN");
            if (c > 0.0f) {
                CHECK(lf_logit_xform_grad(-INFINITY, s, c) == 0.0f, "xform_grad(-inf, %g, %g) = %g",
                      s, c, lf_logit_xform_grad(-INFINITY, s, c));
                CHECK(isnan(lf_logit_xform_grad(NAN, s, c)), "xform_grad(NaN) not NaN");
            }
            for (i = 0; i < 5000; ++i) {
                float x = i % 2 ? gen_profile_logit(1) : (float)((c > 0 ? c : 10.0f) * 3.0 * rng_normal() / s);
                double y = (double)x * s, z, g, zg = lf_logit_xform(x, s, c),
                       gg = lf_logit_xform_grad(x, s, c);
                if (c > 0.0f) {
                    double t = tanh(y / c), h = 1e-6 * (1.0 + fabs(x)), fd;
                    z = c * tanh(y / c);
                    g = s * (1.0 - t * t);
                    CHECK(fabs(zg - z) <= 10.0 * U * fabs(z) + 1e-40, /* softcap's 8u + x*s */ "xform(%.9g, %g, %g) = %.9g want %.17g",
                          x, s, c, zg, z);
                    /* float grad vs the analytic derivative: t has ~3u error, 1 - t^2 loses it
                     * absolutely (cancellation near |t| = 1), and x*s/c rounds (|arg| u). */
                    CHECK(fabs(gg - g) <= U * s * (8.0 + 2.0 * fabs(y / c)),
                          "xform_grad(%.9g, %g, %g) = %.9g want %.17g", x, s, c, gg, g);
                    /* the analytic derivative vs a central difference of the double model:
                     * truncation ~h^2 s^3/c^2, rounding ~1e-16 c/h */
                    fd = (c * tanh((x + h) * (double)s / c) - c * tanh((x - h) * (double)s / c)) /
                         (2.0 * h);
                    CHECK(fabs(fd - gg) <= 1e-5 * s + U * s * (8.0 + 2.0 * fabs(y / c)),
                          "xform_grad(%.9g, %g, %g) = %.9g, central difference %.17g", x, s, c, gg, fd);
                    /* and vs a central difference of the float function itself, h = c/(16 s):
                     * truncation <= h^2 s^3 / (3 c^2) = s / 768, rounding <= 8 u c / (2h) */
                    if (i < 1000) {
                        float hf = c / (16.0f * s), xp = x + hf, xm = x - hf;
                        double fdf = ((double)lf_logit_xform(xp, s, c) - lf_logit_xform(xm, s, c)) /
                                     ((double)xp - (double)xm);
                        if (xp != xm && isfinite(fdf))
                            CHECK(fabs(fdf - gg) <= s / 700.0 + 64.0 * U * s + 4.0 * U * c / hf,
                                  "xform_grad(%.9g, %g, %g) = %.9g, float central difference %.9g",
                                  x, s, c, gg, fdf);
                    }
                } else {
                    /* without the cap: the correctly rounded product, and the constant scale */
                    CHECK(zg == (double)(float)y, "xform(%.9g, %g) = %.9g want %.9g", x, s, zg,
                          (double)(float)y);
                    CHECK(gg == s, "xform_grad(%.9g, %g) = %.9g want %g", x, s, gg, s);
                }
            }
        }
}

/* ---------------------------------------------------------------------------------------- */
/* 9. packed sequences                                                                        */

static void check_packed(const int32_t *cu, int nseq, const int64_t *ids, int64_t ignore)
{
    int total = cu[nseq], k;
    int64_t t;
    int64_t *want_seq = (int64_t *)malloc(sizeof(int64_t) * (size_t)(total + 1));
    int64_t *want_lab = (int64_t *)malloc(sizeof(int64_t) * (size_t)(total + 1));
    /* brute force: walk each sequence's tokens */
    for (k = 0; k < nseq; ++k)
        for (t = cu[k]; t < cu[k + 1]; ++t) {
            want_seq[t] = k;
            want_lab[t] = (t + 1 < cu[k + 1]) ? ids[t + 1] : ignore;
        }
    for (t = -3; t < total + 3; ++t) {
        int64_t s = lf_seq_find(cu, nseq, t), l = lf_packed_next_label(cu, nseq, ids, t, ignore);
        int64_t ws = (t >= 0 && t < total) ? want_seq[t] : -1;
        int64_t wl = (t >= 0 && t < total) ? want_lab[t] : ignore;
        CHECK(s == ws, "seq_find(t=%lld) = %lld want %lld (nseq %d, total %d)", (long long)t,
              (long long)s, (long long)ws, nseq, total);
        CHECK(l == wl, "packed_next_label(t=%lld) = %lld want %lld", (long long)t, (long long)l,
              (long long)wl);
    }
    free(want_seq);
    free(want_lab);
}

static void test_packed(void)
{
    int rep;
    {
        static const int32_t cu[] = {0, 0, 3, 3, 4, 9};
        static const int64_t ids[] = {10, 11, 12, 13, 14, 15, 16, 17, 18};
        static const int64_t want_seq[] = {1, 1, 1, 3, 4, 4, 4, 4, 4};
        static const int64_t want_lab[] = {11, 12, -100, -100, 15, 16, 17, 18, -100};
        int t;
        for (t = 0; t < 9; ++t) {
            CHECK(lf_seq_find(cu, 5, t) == want_seq[t], "cu {0,0,3,3,4,9}: seq_find(%d) = %lld want %lld",
                  t, (long long)lf_seq_find(cu, 5, t), (long long)want_seq[t]);
            CHECK(lf_packed_next_label(cu, 5, ids, t, -100) == want_lab[t],
                  "cu {0,0,3,3,4,9}: label(%d) = %lld want %lld", t,
                  (long long)lf_packed_next_label(cu, 5, ids, t, -100), (long long)want_lab[t]);
        }
        CHECK(lf_seq_find(cu, 5, 9) == -1 && lf_seq_find(cu, 5, -1) == -1, "out of range not -1");
        CHECK(lf_packed_next_label(cu, 5, ids, 9, -7) == -7, "label past the end not ignore");
        CHECK(lf_seq_find(cu, 0, 0) == -1, "nseq 0 should find nothing");
        check_packed(cu, 5, ids, -100);
    }
    for (rep = 0; rep < 300; ++rep) {
        int32_t cu[41];
        int64_t ids[2000];
        int nseq = (int)rng_int(41), k, i;
        cu[0] = 0;
        for (k = 1; k <= nseq; ++k) {
            double r = rng_unif();
            cu[k] = cu[k - 1] + (r < 0.25 ? 0 : r < 0.45 ? 1 : (int)rng_int(48));
        }
        for (i = 0; i < cu[nseq]; ++i) ids[i] = (int64_t)rng_int(50000) + (rep % 2 ? (int64_t)1 << 35 : 0);
        check_packed(cu, nseq, ids, rep % 3 ? -100 : 7);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* 10. validation                                                                             */

static void test_validation(void)
{
    int rep;
    {
        int64_t nb = 99, fb = 99;
        int32_t l32[] = {0, 1, -100};
        CHECK(lf_check_labels(l32, 0, 3, 2, -100, &nb, &fb) == LF_OK && nb == 0 && fb == -1,
              "good int32 labels: nb %lld fb %lld", (long long)nb, (long long)fb);
        CHECK(lf_check_labels(NULL, 0, 0, 2, -100, &nb, &fb) == LF_OK && nb == 0,
              "n = 0 with NULL labels should be ok");
        CHECK(lf_check_labels(NULL, 1, 3, 2, -100, &nb, &fb) == LF_ERR_NULL, "NULL labels");
        CHECK(lf_check_labels(l32, 0, -1, 2, -100, &nb, &fb) == LF_ERR_SIZE, "n < 0");
        CHECK(lf_check_labels(l32, 0, 3, -1, -100, &nb, &fb) == LF_ERR_SIZE, "V < 0");
        CHECK(lf_check_labels(l32, 0, 3, 0, -100, &nb, &fb) == LF_ERR_LABEL && nb == 2 && fb == 0,
              "V = 0: nb %lld fb %lld", (long long)nb, (long long)fb);
        CHECK(lf_check_labels(l32, 0, 3, 2, -100, NULL, NULL) == LF_OK, "NULL outputs");
    }
    for (rep = 0; rep < 400; ++rep) {
        int32_t l32[500];
        int64_t l64[500], V = 1 + rng_int(1000), ignore = rep % 4 ? -100 : (rep % 8 ? V - 1 : 0);
        int n = (int)rng_int(500), i, nbad = 0, first = -1;
        int64_t nb, fb;
        lf_status want, got;
        for (i = 0; i < n; ++i) {
            double r = rng_unif();
            int64_t y;
            if (r < 0.1) y = ignore;
            else if (r < 0.12) {
                static const int64_t bads[] = {-1, -2, -101, INT32_MIN};
                y = rng_unif() < 0.5 ? V + rng_int(3) : bads[rng_int(4)];
                if (y == ignore) y = -99999;
                if (first < 0) first = i;
                ++nbad;
            } else
                y = rng_int(V);
            l32[i] = (int32_t)y;
            l64[i] = y;
        }
        want = nbad ? LF_ERR_LABEL : LF_OK;
        got = lf_check_labels(l32, 0, n, V, ignore, &nb, &fb);
        CHECK(got == want && nb == nbad && fb == first, "int32 labels: status %d nb %lld fb %lld, want %d %d %d",
              (int)got, (long long)nb, (long long)fb, (int)want, nbad, first);
        /* int64: values beyond 32 bits must not be truncated into range */
        if (n > 0 && rep % 2) {
            int p = (int)rng_int(n);
            if (l64[p] >= 0 && l64[p] < V && l64[p] != ignore) {
                l64[p] += (int64_t)1 << 32;
                ++nbad;
                if (first < 0 || p < first) first = p;
            }
        }
        want = nbad ? LF_ERR_LABEL : LF_OK;
        got = lf_check_labels(l64, 1, n, V, ignore, &nb, &fb);
        CHECK(got == want && nb == nbad && fb == first, "int64 labels: status %d nb %lld fb %lld, want %d %d %d",
              (int)got, (long long)nb, (long long)fb, (int)want, nbad, first);
    }
    {
        static const int32_t good[] = {0, 0, 3, 3, 4, 9}, nz[] = {1, 3, 9}, dec[] = {0, 5, 4, 9},
                             one[] = {0};
        CHECK(lf_check_cu_seqlens(good, 5, 9) == LF_OK, "good cu_seqlens rejected");
        CHECK(lf_check_cu_seqlens(good, 5, 8) == LF_ERR_SEQLENS, "wrong total (8) accepted");
        CHECK(lf_check_cu_seqlens(good, 5, 10) == LF_ERR_SEQLENS, "wrong total (10) accepted");
        CHECK(lf_check_cu_seqlens(good, 4, 4) == LF_OK, "prefix with its total rejected");
        CHECK(lf_check_cu_seqlens(nz, 2, 9) == LF_ERR_SEQLENS, "not starting at 0 accepted");
        CHECK(lf_check_cu_seqlens(dec, 3, 9) == LF_ERR_SEQLENS, "decreasing accepted");
        CHECK(lf_check_cu_seqlens(one, 0, 0) == LF_OK, "nseq 0 total 0 rejected");
        CHECK(lf_check_cu_seqlens(one, 0, 1) == LF_ERR_SEQLENS, "nseq 0 total 1 accepted");
        CHECK(lf_check_cu_seqlens(NULL, 2, 9) == LF_ERR_NULL, "NULL cu_seqlens");
        CHECK(lf_check_cu_seqlens(good, -1, 9) == LF_ERR_SIZE, "nseq < 0");
        CHECK(lf_check_cu_seqlens(good, 5, -1) == LF_ERR_SIZE, "total < 0");
    }
    {
        lf_ce_opts o = lf_ce_opts_default(), b;
        static const float wts[] = {1.0f, 2.0f};
        CHECK(o.ignore_index == -100 && o.label_smoothing == 0.0f && o.z_loss == 0.0f &&
                  o.softcap == 0.0f && o.logit_scale == 1.0f && o.class_weights == NULL,
              "lf_ce_opts_default values");
        CHECK(lf_check_ce_opts(&o) == LF_OK, "default opts rejected");
        CHECK(lf_check_ce_opts(NULL) == LF_ERR_NULL, "NULL opts");
        b = o;
        b.label_smoothing = 1.0f;
        b.z_loss = 1e-4f;
        b.softcap = 30.0f;
        b.logit_scale = 0.5f;
        b.class_weights = wts;
        CHECK(lf_check_ce_opts(&b) == LF_OK, "valid non-default opts rejected");
#define BAD_OPT(field, value)                                                                   \
    do {                                                                                        \
        b = o;                                                                                  \
        b.field = (value);                                                                      \
        CHECK(lf_check_ce_opts(&b) == LF_ERR_ARG, #field " = " #value " accepted");            \
    } while (0)
        BAD_OPT(label_smoothing, -0.1f);
        BAD_OPT(label_smoothing, 1.01f);
        BAD_OPT(label_smoothing, NAN);
        BAD_OPT(label_smoothing, INFINITY);
        BAD_OPT(z_loss, -1e-4f);
        BAD_OPT(z_loss, NAN);
        BAD_OPT(softcap, -1.0f);
        BAD_OPT(softcap, NAN);
        BAD_OPT(softcap, INFINITY);
        BAD_OPT(logit_scale, 0.0f);
        BAD_OPT(logit_scale, -1.0f);
        BAD_OPT(logit_scale, NAN);
        BAD_OPT(logit_scale, INFINITY);
#undef BAD_OPT
    }
}

/* ---------------------------------------------------------------------------------------- */

/* lf_xsum: the same buckets and value in any order and any split into merged parts; the value
 * within 1e-15 of the sum of magnitudes of a compensated long double sum; exact cases a double
 * running sum gets wrong; the NaN / inf rules. */
static void test_xsum(void)
{
    enum { N = 2000 };
    float v[N];
    for (int trial = 0; trial < 20; ++trial) {
        /* losses as a kernel makes them: mostly 0.1..20, some tiny, some huge, subnormals, zeros,
         * negative values (a signed upstream gradient) */
        for (int i = 0; i < N; ++i) {
            const double r = rng_unif();
            double x = exp(rng_normal() * 2.0);
            if (r < 0.02) x = ldexp(rng_unif(), -140); /* subnormal or near */
            else if (r < 0.04) x = ldexp(1.0 + rng_unif(), (int)rng_int(120) - 60);
            else if (r < 0.05) x = 0.0;
            else if (r < 0.06) x = 3e37 * rng_unif();
            if (trial % 2 && rng_unif() < 0.3) x = -x;
            v[i] = (float)x;
        }
        lf_xsum a, b, c;
        lf_xsum_init(&a);
        for (int i = 0; i < N; ++i) lf_xsum_add(&a, v[i]);
        lf_xsum_init(&b); /* reverse order */
        for (int i = N - 1; i >= 0; --i) lf_xsum_add(&b, v[i]);
        lf_xsum_init(&c); /* a random permutation, added in 7 parts merged in another order */
        int perm[N];
        for (int i = 0; i < N; ++i) perm[i] = i;
        for (int i = N - 1; i > 0; --i) {
            const int j = (int)rng_int(i + 1), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        lf_xsum part[7];
        for (int k = 0; k < 7; ++k) lf_xsum_init(&part[k]);
        for (int i = 0; i < N; ++i) lf_xsum_add(&part[(i * 7) / N], v[perm[i]]);
        for (int k = 6; k >= 0; --k) lf_xsum_merge(&c, &part[(k * 3) % 7]);
        CHECK(memcmp(&a, &b, sizeof a) == 0 && memcmp(&a, &c, sizeof a) == 0, "xsum: buckets depend on the order (trial %d)", trial);
        const double va = lf_xsum_value(&a), vb = lf_xsum_value(&b), vc = lf_xsum_value(&c);
        CHECK(memcmp(&va, &vb, sizeof va) == 0 && memcmp(&va, &vc, sizeof va) == 0, "xsum: value depends on the order");
        /* accuracy: a long double compensated sum (Kahan in long double) as the reference */
        long double s = 0.0L, comp = 0.0L, mag = 0.0L;
        for (int i = 0; i < N; ++i) {
            const long double y = (long double)v[i] - comp, t = s + y;
            comp = (t - s) - y;
            s = t;
            mag += fabsl((long double)v[i]);
        }
        CHECK(fabsl((long double)va - s) <= 1e-15L * mag, "xsum: %.17g vs %.17Lg (sum of |v| %.3Lg)", va, s, mag);
    }
    /* exact small cases: 2^-149 (the smallest subnormal) + 1 - 1 == 2^-149 exactly; 1e30 + 1 -
     * 1e30 == 1 (a double sum in this order gives 0) */
    {
        lf_xsum s;
        lf_xsum_init(&s);
        lf_xsum_add(&s, ldexpf(1.0f, -149));
        lf_xsum_add(&s, 1.0f);
        lf_xsum_add(&s, -1.0f);
        CHECK(lf_xsum_value(&s) == ldexp(1.0, -149), "xsum: smallest subnormal lost");
        lf_xsum_init(&s);
        lf_xsum_add(&s, 1e30f);
        lf_xsum_add(&s, 1.0f);
        lf_xsum_add(&s, -1e30f);
        CHECK(lf_xsum_value(&s) == 1.0, "xsum: 1e30 + 1 - 1e30 = %.17g, want 1", lf_xsum_value(&s));
        lf_xsum_init(&s);
        CHECK(lf_xsum_value(&s) == 0.0, "xsum: empty sum");
        lf_xsum_add(&s, FLT_MAX);
        lf_xsum_add(&s, FLT_MAX);
        CHECK(lf_xsum_value(&s) == 2.0 * (double)FLT_MAX, "xsum: 2 FLT_MAX (the double holds it)");
        lf_xsum_add(&s, INFINITY);
        CHECK(lf_xsum_value(&s) == INFINITY, "xsum: +inf");
        lf_xsum_add(&s, -INFINITY);
        CHECK(isnan(lf_xsum_value(&s)), "xsum: +inf + -inf is NaN");
        lf_xsum_init(&s);
        lf_xsum_add(&s, -INFINITY);
        lf_xsum_add(&s, 5.0f);
        CHECK(lf_xsum_value(&s) == -INFINITY, "xsum: -inf");
        lf_xsum_add(&s, NAN);
        CHECK(isnan(lf_xsum_value(&s)), "xsum: NaN");
    }
}

static void run_all(unsigned long long seed, int exhaustive)
{
    g_seed = seed;
    g_rng = seed;
    test_lse_accuracy();
    test_lse_order_merge();
    test_xsum();
    test_lse_special();
    if (exhaustive) test_lse_extremes();
    test_row_stats();
    test_bf16(exhaustive);
    test_f16(exhaustive);
    test_argmax();
    test_xform();
    test_packed();
    if (exhaustive) test_validation();
}

int main(int argc, char **argv)
{
    const unsigned long long fixed = 0x5eed1234abcdull;
    unsigned long long seed = argc > 1 ? strtoull(argv[1], NULL, 0) : (unsigned long long)time(NULL);
    printf("test_math: seeds %llu (fixed) and %llu (this run; pass it as argv[1] to reproduce)\n",
           fixed, seed);
    run_all(fixed, 1);
    run_all(seed, 0);
    printf("test_math: %ld checks, %ld failed\n", g_checks, g_failed);
    return g_failed ? 1 : 0;
}
