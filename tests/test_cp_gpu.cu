/* tests/test_cp_gpu.cu — GPU tests of examples/cp_local_ce.cu (context-parallel cross-entropy)
 * and of lossfuse_cuda.cuh's lf_cp_local_labels_grid, in the single-GPU simulation.
 *
 *   test_cp_gpu            cp in {1, 2, 3, 4, 8} x dtypes x options x layouts
 *   test_cp_gpu --small    fewer, smaller cases (for compute-sanitizer)
 *   test_cp_gpu --seed S   reproduce a run
 *   test_cp_gpu --nccl     also the NCCL path, one GPU per rank, for every cp <= the GPUs seen,
 *                          driven by one thread (cp_ce_nccl) and by a thread per rank (cp_ce_launch)
 * Exit: 0 all passed, 1 a check failed, 77 no CUDA device (meson counts it as skipped).
 *
 * Each case (cp_demo_run) makes a packed batch (some sequences empty, a prompt mask, a few
 * out-of-range ids = bad labels), computes the unsharded cross-entropy of it with
 * examples/cross_entropy.cu, then the cp ranks' local losses, and checks: the labels the device
 * built against lf_ref_cp_labels (exact), the global mean loss (1e-6 relative: sums in another
 * order), every gradient row against the unsharded row at its global position (2 units of the
 * dtype's rounding: only the order of the row's sums may differ), per-sequence valid-token
 * counts (exact), mean NLL (1e-5 relative) and perplexity, the bad-label count, and that every output was
 * written (poisoned before). A separate check runs lf_cp_local_labels_grid with int32 ids and
 * labels against the host reference.
 */
#define CP_NO_MAIN
#include "examples/cp_local_ce.cu"

#include "tests/gpu_test.cuh"

__global__ void labels_i32_kernel(const int32_t *cu, int64_t nseq, int cp, int rank, const int32_t *ids, const uint8_t *tm,
                                  int32_t *labels, int64_t *gpos)
{
    lf_cp_local_labels_grid(cu, nseq, cp, rank, ids, tm, -1, labels, gpos);
}

/* lf_cp_local_labels_grid with int32 ids / labels, ignore index -1, odd grid shapes. */
static void test_labels_i32(int cp)
{
    snprintf(g_case, sizeof g_case, "lf_cp_local_labels_grid int32, cp=%d", cp);
    const int fails = g_fail;
    uint64_t rs = g_seed ^ (uint64_t)cp * 977;
    const int64_t nseq = 37;
    std::vector<int32_t> cu(nseq + 1, 0);
    for (int64_t k = 0; k < nseq; ++k) cu[k + 1] = cu[k] + (int32_t)(k % 6 == 5 ? 0 : 2 * cp * (1 + (int64_t)(rng_u(&rs) * 40)));
    const int64_t T = cu[nseq], n = T / cp;
    std::vector<int32_t> ids(T);
    std::vector<int64_t> ids64(T);
    std::vector<uint8_t> tm(T);
    for (int64_t t = 0; t < T; ++t) {
        ids[t] = (int32_t)(rng_u(&rs) * 100000);
        ids64[t] = ids[t];
        tm[t] = rng_u(&rs) < 0.8;
    }
    DevBuf cud(4 * (nseq + 1)), idd(4 * T), tmd(T), labd(4 * n + 4), gpd(8 * n + 8);
    CK(cudaMemcpy(cud.p, cu.data(), 4 * (nseq + 1), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(idd.p, ids.data(), 4 * T, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(tmd.p, tm.data(), T, cudaMemcpyHostToDevice));
    std::vector<int64_t> want(n), wpos(n);
    std::vector<int32_t> got(n);
    std::vector<int64_t> gpos(n);
    for (int r = 0; r < cp; ++r) {
        EXPECT(lf_ref_cp_labels(ids64.data(), tm.data(), cu.data(), nseq, T, cp, r, -1, want.data(), wpos.data()) == LF_OK,
               "reference");
        CK(cudaMemset(labd.p, 0x7f, 4 * n));
        CK(cudaMemset(gpd.p, 0x7f, 8 * n));
        labels_i32_kernel<<<3 + r, 96>>>((const int32_t *)cud.p, nseq, cp, r, (const int32_t *)idd.p, (const uint8_t *)tmd.p,
                                         (int32_t *)labd.p, (int64_t *)gpd.p);
        CK(cudaGetLastError());
        CK(cudaMemcpy(got.data(), labd.p, 4 * n, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gpos.data(), gpd.p, 8 * n, cudaMemcpyDeviceToHost));
        int64_t bad = 0;
        for (int64_t t = 0; t < n; ++t) bad += got[t] != want[t] || gpos[t] != wpos[t];
        EXPECT(bad == 0, "rank %d: %lld local tokens with a wrong label or position", r, (long long)bad);
    }
    printf("%-4s %s\n", g_fail == fails ? "ok" : "FAIL", g_case);
}

static void run(const char *name, const cp_demo &d)
{
    snprintf(g_case, sizeof g_case, "%s cp=%d nseq=%lld V=%lld %s%s", name, d.cp, (long long)d.nseq, (long long)d.V, dt_name(d.dt),
             d.use_nccl ? " NCCL" : "");
    const int fails = g_fail;
    const cp_demo_result r = cp_demo_run(&d);
    EXPECT(r.st == LF_OK, "cp_demo_run: %s (%s)", lf_status_str(r.st), cudaGetErrorString(r.cuda));
    if (r.st == LF_OK) {
        EXPECT(r.label_mismatch == 0, "%lld device labels differ from lf_ref_cp_labels", (long long)r.label_mismatch);
        EXPECT(r.loss_err <= 1.0, "loss %.9g, unsharded %.9g (%.3g x tol)", r.loss, r.loss_ref, r.loss_err);
        EXPECT(r.grad_err <= 1.0, "gradient off by %.3g x tol: token %lld (label %lld) column %lld: %.9g, unsharded %.9g, tol %.3g",
               r.grad_err, (long long)r.gw_pos, (long long)r.gw_label, (long long)r.gw_col, r.gw_got, r.gw_want, r.gw_tol);
        EXPECT(r.count_mismatch == 0, "%lld per-sequence counts differ", (long long)r.count_mismatch);
        EXPECT(r.seq_unwritten == 0, "%lld per-sequence outputs unwritten", (long long)r.seq_unwritten);
        EXPECT(r.nll_err <= 1.0, "per-sequence mean NLL off by %.3g x tol", r.nll_err);
        EXPECT(r.ppl_err <= 1.0, "per-sequence perplexity off by %.3g x tol", r.ppl_err);
        EXPECT(r.errors == r.errors_ref, "bad labels %u, unsharded %u", r.errors, r.errors_ref);
    }
    printf("%-4s %s\n", g_fail == fails ? "ok" : "FAIL", g_case);
    fflush(stdout);
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
        printf("test_cp_gpu: no CUDA device, skipped\n");
        return 77;
    }
    if (!g_seed) g_seed = (uint64_t)time(NULL);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("test_cp_gpu on %s (sm_%d%d), %d device(s), seed %llu%s\n", prop.name, prop.major, prop.minor, ndev,
           (unsigned long long)g_seed, g_small ? ", small sizes" : "");

    for (int cp : {1, 2, 3, 4, 8}) test_labels_i32(cp);

    cp_demo b;
    memset(&b, 0, sizeof b);
    b.opts = lf_ce_opts_default();
    b.dt = LF_BF16;
    b.in_place = 1;
    b.empty_every = 4;
    b.prompt_frac = 0.3;
    b.bad_frac = g_small ? 0.02 : 0.002; /* a few bad labels a case at either size */
    b.mean_len = g_small ? 48 : 256;
    b.nseq = g_small ? 6 : 16;
    b.V = g_small ? 3001 : 32768;
    const lf_dtype dts[3] = {LF_BF16, LF_F16, LF_F32};
    int turn = 0;
    for (int cp : {1, 2, 3, 4, 8}) {
        cp_demo d = b;
        d.cp = cp;
        d.seed = g_seed + (uint64_t)cp;
        run("plain", d);
        d.dt = dts[++turn % 3];
        d.in_place = 0;
        d.opts.label_smoothing = 0.1f;
        d.opts.z_loss = 1e-4f;
        run("smoothing + z-loss, separate gradient", d);
        d = b;
        d.cp = cp;
        d.seed = g_seed * 3 + (uint64_t)cp;
        d.dt = dts[++turn % 3];
        d.opts.softcap = 30.0f;
        d.opts.logit_scale = 0.5f;
        d.V = g_small ? 1001 : 50257;
        d.empty_every = 0;
        run("softcap 30, scale 0.5, V odd", d);
        d = b;
        d.cp = cp;
        d.seed = g_seed * 7 + (uint64_t)cp;
        d.prompt_frac = 1.0; /* no token is a target: loss 0, gradient 0, metrics NaN */
        run("all masked", d);
        d = b;
        d.cp = cp;
        d.seed = g_seed * 13 + (uint64_t)cp;
        d.dt = dts[++turn % 3];
        d.weights = 1;
        d.opts.label_smoothing = cp % 2 ? 0.1f : 0.0f;
        run("class weights (divisor: the global sum of w_y)", d);
        d = b;
        d.cp = cp;
        d.seed = g_seed * 11 + (uint64_t)cp;
        d.nseq = 1;
        d.mean_len = cp; /* one sequence of 2 cp tokens (one unit: cp_demo_run draws 1..2 mean_len / (2 cp) units): one token per chunk */
        d.empty_every = 0;
        run("one tiny sequence", d);
    }
    if (!g_small) {
        cp_demo d = b;
        d.cp = 4;
        d.seed = g_seed + 99;
        d.nseq = 64;
        d.mean_len = 1024;
        d.V = 151936;
        d.dt = LF_BF16;
        run("long batch", d);
    }
#ifdef LF_HAVE_NCCL
    if (with_nccl)
        for (int cp = 1; cp <= ndev && cp <= 8; cp *= 2) {
            cp_demo d = b;
            d.cp = cp;
            d.seed = g_seed + 1000 + (uint64_t)cp;
            d.use_nccl = 1;
            d.weights = 1; /* the weights on every rank's device */
            run("NCCL, class weights", d);
            d.thread_per_rank = 1; /* cp_ce_launch per rank: what one process per GPU runs */
            d.seed += 100;
            run("NCCL, class weights, a thread per rank", d);
        }
#else
    if (with_nccl) printf("skip NCCL cases: built without LF_HAVE_NCCL\n");
#endif

    printf("test_cp_gpu: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
