/* bench/bench_kl.cu — times examples/kl_distill.cu against the bytes-moved floor.
 *
 *   bench_kl [--shapes 4096x32768,...] [--iters 20] [--kinds kl_fwd,kl_rev,jsd,softce,tvd] [--tag _name]
 *            [--forward-only] [--topk K] [--variants] [--jsd-keep -1] [--stages S] [--max-cluster C]
 *            [--divisor-given] [--labels]
 *
 * Each mode is the fused forward+backward of one loss, bf16 student and teacher logits, the
 * gradient written in place over the student, reduction mean (the floor: read the student and
 * the teacher once, write the gradient once = 6 B/elem); --forward-only times the loss alone
 * (mode=<kind>_fo, floor 4 B/elem). --topk K: a sparse teacher instead, K (index, log-prob)
 * pairs per row, the rest spread (mode=<kind>_top<K>; floor: read the student, write the
 * gradient, read the pairs = 4 B/elem + 8 K B/row). Prints the lines bench/report.py reads:
 *   DEVICE name=...   COPY impl=cuda gbps=...
 *   RESULT impl=lossfuse mode=kl_fwd N=.. V=.. dtype=bf16 ms=.. bytes=.. extra_bytes=.. status=ok pieces=..
 * Each timed launch is preceded (untimed) by restoring the student from a pristine copy and by
 * writing a 256 MiB buffer (nothing of the inputs left in L2); the median is reported.
 * impl=lossfuse is the automatic plan (fused forward+backward: row-resident on sm_90; the
 * RESULT line says the plan); --variants also times each schedule forced (impl=lossfuse_streamed,
 * and where it applies lossfuse_resident, its rows handed out by the counter with the automatic
 * side CTAs, lossfuse_resident_static, a fixed share per cluster, and lossfuse_resident_noside,
 * the counter without side CTAs), so the automatic plan's rules stay measured. --stages S and
 * --max-cluster C set kl_args.stages / max_cluster for every launch (the resident ring's stages,
 * which with a row slice per stage chooses the cluster; the largest cluster): e.g. what larger
 * clusters cost a kind (RESULTS.md, "What is left for the 85% distillation target").
 * --divisor-given passes the mean's divisor (N: the bench masks nothing) as a device scalar, so
 * the launch has no divisor kernel before it (name it with --tag, e.g. _divgiven). --labels
 * masks rows as a training batch's padding does: int64 labels, every 20th row ignore_index
 * (-100), so the mean's divisor is counted by kl_divisor_kernel before the launch's main kernel
 * (name it with --tag, e.g. _labels; not with --divisor-given, whose N would not be the count).
 * Built with -DKL_RES_TRACE (bench/prebuild.sh EXTRA=... SUFFIX=_trace), each resident launch's
 * RESULT line is preceded by TIMES lines: the last timed launch's span against its events, and
 * over its CTAs (cluster and side) when each entered, got its first stage, ended its rows and
 * exited, in us after the first entry (what a launch's fixed cost is made of). Built with
 * -DCE_RES_TRACE, the soft-target path's lines are preceded by cross_entropy.cu's TRACE line
 * (the shares of its groups' cycles by phase, over all timed launches) and its per-CTA stamps.
 * A benchmark, not a test: it checks nothing but CUDA errors.
 */
#define KL_NO_MAIN
#include "examples/kl_distill.cu"

#include "bench/bench_common.cuh"

int main(int argc, char **argv)
{
    std::string shapes = "4096x32768,4096x131072,4096x151936,4096x262144,16384x32768,16384x131072,16384x151936,16384x262144";
    std::string kinds = "kl_fwd,kl_rev,jsd";
    int iters = 20;
    std::string tag;
    bool fwd_only = false;
    int64_t topk = -1;
    bool variants = false;
    std::string jsd_keep; /* --jsd-keep -1: JSD also timed with each kl_args.jsd_keep listed (impl=lossfuse_keep<k>) */
    int stages = 0, max_cluster = 0; /* kl_args.stages / max_cluster (0: automatic) */
    bool div_given = false;          /* --divisor-given: the mean's divisor as a device scalar (no divisor kernel) */
    bool with_labels = false;        /* --labels: every 20th row ignored through its label (a divisor kernel) */
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--forward-only")) fwd_only = true;
        else if (!strcmp(argv[i], "--variants")) variants = true;
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) shapes = argv[++i];
        else if (!strcmp(argv[i], "--kinds") && i + 1 < argc) kinds = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tag") && i + 1 < argc) tag = argv[++i];
        else if (!strcmp(argv[i], "--topk") && i + 1 < argc) topk = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--jsd-keep") && i + 1 < argc) jsd_keep = argv[++i];
        else if (!strcmp(argv[i], "--stages") && i + 1 < argc) stages = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-cluster") && i + 1 < argc) max_cluster = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--divisor-given")) div_given = true;
        else if (!strcmp(argv[i], "--labels")) with_labels = true;
    }
    if (div_given && with_labels) {
        fprintf(stderr, "bench_kl: --divisor-given passes N, which is not the count of rows --labels leaves\n");
        return 2;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("bench_kl: no CUDA device\n");
        return 77;
    }
    bench_device_line();
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const size_t flush_bytes = 256u << 20;
    void *flush;
    CK(cudaMalloc(&flush, flush_bytes));
    bench_copy_line(e0, e1);

    const char *names[5] = {"kl_fwd", "kl_rev", "jsd", "softce", "tvd"};
    size_t pos = 0;
    int64_t N, V;
    while (bench_next_shape(shapes, &pos, &N, &V)) {
        const size_t nel = (size_t)N * V, bytes = nel * 2;
        void *xs, *xt, *pristine, *ws;
        float *loss;
        const size_t wsb = kl_workspace_bytes(N);
        CK(cudaMalloc(&xs, bytes));
        CK(cudaMalloc(&xt, topk >= 0 ? 16 : bytes));
        CK(cudaMalloc(&pristine, bytes));
        CK(cudaMalloc(&loss, 8));
        if (div_given) { /* loss[1]: the divisor, N (what the divisor kernel would count: no mask) */
            const float dn = (float)N;
            CK(cudaMemcpy(loss + 1, &dn, 4, cudaMemcpyHostToDevice));
        }
        CK(cudaMalloc(&ws, wsb));
        CK(cudaMemset(ws, 0, wsb));
        fill_logits<<<4096, 256>>>((__nv_bfloat16 *)pristine, (int64_t)nel, 12345u + (uint64_t)V);
        CK(cudaGetLastError());
        int32_t *kidx = NULL;
        float *klp = NULL;
        const int64_t K = topk < 0 ? 0 : std::min<int64_t>(topk, V);
        if (topk >= 0) {
            /* distinct indices spread over the row (offset per row), log-probs -2 - 0.2 q (sum 0.75) */
            std::vector<int32_t> hi((size_t)std::max<int64_t>(1, N * K));
            std::vector<float> hl(hi.size());
            for (int64_t i = 0; i < N; ++i)
                for (int64_t q = 0; q < K; ++q) {
                    hi[i * K + q] = (int32_t)(((i * 7919) + q * (V / std::max<int64_t>(K, 1))) % V);
                    hl[i * K + q] = -2.0f - 0.2f * (float)q;
                }
            CK(cudaMalloc(&kidx, hi.size() * 4));
            CK(cudaMalloc(&klp, hl.size() * 4));
            CK(cudaMemcpy(kidx, hi.data(), hi.size() * 4, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(klp, hl.data(), hl.size() * 4, cudaMemcpyHostToDevice));
        } else {
            fill_logits<<<4096, 256>>>((__nv_bfloat16 *)xt, (int64_t)nel, 777u + (uint64_t)V);
            CK(cudaGetLastError());
        }

        int64_t *labels = NULL;
        if (with_labels) { /* a valid index, -100 at every 20th row */
            std::vector<int64_t> hy((size_t)N);
            for (int64_t i = 0; i < N; ++i) hy[(size_t)i] = i % 20 == 7 ? -100 : (i * 31) % V;
            CK(cudaMalloc(&labels, (size_t)N * 8));
            CK(cudaMemcpy(labels, hy.data(), (size_t)N * 8, cudaMemcpyHostToDevice));
        }

        kl_args a = kl_args_default();
        a.labels = labels;
        a.labels_i64 = 1;
        a.student = xs;
        a.teacher = xt;
        a.n_rows = N;
        a.vocab = V;
        a.s_stride = a.t_stride = V;
        a.grad = fwd_only ? NULL : xs;
        a.grad_stride = V;
        a.loss = loss;
        if (div_given) a.divisor = loss + 1;
        a.workspace = ws;
        a.workspace_bytes = wsb;
        a.stages = stages;
        a.max_cluster = max_cluster;
        if (topk >= 0) {
            a.teacher = NULL;
            a.topk_idx = kidx;
            a.topk_lp = klp;
            a.topk = a.topk_stride = K;
            a.topk_rest = LF_KL_REST_SPREAD;
        }
        char suffix[32] = "";
        if (topk >= 0) snprintf(suffix, sizeof suffix, "_top%lld", (long long)K);
        const size_t moved = topk >= 0 ? (fwd_only ? 1 : 2) * bytes + (size_t)N * K * 8 : (fwd_only ? 2 : 3) * bytes;
        /* automatic, streamed, resident (rows from the counter, side CTAs automatic), resident with
         * static rows, resident from the counter without side CTAs */
        for (int kv = 0; kv < 25; ++kv) {
            const int k = kv % 5, sched = kv < 5 ? KL_SCHED_AUTO : kv < 10 ? KL_SCHED_STREAM : KL_SCHED_RESIDENT;
            const bool static_rows = kv >= 15 && kv < 20, noside = kv >= 20;
            if (("," + kinds + ",").find("," + std::string(names[k]) + ",") == std::string::npos) continue;
            if (sched != KL_SCHED_AUTO && !variants) continue;
            /* a sparse teacher: the automatic plan (the soft-target path for forward KL, soft CE and reverse KL,
             * kl_launch_soft) and the streamed one */
            if (sched == KL_SCHED_RESIDENT && topk >= 0) continue;
            kl_args b0 = a;
            b0.opts.kind = (lf_kl_kind)k;
            b0.schedule = sched;
            b0.static_rows = sched == KL_SCHED_RESIDENT ? (static_rows ? 1 : -1) : 0; /* forced: each way */
            b0.side_ctas = noside ? -1 : 0;
            /* the launch as asked, then (JSD, automatic plan) once per --jsd-keep value */
            std::vector<int> keeps = {0};
            if (k == LF_KL_JSD && sched == KL_SCHED_AUTO)
                for (size_t q = 0; q < jsd_keep.size();) {
                    const size_t e = jsd_keep.find(',', q);
                    keeps.push_back(atoi(jsd_keep.substr(q, e == std::string::npos ? std::string::npos : e - q).c_str()));
                    q = e == std::string::npos ? jsd_keep.size() : e + 1;
                }
            for (const int keep : keeps) {
                kl_args b = b0;
                b.jsd_keep = keep;
                char keep_tag[24] = "";
                if (keep != 0) snprintf(keep_tag, sizeof keep_tag, "_keep%d", keep);
                kl_plan plan;
                memset(&plan, 0, sizeof plan);
                b.plan = &plan;
                std::vector<float> t;
#ifdef CE_RES_TRACE
                { /* the soft-target path's cross-entropy kernel: its phases over the timed launches */
                    const unsigned long long tr_zero[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                    CK(cudaMemcpyToSymbol(ce_res_trace, tr_zero, sizeof tr_zero));
                }
#endif
                for (int it = 0; it < iters + 3; ++it) {
                    CK(cudaMemcpyAsync(xs, pristine, bytes, cudaMemcpyDeviceToDevice));
                    CK(cudaMemsetAsync(flush, it & 0xff, flush_bytes));
#ifdef KL_RES_TRACE
                    {
                        static unsigned long long zero[1024 * 4]; /* the stamps of the last launch only */
                        CK(cudaMemcpyToSymbolAsync(kl_res_times, zero, sizeof(kl_res_times), 0, cudaMemcpyHostToDevice));
                        CK(cudaMemcpyToSymbolAsync(kl_side_times, zero, sizeof(kl_side_times), 0, cudaMemcpyHostToDevice));
                    }
#endif
                    CK(cudaEventRecord(e0));
                    cudaError_t ce;
                    const lf_status st = kl_launch(&b, 0, &ce);
                    CK(cudaEventRecord(e1));
                    if (st != LF_OK) {
                        fprintf(stderr, "kl_launch: %s (%s)\n", lf_status_str(st), cudaGetErrorString(ce));
                        return 1;
                    }
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (it >= 3) t.push_back(ms);
                }
                CK(cudaGetLastError());
#ifdef CE_RES_TRACE
                if (plan.soft_target) { /* (cycles of every launch, the stamps of the last) */
                    unsigned long long tr[8];
                    CK(cudaMemcpyFromSymbol(tr, ce_res_trace, sizeof tr));
                    const int nb = plan.ctas < 1024 ? plan.ctas : 1024;
                    std::vector<unsigned long long> tm((size_t)nb * 4);
                    CK(cudaMemcpyFromSymbol(tm.data(), ce_res_times, tm.size() * 8));
                    char tg[64];
                    snprintf(tg, sizeof tg, "mode=%s", names[k]);
                    bench_res_trace_lines("lossfuse", tg, N, V, tr, tm, nb, 3);
                }
#endif
#ifdef KL_RES_TRACE
                if (plan.schedule == KL_SCHED_RESIDENT) { /* the last launch's stamps, us after the first CTA's entry */
                    const int nr = std::min(plan.ctas, 1024), ns = std::min(plan.side_ctas, 256);
                    std::vector<unsigned long long> tr((size_t)1024 * 4), ts((size_t)256 * 4);
                    CK(cudaMemcpyFromSymbol(tr.data(), kl_res_times, tr.size() * 8));
                    CK(cudaMemcpyFromSymbol(ts.data(), kl_side_times, ts.size() * 8));
                    unsigned long long t0 = ~0ull, t1 = 0;
                    for (int c = 0; c < nr; ++c) t0 = std::min(t0, tr[4 * c]), t1 = std::max(t1, tr[4 * c + 3]);
                    for (int c = 0; c < ns; ++c) t0 = std::min(t0, ts[4 * c]), t1 = std::max(t1, ts[4 * c + 3]);
                    char tg[64];
                    snprintf(tg, sizeof tg, "mode=%s", names[k]);
                    printf("TIMES impl=lossfuse %s N=%lld V=%lld span=%.1f us (first entry to last exit), last launch %.1f us "
                           "(events)\n", tg, (long long)N, (long long)V, (double)(t1 - t0) * 1e-3, t.back() * 1e3);
                    static const char *const sn[4] = {"side_entry", "-", "side_rows_end", "side_exit"};
                    bench_times_lines("lossfuse", tg, N, V, tr.data(), 4, nr, 0, 4, bench_res_times_names, t0);
                    bench_times_lines("lossfuse", tg, N, V, ts.data(), 4, ns, 0, 4, sn, t0);
                }
#endif
                printf("RESULT impl=lossfuse%s%s%s mode=%s%s%s N=%lld V=%lld dtype=bf16 ms=%.4f bytes=%zu extra_bytes=%zu "
                       "status=ok schedule=%s cluster=%d stages=%d pieces=%d ctas=%d dynamic=%d side=%d keep=%d\n",
                       sched == KL_SCHED_STREAM         ? "_streamed"
                       : static_rows                    ? "_resident_static"
                       : noside                         ? "_resident_noside"
                       : sched == KL_SCHED_RESIDENT     ? "_resident"
                                                        : "",
                       keep_tag, tag.c_str(),
                       names[k], suffix, fwd_only ? "_fo" : "", (long long)N, (long long)V, median(t), moved, wsb,
                       plan.soft_target ? "soft_target" : plan.schedule == KL_SCHED_RESIDENT ? "resident" : "streamed", plan.cluster, plan.stages, plan.pieces,
                       plan.ctas, plan.dynamic, plan.side_ctas, plan.jsd_keep);
                fflush(stdout);
            }
        }
        CK(cudaFree(xs));
        CK(cudaFree(xt));
        CK(cudaFree(pristine));
        CK(cudaFree(loss));
        CK(cudaFree(ws));
        if (kidx) CK(cudaFree(kidx));
        if (klp) CK(cudaFree(klp));
        if (labels) CK(cudaFree(labels));
    }
    return 0;
}
