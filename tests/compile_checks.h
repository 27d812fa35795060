/* tests/compile_checks.h — the body of compile_c.c and compile_cpp.cpp: one call of a
 * representative function of every section of lossfuse.h and a few results that can be checked
 * by hand, written once in the subset of C99 that is also C++17, so that the header is compiled
 * and run both ways (compile_c.c with LF_USE_EXP2 1, compile_cpp.cpp with 0; the checks hold
 * for either). Include it after lossfuse.h with LF_COMPILE_NAME set to the program's name. It
 * defines main(). */
#ifndef LF_COMPILE_NAME
#error "define LF_COMPILE_NAME before including compile_checks.h"
#endif

static int failures = 0;
static void expect(int ok, const char *what)
{
    if (!ok) {
        printf("%s: FAIL %s\n", LF_COMPILE_NAME, what);
        ++failures;
    }
}

int main(void)
{
    /* 1. configuration, status codes */
    LF_ASSERT(lf_dtype_size(LF_BF16) == 2);
    expect(lf_dtype_size(LF_F32) == 4 && lf_dtype_size(LF_F16) == 2, "lf_dtype_size");
    expect(strcmp(lf_status_str(LF_OK), "ok") == 0 && strcmp(lf_status_str(99), "unknown status") == 0,
           "lf_status_str");
    /* 2. bf16 / fp16 */
    expect(lf_f32_to_bf16(1.0f) == 0x3f80u && lf_bf16_to_f32(0xc000u) == -2.0f, "bf16");
    expect(lf_f32_to_f16(1.0f) == 0x3c00u && lf_f16_to_f32(0x7bffu) == 65504.0f, "fp16");
    expect(lf_f32_to_f16(65520.0f) == 0x7c00u, "fp16 overflow");
    /* 3. lse, argmax, row stats */
    {
        lf_lse a = lf_lse_init(), b = lf_lse_init(), m;
        lf_argmax am = lf_argmax_init();
        lf_row_stats r = lf_row_stats_init(), r2 = lf_row_stats_init();
        lf_lse_push(&a, 0.0f);
        lf_lse_push(&b, 0.0f);
        lf_lse_push(&b, -INFINITY);
        m = lf_lse_merge(a, b);
        expect(fabsf(lf_lse_final(m) - 0.69314718f) < 1e-6f, "lse of [0, 0] = log 2");
        expect(fabsf(lf_lse_entropy(m) - 0.69314718f) < 1e-6f, "entropy of [0, 0] = log 2");
        expect(lf_lse_final(lf_lse_init()) == -INFINITY, "empty lse");
        expect(lf_exp_diff(1.0f, 1.0f) == 1.0f, "lf_exp_diff(x, x) == 1");
        lf_argmax_push(&am, 3.0f, 0);
        lf_argmax_push(&am, 5.0f, 1);
        lf_argmax_push(&am, 5.0f, 2);
        expect(am.i == 1 && lf_argmax_merge(am, lf_argmax_init()).i == 1, "argmax first index");
        lf_row_stats_push(&r, 1.0f, 1.0f, 2.0f, 0);
        lf_row_stats_push(&r2, 3.0f, 3.0f, 0.5f, 1);
        r = lf_row_stats_merge(r, r2);
        expect(r.wz == 3.5f && r.w == 2.5f && r.am.i == 1, "row stats");
    }
    /* 4. logit transform */
    expect(lf_softcap(-INFINITY, 30.0f) == -INFINITY && lf_softcap(0.0f, 30.0f) == 0.0f, "softcap");
    expect(lf_logit_xform(2.0f, 0.5f, 0.0f) == 1.0f && lf_logit_xform_grad(2.0f, 0.5f, 0.0f) == 0.5f,
           "logit transform without cap");
    expect(lf_logit_xform_grad(0.0f, 2.0f, 10.0f) == 2.0f, "logit transform grad at 0");
    /* 5. packed sequences */
    {
        static const int32_t cu[] = {0, 0, 3, 3, 4, 9};
        static const int64_t ids[] = {10, 11, 12, 13, 14, 15, 16, 17, 18};
        expect(lf_seq_find(cu, 5, 0) == 1 && lf_seq_find(cu, 5, 3) == 3 && lf_seq_find(cu, 5, 9) == -1,
               "lf_seq_find");
        expect(lf_packed_next_label(cu, 5, ids, 1, -100) == 12 &&
                   lf_packed_next_label(cu, 5, ids, 2, -100) == -100,
               "lf_packed_next_label");
    }
    /* 6. validation */
    {
        static const int32_t labels[] = {0, -100, 7, 2};
        static const int32_t cu[] = {0, 2, 4};
        int64_t nb, fb;
        lf_ce_opts o = lf_ce_opts_default();
        expect(lf_check_labels(labels, 0, 4, 5, -100, &nb, &fb) == LF_ERR_LABEL && nb == 1 && fb == 2,
               "lf_check_labels");
        expect(lf_check_cu_seqlens(cu, 2, 4) == LF_OK && lf_check_cu_seqlens(cu, 2, 5) == LF_ERR_SEQLENS,
               "lf_check_cu_seqlens");
        expect(lf_check_ce_opts(&o) == LF_OK, "lf_check_ce_opts default");
        o.logit_scale = 0.0f;
        expect(lf_check_ce_opts(&o) == LF_ERR_ARG, "lf_check_ce_opts bad scale");
    }
    /* 7. references: equal logits give loss log(V) and gradient p - onehot */
    {
        static const float x[8] = {1, 1, 1, 1, 1, 1, 1, 1};
        static const int64_t y[2] = {3, -100};
        double loss = -1.0, dx[8], g[8];
        int64_t nbad = -1;
        lf_ce_opts o = lf_ce_opts_default();
        lf_ce_row r = lf_ref_ce_row(x, 8, 3, &o, dx);
        expect(r.status == LF_ROW_OK && fabs(r.loss - log(8.0)) < 1e-12, "lf_ref_ce_row loss");
        expect(fabs(dx[3] - (0.125 - 1.0)) < 1e-12 && fabs(dx[0] - 0.125) < 1e-12, "lf_ref_ce_row dx");
        expect(lf_ref_cross_entropy(2, 4, x, 4, y, &o, LF_REDUCE_MEAN, -1.0, &loss, NULL, g, &nbad) ==
                       LF_OK &&
                   fabs(loss - log(4.0)) < 1e-12 && nbad == 0 && g[4] == 0.0 &&
                   fabs(g[3] + 0.75) < 1e-12,
               "lf_ref_cross_entropy mean");
    }
    /* 3c. pair losses: DPO at h = 0 is log 2 with derivative -beta / 2; BT's derivative
     * scale (sigma(0) - t) */
    {
        float d1, d2;
        expect(fabs(lf_dpo_sigmoid(0.0f, 0.5f, 0.0f, &d1) - 0.69314718) < 1e-6 && fabs(d1 + 0.25) < 1e-7,
               "lf_dpo_sigmoid(0)");
        expect(fabs(lf_bt(0.0f, 0.2f, 2.0f, &d2) - 0.69314718) < 1e-6 && fabs(d2 - 0.6) < 1e-6, "lf_bt(0)");
        expect(lf_softplus(-200.0f) == 0.0f && lf_log_sigmoid(200.0f) == 0.0f, "softplus tails");
    }
    /* 3b / 8. dual state and distillation references: a row against itself has KL 0, against
     * a uniform teacher q: KL(p || q) = log V - H(p) */
    {
        float s[4] = {1.0f, 0.0f, -1.0f, 2.0f}, t[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        double g[4], l = -1.0;
        lf_dual d = lf_dual_init(), e = lf_dual_init();
        lf_dual_out out;
        lf_kl_opts ko = lf_kl_opts_default();
        int k;
        for (k = 0; k < 4; ++k) {
            lf_dual_push(k < 2 ? &d : &e, s[k], s[k]);
        }
        out = lf_dual_final(lf_dual_merge(d, e));
        expect(out.kl_fwd == 0.0f && out.kl_rev == 0.0f, "lf_dual identical rows");
        ko.kind = LF_KL_JSD;
        expect(lf_check_kl_opts(&ko) == LF_OK, "lf_check_kl_opts");
        expect(lf_ref_kl(1, 4, s, 4, t, 4, NULL, NULL, &ko, LF_REDUCE_SUM, -1.0, &l, g) == LF_OK && l > 0.0 &&
                   l < 0.6931472,
               "lf_ref_kl jsd");
        ko.kind = LF_KL_FORWARD;
        {
            lf_kl_row r = lf_ref_kl_row(s, t, 4, &ko, g);
            expect(r.loss == r.kl_fwd && fabs(r.kl_rev - (log(4.0) - r.ent_s)) < 1e-12,
                   "lf_ref_kl_row: KL(p || uniform) = log V - H(p)");
        }
    }
    /* 10. context parallelism: one sequence of 8 at cp 2, rank 1 holds global tokens 2 3 4 5 */
    {
        const int32_t cu8[2] = {0, 8};
        int32_t cul[2];
        const int64_t id8[8] = {10, 11, 12, 13, 14, 15, 16, 17};
        int64_t lab[4];
        int rk = -1;
        expect(lf_cp_check(cu8, 1, 8, 2, NULL) == LF_OK && lf_cp_to_local(6, 8, 2, &rk) == 2 && rk == 0, "lf_cp_to_local");
        lf_cp_local_cu(cu8, 1, 2, cul);
        expect(cul[1] == 4 && lf_cp_global_token(cu8, 1, 2, 1, 3) == 5 && lf_cp_label(cu8, 1, 2, 1, id8, NULL, 3, -100) == 16,
               "lf_cp_global_token / lf_cp_label");
        expect(lf_ref_cp_labels(id8, NULL, cu8, 1, 8, 2, 0, -100, lab, NULL) == LF_OK && lab[3] == -100 && lab[1] == 12,
               "lf_ref_cp_labels");
    }
    /* 11. tensor parallelism: a row of 4 equal logits over 3 ranks (shards 2, 1, 1): lse log 4 */
    {
        lf_tp_share g[3];
        lf_tp_merged mg;
        int64_t v0, v1, j;
        int r;
        float lse = 0.0f, loss;
        for (r = 0; r < 3; ++r) {
            lf_tp_acc acc = lf_tp_acc_init();
            lf_tp_shard(4, 3, r, &v0, &v1);
            for (j = v0; j < v1; ++j) lf_tp_acc_push(&acc, 0.5f, 1.0f, j == 3, 0);
            g[r] = lf_tp_share_make(acc, 1.0f, (float)(v1 - v0), 4, 0.0f);
        }
        mg = lf_tp_merge(g, 1, 3, 0, 3, 1.0f, NULL, 4, 0.0f);
        loss = lf_tp_loss(mg, 0.0f, &lse);
        expect(fabs(lse - (0.5 + log(4.0))) < 1e-6 && fabs(loss - log(4.0)) < 1e-6 && lf_tp_grad_coef(mg, lse, 0.0f) == 1.0f &&
                   lf_tp_owner(4, 3, 3) == 2 && sizeof(lf_tp_share) == 12,
               "lf_tp_*: equal logits over 3 ranks");
    }
    printf("%s: %s (LF_USE_EXP2 %d)\n", LF_COMPILE_NAME, failures ? "FAILED" : "ok", LF_USE_EXP2);
    return failures ? 1 : 0;
}
