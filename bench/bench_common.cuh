/* bench/bench_common.cuh — what the CUDA benchmarks share: the CUDA check macro, bf16 logits
 * like a language model's (hash of the index: no host RNG, any size), the median, the device
 * copy bandwidth (the denominator of every "% of copy" figure) and the DEVICE line. */
#ifndef LOSSFUSE_BENCH_COMMON_CUH
#define LOSSFUSE_BENCH_COMMON_CUH

#include <algorithm>
#include <string>
#include <vector>

#define CK(call)                                                                                    \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #call); \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

static __device__ __forceinline__ void bench_store(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
static __device__ __forceinline__ void bench_store(float *p, float v) { *p = v; }

/* bf16 (or fp32: bench_ce --dtype f32) logits: ~N(0, 6^2/6)-ish, 1 in 10^4 spread over +-30. */
template <typename T>
__global__ void fill_logits(T *x, int64_t n, uint64_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull + seed;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float u = (float)(z >> 40) * (1.0f / 16777216.0f), v = (float)((z >> 16) & 0xffffff) * (1.0f / 16777216.0f);
        bench_store(x + i, u < 1e-4f ? 60.0f * (v - 0.5f) : 6.0f * (u + v - 1.0f));
    }
}

/* Spins for `ns` nanoseconds and touches no memory: enqueued before a timed launch that nothing
 * else precedes, it keeps the device busy while the host launches, so that the events measure
 * the kernel and not the host's launch latency. */
__global__ void bench_delay(long long ns)
{
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

static float median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v.empty() ? NAN : v[v.size() / 2];
}

/* Prints the DEVICE line; returns the device properties. */
static cudaDeviceProp bench_device_line(void)
{
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::string name = prop.name;
    std::replace(name.begin(), name.end(), ' ', '_');
    int khz = 0, bits = 0; /* the memory's peak, as lf_ring_setup computes it (0: not reported) */
    CK(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, 0));
    CK(cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, 0));
    printf("DEVICE name=%s sms=%d l2_bytes=%d mem_khz=%d bus_bits=%d peak_gbps=%.1f\n", name.c_str(), prop.multiProcessorCount,
           prop.l2CacheSize, khz, bits, 2.0 * khz * 1e3 * bits / 8.0 / 1e9);
    return prop;
}

/* Device-to-device copy of 2 GiB, median of 10: prints the COPY line (bytes read + written). */
static void bench_copy_line(cudaEvent_t e0, cudaEvent_t e1)
{
    const size_t bytes = (size_t)2 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemset(a, 1, bytes));
    std::vector<float> t;
    for (int it = 0; it < 13; ++it) {
        CK(cudaEventRecord(e0));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
        CK(cudaEventRecord(e1));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 3) t.push_back(ms);
    }
    printf("COPY impl=cuda gbps=%.1f bytes=%zu\n", 2.0 * bytes / (median(t) * 1e6), 2 * bytes);
    CK(cudaFree(a));
    CK(cudaFree(b));
}

/* The next "NxV" of a comma-separated list from *pos; false at the end. */
/* The row-resident kernel's diagnostic record (a -DCE_RES_TRACE build of examples/cross_entropy.cu:
 * ce_res_trace[8], ce_res_times[][4]) as one TRACE line, the shares of the groups' row-loop
 * cycles per phase, and TIMES lines, over the nb CTAs of the last launch, when each got its
 * first stage, ended its row loop and (last = 3) exited, in us after the earliest entry. tag:
 * the key=value text that says which run (e.g. "mode=fwdbwd", "gpu=1"). */
/* TIMES lines of a diagnostic build's per-CTA %globaltimer stamps: tm holds nb rows of `stride`
 * stamps; for each column j in [j0, j1) named names[j], the spread over the CTAs (us after t0;
 * stamps before t0, e.g. 0 = not written, are left out). */
static inline void bench_times_lines(const char *impl, const char *tag, int64_t N, int64_t V, const unsigned long long *tm,
                                     int stride, int nb, int j0, int j1, const char *const *names, unsigned long long t0)
{
    for (int j = j0; j < j1; ++j) {
        std::vector<double> v;
        for (int b = 0; b < nb; ++b)
            if (tm[(size_t)stride * b + j] >= t0) v.push_back((double)(tm[(size_t)stride * b + j] - t0) * 1e-3);
        std::sort(v.begin(), v.end());
        if (!v.empty())
            printf("TIMES impl=%s %s N=%lld V=%lld %s n=%zu min=%.1f p10=%.1f med=%.1f p90=%.1f max=%.1f us\n", impl, tag,
                   (long long)N, (long long)V, names[j], v.size(), v[0], v[v.size() / 10], v[v.size() / 2], v[v.size() * 9 / 10],
                   v.back());
    }
}

/* the columns of the resident kernels' per-CTA stamps (cross_entropy.cu's CE_RES_TRACE,
 * kl_distill.cu's KL_RES_TRACE) */
static const char *const bench_res_times_names[4] = {"entry", "first_stage", "loop_end", "exit"};

static inline void bench_res_trace_lines(const char *impl, const char *tag, int64_t N, int64_t V, const unsigned long long *tr,
                                         const std::vector<unsigned long long> &tm, int nb, int last)
{
    const double tot = (double)(tr[7] ? tr[7] : 1);
    printf("TRACE impl=%s %s N=%lld V=%lld rows=%llu cycles_per_row=%.0f wait=%.3f stats=%.3f merge=%.3f xchg=%.3f "
           "grad=%.3f bar=%.3f\n", impl, tag, (long long)N, (long long)V, tr[6], tot / (double)(tr[6] ? tr[6] : 1), tr[0] / tot,
           tr[1] / tot, tr[2] / tot, tr[3] / tot, tr[4] / tot, tr[5] / tot);
    unsigned long long t0 = ~0ull;
    for (int b = 0; b < nb; ++b) t0 = std::min(t0, tm[4 * b]);
    bench_times_lines(impl, tag, N, V, tm.data(), 4, nb, 1, last + 1, bench_res_times_names, t0);
}

static bool bench_next_shape(const std::string &shapes, size_t *pos, int64_t *N, int64_t *V)
{
    while (*pos < shapes.size()) {
        size_t comma = shapes.find(',', *pos);
        if (comma == std::string::npos) comma = shapes.size();
        const std::string s = shapes.substr(*pos, comma - *pos);
        *pos = comma + 1;
        long long n = 0, v = 0;
        if (sscanf(s.c_str(), "%lldx%lld", &n, &v) == 2) {
            *N = n;
            *V = v;
            return true;
        }
    }
    return false;
}

#endif
