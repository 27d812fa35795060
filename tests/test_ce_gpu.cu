/* tests/test_ce_gpu.cu — GPU tests of examples/cross_entropy.cu against the double-precision
 * host reference lf_ref_ce_row (lossfuse.h).
 *
 *   test_ce_gpu            full suite (sizes V in {1 .. 262144}, N in {1, 3, 4096}, every dtype
 *                          and option, N*V > 2^31, determinism, graph replay, bad input)
 *   test_ce_gpu --small    small sizes only, for compute-sanitizer (memcheck, racecheck)
 *   test_ce_gpu --seed S   reproduce a run (the seed is printed at start)
 * Exit: 0 all passed, 1 a check failed, 77 no CUDA device (meson counts it as skipped).
 *
 * Every launch writes into outputs poisoned with signalling-NaN bit patterns the kernel can never
 * produce, and every element of every output (and the untouched padding of strided rows) is
 * checked afterwards on the device. Logits are drawn fresh each run (seeded hash on the device):
 * a normal-like bulk, 1% strong candidates, 0.01% outliers of magnitude up to 40.
 *
 * Tolerances (justified where they are computed, in tol_*): fp32 arithmetic of the kernel
 * relative to the row's magnitudes (lse and max |z|), plus the bf16/fp16 rounding of the gradient.
 */
#define CE_NO_MAIN
#include <cstddef>
#include "examples/cross_entropy.cu"

#include "tests/gpu_test.cuh"

struct Case {
    const char *name = "";
    int64_t N = 1, V = 1, pad = 0;
    lf_dtype dt = LF_BF16;
    int lab64 = 1;
    float eps = 0, lam = 0, cap = 0, scale = 1;
    bool weights = false;
    lf_reduction red = LF_REDUCE_MEAN;
    int grad = 1;        /* 0 forward only, 1 separate buffer, 2 in place */
    int64_t gpad = 0;    /* separate buffer: grad stride = V + gpad */
    bool stats = false;  /* request logprob, lse, entropy, argmax, n_correct */
    int max_cluster = 0;
    bool dev_divisor = false;
    bool dloss = false;  /* per row (none): signed, some exactly 0; [1] (sum/mean): positive ... */
    bool dloss_neg = false; /* ... or negative */
    float grad_scale = 1.0f;
    double ignore_frac = 0.05, bad_frac = 0.0;
    int64_t ignore_index = -100; /* ce_args.ignore_index (the ignored rows' label) */
    bool plant_nonfinite = false; /* a NaN row and a +inf row */
    bool plant_masks = false;     /* rows with -inf entries, one with the label at -inf, one all -inf */
    bool plant_fmin = false;      /* rows at the dtype's lowest finite value (finfo.min masking) */
    bool plant_ties = false;      /* rows whose maximum appears several times (argmax: the first) */
    bool plant_big = false;       /* rows with a maximum of ~3e3-9e3 at the label (loss ~0 / 0.39) */
    float outlier = 40.0f;        /* 1e4: huge-value case */
    bool determinism = false;     /* run twice, compare bits */
    bool check_all = false;       /* check every row against the reference whatever the size */
    int schedule = CE_SCHED_AUTO; /* forced schedule (CE_SCHED_RESIDENT: sm_90 only) */
    int stages = 0;               /* resident: stages per CTA (0 automatic) */
    int static_rows = 0;          /* resident: 1 = a fixed share of rows per CTA (ce_args.static_rows) */
    int expect_dynamic = -1;      /* on sm_90, resident: the plan hands rows out dynamically (1) or not (0) */
    int expect_cluster = 0;       /* on sm_90: the plan must use clusters of this size ... */
    int expect_pieces = 0;        /* ... and this many pieces per slice (0: don't care) ... */
    int expect_schedule = 0;      /* ... and this schedule ... */
    int expect_stages = 0;        /* ... and this many stages */
};

static const char *sched_name(int s)
{
    return s == CE_SCHED_STREAM ? " [streamed]" : s == CE_SCHED_RESIDENT ? " [resident]" : s == CE_SCHED_WARP ? " [warp]" : "";
}

/* --only 'A|B|...': run only the cases whose name (with the schedule tag) contains one of the
 * texts (the special tests still run): e.g. the full-size cases of one schedule in a short call. */
static const char *g_only = NULL;

static bool only_match(const char *name)
{
    if (!g_only) return true;
    for (const char *t = g_only; *t;) {
        const char *bar = strchr(t, '|');
        const size_t n = bar ? (size_t)(bar - t) : strlen(t);
        if (n > 0) {
            for (const char *q = name; *q; ++q)
                if (!strncmp(q, t, n)) return true;
        }
        if (!bar) break;
        t = bar + 1;
    }
    return false;
}

static int g_cc_major = 0;

static void gen_device(void *x, const Case &c, int64_t stride, uint64_t seed)
{
    if (c.dt == LF_F32) gen_logits<float><<<2048, 256>>>((float *)x, c.N, c.V, stride, seed, c.outlier);
    else if (c.dt == LF_BF16) gen_logits<__nv_bfloat16><<<2048, 256>>>((__nv_bfloat16 *)x, c.N, c.V, stride, seed, c.outlier);
    else gen_logits<__half><<<2048, 256>>>((__half *)x, c.N, c.V, stride, seed, c.outlier);
    CK(cudaGetLastError());
}

/* Run one case: launch, then check everything. */
static void run_case(const Case &c)
{
    snprintf(g_case, sizeof g_case, "%s%s N=%lld V=%lld %s", c.name, sched_name(c.schedule), (long long)c.N, (long long)c.V,
             dt_name(c.dt));
    if (!only_match(g_case)) return;
    const int fails_before = g_fail;
    uint64_t rs = g_seed ^ mix64((uint64_t)c.N * 1315423911ull + (uint64_t)c.V * 2654435761ull + (uint64_t)c.dt);
    const uint64_t data_seed = mix64(rs + 7);
    const int64_t N = c.N, V = c.V, stride = V + c.pad;
    const int esz = lf_dtype_size(c.dt);
    const size_t nel = (size_t)N * (size_t)stride;

    DevBuf x(nel * esz);
    gen_device(x.p, c, stride, data_seed);

    /* labels and planted rows */
    std::vector<int64_t> y(N);
    int64_t n_bad = 0;
    for (int64_t i = 0; i < N; ++i) {
        const double r = rng_u(&rs);
        if (r < c.ignore_frac) y[i] = c.ignore_index;
        else if (r < c.ignore_frac + c.bad_frac) {
            const int64_t bads[3] = {V, -7, V + 1000}; /* V + 1 where V is the ignore index */
            y[i] = bads[i % 3] == c.ignore_index ? V + 1 : bads[i % 3];
            ++n_bad;
        } else y[i] = (int64_t)(rng_u(&rs) * V) % V;
    }
    std::set<int64_t> planted;
    if (c.plant_nonfinite && N >= 3) {
        put_elem(x.p, 1 * stride + (V - 1), NAN, c.dt);
        put_elem(x.p, 2 * stride + V / 2, INFINITY, c.dt);
        for (int64_t i : {1, 2}) {
            if (y[i] < 0 || y[i] >= V) n_bad -= (y[i] != c.ignore_index);
            y[i] = i % V;
            planted.insert(i);
        }
    }
    if (c.plant_masks && N >= 3 && V >= 3) {
        /* row 0: every third entry -inf (label kept finite); row N-1: label entry -inf;
         * row N/2: every entry -inf (a valid label over an empty distribution: NaN loss) */
        std::vector<char> h((size_t)V * esz);
        for (int64_t i : {(int64_t)0, N - 1, N / 2}) {
            if (y[i] < 0 || y[i] >= V) n_bad -= (y[i] != c.ignore_index);
            y[i] = 1;
            planted.insert(i);
            CK(cudaMemcpy(h.data(), (char *)x.p + i * stride * esz, V * esz, cudaMemcpyDeviceToHost));
            for (int64_t j = 0; j < V; ++j) {
                const bool mask = i == N / 2 ? true : i == 0 ? (j % 3 == 0 && j != y[i]) : j == y[i];
                if (!mask) continue;
                if (c.dt == LF_F32) ((float *)h.data())[j] = -INFINITY;
                else ((uint16_t *)h.data())[j] = c.dt == LF_BF16 ? lf_f32_to_bf16(-INFINITY) : lf_f32_to_f16(-INFINITY);
            }
            CK(cudaMemcpy((char *)x.p + i * stride * esz, h.data(), V * esz, cudaMemcpyHostToDevice));
        }
    }
    if (c.plant_fmin && N >= 3 && V >= 16) {
        /* entries at the dtype's lowest finite value, as masking with torch.finfo(dtype).min
         * leaves them (bf16 and fp32: x log2(e) overflows to -inf; fp16's -65504 does not):
         * row 0 every 11th entry and the last 40% (whole slices and pieces of a thread all
         * masked, the tail edges too); row 1 every entry but the label's (1) and V/2; row 2 the
         * first 8 entries (the head edges) and V/2, its label at V/3. Reference: their terms are
         * exp(-3.4e38 - m) = 0, exactly as the kernel's.
         * Row 3, where the losses are per row (a NaN row would hide the others in a reduced
         * loss) and no ties are planted: EVERY entry at the floor, label V/2. In bf16 and fp32
         * the row has no mass (lf_massless): NaN loss, NaN gradient, lse -inf, whichever of its
         * entries are head / tail edges (pushed one by one) and which are body vectors (the
         * one-FFMA exponent); in fp16 it is an ordinary uniform row, loss log V. */
        const float fmin = c.dt == LF_F32 ? -3.402823466e38f : c.dt == LF_BF16 ? -3.3895314e38f : -65504.0f;
        std::vector<char> h((size_t)V * esz);
        std::vector<int64_t> frows = {0, 1, 2};
        if (N >= 4 && c.red == LF_REDUCE_NONE && !c.plant_ties) frows.push_back(3);
        for (int64_t i : frows) {
            if (y[i] < 0 || y[i] >= V) n_bad -= (y[i] != c.ignore_index);
            y[i] = i == 2 ? V / 3 : i == 3 ? V / 2 : 1;
            planted.insert(i);
            CK(cudaMemcpy(h.data(), (char *)x.p + i * stride * esz, V * esz, cudaMemcpyDeviceToHost));
            for (int64_t j = 0; j < V; ++j) {
                const bool m = i == 0 ? (j % 11 == 4 || j >= V - (4 * V) / 10) && j != 1
                             : i == 1 ? j != 1 && j != V / 2
                             : i == 2 ? j < 8 || j == V / 2
                                      : true;
                if (!m) continue;
                if (c.dt == LF_F32) ((float *)h.data())[j] = fmin;
                else ((uint16_t *)h.data())[j] = c.dt == LF_BF16 ? lf_f32_to_bf16(fmin) : lf_f32_to_f16(fmin);
            }
            CK(cudaMemcpy((char *)x.p + i * stride * esz, h.data(), V * esz, cudaMemcpyHostToDevice));
        }
    }
    if (c.plant_big && c.cap == 0.0f) {
        /* The loss's accuracy where the maximum is large: the last three rows (row N-1 only if N
         * < 3) get one entry M at a spread place j0 = 7919 i mod V, their label; in fp32 also M -
         * 0.75 at j0 + 1 (when V > 1), so that their loss is log(1 + e^-0.75) = 0.386, else ~0
         * (the rest is ~M below: exp(-M) = 0). M = 9344, 6016, 3104, exact in every dtype, are
         * values where M log2(e) rounds by 2.9e-4, 3.2e-4, -1.4e-4 in fp32: a kernel whose sum s
         * is relative to that rounded shift instead of M (lossfuse_cuda.cuh lf_shift_err) is
         * off by 2.0e-4, 2.2e-4, 9.8e-5 in its loss, above the tight tolerance (loss_tol) of
         * these rows (with class weights w_y times that, w_y >= 0.25 but for 1% at 0). Under a
         * logit scale the maximum is scale M; with outliers of 1e4 ("huge logits") the row's
         * maximum may be an outlier instead, and the row tests the loss at a large maximum away
         * from the label. A row planted before (masks, finfo.min) is left as it is. Not tested
         * here: the entropy's half of the correction (u), which a state of one shift does not
         * see (log s - u / s is the same), and whose tolerance is still relative to |lse|. */
        std::vector<char> h((size_t)V * esz);
        auto set = [&](int64_t j, float v) {
            if (c.dt == LF_F32) ((float *)h.data())[j] = v;
            else ((uint16_t *)h.data())[j] = c.dt == LF_BF16 ? lf_f32_to_bf16(v) : lf_f32_to_f16(v);
        };
        const float Ms[3] = {9344.0f, 6016.0f, 3104.0f};
        for (int k = 0; k < 3 && k < N; ++k) {
            const int64_t i = N - 1 - k, j0 = (7919 * i) % V;
            if (planted.count(i)) continue;
            if (y[i] < 0 || y[i] >= V) n_bad -= (y[i] != c.ignore_index);
            y[i] = j0;
            planted.insert(i);
            CK(cudaMemcpy(h.data(), (char *)x.p + i * stride * esz, V * esz, cudaMemcpyDeviceToHost));
            set(j0, Ms[k]);
            if (c.dt == LF_F32 && V > 1) set((j0 + 1) % V, Ms[k] - 0.75f);
            CK(cudaMemcpy((char *)x.p + i * stride * esz, h.data(), V * esz, cudaMemcpyHostToDevice));
        }
    }
    if (c.plant_ties && N >= 6) {
        /* row 3: a constant row (argmax 0); row 4: the maximum 50 at four spread places, in
         * different threads, warps and pieces; row 5: all -1 but -0 at V/3 and +0 at 2V/3 (they
         * tie: the first wins). The lazy argmax must find the first in every case. */
        std::vector<char> h((size_t)V * esz);
        auto set = [&](int64_t j, float v) {
            if (c.dt == LF_F32) ((float *)h.data())[j] = v;
            else ((uint16_t *)h.data())[j] = c.dt == LF_BF16 ? lf_f32_to_bf16(v) : lf_f32_to_f16(v);
        };
        for (int64_t i : {(int64_t)3, (int64_t)4, (int64_t)5}) {
            if (i == 5 && V < 3) continue;
            if (y[i] < 0 || y[i] >= V) n_bad -= (y[i] != c.ignore_index);
            y[i] = 1 % V;
            planted.insert(i);
            CK(cudaMemcpy(h.data(), (char *)x.p + i * stride * esz, V * esz, cudaMemcpyDeviceToHost));
            if (i == 3)
                for (int64_t j = 0; j < V; ++j) set(j, 0.5f);
            if (i == 4)
                for (int64_t j : {V - 1, V / 2, V / 3, std::min<int64_t>(17, V - 1)}) set(j, 50.0f);
            if (i == 5) {
                for (int64_t j = 0; j < V; ++j) set(j, -1.0f);
                set(V / 3, -0.0f);
                set(2 * V / 3, 0.0f);
            }
            CK(cudaMemcpy((char *)x.p + i * stride * esz, h.data(), V * esz, cudaMemcpyHostToDevice));
        }
    }
    DevBuf yd(N * 8 + 8);
    if (c.lab64) CK(cudaMemcpy(yd.p, y.data(), N * 8, cudaMemcpyHostToDevice));
    else {
        std::vector<int32_t> y32(y.begin(), y.end());
        CK(cudaMemcpy(yd.p, y32.data(), N * 4, cudaMemcpyHostToDevice));
    }

    /* class weights in [0.25, 2), 1% exactly zero */
    std::vector<float> w;
    DevBuf wd(c.weights ? V * 4 : 4);
    if (c.weights) {
        w.resize(V);
        for (int64_t j = 0; j < V; ++j) w[j] = rng_u(&rs) < 0.01 ? 0.0f : (float)(0.25 + 1.75 * rng_u(&rs));
        CK(cudaMemcpy(wd.p, w.data(), V * 4, cudaMemcpyHostToDevice));
    }

    /* rows to check against the reference */
    std::set<int64_t> rows;
    if (c.check_all || (double)N * V <= 4e6) {
        for (int64_t i = 0; i < N; ++i) rows.insert(i);
    } else {
        rows = planted;
        for (int64_t i : {(int64_t)0, (int64_t)1, N - 1, N / 2}) rows.insert(std::max<int64_t>(0, std::min(i, N - 1)));
        for (int k = 0; k < (g_small ? 4 : 20); ++k) rows.insert((int64_t)(rng_u(&rs) * N) % N);
    }
    std::vector<std::vector<float>> xrows;
    {
        std::vector<char> h((size_t)V * esz);
        for (int64_t i : rows) {
            CK(cudaMemcpy(h.data(), (char *)x.p + (size_t)i * stride * esz, V * esz, cudaMemcpyDeviceToHost));
            std::vector<float> r(V);
            for (int64_t j = 0; j < V; ++j) r[j] = elem_to_f32(h.data(), j, c.dt);
            xrows.push_back(r);
        }
    }

    /* With every row checked and statistics requested: a quarter of the valid labels are the row's
     * argmax, so the accuracy counter has something to count. */
    if (c.stats && rows.size() == (size_t)N) {
        int k2 = 0;
        for (int64_t i : rows) {
            const std::vector<float> &xr = xrows[k2++];
            if (planted.count(i) || y[i] < 0 || y[i] >= V || i % 4 != 0) continue;
            lf_argmax am = lf_argmax_init();
            for (int64_t j = 0; j < V; ++j) lf_argmax_push(&am, xr[j], (int32_t)j);
            y[i] = am.i;
        }
        if (c.lab64) CK(cudaMemcpy(yd.p, y.data(), N * 8, cudaMemcpyHostToDevice));
        else {
            std::vector<int32_t> y32(y.begin(), y.end());
            CK(cudaMemcpy(yd.p, y32.data(), N * 4, cudaMemcpyHostToDevice));
        }
    }

    /* host reference options */
    lf_ce_opts oh = lf_ce_opts_default();
    oh.label_smoothing = c.eps;
    oh.z_loss = c.lam;
    oh.softcap = c.cap;
    oh.logit_scale = c.scale;
    oh.class_weights = c.weights ? w.data() : NULL;
    oh.ignore_index = c.ignore_index;
    double wsum_valid = 0.0; /* default mean divisor */
    for (int64_t i = 0; i < N; ++i)
        if (y[i] >= 0 && y[i] < V) wsum_valid += c.weights ? w[y[i]] : 1.0;
    const double D = c.dev_divisor ? 123.5 : wsum_valid;

    /* device upstream gradient */
    std::vector<float> dl(c.red == LF_REDUCE_NONE ? N : 1);
    /* Signed upstream gradients reach the fast writer's negative branch (sgn(a) = -1) and its
     * zero (a = 0: k = +inf); a quarter of the rows negative, one in twenty exactly zero. */
    for (size_t k = 0; k < dl.size(); ++k) {
        const double u = rng_u(&rs);
        dl[k] = (float)(0.5 + rng_u(&rs));
        if (dl.size() == 1) dl[k] = c.dloss_neg ? -dl[k] : dl[k];
        else if (u < 0.05) dl[k] = 0.0f;
        else if (u < 0.30) dl[k] = -dl[k];
    }
    DevBuf dld(dl.size() * 4), divd(4), ws(ce_workspace_bytes(N));
    CK(cudaMemcpy(dld.p, dl.data(), dl.size() * 4, cudaMemcpyHostToDevice));
    const float divh = 123.5f;
    CK(cudaMemcpy(divd.p, &divh, 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(ws.p, 0, ws.bytes));

    /* outputs, poisoned */
    const int64_t nloss = c.red == LF_REDUCE_NONE ? N : 1;
    DevBuf loss(nloss * 4), zo(nloss * 4), lp(N * 4), lse(N * 4), ent(N * 4), am(N * 4), cnt(8);
    for (DevBuf *b : {&loss, &zo, &lp, &lse, &ent, &am}) fill_poison(b->p, b->bytes / 4, LF_F32);
    CK(cudaMemset(cnt.p, 0, 8));
    const int64_t gstride = c.grad == 1 ? V + c.gpad : stride;
    DevBuf gbuf(c.grad == 1 ? (size_t)N * gstride * esz : 4);
    /* a separate gradient's columns [0, V) poisoned (again before each relaunch below) */
    auto poison_grad = [&]() {
        if (c.dt == LF_F32) fill_cols<uint32_t><<<1024, 256>>>((uint32_t *)gbuf.p, N, V, gstride, POISON32);
        else fill_cols<uint16_t><<<1024, 256>>>((uint16_t *)gbuf.p, N, V, gstride, POISON16);
        CK(cudaGetLastError());
    };
    if (c.grad == 1) {
        /* known padding bits in [V, gstride), poison in [0, V) */
        if (c.dt == LF_F32) fill_bits<uint32_t><<<1024, 256>>>((uint32_t *)gbuf.p, N * gstride, PAD32);
        else fill_bits<uint16_t><<<1024, 256>>>((uint16_t *)gbuf.p, N * gstride, PAD16);
        CK(cudaGetLastError());
        poison_grad();
    }
    /* before a relaunch: the loss, z and (separate) gradient poisoned, so that a relaunch that
     * wrote nothing cannot match the first launch's bits */
    auto poison_relaunch = [&]() {
        fill_poison(loss.p, nloss, LF_F32);
        fill_poison(zo.p, nloss, LF_F32);
        if (c.grad == 1) poison_grad();
        CK(cudaDeviceSynchronize());
    };

    ce_args a = ce_args_default();
    a.logits = x.p;
    a.dtype = c.dt;
    a.n_rows = N;
    a.vocab = V;
    a.stride = stride;
    a.labels = yd.p;
    a.labels_i64 = c.lab64;
    a.opts = oh;
    a.opts.class_weights = c.weights ? (const float *)wd.p : NULL;
    a.reduction = c.red;
    a.divisor = c.dev_divisor ? (const float *)divd.p : NULL;
    a.dloss = c.dloss ? (const float *)dld.p : NULL;
    a.grad_scale = c.grad_scale;
    a.grad = c.grad == 0 ? NULL : c.grad == 1 ? gbuf.p : x.p;
    a.grad_stride = gstride;
    a.loss = (float *)loss.p;
    a.z_loss_out = (float *)zo.p;
    if (c.stats) {
        a.logprob = (float *)lp.p;
        a.lse = (float *)lse.p;
        a.entropy = (float *)ent.p;
        a.argmax = (int32_t *)am.p;
        a.n_correct = (unsigned *)cnt.p;
    }
    a.n_errors = (unsigned *)cnt.p + 1;
    a.workspace = ws.p;
    a.workspace_bytes = ws.bytes;
    a.max_cluster = c.max_cluster;
    a.schedule = c.schedule;
    a.stages = c.stages;
    a.static_rows = c.static_rows;
    ce_plan plan;
    memset(&plan, 0, sizeof plan);
    a.plan = &plan;

    /* For reduced losses over sampled rows: all per-row losses from a forward-only launch first
     * (before an in-place launch overwrites the logits); the reduction is checked against them. */
    /* A row's loss tolerance, from its logits xr (floats) and its reference r: the absolute part
     * (tol_abs, in z units) and lse's magnitude. */
    const double wmax = c.weights ? 2.0 : 1.0;
    auto row_tol_abs = [&](const float *xr, const lf_ce_row &r, double *lsea_out, double *zmax_out) {
        /* the row's magnitude: lse and the largest finite |z| below the float floor (ZFLOOR).
         * Without smoothing (whose sum of w_j z_j carries every |z|), an entry more than 128
         * below the lse is left out too: its exponential is 0 (or flushed) in the kernel and the
         * reference alike, whatever its argument's rounding (fp16's finfo.min, -65504, had made
         * the bound 0.06) */
        const double zcut = c.eps == 0.0f && fabs(r.lse) < INFINITY ? r.lse - 128.0 : -INFINITY;
        double zmax = 0.0;
        for (int64_t j = 0; j < V; ++j) {
            const double z = (double)lf_logit_xform(xr[j], c.scale, c.cap);
            if (fabs(z) < ZFLOOR && z >= zcut) zmax = fmax(zmax, fabs(z));
        }
        const double lsea = fabs(r.lse) < INFINITY ? fabs(r.lse) : 0.0;
        *lsea_out = lsea;
        *zmax_out = zmax;
        /* (lse, entropy, and the loss where loss_tol's tight form does not apply:) fp32 work of
         * the kernel: exp arguments carry ~2^-24 (|z| + |lse|) absolute error each (FFMA; the
         * gradient's shift lse log2 e is rounded), sums of up to 2^18 terms in per-thread chains and
         * trees, log of a sum <= V: 2^-20 (1 + |lse| + max|z| + log V) covers it with room,
         * scaled by the largest class weight; relative 1e-5 on top (the issue's target). Label
         * smoothing adds the mean of w_j z_j over V, a long fp32 sum: 4x more room then. */
        return 0x1p-20 * (1.0 + lsea + zmax + log((double)V + 1.0)) * wmax * (c.eps > 0 ? 4.0 : 1.0);
    };
    /* The loss is (m - z_y) + log s with s relative to m itself (cross_entropy.cu's contract):
     * without label smoothing (whose W lse - sum w z carries ~|z| 2^-24 per term) and where z is
     * x times an exact power of 2 (no cap: tanhf's error is ~|z| 2^-22), its error is the
     * rounding of m - z_y (relative, below 1e-5 |loss|: loss >= m - z_y), the fp32 sum s
     * (relative, ~1e-6 at 2^18 terms), the exponents' and EX2's rounding (~2^-22 relative per
     * term) and logf: 2^-20 (1 + log V) absolute covers it, times the largest class weight;
     * z-loss adds lam lse^2, whose lse carries ~|lse| 2^-24. Otherwise the old bound, relative
     * to the row's magnitudes. */
    int scale_exp = 0;
    const bool pow2_scale = c.scale > 0.0f && frexpf(c.scale, &scale_exp) == 0.5f;
    const bool tight_lp = c.cap == 0.0f && pow2_scale, tight = tight_lp && c.eps == 0.0f;
    const double tight_abs = 0x1p-20 * (1.0 + log((double)V + 1.0));
    auto loss_tol = [&](const lf_ce_row &r, double tol_abs, double lsea) {
        return 1e-5 * fabs(r.loss) + (tight ? tight_abs * wmax : tol_abs) + tol_abs * c.lam * 2.0 * lsea;
    };
    auto z_tol = [&](const lf_ce_row &r, double tol_abs, double lsea) {
        return 1e-5 * fabs(r.z_term) + 4 * c.lam * lsea * tol_abs;
    };

    /* Sampled rows with a reduction: a forward-only launch of the same kernel gives every row's
     * loss and z, whose sum must give the reduced values; and every one of those rows is held
     * to the reference here (host threads, the logits copied in chunks), so that a row the
     * sample missed cannot be wrong in both. */
    std::vector<float> all_rows;
    double full_sum = 0.0, full_tol = 0.0, full_zsum = 0.0, full_ztol = 0.0;
    if (c.red != LF_REDUCE_NONE && rows.size() < (size_t)N) {
        ce_args f = a;
        DevBuf l2(N * 4), ws2(ce_workspace_bytes(N)), cnt2(8);
        CK(cudaMemset(ws2.p, 0, ws2.bytes));
        f.reduction = LF_REDUCE_NONE;
        f.grad = NULL;
        f.loss = (float *)l2.p;
        DevBuf z2(N * 4);
        f.z_loss_out = (float *)z2.p;
        f.logprob = f.lse = f.entropy = NULL;
        f.argmax = NULL;
        f.n_correct = NULL;
        f.n_errors = (unsigned *)cnt2.p;
        f.dloss = NULL;
        f.workspace = ws2.p;
        f.plan = NULL;
        cudaError_t ce;
        EXPECT(ce_launch(&f, 0, &ce) == LF_OK, "forward-only launch failed: %s", cudaGetErrorString(ce));
        CK(cudaDeviceSynchronize());
        all_rows.resize(N);
        std::vector<float> all_z(N);
        CK(cudaMemcpy(all_rows.data(), l2.p, N * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(all_z.data(), z2.p, N * 4, cudaMemcpyDeviceToHost));
        std::vector<double> rl(N), rt(N), rz(N), rzt(N);
        const int64_t chunk = std::max<int64_t>(1, ((int64_t)256 << 20) / (stride * esz));
        std::vector<char> hx;
        for (int64_t i0 = 0; i0 < N; i0 += chunk) {
            const int64_t n = std::min(chunk, N - i0);
            hx.resize((size_t)n * stride * esz);
            CK(cudaMemcpy(hx.data(), (const char *)x.p + (size_t)i0 * stride * esz, hx.size(), cudaMemcpyDeviceToHost));
            host_workers([&](unsigned k, unsigned nth) {
                std::vector<float> xr(V);
                for (int64_t i = i0 + k; i < i0 + n; i += nth) {
                    const char *row = hx.data() + (size_t)(i - i0) * stride * esz;
                    for (int64_t j = 0; j < V; ++j) xr[j] = elem_to_f32(row, j, c.dt);
                    const lf_ce_row r = lf_ref_ce_row(xr.data(), V, y[i], &oh, NULL);
                    double lsea, zm;
                    const double ta = row_tol_abs(xr.data(), r, &lsea, &zm);
                    const bool valid = r.status == LF_ROW_OK;
                    rl[i] = r.loss;
                    rz[i] = r.z_term;
                    rt[i] = valid ? loss_tol(r, ta, lsea) : 0.0;
                    rzt[i] = valid ? z_tol(r, ta, lsea) : 0.0;
                }
            });
        }
        int64_t off = 0, zoff = 0, first = -1;
        for (int64_t i = 0; i < N; ++i) {
            full_sum += rl[i];
            full_tol += rt[i];
            full_zsum += rz[i];
            full_ztol += rzt[i];
            const bool lb = !close(all_rows[i], rl[i], rt[i]), zb = !close(all_z[i], rz[i], rzt[i]);
            off += lb;
            zoff += zb;
            if ((lb || zb) && first < 0) first = i;
        }
        EXPECT(off == 0 && zoff == 0,
               "forward-only launch: %lld rows' loss and %lld rows' z off the reference; first row %lld: loss %.9g want %.9g, z %.9g want %.9g",
               (long long)off, (long long)zoff, (long long)first, first >= 0 ? all_rows[first] : 0.0, first >= 0 ? rl[first] : 0.0,
               first >= 0 ? all_z[first] : 0.0, first >= 0 ? rz[first] : 0.0);
    }

    cudaError_t ce;
    lf_status st = ce_launch(&a, 0, &ce);
    EXPECT(st == LF_OK, "ce_launch: %s (%s)", lf_status_str(st), cudaGetErrorString(ce));
    if (g_cc_major >= 9 && c.expect_cluster)
        EXPECT(plan.cluster == c.expect_cluster, "plan: cluster %d, want %d", plan.cluster, c.expect_cluster);
    if (g_cc_major >= 9 && c.expect_pieces)
        EXPECT(plan.pieces == c.expect_pieces, "plan: %d pieces, want %d", plan.pieces, c.expect_pieces);
    if (g_cc_major >= 9 && c.expect_schedule)
        EXPECT(plan.schedule == c.expect_schedule, "plan: schedule %d, want %d", plan.schedule, c.expect_schedule);
    if (g_cc_major >= 9 && c.expect_stages)
        EXPECT(plan.stages == c.expect_stages, "plan: %d stages, want %d", plan.stages, c.expect_stages);
    if (g_cc_major >= 9 && c.expect_dynamic >= 0 && plan.schedule == CE_SCHED_RESIDENT)
        EXPECT(plan.dynamic == c.expect_dynamic, "plan: dynamic %d, want %d", plan.dynamic, c.expect_dynamic);
    if (c.schedule != CE_SCHED_AUTO)
        EXPECT(plan.schedule == c.schedule, "plan: schedule %d, forced %d", plan.schedule, c.schedule);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());

    /* ---- the workspace's completion counters are back at zero (the next launch and graph
     * replays rely on it: a counter left behind would make the next launch's last CTA never see
     * itself last, and its divisor or batch sum stale) ---- */
    {
        ce_ws_header h;
        CK(cudaMemcpy(&h, ws.p, sizeof h, cudaMemcpyDeviceToHost));
        EXPECT(h.rows_done == 0 && h.div_done == 0 && h.row_next == 0, "workspace counters left at %llu / %u / %llu", h.rows_done,
               h.div_done, h.row_next);
        int nz = 0; /* the order-free batch sums, cleared by the last CTA */
        for (size_t i = 0; i < sizeof h.xs; ++i) nz += ((const unsigned char *)h.xs)[i] != 0;
        EXPECT(nz == 0, "workspace batch sums left non-zero (%d bytes)", nz);
    }

    /* ---- counters, per-row outputs: every element written ---- */
    unsigned cnth[2];
    CK(cudaMemcpy(cnth, cnt.p, 8, cudaMemcpyDeviceToHost));
    EXPECT((int64_t)cnth[1] == n_bad, "n_errors %u, want %lld", cnth[1], (long long)n_bad);
    std::vector<float> lossh(nloss), zoh(nloss), lph(N), lseh(N), enth(N);
    std::vector<int32_t> amh(N);
    CK(cudaMemcpy(lossh.data(), loss.p, nloss * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(zoh.data(), zo.p, nloss * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lph.data(), lp.p, N * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(lseh.data(), lse.p, N * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(enth.data(), ent.p, N * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(amh.data(), am.p, N * 4, cudaMemcpyDeviceToHost));
    auto bits = [](float f) { uint32_t u; memcpy(&u, &f, 4); return u; };
    int64_t unwritten = 0;
    for (int64_t i = 0; i < nloss; ++i) unwritten += (bits(lossh[i]) == POISON32) + (bits(zoh[i]) == POISON32);
    if (c.stats)
        for (int64_t i = 0; i < N; ++i)
            unwritten += (bits(lph[i]) == POISON32) + (bits(lseh[i]) == POISON32) + (bits(enth[i]) == POISON32) +
                         ((uint32_t)amh[i] == POISON32);
    EXPECT(unwritten == 0, "%lld per-row outputs left unwritten", (long long)unwritten);

    /* ---- gradient buffer: every element of [0, V) written, padding untouched ---- */
    if (c.grad == 1 || (c.grad == 2 && c.pad > 0)) {
        DevBuf counts(16);
        CK(cudaMemset(counts.p, 0, 16));
        unsigned long long ch[2];
        if (c.grad == 1) {
            if (c.dt == LF_F32)
                count_unwritten<uint32_t><<<1024, 256>>>((const uint32_t *)gbuf.p, N, V, gstride, POISON32, PAD32,
                                                         (unsigned long long *)counts.p);
            else
                count_unwritten<uint16_t><<<1024, 256>>>((const uint16_t *)gbuf.p, N, V, gstride, POISON16, PAD16,
                                                         (unsigned long long *)counts.p);
        } else {
            if (c.dt == LF_F32) count_pad_changed<float><<<1024, 256>>>((const float *)x.p, N, V, stride, data_seed, c.outlier, (unsigned long long *)counts.p + 1);
            else if (c.dt == LF_BF16) count_pad_changed<__nv_bfloat16><<<1024, 256>>>((const __nv_bfloat16 *)x.p, N, V, stride, data_seed, c.outlier, (unsigned long long *)counts.p + 1);
            else count_pad_changed<__half><<<1024, 256>>>((const __half *)x.p, N, V, stride, data_seed, c.outlier, (unsigned long long *)counts.p + 1);
        }
        CK(cudaGetLastError());
        CK(cudaMemcpy(ch, counts.p, 16, cudaMemcpyDeviceToHost));
        EXPECT(ch[0] == 0, "%llu gradient elements never written", ch[0]);
        EXPECT(ch[1] == 0, "%llu padding elements overwritten", ch[1]);
    }

    /* ---- checked rows against the double reference ---- */
    const double unit_round = c.dt == LF_BF16 ? 0x1p-8 : c.dt == LF_F16 ? 0x1p-11 : 0.0;
    double ref_sum = 0.0, ref_zsum = 0.0, ref_tol = 0.0;
    int64_t ref_correct = 0; /* valid checked rows whose argmax is the label */
    int k = 0;
    std::vector<double> dx(V);
    std::vector<char> grow((size_t)V * esz);
    for (int64_t i : rows) {
        const std::vector<float> &xr = xrows[k++];
        const lf_ce_row r = lf_ref_ce_row(xr.data(), V, y[i], &oh, c.grad ? dx.data() : NULL);
        ref_sum += r.loss;
        ref_zsum += r.z_term;
        ref_correct += r.status == LF_ROW_OK && r.argmax == y[i];
        const bool valid = r.status == LF_ROW_OK;
        double lsea, zmax;
        const double tol_abs = row_tol_abs(xr.data(), r, &lsea, &zmax);
        const double tol_l = loss_tol(r, tol_abs, lsea);
        ref_tol += valid ? tol_l : 0.0;
        const double G = (double)c.grad_scale * (c.dloss ? dl[c.red == LF_REDUCE_NONE ? i : 0] : 1.0) *
                         (c.red == LF_REDUCE_MEAN ? (D == 0.0 ? 0.0 : 1.0 / D) : 1.0);
        if (c.red == LF_REDUCE_NONE) {
            EXPECT(close(lossh[i], r.loss, tol_l), "row %lld loss %.9g want %.9g (tol %.3g)", (long long)i, lossh[i], r.loss, tol_l);
            EXPECT(close(zoh[i], r.z_term, z_tol(r, tol_abs, lsea)), "row %lld z %.9g want %.9g", (long long)i, zoh[i], r.z_term);
        }
        if (c.stats) {
            EXPECT(close(lph[i], valid ? r.logprob : 0.0, 1e-5 * fabs(r.logprob) + (tight_lp ? tight_abs : tol_abs)), "row %lld logprob %.9g want %.9g", (long long)i, lph[i], r.logprob);
            EXPECT(close(lseh[i], valid ? r.lse : 0.0, tol_abs), "row %lld lse %.9g want %.9g", (long long)i, lseh[i], r.lse);
            EXPECT(close(enth[i], valid ? r.entropy : 0.0, 1e-5 * fabs(r.entropy) + tol_abs), "row %lld entropy %.9g want %.9g", (long long)i, enth[i], r.entropy);
            EXPECT(amh[i] == (valid ? r.argmax : -1), "row %lld argmax %d want %lld", (long long)i, amh[i], (long long)(valid ? r.argmax : -1));
        }
        if (c.grad) {
            const void *src = c.grad == 1 ? (const char *)gbuf.p + (size_t)i * gstride * esz : (const char *)x.p + (size_t)i * stride * esz;
            CK(cudaMemcpy(grow.data(), src, V * esz, cudaMemcpyDeviceToHost));
            /* each g_j is an fp32 combination of the coefficients a (p_j), b (label), e (smoothing)
             * of magnitude <= |G| scale (2 wmax + 2 lam |lse|): 2^-21 of that absolute, plus the
             * relative fp32 error of p_j, plus the dtype's rounding (2^-8 bf16, 2^-11 fp16, and
             * fp16's subnormal step 2^-24 / 2 absolute). */
            const double coef = fabs(G) * c.scale * (2.0 * wmax + 2.0 * c.lam * lsea);
            const double rel32_row = 1e-6 + 0x1p-22 * (lsea + zmax);
            /* An fp32 gradient with z = x times a power of 2 and no cap (tight_lp) takes p_j
             * against the row maximum, the row's 2^-c / s folded into a (lossfuse_cuda.cuh
             * lf_grad_coef_onto_max; fp32 rows never take the fast form, whose k is one rounded
             * float: lf_grad_fast_ok): its exponent's error is relative to |z_j - m| <= |z_j -
             * lse| + log V, the rest a few fp32 roundings (the sum s, a's factors) and EX2's
             * 2^-22, so 1e-6 + 2^-22 (4 + |z_j - lse| + log V), or the bound relative to |lse|
             * + max|z| where that is smaller (which let ~2^-24 |lse| through: 2e-4 at the
             * planted maxima). */
            const bool tight_g = tight_lp && c.dt == LF_F32 && valid && fabs(r.lse) < INFINITY;
            const double logV = log((double)V + 1.0);
            const double fp16_abs = c.dt == LF_F16 ? 0x1p-25 : 0.0;
            int bad_elems = 0;
            double worst = 0.0;
            int64_t worst_j = -1;
            for (int64_t j = 0; j < V; ++j) {
                const double g = elem_to_f32(grow.data(), j, c.dt), want = dx[j] * G;
                const double zj = tight_g ? (double)lf_logit_xform(xr[j], c.scale, c.cap) : 0.0;
                const double rel32 = tight_g && fabs(zj) < INFINITY
                                         ? std::min(rel32_row, 1e-6 + 0x1p-22 * (4.0 + fabs(zj - r.lse) + logV))
                                         : rel32_row;
                /* (the coefficient term also carries p_j's own relative error: at the label with
                 * p_y ~ 1, a p_y - b cancels and leaves rel32 * a absolute; the tight rows' rel32
                 * is never above the row's bound) */
                const double tol = (unit_round + rel32) * fabs(want) + (0x1p-21 + rel32) * coef + fp16_abs + 1e-37;
                if (!close(g, want, tol)) {
                    ++bad_elems;
                    const double e = want != want ? INFINITY : fabs(g - want) / tol;
                    if (!(e <= worst)) { worst = e; worst_j = j; }
                }
            }
            EXPECT(bad_elems == 0, "row %lld: %d gradient elements off; worst j=%lld got %.9g want %.9g (%.3g x tol)",
                   (long long)i, bad_elems, (long long)worst_j, worst_j >= 0 ? elem_to_f32(grow.data(), worst_j, c.dt) : 0.0,
                   worst_j >= 0 ? dx[worst_j] * G : 0.0, worst);
        }
    }

    /* ---- accuracy counter (needs every row checked) ---- */
    if (c.stats && rows.size() == (size_t)N)
        EXPECT((int64_t)cnth[0] == ref_correct, "n_correct %u, want %lld", cnth[0], (long long)ref_correct);

    /* ---- the reduced loss ---- */
    if (c.red != LF_REDUCE_NONE) {
        const double inv = c.red == LF_REDUCE_MEAN ? (D == 0.0 ? 0.0 : 1.0 / D) : 1.0;
        if (rows.size() == (size_t)N) {
            const double want = ref_sum * inv;
            EXPECT(close(lossh[0], want, 1e-6 * fabs(want) + ref_tol * inv), "reduced loss %.9g want %.9g", lossh[0], want);
            EXPECT(close(zoh[0], ref_zsum * inv, 1e-5 * fabs(ref_zsum * inv) + 1e-9), "reduced z %.9g want %.9g", zoh[0], ref_zsum * inv);
        } else {
            /* sampled rows were checked above; the sum of the kernel's own per-row losses
             * (double, any order) must give the reduced value to float rounding */
            double s = 0.0;
            for (float v : all_rows) s += v;
            EXPECT(close(lossh[0], s * inv, 4e-7 * fabs(s * inv) + 1e-30), "reduced loss %.9g want %.9g (sum of rows)", lossh[0], s * inv);
            /* and the reduced values against every row's reference (the forward-only block) */
            EXPECT(close(lossh[0], full_sum * inv, 1e-6 * fabs(full_sum * inv) + full_tol * inv), "reduced loss %.9g want %.9g (every row)",
                   lossh[0], full_sum * inv);
            EXPECT(close(zoh[0], full_zsum * inv, 1e-5 * fabs(full_zsum * inv) + full_ztol * inv + 1e-9), "reduced z %.9g want %.9g (every row)",
                   zoh[0], full_zsum * inv);
        }
    }

    /* ---- determinism: same inputs, same bits ---- */
    if (c.determinism) {
        const unsigned long long h1 = c.grad ? device_checksum(c.grad == 1 ? gbuf.p : x.p, (c.grad == 1 ? (size_t)N * gstride : nel) * esz) : 0;
        float l1 = lossh[0];
        for (int rep = 0; rep < 2; ++rep) {
            if (c.grad == 2) { /* restore the logits */
                gen_device(x.p, c, stride, data_seed);
                CK(cudaDeviceSynchronize());
            }
            poison_relaunch();
            EXPECT(ce_launch(&a, 0, &ce) == LF_OK, "relaunch failed");
            CK(cudaDeviceSynchronize());
            float l2;
            CK(cudaMemcpy(&l2, loss.p, 4, cudaMemcpyDeviceToHost));
            const unsigned long long h2 = c.grad ? device_checksum(c.grad == 1 ? gbuf.p : x.p, (c.grad == 1 ? (size_t)N * gstride : nel) * esz) : 0;
            EXPECT(bits(l1) == bits(l2), "loss not bit-identical across runs: %.9g vs %.9g", l1, l2);
            EXPECT(h1 == h2, "gradient not bit-identical across runs");
        }
        /* row-resident: the other way of handing out rows (dynamic <-> a fixed share per CTA)
         * must give the same bits: per-row work does not depend on the CTA, and the batch sum is
         * order-free */
        if (plan.schedule == CE_SCHED_RESIDENT) {
            ce_args b = a;
            ce_plan plan2;
            memset(&plan2, 0, sizeof plan2);
            b.static_rows = plan.dynamic; /* static after dynamic; 0 (dynamic where it applies) after static */
            b.plan = &plan2;
            if (c.grad == 2) {
                gen_device(x.p, c, stride, data_seed);
                CK(cudaDeviceSynchronize());
            }
            poison_relaunch();
            EXPECT(ce_launch(&b, 0, &ce) == LF_OK, "relaunch (static_rows %d) failed", b.static_rows);
            CK(cudaDeviceSynchronize());
            float l2, z1 = zoh[0], z2;
            CK(cudaMemcpy(&l2, loss.p, 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&z2, zo.p, 4, cudaMemcpyDeviceToHost));
            const unsigned long long h2 = c.grad ? device_checksum(c.grad == 1 ? gbuf.p : x.p, (c.grad == 1 ? (size_t)N * gstride : nel) * esz) : 0;
            EXPECT(plan2.schedule == CE_SCHED_RESIDENT, "relaunch: schedule %d", plan2.schedule);
            if (plan.dynamic || c.static_rows)
                EXPECT(plan2.dynamic == !plan.dynamic, "relaunch: dynamic %d after %d", plan2.dynamic, plan.dynamic);
            EXPECT(bits(l1) == bits(l2) && bits(z1) == bits(z2), "static_rows %d: loss / z %.9g / %.9g, dynamic %d: %.9g / %.9g",
                   b.static_rows, l2, z2, plan.dynamic, l1, z1);
            EXPECT(h1 == h2, "gradient differs between dynamic %d and %d", plan.dynamic, plan2.dynamic);
        }
        /* mean without a divisor: the divisor kernel's count must be the sum of the valid rows'
         * weights, which is exact in double in any order for these weights (0 or [0.25, 2), at
         * most 2^20 rows): the same bits as that sum given as a device divisor */
        if (c.red == LF_REDUCE_MEAN && !c.dev_divisor && N <= (1 << 20)) {
            ce_args b = a;
            const float dv = (float)wsum_valid;
            CK(cudaMemcpy(divd.p, &dv, 4, cudaMemcpyHostToDevice));
            b.divisor = (const float *)divd.p;
            if (c.grad == 2) {
                gen_device(x.p, c, stride, data_seed);
                CK(cudaDeviceSynchronize());
            }
            poison_relaunch();
            EXPECT(ce_launch(&b, 0, &ce) == LF_OK, "relaunch with the divisor given failed");
            CK(cudaDeviceSynchronize());
            float l2, z1 = zoh[0], z2;
            CK(cudaMemcpy(&l2, loss.p, 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(&z2, zo.p, 4, cudaMemcpyDeviceToHost));
            const unsigned long long h2 = c.grad ? device_checksum(c.grad == 1 ? gbuf.p : x.p, (c.grad == 1 ? (size_t)N * gstride : nel) * esz) : 0;
            EXPECT(bits(l1) == bits(l2) && bits(z1) == bits(z2), "divisor %.9g given: loss / z %.9g / %.9g, counted: %.9g / %.9g",
                   (double)dv, l2, z2, l1, z1);
            EXPECT(h1 == h2, "gradient differs between the divisor counted and given");
        }
    }
    printf("%-4s %s\n", g_fail == fails_before ? "ok" : "FAIL", g_case);
    fflush(stdout);
}

/* ---------------------------------------------------------------- special cases ------------ */

static void test_arguments(void)
{
    snprintf(g_case, sizeof g_case, "argument checks");
    DevBuf x(64 * 4), y(64 * 8), l(64 * 4), ws(ce_workspace_bytes(64));
    ce_args a = ce_args_default();
    a.logits = x.p;
    a.n_rows = 4;
    a.vocab = 8;
    a.stride = 8;
    a.labels = y.p;
    a.labels_i64 = 1;
    a.loss = (float *)l.p;
    a.workspace = ws.p;
    a.workspace_bytes = ws.bytes;
    cudaError_t ce;
    ce_args b = a;
    b.stride = 7;
    EXPECT(ce_launch(&b, 0, &ce) == LF_ERR_SIZE, "stride < V accepted");
    b = a;
    b.opts.label_smoothing = 1.5f;
    EXPECT(ce_launch(&b, 0, &ce) == LF_ERR_ARG, "smoothing 1.5 accepted");
    b = a;
    b.opts.logit_scale = 0.0f;
    EXPECT(ce_launch(&b, 0, &ce) == LF_ERR_ARG, "scale 0 accepted");
    b = a;
    b.workspace_bytes = 8;
    EXPECT(ce_launch(&b, 0, &ce) == LF_ERR_SIZE, "small workspace accepted");
    b = a;
    b.grad = (char *)x.p + 2; /* overlaps the logits without being them */
    b.grad_stride = 8;
    EXPECT(ce_launch(&b, 0, &ce) == LF_ERR_ARG, "overlapping gradient accepted");
    b = a;
    b.labels = NULL;
    EXPECT(ce_launch(&b, 0, &ce) == LF_ERR_NULL, "NULL labels accepted");
    b = a;
    b.schedule = CE_SCHED_WARP + 1;
    EXPECT(ce_launch(&b, 0, &ce) == LF_ERR_ARG, "schedule %d accepted", CE_SCHED_WARP + 1);
    b = a;
    b.schedule = -1;
    EXPECT(ce_launch(&b, 0, &ce) == LF_ERR_ARG, "schedule -1 accepted");
    b = a;
    b.schedule = CE_SCHED_WARP; /* forward only: with a gradient, an argument error */
    b.grad = x.p;
    b.grad_stride = 8;
    EXPECT(ce_launch(&b, 0, &ce) == LF_ERR_ARG, "warp schedule with a gradient accepted");
    for (int ns = 1; ns <= CE_RES_GROUPS; ++ns) { /* a ring no larger than its warp groups cannot load ahead */
        b = a;
        b.stages = ns;
        EXPECT(ce_launch(&b, 0, &ce) == LF_ERR_ARG, "%d stages accepted", ns);
    }
    b = a;
    b.stages = CE_RES_MAX_STAGES + 1;
    EXPECT(ce_launch(&b, 0, &ce) == LF_ERR_ARG, "too many stages accepted");
    if (g_cc_major < 9) {
        b = a;
        b.schedule = CE_SCHED_RESIDENT;
        EXPECT(ce_launch(&b, 0, &ce) == LF_ERR_DEVICE, "resident schedule accepted below sm_90");
    }
    /* N = 0: nothing launched, reduced loss 0 */
    b = a;
    b.n_rows = 0;
    fill_poison(l.p, 1, LF_F32);
    EXPECT(ce_launch(&b, 0, &ce) == LF_OK, "N = 0 rejected");
    CK(cudaDeviceSynchronize());
    float lh;
    CK(cudaMemcpy(&lh, l.p, 4, cudaMemcpyDeviceToHost));
    EXPECT(lh == 0.0f, "N = 0 loss %g, want 0", lh);
    printf("%-4s %s\n", "ok", g_case);
}

/* lf_ex2_fma (2^x on the FMA pipe) against exp2 in double: every float in [-130, 130] on a grid
 * of 2^-12 plus random values, the flush below -126 (exactly 0, as lf_ex2), +inf from 127.5 on
 * (and for +inf), -inf -> 0, NaN -> NaN; and the gradient writer with half of each vector's exponentials on the FMA pipe (NPOLY 4)
 * against the all-MUFU one (lf_piece_grad_fast), bf16, from a shared-memory piece. */
__global__ void ex2_fma_kernel(const float *x, float *y, float *y_mufu, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = lf_ex2_fma(x[i]);
        y_mufu[i] = lf_ex2(x[i]);
    }
}
template <int NPOLY>
__global__ void grad_mix_kernel(const __nv_bfloat16 *row, __nv_bfloat16 *out, int V, float c, float k)
{
    __shared__ uint4 buf[1024];
    const lf_row_span sp = lf_row_span_make(row, V);
    const uint4 *body = reinterpret_cast<const uint4 *>(row + sp.head);
    for (int v = threadIdx.x; v < sp.nvec; v += 256) buf[v] = body[v];
    __syncthreads();
    lf_piece_grad_fast<256, __nv_bfloat16, false, NPOLY>(out, buf, sp, 0, sp.nvec, c, k);
}

/* The statistics sweep with NPOLY of each 8 exponentials on the FMA pipe: lse and entropy of
 * one staged row (FULL), written by thread 0. */
template <int NPOLY>
__global__ void stats_mix_kernel(const __nv_bfloat16 *row, int V, float *out)
{
    __shared__ uint4 buf[1024];
    __shared__ float scratch[6 * 256 / 32];
    __shared__ unsigned best_key;
    const lf_row_span sp = lf_row_span_make(row, V);
    const uint4 *body = reinterpret_cast<const uint4 *>(row + sp.head);
    for (int v = threadIdx.x; v < sp.nvec; v += 256) buf[v] = body[v];
    if (threadIdx.x == 0) best_key = lf_argmax_key(-LF_INF_F);
    __syncthreads();
    lf_row_stats st = lf_row_stats_init();
    lf_lazy_argmax la = lf_lazy_argmax_init();
    const lf_xform t = lf_xform_make(1.0f, 0.0f);
    lf_piece_stats_fast<256, __nv_bfloat16, true, NPOLY>(st, la, &best_key, buf, sp, 0, sp.nvec, t, false);
    float xm = la.v, xs = 0.0f;
    int32_t xi = la.i;
    st.lse = lf_block_lse_fast<256, true>(st.lse, &xm, &xi, &xs, scratch);
    if (threadIdx.x == 0) {
        out[0] = lf_lse_final(st.lse);
        out[1] = lf_lse_entropy(st.lse);
    }
}

static void test_ex2_fma(void)
{
    snprintf(g_case, sizeof g_case, "lf_ex2_fma vs exp2");
    std::vector<float> xs;
    for (double v = -130.0; v <= 130.0; v += 1.0 / 4096) xs.push_back((float)v);
    uint64_t rs = g_seed + 11;
    for (int i = 0; i < 200000; ++i) xs.push_back((float)(-140.0 + 200.0 * rng_u(&rs)));
    for (float v : {-126.0f, -125.99f, -126.01f, -0.0f, 0.0f, 0.5f, -0.5f, 0.49999997f, -0.49999997f, 126.0f, 127.49f,
                    127.5f, 128.0f, 200.0f, 1e6f, 1e30f})
        xs.push_back(v);
    xs.push_back(-INFINITY);
    xs.push_back(INFINITY);
    xs.push_back(NAN);
    const int n = (int)xs.size();
    DevBuf xd(n * 4), yd(n * 4), ym(n * 4);
    CK(cudaMemcpy(xd.p, xs.data(), n * 4, cudaMemcpyHostToDevice));
    ex2_fma_kernel<<<(n + 255) / 256, 256>>>((const float *)xd.p, (float *)yd.p, (float *)ym.p, n);
    CK(cudaGetLastError());
    std::vector<float> y(n), ymu(n);
    CK(cudaMemcpy(y.data(), yd.p, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ymu.data(), ym.p, n * 4, cudaMemcpyDeviceToHost));
    double worst = 0.0, worst_mufu = 0.0;
    int bad = 0;
    for (int i = 0; i < n; ++i) {
        const float x = xs[i];
        if (x != x) {
            bad += !(y[i] != y[i]);
            continue;
        }
        if (x < -126.0f) { /* flushed, as the MUFU's ex2.approx.ftz (which flushes its subnormal results) */
            bad += y[i] != 0.0f;
            continue;
        }
        if (x >= 127.5f) { /* the documented overflow: +inf (true values from 2.4e38) */
            bad += !(y[i] == INFINITY);
            continue;
        }
        const double want = exp2((double)x);
        const double e = fabs((double)y[i] - want) / want, em = fabs((double)ymu[i] - want) / want;
        if (!(e <= 2.5e-7)) ++bad;
        worst = std::max(worst, e);
        if (x >= -125.0f && x < 127.0f) worst_mufu = std::max(worst_mufu, em);
    }
    EXPECT(bad == 0, "%d values off (worst relative error %.3g; ex2.approx's %.3g)", bad, worst, worst_mufu);

    /* the gradient writer: NPOLY 4 within 2^-8 + 2.5e-7 relative (bf16 rounding) of NPOLY 0 */
    const int V = 8000;
    Case c;
    c.N = 1;
    c.V = V;
    DevBuf xr(V * 2), g0(V * 2), g4(V * 2);
    gen_device(xr.p, c, V, mix64(g_seed + 13));
    const float cc = 1.4426950f, kk = 12.0f;
    /* the two outputs poisoned differently (a NaN, a small finite value), so that an element
     * neither variant wrote cannot pass as equal */
    fill_bits<uint16_t><<<8, 256>>>((uint16_t *)g0.p, V, POISON16);
    fill_bits<uint16_t><<<8, 256>>>((uint16_t *)g4.p, V, PAD16);
    grad_mix_kernel<0><<<1, 256>>>((const __nv_bfloat16 *)xr.p, (__nv_bfloat16 *)g0.p, V, cc, kk);
    grad_mix_kernel<4><<<1, 256>>>((const __nv_bfloat16 *)xr.p, (__nv_bfloat16 *)g4.p, V, cc, kk);
    CK(cudaGetLastError());
    std::vector<uint16_t> h0(V), h4(V);
    CK(cudaMemcpy(h0.data(), g0.p, V * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(h4.data(), g4.p, V * 2, cudaMemcpyDeviceToHost));
    int off = 0, differ = 0;
    for (int j = 0; j < V; ++j) {
        const double a = lf_bf16_to_f32(h0[j]), b = lf_bf16_to_f32(h4[j]);
        differ += h0[j] != h4[j];
        if (!(fabs(a - b) <= (0x1p-7 + 5e-7) * fabs(a) + 1e-37)) ++off;
    }
    EXPECT(off == 0, "%d of %d gradient elements differ by more than one bf16 step (NPOLY 4 vs 0)", off, V);

    /* the statistics sweep: lse and entropy of the row (V = 8000, a multiple of 8: no edges) with
     * NPOLY 4 within fp32 summation error (2^-20 relative) of NPOLY 0 */
    DevBuf so(16);
    float s0[2], s4[2];
    fill_poison(so.p, 4, LF_F32); /* before each variant: an unwritten result is NaN, and fails */
    stats_mix_kernel<0><<<1, 256>>>((const __nv_bfloat16 *)xr.p, V, (float *)so.p);
    CK(cudaGetLastError());
    CK(cudaMemcpy(s0, so.p, 8, cudaMemcpyDeviceToHost));
    fill_poison(so.p, 4, LF_F32);
    stats_mix_kernel<4><<<1, 256>>>((const __nv_bfloat16 *)xr.p, V, (float *)so.p);
    CK(cudaGetLastError());
    CK(cudaMemcpy(s4, so.p, 8, cudaMemcpyDeviceToHost));
    EXPECT(fabs(s4[0] - s0[0]) <= 0x1p-20 * fabs(s0[0]) + 1e-6 && fabs(s4[1] - s0[1]) <= 0x1p-20 * fabs(s0[1]) + 1e-6,
           "statistics with NPOLY 4: lse %.9g entropy %.9g, all-MUFU %.9g %.9g", s4[0], s4[1], s0[0], s0[1]);
    printf("%-4s %s (worst relative error %.3g, ex2.approx %.3g; %d of %d bf16 gradients differ in the last bit)\n",
           bad == 0 && off == 0 ? "ok" : "FAIL", g_case, worst, worst_mufu, differ, V);
}

/* lf_warp_row_pass at batch sizes other than the example's (U = 1, 2, 8: other whole / partial
 * batch splits) against the double reference: lse, entropy and argmax of bf16 rows at awkward V
 * and row phases, with ties (also -0 against +0), -inf entries, an all -inf row, a NaN and a +inf;
 * and with FULL = false (the loss-only path), whose lse must be FULL's to the bit (the same sums in
 * the same order). One warp per row, 2 warps per CTA. */
template <int U, bool FULL>
__global__ void warp_pass_kernel(const __nv_bfloat16 *x, int64_t V, int64_t stride, int N, float *lse, float *ent, int *am)
{
    const int row = (int)((blockIdx.x * (int64_t)blockDim.x + threadIdx.x) / 32);
    if (row >= N) return;
    const lf_xform t = lf_xform_make(1.0f, 0.0f);
    const lf_row_stats st = lf_warp_row_pass<__nv_bfloat16, FULL, false, U>(x + (int64_t)row * stride, V, t, NULL, false);
    if ((threadIdx.x & 31) == 0) {
        lse[row] = lf_lse_final(st.lse);
        ent[row] = FULL ? lf_lse_entropy(st.lse) : 0.0f;
        am[row] = FULL ? st.am.i : -1;
    }
}

static void test_warp_pass(void)
{
    const int64_t Vs[] = {1, 5, 9, 255, 256, 257, 1000, 4097, 40000};
    for (int64_t V : Vs)
        for (int64_t pad : {(int64_t)0, (int64_t)3}) {
            snprintf(g_case, sizeof g_case, "lf_warp_row_pass U=1,2,8 V=%lld stride+%lld bf16", (long long)V, (long long)pad);
            const int N = 12;
            const int64_t stride = V + pad;
            DevBuf x((size_t)N * stride * 2 + 16);
            gen_logits<__nv_bfloat16><<<64, 256>>>((__nv_bfloat16 *)x.p, N, V, stride, g_seed + V * 7 + pad, 40.0f);
            CK(cudaGetLastError());
            /* row 1: ties of the maximum at four places; row 2: every third entry -inf; row 3: all -inf;
             * row 4: a NaN; row 5: a +inf; row 6: constant; row 7: all -1 but -0 at V/3 and +0 at
             * 2V/3 (a tie: the first wins) */
            std::vector<uint16_t> h((size_t)N * stride);
            CK(cudaMemcpy(h.data(), x.p, h.size() * 2, cudaMemcpyDeviceToHost));
            auto at = [&](int64_t i, int64_t j) -> uint16_t & { return h[(size_t)(i * stride + j)]; };
            for (int64_t j : {V - 1, V / 2, V / 3, std::min<int64_t>(17, V - 1)}) at(1, j) = lf_f32_to_bf16(60.0f);
            for (int64_t j = 0; j < V; ++j) {
                if (j % 3 == 0) at(2, j) = lf_f32_to_bf16(-INFINITY);
                at(3, j) = lf_f32_to_bf16(-INFINITY);
                at(6, j) = lf_f32_to_bf16(0.25f);
                at(7, j) = lf_f32_to_bf16(-1.0f);
            }
            at(7, V / 3) = lf_f32_to_bf16(-0.0f);
            at(7, (2 * V) / 3) = lf_f32_to_bf16(0.0f);
            at(4, V / 2) = lf_f32_to_bf16(NAN);
            at(5, (V * 2) / 3) = lf_f32_to_bf16(INFINITY);
            CK(cudaMemcpy(x.p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
            DevBuf lse(N * 4), ent(N * 4), am(N * 4);
            std::vector<float> lse_u2(N); /* variant 1's lse: variant 3 must give the same bits */
            for (int variant = 0; variant < 4; ++variant) {
                for (DevBuf *b : {&lse, &ent, &am}) fill_poison(b->p, N, LF_F32);
                const __nv_bfloat16 *xp = (const __nv_bfloat16 *)x.p;
                float *lp = (float *)lse.p, *ep = (float *)ent.p;
                int *ap = (int *)am.p;
                if (variant == 0) warp_pass_kernel<1, true><<<(N + 1) / 2, 64>>>(xp, V, stride, N, lp, ep, ap);
                if (variant == 1) warp_pass_kernel<2, true><<<(N + 1) / 2, 64>>>(xp, V, stride, N, lp, ep, ap);
                if (variant == 2) warp_pass_kernel<8, true><<<(N + 1) / 2, 64>>>(xp, V, stride, N, lp, ep, ap);
                if (variant == 3) warp_pass_kernel<2, false><<<(N + 1) / 2, 64>>>(xp, V, stride, N, lp, ep, ap);
                CK(cudaGetLastError());
                CK(cudaDeviceSynchronize());
                std::vector<float> lh(N), eh(N);
                std::vector<int> ah(N);
                CK(cudaMemcpy(lh.data(), lse.p, N * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(eh.data(), ent.p, N * 4, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(ah.data(), am.p, N * 4, cudaMemcpyDeviceToHost));
                const lf_ce_opts o = lf_ce_opts_default();
                std::vector<float> xr(V);
                for (int i = 0; i < N; ++i) {
                    for (int64_t j = 0; j < V; ++j) xr[j] = lf_bf16_to_f32(h[(size_t)i * stride + j]);
                    const lf_ce_row r = lf_ref_ce_row(xr.data(), V, 0, &o, NULL);
                    double zmax = 0.0;
                    for (int64_t j = 0; j < V; ++j)
                        if (fabs((double)xr[j]) < INFINITY) zmax = fmax(zmax, fabs((double)xr[j]));
                    const double lsea = fabs(r.lse) < INFINITY ? fabs(r.lse) : 0.0;
                    /* as run_case: fp32 exponent arguments and sums, relative to the row's magnitudes */
                    const double tol = 0x1p-20 * (1.0 + lsea + zmax + log((double)V + 1.0));
                    uint32_t lb;
                    memcpy(&lb, &lh[i], 4);
                    EXPECT(lb != POISON32, "variant %d row %d: lse not written", variant, i);
                    EXPECT(close(lh[i], r.lse, tol), "variant %d row %d lse %.9g want %.9g", variant, i, lh[i], r.lse);
                    if (variant == 1) lse_u2[i] = lh[i];
                    if (variant == 3) {
                        /* the same sums in the same order, but where FULL's rescale also feeds u the
                         * compiler does not fuse a * s + sum into one FMA: s an ulp or two apart, so
                         * lse = m + log s a few ulps of 1 apart in absolute terms (also where lse
                         * itself is near 0: seen on an H100, 6e-8 at lse = 0.048) */
                        EXPECT(close(lh[i], lse_u2[i], 0x1p-21 * (1.0 + fabs((double)lse_u2[i]))), "row %d: FULL = false lse %.9g, FULL %.9g (U = 2)",
                               i, lh[i], lse_u2[i]);
                        continue;
                    }
                    EXPECT(close(eh[i], r.entropy, 1e-5 * fabs(r.entropy) + tol), "variant %d row %d entropy %.9g want %.9g",
                           variant, i, eh[i], r.entropy);
                    EXPECT(ah[i] == r.argmax, "variant %d row %d argmax %d want %lld", variant, i, ah[i], (long long)r.argmax);
                }
            }
            printf("%-4s %s\n", "ok", g_case);
        }
}

/* A captured graph replays to the same bits as the eager launch (the completion counter resets). */
static void test_graph(void)
{
    snprintf(g_case, sizeof g_case, "graph capture + replay");
    const int64_t N = g_small ? 33 : 1024, V = g_small ? 3001 : 50257;
    Case c;
    c.N = N;
    c.V = V;
    DevBuf x(N * V * 2), g(N * V * 2), y(N * 8), l(4), ws(ce_workspace_bytes(N));
    gen_device(x.p, c, V, mix64(g_seed + 99));
    std::vector<int64_t> yh(N);
    uint64_t rs = g_seed + 5;
    for (auto &v : yh) v = (int64_t)(rng_u(&rs) * V);
    CK(cudaMemcpy(y.p, yh.data(), N * 8, cudaMemcpyHostToDevice));
    CK(cudaMemset(ws.p, 0, ws.bytes));
    ce_args a = ce_args_default();
    a.logits = x.p;
    a.n_rows = N;
    a.vocab = V;
    a.stride = V;
    a.labels = y.p;
    a.labels_i64 = 1;
    a.loss = (float *)l.p;
    a.grad = g.p;
    a.grad_stride = V;
    a.opts.label_smoothing = 0.05f;
    a.workspace = ws.p;
    a.workspace_bytes = ws.bytes;
    cudaError_t ce;
    EXPECT(ce_launch(&a, 0, &ce) == LF_OK, "eager launch");
    CK(cudaDeviceSynchronize());
    float l0;
    CK(cudaMemcpy(&l0, l.p, 4, cudaMemcpyDeviceToHost));
    const unsigned long long h0 = device_checksum(g.p, N * V * 2);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    const lf_status st = ce_launch(&a, s, &ce);
    CK(cudaStreamEndCapture(s, &graph));
    EXPECT(st == LF_OK, "launch under capture: %s", cudaGetErrorString(ce));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 3; ++r) {
        CK(cudaMemset(g.p, 0xff, N * V * 2));
        fill_poison(l.p, 1, LF_F32); /* written by the replay's last CTA only: a stale count would leave it */
        CK(cudaDeviceSynchronize());  /* (the poison, on the default stream, lands before the replay on s) */
        CK(cudaGraphLaunch(exec, s));
        CK(cudaStreamSynchronize(s));
        float l1;
        CK(cudaMemcpy(&l1, l.p, 4, cudaMemcpyDeviceToHost));
        EXPECT(memcmp(&l0, &l1, 4) == 0, "replay %d loss %.9g vs eager %.9g", r, l1, l0);
        EXPECT(device_checksum(g.p, N * V * 2) == h0, "replay %d gradient differs from eager", r);
    }
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaStreamDestroy(s));
    printf("%-4s %s\n", "ok", g_case);
}

/* ---------------------------------------------------------------- the header's quick start -- */

/* The header's quick start (lossfuse_cuda.cuh, its top doc comment) and section 6's usage
 * kernel, as the doc comments write them (keep them the same): the row's lse, forward only;
 * cross-entropy forward + backward of bf16 logits, one CTA per row, the row staged once, the
 * gradient in place. Run here against lf_ref_ce_row, so that the patterns the header teaches
 * are tested, not only compiled. (row_ce's barrier before the label's patch orders another
 * thread's dense write of y before it: a race on global memory that no check here can catch
 * for certain, nor racecheck, which watches shared memory.) */
__global__ void row_lse(const __nv_bfloat16 *x, int64_t V, int64_t stride, float *out)
{
    extern __shared__ uint4 buf[];
    __shared__ lf_row_stats red[256 / 32];
    const __nv_bfloat16 *row = x + blockIdx.x * stride;
    const lf_row_span sp = lf_row_span_make(row, V);
    const lf_xform t = lf_xform_make(1.0f, 0.0f);
    lf_piece_load<256>(buf, row, sp, 0, sp.nvec);
    lf_cp_async_commit();
    const lf_edge e = lf_row_edge_load(row, sp);
    lf_cp_async_wait<0>();
    lf_row_stats st = lf_row_stats_init();
    lf_edge_stats<false, false>(st, e, t, NULL);
    lf_piece_stats<256, __nv_bfloat16, false, false>(st, buf, sp, 0, sp.nvec, t, NULL);
    st = lf_block_row_stats<256>(st, red);
    if (threadIdx.x == 0) out[blockIdx.x] = lf_lse_final(st.lse);
}

typedef __nv_bfloat16 bf;
__global__ void row_ce(bf *x, const int64_t *labels, int64_t V, float *loss)
{
    extern __shared__ uint4 buf[];
    __shared__ lf_row_stats red[256 / 32];
    bf *row = x + blockIdx.x * V;
    const int64_t y = labels[blockIdx.x];
    const float x_y = lf_elem<bf>::to_f32(row[y]); // before any thread overwrites it
    const lf_row_span sp = lf_row_span_make(row, V);
    const lf_xform t = lf_xform_make(1.0f, 0.0f);
    lf_piece_load<256>(buf, row, sp, 0, sp.nvec);
    lf_cp_async_commit();
    const lf_edge e = lf_row_edge_load(row, sp);
    lf_cp_async_wait<0>();
    lf_row_stats st = lf_row_stats_init();
    lf_edge_stats<false, false>(st, e, t, NULL);
    lf_piece_stats<256, bf, false, false>(st, buf, sp, 0, sp.nvec, t, NULL);
    st = lf_block_row_stats<256>(st, red); // a barrier: every x_y is read
    const float lse = lf_lse_final(st.lse);
    const lf_grad_coef c = lf_grad_coef_make(1.0f, lse, 0.0f, 0.0f, 1.0f, (float)V, V, t);
    lf_piece_grad_store<256, false, false>(row, true, buf, sp, 0, sp.nvec, c, t, NULL);
    lf_edge_grad_store<false, false>(row, e, c, t, NULL);
    __syncthreads(); // the dense write of y, then its patch
    if (threadIdx.x == 0) {
        row[y] = lf_elem<bf>::from_f32(lf_ce_label_grad<false, false>(x_y, (int32_t)y, c, t, NULL));
        loss[blockIdx.x] = lse - x_y;
    }
}

/* Eight rows of V in {1, 7, 1000, 4099, 65536} (V = 4099: rows at all eight alignments, so the
 * edge forms run), labels drawn in [0, V) with rows whose label is the first or last column,
 * logits as the sweep's (1% strong candidates, 0.01% outliers in [-12, 28)). Every row checked:
 * row_lse's lse and row_ce's loss within 1e-5
 * relative + 2^-20 (1 + |lse| + max |z| + log V) (row_tol_abs's bound), each gradient element
 * within bf16's rounding (2^-8 relative) plus 2^-20 (p_j + [j = y]) (1 + |lse| + max |z|) and
 * EX2's flush (2^-125). The loss is poisoned first; the gradient overwrites the logits, so an
 * element not written keeps a logit, far off the reference. */
static void test_quickstart(void)
{
    const int64_t Vs[5] = {1, 7, 1000, 4099, 65536};
    const int64_t N = 8;
    CK(cudaFuncSetAttribute(row_ce, cudaFuncAttributeMaxDynamicSharedMemorySize, 16 * (65536 / 8 + 1)));
    CK(cudaFuncSetAttribute(row_lse, cudaFuncAttributeMaxDynamicSharedMemorySize, 16 * (65536 / 8 + 1)));
    for (int vi = 0; vi < (g_small ? 4 : 5); ++vi) {
        const int64_t V = Vs[vi];
        snprintf(g_case, sizeof g_case, "quickstart row_lse + row_ce V=%lld", (long long)V);
        if (!only_match(g_case)) continue;
        DevBuf x(N * V * 2), lab(N * 8), l(N * 4), ls(N * 4);
        gen_logits<bf><<<2048, 256>>>((bf *)x.p, N, V, V, mix64(g_seed + 700 + vi), 40.0f);
        CK(cudaGetLastError());
        std::vector<int64_t> hy(N);
        uint64_t rs = mix64(g_seed + 710 + vi);
        for (int64_t i = 0; i < N; ++i) hy[i] = i == 0 ? 0 : i == 1 ? V - 1 : (int64_t)(rng_u(&rs) * (double)V) % V;
        CK(cudaMemcpy(lab.p, hy.data(), N * 8, cudaMemcpyHostToDevice));
        fill_poison(l.p, N, LF_F32);
        fill_poison(ls.p, N, LF_F32);
        std::vector<uint16_t> hx(N * V), hg(N * V);
        std::vector<float> hl(N), hlse(N);
        CK(cudaMemcpy(hx.data(), x.p, N * V * 2, cudaMemcpyDeviceToHost));
        row_lse<<<(unsigned)N, 256, (size_t)(16 * (V / 8 + 1))>>>((const bf *)x.p, V, V, (float *)ls.p);
        CK(cudaGetLastError());
        row_ce<<<(unsigned)N, 256, (size_t)(16 * (V / 8 + 1))>>>((bf *)x.p, (const int64_t *)lab.p, V, (float *)l.p);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hg.data(), x.p, N * V * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hl.data(), l.p, N * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hlse.data(), ls.p, N * 4, cudaMemcpyDeviceToHost));
        const lf_ce_opts o = lf_ce_opts_default();
        std::vector<float> xr(V);
        std::vector<double> dx(V);
        for (int64_t i = 0; i < N; ++i) {
            double zmax = 0.0;
            for (int64_t j = 0; j < V; ++j) {
                xr[j] = lf_bf16_to_f32(hx[i * V + j]);
                zmax = fmax(zmax, fabs(xr[j]));
            }
            const lf_ce_row r = lf_ref_ce_row(xr.data(), V, hy[i], &o, dx.data());
            const double mag = 1.0 + fabs(r.lse) + zmax;
            const double tl = 1e-5 * fabs(r.loss) + 0x1p-20 * (mag + log((double)V + 1.0));
            EXPECT(close(hl[i], r.loss, tl), "row %lld loss %.9g want %.9g (tol %.3g)", (long long)i, hl[i], r.loss, tl);
            const double tlse = 1e-5 * fabs(r.lse) + 0x1p-20 * (mag + log((double)V + 1.0));
            EXPECT(close(hlse[i], r.lse, tlse), "row %lld row_lse %.9g want %.9g (tol %.3g)", (long long)i, hlse[i], r.lse, tlse);
            int bad = 0;
            for (int64_t j = 0; j < V; ++j) {
                const double pj = exp((double)xr[j] - r.lse);
                const double g = lf_bf16_to_f32(hg[i * V + j]), want = dx[j];
                const double tol = 0x1p-8 * fabs(want) + 0x1p-20 * (pj + (j == hy[i])) * mag + 0x1p-125;
                if (!close(g, want, tol) && ++bad == 1)
                    EXPECT(false, "row %lld j=%lld (label %lld) gradient %.9g want %.9g (tol %.3g)", (long long)i, (long long)j,
                           (long long)hy[i], g, want, tol);
            }
            EXPECT(bad == 0, "row %lld: %d gradient elements off", (long long)i, bad);
        }
        printf("%-4s %s\n", "ok", g_case);
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
        printf("test_ce_gpu: no CUDA device, skipped\n");
        return 77;
    }
    if (!g_seed) g_seed = (uint64_t)time(NULL);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    g_cc_major = prop.major;
    printf("test_ce_gpu on %s (sm_%d%d), seed %llu%s\n", prop.name, prop.major, prop.minor, (unsigned long long)g_seed,
           g_small ? ", small sizes" : "");

    test_arguments();
    test_quickstart();
    test_ex2_fma();
    test_warp_pass();
    test_graph();

    const lf_dtype dts[3] = {LF_BF16, LF_F16, LF_F32};
    const int64_t Vs_full[] = {1, 7, 31, 1000, 32000, 32768, 50257, 128256, 151936, 262144};
    const int64_t Vs_small[] = {1, 7, 31, 1000, 3001, 16385};
    const int64_t Ns_full[] = {1, 3, 4096};
    const int64_t Ns_small[] = {1, 3, 37};
    const int64_t *Vs = g_small ? Vs_small : Vs_full, *Ns = g_small ? Ns_small : Ns_full;
    const int nV = g_small ? 6 : 10;

    /* Sweep: every V x N x dtype. N = 4096 runs the plain fused path (no extra statistics) into a
     * separate poisoned buffer; N = 3 the full path (smoothing, z-loss, statistics, bad labels);
     * N = 1 in place with reduction none and a per-row upstream gradient; forward-only statistics
     * of 1000 rows. Then the full, the plain and the forward path again on the schedule the
     * automatic plan did not take (sm_90): streamed where it chose the row-resident one (a
     * gradient, rows of 8 KB or more), resident where it streamed; and the forward path on the
     * warp-per-row schedule (any GPU; the automatic plan takes it from CE_WARP_MIN_ROWS_PER_SM
     * rows per SM, so the first forward pass is forced streamed). */
    for (lf_dtype dt : dts)
        for (int vi = 0; vi < nV; ++vi)
            for (int ni = 0; ni < 8; ++ni) {
                Case c;
                /* 4: as 1 (full), 5: as 2 (plain), 6: as 3 (forward), 7: forward by warps */
                const int nj = ni == 7 ? 3 : ni >= 4 ? ni - 3 : ni;
                if (ni == 7) {
                    c.schedule = CE_SCHED_WARP;
                } else if (ni >= 4) {
                    if (g_cc_major < 9) continue; /* everything is streamed there already */
                    const bool auto_resident = nj != 3 && (double)Vs[vi] * lf_dtype_size(dt) >= CE_RES_MIN_SLICE;
                    c.schedule = auto_resident ? CE_SCHED_STREAM : CE_SCHED_RESIDENT;
                }
                c.name = nj == 3 ? "sweep forward stats" : nj == 2 ? "sweep plain" : nj == 1 ? "sweep full" : "sweep in-place none";
                c.dt = dt;
                c.V = Vs[vi];
                c.N = nj == 3 ? (g_small ? 300 : 1000) : Ns[nj];
                if (nj == 3) {
                    /* forward only, several rows per CTA: the deferred row merge (streamed: on a GPU
                     * of fewer SMs the automatic plan would take warps here) */
                    if (ni == 3) c.schedule = CE_SCHED_STREAM;
                    c.grad = 0;
                    c.stats = true;
                    c.red = LF_REDUCE_NONE;
                    c.plant_ties = true;
                    c.bad_frac = 0.05;
                } else if (nj == 1) {
                    c.eps = 0.1f;
                    c.lam = 1e-4f;
                    c.stats = true;
                    c.bad_frac = 0.3;
                    c.lab64 = 0;
                } else if (nj == 0) {
                    c.grad = 2;
                    c.red = LF_REDUCE_NONE;
                    c.dloss = true;
                    c.ignore_frac = 0.0;
                    c.plant_big = true;
                }
                run_case(c);
            }

    /* Options one at a time and together, at three vocabularies, every dtype, on the automatic plan
     * and (sm_90) again on the other schedule: the smallest V forced row-resident, the others forced
     * streamed (one CTA, a 3-CTA cluster, a 10-CTA cluster); then the forward-only cases once more
     * on the warp-per-row schedule (any GPU). */
    const int64_t Vo_full[3] = {1000, 50257, 151936}, Vo_small[3] = {1000, 3001, 16385};
    for (int pass = 0; pass < 3; ++pass)
    for (lf_dtype dt : dts)
        for (int vi = 0; vi < 3; ++vi) {
            if (pass == 1 && g_cc_major < 9) continue;
            Case b;
            if (pass == 1) b.schedule = vi == 0 ? CE_SCHED_RESIDENT : CE_SCHED_STREAM;
            if (pass == 2) b.schedule = CE_SCHED_WARP;
            /* the warp pass runs the forward-only cases (with a gradient it is an argument error) */
            auto run = [&](const Case &c) {
                if (pass < 2 || c.grad == 0) run_case(c);
            };
            b.dt = dt;
            b.V = g_small ? Vo_small[vi] : Vo_full[vi];
            b.N = g_small ? 9 : 67;
            b.check_all = true;
            Case c;
            c = b; c.name = "softcap 30"; c.cap = 30.0f; c.stats = true; run(c);
            c = b; c.name = "logit scale 0.7"; c.scale = 0.7f; run(c);
            c = b; c.name = "softcap + scale 1.5 in place"; c.cap = 15.0f; c.scale = 1.5f; c.grad = 2; run(c);
            c = b; c.name = "class weights"; c.weights = true; run(c);
            c = b; c.name = "weights + smoothing 0.2"; c.weights = true; c.eps = 0.2f; run(c);
            c = b; c.name = "z-loss 1e-3 sum dloss"; c.lam = 1e-3f; c.red = LF_REDUCE_SUM; c.dloss = true; c.grad_scale = 2.0f; run(c);
            c = b; c.name = "mean device divisor"; c.dev_divisor = true; run(c);
            c = b; c.name = "none per-row dloss"; c.red = LF_REDUCE_NONE; c.dloss = true; run(c);
            c = b; c.name = "sum, negative dloss, in place"; c.red = LF_REDUCE_SUM; c.dloss = true; c.dloss_neg = true; c.grad = 2; run(c);
            c = b; c.name = "int32 labels, stride+5 in place"; c.lab64 = 0; c.pad = 5; c.grad = 2; run(c);
            c = b; c.name = "grad stride+3 (phase differs)"; c.pad = 2; c.gpad = 3; run(c);
            c = b; c.name = "forward only stats + softcap"; c.grad = 0; c.stats = true; c.cap = 20.0f; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "forward only stats, ties"; c.grad = 0; c.stats = true; c.plant_ties = true; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "forward only, smoothing, z-loss, mean"; c.grad = 0; c.eps = 0.1f; c.lam = 1e-4f; run(c);
            c = b; c.name = "forward only stats, stride+5, int32 labels"; c.grad = 0; c.stats = true; c.pad = 5; c.lab64 = 0; c.red = LF_REDUCE_NONE; c.plant_ties = true; run(c);
            c = b; c.name = "forward only weights + smoothing, softcap, sum"; c.grad = 0; c.weights = true; c.eps = 0.2f; c.cap = 25.0f; c.red = LF_REDUCE_SUM; c.pad = 3; run(c);
            c = b; c.name = "forward only, huge logits 1e4, all options"; c.grad = 0; c.stats = true; c.outlier = 1e4f; c.eps = 0.1f; c.lam = 1e-4f; c.scale = 0.7f; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "forward only class weights"; c.grad = 0; c.weights = true; c.stats = true; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "forward only smoothing + softcap"; c.grad = 0; c.eps = 0.1f; c.cap = 20.0f; c.stats = true; run(c);
            c = b; c.name = "forward only -inf masks, NaN rows"; c.grad = 0; c.stats = true; c.plant_masks = true; c.plant_nonfinite = true; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "forward only clusters of 3"; c.grad = 0; c.stats = true; c.max_cluster = 3; c.plant_ties = true; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "ties, fused, entropy"; c.stats = true; c.plant_ties = true; run(c);
            c = b; c.name = "huge logits 1e4"; c.outlier = 1e4f; c.stats = true; c.plant_big = true; run(c);
            c = b; c.name = "large maxima at the label, none"; c.plant_big = true; c.stats = true; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "large maxima, weights, z-loss, in place"; c.plant_big = true; c.weights = true; c.lam = 1e-4f; c.grad = 2; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "large maxima, scale 0.5"; c.plant_big = true; c.scale = 0.5f; c.stats = true; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "forward only, large maxima, stats"; c.grad = 0; c.plant_big = true; c.stats = true; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "forward only, large maxima, clusters of 3"; c.grad = 0; c.plant_big = true; c.max_cluster = 3; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "forward only, large maxima, weights"; c.grad = 0; c.plant_big = true; c.weights = true; c.stats = true; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "-inf masks"; c.plant_masks = true; c.stats = true; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "finfo.min entries, stats"; c.plant_fmin = true; c.stats = true; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "finfo.min entries, fast path, in place"; c.plant_fmin = true; c.grad = 2; run(c);
            c = b; c.name = "finfo.min entries, forward only"; c.grad = 0; c.plant_fmin = true; c.stats = true; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "-inf masks + smoothing"; c.plant_masks = true; c.eps = 0.1f; run(c);
            c = b; c.name = "NaN and +inf rows"; c.plant_nonfinite = true; c.stats = true; c.red = LF_REDUCE_NONE; run(c);
            c = b; c.name = "NaN rows, mean"; c.plant_nonfinite = true; run(c);
            c = b; c.name = "no clusters (re-read)"; c.max_cluster = 1; c.eps = 0.05f; run(c);
            c = b; c.name = "cluster of 3"; c.max_cluster = 3; c.stats = true; run(c);
            c = b; c.name = "all ignored"; c.ignore_frac = 1.0; c.stats = true; run(c);
            c = b; c.name = "bad labels"; c.bad_frac = 0.5; c.grad = 2; run(c);
        }

    /* Launch plans at V = 256K: streamed without clusters (16 pieces re-read), clusters of 3 (each
     * CTA streams 6 pieces), clusters of 16 (each row read once, 16 CTAs merging over DSMEM). */
    if (!g_small) {
        const int mcs[3] = {1, 3, 16}, pieces[3] = {16, 6, 1};
        for (int k = 0; k < 3; ++k) {
            Case c;
            c.name = k == 0 ? "V=256K without clusters" : k == 1 ? "V=256K clusters of 3" : "V=256K clusters of 16";
            c.N = 512;
            c.V = 262144;
            c.schedule = CE_SCHED_STREAM;
            c.max_cluster = mcs[k];
            c.expect_cluster = mcs[k];
            c.expect_pieces = pieces[k];
            c.eps = 0.1f;
            c.stats = k == 1;
            run_case(c);
        }
        /* automatic plans (sm_90, bf16): row-resident, each row read once; V = 32K one CTA per row
         * with three 64 KB stages; wider rows on clusters (their size depends on how the chip's
         * GPCs pack: see ce_launch_resident) */
        const int64_t Va[3] = {32768, 151936, 262144};
        for (int k = 0; k < 3; ++k) {
            Case c;
            c.name = "automatic plan";
            c.N = 1000;
            c.V = Va[k];
            c.expect_schedule = CE_SCHED_RESIDENT;
            c.expect_cluster = k == 0 ? 1 : 0;
            c.expect_pieces = 1;
            c.expect_stages = k == 0 ? 3 : 0;
            run_case(c);
        }
        /* forward only over many rows: one warp per row (lf_warp_row_pass) */
        {
            Case c;
            c.name = "automatic plan, forward stats";
            c.N = 4096;
            c.V = 32768;
            c.grad = 0;
            c.stats = true;
            c.red = LF_REDUCE_NONE;
            c.plant_ties = true;
            c.expect_schedule = CE_SCHED_WARP;
            run_case(c);
        }
        Case c;
        c.name = "V=32K clusters of 2 (each row read once)";
        c.N = 1000;
        c.V = 32768;
        c.schedule = CE_SCHED_STREAM;
        c.max_cluster = 2;
        c.expect_cluster = 2;
        c.expect_pieces = 1;
        run_case(c);
        if (g_cc_major >= 9) {
            /* resident plans off the automatic path: the smallest ring (one stage more than the
             * warp groups) on a 3-CTA cluster, and the largest (8 stages of 16 KB) on clusters of
             * 4, with smoothing and statistics (the full merge over the cluster) */
            c = Case();
            c.name = "resident, clusters of 3, smallest ring";
            c.N = 700;
            c.V = 100000;
            c.schedule = CE_SCHED_RESIDENT;
            c.max_cluster = 3;
            c.stages = CE_RES_GROUPS + 1;
            c.expect_cluster = 3;
            c.expect_stages = CE_RES_GROUPS + 1;
            c.eps = 0.1f;
            c.stats = true;
            c.plant_ties = true;
            c.plant_nonfinite = true;
            run_case(c);
            c = Case();
            c.name = "resident, clusters of 4, 8 stages";
            c.N = 700;
            c.V = 32768;
            c.schedule = CE_SCHED_RESIDENT;
            c.max_cluster = 4;
            c.stages = 8;
            c.expect_cluster = 4;
            c.expect_stages = 8;
            c.lam = 1e-4f;
            c.stats = true;
            c.bad_frac = 0.1;
            run_case(c);
        }
    }

    /* Many tiny rows: each persistent CTA takes > 512 rows, so its label cache (CE_LABEL_CACHE)
     * is refilled several times mid-pipeline; rows checked against the reference, the reduction
     * against the kernel's own per-row losses. */
    {
        Case c;
        c.name = "250000 rows (label cache refills)";
        c.N = 250000;
        c.V = g_small ? 7 : 31;
        c.eps = 0.1f;
        c.bad_frac = 0.01;
        run_case(c);
        c.name = "250000 rows, none, in place";
        c.red = LF_REDUCE_NONE;
        c.grad = 2;
        c.dloss = true;
        run_case(c);
        c.name = "250000 rows, forward stats";
        c.grad = 0;
        c.dloss = false;
        c.stats = true;
        c.plant_ties = true;
        run_case(c); /* automatic: one warp per row */
        c.schedule = CE_SCHED_STREAM;
        run_case(c);
        c.schedule = CE_SCHED_AUTO;
        if (g_cc_major >= 9) { /* the resident ring cycled ~2000 times per CTA, the labels loaded ahead */
            c.name = "250000 rows";
            c.schedule = CE_SCHED_RESIDENT;
            c.grad = 2;
            c.red = LF_REDUCE_NONE;
            c.dloss = true;
            c.stats = false;
            c.plant_ties = false;
            run_case(c);
            c.grad = 0;
            c.dloss = false;
            c.stats = true;
            c.plant_ties = true;
            c.name = "250000 rows, forward stats";
            run_case(c);
        }
    }

    /* Determinism: bit-identical loss and gradient across runs. */
    {
        Case c;
        c.name = "determinism";
        c.N = g_small ? 50 : 4096;
        c.V = g_small ? 16385 : 32768;
        c.determinism = true;
        c.eps = 0.1f;
        run_case(c);
        c.N = g_small ? 20 : 512;
        c.V = g_small ? 3001 : 262144;
        c.grad = 2;
        c.name = "determinism in place, clusters";
        run_case(c);
        c.max_cluster = 1;
        c.V = g_small ? 40000 : 151936;
        c.schedule = CE_SCHED_STREAM;
        c.name = "determinism in place, re-read";
        run_case(c);
    }

    /* The row-resident schedule's dynamic rows (sm_90), rows of one CTA and rows split over a
     * cluster (rank 0 draws and hands the row to its peers with the exchange; an ignored row still
     * exchanges): the same bits as a fixed share (run_case's determinism check relaunches the
     * other way); fewer rows than CTAs or clusters; NaN and +inf rows (the order-free sum's NaN
     * count); every row ignored (every row an exchange without statistics); bad labels; z-loss
     * with sum; reduction none (the row counter must still be reset); statistics and smoothing
     * (the full merge). */
    for (int cl = 0; cl < 2; ++cl) {
        Case c;
        c.name = case_name("dynamic rows", cl, "z-loss, sum");
        c.N = g_small ? 300 : 5000;
        c.V = cl ? (g_small ? 40000 : 151936) : (g_small ? 16385 : 32768);
        c.lam = 1e-3f;
        c.red = LF_REDUCE_SUM;
        c.determinism = true;
        c.expect_schedule = CE_SCHED_RESIDENT;
        c.expect_dynamic = 1;
        run_case(c);
        c.name = case_name("dynamic rows", cl, "fewer rows than SMs, NaN rows");
        c.N = 7;
        c.plant_nonfinite = true;
        c.check_all = true;
        run_case(c);
        c.name = case_name("dynamic rows", cl, "all ignored, mean");
        c.N = g_small ? 200 : 3000;
        c.plant_nonfinite = false;
        c.ignore_frac = 1.0;
        c.red = LF_REDUCE_MEAN;
        run_case(c);
        c.name = case_name("dynamic rows", cl, "reduction none, in place, bad labels");
        c.ignore_frac = 0.05;
        c.bad_frac = 0.1;
        c.red = LF_REDUCE_NONE;
        c.grad = 2;
        run_case(c);
        /* ignore_index == V end to end: ignored rows, bad labels counted, the mean's divisor. On
         * clusters the peers take ce_next_label's V + 1 branch for a bad label; a peer uses only
         * whether the row is masked, so this case would not see that branch return the ignore
         * index instead (it would see one return a label in [0, V)) */
        c.name = case_name("dynamic rows", cl, "ignore_index V, bad labels, mean");
        c.ignore_index = c.V;
        c.red = LF_REDUCE_MEAN;
        c.grad = 1;
        c.stats = true;
        run_case(c);
        c.ignore_index = -100;
        c.name = case_name("dynamic rows", cl, "smoothing, statistics, ties");
        c.bad_frac = 0.0;
        c.red = LF_REDUCE_MEAN;
        c.grad = 1;
        c.eps = 0.1f;
        c.stats = true;
        c.plant_ties = true;
        c.ignore_frac = 0.3;
        run_case(c);
        c.name = case_name("dynamic rows", cl, "off: static rows forced, mean");
        c.eps = 0.0f;
        c.stats = false;
        c.plant_ties = false;
        c.ignore_frac = 0.05;
        c.static_rows = 1;
        c.expect_dynamic = 0;
        run_case(c);
    }
    if (!g_small) { /* fp32 rows of 1 MB: the largest clusters (14-16 CTAs, as the chip's GPCs allow) */
        Case c;
        c.name = "dynamic rows, fp32 V=256K, the largest clusters";
        c.dt = LF_F32;
        c.N = 300;
        c.V = 262144;
        c.determinism = true;
        c.expect_schedule = CE_SCHED_RESIDENT;
        c.expect_dynamic = 1;
        run_case(c);
    }

    /* The warp-per-row schedule off the automatic path: fewer rows than warps (1, 3, 7 rows of
     * 256K: one warp streams a whole long row; V = 5 and 1: rows shorter than a vector), in every
     * dtype; the forward loss reduced deterministically (same bits run to run). */
    for (lf_dtype dt : dts)
        for (int64_t n : {(int64_t)1, (int64_t)3, (int64_t)7}) {
            Case c;
            c.name = "warp, few rows";
            c.schedule = CE_SCHED_WARP;
            c.dt = dt;
            c.N = n;
            c.V = g_small ? 40000 : 262144;
            c.grad = 0;
            c.stats = true;
            c.red = LF_REDUCE_NONE;
            c.plant_ties = n >= 6;
            c.plant_nonfinite = n >= 3;
            c.ignore_frac = 0.0;
            run_case(c);
            c.V = n == 7 ? 1 : 5;
            c.plant_nonfinite = false;
            c.pad = 1;
            run_case(c);
        }
    {
        Case c;
        c.name = "determinism forward, mean";
        c.schedule = CE_SCHED_WARP;
        c.N = g_small ? 50 : 4096;
        c.V = g_small ? 16385 : 32768;
        c.grad = 0;
        c.eps = 0.1f;
        c.lam = 1e-4f;
        c.determinism = true;
        run_case(c);
    }

    /* The mean's divisor from several CTAs (ce_divisor_ctas: > 4096 rows), with class weights,
     * on the automatic plan (row-resident on sm_90: per-CTA loss sums), run twice on one
     * workspace (the counters reset, the sums in a fixed order). */
    {
        Case c;
        c.name = "mean over several divisor CTAs, class weights";
        c.N = g_small ? 9000 : 12289;
        c.V = g_small ? 4099 : 32768;
        c.weights = true;
        c.grad = 2;
        c.determinism = true;
        run_case(c);
    }

    /* rows x V > 2^31: 64-bit offsets everywhere (4.3 GB of bf16, in place). */
    if (!g_small) {
        Case c;
        c.name = "N*V > 2^31 in place";
        c.N = 8193;
        c.V = 262144;
        c.grad = 2;
        c.eps = 0.1f;
        run_case(c);
        c.name = "N*V > 2^31 forward stats";
        c.grad = 0;
        c.stats = true;
        c.red = LF_REDUCE_NONE;
        run_case(c); /* automatic: one warp per row */
        c.schedule = CE_SCHED_STREAM;
        run_case(c);
    }

    printf("test_ce_gpu: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
