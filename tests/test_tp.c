/* test_tp.c — host tests of lossfuse.h section 11: the cross-entropy of a row whose vocabulary
 * is split over P ranks, from 12-byte per-rank shares merged in rank order.
 *
 * Build and run:
 *     gcc -std=c99 -O2 -Wall -Wextra -pedantic -Werror -I. tests/test_tp.c -o test_tp -lm
 *     ./test_tp [seed]
 * For P in {1, 2, 3, 4, 8} (more ranks than columns included: empty shards), V from 1 to 4099,
 * rows with outliers up to 1e4 and -inf columns, labels in any shard, ignored and bad labels
 * (made, then skipped: section 11 has no rule for them, the caller zeroes those rows; the GPU
 * tests check them),
 * label smoothing, z-loss, class weights, softcap and logit scale: the shards are accumulated
 * in float (lf_tp_acc_push, what a device kernel does per column), their shares all-gathered
 * into [P][N] and merged (lf_tp_merge), and the loss (lf_tp_loss) and every gradient element
 * (lf_tp_grad_coef) are compared with the unsharded double reference lf_ref_ce_row. Plus a row
 * whose label is its maximum at |z| ~ 1e4: the loss must be exact to a few ulp of the loss
 * itself (what the max-relative t buys), and the edge rules of the shares.
 * Tolerances (float arithmetic against double): z is a float (scale, tanhf and cap each round:
 * ~2^-21.5 |z|); a shard's s is a sequential float sum of at most n terms in [0, 1], s >= 1
 * after the merge's largest term, so log S is off by at most (n + P) 2^-24 plus the shift's
 * error; lse = M + log S rounds once more: 2^-21 (|lse| + 1) + n 2^-24 in all. The loss terms:
 * A log S (A's few roundings), T = sum of P moved shares, each a difference of float z's
 * (2^-21 of |m| + |z| per unit of A) and the smoothing sums (2^-22 n sum |w z| eps / V), and
 * lam lse^2 (2 lam |lse| times the lse error). A gradient element: p_j times the lse error plus
 * 2^-21 of its terms, and under a softcap 2^-21 scale |g_z| more: dz/dx = scale (1 - tanh^2) is
 * formed in float from a tanh within a few ulps of +-1 where the cap saturates.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lossfuse.h"

#include "host_check.h"

#define MAXV 4099
#define ROWS 6

static float xs[ROWS][MAXV], cw[MAXV];

static int close_or_nan(double got, double want, double tol)
{
    if (want != want) return got != got;
    if (want == INFINITY || want == -INFINITY) return got == want;
    return fabs(got - want) <= tol;
}

static double zmax_finite(const float *x, int64_t V, const lf_ce_opts *o)
{
    double L = 0.0;
    int64_t j;
    for (j = 0; j < V; ++j) {
        const double z = lf_logit_xform(x[j], o->logit_scale, o->softcap);
        if (z > -INFINITY && z < INFINITY && fabs(z) > L) L = fabs(z);
    }
    return L;
}

/* The shares of rows xs[0 .. ROWS) on each of P ranks, as the all-gather leaves them:
 * g[r * ROWS + i]; Wr[r]: the per-shard weight sums (what every rank computes once). */
static void make_shares(int P, int64_t V, const lf_ce_opts *o, const int64_t *labels, lf_tp_share *g, float *Wr)
{
    const int smoothing = o->label_smoothing > 0.0f;
    int64_t i, j;
    int r;
    for (r = 0; r < P; ++r) {
        int64_t v0, v1;
        lf_tp_shard(V, P, r, &v0, &v1);
        Wr[r] = 0.0f;
        for (j = v0; j < v1; ++j) Wr[r] += o->class_weights ? o->class_weights[j] : 1.0f;
        for (i = 0; i < ROWS; ++i) {
            lf_tp_acc acc = lf_tp_acc_init();
            const int64_t y = labels[i];
            const float wy = (o->class_weights && y >= 0 && y < V) ? o->class_weights[y] : 1.0f;
            for (j = v0; j < v1; ++j) {
                const float z = lf_logit_xform(xs[i][j], o->logit_scale, o->softcap);
                lf_tp_acc_push(&acc, z, o->class_weights ? o->class_weights[j] : 1.0f, j == y, smoothing);
            }
            g[r * ROWS + i] = lf_tp_share_make(acc, wy, Wr[r], V, o->label_smoothing);
        }
    }
}

static void test_case(int P, int64_t V, const lf_ce_opts *o)
{
    lf_tp_share g[8 * ROWS];
    float Wr[8];
    int64_t labels[ROWS], i, j;
    double dx[MAXV];
    double W = 0.0;
    for (j = 0; j < V; ++j) W += o->class_weights ? (double)o->class_weights[j] : 1.0;
    for (i = 0; i < ROWS; ++i) {
        const double pinf = i == 1 ? 0.3 : 0.02;
        for (j = 0; j < V; ++j) xs[i][j] = gen_logit(i == 2 ? 1e4 : 60.0, pinf);
        labels[i] = rng_int(V);
        if (i == 3 && rng_int(2)) labels[i] = o->ignore_index;
        if (i == 4 && rng_int(3) == 0) labels[i] = V + (int64_t)rng_int(3); /* bad */
        if (i == 5 && rng_int(4) == 0) xs[i][rng_int(V)] = NAN;
        if (i == 5 && rng_int(4) == 0) for (j = 0; j < V; ++j) xs[i][j] = -INFINITY; /* no mass */
        if (i == 0 && rng_int(3) == 0) xs[i][labels[i]] = -INFINITY; /* the label masked: +inf */
    }
    make_shares(P, V, o, labels, g, Wr);
    for (i = 0; i < ROWS; ++i) {
        const lf_ce_row ref = lf_ref_ce_row(xs[i], V, labels[i], o, dx);
        lf_tp_merged mg;
        float lse, loss;
        const float wy = (ref.status == LF_ROW_OK && o->class_weights) ? o->class_weights[labels[i]] : 1.0f;
        const int64_t shard_max = (V + P - 1) / P;
        double sum_wz = 0.0, tol_lse, tol;
        if (ref.status != LF_ROW_OK) continue; /* the caller zeroes ignored / bad rows */
        mg = lf_tp_merge(g, ROWS, P, i, labels[i], wy, o->class_weights ? Wr : NULL, V, o->label_smoothing);
        loss = lf_tp_loss(mg, o->z_loss, &lse);
        for (j = 0; j < V; ++j) {
            const double z = lf_logit_xform(xs[i][j], o->logit_scale, o->softcap);
            if (z > -INFINITY && z < INFINITY) sum_wz += fabs((o->class_weights ? cw[j] : 1.0) * z);
        }
        tol_lse = (double)(shard_max + P) * 0x1p-24 + 0x1p-21 * ((fabs(ref.lse) < INFINITY ? fabs(ref.lse) : 0.0) + 1.0);
        CHECK(close_or_nan(lse, ref.lse, tol_lse), "P=%d V=%lld row %lld: lse %.9g want %.12g (tol %.3g)", P, (long long)V,
              (long long)i, lse, ref.lse, tol_lse);
        {
            const double L = fabs(ref.lse) < INFINITY ? fabs(ref.lse) : 0.0, Lz = zmax_finite(xs[i], V, o);
            const double eps = o->label_smoothing, lam = o->z_loss;
            const double A = (1.0 - eps) * wy + eps * W / V;
            tol = tol_lse * (A + 2.0 * lam * L) + 0x1p-20 * A * (L + Lz) * (P + 1) + 0x1p-21 * lam * L * L +
                  0x1p-22 * eps * sum_wz / V * (double)(shard_max + P) + 0x1p-22 * fabs(ref.loss) + 1e-30;
            CHECK(close_or_nan(loss, ref.loss, tol), "P=%d V=%lld row %lld: loss %.9g want %.12g (tol %.3g)", P, (long long)V,
                  (long long)i, loss, ref.loss, tol);
        }
        /* the gradient each rank writes for its columns (every column, whoever holds it) */
        if (lse > -INFINITY && lse < INFINITY) {
            const float a = lf_tp_grad_coef(mg, lse, o->z_loss);
            int64_t bad = 0, worst = -1;
            for (j = 0; j < V; ++j) {
                const float x = xs[i][j], z = lf_logit_xform(x, o->logit_scale, o->softcap);
                const float w = o->class_weights ? o->class_weights[j] : 1.0f;
                const float p = z == -INFINITY ? 0.0f : expf(z - lse);
                float gz = a * p - o->label_smoothing * w / (float)V;
                if (j == labels[i]) gz -= (1.0f - o->label_smoothing) * wy;
                {
                    const double gj = (double)gz * lf_logit_xform_grad(x, o->logit_scale, o->softcap);
                    /* dz's upper bound: under a cap its float form is off by up to ~2^-23 scale */
                    const double dz = fabs((double)lf_logit_xform_grad(x, o->logit_scale, o->softcap)) +
                                      (o->softcap > 0.0f ? 0x1p-21 * o->logit_scale : 0.0);
                    const double t = dz * (fabs(a) * p * (tol_lse + 0x1p-21 * (1.0 + (z > -INFINITY ? fabs(z) : 0.0))) +
                                           0x1p-21 * (fabs(a) * p + o->label_smoothing * w / V + (j == labels[i] ? wy : 0.0))) +
                                     (o->softcap > 0.0f ? 0x1p-21 * o->logit_scale * fabs((double)gz) : 0.0) + 1e-30;
                    if (!close_or_nan(gj, dx[j], t)) {
                        ++bad;
                        worst = j;
                    }
                }
            }
            CHECK(bad == 0, "P=%d V=%lld row %lld: %lld gradient elements off (e.g. column %lld)", P, (long long)V, (long long)i,
                  (long long)bad, (long long)worst);
        }
    }
}

/* The label is the row's max at |z| ~ 1e4: the loss (~1e-3) is log S + (M - z_y) with M - z_y
 * exact, so its error is that of the float sum S ((V + P) 2^-24 with S ~ 1), not ulp(lse) ~ 1e-3
 * as in A lse - sum q z, which this bound (~1e-5) would fail. */
static void test_exact_at_max(void)
{
    int P;
    for (P = 1; P <= 4; ++P) {
        lf_tp_share g[8 * ROWS];
        float Wr[8], lse;
        int64_t labels[ROWS], i, j;
        const int64_t V = 64;
        lf_ce_opts o = lf_ce_opts_default();
        for (i = 0; i < ROWS; ++i) {
            for (j = 0; j < V; ++j) xs[i][j] = (float)(1e4 - 8.0 - rng_unif() * 40.0);
            labels[i] = rng_int(V);
            xs[i][labels[i]] = 1e4f;
        }
        make_shares(P, V, &o, labels, g, Wr);
        for (i = 0; i < ROWS; ++i) {
            const lf_ce_row ref = lf_ref_ce_row(xs[i], V, labels[i], &o, NULL);
            const float loss = lf_tp_loss(lf_tp_merge(g, ROWS, P, i, labels[i], 1.0f, NULL, V, 0.0f), 0.0f, &lse);
            CHECK(fabs(loss - ref.loss) <= (double)(V + P) * 0x1p-23 + 0x1p-22 * ref.loss, "P=%d row %lld: loss %.9g want %.12g (max label)", P,
                  (long long)i, loss, ref.loss);
        }
    }
}

static void test_share_rules(void)
{
    lf_tp_acc a = lf_tp_acc_init(), e = lf_tp_acc_init();
    lf_tp_share sh, id;
    int64_t v0, v1, total = 0, y;
    int r, P;
    lf_tp_acc_push(&a, 3.0f, 1.0f, 0, 1);
    lf_tp_acc_push(&a, -1.5f, 2.0f, 1, 1);
    CHECK(a.zy == -1.5f && a.wz == 0.0f && a.has_y == 1 && a.m == 3.0f, "acc: zy %g wz %g m %g", a.zy, a.wz, a.m);
    /* t = (1 - eps) w_y (m - z_y) + eps (W_r m - wz) / V with eps = 0.5, w_y = 2, W_r = 3, V = 6 */
    sh = lf_tp_share_make(a, 2.0f, 3.0f, 6, 0.5f);
    CHECK(sh.t == 0.5f * 2.0f * 4.5f + 0.5f * 9.0f / 6.0f, "share t %g", sh.t);
    id = lf_tp_share_make(e, 1.0f, 0.0f, 6, 0.5f);
    CHECK(id.m == -INFINITY && id.s == 0.0f && id.t == 0.0f, "an empty shard is not the identity");
    lf_tp_acc_push(&e, -INFINITY, 1.0f, 1, 1); /* a masked label with smoothing weight */
    sh = lf_tp_share_make(e, 1.0f, 1.0f, 6, 0.1f);
    CHECK(sh.t == INFINITY && sh.s == 0.0f, "masked label: t %g", sh.t);
    { /* label smoothing with a shard whose columns all sit at bf16's finfo.min: W_r m and sum w z
       * both overflow to -inf; the share's t (and the loss) +inf, as the single-GPU kernel's, not
       * NaN; the gradient finite (its coefficients take the lse, not t) */
        enum { FV = 8, FP = 2 };
        const float fm = -3.3895314e38f;
        float x[FV], lse = 0.0f;
        lf_tp_share g[FP];
        lf_tp_merged mg;
        int64_t j;
        float coef;
        for (j = 0; j < FV; ++j) x[j] = j < 4 ? 0.5f * (float)j : fm;
        for (r = 0; r < FP; ++r) {
            lf_tp_acc f = lf_tp_acc_init();
            lf_tp_shard(FV, FP, r, &v0, &v1);
            for (j = v0; j < v1; ++j) lf_tp_acc_push(&f, x[j], 1.0f, j == 1, 1);
            g[r] = lf_tp_share_make(f, 1.0f, (float)(v1 - v0), FV, 0.1f);
        }
        CHECK(g[1].t == INFINITY && g[0].t == g[0].t, "finfo.min shard with smoothing: t %g / %g", g[0].t, g[1].t);
        mg = lf_tp_merge(g, 1, FP, 0, 1, 1.0f, NULL, FV, 0.1f);
        CHECK(lf_tp_loss(mg, 0.0f, &lse) == INFINITY && lse == lse && lse < 10.0f, "finfo.min shard with smoothing: loss not +inf (lse %g)", lse);
        coef = lf_tp_grad_coef(mg, lse, 0.0f);
        CHECK(coef == coef && fabs(coef) < 2.0f, "finfo.min shard with smoothing: gradient coefficient %g", coef);
    }
    { /* the label inside a shard with no mass (every column massless, lf_massless; pushed one by
       * one its m is -inf, as a shard of edge elements is on a GPU): the loss is the full row's
       * finite (M - z_y) + log S (~3.4e38), as lf_ref_ce_row and the single-GPU kernel give, not
       * -inf - z_y + inf = NaN; without smoothing and with it (then +inf, as there) */
        enum { FV = 8, FP = 2 };
        static const float floors[2] = {-3.3895314e38f, -3.402823466e38f};
        int f, sm;
        for (f = 0; f < 2; ++f)
            for (sm = 0; sm < 2; ++sm) {
                float x[FV], lse = 0.0f, loss;
                lf_tp_share g[FP];
                lf_tp_merged mg;
                lf_ce_opts o = lf_ce_opts_default();
                lf_ce_row ref;
                int64_t j;
                o.label_smoothing = sm ? 0.1f : 0.0f;
                for (j = 0; j < FV; ++j) x[j] = j < 4 ? floors[f] : (float)(j - 3);
                for (r = 0; r < FP; ++r) {
                    lf_tp_acc a = lf_tp_acc_init();
                    lf_tp_shard(FV, FP, r, &v0, &v1);
                    for (j = v0; j < v1; ++j) lf_tp_acc_push(&a, x[j], 1.0f, j == 1, sm);
                    g[r] = lf_tp_share_make(a, 1.0f, (float)(v1 - v0), FV, o.label_smoothing);
                }
                mg = lf_tp_merge(g, 1, FP, 0, 1, 1.0f, NULL, FV, o.label_smoothing);
                loss = lf_tp_loss(mg, 0.0f, &lse);
                ref = lf_ref_ce_row(x, FV, 1, &o, NULL);
                CHECK(sm ? loss == INFINITY : (loss < INFINITY && fabs(loss - ref.loss) <= 1e-6 * fabs(ref.loss)),
                      "label in a massless shard (floor %g, smoothing %d): loss %g, reference %g", floors[f], sm, loss, ref.loss);
                CHECK(fabs(lse - ref.lse) <= 1e-6 * fabs(ref.lse), "label in a massless shard: lse %.9g, reference %.9g", lse, ref.lse);
            }
        { /* ... with class weights and smoothing, where W_r z_y overflows but sum w z does not (a
           * review's case: -inf before the fmaf in lf_tp_share_from); the true loss ~9.1e36 */
            static const float xw[4] = {-2.4e38f, -3.4e38f, 1.0f, 2.0f}, cw[4] = {1.0f, 0.01f, 1.0f, 1.0f};
            float Wr[2], lse = 0.0f, loss;
            lf_tp_share g[2];
            lf_tp_merged mg;
            lf_ce_opts o = lf_ce_opts_default();
            lf_ce_row ref;
            int64_t j;
            o.label_smoothing = 0.1f;
            o.class_weights = cw;
            for (r = 0; r < 2; ++r) {
                lf_tp_acc a = lf_tp_acc_init();
                lf_tp_shard(4, 2, r, &v0, &v1);
                Wr[r] = 0.0f;
                for (j = v0; j < v1; ++j) {
                    lf_tp_acc_push(&a, xw[j], cw[j], j == 1, 1);
                    Wr[r] += cw[j];
                }
                g[r] = lf_tp_share_make(a, cw[1], Wr[r], 4, o.label_smoothing);
            }
            mg = lf_tp_merge(g, 1, 2, 0, 1, cw[1], Wr, 4, o.label_smoothing);
            loss = lf_tp_loss(mg, 0.0f, &lse);
            ref = lf_ref_ce_row(xw, 4, 1, &o, NULL);
            CHECK(fabs(loss - ref.loss) <= 1e-5 * fabs(ref.loss), "label in a massless shard, weights + smoothing: loss %.9g, reference %.9g",
                  loss, ref.loss);
        }
    }
    for (r = 0; r < 5; ++r) {
        lf_tp_shard(13, 5, r, &v0, &v1);
        CHECK(v0 == total && v1 - v0 == (r < 3 ? 3 : 2), "shard %d of 13 over 5: [%lld, %lld)", r, (long long)v0, (long long)v1);
        total = v1;
    }
    lf_tp_shard(3, 8, 6, &v0, &v1);
    CHECK(v0 == 3 && v1 == 3, "an empty shard: [%lld, %lld)", (long long)v0, (long long)v1);
    for (P = 1; P <= 9; ++P)
        for (total = 1; total <= 40; ++total)
            for (y = 0; y < total; ++y) {
                r = lf_tp_owner(total, P, y);
                lf_tp_shard(total, P, r, &v0, &v1);
                CHECK(r >= 0 && r < P && v0 <= y && y < v1, "owner of %lld in V=%lld P=%d: %d", (long long)y, (long long)total,
                      P, r);
            }
}

static void run_all(unsigned long long seed)
{
    const int Ps[5] = {1, 2, 3, 4, 8};
    const int64_t Vs[7] = {1, 3, 7, 100, 1000, 2048, 4099};
    int pi, vi, k;
    g_seed = seed;
    g_rng = seed;
    for (k = 0; k < MAXV; ++k) cw[k] = rng_int(10) == 0 ? 0.0f : (float)(0.25 + 2.0 * rng_unif());
    test_share_rules();
    test_exact_at_max();
    for (vi = 0; vi < 7; ++vi)
        for (pi = 0; pi < 5; ++pi)
            for (k = 0; k < 6; ++k) {
                lf_ce_opts o = lf_ce_opts_default();
                if (k == 1) o.label_smoothing = 0.1f;
                if (k == 2) o.z_loss = 1e-3f;
                if (k == 3) o.class_weights = cw;
                if (k == 4) {
                    o.softcap = 30.0f;
                    o.logit_scale = 0.7f;
                }
                if (k == 5) {
                    o.label_smoothing = 0.2f;
                    o.z_loss = 1e-4f;
                    o.class_weights = cw;
                    o.softcap = 20.0f;
                }
                test_case(Ps[pi], Vs[vi], &o);
            }
}

int main(int argc, char **argv) { return host_check_main(argc, argv, "test_tp", 20261123ull, run_all); }
