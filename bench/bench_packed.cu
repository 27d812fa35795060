/* bench/bench_packed.cu — times issue 4's pieces: packed DPO from logits
 * (examples/dpo_packed.cu), the pairwise preference loss (examples/pairwise_preference.cu) and
 * the per-sequence sums of lossfuse_cuda.cuh section 9.
 *
 *   bench_packed [--modes pref,segsum,dpo] [--shapes 8192x32768,8192x151936] [--iters 10] [--seqs 16]
 *
 *   mode=dpo      sigmoid DPO with reference log-probabilities, forward + backward, the gradient
 *                 written in place over bf16 logits [T, V] packed as --seqs sequences (pairs of
 *                 adjacent chosen / rejected, a quarter of each a prompt without labels). Floor:
 *                 read the logits once + write the gradient once = 4 B/elem (the issue's); the
 *                 kernel reads them twice (a sequence's coefficient needs every token of both
 *                 sequences of its pairs first), so 6 B/elem are moved: its ceiling is 2/3 of
 *                 copy bandwidth on that floor (moved= gives the bytes moved). extra_bytes: workspace.
 *                 impl=lossfuse_deferred: the same loss with the deferred scale (dpo_args.tok_scale:
 *                 G_t = softmax - onehot written in the one read, s_t per token; the caller
 *                 applies s_t), which moves the floor's 4 B/elem (moved=).
 *                 _separate: the same with dpo_args.separate_launches (the small launches 3-7
 *                 as six kernels instead of one cooperative launch).
 *   mode=pref     S = 12480 items, P = 50000 pairs, 32 bins, Bradley-Terry with budget and
 *                 coverage penalties, forward + gradient; impl=lossfuse_fast (memset + two
 *                 kernels), lossfuse_fast_single (one cooperative launch), lossfuse_det;
 *                 _zeroed: the same with workspace_zeroed (no clearing step: one node or
 *                 one grid barrier fewer);
 *                 the time of one loss under CUDA-graph replay (200 back to back) and of plain
 *                 stream launches (launch_us=). bytes: the inputs read once.
 *   mode=segsum   10^8 fp32 values in 10^5 sequences of random length (some empty), sums per
 *                 sequence: impl=lossfuse_chunked (lf_seg_sum_chunked: equal chunks per warp,
 *                 fixed order, workspace = extra_bytes), lossfuse_det (lf_seg_sum_grid: a warp
 *                 per sequence, fixed order) and lossfuse_fast (a token per lane, segmented warp
 *                 scan, one atomic per run); plain_read: a grid-stride read of the same values
 *                 (16-byte loads, summed and dropped), the ceiling of any of them on this device.
 *                 Floor: read the values once (4 B each). Read-only passes leave L2 clean, so
 *                 the timed launches alternate between two copies of the values (each 400 MB:
 *                 each launch starts with the other copy's clean tail in L2, METHOD.md's
 *                 rotation of input sets), each after a 50 us spin (bench_delay) that keeps the
 *                 host's launch latency out of the events. _l2dirty: timed the old way, after a
 *                 256 MiB write, so that L2 is full of dirty lines the read must write back
 *                 (kept to compare with the runs before 2026-11-25, session 16).
 * DPO: each timed launch is preceded (untimed) by restoring the logits from a pristine copy and
 * writing a 256 MiB buffer (nothing of the inputs left in L2; L2 full of dirty lines, as the
 * fused pass, which writes its gradient, leaves it); the median.
 * A benchmark, not a test: it checks nothing but CUDA errors and the launchers' status.
 */
#define DPO_NO_MAIN
#include "examples/dpo_packed.cu"
#define PREF_NO_MAIN
#include "examples/pairwise_preference.cu"

#include "bench/bench_common.cuh"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double urand(void)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0);
}

#define LAUNCH_OK(call)                                                                             \
    do {                                                                                            \
        cudaError_t ce_;                                                                            \
        const lf_status st_ = (call);                                                               \
        (void)ce_;                                                                                  \
        if (st_ != LF_OK) {                                                                         \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, lf_status_str(st_));      \
            exit(1);                                                                                \
        }                                                                                           \
        CK(cudaGetLastError());                                                                     \
    } while (0)

static float time_ms(cudaEvent_t e0, cudaEvent_t e1)
{
    float ms;
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms;
}

/* ------------------------------------------------------------------ DPO ------------------- */
static void bench_dpo(int64_t T, int64_t V, int nseq, int iters, void *flush, size_t flush_bytes, cudaEvent_t e0, cudaEvent_t e1)
{
    std::vector<int32_t> cu(nseq + 1), pairs(nseq);
    std::vector<int64_t> lab(T);
    std::vector<float> ref(nseq);
    for (int k = 0; k <= nseq; ++k) cu[k] = (int32_t)(T * k / nseq);
    for (int k = 0; k < nseq; ++k) {
        const int64_t len = cu[k + 1] - cu[k], prompt = len / 4;
        for (int64_t t = cu[k]; t < cu[k + 1]; ++t)
            lab[t] = (t - cu[k] < prompt || t + 1 == cu[k + 1]) ? -100 : (int64_t)(urand() * V) % V;
        ref[k] = (float)(-2.0 * (double)len);
    }
    for (int p = 0; p < nseq / 2; ++p) {
        pairs[2 * p] = 2 * p;
        pairs[2 * p + 1] = 2 * p + 1;
    }
    __nv_bfloat16 *x, *x0;
    int64_t *yd;
    int32_t *cud, *pd;
    float *refd, *loss, *seqlp, *pm, *scale;
    unsigned *err;
    void *ws;
    const size_t bytes = (size_t)T * V * 2, wsb = dpo_workspace_bytes(T, nseq, nseq / 2);
    CK(cudaMalloc(&scale, 4 * T));
    CK(cudaMalloc(&x, bytes));
    CK(cudaMalloc(&x0, bytes));
    CK(cudaMalloc(&yd, 8 * T));
    CK(cudaMalloc(&cud, 4 * (nseq + 1)));
    CK(cudaMalloc(&pd, 4 * nseq));
    CK(cudaMalloc(&refd, 4 * nseq));
    CK(cudaMalloc(&loss, 4));
    CK(cudaMalloc(&seqlp, 4 * nseq));
    CK(cudaMalloc(&pm, sizeof(float) * LF_DPO_METRICS * nseq)); /* nseq / 2 pairs */
    CK(cudaMalloc(&err, 4));
    CK(cudaMalloc(&ws, wsb));
    fill_logits<<<1024, 256>>>(x0, (int64_t)T * V, 7);
    CK(cudaGetLastError());
    CK(cudaMemcpy(yd, lab.data(), 8 * T, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(cud, cu.data(), 4 * (nseq + 1), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(pd, pairs.data(), 4 * nseq, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(refd, ref.data(), 4 * nseq, cudaMemcpyHostToDevice));
    CK(cudaMemset(err, 0, 4));
    dpo_args a = dpo_args_default();
    a.logits = x;
    a.dtype = LF_BF16;
    a.n_tokens = T;
    a.vocab = V;
    a.stride = V;
    a.labels = yd;
    a.labels_i64 = 1;
    a.cu_seqlens = cud;
    a.n_seqs = nseq;
    a.pairs = pd;
    a.n_pairs = nseq / 2;
    a.ref_logps = refd;
    a.grad = x;
    a.grad_stride = V;
    a.loss = loss;
    a.seq_logps = seqlp;
    a.pair_metrics = pm;
    a.n_errors = err;
    a.workspace = ws;
    for (int variant = 0; variant < 4; ++variant) {
        const int deferred = variant & 1;
        a.tok_scale = deferred ? scale : NULL;
        a.separate_launches = variant >> 1;
        a.workspace_bytes = dpo_workspace_bytes(T, nseq, nseq / 2);
        std::vector<float> t;
        for (int it = 0; it < iters + 2; ++it) {
            CK(cudaMemcpyAsync(x, x0, bytes, cudaMemcpyDeviceToDevice));
            CK(cudaMemsetAsync(flush, it & 0xff, flush_bytes));
            CK(cudaEventRecord(e0));
            LAUNCH_OK(dpo_launch(&a, 0, &ce_));
            CK(cudaEventRecord(e1));
            const float ms = time_ms(e0, e1);
            if (it >= 2) t.push_back(ms);
        }
        unsigned eh;
        CK(cudaMemcpy(&eh, err, 4, cudaMemcpyDeviceToHost));
        if (eh) fprintf(stderr, "bench_dpo: %u errors counted\n", eh);
        printf("RESULT impl=lossfuse%s mode=dpo N=%lld V=%lld dtype=bf16 ms=%.4f bytes=%zu extra_bytes=%zu status=ok seqs=%d "
               "moved=%zu\n",
               deferred ? (a.separate_launches ? "_deferred_separate" : "_deferred") : a.separate_launches ? "_separate" : "",
               (long long)T, (long long)V, median(t), 2 * bytes,
               (size_t)a.workspace_bytes + (deferred ? 4 * (size_t)T : 0), nseq, (deferred ? 2 : 3) * bytes);
        fflush(stdout);
    }
    CK(cudaFree(x));
    CK(cudaFree(x0));
    CK(cudaFree(yd));
    CK(cudaFree(cud));
    CK(cudaFree(pd));
    CK(cudaFree(refd));
    CK(cudaFree(loss));
    CK(cudaFree(seqlp));
    CK(cudaFree(pm));
    CK(cudaFree(err));
    CK(cudaFree(ws));
    CK(cudaFree(scale));
}

/* ------------------------------------------------------------------ pairwise -------------- */
/* mode 0 fast, 1 fast_single, 2 det, 3 fast_zeroed, 4 fast_single_zeroed (workspace_zeroed:
 * the workspace zeroed once, then no clearing step) */
static void bench_pref(int mode, cudaEvent_t e0, cudaEvent_t e1)
{
    const int det = mode == 2;
    const int64_t S = 12480, P = 50000, B = 32;
    std::vector<float> s(S), t(P), w(P), mass(S), budget(B), cov(B);
    std::vector<int32_t> pairs(2 * P), bin(S);
    for (int64_t i = 0; i < S; ++i) {
        s[i] = (float)(3.0 * (urand() - 0.5));
        bin[i] = (int32_t)(urand() * B);
        mass[i] = (float)(0.5 + urand());
    }
    for (int64_t b = 0; b < B; ++b) {
        budget[b] = (float)(0.52 * S / B);
        cov[b] = (float)(0.45 * S / B);
    }
    for (int64_t p = 0; p < P; ++p) {
        const int32_t i = (int32_t)(urand() * S), j0 = (int32_t)(urand() * (S - 1));
        pairs[2 * p] = i;
        pairs[2 * p + 1] = j0 >= i ? j0 + 1 : j0;
        t[p] = urand() < 0.5 ? 1.0f : 0.0f;
        w[p] = (float)(0.5 + urand());
    }
    float *sd, *td, *wd, *md, *bud, *cvd, *loss, *grad;
    int32_t *pd, *bd;
    unsigned *err;
    void *ws;
    const size_t wsb = pref_workspace_bytes(S, P, B, det);
    CK(cudaMalloc(&sd, 4 * S));
    CK(cudaMalloc(&td, 4 * P));
    CK(cudaMalloc(&wd, 4 * P));
    CK(cudaMalloc(&md, 4 * S));
    CK(cudaMalloc(&bud, 4 * B));
    CK(cudaMalloc(&cvd, 4 * B));
    CK(cudaMalloc(&loss, 12));
    CK(cudaMalloc(&grad, 4 * S));
    CK(cudaMalloc(&pd, 8 * P));
    CK(cudaMalloc(&bd, 4 * S));
    CK(cudaMalloc(&err, 4));
    CK(cudaMalloc(&ws, wsb));
    CK(cudaMemcpy(sd, s.data(), 4 * S, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(td, t.data(), 4 * P, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(wd, w.data(), 4 * P, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(md, mass.data(), 4 * S, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(bud, budget.data(), 4 * B, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(cvd, cov.data(), 4 * B, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(pd, pairs.data(), 8 * P, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(bd, bin.data(), 4 * S, cudaMemcpyHostToDevice));
    CK(cudaMemset(err, 0, 4));
    pref_args a = pref_args_default();
    a.n_items = S;
    a.scores = sd;
    a.n_pairs = P;
    a.pairs = pd;
    a.target = td;
    a.pair_weight = wd;
    a.opts.budget_weight = 0.5f;
    a.opts.coverage_weight = 0.5f;
    a.item_bin = bd;
    a.item_mass = md;
    a.n_bins = B;
    a.budget = bud;
    a.coverage = cvd;
    a.deterministic = det;
    a.single_launch = mode == 1 || mode == 4;
    a.workspace_zeroed = mode >= 3;
    CK(cudaMemset(ws, 0, wsb));
    a.loss = loss;
    a.grad = grad;
    a.n_errors = err;
    a.workspace = ws;
    a.workspace_bytes = wsb;
    cudaStream_t cs;
    CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    /* plain stream launches: median of 20 */
    std::vector<float> tl;
    for (int it = 0; it < 25; ++it) {
        CK(cudaEventRecord(e0, cs));
        LAUNCH_OK(pref_launch(&a, cs, &ce_));
        CK(cudaEventRecord(e1, cs));
        const float ms = time_ms(e0, e1);
        if (it >= 5) tl.push_back(ms);
    }
    /* graph replay: 200 back to back, 5 rounds, the median round */
    cudaGraph_t graph;
    cudaGraphExec_t gexec;
    CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
    LAUNCH_OK(pref_launch(&a, cs, &ce_));
    CK(cudaStreamEndCapture(cs, &graph));
    CK(cudaGraphInstantiate(&gexec, graph, 0));
    const int reps = 200;
    std::vector<float> tg;
    for (int round = 0; round < 6; ++round) {
        CK(cudaEventRecord(e0, cs));
        for (int it = 0; it < reps; ++it) CK(cudaGraphLaunch(gexec, cs));
        CK(cudaEventRecord(e1, cs));
        const float ms = time_ms(e0, e1);
        if (round >= 1) tg.push_back(ms / reps);
    }
    size_t nodes = 0;
    CK(cudaGraphGetNodes(graph, nullptr, &nodes));
    unsigned eh;
    CK(cudaMemcpy(&eh, err, 4, cudaMemcpyDeviceToHost));
    if (eh) fprintf(stderr, "bench_pref: %u errors counted\n", eh);
    const size_t in_bytes = (size_t)P * 16 + (size_t)S * 16;
    printf("RESULT impl=lossfuse_%s mode=pref N=%lld V=%lld dtype=fp32 ms=%.5f bytes=%zu extra_bytes=%zu status=ok graph_us=%.2f "
           "launch_us=%.2f graph_nodes=%zu bins=%lld\n",
           det ? "det" : mode == 1 ? "fast_single" : mode == 3 ? "fast_zeroed" : mode == 4 ? "fast_single_zeroed" : "fast", (long long)S, (long long)P, median(tg), in_bytes, wsb, median(tg) * 1e3, median(tl) * 1e3, nodes,
           (long long)B);
    fflush(stdout);
    CK(cudaGraphExecDestroy(gexec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(cs));
    CK(cudaFree(sd));
    CK(cudaFree(td));
    CK(cudaFree(wd));
    CK(cudaFree(md));
    CK(cudaFree(bud));
    CK(cudaFree(cvd));
    CK(cudaFree(loss));
    CK(cudaFree(grad));
    CK(cudaFree(pd));
    CK(cudaFree(bd));
    CK(cudaFree(err));
    CK(cudaFree(ws));
}

/* ------------------------------------------------------------------ segment sums ---------- */
__global__ void seg_det_kernel(const int32_t *cu, int64_t nseq, const float *v, float *out) { lf_seg_sum_grid(cu, nseq, v, out); }

#ifndef SEG_CTAS_PER_SM
#define SEG_CTAS_PER_SM 4 /* 64 registers, no spills (measured against 2 and 3: bench/RESULTS.md) */
#endif
__global__ void __launch_bounds__(256, SEG_CTAS_PER_SM) seg_chunk_kernel(const int32_t *cu, int64_t nseq, int64_t T, const float *v, float *out, void *ws)
{
    lf_seg_sum_chunked(cu, nseq, T, v, out, ws);
}

__global__ void seg_fast_kernel(const int32_t *cu, int64_t nseq, const float *v, int64_t T, float *out)
{
    const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    float x = 0.0f;
    int64_t seg = -1;
    if (t < T) {
        x = v[t];
        seg = lf_seq_find(cu, nseq, t);
    }
    bool last;
    const float s = lf_warp_seg_scan_f32(x, seg, &last);
    if (last && seg >= 0) atomicAdd(out + seg, s);
}

__global__ void seg_fill(float *v, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        v[i] = (float)((i * 2654435761u) & 1023) * (1.0f / 512.0f) - 1.0f;
}

/* the ceiling: read every value once (16-byte loads), nothing else */
__global__ void plain_read_kernel(const float4 *v, int64_t n4, float *sink)
{
    float a = 0.0f;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += (int64_t)gridDim.x * blockDim.x) {
        const float4 x = __ldcs(v + i);
        a += (x.x + x.y) + (x.z + x.w);
    }
    if (a == 1234.5f) *sink = a; /* never true for this data; keeps the loads */
}

static void bench_seg(const cudaDeviceProp &prop, void *flush, size_t flush_bytes, cudaEvent_t e0, cudaEvent_t e1)
{
    const int64_t T = 100000000, nseq = 100000;
    std::vector<int32_t> cu(nseq + 1);
    std::vector<double> cut(nseq - 1);
    for (auto &c : cut) c = urand();
    std::sort(cut.begin(), cut.end());
    cu[0] = 0;
    for (int64_t k = 1; k < nseq; ++k) cu[k] = (int32_t)(cut[k - 1] * (double)T);
    cu[nseq] = (int32_t)T;
    cu[17] = cu[16]; /* an empty sequence (the random cuts give a few more) */
    /* two copies of the values (each 400 MB, far more than L2): the timed launches alternate */
    float *vs[2], *out;
    int32_t *cud;
    for (int r = 0; r < 2; ++r) {
        CK(cudaMalloc(&vs[r], 4 * T));
        seg_fill<<<1024, 256>>>(vs[r], T);
        CK(cudaGetLastError());
    }
    CK(cudaMalloc(&out, 4 * nseq));
    CK(cudaMalloc(&cud, 4 * (nseq + 1)));
    CK(cudaMemcpy(cud, cu.data(), 4 * (nseq + 1), cudaMemcpyHostToDevice));
    const size_t wsb = lf_seg_chunk_ws_bytes(T);
    void *ws;
    CK(cudaMalloc(&ws, wsb));
    CK(cudaMemset(ws, 0, wsb));
    /* m < 4: rotated (a read-only pass leaves L2 clean: each launch starts with the other copy's
     * clean tail in L2, after a 50 us spin that keeps the host's launch latency out); m >= 4: the
     * old way for comparison, after a 256 MiB write (L2 full of dirty lines that the timed read
     * then writes back: impl suffix _l2dirty) */
    const char *names[6] = {"lossfuse_chunked", "lossfuse_det", "lossfuse_fast", "plain_read", "lossfuse_chunked_l2dirty",
                            "plain_read_l2dirty"};
    for (int m = 0; m < 6; ++m) {
        const int k = m == 4 ? 0 : m == 5 ? 3 : m;
        std::vector<float> t;
        for (int it = 0; it < 14; ++it) {
            const float *v = vs[it & 1];
            if (m >= 4) CK(cudaMemsetAsync(flush, it & 0xff, flush_bytes));
            if (k == 2) CK(cudaMemsetAsync(out, 0, 4 * nseq));
            if (m < 4) {
                bench_delay<<<1, 1>>>(50000);
                CK(cudaGetLastError());
            }
            CK(cudaEventRecord(e0));
            if (k == 0) seg_chunk_kernel<<<(unsigned)(prop.multiProcessorCount * SEG_CTAS_PER_SM), 256>>>(cud, nseq, T, v, out, ws);
            else if (k == 1) seg_det_kernel<<<(unsigned)(prop.multiProcessorCount * 8), 256>>>(cud, nseq, v, out);
            else if (k == 2) seg_fast_kernel<<<(unsigned)((T + 255) / 256), 256>>>(cud, nseq, v, T, out);
            else plain_read_kernel<<<(unsigned)(prop.multiProcessorCount * 8), 256>>>((const float4 *)v, T / 4, out);
            CK(cudaGetLastError());
            CK(cudaEventRecord(e1));
            const float ms = time_ms(e0, e1);
            if (it >= 2) t.push_back(ms);
        }
        printf("RESULT impl=%s mode=segsum N=%lld V=%lld dtype=fp32 ms=%.4f bytes=%zu extra_bytes=%zu status=ok\n", names[m],
               (long long)T, (long long)nseq, median(t), (size_t)4 * T, k == 0 ? wsb : (size_t)0);
        fflush(stdout);
    }
    CK(cudaFree(ws));
    for (int r = 0; r < 2; ++r) CK(cudaFree(vs[r]));
    CK(cudaFree(out));
    CK(cudaFree(cud));
}

int main(int argc, char **argv)
{
    std::string shapes = "8192x32768,8192x151936";
    std::string modes = "pref,segsum,dpo";
    int iters = 10, nseq = 16;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--modes") && i + 1 < argc) modes = argv[++i];
        else if (!strcmp(argv[i], "--shapes") && i + 1 < argc) shapes = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seqs") && i + 1 < argc) nseq = atoi(argv[++i]) & ~1;
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("bench_packed: no CUDA device\n");
        return 77;
    }
    const cudaDeviceProp prop = bench_device_line();
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    bench_copy_line(e0, e1);
    const size_t flush_bytes = 256u << 20;
    void *flush;
    CK(cudaMalloc(&flush, flush_bytes));
    auto want = [&](const char *m) { return ("," + modes + ",").find("," + std::string(m) + ",") != std::string::npos; };
    if (want("pref"))
        for (int mode = 0; mode < 5; ++mode) bench_pref(mode, e0, e1);
    if (want("segsum")) bench_seg(prop, flush, flush_bytes, e0, e1);
    size_t pos = 0;
    int64_t T, V;
    while (want("dpo") && bench_next_shape(shapes, &pos, &T, &V)) bench_dpo(T, V, nseq < 2 ? 2 : nseq, iters, flush, flush_bytes, e0, e1);
    CK(cudaFree(flush));
    return 0;
}
