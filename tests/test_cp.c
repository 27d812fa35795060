/* test_cp.c — host tests of lossfuse.h section 10, the zigzag layout of context parallelism.
 *
 * Build and run:
 *     gcc -std=c99 -O2 -Wall -Wextra -pedantic -Werror -I. tests/test_cp.c -o test_cp -lm
 *     ./test_cp [seed]
 * For cp in {1, 2, 3, 4, 8} and random packings (lengths multiples of 2 cp, empty sequences
 * among them):
 *   - the chunk-by-chunk reference lf_ref_cp_labels against the closed forms lf_cp_to_global,
 *     lf_cp_global_token and lf_cp_label for every local token of every rank;
 *   - lf_cp_to_local inverts lf_cp_to_global (round trip both ways);
 *   - the ranks' local tokens cover every global token exactly once;
 *   - every rank's chunks are the ones the layout names (r and 2 cp - 1 - r), and the local
 *     labels equal the unsharded next-token labels (lf_packed_next_label, with the target mask
 *     applied) at the mapped global positions: the label of a chunk's last token comes from
 *     the next chunk, held by another rank;
 *   - the multiset of valid labels over all ranks equals the unsharded one, so counts and sums
 *     over the labels do not depend on cp;
 *   - bad input: cp 0, rank out of range, a length not a multiple of 2 cp (and which one).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lossfuse.h"

#include "host_check.h"

#define MAXT 4096

static void test_layout(int cp)
{
    int32_t cu[65], cul[65];
    int64_t ids[MAXT], lab[MAXT], gpos[MAXT], full[MAXT];
    uint8_t tmask[MAXT];
    int seen[MAXT];
    int64_t nseq = 1 + rng_int(12), total = 0, k, t, ign = -100;
    int r, use_mask = (int)rng_int(2);
    cu[0] = 0;
    for (k = 0; k < nseq; ++k) {
        const int64_t len = rng_int(5) == 0 ? 0 : 2 * (int64_t)cp * (1 + rng_int(MAXT / (2 * cp * 16)));
        cu[k + 1] = (int32_t)(cu[k] + len);
    }
    total = cu[nseq];
    for (t = 0; t < total; ++t) {
        ids[t] = rng_int(50000);
        tmask[t] = (uint8_t)(rng_int(4) != 0);
        seen[t] = 0;
    }
    CHECK(lf_cp_check(cu, nseq, total, cp, NULL) == LF_OK, "cp %d: valid layout rejected", cp);
    lf_cp_local_cu(cu, nseq, cp, cul);
    for (k = 0; k <= nseq; ++k) CHECK(cul[k] * (int64_t)cp == cu[k], "cp %d: local cu[%lld] %d", cp, (long long)k, cul[k]);
    /* the unsharded labels */
    for (t = 0; t < total; ++t) {
        int64_t y = lf_packed_next_label(cu, nseq, ids, t, ign);
        if (y != ign && use_mask && !tmask[t + 1]) y = ign;
        full[t] = y;
    }
    {
        int64_t n_valid_full = 0, n_valid_cp = 0, sum_full = 0, sum_cp = 0;
        for (t = 0; t < total; ++t)
            if (full[t] != ign) {
                ++n_valid_full;
                sum_full += full[t] * (t % 7 + 1); /* position-weighted: a moved label would show */
            }
        for (r = 0; r < cp; ++r) {
            const int64_t nloc = total / cp;
            CHECK(lf_ref_cp_labels(ids, use_mask ? tmask : NULL, cu, nseq, total, cp, r, ign, lab, gpos) == LF_OK,
                  "cp %d rank %d: reference failed", cp, r);
            for (t = 0; t < nloc; ++t) {
                const int64_t g = gpos[t], kk = lf_seq_find(cul, nseq, t);
                if (kk < 0) {
                    CHECK(0, "cp %d rank %d: local token %lld in no sequence", cp, r, (long long)t);
                    continue;
                }
                const int64_t l = t - cul[kk];
                CHECK(lf_cp_seq_find(cu, nseq, cp, t) == kk, "cp %d: lf_cp_seq_find(%lld) %lld want %lld", cp, (long long)t,
                      (long long)lf_cp_seq_find(cu, nseq, cp, t), (long long)kk);
                const int64_t len = (int64_t)cu[kk + 1] - cu[kk], c = len / (2 * cp);
                int rr = -1;
                CHECK(g >= cu[kk] && g < cu[kk + 1], "cp %d rank %d: token %lld maps outside its sequence", cp, r, (long long)t);
                CHECK(lf_cp_global_token(cu, nseq, cp, r, t) == g, "cp %d rank %d t %lld: global %lld want %lld", cp, r,
                      (long long)t, (long long)lf_cp_global_token(cu, nseq, cp, r, t), (long long)g);
                CHECK(lf_cp_to_global(l, len, cp, r) == g - cu[kk], "cp %d: to_global", cp);
                CHECK(lf_cp_to_local(g - cu[kk], len, cp, &rr) == l && rr == r, "cp %d rank %d: to_local of %lld gave %d", cp, r,
                      (long long)(g - cu[kk]), rr);
                /* the chunk: r for the first half of the local part, 2 cp - 1 - r for the second */
                CHECK((g - cu[kk]) / c == (l < c ? r : 2 * cp - 1 - r), "cp %d rank %d: token in chunk %lld", cp, r,
                      (long long)((g - cu[kk]) / c));
                CHECK(lab[t] == full[g], "cp %d rank %d t %lld (global %lld): label %lld want %lld", cp, r, (long long)t,
                      (long long)g, (long long)lab[t], (long long)full[g]);
                CHECK(lf_cp_label(cu, nseq, cp, r, ids, use_mask ? tmask : NULL, t, ign) == lab[t],
                      "cp %d rank %d t %lld: lf_cp_label differs", cp, r, (long long)t);
                ++seen[g];
                if (lab[t] != ign) {
                    ++n_valid_cp;
                    sum_cp += lab[t] * (g % 7 + 1);
                }
            }
            CHECK(lf_cp_global_token(cu, nseq, cp, r, nloc) == -1, "cp %d: token past the end mapped", cp);
            CHECK(lf_cp_label(cu, nseq, cp, r, ids, NULL, nloc, ign) == ign, "cp %d: label past the end", cp);
        }
        for (t = 0; t < total; ++t) CHECK(seen[t] == 1, "cp %d: global token %lld held %d times", cp, (long long)t, seen[t]);
        CHECK(n_valid_cp == n_valid_full && sum_cp == sum_full, "cp %d: valid labels %lld (sum %lld), unsharded %lld (%lld)", cp,
              (long long)n_valid_cp, (long long)sum_cp, (long long)n_valid_full, (long long)sum_full);
    }
    /* every position of a sequence round-trips through to_local / to_global */
    for (k = 0; k < nseq; ++k) {
        const int64_t len = (int64_t)cu[k + 1] - cu[k];
        int64_t g;
        for (g = 0; g < len; ++g) {
            int rr;
            const int64_t l = lf_cp_to_local(g, len, cp, &rr);
            CHECK(rr >= 0 && rr < cp && l >= 0 && l < len / cp && lf_cp_to_global(l, len, cp, rr) == g,
                  "cp %d len %lld: offset %lld -> rank %d local %lld", cp, (long long)len, (long long)g, rr, (long long)l);
        }
    }
}

static void test_errors(void)
{
    int32_t cu[4] = {0, 8, 18, 24}; /* lengths 8, 10, 6 */
    int64_t ids[24] = {0}, lab[24], bad = 0;
    CHECK(lf_cp_check(cu, 3, 24, 2, &bad) == LF_ERR_CP && bad == 1, "length 10 at cp 2 (needs a multiple of 4) accepted: %lld", (long long)bad);
    CHECK(lf_cp_check(cu, 3, 24, 1, &bad) == LF_OK && bad == -1, "cp 1 rejected");
    CHECK(lf_cp_check(cu, 3, 24, 0, NULL) == LF_ERR_CP, "cp 0 accepted");
    CHECK(lf_cp_check(cu, 3, 25, 1, NULL) == LF_ERR_SEQLENS, "wrong total accepted");
    CHECK(lf_ref_cp_labels(ids, NULL, cu, 3, 24, 1, 1, -100, lab, NULL) == LF_ERR_CP, "rank 1 of cp 1 accepted");
    CHECK(lf_ref_cp_labels(ids, NULL, cu, 3, 24, 1, -1, -100, lab, NULL) == LF_ERR_CP, "rank -1 accepted");
    CHECK(lf_ref_cp_labels(NULL, NULL, cu, 3, 24, 1, 0, -100, lab, NULL) == LF_ERR_NULL, "NULL ids accepted");
    CHECK(strstr(lf_status_str(LF_ERR_CP), "2*cp") != NULL, "LF_ERR_CP has no message");
    /* a known layout by hand: one sequence of 8 tokens, cp 2: chunks of 2, rank 0 holds chunks
     * 0 and 3 (tokens 0 1 6 7), rank 1 chunks 1 and 2 (tokens 2 3 4 5) */
    {
        int32_t c1[2] = {0, 8};
        int64_t id8[8] = {10, 11, 12, 13, 14, 15, 16, 17}, g[4];
        const int64_t want_g[2][4] = {{0, 1, 6, 7}, {2, 3, 4, 5}}, want_l[2][4] = {{11, 12, 17, -100}, {13, 14, 15, 16}};
        int r, i;
        for (r = 0; r < 2; ++r) {
            CHECK(lf_ref_cp_labels(id8, NULL, c1, 1, 8, 2, r, -100, lab, g) == LF_OK, "hand layout");
            for (i = 0; i < 4; ++i)
                CHECK(g[i] == want_g[r][i] && lab[i] == want_l[r][i], "hand layout rank %d token %d: global %lld label %lld", r, i,
                      (long long)g[i], (long long)lab[i]);
        }
    }
}

static void run_all(unsigned long long seed)
{
    const int cps[5] = {1, 2, 3, 4, 8};
    int i, rep;
    g_seed = seed;
    g_rng = seed;
    for (rep = 0; rep < 40; ++rep)
        for (i = 0; i < 5; ++i) test_layout(cps[i]);
    test_errors();
}

int main(int argc, char **argv) { return host_check_main(argc, argv, "test_cp", 20261123ull, run_all); }
