/* tests/gpu_test.cuh — what the GPU tests share: the EXPECT / CK macros and counters, seeded
 * device data (logits with outliers from a hash of (seed, index): no host RNG state, any size),
 * poisoning and the "every element written / padding untouched" counters, a bit checksum for
 * run-to-run identity, and a few host helpers. Include after the example under test.
 * g_case holds the current case's name (printed with every failure); g_small selects the small
 * sizes (for compute-sanitizer); g_seed is printed at start so that a run can be reproduced. */
#ifndef LOSSFUSE_TESTS_GPU_TEST_CUH
#define LOSSFUSE_TESTS_GPU_TEST_CUH

#include <algorithm>
#include <set>
#include <thread>
#include <time.h>
#include <unistd.h>
#include <vector>

static char g_case[256];
static int g_checks = 0, g_fail = 0, g_small = 0;
static uint64_t g_seed = 0;

/* This host's physical memory in bytes, 0 where unknown: a case whose host reference needs more
 * than the host has says so and is skipped (printed as "skip"), rather than dying in an
 * allocation; where unknown it runs. */
static inline double host_memory_bytes(void)
{
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? (double)pages * (double)page : 0.0;
}

#define EXPECT(cond, ...)                                                                           \
    do {                                                                                            \
        ++g_checks;                                                                                 \
        if (!(cond)) {                                                                              \
            if (++g_fail <= 60) {                                                                   \
                printf("FAIL [%s] %s:%d: ", g_case, __FILE__, __LINE__);                            \
                printf(__VA_ARGS__);                                                                \
                printf("\n");                                                                       \
            }                                                                                       \
        }                                                                                           \
    } while (0)

#define CK(call)                                                                                    \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #call); \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)


/* ---------------------------------------------------------------- device data and checks -- */

static inline __host__ __device__ uint64_t mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline __host__ __device__ float unit(uint64_t h) { return (float)(h >> 40) * (1.0f / 16777216.0f); }

/* One logit from (seed, flat index): bulk ~ 3.4 * (sum of 4 uniforms - 2), 1% around 8, 0.01%
 * in [-12, 28] * `outlier` (40 normally; 1e4 for the huge-value cases). */
static inline __host__ __device__ float gen_value(uint64_t seed, uint64_t idx, float outlier)
{
    const uint64_t h = mix64(seed ^ mix64(idx));
    const float u = unit(h), n = unit(mix64(h + 1)) + unit(mix64(h + 2)) + unit(mix64(h + 3)) + unit(mix64(h + 4)) - 2.0f;
    if (u < 1e-4f) return outlier * (unit(mix64(h + 5)) - 0.3f);
    if (u < 1e-2f) return 8.0f + 4.0f * n;
    return 3.4f * n;
}

template <typename T>
__global__ void gen_logits(T *x, int64_t N, int64_t V, int64_t stride, uint64_t seed, float outlier)
{
    const int64_t total = N * stride;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x)
        x[i] = lf_elem<T>::from_f32(gen_value(seed, (uint64_t)i, outlier));
    (void)V;
}

template <typename W>
__global__ void fill_bits(W *p, int64_t n, W v)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) p[i] = v;
}

/* columns [0, V) of n rows of `stride` elements set to v (the padding left as it is) */
template <typename W>
__global__ void fill_cols(W *p, int64_t n, int64_t V, int64_t stride, W v)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n * V; i += (int64_t)gridDim.x * blockDim.x)
        p[(i / V) * stride + i % V] = v;
}

/* counts[0]: elements of columns [0, V) still holding the poison bits (never written);
 * counts[1]: padding elements (columns [V, stride)) that no longer hold `pad_bits` (overrun). */
template <typename W>
__global__ void count_unwritten(const W *p, int64_t N, int64_t V, int64_t stride, W poison, W pad_bits,
                                unsigned long long *counts)
{
    unsigned long long a = 0, b = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * stride; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t col = i % stride;
        if (col < V) a += p[i] == poison;
        else b += p[i] != pad_bits;
    }
    if (a) atomicAdd(counts, a);
    if (b) atomicAdd(counts + 1, b);
}

/* In-place padding check: padding columns must still hold what gen_logits wrote there. */
template <typename T>
__global__ void count_pad_changed(const T *x, int64_t N, int64_t V, int64_t stride, uint64_t seed, float outlier,
                                  unsigned long long *count)
{
    unsigned long long b = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N * stride; i += (int64_t)gridDim.x * blockDim.x) {
        if (i % stride < V) continue;
        const T want = lf_elem<T>::from_f32(gen_value(seed, (uint64_t)i, outlier));
        const T got = x[i];
        const unsigned short *pw = reinterpret_cast<const unsigned short *>(&want), *pg = reinterpret_cast<const unsigned short *>(&got);
        bool diff = false;
        for (int k = 0; k < (int)(sizeof(T) / 2); ++k) diff |= pw[k] != pg[k];
        b += diff;
    }
    if (b) atomicAdd(count, b);
}

/* Order-independent integer checksum of a buffer's bits (for bit-identity between runs). */
__global__ void checksum_u16(const uint16_t *p, int64_t n, unsigned long long *out)
{
    unsigned long long a = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        a += mix64((uint64_t)p[i] ^ ((uint64_t)i << 16));
    atomicAdd(out, a);
}

static inline unsigned long long device_checksum(const void *p, size_t bytes)
{
    unsigned long long *d, h;
    CK(cudaMalloc(&d, sizeof h));
    CK(cudaMemset(d, 0, sizeof h));
    checksum_u16<<<1024, 256>>>((const uint16_t *)p, (int64_t)(bytes / 2), d);
    CK(cudaGetLastError());
    CK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    CK(cudaFree(d));
    return h;
}

/* ---------------------------------------------------------------- host helpers ------------- */

static inline double rng_u(uint64_t *s) { return (double)(mix64((*s)++) >> 11) * (1.0 / 9007199254740992.0); }

static const uint16_t POISON16 = 0x7FA5;     /* bf16 / fp16 signalling NaN: never produced */
static const uint32_t POISON32 = 0x7FBADBADu; /* fp32 signalling NaN; as int32 never an index */
static const uint16_t PAD16 = 0x1234;
static const uint32_t PAD32 = 0x12345678u;

static inline float elem_to_f32(const void *p, int64_t j, lf_dtype dt)
{
    if (dt == LF_F32) return ((const float *)p)[j];
    const uint16_t h = ((const uint16_t *)p)[j];
    return dt == LF_BF16 ? lf_bf16_to_f32(h) : lf_f16_to_f32(h);
}

static inline void fill_poison(void *p, size_t n_elems, lf_dtype dt)
{
    if (dt == LF_F32) fill_bits<uint32_t><<<1024, 256>>>((uint32_t *)p, (int64_t)n_elems, POISON32);
    else fill_bits<uint16_t><<<1024, 256>>>((uint16_t *)p, (int64_t)n_elems, POISON16);
    CK(cudaGetLastError());
}

/* |z| from which a logit counts as at the float floor (masking with torch.finfo(bf16 or
 * fp32).min leaves about -3.4e38): its probability is exactly 0 in a kernel and in the double
 * reference alike and it adds no rounding to their sums, so a tolerance built from a row's
 * magnitudes leaves it out (with it, the bound was ~1e31 and the check could not fail). */
#define ZFLOOR 1e30

/* |d - r| <= tol, with NaN matching NaN and infinities matching exactly: lossfuse.h's
 * lf_check_err (the rule the examples' own checks use) within one tolerance. */
static inline bool close(double d, double r, double tol) { return lf_check_err(d, r, tol) <= 1.0; }

/* f(worker, workers) on up to 32 host threads (one per core), joined before it returns: the
 * tests' double references over every row of a large case. */
template <typename F>
static void host_workers(F f)
{
    const unsigned n = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (unsigned k = 0; k < n; ++k) pool.emplace_back([&f, k, n] { f(k, n); });
    for (std::thread &t : pool) t.join();
}

static inline const char *dt_name(lf_dtype d) { return d == LF_F32 ? "fp32" : d == LF_F16 ? "fp16" : "bf16"; }

/* A case name made at run time, "<what>[ (clusters)], <detail>", from a rotating pool: valid
 * until 32 more are made (a test's run_case reads its case's name while it runs). */
static inline const char *case_name(const char *what, bool clusters, const char *detail)
{
    static char pool[32][112];
    static int next = 0;
    char *s = pool[next++ & 31];
    snprintf(s, sizeof pool[0], "%s%s, %s", what, clusters ? " (clusters)" : "", detail);
    return s;
}

struct DevBuf {
    void *p = nullptr;
    size_t bytes = 0;
    explicit DevBuf(size_t b) : bytes(b) { CK(cudaMalloc(&p, b ? b : 1)); }
    ~DevBuf() { cudaFree(p); }
    DevBuf(const DevBuf &) = delete;
    DevBuf &operator=(const DevBuf &) = delete;
};

static inline void put_elem(void *x, int64_t idx, float v, lf_dtype dt)
{
    const int esz = lf_dtype_size(dt);
    if (dt == LF_F32) CK(cudaMemcpy((char *)x + idx * esz, &v, 4, cudaMemcpyHostToDevice));
    else {
        const uint16_t h = dt == LF_BF16 ? lf_f32_to_bf16(v) : lf_f32_to_f16(v);
        CK(cudaMemcpy((char *)x + idx * esz, &h, 2, cudaMemcpyHostToDevice));
    }
}

#endif
