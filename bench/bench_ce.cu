/* bench/bench_ce.cu — times examples/cross_entropy.cu against the bytes-moved floor.
 *
 *   bench_ce [--shapes 4096x32768,16384x262144,...] [--iters 20] [--variants] [--clusters 0,1,2,4]
 *            [--tag _name]
 *
 * Prints machine-readable lines that bench/report.py turns into the table and chart:
 *   DEVICE name=...
 *   COPY impl=cuda gbps=... bytes=...        device-to-device copy, bytes read + written
 *   RESULT impl=lossfuse mode=fwdbwd N=.. V=.. dtype=bf16 ms=.. bytes=.. extra_bytes=.. status=ok
 * fwdbwd: fused forward+backward, gradient in place over the logits, reduction mean (floor:
 * read bf16 logits once + write the gradient once = 4 B/elem). fwd: forward-only token
 * statistics (logprob, lse, entropy, argmax, accuracy; floor 2 B/elem).
 * --variants adds impl=lossfuse_nocluster (max_cluster = 1: CTAs re-read their pieces) so the
 * design choice stays measured; --clusters 0,1,2,4,8 times each cluster cap (lossfuse_cN).
 * --tag appends to every impl name (bench/tune.sh builds variants with other tile macros).
 * Each RESULT line also says the plan chosen (cluster size, pieces per slice, CTAs).
 * Each timed launch is preceded (untimed) by restoring the logits from a pristine copy and by
 * writing a 256 MiB buffer, so nothing of the input is left in L2; the median is reported.
 * A benchmark, not a test: it checks nothing but CUDA errors.
 */
#define CE_NO_MAIN
#include "examples/cross_entropy.cu"

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

static float median(std::vector<float> v)
{
    std::sort(v.begin(), v.end());
    return v.empty() ? NAN : v[v.size() / 2];
}

int main(int argc, char **argv)
{
    std::string shapes = "4096x32768,4096x131072,4096x151936,4096x262144,16384x32768,16384x131072,16384x151936,16384x262144";
    int iters = 20;
    std::string tag; /* appended to impl names: for binaries built with other CE_* tile macros */
    std::vector<int> variants = {0}; /* max_cluster per variant: 0 = automatic */
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--shapes") && i + 1 < argc) shapes = argv[++i];
        else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--variants")) variants = {0, 1};
        else if (!strcmp(argv[i], "--tag") && i + 1 < argc) tag = argv[++i];
        else if (!strcmp(argv[i], "--clusters") && i + 1 < argc) { /* e.g. 0,1,2,4,8 */
            variants.clear();
            for (char *t = strtok(argv[++i], ","); t; t = strtok(NULL, ",")) variants.push_back(atoi(t));
        }
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        printf("bench_ce: no CUDA device\n");
        return 77;
    }
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::string name = prop.name;
    std::replace(name.begin(), name.end(), ' ', '_');
    printf("DEVICE name=%s sms=%d l2_bytes=%d\n", name.c_str(), prop.multiProcessorCount, prop.l2CacheSize);

    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const size_t flush_bytes = 256u << 20;
    void *flush;
    CK(cudaMalloc(&flush, flush_bytes));

    { /* copy bandwidth: 2 GiB device to device, bytes read + written */
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

    size_t pos = 0;
    while (pos < shapes.size()) {
        size_t comma = shapes.find(',', pos);
        if (comma == std::string::npos) comma = shapes.size();
        const std::string s = shapes.substr(pos, comma - pos);
        pos = comma + 1;
        long long Nl = 0, Vl = 0;
        if (sscanf(s.c_str(), "%lldx%lld", &Nl, &Vl) != 2) continue;
        const int64_t N = Nl, V = Vl;
        const size_t nel = (size_t)N * V, bytes = nel * 2;
        void *x, *pristine, *ws;
        int64_t *y;
        float *loss, *lp, *lse, *ent;
        int32_t *am;
        unsigned *cnt;
        const size_t wsb = ce_workspace_bytes(N);
        CK(cudaMalloc(&x, bytes));
        CK(cudaMalloc(&pristine, bytes));
        CK(cudaMalloc(&y, N * 8));
        CK(cudaMalloc(&loss, N * 4));
        CK(cudaMalloc(&lp, N * 4));
        CK(cudaMalloc(&lse, N * 4));
        CK(cudaMalloc(&ent, N * 4));
        CK(cudaMalloc(&am, N * 4));
        CK(cudaMalloc(&cnt, 8));
        CK(cudaMalloc(&ws, wsb));
        CK(cudaMemset(ws, 0, wsb));
        CK(cudaMemset(cnt, 0, 8));
        fill_logits<<<4096, 256>>>((__nv_bfloat16 *)pristine, (int64_t)nel, 12345u + (uint64_t)V);
        CK(cudaGetLastError());
        std::vector<int64_t> yh(N);
        for (int64_t i = 0; i < N; ++i) yh[i] = (i % 20 == 7) ? -100 : (int64_t)((i * 2654435761ull) % (uint64_t)V);
        CK(cudaMemcpy(y, yh.data(), N * 8, cudaMemcpyHostToDevice));

        ce_args a = ce_args_default();
        a.logits = x;
        a.dtype = LF_BF16;
        a.n_rows = N;
        a.vocab = V;
        a.stride = V;
        a.labels = y;
        a.labels_i64 = 1;
        a.loss = loss;
        a.workspace = ws;
        a.workspace_bytes = wsb;
        a.n_errors = cnt + 1;

        for (int mc : variants) {
            char impl[96];
            if (mc == 0) snprintf(impl, sizeof impl, "lossfuse%s", tag.c_str());
            else if (mc == 1) snprintf(impl, sizeof impl, "lossfuse_nocluster%s", tag.c_str());
            else snprintf(impl, sizeof impl, "lossfuse_c%d%s", mc, tag.c_str());
            for (int mode = 0; mode < 2; ++mode) { /* 0 fwdbwd, 1 fwd */
                ce_args b = a;
                b.max_cluster = mc;
                ce_plan plan;
                b.plan = &plan;
                if (mode == 0) {
                    b.grad = x;
                    b.grad_stride = V;
                } else {
                    b.reduction = LF_REDUCE_NONE;
                    b.logprob = lp;
                    b.lse = lse;
                    b.entropy = ent;
                    b.argmax = am;
                    b.n_correct = cnt;
                }
                std::vector<float> t;
                CK(cudaMemcpy(x, pristine, bytes, cudaMemcpyDeviceToDevice));
                for (int it = 0; it < iters + 3; ++it) {
                    if (mode == 0) CK(cudaMemcpyAsync(x, pristine, bytes, cudaMemcpyDeviceToDevice));
                    CK(cudaMemsetAsync(flush, it & 0xff, flush_bytes));
                    CK(cudaEventRecord(e0));
                    cudaError_t ce;
                    const lf_status st = ce_launch(&b, 0, &ce);
                    CK(cudaEventRecord(e1));
                    if (st != LF_OK) {
                        fprintf(stderr, "ce_launch: %s (%s)\n", lf_status_str(st), cudaGetErrorString(ce));
                        return 1;
                    }
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    if (it >= 3) t.push_back(ms);
                }
                CK(cudaGetLastError());
                const size_t floor_bytes = mode == 0 ? 2 * bytes : bytes;
                printf("RESULT impl=%s mode=%s N=%lld V=%lld dtype=bf16 ms=%.4f bytes=%zu extra_bytes=%zu status=ok "
                       "cluster=%d pieces=%d ctas=%d\n", impl, mode == 0 ? "fwdbwd" : "fwd", (long long)N, (long long)V,
                       median(t), floor_bytes, wsb, plan.cluster, plan.pieces, plan.ctas);
                fflush(stdout);
            }
        }
        CK(cudaFree(x));
        CK(cudaFree(pristine));
        CK(cudaFree(y));
        CK(cudaFree(loss));
        CK(cudaFree(lp));
        CK(cudaFree(lse));
        CK(cudaFree(ent));
        CK(cudaFree(am));
        CK(cudaFree(cnt));
        CK(cudaFree(ws));
    }
    return 0;
}
