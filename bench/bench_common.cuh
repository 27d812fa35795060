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

__global__ void fill_logits(__nv_bfloat16 *x, int64_t n, uint64_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull + seed;
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        const float u = (float)(z >> 40) * (1.0f / 16777216.0f), v = (float)((z >> 16) & 0xffffff) * (1.0f / 16777216.0f);
        x[i] = __float2bfloat16_rn(u < 1e-4f ? 60.0f * (v - 0.5f) : 6.0f * (u + v - 1.0f));
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
