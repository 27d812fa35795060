/* bench/bench_ce.cu — times examples/cross_entropy.cu against the bytes-moved floor.
 *
 *   bench_ce [--shapes 4096x32768,16384x262144,...] [--iters 20] [--variants] [--clusters 0,1,2,4]
 *            [--stages 2,3,4] [--modes fwdbwd,fwd] [--separate-grad] [--fwd-flush] [--fwdbwd-probes]
 *            [--tag _name] [--dtype bf16|f32]
 *
 * Prints machine-readable lines that bench/report.py turns into the table and chart:
 *   DEVICE name=...
 *   COPY impl=cuda gbps=... bytes=...        device-to-device copy, bytes read + written
 *   RESULT impl=lossfuse mode=fwdbwd N=.. V=.. dtype=bf16 ms=.. bytes=.. extra_bytes=.. status=ok
 * fwdbwd: fused forward+backward, gradient in place over the logits, reduction mean (floor:
 * read bf16 logits once + write the gradient once = 4 B/elem). fwd: forward-only token
 * statistics (logprob, lse, entropy, argmax, accuracy; floor 2 B/elem).
 * impl=lossfuse is the automatic plan (fwdbwd: row-resident on sm_90; fwd: a warp per row).
 * --variants adds
 * impl=lossfuse_streamed (the streaming schedule, its automatic cluster plan) and
 * lossfuse_nocluster (streamed, max_cluster = 1: CTAs re-read their pieces) and, forward only,
 * lossfuse_warp (one warp per row, forced also where the automatic plan streams) and
 * lossfuse_static (the row-resident schedule with a fixed share of rows per CTA instead of rows
 * handed out by a counter; also alone with --static-rows), so the design choices stay measured; --clusters 0,1,2,4,8 times each cluster cap of the automatic plan
 * (lossfuse_cN); --stages 2,3,4 each stage count of the row-resident schedule (lossfuse_sN).
 * --separate-grad writes the gradient to another buffer instead of in place (same floor bytes).
 * --tag appends to every impl name (bench/tune.sh builds variants with other tile macros).
 * --dtype f32: fp32 logits and gradient (floor 8 B/elem fwd+bwd, 4 B/elem forward only; the
 * fill's values kept in fp32, not rounded to bf16); its impl names end in _f32.
 * --fwdbwd-probes also times the fused forward+backward three other ways, to split its cost:
 * impl=<name>_rnone (reduction none: no divisor kernel, no batch sum), <name>_divgiven (mean with
 * the divisor given as a device scalar: no divisor kernel) and <name>_rot (no restore and no
 * flush: two buffers alternate, each holding the previous launch's gradient, so L2 starts full of
 * a fused launch's own dirty lines; measured within 1% of the flush).
 * Built with -DCE_RES_TRACE (bench/prebuild.sh EXTRA=...), each fwdbwd line of the row-resident
 * schedule is followed by a TRACE line: the shares of the row loop's cycles per phase (waiting
 * for the stage, statistics, block merge, cluster exchange, gradient, group barrier + reload),
 * and TIMES lines: over the last launch's CTAs, when each got its first stage, ended its row
 * loop and exited (us after the earliest entry: how far apart the CTAs finish).
 * Each RESULT line also says the plan chosen (cluster size, pieces per slice, CTAs).
 * L2 before each timed launch: a launch should start with L2 in the state that a launch of its
 * own kind leaves, filled with other data, so that it pays for its own traffic and no one
 * else's. fwdbwd: the logits are restored from a pristine copy and a 256 MiB buffer is written
 * (untimed), so L2 holds none of the input and is full of dirty lines, as the kernel leaves it
 * (its own gradient). fwd (read-only: it leaves L2 clean): the launches alternate between two
 * copies of the logits, each larger than L2, with nothing in between, so each starts with the
 * other copy's clean tail in L2 (METHOD.md's rotation of input sets). After a 256 MiB write
 * instead, a forward pass would also pay for writing that buffer's last ~L2-size of dirty lines
 * back to HBM (measured at 4096 x 32768: +3.9 us on an H200, +8.0 us on an H100); --fwd-flush times
 * the forward passes that way too, as impl=<name>_l2dirty. Where nothing else precedes a timed
 * launch (the rotated forward passes), a 50 us spin kernel (bench_delay: no memory traffic) does,
 * so that the host's launch latency stays out of the events, as the restore and the flush keep it
 * out otherwise. The median is reported.
 * A benchmark, not a test: it checks nothing but CUDA errors.
 */
#define CE_NO_MAIN
#include "examples/cross_entropy.cu"

#include "bench/bench_common.cuh"

int main(int argc, char **argv)
{
    std::string shapes = "4096x32768,4096x131072,4096x151936,4096x262144,16384x32768,16384x131072,16384x151936,16384x262144";
    int iters = 20;
    std::string tag; /* appended to impl names: for binaries built with other CE_* tile macros */
    struct variant { int max_cluster, schedule, stages; std::string name; int static_rows = 0; };
    std::vector<variant> variants = {{0, CE_SCHED_AUTO, 0, "lossfuse"}};
    bool do_mode[2] = {true, true};
    bool separate = false; /* gradient to another buffer */
    bool fwd_flush = false; /* forward passes also timed after the L2 flush (impl suffix _l2dirty) */
    bool probes = false;    /* fwdbwd also timed as _rnone, _divgiven and _rot (see above) */
    bool f32 = false;       /* --dtype f32 */
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--shapes") && i + 1 < argc) shapes = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--variants")) {
            variants.push_back({0, CE_SCHED_STREAM, 0, "lossfuse_streamed"});
            variants.push_back({1, CE_SCHED_STREAM, 0, "lossfuse_nocluster"});
            variants.push_back({0, CE_SCHED_WARP, 0, "lossfuse_warp"}); /* forward only */
            variants.push_back({0, CE_SCHED_AUTO, 0, "lossfuse_static", 1}); /* fixed rows per CTA */
        } else if (!strcmp(argv[i], "--static-rows")) {
            variants.push_back({0, CE_SCHED_AUTO, 0, "lossfuse_static", 1});
        } else if (!strcmp(argv[i], "--tag") && i + 1 < argc) tag = argv[++i];
        else if (!strcmp(argv[i], "--separate-grad")) separate = true;
        else if (!strcmp(argv[i], "--fwd-flush")) fwd_flush = true;
        else if (!strcmp(argv[i], "--fwdbwd-probes")) probes = true;
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) {
            const char *d = argv[++i];
            if (strcmp(d, "f32") && strcmp(d, "bf16")) {
                fprintf(stderr, "bench_ce: --dtype bf16 or f32, not %s\n", d);
                return 2;
            }
            f32 = !strcmp(d, "f32");
        }
        else if (!strcmp(argv[i], "--clusters") && i + 1 < argc) { /* e.g. 0,1,2,4,8 */
            variants.clear();
            for (char *t = strtok(argv[++i], ","); t; t = strtok(NULL, ",")) {
                const int mc = atoi(t);
                variants.push_back({mc, CE_SCHED_AUTO, 0, mc == 0 ? "lossfuse" : "lossfuse_c" + std::to_string(mc)});
            }
        } else if (!strcmp(argv[i], "--stages") && i + 1 < argc) { /* e.g. 2,3,4 */
            for (char *t = strtok(argv[++i], ","); t; t = strtok(NULL, ","))
                variants.push_back({0, CE_SCHED_RESIDENT, atoi(t), std::string("lossfuse_s") + t});
        } else if (!strcmp(argv[i], "--modes") && i + 1 < argc) { /* fwdbwd, fwd or both */
            do_mode[0] = do_mode[1] = false;
            for (char *t = strtok(argv[++i], ","); t; t = strtok(NULL, ",")) {
                if (!strcmp(t, "fwdbwd")) do_mode[0] = true;
                if (!strcmp(t, "fwd")) do_mode[1] = true;
            }
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("bench_ce: no CUDA device\n");
        return 77;
    }
    const cudaDeviceProp prop = bench_device_line();

    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const size_t flush_bytes = 256u << 20;
    void *flush;
    CK(cudaMalloc(&flush, flush_bytes));

    bench_copy_line(e0, e1);

    size_t pos = 0;
    int64_t N, V;
    while (bench_next_shape(shapes, &pos, &N, &V)) {
        const size_t esz = f32 ? 4 : 2, nel = (size_t)N * V, bytes = nel * esz;
        void *x, *pristine, *ws;
        int64_t *y;
        float *loss, *lp, *lse, *ent;
        int32_t *am;
        unsigned *cnt;
        const size_t wsb = ce_workspace_bytes(N);
        void *g = nullptr;
        CK(cudaMalloc(&x, bytes));
        CK(cudaMalloc(&pristine, bytes));
        if (separate) CK(cudaMalloc(&g, bytes));
        CK(cudaMalloc(&y, N * 8));
        CK(cudaMalloc(&loss, N * 4));
        CK(cudaMalloc(&lp, N * 4));
        CK(cudaMalloc(&lse, N * 4));
        CK(cudaMalloc(&ent, N * 4));
        CK(cudaMalloc(&am, N * 4));
        CK(cudaMalloc(&cnt, 8));
        CK(cudaMalloc(&ws, wsb));
        CK(cudaMemset(ws, 0, wsb));
        CK(cudaMemset(cnt, 0, 8));
        auto fill_pristine = [&]() {
            if (f32) fill_logits<<<4096, 256>>>((float *)pristine, (int64_t)nel, 12345u + (uint64_t)V);
            else fill_logits<<<4096, 256>>>((__nv_bfloat16 *)pristine, (int64_t)nel, 12345u + (uint64_t)V);
            CK(cudaGetLastError());
        };
        fill_pristine();
        std::vector<int64_t> yh(N);
        for (int64_t i = 0; i < N; ++i) yh[i] = (i % 20 == 7) ? -100 : (int64_t)((i * 2654435761ull) % (uint64_t)V);
        CK(cudaMemcpy(y, yh.data(), N * 8, cudaMemcpyHostToDevice));
        if (do_mode[1] && bytes < 2 * (size_t)prop.l2CacheSize)
            printf("NOTE N=%lld V=%lld: the logits are smaller than twice L2, so the rotated forward passes read part "
                   "of them from L2\n", (long long)N, (long long)V);

        ce_args a = ce_args_default();
        a.logits = x;
        a.dtype = f32 ? LF_F32 : LF_BF16;
        a.n_rows = N;
        a.vocab = V;
        a.stride = V;
        a.labels = y;
        a.labels_i64 = 1;
        a.loss = loss;
        a.workspace = ws;
        a.workspace_bytes = wsb;
        a.n_errors = cnt + 1;

        for (const variant &va : variants) {
            const std::string impl = va.name + tag + (f32 ? "_f32" : "");
            /* 0 fwdbwd; 1 fwd, rotating two copies of the logits; 2 fwd after the L2 flush; 3 fwdbwd with
             * reduction none; 4 fwdbwd rotating two buffers, each the previous gradient, nothing between;
             * 5 fwdbwd with the mean's divisor given (a device scalar: no divisor kernel) */
            for (int mode = 0; mode < 6; ++mode) {
                const bool fwd = mode == 1 || mode == 2;
                if (!do_mode[fwd ? 1 : 0] || (mode == 2 && !fwd_flush) || (mode >= 3 && !probes) ||
                    (!fwd && va.schedule == CE_SCHED_WARP))
                    continue;
                ce_args b = a;
                b.max_cluster = va.max_cluster;
                b.schedule = va.schedule;
                b.stages = va.stages;
                b.static_rows = va.static_rows;
                ce_plan plan;
                b.plan = &plan;
                if (!fwd) {
                    b.grad = separate ? g : x;
                    b.grad_stride = V;
                    if (mode == 3) {
                        b.reduction = LF_REDUCE_NONE;
                        b.loss = lp;
                    }
                    if (mode == 5) b.divisor = ent; /* any positive device float: written below */
                } else {
                    b.reduction = LF_REDUCE_NONE;
                    b.logprob = lp;
                    b.lse = lse;
                    b.entropy = ent;
                    b.argmax = am;
                    b.n_correct = cnt;
                }
                std::vector<float> t;
                if (mode == 5) {
                    const float d = (float)N;
                    CK(cudaMemcpy(ent, &d, 4, cudaMemcpyHostToDevice));
                }
                CK(cudaMemcpy(x, pristine, bytes, cudaMemcpyDeviceToDevice));
#ifdef CE_RES_TRACE
                const unsigned long long tr_zero[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                CK(cudaMemcpyToSymbol(ce_res_trace, tr_zero, sizeof tr_zero));
#endif
                for (int it = 0; it < iters + 3; ++it) {
                    if (mode == 0 || mode == 3 || mode == 5) CK(cudaMemcpyAsync(x, pristine, bytes, cudaMemcpyDeviceToDevice));
                    if (mode != 1 && mode != 4) CK(cudaMemsetAsync(flush, it & 0xff, flush_bytes));
                    if (mode == 1 || mode == 4) { /* the GPU kept busy while the host launches */
                        b.logits = (it & 1) ? pristine : x;
                        if (mode == 4) b.grad = (it & 1) ? pristine : x;
                        bench_delay<<<1, 32>>>(50000);
                        CK(cudaGetLastError());
                    }
                    CK(cudaEventRecord(e0));
                    cudaError_t ce;
                    const lf_status st = ce_launch(&b, 0, &ce);
                    CK(cudaEventRecord(e1));
                    if (st != LF_OK) {
                        fprintf(stderr, "ce_launch: %s (%s)\n", lf_status_str(st), cudaGetErrorString(ce));
                        return 1;
                    }
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (it >= 3) t.push_back(ms);
                }
                CK(cudaGetLastError());
                if (mode == 4) { /* pristine holds gradients now */
                    fill_pristine();
                }
                const size_t floor_bytes = fwd ? bytes : 2 * bytes;
#ifdef CE_RES_TRACE
                if (plan.schedule == CE_SCHED_RESIDENT) { /* the shares of the row loop's cycles (thread 0 of each group) */
                    unsigned long long tr[8];
                    CK(cudaMemcpyFromSymbol(tr, ce_res_trace, sizeof tr));
                    const int nb = plan.ctas < 1024 ? plan.ctas : 1024;
                    std::vector<unsigned long long> tm((size_t)nb * 4);
                    CK(cudaMemcpyFromSymbol(tm.data(), ce_res_times, tm.size() * 8));
                    bench_res_trace_lines(impl.c_str(), fwd ? "mode=fwd" : "mode=fwdbwd", N, V, tr, tm, nb, 3);
                }
#endif
                printf("RESULT impl=%s%s mode=%s N=%lld V=%lld dtype=%s ms=%.4f bytes=%zu extra_bytes=%zu status=ok "
                       "schedule=%s cluster=%d pieces=%d stages=%d ctas=%d dynamic=%d\n", impl.c_str(), mode == 2 ? "_l2dirty" : mode == 3 ? "_rnone" : mode == 4 ? "_rot" : mode == 5 ? "_divgiven" : "",
                       fwd ? "fwd" : "fwdbwd", (long long)N, (long long)V, f32 ? "f32" : "bf16", median(t), floor_bytes, wsb,
                       plan.schedule == CE_SCHED_RESIDENT ? "resident" : plan.schedule == CE_SCHED_WARP ? "warp" : "streamed",
                       plan.cluster, plan.pieces, plan.stages,
                       plan.ctas, plan.dynamic);
                fflush(stdout);
            }
        }
        CK(cudaFree(x));
        CK(cudaFree(pristine));
        if (g) CK(cudaFree(g));
        CK(cudaFree(y));
        CK(cudaFree(loss));
        CK(cudaFree(lp));
        CK(cudaFree(lse));
        CK(cudaFree(ent));
        CK(cudaFree(am));
        CK(cudaFree(cnt));
        CK(cudaFree(ws));
    }
    return 0;
}
