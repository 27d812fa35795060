/* tests/test_dpo_gpu.cu — GPU tests of examples/dpo_packed.cu against the double host
 * reference lf_ref_dpo_packed (lossfuse.h section 9b).
 *
 *   test_dpo_gpu [--small] [--seed S] [--only W]   exit 0 passed, 1 failed, 77 no device
 *   (--only W: only the cases whose name contains W, e.g. "2^31")
 *
 * Random packings with an empty sequence, a sequence of one token, an all-prompt (unlabelled)
 * sequence and sequences reused by several pairs; every kind and option; bf16 / fp16 / fp32;
 * int32 / int64 labels and the input-ids mode; gradient in place or to a padded buffer
 * (poisoned: every element written, padding untouched); bad labels, bad pairs (chosen ==
 * rejected, a sequence past the end, a negative one) and a bad cu_seqlens (a decrease, cu[0] = 1,
 * cu[n] = T + 1) counted (never an out-of-bounds access), the metrics of a bad pair and, after a
 * bad cu_seqlens, every per-sequence and per-pair output written as 0; the five per-pair
 * metrics (the margin within the rewards' tolerances); bit-identical reruns, and the same bits
 * with the tail as one cooperative launch or as six kernels (dpo_args.separate_launches, on a
 * re-poisoned workspace), and the same bits again from CUDA-graph replays; logits masked with
 * the dtype's lowest finite value (torch.finfo(dtype).min); a launch with no tokens; tokens x V
 * above 2^31 (12 sequences of ~1550 tokens at V = 151936, in place: 64-bit offsets in the row
 * pass, the gradient pass and the reference; not with --small, nor on a host with less than
 * ~49 GB of memory).
 * Tolerances: per-token log-probabilities carry ~2^-22 (|x| + |lse|) each in fp32, sums of a
 * few hundred and float pair losses: the loss within 1e-4 (1 + |loss|), per-sequence log-
 * probabilities within 1e-5 (1 + |logp|) + 2^-20 n; each gradient entry within the dtype's
 * rounding of it plus 2e-5 |c_k| (p_j + [j = y]) (c_k the reference's d loss / d logp_k), and
 * the device's c_k themselves within 2e-5 |c_k|: relative even where a sigmoid loss saturates
 * (c_k ~ e^-z), since both sides form sigma(-z) without the cancellation of sigma(z) - 1.
 * The deferred scale (dpo_args.tok_scale): s_t G_t is held to the same tolerance (G_t's rounding
 * is unit |p - onehot|, times |s_t| = |c_k|: unit |w|), s_t must be exactly -c_k (0 for
 * unlabelled tokens), and an unlabelled token's G_t row exactly 0.
 */
#define DPO_NO_MAIN
#include "examples/dpo_packed.cu"

#include "tests/gpu_test.cuh"

struct DCase {
    const char *name = "";
    int64_t npairs = 5, V = 1000, pad = 0, gpad = 0;
    int64_t len_min = 3, len_span = 0; /* sequence lengths len_min + [0, len_span) (0: 20, 60 full) */
    bool big = false;                  /* the case must have T x V > 2^31 (checked) */
    lf_dtype dt = LF_BF16;
    lf_dpo_kind kind = LF_DPO_SIGMOID;
    float eps = 0.0f, nll = 0.0f, beta = 0.1f;
    bool norm = false, use_ref = true, dev_div = false, dloss = false, ids = false, lab64 = true;
    int grad = 1; /* 0 none, 1 buffer, 2 in place */
    int bad_pairs = 0, bad_labels = 0;
    int bad_cu = 0; /* a bad cu_seqlens: 1 a decrease, 2 cu[0] = 1, 3 cu[n_seqs] = T + 1 */
    bool determinism = false;
    bool deferred = false; /* dpo_args.tok_scale: grad gets G_t = softmax - onehot, tok_scale s_t */
    bool plant_fmin = false; /* entries at the dtype's lowest finite value (finfo.min masking) */
    bool separate = false;   /* dpo_args.separate_launches: the tail as six kernels */
    bool coop_refuse = false; /* dpo_args.coop_refuse_test: the cooperative launch refused, the
                               * six kernels by the fallback (determinism: then compared with the
                               * cooperative launch) */
};

/* The fields every launch sets (the rest stay dpo_args_default's). */
static dpo_args dpo_args_fill(void *x, lf_dtype dt, int64_t T, int64_t V, int64_t stride, const void *labels, bool lab64,
                              const void *cu, int64_t nseq, const void *pairs, int64_t P, float *loss, const DevBuf &ws)
{
    dpo_args a = dpo_args_default();
    a.logits = x;
    a.dtype = dt;
    a.n_tokens = T;
    a.vocab = V;
    a.stride = stride;
    a.labels = labels;
    a.labels_i64 = lab64;
    a.cu_seqlens = (const int32_t *)cu;
    a.n_seqs = nseq;
    a.pairs = (const int32_t *)pairs;
    a.n_pairs = P;
    a.loss = loss;
    a.workspace = ws.p;
    a.workspace_bytes = ws.bytes;
    return a;
}

/* The per-sequence and per-pair outputs and the error counter set, one launch, checked and
 * waited for. */
static void dpo_launch_sync(dpo_args &a, const DevBuf &seq, const DevBuf &pm, const DevBuf &err)
{
    a.seq_logps = (float *)seq.p;
    a.pair_metrics = (float *)pm.p;
    a.n_errors = (unsigned *)err.p;
    cudaError_t ce;
    EXPECT(dpo_launch(&a, 0, &ce) == LF_OK, "dpo_launch: %s", cudaGetErrorString(ce));
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
}

static const char *g_only = NULL;

static void run_dcase(const DCase &c)
{
    if (g_only && !strstr(c.name, g_only)) return;
    const char *kn[4] = {"sigmoid", "hinge", "ipo", "simpo"};
    snprintf(g_case, sizeof g_case, "%s%s %s V=%lld %s", c.deferred ? "deferred scale, " : "", c.name, kn[c.kind], (long long)c.V,
             dt_name(c.dt));
    const int fails = g_fail;
    uint64_t rs = g_seed ^ mix64((uint64_t)c.V * 131u + (uint64_t)c.kind * 7u + (uint64_t)c.dt + (uint64_t)c.npairs * 1009u);
    const int64_t V = c.V, stride = V + c.pad, esz = lf_dtype_size(c.dt);
    /* sequences: 2 per pair plus an empty one (2), a one-token one (5 if present), an all-prompt one (7) */
    const int64_t nseq = 2 * c.npairs + 2;
    std::vector<int32_t> cu(nseq + 1, 0);
    for (int64_t k = 0; k < nseq; ++k) {
        int64_t len = c.len_min + (int64_t)(rng_u(&rs) * (double)(c.len_span ? c.len_span : g_small ? 20 : 60));
        if (k == 2) len = 0;
        if (k == 5) len = 1;
        cu[k + 1] = cu[k] + (int32_t)len;
    }
    const int64_t T = cu[nseq];
    if (c.big) EXPECT(T * V > ((int64_t)1 << 31), "T x V = %lld, not above 2^31", (long long)(T * V));
    std::vector<int64_t> lab(T), ids(T);
    for (int64_t t = 0; t < T; ++t) ids[t] = (int64_t)(rng_u(&rs) * V) % V;
    for (int64_t k = 0; k < nseq; ++k)
        for (int64_t t = cu[k]; t < cu[k + 1]; ++t) {
            const int64_t pos = t - cu[k];
            lab[t] = (pos < 2 || t + 1 == cu[k + 1] || k == 7) ? -100 : (int64_t)(rng_u(&rs) * V) % V;
        }
    if (cu[6] > cu[5]) lab[cu[5]] = 3 % V; /* the one-token sequence has a label */
    int64_t n_bad = 0;
    for (int b = 0; b < c.bad_labels; ++b) {
        const int64_t t = (int64_t)(rng_u(&rs) * T) % T;
        if (lab[t] == -100 || lab[t] < 0 || lab[t] >= V) continue; /* unlabelled, or already made bad */
        lab[t] = b % 2 ? V : -5;
        ++n_bad;
    }
    const int64_t n_bad_labels = n_bad; /* before the bad pairs join the count */
    std::vector<int64_t> ref_lab = lab;
    if (c.ids)
        for (int64_t t = 0; t < T; ++t) ref_lab[t] = lf_packed_next_label(cu.data(), nseq, ids.data(), t, -100);
    std::vector<int64_t> ref_lab_clean = ref_lab; /* bad labels are ignored tokens for the reference */
    /* pairs: (2p, 2p+1), then reuse: pair 0's chosen also in the last pair, the empty and the
     * all-prompt sequences in pairs; with 8 pairs or more (the determinism cases) sequence 0 is
     * also the chosen of pairs npairs/2 .. npairs-2, so that its coefficient is a sum of more
     * than two terms, whose bits depend on their order (two terms commute exactly) */
    std::vector<int32_t> pairs(2 * c.npairs + 2 * c.bad_pairs);
    for (int64_t p = 0; p < c.npairs; ++p) {
        pairs[2 * p] = (int32_t)(2 * p);
        pairs[2 * p + 1] = (int32_t)(2 * p + 1);
    }
    if (c.npairs >= 4) {
        pairs[2] = 2;
        pairs[3] = 7;
        pairs[2 * (c.npairs - 1)] = 0;
    }
    if (c.npairs >= 8)
        for (int64_t p = c.npairs / 2; p < c.npairs - 1; ++p) pairs[2 * p] = 0;
    std::vector<int32_t> valid_pairs(pairs.begin(), pairs.begin() + 2 * c.npairs);
    for (int b = 0; b < c.bad_pairs; ++b) { /* chosen == rejected, a sequence past the end, a negative one */
        pairs[2 * (c.npairs + b)] = b % 3 == 0 ? 1 : b % 3 == 1 ? (int32_t)nseq : 0;
        pairs[2 * (c.npairs + b) + 1] = b % 3 == 0 ? 1 : b % 3 == 1 ? 0 : -2;
    }
    const int64_t P = c.npairs + c.bad_pairs;
    n_bad += c.bad_pairs;

    DevBuf x((size_t)T * stride * esz + 16);
    if (c.dt == LF_F32) gen_logits<float><<<512, 256>>>((float *)x.p, T, V, stride, mix64(rs), 30.0f);
    else if (c.dt == LF_BF16) gen_logits<__nv_bfloat16><<<512, 256>>>((__nv_bfloat16 *)x.p, T, V, stride, mix64(rs), 30.0f);
    else gen_logits<__half><<<512, 256>>>((__half *)x.p, T, V, stride, mix64(rs), 30.0f);
    CK(cudaGetLastError());
    if (c.plant_fmin) {
        /* entries at the dtype's lowest finite value, as masking with torch.finfo(dtype).min
         * leaves them (bf16 and fp32: x log2(e) overflows to -inf; fp16's -65504 does not), never
         * on a token's label: labelled tokens, by t % 4, every entry but the label's and V/2
         * (1), every 11th and the last 40% (2: whole pieces and a thread's share, the tail), the
         * first 8 and V/2 (3: the head); unlabelled tokens with t % 4 == 0 all of them. The
         * reference's terms exp(-3.4e38 - m) are 0, as the kernels' must be. */
        const float fmin = c.dt == LF_F32 ? -3.402823466e38f : c.dt == LF_BF16 ? -3.3895314e38f : -65504.0f;
        std::vector<char> h((size_t)V * esz);
        for (int64_t t = 0; t < T; ++t) {
            const int64_t y = ref_lab_clean[t];
            const bool lab = y >= 0 && y < V;
            const int pat = (int)(t % 4);
            if (lab ? pat == 0 : pat != 0) continue;
            CK(cudaMemcpy(h.data(), (char *)x.p + (size_t)t * stride * esz, (size_t)V * esz, cudaMemcpyDeviceToHost));
            for (int64_t j = 0; j < V; ++j) {
                const bool m = !lab ? true
                             : j == y ? false
                             : pat == 1 ? j != V / 2
                             : pat == 2 ? (j % 11 == 4 || j >= V - (4 * V) / 10)
                                        : (j < 8 || j == V / 2);
                if (!m) continue;
                if (c.dt == LF_F32) memcpy(h.data() + 4 * j, &fmin, 4);
                else {
                    const uint16_t b = c.dt == LF_BF16 ? lf_f32_to_bf16(fmin) : lf_f32_to_f16(fmin);
                    memcpy(h.data() + 2 * j, &b, 2);
                }
            }
            CK(cudaMemcpy((char *)x.p + (size_t)t * stride * esz, h.data(), (size_t)V * esz, cudaMemcpyHostToDevice));
        }
    }
    std::vector<float> xf((size_t)T * V);
    /* the logits as launched (kept, up to 1 GiB, to check what the launch leaves of them) */
    const bool keep_x = (size_t)T * stride * esz <= ((size_t)1 << 30);
    std::vector<char> x_before;
    {
        std::vector<char> h((size_t)T * stride * esz);
        CK(cudaMemcpy(h.data(), x.p, h.size(), cudaMemcpyDeviceToHost));
        for (int64_t t = 0; t < T; ++t)
            for (int64_t j = 0; j < V; ++j) xf[(size_t)t * V + j] = elem_to_f32(h.data() + (size_t)t * stride * esz, j, c.dt);
        if (keep_x) x_before.swap(h);
    }
    std::vector<float> refl(nseq);
    for (int64_t k = 0; k < nseq; ++k) refl[k] = (float)(-(double)(cu[k + 1] - cu[k]) * (1.0 + rng_u(&rs)));
    lf_dpo_opts o = lf_dpo_opts_default();
    o.kind = c.kind;
    o.beta = c.beta;
    o.label_smoothing = c.eps;
    o.length_normalize = c.norm;
    o.nll_weight = c.nll;
    const float dl = c.dloss ? -1.75f : 1.0f, divh = 3.5f;
    double want = 0.0;
    const int M = LF_DPO_METRICS;
    std::vector<double> seq(3 * nseq), pm(M * c.npairs), rg((size_t)T * V);
    int64_t ref_bad = 0;
    EXPECT(lf_ref_dpo_packed(T, V, xf.data(), V, ref_lab_clean.data(), cu.data(), nseq, valid_pairs.data(), c.npairs,
                             c.use_ref ? refl.data() : NULL, &o, c.dev_div ? (double)divh : -1.0, &want, seq.data(), pm.data(),
                             rg.data(), &ref_bad) == LF_OK,
           "reference failed");
    /* the reference counts the planted bad labels (it takes them as ignored); input ids give none */
    EXPECT(ref_bad == (c.ids ? 0 : n_bad_labels), "the reference counted %lld bad labels, want %lld", (long long)ref_bad,
           (long long)(c.ids ? 0 : n_bad_labels));
    if (c.bad_cu) want = 0.0;

    std::vector<int32_t> cu_dev = cu;
    if (c.bad_cu) {
        if (c.bad_cu == 1) cu_dev[3] = cu_dev[2] - 1;
        else if (c.bad_cu == 2) cu_dev[0] = 1;
        else cu_dev[nseq] = (int32_t)T + 1;
        n_bad = 1; /* one error for the whole launch; nothing else is looked at */
    }
    const std::vector<int64_t> &lab_dev = c.ids ? ids : lab;
    DevBuf yd(8 * T + 8), cud(4 * (nseq + 1)), pd(8 * P + 8), refd(4 * nseq), loss(4), seqd(4 * nseq), pmd(4 * M * P + 16), err(4),
        divd(4), dld(4), ws(dpo_workspace_bytes(T, nseq, P)), scd(4 * T + 4);
    if (c.lab64) CK(cudaMemcpy(yd.p, lab_dev.data(), 8 * T, cudaMemcpyHostToDevice));
    else {
        std::vector<int32_t> y32(lab_dev.begin(), lab_dev.end());
        CK(cudaMemcpy(yd.p, y32.data(), 4 * T, cudaMemcpyHostToDevice));
    }
    CK(cudaMemcpy(cud.p, cu_dev.data(), 4 * (nseq + 1), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(pd.p, pairs.data(), 8 * P, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(refd.p, refl.data(), 4 * nseq, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(divd.p, &divh, 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dld.p, &dl, 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(err.p, 0, 4));
    CK(cudaMemset(ws.p, 0x5a, ws.bytes));
    fill_poison(loss.p, 1, LF_F32);
    fill_poison(seqd.p, nseq, LF_F32);
    fill_poison(pmd.p, M * P, LF_F32);
    fill_poison(scd.p, T, LF_F32);
    const int64_t gs = c.grad == 1 ? V + c.gpad : stride;
    DevBuf g(c.grad == 1 ? (size_t)T * gs * esz + 16 : 16);
    if (c.grad == 1) {
        if (esz == 4) fill_bits<uint32_t><<<512, 256>>>((uint32_t *)g.p, T * gs, PAD32);
        else fill_bits<uint16_t><<<512, 256>>>((uint16_t *)g.p, T * gs, PAD16);
        CK(cudaGetLastError());
        for (int64_t t = 0; t < T; ++t) fill_poison((char *)g.p + (size_t)t * gs * esz, V, c.dt);
    }
    dpo_args a = dpo_args_fill(x.p, c.dt, T, V, stride, yd.p, c.lab64, cud.p, nseq, pd.p, P, (float *)loss.p, ws);
    a.ids_shift = c.ids;
    a.ref_logps = c.use_ref ? (const float *)refd.p : NULL;
    a.opts = o;
    a.divisor = c.dev_div ? (const float *)divd.p : NULL;
    a.dloss = c.dloss ? (const float *)dld.p : NULL;
    a.grad = c.grad == 0 ? NULL : c.grad == 1 ? g.p : x.p;
    a.grad_stride = gs;
    a.tok_scale = c.deferred ? (float *)scd.p : NULL;
    a.separate_launches = c.separate;
    a.coop_refuse_test = c.coop_refuse;
    int coop_ran = -1, coop_dev = 0;
    a.tail_cooperative = &coop_ran;
    CK(cudaDeviceGetAttribute(&coop_dev, cudaDevAttrCooperativeLaunch, 0));
    dpo_launch_sync(a, seqd, pmd, err); /* (it checks that a refused launch left no error behind) */
    EXPECT(coop_ran == (coop_dev && !c.separate && !c.coop_refuse ? 1 : 0), "tail_cooperative %d (separate %d, refusal test %d)",
           coop_ran, (int)c.separate, (int)c.coop_refuse);
    if (keep_x) { /* the logits untouched, but for their V columns when the gradient is written in place */
        std::vector<char> xa(x_before.size());
        CK(cudaMemcpy(xa.data(), x.p, xa.size(), cudaMemcpyDeviceToHost));
        int64_t changed = 0;
        for (int64_t t = 0; t < T; ++t)
            for (int64_t j = c.grad == 2 ? V : 0; j < stride; ++j) {
                const size_t o = ((size_t)t * stride + j) * esz;
                changed += memcmp(xa.data() + o, x_before.data() + o, esz) != 0;
            }
        EXPECT(changed == 0, "%lld logit elements changed (%s)", (long long)changed,
               c.grad == 2 ? "padding columns, gradient in place" : "the gradient not in place");
    }
    cudaError_t ce;
    float lh;
    unsigned eh;
    std::vector<float> sh(nseq), ph(M * P);
    CK(cudaMemcpy(&lh, loss.p, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(&eh, err.p, 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(sh.data(), seqd.p, 4 * nseq, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ph.data(), pmd.p, 4 * M * P, cudaMemcpyDeviceToHost));
    EXPECT((int64_t)eh == n_bad, "n_errors %u want %lld", eh, (long long)n_bad);
    const double wantl = want * (c.bad_cu ? 0.0 : 1.0);
    EXPECT(close(lh, wantl, 1e-4 * (1.0 + fabs(wantl))), "loss %.9g want %.9g", lh, wantl);
    if (!c.bad_cu) {
        for (int64_t k = 0; k < nseq; ++k)
            EXPECT(close(sh[k], seq[k], 1e-5 * (1.0 + fabs(seq[k])) + 0x1p-20 * seq[nseq + k]), "seq %lld logp %.9g want %.9g",
                   (long long)k, sh[k], seq[k]);
        for (int64_t p = 0; p < c.npairs; ++p) {
            const float *hp = ph.data() + M * p;
            const double *wp = pm.data() + M * p;
            EXPECT(close(hp[0], wp[0], 1e-4 * (1.0 + fabs(wp[0]))), "pair %lld loss %.9g want %.9g", (long long)p, hp[0], wp[0]);
            for (int q = 1; q < 3; ++q)
                EXPECT(close(hp[q], wp[q], 1e-5 * (1.0 + fabs(wp[q])) + 1e-4 * c.beta), "pair %lld reward %d %.9g want %.9g", (long long)p, q,
                       hp[q], wp[q]);
            /* the margin: beta times the margin the kernel forms in double from its float sums, so
             * the two rewards' tolerances */
            EXPECT(close(hp[4], wp[4], 1e-5 * (2.0 + fabs(wp[1]) + fabs(wp[2])) + 2e-4 * c.beta), "pair %lld margin %.9g want %.9g",
                   (long long)p, hp[4], wp[4]);
            if (fabs(wp[4]) > 1e-3) EXPECT(hp[3] == (float)wp[3], "pair %lld accuracy %g want %g", (long long)p, hp[3], wp[3]);
        }
        for (int64_t p = c.npairs; p < P; ++p)
            for (int q = 0; q < M; ++q) EXPECT(ph[M * p + q] == 0.0f, "bad pair %lld metric %d %.9g, not 0", (long long)p, q, ph[M * p + q]);
    } else { /* a bad cu_seqlens: every per-sequence and per-pair output written, 0 */
        for (int64_t k = 0; k < nseq; ++k) EXPECT(sh[k] == 0.0f, "bad cu_seqlens: seq %lld logp %.9g, not 0", (long long)k, sh[k]);
        for (int64_t q = 0; q < M * P; ++q) EXPECT(ph[q] == 0.0f, "bad cu_seqlens: pair metric %lld %.9g, not 0", (long long)q, ph[q]);
    }
    if (c.grad) {
        const double unit = c.dt == LF_BF16 ? 0x1p-8 : c.dt == LF_F16 ? 0x1p-11 : 0.0;
        std::vector<char> gh((size_t)T * gs * esz);
        CK(cudaMemcpy(gh.data(), c.grad == 1 ? g.p : x.p, gh.size(), cudaMemcpyDeviceToHost));
        /* Each sequence coefficient's tolerance: 2e-5 relative, plus, for IPO, whose derivative
         * 2 (h - 1 / (2 beta)) is itself a cancelling difference, its error from the margin's
         * inputs: the device sums float log-probabilities (each ~2^-24 |lp_t| off, and
         * sum |lp_t| = |lp_k| since every lp_t <= 0), so 2 * 2^-22 (|lp_c| / n_c + |lp_r| / n_r
         * with length normalisation) per pair, times the pair's scale 1/D and dl. */
        std::vector<double> coef_extra(nseq > 0 ? nseq : 1, 0.0);
        if (c.kind == LF_DPO_IPO) {
            const double inv = c.dev_div ? 1.0 / divh : (c.npairs ? 1.0 / (double)c.npairs : 0.0);
            auto per = [&](int64_t k) { return c.norm ? (seq[nseq + k] > 0.0 ? 1.0 / seq[nseq + k] : 0.0) : 1.0; };
            for (int64_t p = 0; p < c.npairs; ++p) {
                const int32_t pc = valid_pairs[2 * p], pr = valid_pairs[2 * p + 1];
                const double dh = 2.0 * 0x1p-22 * (fabs(seq[pc]) * per(pc) + fabs(seq[pr]) * per(pr));
                coef_extra[pc] += 2.0 * dh * inv * per(pc) * fabs(dl);
                coef_extra[pr] += 2.0 * dh * inv * per(pr) * fabs(dl);
            }
        }
        /* white box: the per-sequence coefficients d loss / d logp_k against the reference's */
        std::vector<float> coefh(nseq > 0 ? nseq : 1);
        const dpo_ws wsd = dpo_ws_layout(ws.p, T, nseq, P);
        if (!c.bad_cu && nseq > 0) {
            CK(cudaMemcpy(coefh.data(), wsd.seq_coef, 4 * nseq, cudaMemcpyDeviceToHost));
            for (int64_t k = 0; k < nseq; ++k) {
                const double ck = seq[2 * nseq + k] * dl;
                const double tol = 2e-5 * fabs(ck) + coef_extra[k] + 1e-37;
                EXPECT(close(coefh[k], ck, tol), "seq %lld coefficient %.9g want %.9g (tol %.3g)", (long long)k, coefh[k], ck, tol);
            }
        }
        /* the deferred scale: s_t = -c_k exactly (the device's own c_k), 0 for unlabelled tokens
         * and a bad cu_seqlens; an unlabelled token's G_t row all zeros */
        std::vector<float> sch(T > 0 ? T : 1, 1.0f);
        auto labelled = [&](int64_t t) { return !c.bad_cu && ref_lab_clean[t] >= 0 && ref_lab_clean[t] < V; };
        if (c.deferred) {
            CK(cudaMemcpy(sch.data(), scd.p, 4 * T, cudaMemcpyDeviceToHost));
            int sbad = 0, zbad = 0;
            for (int64_t t = 0; t < T; ++t) {
                const float want_s = labelled(t) ? -coefh[lf_seq_find(cu.data(), nseq, t)] : 0.0f;
                sbad += memcmp(&sch[t], &want_s, 4) != 0 && !(want_s == 0.0f && sch[t] == 0.0f);
                if (!labelled(t))
                    for (int64_t j = 0; j < V; ++j) zbad += elem_to_f32(gh.data() + (size_t)t * gs * esz, j, c.dt) != 0.0f;
            }
            EXPECT(sbad == 0, "%d tok_scale entries differ from -c_k (0 unlabelled)", sbad);
            EXPECT(zbad == 0, "%d entries of unlabelled tokens' G rows not 0", zbad);
        }
        int bad = 0;
        int64_t wt = -1, wj = -1;
        double wg = 0.0, ww = 0.0, wtol = 0.0;
        for (int64_t t = 0; t < T; ++t) {
            const int64_t k = lf_seq_find(cu.data(), nseq, t);
            const double ck = c.bad_cu ? 0.0 : seq[2 * nseq + k] * dl;
            for (int64_t j = 0; j < V; ++j) {
                const double gj = (double)sch[t] * elem_to_f32(gh.data() + (size_t)t * gs * esz, j, c.dt); /* s_t G_t deferred */
                const double w = c.bad_cu ? 0.0 : rg[(size_t)t * V + j] * dl;
                const double pj = fabs(w) / (fabs(ck) + 1e-300);
                const double ctol = c.bad_cu ? 0.0 : coef_extra[k]; /* the coefficient's, carried by every entry */
                /* fp16's subnormal spacing 2^-24 on the written value: on w itself, or on G_t (then times |s_t|) */
                const double sub = c.dt == LF_F16 ? 0x1p-25 * (c.deferred ? fabs((double)sch[t]) : 1.0) : 0.0;
                const double tol = unit * fabs(w) + (2e-5 * fabs(ck) + ctol) * (pj + (ref_lab_clean[t] == j ? 1.0 : 0.0)) + sub + 1e-37;
                if (!close(gj, w, tol)) {
                    if (wt < 0) {
                        wt = t;
                        wj = j;
                        wg = gj;
                        ww = w;
                        wtol = tol;
                    }
                    ++bad;
                }
            }
            if (c.grad == 1)
                for (int64_t j = V; j < gs; ++j) {
                    const char *e = gh.data() + ((size_t)t * gs + j) * esz;
                    bad += esz == 4 ? *(const uint32_t *)e != PAD32 : *(const uint16_t *)e != PAD16;
                }
        }
        EXPECT(bad == 0, "%d gradient entries off; first t=%lld (seq %lld, label %lld) j=%lld: %.9g want %.9g (tol %.3g)", bad,
               (long long)wt, (long long)(wt >= 0 ? lf_seq_find(cu.data(), nseq, wt) : -1), (long long)(wt >= 0 ? ref_lab_clean[wt] : 0),
               (long long)wj, wg, ww, wtol);
        if (c.determinism && c.grad == 1) {
            float l2;
            EXPECT(dpo_launch(&a, 0, &ce) == LF_OK, "relaunch");
            CK(cudaDeviceSynchronize());
            std::vector<char> g2(gh.size());
            CK(cudaMemcpy(g2.data(), g.p, g2.size(), cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&l2, loss.p, 4, cudaMemcpyDeviceToHost));
            EXPECT(memcmp(g2.data(), gh.data(), gh.size()) == 0, "gradient not bit-identical across runs");
            EXPECT(memcmp(&l2, &lh, 4) == 0, "loss not bit-identical across runs");
            if (c.deferred) {
                std::vector<float> s2(T > 0 ? T : 1);
                CK(cudaMemcpy(s2.data(), scd.p, 4 * T, cudaMemcpyDeviceToHost));
                EXPECT(memcmp(s2.data(), sch.data(), 4 * T) == 0, "tok_scale not bit-identical across runs");
            }
            /* the tail the other way (one cooperative launch / six kernels; after a refused
             * cooperative launch, the cooperative launch): the same bits everywhere, the error
             * count included */
            const int other = c.coop_refuse ? 0 : !c.separate;
            a.separate_launches = other;
            a.coop_refuse_test = 0;
            /* every output poisoned again (the gradient rows, the loss, per-sequence and per-pair
             * outputs, the deferred scales), the error count zeroed */
            auto poison_outputs = [&]() {
                for (int64_t t = 0; t < T; ++t) fill_poison((char *)g.p + (size_t)t * gs * esz, V, c.dt);
                fill_poison(loss.p, 1, LF_F32);
                fill_poison(seqd.p, nseq, LF_F32);
                fill_poison(pmd.p, M * P, LF_F32);
                fill_poison(scd.p, T, LF_F32);
                CK(cudaMemset(err.p, 0, 4));
            };
            /* every output read back: the first run's bits, the error count included */
            std::vector<float> s3(nseq), p3(M * P), t3(T > 0 ? T : 1);
            auto expect_first_bits = [&](const char *what) {
                unsigned e3;
                CK(cudaMemcpy(g2.data(), g.p, g2.size(), cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(&l2, loss.p, 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(s3.data(), seqd.p, 4 * nseq, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(p3.data(), pmd.p, 4 * M * P, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(&e3, err.p, 4, cudaMemcpyDeviceToHost));
                EXPECT(memcmp(g2.data(), gh.data(), gh.size()) == 0, "%s: gradient differs", what);
                EXPECT(memcmp(&l2, &lh, 4) == 0, "%s: loss differs", what);
                EXPECT(memcmp(s3.data(), sh.data(), 4 * nseq) == 0, "%s: sequence log-probabilities differ", what);
                EXPECT(memcmp(p3.data(), ph.data(), 4 * M * P) == 0, "%s: pair metrics differ", what);
                EXPECT(e3 == eh, "%s: n_errors %u, %u the first time", what, e3, eh);
                if (c.deferred) {
                    CK(cudaMemcpy(t3.data(), scd.p, 4 * T, cudaMemcpyDeviceToHost));
                    EXPECT(memcmp(t3.data(), sch.data(), 4 * T) == 0, "%s: tok_scale differs", what);
                }
            };
            char what[64];
            poison_outputs();
            CK(cudaMemset(ws.p, 0x5a, ws.bytes)); /* nothing left over from the other form */
            coop_ran = -1;
            dpo_launch_sync(a, seqd, pmd, err);
            snprintf(what, sizeof what, "separate_launches = %d", other);
            EXPECT(coop_ran == (coop_dev && !other ? 1 : 0), "%s: tail_cooperative %d", what, coop_ran);
            expect_first_bits(what);
            /* CUDA graphs (the header says capturable): that launch captured on a stream, then
             * replayed twice onto poisoned outputs and a workspace left as the last run left it:
             * the same bits each time */
            cudaStream_t cs;
            CK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
            cudaGraph_t gr = nullptr;
            cudaGraphExec_t ge = nullptr;
            CK(cudaStreamBeginCapture(cs, cudaStreamCaptureModeThreadLocal));
            const lf_status cst = dpo_launch(&a, cs, &ce);
            const cudaError_t cend = cudaStreamEndCapture(cs, &gr);
            EXPECT(cst == LF_OK && cend == cudaSuccess, "captured dpo_launch: %s, end of capture: %s (separate_launches = %d)",
                   lf_status_str(cst), cudaGetErrorString(cend), other);
            if (cst == LF_OK && cend == cudaSuccess) {
                CK(cudaGraphInstantiate(&ge, gr, 0));
                for (int rep = 0; rep < 2; ++rep) {
                    poison_outputs();
                    CK(cudaDeviceSynchronize()); /* (cs does not wait for the legacy stream) */
                    CK(cudaGraphLaunch(ge, cs));
                    CK(cudaStreamSynchronize(cs));
                    snprintf(what, sizeof what, "graph replay %d (separate_launches = %d)", rep, other);
                    expect_first_bits(what);
                }
                CK(cudaGraphExecDestroy(ge));
            }
            if (gr) CK(cudaGraphDestroy(gr));
            CK(cudaStreamDestroy(cs));
        }
    }
    printf("%-4s %s\n", g_fail == fails ? "ok" : "FAIL", g_case);
}

/* argument errors: the deferred scale without a gradient to scale; a workspace one byte short,
 * for either gradient form */
static void dpo_arg_checks()
{
    snprintf(g_case, sizeof g_case, "argument checks");
    const int fails = g_fail;
    const int64_t T = 6, V = 100, nseq = 2, P = 1;
    const int32_t cu[3] = {0, 3, 6}, pairs[2] = {0, 1};
    DevBuf x(2 * T * V), y(8 * T), cud(12), pd(8), loss(4), sc(4 * T), ws(dpo_workspace_bytes(T, nseq, P));
    CK(cudaMemset(x.p, 0, x.bytes));
    CK(cudaMemset(y.p, 0, y.bytes));
    CK(cudaMemcpy(cud.p, cu, 12, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(pd.p, pairs, 8, cudaMemcpyHostToDevice));
    dpo_args a = dpo_args_fill(x.p, LF_BF16, T, V, V, y.p, true, cud.p, nseq, pd.p, P, (float *)loss.p, ws);
    a.grad = x.p;
    a.grad_stride = V;
    a.tok_scale = (float *)sc.p;
    cudaError_t ce;
    EXPECT(dpo_launch(&a, 0, &ce) == LF_OK, "deferred launch: %s", cudaGetErrorString(ce));
    CK(cudaDeviceSynchronize());
    dpo_args b = a;
    b.grad = NULL;
    EXPECT(dpo_launch(&b, 0, &ce) == LF_ERR_ARG, "tok_scale without grad accepted");
    b = a;
    b.workspace_bytes = ws.bytes - 1;
    EXPECT(dpo_launch(&b, 0, &ce) == LF_ERR_SIZE, "a short workspace accepted for the deferred scale");
    b.tok_scale = NULL; /* in place */
    EXPECT(dpo_launch(&b, 0, &ce) == LF_ERR_SIZE, "a short workspace accepted in place");
    b.workspace_bytes = ws.bytes;
    EXPECT(dpo_launch(&b, 0, &ce) == LF_OK, "in-place launch: %s", cudaGetErrorString(ce));
    CK(cudaDeviceSynchronize());
    printf("%-4s %s\n", g_fail == fails ? "ok" : "FAIL", g_case);
}

/* No tokens (T = 0): two empty sequences in one pair, with reference log-probabilities, in place
 * and deferred. Every sequence log-probability is 0, so the loss is the reference's (-log
 * sigmoid(-beta (ref_c - ref_r)) for sigmoid), the pair's metrics its rewards; nothing is read
 * or written per token, and no error is counted. */
static void dpo_empty_checks()
{
    const char *kn[4] = {"sigmoid", "hinge", "ipo", "simpo"};
    const int32_t cu[3] = {0, 0, 0}, pairs[2] = {0, 1};
    const float refl[2] = {-3.25f, -1.5f};
    for (int kind = 0; kind < 4; ++kind)
        for (int deferred = 0; deferred <= 1; ++deferred) {
            snprintf(g_case, sizeof g_case, "%sno tokens %s", deferred ? "deferred scale, " : "", kn[kind]);
            const int fails = g_fail;
            const int64_t V = 1000, nseq = 2, P = 1;
            lf_dpo_opts o = lf_dpo_opts_default();
            o.kind = (lf_dpo_kind)kind;
            if (kind == LF_DPO_SIMPO) o.beta = 2.0f;
            double want = 0.0, seq[6] = {0.0}, pm[LF_DPO_METRICS] = {0.0};
            int64_t nb = 0;
            EXPECT(lf_ref_dpo_packed(0, V, NULL, V, NULL, cu, nseq, pairs, P, refl, &o, -1.0, &want, seq, pm, NULL, &nb) == LF_OK,
                   "reference failed");
            DevBuf x(16), y(16), cud(12), pd(8), refd(8), loss(4), seqd(8), pmd(4 * LF_DPO_METRICS), err(4), sc(16),
                ws(dpo_workspace_bytes(0, nseq, P));
            CK(cudaMemcpy(cud.p, cu, 12, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(pd.p, pairs, 8, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(refd.p, refl, 8, cudaMemcpyHostToDevice));
            CK(cudaMemset(err.p, 0, 4));
            CK(cudaMemset(ws.p, 0x5a, ws.bytes));
            fill_poison(loss.p, 1, LF_F32);
            fill_poison(seqd.p, nseq, LF_F32);
            fill_poison(pmd.p, LF_DPO_METRICS * P, LF_F32);
            dpo_args a = dpo_args_fill(x.p, LF_BF16, 0, V, V, y.p, true, cud.p, nseq, pd.p, P, (float *)loss.p, ws);
            a.opts = o;
            a.ref_logps = (const float *)refd.p;
            a.grad = x.p;
            a.grad_stride = V;
            a.tok_scale = deferred ? (float *)sc.p : NULL;
            dpo_launch_sync(a, seqd, pmd, err);
            float lh, sh[2], ph[LF_DPO_METRICS];
            unsigned eh;
            CK(cudaMemcpy(&lh, loss.p, 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(sh, seqd.p, 8, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(ph, pmd.p, sizeof ph, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&eh, err.p, 4, cudaMemcpyDeviceToHost));
            EXPECT(eh == 0, "n_errors %u", eh);
            EXPECT(close(lh, want, 1e-5 * (1.0 + fabs(want))), "loss %.9g want %.9g", lh, want);
            EXPECT(sh[0] == 0.0f && sh[1] == 0.0f, "sequence log-probabilities %.9g %.9g, not 0", sh[0], sh[1]);
            for (int q = 0; q < LF_DPO_METRICS; ++q)
                if (q != 3) EXPECT(close(ph[q], pm[q], 1e-5 * (1.0 + fabs(pm[q]))), "pair metric %d %.9g want %.9g", q, ph[q], pm[q]);
            EXPECT(ph[3] == (float)pm[3], "pair accuracy %.9g want %.9g", ph[3], pm[3]);
            printf("%-4s %s\n", g_fail == fails ? "ok" : "FAIL", g_case);
        }
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--small")) g_small = 1;
        else if (!strcmp(argv[i], "--seed") && i + 1 < argc) g_seed = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc) g_only = argv[++i];
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("test_dpo_gpu: no CUDA device, skipped\n");
        return 77;
    }
    if (!g_seed) g_seed = (uint64_t)time(NULL);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("test_dpo_gpu on %s (sm_%d%d), seed %llu%s\n", prop.name, prop.major, prop.minor, (unsigned long long)g_seed,
           g_small ? ", small sizes" : "");
    const lf_dtype dts[3] = {LF_BF16, LF_F16, LF_F32};
    const int64_t Vs[3] = {7, 1000, 50257};
    for (int kind = 0; kind < 4; ++kind)
        for (int vi = 0; vi < (g_small ? 2 : 3); ++vi) {
            DCase b;
            b.kind = (lf_dpo_kind)kind;
            b.V = Vs[vi];
            b.dt = dts[(kind + vi) % 3];
            if (kind == LF_DPO_SIMPO) b.beta = 2.0f;
            DCase c;
            c = b; c.name = "plain"; run_dcase(c);
            c = b; c.name = "in place, strided +3"; c.grad = 2; c.pad = 3; run_dcase(c);
            c = b; c.name = "grad stride +5, no ref, nll 0.5"; c.gpad = 5; c.use_ref = false; c.nll = 0.5f; run_dcase(c);
            c = b; c.name = "length-normalised, smoothing, device divisor, dloss"; c.norm = true; c.eps = kind == 0 ? 0.1f : 0.0f; c.dev_div = true; c.dloss = true; run_dcase(c);
            c = b; c.name = "input ids (shift on the device), int32"; c.ids = true; c.lab64 = false; run_dcase(c);
            c = b; c.name = "bad labels and pairs"; c.bad_labels = 6; c.bad_pairs = 3; run_dcase(c);
            c = b; c.name = "bad cu_seqlens"; c.bad_cu = 1; run_dcase(c);
            c = b; c.name = "bad cu_seqlens, cu[0] = 1"; c.bad_cu = 2; run_dcase(c);
            c = b; c.name = "bad cu_seqlens, cu[n] = T + 1"; c.bad_cu = 3; run_dcase(c);
            /* the tail as six kernels: their own error counting (the determinism cases compare
             * the two forms bit for bit) */
            c = b; c.name = "bad labels, pairs, separate launches"; c.bad_labels = 6; c.bad_pairs = 3; c.separate = true; run_dcase(c);
            c = b; c.deferred = true; c.name = "bad cu_seqlens, cu[n] = T + 1, separate launches"; c.bad_cu = 3; c.separate = true; run_dcase(c);
            c = b; c.name = "forward only"; c.grad = 0; run_dcase(c);
            c = b; c.name = "determinism"; c.determinism = true; c.npairs = 12; run_dcase(c);
            /* the deferred scale (one read of the logits: cross_entropy.cu's fused kernel) */
            c = b; c.deferred = true; c.name = "plain"; run_dcase(c);
            c = b; c.deferred = true; c.name = "in place, strided +3, input ids, nll 0.5, no ref"; c.grad = 2; c.pad = 3; c.ids = true; c.lab64 = false; c.nll = 0.5f; c.use_ref = false; run_dcase(c);
            c = b; c.deferred = true; c.name = "length-normalised, device divisor, dloss, bad labels and pairs"; c.norm = true; c.dev_div = true; c.dloss = true; c.bad_labels = 6; c.bad_pairs = 3; run_dcase(c);
            c = b; c.deferred = true; c.name = "bad cu_seqlens, cu[0] = 1"; c.bad_cu = 2; run_dcase(c);
            c = b; c.deferred = true; c.name = "determinism"; c.determinism = true; c.npairs = 12; run_dcase(c);
            c = b; c.deferred = true; c.name = "determinism, separate launches"; c.determinism = true; c.npairs = 12; c.separate = true; c.bad_pairs = 2; run_dcase(c);
            /* a cooperative launch the driver refuses (as where a process has part of the SMs):
             * the six kernels by themselves, the same bits as the cooperative launch. Not under
             * --small: compute-sanitizer reports the refusal as an API error (the six kernels
             * are sanitized in the separate-launch cases) */
            if (!g_small) {
                c = b; c.name = "determinism, cooperative launch refused"; c.determinism = true; c.npairs = 12; c.coop_refuse = true; c.bad_labels = 3; run_dcase(c);
                c = b; c.deferred = true; c.name = "cooperative launch refused, bad cu_seqlens"; c.bad_cu = 1; c.coop_refuse = true; run_dcase(c);
            }
            /* masks at finfo.min: the in-place path's own online softmax (its row pass) and
             * cross_entropy.cu's fused kernel (the deferred pass; the in-place gradient pass) */
            c = b; c.name = "finfo.min entries, in place"; c.plant_fmin = true; c.grad = 2; run_dcase(c);
            c = b; c.deferred = true; c.name = "finfo.min entries, input ids"; c.plant_fmin = true; c.ids = true; run_dcase(c);
        }
    /* tokens x V > 2^31: the packing of issue 4's report (16K tokens at V = 152K made a 12.25 GiB
     * fp32 logits tensor): 12 sequences, 10 of 1500-1599 tokens (with the empty and the one-token
     * sequence), bf16, in place; 4.7 GB on the device, ~40 GB of host memory for the reference
     * (skipped where the host has less) */
    if (!g_small) {
        DCase c;
        c.name = "T*V > 2^31, in place";
        c.V = 151936;
        c.dt = LF_BF16;
        c.grad = 2;
        c.len_min = 1500;
        c.len_span = 100;
        c.big = true;
        /* the host's share: the logits as float and bf16, the reference gradient in double and
         * the device's copy, 16 B per element of at most 16000 x V, with room to spare */
        const double need = 1.25 * 16.0 * 16000.0 * (double)c.V, have = host_memory_bytes();
        if (have > 0.0 && have < need)
            printf("skip %s: its host reference needs ~%.0f GB, this host has %.0f GB\n", c.name, need / 1e9, have / 1e9);
        else
            run_dcase(c);
    }
    if (!g_only) {
        dpo_arg_checks();
        dpo_empty_checks();
    }
    printf("test_dpo_gpu: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
