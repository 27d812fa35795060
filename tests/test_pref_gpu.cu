/* tests/test_pref_gpu.cu — GPU tests of examples/pairwise_preference.cu against the double
 * host reference lf_ref_pairwise_preference (lossfuse.h section 9c).
 *
 *   test_pref_gpu [--small] [--seed S]      exit 0 passed, 1 failed, 77 no device
 *
 * Bradley-Terry and hinge, fast (three launches, or one cooperative) and deterministic modes,
 * with and without per-pair weights and scales, histogram penalties with both gates, a hot
 * item, 0 and 1 pairs, poisoned outputs, bit-identity of the deterministic mode, CUDA-graph
 * replays of the fast mode. Bad input, counted exactly and skipped (compared with the
 * reference on the valid pairs, bad bins as no bin): pairs with an item out of range or i == j;
 * bad targets (Bradley-Terry outside [0, 1]: 1.5, -0.25, 1 + 2^-23, -inf, with exact 0 and 1
 * among the valid ones; hinge other than +-1: 0, 0.5, -(1 + 2^-23), +inf), some on pairs that
 * are bad already (still one error each); bin ids n_bins, n_bins + 2, -2, -7 and INT32_MIN;
 * n_bins == 0 with item_bin given (every id but -1 counted, no penalty, no hist). Histograms
 * in the fast mode's shared memory (B <= PREF_SMEM_BINS) and in global memory (B = 5000). A
 * NaN target: not counted, NaN loss and NaN gradient on its two items only. n_bins = 2^31:
 * LF_ERR_SIZE, nothing launched. Tolerances: each pair term and its derivative is a
 * float evaluation (relative ~2^-22 of its size), sums in double or float atomics (fast mode:
 * (n + 1) 2^-24 of the sum of |terms| per slot). A bin's total h_b carries herr_b = (n_b + 1)
 * 2^-24 sum_b |m g| (fast; det: 2^-23 sum_b) and moves the penalty by 2 (w_B over + w_C under)
 * herr_b and each of its items' gradients by 2 (w_B + w_C) m |g'| herr_b. The loss within 1e-5
 * (1 + |loss|) plus that; each gradient entry within 2^-18 of the sum of the |pair terms|
 * that reach it, the penalty part, and 1e-6 of the largest entry.
 */
#define PREF_NO_MAIN
#include "examples/pairwise_preference.cu"

#include "tests/gpu_test.cuh"

struct PCase {
    const char *name = "";
    int64_t S = 100, P = 500, B = 7;
    lf_pref_kind kind = LF_PREF_BT;
    lf_pref_gate gate = LF_GATE_SIGMOID;
    bool det = false, single = false, weights = false, scales = false, bins = true, dev_div = false, grad = true;
    double bad_pairs = 0.0, bad_bins = 0.0, bad_targets = 0.0, hot = 0.3;
};

static void run_pcase(const PCase &c)
{
    snprintf(g_case, sizeof g_case, "%s S=%lld P=%lld %s %s", c.name, (long long)c.S, (long long)c.P,
             c.kind == LF_PREF_BT ? "bt" : "hinge", c.det ? "det" : c.single ? "fast single" : "fast");
    const int fails = g_fail;
    uint64_t rs = g_seed ^ mix64((uint64_t)c.S * 7919u + (uint64_t)c.P * 104729u + (uint64_t)c.kind * 31u + (uint64_t)c.det + 2u * (uint64_t)c.single);
    const int64_t S = c.S, P = c.P, B = c.B;
    std::vector<float> s(S), t(P + 1), w(P + 1), sc(P + 1), mass(S), budget(B + 1), cov(B + 1);
    std::vector<int32_t> pairs(2 * P + 2), bin(S);
    for (int64_t i = 0; i < S; ++i) {
        s[i] = (float)(4.0 * (rng_u(&rs) - 0.5));
        bin[i] = (int32_t)(rng_u(&rs) * (B + 1)) - 1;
        mass[i] = (float)(0.5 + rng_u(&rs));
    }
    for (int64_t b = 0; b < B; ++b) {
        budget[b] = (float)(0.5 * S / (B + 1));
        cov[b] = (float)(0.45 * S / (B + 1));
    }
    int64_t n_bad = 0;
    std::vector<char> valid(P + 1, 1);
    for (int64_t p = 0; p < P; ++p) {
        int32_t a = (int32_t)(rng_u(&rs) * S) % (int32_t)S, b = (int32_t)(rng_u(&rs) * (S - 1)) % (int32_t)(S - 1);
        if (b >= a) ++b;
        if (rng_u(&rs) < c.hot && a != 0) b = 0; /* item 0 is hot */
        if (rng_u(&rs) < c.bad_pairs) {
            const int r = (int)(p % 3);
            if (r == 0) b = a;
            else if (r == 1) a = (int32_t)S;
            else b = -3;
            valid[p] = 0;
            ++n_bad;
        }
        pairs[2 * p] = a;
        pairs[2 * p + 1] = b;
        t[p] = c.kind == LF_PREF_BT ? (float)rng_u(&rs) : (rng_u(&rs) < 0.5 ? -1.0f : 1.0f);
        w[p] = rng_u(&rs) < 0.05 ? 0.0f : (float)(0.25 + rng_u(&rs));
        sc[p] = (float)(0.5 + 2.0 * rng_u(&rs));
        if (c.bad_targets > 0.0) {
            if (rng_u(&rs) < c.bad_targets) { /* a bad target: one error, also on a pair that is bad already */
                static const float bad_bt[4] = {1.5f, -0.25f, 0x1.000002p0f, -INFINITY}, bad_hinge[4] = {0.0f, 0.5f, -0x1.000002p0f, INFINITY};
                t[p] = c.kind == LF_PREF_BT ? bad_bt[p % 4] : bad_hinge[p % 4];
                if (valid[p]) {
                    valid[p] = 0;
                    ++n_bad;
                }
            } else if (c.kind == LF_PREF_BT && rng_u(&rs) < 0.1) {
                t[p] = (p & 1) ? 1.0f : 0.0f; /* the ends of [0, 1] are valid */
            }
        }
    }
    if (c.bins)
        for (int64_t i = 0; i < S; ++i)
            if (rng_u(&rs) < c.bad_bins) {
                const int32_t bad_bin[5] = {(int32_t)B, (int32_t)(B + 2), -2, -7, INT32_MIN};
                bin[i] = bad_bin[i % 5];
                ++n_bad;
            }
    /* the reference over the valid pairs and with bad bins as no bin */
    std::vector<int32_t> vp;
    std::vector<float> vt, vw, vsc;
    for (int64_t p = 0; p < P; ++p)
        if (valid[p]) {
            vp.push_back(pairs[2 * p]);
            vp.push_back(pairs[2 * p + 1]);
            vt.push_back(t[p]);
            vw.push_back(w[p]);
            vsc.push_back(sc[p]);
        }
    std::vector<int32_t> vbin(bin);
    for (auto &b : vbin)
        if (b < -1 || b >= B) b = -1;
    lf_pref_opts o = lf_pref_opts_default();
    o.kind = c.kind;
    o.gate = c.gate;
    o.budget_weight = c.bins ? 0.4f : 0.0f;
    o.coverage_weight = c.bins ? 0.9f : 0.0f;
    o.margin = 0.5f;
    const int64_t nv = (int64_t)vt.size();
    double ref[3] = {0, 0, 0};
    std::vector<double> rg(S), rh(B + 1);
    const double D = c.dev_div ? 37.5 : -1.0;
    EXPECT(lf_ref_pairwise_preference(S, s.data(), nv, vp.data(), vt.data(), c.weights ? vw.data() : NULL, c.scales ? vsc.data() : NULL,
                                      c.bins ? vbin.data() : NULL, mass.data(), B, budget.data(), cov.data(), &o, D, ref, rh.data(),
                                      rg.data()) == LF_OK,
           "reference failed");
    /* the sums of |terms| per item, for the tolerance */
    std::vector<double> mag(S, 0.0), cnt(S, 1.0);
    double wsum = 0.0;
    for (int64_t p = 0; p < nv; ++p) wsum += c.weights ? vw[p] : 1.0;
    const double inv = c.dev_div ? 1.0 / 37.5 : (wsum > 0 ? 1.0 / wsum : 0.0);
    for (int64_t p = 0; p < nv; ++p) {
        const double a = (c.weights ? vw[p] : 1.0) * (c.scales ? vsc[p] : 1.0) * inv * 2.0;
        mag[vp[2 * p]] += a;
        mag[vp[2 * p + 1]] += a;
        cnt[vp[2 * p]] += 1;
        cnt[vp[2 * p + 1]] += 1;
    }
    double gmax = 0.0;
    for (int64_t i = 0; i < S; ++i) gmax = fmax(gmax, fabs(rg[i]));
    /* the histogram's float error per bin, and what it does to the penalty and its gradient */
    std::vector<double> herr(B + 1, 0.0), bsum(B + 1, 0.0), bcnt(B + 1, 1.0), pen_g(S, 0.0);
    double pen_tol = 0.0;
    if (c.bins) {
        for (int64_t i = 0; i < S; ++i)
            if (vbin[i] >= 0) {
                const double g = c.gate == LF_GATE_SIGMOID ? 1.0 / (1.0 + exp(-(double)s[i])) : (double)s[i];
                bsum[vbin[i]] += fabs(mass[i] * g);
                bcnt[vbin[i]] += 1.0;
            }
        for (int64_t b = 0; b < B; ++b) {
            herr[b] = (c.det ? 0x1p-23 : (bcnt[b] + 1.0) * 0x1p-24) * bsum[b] + 0x1p-22 * bsum[b];
            const double over = rh[b] > budget[b] ? rh[b] - budget[b] : 0.0, under = rh[b] < cov[b] ? cov[b] - rh[b] : 0.0;
            pen_tol += 2.0 * (o.budget_weight * over + o.coverage_weight * under) * herr[b] + (o.budget_weight + o.coverage_weight) * herr[b] * herr[b];
        }
        for (int64_t i = 0; i < S; ++i)
            if (vbin[i] >= 0) {
                const double dg = c.gate == LF_GATE_SIGMOID ? 0.25 : 1.0;
                pen_g[i] = 2.0 * (o.budget_weight + o.coverage_weight) * mass[i] * dg * herr[vbin[i]] + 0x1p-20 * fabs(rg[i]);
            }
    }

    DevBuf sd(4 * S), td(4 * P + 4), wd(4 * P + 4), scd(4 * P + 4), md(4 * S), bud(4 * B + 4), cvd(4 * B + 4), pd(8 * P + 8),
        bd(4 * S), loss(12), grad(4 * S), hist(4 * B + 4), err(4), divd(4);
    const size_t wsb = pref_workspace_bytes(S, P, c.bins ? B : 0, c.det);
    DevBuf ws(wsb);
    CK(cudaMemcpy(sd.p, s.data(), 4 * S, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(td.p, t.data(), 4 * P + 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(wd.p, w.data(), 4 * P + 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(scd.p, sc.data(), 4 * P + 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(md.p, mass.data(), 4 * S, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(bud.p, budget.data(), 4 * B + 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(cvd.p, cov.data(), 4 * B + 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(pd.p, pairs.data(), 8 * P + 8, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(bd.p, bin.data(), 4 * S, cudaMemcpyHostToDevice));
    const float divh = 37.5f;
    CK(cudaMemcpy(divd.p, &divh, 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(err.p, 0, 4));
    /* the workspace holds garbage: the launch must not depend on its contents */
    CK(cudaMemset(ws.p, 0x7f, wsb));
    fill_poison(loss.p, 3, LF_F32);
    fill_poison(grad.p, S, LF_F32);
    fill_poison(hist.p, B + 1, LF_F32);

    pref_args a = pref_args_default();
    a.n_items = S;
    a.scores = (const float *)sd.p;
    a.n_pairs = P;
    a.pairs = (const int32_t *)pd.p;
    a.target = (const float *)td.p;
    a.pair_weight = c.weights ? (const float *)wd.p : NULL;
    a.pair_scale = c.scales ? (const float *)scd.p : NULL;
    a.opts = o;
    a.item_bin = c.bins ? (const int32_t *)bd.p : NULL;
    a.item_mass = (const float *)md.p;
    a.n_bins = B;
    a.budget = (const float *)bud.p;
    a.coverage = (const float *)cvd.p;
    a.divisor = c.dev_div ? (const float *)divd.p : NULL;
    a.deterministic = c.det;
    a.single_launch = c.single;
    a.loss = (float *)loss.p;
    a.grad = c.grad ? (float *)grad.p : NULL;
    a.hist = c.bins && B > 0 ? (float *)hist.p : NULL; /* with no bins, hist is not needed */
    a.n_errors = (unsigned *)err.p;
    a.workspace = ws.p;
    a.workspace_bytes = wsb;
    cudaError_t ce;
    EXPECT(pref_launch(&a, 0, &ce) == LF_OK, "pref_launch: %s", cudaGetErrorString(ce));
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    float lh[3];
    std::vector<float> gh(S), hh(B + 1);
    unsigned eh;
    CK(cudaMemcpy(lh, loss.p, 12, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gh.data(), grad.p, 4 * S, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hh.data(), hist.p, 4 * (B + 1), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&eh, err.p, 4, cudaMemcpyDeviceToHost));
    EXPECT((int64_t)eh == n_bad, "n_errors %u want %lld", eh, (long long)n_bad);
    for (int k = 0; k < 3; ++k)
        EXPECT(close(lh[k], ref[k], 1e-5 * (1.0 + fabs(ref[k])) + (k != 1 ? pen_tol : 0.0)), "loss[%d] %.9g want %.9g", k, lh[k], ref[k]);
    if (c.bins)
        for (int64_t b = 0; b < B; ++b) EXPECT(close(hh[b], rh[b], herr[b] + 1e-30), "hist[%lld] %.9g want %.9g", (long long)b, hh[b], rh[b]);
    /* every output poisoned before a rerun, so that what is checked is that run's writes */
    auto poison_outputs = [&]() {
        fill_poison(grad.p, S, LF_F32);
        fill_poison(loss.p, 3, LF_F32);
        fill_poison(hist.p, B + 1, LF_F32);
        CK(cudaDeviceSynchronize()); /* (on the default stream: it lands before a launch on another) */
    };
    /* the bin totals now in hist against the reference (with bins) */
    auto check_hist = [&](const char *when, int call) {
        if (!c.bins) return;
        CK(cudaMemcpy(hh.data(), hist.p, 4 * (B + 1), cudaMemcpyDeviceToHost));
        int hb = 0;
        for (int64_t b = 0; b < B; ++b) hb += !close(hh[b], rh[b], herr[b] + 1e-30);
        EXPECT(hb == 0, "%s: %d bin totals off (call %d)", when, hb, call);
    };
    auto check_grad = [&](const std::vector<float> &gv, const char *when) {
        int bad = 0;
        int64_t wi = -1;
        for (int64_t i = 0; i < S; ++i) {
            const double tol = (0x1p-18 + (c.det ? 0.0 : cnt[i] * 0x1p-24)) * mag[i] + pen_g[i] + 1e-6 * gmax + 1e-30;
            if (!close(gv[i], rg[i], tol)) {
                if (wi < 0) wi = i;
                ++bad;
            }
        }
        EXPECT(bad == 0, "%s: %d gradient entries off; first %lld: %.9g want %.9g", when, bad, (long long)wi, wi >= 0 ? gv[wi] : 0.0f,
               wi >= 0 ? rg[wi] : 0.0);
    };
    if (c.grad) {
        check_grad(gh, "launch");
        if (!c.det) { /* captured in a CUDA graph, replayed 3 times: the memset is in the graph, so each
                       * replay starts clean; the pair loss (fixed-order partials) keeps its bits */
            cudaStream_t cs;
            cudaGraph_t graph;
            cudaGraphExec_t gexec;
            CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
            CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
            const lf_status gst = pref_launch(&a, cs, &ce);
            CK(cudaStreamEndCapture(cs, &graph));
            EXPECT(gst == LF_OK, "capture");
            CK(cudaGraphInstantiate(&gexec, graph, 0));
            /* the outputs poisoned first, so that what is checked is the replays' writes */
            poison_outputs();
            for (int r = 0; r < 3; ++r) CK(cudaGraphLaunch(gexec, cs));
            CK(cudaStreamSynchronize(cs));
            std::vector<float> g3(S);
            float l3[3];
            CK(cudaMemcpy(g3.data(), grad.p, 4 * S, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(l3, loss.p, 12, cudaMemcpyDeviceToHost));
            check_grad(g3, "graph replay");
            check_hist("graph replay", 3);
            EXPECT(memcmp(&l3[1], &lh[1], 4) == 0, "fast-mode pair loss changed bits on graph replay");
            for (int q = 0; q < 3; q += 2) /* the penalty comes from a float-atomic histogram */
                EXPECT(close(l3[q], ref[q], 1e-5 * (1.0 + fabs(ref[q])) + pen_tol), "graph replay loss[%d] %.9g want %.9g", q, l3[q], ref[q]);
            CK(cudaGraphExecDestroy(gexec));
            CK(cudaGraphDestroy(graph));
            CK(cudaMemcpy(&eh, err.p, 4, cudaMemcpyDeviceToHost));
            EXPECT((int64_t)eh == 4 * n_bad, "n_errors after 3 replays %u want %lld", eh, (long long)(4 * n_bad));
            /* workspace_zeroed: every fast call above (the first on a garbage workspace) left the
             * accumulators zeroed, so calls that skip the clearing must give the same results:
             * twice on the stream, then three replays of a graph captured so */
            pref_args az = a;
            az.workspace_zeroed = 1;
            for (int r = 0; r < 5; ++r) {
                poison_outputs();
                if (r < 2) {
                    EXPECT(pref_launch(&az, cs, &ce) == LF_OK, "zeroed launch: %s", cudaGetErrorString(ce));
                } else {
                    CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
                    const lf_status zst = pref_launch(&az, cs, &ce);
                    CK(cudaStreamEndCapture(cs, &graph));
                    EXPECT(zst == LF_OK, "zeroed capture");
                    CK(cudaGraphInstantiate(&gexec, graph, 0));
                    CK(cudaGraphLaunch(gexec, cs));
                    CK(cudaStreamSynchronize(cs));
                    CK(cudaGraphExecDestroy(gexec));
                    CK(cudaGraphDestroy(graph));
                }
                CK(cudaStreamSynchronize(cs));
                CK(cudaMemcpy(g3.data(), grad.p, 4 * S, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(l3, loss.p, 12, cudaMemcpyDeviceToHost));
                check_grad(g3, r < 2 ? "workspace_zeroed" : "workspace_zeroed graph");
                check_hist("workspace_zeroed", r); /* a bin total left over from the call before would show */
                EXPECT(memcmp(&l3[1], &lh[1], 4) == 0, "workspace_zeroed: pair loss changed bits (call %d)", r);
                for (int q = 0; q < 3; q += 2)
                    EXPECT(close(l3[q], ref[q], 1e-5 * (1.0 + fabs(ref[q])) + pen_tol), "workspace_zeroed loss[%d] %.9g want %.9g", q,
                           l3[q], ref[q]);
            }
            CK(cudaStreamDestroy(cs));
            CK(cudaMemcpy(&eh, err.p, 4, cudaMemcpyDeviceToHost));
            EXPECT((int64_t)eh == 9 * n_bad, "n_errors after 5 more calls %u want %lld", eh, (long long)(9 * n_bad));
        }
        if (c.det) { /* run again on a garbage workspace, the outputs poisoned: the same bits */
            CK(cudaMemset(ws.p, 0x3c, wsb));
            poison_outputs();
            EXPECT(pref_launch(&a, 0, &ce) == LF_OK, "relaunch");
            CK(cudaDeviceSynchronize());
            std::vector<float> g2(S), h2(B + 1);
            float l2[3];
            CK(cudaMemcpy(g2.data(), grad.p, 4 * S, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(l2, loss.p, 12, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(h2.data(), hist.p, 4 * (B + 1), cudaMemcpyDeviceToHost));
            EXPECT(memcmp(g2.data(), gh.data(), 4 * S) == 0, "deterministic gradient not bit-identical");
            EXPECT(memcmp(l2, lh, 12) == 0, "deterministic loss not bit-identical");
            if (c.bins) EXPECT(memcmp(h2.data(), hh.data(), 4 * B) == 0, "deterministic histogram not bit-identical");
        }
    }
    printf("%-4s %s\n", g_fail == fails ? "ok" : "FAIL", g_case);
}

static const char *mode_name(int mode) { return mode == 2 ? "det" : mode == 1 ? "fast single" : "fast"; }

/* A small hand-written case on the device: scores, pairs and targets uploaded, the loss and the
 * gradient poisoned, the error count zeroed, a workspace for no bins, and pref_args filled in
 * for mode 0 (fast), 1 (fast, one launch) or 2 (deterministic); no bins, weights or scales. */
struct SmallPref {
    DevBuf sd, pd, td, loss, grad, err, ws;
    pref_args a;
    SmallPref(const float *s, int64_t S, const int32_t *pairs, const float *t, int64_t P, int mode)
        : sd(4 * S), pd(8 * P), td(4 * P), loss(12), grad(4 * S), err(4), ws(pref_workspace_bytes(S, P, 0, mode == 2))
    {
        CK(cudaMemcpy(sd.p, s, 4 * S, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(pd.p, pairs, 8 * P, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(td.p, t, 4 * P, cudaMemcpyHostToDevice));
        CK(cudaMemset(err.p, 0, 4));
        fill_poison(loss.p, 3, LF_F32);
        fill_poison(grad.p, S, LF_F32);
        a = pref_args_default();
        a.n_items = S;
        a.scores = (const float *)sd.p;
        a.n_pairs = P;
        a.pairs = (const int32_t *)pd.p;
        a.target = (const float *)td.p;
        a.deterministic = mode == 2;
        a.single_launch = mode == 1;
        a.loss = (float *)loss.p;
        a.grad = (float *)grad.p;
        a.n_errors = (unsigned *)err.p;
        a.workspace = ws.p;
        a.workspace_bytes = ws.bytes;
    }
    /* after a launch (or a refused one): the last error checked, the device synchronised, the
     * loss (3 floats), the gradient (S floats) and the error count read back */
    void fetch(void *lh, void *gh, unsigned *eh) const
    {
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(lh, loss.p, 12, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(gh, grad.p, grad.bytes, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(eh, err.p, 4, cudaMemcpyDeviceToHost));
    }
};

/* A NaN target does not make a pair bad: no error, the loss NaN (NaN in, NaN out), a NaN
 * gradient on the pair's two items and a finite one everywhere else. */
static void run_nan_target(lf_pref_kind kind, int mode)
{
    snprintf(g_case, sizeof g_case, "NaN target %s %s", kind == LF_PREF_BT ? "bt" : "hinge", mode_name(mode));
    const int fails = g_fail;
    constexpr int64_t S = 8, P = 6;
    const float s[S] = {0.3f, -1.2f, 0.7f, 2.0f, -0.4f, 0.1f, 1.1f, -2.2f};
    const int32_t pairs[2 * P] = {0, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4}; /* pair 0 = (0, 1); item 1 also in pair 4 */
    float t[P];
    for (int64_t p = 0; p < P; ++p) t[p] = kind == LF_PREF_BT ? 0.25f * (float)(p % 5) : (p & 1) ? -1.0f : 1.0f;
    t[0] = NAN;
    SmallPref c(s, S, pairs, t, P, mode);
    CK(cudaMemset(c.ws.p, 0x7f, c.ws.bytes));
    c.a.opts.kind = kind;
    cudaError_t ce;
    EXPECT(pref_launch(&c.a, 0, &ce) == LF_OK, "pref_launch: %s", cudaGetErrorString(ce));
    float lh[3], gh[S];
    unsigned eh;
    c.fetch(lh, gh, &eh);
    EXPECT(eh == 0u, "n_errors %u want 0 (a NaN target is not a bad pair)", eh);
    /* the poison is a NaN too: every output must have been written */
    int unwritten = 0;
    for (int k = 0; k < 3; ++k) unwritten += memcmp(&lh[k], &POISON32, 4) == 0;
    for (int64_t i = 0; i < S; ++i) unwritten += memcmp(&gh[i], &POISON32, 4) == 0;
    EXPECT(unwritten == 0, "%d outputs not written", unwritten);
    EXPECT(lh[0] != lh[0] && lh[1] != lh[1], "loss %.9g, pair loss %.9g: want NaN", lh[0], lh[1]);
    EXPECT(lh[2] == 0.0f, "penalty %.9g want 0", lh[2]);
    for (int64_t i = 0; i < S; ++i) {
        if (i < 2) EXPECT(gh[i] != gh[i], "grad[%lld] %.9g want NaN", (long long)i, gh[i]);
        else EXPECT(isfinite(gh[i]), "grad[%lld] %.9g want finite", (long long)i, gh[i]);
    }
    printf("%-4s %s\n", g_fail == fails ? "ok" : "FAIL", g_case);
}

/* n_bins = 2^31 (bin ids are int32): LF_ERR_SIZE, checked on the host before anything is
 * launched. Nothing of that size is allocated: the workspace is the one for no bins, its size
 * claimed to be what 2^31 bins would need (so that only the n_bins check can refuse the call;
 * item_bin is NULL, so even a launch would stay within it). Then the same call with n_bins = 0
 * and the true size: LF_OK (the other arguments are good). */
static void run_too_many_bins(int mode)
{
    snprintf(g_case, sizeof g_case, "n_bins = 2^31 %s", mode_name(mode));
    const int fails = g_fail;
    constexpr int64_t S = 16, P = 8;
    float s[S], t[P];
    int32_t pairs[2 * P];
    for (int64_t i = 0; i < S; ++i) s[i] = 0.1f * (float)i - 0.7f;
    for (int64_t p = 0; p < P; ++p) {
        pairs[2 * p] = (int32_t)(2 * p);
        pairs[2 * p + 1] = (int32_t)(2 * p + 1);
        t[p] = 0.75f;
    }
    const int64_t huge = (int64_t)0x80000000ll;
    SmallPref c(s, S, pairs, t, P, mode);
    CK(cudaDeviceSynchronize());
    pref_args &a = c.a;
    const size_t wsb = a.workspace_bytes;
    a.n_bins = huge;
    a.workspace_bytes = pref_workspace_bytes(S, P, huge, mode == 2); /* a host computation only */
    EXPECT(a.workspace_bytes > (size_t)4 * (size_t)huge, "claimed workspace %zu bytes", a.workspace_bytes);
    cudaError_t ce;
    lf_status st = pref_launch(&a, 0, &ce);
    EXPECT(st == LF_ERR_SIZE, "n_bins 2^31: %s, want LF_ERR_SIZE", lf_status_str(st));
    a.n_bins = INT64_MAX;
    a.workspace_bytes = (size_t)-1;
    st = pref_launch(&a, 0, &ce);
    EXPECT(st == LF_ERR_SIZE, "n_bins INT64_MAX: %s, want LF_ERR_SIZE", lf_status_str(st));
    uint32_t lb[3], gb[S];
    unsigned eh;
    c.fetch(lb, gb, &eh);
    int written = 0;
    for (int k = 0; k < 3; ++k) written += lb[k] != POISON32;
    for (int64_t i = 0; i < S; ++i) written += gb[i] != POISON32;
    EXPECT(written == 0 && eh == 0u, "refused call wrote %d outputs, n_errors %u", written, eh);
    a.n_bins = 0; /* the control: the same call with no bins runs */
    a.workspace_bytes = wsb;
    st = pref_launch(&a, 0, &ce);
    EXPECT(st == LF_OK, "n_bins 0: %s (%s)", lf_status_str(st), cudaGetErrorString(ce));
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    float lh[3];
    CK(cudaMemcpy(lh, c.loss.p, 12, cudaMemcpyDeviceToHost));
    EXPECT(isfinite(lh[0]) && lh[0] > 0.0f && lh[2] == 0.0f, "n_bins 0: loss %.9g, penalty %.9g", lh[0], lh[2]);
    printf("%-4s %s\n", g_fail == fails ? "ok" : "FAIL", g_case);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--small")) g_small = 1;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) g_seed = strtoull(argv[++i], NULL, 0);
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("test_pref_gpu: no CUDA device, skipped\n");
        return 77;
    }
    if (!g_seed) g_seed = (uint64_t)time(NULL);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("test_pref_gpu on %s (sm_%d%d), seed %llu%s\n", prop.name, prop.major, prop.minor, (unsigned long long)g_seed,
           g_small ? ", small sizes" : "");
    for (int mode = 0; mode < 3; ++mode) /* fast (memset + two kernels), fast single (cooperative), deterministic */
        for (int kind = 0; kind < 2; ++kind) {
            PCase b;
            b.det = mode == 2;
            b.single = mode == 1;
            b.kind = (lf_pref_kind)kind;
            PCase c;
            c = b; c.name = "plain"; c.bins = false; run_pcase(c);
            c = b; c.name = "weights, scales, bins"; c.weights = c.scales = true; run_pcase(c);
            c = b; c.name = "bins, gate none, device divisor"; c.gate = LF_GATE_NONE; c.dev_div = true; run_pcase(c);
            c = b; c.name = "bad pairs and bins"; c.bad_pairs = 0.1; c.bad_bins = 0.05; c.weights = true; run_pcase(c);
            c = b; c.name = "one pair"; c.P = 1; c.S = 2; c.hot = 0.0; run_pcase(c);
            c = b; c.name = "no pairs"; c.P = 0; run_pcase(c);
            c = b; c.name = "forward only"; c.grad = false; run_pcase(c);
            c = b; c.name = "many"; c.S = g_small ? 3000 : 20000; c.P = g_small ? 20000 : 300000; c.B = 100; c.weights = true; run_pcase(c);
            c = b; c.name = "bad targets, bad pairs"; c.bad_targets = 0.15; c.bad_pairs = 0.05; c.weights = true; run_pcase(c);
            c = b; c.name = "bad targets, device divisor"; c.bad_targets = 0.2; c.dev_div = true; c.scales = true; run_pcase(c);
            c = b; c.name = "n_bins 0 with item_bin, bad bin ids"; c.B = 0; c.bad_bins = 0.1; c.bad_pairs = 0.05; run_pcase(c);
            c = b; c.name = "5000 bins (fast: histogram in global memory), bad bins"; c.B = 5000; c.S = g_small ? 6000 : 40000;
            c.P = g_small ? 10000 : 200000; c.bad_bins = 0.02; c.weights = true; run_pcase(c);
            run_nan_target((lf_pref_kind)kind, mode);
        }
    for (int mode = 0; mode < 3; ++mode) run_too_many_bins(mode);
    printf("test_pref_gpu: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
