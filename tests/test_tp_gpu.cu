/* tests/test_tp_gpu.cu — GPU tests of examples/vocab_parallel_ce.cu (vocabulary-parallel
 * cross-entropy), tp ranks simulated in one process, against the single-GPU cross-entropy of the
 * full vocabulary (examples/cross_entropy.cu, itself tested against the double reference).
 *
 *   test_tp_gpu            tp in {1, 2, 3, 4} x dtypes x options x layouts, and the large cases;
 *                          the read-once schedules (resident, chunked) with every rank's window on
 *                          this GPU (tp_sim_windows: the ranks' kernels run at once)
 *   test_tp_gpu --small    fewer, smaller cases (for compute-sanitizer)
 *   test_tp_gpu --seed S   reproduce a run
 *   test_tp_gpu --no-sim-windows  without the cases whose ranks share one GPU (tp_sim_windows: the
 *                          ranks' kernels must run at once; a tool that runs kernels one at a
 *                          time would hang them. gpu_check.sh passes it to compute-sanitizer,
 *                          which was not tried on them)
 *   test_tp_gpu --nccl     also the NCCL paths (all-gathers; read-once over symmetric windows,
 *                          chunked and resident), one
 *                          GPU per rank, for every tp <= the GPUs seen, over a matrix of options,
 *                          each driven both ways (one thread for every rank; a thread per rank
 *                          with its own communicator, as one process per GPU runs), and
 *                          tp_nccl_ranks::abort
 * Exit: 0 all passed, 1 a check failed, 77 no CUDA device (meson counts it as skipped).
 *
 * Each case (tp_demo_run) draws logits with outliers (and optionally -inf entries, NaN rows,
 * finfo.min masks over whole shards), labels with ignored and bad ones and labels on the shard
 * boundaries, runs the single-GPU kernel on the full rows and the tp shards (each its own buffer,
 * optionally with a padded row stride), and checks: the loss (per row for reduction none, else
 * reduced) and every row's lse within the fp32 order-of-summation bound derived in tp_demo_run,
 * every gradient element of every shard against the full row's (two roundings to the dtype plus the
 * lse difference on the p_j term; an fp32 gradient without a softcap per element, 2 (1e-6 + 2^-22
 * (4 + |z_j - lse| + log V)) relative, as test_ce_gpu's, with cases at logits offset by +-4e4 at
 * scale 1/4), that every rank holds the same bits of loss / z / lse, the bad-label count, that
 * every output was written (all poisoned with NaN first), and with `repeat` that a second run is
 * bit-identical.
 */
#define TP_NO_MAIN
#include "examples/vocab_parallel_ce.cu"

#include "tests/gpu_test.cuh"

#include <chrono>
#include <cmath>
#include <functional>
#include <thread>

/* Whether this device runs the resident read-once schedule (sm_90: the row-resident ring). Where
 * it does not, the cases that ask for it ask for the automatic choice instead (chunked there). */
static int g_resident = 0;
static int res_sched(void) { return g_resident ? TP_LSA_RESIDENT : TP_LSA_AUTO; }

/* The case's results: one (the simulation, or one thread driving every rank), or with
 * d.one_rank one per rank, each from its own thread on GPU r over its own communicator
 * (ncclCommInitRank) through tp_ce_launch: what one process per GPU runs (tp_one_rank). */
static std::vector<tp_demo_result> run_ranks(const tp_demo &d)
{
    if (!d.one_rank) return {tp_demo_run(&d)};
    std::vector<tp_demo_result> res(d.tp > 0 ? d.tp : 1);
    for (tp_demo_result &r : res) {
        memset(&r, 0, sizeof r);
        r.st = LF_ERR_DEVICE;
    }
#ifdef LF_HAVE_NCCL /* each thread as one process per GPU would run its rank */
    ncclUniqueId id;
    if (ncclGetUniqueId(&id) != ncclSuccess) return res;
    std::vector<std::thread> th;
    for (int r = 0; r < d.tp; ++r)
        th.emplace_back([&, r]() { res[r] = tp_demo_run_rank(&d, id, r); });
    for (std::thread &t : th) t.join();
    CK(cudaSetDevice(0));
#endif
    return res;
}

static void run(const char *name, const tp_demo &d)
{
    snprintf(g_case, sizeof g_case, "%s tp=%d N=%lld V=%lld %s%s", name, d.tp, (long long)d.N, (long long)d.V, dt_name(d.dt),
             d.use_nccl ? " NCCL" : "");
    const int fails = g_fail;
    const std::vector<tp_demo_result> rs = run_ranks(d);
    for (size_t k = 0; k < rs.size(); ++k) {
        const tp_demo_result &r = rs[k];
        EXPECT(r.st == LF_OK, "rank result %zu: tp_demo_run: %s (%s)", k, lf_status_str(r.st), cudaGetErrorString(r.cuda));
        if (r.st != LF_OK) continue;
        EXPECT(r.loss_err <= 1.0, "loss %.9g, single GPU %.9g (%.3g x tol)", r.loss, r.loss_ref, r.loss_err);
        EXPECT(r.z_err <= 1.0, "z_loss_out off by %.3g x tol", r.z_err);
        EXPECT(r.lse_err <= 1.0, "lse off by %.3g x tol", r.lse_err);
        EXPECT(r.grad_err <= 1.0, "gradient off by %.3g x tol", r.grad_err);
        EXPECT(r.rank_mismatch == 0, "%lld ranks hold other bits than rank 0", (long long)r.rank_mismatch);
        EXPECT(r.nondeterministic == 0, "a later run differs (%lld rank outputs)", (long long)r.nondeterministic);
        EXPECT(r.unwritten == 0, "%lld loss / z / lse words left unwritten", (long long)r.unwritten);
        EXPECT(r.pad_written == 0, "%lld gradient padding elements written", (long long)r.pad_written);
        /* rank 0 counts the bad labels (with one result per rank, the others count none) */
        const unsigned want = k == 0 ? r.errors_ref : 0u;
        EXPECT(r.errors == want, "rank result %zu: bad labels %u, expected %u (single GPU %u)", k, r.errors, want, r.errors_ref);
        EXPECT(r.errors_not_rank0 == 0, "rank result %zu: ranks other than 0 counted %u bad labels", k, r.errors_not_rank0);
        EXPECT(r.out_hash == rs[0].out_hash, "rank %zu holds other loss / z / lse bits than rank 0", k);
    }
    if (d.graph) /* every rank's replays ran, each read-once one with a generation of its own (a
                  * step without rows takes none; the all-gathers none) */
        for (size_t k = 0; k < rs.size(); ++k) {
            const tp_demo_result &q = rs[k];
            if (q.st != LF_OK) continue;
            EXPECT(q.graph_replays == (d.repeat + 1) / 2, "rank result %zu: %d runs replayed a graph, not %d", k, q.graph_replays,
                   (d.repeat + 1) / 2);
            const unsigned want = (d.sim_lsa || (d.use_nccl && d.lsa)) && d.N > 0 ? (unsigned)(1 + d.repeat) : 0u;
            EXPECT(q.lsa_generation == want, "rank result %zu: generation %u after %d launches, not %u", k, q.lsa_generation,
                   1 + d.repeat, want);
        }
    const tp_demo_result &r = rs[0];
    /* a forced resident schedule ran resident (else tp_lsa_plan refused it: st above) */
    if (r.st == LF_OK && (d.lsa || d.sim_lsa) && d.lsa_schedule == TP_LSA_RESIDENT && d.N > 0)
        EXPECT(r.plan.resident == 1, "the resident schedule was asked for, the plan says %d", r.plan.resident);
    char plan[96];
    if (r.plan.resident)
        snprintf(plan, sizeof plan, "resident: clusters of %d, %d stages, %d CTAs", r.plan.cluster, r.plan.stages, r.plan.ctas);
    else
        snprintf(plan, sizeof plan, "chunks %lld x %lld rows, %d CTAs/row", (long long)r.plan.chunks, (long long)r.plan.chunk_rows,
                 r.plan.nsplit);
    printf("%-4s %s%s (%s; worst: loss %.2g lse %.2g grad %.2g of tol)\n", g_fail == fails ? "ok" : "FAIL", g_case,
           d.one_rank ? ", a thread per rank" : "", plan, r.loss_err, r.lse_err, r.grad_err);
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

/* tp_sim_windows::run refuses ranks that disagree on the read-once schedule or on the CTA cap
 * (they would wait for each other forever), before anything is launched; ranks that agree on a
 * cap of 0 (each then gets its share of the SMs) are not refused on that account (every
 * simulated case below runs so; this once failed all of them at tp >= 2). */
static void test_sim_args(void)
{
    snprintf(g_case, sizeof g_case, "simulated windows: ranks that disagree are refused");
    const int fails = g_fail;
    tp_sim_windows sim;
    cudaError_t e = cudaSuccess;
    EXPECT(sim.init(2, 4, &e) == LF_OK, "tp_sim_windows init failed");
    tp_ce_args a[2] = {tp_ce_args_default(), tp_ce_args_default()};
    for (int r = 0; r < 2; ++r) {
        a[r].tp = 2;
        a[r].rank = r;
        a[r].n_rows = 4;
        a[r].vocab = 100;
        a[r].stride = 50;
    }
    /* both caps 0 (each then gets the share of the SMs), rank 0 plannable (no gradient: the
     * chunked plan, host work only), rank 1 without logits: refused by rank 1's plan, not as
     * a mismatch (the defect refused it with LF_ERR_ARG); nothing launches */
    const int64_t vs = 50;
    DevBuf x(4 * vs * 2), lab(4 * 8), loss(4 * 4), ws(tp_ce_workspace_bytes(4, vs, LF_BF16));
    a[0].logits = x.p;
    a[0].labels = lab.p;
    a[0].loss = (float *)loss.p;
    a[0].workspace = ws.p;
    a[0].workspace_bytes = tp_ce_workspace_bytes(4, vs, LF_BF16);
    EXPECT(sim.run(a, &e) == LF_ERR_NULL, "ranks agreeing on a cap of 0 (rank 1 has no logits: LF_ERR_NULL)");
    a[0] = a[1];
    a[0].rank = 0;
    a[1].lsa_schedule = TP_LSA_CHUNKED;
    EXPECT(sim.run(a, &e) == LF_ERR_ARG, "ranks with different schedules");
    a[1].lsa_schedule = a[0].lsa_schedule;
    a[1].max_ctas = 7;
    EXPECT(sim.run(a, &e) == LF_ERR_ARG, "ranks with different CTA caps");
    a[0].max_ctas = 7;
    /* the same fields now: refused later, by the plan (no logits), not as a mismatch */
    EXPECT(sim.run(a, &e) == LF_ERR_NULL, "agreeing ranks not planned (no logits: LF_ERR_NULL)");
    printf("%-4s %s\n", g_fail == fails ? "ok" : "FAIL", g_case);
}

/* The read-once schedule giving up (no NCCL needed: the windows are plain device buffers, so
 * rank 1 of tp = 2 is a rank that never launches). Rank 0 alone, in place, its gradient waiting
 * for rank 1's shares: (1) lsa_timeout_ms = 100 ends it; (2) without a timeout, tp_lsa_abort from
 * the host; (3) rank 1's failure word set in rank 0's window while it waits (a peer that gave
 * up), and rank 0 passes the word on to rank 1's window. Each time: the launch ends (else the
 * test exits after 20 s: a hang), tp_lsa_failure gives the reason and the launch's generation,
 * the loss and every valid row's lse and gradient are NaN, ignored rows 0. (4) tp = 1 on a window
 * made the same way, with an abort request standing for earlier launches only: the launch
 * completes, finite, no failure recorded, and the host learns its generation (6) from the device.
 * (5) On rank 0's window again, launches captured into CUDA graphs: a replay that times out
 * (generation 4), and the host's abort request ending a replay that waits (5; its failure record
 * read on the stream before the next replay begins) and one queued behind it (6; its outputs
 * checked NaN after the loss and lse were zeroed). Both read-once schedules (sched): the chunked one's
 * gradient waits for a chunk's flags, the resident one's rows for their slots, and its end for
 * rank 1's done word (the end-of-launch barrier gives up too). */
static void test_lsa_give_up(int sched)
{
    snprintf(g_case, sizeof g_case, "read-once launches give up (%s): timeout, abort, a peer's failure",
             sched == TP_LSA_RESIDENT ? "resident" : "chunked");
    const int fails = g_fail;
    const int64_t N = g_small ? 64 : 300, V = 20000;
    int64_t v0, v1;
    lf_tp_shard(V, 2, 0, &v0, &v1);
    const int64_t vs = v1 - v0;
    std::vector<int64_t> y(N);
    for (int64_t i = 0; i < N; ++i) y[i] = i % 7 == 3 ? -100 : (int64_t)(mix64(g_seed + 77 * (uint64_t)i) % (uint64_t)V);
    DevBuf x((size_t)N * V * 2), lab(8 * N), loss(4), lse(4 * N), ws(tp_ce_workspace_bytes(N, V, LF_BF16));
    CK(cudaMemcpy(lab.p, y.data(), 8 * N, cudaMemcpyHostToDevice));
    cudaStream_t st, side;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    cudaError_t e = cudaSuccess;
    /* windows of `tp` ranks on this GPU, ex the exchange of rank 0 */
    auto make = [&](tp_exchange *ex, int tp, char **win, char ***peers) {
        memset(ex, 0, sizeof *ex);
        const size_t wb = tp_lsa_window_bytes(N, tp);
        for (int q = 0; q < tp; ++q) {
            CK(cudaMalloc(&win[q], wb));
            CK(cudaMemset(win[q], 0, wb));
        }
        CK(cudaMalloc(peers, sizeof(char *) * tp));
        CK(cudaMemcpy(*peers, win, sizeof(char *) * tp, cudaMemcpyHostToDevice));
        ex->lsa = 1;
        ex->lsa_rows = N;
        ex->win_buf = win[0];
        ex->peers = *peers;
        EXPECT(tp_lsa_ctl_create(ex, &e) == LF_OK, "tp_lsa_ctl_create: %s", cudaGetErrorString(e));
    };
    auto args = [&](int tp, int timeout_ms) {
        tp_ce_args a = tp_ce_args_default();
        a.logits = x.p;
        a.dtype = LF_BF16;
        a.n_rows = N;
        a.vocab = V;
        a.tp = tp;
        a.rank = 0;
        a.stride = tp == 1 ? V : vs;
        a.labels = lab.p;
        a.labels_i64 = 1;
        a.grad = x.p;
        a.grad_stride = a.stride;
        a.loss = (float *)loss.p;
        a.lse = (float *)lse.p;
        a.workspace = ws.p;
        a.workspace_bytes = ws.bytes;
        a.lsa_timeout_ms = timeout_ms;
        a.lsa_schedule = sched;
        return a;
    };
    /* fresh logits of row stride `stride`, then what `enqueue` puts on `st` (a launch, or graph
     * replays); `during` runs once it has been seen still running after 30 ms */
    auto launch_fn = [&](int64_t stride, const std::function<void()> &enqueue, int expect_running,
                         const std::function<void()> &during) {
        gen_logits<__nv_bfloat16><<<512, 256, 0, st>>>((__nv_bfloat16 *)x.p, N, stride, stride, g_seed + 5, 30.0f);
        CK(cudaGetLastError());
        /* loss and lse poisoned with 0x42424242 (48.6: neither NaN nor 0), so that check_nan
         * sees this launch's writes, not an earlier launch's NaN and zeros */
        CK(cudaMemsetAsync(loss.p, 0x42, 4, st));
        CK(cudaMemsetAsync(lse.p, 0x42, 4 * N, st));
        CK(cudaStreamSynchronize(st));
        const auto t0 = std::chrono::steady_clock::now();
        enqueue();
        CK(cudaGetLastError());
        if (expect_running) {
            std::this_thread::sleep_for(std::chrono::milliseconds(30));
            EXPECT(cudaStreamQuery(st) == cudaErrorNotReady, "the launch was not waiting after 30 ms");
            during();
        }
        cudaError_t q;
        while ((q = cudaStreamQuery(st)) == cudaErrorNotReady) {
            if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20)) {
                printf("FAIL %s: the launch still runs after 20 s (a hang); exiting\n", g_case);
                fflush(stdout);
                exit(1);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        CK(q);
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    auto launch = [&](const tp_ce_args &a, tp_exchange *ex, int expect_running, const std::function<void()> &during) {
        return launch_fn(
            a.stride, [&] { EXPECT(tp_ce_launch(&a, ex, st, &e) == LF_OK, "tp_ce_launch: %s", cudaGetErrorString(e)); },
            expect_running, during);
    };
    /* the outputs of a launch that gave up: loss NaN, valid rows' lse and gradient NaN, ignored 0 */
    auto check_nan = [&](const char *what) {
        float lh;
        std::vector<float> lseh(N);
        std::vector<uint16_t> g((size_t)N * vs);
        CK(cudaMemcpy(&lh, loss.p, 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(lseh.data(), lse.p, 4 * N, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(g.data(), x.p, 2 * g.size(), cudaMemcpyDeviceToHost));
        int64_t bad_lse = 0, bad_g = 0;
        for (int64_t i = 0; i < N; ++i) {
            const bool valid = y[i] != -100;
            bad_lse += valid ? !std::isnan(lseh[i]) : lseh[i] != 0.0f;
            for (int64_t j = 0; j < vs; ++j) {
                const float v = lf_bf16_to_f32(g[(size_t)i * vs + j]);
                bad_g += valid ? !std::isnan(v) : v != 0.0f;
            }
        }
        EXPECT(std::isnan(lh), "%s: loss %.9g, not NaN", what, lh);
        EXPECT(bad_lse == 0, "%s: %lld rows' lse not NaN (valid) / 0 (ignored)", what, (long long)bad_lse);
        EXPECT(bad_g == 0, "%s: %lld gradient elements not NaN (valid rows) / 0 (ignored)", what, (long long)bad_g);
    };
    tp_exchange ex;
    char *win[2], **peers;
    make(&ex, 2, win, &peers);
    unsigned gen = 0;
    /* (1) the timeout */
    const double t1 = launch(args(2, 100), &ex, 0, [] {});
    EXPECT(tp_lsa_failure(&ex, &gen) == TP_LSA_TIMED_OUT && gen == 1, "timeout: reason %u generation %u", tp_lsa_failure(&ex, nullptr), gen);
    EXPECT(t1 >= 0.1, "timeout: ended after %.3f s, before the 100 ms", t1);
    check_nan("timeout");
    /* (2) the host's abort request */
    launch(args(2, 0), &ex, 1, [&] { tp_lsa_abort(&ex); });
    EXPECT(tp_lsa_failure(&ex, &gen) == TP_LSA_ABORTED && gen == 2, "abort: reason %u generation %u", tp_lsa_failure(&ex, nullptr), gen);
    check_nan("abort");
    /* (3) rank 1 gave up: its generation in rank 0's failure word of parity 1 (generation 3) */
    unsigned *word;
    CK(cudaHostAlloc((void **)&word, 4, cudaHostAllocDefault));
    *word = 3;
    launch(args(2, 0), &ex, 1, [&] {
        CK(cudaMemcpyAsync(win[0] + tp_lsa_fail_offset(N, 2, 1), word, 4, cudaMemcpyHostToDevice, side));
        CK(cudaStreamSynchronize(side));
    });
    EXPECT(tp_lsa_failure(&ex, &gen) == TP_LSA_PEER_FAILED && gen == 3, "peer: reason %u generation %u", tp_lsa_failure(&ex, nullptr), gen);
    unsigned w1 = 0;
    CK(cudaMemcpy(&w1, win[1] + tp_lsa_fail_offset(N, 2, 1), 4, cudaMemcpyDeviceToHost));
    EXPECT(w1 == 3, "peer: rank 1's failure word %u, not passed on (3)", w1);
    check_nan("a peer's failure");
    CK(cudaFreeHost(word));
    /* (4) tp = 1, an abort request for generations <= 4 standing, this launch generation 6 */
    tp_exchange ex1;
    char *win1[1], **peers1;
    make(&ex1, 1, win1, &peers1);
    ex1.ctl[0] = 4; /* (ex1.gen stays 0: only the device's count, through ctl[3], can say 6) */
    const unsigned five = 5; /* the device's count of launches (the generation word) */
    CK(cudaMemcpy(win1[0] + tp_lsa_gen_offset(N, 1), &five, 4, cudaMemcpyHostToDevice));
    launch(args(1, 10000), &ex1, 0, [] {}); /* a timeout that only a hang reaches (compute-sanitizer too) */
    float lh;
    CK(cudaMemcpy(&lh, loss.p, 4, cudaMemcpyDeviceToHost));
    EXPECT(std::isfinite(lh) && lh > 0.0f, "tp = 1 after an earlier abort request: loss %.9g", lh);
    EXPECT(tp_lsa_failure(&ex1, &gen) == TP_LSA_OK, "tp = 1: a failure recorded (%u, generation %u)", tp_lsa_failure(&ex1, nullptr), gen);
    EXPECT(tp_lsa_device_generation(&ex1) == 6 && tp_lsa_device_generation(&ex) == 3 && tp_lsa_generation(&ex1) == 6 &&
               tp_lsa_generation(&ex) == 3,
           "generations %u / %u (the device's count), %u / %u (the host's), not 6 / 3", tp_lsa_device_generation(&ex1),
           tp_lsa_device_generation(&ex), tp_lsa_generation(&ex1), tp_lsa_generation(&ex));
    /* (5) the same from CUDA-graph replays of rank 0's step (tp_ce_capture, tp_ce_replay): (a) a
     * replay times out (generation 4); (b) the host's abort request reaches a replay that waits
     * (generation 5) and one queued behind it that has not begun (6; the logits drawn again and
     * the loss and lse zeroed in between, so that the NaN checked are the second replay's) */
    tp_ce_graph gt{nullptr, 0}, ga{nullptr, 0};
    const tp_ce_args at = args(2, 100), aa = args(2, 0);
    EXPECT(tp_ce_capture(&at, &ex, st, &gt, &e) == LF_OK && tp_ce_capture(&aa, &ex, st, &ga, &e) == LF_OK, "tp_ce_capture: %s",
           cudaGetErrorString(e));
    EXPECT(tp_lsa_generation(&ex) == 3, "the captures were counted as launches (generation %u, not 3)", tp_lsa_generation(&ex));
    double t5 = 0.0;
    if (gt.exec && ga.exec) {
        t5 = launch_fn(
            vs, [&] { EXPECT(tp_ce_replay(&gt, &ex, st, &e) == LF_OK, "tp_ce_replay: %s", cudaGetErrorString(e)); }, 0, [] {});
        EXPECT(tp_lsa_failure(&ex, &gen) == TP_LSA_TIMED_OUT && gen == 4, "timeout in a replay: reason %u generation %u",
               tp_lsa_failure(&ex, nullptr), gen);
        EXPECT(t5 >= 0.1, "timeout in a replay: ended after %.3f s, before the 100 ms", t5);
        EXPECT(tp_lsa_last_failed(&ex) && tp_lsa_device_generation(&ex) == 4, "timeout in a replay: last failed %d, generation %u",
               (int)tp_lsa_last_failed(&ex), tp_lsa_device_generation(&ex));
        check_nan("timeout in a replay");
        /* the first replay's failure record, read on the stream between the two replays */
        struct rec_t {
            const volatile unsigned *ctl;
            unsigned gen, reason;
        } rec5{ex.ctl, 0u, 0u};
        launch_fn(
            vs,
            [&] {
                EXPECT(tp_ce_replay(&ga, &ex, st, &e) == LF_OK, "tp_ce_replay: %s", cudaGetErrorString(e));
                CK(cudaLaunchHostFunc(
                    st,
                    [](void *p) {
                        rec_t *q = static_cast<rec_t *>(p);
                        q->gen = q->ctl[1];
                        q->reason = q->ctl[2];
                    },
                    &rec5));
                gen_logits<__nv_bfloat16><<<512, 256, 0, st>>>((__nv_bfloat16 *)x.p, N, vs, vs, g_seed + 6, 30.0f);
                CK(cudaGetLastError());
                CK(cudaMemsetAsync(loss.p, 0, 4, st));
                CK(cudaMemsetAsync(lse.p, 0, 4 * N, st));
                EXPECT(tp_ce_replay(&ga, &ex, st, &e) == LF_OK, "tp_ce_replay: %s", cudaGetErrorString(e));
            },
            1,
            [&] {
                EXPECT(tp_lsa_generation(&ex) == 6, "two replays queued: the host knows generation %u, not 6", tp_lsa_generation(&ex));
                tp_lsa_abort(&ex);
            });
        EXPECT(rec5.reason == TP_LSA_ABORTED && rec5.gen == 5, "abort of the waiting replay: reason %u generation %u", rec5.reason,
               rec5.gen);
        EXPECT(tp_lsa_failure(&ex, &gen) == TP_LSA_ABORTED && gen == 6, "abort of the queued replay: reason %u generation %u",
               tp_lsa_failure(&ex, nullptr), gen);
        EXPECT(tp_lsa_last_failed(&ex) && tp_lsa_device_generation(&ex) == 6, "abort of replays: last failed %d, generation %u",
               (int)tp_lsa_last_failed(&ex), tp_lsa_device_generation(&ex));
        check_nan("abort of a waiting replay and a queued one");
    }
    tp_ce_graph_destroy(&gt);
    tp_ce_graph_destroy(&ga);
    for (tp_exchange *p : {&ex, &ex1})
        if (p->ctl) CK(cudaFreeHost(p->ctl));
    for (char *w : {win[0], win[1], win1[0]}) CK(cudaFree(w));
    CK(cudaFree(peers));
    CK(cudaFree(peers1));
    CK(cudaStreamDestroy(st));
    CK(cudaStreamDestroy(side));
    printf("%-4s %s (timeout after %.3f s; in a replay %.3f s)\n", g_fail == fails ? "ok" : "FAIL", g_case, t1, t5);
}

#ifdef LF_HAVE_NCCL
/* tp_nccl_ranks::abort, what a failed step or a failed registration group calls (tp = 1 on
 * GPU 0, the all-gathers or the read-once window): before it a step runs and gives a finite
 * loss; after it the communicators are gone (nullptr), run() refuses with LF_ERR_DEVICE and
 * launches nothing (the poisoned loss stays NaN), sync() still answers, and the destructor
 * frees the rest with no collective call (a hang would end the test at its timeout). */
static void test_ranks_abort(int lsa)
{
    snprintf(g_case, sizeof g_case, "tp_nccl_ranks::abort, %s", lsa ? "read-once window" : "all-gathers");
    const int fails = g_fail;
    const int64_t N = 96, V = 5003;
    std::vector<int64_t> y(N);
    for (int64_t i = 0; i < N; ++i) y[i] = (int64_t)(mix64(g_seed + 31 * (uint64_t)i) % (uint64_t)V);
    DevBuf x((size_t)N * V * 2), lab(8 * N), loss(4), ws(tp_ce_workspace_bytes(N, V, LF_BF16)), sh(tp_ce_shares_bytes(N, 1));
    CK(cudaMemcpy(lab.p, y.data(), 8 * N, cudaMemcpyHostToDevice));
    tp_ce_args a = tp_ce_args_default();
    a.logits = x.p;
    a.dtype = LF_BF16;
    a.n_rows = N;
    a.vocab = a.stride = a.grad_stride = V;
    a.tp = 1;
    a.labels = lab.p;
    a.labels_i64 = 1;
    a.grad = x.p;
    a.loss = (float *)loss.p;
    a.shares = (lf_tp_share *)sh.p;
    a.shares_bytes = sh.bytes;
    a.workspace = ws.p;
    a.workspace_bytes = ws.bytes;
    auto step = [&](tp_nccl_ranks &g, lf_status want, bool finite) {
        gen_logits<__nv_bfloat16><<<512, 256>>>((__nv_bfloat16 *)x.p, N, V, V, g_seed + 9, 30.0f);
        CK(cudaGetLastError());
        CK(cudaMemset(loss.p, 0xff, 4));
        CK(cudaDeviceSynchronize());
        cudaError_t e = cudaSuccess;
        const lf_status st = g.run(&a, &e);
        EXPECT(st == want, "run: %s, expected %s (%s)", lf_status_str(st), lf_status_str(want), cudaGetErrorString(e));
        const lf_status ss = g.sync(&e);
        EXPECT(ss == LF_OK, "sync: %s (%s)", lf_status_str(ss), cudaGetErrorString(e));
        CK(cudaSetDevice(0));
        float lh;
        CK(cudaMemcpy(&lh, loss.p, 4, cudaMemcpyDeviceToHost));
        EXPECT(finite ? std::isfinite(lh) : std::isnan(lh), "loss %.9g, expected %s", lh, finite ? "finite" : "NaN (nothing launched)");
    };
    {
        tp_nccl_ranks g;
        cudaError_t e = cudaSuccess;
        const lf_status st = g.init(1, &e, lsa ? N : 0);
        EXPECT(st == LF_OK, "init: %s (%s)", lf_status_str(st), cudaGetErrorString(e));
        if (st == LF_OK) {
            EXPECT(!lsa || g.ex[0].lsa, "the read-once window was not made");
            if (!lsa) { /* one thread's all-gathers are grouped across ranks: not captured */
                tp_ce_graph gr{reinterpret_cast<cudaGraphExec_t>(&gr), 1};
                const lf_status cs = g.capture(&a, &gr, &e);
                EXPECT(cs == LF_ERR_ARG && gr.exec == nullptr, "capture with the all-gathers: %s, exec %p (expected LF_ERR_ARG, none)",
                       lf_status_str(cs), (void *)gr.exec);
                EXPECT(!g.aborted, "a refused capture aborted the communicators");
            }
            step(g, LF_OK, true);
            g.abort();
            EXPECT(g.aborted && g.comms.size() == 1 && g.comms[0] == nullptr && g.ex[0].comm == nullptr,
                   "abort left a communicator (aborted %d)", (int)g.aborted);
            step(g, LF_ERR_DEVICE, false);
        }
    } /* the destructor: no collective after abort */
    CK(cudaSetDevice(0));
    CK(cudaDeviceSynchronize());
    printf("%-4s %s\n", g_fail == fails ? "ok" : "FAIL", g_case);
}
#endif

int main(int argc, char **argv)
{
    bool with_nccl = false, sim_windows = true;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--small")) g_small = 1;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) g_seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--nccl")) with_nccl = true;
        else if (!strcmp(argv[i], "--no-sim-windows")) sim_windows = false;
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

    g_resident = prop.major >= 9;
    test_args();
    if (sim_windows) test_sim_args();
    test_lsa_give_up(TP_LSA_CHUNKED);
    if (g_resident) test_lsa_give_up(TP_LSA_RESIDENT);
    else printf("skip read-once resident give-up: sm_%d%d has no row-resident ring\n", prop.major, prop.minor);

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
        d.seed = g_seed * 37 + (uint64_t)tp;
        d.dt = dts[tp % 3];
        d.fmin_rows = 1;
        d.opts.z_loss = 1e-4f;
        d.repeat = 1;
        run("finfo.min entries (whole shards, every 11th), z-loss, repeat", d);
        d.reduction = LF_REDUCE_NONE;
        d.in_place = 0;
        d.dt = LF_BF16;
        run("finfo.min entries, reduction none, bf16, separate gradient", d);

        d = b;
        d.tp = tp;
        d.seed = g_seed * 17 + (uint64_t)tp;
        d.dt = LF_F32;
        /* |lse| ~ 1e4, where one float lse would put ~2^-24 |lse| (6e-4) relative into every
         * p_j: the fp32 gradient's per-element bound. Scale 1/4 (exact): the +-30 outliers (~16
         * a row) at +-7.5 no longer hold nearly all the mass (at scale 1 the row's sum is ~16
         * exactly in any order, and the two kernels agree to the bit) */
        d.logit_offset = tp % 2 ? 4e4f : -4e4f;
        d.opts.logit_scale = 0.25f;
        d.opts.label_smoothing = 0.1f;
        d.opts.z_loss = tp == 4 ? 1e-6f : 0.0f;
        run(tp % 2 ? "fp32 logits offset by +4e4, scale 1/4, smoothing" : "fp32 logits offset by -4e4, scale 1/4, smoothing", d);

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

        /* The read-once schedules with every rank's window on this GPU (tp_sim_windows: the
         * ranks' kernels run at once, each on its share of the SMs). Resident: the shard rows
         * wide enough for the ring (V = 16411 at --small), split over clusters where they are
         * wider than a stage (V = 100003: 100 KB bf16 / 200 KB fp32 shards at tp = 2). */
        const int64_t Vr = g_small ? 16411 : 32771;
        /* a simulated read-once case: the base case at tp, rows Vr wide, its own seed */
        auto sim_case = [&](uint64_t seed_mul, int sched) {
            tp_demo e = b;
            e.tp = tp;
            e.V = Vr;
            e.seed = g_seed * seed_mul + (uint64_t)tp;
            e.sim_lsa = 1;
            e.lsa_schedule = sched;
            return e;
        };
        if (sim_windows) {
            d = sim_case(41, res_sched());
            d.repeat = 3; /* four launches: each set of slots reused (after the end-of-launch barriers) */
            run("read-once resident, simulated windows, 3 repeats", d);
            d.dt = dts[tp % 3];
            d.opts.label_smoothing = 0.1f;
            d.opts.z_loss = 1e-4f;
            d.opts.class_weights = (const float *)1;
            d.opts.softcap = 25.0f;
            d.opts.logit_scale = 0.8f;
            d.in_place = 0;
            d.pad = 3; /* rows off the 16-byte grid: head and tail elements */
            d.labels_i64 = 0;
            d.seed += 7;
            run("read-once resident, simulated, smoothing + z-loss + weights + softcap + scale, padded", d);
            d = sim_case(43, res_sched());
            d.dt = dts[(tp + 1) % 3];
            d.reduction = LF_REDUCE_NONE;
            d.use_dloss = 1;
            d.neg_inf = 1;
            d.nan_rows = 1;
            d.fmin_rows = 1;
            run("read-once resident, simulated, none, upstream, -inf, NaN, finfo.min", d);
            d.reduction = LF_REDUCE_MEAN;
            d.use_dloss = 0;
            d.use_divisor = 1;
            d.divisor_value = 321.0f;
            d.all_ignored = 1;
            d.repeat = 3; /* no row waits: only the done words keep the launches in step */
            run("read-once resident, simulated, all ignored, device divisor, 3 repeats", d);
            if (!g_small || tp == 2) {
                d = sim_case(47, res_sched());
                d.V = 100003;
                d.N = g_small ? 29 : 257;
                d.dt = tp == 2 ? LF_F32 : LF_BF16;
                d.opts.label_smoothing = 0.05f;
                d.repeat = 1;
                run("read-once resident, simulated, wide shards (clusters), repeat", d);
            }
            /* CUDA graphs: every rank's step captured once, replayed (each replay takes the next
             * generation on the device), alternating with plain launches: every run's bits equal */
            d = sim_case(59, res_sched());
            d.repeat = 4;
            d.graph = 1;
            d.opts.label_smoothing = 0.1f;
            d.opts.class_weights = (const float *)1;
            run("read-once resident, simulated, CUDA graph replays between launches", d);
            d = sim_case(61, TP_LSA_CHUNKED);
            d.chunk_rows = 16;
            d.repeat = 4;
            d.graph = 1;
            run("read-once chunked, simulated, CUDA graph replays between launches", d);
            d = sim_case(67, res_sched()); /* a captured step without rows runs no read-once kernel */
            d.N = 0;
            d.repeat = 2;
            d.graph = 1;
            run("read-once resident, simulated, CUDA graph of a step without rows", d);
            d = sim_case(53, TP_LSA_CHUNKED);
            d.chunk_rows = 16;
            d.lsa_lag = 2;
            d.opts.label_smoothing = 0.1f;
            d.repeat = 1;
            run("read-once chunked, simulated windows, 16-row chunks, repeat", d);
            d.lsa_schedule = TP_LSA_AUTO;
            d.chunk_rows = 0;
            d.forward_only = 1;
            d.repeat = 0;
            run("read-once automatic, simulated, forward only (chunked)", d);
        }

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
        for (int lsa = 0; lsa <= 1; ++lsa) {
#ifndef TP_HAVE_LSA
            if (lsa) break;
#endif
            test_ranks_abort(lsa);
        }
    if (with_nccl)
        for (int tp = 1; tp <= ndev && tp <= 8; tp *= 2) {
            /* the exchanges (the all-gathers; the read-once schedules over symmetric windows,
             * chunked and resident) over the options and layouts that change what crosses between
             * the ranks, driven both ways: one thread for every rank (tp_nccl_ranks, tp_ce_nccl),
             * and a thread per rank with its own communicator through tp_ce_launch (one_rank: one
             * process per GPU) */
            for (int thr = 0; thr <= 1; ++thr)
            for (int lsa = 0; lsa <= 2; ++lsa) {
#ifndef TP_HAVE_LSA
                if (lsa) {
                    printf("skip NCCL read-once cases: this NCCL has no symmetric windows\n");
                    break;
                }
#endif
                const char *nm = lsa == 2 ? "NCCL read-once resident" : lsa ? "NCCL read-once" : "NCCL all-gather";
                char name[96];
                auto nccl_case = [&](uint64_t seed_off) { /* b over NCCL with this exchange and driver */
                    tp_demo c = b;
                    c.tp = tp;
                    c.use_nccl = 1;
                    c.lsa = lsa > 0;
                    c.lsa_schedule = lsa == 2 ? res_sched() : TP_LSA_CHUNKED;
                    /* --small: shard rows wide enough for the ring (8 KB of bf16 at least) */
                    if (lsa == 2 && c.V < 4104 * (int64_t)tp + 7) c.V = 4104 * (int64_t)tp + 7;
                    c.one_rank = thr;
                    c.seed = g_seed + seed_off + (uint64_t)(16 * tp + 3 * lsa + thr);
                    return c;
                };
                tp_demo d = nccl_case(1000);
                d.opts.label_smoothing = 0.1f;
                d.opts.z_loss = 1e-4f;
                d.repeat = lsa == 2 ? 3 : 1; /* both parities of the window (resident: each reused) */
                snprintf(name, sizeof name, "%s, smoothing, z-loss, repeat", nm);
                run(name, d);
                /* CUDA graphs: each rank's step captured on its GPU, replayed; one thread driving
                 * every rank captures the read-once window only (tp_nccl_ranks::capture refuses the
                 * all-gathers: test_ranks_abort), a thread per rank the all-gathers too */
                if (lsa || thr) {
                    tp_demo g = d;
                    g.repeat = 4;
                    g.graph = 1;
                    g.seed += 50;
                    snprintf(name, sizeof name, "%s, CUDA graph replays between launches", nm);
                    run(name, g);
                }
                if (lsa != 2) { /* chunks: the all-gathers' and the chunked schedule's */
                    d.chunk_rows = 16;
                    d.lsa_lag = 3;
                    d.seed += 100;
                    snprintf(name, sizeof name, "%s, 16-row chunks, lag 3", nm);
                    run(name, d);
                }
                if (lsa == 1) { /* the most waiting: the gradient right behind its statistics, few CTAs */
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
                    d = nccl_case(1500);
                    d.N = 600;
                    d.V = 32769;
                    d.chunk_rows = 0;
                    d.repeat = 1;
                    snprintf(name, sizeof name, "%s, V %% tp != 0, automatic chunks, repeat", nm);
                    run(name, d);
                }
                d = nccl_case(2000);
                d.dt = LF_F32;
                d.reduction = LF_REDUCE_NONE;
                d.use_dloss = 1;
                d.in_place = 0;
                d.pad = 3;
                d.chunk_rows = lsa == 2 ? 0 : 1;
                d.labels_i64 = 0;
                snprintf(name, sizeof name, "%s, fp32, none, upstream, padded%s", nm, lsa == 2 ? "" : ", 1-row chunks");
                run(name, d);
                if (lsa == 2) { /* V % tp != 0: shards of 16385 and 16384 (every rank the same plan) */
                    d = nccl_case(2500);
                    d.N = 600;
                    d.V = 32769;
                    d.repeat = 1;
                    snprintf(name, sizeof name, "%s, V %% tp != 0, repeat", nm);
                    run(name, d);
                }
                d = nccl_case(3000);
                d.dt = LF_F16;
                d.opts.softcap = 30.0f;
                d.opts.logit_scale = 0.5f;
                d.opts.class_weights = (const float *)1; /* random weights */
                d.neg_inf = 1;
                d.nan_rows = 1;
                snprintf(name, sizeof name, "%s, fp16, softcap, scale, weights, -inf, NaN", nm);
                run(name, d);
                d = nccl_case(3500);
                d.fmin_rows = 1;
                snprintf(name, sizeof name, "%s, finfo.min entries (whole shards)", nm);
                run(name, d);
                d = nccl_case(4000);
                if (lsa == 2) d.lsa_schedule = TP_LSA_AUTO; /* forward only: the chunked schedule */
                d.forward_only = 1;
                d.use_divisor = 1;
                d.divisor_value = 123.0f;
                snprintf(name, sizeof name, "%s, forward only, device divisor", nm);
                run(name, d);
                d = nccl_case(5000);
                d.all_ignored = 1;
                /* launches that wait on no row's shares (chunked: the end-of-launch wait; resident:
                 * the done words, each set of slots reused) */
                d.repeat = lsa == 2 ? 3 : 1;
                snprintf(name, sizeof name, "%s, all ignored, repeat", nm);
                run(name, d);
                if (lsa || thr) {
                    tp_demo g = d;
                    g.repeat = 2;
                    g.graph = 1;
                    snprintf(name, sizeof name, "%s, all ignored, CUDA graph replays", nm);
                    run(name, g);
                }
                d.all_ignored = 0;
                d.repeat = 0;
                d.N = 1;
                snprintf(name, sizeof name, "%s, one row", nm);
                run(name, d);
                d.N = 0;
                snprintf(name, sizeof name, "%s, no rows", nm);
                run(name, d);
                if (lsa || thr) {
                    d.repeat = 2;
                    d.graph = 1;
                    snprintf(name, sizeof name, "%s, no rows, CUDA graph replays", nm);
                    run(name, d);
                }
                if (!g_small) {
                    d = nccl_case(6000);
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
