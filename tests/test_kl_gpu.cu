/* tests/test_kl_gpu.cu — GPU tests of examples/kl_distill.cu against the double-precision host
 * references lf_ref_kl_row / lf_ref_kl_row_lq (lossfuse.h section 8).
 *
 *   test_kl_gpu            full suite (V in {1 .. 262144}, N in {1, 3, 4096}, every kind, all
 *                          nine student x teacher dtype pairs, every option, N*V > 2^31,
 *                          determinism, graph replay, bad input)
 *   test_kl_gpu --small    small sizes only, for compute-sanitizer
 *   test_kl_gpu --seed S   reproduce a run (the seed is printed at start)
 *   test_kl_gpu --only W   only the cases whose name contains W (e.g. "sparse")
 * Exit: 0 all passed, 1 a check failed, 77 no CUDA device (meson counts it as skipped).
 *
 * Every output is poisoned before each launch and checked to be written (gradient columns
 * [0, V)) or untouched (padding). The teacher is the student plus uniform noise of width 1.5
 * (close distributions, where the KLs are small and cancellation is the danger), drawn fresh
 * each run from a seeded hash on the device. Tolerances are derived where they are computed.
 */
#define KL_NO_MAIN
#include "examples/kl_distill.cu"

#include "tests/gpu_test.cuh"

/* ---------------------------------------------------------------- data --------------------- */

/* Teacher element (row, col): the student's value at the same place plus noise in
 * [-0.75, 0.75) (noise 0: identical rows); padding columns get plain values. */
template <typename T>
__global__ void gen_teacher(T *t, int64_t N, int64_t V, int64_t t_stride, int64_t s_stride, uint64_t seed_s,
                            uint64_t seed_t, float outlier, float noise)
{
    const int64_t total = N * t_stride;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t row = i / t_stride, col = i % t_stride;
        float v;
        if (col < V) v = gen_value(seed_s, (uint64_t)(row * s_stride + col), outlier) + noise * (unit(mix64(seed_t ^ mix64((uint64_t)i))) - 0.5f);
        else v = gen_value(seed_t, (uint64_t)i, outlier);
        t[i] = lf_elem<T>::from_f32(v);
    }
}

template <typename T>
static void gen_typed(void *x, lf_dtype dt, int64_t N, int64_t V, int64_t stride, uint64_t seed, float outlier)
{
    (void)dt;
    gen_logits<T><<<2048, 256>>>((T *)x, N, V, stride, seed, outlier);
}

static void gen_student(void *x, lf_dtype dt, int64_t N, int64_t V, int64_t stride, uint64_t seed, float outlier)
{
    if (dt == LF_F32) gen_typed<float>(x, dt, N, V, stride, seed, outlier);
    else if (dt == LF_BF16) gen_typed<__nv_bfloat16>(x, dt, N, V, stride, seed, outlier);
    else gen_typed<__half>(x, dt, N, V, stride, seed, outlier);
    CK(cudaGetLastError());
}

static void gen_teacher_any(void *t, lf_dtype dt, int64_t N, int64_t V, int64_t t_stride, int64_t s_stride,
                            uint64_t seed_s, uint64_t seed_t, float outlier, float noise)
{
    if (dt == LF_F32) gen_teacher<float><<<2048, 256>>>((float *)t, N, V, t_stride, s_stride, seed_s, seed_t, outlier, noise);
    else if (dt == LF_BF16)
        gen_teacher<__nv_bfloat16><<<2048, 256>>>((__nv_bfloat16 *)t, N, V, t_stride, s_stride, seed_s, seed_t, outlier, noise);
    else gen_teacher<__half><<<2048, 256>>>((__half *)t, N, V, t_stride, s_stride, seed_s, seed_t, outlier, noise);
    CK(cudaGetLastError());
}

static float host_round(float v, lf_dtype dt)
{
    if (dt == LF_F32) return v;
    return dt == LF_BF16 ? lf_bf16_to_f32(lf_f32_to_bf16(v)) : lf_f16_to_f32(lf_f32_to_f16(v));
}

static void host_put(std::vector<char> &h, int64_t j, float v, lf_dtype dt)
{
    if (dt == LF_F32) ((float *)h.data())[j] = v;
    else ((uint16_t *)h.data())[j] = dt == LF_BF16 ? lf_f32_to_bf16(v) : lf_f32_to_f16(v);
}

/* ---------------------------------------------------------------- one case ----------------- */

struct Case {
    const char *name = "";
    int64_t N = 3, V = 1000, spad = 0, tpad = 0;
    lf_dtype sdt = LF_BF16, tdt = LF_BF16;
    lf_kl_kind kind = LF_KL_FORWARD;
    float beta = 0.5f, tau = 1.0f, cap = 0.0f;
    int tau2 = 0;
    kl_teacher_kind tkind = KL_TEACHER_LOGITS;
    int grad = 1;            /* 0 forward only, 1 separate buffer, 2 in place */
    int64_t gpad = 0;        /* separate buffer: grad stride = V + gpad */
    int64_t t_offset = 0;    /* teacher pointer shifted by this many elements (alignment) */
    bool labels = false;     /* mask through labels (int64 if lab64) with ignore / bad labels */
    int lab64 = 1;
    bool mask = false;       /* mask bytes */
    double ignore_frac = 0.1, bad_frac = 0.0;
    bool weights = false;
    lf_reduction red = LF_REDUCE_MEAN;
    bool dev_divisor = false;
    bool dloss = false;
    float grad_scale = 1.0f;
    bool stats = false;      /* request kl_fwd, kl_rev, ent_s, ent_t */
    bool no_rev = false;     /* with stats: not kl_rev (the soft-target path's forward KL has none) */
    bool no_fwd = false;     /* with stats: neither kl_fwd nor ent_s (the soft-target path's reverse KL has neither) */
    int soft = -1;           /* a sparse teacher on sm_90: the plan must (1) or must not (0) be the soft-target path */
    float noise = 1.5f;      /* teacher = student + noise (0: identical rows) */
    float outlier = 40.0f;
    bool plant_masks = false, plant_nonfinite = false;
    bool plant_fmin = false;   /* rows 0-2: entries at bf16's lowest finite value, as masking with
                                * torch.finfo(bf16).min leaves them: finite, but w log2(e) / tau
                                * overflows to -inf (tau < 1.44) where the fast forms multiply by p = 0 */
    bool plant_spikes = false; /* every row: -100 with one entry in ~300 at -12.3125 (spike - floor
                                * = 126.5 in exp2 units at tau 1: a shift at the floor would hold
                                * a spike's term at 2^126.5, and moving it onto the spike flushes) */
    bool plant_close = false;  /* rows 1 and N-2: both sides' maxima ~8000, 32 apart, at one place */
    bool determinism = false, check_all = false;
    /* a sparse teacher: k >= 0 pairs per row (-1: the dense teacher), the top-k of the
     * generated teacher row as log-softmax, in shuffled order; row stride k + kpad */
    int64_t topk = -1, kpad = 0;
    lf_kl_rest rest = LF_KL_REST_SPREAD;
    bool plant_topk = false; /* rows 0-6: repeated / out-of-range indices, NaN / -inf / +inf lp, no rest mass;
                              * rows 7-8 and (N >= 11) the last two: repeated indices */
    bool plant_deep = false; /* row 0 (k >= 2): a listed pair at lp -150 (its q below fp32's range) where the
                              * student is -inf: still mass there, so +inf for forward KL and soft CE */
    int schedule = KL_SCHED_AUTO, max_cluster = 0, stages = 0;
    int static_rows = 0;     /* resident: 1 = a fixed share of rows per cluster (kl_args.static_rows) */
    int expect_schedule = 0; /* on sm_90: the plan must be this schedule ... */
    int expect_cluster = 0;  /* ... with clusters of this size */
    int expect_dynamic = -1; /* ... handing rows out dynamically (1) or not (0), where resident */
    int side_ctas = 0;       /* kl_args.side_ctas */
    bool side_rest = false;  /* kl_args.side_take_rest: the side CTAs take every row after the rings' first
                              * stages, whatever the order of the grids (under compute-sanitizer too) */
    bool expect_side_auto = false; /* full size, sm_90: side CTAs where kl_launch's rule wants them, checked
                                    * from the device's own figures (memory peak / LF_RING_CTA_BW > the
                                    * clusters' CTAs, SMs left idle) */
};
static int g_cc_major = 0, g_sms = 0;
static double g_peak_bw = 0.0;

static const char *g_only = NULL;

/* The workspace's mean divisor poisoned (NaN) before a launch or replay: a masked or weighted
 * mean without a given divisor must read the one its divisor kernel writes in the same launch,
 * and an unmasked one must not read it at all (its divisor is N): a stale or early read gives
 * NaN. (A synchronous copy: it lands before any launch after it, on any stream.) */
static void poison_ws_divisor(void *ws)
{
    const float qn = NAN;
    CK(cudaMemcpy((char *)ws + offsetof(kl_ws_header, divisor), &qn, 4, cudaMemcpyHostToDevice));
}

static void run_case(const Case &c)
{
    if (g_only && !strstr(c.name, g_only)) return;
    const char *kn[5] = {"fwd", "rev", "jsd", "softce", "tvd"};
    if (c.topk >= 0)
        snprintf(g_case, sizeof g_case, "%s %s N=%lld V=%lld %s, top-%lld %s", c.name, kn[c.kind], (long long)c.N, (long long)c.V,
                 dt_name(c.sdt), (long long)c.topk, c.rest == LF_KL_REST_DROP ? "drop" : "spread");
    else
        snprintf(g_case, sizeof g_case, "%s %s N=%lld V=%lld %s/%s", c.name, kn[c.kind], (long long)c.N, (long long)c.V,
                 dt_name(c.sdt), dt_name(c.tdt));
    const int fails_before = g_fail;
    double grad_worst = 0.0; /* the largest finite |g - want| / tol of the gradients checked (printed) */
    uint64_t rs = g_seed ^ mix64((uint64_t)c.N * 1315423911ull + (uint64_t)c.V * 2654435761ull + (uint64_t)c.kind * 97 +
                                 (uint64_t)c.sdt * 7 + (uint64_t)c.tdt);
    const uint64_t seed_s = mix64(rs + 7), seed_t = mix64(rs + 11);
    const int64_t N = c.N, V = c.V, ss = V + c.spad, ts = V + c.tpad;
    const int es = lf_dtype_size(c.sdt), et = lf_dtype_size(c.tdt);
    const size_t nel_s = (size_t)N * ss, nel_t = (size_t)N * ts;

    DevBuf xs(nel_s * es), xtb((nel_t + c.t_offset) * et);
    char *xt = (char *)xtb.p + c.t_offset * et;
    gen_student(xs.p, c.sdt, N, V, ss, seed_s, c.outlier);
    gen_teacher_any(xt, c.tdt, N, V, ts, ss, seed_s, seed_t, c.outlier, c.noise);

    /* host copies of every row (what the kernel sees), and the teacher as log-probs / probs */
    std::vector<std::vector<float>> hs(N), ht(N);
    {
        std::vector<char> a((size_t)V * es), b((size_t)V * et);
        for (int64_t i = 0; i < N; ++i) {
            CK(cudaMemcpy(a.data(), (char *)xs.p + (size_t)i * ss * es, V * es, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(b.data(), xt + (size_t)i * ts * et, V * et, cudaMemcpyDeviceToHost));
            hs[i].resize(V);
            ht[i].resize(V);
            for (int64_t j = 0; j < V; ++j) {
                hs[i][j] = elem_to_f32(a.data(), j, c.sdt);
                ht[i][j] = elem_to_f32(b.data(), j, c.tdt);
            }
        }
    }
    std::set<int64_t> planted;
    std::set<int64_t> rewritten; /* rows written from the host copies: a relaunch in place writes them again */
    auto write_row = [&](int64_t i) {
        rewritten.insert(i);
        std::vector<char> a((size_t)V * es), b((size_t)V * et);
        for (int64_t j = 0; j < V; ++j) {
            host_put(a, j, hs[i][j], c.sdt);
            host_put(b, j, ht[i][j], c.tdt);
        }
        CK(cudaMemcpy((char *)xs.p + (size_t)i * ss * es, a.data(), V * es, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(xt + (size_t)i * ts * et, b.data(), V * et, cudaMemcpyHostToDevice));
    };
    const float NINF = -INFINITY;
    if (c.plant_masks && N >= 5) {
        /* row 0: both sides -inf on the last 7 entries and every 5th (vocabulary padding);
         * row 1: the student -inf where the teacher is not (forward KL +inf);
         * row 2: the teacher -inf where the student is not (reverse KL +inf, NaN gradient);
         * row 3: the student all -inf; row 4: the teacher all -inf (no distribution: NaN);
         * rows 5 and 6 (few -inf entries: most threads' units finite, so the fast gradient
         * forms run beside the exact ones in one row): row 5 both sides -inf every 997th entry
         * and on 40 entries from V / 3; row 6 the student -inf every 1009th entry (forward KL
         * +inf; reverse KL and JSD finite, and their gradient there exactly 0) */
        const int64_t nm = N >= 7 ? 7 : 5;
        for (int64_t j = 0; j < V; ++j) {
            if (j % 5 == 0 || j >= V - 7) hs[0][j] = ht[0][j] = NINF;
            if (j % 7 == 3 && j + 1 < V) hs[1][j] = NINF;
            if (j % 6 == 2 && j + 1 < V) ht[2][j] = NINF;
            hs[3][j] = NINF;
            ht[4][j] = NINF;
            if (nm == 7 && (j % 997 == 500 || (j >= V / 3 && j < V / 3 + 40))) hs[5][j] = ht[5][j] = NINF;
            if (nm == 7 && j % 1009 == 17 && j + 1 < V) hs[6][j] = NINF;
        }
        for (int64_t i = 0; i < nm; ++i) {
            write_row(i);
            planted.insert(i);
        }
    }
    if (c.plant_nonfinite && N >= 3) {
        hs[1][V - 1] = NAN;
        ht[2][V / 2] = INFINITY;
        write_row(1);
        write_row(2);
        planted.insert(1);
        planted.insert(2);
    }
    if (c.plant_fmin && N >= 3) {
        /* row 0: both sides on every 11th entry and the last 3; row 1: both sides on one entry
         * (one thread's share of the row goes the long way, the others not); row 2 (not forward
         * KL / soft CE, whose true loss there is ~1e38, past what fp32 sums reliably): the student
         * alone on every 13th entry, where p = 0 and the reference's terms are exactly 0 */
        const float fm = host_round(-3.3895314e38f, c.sdt), fmt = host_round(-3.3895314e38f, c.tdt);
        const bool row2 = c.kind != LF_KL_FORWARD && c.kind != LF_KL_SOFT_CE;
        for (int64_t j = 0; j < V; ++j) {
            if (j % 11 == 4 || j >= V - 3) hs[0][j] = fm, ht[0][j] = fmt;
            if (row2 && j % 13 == 6) hs[2][j] = fm;
        }
        hs[1][V / 2] = fm;
        ht[1][V / 2] = fmt;
        /* row 3: the teacher alone on every 17th entry, where q = 0. Forward KL, soft CE, JSD and
         * TVD: those terms are exactly 0, as in the reference. Reverse KL: the true loss is ~3.4e38
         * times the student's mass there; kl_distill.cu's contract gives either that (where the
         * fp32 sums hold it) or, where they overflow, a support mismatch: +inf loss, NaN
         * gradient. Which one depends on the row; the checks below take either. */
        if (N >= 4)
            for (int64_t j = 0; j < V; ++j)
                if (j % 17 == 8) ht[3][j] = fmt;
        /* rows 4 and 5: the student, then the teacher, with EVERY entry at the floor: a side
         * with no mass (lossfuse.h lf_massless), no distribution, as a side of -inf: NaN loss
         * and gradient in the kernel (its held shift makes every term 0) and in the reference */
        if (N >= 6)
            for (int64_t j = 0; j < V; ++j) {
                hs[4][j] = fm;
                ht[5][j] = fmt;
            }
        for (int64_t i = 0; i < std::min<int64_t>(N, N >= 6 ? 6 : 4); ++i) {
            write_row(i);
            planted.insert(i);
        }
    }
    if (c.outlier >= 1000.0f && c.tkind == KL_TEACHER_LOGITS && c.topk < 0 && N >= 1 && V >= 2) {
        /* "huge logits": the outliers put most rows' mass on one maximum shared by both sides
         * (the rest below exp(-745)), so their KLs are exactly 0 and a wrong kernel could still
         * match. Rows 0, N/2 and N-1 get two maxima at 7488 (a bf16 value: every dtype holds it,
         * above every outlier), tied on the student and 32 apart on the teacher: at tau 1 forward
         * KL ~ log 2, reverse KL ~ 15.3, TVD 0.5, all from logits ~7.5e3, where the cancellation of
         * the maxima is what is tested */
        const float H = lf_bf16_to_f32(lf_f32_to_bf16(7500.0f));
        const int64_t ja = V / 3, jb = (V / 3 + V / 2) % V == ja ? (ja + 1) % V : (V / 3 + V / 2) % V;
        for (int64_t i : {(int64_t)0, N / 2, N - 1}) {
            if (planted.count(i)) continue;
            hs[i][ja] = hs[i][jb] = H;
            ht[i][ja] = H;
            ht[i][jb] = H - 32.0f;
            write_row(i);
            planted.insert(i);
        }
    }
    /* "close large maxima": rows 1 and N-2 get the two sides' maxima at one place, 32 apart at
     * ~8000 (student 8000 / teacher 7968 at V/2; student 7840 / teacher 7872 at 0, a head edge
     * element wherever the row pair's start is not 16-byte aligned, and in the unaligned-pair
     * case, where every element is an edge), and beside them values 1.5 and 1 below (rounded to
     * each dtype: in bf16 and fp16 onto the maxima themselves, two tied entries per side): small
     * KLs from logits ~8e3 (0 where both sides are 16-bit). M log2 e rounds in fp32 by -3.74e-4
     * and +3.78e-4 at 8000 / 7968, +4.54e-4 and -2.98e-4 at 7840 / 7872: a kernel whose two
     * sides' sums are relative to those rounded shifts, not to the maxima themselves, is off in
     * both KLs by ln 2 (c_s - c_t) = 5.2e-4 nats at tau 1 (7x the tight tolerance these rows get,
     * close_rows below), 2.6e-4 at tau 2 (3.6x), and in soft CE by ln 2 c_s alone (its log st
     * cancels): 2.6e-4 / 3.1e-4 at tau 1, 1.3e-4 / 1.6e-4 at tau 2 (1.6-2.2x). */
    std::set<int64_t> close_rows;
    if (c.plant_close && c.tkind == KL_TEACHER_LOGITS && c.topk < 0 && c.cap == 0.0f && N >= 3 && V >= 2) {
        for (int64_t i : {(int64_t)1, N - 2}) {
            if (planted.count(i)) continue;
            const bool first = i == 1;
            const int64_t j0 = first ? V / 2 : 0, j1 = first ? (V / 2 + 1) % V : 1;
            const float ms = first ? 8000.0f : 7840.0f, mt = first ? 7968.0f : 7872.0f;
            hs[i][j1] = host_round(ms - 1.5f, c.sdt);
            ht[i][j1] = host_round(mt - 1.0f, c.tdt);
            hs[i][j0] = ms; /* exact in every dtype */
            ht[i][j0] = mt;
            write_row(i);
            planted.insert(i);
            close_rows.insert(i);
        }
    }
    /* the row the contract's reverse-KL overflow case applies to (the reference is finite there) */
    const int64_t rev_tmin_row = c.plant_fmin && N >= 4 && c.kind == LF_KL_REVERSE && c.red == LF_REDUCE_NONE ? 3 : -1;
    /* row 6 (reverse KL, N >= 7): the student's mass nearly all on one entry (24 above the rest),
     * where the teacher alone is at its floor: pass 1's cross term is ~3.39e38, finite, and so is
     * the loss, but KL log2(e) is not, so the gradient's log2 form cannot hold it; the contract
     * takes such a row as a support mismatch (+inf loss, NaN gradient) every time. (A row 3 of
     * seed 1795882861, N = 9, V = 1000, came out with its loss finite and every gradient element
     * ~-p_j FLT_MAX before lf_kl_rev_fit.) A sparse teacher lists that entry only where fewer
     * than k of its entries are above the floor: otherwise it is one of the rest, whose q_rest
     * the KL takes there, finite (~10 nats; 8ef26ba's test wanted +inf of it): rev_big_inf. */
    const int64_t rev_big_row = rev_tmin_row >= 0 && N >= 7 && !planted.count(6) ? 6 : -1;
    if (rev_big_row >= 0) {
        const int64_t j0 = V / 3;
        float mx = -INFINITY;
        for (int64_t j = 0; j < V; ++j) mx = fmaxf(mx, hs[6][j]);
        hs[6][j0] = host_round(mx + 24.0f, c.sdt);
        ht[6][j0] = host_round(-3.3895314e38f, c.tdt);
        write_row(6);
        planted.insert(6);
    }
    /* row 7 (N >= 8, tau <= 1): the teacher at the floor on every 19th entry, where the student's
     * logit is 120 below its maximum, so p flushes to 0 there (~2^-173) while log2 q overflows to
     * -inf: reverse KL's fast gradient (the 16-bit kernels') took p times an infinite bracket
     * there, 0 x inf = NaN, where the exact form gives 0. Every kind's true gradient there is ~0
     * (the reference's p_j |log q_j| ~ 1e-14); the loss is finite. */
    if (c.plant_fmin && N >= 8 && c.tau <= 1.0f && !planted.count(7)) {
        float mx = -INFINITY;
        for (int64_t j = 0; j < V; ++j) mx = fmaxf(mx, hs[7][j]);
        const float low = host_round(mx - 120.0f, c.sdt), fmt = host_round(-3.3895314e38f, c.tdt);
        for (int64_t j = 0; j < V; ++j)
            if (j % 19 == 10) hs[7][j] = low, ht[7][j] = fmt;
        write_row(7);
        planted.insert(7);
    }
    if (c.plant_spikes) {
        uint64_t h = rs;
        for (int64_t i = 0; i < N; ++i) {
            if (planted.count(i)) continue;
            for (int64_t j = 0; j < V; ++j) {
                hs[i][j] = (mix64(h += 0x9e3779b97f4a7c15ull) % 300 == 0) ? -12.3125f : -100.0f;
                ht[i][j] = (mix64(h += 0x9e3779b97f4a7c15ull) % 300 == 0) ? -12.3125f : -100.0f;
            }
            hs[i][V - 1] = -12.3125f; /* at least one spike per side */
            ht[i][V / 2] = -12.3125f;
            write_row(i);
        }
    }
    if (c.tkind != KL_TEACHER_LOGITS && c.topk < 0) {
        /* the teacher's logits become log-softmax (or softmax) at temperature 1, stored in its dtype */
        for (int64_t i = 0; i < N; ++i) {
            double m = -INFINITY, s = 0.0;
            for (float v : ht[i]) m = fmax(m, (double)v);
            for (float v : ht[i]) s += v == NINF ? 0.0 : exp((double)v - m);
            const double lse = m + log(s);
            for (int64_t j = 0; j < V; ++j) {
                const double lp = ht[i][j] == NINF ? -INFINITY : (double)ht[i][j] - lse;
                ht[i][j] = host_round((float)(c.tkind == KL_TEACHER_PROBS ? exp(lp) : lp), c.tdt);
            }
            write_row(i);
        }
    }

    /* a sparse teacher from the dense one: top-k of each row, log-softmax at temperature 1 */
    const bool sparse = c.topk >= 0;
    const int64_t K = sparse ? c.topk : 0, kst = K + c.kpad;
    std::vector<int32_t> kidx((size_t)std::max<int64_t>(1, N * kst), 0);
    std::vector<float> klp((size_t)std::max<int64_t>(1, N * kst), 0.0f);
    std::vector<int> topk_bad(N, 0);
    if (sparse) {
        std::vector<int32_t> order(V);
        for (int64_t i = 0; i < N; ++i) {
            double m = -INFINITY, sum = 0.0;
            for (float v : ht[i]) m = fmax(m, (double)v);
            for (float v : ht[i]) sum += v == -INFINITY ? 0.0 : exp((double)v - m);
            const double lse = m + log(sum);
            for (int64_t j = 0; j < V; ++j) order[j] = (int32_t)j;
            std::partial_sort(order.begin(), order.begin() + K, order.end(),
                              [&](int32_t a, int32_t b) { return ht[i][a] > ht[i][b] || (ht[i][a] == ht[i][b] && a < b); });
            for (int64_t q = K - 1; q > 0; --q) std::swap(order[q], order[(int64_t)(rng_u(&rs) * (q + 1)) % (q + 1)]);
            for (int64_t q = 0; q < K; ++q) {
                kidx[i * kst + q] = order[q];
                klp[i * kst + q] = (float)((double)ht[i][order[q]] - lse);
            }
        }
        if (c.plant_topk && N >= 7 && K >= 2) {
            kidx[0 * kst + 1] = kidx[0 * kst + 0];               /* row 0: a repeated index */
            kidx[1 * kst + K - 1] = (int32_t)V;                  /* row 1: index V */
            kidx[2 * kst + 0] = -1;                              /* row 2: index -1 */
            klp[3 * kst + K / 2] = NAN;                          /* row 3: NaN log-prob: NaN row */
            klp[4 * kst + 0] = -INFINITY;                        /* row 4: a zero-mass pair */
            for (int64_t q = 0; q < K; ++q) klp[5 * kst + q] = 0.0f; /* row 5: sum exp > 1, no rest */
            klp[6 * kst + 1] = INFINITY;                         /* row 6: +inf log-prob: NaN row */
            for (int64_t i = 0; i < 7; ++i) planted.insert(i);
            topk_bad[0] = topk_bad[1] = topk_bad[2] = 1;
            /* repeats the warp's hash table must find (kl_topk_prep_kernel): positions 0 and
             * min(K - 1, 32) (for K > 32 in one lane's two registers), and 0, K / 2, K - 1 (for K > 32
             * across lanes and registers; three times for K >= 3); the last two rows too, which
             * with more rows than the prep's warps (32768) are a warp's second row, after a first
             * that filled its table */
            auto plant_repeats = [&](int64_t r1, int64_t r2) {
                kidx[r1 * kst + std::min<int64_t>(K - 1, 32)] = kidx[r1 * kst + 0];
                kidx[r2 * kst + K - 1] = kidx[r2 * kst + K / 2] = kidx[r2 * kst + 0];
                planted.insert(r1);
                planted.insert(r2);
                topk_bad[r1] = topk_bad[r2] = 1;
            };
            if (N >= 9) plant_repeats(7, 8);
            if (N >= 11) plant_repeats(N - 2, N - 1);
        }
        if (c.plant_deep && N >= 1 && K >= 2) {
            klp[1] = -150.0f;
            hs[0][kidx[1]] = -INFINITY;
            write_row(0);
            planted.insert(0);
        }
    }

    /* masks: labels and/or bytes; rows planted above stay valid */
    std::vector<int64_t> y(N, 0);
    std::vector<uint8_t> mb(N, 1);
    std::vector<int> valid(N, 1);
    int64_t n_bad = 0;
    for (int64_t i = 0; i < N; ++i) {
        const double r = rng_u(&rs);
        if (c.labels) {
            y[i] = (int64_t)(rng_u(&rs) * V) % V;
            if (!planted.count(i) && r < c.ignore_frac) y[i] = -100, valid[i] = 0;
            else if (!planted.count(i) && r < c.ignore_frac + c.bad_frac) {
                y[i] = (i % 2) ? V : -5;
                valid[i] = 0;
                ++n_bad;
            }
        }
        if (c.mask && !planted.count(i) && rng_u(&rs) < 0.15) {
            mb[i] = 0;
            if (valid[i] == 0 && c.labels && y[i] != -100) --n_bad; /* masked first: no label check */
            valid[i] = 0;
        }
    }
    DevBuf yd(N * 8 + 8), md(N + 1), wd(N * 4 + 4);
    if (c.lab64) CK(cudaMemcpy(yd.p, y.data(), N * 8, cudaMemcpyHostToDevice));
    else {
        std::vector<int32_t> y32(y.begin(), y.end());
        CK(cudaMemcpy(yd.p, y32.data(), N * 4, cudaMemcpyHostToDevice));
    }
    CK(cudaMemcpy(md.p, mb.data(), N, cudaMemcpyHostToDevice));
    std::vector<float> w(N, 1.0f);
    if (c.weights)
        for (auto &v : w) v = rng_u(&rs) < 0.05 ? 0.0f : (float)(0.25 + 1.75 * rng_u(&rs));
    CK(cudaMemcpy(wd.p, w.data(), N * 4, cudaMemcpyHostToDevice));
    double wsum = 0.0;
    for (int64_t i = 0; i < N; ++i)
        if (valid[i] && topk_bad[i]) { /* a row with bad top-k pairs counts as an error and is masked */
            valid[i] = 0;
            ++n_bad;
        }
    for (int64_t i = 0; i < N; ++i) wsum += valid[i] ? w[i] : 0.0;
    const double D = c.dev_divisor ? 77.25 : wsum;

    std::vector<float> dl(c.red == LF_REDUCE_NONE ? N : 1);
    for (auto &v : dl) v = (float)((rng_u(&rs) < 0.3 ? -1.0 : 1.0) * (0.5 + rng_u(&rs)));
    DevBuf dld(dl.size() * 4), divd(4), ws(kl_workspace_bytes(N));
    CK(cudaMemcpy(dld.p, dl.data(), dl.size() * 4, cudaMemcpyHostToDevice));
    const float divh = 77.25f;
    CK(cudaMemcpy(divd.p, &divh, 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(ws.p, 0, ws.bytes));
    poison_ws_divisor(ws.p); /* and before each relaunch */

    /* outputs, poisoned */
    const int64_t nloss = c.red == LF_REDUCE_NONE ? N : 1;
    DevBuf loss(nloss * 4), kf(N * 4), kr(N * 4), ens(N * 4), ent(N * 4), cnt(4);
    for (DevBuf *b : {&loss, &kf, &kr, &ens, &ent}) fill_poison(b->p, b->bytes / 4, LF_F32);
    CK(cudaMemset(cnt.p, 0, 4));
    const int64_t gs = c.grad == 1 ? V + c.gpad : ss;
    DevBuf gbuf(c.grad == 1 ? (size_t)N * gs * es : 4);
    auto poison_grad = [&]() { /* a separate gradient buffer: padding patterned, rows poisoned */
        if (c.sdt == LF_F32) fill_bits<uint32_t><<<1024, 256>>>((uint32_t *)gbuf.p, N * gs, PAD32);
        else fill_bits<uint16_t><<<1024, 256>>>((uint16_t *)gbuf.p, N * gs, PAD16);
        CK(cudaGetLastError());
        for (int64_t i = 0; i < N && c.gpad > 0; ++i) fill_poison((char *)gbuf.p + (size_t)i * gs * es, V, c.sdt);
        if (c.gpad == 0) fill_poison(gbuf.p, (size_t)N * gs, c.sdt);
    };
    if (c.grad == 1) poison_grad();

    kl_args a = kl_args_default();
    a.student = xs.p;
    a.s_dtype = c.sdt;
    a.n_rows = N;
    a.vocab = V;
    a.s_stride = ss;
    a.teacher = xt;
    a.t_dtype = c.tdt;
    a.t_stride = ts;
    a.teacher_kind = c.tkind;
    DevBuf kidx_d(kidx.size() * 4), klp_d(klp.size() * 4);
    if (sparse) {
        CK(cudaMemcpy(kidx_d.p, kidx.data(), kidx.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(klp_d.p, klp.data(), klp.size() * 4, cudaMemcpyHostToDevice));
        a.teacher = NULL;
        a.topk_idx = (const int32_t *)kidx_d.p;
        a.topk_lp = (const float *)klp_d.p;
        a.topk = K;
        a.topk_stride = kst;
        a.topk_rest = c.rest;
    }
    a.opts.kind = c.kind;
    a.opts.beta = c.beta;
    a.opts.temperature = c.tau;
    a.opts.tau2 = c.tau2;
    a.opts.softcap = c.cap;
    a.labels = c.labels ? yd.p : NULL;
    a.labels_i64 = c.lab64;
    a.mask = c.mask ? (const uint8_t *)md.p : NULL;
    a.weights = c.weights ? (const float *)wd.p : NULL;
    a.reduction = c.red;
    a.divisor = c.dev_divisor ? (const float *)divd.p : NULL;
    a.dloss = c.dloss ? (const float *)dld.p : NULL;
    a.grad_scale = c.grad_scale;
    a.grad = c.grad == 0 ? NULL : c.grad == 1 ? gbuf.p : xs.p;
    a.grad_stride = gs;
    a.loss = (float *)loss.p;
    if (c.stats) {
        a.kl_fwd = c.no_fwd ? NULL : (float *)kf.p;
        a.kl_rev = c.no_rev ? NULL : (float *)kr.p;
        a.ent_s = c.no_fwd ? NULL : (float *)ens.p;
        a.ent_t = (float *)ent.p;
    }
    a.n_errors = (unsigned *)cnt.p;
    a.workspace = ws.p;
    a.workspace_bytes = ws.bytes;
    a.schedule = c.schedule;
    a.max_cluster = c.max_cluster;
    a.stages = c.stages;
    a.static_rows = c.static_rows;
    a.side_ctas = c.side_ctas;
    a.side_take_rest = c.side_rest ? 1 : 0;
    kl_plan plan;
    memset(&plan, 0, sizeof plan);
    a.plan = &plan;

    /* rows to check */
    std::set<int64_t> rows;
    if (c.check_all || (double)N * V <= 4e6) {
        for (int64_t i = 0; i < N; ++i) rows.insert(i);
    } else {
        rows = planted;
        for (int64_t i : {(int64_t)0, (int64_t)1, N - 1, N / 2}) rows.insert(std::max<int64_t>(0, std::min(i, N - 1)));
        for (int k = 0; k < (g_small ? 4 : 16); ++k) rows.insert((int64_t)(rng_u(&rs) * N) % N);
    }

    /* reduced losses over sampled rows: the kernel's own per-row losses (forward only, none) */
    std::vector<float> all_rows;
    if (c.red != LF_REDUCE_NONE && rows.size() < (size_t)N) {
        kl_args f = a;
        DevBuf l2(N * 4), ws2(kl_workspace_bytes(N)), cnt2(4);
        CK(cudaMemset(ws2.p, 0, ws2.bytes));
        f.reduction = LF_REDUCE_NONE;
        f.grad = NULL;
        f.loss = (float *)l2.p;
        /* the statistics asked for as in the checked launch (they choose the pass-1 terms, and
         * with them the rounding of a row's loss), written to scratch */
        DevBuf st2((size_t)N * 4 * 4);
        float *const st2f = (float *)st2.p;
        f.kl_fwd = a.kl_fwd ? st2f : NULL;
        f.kl_rev = a.kl_rev ? st2f + N : NULL;
        f.ent_s = a.ent_s ? st2f + 2 * N : NULL;
        f.ent_t = a.ent_t ? st2f + 3 * N : NULL;
        f.n_errors = (unsigned *)cnt2.p;
        f.dloss = NULL;
        f.workspace = ws2.p;
        /* the same schedule and plan as the launch checked (per-row sums are bit-identical
         * within a schedule and plan, not across them) */
        kl_plan fp;
        memset(&fp, 0, sizeof fp);
        {
            kl_args probe = a; /* the plan the checked launch will take, from a launch on a copy */
            DevBuf gtmp(c.grad ? (size_t)N * gs * es : 4), ws3(kl_workspace_bytes(N));
            CK(cudaMemset(ws3.p, 0, ws3.bytes));
            if (c.grad) probe.grad = gtmp.p, probe.grad_stride = gs;
            probe.workspace = ws3.p;
            probe.loss = (float *)l2.p;
            /* the outputs asked for as in the checked launch (a reverse KL output rules the
             * soft-target path out), written to scratch */
            probe.kl_fwd = f.kl_fwd;
            probe.kl_rev = f.kl_rev;
            probe.ent_s = f.ent_s;
            probe.ent_t = f.ent_t;
            probe.n_errors = (unsigned *)cnt2.p;
            probe.plan = &fp;
            cudaError_t pe;
            EXPECT(kl_launch(&probe, 0, &pe) == LF_OK, "plan probe failed: %s", cudaGetErrorString(pe));
            CK(cudaDeviceSynchronize());
            CK(cudaMemset(cnt2.p, 0, 4));
        }
        f.schedule = fp.schedule;
        f.plan = NULL;
        cudaError_t ce;
        EXPECT(kl_launch(&f, 0, &ce) == LF_OK, "forward-only launch failed: %s", cudaGetErrorString(ce));
        CK(cudaDeviceSynchronize());
        all_rows.resize(N);
        CK(cudaMemcpy(all_rows.data(), l2.p, N * 4, cudaMemcpyDeviceToHost));
    }

    cudaError_t ce;
    const lf_status st = kl_launch(&a, 0, &ce);
    EXPECT(st == LF_OK, "kl_launch: %s (%s)", lf_status_str(st), cudaGetErrorString(ce));
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    if (g_cc_major >= 9 && c.expect_schedule)
        EXPECT(plan.schedule == c.expect_schedule, "plan: schedule %d, want %d", plan.schedule, c.expect_schedule);
    if (g_cc_major >= 9 && c.expect_cluster)
        EXPECT(plan.cluster == c.expect_cluster, "plan: cluster %d, want %d", plan.cluster, c.expect_cluster);
    if (c.schedule != KL_SCHED_AUTO) EXPECT(plan.schedule == c.schedule, "plan: schedule %d, forced %d", plan.schedule, c.schedule);
    if (g_cc_major >= 9 && c.soft >= 0)
        EXPECT(plan.soft_target == c.soft, "plan: soft-target path %d, want %d", plan.soft_target, c.soft);
    if (g_cc_major >= 9 && c.expect_dynamic >= 0 && plan.schedule == KL_SCHED_RESIDENT)
        EXPECT(plan.dynamic == c.expect_dynamic, "plan: dynamic %d, want %d", plan.dynamic, c.expect_dynamic);
    if (g_cc_major >= 9 && c.expect_side_auto && !g_small) {
        const bool want = plan.schedule == KL_SCHED_RESIDENT && plan.dynamic && plan.cluster > 1 && plan.ctas < g_sms &&
                          g_peak_bw / LF_RING_CTA_BW > (double)plan.ctas;
        EXPECT((plan.side_ctas > 0) == want, "plan: %d side CTAs (cluster %d, %d CTAs of %d SMs, peak %.0f GB/s)", plan.side_ctas,
               plan.cluster, plan.ctas, g_sms, g_peak_bw / 1e9);
    }
    if (c.side_ctas > 0 && plan.schedule == KL_SCHED_RESIDENT && plan.dynamic && plan.cluster > 1) {
        /* forced: that many, except a forward-only launch of a one-pass kind (kl_side_kernel's
         * ring needs a second pass to reach the next row) */
        const int want = (c.grad || c.kind == LF_KL_JSD || c.kind == LF_KL_TVD) ? c.side_ctas : 0;
        EXPECT(plan.side_ctas == want, "plan: %d side CTAs, forced %d, want %d", plan.side_ctas, c.side_ctas, want);
    }
    /* the workspace's counters are back at zero after every launch (the next one, or a graph
     * replay, starts from them); with side CTAs their row count of this launch is kept */
    kl_ws_header wh;
    CK(cudaMemcpy(&wh, ws.p, sizeof wh, cudaMemcpyDeviceToHost));
    EXPECT(wh.rows_done == 0 && wh.row_next == 0 && wh.side_rows == 0, "workspace counters left at %llu, %llu, %u", wh.rows_done,
           wh.row_next, wh.side_rows);
    if (plan.side_ctas > 0) printf("     %d side CTAs took %u of %lld rows\n", plan.side_ctas, wh.side_rows_last, (long long)N);
    if (c.side_ctas > 0 && plan.side_ctas > 0 && !c.side_rest && !g_small && N >= 1000 && plan.ctas < g_sms) /* as below */
        EXPECT(wh.side_rows_last > 0, "%d side CTAs took no row of %lld", plan.side_ctas, (long long)N);
    if (c.side_rest && plan.side_ctas > 0) {
        /* the clusters took their rings' first rows only, the side CTAs all the others (so
         * kl_side_kernel ran, its ring included, whatever the order of the grids) */
        const int64_t first = (int64_t)(plan.ctas / plan.cluster) * plan.stages;
        const int64_t want = N > first ? N - first : 0;
        EXPECT((int64_t)wh.side_rows_last == want, "side CTAs took %u rows, want all %lld after the clusters' first %lld",
               wh.side_rows_last, (long long)want, (long long)first);
        EXPECT(want > 0, "the side CTAs had no row to take (%lld rows, %lld in the rings' first stages)",
               (long long)N, (long long)first);
    }

    /* ---- counters and per-row outputs: every element written ---- */
    unsigned errs;
    CK(cudaMemcpy(&errs, cnt.p, 4, cudaMemcpyDeviceToHost));
    EXPECT((int64_t)errs == n_bad, "n_errors %u, want %lld", errs, (long long)n_bad);
    std::vector<float> lossh(nloss), kfh(N), krh(N), ensh(N), enth(N);
    CK(cudaMemcpy(lossh.data(), loss.p, nloss * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(kfh.data(), kf.p, N * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(krh.data(), kr.p, N * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(ensh.data(), ens.p, N * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(enth.data(), ent.p, N * 4, cudaMemcpyDeviceToHost));
    auto bits = [](float f) { uint32_t u; memcpy(&u, &f, 4); return u; };
    int64_t unwritten = 0;
    for (int64_t i = 0; i < nloss; ++i) unwritten += bits(lossh[i]) == POISON32;
    if (c.stats)
        for (int64_t i = 0; i < N; ++i)
            unwritten += (!c.no_fwd && bits(kfh[i]) == POISON32) + (!c.no_rev && bits(krh[i]) == POISON32) +
                         (!c.no_fwd && bits(ensh[i]) == POISON32) + (bits(enth[i]) == POISON32);
    EXPECT(unwritten == 0, "%lld per-row outputs left unwritten", (long long)unwritten);
    if (c.grad == 1) {
        DevBuf counts(16);
        CK(cudaMemset(counts.p, 0, 16));
        unsigned long long ch[2];
        if (c.sdt == LF_F32)
            count_unwritten<uint32_t><<<1024, 256>>>((const uint32_t *)gbuf.p, N, V, gs, POISON32, PAD32, (unsigned long long *)counts.p);
        else
            count_unwritten<uint16_t><<<1024, 256>>>((const uint16_t *)gbuf.p, N, V, gs, POISON16, PAD16, (unsigned long long *)counts.p);
        CK(cudaGetLastError());
        CK(cudaMemcpy(ch, counts.p, 16, cudaMemcpyDeviceToHost));
        EXPECT(ch[0] == 0, "%llu gradient elements never written", ch[0]);
        EXPECT(ch[1] == 0, "%llu padding elements overwritten", ch[1]);
    }
    if (c.grad == 2 && ss > V) { /* in place: the student's padding columns as gen_logits wrote them */
        DevBuf pc(8);
        CK(cudaMemset(pc.p, 0, 8));
        unsigned long long changed;
        unsigned long long *const pcp = (unsigned long long *)pc.p;
        if (c.sdt == LF_F32) count_pad_changed<float><<<1024, 256>>>((const float *)xs.p, N, V, ss, seed_s, c.outlier, pcp);
        else if (c.sdt == LF_BF16) count_pad_changed<__nv_bfloat16><<<1024, 256>>>((const __nv_bfloat16 *)xs.p, N, V, ss, seed_s, c.outlier, pcp);
        else count_pad_changed<__half><<<1024, 256>>>((const __half *)xs.p, N, V, ss, seed_s, c.outlier, pcp);
        CK(cudaGetLastError());
        CK(cudaMemcpy(&changed, pc.p, 8, cudaMemcpyDeviceToHost));
        EXPECT(changed == 0, "%llu student padding elements overwritten (gradient in place)", changed);
    }

    /* ---- checked rows against the double reference ---- */
    lf_kl_opts o = lf_kl_opts_default();
    o.kind = c.kind;
    o.beta = c.beta;
    o.temperature = c.tau;
    o.tau2 = c.tau2;
    o.softcap = c.cap;
    const double unit_round = c.sdt == LF_BF16 ? 0x1p-8 : c.sdt == LF_F16 ? 0x1p-11 : 0.0;
    const double fp16_abs = c.sdt == LF_F16 ? 0x1p-25 : 0.0;
    const double scale2 = c.tau2 ? (double)c.tau * c.tau : 1.0;
    double ref_sum = 0.0, ref_tol = 0.0;
    std::vector<double> dx(V), lq(V);
    std::vector<char> grow((size_t)V * es);
    std::vector<char> tracked(V, 0); /* sparse: the row's top-k entries */
    double rest_rel = 0.0;           /* sparse, spread: an untracked entry's relative uncertainty */
    /* Row i's reference (lqb: V doubles of scratch, the teacher's log-probabilities unless the
     * teacher is dense logits; dxb may be NULL) and its loss tolerance. No EXPECT inside: the
     * reduced-loss check below runs them on host threads. */
    auto ref_row = [&](int64_t i, double *lqb, double *dxb, bool *rejected, bool overflowed) -> lf_kl_row {
        const float *xsr = hs[i].data();
        *rejected = false;
        lf_kl_row r;
        if (sparse) {
            if (lf_ref_kl_sparse_teacher(V, &kidx[i * kst], &klp[i * kst], K, c.rest, c.tau, lqb) != LF_OK) {
                *rejected = true;
                std::fill(lqb, lqb + V, 0.0); /* a masked row: any finite teacher */
            }
            r = lf_ref_kl_row_lq(xsr, lqb, V, &o, dxb);
        } else if (c.tkind == KL_TEACHER_LOGITS) {
            r = lf_ref_kl_row(xsr, ht[i].data(), V, &o, dxb);
        } else {
            for (int64_t j = 0; j < V; ++j) {
                const double v = c.tkind == KL_TEACHER_PROBS ? log((double)ht[i][j]) : (double)ht[i][j];
                lqb[j] = v / c.tau;
            }
            r = lf_ref_kl_row_lq(xsr, lqb, V, &o, dxb);
        }
        if ((i == rev_tmin_row || i == rev_big_row) && overflowed) { /* the contract's support mismatch, not the literal loss */
            r.loss = r.kl_rev = INFINITY;
            if (dxb) std::fill(dxb, dxb + V, (double)NAN);
        }
        return r;
    };
    /* the row's magnitudes in z units (lqb as ref_row left it); an entry at the float floor
     * (finfo.min) has probability exactly 0 on both sides of the comparison and adds no
     * rounding to the kernel's sums, so it is left out, as a -inf one is */
    auto row_zmax = [&](int64_t i, const double *lqb) {
        double zmax = 0.0;
        for (int64_t j = 0; j < V; ++j) {
            const double zs = fabs((double)lf_logit_xform(hs[i][j], 1.0f / c.tau, 0.0f));
            if (zs < ZFLOOR) zmax = fmax(zmax, zs);
            const double zt = c.tkind == KL_TEACHER_LOGITS && !sparse ? fabs((double)ht[i][j] / c.tau) : fabs(lqb[j]);
            if (zt < ZFLOOR) zmax = fmax(zmax, zt);
        }
        return zmax;
    };
    auto lse_mag = [](const lf_kl_row &r) {
        return (fabs(r.lse_s) < INFINITY ? fabs(r.lse_s) : 0.0) + (fabs(r.lse_t) < INFINITY ? fabs(r.lse_t) : 0.0);
    };
    /* fp32 work: exp arguments w*cs - shift carry ~2^-24 (|z| + |m|) each, the cross terms and
     * sums are fp32 chains of <= 2^15 terms per thread then trees, logs of sums <= V; the KL is
     * a difference of terms of size ~(|z| + |lse|): 2^-19 (1 + |lse_s| + |lse_t| + max|z| +
     * log V) absolute covers it; 1e-5 relative on top. Soft CE and JSD/TVD (two passes, log2 of
     * a mixture) get 2x. */
    auto loss_tol_abs = [&](double lsem, double zmax) {
        return 0x1p-19 * (1.0 + lsem + zmax + log((double)V + 1.0)) * (c.kind >= LF_KL_JSD ? 2.0 : 1.0);
    };
    /* An fp32 student: the kernel's pass 2 and gradient take p_j and q_j against each side's
     * maximum (lossfuse_cuda.cuh lf_kl_coef_onto_max), so their exponents carry ~2^-24 (|z_j -
     * lse| + log2 of the sum against the passes' shift, up to ~64 where a lazy shift stopped
     * below the maximum) and reverse KL's log-ratio ~2^-24 (|z_s - z_t| + |lse_s - lse_t|), not
     * 2^-24 |lse|: the gradient's tolerance below is per element for it (the one-float lse's
     * 2^-24 |lse| was 6e-4 relative at |lse| = 1e4, held only by a row bound of 2^-21 (|lse| +
     * max |z|)); a 16-bit student keeps the row bound, below its rounding. A capped or probs
     * side rounds each z_j itself (lin_sides false): rel_j adds 2^-22 |z_j| per side there. */
    const bool split = c.sdt == LF_F32;
    const bool lin_sides = c.cap == 0.0f && c.tkind != KL_TEACHER_PROBS;
    /* the tolerance of row i's weighted loss */
    auto loss_tol = [&](double wi, const lf_kl_row &r, double tol_abs) {
        return wi * scale2 * (1e-5 * fabs(r.loss / scale2) + tol_abs);
    };
    bool rev_big_inf = rev_big_row >= 0; /* row 6's loss: the support mismatch (see above) */
    if (rev_big_inf && sparse) {
        rev_big_inf = false;
        for (int64_t q = 0; q < K; ++q) rev_big_inf |= kidx[rev_big_row * kst + q] == (int32_t)(V / 3);
    }
    for (int64_t i : rows) {
        const float *xsr = hs[i].data();
        bool rejected;
        /* rev_tmin_row: the kernel's sums overflowed (the loss is +inf) or held the loss;
         * rev_big_row: the support mismatch where rev_big_inf */
        const bool overflowed = (i == rev_tmin_row || (i == rev_big_row && rev_big_inf)) && lossh[i] == INFINITY;
        if (i == rev_tmin_row)
            printf("     row 3, the teacher alone at finfo.min: %s\n", overflowed ? "+inf, a support mismatch" : "the finite loss");
        if (i == rev_big_row && rev_big_inf)
            EXPECT(overflowed, "row 6 (KL log2 e past FLT_MAX): loss %.9g, want +inf (a support mismatch)", lossh[i]);
        const lf_kl_row r = ref_row(i, lq.data(), dx.data(), &rejected, overflowed);
        if (rejected) EXPECT(topk_bad[i], "row %lld: the reference rejects its top-k pairs", (long long)i);
        if (sparse) {
            /* A spread rest is log((1 - sum_i exp(lp_i)) / (V - k)): where the pairs carry nearly
             * all the mass, 1 - sum cancels. The device (kl_topk_prep_kernel: lanes, then a
             * 5-level shuffle tree, CUDA's double exp) and the reference (in order, the host's exp)
             * may differ by (k + 6) 2^-53 sum from the order and 2 k 2^-53 sum from the exps, so
             * each untracked teacher entry by that relative to 1 - sum (over tau); twice that. */
            rest_rel = 0.0;
            std::fill(tracked.begin(), tracked.end(), (char)0);
            if (c.rest == LF_KL_REST_SPREAD && K < V) {
                double in = 0.0;
                for (int64_t q = 0; q < K; ++q) {
                    const float l = klp[i * kst + q];
                    if (l < INFINITY) in += exp((double)l);
                    const int32_t id = kidx[i * kst + q];
                    if (id >= 0 && id < V) tracked[id] = 1;
                }
                if (in < 1.0) rest_rel = 2.0 * (double)(3 * K + 6) * 0x1p-53 * in / (1.0 - in) / c.tau;
            }
        }
        const double zmax = row_zmax(i, lq.data());
        const double lsem = lse_mag(r);
        const double tol_abs = loss_tol_abs(lsem, zmax);
        /* close_rows at a temperature that is a power of 2 (w / tau and its maximum exact in
         * fp32): the KLs are rb / st + (ms - mt) + (log ss - log st) with every sum relative to
         * its side's maximum itself (lossfuse_cuda.cuh lf_impl_acc_fold); what fp32 leaves is
         * the cross terms' and the maxima's differences (<= 2 x 32 here) to a few 2^-24 and the
         * sums' rounding: 2^-20 (1 + 64 + log V). The losses built on them alone (forward,
         * reverse KL, soft CE) get it too; JSD and TVD (pass 2 on p = exp2(w cs - lse log2 e),
         * whose shift is rounded) keep the bound above, except with an fp32 student, whose
         * pass 2 takes p and q against each side's maximum (split, above). */
        int tau_exp = 0;
        const bool tight_row = close_rows.count(i) && frexpf(c.tau, &tau_exp) == 0.5f;
        const double tight_abs = 0x1p-20 * (1.0 + 64.0 + log((double)V + 1.0));
        const bool tight_loss = tight_row && (c.kind == LF_KL_FORWARD || c.kind == LF_KL_REVERSE || c.kind == LF_KL_SOFT_CE ||
                                              (split && (c.kind == LF_KL_JSD || c.kind == LF_KL_TVD)));
        const bool ok_row = valid[i] != 0;
        const double wi = ok_row ? w[i] : 0.0;
        const double loss_w = ok_row ? wi * r.loss : 0.0;
        ref_sum += loss_w;
        ref_tol += ok_row ? loss_tol(wi, r, tight_loss ? tight_abs : tol_abs) : 0.0;
        if (c.red == LF_REDUCE_NONE) {
            const double tl = loss_tol(wi, r, tight_loss ? tight_abs : tol_abs);
            EXPECT(close(lossh[i], loss_w, tl), "row %lld loss %.9g want %.9g (tol %.3g)", (long long)i, lossh[i], loss_w, tl);
        }
        if (c.stats) {
            const double kfw = ok_row ? r.kl_fwd : 0.0, krw = ok_row ? r.kl_rev : 0.0;
            const double esw = ok_row ? r.ent_s : 0.0, etw = ok_row ? r.ent_t : 0.0;
            const double tk = tight_row ? tight_abs : tol_abs;
            if (!c.no_fwd)
                EXPECT(close(kfh[i], kfw, 1e-5 * fabs(kfw) + tk), "row %lld kl_fwd %.9g want %.9g", (long long)i, kfh[i], kfw);
            if (!c.no_rev)
                EXPECT(close(krh[i], krw, 1e-5 * fabs(krw) + tk), "row %lld kl_rev %.9g want %.9g", (long long)i, krh[i], krw);
            if (!c.no_fwd)
                EXPECT(close(ensh[i], esw, 1e-5 * fabs(esw) + tol_abs), "row %lld ent_s %.9g want %.9g", (long long)i, ensh[i], esw);
            EXPECT(close(enth[i], etw, 1e-5 * fabs(etw) + tol_abs), "row %lld ent_t %.9g want %.9g", (long long)i, enth[i], etw);
        }
        if (!c.grad) continue;
        const double G = (double)c.grad_scale * (c.dloss ? dl[c.red == LF_REDUCE_NONE ? i : 0] : 1.0) *
                         (c.red == LF_REDUCE_MEAN ? (D == 0.0 ? 0.0 : 1.0 / D) : 1.0) * wi;
        const void *src = c.grad == 1 ? (const char *)gbuf.p + (size_t)i * gs * es : (const char *)xs.p + (size_t)i * ss * es;
        CK(cudaMemcpy(grow.data(), src, V * es, cudaMemcpyDeviceToHost));
        /* per element: with p_j, q_j and the reference's log-ratios, the kernel's fp32 error is
         * |G| dz/dx (p_j + q_j) (rel32 (1 + |log-ratio terms|) + 2^-21 (|z_j| + |lse| terms));
         * TVD's sign can flip where p_j ~ q_j (the tie band), which moves its element by up to
         * p_j and the row's sum sgn * p by the band's mass; then the dtype's rounding. */
        const double rel32 = 1e-6 + 0x1p-22 * (lsem + zmax);
        /* identical rows (same values, same dtype): the kernel's p_j and q_j come from the same
         * values through the same code, so they are equal bit for bit and TVD's signs are all 0,
         * as the reference's: no tie band there (with one, every element sat in it and its
         * bound was p_j, which no error could pass) */
        const bool same_rows = c.sdt == c.tdt && c.tkind == KL_TEACHER_LOGITS && !sparse && hs[i] == ht[i];
        double band = 0.0;
        std::vector<double> pj(V), qj(V), lr(V), lrf(V);
        for (int64_t j = 0; j < V; ++j) {
            const double zs = (double)lf_logit_xform(xsr[j], 1.0f, c.cap) / c.tau;
            const double zt = c.tkind == KL_TEACHER_LOGITS && !sparse ? (double)lf_logit_xform(ht[i][j], 1.0f, c.cap) / c.tau : lq[j];
            pj[j] = zs == -INFINITY ? 0.0 : exp(zs - r.lse_s);
            qj[j] = zt == -INFINITY ? 0.0 : exp(zt - r.lse_t);
            /* |log p_j - log q_j| (0 where a side is exactly 0: -inf or at the float floor) */
            lr[j] = zs > -ZFLOOR && zt > -ZFLOOR ? fabs((zs - r.lse_s) - (zt - r.lse_t)) : 0.0;
            /* the same with a side at the floor (finite, up to ~3.4e38): for a flushed p_j */
            lrf[j] = zs > -INFINITY && zt > -INFINITY ? fabs((zs - r.lse_s) - (zt - r.lse_t)) : 0.0;
            if (!same_rows && fabs(pj[j] - qj[j]) <= 8.0 * rel32 * (pj[j] + qj[j])) band += pj[j];
        }
        /* the factor on the relative errors of p_j and q_j from the log-ratio terms each loss's
         * gradient carries: reverse KL p_j (log p_j - log q_j - KL), JSD the same with the mixture
         * (bounded here by 60 nats); TVD p_j (sgn - sum p sgn), at most 2 p_j; forward KL and
         * soft CE p_j - q_j, none (1) */
        const double ratio = c.kind == LF_KL_REVERSE ? 2.0 * (fabs(r.kl_rev) < INFINITY ? fabs(r.kl_rev) : 0.0) + 60.0
                           : c.kind == LF_KL_JSD     ? 60.0
                           : c.kind == LF_KL_TVD     ? 2.0
                                                     : 1.0;
        /* split (an fp32 student): element j's relative error of p_j and q_j, and of the log-ratio
         * terms over their size (ratio), from |z_j - lse| of both sides and the lse's distance */
        const double dlse = fabs(r.lse_s - r.lse_t) < INFINITY ? fabs(r.lse_s - r.lse_t) : 0.0;
        auto rel_j = [&](int64_t j) {
            const double zs = (double)lf_logit_xform(xsr[j], 1.0f, c.cap) / c.tau;
            const double zt = c.tkind == KL_TEACHER_LOGITS && !sparse ? (double)lf_logit_xform(ht[i][j], 1.0f, c.cap) / c.tau : lq[j];
            const double ds = fabs(zs - r.lse_s) < ZFLOOR ? fabs(zs - r.lse_s) : 0.0;
            const double dt = fabs(zt - r.lse_t) < ZFLOOR ? fabs(zt - r.lse_t) : 0.0;
            /* a capped or probs side rounds each z_j itself (x / tau, tanh, log: a few ulps) */
            const double zr = lin_sides ? 0.0 : 0x1p-22 * ((fabs(zs) < ZFLOOR ? fabs(zs) : 0.0) + (fabs(zt) < ZFLOOR ? fabs(zt) : 0.0));
            return 1e-6 + 0x1p-22 * (4.0 + ds + dt + dlse + log((double)V + 1.0)) + zr;
        };
        /* split: the log-ratio factor per element instead of the 60-nat cap above, so that the
         * lse's rounding shows in reverse KL and JSD too: the bracket log p_j - log q_j - KL
         * (reverse) or log p_j - log M_j - k_p (JSD, |log p_j - log M_j| <= |log p_j - log q_j|,
         * k_p <= JSD / (1 - beta)) is at most |lr_j| plus that row constant; twice it, plus 8. On
         * the close-maxima rows the one-float lse puts ~2^-24 (|ks| + |kt|) ~ 1.4e-3 into the
         * bracket, ~10x this bound there. (JSD at beta 0 and 1 runs as forward / reverse KL.) */
        const double jsd_kp = c.kind == LF_KL_JSD && c.beta > 0.0f && c.beta < 1.0f && fabs(r.loss) < INFINITY
                                  ? fabs(r.loss) / scale2 / (1.0 - (double)c.beta)
                                  : -1.0;
        auto ratio_j = [&](int64_t j) {
            if (!split) return ratio;
            if (c.kind == LF_KL_REVERSE) return 2.0 * lr[j] + 8.0 + 2.0 * (fabs(r.kl_rev) < INFINITY ? fabs(r.kl_rev) : 0.0);
            if (c.kind == LF_KL_JSD && jsd_kp >= 0.0) return 2.0 * lr[j] + 8.0 + 2.0 * jsd_kp;
            return ratio;
        };
        int bad_elems = 0, inf_at_floor = 0;
        double worst = 0.0;
        int64_t worst_j = -1;
        for (int64_t j = 0; j < V; ++j) {
            const double gj = elem_to_f32(grow.data(), j, c.sdt), want = dx[j] * G;
            /* rev_tmin_row's finite form: where the teacher is at the floor the exact form's log2
             * p_j - log2 q_j overflows, so +inf there (the reference's p_j 3.4e38 is finite), and
             * the 16-bit fast form's where p_j (w_s - w_t) log2(e) / tau passes FLT_MAX; counted.
             * Its finite values are checked as any other. */
            if (i == rev_tmin_row && !overflowed && gj == INFINITY && ht[i][j] < -ZFLOOR) {
                ++inf_at_floor;
                continue;
            }
            const double dzdx = (double)lf_logit_xform_grad(xsr[j], 1.0f, c.cap) / c.tau;
            const double sc = fabs(G) * dzdx * scale2;
            /* (and ex2.approx.ftz flushes p_j < 2^-126 to 0: the element's own log-ratio factor times
             * that; at tau 0.05 against a spread sparse teacher it reaches hundreds of nats) */
            double e32 = sc * (pj[j] + qj[j]) *
                             (split ? rel_j(j) * (1.0 + ratio_j(j)) : rel32 * (1.0 + ratio) + 0x1p-21 * (1.0 + lsem + zmax)) +
                         sc * 0x1p-126 * (2.0 + ratio + lr[j]);
            /* a p_j that EX2 may flush (below 2^-126, with a margin for its exponent's error): its
             * whole term is lost, p_j |log p_j - log q_j| and the rest, which reaches ~1e-14 where
             * the teacher is at the floor (row 7; lrf keeps that log-ratio, lr takes it as 0) */
            if (pj[j] < 0x1p-120) e32 += sc * pj[j] * (2.0 + ratio + lrf[j]);
            if (sparse && !tracked[j]) e32 += sc * (pj[j] + qj[j]) * rest_rel * (1.0 + ratio);
            /* under the cap dz/dx = (1 - t^2) / tau from an fp32 t = tanh(x / cap): t's rounding
             * (a few 2^-24) stays in 1 - t^2 as ~2^-21 absolute, which past |x| ~ 4 cap, where
             * 1 - t^2 < 1e-3, is more than fp16's rounding of the element (seen: cap 5, fp16) */
            if (c.cap > 0.0f) e32 += fabs(G) * scale2 / c.tau * (pj[j] + qj[j]) * (1.0 + ratio) * 0x1p-21;
            if (c.kind == LF_KL_TVD && !same_rows) {
                e32 += sc * pj[j] * (band + 1e-6);
                if (fabs(pj[j] - qj[j]) <= 8.0 * rel32 * (pj[j] + qj[j])) e32 += sc * pj[j];
            }
            const double tol = unit_round * fabs(want) + e32 * (1.0 + unit_round) + fp16_abs + 1e-37;
            const double ej = lf_check_err(gj, want, tol);
            if (ej < INFINITY && ej > grad_worst) grad_worst = ej;
            if (!close(gj, want, tol)) {
                ++bad_elems;
                const double e = want != want ? INFINITY : fabs(gj - want) / tol;
                if (!(e <= worst)) {
                    worst = e;
                    worst_j = j;
                }
            }
        }
        EXPECT(bad_elems == 0, "row %lld: %d gradient elements off; worst j=%lld got %.9g want %.9g (%.3g x tol)", (long long)i,
               bad_elems, (long long)worst_j, worst_j >= 0 ? elem_to_f32(grow.data(), worst_j, c.sdt) : 0.0,
               worst_j >= 0 ? dx[worst_j] * G : 0.0, worst);
        if (i == rev_tmin_row && !overflowed) printf("     row 3: %d gradient entries +inf where the teacher is at the floor\n", inf_at_floor);
    }

    /* ---- the reduced loss ---- */
    if (c.red != LF_REDUCE_NONE) {
        const double inv = c.red == LF_REDUCE_MEAN ? (D == 0.0 ? 0.0 : 1.0 / D) : 1.0;
        if (rows.size() == (size_t)N) {
            const double want = ref_sum * inv;
            EXPECT(close(lossh[0], want, 1e-6 * fabs(want) + ref_tol * inv), "reduced loss %.9g want %.9g", lossh[0], want);
        } else {
            /* Sampled rows: the reduced loss is the sum of the rows of a forward-only launch of the
             * same schedule and plan (4e-7: only the order of one fp32 sum differs), and every one
             * of those rows is held to the double reference here, so that a row the sample missed
             * cannot be wrong in both. The references run on host threads (loss only). */
            double s = 0.0;
            for (float v : all_rows) s += v;
            EXPECT(close(lossh[0], s * inv, 4e-7 * fabs(s * inv) + 1e-30), "reduced loss %.9g want %.9g (sum of rows)", lossh[0], s * inv);
            std::vector<double> rw(N), rt(N);
            host_workers([&](unsigned k, unsigned nth) {
                std::vector<double> lqb(V);
                bool rejected;
                for (int64_t i = k; i < N; i += nth) {
                    const lf_kl_row r = ref_row(i, lqb.data(), NULL, &rejected, false);
                    const bool ok_row = valid[i] != 0;
                    const double wi = ok_row ? w[i] : 0.0;
                    rw[i] = ok_row ? wi * r.loss : 0.0;
                    rt[i] = ok_row ? loss_tol(wi, r, loss_tol_abs(lse_mag(r), row_zmax(i, lqb.data()))) : 0.0;
                }
            });
            int64_t off = 0, worst_i = -1;
            double full_sum = 0.0, full_tol = 0.0;
            for (int64_t i = 0; i < N; ++i) {
                full_sum += rw[i];
                full_tol += rt[i];
                if (!close(all_rows[i], rw[i], rt[i]) && ++off == 1) worst_i = i;
            }
            EXPECT(off == 0, "%lld of %lld rows of the forward-only launch off the reference; first row %lld: %.9g want %.9g (tol %.3g)",
                   (long long)off, (long long)N, (long long)worst_i, worst_i >= 0 ? all_rows[worst_i] : 0.0,
                   worst_i >= 0 ? rw[worst_i] : 0.0, worst_i >= 0 ? rt[worst_i] : 0.0);
            EXPECT(close(lossh[0], full_sum * inv, 1e-6 * fabs(full_sum * inv) + full_tol * inv),
                   "reduced loss %.9g want %.9g (every row's reference)", lossh[0], full_sum * inv);
        }
    }

    /* ---- determinism: every output poisoned again, relaunched, the same bits ---- */
    if (c.determinism) {
        const size_t gbytes = (c.grad == 1 ? (size_t)N * gs : nel_s) * es;
        auto outputs_hash = [&]() { /* the gradient, and the loss and per-row outputs (poisoned where not asked for) */
            unsigned long long h = c.grad ? device_checksum(c.grad == 1 ? gbuf.p : xs.p, gbytes) : 0;
            for (DevBuf *b : {&loss, &kf, &kr, &ens, &ent}) h = mix64(h ^ device_checksum(b->p, b->bytes));
            return h;
        };
        auto relaunch = [&](const kl_args &b) {
            for (DevBuf *o : {&loss, &kf, &kr, &ens, &ent}) fill_poison(o->p, o->bytes / 4, LF_F32);
            poison_ws_divisor(ws.p);
            if (c.grad == 1) poison_grad();
            if (c.grad == 2) { /* the student as the first launch had it: generated, then the planted rows */
                gen_student(xs.p, c.sdt, N, V, ss, seed_s, c.outlier);
                for (int64_t i : rewritten) write_row(i);
            }
            CK(cudaDeviceSynchronize());
            cudaError_t e2;
            EXPECT(kl_launch(&b, 0, &e2) == LF_OK, "relaunch failed: %s", cudaGetErrorString(e2));
            CK(cudaDeviceSynchronize());
            return outputs_hash();
        };
        const unsigned long long h1 = outputs_hash();
        for (int rep = 0; rep < 2; ++rep) EXPECT(relaunch(a) == h1, "outputs not bit-identical across runs (relaunch %d)", rep);
        /* resident: the other way of handing out rows (dynamic <-> a fixed share per cluster) must
         * give the same bits: a row's work does not depend on its CTA, and the batch sum adds the
         * rows in row order */
        if (plan.schedule == KL_SCHED_RESIDENT) {
            kl_args b = a;
            kl_plan plan2;
            memset(&plan2, 0, sizeof plan2);
            b.static_rows = plan.dynamic ? 1 : -1; /* static after dynamic; dynamic (where it applies) after static */
            b.plan = &plan2;
            const unsigned long long h2 = relaunch(b);
            EXPECT(plan2.schedule == KL_SCHED_RESIDENT, "relaunch: schedule %d", plan2.schedule);
            if (plan.dynamic || c.static_rows || c.expect_dynamic == 0)
                EXPECT(plan2.dynamic == !plan.dynamic, "relaunch: dynamic %d after %d", plan2.dynamic, plan.dynamic);
            EXPECT(h2 == h1, "outputs differ between dynamic %d and %d", plan.dynamic, plan2.dynamic);
            /* and with side CTAs the other way (none after some; 8, drawing from the first row on,
             * after none): the rows they took have the bits the clusters give them */
            b = a;
            b.static_rows = -1;
            b.side_ctas = plan.side_ctas > 0 ? -1 : 8;
            b.side_take_rest = 0;
            memset(&plan2, 0, sizeof plan2);
            b.plan = &plan2;
            const unsigned long long h3 = relaunch(b);
            kl_ws_header wh3;
            CK(cudaMemcpy(&wh3, ws.p, sizeof wh3, cudaMemcpyDeviceToHost));
            EXPECT(h3 == h1, "outputs differ with %d side CTAs (%u rows) and %d", plan2.side_ctas, wh3.side_rows_last,
                   plan.side_ctas);
            if (plan2.side_ctas > 0) {
                printf("     relaunch: %d side CTAs took %u of %lld rows\n", plan2.side_ctas, wh3.side_rows_last, (long long)N);
                /* full size (not under compute-sanitizer, which may run the grids one after the
                 * other), SMs left idle by the clusters: rows enough that the side CTAs, resident
                 * beside the clusters, take some (on a full device they start as clusters end) */
                if (!g_small && N >= 1000 && plan2.ctas < g_sms) EXPECT(wh3.side_rows_last > 0, "%d side CTAs took no row of %lld", plan2.side_ctas, (long long)N);
            }
            /* JSD with a gradient: pass 2's values kept for the gradient pass (the default, as
             * many units as fit beside the stages) or computed again (jsd_keep -1): the same bits */
            if (c.kind == LF_KL_JSD && c.grad) {
                b = a;
                b.jsd_keep = -1;
                memset(&plan2, 0, sizeof plan2);
                b.plan = &plan2;
                const unsigned long long h4 = relaunch(b);
                EXPECT(h4 == h1, "outputs differ with jsd_keep -1 and the default (%d of %d units kept)", plan.jsd_keep,
                       plan.piece_units);
                EXPECT(plan2.jsd_keep == 0, "jsd_keep -1: %d units kept", plan2.jsd_keep);
                printf("     jsd_keep: %d of %d units kept (cluster %d, %d stages)\n", plan.jsd_keep, plan.piece_units,
                       plan.cluster, plan.stages);
            }
        }
    }
    if (c.grad) printf("%-4s %s (gradient: worst %.3g of its bound)\n", g_fail == fails_before ? "ok" : "FAIL", g_case, grad_worst);
    else printf("%-4s %s\n", g_fail == fails_before ? "ok" : "FAIL", g_case);
    fflush(stdout);
}

/* A sweep of sparse-teacher cases: each of the nkl kinds x both rest modes over the vocabularies
 * Vs, k = ks[t % nk] in turn (at most V; every entry, at most kmax, in every all_every-th case at
 * V <= 1000), gradient modes and temperatures in turn, the statistics asked for; tweak(c, t)
 * sets the rest (t: the case's index). */
template <typename F>
static void sparse_sweep(const char *name, const lf_kl_kind *kl, int nkl, const int64_t *Vs, int nVs, const int64_t *ks, int nk,
                         int all_every, int64_t kmax, F &&tweak)
{
    int t = 0;
    for (int vi = 0; vi < nVs; ++vi)
        for (int q = 0; q < nkl; ++q)
            for (lf_kl_rest rm : {LF_KL_REST_DROP, LF_KL_REST_SPREAD}) {
                Case c;
                c.name = name;
                c.V = Vs[vi];
                c.kind = kl[q];
                c.rest = rm;
                c.topk = std::min<int64_t>(ks[t % nk], c.V);
                if (t % all_every == all_every - 1 && c.V <= 1000) c.topk = std::min<int64_t>(c.V, kmax); /* (the check is k^2) */
                c.grad = t % 4 == 3 ? 0 : 1 + t % 2;
                c.stats = true;
                c.tau = t % 3 == 1 ? 2.0f : 1.0f;
                tweak(c, t);
                ++t;
                run_case(c);
            }
}

/* the base of the sparse-teacher option cases: 20 pairs per row, every row checked */
static Case sparse_base(lf_kl_kind kd, int64_t V)
{
    Case b;
    b.V = V;
    b.N = g_small ? 9 : 41;
    b.kind = kd;
    b.topk = 20;
    b.check_all = true;
    return b;
}

/* ---------------------------------------------------------------- special cases ------------ */

static void test_arguments(void)
{
    snprintf(g_case, sizeof g_case, "argument checks");
    DevBuf xs(64 * 4), xt(64 * 4), l(64 * 4), ws(kl_workspace_bytes(64));
    kl_args a = kl_args_default();
    a.student = xs.p;
    a.teacher = xt.p;
    a.n_rows = 4;
    a.vocab = 8;
    a.s_stride = a.t_stride = 8;
    a.loss = (float *)l.p;
    a.workspace = ws.p;
    a.workspace_bytes = ws.bytes;
    cudaError_t ce;
    kl_args b = a;
    b.t_stride = 7;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_SIZE, "teacher stride < V accepted");
    b = a;
    b.opts.temperature = 0.0f;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "temperature 0 accepted");
    b = a;
    b.opts.beta = 1.5f;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "beta 1.5 accepted");
    b = a;
    b.teacher_kind = (kl_teacher_kind)7;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "teacher kind 7 accepted");
    b = a;
    b.workspace_bytes = 8;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_SIZE, "small workspace accepted");
    b = a;
    b.grad = xt.p; /* over the teacher */
    b.grad_stride = 8;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "gradient over the teacher accepted");
    b = a;
    b.grad = (char *)xs.p + 2;
    b.grad_stride = 8;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "gradient overlapping the student accepted");
    b = a;
    b.teacher = NULL;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_NULL, "NULL teacher accepted");
    b = a;
    b.schedule = 3;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "schedule 3 accepted");
    b = a;
    b.stages = 2;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "2 stages accepted");
    b = a;
    b.static_rows = 2;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "static_rows 2 accepted");
    b.static_rows = -2;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "static_rows -2 accepted");
    b = a;
    b.side_ctas = -2;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "side_ctas -2 accepted");
    b.side_ctas = 4097;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "side_ctas 4097 accepted");
    b.side_ctas = 0;
    b.jsd_keep = -2;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "jsd_keep -2 accepted");
    b.jsd_keep = 1;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "jsd_keep 1 accepted");
    b.jsd_keep = 0;
    b.side_take_rest = 2;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "side_take_rest 2 accepted");
    b = a;
    b.s_dtype = b.t_dtype = LF_F32;
    b.schedule = KL_SCHED_RESIDENT;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "resident schedule with fp32 rows accepted");
    /* a sparse teacher's arguments */
    DevBuf ki(64 * 4), kp(64 * 4);
    kl_args sp = a;
    sp.teacher = NULL;
    sp.topk_idx = (const int32_t *)ki.p;
    sp.topk_lp = (const float *)kp.p;
    sp.topk = 4;
    sp.topk_stride = 4;
    b = sp;
    b.teacher = xt.p;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "dense and sparse teacher together accepted");
    b = sp;
    b.schedule = KL_SCHED_RESIDENT; /* the soft-target path takes forward KL, soft CE and reverse KL only */
    b.opts.kind = LF_KL_JSD;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "resident schedule with a sparse teacher's JSD accepted");
    b.opts.kind = LF_KL_REVERSE; /* ... reverse KL without kl_fwd and ent_s */
    b.kl_fwd = (float *)l.p;     /* (not written: refused before any launch) */
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "resident schedule with a sparse teacher's reverse KL and kl_fwd accepted");
    b.kl_fwd = NULL;
    b.ent_s = (float *)l.p;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "resident schedule with a sparse teacher's reverse KL and ent_s accepted");
    b.ent_s = NULL;
    b.opts.kind = LF_KL_FORWARD;
    b.kl_rev = (float *)l.p; /* (not written: refused before any launch) */
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "resident schedule with a sparse teacher and kl_rev accepted");
    b.kl_rev = NULL;
    b.s_dtype = LF_F32;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "resident schedule with a sparse teacher and an fp32 student accepted");
    b = sp;
    b.topk = 9;
    b.topk_stride = 9;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_SIZE, "k > V accepted");
    b = sp;
    b.topk_stride = 3;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_SIZE, "top-k stride < k accepted");
    b = sp;
    b.topk_rest = (lf_kl_rest)5;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "rest mode 5 accepted");
    b = sp;
    b.topk_lp = NULL;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_NULL, "NULL top-k log-probs accepted");
    b = sp;
    b.grad = ki.p; /* over the pair list */
    b.grad_stride = 8;
    EXPECT(kl_launch(&b, 0, &ce) == LF_ERR_ARG, "gradient over the top-k indices accepted");
    b = a;
    b.n_rows = 0;
    fill_poison(l.p, 1, LF_F32);
    EXPECT(kl_launch(&b, 0, &ce) == LF_OK, "N = 0 rejected");
    CK(cudaDeviceSynchronize());
    float lh;
    CK(cudaMemcpy(&lh, l.p, 4, cudaMemcpyDeviceToHost));
    EXPECT(lh == 0.0f, "N = 0 loss %g, want 0", lh);
    printf("%-4s %s\n", "ok", g_case);
}

/* A captured graph replays to the same bits as the eager launch: JSD (streamed by the automatic
 * plan at this V) and forward KL (on sm_90 the resident schedule with dynamic rows: each replay
 * must find the workspace's row counter reset by the launch before; with a mask, so the mean's
 * divisor kernel is captured too, and the workspace's divisor is poisoned before each replay). */
static void test_graph(lf_kl_kind kind)
{
    snprintf(g_case, sizeof g_case, "graph capture + replay (%s)", kind == LF_KL_JSD ? "JSD" : "forward KL");
    const int64_t N = g_small ? 33 : 1024, V = g_small ? 3001 : 50257;
    DevBuf xs(N * V * 2), xt(N * V * 2), g(N * V * 2), l(4), ws(kl_workspace_bytes(N));
    gen_student(xs.p, LF_BF16, N, V, V, mix64(g_seed + 99), 40.0f);
    gen_teacher_any(xt.p, LF_BF16, N, V, V, V, mix64(g_seed + 99), mix64(g_seed + 98), 40.0f, 1.5f);
    CK(cudaMemset(ws.p, 0, ws.bytes));
    /* forward KL: a mask byte per row (every 5th row masked), so the mean's divisor kernel is in
     * the graph too (without a mask the divisor is N, known on the host) */
    DevBuf mk(N);
    std::vector<uint8_t> mh(N);
    for (int64_t i = 0; i < N; ++i) mh[i] = i % 5 != 3;
    CK(cudaMemcpy(mk.p, mh.data(), N, cudaMemcpyHostToDevice));
    kl_args a = kl_args_default();
    a.student = xs.p;
    a.teacher = xt.p;
    a.n_rows = N;
    a.vocab = V;
    a.s_stride = a.t_stride = V;
    if (kind == LF_KL_FORWARD) a.mask = (const uint8_t *)mk.p;
    a.opts.kind = kind;
    a.loss = (float *)l.p;
    a.grad = g.p;
    a.grad_stride = V;
    a.workspace = ws.p;
    a.workspace_bytes = ws.bytes;
    kl_plan pl;
    memset(&pl, 0, sizeof pl);
    a.plan = &pl;
    cudaError_t ce;
    EXPECT(kl_launch(&a, 0, &ce) == LF_OK, "eager launch");
    CK(cudaDeviceSynchronize());
    a.plan = NULL;
    if (g_cc_major >= 9 && kind == LF_KL_FORWARD)
        EXPECT(pl.schedule == KL_SCHED_RESIDENT && pl.dynamic == 1, "plan: schedule %d dynamic %d, want resident, dynamic",
               pl.schedule, pl.dynamic);
    float l0;
    CK(cudaMemcpy(&l0, l.p, 4, cudaMemcpyDeviceToHost));
    const unsigned long long h0 = device_checksum(g.p, N * V * 2);
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    const lf_status st = kl_launch(&a, s, &ce);
    CK(cudaStreamEndCapture(s, &graph));
    EXPECT(st == LF_OK, "launch under capture: %s", cudaGetErrorString(ce));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    for (int r = 0; r < 3; ++r) {
        CK(cudaMemset(g.p, 0xff, N * V * 2));
        fill_poison(l.p, 1, LF_F32); /* written by the replay's last CTA only: a stale count would leave it */
        poison_ws_divisor(ws.p);      /* the replay's divisor kernel writes it before any read */
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

/* lossfuse_cuda.cuh section 8's usage kernel, as its doc comment writes it (keep the two the
 * same): forward KL of a bf16 pair, one CTA per row, the whole pair staged once, the gradient
 * in place over the student. Run here against lf_ref_kl_row, so that the pattern the header
 * teaches is tested, not only compiled. */
typedef __nv_bfloat16 bf;
__global__ void row_kl_fwd(bf *xs_all, const bf *xt_all, int64_t V, float tau, float *loss)
{
    extern __shared__ uint4 buf[];
    __shared__ lf_dual_acc red[256 / 32];
    bf *xs = xs_all + blockIdx.x * V;
    const bf *xt = xt_all + blockIdx.x * V;
    const lf_kl_xf xf = lf_kl_xf_make(tau, LF_SIDE_LOGITS, 0.0f, LF_SIDE_LOGITS, 0.0f, true);
    const lf_dual_span sp = lf_dual_span_make(xs, xt, V);
    const int nu = sp.nunit; // one piece of every unit of the row
    uint4 *bs = buf, *bt = buf + lf_dual_part_vecs<bf>(nu);
    lf_dual_piece_load<256, bf, bf>(bs, bt, xs, xt, sp, 0, nu, nu);
    lf_cp_async_commit();
    lf_cp_async_wait<0>(); // a thread reads back only its own copies
    lf_dual_acc acc = lf_dual_acc_init();
    lf_dual_edge_stats<256, bf, bf, true, LF_DUAL_FULL>(acc, xs, xt, sp, xf);
    lf_dual_piece_stats<256, bf, bf, true, LF_DUAL_FULL>(acc, bs, bt, nu, nu, xf);
    acc = lf_block_dual_acc<256>(acc, xf.cs, red); // the row's state, in every thread
    const lf_dual_out o = lf_dual_final(lf_dual_acc_final(acc, xf));
    const lf_kl_coef c = lf_kl_coef_make(LF_KL_FORWARD, 0.0f, 1.0f, o, xf, true);
    lf_kl_piece_grad<256, bf, bf, true>(xs, true, bs, bt, sp, 0, nu, nu, xf, c);
    lf_kl_edge_grad<256, bf, bf, true>(xs, xs, xt, sp, xf, c); // each element: one owner
    if (threadIdx.x == 0) loss[blockIdx.x] = o.kl_fwd;
}

/* Eight rows of V in {1, 7, 1000, 4099, 32768} (V = 4099: the rows start at all eight
 * alignments of a 16-byte vector, so the edge forms run; V = 7: no body) at tau 1 and 0.5, data as the sweep's (outliers, teacher = student + noise),
 * every row checked: the loss as run_case's forward KL (1e-5 relative + 2^-19 (1 + |lse_s| +
 * |lse_t| + max |z| + log V) absolute), each gradient element within bf16's rounding (2^-8
 * relative) plus the fp32 work, 2^-20 (p + q)(1 + |lse_s| + |lse_t| + max |z|) / tau, and
 * EX2's flush (2^-125 / tau). The loss is poisoned first; the gradient overwrites the logits,
 * so an element not written keeps a logit, far off the reference. */
static void test_quickstart(void)
{
    const int64_t Vs[5] = {1, 7, 1000, 4099, 32768};
    const int64_t N = 8; /* at V = 4099, rows at all 8 alignments of a 16-byte vector */
    CK(cudaFuncSetAttribute(row_kl_fwd, cudaFuncAttributeMaxDynamicSharedMemorySize, 32 * (32768 / 8 + 1)));
    for (int vi = 0; vi < (g_small ? 4 : 5); ++vi)
        for (int ti = 0; ti < 2; ++ti) {
            const int64_t V = Vs[vi];
            const float tau = ti ? 0.5f : 1.0f;
            snprintf(g_case, sizeof g_case, "quickstart row_kl_fwd V=%lld tau=%g", (long long)V, tau);
            if (g_only && !strstr(g_case, g_only)) continue;
            DevBuf xs(N * V * 2), xt(N * V * 2), l(N * 4);
            const uint64_t ss = mix64(g_seed + 500 + vi * 2 + ti), st = mix64(ss + 1);
            gen_student(xs.p, LF_BF16, N, V, V, ss, 40.0f);
            gen_teacher_any(xt.p, LF_BF16, N, V, V, V, ss, st, 40.0f, 1.5f);
            fill_poison(l.p, N, LF_F32);
            std::vector<uint16_t> hs(N * V), ht(N * V), hg(N * V);
            std::vector<float> hl(N);
            CK(cudaMemcpy(hs.data(), xs.p, N * V * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(ht.data(), xt.p, N * V * 2, cudaMemcpyDeviceToHost));
            row_kl_fwd<<<(unsigned)N, 256, (size_t)(32 * (V / 8 + 1))>>>((bf *)xs.p, (const bf *)xt.p, V, tau, (float *)l.p);
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(hg.data(), xs.p, N * V * 2, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(hl.data(), l.p, N * 4, cudaMemcpyDeviceToHost));
            lf_kl_opts o = lf_kl_opts_default();
            o.temperature = tau;
            std::vector<float> fs(V), ft(V);
            std::vector<double> dx(V);
            for (int64_t i = 0; i < N; ++i) {
                double zmax = 0.0;
                for (int64_t j = 0; j < V; ++j) {
                    fs[j] = lf_bf16_to_f32(hs[i * V + j]);
                    ft[j] = lf_bf16_to_f32(ht[i * V + j]);
                    zmax = fmax(zmax, fmax(fabs(fs[j]), fabs(ft[j])) / tau);
                }
                const lf_kl_row r = lf_ref_kl_row(fs.data(), ft.data(), V, &o, dx.data());
                const double mag = 1.0 + fabs(r.lse_s) + fabs(r.lse_t) + zmax;
                const double tl = 1e-5 * fabs(r.loss) + 0x1p-19 * (mag + log((double)V + 1.0));
                EXPECT(close(hl[i], r.loss, tl), "row %lld loss %.9g want %.9g (tol %.3g)", (long long)i, hl[i], r.loss, tl);
                int bad = 0;
                for (int64_t j = 0; j < V; ++j) {
                    const double pj = exp(fs[j] / tau - r.lse_s), qj = exp(ft[j] / tau - r.lse_t);
                    const double g = lf_bf16_to_f32(hg[i * V + j]), want = dx[j];
                    const double tol = 0x1p-8 * fabs(want) + (0x1p-20 * (pj + qj) * mag + 0x1p-125) / tau;
                    if (!close(g, want, tol) && ++bad == 1)
                        EXPECT(false, "row %lld j=%lld gradient %.9g want %.9g (tol %.3g)", (long long)i, (long long)j, g, want, tol);
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
        printf("test_kl_gpu: no CUDA device, skipped\n");
        return 77;
    }
    if (!g_seed) g_seed = (uint64_t)time(NULL);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    g_cc_major = prop.major;
    g_sms = prop.multiProcessorCount;
    {
        int khz = 0, bits = 0;
        CK(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, 0));
        CK(cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, 0));
        g_peak_bw = 2.0 * (double)khz * 1e3 * (double)bits / 8.0;
    }
    printf("test_kl_gpu on %s (sm_%d%d), seed %llu%s\n", prop.name, prop.major, prop.minor, (unsigned long long)g_seed,
           g_small ? ", small sizes" : "");

    test_arguments();
    test_quickstart();
    test_graph(LF_KL_JSD);
    test_graph(LF_KL_FORWARD);

    const lf_dtype dts[3] = {LF_BF16, LF_F16, LF_F32};
    const lf_kl_kind kinds[5] = {LF_KL_FORWARD, LF_KL_REVERSE, LF_KL_JSD, LF_KL_SOFT_CE, LF_KL_TVD};
    const int64_t Vs_full[] = {1, 7, 31, 1000, 32000, 32768, 50257, 128256, 151936, 262144};
    const int64_t Vs_small[] = {1, 7, 31, 1000, 3001, 16385};
    const int64_t *Vs = g_small ? Vs_small : Vs_full;
    const int nV = g_small ? 6 : 10;

    /* Sweep: every V x kind with N = 3 (all rows checked), the nine dtype pairs in turn, the
     * gradient to a buffer / in place / none in turn; per V one N = 4096 (bf16 pair, the bench's
     * shape) and one N = 1 case. */
    int turn = 0;
    for (int vi = 0; vi < nV; ++vi) {
        for (int ki = 0; ki < 5; ++ki, ++turn) {
            Case c;
            c.name = "sweep";
            c.V = Vs[vi];
            c.N = 3;
            c.kind = kinds[ki];
            c.sdt = dts[turn % 3];
            c.tdt = dts[(turn / 3) % 3];
            c.grad = turn % 3 == 2 ? 0 : 1 + turn % 2;
            c.red = turn % 2 ? LF_REDUCE_NONE : LF_REDUCE_MEAN;
            c.stats = true;
            run_case(c);
        }
        Case c;
        c.name = "sweep N=4096";
        c.V = Vs[vi];
        c.N = g_small ? 300 : 4096;
        c.kind = kinds[vi % 5];
        run_case(c);
        c.name = "sweep N=1 in place, none";
        c.N = 1;
        c.kind = kinds[(vi + 2) % 5];
        c.grad = 2;
        c.red = LF_REDUCE_NONE;
        c.dloss = true;
        run_case(c);
    }

    /* Options, every kind, at two vocabularies (a one-piece row and a streamed one). */
    const int64_t Vo[2] = {1000, g_small ? 16385 : 50257};
    for (int vi = 0; vi < 2; ++vi)
        for (lf_kl_kind kd : kinds) {
            Case b;
            b.V = Vo[vi];
            b.N = g_small ? 9 : 41;
            b.kind = kd;
            b.check_all = true;
            Case c;
            c = b; c.name = "tau 0.05"; c.tau = 0.05f; c.stats = true; run_case(c);
            c = b; c.name = "tau 20 + tau^2"; c.tau = 20.0f; c.tau2 = 1; run_case(c);
            c = b; c.name = "tau 2, softcap 30, in place"; c.tau = 2.0f; c.cap = 30.0f; c.grad = 2; c.stats = true; run_case(c);
            c = b; c.name = "teacher log-probs, tau 1.5"; c.tkind = KL_TEACHER_LOGPROBS; c.tau = 1.5f; c.stats = true; run_case(c);
            c = b; c.name = "teacher probs fp32"; c.tkind = KL_TEACHER_PROBS; c.tdt = LF_F32; c.stats = true; run_case(c);
            c = b; c.name = "teacher probs bf16 + softcap"; c.tkind = KL_TEACHER_PROBS; c.cap = 20.0f; run_case(c);
            c = b; c.name = "labels mask + bad labels (int32)"; c.labels = true; c.lab64 = 0; c.bad_frac = 0.2; run_case(c);
            c = b; c.name = "mask bytes + labels, weights, none"; c.mask = true; c.labels = true; c.weights = true; c.red = LF_REDUCE_NONE; c.dloss = true; run_case(c);
            c = b; c.name = "weights, sum, dloss, grad_scale 2"; c.weights = true; c.red = LF_REDUCE_SUM; c.dloss = true; c.grad_scale = 2.0f; run_case(c);
            c = b; c.name = "mean, device divisor"; c.dev_divisor = true; run_case(c);
            c = b; c.name = "strides +5 / +3, in place"; c.spad = 5; c.tpad = 3; c.grad = 2; run_case(c);
            c = b; c.name = "grad stride +3"; c.spad = 2; c.gpad = 3; run_case(c);
            c = b; c.name = "unaligned pair (teacher +1 elem)"; c.t_offset = 1; c.stats = true; run_case(c);
            c = b; c.name = "fp32 student, bf16 teacher +1"; c.sdt = LF_F32; c.t_offset = 1; run_case(c);
            c = b; c.name = "identical rows"; c.noise = 0.0f; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
            c = b; c.name = "-inf masks, support mismatch"; c.plant_masks = true; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
            c = b; c.name = "NaN and +inf rows"; c.plant_nonfinite = true; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
            c = b; c.name = "NaN rows, mean"; c.plant_nonfinite = true; run_case(c);
            c = b; c.name = "huge logits 1e4"; c.outlier = 1e4f; c.stats = true; run_case(c);
            c = b; c.name = "huge logits 1e4, fp32 student"; c.outlier = 1e4f; c.sdt = LF_F32; c.red = LF_REDUCE_NONE; run_case(c);
            c = b; c.name = "tau 0.05, fp32 student"; c.tau = 0.05f; c.sdt = LF_F32; c.stats = true; run_case(c);
            c = b; c.name = "tau 2, softcap 30, fp32 student"; c.tau = 2.0f; c.cap = 30.0f; c.sdt = LF_F32; run_case(c);
            c = b; c.name = "teacher probs fp32, fp32 student"; c.tkind = KL_TEACHER_PROBS; c.sdt = c.tdt = LF_F32; run_case(c);
            c = b; c.name = "close large maxima, stats"; c.plant_close = true; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
            c = b; c.name = "close large maxima, tau 2, in place, no stats"; c.plant_close = true; c.tau = 2.0f; c.grad = 2; c.red = LF_REDUCE_NONE; run_case(c);
            c = b; c.name = "close large maxima, fp32 pair, stats"; c.plant_close = true; c.sdt = c.tdt = LF_F32; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
            c = b; c.name = "close large maxima, fp32 student, bf16 teacher, in place"; c.plant_close = true; c.sdt = LF_F32; c.stats = true; c.grad = 2; c.red = LF_REDUCE_NONE; run_case(c);
            c = b; c.name = "close large maxima, unaligned pair (teacher +1 elem), fp16 pair"; c.plant_close = true; c.sdt = c.tdt = LF_F16; c.t_offset = 1; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
            c = b; c.name = "close large maxima, fp32 pair, tau 2, stats"; c.plant_close = true; c.sdt = c.tdt = LF_F32; c.tau = 2.0f; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
            c = b; c.name = "bf16 finfo.min entries, no stats"; c.plant_fmin = true; c.red = LF_REDUCE_NONE; run_case(c); /* the fast forms */
            c = b; c.name = "-inf masks, no stats"; c.plant_masks = true; c.red = LF_REDUCE_NONE; run_case(c);
            c = b; c.name = "spikes 87.7 nats over the floor"; c.plant_spikes = true; c.red = LF_REDUCE_NONE; run_case(c); /* no stats: the lazy shifts */
            c = b; c.name = "all masked"; c.labels = true; c.ignore_frac = 1.0; c.stats = true; run_case(c);
            c = b; c.name = "forward only, stats"; c.grad = 0; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
        }
    for (float beta : {0.0f, 1.0f, 0.1f, 0.9f}) { /* JSD's ends are the two KLs (checked against them) */
        Case c;
        c.name = beta == 0.0f ? "JSD beta 0 (= forward KL)" : beta == 1.0f ? "JSD beta 1 (= reverse KL)" : "JSD beta";
        c.kind = LF_KL_JSD;
        c.beta = beta;
        c.N = 17;
        c.V = 4099;
        c.stats = true;
        run_case(c);
    }

    /* Sparse (top-k) teachers: every kind x both rest modes over the vocabularies, k from 0 to
     * V and past the shared-memory pair list (KL_TOPK_SMEM), dtypes and outputs in turn. */
    {
        const int64_t Vsp_full[] = {1, 7, 31, 1000, 32768, 50257, 151936}, Vsp_small[] = {1, 7, 31, 1000, 16385};
        const int64_t *Vsp = g_small ? Vsp_small : Vsp_full;
        const int nVsp = g_small ? 5 : 7;
        const int64_t ks[5] = {0, 1, 7, 64, KL_TOPK_SMEM + 44};
        sparse_sweep("sparse sweep", kinds, 5, Vsp, nVsp, ks, 5, 7, INT64_MAX, [&](Case &c, int t) {
            c.N = 5;
            c.sdt = dts[t % 3];
            c.red = t % 2 ? LF_REDUCE_NONE : LF_REDUCE_MEAN;
        });
        for (lf_kl_kind kd : kinds)
            for (int64_t V : {(int64_t)1000, g_small ? (int64_t)16385 : (int64_t)128256}) {
                const Case b = sparse_base(kd, V);
                Case c;
                c = b; c.name = "sparse tau 0.05"; c.tau = 0.05f; c.stats = true; run_case(c);
                c = b; c.name = "sparse drop, tau 20 + tau^2"; c.rest = LF_KL_REST_DROP; c.tau = 20.0f; c.tau2 = 1; run_case(c);
                c = b; c.name = "sparse softcap 30, tau 2, in place"; c.cap = 30.0f; c.tau = 2.0f; c.grad = 2; c.stats = true; run_case(c);
                c = b; c.name = "sparse labels + bad labels, weights"; c.labels = true; c.bad_frac = 0.2; c.weights = true; run_case(c);
                c = b; c.name = "sparse none, dloss, strides +5 / k+3"; c.red = LF_REDUCE_NONE; c.dloss = true; c.spad = 5; c.kpad = 3; run_case(c);
                c = b; c.name = "sparse planted pairs"; c.plant_topk = true; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
                c = b; c.name = "sparse planted pairs, drop, mean"; c.plant_topk = true; c.rest = LF_KL_REST_DROP; run_case(c);
                /* the prep's hash table with pairs in every register (KL_PREP_REG), and its compares past it */
                c = b; c.name = "sparse planted pairs, 512 pairs"; c.plant_topk = true; c.topk = 512; c.red = LF_REDUCE_NONE; run_case(c);
                c = b; c.name = "sparse planted pairs, 600 pairs"; c.plant_topk = true; c.topk = 600; c.red = LF_REDUCE_NONE; run_case(c);
                if (V == 1000) { /* more rows than the prep's warps: tables reused, repeats in second rows */
                    c = b; c.name = "sparse planted pairs, 40000 rows of 64"; c.plant_topk = true; c.N = 40000; c.topk = 64;
                    run_case(c);
                }
                c = b; c.name = "sparse -inf masks"; c.plant_masks = true; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
                c = b; c.name = "sparse fp32 student, 300 pairs"; c.sdt = LF_F32; c.topk = 300; c.stats = true; run_case(c);
                c = b; c.name = "sparse all masked"; c.labels = true; c.ignore_frac = 1.0; run_case(c);
            }
        Case c;
        c.name = "sparse determinism, JSD in place";
        c.kind = LF_KL_JSD;
        c.N = g_small ? 40 : 2048;
        c.V = g_small ? 16385 : 151936;
        c.topk = 100;
        c.grad = 2;
        c.determinism = true;
        run_case(c);
        c.name = "sparse 200000 rows";
        c.kind = LF_KL_FORWARD;
        c.N = 200000;
        c.V = g_small ? 7 : 31;
        c.topk = 5;
        c.grad = 1;
        c.determinism = false;
        c.labels = true;
        c.bad_frac = 0.01;
        run_case(c);
    }

    /* A sparse teacher's forward KL, soft CE and reverse KL on the soft-target path
     * (kl_launch_soft: the cross-entropy kernel with a soft target, ce_soft / ce_soft_rev, sm_90,
     * 16-bit students), forced (below sm_90 the automatic plan, checked the same), at every
     * vocabulary from 1 to 262144, k from 0 to KL_SOFT_MAX_K, both rest modes and 16-bit dtypes,
     * every option and planted value; the statistics each has (forward KL and soft CE: kl_fwd,
     * ent_s, ent_t; reverse KL: kl_rev, ent_t). (The sparse cases above without statistics take
     * this path too where the plan is automatic.) */
    {
        const int sched = g_cc_major >= 9 ? KL_SCHED_RESIDENT : KL_SCHED_AUTO;
        const int want = g_cc_major >= 9 ? 1 : 0;
        const int64_t Vs_full[] = {1, 7, 31, 1000, 4099, 32768, 50257, 151936, 262144}, Vs_small[] = {1, 7, 31, 1000, 16385};
        const int64_t *Vs = g_small ? Vs_small : Vs_full;
        const int nVs = g_small ? 5 : 9;
        const int64_t ks[6] = {0, 1, 7, 64, 300, KL_SOFT_MAX_K};
        const lf_kl_kind soft_kinds[3] = {LF_KL_FORWARD, LF_KL_SOFT_CE, LF_KL_REVERSE};
        sparse_sweep("soft target sweep", soft_kinds, 3, Vs, nVs, ks, 6, 5, KL_SOFT_MAX_K, [&](Case &c, int t) {
            c.N = 7;
            c.sdt = t % 2 ? LF_F16 : LF_BF16;
            c.red = t % 3 == 0 ? LF_REDUCE_NONE : t % 3 == 1 ? LF_REDUCE_MEAN : LF_REDUCE_SUM;
            c.no_rev = c.kind != LF_KL_REVERSE;
            c.no_fwd = c.kind == LF_KL_REVERSE;
            c.schedule = sched;
            c.soft = want;
        });
        for (lf_kl_kind kd : soft_kinds)
            for (int64_t V : {(int64_t)1000, g_small ? (int64_t)16385 : (int64_t)128256}) {
                Case b = sparse_base(kd, V);
                b.schedule = sched;
                b.soft = want;
                b.no_rev = kd != LF_KL_REVERSE;
                b.no_fwd = kd == LF_KL_REVERSE;
                Case c;
                c = b; c.name = "soft target tau 0.05"; c.tau = 0.05f; c.stats = true; run_case(c);
                c = b; c.name = "soft target drop, tau 20 + tau^2"; c.rest = LF_KL_REST_DROP; c.tau = 20.0f; c.tau2 = 1; run_case(c);
                c = b; c.name = "soft target softcap 30, tau 2, in place"; c.cap = 30.0f; c.tau = 2.0f; c.grad = 2; c.stats = true; run_case(c);
                c = b; c.name = "soft target softcap 5, fp16, drop"; c.cap = 5.0f; c.sdt = LF_F16; c.rest = LF_KL_REST_DROP; run_case(c);
                c = b; c.name = "soft target labels + bad labels, mask, weights"; c.labels = true; c.bad_frac = 0.2; c.mask = true; c.weights = true; run_case(c);
                c = b; c.name = "soft target none, dloss, strides +5 / k+3"; c.red = LF_REDUCE_NONE; c.dloss = true; c.spad = 5; c.kpad = 3; run_case(c);
                c = b; c.name = "soft target sum, dloss, grad scale 3"; c.red = LF_REDUCE_SUM; c.dloss = true; c.grad_scale = 3.0f; run_case(c);
                c = b; c.name = "soft target mean, device divisor, weights"; c.dev_divisor = true; c.weights = true; run_case(c);
                c = b; c.name = "soft target planted pairs"; c.plant_topk = true; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
                c = b; c.name = "soft target planted pairs, drop, mean"; c.plant_topk = true; c.rest = LF_KL_REST_DROP; run_case(c);
                c = b; c.name = "soft target planted pairs, 300 pairs"; c.plant_topk = true; c.topk = 300; c.stats = true; run_case(c);
                if (V == 1000) {
                    c = b; c.name = "soft target planted pairs, 40000 rows of 64"; c.plant_topk = true; c.N = 40000; c.topk = 64;
                    run_case(c);
                }
                c = b; c.name = "soft target -inf masks"; c.plant_masks = true; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
                c = b; c.name = "soft target -inf masks, drop"; c.plant_masks = true; c.rest = LF_KL_REST_DROP; c.stats = true; run_case(c);
                c = b; c.name = "soft target NaN / inf rows"; c.plant_nonfinite = true; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
                c = b; c.name = "soft target all masked"; c.labels = true; c.ignore_frac = 1.0; run_case(c);
                /* where fp32 flushes the target's mass, the student's -inf entries still make +inf */
                c = b; c.name = "soft target -inf masks, tau 0.05"; c.plant_masks = true; c.tau = 0.05f; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
                c = b; c.name = "soft target a deep pair at -inf"; c.plant_deep = true; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
                c = b; c.name = "soft target finfo.min entries"; c.plant_fmin = true; c.red = LF_REDUCE_NONE; run_case(c);
                c = b; c.name = "soft target finfo.min entries, drop, in place"; c.plant_fmin = true; c.rest = LF_KL_REST_DROP; c.grad = 2; c.red = LF_REDUCE_NONE; run_case(c);
            }
        /* the automatic plan: the soft-target path where it applies, the streamed one where not */
        Case b;
        b.name = "soft target automatic plan";
        b.V = 32768;
        b.N = 33;
        b.topk = 64;
        Case c;
        c = b; c.soft = want; run_case(c);
        c = b; c.kind = LF_KL_SOFT_CE; c.soft = want; c.grad = 0; run_case(c);
        c = b; c.name = "soft target automatic plan: jsd beta 0"; c.kind = LF_KL_JSD; c.beta = 0.0f; c.soft = want; run_case(c);
        c = b; c.name = "soft target automatic plan: kl_rev asked"; c.stats = true; c.soft = 0; run_case(c);
        c = b; c.name = "soft target automatic plan: k past the limit"; c.topk = KL_SOFT_MAX_K + 1; c.soft = 0; run_case(c);
        c = b; c.name = "soft target automatic plan: fp32 student"; c.sdt = LF_F32; c.soft = 0; run_case(c);
        c = b; c.name = "soft target automatic plan: reverse KL"; c.kind = LF_KL_REVERSE; c.soft = want; run_case(c);
        c = b; c.name = "soft target automatic plan: jsd beta 1"; c.kind = LF_KL_JSD; c.beta = 1.0f; c.soft = want; run_case(c);
        c = b; c.name = "soft target automatic plan: reverse KL, kl_fwd asked"; c.kind = LF_KL_REVERSE; c.stats = true; c.soft = 0; run_case(c);
        c = b; c.name = "soft target automatic plan: reverse KL, kl_rev and ent_t asked"; c.kind = LF_KL_REVERSE; c.stats = true;
        c.no_fwd = true; c.soft = want; run_case(c);
        c = b; c.name = "soft target automatic plan: streamed by request"; c.schedule = KL_SCHED_STREAM; c.soft = 0; run_case(c);
        /* kl_args.static_rows and stages reach the cross-entropy ring (a fixed share per CTA; a
         * fourth stage) */
        c = b; c.name = "soft target static rows"; c.schedule = sched; c.static_rows = 1; c.expect_dynamic = 0; c.soft = want; run_case(c);
        c = b; c.name = "soft target 4 stages, V 131072"; c.V = 131072; c.N = 17; c.stages = 4; c.schedule = sched; c.soft = want; run_case(c);
        c = b; c.name = "soft target determinism, in place"; c.N = g_small ? 40 : 2048; c.V = g_small ? 16385 : 151936;
        c.topk = 100; c.grad = 2; c.determinism = true; c.schedule = sched; c.soft = want; run_case(c);
        c.name = "soft target reverse KL determinism, in place"; c.kind = LF_KL_REVERSE; run_case(c);
        c = b; c.name = "soft target 200000 rows"; c.N = 200000; c.V = g_small ? 7 : 31; c.topk = 5; c.labels = true;
        c.bad_frac = 0.01; c.schedule = sched; c.soft = want; run_case(c);
        c = b; c.name = "soft target 30000 rows, mask, weights, mean"; c.N = 30000; c.V = g_small ? 7 : 300; c.topk = 5; c.labels = true;
        c.mask = true; c.weights = true; c.determinism = true; c.schedule = sched; c.soft = want; run_case(c);
        if (!g_small) { /* rows x V > 2^31: 64-bit offsets, gradient in place */
            c = b; c.name = "soft target N*V > 2^31 in place"; c.N = 8193; c.V = 262144; c.grad = 2; c.schedule = sched; c.soft = want;
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
        run_case(c);
        c.name = "determinism JSD in place";
        c.kind = LF_KL_JSD;
        c.N = g_small ? 20 : 512;
        c.V = g_small ? 40000 : 151936;
        c.grad = 2;
        run_case(c);
    }

    /* The two schedules side by side (the automatic plan takes the row-resident one for a 16-bit
     * pair with a gradient on sm_90, and the options above ran on it there): the streamed one
     * forced on the same cases, and resident plans off the automatic path -- clusters of 3 (the
     * pass-1 and pass-2 exchanges), the smallest and the largest ring, rows that leave a CTA of
     * the cluster without units, the automatic plan's choice, determinism over a cluster. */
    if (g_cc_major >= 9) {
        for (lf_kl_kind kd : kinds) {
            Case b;
            b.V = g_small ? 16385 : 50257;
            b.N = g_small ? 9 : 41;
            b.kind = kd;
            b.check_all = true;
            Case c;
            c = b; c.name = "streamed forced, masks + weights, in place"; c.schedule = KL_SCHED_STREAM; c.labels = true; c.bad_frac = 0.1; c.weights = true; c.grad = 2; run_case(c);
            c = b; c.name = "resident clusters of 3, stats, NaN rows"; c.schedule = KL_SCHED_RESIDENT; c.max_cluster = 3; c.expect_cluster = g_small ? 0 : 3; c.stats = true; c.plant_nonfinite = true; c.red = LF_REDUCE_NONE; run_case(c);
            c = b; c.name = "resident clusters of 3, bf16 finfo.min entries, in place"; c.schedule = KL_SCHED_RESIDENT; c.max_cluster = 3; c.expect_cluster = g_small ? 0 : 3; c.plant_fmin = true; c.grad = 2; c.red = LF_REDUCE_NONE; run_case(c);
            c = b; c.name = "resident clusters of 3, -inf masks, fp16 pair"; c.schedule = KL_SCHED_RESIDENT; c.max_cluster = 3; c.sdt = c.tdt = LF_F16; c.plant_masks = true; c.stats = true; run_case(c);
            c = b; c.name = "resident clusters of at most 5, 3 stages, strides +5 / +3"; c.schedule = KL_SCHED_RESIDENT; c.max_cluster = 5; c.stages = 3; c.spad = 5; c.tpad = 3; c.grad = 2; run_case(c);
            c = b; c.name = "resident 8 stages, tau 0.05, labels"; c.schedule = KL_SCHED_RESIDENT; c.V = 3001; c.stages = 8; c.tau = 0.05f; c.labels = true; c.bad_frac = 0.2; c.stats = true; run_case(c);
            c = b; c.name = "resident V = 100, mean, dloss"; c.schedule = KL_SCHED_RESIDENT; c.V = 100; c.dloss = true; c.stats = true; run_case(c);
            c = b; c.name = "resident V = 7 (edges only)"; c.schedule = KL_SCHED_RESIDENT; c.V = 7; c.grad = 2; run_case(c);
            c = b; c.name = "resident unaligned pair (teacher +1 elem)"; c.schedule = KL_SCHED_RESIDENT; c.t_offset = 1; c.stats = true; run_case(c);
            c = b; c.name = "resident forward only, stats"; c.schedule = KL_SCHED_RESIDENT; c.grad = 0; c.stats = true; c.red = LF_REDUCE_NONE; run_case(c);
            c = b; c.name = "resident all masked"; c.schedule = KL_SCHED_RESIDENT; c.labels = true; c.ignore_frac = 1.0; c.stats = true; run_case(c);
        }
        /* automatic plans (kl_launch_any): resident for every kind with a gradient at V = 131K,
         * 32K and 256K (clusters of 8, 2 and 16 on an H100 / H200); streamed for forward only
         * and an fp32 teacher */
        Case c;
        c.name = "automatic plan";
        c.N = g_small ? 300 : 4096;
        c.V = 131072;
        c.kind = LF_KL_REVERSE;
        c.expect_schedule = KL_SCHED_RESIDENT;
        run_case(c);
        c.name = "automatic plan, JSD";
        c.kind = LF_KL_JSD;
        c.expect_cluster = g_small ? 0 : 8;
        run_case(c);
        c.name = "automatic plan, forward only";
        c.kind = LF_KL_FORWARD;
        c.grad = 0;
        c.expect_schedule = KL_SCHED_STREAM;
        c.expect_cluster = 0;
        run_case(c);
        c.name = "automatic plan, fp32 teacher";
        c.grad = 1;
        c.tdt = LF_F32;
        run_case(c);
        c.name = "automatic plan, V = 32K";
        c.tdt = LF_BF16;
        c.V = 32768;
        c.expect_schedule = KL_SCHED_RESIDENT;
        run_case(c);
        c.name = "automatic plan, JSD, V = 32K";
        c.kind = LF_KL_JSD;
        c.expect_cluster = g_small ? 0 : 2;
        run_case(c);
        c.name = "automatic plan, V = 256K";
        c.kind = LF_KL_FORWARD;
        c.N = g_small ? 7 : 64;
        c.V = 262144;
        c.expect_cluster = g_small ? 0 : 16;
        run_case(c);
        c.name = "automatic plan, TVD, V = 256K";
        c.kind = LF_KL_TVD;
        c.expect_dynamic = 1;
        run_case(c);
        c.name = "automatic plan, JSD, V = 256K (fixed row shares)";
        c.kind = LF_KL_JSD;
        c.expect_dynamic = g_small ? -1 : 0;
        run_case(c);
        /* Dynamic rows (the default of the resident schedule): rows of one CTA (V = 16385) and
         * rows split over clusters, with enough rows that most are drawn from the counter; in a
         * cluster rank 0 hands each row and its status to its peers with pass 1's exchange (a
         * masked row still exchanges, JSD's pass 2 exchanges on its own phases). run_case's
         * determinism check relaunches the other way (static) and requires the same bits, after
         * poisoning every output again: a counter left unreset would skip rows. */
        for (int cl = 0; cl < 2; ++cl) {
            Case b;
            b.schedule = KL_SCHED_RESIDENT;
            b.V = cl ? (g_small ? 40000 : 151936) : 16385;
            b.N = cl ? (g_small ? 400 : 1024) : (g_small ? 600 : 3000);
            b.determinism = true;
            b.expect_dynamic = 1;
            Case c;
            c = b; c.name = case_name("dynamic rows", cl, "sum"); c.red = LF_REDUCE_SUM; run_case(c);
            c = b; c.name = case_name("dynamic rows", cl, "masks, bad labels, weights, none, in place"); c.kind = LF_KL_REVERSE; c.labels = true; c.ignore_frac = 0.3; c.bad_frac = 0.1; c.weights = true; c.red = LF_REDUCE_NONE; c.grad = 2; run_case(c);
            c = b; c.name = case_name("dynamic rows", cl, "JSD, masks, mean, stats"); c.kind = LF_KL_JSD; c.labels = true; c.ignore_frac = 0.2; c.stats = true; run_case(c);
            c = b; c.name = case_name("dynamic rows", cl, "fewer rows than clusters, NaN rows"); c.kind = LF_KL_REVERSE; c.N = 7; c.plant_nonfinite = true; c.check_all = true; c.determinism = false; run_case(c);
            c = b; c.name = case_name("dynamic rows", cl, "all masked"); c.labels = true; c.ignore_frac = 1.0; c.stats = true; run_case(c);
            c = b; c.name = case_name("dynamic rows", cl, "off: static rows forced"); c.kind = LF_KL_TVD; c.static_rows = 1; c.expect_dynamic = 0; c.labels = true; c.ignore_frac = 0.1; run_case(c);
        }
        /* Side CTAs on the SMs the clusters leave idle (kl_side_kernel): the automatic rule at a
         * benchmark shape (an H200 takes them, an H100 does not), and forced on a cluster plan
         * with special rows; the determinism check relaunches with them the other way. */
        {
            Case s;
            s.schedule = KL_SCHED_RESIDENT;
            s.determinism = true;
            s.expect_dynamic = 1;
            s.N = g_small ? 300 : 4096;
            s.V = g_small ? 40000 : 131072;
            s.name = "side CTAs, automatic, forward KL";
            s.expect_side_auto = true;
            run_case(s);
            s.N = g_small ? 300 : 2048;
            s.name = "side CTAs, automatic, JSD, stats";
            s.kind = LF_KL_JSD;
            s.static_rows = -1;
            s.stats = true;
            run_case(s);
            s = Case();
            s.schedule = KL_SCHED_RESIDENT;
            s.determinism = true;
            s.N = g_small ? 300 : 1500;
            s.V = g_small ? 40000 : 100003;
            s.side_ctas = 5;
            s.side_rest = true; /* the side CTAs take every row after the clusters' first */
            s.name = "side CTAs, forced, reverse KL, masks, bad labels, NaN rows, none";
            s.kind = LF_KL_REVERSE;
            s.labels = true;
            s.ignore_frac = 0.2;
            s.bad_frac = 0.05;
            s.plant_nonfinite = true;
            s.red = LF_REDUCE_NONE;
            s.dloss = true;
            run_case(s);
            s.name = "side CTAs, forced, TVD, weights, softcap, in place";
            s.side_rest = false; /* both grids draw */
            s.kind = LF_KL_TVD;
            s.red = LF_REDUCE_MEAN;
            s.dloss = false;
            s.weights = true;
            s.cap = 30.0f;
            s.grad = 2;
            run_case(s);
            /* clusters of 2: the plan (the side ring has 2 stages for a two-pass kind, the
             * cluster's 3 for JSD) and the results. These plans fill every SM of an H100 or H200,
             * so the side CTAs start as the clusters end: with side_take_rest they then take
             * every row after the clusters' first (the 2-stage ring's only exercise). Forward
             * only: no side CTAs, so side_take_rest is ignored and the clusters do every row */
            s = Case();
            s.schedule = KL_SCHED_RESIDENT;
            s.determinism = true;
            s.N = g_small ? 300 : 1500;
            s.V = 32768;
            s.max_cluster = 2;
            s.expect_cluster = g_small ? 0 : 2;
            s.side_ctas = 7;
            s.side_rest = true;
            s.name = "side CTAs, forced, clusters of 2, forward KL, masks, stats";
            s.labels = true;
            s.ignore_frac = 0.3;
            s.stats = true;
            run_case(s);
            s.name = "side CTAs, forced, clusters of 2, JSD, beta 0.3";
            s.kind = LF_KL_JSD;
            s.beta = 0.3f;
            run_case(s);
            s.name = "side CTAs, forced, forward only: none";
            s.kind = LF_KL_FORWARD;
            s.grad = 0;
            s.determinism = false;
            s.red = LF_REDUCE_NONE;
            run_case(s);
        }
        c = Case();
        c.name = "resident determinism, clusters, JSD in place";
        c.schedule = KL_SCHED_RESIDENT;
        c.kind = LF_KL_JSD;
        c.N = g_small ? 100 : 1024;
        c.V = g_small ? 40000 : 151936;
        c.grad = 2;
        c.determinism = true;
        run_case(c);
        c.name = "resident determinism, TVD, weights";
        c.kind = LF_KL_TVD;
        c.grad = 1;
        c.weights = true;
        run_case(c);
    }

    /* Many tiny rows: the row-status cache refills mid-pipeline. */
    {
        Case c;
        c.name = "200000 rows";
        c.N = 200000;
        c.V = g_small ? 7 : 31;
        c.labels = true;
        c.bad_frac = 0.01;
        run_case(c);
        /* the mean's divisor over many rows: labels, mask bytes and weights (every array its
         * status reads), run twice for the same bits */
        c.name = "200000 rows, mask, weights, mean";
        c.mask = true;
        c.weights = true;
        c.determinism = true;
        run_case(c);
    }

    /* rows x V > 2^31: 64-bit offsets (two 4.3 GB bf16 tensors, gradient in place). */
    if (!g_small) {
        Case c;
        c.name = "N*V > 2^31 in place";
        c.N = 8193;
        c.V = 262144;
        c.grad = 2;
        run_case(c);
    }

    printf("test_kl_gpu: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
