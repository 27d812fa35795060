/* tests/test_seg_gpu.cu — GPU tests of lossfuse_cuda.cuh section 9 (segmented sums over
 * cu_seqlens, pair scatter-add, histograms) against the host references of lossfuse.h
 * section 9 (lf_ref_seg_sum, lf_ref_pair_scatter, lf_ref_histogram).
 *
 *   test_seg_gpu [--small] [--seed S]      exit 0 passed, 1 failed, 77 no device
 *
 * Packings with empty sequences, sequences of one token, sequences longer than a block and
 * 20000 tiny ones; pair tables with a hot item in a third of the pairs; outputs poisoned before
 * every launch. Tolerances: the deterministic forms sum in double and round once to float:
 * 2^-24 |ref| + 1e-12 sum |v|. The fast forms add float partials with float atomics: each of
 * the n additions into a slot rounds relative to a running sum <= sum |v|, so (n + 1) 2^-24
 * sum |v| bounds any order. Deterministic forms must also give the same bits on a second run
 * and with another grid shape. lf_seg_sum_chunked (check_chunked) runs on every packing above
 * and on packings made for its chunk edges (lengths around multiples of LF_SEG_CHUNK, empty
 * sequences at chunk edges and at T, one sequence of 3M tokens, 10^7 tokens with NaN / inf):
 * float and double outputs (tolerance (n + 1) 2^-53 sum |v|, + 2^-24 |ref| for float), four
 * grids, a reused workspace, v not 16-byte aligned.
 */
#include "lossfuse_cuda.cuh"

#include <cub/device/device_radix_sort.cuh>

#include "tests/gpu_test.cuh"

/* ------------------------------------------------------------------ kernels --------------- */

__global__ void k_seg_sum_grid(const int32_t *cu, int64_t nseq, const float *v, float *out)
{
    lf_seg_sum_grid(cu, nseq, v, out);
}

template <typename O>
__global__ void k_seg_sum_chunked(const int32_t *cu, int64_t nseq, int64_t T, const float *v, O *out, void *ws)
{
    lf_seg_sum_chunked(cu, nseq, T, v, out, ws);
}

/* fast per-sequence sums: one token per lane, a segmented scan, one atomic per run per warp */
__global__ void k_seg_sum_fast(const int32_t *cu, int64_t nseq, const float *v, int64_t T, float *out)
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

__global__ void k_scatter_fast(const int32_t *pairs, int64_t P, const float *g, float *acc)
{
    const int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool on = p < P;
    const int64_t i = on ? pairs[2 * p] : -1, j = on ? pairs[2 * p + 1] : -1;
    const float v = on ? g[p] : 0.0f;
    lf_atomic_add_aggregated(acc, i, v);
    lf_atomic_add_aggregated(acc, j, -v);
}

/* entries 2p = (i, +g), 2p + 1 = (j, -g): the input of the stable sort */
__global__ void k_scatter_entries(const int32_t *pairs, int64_t P, const float *g, int32_t *keys, float *vals)
{
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < P; p += (int64_t)gridDim.x * blockDim.x) {
        keys[2 * p] = pairs[2 * p];
        vals[2 * p] = g[p];
        keys[2 * p + 1] = pairs[2 * p + 1];
        vals[2 * p + 1] = -g[p];
    }
}

__global__ void k_run_sum(const int32_t *keys, const float *vals, int64_t n, int64_t nkeys, float *out)
{
    lf_sorted_run_sum_grid(keys, vals, n, nkeys, out);
}

__global__ void k_hist_fast(const int32_t *bin, const float *mass, int64_t S, float *hist)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const bool on = i < S;
    lf_atomic_add_aggregated(hist, on ? bin[i] : -1, on ? mass[i] : 0.0f);
}

__global__ void k_seq_bad(const int32_t *cu, int64_t nseq, int64_t total, int *flag) { lf_seq_bad(cu, nseq, total, flag); }

/* ------------------------------------------------------------------ helpers --------------- */

static std::vector<float> fetch(const DevBuf &b, size_t n)
{
    std::vector<float> h(n);
    CK(cudaMemcpy(h.data(), b.p, n * 4, cudaMemcpyDeviceToHost));
    return h;
}

/* Stable device sort of (keys, vals) by key (CUB LSD radix sort), into (ko, vo). */
static void stable_sort(const int32_t *keys, const float *vals, int32_t *ko, float *vo, int64_t n)
{
    size_t tmp = 0;
    CK(cub::DeviceRadixSort::SortPairs(nullptr, tmp, keys, ko, vals, vo, (int)n));
    DevBuf t(tmp);
    CK(cub::DeviceRadixSort::SortPairs(t.p, tmp, keys, ko, vals, vo, (int)n));
    CK(cudaGetLastError());
}

static double sum_abs(const std::vector<float> &v, int64_t b, int64_t e)
{
    double a = 0.0;
    for (int64_t i = b; i < e; ++i) a += fabs((double)v[i]);
    return a;
}

/* ------------------------------------------------------------------ cases ----------------- */

/* lf_seg_sum_chunked on (cu, v) against the double reference: float and double outputs, grids of
 * one warp (it walks every chunk), 5 x 96 and 264 x 256 threads, a second call on the same
 * workspace (it must have cleared its counters), and v at an address that is not 16-byte
 * aligned (scalar loads): all float results bit-identical. Tolerance: the sum of n values in
 * double is within (n - 1) 2^-53 sum |v| of the exact one, plus the final rounding to float. */
static void check_chunked(const std::vector<int32_t> &cu, const std::vector<float> &v, const std::vector<double> &ref)
{
    const int64_t nseq = (int64_t)cu.size() - 1, T = cu[nseq];
    const size_t wsb = lf_seg_chunk_ws_bytes(T);
    DevBuf cud((nseq + 1) * 4), vd((v.size() + 4) * 4), ws(wsb), of(nseq * 4 * 5 + 4), od(nseq * 8 + 8);
    CK(cudaMemcpy(cud.p, cu.data(), (nseq + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(vd.p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(ws.p, 0, wsb));
    fill_poison(of.p, nseq * 5, LF_F32);
    fill_bits<uint32_t><<<64, 256>>>((uint32_t *)od.p, 2 * nseq, POISON32);
    CK(cudaGetLastError());
    const int32_t *c = (const int32_t *)cud.p;
    const float *vp = (const float *)vd.p;
    float *o = (float *)of.p;
    k_seg_sum_chunked<float><<<1, 32>>>(c, nseq, T, vp, o, ws.p);
    CK(cudaGetLastError());
    k_seg_sum_chunked<float><<<5, 96>>>(c, nseq, T, vp, o + nseq, ws.p);
    CK(cudaGetLastError());
    k_seg_sum_chunked<float><<<264, 256>>>(c, nseq, T, vp, o + 2 * nseq, ws.p);
    CK(cudaGetLastError());
    k_seg_sum_chunked<float><<<264, 256>>>(c, nseq, T, vp, o + 3 * nseq, ws.p);
    CK(cudaGetLastError());
    k_seg_sum_chunked<double><<<33, 128>>>(c, nseq, T, vp, (double *)od.p, ws.p);
    CK(cudaGetLastError());
    /* v one float further on: no 16-byte loads */
    DevBuf vm((v.size() + 4) * 4);
    CK(cudaMemcpy((float *)vm.p + 1, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    k_seg_sum_chunked<float><<<40, 256>>>(c, nseq, T, (const float *)vm.p + 1, o + 4 * nseq, ws.p);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const std::vector<float> h = fetch(of, nseq * 5);
    std::vector<double> hd(nseq);
    CK(cudaMemcpy(hd.data(), od.p, nseq * 8, cudaMemcpyDeviceToHost));
    int bad = 0, badd = 0, diff = 0, unwritten = 0;
    for (int64_t k = 0; k < nseq; ++k) {
        const double sa = sum_abs(v, cu[k], cu[k + 1]), n = (double)(cu[k + 1] - cu[k]);
        const double tol = (n + 1.0) * 0x1p-53 * sa;
        bad += !close(h[k], ref[k], 0x1p-24 * fabs(ref[k]) + tol);
        badd += !close(hd[k], ref[k], tol + 1e-300);
        for (int r = 1; r < 5; ++r) diff += memcmp(&h[k], &h[k + r * nseq], 4) != 0;
        /* the poisons are NaNs: a NaN sum (kind 2) left unwritten would pass the checks above */
        for (int r = 0; r < 5; ++r) {
            uint32_t b;
            memcpy(&b, &h[k + r * nseq], 4);
            unwritten += b == POISON32;
        }
        uint64_t bd;
        memcpy(&bd, &hd[k], 8);
        unwritten += bd == ((uint64_t)POISON32 << 32 | POISON32);
    }
    EXPECT(unwritten == 0, "%d chunked sums left unwritten (poison)", unwritten);
    EXPECT(bad == 0, "%d chunked sums off", bad);
    EXPECT(badd == 0, "%d chunked double sums off", badd);
    EXPECT(diff == 0, "%d chunked sums differ between grids / runs / alignments (must be bit-identical)", diff);
}

static void test_seg(int64_t nseq, int kind, uint64_t *rs)
{
    snprintf(g_case, sizeof g_case, "segment sums nseq=%lld kind=%d", (long long)nseq, kind);
    const int fails = g_fail;
    std::vector<int32_t> cu(nseq + 1, 0);
    for (int64_t k = 0; k < nseq; ++k) {
        const double r = rng_u(rs);
        int64_t len = kind == 1 ? (int64_t)(rng_u(rs) * 4) /* tiny: 0..3 */
                                : r < 0.15 ? 0 : r < 0.3 ? 1 : r < 0.35 ? 5000 + (int64_t)(rng_u(rs) * 3000) : (int64_t)(rng_u(rs) * 300);
        cu[k + 1] = cu[k] + (int32_t)len;
    }
    const int64_t T = cu[nseq];
    std::vector<float> v(T > 0 ? T : 1);
    for (int64_t t = 0; t < T; ++t) {
        const double r = rng_u(rs);
        v[t] = (float)((r < 0.01 ? 1e4 : 1.0) * (rng_u(rs) - 0.5) * 8.0);
    }
    std::vector<double> ref(nseq);
    EXPECT(lf_ref_seg_sum(cu.data(), nseq, v.data(), ref.data()) == LF_OK, "reference failed");
    DevBuf cud((nseq + 1) * 4), vd(v.size() * 4), o1(nseq * 4 + 4), o2(nseq * 4 + 4), o3(nseq * 4 + 4), flag(4);
    CK(cudaMemcpy(cud.p, cu.data(), (nseq + 1) * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(vd.p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    fill_poison(o1.p, nseq, LF_F32);
    fill_poison(o2.p, nseq, LF_F32);
    CK(cudaMemset(o3.p, 0, nseq * 4 + 4));
    k_seg_sum_grid<<<120, 256>>>((const int32_t *)cud.p, nseq, (const float *)vd.p, (float *)o1.p);
    CK(cudaGetLastError());
    k_seg_sum_grid<<<7, 96>>>((const int32_t *)cud.p, nseq, (const float *)vd.p, (float *)o2.p); /* another shape */
    CK(cudaGetLastError());
    if (T > 0) {
        k_seg_sum_fast<<<(unsigned)((T + 255) / 256), 256>>>((const int32_t *)cud.p, nseq, (const float *)vd.p, T, (float *)o3.p);
        CK(cudaGetLastError());
    }
    CK(cudaMemset(flag.p, 0, 4));
    k_seq_bad<<<4, 128>>>((const int32_t *)cud.p, nseq, T, (int *)flag.p);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const std::vector<float> h1 = fetch(o1, nseq), h2 = fetch(o2, nseq), h3 = fetch(o3, nseq);
    int flag_h;
    CK(cudaMemcpy(&flag_h, flag.p, 4, cudaMemcpyDeviceToHost));
    EXPECT(flag_h == 0, "valid cu_seqlens flagged bad");
    int bad_det = 0, bad_fast = 0, diff = 0;
    for (int64_t k = 0; k < nseq; ++k) {
        const double sa = sum_abs(v, cu[k], cu[k + 1]);
        bad_det += !close(h1[k], ref[k], 0x1p-24 * fabs(ref[k]) + 1e-12 * sa);
        bad_fast += !close(h3[k], ref[k], (double)(cu[k + 1] - cu[k] + 1) * 0x1p-24 * sa + 1e-30);
        diff += memcmp(&h1[k], &h2[k], 4) != 0;
    }
    EXPECT(bad_det == 0, "%d deterministic sums off", bad_det);
    EXPECT(bad_fast == 0, "%d fast sums off", bad_fast);
    EXPECT(diff == 0, "%d sums differ between grid shapes (must be bit-identical)", diff);
    check_chunked(cu, v, ref);
    /* a corrupt cu_seqlens is flagged on the device: a decrease, cu[0] != 0, cu[nseq] != T */
    for (int form = 0; form < 3; ++form) {
        if (form == 0 && nseq < 3) continue;
        std::vector<int32_t> bad = cu;
        if (form == 0) bad[2] = bad[1] - 1;
        else if (form == 1) bad[0] = 1;
        else bad[nseq] = (int32_t)T + 1;
        CK(cudaMemcpy(cud.p, bad.data(), (nseq + 1) * 4, cudaMemcpyHostToDevice));
        CK(cudaMemset(flag.p, 0, 4));
        k_seq_bad<<<4, 128>>>((const int32_t *)cud.p, nseq, T, (int *)flag.p);
        CK(cudaGetLastError());
        CK(cudaMemcpy(&flag_h, flag.p, 4, cudaMemcpyDeviceToHost));
        EXPECT(flag_h == 1, "bad cu_seqlens (%s) not flagged", form == 0 ? "a decrease" : form == 1 ? "cu[0] = 1" : "cu[nseq] = T + 1");
    }
    printf("%-4s %s\n", g_fail == fails ? "ok" : "FAIL", g_case);
}

/* lf_seg_sum_chunked where the chunk edges are awkward: lengths around multiples of
 * LF_SEG_CHUNK (1023, 1024, 1025, 2048, ...), empty sequences at chunk edges, at the start and at
 * the end (T a multiple of the chunk: the extra chunk at T), one sequence over many chunks;
 * kind 1: one sequence of every token; kind 2: long random lengths (mean ~1000, the benchmark's
 * shape) with a NaN in one sequence and +inf in another. */
static void test_chunked_edges(int kind, uint64_t *rs)
{
    snprintf(g_case, sizeof g_case, "chunked segment sums kind=%d", kind);
    const int fails = g_fail;
    const int64_t C = LF_SEG_CHUNK;
    std::vector<int32_t> cu(1, 0);
    auto add = [&](int64_t len) { cu.push_back(cu.back() + (int32_t)len); };
    if (kind == 0) {
        add(0); /* empty first */
        for (int64_t len : {C - 1, (int64_t)1, C, (int64_t)0, C + 1, 2 * C, (int64_t)0, (int64_t)0, C - 2, 5 * C + 3, (int64_t)7, C})
            add(len);
        while (cu.back() % C) add(1);
        add(0); /* empty at T, T a multiple of the chunk */
        add(0);
    } else if (kind == 1) {
        add(g_small ? 200003 : 3 * (1 << 20) + 5);
    } else {
        const int64_t n = g_small ? 1000 : 10000;
        for (int64_t k = 0; k < n; ++k) add((int64_t)(-log(1.0 - rng_u(rs)) * 1000.0));
    }
    const int64_t nseq = (int64_t)cu.size() - 1, T = cu[nseq];
    std::vector<float> v(T > 0 ? T : 1);
    for (int64_t t = 0; t < T; ++t) {
        const double r = rng_u(rs);
        v[t] = (float)((r < 0.01 ? 1e4 : 1.0) * (rng_u(rs) - 0.5) * 8.0);
    }
    if (kind == 2) {
        for (int64_t k = 0, hit = 0; k < nseq && hit < 2; ++k)
            if (cu[k + 1] - cu[k] > 3 * C) v[cu[k] + 2 * C + 5 * hit] = hit ? INFINITY : NAN, ++hit; /* past the first chunk edge */
    }
    std::vector<double> ref(nseq);
    EXPECT(lf_ref_seg_sum(cu.data(), nseq, v.data(), ref.data()) == LF_OK, "reference failed");
    check_chunked(cu, v, ref);
    printf("%-4s %s (T=%lld, nseq=%lld)\n", g_fail == fails ? "ok" : "FAIL", g_case, (long long)T, (long long)nseq);
}

static void test_scatter(int64_t S, int64_t P, uint64_t *rs)
{
    snprintf(g_case, sizeof g_case, "pair scatter S=%lld P=%lld", (long long)S, (long long)P);
    const int fails = g_fail;
    std::vector<int32_t> pairs(2 * P + 2);
    std::vector<float> g(P + 1);
    const int32_t hot = (int32_t)(S / 2);
    for (int64_t p = 0; p < P; ++p) {
        int32_t a = (int32_t)(rng_u(rs) * S) % (int32_t)S, b = (int32_t)(rng_u(rs) * (S - 1)) % (int32_t)(S - 1);
        if (b >= a) ++b;
        if (rng_u(rs) < 0.33) { /* a hot item in a third of the pairs: many lanes on one slot */
            if (a != hot) b = hot;
        }
        pairs[2 * p] = a;
        pairs[2 * p + 1] = b;
        g[p] = (float)(rng_u(rs) - 0.5);
    }
    std::vector<double> ref(S, 0.0);
    EXPECT(lf_ref_pair_scatter(pairs.data(), P, g.data(), S, ref.data()) == LF_OK, "reference failed");
    std::vector<double> sa(S, 0.0), na(S, 1.0);
    for (int64_t p = 0; p < P; ++p) {
        sa[pairs[2 * p]] += fabs(g[p]);
        sa[pairs[2 * p + 1]] += fabs(g[p]);
        na[pairs[2 * p]] += 1.0;
        na[pairs[2 * p + 1]] += 1.0;
    }
    DevBuf pd(pairs.size() * 4), gd(g.size() * 4), acc(S * 4), keys(2 * P * 4 + 4), vals(2 * P * 4 + 4), ks(2 * P * 4 + 4),
        vs(2 * P * 4 + 4), o1(S * 4), o2(S * 4);
    CK(cudaMemcpy(pd.p, pairs.data(), pairs.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(gd.p, g.data(), g.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(acc.p, 0, S * 4));
    k_scatter_fast<<<(unsigned)((P + 255) / 256), 256>>>((const int32_t *)pd.p, P, (const float *)gd.p, (float *)acc.p);
    CK(cudaGetLastError());
    k_scatter_entries<<<64, 256>>>((const int32_t *)pd.p, P, (const float *)gd.p, (int32_t *)keys.p, (float *)vals.p);
    CK(cudaGetLastError());
    stable_sort((const int32_t *)keys.p, (const float *)vals.p, (int32_t *)ks.p, (float *)vs.p, 2 * P);
    fill_poison(o1.p, S, LF_F32);
    fill_poison(o2.p, S, LF_F32);
    k_run_sum<<<50, 128>>>((const int32_t *)ks.p, (const float *)vs.p, 2 * P, S, (float *)o1.p);
    CK(cudaGetLastError());
    /* a second run from scratch with another grid: the same bits */
    stable_sort((const int32_t *)keys.p, (const float *)vals.p, (int32_t *)ks.p, (float *)vs.p, 2 * P);
    k_run_sum<<<3, 64>>>((const int32_t *)ks.p, (const float *)vs.p, 2 * P, S, (float *)o2.p);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const std::vector<float> hf = fetch(acc, S), h1 = fetch(o1, S), h2 = fetch(o2, S);
    int bad_fast = 0, bad_det = 0, diff = 0;
    for (int64_t i = 0; i < S; ++i) {
        bad_fast += !close(hf[i], ref[i], na[i] * 0x1p-24 * sa[i] + 1e-30);
        bad_det += !close(h1[i], ref[i], 0x1p-24 * fabs(ref[i]) + 1e-12 * sa[i]);
        diff += memcmp(&h1[i], &h2[i], 4) != 0;
    }
    EXPECT(bad_fast == 0, "%d fast (aggregated atomic) items off", bad_fast);
    EXPECT(bad_det == 0, "%d deterministic items off", bad_det);
    EXPECT(diff == 0, "%d items differ between runs / grid shapes", diff);
    printf("%-4s %s\n", g_fail == fails ? "ok" : "FAIL", g_case);
}

static void test_hist(int64_t S, int64_t B, uint64_t *rs)
{
    snprintf(g_case, sizeof g_case, "histogram S=%lld bins=%lld", (long long)S, (long long)B);
    const int fails = g_fail;
    std::vector<int32_t> bin(S);
    std::vector<float> mass(S);
    for (int64_t i = 0; i < S; ++i) {
        bin[i] = (int32_t)(rng_u(rs) * (B + 1)) - 1; /* -1: in no bin */
        mass[i] = (float)(rng_u(rs) * 3.0);
    }
    std::vector<double> ref(B);
    EXPECT(lf_ref_histogram(bin.data(), mass.data(), S, B, ref.data()) == LF_OK, "reference failed");
    std::vector<double> sa(B, 0.0), na(B, 1.0);
    for (int64_t i = 0; i < S; ++i)
        if (bin[i] >= 0) {
            sa[bin[i]] += mass[i];
            na[bin[i]] += 1.0;
        }
    DevBuf bd(S * 4), md(S * 4), h(B * 4), ks(S * 4), vs(S * 4), o1(B * 4);
    CK(cudaMemcpy(bd.p, bin.data(), S * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(md.p, mass.data(), S * 4, cudaMemcpyHostToDevice));
    CK(cudaMemset(h.p, 0, B * 4));
    k_hist_fast<<<(unsigned)((S + 255) / 256), 256>>>((const int32_t *)bd.p, (const float *)md.p, S, (float *)h.p);
    CK(cudaGetLastError());
    stable_sort((const int32_t *)bd.p, (const float *)md.p, (int32_t *)ks.p, (float *)vs.p, S);
    fill_poison(o1.p, B, LF_F32);
    k_run_sum<<<20, 128>>>((const int32_t *)ks.p, (const float *)vs.p, S, B, (float *)o1.p);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const std::vector<float> hf = fetch(h, B), h1 = fetch(o1, B);
    /* the deterministic form again, sorted anew onto poisoned keys and values and summed on
     * another grid: the same bits */
    fill_poison(ks.p, S, LF_F32);
    fill_poison(vs.p, S, LF_F32);
    fill_poison(o1.p, B, LF_F32);
    stable_sort((const int32_t *)bd.p, (const float *)md.p, (int32_t *)ks.p, (float *)vs.p, S);
    k_run_sum<<<3, 64>>>((const int32_t *)ks.p, (const float *)vs.p, S, B, (float *)o1.p);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const std::vector<float> h2 = fetch(o1, B);
    int bad_fast = 0, bad_det = 0, diff = 0;
    for (int64_t b = 0; b < B; ++b) {
        bad_fast += !close(hf[b], ref[b], na[b] * 0x1p-24 * sa[b] + 1e-30);
        bad_det += !close(h1[b], ref[b], 0x1p-24 * fabs(ref[b]) + 1e-12 * sa[b]);
        diff += memcmp(&h1[b], &h2[b], 4) != 0;
    }
    EXPECT(bad_fast == 0, "%d fast bins off", bad_fast);
    EXPECT(bad_det == 0, "%d deterministic bins off", bad_det);
    EXPECT(diff == 0, "%d deterministic bins differ on a second run (another grid)", diff);
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
        printf("test_seg_gpu: no CUDA device, skipped\n");
        return 77;
    }
    if (!g_seed) g_seed = (uint64_t)time(NULL);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("test_seg_gpu on %s (sm_%d%d), seed %llu%s\n", prop.name, prop.major, prop.minor, (unsigned long long)g_seed,
           g_small ? ", small sizes" : "");
    uint64_t rs = mix64(g_seed);
    for (int64_t nseq : {1, 7, 64, 1000}) test_seg(nseq, 0, &rs);
    test_seg(g_small ? 3000 : 20000, 1, &rs); /* thousands of tiny segments */
    for (int kind = 0; kind < 3; ++kind) test_chunked_edges(kind, &rs);
    for (int64_t P : {1, 31, 1000, 77777}) test_scatter(P < 100 ? 10 : 2000, g_small && P > 5000 ? 5000 : P, &rs);
    test_hist(5000, 17, &rs);
    test_hist(100000, 1000, &rs);
    printf("test_seg_gpu: %d checks, %d failed\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
