/* test_tp.c — host tests of lossfuse.h section 11: the cross-entropy of a row whose vocabulary
 * is split over P ranks, from 16-byte per-rank shares merged in rank order.
 *
 * Build and run:
 *     gcc -std=c99 -O2 -Wall -Wextra -pedantic -Werror -I. tests/test_tp.c -o test_tp -lm
 *     ./test_tp [seed]
 * For P in {1, 2, 3, 4, 8} (more ranks than columns included: empty shards), V from 1 to 4099,
 * rows with outliers up to 1e4 and -inf columns, labels in any shard, ignored and bad labels,
 * label smoothing, z-loss, class weights, softcap and logit scale: the shares are pushed in
 * float (lf_tp_row_push, what a device kernel does per column), all-gathered into [P][N] and
 * merged (lf_tp_gather_merge), and the loss (lf_tp_row_loss) and every gradient element
 * (lf_tp_grad_coef) are compared with the unsharded double reference lf_ref_ce_row.
 * Tolerances (float arithmetic against double): a shard's s is a sequential float sum of at
 * most n terms in [0, 1] with s >= 1 after the merge's largest term, so log s is off by at most
 * n 2^-24; the maximum m is a float z (scale, tanhf and cap each round: ~2^-21.5 |z|) and
 * m + log s rounds once more: 2^-21 (|lse| + 1), lse >= m. The loss is then off by its terms' sizes times
 * that (w_y, eps W / V, 2 lam |lse|) plus the float sums zy and wz (2^-22 sum |w_j z_j| eps / V);
 * a gradient element by a p_j times the lse error plus 2^-21 of its terms, and under a softcap
 * by 2^-21 scale |g_z| more: dz/dx = scale (1 - tanh^2) is formed in float from a tanh within a
 * few ulps of +-1 where the cap saturates (absolute error ~2^-23 scale, shared by the kernels).
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

static void test_case(int P, int64_t V, const lf_ce_opts *o)
{
    lf_tp_row g[8 * ROWS];
    int64_t labels[ROWS], i, j;
    double dx[MAXV];
    const int smoothing = o->label_smoothing > 0.0f;
    double W = 0.0;
    int r;
    for (j = 0; j < V; ++j) W += o->class_weights ? (double)o->class_weights[j] : 1.0;
    for (i = 0; i < ROWS; ++i) {
        const double pinf = i == 1 ? 0.3 : 0.02;
        for (j = 0; j < V; ++j) xs[i][j] = gen_logit(i == 2 ? 1e4 : 60.0, pinf);
        labels[i] = rng_int(V);
        if (i == 3 && rng_int(2)) labels[i] = o->ignore_index;
        if (i == 4 && rng_int(3) == 0) labels[i] = V + (int64_t)rng_int(3); /* bad */
        if (i == 5 && rng_int(4) == 0) xs[i][rng_int(V)] = NAN;
        if (i == 5 && rng_int(4) == 0) for (j = 0; j < V; ++j) xs[i][j] = -INFINITY; /* no mass */
    }
    /* each rank's shares of every row, as the all-gather leaves them: g[r * ROWS + i] */
    for (r = 0; r < P; ++r) {
        int64_t v0, v1;
        lf_tp_shard(V, P, r, &v0, &v1);
        for (i = 0; i < ROWS; ++i) {
            lf_tp_row s = lf_tp_row_init();
            for (j = v0; j < v1; ++j) {
                const float z = lf_logit_xform(xs[i][j], o->logit_scale, o->softcap);
                lf_tp_row_push(&s, z, o->class_weights ? o->class_weights[j] : 1.0f, j == labels[i], smoothing);
            }
            g[r * ROWS + i] = s;
        }
    }
    for (i = 0; i < ROWS; ++i) {
        const lf_ce_row ref = lf_ref_ce_row(xs[i], V, labels[i], o, dx);
        const lf_tp_row mr = lf_tp_gather_merge(g, ROWS, P, i);
        float lse;
        const float wy = (ref.status == LF_ROW_OK && o->class_weights) ? o->class_weights[labels[i]] : 1.0f;
        const float loss = lf_tp_row_loss(mr, wy, (float)W, V, o->label_smoothing, o->z_loss, &lse);
        int64_t shard_max = (V + P - 1) / P;
        double sum_wz = 0.0, tol_lse, tol;
        if (ref.status != LF_ROW_OK) continue; /* the caller zeroes ignored / bad rows */
        for (j = 0; j < V; ++j) {
            const double z = lf_logit_xform(xs[i][j], o->logit_scale, o->softcap);
            if (z > -INFINITY && z < INFINITY) sum_wz += fabs((o->class_weights ? cw[j] : 1.0) * z);
        }
        tol_lse = (double)shard_max * 0x1p-24 + 0x1p-21 * ((fabs(ref.lse) < INFINITY ? fabs(ref.lse) : 0.0) + 1.0) + 0x1p-24 * P;
        CHECK(close_or_nan(lse, ref.lse, tol_lse), "P=%d V=%lld row %lld: lse %.9g want %.12g (tol %.3g)", P, (long long)V,
              (long long)i, lse, ref.lse, tol_lse);
        {
            const double L = fabs(ref.lse) < INFINITY ? fabs(ref.lse) : 0.0;
            const double eps = o->label_smoothing, lam = o->z_loss;
            tol = tol_lse * ((1.0 - eps) * wy + eps * W / V + 2.0 * lam * L) +
                  0x1p-21 * ((1.0 - eps) * wy * (L + fabs(ref.logprob) + L) + eps * (W * L + sum_wz) / V + lam * L * L) +
                  0x1p-22 * eps * sum_wz / V * (double)shard_max + 1e-30;
            CHECK(close_or_nan(loss, ref.loss, tol), "P=%d V=%lld row %lld: loss %.9g want %.12g (tol %.3g)", P, (long long)V,
                  (long long)i, loss, ref.loss, tol);
        }
        /* the gradient each rank writes for its columns (every column, whoever holds it) */
        if (lse > -INFINITY && lse < INFINITY) {
            const float a = lf_tp_grad_coef(lse, wy, (float)W, V, o->label_smoothing, o->z_loss);
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

static void test_merge_rules(void)
{
    lf_tp_row a = lf_tp_row_init(), b = lf_tp_row_init(), e = lf_tp_row_init(), ab, ba;
    int64_t v0, v1, total = 0;
    int r;
    lf_tp_row_push(&a, 3.0f, 1.0f, 0, 1);
    lf_tp_row_push(&a, -1.5f, 2.0f, 1, 1);
    lf_tp_row_push(&b, 7.25f, 0.5f, 0, 1);
    ab = lf_tp_row_merge(a, b);
    ba = lf_tp_row_merge(b, a);
    CHECK(memcmp(&ab, &ba, sizeof ab) == 0, "merge not commutative bit for bit");
    ab = lf_tp_row_merge(a, e);
    CHECK(ab.m == a.m && ab.s == a.s && ab.zy == a.zy && ab.wz == a.wz, "an empty share is not the identity");
    CHECK(a.zy == -1.5f && a.wz == 3.0f - 3.0f, "zy %g wz %g", a.zy, a.wz);
    for (r = 0; r < 5; ++r) {
        lf_tp_shard(13, 5, r, &v0, &v1);
        CHECK(v0 == total && v1 - v0 == (r < 3 ? 3 : 2), "shard %d of 13 over 5: [%lld, %lld)", r, (long long)v0, (long long)v1);
        total = v1;
    }
    lf_tp_shard(3, 8, 6, &v0, &v1);
    CHECK(v0 == 3 && v1 == 3, "an empty shard: [%lld, %lld)", (long long)v0, (long long)v1);
}

static void run_all(unsigned long long seed)
{
    const int Ps[5] = {1, 2, 3, 4, 8};
    const int64_t Vs[7] = {1, 3, 7, 100, 1000, 2048, 4099};
    int pi, vi, k;
    g_seed = seed;
    g_rng = seed;
    for (k = 0; k < MAXV; ++k) cw[k] = rng_int(10) == 0 ? 0.0f : (float)(0.25 + 2.0 * rng_unif());
    test_merge_rules();
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
