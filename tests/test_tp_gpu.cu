/* tests/test_tp_gpu.cu — GPU tests of examples/vocab_parallel_ce.cu (vocabulary-parallel
 * cross-entropy), tp ranks simulated in one process, against the single-GPU cross-entropy of the
 * full vocabulary (examples/cross_entropy.cu, itself tested against the double reference).
 *
 *   test_tp_gpu            tp in {1, 2, 3, 4} x dtypes x options x layouts, and the large cases
 *   test_tp_gpu --small    fewer, smaller cases (for compute-sanitizer)
 *   test_tp_gpu --seed S   reproduce a run
 *   test_tp_gpu --nccl     also the NCCL paths (all-gathers; read-once over symmetric windows), one
 *                          GPU per rank, for every tp <= the GPUs seen, over a matrix of options
 * Exit: 0 all passed, 1 a check failed, 77 no CUDA device (meson counts it as skipped).
 *
 * Each case (tp_demo_run) draws logits with outliers (and optionally -inf entries, NaN rows),
 * labels with ignored and bad ones and labels on the shard boundaries, runs the single-GPU
 * kernel on the full rows and the tp shards (each its own buffer, optionally with a padded row
 * stride), and checks: the loss (per row for reduction none, else reduced) and every row's lse
 * within the fp32 order-of-summation bound derived in tp_demo_run, every gradient element of
 * every shard against the full row's (two roundings to the dtype plus the lse difference on
 * the p_j term), that every rank holds the same bits of loss / z / lse, the bad-label count,
 * that every output was written (all poisoned with NaN first), and with `repeat` that a second
 * run is bit-identical.
 */
#define TP_NO_MAIN
#include "examples/vocab_parallel_ce.cu"

#include "tests/gpu_test.cuh"

static void run(const char *name, const tp_demo &d)
{
    snprintf(g_case, sizeof g_case, "%s tp=%d N=%lld V=%lld %s%s", name, d.tp, (long long)d.N, (long long)d.V, dt_name(d.dt),
             d.use_nccl ? " NCCL" : "");
    const int fails = g_fail;
    const tp_demo_result r = tp_demo_run(&d);
    EXPECT(r.st == LF_OK, "tp_demo_run: %s (%s)", lf_status_str(r.st), cudaGetErrorString(r.cuda));
    if (r.st == LF_OK) {
        EXPECT(r.loss_err <= 1.0, "loss %.9g, single GPU %.9g (%.3g x tol)", r.loss, r.loss_ref, r.loss_err);
        EXPECT(r.lse_err <= 1.0, "lse off by %.3g x tol", r.lse_err);
        EXPECT(r.grad_err <= 1.0, "gradient off by %.3g x tol", r.grad_err);
        EXPECT(r.rank_mismatch == 0, "%lld ranks hold other bits than rank 0", (long long)r.rank_mismatch);
        EXPECT(r.nondeterministic == 0, "a second run differs (%lld)", (long long)r.nondeterministic);
        EXPECT(r.errors == r.errors_ref, "bad labels %u, single GPU %u", r.errors, r.errors_ref);
    }
    printf("%-4s %s (chunks %lld x %lld rows, %d CTAs/row; worst: loss %.2g lse %.2g grad %.2g of tol)\n",
           g_fail == fails ? "ok" : "FAIL", g_case, (long long)r.plan.chunks, (long long)r.plan.chunk_rows, r.plan.nsplit,
           r.loss_err, r.lse_err, r.grad_err);
    fflush(stdout);
}

/* Argument checks: each bad field is refused before anything is launched. */
static void test_args(void)
{
    snprintf(g_case, sizeof g_case, "argument checks");
    const int fails = g_fail;
    DevBuf x(1024), lab(64), loss(64), ws(4096), sh(4096);
    tp_ce_args a = tp_ce_args_default();
    a.logits = x.p;
    a.n_rows = 4;
    a.vocab = 10;
    a.tp = 2;
    a.rank = 1;
    a.stride = 5;
    a.labels = lab.p;
    a.loss = (float *)loss.p;
    a.workspace = ws.p;
    a.workspace_bytes = tp_ce_workspace_bytes(4, 5, LF_BF16);
    a.shares = (lf_tp_share *)sh.p;
    a.shares_bytes = tp_ce_shares_bytes(4, 2);
    tp_run r;
    cudaError_t e;
    EXPECT(tp_ce_plan(&a, &r, &e) == LF_OK, "a valid call is refused");
    tp_ce_args b = a;
    b.rank = 2;
    EXPECT(tp_ce_plan(&b, &r, &e) == LF_ERR_ARG, "rank >= tp");
    b = a;
    b.stride = 4;
    EXPECT(tp_ce_plan(&b, &r, &e) == LF_ERR_SIZE, "stride below the shard width");
    b = a;
    b.shares_bytes = 12 * 4;
    EXPECT(tp_ce_plan(&b, &r, &e) == LF_ERR_SIZE, "shares too small");
    b = a;
    b.workspace_bytes = 64;
    EXPECT(tp_ce_plan(&b, &r, &e) == LF_ERR_SIZE, "workspace too small");
    b = a;
    b.opts.label_smoothing = 1.5f;
    EXPECT(tp_ce_plan(&b, &r, &e) == LF_ERR_ARG, "smoothing outside [0, 1]");
    b = a;
    b.grad = (char *)x.p + 2; /* overlaps the logits without being them */
    b.grad_stride = 5;
    EXPECT(tp_ce_plan(&b, &r, &e) == LF_ERR_ARG, "a gradient overlapping the logits");
    b = a;
    b.shares = NULL;
    EXPECT(tp_ce_plan(&b, &r, &e) == LF_ERR_NULL, "no shares buffer");
    b = a;
    b.tp = TP_MAX_RANKS + 1;
    EXPECT(tp_ce_plan(&b, &r, &e) == LF_ERR_ARG, "tp above TP_MAX_RANKS");
    printf("%-4s %s\n", g_fail == fails ? "ok" : "FAIL", g_case);
}

int main(int argc, char **argv)
{
    bool with_nccl = false;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--small")) g_small = 1;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) g_seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--nccl")) with_nccl = true;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("test_tp_gpu: no CUDA device, skipped\n");
        return 77;
    }
    if (!g_seed) g_seed = (uint64_t)time(NULL);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("test_tp_gpu on %s (sm_%d%d), %d device(s), seed %llu%s\n", prop.name, prop.major, prop.minor, ndev,
           (unsigned long long)g_seed, g_small ? ", small sizes" : "");

    test_args();

    tp_demo b;
    memset(&b, 0, sizeof b);
    b.opts = lf_ce_opts_default();
    b.dt = LF_BF16;
    b.reduction = LF_REDUCE_MEAN;
    b.grad_scale = 1.0f;
    b.in_place = 1;
    b.labels_i64 = 1;
    b.ignore_frac = 0.1;
    b.bad_frac = 0.02;
    b.edge_labels = 1;
    b.N = g_small ? 37 : 257;
    b.V = g_small ? 3001 : 32771;
    const lf_dtype dts[3] = {LF_BF16, LF_F16, LF_F32};
    int turn = 0;
    for (int tp : {1, 2, 3, 4}) {
        tp_demo d = b;
        d.tp = tp;
        d.seed = g_seed + (uint64_t)tp;
        run("plain, in place", d);

        d.dt = dts[++turn % 3];
        d.in_place = 0;
        d.labels_i64 = 0;
        d.pad = 3;
        d.chunk_rows = 7; /* many chunks, the last one short */
        d.opts.label_smoothing = 0.1f;
        d.opts.z_loss = 1e-4f;
        d.repeat = 1;
        run("smoothing + z-loss, separate padded gradient, int32 labels, 7-row chunks, repeat", d);

        d = b;
        d.tp = tp;
        d.seed = g_seed * 3 + (uint64_t)tp;
        d.dt = dts[++turn % 3];
        d.opts.class_weights = (const float *)1; /* random weights */
        d.opts.label_smoothing = 0.2f;
        d.opts.softcap = 20.0f;
        d.opts.logit_scale = 0.7f;
        d.reduction = LF_REDUCE_SUM;
        d.use_dloss = 1;
        d.grad_scale = 0.5f;
        d.V = g_small ? 1000 : 50257;
        run("class weights + smoothing + softcap + scale, sum, upstream gradient", d);

        d = b;
        d.tp = tp;
        d.seed = g_seed * 5 + (uint64_t)tp;
        d.dt = dts[++turn % 3];
        d.reduction = LF_REDUCE_NONE;
        d.use_dloss = 1;
        d.neg_inf = 1;
        d.nan_rows = 1;
        d.opts.z_loss = 1e-3f;
        run("reduction none, -inf entries, NaN rows", d);

        d = b;
        d.tp = tp;
        d.seed = g_seed * 7 + (uint64_t)tp;
        d.use_divisor = 1;
        d.divisor_value = 0.0f;
        run("mean with a zero device divisor", d);
        d.divisor_value = 1234.5f;
        d.opts.class_weights = (const float *)1;
        run("mean with a device divisor, class weights", d);

        d = b;
        d.tp = tp;
        d.seed = g_seed * 11 + (uint64_t)tp;
        d.forward_only = 1;
        d.reduction = LF_REDUCE_NONE;
        d.opts.label_smoothing = 0.05f;
        run("forward only", d);

        d = b;
        d.tp = tp;
        d.seed = g_seed * 13 + (uint64_t)tp;
        d.all_ignored = 1;
        run("all rows ignored", d);

        for (int64_t V : {(int64_t)1, (int64_t)3, (int64_t)7, (int64_t)100}) {
            d = b;
            d.tp = tp;
            d.seed = g_seed * 17 + (uint64_t)(tp * 100 + V);
            d.V = V;
            d.N = V == 7 ? 1 : 23;
            d.dt = dts[++turn % 3];
            d.opts.label_smoothing = V == 3 ? 0.3f : 0.0f;
            run(V < tp ? "V < tp (empty shards)" : "tiny V", d);
        }
    }
    for (int64_t chunk : {(int64_t)0, (int64_t)1, (int64_t)5, (int64_t)16}) {
        tp_demo d = b; /* tp = 1 through tp_ce_launch: the pipelined schedule itself (lag, PDL) */
        d.tp = 1;
        d.launch_single = 1;
        d.chunk_rows = chunk;
        d.seed = g_seed * 19 + (uint64_t)chunk;
        d.opts.label_smoothing = chunk == 5 ? 0.1f : 0.0f;
        d.repeat = 1;
        d.in_place = chunk != 16;
        run(chunk ? "tp_ce_launch, pipelined chunks" : "tp_ce_launch, one chunk", d);
    }
    {
        tp_demo d = b; /* most 1-row steps have no valid row: their CTAs must still order the steps */
        d.tp = 1;
        d.launch_single = 1;
        d.chunk_rows = 1;
        d.ignore_frac = 0.8;
        d.seed = g_seed * 23;
        d.repeat = 1;
        d.in_place = 0;
        run("tp_ce_launch, 1-row chunks, 80% ignored", d);
    }
    {
        tp_demo d = b; /* more ranks than a warp: lf_tp_merge_warp takes the shares 32 at a time */
        d.tp = 40;
        d.V = 1000;
        d.N = 37;
        d.seed = g_seed * 31;
        d.opts.label_smoothing = 0.1f;
        d.opts.class_weights = (const float *)1;
        run("40 ranks", d);
    }
    if (!g_small) {
        tp_demo d = b; /* more rows than grid y holds twice: chunks of 32767 */
        d.tp = 1;
        d.launch_single = 1;
        d.N = 131075;
        d.V = 7;
        d.seed = g_seed * 29;
        run("tp_ce_launch, 131075 rows", d);
        d.tp = 3;
        d.launch_single = 0;
        d.V = 100;
        run("simulated, 131075 rows", d);
    }
    if (!g_small) {
        tp_demo d = b;
        d.tp = 2;
        d.seed = g_seed + 99;
        d.N = 4096;
        d.V = 151936;
        d.check_rows = 64;
        d.repeat = 1;
        d.in_place = 0;
        run("Qwen vocabulary, repeat", d);
        d = b;
        d.tp = 2;
        d.seed = g_seed + 98;
        d.N = 16389;
        d.V = 262144; /* a shard of 16389 x 131072 elements: more than 2^31 */
        d.check_rows = 12;
        d.ignore_frac = 0.0;
        d.bad_frac = 0.0;
        run("shard rows x columns > 2^31", d);
    }
#ifdef LF_HAVE_NCCL
    if (with_nccl)
        for (int tp = 1; tp <= ndev && tp <= 8; tp *= 2) {
            /* both exchanges (the all-gathers; the read-once schedule over symmetric windows)
             * over the options and layouts that change what crosses between the ranks */
            for (int lsa = 0; lsa <= 1; ++lsa) {
#ifndef TP_HAVE_LSA
                if (lsa) {
                    printf("skip NCCL read-once cases: this NCCL has no symmetric windows\n");
                    break;
                }
#endif
                const char *nm = lsa ? "NCCL read-once" : "NCCL all-gather";
                char name[96];
                tp_demo d = b;
                d.tp = tp;
                d.use_nccl = 1;
                d.lsa = lsa;
                d.seed = g_seed + 1000 + (uint64_t)(16 * tp + 2 * lsa);
                d.opts.label_smoothing = 0.1f;
                d.opts.z_loss = 1e-4f;
                d.repeat = 1; /* two launches: both parities of the window */
                snprintf(name, sizeof name, "%s, smoothing, z-loss, repeat", nm);
                run(name, d);
                d.chunk_rows = 16;
                d.lsa_lag = 3;
                d.seed += 100;
                snprintf(name, sizeof name, "%s, 16-row chunks, lag 3", nm);
                run(name, d);
                if (lsa) { /* the most waiting: the gradient right behind its statistics, few CTAs */
                    d.chunk_rows = 5;
                    d.lsa_lag = 1;
                    d.lsa_ctas_per_sm = 1;
                    d.lsa_hints = -1;
                    d.seed += 100;
                    snprintf(name, sizeof name, "%s, 5-row chunks, lag 1, 1 CTA per SM, no L2 hints", nm);
                    run(name, d);
                    /* automatic chunks with V % tp != 0: an eighth of L2 over a row of 16385 or
                     * 16384 bf16 is 239 or 240 rows on an H200 (199 / 200 on an H100); every
                     * rank must take the widest shard's (tp_lsa_plan), or at tp = 2 the ranks
                     * would cut different chunks */
                    d = b;
                    d.tp = tp;
                    d.use_nccl = 1;
                    d.lsa = 1;
                    d.seed = g_seed + 1500 + (uint64_t)(16 * tp);
                    d.N = 600;
                    d.V = 32769;
                    d.chunk_rows = 0;
                    d.repeat = 1;
                    snprintf(name, sizeof name, "%s, V %% tp != 0, automatic chunks, repeat", nm);
                    run(name, d);
                }
                d = b;
                d.tp = tp;
                d.use_nccl = 1;
                d.lsa = lsa;
                d.seed = g_seed + 2000 + (uint64_t)(16 * tp + 2 * lsa);
                d.dt = LF_F32;
                d.reduction = LF_REDUCE_NONE;
                d.use_dloss = 1;
                d.in_place = 0;
                d.pad = 3;
                d.chunk_rows = 1;
                d.labels_i64 = 0;
                snprintf(name, sizeof name, "%s, fp32, none, upstream, padded, 1-row chunks", nm);
                run(name, d);
                d = b;
                d.tp = tp;
                d.use_nccl = 1;
                d.lsa = lsa;
                d.seed = g_seed + 3000 + (uint64_t)(16 * tp + 2 * lsa);
                d.dt = LF_F16;
                d.opts.softcap = 30.0f;
                d.opts.logit_scale = 0.5f;
                d.opts.class_weights = (const float *)1; /* random weights */
                d.neg_inf = 1;
                d.nan_rows = 1;
                snprintf(name, sizeof name, "%s, fp16, softcap, scale, weights, -inf, NaN", nm);
                run(name, d);
                d = b;
                d.tp = tp;
                d.use_nccl = 1;
                d.lsa = lsa;
                d.seed = g_seed + 4000 + (uint64_t)(16 * tp + 2 * lsa);
                d.forward_only = 1;
                d.use_divisor = 1;
                d.divisor_value = 123.0f;
                snprintf(name, sizeof name, "%s, forward only, device divisor", nm);
                run(name, d);
                d = b;
                d.tp = tp;
                d.use_nccl = 1;
                d.lsa = lsa;
                d.seed = g_seed + 5000 + (uint64_t)(16 * tp + 2 * lsa);
                d.all_ignored = 1;
                d.repeat = 1; /* two launches that wait on no row's shares (read-once: the end-of-launch wait) */
                snprintf(name, sizeof name, "%s, all ignored, repeat", nm);
                run(name, d);
                d.all_ignored = 0;
                d.repeat = 0;
                d.N = 1;
                snprintf(name, sizeof name, "%s, one row", nm);
                run(name, d);
                d.N = 0;
                snprintf(name, sizeof name, "%s, no rows", nm);
                run(name, d);
                if (!g_small) {
                    d = b;
                    d.tp = tp;
                    d.use_nccl = 1;
                    d.lsa = lsa;
                    d.seed = g_seed + 6000 + (uint64_t)(16 * tp + 2 * lsa);
                    d.N = 4096;
                    d.V = 151936;
                    d.check_rows = 64;
                    d.repeat = 1;
                    snprintf(name, sizeof name, "%s, Qwen vocabulary, repeat", nm);
                    run(name, d);
                }
            }
        }
#else
    if (with_nccl) printf("skip NCCL cases: built without LF_HAVE_NCCL\n");
#endif

    printf("test_tp_gpu: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
