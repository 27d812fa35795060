/* examples/cp_local_ce.cu — context-parallel cross-entropy on packed sequences: each rank computes
 * the loss of its own zigzag shard of the tokens, and nothing of size [tokens, V] is gathered.
 *
 * Build and run (from the repository root; meson does the same, see README.md):
 *     nvcc -O3 -std=c++17 -arch=sm_90 -I. examples/cp_local_ce.cu -o cp_local_ce
 *     nvcc -O3 -std=c++17 -arch=sm_90 -I. -DLF_HAVE_NCCL examples/cp_local_ce.cu -lnccl -o cp_local_ce
 *     ./cp_local_ce [cp=4] [nseq=16] [V=32768] [sim|nccl] [mem]
 *   sim  (default): the cp ranks simulated one after another on one GPU, checked against the
 *        unsharded cross-entropy of the same batch;
 *   nccl (built with -DLF_HAVE_NCCL): one process drives every visible GPU, one rank each
 *        (cp = the number of GPUs), the all-reduces through NCCL; checked the same way. With one
 *        process per GPU, each calls cp_ce_launch for its rank with its communicator
 *        (test_cp_gpu --nccl runs that too, a thread per rank).
 *   mem  (opt-in): also report the net device memory a step allocates (free memory before and
 *        after a second run: it allocates nothing, every buffer is the caller's).
 *
 * Why: under context parallelism each rank holds the logits of its shard of every sequence
 *   (lossfuse.h section 10: sequences cut into 2 cp chunks, rank r holding chunks r and
 *   2 cp - 1 - r). Gathering them to compute the loss is what runs out of memory (128K tokens x
 *   152K vocabulary in bf16 is ~37 GiB per rank). Computed locally it needs three things right:
 *   labels shifted on the FULL sequences (the target of a chunk's last token is on another
 *   rank), the mean divided by the GLOBAL count of valid labels, and metrics (token counts,
 *   per-sequence loss and perplexity) that do not depend on cp: the counts exactly, the loss
 *   and perplexity within fp32 summation order (a row's sums are taken in an order that
 *   depends on the launch's shape, and a sequence's sum is split over the ranks).
 *
 * One rank's step, three phases around two all-reduces over the CP group (cp_ce_phase_a/b/c):
 *   A  local labels from the global ids (lf_cp_local_labels_grid), the local count of valid
 *      labels per sequence and their summed class weights (lf_seg_sum_grid, in double)
 *                                                                   -> red_a[2 nseq]
 *      all-reduce(red_a): the global per-sequence counts and weights; the weights' sum (in a
 *      fixed order) is the mean's divisor (the count without class weights), a device scalar:
 *      no host synchronisation
 *   B  ce_launch (examples/cross_entropy.cu) on the local logits: reduction mean with that
 *      divisor, gradient in place (or to grad), per-token label log-probs; then per-sequence
 *      NLL sums and the rank's share of the loss                    -> red_b[nseq + 1]
 *      all-reduce(red_b)
 *   C  outputs: the global mean loss, per-sequence token counts, mean NLL and perplexity
 *   The all-reduce is ncclAllReduce (sum, double) with a communicator; the single-GPU
 *   simulation sums the ranks' buffers in rank order and gives every rank the sum (what
 *   ncclAllReduce returns).
 * Contract: the cross-entropy's (options, bad labels counted in *n_errors, NaN logits -> NaN);
 *   the loss equals the unsharded loss up to the order of the fp32/fp64 sums; the gradient rows
 *   are those of the unsharded loss; counts are exact. Workspace: cp_ce_workspace_bytes
 *   (about 20 B per local token + 28 B per sequence + the cross-entropy's 8 B per token).
 *   With class weights the loss is the weighted mean (PyTorch's); the per-sequence metrics stay
 *   unweighted (token counts, mean label NLL, perplexity: what a log reports).
 *
 * Sections: 1. API   2. kernels   3. the phases   4. main (simulation / NCCL, check)
 */
#define CE_NO_MAIN
#include "examples/cross_entropy.cu"

#include <thread>
#include <vector>
#ifdef LF_HAVE_NCCL
#include <nccl.h>
#endif

/* ============================================================================================
 * 1. API
 * ========================================================================================== */

typedef struct cp_ce_args {
    /* the batch, the same on every rank of the group (device pointers) */
    const int64_t *ids;          /* [T] global input ids */
    const uint8_t *target_mask;  /* [T] or NULL: 0 = token not predicted (e.g. a prompt) */
    const int32_t *cu_seqlens;   /* [nseq + 1] global, every length a multiple of 2 cp */
    int64_t nseq, total;         /* total = cu_seqlens[nseq] (host value, for sizes); both checked
                                  * once per batch on the host: lf_cp_check(cu, nseq, total, cp) */
    int cp, rank;
    /* this rank's logits: [total / cp, V], the zigzag order of lossfuse.h section 10 */
    const void *logits;
    lf_dtype dtype;
    int64_t vocab, stride;
    lf_ce_opts opts;             /* as examples/cross_entropy.cu (class_weights: a device pointer
                                  * to all V weights on this rank's device; the mean is then
                                  * divided by the GLOBAL sum of w_y over valid labels);
                                  * opts.ignore_index marks the labels without a target */
    void *grad;                  /* NULL: no gradient; == logits: in place */
    int64_t grad_stride;
    /* outputs (device), the same on every rank after phase C */
    float *loss;                 /* [1] mean over the global valid labels */
    float *seq_tokens;           /* [nseq] optional: valid labels per sequence (exact < 2^24) */
    float *seq_nll;              /* [nseq] optional: mean label NLL per sequence (NaN for none) */
    float *seq_ppl;              /* [nseq] optional: exp(seq_nll) */
    unsigned int *n_errors;      /* optional: += local rows with a bad label */
    void *workspace;             /* cp_ce_workspace_bytes(total / cp, nseq), zeroed once */
    size_t workspace_bytes;
} cp_ce_args;

typedef struct cp_ws { /* carved from the workspace */
    int64_t *labels;  /* [n] */
    float *valid;     /* [n] 1 / 0; then -logprob for valid rows */
    float *wvalid;    /* [n] w_y for valid rows (1 without class weights), else 0 */
    float *logprob;   /* [n] */
    int32_t *cu_local;/* [nseq + 1] */
    double *red_a;    /* [2 nseq]: per sequence the valid labels, then their summed weights */
    double *red_b;    /* [nseq + 1] */
    float *divisor;   /* [1] */
    void *ce_ws;      /* ce_workspace_bytes(n) */
} cp_ws;

static size_t cp_align(size_t b) { return (b + 255) & ~(size_t)255; }

static size_t cp_ce_workspace_bytes(int64_t n_local, int64_t nseq)
{
    const size_t n = (size_t)(n_local > 0 ? n_local : 0), s = (size_t)(nseq > 0 ? nseq : 0);
    return cp_align(8 * n) + 3 * cp_align(4 * n) + cp_align(4 * (s + 1)) + cp_align(16 * s) + cp_align(8 * (s + 1)) +
           cp_align(4) + cp_align(ce_workspace_bytes(n_local));
}

static cp_ws cp_ws_carve(void *base, int64_t n_local, int64_t nseq)
{
    cp_ws w;
    char *p = (char *)base;
    const size_t n = (size_t)n_local, s = (size_t)nseq;
    w.labels = (int64_t *)p; p += cp_align(8 * n);
    w.valid = (float *)p; p += cp_align(4 * n);
    w.wvalid = (float *)p; p += cp_align(4 * n);
    w.logprob = (float *)p; p += cp_align(4 * n);
    w.cu_local = (int32_t *)p; p += cp_align(4 * (s + 1));
    w.red_a = (double *)p; p += cp_align(16 * s);
    w.red_b = (double *)p; p += cp_align(8 * (s + 1));
    w.divisor = (float *)p; p += cp_align(4);
    w.ce_ws = p;
    return w;
}

/* ============================================================================================
 * 2. Kernels
 * ========================================================================================== */

/* Labels, valid flags and the local cu_seqlens. */
__global__ void cp_labels_kernel(const cp_ce_args a, cp_ws w)
{
    lf_cp_local_labels_grid(a.cu_seqlens, a.nseq, a.cp, a.rank, a.ids, a.target_mask, a.opts.ignore_index, w.labels,
                            (int64_t *)NULL);
    const int64_t n = a.total / a.cp, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += stride) {
        const int64_t y = w.labels[t];
        /* valid: a label the cross-entropy counts (a bad label is counted as an error there) */
        const bool ok = y != a.opts.ignore_index && y >= 0 && y < a.vocab;
        w.valid[t] = ok ? 1.0f : 0.0f;
        w.wvalid[t] = ok ? (a.opts.class_weights ? a.opts.class_weights[y] : 1.0f) : 0.0f;
    }
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k <= a.nseq; k += stride)
        w.cu_local[k] = a.cu_seqlens[k] / a.cp;
}

/* out[k] = sum over sequence k's local tokens of v (deterministic, double). */
__global__ void cp_seq_sum_kernel(const int32_t *cu_local, int64_t nseq, const float *v, double *out)
{
    lf_seg_sum_grid(cu_local, nseq, v, out);
}

/* After all-reduce(red_a): the divisor, the global sum of w_y over valid labels (their count
 * without class weights), summed over the sequences in order. */
__global__ void cp_divisor_kernel(const double *red_a, int64_t nseq, float *divisor)
{
    double s = 0.0;
    for (int64_t k = 0; k < nseq; ++k) s += red_a[nseq + k];
    *divisor = (float)s;
}

/* -logprob of valid rows into valid[] (reused), for the per-sequence NLL. */
__global__ void cp_nll_kernel(int64_t n, const float *logprob, float *valid)
{
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < n; t += (int64_t)gridDim.x * blockDim.x)
        valid[t] = valid[t] != 0.0f ? -logprob[t] : 0.0f;
}

__global__ void cp_loss_share_kernel(const float *loss, double *slot) { *slot = (double)*loss; }

/* After all-reduce(red_b): the outputs. */
__global__ void cp_outputs_kernel(const cp_ce_args a, cp_ws w)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0) *a.loss = (float)w.red_b[a.nseq];
    for (int64_t k = i; k < a.nseq; k += (int64_t)gridDim.x * blockDim.x) {
        const double c = w.red_a[k], m = c > 0.0 ? w.red_b[k] / c : (double)NAN;
        if (a.seq_tokens) a.seq_tokens[k] = (float)c;
        if (a.seq_nll) a.seq_nll[k] = (float)m;
        if (a.seq_ppl) a.seq_ppl[k] = (float)exp(m);
    }
}

/* ============================================================================================
 * 3. The phases of one rank (all on `stream`; an all-reduce of cp_ce_red_a / _b between)
 * ========================================================================================== */

/* CUDA errors: CE_CHECK (examples/cross_entropy.cu) returns LF_ERR_DEVICE and sets *cuda_err */

/* The buffers the group all-reduces (sum, double) after phase A (cp_ce_red_a_count = 2 nseq
 * doubles: counts, then weight sums) and after phase B (nseq + 1 doubles). */
static double *cp_ce_red_a(const cp_ce_args *a) { return cp_ws_carve(a->workspace, a->total / a->cp, a->nseq).red_a; }
static size_t cp_ce_red_a_count(const cp_ce_args *a) { return 2 * (size_t)a->nseq; }
static double *cp_ce_red_b(const cp_ce_args *a) { return cp_ws_carve(a->workspace, a->total / a->cp, a->nseq).red_b; }

static int cp_grid(int64_t n)
{
    const int64_t b = (n + 255) / 256;
    return (int)(b < 1 ? 1 : b > 1024 ? 1024 : b);
}

/* Phase B's cross-entropy over this rank's n local rows (w: the carved workspace). */
static ce_args cp_ce_ce_args(const cp_ce_args *a, const cp_ws &w, int64_t n)
{
    ce_args c = ce_args_default();
    c.logits = a->logits;
    c.dtype = a->dtype;
    c.n_rows = n;
    c.vocab = a->vocab;
    c.stride = a->stride;
    c.labels = w.labels;
    c.labels_i64 = 1;
    c.opts = a->opts;
    c.reduction = LF_REDUCE_MEAN;
    c.divisor = w.divisor; /* the GLOBAL count (sum of w_y) */
    c.grad = a->grad;
    c.grad_stride = a->grad_stride;
    c.loss = a->loss; /* this rank's share: local sum / global count */
    c.logprob = w.logprob;
    c.n_errors = a->n_errors;
    c.workspace = w.ce_ws;
    c.workspace_bytes = ce_workspace_bytes(n);
    return c;
}

/* Checks the arguments that need no device data, phase B's cross-entropy arguments included
 * (ce_check_args: what ce_launch would refuse there), so that a rank with a bad argument fails
 * in phase A, before the first all-reduce, not between the two while its peers wait in the
 * second. The layout itself (every length a multiple of 2 cp) is the caller's to check once
 * per batch on the host: lf_cp_check. */
static lf_status cp_ce_check(const cp_ce_args *a)
{
    if (!a) return LF_ERR_NULL;
    if (a->cp < 1 || a->rank < 0 || a->rank >= a->cp || a->total % a->cp) return LF_ERR_CP;
    if (a->nseq < 1 || a->total < 0 || a->vocab < 1 || a->stride < a->vocab) return LF_ERR_SIZE;
    if (!a->ids || !a->cu_seqlens || !a->loss || !a->workspace || (a->total > 0 && !a->logits)) return LF_ERR_NULL;
    if (a->workspace_bytes < cp_ce_workspace_bytes(a->total / a->cp, a->nseq)) return LF_ERR_SIZE;
    const int64_t n = a->total / a->cp;
    const ce_args c = cp_ce_ce_args(a, cp_ws_carve(a->workspace, n, a->nseq), n);
    return ce_check_args(&c);
}

static lf_status cp_ce_phase_a(const cp_ce_args *a, cudaStream_t s, cudaError_t *cuda_err)
{
    if (cuda_err) *cuda_err = cudaSuccess;
    const lf_status st = cp_ce_check(a);
    if (st != LF_OK) return st;
    const int64_t n = a->total / a->cp;
    const cp_ws w = cp_ws_carve(a->workspace, n, a->nseq);
    cp_labels_kernel<<<cp_grid(n > a->nseq ? n : a->nseq + 1), 256, 0, s>>>(*a, w);
    CE_CHECK(cudaGetLastError());
    cp_seq_sum_kernel<<<cp_grid(32 * a->nseq), 256, 0, s>>>(w.cu_local, a->nseq, w.valid, w.red_a);
    CE_CHECK(cudaGetLastError());
    cp_seq_sum_kernel<<<cp_grid(32 * a->nseq), 256, 0, s>>>(w.cu_local, a->nseq, w.wvalid, w.red_a + a->nseq);
    CE_CHECK(cudaGetLastError());
    return LF_OK;
}

static lf_status cp_ce_phase_b(const cp_ce_args *a, cudaStream_t s, cudaError_t *cuda_err)
{
    if (cuda_err) *cuda_err = cudaSuccess;
    lf_status st = cp_ce_check(a);
    if (st != LF_OK) return st;
    const int64_t n = a->total / a->cp;
    const cp_ws w = cp_ws_carve(a->workspace, n, a->nseq);
    cp_divisor_kernel<<<1, 1, 0, s>>>(w.red_a, a->nseq, w.divisor);
    CE_CHECK(cudaGetLastError());
    const ce_args c = cp_ce_ce_args(a, w, n);
    if (n > 0) {
        st = ce_launch(&c, s, cuda_err);
        if (st != LF_OK) return st;
        cp_nll_kernel<<<cp_grid(n), 256, 0, s>>>(n, w.logprob, w.valid);
        CE_CHECK(cudaGetLastError());
    } else {
        CE_CHECK(cudaMemsetAsync(a->loss, 0, sizeof(float), s));
    }
    cp_seq_sum_kernel<<<cp_grid(32 * a->nseq), 256, 0, s>>>(w.cu_local, a->nseq, w.valid, w.red_b);
    CE_CHECK(cudaGetLastError());
    cp_loss_share_kernel<<<1, 1, 0, s>>>(a->loss, w.red_b + a->nseq);
    CE_CHECK(cudaGetLastError());
    return LF_OK;
}

static lf_status cp_ce_phase_c(const cp_ce_args *a, cudaStream_t s, cudaError_t *cuda_err)
{
    if (cuda_err) *cuda_err = cudaSuccess;
    const lf_status st = cp_ce_check(a);
    if (st != LF_OK) return st;
    const cp_ws w = cp_ws_carve(a->workspace, a->total / a->cp, a->nseq);
    cp_outputs_kernel<<<cp_grid(a->nseq), 256, 0, s>>>(*a, w);
    CE_CHECK(cudaGetLastError());
    return LF_OK;
}

/* The single-GPU simulation's all-reduce: the ranks' buffers (n doubles each), passed by value,
 * summed in rank order into every one of them. */
#define CP_SIM_MAX 64
typedef struct cp_sim_bufs {
    double *p[CP_SIM_MAX];
} cp_sim_bufs;

__global__ void cp_sim_allreduce_kernel(const cp_sim_bufs b, int nranks, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        double s = 0.0;
        for (int r = 0; r < nranks; ++r) s += b.p[r][i];
        for (int r = 0; r < nranks; ++r) b.p[r][i] = s;
    }
}

/* One step of a simulated CP group of cp <= CP_SIM_MAX ranks: args[r] for r < cp, on one device
 * and stream; no host synchronisation (graph-capturable). */
static lf_status cp_ce_simulate(const cp_ce_args *args, int cp, cudaStream_t s, cudaError_t *cuda_err)
{
    cp_sim_bufs ba, bb;
    lf_status st;
    if (cp < 1 || cp > CP_SIM_MAX) return LF_ERR_CP;
    for (int r = 0; r < cp; ++r) {
        ba.p[r] = cp_ce_red_a(&args[r]);
        bb.p[r] = cp_ce_red_b(&args[r]);
    }
    for (int r = 0; r < cp; ++r)
        if ((st = cp_ce_phase_a(&args[r], s, cuda_err)) != LF_OK) return st;
    cp_sim_allreduce_kernel<<<cp_grid(2 * args[0].nseq), 256, 0, s>>>(ba, cp, (int64_t)cp_ce_red_a_count(&args[0]));
    CE_CHECK(cudaGetLastError());
    for (int r = 0; r < cp; ++r)
        if ((st = cp_ce_phase_b(&args[r], s, cuda_err)) != LF_OK) return st;
    cp_sim_allreduce_kernel<<<cp_grid(args[0].nseq + 1), 256, 0, s>>>(bb, cp, args[0].nseq + 1);
    CE_CHECK(cudaGetLastError());
    for (int r = 0; r < cp; ++r)
        if ((st = cp_ce_phase_c(&args[r], s, cuda_err)) != LF_OK) return st;
    return LF_OK;
}

#ifdef LF_HAVE_NCCL
/* One rank's whole step on `stream`, one process (or thread) per GPU: the three phases with the
 * two all-reduces over `comm` (the CP x DP group: every rank of it calls this with its shard)
 * between them. No host synchronisation; nothing is launched for an argument that fails
 * cp_ce_check (then the other ranks would wait in the all-reduce: check on every rank first). */
static lf_status cp_ce_launch(const cp_ce_args *a, ncclComm_t comm, cudaStream_t stream, cudaError_t *cuda_err)
{
    lf_status st;
    if ((st = cp_ce_phase_a(a, stream, cuda_err)) != LF_OK) return st;
    if (ncclAllReduce(cp_ce_red_a(a), cp_ce_red_a(a), cp_ce_red_a_count(a), ncclDouble, ncclSum, comm, stream) != ncclSuccess)
        return LF_ERR_DEVICE;
    if ((st = cp_ce_phase_b(a, stream, cuda_err)) != LF_OK) return st;
    if (ncclAllReduce(cp_ce_red_b(a), cp_ce_red_b(a), (size_t)a->nseq + 1, ncclDouble, ncclSum, comm, stream) != ncclSuccess)
        return LF_ERR_DEVICE;
    return cp_ce_phase_c(a, stream, cuda_err);
}

/* One step of a real CP group driven by one process: args[r] on device devs[r], comms[r],
 * streams[r], each phase over every rank and each all-reduce in one NCCL group (one thread
 * issuing several ranks' collectives must group them). */
static lf_status cp_ce_nccl(const cp_ce_args *args, int cp, const int *devs, ncclComm_t *comms, cudaStream_t *streams,
                            cudaError_t *cuda_err)
{
    lf_status st;
    for (int r = 0; r < cp; ++r) {
        CE_CHECK(cudaSetDevice(devs[r]));
        if ((st = cp_ce_phase_a(&args[r], streams[r], cuda_err)) != LF_OK) return st;
    }
    bool ok = ncclGroupStart() == ncclSuccess;
    for (int r = 0; r < cp && ok; ++r)
        ok = ncclAllReduce(cp_ce_red_a(&args[r]), cp_ce_red_a(&args[r]), cp_ce_red_a_count(&args[r]), ncclDouble, ncclSum,
                           comms[r], streams[r]) == ncclSuccess;
    if (ncclGroupEnd() != ncclSuccess || !ok) return LF_ERR_DEVICE; /* the group is closed either way */
    for (int r = 0; r < cp; ++r) {
        CE_CHECK(cudaSetDevice(devs[r]));
        if ((st = cp_ce_phase_b(&args[r], streams[r], cuda_err)) != LF_OK) return st;
    }
    ok = ncclGroupStart() == ncclSuccess;
    for (int r = 0; r < cp && ok; ++r)
        ok = ncclAllReduce(cp_ce_red_b(&args[r]), cp_ce_red_b(&args[r]), (size_t)args[r].nseq + 1, ncclDouble, ncclSum,
                           comms[r], streams[r]) == ncclSuccess;
    if (ncclGroupEnd() != ncclSuccess || !ok) return LF_ERR_DEVICE;
    for (int r = 0; r < cp; ++r) {
        CE_CHECK(cudaSetDevice(devs[r]));
        if ((st = cp_ce_phase_c(&args[r], streams[r], cuda_err)) != LF_OK) return st;
    }
    return LF_OK;
}
#endif

/* ============================================================================================
 * 4. A whole check against the unsharded cross-entropy (main, and tests/test_cp_gpu.cu use it),
 *    then main.
 * ========================================================================================== */

typedef struct cp_demo {
    int cp;
    int64_t nseq, V;
    lf_dtype dt;
    lf_ce_opts opts;
    int in_place;        /* gradient over the local logits, else to a separate buffer */
    int empty_every;     /* every k-th sequence empty (0: none) */
    double prompt_frac;  /* leading fraction of each sequence with target_mask 0 */
    double bad_frac;     /* fraction of ids set out of range (bad labels, counted) */
    int64_t mean_len;    /* mean sequence length (rounded to multiples of 2 cp) */
    uint64_t seed;
    int use_nccl;        /* one GPU per rank through NCCL (LF_HAVE_NCCL; cp <= devices) */
    int thread_per_rank; /* with use_nccl: a thread per rank, each calling cp_ce_launch for its
                          * rank alone (what one process per GPU runs), not cp_ce_nccl */
    int weights;         /* random class weights (0.25 .. 2.25, one in ten 0) */
    int report_memory;   /* opt-in: run the sharded step once more between two cudaMemGetInfo
                          * readings (what it allocates beyond the caller's buffers: nothing) */
    int time_iters;      /* simulation only: then time rank 0's three phases (the all-reduces
                          * left out: one GPU), a device copy of the bytes a rank would receive
                          * gathering the logits ((cp - 1) / cp of them), and the cross-entropy
                          * of the gathered [T, V]; medians of time_iters, in place */
} cp_demo;

typedef struct cp_demo_result {
    lf_status st;
    cudaError_t cuda;
    int64_t total;
    double loss, loss_ref, loss_err; /* loss_err: |loss - loss_ref| / tolerance, worst rank */
    double grad_err;                 /* worst gradient element, in tolerances */
    int64_t gw_pos, gw_col, gw_label; /* ... that element: its token (position in the batch), its
                                       * column, the token's label (-1 none) */
    double gw_got, gw_want, gw_tol;   /* ... its value, the unsharded kernel's, the tolerance */
    int64_t label_mismatch, count_mismatch, seq_unwritten;
    double nll_err;                  /* worst per-sequence mean NLL, in tolerances */
    double ppl_err;                  /* worst per-sequence perplexity, in tolerances */
    unsigned errors, errors_ref;
    size_t ws_bytes, gathered_bytes;
    double ms_local, ms_gather_copy, ms_full; /* with time_iters */
    long long step_alloc_bytes;               /* with report_memory: free before - after the step */
    int ok;
} cp_demo_result;

static uint64_t cp_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Logits like a language model's: a bulk of width ~2, strong candidates, rare +-30 outliers. */
template <typename T>
__global__ void cp_gen_logits(T *x, int64_t n, uint64_t seed)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ seed;
        z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
        z ^= z >> 29;
        const float u = (float)(z >> 40) * (1.0f / 16777216.0f), v = (float)((z >> 16) & 0xffffff) * (1.0f / 16777216.0f);
        float x0 = 4.0f * (u + v - 1.0f);
        if ((z & 0x3ff) == 7) x0 = (z & 0x400) ? 30.0f : -30.0f;
        x[i] = lf_elem<T>::from_f32(x0);
    }
}

/* dst row t = src row rows[t] (the zigzag gather a CP model's layout produces by itself). */
template <typename T>
__global__ void cp_gather_rows(T *dst, const T *src, const int64_t *rows, int64_t n, int64_t V)
{
    for (int64_t t = blockIdx.x; t < n; t += gridDim.x)
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) dst[t * V + j] = src[rows[t] * V + j];
}

static void cp_launch_gen(void *x, lf_dtype dt, int64_t n, uint64_t seed)
{
    if (dt == LF_F32) cp_gen_logits<float><<<2048, 256>>>((float *)x, n, seed);
    else if (dt == LF_BF16) cp_gen_logits<__nv_bfloat16><<<2048, 256>>>((__nv_bfloat16 *)x, n, seed);
    else cp_gen_logits<__half><<<2048, 256>>>((__half *)x, n, seed);
}

static void cp_launch_gather(void *dst, const void *src, lf_dtype dt, const int64_t *rows, int64_t n, int64_t V)
{
    if (n == 0) return;
    const int g = (int)(n < 4096 ? n : 4096);
    if (dt == LF_F32) cp_gather_rows<float><<<g, 256>>>((float *)dst, (const float *)src, rows, n, V);
    else cp_gather_rows<uint16_t><<<g, 256>>>((uint16_t *)dst, (const uint16_t *)src, rows, n, V);
}

static double cp_elem(const std::vector<char> &h, size_t i, lf_dtype dt)
{
    if (dt == LF_F32) return ((const float *)h.data())[i];
    const uint16_t b = ((const uint16_t *)h.data())[i];
    return dt == LF_BF16 ? lf_bf16_to_f32(b) : lf_f16_to_f32(b);
}

#define CP_TRY(call)                                                                                \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            res->cuda = e_;                                                                         \
            res->st = LF_ERR_DEVICE;                                                                \
            return *res;                                                                            \
        }                                                                                           \
    } while (0)

/* Makes a packed batch, runs the unsharded cross-entropy and the cp-sharded one, compares. */
static cp_demo_result cp_demo_run(const cp_demo *d)
{
    cp_demo_result rr;
    cp_demo_result *res = &rr;
    memset(res, 0, sizeof *res);
    res->cuda = cudaSuccess;
    const int cp = d->cp;
    const int64_t V = d->V, nseq = d->nseq, ign = d->opts.ignore_index;
    const int esz = lf_dtype_size(d->dt);
    uint64_t rs = cp_mix(d->seed);
    auto rnd = [&](uint64_t n) { rs = cp_mix(rs); return n ? rs % n : 0; };

    /* the batch: lengths multiples of 2 cp, some empty; ids; a prompt mask */
    std::vector<int32_t> cu(nseq + 1, 0);
    const int64_t unit = 2 * (int64_t)cp, maxu = (2 * d->mean_len) / unit > 1 ? (2 * d->mean_len) / unit : 1;
    for (int64_t k = 0; k < nseq; ++k) {
        const bool empty = d->empty_every > 0 && k % d->empty_every == d->empty_every - 1;
        cu[k + 1] = cu[k] + (int32_t)(empty ? 0 : unit * (int64_t)(1 + rnd((uint64_t)maxu)));
    }
    const int64_t T = cu[nseq], n_local = T / cp;
    res->total = T;
    std::vector<int64_t> ids(T > 0 ? T : 1);
    std::vector<uint8_t> tmask(T > 0 ? T : 1, 1);
    for (int64_t t = 0; t < T; ++t) ids[t] = (rnd(1000000) < (uint64_t)(d->bad_frac * 1e6)) ? V + 3 : (int64_t)rnd((uint64_t)V);
    for (int64_t k = 0; k < nseq; ++k)
        for (int64_t t = cu[k]; t < cu[k] + (int64_t)(d->prompt_frac * (cu[k + 1] - cu[k])); ++t) tmask[t] = 0;
    if ((res->st = lf_cp_check(cu.data(), nseq, T, cp, NULL)) != LF_OK) return *res;

    /* the unsharded reference (the same kernel on the full batch) */
    std::vector<int64_t> lab_full(T > 0 ? T : 1);
    for (int64_t t = 0; t < T; ++t) {
        int64_t y = lf_packed_next_label(cu.data(), nseq, ids.data(), t, ign);
        lab_full[t] = (y != ign && !tmask[t + 1]) ? ign : y;
    }
    const size_t nel = (size_t)T * V;
    void *xg = NULL, *gref = NULL, *wsr = NULL;
    int64_t *labd = NULL;
    float *lpref = NULL, *lossref = NULL;
    unsigned *erref = NULL;
    const size_t wsrb = ce_workspace_bytes(T);
    CP_TRY(cudaSetDevice(0));
    CP_TRY(cudaMalloc(&xg, nel * esz + 16));
    CP_TRY(cudaMalloc(&gref, nel * esz + 16));
    CP_TRY(cudaMalloc(&labd, 8 * (T + 1)));
    std::vector<float> cw(V);
    for (int64_t j = 0; j < V; ++j) cw[j] = rnd(10) == 0 ? 0.0f : 0.25f + 2.0f * (float)rnd(1000) / 1000.0f;
    std::vector<float *> cwd(cp > 0 ? cp : 1, (float *)NULL); /* per rank's device; [0] also the reference's */
    if (d->weights) {
        CP_TRY(cudaMalloc(&cwd[0], 4 * V));
        CP_TRY(cudaMemcpy(cwd[0], cw.data(), 4 * V, cudaMemcpyHostToDevice));
    }
    CP_TRY(cudaMalloc(&lpref, 4 * (T + 1)));
    CP_TRY(cudaMalloc(&lossref, 4));
    CP_TRY(cudaMalloc(&erref, 4));
    CP_TRY(cudaMalloc(&wsr, wsrb));
    CP_TRY(cudaMemset(wsr, 0, wsrb));
    CP_TRY(cudaMemset(erref, 0, 4));
    cp_launch_gen(xg, d->dt, (int64_t)nel, d->seed * 31 + 5);
    CP_TRY(cudaGetLastError());
    CP_TRY(cudaMemcpy(labd, lab_full.data(), 8 * T, cudaMemcpyHostToDevice));
    ce_args cref = ce_args_default(); /* the reference's arguments (the timing reuses them, in place) */
    {
        ce_args &c = cref;
        c.logits = xg;
        c.dtype = d->dt;
        c.n_rows = T;
        c.vocab = c.stride = V;
        c.labels = labd;
        c.labels_i64 = 1;
        c.opts = d->opts;
        c.opts.class_weights = cwd[0];
        c.grad = gref;
        c.grad_stride = V;
        c.loss = lossref;
        c.logprob = lpref;
        c.n_errors = erref;
        c.workspace = wsr;
        c.workspace_bytes = wsrb;
        if ((res->st = ce_launch(&c, 0, &res->cuda)) != LF_OK) return *res;
        CP_TRY(cudaDeviceSynchronize());
    }
    float lref;
    std::vector<float> lph(T > 0 ? T : 1);
    CP_TRY(cudaMemcpy(&lref, lossref, 4, cudaMemcpyDeviceToHost));
    CP_TRY(cudaMemcpy(lph.data(), lpref, 4 * T, cudaMemcpyDeviceToHost));
    CP_TRY(cudaMemcpy(&res->errors_ref, erref, 4, cudaMemcpyDeviceToHost));
    res->loss_ref = lref;
    /* per-sequence reference metrics (double, from the unsharded per-token log-probs) */
    std::vector<double> cnt_ref(nseq, 0.0), nll_ref(nseq, 0.0);
    for (int64_t k = 0; k < nseq; ++k)
        for (int64_t t = cu[k]; t < cu[k + 1]; ++t)
            if (lab_full[t] != ign && lab_full[t] >= 0 && lab_full[t] < V) {
                cnt_ref[k] += 1.0;
                nll_ref[k] -= lph[t];
            }

    /* the sharded run: rank r on device 0 (simulation) or device r (NCCL) */
    const bool nccl = d->use_nccl != 0;
    std::vector<cp_ce_args> args(cp);
    std::vector<void *> xl(cp), gl(cp), ws(cp);
    std::vector<float *> outs(cp);
    std::vector<unsigned *> errs(cp);
    std::vector<int64_t *> ids_d(cp), gpos_d(cp);
    std::vector<int32_t *> cu_d(cp);
    std::vector<uint8_t *> tm_d(cp);
    std::vector<std::vector<int64_t>> lab_r(cp, std::vector<int64_t>(n_local > 0 ? n_local : 1)),
        gpos_r(cp, std::vector<int64_t>(n_local > 0 ? n_local : 1));
    res->ws_bytes = cp_ce_workspace_bytes(n_local, nseq);
    res->gathered_bytes = nel * esz;
    for (int r = 0; r < cp; ++r) {
        const int dev = nccl ? r : 0;
        if ((res->st = lf_ref_cp_labels(ids.data(), tmask.data(), cu.data(), nseq, T, cp, r, ign, lab_r[r].data(),
                                        gpos_r[r].data())) != LF_OK)
            return *res;
        /* the local logits, gathered on device 0 from the global ones */
        void *tmp = NULL;
        int64_t *rows = NULL;
        CP_TRY(cudaSetDevice(0));
        CP_TRY(cudaMalloc(&tmp, (size_t)n_local * V * esz + 16));
        CP_TRY(cudaMalloc(&rows, 8 * (n_local + 1)));
        CP_TRY(cudaMemcpy(rows, gpos_r[r].data(), 8 * n_local, cudaMemcpyHostToDevice));
        cp_launch_gather(tmp, xg, d->dt, rows, n_local, V);
        CP_TRY(cudaGetLastError());
        CP_TRY(cudaDeviceSynchronize());
        CP_TRY(cudaSetDevice(dev));
        CP_TRY(cudaMalloc(&xl[r], (size_t)n_local * V * esz + 16));
        CP_TRY(cudaMemcpyPeer(xl[r], dev, tmp, 0, (size_t)n_local * V * esz));
        CP_TRY(cudaSetDevice(0));
        CP_TRY(cudaFree(tmp));
        CP_TRY(cudaFree(rows));
        CP_TRY(cudaSetDevice(dev));
        if (!d->in_place) {
            CP_TRY(cudaMalloc(&gl[r], (size_t)n_local * V * esz + 16));
            CP_TRY(cudaMemset(gl[r], 0xff, (size_t)n_local * V * esz)); /* poison: NaN in every dtype */
        }
        CP_TRY(cudaMalloc(&outs[r], 4 * (1 + 3 * nseq)));
        CP_TRY(cudaMemset(outs[r], 0xff, 4 * (1 + 3 * nseq)));
        CP_TRY(cudaMalloc(&errs[r], 4));
        CP_TRY(cudaMemset(errs[r], 0, 4));
        CP_TRY(cudaMalloc(&ws[r], res->ws_bytes));
        CP_TRY(cudaMemset(ws[r], 0, res->ws_bytes));
        CP_TRY(cudaMalloc(&ids_d[r], 8 * (T + 1)));
        CP_TRY(cudaMemcpy(ids_d[r], ids.data(), 8 * T, cudaMemcpyHostToDevice));
        CP_TRY(cudaMalloc(&tm_d[r], T + 1));
        CP_TRY(cudaMemcpy(tm_d[r], tmask.data(), T, cudaMemcpyHostToDevice));
        CP_TRY(cudaMalloc(&cu_d[r], 4 * (nseq + 1)));
        CP_TRY(cudaMemcpy(cu_d[r], cu.data(), 4 * (nseq + 1), cudaMemcpyHostToDevice));
        cp_ce_args &a = args[r];
        memset(&a, 0, sizeof a);
        a.ids = ids_d[r];
        a.target_mask = tm_d[r];
        a.cu_seqlens = cu_d[r];
        a.nseq = nseq;
        a.total = T;
        a.cp = cp;
        a.rank = r;
        a.logits = xl[r];
        a.dtype = d->dt;
        a.vocab = a.stride = V;
        a.opts = d->opts;
        if (d->weights && dev != 0 && !cwd[r]) {
            CP_TRY(cudaMalloc(&cwd[r], 4 * V));
            CP_TRY(cudaMemcpy(cwd[r], cw.data(), 4 * V, cudaMemcpyHostToDevice));
        }
        a.opts.class_weights = dev != 0 ? cwd[r] : cwd[0];
        a.grad = d->in_place ? xl[r] : gl[r];
        a.grad_stride = V;
        a.loss = outs[r];
        a.seq_tokens = outs[r] + 1;
        a.seq_nll = outs[r] + 1 + nseq;
        a.seq_ppl = outs[r] + 1 + 2 * nseq;
        a.n_errors = errs[r];
        a.workspace = ws[r];
        a.workspace_bytes = res->ws_bytes;
    }
    if (nccl) {
#ifdef LF_HAVE_NCCL
        std::vector<int> devs(cp);
        std::vector<ncclComm_t> comms(cp);
        std::vector<cudaStream_t> streams(cp);
        for (int r = 0; r < cp; ++r) {
            devs[r] = r;
            CP_TRY(cudaSetDevice(r));
            CP_TRY(cudaStreamCreate(&streams[r]));
        }
        if (ncclCommInitAll(comms.data(), cp, devs.data()) != ncclSuccess) {
            res->st = LF_ERR_DEVICE;
            return *res;
        }
        if (d->thread_per_rank) {
            std::vector<lf_status> sts(cp, LF_OK);
            std::vector<cudaError_t> errs_cu(cp, cudaSuccess);
            std::vector<std::thread> th;
            for (int r = 0; r < cp; ++r)
                th.emplace_back([&, r]() {
                    if ((errs_cu[r] = cudaSetDevice(r)) != cudaSuccess) sts[r] = LF_ERR_DEVICE;
                    else sts[r] = cp_ce_launch(&args[r], comms[r], streams[r], &errs_cu[r]);
                });
            for (std::thread &t : th) t.join();
            res->st = LF_OK;
            for (int r = 0; r < cp && res->st == LF_OK; ++r) {
                res->st = sts[r];
                res->cuda = errs_cu[r];
            }
        } else {
            res->st = cp_ce_nccl(args.data(), cp, devs.data(), comms.data(), streams.data(), &res->cuda);
        }
        for (int r = 0; r < cp; ++r) {
            CP_TRY(cudaSetDevice(r));
            CP_TRY(cudaStreamSynchronize(streams[r]));
            CP_TRY(cudaStreamDestroy(streams[r]));
            ncclCommDestroy(comms[r]);
        }
        if (res->st != LF_OK) return *res;
#else
        res->st = LF_ERR_ARG; /* built without NCCL */
        return *res;
#endif
    } else {
        if ((res->st = cp_ce_simulate(args.data(), cp, 0, &res->cuda)) != LF_OK) return *res;
    }

    /* compare */
    const double unit_r = d->dt == LF_BF16 ? 0x1p-8 : d->dt == LF_F16 ? 0x1p-11 : 0x1p-16;
    double count = 0.0;
    for (double c : cnt_ref) count += c;
    /* a non-label element is (p_j a - eps w_j / V) / divisor (a = (1 - eps) w_y + eps W / V +
     * 2 lam lse; divisor = sum of w_y, the count without weights): the other order of the row's
     * sums moves lse by a few ulps, p_j by ~2^-18 relative, so the element by up to
     * 2^-18 (|g_j| + eps w_max / (V divisor)) absolute however much p_j a - eps w_j / V cancels */
    double wdiv = 0.0, wmax = 1.0;
    for (int64_t t = 0; t < T; ++t)
        if (lab_full[t] != ign && lab_full[t] >= 0 && lab_full[t] < V) wdiv += d->weights ? cw[lab_full[t]] : 1.0;
    if (d->weights)
        for (int64_t j = 0; j < V; ++j) wmax = fmax(wmax, cw[j]);
    const double smooth_floor = wdiv > 0.0 ? (double)d->opts.label_smoothing * wmax / ((double)V * wdiv) : 0.0;
    std::vector<char> gh((size_t)V * esz), rh((size_t)V * esz);
    std::vector<int64_t> labl(n_local > 0 ? n_local : 1);
    std::vector<float> oh(1 + 3 * nseq);
    for (int r = 0; r < cp; ++r) {
        const int dev = nccl ? r : 0;
        CP_TRY(cudaSetDevice(dev));
        CP_TRY(cudaDeviceSynchronize());
        unsigned e;
        CP_TRY(cudaMemcpy(&e, errs[r], 4, cudaMemcpyDeviceToHost));
        res->errors += e;
        CP_TRY(cudaMemcpy(oh.data(), outs[r], 4 * (1 + 3 * nseq), cudaMemcpyDeviceToHost));
        res->loss = oh[0];
        /* the loss: a sum of T fp32 terms in another order, then / count */
        const double tol = 1e-6 * fabs(res->loss_ref) + 1e-7;
        res->loss_err = fmax(res->loss_err, lf_check_err(oh[0], res->loss_ref, tol));
        for (int64_t k = 0; k < nseq; ++k) {
            uint32_t b0, b1, b2;
            memcpy(&b0, &oh[1 + k], 4);
            memcpy(&b1, &oh[1 + nseq + k], 4);
            memcpy(&b2, &oh[1 + 2 * nseq + k], 4);
            res->seq_unwritten += b0 == 0xffffffffu || b1 == 0xffffffffu || b2 == 0xffffffffu;
            res->count_mismatch += (double)oh[1 + k] != cnt_ref[k];
            const double want = cnt_ref[k] > 0 ? nll_ref[k] / cnt_ref[k] : (double)NAN;
            const float nll = oh[1 + nseq + k], ppl = oh[1 + 2 * nseq + k];
            /* the mean NLL: 1e-5 relative plus 1e-6 (sums of fp32 terms in another order); the
             * perplexity exp(m), computed in double from the same m and rounded once: relative error
             * up to the NLL's absolute tolerance plus fp32's rounding */
            const double tol_m = 1e-5 * fabs(want) + 1e-6;
            const double pw = exp(want), pwant = (double)(float)pw == INFINITY ? INFINITY : pw; /* NaN for NaN */
            res->nll_err = fmax(res->nll_err, lf_check_err(nll, want, tol_m));
            res->ppl_err = fmax(res->ppl_err, lf_check_err(ppl, pwant, pw * (1.5 * tol_m + 0x1p-23)));
        }
        /* the device labels (in the workspace) against the host reference */
        const cp_ws w = cp_ws_carve(ws[r], n_local, nseq);
        CP_TRY(cudaMemcpy(labl.data(), w.labels, 8 * n_local, cudaMemcpyDeviceToHost));
        for (int64_t t = 0; t < n_local; ++t) res->label_mismatch += labl[t] != lab_r[r][t];
        /* gradient rows against the unsharded ones: the same kernel, only the order of the row's
         * sums may differ with the launch shape: 2 units of the dtype's rounding (fp32: 2^-16)
         * plus the cancellation bound above. At the label column the element is (a p_y - b) dz/dx
         * with b = (1 - eps) w_y / divisor: where the label is confident, a p_y ~ b and the
         * difference keeps the absolute error of a p_y, up to the 2^-18 relative that the other
         * order moves p_y by (above) times |b|, which the relative terms of a small element do not
         * cover (seen: the two runs one ulp of b apart, 2^-24 |b|, at p_y ~ 1 - 1e-3 2^-14 of the
         * element: fp32 logits, V = 1001, softcap 30): so 2^-18 w_y |scale| / divisor there. */
        for (int64_t t = 0; t < n_local; ++t) {
            const int64_t y = lab_r[r][t];
            const double lab_tol = y != ign && y >= 0 && y < V && wdiv > 0.0
                                       ? 0x1p-18 * (d->weights ? cw[y] : 1.0) * fabs((double)d->opts.logit_scale) / wdiv
                                       : 0.0;
            CP_TRY(cudaMemcpy(gh.data(), (char *)(d->in_place ? xl[r] : gl[r]) + (size_t)t * V * esz, V * esz, cudaMemcpyDeviceToHost));
            CP_TRY(cudaSetDevice(0));
            CP_TRY(cudaMemcpy(rh.data(), (char *)gref + (size_t)gpos_r[r][t] * V * esz, V * esz, cudaMemcpyDeviceToHost));
            CP_TRY(cudaSetDevice(dev));
            for (int64_t j = 0; j < V; ++j) {
                const double g = cp_elem(gh, j, d->dt), want = cp_elem(rh, j, d->dt);
                /* (fp16: one step of its subnormal grid, 2^-24, where such small elements land) */
                const double tl = 2.0 * unit_r * fmax(fabs(g), fabs(want)) + 0x1p-16 * (fabs(want) + smooth_floor) +
                                  (d->dt == LF_F16 ? 0x1p-24 : 0.0) + (j == y ? lab_tol : 0.0) + 1e-30;
                const double e = lf_check_err(g, want, tl);
                if (e > res->grad_err) {
                    res->grad_err = e;
                    res->gw_pos = gpos_r[r][t], res->gw_col = j, res->gw_label = y == ign ? -1 : y;
                    res->gw_got = g, res->gw_want = want, res->gw_tol = tl;
                }
            }
        }
    }
    res->ok = res->st == LF_OK && res->loss_err <= 1.0 && res->grad_err <= 1.0 && res->label_mismatch == 0 &&
              res->count_mismatch == 0 && res->seq_unwritten == 0 && res->nll_err <= 1.0 && res->ppl_err <= 1.0 &&
              res->errors == res->errors_ref;
    if (d->report_memory && !nccl) {
        size_t f0 = 0, f1 = 0, tot = 0;
        CP_TRY(cudaSetDevice(0));
        CP_TRY(cudaDeviceSynchronize());
        CP_TRY(cudaMemGetInfo(&f0, &tot));
        if ((res->st = cp_ce_simulate(args.data(), cp, 0, &res->cuda)) != LF_OK) return *res;
        CP_TRY(cudaDeviceSynchronize());
        CP_TRY(cudaMemGetInfo(&f1, &tot));
        res->step_alloc_bytes = (long long)f0 - (long long)f1;
    }
    if (d->time_iters > 0 && !nccl && T > 0) {
        CP_TRY(cudaSetDevice(0));
        auto time_it = [&](auto &&step, double *ms) { return ce_time_median(step, d->time_iters, ms); };
        cp_ce_args a0 = args[0];
        a0.grad = xl[0]; /* in place */
        auto local = [&]() -> lf_status {
            lf_status st = cp_ce_phase_a(&a0, 0, &res->cuda);
            if (st == LF_OK) st = cp_ce_phase_b(&a0, 0, &res->cuda);
            if (st == LF_OK) st = cp_ce_phase_c(&a0, 0, &res->cuda);
            return st;
        };
        if ((res->st = time_it(local, &res->ms_local)) != LF_OK) return *res;
        const size_t recv = nel * esz / (size_t)cp * (size_t)(cp - 1);
        auto gather = [&]() -> lf_status {
            if (recv && cudaMemcpyAsync(gref, xg, recv, cudaMemcpyDeviceToDevice, 0) != cudaSuccess) return LF_ERR_DEVICE;
            return LF_OK;
        };
        if ((res->st = time_it(gather, &res->ms_gather_copy)) != LF_OK) return *res;
        ce_args c = cref;
        c.grad = xg;
        if ((res->st = time_it([&]() { return ce_launch(&c, 0, &res->cuda); }, &res->ms_full)) != LF_OK) return *res;
        CP_TRY(cudaGetLastError());
    }
    for (int r = 0; r < cp; ++r) {
        CP_TRY(cudaSetDevice(nccl ? r : 0));
        for (void *q : {xl[r], gl[r], (void *)outs[r], (void *)errs[r], ws[r], (void *)ids_d[r], (void *)tm_d[r], (void *)cu_d[r]})
            if (q) CP_TRY(cudaFree(q));
    }
    CP_TRY(cudaSetDevice(0));
    for (int r = 1; r < cp; ++r)
        if (cwd[r]) {
            CP_TRY(cudaSetDevice(r));
            CP_TRY(cudaFree(cwd[r]));
        }
    CP_TRY(cudaSetDevice(0));
    for (void *q : {xg, gref, wsr, (void *)labd, (void *)lpref, (void *)lossref, (void *)erref, (void *)cwd[0]})
        if (q) CP_TRY(cudaFree(q));
    return *res;
}
#undef CP_TRY

#ifndef CP_NO_MAIN
int main(int argc, char **argv)
{
    cp_demo d;
    memset(&d, 0, sizeof d);
    d.cp = argc > 1 ? atoi(argv[1]) : 4;
    d.nseq = argc > 2 ? atoll(argv[2]) : 16;
    d.V = argc > 3 ? atoll(argv[3]) : 32768;
    d.use_nccl = argc > 4 && !strcmp(argv[4], "nccl");
    d.report_memory = argc > 5 && !strcmp(argv[5], "mem");
    d.dt = LF_BF16;
    d.opts = lf_ce_opts_default();
    d.opts.label_smoothing = 0.1f;
    d.opts.z_loss = 1e-4f;
    d.in_place = 1;
    d.empty_every = 5;
    d.prompt_frac = 0.25;
    d.bad_frac = 0.001;
    d.mean_len = 256;
    d.seed = 20261123;
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        /* Say so plainly, and still show the layout at work on the host. */
        const int32_t cu[3] = {0, 8, 24};
        int64_t ids[24], lab[12], gpos[12];
        for (int i = 0; i < 24; ++i) ids[i] = 100 + i;
        printf("no CUDA device found: the zigzag layout of cp = 2 on the host only\n");
        for (int r = 0; r < 2; ++r) {
            const lf_status st = lf_ref_cp_labels(ids, NULL, cu, 2, 24, 2, r, -100, lab, gpos);
            printf("rank %d (%s): global tokens", r, lf_status_str(st));
            for (int t = 0; t < 12; ++t) printf(" %lld", (long long)gpos[t]);
            printf("\n         labels");
            for (int t = 0; t < 12; ++t) printf(" %lld", (long long)lab[t]);
            printf("\n");
        }
        return 0;
    }
#ifndef LF_HAVE_NCCL
    if (d.use_nccl) {
        fprintf(stderr, "built without NCCL: rebuild with -DLF_HAVE_NCCL -lnccl\n");
        return 1;
    }
#endif
    if (d.use_nccl && d.cp > ndev) {
        fprintf(stderr, "nccl mode: cp = %d ranks need %d GPUs, %d visible\n", d.cp, d.cp, ndev);
        return 1;
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return 1;
    printf("device: %s  cp=%d (%s)  nseq=%lld  V=%lld bf16, smoothing 0.1, z-loss 1e-4, 25%% prompt, every 5th sequence empty\n",
           prop.name, d.cp, d.use_nccl ? "NCCL, one GPU per rank" : "simulated on one GPU", (long long)d.nseq, (long long)d.V);
    const cp_demo_result r = cp_demo_run(&d);
    if (r.st != LF_OK) {
        fprintf(stderr, "cp_demo_run: %s (%s)\n", lf_status_str(r.st), cudaGetErrorString(r.cuda));
        return 1;
    }
    printf("tokens %lld; loss %.7f, unsharded %.7f (%.3f of tolerance); gradient worst %.3f of tolerance\n", (long long)r.total,
           r.loss, r.loss_ref, r.loss_err, r.grad_err);
    printf("labels built on the device: %lld mismatches; per-sequence counts: %lld mismatches; mean NLL worst %.3f of tolerance; "
           "perplexity worst %.3f of tolerance; bad labels %u (unsharded %u)\n", (long long)r.label_mismatch,
           (long long)r.count_mismatch, r.nll_err, r.ppl_err, r.errors, r.errors_ref);
    printf("memory per rank: workspace %zu B; gathering the logits instead would take %zu B\n", r.ws_bytes, r.gathered_bytes);
    if (d.report_memory && !d.use_nccl)
        printf("memory report: net device memory the step allocated: %lld B (cudaMemGetInfo around a second run of every rank)\n",
               r.step_alloc_bytes);
    printf("%s\n", r.ok ? "OK" : "MISMATCH");
    return r.ok ? 0 : 1;
}
#endif /* CP_NO_MAIN */
