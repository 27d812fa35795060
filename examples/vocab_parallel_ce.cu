/* examples/vocab_parallel_ce.cu — cross-entropy with the vocabulary split over tp ranks (tensor
 * parallelism): each rank reduces its [N, V/tp] shard of the logits to 12 bytes per row, the
 * ranks exchange those (never the logits), and each writes the gradient of its shard in place.
 *
 * Build and run (from the repository root; meson does the same, see README.md):
 *     nvcc -O3 -std=c++17 -arch=sm_90 -I. examples/vocab_parallel_ce.cu -o vocab_parallel_ce
 *     nvcc -O3 -std=c++17 -arch=sm_90 -I. -DLF_HAVE_NCCL examples/vocab_parallel_ce.cu -lnccl -o vocab_parallel_ce
 *     ./vocab_parallel_ce [tp=2] [N=2048] [V=151936] [sim|simlsa|nccl|lsa|mp|mplsa] [mem] [graph]
 *   sim  (default): the tp ranks simulated in one process on one GPU (each shard its own buffer),
 *        checked against the single-GPU cross-entropy (examples/cross_entropy.cu) on the full
 *        vocabulary;
 *   nccl (built with -DLF_HAVE_NCCL): one process drives every visible GPU, one rank each, the
 *        exchange through ncclAllGather; checked the same way. With one process per GPU, each
 *        process calls tp_ce_launch for its rank with its communicator (ncclCommInitRank).
 *   lsa  (NCCL 2.28 or later, GPUs of one NVLink domain): as nccl, on a read-once schedule:
 *        the shares go straight into every rank's symmetric window (see "Read once" below);
 *        resident wherever it applies.
 *   simlsa: the read-once schedules with every rank's window on ONE GPU (no NCCL needed): the
 *        ranks' kernels run at once, each on its share of the SMs (tp_sim_windows).
 *   mp, mplsa: as nccl and lsa, but ONE PROCESS PER GPU, as a training job runs: tp processes
 *        (forked here; torchrun or mpirun would start them), each with its communicator from
 *        ncclCommInitRank, calling tp_ce_launch for its own rank only (tp_one_rank); each checks
 *        its shard against the single-GPU loss on its GPU, and the ranks' loss / lse bits are
 *        compared. tp = 1 runs on one GPU. Also times each rank's whole step, exchange included.
 *   mem  (opt-in; sim, simlsa): also report the net device memory a step allocates (free memory before and
 *        after a second run: it allocates nothing, every buffer is the caller's) and the
 *        caller's buffers it touches.
 *   graph (modes simlsa, lsa, mp, mplsa): four more runs, the first and third of them replays
 *        of each rank's step captured into a CUDA graph (tp_ce_capture), the others plain
 *        launches; every run must give the first run's bits.
 *
 * The math (lossfuse.h section 11): per row, each rank's 12-byte share lf_tp_share is the lse
 *   state (m, s) of its columns and t, its part of sum_j q_j (m - z_j) where q is the target
 *   distribution (label, smoothing, class weights). After an all-gather of the shares every rank
 *   merges a row's P shares in RANK ORDER — the same bits on every rank — into the global lse
 *   and the loss, and writes the gradient of its own columns. Same options and contract as
 *   examples/cross_entropy.cu: ignore_index, label smoothing with the GLOBAL mean over V, z-loss,
 *   softcap, logit scale, class weights (the full [V] vector on every rank: it is small),
 *   reduction none / sum / mean with a device-scalar divisor, upstream gradient, bad labels
 *   counted (on rank 0) with loss 0 and zero gradient, NaN logits -> NaN row, all ignored -> 0,
 *   the batch loss summed in a fixed order (bit-identical run to run, and on every rank).
 *
 * Schedule: two passes over the shard around one exchange (the default)
 *   Step 1 reads every row's shard (each row in slices of 32 KB, one CTA each, staged in shared
 *   memory; the slices' partial states merged in slice order by the row's last CTA into the
 *   share), the all-gather of the shares runs, step 2 reads the shard again and writes the
 *   gradient (in reverse row order: the rows read last may still be in L2). HBM traffic: 1.5x
 *   the floor (read + write of the shard). The exchange is one all-gather of 12 tp N bytes.
 *   Chunked (chunk_rows > 0): chunk k's statistics, its all-gather on a second stream, and its
 *   gradient two steps later in the launch of chunk k + 2's statistics (tp_step_kernel, with
 *   programmatic dependent launch on sm_90): the exchange overlaps a step and the chunk should
 *   still be in L2 for the gradient, so the floor traffic only. Measured on an H100
 *   (bench/RESULTS.md) the per-step cost of a kernel boundary every few microseconds outweighs
 *   the saved re-read at every chunk size tried, hence the default: a tp = 2 rank's step takes
 *   0.6-0.7x the single-GPU kernel's time on the full V there.
 * Read once, resident (an exchange with a window, tp_lsa_create; the automatic choice for
 *   forward + backward on sm_90, tp_ce_args.lsa_schedule): each rank runs examples/
 *   cross_entropy.cu's row-resident kernel over its shard with an exchange hook (tp_res_xchg):
 *   a row's shard statistics go into every rank's window as soon as they are merged, and the
 *   row waits in its shared-memory stage for the other ranks' shares, then writes its gradient
 *   from the stage. HBM traffic is the floor (read + write of the shard once), no collective
 *   kernel runs, and no [N, V] or L2 capacity condition applies. Each cluster takes a fixed share
 *   of the rows, the same on every rank, so the ranks make a row's shares at about the same
 *   time (rows handed out by each rank's own counter, as the single-GPU kernel does, made the
 *   waits chain: 23-28x slower, bench/RESULTS.md); four warp groups of 128 threads per CTA
 *   (TP_RES_GROUPS) keep four rows in flight per SM while rows wait. Measured on two H200s
 *   (session 31, bench/RESULTS.md): a tp = 2 rank's step, exchange included, takes 0.67-0.68x
 *   the single-GPU kernel on the full V at 4096 x 151936, 0.74x at 8192 x 32768 and 0.66-0.67x
 *   at 4096 x 262144 (the two passes with the all-gather: 0.90x, 0.95x, 0.79x). Session 32:
 *   a rank's own share is no longer polled back from its window, and every warp collects the
 *   shares itself (no group barrier on the row's path): 0.65x, 0.74-0.75x, 0.65x. The issue's
 *   0.55x is not reached. Where the time goes (session 32): with ONE rank, no NVLink, the hook
 *   made the kernel 17-31% slower than the single-GPU kernel (now 10-23%), each warp group
 *   spending 24-33% of its row loop in the exchange (the publish and the polls on the row's
 *   path, its stage held meanwhile); at tp = 2, 33-39%. More groups, deeper rings (larger
 *   clusters) and longer L2 prefetch were no faster. At 8192 x 32768 even a free exchange
 *   would not do: the single-GPU kernel on the shard's shape (8192 x 16384) takes 0.57x of
 *   the full V's time. Session 38: releasing the stage after the statistics and re-reading
 *   the slice from L2 for the gradient was 12-78% slower (the re-read misses L2: the ring's
 *   loads ahead of use and the writes outgrow it), keeping the row in registers instead was
 *   1.5-1.9x slower (128 registers, spills), and skipping the cluster merge (a probe) gained
 *   at most 2%: the row keeps its stage, and waits for the other rank. On two H100s: 0.58x,
 *   0.67x, 0.62x.
 * Read once, chunked (chunk_rows > 0, lsa_schedule = TP_LSA_CHUNKED, or forward only): one
 *   persistent kernel takes the chunks' statistics and gradient items in a pipelined order; each row's share is stored straight
 *   into every rank's NCCL symmetric window over NVLink and a chunk's gradient waits on per-chunk
 *   flags (section 2, tp_lsa), so the gradient finds its chunk in L2 with no kernel boundary and
 *   no collective kernel. Needs NCCL >= 2.28 and every rank in one NVLink domain. Measured on two
 *   H200s: 0-5% faster than the two passes with the all-gather; the waits cost ~2% at lag 6, but
 *   two thirds of the gradient's re-read still come from DRAM (the chunks in flight outgrow what
 *   L2 keeps; bench/RESULTS.md has the numbers and the next step).
 *   Three defects a review found (ranks picking different chunks when V % tp != 0 and
 *   chunk_rows = 0; a launch whose rows are all ignored, or an empty one, letting a rank run two
 *   launches ahead; tp_ce_nccl launching some ranks before checking the others) are fixed
 *   (tp_lsa_plan; the end-of-launch wait in tp_persist_kernel, no generation for an empty
 *   launch; every rank planned first) and their cases pass on two H200s over NCCL (session 31).
 *   Its waits polled hard (a system-scope acquire of the flag and the failure word every spin):
 *   on two H200s it then took 8.5 ms instead of ~0.58 at 4096 x 151936 in every run of session
 *   31's first calls, and once 78 ms at 4096 x 262144. With the gentle polls of tp_lsa_spin it
 *   ran at 0.59 ms there (the two passes: 0.56 ms): no faster than the all-gather.
 *   CUDA graphs: a rank's step with either read-once schedule can be captured and replayed
 *   (tp_ce_capture, tp_ce_replay), as with the all-gather exchange where each rank has its own
 *   thread: a launch's generation (which set of slots and flags it uses, and what a wait waits
 *   for) is not a kernel argument but a word in the rank's own window that the launch's prep
 *   kernel advances, so each replay takes the next one; tp_ce_replay counts the replays for
 *   the host (tp_lsa_abort reaches those not yet begun) and the prep kernel copies the word to
 *   a mapped one (tp_lsa_generation, tp_lsa_last_failed). Tested: replays alternating with
 *   plain launches, bit-identical, on one GPU and over NCCL, one thread for every rank (the
 *   shares left in the windows made NaN between runs) and a thread per rank (tp_one_rank::
 *   capture, which captures the all-gather too; each rank poisons its own window, then the
 *   ranks meet before the next run); all rows ignored, no rows; replays that time out or are
 *   aborted, one waiting and one queued behind it (session 36, two H200s). With a thread or
 *   process per rank, a rank whose capture or replay fails leaves the others' collectives (or
 *   waits, without lsa_timeout_ms) waiting, as a failed plain launch does: abort the
 *   communicators (ncclCommAbort) before anything synchronises their streams.
 *   Failures: a launch waiting for a rank that died, or never launched, gives up on the host's
 *   request (tp_lsa_abort, e.g. from a watchdog thread) or after tp_ce_args.lsa_timeout_ms, with
 *   NaN loss, lse and gradient rows, and tells every rank through the windows (they give up
 *   too); tp_lsa_failure says why. tp_nccl_ranks aborts its communicators (ncclCommAbort) after a
 *   failed registration group or a failed step, so nothing frees a window NCCL still holds and
 *   no stream is left waiting on a collective that a peer never enqueued.
 *
 * Memory: tp_ce_workspace_bytes (16 B per row + 12 B per row and 32 KB slice + ~1 KB) and the
 *   shares, tp_ce_shares_bytes = 12 tp N bytes; with a window (tp_lsa_create) ~96 tp N bytes of
 *   NCCL symmetric memory; nothing of size [N, V]. Gathering the logits to run the loss on one
 *   rank would take N V bytes times the element size.
 *
 * Sections: 1. API   2. kernels   3. the run: plan, prep, chunks, exchange, reduce
 *           4. simulation and NCCL drivers   5. demo / check (tp_demo_run, used by the tests)
 *           6. main
 */
#define CE_NO_MAIN
#include "examples/cross_entropy.cu"

#include <algorithm>
#include <vector>
#if defined(LF_HAVE_NCCL) && !defined(TP_NO_MAIN)
#include <signal.h> /* modes mp / mplsa: one forked process per GPU */
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#endif
#ifdef LF_HAVE_NCCL
#include <nccl.h>
#if __has_include(<nccl_device.h>) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#pragma GCC diagnostic push /* NCCL's device headers do not build clean under -Wextra */
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <nccl_device.h>
#pragma GCC diagnostic pop
#define TP_HAVE_LSA 1 /* NCCL's symmetric windows and device pointers: the read-once schedule */
#endif
#endif

/* ============================================================================================
 * 1. API
 * ========================================================================================== */

#ifndef TP_MAX_RANKS
#define TP_MAX_RANKS 64
#endif
#ifndef TP_THREADS
#define TP_THREADS 256
#endif
#ifndef TP_LSA_HINTS
#define TP_LSA_HINTS 1 /* the read-once schedule's default L2 policy (tp_ce_args.lsa_hints = 0) */
#endif
#ifndef TP_SLICE_VECS
#define TP_SLICE_VECS 2048 /* 16-byte vectors per CTA slice: 32 KB of shared memory */
#endif

typedef struct tp_plan {
    int64_t chunk_rows; /* rows per chunk */
    int64_t chunks;
    int nsplit;         /* CTAs (32 KB slices) per row */
    int resident;       /* 1: the resident read-once schedule ran (lsa_schedule); then: */
    int cluster, stages, ctas; /* its CTAs per row, stages per CTA, CTAs launched */
} tp_plan;

typedef struct tp_ce_args {
    /* this rank's shard: columns [v0, v1) = lf_tp_shard(vocab, tp, rank) of every row */
    const void *logits;   /* [N, v1 - v0] with row stride `stride` (elements) */
    lf_dtype dtype;       /* of logits and grad */
    int64_t n_rows, vocab, stride; /* vocab: the FULL V */
    int tp, rank;
    const void *labels;   /* [N] global labels (int32 or int64), the same on every rank */
    int labels_i64;
    lf_ce_opts opts;      /* class_weights: device pointer to all V weights (every rank) */
    lf_reduction reduction;
    const float *divisor; /* device scalar for LF_REDUCE_MEAN, or NULL: sum of w_y over valid rows */
    const float *dloss;   /* device upstream gradient: [1] for sum / mean, [N] for none; NULL = 1 */
    float grad_scale;     /* host multiplier of the gradient */
    /* outputs (device), the same bits on every rank */
    void *grad;           /* NULL: forward only; == logits: in place */
    int64_t grad_stride;
    float *loss;          /* [N] for none, [1] otherwise; required */
    float *z_loss_out;    /* optional, shaped like loss */
    float *lse;           /* optional [N]: the full row's lse (0 for ignored / bad rows) */
    unsigned int *n_errors; /* optional: += rows with a bad label (rank 0 counts them) */
    lf_tp_share *shares;  /* tp_ce_shares_bytes(N, tp): the all-gather's buffer. The simulation
                           * passes the SAME buffer to every simulated rank. */
    size_t shares_bytes;
    void *workspace;      /* tp_ce_workspace_bytes(N, v1 - v0, dtype); needs no zeroing (every
                           * launch initialises what it reads) */
    size_t workspace_bytes;
    int64_t chunk_rows;   /* 0: every row in one chunk (the default, fastest measured on an H100;
                           * more than 65535 rows go in chunks of at most 32767: grid y); n:
                           * chunks of n rows, pipelined (see above) */
    int no_pdl;           /* 1: launch the steps without programmatic dependent launch */
    int lsa_lag;          /* read-once schedule (an exchange with a window): the gradient of chunk
                           * k is handed out after the statistics of chunk k + lsa_lag; 0: 6 */
    int lsa_ctas_per_sm;  /* its CTAs per multiprocessor (0: as many as fit) */
    int lsa_hints;        /* its L2 policy: 0 default, 1 evict_last / evict_first, -1 none */
    int lsa_timeout_ms;   /* its longest wait for another rank's shares: 0 none (wait, as NCCL's
                           * collectives do); past it the launch gives up: NaN outputs, the
                           * reason in tp_lsa_failure (a rank that died costs its peers this
                           * long, not a hang; tp_lsa_abort ends a launch from the host) */
    int lsa_schedule;     /* with a window: TP_LSA_AUTO (0) the resident schedule where it applies
                           * (forward + backward on sm_90, tp <= 32, the widest shard's row at
                           * least CE_RES_MIN_SLICE bytes, no empty shard, chunk_rows = 0), else
                           * the chunked one (its lag, CTAs per SM and hints above);
                           * TP_LSA_CHUNKED (1); TP_LSA_RESIDENT (2: LF_ERR_ARG where it cannot
                           * run). Every rank must pass the same. */
    int64_t max_ctas;     /* the read-once kernels' CTAs at most (0: as many as stream the memory):
                           * their CTAs wait for other ranks, so a GPU shared with them (the
                           * single-GPU simulation of tp_sim_windows) must leave those room */
    tp_plan *plan;        /* optional host out */
} tp_ce_args;

static tp_ce_args tp_ce_args_default(void)
{
    tp_ce_args a;
    memset(&a, 0, sizeof a);
    a.dtype = LF_BF16;
    a.tp = 1;
    a.opts = lf_ce_opts_default();
    a.reduction = LF_REDUCE_MEAN;
    a.grad_scale = 1.0f;
    return a;
}

/* tp_ce_args.lsa_schedule: how a launch with a window (tp_lsa_create) reads the shard once */
enum { TP_LSA_AUTO = 0, TP_LSA_CHUNKED = 1, TP_LSA_RESIDENT = 2 };

typedef struct tp_ws_header {
    float Wr[TP_MAX_RANKS]; /* per-shard weight sums (shard sizes without class weights) */
    float W;                /* their total */
    float divisor;          /* the default mean divisor */
    float pad[14];
} tp_ws_header;

static int tp_nsplit(int64_t shard_cols, lf_dtype dt)
{
    const int64_t pv = dt == LF_F32 ? 4 : 8, nvec = (shard_cols + pv - 1) / pv;
    const int64_t n = (nvec + TP_SLICE_VECS - 1) / TP_SLICE_VECS;
    return (int)(n > 0 ? n : 1);
}

/* Where the resident schedule's cross-entropy workspace header (examples/cross_entropy.cu's
 * ce_ws_header: its row counter and batch sums) starts: after the rest, 64-byte aligned. */
static size_t tp_ce_ws_ce_offset(int64_t n_rows, int64_t shard_cols, lf_dtype dt)
{
    const size_t n = (size_t)(n_rows > 0 ? n_rows : 0);
    /* header, per-row loss and z, slice partials, hand-off counters; the chunked read-once
     * schedule's work counter and per-chunk counts (at most N chunks) */
    const size_t b = sizeof(tp_ws_header) + 2 * 4 * n + 12 * n * (size_t)tp_nsplit(shard_cols, dt) + 4 * n + 4 * (n + 1);
    return (b + 63) & ~(size_t)63;
}

static size_t tp_ce_workspace_bytes(int64_t n_rows, int64_t shard_cols, lf_dtype dt)
{
    return tp_ce_ws_ce_offset(n_rows, shard_cols, dt) + sizeof(ce_ws_header);
}

static size_t tp_ce_shares_bytes(int64_t n_rows, int tp) { return sizeof(lf_tp_share) * (size_t)(n_rows > 0 ? n_rows : 0) * tp; }

/* ============================================================================================
 * 2. Kernels
 * ========================================================================================== */

typedef struct tp_kparams {
    const void *logits;
    int64_t stride, n_rows, V, v0, vs; /* vs = v1 - v0 */
    int tp, rank, nsplit;
    const void *labels;
    int labels_i64;
    int64_t ignore_index;
    const float *class_w;   /* all V */
    float eps, lam;
    lf_xform xf;
    int reduction;
    const float *divisor, *dloss;
    float grad_scale;
    void *grad;
    int64_t grad_stride;
    float *loss, *z_out, *lse;
    unsigned int *n_errors;
    lf_tp_share *shares;
    tp_ws_header *ws;
    float *ws_loss, *ws_z, *part; /* part: [N][nsplit][3] */
    unsigned int *cnt;            /* [N] */
} tp_kparams;

static __device__ __forceinline__ int64_t tp_label(const tp_kparams &p, int64_t row)
{
    return p.labels_i64 ? ((const int64_t *)p.labels)[row] : (int64_t)((const int32_t *)p.labels)[row];
}

/* 0 valid, 1 ignored, 2 bad label */
static __device__ __forceinline__ int tp_status(const tp_kparams &p, int64_t y)
{
    return y == p.ignore_index ? 1 : (y < 0 || y >= p.V) ? 2 : 0;
}

/* Per-shard weight sums (double, fixed order: the same bits on every rank) and the default mean
 * divisor. One CTA. */
__global__ void __launch_bounds__(1024) tp_prep_kernel(const tp_kparams p, int want_divisor, unsigned *gen_word,
                                                       volatile unsigned *gen_mirror)
{
    __shared__ double scratch[32];
    if (gen_word && threadIdx.x == 0) { /* a read-once launch: its generation (tp_lsa_now) */
        const unsigned g = *gen_word + 1u;
        *gen_word = g;
        if (gen_mirror) *gen_mirror = g; /* for the host (tp_lsa_generation) */
    }
    double W = 0.0;
    for (int r = 0; r < p.tp; ++r) {
        int64_t a, b;
        lf_tp_shard(p.V, p.tp, r, &a, &b);
        double acc = 0.0;
        if (p.class_w)
            for (int64_t j = a + threadIdx.x; j < b; j += 1024) acc += (double)p.class_w[j];
        else if (threadIdx.x == 0)
            acc = (double)(b - a);
        acc = lf_block_sum_f64<1024>(acc, scratch);
        __syncthreads();
        if (threadIdx.x == 0) p.ws->Wr[r] = (float)acc;
        W += acc;
    }
    if (threadIdx.x == 0) p.ws->W = (float)W;
    if (!want_divisor) return;
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < p.n_rows; i += 1024) {
        const int64_t y = tp_label(p, i);
        if (tp_status(p, y) == 0) acc += p.class_w ? (double)p.class_w[y] : 1.0;
    }
    acc = lf_block_sum_f64<1024>(acc, scratch);
    if (threadIdx.x == 0) p.ws->divisor = (float)acc;
}

/* Programmatic dependent launch (sm_90): a step kernel lets the next one start as soon as all
 * its CTAs are running (lf_pdl_trigger), so that the next step's CTAs fill the SMs while this
 * one's last wave drains, instead of after it; what reads another step's results waits for it
 * first (lf_pdl_wait: returns when the preceding kernels are complete and their writes visible).
 * No-ops before sm_90 (and when launched without the attribute). These are cross_entropy.cu's
 * lf_pdl_trigger / lf_pdl_wait. */


/* The window's layout for lsa_rows rows and tp ranks: per parity, the shares [N tp], then per
 * parity the flags [K <= N][tp], then per parity the failure word and the word saying the
 * failure was this rank's own (128 bytes apart) (the chunked schedule); then per parity the
 * resident schedule's flagged slots [N][tp - 1] (32 bytes each: a rank has none for its own
 * share), the done words [tp], and the generation word (this rank's launches so far: advanced by
 * tp_prep_kernel, read by the read-once kernels, tp_lsa_now). About (32 tp + 64 (tp - 1)) N
 * bytes in all: 0.5 MiB for 4096 rows at tp = 2. The kernels find a launch's parity here too. */
static __host__ __device__ size_t tp_lsa_shares_bytes(int64_t rows, int tp)
{
    return ((size_t)rows * tp * sizeof(lf_tp_share) + 255) & ~(size_t)255;
}
static __host__ __device__ size_t tp_lsa_flags_bytes(int64_t rows, int tp) { return ((size_t)rows * tp * 4 + 255) & ~(size_t)255; }
#define TP_LSA_FAIL_STRIDE 128 /* from parity 0's failure words to parity 1's */
static __host__ __device__ size_t tp_lsa_fail_offset(int64_t rows, int tp, int par)
{
    return 2 * tp_lsa_shares_bytes(rows, tp) + 2 * tp_lsa_flags_bytes(rows, tp) + TP_LSA_FAIL_STRIDE * (size_t)par;
}
static __host__ __device__ size_t tp_lsa_slots_offset(int64_t rows, int tp, int par)
{
    return tp_lsa_fail_offset(rows, tp, 0) + 256 + (size_t)par * (size_t)rows * (size_t)(tp - 1) * sizeof(lf_tp_slot);
}
static __host__ __device__ size_t tp_lsa_done_offset(int64_t rows, int tp) { return tp_lsa_slots_offset(rows, tp, 2); }
static __host__ __device__ size_t tp_lsa_gen_offset(int64_t rows, int tp)
{
    return tp_lsa_done_offset(rows, tp) + (((size_t)tp * 4 + 255) & ~(size_t)255);
}
[[maybe_unused]] static size_t tp_lsa_window_bytes(int64_t rows, int tp) { return tp_lsa_gen_offset(rows, tp) + 256; }

/* The read-once schedule over NCCL's symmetric memory (tp_persist_kernel, section 3's
 * tp_ce_launch_lsa). Every rank registers one window (ncclCommWindowRegister, symmetric: the
 * same layout on every rank) holding, for each of two launch parities, the all-gathered shares
 * [N tp] and one flag per chunk and rank [K tp]. A rank writes each row's share straight into
 * every rank's window (NVLink stores through ncclGetPeerPointer), and the last of a chunk's
 * statistics items sets the chunk's flag of this rank in every window to the launch's
 * generation; a gradient item of chunk k waits until its own window's flags of chunk k, one per
 * rank, reach the generation. No collective kernel runs: NCCL maps the memory, the kernel moves
 * 12 bytes per row and rank, and the gradient reads the chunk while it is still in L2.
 * Two parities: rank q can be one launch ahead (its next launch's shares land in the other
 * half), never two (its launch after that needs this rank's shares of the next launch; a
 * resident launch between them ends with a barrier of the ranks, tp_res_xchg::end). */
typedef struct tp_lsa {
    char *const *peers;  /* [tp] device array: each rank's window base, as this GPU maps it */
    char *local;         /* this rank's window base */
    int64_t rows;        /* the window's rows (its layout, tp_lsa_window_bytes) */
    size_t gen_off;      /* the generation word (tp_lsa_gen_offset) */
    /* This launch's generation (>= 1) and the offsets of its parity: filled in on the device
     * from the generation word (the chunked kernel: tp_lsa_now at its start; the resident
     * hook: tp_res_xchg::at; the host leaves them 0), so that a launch replayed from a CUDA
     * graph takes a new generation */
    unsigned gen;
    size_t shares_off;   /* this launch's shares [N tp] (of this parity) */
    size_t flags_off;    /* this launch's flags [K tp] (of this parity) */
    int64_t C, K;        /* rows per chunk, chunks */
    int lag;             /* a chunk's gradient items come after the statistics of chunk k + lag */
    unsigned *ticket;    /* work counter (zeroed before the launch) */
    unsigned *done;      /* [K] finished statistics items per chunk (zeroed before the launch) */
    int hints;           /* 1: the statistics read with L2 evict_last, the gradient's re-read with
                          * evict_first (the chunk should stay in L2 between the two, and go after) */
    unsigned long long *prof; /* optional [2]: += nanoseconds warp 0s spent waiting, waits */
    /* Giving up (tp_lsa_wait): this launch's failure word in every window (a rank that gives up
     * stores its generation there in every window, its own included, so that no rank waits on
     * it any longer); the host's abort request (mapped host memory, or NULL: launches with a
     * generation <= its value give up); the host's failure record ([2]: generation, reason;
     * or NULL); the longest a wait may last in nanoseconds (0: no limit). */
    size_t fail_off;     /* (of this launch's parity, as gen) */
    const volatile unsigned *abort_req;
    volatile unsigned *report;
    unsigned long long timeout_ns;
} tp_lsa;

/* Why a read-once launch gave up (tp_lsa_failure): the host asked (tp_lsa_abort), a wait
 * outlasted tp_ce_args.lsa_timeout_ms, or another rank gave up first. */
enum { TP_LSA_OK = 0, TP_LSA_ABORTED = 1, TP_LSA_TIMED_OUT = 2, TP_LSA_PEER_FAILED = 3 };

/* This launch's generation and the offsets of its parity, from the generation word that
 * tp_prep_kernel advanced just before the launch (the kernel before it on the stream: nothing
 * writes the word while a read-once kernel runs, so the read may go through the read-only path). */
static __device__ __forceinline__ void tp_lsa_now(tp_lsa &L, int P)
{
    L.gen = __ldg(reinterpret_cast<const unsigned *>(L.local + L.gen_off));
    const int par = (int)(L.gen & 1u);
    L.shares_off = (size_t)par * tp_lsa_shares_bytes(L.rows, P);
    L.flags_off = 2 * tp_lsa_shares_bytes(L.rows, P) + (size_t)par * tp_lsa_flags_bytes(L.rows, P);
    L.fail_off = tp_lsa_fail_offset(L.rows, P, par);
}

/* A slice into shared memory like lf_piece_load, with an L2 eviction policy on every copy. */
static __device__ __forceinline__ uint64_t tp_policy(bool keep)
{
    uint64_t pol;
    if (keep) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
    else asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    return pol;
}
template <typename T>
static __device__ __forceinline__ void tp_piece_load_hint(uint4 *buf, const T *row, const lf_row_span &sp, int vbeg, int vend,
                                                          uint64_t pol)
{
    const uint4 *body = reinterpret_cast<const uint4 *>(row + sp.head);
    for (int v = vbeg + (int)threadIdx.x; v < vend; v += TP_THREADS) {
        const uint32_t d = (uint32_t)__cvta_generic_to_shared(buf + (v - vbeg));
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(d), "l"(body + v), "l"(pol) : "memory");
    }
}

static __device__ __forceinline__ unsigned tp_ld_acquire_sys(const unsigned *a)
{
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(a) : "memory");
    return v;
}
static __device__ __forceinline__ void tp_st_release_sys(unsigned *a, unsigned v)
{
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(a), "r"(v) : "memory");
}

/* Whether this launch must give up, checked every 1024 spins of a wait (tp_lsa_spin; reading
 * mapped host memory costs a bus round trip): the host's abort request, or a wait that began at t_start
 * (set here on the first call) and outlasted the timeout. */
static __device__ __forceinline__ unsigned tp_lsa_check(const tp_lsa &L, unsigned long long &t_start)
{
    if (L.abort_req) {
        const unsigned a = *L.abort_req;
        if (a != 0u && (int)(a - L.gen) >= 0) return TP_LSA_ABORTED;
    }
    if (L.timeout_ns) {
        const unsigned long long now = lf_globaltimer_ns();
        if (t_start == 0ull) t_start = now;
        else if (now - t_start > L.timeout_ns) return TP_LSA_TIMED_OUT;
    }
    return TP_LSA_OK;
}

/* One spin of a wait of this launch: whether it must give up now. The failure word (another
 * rank gave up) is read every 256 spins, the host's abort request and the timeout every 1024,
 * both with relaxed loads (a give-up needs no ordering), and from the 16th spin on each spin
 * sleeps a little. Polling hard is what a waiting kernel must not do: on two H200s (session 31)
 * both read-once schedules, which then read the failure word with a system-scope acquire every
 * spin (chunked) or every 8th (resident) and the host word every 64th, ran 8-30x slower in about
 * half of the runs, their CTAs waiting 60-70% of the time (bench/RESULTS.md). */
static __device__ __forceinline__ unsigned tp_lsa_spin(const tp_lsa &L, unsigned &spins, unsigned long long &t_start)
{
    ++spins;
    if ((spins & 255u) == 0u && *reinterpret_cast<const volatile unsigned *>(L.local + L.fail_off) == L.gen)
        return TP_LSA_PEER_FAILED;
    if ((spins & 1023u) == 0u) return tp_lsa_check(L, t_start);
    if (spins >= 16u) __nanosleep(64);
    return TP_LSA_OK;
}

/* By one thread, once a wait of this launch gives up for `why` (tp_lsa_spin): the generation into
 * every rank's failure word, so that every later wait of every rank gives up (within 256 spins), and the
 * reason into the host's record. The word after the failure word (this window only) says the
 * cause was this rank's: set before the failure word is passed on (the release orders it), so
 * that this rank's other waits, which then give up on the failure word, leave the record to the
 * cause. */
static __device__ void tp_lsa_give_up(const tp_lsa &L, int P, unsigned why)
{
    volatile unsigned *mine = reinterpret_cast<volatile unsigned *>(L.local + L.fail_off) + 1;
    if (why != TP_LSA_PEER_FAILED) *mine = L.gen;
    for (int q = 0; q < P; ++q) tp_st_release_sys(reinterpret_cast<unsigned *>(L.peers[q] + L.fail_off), L.gen);
    if (L.report && (why != TP_LSA_PEER_FAILED || *mine != L.gen)) {
        L.report[1] = why;
        L.report[0] = L.gen;
    }
}

/* By the 32 lanes of warp 0, before the row's shares are merged: lane q waits until the flags of
 * chunk k of ranks q, q + 32, ... (the ranks whose shares it then loads, lf_tp_merge_warp)
 * reach this launch's generation; the acquire orders its share loads after them. Returns false
 * where the launch gives up instead (the host's abort request, the timeout, or another rank's
 * failure word): then the caller makes the row's outputs NaN, and the first lane to give up has
 * stored the generation into every rank's failure word (tp_lsa_give_up). A rank that dies, or
 * never launches, thus costs its peers one timeout (or one abort request), not a hang. */
static __device__ __forceinline__ bool tp_lsa_wait(const tp_lsa &L, int64_t k, int P)
{
    const unsigned *f = reinterpret_cast<const unsigned *>(L.local + L.flags_off) + k * P;
    unsigned long long t0 = 0, t_start = 0;
    bool waited = false;
    unsigned why = TP_LSA_OK;
    if (L.prof) t0 = lf_globaltimer_ns();
    for (int q = (int)(threadIdx.x & 31); q < P && why == TP_LSA_OK; q += 32) {
        unsigned spins = 0;
        /* relaxed polls; the acquire once the flag is seen orders the share loads after it */
        while ((int)(*reinterpret_cast<const volatile unsigned *>(f + q) - L.gen) < 0) {
            waited = true;
            if ((why = tp_lsa_spin(L, spins, t_start)) != TP_LSA_OK) break;
        }
        if (why == TP_LSA_OK) (void)tp_ld_acquire_sys(f + q);
    }
    const unsigned gave_up = __ballot_sync(0xffffffffu, why != TP_LSA_OK);
    if (gave_up && (int)(threadIdx.x & 31) == __ffs(gave_up) - 1) tp_lsa_give_up(L, P, why);
    if (L.prof && __any_sync(0xffffffffu, waited) && (threadIdx.x & 31) == 0) {
        atomicAdd(L.prof, lf_globaltimer_ns() - t0);
        atomicAdd(L.prof + 1, 1ull);
    }
    return gave_up == 0u;
}

/* The resident read-once schedule's exchange (examples/cross_entropy.cu's ce_resident_kernel with
 * this hook; section 3's tp_ce_launch_lsa): each rank runs the single-GPU row-resident kernel
 * over its shard, and a row waits in its shared-memory stage, between its statistics and its
 * gradient, for the other ranks' shares of that row. So the shard is read from HBM once and
 * nothing is re-read from L2, whatever the row count.
 *   Per row, one thread of this rank (the CTA holding the label's logit, else the cluster's rank
 *   0: the publisher) stores the row's 12-byte share into every OTHER rank's window as a flagged
 *   slot [row][j], j the sender's place among the receiver's P - 1 peers (tp_res_peer_slot;
 *   lossfuse_cuda.cuh lf_tp_slot_put: three {value, generation} words, no fence, no flag of its
 *   own); every warp of each group of each CTA of the row polls
 *   its own window's P - 1 slots of the row (lf_tp_slot_get), takes this rank's share from the
 *   cluster-merged statistics it already holds (the same bits in every CTA; session 32: 1.5-3.5%
 *   faster at tp = 2 than polling it back), and merges the P shares in rank order
 *   (lf_tp_merge_lanes): the same bits on every rank, and the bits of the two-pass schedules'
 *   merge of the same shares. Only the publisher's own share has the label term, so it writes
 *   the row's outputs.
 *   Slots alternate between two sets by generation parity. The launch ends with a barrier of the
 *   ranks (end(), by its last CTA once every CTA is past its rows): it stores its generation
 *   into every rank's done word, then waits until every rank's done word in its own window has
 *   it. So no rank starts a later launch while another still polls this one's slots, even where
 *   a launch has nothing else to wait for (every row ignored), and a rank is never more than one
 *   launch ahead of another, which the chunked schedule's shares (no generation in them) rely
 *   on where the two schedules take turns on one exchange (e.g. forward-only evaluation steps,
 *   chunked, between training steps, resident).
 *   Progress: each cluster takes its fixed share of the rows in increasing order, the same on
 *   every rank (tp_res_dispatch), a row publishes its share before it waits, and a row waits
 *   only for other ranks' shares of the same row: the lowest row any rank waits for is always
 *   published or about to be, so no launch deadlocks as long as every rank's CTAs are resident
 *   (the grid is sized to the device; max_ctas leaves room where two ranks share a GPU).
 *   Giving up: as the chunked schedule (tp_lsa_spin, tp_lsa_give_up): the abort request, the
 *   timeout, or another rank's failure word end a wait; a row that gave up has NaN outputs, and
 *   an end() that gave up leaves the outputs as they are but records the failure (tp_lsa_failure).
 *   Capturable in a CUDA graph: the generation comes from the window's generation word, which
 *   the launch's prep kernel advances (each thread reads it once: generation(); the chunked
 *   schedule likewise, tp_lsa_now). */
#ifndef TP_RES_GROUPS
#define TP_RES_GROUPS 4 /* warp groups of 128 threads per CTA of the resident schedule: rows in
                         * flight per SM. Measured on two H200s (session 31): 4 instead of 2 took
                         * 8192 x 32768 at tp = 2 from 1.00-1.03x the single GPU to 0.72x, the
                         * same within 4% at 4096 x 151936 / 262144; 8 groups of 64 (session
                         * 32, with 16 stages allowed: clusters of 2-16) 4-8% slower than 4.
                         * Session 38, two H200s: 2 groups 3-6% faster at 4096 x 151936, 1-2%
                         * slower at 4096 x 262144, 35-39% slower at 8192 x 32768; two H100s:
                         * 5-7% slower, 5-7% faster, 16-19% slower; 8 groups 1-11% slower */
#endif
#ifndef TP_RES_MIN_STAGES
#define TP_RES_MIN_STAGES CE_RES_MIN_STAGES /* the least ring the plan takes. Measured on two H200s
                                             * (session 32; CE_RES_MAX_STAGES 16): 8 or 12 stages,
                                             * i.e. clusters of 8-16 at V = 151936, 2 at 32768,
                                             * were 1.5-2.7x SLOWER than the default plan's 5-6
                                             * stages in clusters of 1-8: a larger cluster couples
                                             * more CTAs to each row's waits */
#endif
/* Receiver `to`'s slot for sender `from`'s share of a row (from != to): the P - 1 senders in rank
 * order, `to` left out. */
static __host__ __device__ __forceinline__ int64_t tp_res_peer_slot(int64_t row, int P, int to, int from)
{
    return row * (P - 1) + (from < to ? from : from - 1);
}
struct tp_res_xchg {
    static constexpr bool on = true;
    static constexpr int groups = TP_RES_GROUPS;
    static constexpr int min_stages = TP_RES_MIN_STAGES;
    int64_t V, v0;           /* the full vocabulary; this shard's first column */
    int P, rank;
    const float *class_w;    /* all V weights (every rank), or NULL */
    const tp_ws_header *ws;  /* the shards' weight sums Wr and their total W (tp_prep_kernel) */
    float eps;
    tp_lsa L;                /* peers, local, gen_off, fail_off (parity 0), abort_req, report,
                              * timeout_ns; the generation: at() */
    size_t slots_off;        /* the slots [N][P - 1] of parity 0 (lf_tp_slot; no rank has a slot
                              * for its own share, tp_res_peer_slot), */
    size_t slots_stride;     /* and the step to parity 1 */
    size_t done_off;         /* the done words [P] */

    /* This launch's generation, read once by each thread at the kernel's start (the window's
     * generation word, which tp_prep_kernel advanced before the launch), and L at it: its
     * parity's failure word. Measured on two H200s (session 35): reading the word in each row's
     * publish and collect instead (tp_lsa_now) made the schedule 2-3% slower. */
    __device__ __forceinline__ unsigned generation() const { return __ldg(reinterpret_cast<const unsigned *>(L.local + L.gen_off)); }
    __device__ __forceinline__ tp_lsa at(unsigned gen) const
    {
        tp_lsa n = L;
        n.gen = gen;
        n.fail_off = L.fail_off + (gen & 1u) * TP_LSA_FAIL_STRIDE;
        return n;
    }
    __device__ __forceinline__ size_t slots(unsigned gen) const { return slots_off + (gen & 1u) * slots_stride; }

    __device__ __forceinline__ float label_weight(int64_t y) const { return class_w ? __ldg(class_w + y) : 1.0f; }
    __device__ __forceinline__ float wsum() const { return ws->W; }

    /* This rank's share of the row from the shard's (cluster-merged) statistics. */
    __device__ lf_tp_share share(const lf_row_stats &st, bool has_y, float zy, float wy) const
    {
        return lf_tp_share_from(st.lse.m, st.lse.s, has_y, zy, wy, st.wz, ws->Wr[rank], V, eps);
    }
    /* By one thread: this rank's share of the row into the other ranks' slots (no one polls its
     * own: collect takes it from the caller, so no window holds a slot for it). */
    __device__ void publish(int64_t row, const lf_tp_share &sh, unsigned gen) const
    {
        const size_t so = slots(gen);
        for (int q = 0; q < P; ++q)
            if (q != rank)
                lf_tp_slot_put(reinterpret_cast<lf_tp_slot *>(L.peers[q] + so) + tp_res_peer_slot(row, P, q, rank), sh, gen);
    }
    /* By the 32 lanes of one warp (each warp of a group, independently): lane q < P, q != rank,
     * waits for rank q's share of the row in this rank's window, lane `rank` takes `own`; then
     * the merge (every lane). False: the launch gave up (NaN outputs; a warp that gives up tells
     * every rank, so the group's other warps give up too, within 256 polls, unless the share
     * had already reached them: then a row of a failed launch may be NaN only in part). */
    __device__ bool collect(int64_t row, int64_t y, float wy, const lf_tp_share &own, lf_tp_merged *mg, unsigned gen) const
    {
        const tp_lsa n = at(gen);
        const int lane = (int)(threadIdx.x & 31);
        lf_tp_share mine = own;
        unsigned why = TP_LSA_OK;
        unsigned long long t0 = 0;
        bool waited = false;
        if (n.prof) t0 = lf_globaltimer_ns();
        if (lane < P && lane != rank) {
            const lf_tp_slot *sl = reinterpret_cast<const lf_tp_slot *>(n.local + slots(gen)) + tp_res_peer_slot(row, P, rank, lane);
            unsigned spins = 0;
            unsigned long long t_start = 0;
            while (!lf_tp_slot_get(sl, n.gen, &mine)) {
                waited = true;
                if ((why = tp_lsa_spin(n, spins, t_start)) != TP_LSA_OK) break;
            }
        }
        if (n.prof && __any_sync(0xffffffffu, waited) && threadIdx.x == 0) { /* the time this group's warp 0 waited */
            atomicAdd(n.prof, lf_globaltimer_ns() - t0);
            atomicAdd(n.prof + 1, 1ull);
        }
        const unsigned gave_up = __ballot_sync(0xffffffffu, why != TP_LSA_OK);
        if (gave_up) {
            if (lane == __ffs(gave_up) - 1) tp_lsa_give_up(n, P, why);
            return false;
        }
        *mg = lf_tp_merge_lanes(mine, P, y, wy, class_w ? ws->Wr : nullptr, V, eps);
        return true;
    }
    /* By one thread of the launch's last CTA, every CTA past its rows: this rank is done; then
     * the barrier: every rank is. */
    __device__ void end(unsigned gen) const
    {
        const tp_lsa n = at(gen);
        __threadfence_system();
        for (int q = 0; q < P; ++q) tp_st_release_sys(reinterpret_cast<unsigned *>(n.peers[q] + done_off) + rank, n.gen);
        unsigned long long t_start = 0;
        for (int q = 0; q < P; ++q) {
            const unsigned *d = reinterpret_cast<const unsigned *>(n.local + done_off) + q;
            unsigned spins = 0, why = TP_LSA_OK;
            while ((int)(*reinterpret_cast<const volatile unsigned *>(d) - n.gen) < 0)
                if ((why = tp_lsa_spin(n, spins, t_start)) != TP_LSA_OK) {
                    tp_lsa_give_up(n, P, why);
                    return;
                }
        }
    }
};

/* Statistics: this CTA takes slice `split` of row r0 + i of a chunk of C rows, staged in shared
 * memory; a row's CTAs leave their partial (m, s, sum w z), and the last of them merges the
 * partials in slice order into the row's share lf_tp_share (lossfuse.h section 11), stored at
 * shares[r0 tp + rank C + i], where the chunk's all-gather expects it.
 *   FULL: label smoothing (sum w z is needed)   SOFTCAP: the tanh cap is on */
template <typename T, bool FULL, bool SOFTCAP>
static __device__ __forceinline__ bool tp_stats_cta(const tp_kparams &p, int64_t r0, int64_t C, int64_t i, int split,
                                                    uint4 *tp_smem, lf_row_stats *red, const tp_lsa *L = nullptr)
{
    const int64_t row = r0 + i;
    const int64_t y = tp_label(p, row);
    if (tp_status(p, y) != 0) return false; /* no share: the gradient pass zeroes the row */
    const T *x = (const T *)p.logits + row * p.stride;
    const lf_row_span sp = lf_row_span_make(x, p.vs);
    int sb, se;
    lf_row_slice(sp, split, p.nsplit, &sb, &se);
    if (L && L->hints) tp_piece_load_hint(tp_smem, x, sp, sb, se, tp_policy(true));
    else lf_piece_load<TP_THREADS>(tp_smem, x, sp, sb, se);
    lf_cp_async_commit();
    const float *cw = p.class_w ? p.class_w + p.v0 : nullptr; /* the shard's weights, local index */
    lf_row_stats st = lf_row_stats_init();
    if (split == 0) lf_edge_stats<FULL, SOFTCAP>(st, lf_row_edge_load<T>(x, sp), p.xf, cw);
    lf_cp_async_wait<0>(); /* this thread's vectors have landed: it alone reads them */
    lf_piece_stats<TP_THREADS, T, FULL, SOFTCAP>(st, tp_smem, sp, sb, se, p.xf, cw);
    if (FULL) {
        st = lf_block_row_stats<TP_THREADS>(st, red);
    } else {
        st.lse = lf_block_lse<TP_THREADS>(st.lse, reinterpret_cast<lf_lse *>(red));
        st.wz = 0.0f;
    }
    if (threadIdx.x != 0) return false;
    lf_pdl_wait(); /* the prep's weight sums; the previous steps' hand-offs */
    if (p.nsplit > 1) {
        float *mine = p.part + (row * p.nsplit + split) * 3;
        mine[0] = st.lse.m;
        mine[1] = st.lse.s;
        mine[2] = st.wz;
        __threadfence(); /* the partial is visible before the count says so */
        if (atomicAdd(p.cnt + row, 1u) != (unsigned)(p.nsplit - 1)) return false; /* not the row's last */
        __threadfence();
        lf_lse m = lf_lse_init();
        float wz = 0.0f;
        for (int k = 0; k < p.nsplit; ++k) { /* slice order: the same bits however CTAs finish */
            const float *q = p.part + (row * p.nsplit + k) * 3;
            lf_lse b;
            b.m = __ldcg(q);
            b.s = __ldcg(q + 1);
            b.u = 0.0f;
            m = lf_lse_merge(m, b);
            wz += __ldcg(q + 2);
        }
        st.lse = m;
        st.wz = wz;
        p.cnt[row] = 0u; /* ready for the next launch (or graph replay) */
    }
    const bool has_y = y >= p.v0 && y < p.v0 + p.vs;
    const float zy = has_y ? lf_xform_apply<SOFTCAP>(lf_elem<T>::to_f32(x[y - p.v0]), p.xf) : 0.0f;
    const float wy = p.class_w ? __ldg(p.class_w + y) : 1.0f;
    const lf_tp_share sh = lf_tp_share_from(st.lse.m, st.lse.s, has_y, zy, wy, st.wz, p.ws->Wr[p.rank], p.V, p.eps);
    const int64_t at = r0 * p.tp + (int64_t)p.rank * C + i;
    if (L) /* into every rank's window (this one's included) */
        for (int q = 0; q < p.tp; ++q) reinterpret_cast<lf_tp_share *>(L->peers[q] + L->shares_off)[at] = sh;
    else
        p.shares[at] = sh;
    return true;
}

/* The row's outputs and gradient coefficients from its merged shares, by the 32 lanes of one
 * warp (lf_tp_merge_warp: the P share loads in parallel); lane 0 writes the outputs (write)
 * and, with coef, the coefficients to *coef (for a gradient of T). */
template <typename T>
static __device__ void tp_row_finish(const tp_kparams &p, int64_t row, int64_t y, int64_t r0, int64_t C, bool write,
                                     lf_grad_coef *coef, bool gave_up = false)
{
    const float wy = p.class_w ? __ldg(p.class_w + y) : 1.0f;
    const lf_tp_merged mg =
        lf_tp_merge_warp(p.shares + r0 * p.tp, C, p.tp, row - r0, y, wy, p.class_w ? p.ws->Wr : nullptr, p.V, p.eps);
    if ((threadIdx.x & 31) != 0) return;
    float lse;
    float loss = lf_tp_loss(mg, p.lam, &lse);
    if (gave_up) { /* the read-once launch gave up waiting for the shares (tp_lsa_wait): NaN */
        lse = NAN;
        loss = NAN;
    }
    const float zterm = p.lam * lse * lse;
    if (write) {
        if (p.lse) p.lse[row] = lse;
        ce_store_row_loss(p, row, loss, zterm);
    }
    if (coef) {
        float g = p.grad_scale * (p.dloss ? (p.reduction == LF_REDUCE_NONE ? p.dloss[row] : p.dloss[0]) : 1.0f);
        if (p.reduction == LF_REDUCE_MEAN) {
            const float d = p.divisor ? *p.divisor : p.ws->divisor;
            g = d == 0.0f ? 0.0f : g / d;
        }
        /* a = (1 - eps) w_y + eps W / V + 2 lam lse: the merged A + 2 lam lse (lf_tp_grad_coef)
         * to rounding, in the form the single-GPU writers take */
        *coef = lf_grad_coef_make(g, lse, p.eps, p.lam, wy, p.ws->W, p.V, p.xf);
        lf_grad_coef_onto_max_for<T>(*coef, mg.M, mg.S); /* p_j against the row's maximum: no lse rounding */
    }
}

/* Outputs of an ignored / bad row (one thread); rank 0 counts a bad label. */
static __device__ void tp_row_skip(const tp_kparams &p, int64_t row, int status)
{
    if (status == 2 && p.n_errors && p.rank == 0) atomicAdd(p.n_errors, 1u);
    if (p.lse) p.lse[row] = 0.0f;
    if (p.reduction == LF_REDUCE_NONE) {
        p.loss[row] = 0.0f;
        if (p.z_out) p.z_out[row] = 0.0f;
    } else {
        p.ws_loss[row] = 0.0f;
        p.ws_z[row] = 0.0f;
    }
}

/* After the exchange: this CTA merges the shares of row r0 + i of a chunk of C rows and writes
 * the gradient of slice `split` of the shard's row (GRAD), staging the slice first (from L2:
 * the statistics read it two steps ago); slice 0's thread 0 writes the row's outputs. Forward
 * only (GRAD = false) only slice 0 works: the outputs. */
template <typename T, bool GRAD, bool FULL, bool SOFTCAP>
static __device__ __forceinline__ void tp_grad_cta(const tp_kparams &p, int64_t r0, int64_t C, int64_t i, int split,
                                                   uint4 *tp_smem, lf_grad_coef &coef_s, const tp_lsa *L = nullptr,
                                                   int64_t k = 0)
{
    const int64_t row = r0 + i;
    if (!GRAD && split != 0) return;
    const int64_t y = tp_label(p, row);
    const int status = tp_status(p, y);
    const T *x = (const T *)p.logits + row * p.stride;
    T *out = GRAD ? (T *)p.grad + row * p.grad_stride : nullptr;
    if (status != 0) {
        if (threadIdx.x == 0 && split == 0) tp_row_skip(p, row, status);
        if (GRAD) lf_row_zero<TP_THREADS>(out, p.vs, split, p.nsplit);
        return;
    }
    if (!GRAD) {
        lf_pdl_wait();
        if (threadIdx.x < 32) {
            const bool ok = L ? tp_lsa_wait(*L, k, p.tp) : true;
            tp_row_finish<T>(p, row, y, r0, C, true, nullptr, !ok);
        }
        return;
    }
    const lf_row_span sp = lf_row_span_make(x, p.vs);
    int sb, se;
    lf_row_slice(sp, split, p.nsplit, &sb, &se);
    if (L && L->hints) tp_piece_load_hint(tp_smem, x, sp, sb, se, tp_policy(false));
    else lf_piece_load<TP_THREADS>(tp_smem, x, sp, sb, se);
    lf_cp_async_commit();
    /* the edge elements and the label element: loaded before anything of the row is written
     * (in place), each by the thread that will write it */
    const lf_edge edge = split == 0 ? lf_row_edge_load<T>(x, sp) : lf_edge{0.0f, -1};
    lf_pdl_wait(); /* the shares (statistics two steps ago, then the exchange) */
    if (threadIdx.x < 32) {
        const bool ok = L ? tp_lsa_wait(*L, k, p.tp) : true; /* the shares of chunk k from every rank */
        tp_row_finish<T>(p, row, y, r0, C, split == 0, &coef_s, !ok); /* lane 0 sets coef_s */
    }
    __syncthreads();
    const lf_grad_coef coef = coef_s;
    lf_cp_async_wait<0>();
    const float *cw = p.class_w ? p.class_w + p.v0 : nullptr;
    const bool vec_ok = ((uintptr_t)out & 15u) == (uintptr_t)sp.phase;
    const bool fast = !SOFTCAP && !FULL && p.class_w == nullptr;
    if (split == 0) lf_edge_grad_store<FULL, SOFTCAP>(out, edge, coef, p.xf, cw);
    if (!(fast && vec_ok &&
          lf_piece_grad_fast_if_ok<TP_THREADS, T>(out, tp_smem, sp, sb, se, coef, lf_grad_fast_k(coef), p.xf.scale_l2e)))
        lf_piece_grad_store<TP_THREADS, FULL, SOFTCAP>(out, vec_ok, tp_smem, sp, sb, se, coef, p.xf, cw);
    /* the label element, if this shard holds it: patched by the thread that wrote its dense
     * value (program order, no barrier), from the staged copy */
    const int64_t yl = y - p.v0;
    if (yl < 0 || yl >= p.vs) return;
    const int PV = lf_elem<T>::per_vec;
    const int64_t yb = yl - sp.head;
    if (yb < 0 || yb >= (int64_t)sp.nvec * PV) {
        if (split == 0 && edge.j == (int32_t)yl)
            out[yl] = lf_elem<T>::from_f32(lf_ce_label_grad<FULL, SOFTCAP>(edge.x, (int32_t)yl, coef, p.xf, cw));
    } else {
        const int vy = (int)(yb / PV);
        if (vy >= sb && vy < se && (int)threadIdx.x == (vy - sb) % TP_THREADS) {
            const float x_y = lf_elem<T>::get(tp_smem[vy - sb], (int)(yb % PV));
            out[yl] = lf_elem<T>::from_f32(lf_ce_label_grad<FULL, SOFTCAP>(x_y, (int32_t)yl, coef, p.xf, cw));
        }
    }
}

/* One step: grad-role CTAs (blockIdx.y < gC, after the chunk's exchange) and stats-role CTAs
 * (the sC rows from s_r0) in one launch, the grad roles first and in reverse row order (lower
 * indices are scheduled first, and the rows read last are the likeliest still in L2). The two
 * roles' latencies (the share merge, the partials' hand-off) overlap each other's streaming. */
template <typename T, bool GRAD, bool FULL, bool SOFTCAP>
__global__ void __launch_bounds__(TP_THREADS) tp_step_kernel(const tp_kparams p, int64_t g_r0, int64_t gC, int64_t s_r0,
                                                             int64_t sC)
{
    extern __shared__ uint4 tp_smem[];
    __shared__ lf_row_stats red[TP_THREADS / 32];
    __shared__ lf_grad_coef coef_s;
    const int64_t y = blockIdx.y;
    lf_pdl_trigger();
    if (y < gC) tp_grad_cta<T, GRAD, FULL, SOFTCAP>(p, g_r0, gC, gC - 1 - y, (int)blockIdx.x, tp_smem, coef_s);
    else tp_stats_cta<T, FULL, SOFTCAP>(p, s_r0, sC, y - gC, (int)blockIdx.x, tp_smem, red);
    /* Every CTA waits for the previous step before it exits (a CTA whose rows are all ignored
     * would not otherwise), so no step completes before its predecessor: the gradient of step
     * k + 2, which waits only for step k + 1, may rely on step k's shares. */
    if (threadIdx.x == 0) lf_pdl_wait();
}

/* The read-once schedule (see tp_lsa): one launch, CTAs taking work items from a counter in
 * this order: the statistics of chunk 0 .. lag - 1, then for each k the statistics of chunk
 * k + lag and the gradient of chunk k (its rows in reverse order, a row's slices together). A
 * gradient item waits only for items handed out before it (this rank's statistics of its chunk)
 * and for the other ranks' statistics, which never wait: no deadlock, whatever the grid and
 * whatever else runs on the GPU. The last statistics item of a chunk publishes the chunk. */
template <typename T, bool GRAD, bool FULL, bool SOFTCAP>
__global__ void __launch_bounds__(TP_THREADS) tp_persist_kernel(const tp_kparams p_, const tp_lsa L_)
{
    tp_lsa L = L_; /* this launch's generation and parity (tp_lsa_now), */
    tp_lsa_now(L, p_.tp);
    tp_kparams p = p_; /* and its parity's shares, which the gradient reads */
    p.shares = reinterpret_cast<lf_tp_share *>(L.local + L.shares_off);
    extern __shared__ uint4 tp_smem[];
    __shared__ lf_row_stats red[TP_THREADS / 32];
    __shared__ lf_grad_coef coef_s;
    __shared__ unsigned tk_s[2];
    const int ns = p.nsplit;
    const int64_t total = 2 * p.n_rows * (int64_t)ns;
    int64_t j = 0, seg0 = 0; /* the cursor: step j, phase ph (0 statistics of chunk j, 1 gradient
                              * of chunk j - lag), its first item seg0 */
    int ph = 0;
    unsigned next = 0;
    if (threadIdx.x == 0) next = atomicAdd(L.ticket, 1u);
    for (int it = 0;; ++it) {
        if (threadIdx.x == 0) tk_s[it & 1] = next;
        __syncthreads();
        const int64_t t = tk_s[it & 1];
        if (t >= total) break;
        if (threadIdx.x == 0) next = atomicAdd(L.ticket, 1u); /* the next item, while this one runs */
        int64_t kc, rows;
        for (;;) {
            kc = ph == 0 ? j : j - L.lag;
            rows = (kc >= 0 && kc < L.K) ? (p.n_rows - kc * L.C < L.C ? p.n_rows - kc * L.C : L.C) : 0;
            if (t < seg0 + rows * ns) break;
            seg0 += rows * ns;
            if (ph == 0) ph = 1;
            else { ph = 0; ++j; }
        }
        const int64_t u = t - seg0, r0 = kc * L.C;
        if (ph == 0) {
            const bool wrote = tp_stats_cta<T, FULL, SOFTCAP>(p, r0, rows, u / ns, (int)(u % ns), tp_smem, red, &L);
            if (threadIdx.x == 0) {
                if (wrote) __threadfence_system(); /* its shares (remote stores) before the count */
                if (atomicAdd(L.done + kc, 1u) == (unsigned)(rows * ns - 1)) { /* the chunk's last item */
                    __threadfence_system();
                    for (int q = 0; q < p.tp; ++q)
                        tp_st_release_sys(reinterpret_cast<unsigned *>(L.peers[q] + L.flags_off) + kc * p.tp + p.rank, L.gen);
                }
            }
        } else {
            tp_grad_cta<T, GRAD, FULL, SOFTCAP>(p, r0, rows, rows - 1 - u / ns, (int)(u % ns), tp_smem, coef_s, &L, kc);
        }
    }
    /* The launch ends only once every rank has published its last chunk, whatever its rows
     * (a launch whose rows are all ignored waits on nothing above): so no rank starts a second
     * launch while another is still in this one, and the parity a rank writes two launches on
     * is never one that another still reads. Every item has been handed out when block 0 gets
     * here, and the ranks' statistics never wait: no deadlock. */
    if (blockIdx.x == 0 && threadIdx.x < 32) tp_lsa_wait(L, L.K - 1, p.tp);
}

/* The batch loss: the per-row values summed in double in a fixed order (one CTA). */
__global__ void __launch_bounds__(1024) tp_reduce_kernel(const tp_kparams p)
{
    __shared__ double fin[32];
    double a = 0.0, bz = 0.0;
    for (int64_t i = threadIdx.x; i < p.n_rows; i += 1024) {
        a += (double)p.ws_loss[i];
        bz += (double)p.ws_z[i];
    }
    a = lf_block_sum_f64<1024>(a, fin);
    __syncthreads();
    bz = lf_block_sum_f64<1024>(bz, fin);
    if (threadIdx.x != 0) return;
    if (p.reduction == LF_REDUCE_MEAN) {
        const double d = (double)(p.divisor ? *p.divisor : p.ws->divisor);
        a = d == 0.0 ? a * 0.0 : a / d; /* 0, or NaN when a row is NaN: never hidden */
        bz = d == 0.0 ? bz * 0.0 : bz / d;
    }
    p.loss[0] = (float)a;
    if (p.z_out) p.z_out[0] = (float)bz;
}

/* ============================================================================================
 * 3. The run of one rank: validate and plan, then prep, per chunk statistics / exchange /
 *    gradient, and the final reduction. tp_ce_launch strings them together for one rank; the
 *    drivers of section 4 interleave them over ranks.
 * ========================================================================================== */

/* The exchange between the statistics and the gradient of a chunk. NULL (no exchange): the
 * shares buffer already holds the other ranks' shares (the simulation; benchmarks). */
typedef struct tp_exchange {
#ifdef LF_HAVE_NCCL
    ncclComm_t comm;
#endif
    cudaStream_t comm_stream;  /* the all-gathers run here, overlapping the next statistics */
    cudaEvent_t ev_stats, ev_ag[2];
    /* the read-once schedule (tp_lsa_create): this rank's symmetric window and every rank's
     * base as this GPU maps it; lsa = 1: launches use it (else the all-gathers) */
    int lsa;
    char *win_buf;
    char **peers;
    int64_t lsa_rows;          /* the most rows a launch may have */
    unsigned gen;              /* the read-once launches and replays enqueued by tp_ce_launch and
                                * tp_ce_replay (the device holds the real count, and copies it to
                                * ctl[3]: tp_lsa_generation, tp_lsa_device_generation) */
    unsigned long long *prof;  /* optional device [2]: waits of the read-once kernel (tp_lsa) */
    int grid;                  /* CTAs of the last read-once launch */
    unsigned *ctl, *ctl_dev;   /* tp_lsa_ctl_create: mapped host words, [0] the abort request,
                                * [1] [2] the last failure's generation and reason, [3] the
                                * generation of the last launch to begin; the device's address of them */
#ifdef TP_HAVE_LSA
    ncclWindow_t win;
#endif
} tp_exchange;

/* The read-once launches' host words (mapped, pinned: the kernel reads the abort request and
 * writes its failure record while it runs), zeroed. tp_lsa_alloc makes them; an exchange whose
 * window was made another way may too (or run without: no abort request, no record). */
[[maybe_unused]] static lf_status tp_lsa_ctl_create(tp_exchange *ex, cudaError_t *cuda_err)
{
    CE_CHECK(cudaHostAlloc((void **)&ex->ctl, 4 * sizeof(unsigned), cudaHostAllocMapped | cudaHostAllocPortable));
    memset(ex->ctl, 0, 4 * sizeof(unsigned));
    CE_CHECK(cudaHostGetDevicePointer((void **)&ex->ctl_dev, ex->ctl, 0));
    return LF_OK;
}

/* The latest generation of this rank's read-once launches that the host knows of: the count of
 * the launches tp_ce_launch enqueued and the replays tp_ce_replay enqueued (ex->gen), or, where a
 * launch began that neither counted (a captured graph launched by other means), the generation
 * the last launch to begin took (tp_prep_kernel's copy into the mapped word ctl[3]). */
[[maybe_unused]] static unsigned tp_lsa_generation(const tp_exchange *ex)
{
    unsigned g = ex->gen;
    if (ex->ctl) {
        const unsigned m = ((const volatile unsigned *)ex->ctl)[3];
        if ((int)(m - g) > 0) g = m;
    }
    return g;
}

/* The generation the last read-once launch of this rank to begin took, as its prep kernel copied
 * it (exact once the stream is synchronised; 0 without the mapped words, or before any launch). */
[[maybe_unused]] static unsigned tp_lsa_device_generation(const tp_exchange *ex)
{
    return ex->ctl ? ((const volatile unsigned *)ex->ctl)[3] : 0u;
}

/* Ends this rank's read-once launches so far, those enqueued and not yet begun included, replays
 * of captured graphs too where tp_ce_replay enqueued them (any thread, any time, no CUDA call): a launch
 * still waiting for another rank's shares gives up within ~1024 of its spins (tp_lsa_spin: about
 * a millisecond), with NaN outputs,
 * and stores its generation into every rank's failure word, so the other ranks' launches of the
 * same generation give up too. For a watchdog: a rank that died or hangs elsewhere. Launches
 * made after the call are not affected. */
[[maybe_unused]] static void tp_lsa_abort(tp_exchange *ex)
{
    if (ex->ctl) *(volatile unsigned *)&ex->ctl[0] = tp_lsa_generation(ex);
}

/* The last read-once launch of this rank that gave up: returns its reason (TP_LSA_ABORTED,
 * _TIMED_OUT, _PEER_FAILED; TP_LSA_OK if none ever did) and *gen the generation of that launch
 * (whether it is the latest: tp_lsa_last_failed). Read after the launch's stream is synchronised. */
[[maybe_unused]] static unsigned tp_lsa_failure(const tp_exchange *ex, unsigned *gen)
{
    if (!ex->ctl) {
        if (gen) *gen = 0;
        return TP_LSA_OK;
    }
    const volatile unsigned *c = ex->ctl;
    if (gen) *gen = c[1];
    return c[2];
}

/* Whether the last read-once launch of this rank gave up (its outputs are NaN; tp_lsa_failure
 * says why). Read after its stream is synchronised: then the mapped word ctl[3] holds the
 * generation that launch took (exact, replays included). */
[[maybe_unused]] static bool tp_lsa_last_failed(const tp_exchange *ex)
{
    unsigned g = 0;
    if (!ex->lsa || tp_lsa_failure(ex, &g) == TP_LSA_OK) return false;
    return g == tp_lsa_device_generation(ex); /* (a failure record implies ctl) */
}

typedef struct tp_run {
    tp_kparams p;
    lf_dtype dt;
    bool grad, full, softcap, want_divisor;
    bool pdl;     /* programmatic dependent launch of the steps (sm_90+) */
    int64_t C, K; /* rows per chunk, chunks */
    bool res;     /* the resident read-once schedule (tp_lsa_plan) */
    int64_t max_ctas; /* the read-once kernels' CTAs at most (0: no cap) */
    int64_t widest;   /* the widest shard's columns (every rank plans the resident ring for it) */
    ce_ws_header *ce_ws; /* its cross-entropy workspace header */
} tp_run;

/* CUDA errors: CE_CHECK (examples/cross_entropy.cu) returns LF_ERR_DEVICE and sets *cuda_err */

/* Validate a rank's arguments and plan its chunks (host only: nothing launched). */
static lf_status tp_ce_plan(const tp_ce_args *a, tp_run *run, cudaError_t *cuda_err, bool need_shares = true)
{
    if (cuda_err) *cuda_err = cudaSuccess;
    if (!a || !run) return LF_ERR_NULL;
    lf_status st = lf_check_ce_opts(&a->opts);
    if (st != LF_OK) return st;
    if (a->tp < 1 || a->tp > TP_MAX_RANKS || a->rank < 0 || a->rank >= a->tp) return LF_ERR_ARG;
    if (a->n_rows < 0 || a->vocab < 1 || a->vocab > 0x7fffffff) return LF_ERR_SIZE;
    int64_t v0, v1;
    lf_tp_shard(a->vocab, a->tp, a->rank, &v0, &v1);
    const int64_t vs = v1 - v0;
    if (a->stride < vs || (a->grad && a->grad_stride < vs)) return LF_ERR_SIZE;
    if (a->dtype != LF_F32 && a->dtype != LF_BF16 && a->dtype != LF_F16) return LF_ERR_ARG;
    if ((int)a->reduction < 0 || (int)a->reduction > 2) return LF_ERR_ARG;
    if (a->n_rows > 0) {
        if (!a->logits || !a->labels || !a->loss || !a->workspace || (need_shares && !a->shares)) return LF_ERR_NULL;
        if (a->workspace_bytes < tp_ce_workspace_bytes(a->n_rows, vs, a->dtype)) return LF_ERR_SIZE;
        if (need_shares && a->shares_bytes < tp_ce_shares_bytes(a->n_rows, a->tp)) return LF_ERR_SIZE;
        if (a->grad && ce_grad_overlaps(a->logits, a->stride, a->grad, a->grad_stride, a->n_rows, vs, a->dtype))
            return LF_ERR_ARG; /* in place means the same rows; any other overlap would race */
    }
    memset(run, 0, sizeof *run);
    tp_kparams &p = run->p;
    p.logits = a->logits;
    p.stride = a->stride;
    p.n_rows = a->n_rows;
    p.V = a->vocab;
    p.v0 = v0;
    p.vs = vs;
    p.tp = a->tp;
    p.rank = a->rank;
    p.nsplit = tp_nsplit(vs, a->dtype);
    p.labels = a->labels;
    p.labels_i64 = a->labels_i64;
    p.ignore_index = a->opts.ignore_index;
    p.class_w = a->opts.class_weights;
    p.eps = a->opts.label_smoothing;
    p.lam = a->opts.z_loss;
    p.xf = lf_xform_make(a->opts.logit_scale, a->opts.softcap);
    p.reduction = (int)a->reduction;
    p.divisor = a->divisor;
    p.dloss = a->dloss;
    p.grad_scale = a->grad_scale;
    p.grad = a->grad;
    p.grad_stride = a->grad_stride;
    p.loss = a->loss;
    p.z_out = a->z_loss_out;
    p.lse = a->lse;
    p.n_errors = a->n_errors;
    p.shares = a->shares;
    const size_t n = (size_t)a->n_rows;
    p.ws = (tp_ws_header *)a->workspace;
    p.ws_loss = (float *)((char *)a->workspace + sizeof(tp_ws_header));
    p.ws_z = p.ws_loss + n;
    p.part = p.ws_z + n;
    p.cnt = (unsigned int *)(p.part + 3 * n * (size_t)p.nsplit);
    run->ce_ws = (ce_ws_header *)((char *)a->workspace + tp_ce_ws_ce_offset(a->n_rows, vs, a->dtype));
    run->max_ctas = a->max_ctas;
    run->dt = a->dtype;
    run->grad = a->grad != NULL;
    run->full = p.eps > 0.0f;
    run->softcap = p.xf.softcap > 0.0f;
    run->want_divisor = a->reduction == LF_REDUCE_MEAN && !a->divisor;
    /* chunk: all rows (at most 65535: grid y) unless the caller asks for chunks */
    int64_t C = a->chunk_rows > 0 ? a->chunk_rows : 65535;
    {
        int dev = 0, cc = 0;
        CE_CHECK(cudaGetDevice(&dev));
        CE_CHECK(cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, dev));
        run->pdl = cc >= 9 && !a->no_pdl;
    }
    if (C < 1) C = 1;
    if (C > 65535) C = 65535;
    /* from three chunks on, a step holds a gradient chunk and a statistics chunk: grid y is their
     * sum, at most 65535 */
    if (a->n_rows > 2 * C && C > 32767) C = 32767;
    if (C > a->n_rows) C = a->n_rows > 0 ? a->n_rows : 1;
    run->C = C;
    run->K = (a->n_rows + C - 1) / C;
    if (a->plan) {
        a->plan->chunk_rows = C;
        a->plan->chunks = run->K;
        a->plan->nsplit = p.nsplit;
    }
    return LF_OK;
}

/* Rows and first row of chunk k (k < 0 or past the end: none). */
static void tp_chunk(const tp_run &r, int64_t k, int64_t *r0, int64_t *C)
{
    *r0 = k * r.C;
    *C = (k < 0 || k >= r.K) ? 0 : (r.p.n_rows - *r0 < r.C ? r.p.n_rows - *r0 : r.C);
    if (*C == 0) *r0 = 0;
}

template <typename T, bool GRAD, bool FULL, bool SOFTCAP>
static lf_status tp_step_launch(const tp_run &run, int64_t kg, int64_t ks, cudaStream_t s, cudaError_t *cuda_err)
{
    auto kernel = tp_step_kernel<T, GRAD, FULL, SOFTCAP>; /* 32 KB of shared memory: no opt-in needed */
    int64_t g0, gC, s0, sC;
    tp_chunk(run, kg, &g0, &gC);
    tp_chunk(run, ks, &s0, &sC);
    if (gC + sC == 0) return LF_OK;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr = {};
    cfg.gridDim = dim3((unsigned)run.p.nsplit, (unsigned)(gC + sC), 1);
    cfg.blockDim = dim3(TP_THREADS, 1, 1);
    cfg.dynamicSmemBytes = TP_SLICE_VECS * 16;
    cfg.stream = s;
    if (run.pdl) {
        attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr.val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = &attr;
        cfg.numAttrs = 1;
    }
    CE_CHECK(cudaLaunchKernelEx(&cfg, kernel, run.p, g0, gC, s0, sC));
    CE_CHECK(cudaGetLastError());
    return LF_OK;
}

template <typename T>
static lf_status tp_step_dispatch(const tp_run &r, int64_t kg, int64_t ks, cudaStream_t s, cudaError_t *e)
{
    if (!r.grad) {
        if (r.full) return r.softcap ? tp_step_launch<T, false, true, true>(r, kg, ks, s, e) : tp_step_launch<T, false, true, false>(r, kg, ks, s, e);
        return r.softcap ? tp_step_launch<T, false, false, true>(r, kg, ks, s, e) : tp_step_launch<T, false, false, false>(r, kg, ks, s, e);
    }
    if (r.full) return r.softcap ? tp_step_launch<T, true, true, true>(r, kg, ks, s, e) : tp_step_launch<T, true, true, false>(r, kg, ks, s, e);
    return r.softcap ? tp_step_launch<T, true, false, true>(r, kg, ks, s, e) : tp_step_launch<T, true, false, false>(r, kg, ks, s, e);
}

/* Prep: the hand-off counters (the resident schedule: its cross-entropy workspace header), weight
 * sums and the default divisor (a memset, one small kernel). */
static lf_status tp_ce_prep(const tp_run &r, cudaStream_t s, cudaError_t *cuda_err, unsigned *gen_word = nullptr,
                            unsigned *gen_mirror = nullptr)
{
    if (r.p.n_rows == 0) return LF_OK;
    /* the slices' hand-off counters start at zero every launch (their place in the workspace
     * depends on N and the slice count, so nothing left by another configuration can leak in) */
    if (r.res) CE_CHECK(cudaMemsetAsync(r.ce_ws, 0, sizeof(ce_ws_header), s));
    else CE_CHECK(cudaMemsetAsync(r.p.cnt, 0, sizeof(unsigned int) * (size_t)r.p.n_rows, s));
    tp_prep_kernel<<<1, 1024, 0, s>>>(r.p, r.want_divisor ? 1 : 0, gen_word, gen_mirror);
    CE_CHECK(cudaGetLastError());
    return LF_OK;
}

/* One step: the gradient (or forward-only outputs) of chunk kg, after its exchange, and the
 * statistics of chunk ks (-> this rank's shares of it); either may be -1 (none). */
static lf_status tp_ce_step(const tp_run &r, int64_t kg, int64_t ks, cudaStream_t s, cudaError_t *e)
{
    if (r.dt == LF_F32) return tp_step_dispatch<float>(r, kg, ks, s, e);
    if (r.dt == LF_BF16) return tp_step_dispatch<__nv_bfloat16>(r, kg, ks, s, e);
    return tp_step_dispatch<__half>(r, kg, ks, s, e);
}

/* The reduced loss (reduction sum / mean), or for N = 0 the zero outputs. */
static lf_status tp_ce_reduce(const tp_run &r, cudaStream_t s, cudaError_t *cuda_err)
{
    if (r.p.reduction == LF_REDUCE_NONE) return LF_OK;
    if (r.p.n_rows == 0) {
        if (r.p.loss) CE_CHECK(cudaMemsetAsync(r.p.loss, 0, sizeof(float), s));
        if (r.p.z_out) CE_CHECK(cudaMemsetAsync(r.p.z_out, 0, sizeof(float), s));
        return LF_OK;
    }
    tp_reduce_kernel<<<1, 1024, 0, s>>>(r.p);
    CE_CHECK(cudaGetLastError());
    return LF_OK;
}

/* Enqueue the exchange of chunk k: the comm stream waits for the chunk's statistics on `s`,
 * all-gathers the shares in place (rank r's block of the chunk is its send buffer), and records
 * ev_ag[k % 2]. Inside ncclGroupStart / End when one thread drives several ranks. */
static lf_status tp_ce_exchange(const tp_run &r, int64_t k, tp_exchange *ex, cudaStream_t s, cudaError_t *cuda_err)
{
#ifdef LF_HAVE_NCCL
    const int64_t r0 = k * r.C, C = r.p.n_rows - r0 < r.C ? r.p.n_rows - r0 : r.C;
    float *base = reinterpret_cast<float *>(r.p.shares + r0 * r.p.tp);
    CE_CHECK(cudaEventRecord(ex->ev_stats, s));
    CE_CHECK(cudaStreamWaitEvent(ex->comm_stream, ex->ev_stats, 0));
    if (ncclAllGather(base + 3 * C * r.p.rank, base, (size_t)(3 * C), ncclFloat, ex->comm, ex->comm_stream) != ncclSuccess)
        return LF_ERR_DEVICE;
    return LF_OK;
#else
    (void)r; (void)k; (void)ex; (void)s; (void)cuda_err;
    return LF_ERR_ARG; /* built without NCCL */
#endif
}

static lf_status tp_ce_exchange_done(int64_t k, tp_exchange *ex, cudaError_t *cuda_err)
{
    CE_CHECK(cudaEventRecord(ex->ev_ag[k & 1], ex->comm_stream));
    return LF_OK;
}

static lf_status tp_ce_wait_exchange(int64_t k, tp_exchange *ex, cudaStream_t s, cudaError_t *cuda_err)
{
    CE_CHECK(cudaStreamWaitEvent(s, ex->ev_ag[k & 1], 0));
    return LF_OK;
}

#define TP_TRY(x)                                                                                   \
    do {                                                                                            \
        lf_status s_ = (x);                                                                         \
        if (s_ != LF_OK) return s_;                                                                 \
    } while (0)

/* The gradient of chunk k runs in step k + TP_LAG, with the statistics of chunk k + TP_LAG: the
 * exchange of chunk k (enqueued after step k) has all of step k + 1 to finish. */
#define TP_LAG 2

/* The read-once schedule's launch (ex->lsa): prep, one tp_persist_kernel, the reduction. Rows
 * per chunk: a->chunk_rows, or what makes a chunk an eighth of L2; the gradient of chunk k is
 * handed out after the statistics of chunk k + lag, while chunk k should still be in L2. Every
 * rank must launch the same sequence (the generations must agree). */
template <typename T, bool GRAD, bool FULL, bool SOFTCAP>
static lf_status tp_persist_launch(const tp_run &r, const tp_lsa &L, int per_sm, cudaStream_t s, int *grid_out,
                                   cudaError_t *cuda_err)
{
    auto kernel = tp_persist_kernel<T, GRAD, FULL, SOFTCAP>;
    int dev = 0, sms = 0, occ = 0;
    CE_CHECK(cudaGetDevice(&dev));
    CE_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CE_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kernel, TP_THREADS, TP_SLICE_VECS * 16));
    if (per_sm > 0 && per_sm < occ) occ = per_sm;
    const int64_t items = 2 * r.p.n_rows * (int64_t)r.p.nsplit;
    int64_t grid = (int64_t)(occ > 0 ? occ : 1) * sms;
    if (grid > items) grid = items;
    if (r.max_ctas > 0 && grid > r.max_ctas) grid = r.max_ctas;
    *grid_out = (int)grid;
    kernel<<<(unsigned)grid, TP_THREADS, TP_SLICE_VECS * 16, s>>>(r.p, L);
    CE_CHECK(cudaGetLastError());
    return LF_OK;
}

template <typename T>
static lf_status tp_persist_dispatch(const tp_run &r, const tp_lsa &L, int n, cudaStream_t s, int *g, cudaError_t *e)
{
    if (!r.grad) {
        if (r.full) return r.softcap ? tp_persist_launch<T, false, true, true>(r, L, n, s, g, e) : tp_persist_launch<T, false, true, false>(r, L, n, s, g, e);
        return r.softcap ? tp_persist_launch<T, false, false, true>(r, L, n, s, g, e) : tp_persist_launch<T, false, false, false>(r, L, n, s, g, e);
    }
    if (r.full) return r.softcap ? tp_persist_launch<T, true, true, true>(r, L, n, s, g, e) : tp_persist_launch<T, true, true, false>(r, L, n, s, g, e);
    return r.softcap ? tp_persist_launch<T, true, false, true>(r, L, n, s, g, e) : tp_persist_launch<T, true, false, false>(r, L, n, s, g, e);
}

/* The resident read-once schedule (tp_res_xchg): examples/cross_entropy.cu's row-resident kernel
 * over this rank's shard (its parameters: the shard's width as the row, the shard's class
 * weights, rank 0 counting bad labels, the divisor from tp_prep_kernel where the caller gives
 * none) with the exchange hook; dry: plan only (ce_launch_resident).
 * Rows in a FIXED share per cluster (static_rows), the ring planned for the widest shard: every
 * rank's cluster c then takes the same rows in the same order, so a row's shares are made at about
 * the same time on every rank. Measured on two H200s (bench/RESULTS.md), rows handed out by each
 * rank's own counter were 23-28x slower: a CTA waiting for a row has already drawn its next one,
 * which another rank may reach first and wait for in turn, and the waits chain. */
static ce_kparams tp_res_params(const tp_run &r)
{
    const tp_kparams &p = r.p;
    ce_kparams c;
    memset(&c, 0, sizeof c);
    c.logits = p.logits;
    c.stride = p.stride;
    c.n_rows = p.n_rows;
    c.vocab = p.vs;
    c.labels = p.labels;
    c.labels_i64 = p.labels_i64;
    c.ignore_index = p.ignore_index;
    c.class_w = p.class_w ? p.class_w + p.v0 : nullptr;
    c.eps = p.eps;
    c.lam = p.lam;
    c.xf = p.xf;
    c.reduction = p.reduction;
    c.divisor = p.divisor ? p.divisor : &p.ws->divisor;
    c.dloss = p.dloss;
    c.grad_scale = p.grad_scale;
    c.grad = p.grad;
    c.grad_stride = p.grad_stride;
    c.loss = p.loss;
    c.z_out = p.z_out;
    c.lse = p.lse;
    c.n_errors = p.rank == 0 ? p.n_errors : nullptr;
    c.ws = r.ce_ws;
    c.ws_loss = p.ws_loss;
    c.ws_z = p.ws_z;
    return c;
}

template <typename T>
static lf_status tp_res_dispatch(const tp_run &r, const tp_res_xchg &xc, int64_t max_ctas, bool dry, ce_plan *pl,
                                 cudaStream_t s, cudaError_t *cuda_err)
{
    const ce_kparams c = tp_res_params(r);
    bool launched = false;
    lf_status st;
    /* forced: a refusal is an error, never a quiet fallback (the other ranks would wait) */
    const int64_t w = r.widest;
    if (r.full) st = r.softcap ? ce_launch_resident<T, true, true, true>(c, 0, 0, 1, true, false, pl, s, cuda_err, &launched, xc, max_ctas, dry, w)
                               : ce_launch_resident<T, true, true, false>(c, 0, 0, 1, true, false, pl, s, cuda_err, &launched, xc, max_ctas, dry, w);
    else st = r.softcap ? ce_launch_resident<T, true, false, true>(c, 0, 0, 1, true, false, pl, s, cuda_err, &launched, xc, max_ctas, dry, w)
                        : ce_launch_resident<T, true, false, false>(c, 0, 0, 1, true, false, pl, s, cuda_err, &launched, xc, max_ctas, dry, w);
    if (st == LF_OK && !launched) st = LF_ERR_SIZE;
    return st;
}

static lf_status tp_res_run(const tp_run &r, const tp_res_xchg &xc, int64_t max_ctas, bool dry, ce_plan *pl, cudaStream_t s,
                            cudaError_t *e)
{
    if (r.dt == LF_F32) return tp_res_dispatch<float>(r, xc, max_ctas, dry, pl, s, e);
    if (r.dt == LF_BF16) return tp_res_dispatch<__nv_bfloat16>(r, xc, max_ctas, dry, pl, s, e);
    return tp_res_dispatch<__half>(r, xc, max_ctas, dry, pl, s, e);
}

/* The read-once launch's plan and checks, with nothing launched (tp_ce_nccl checks every rank
 * before it launches any: a rank that fails after others have launched would leave them
 * waiting for its flags forever). The schedule (r->res), from what is the same on every rank:
 * resident where a->lsa_schedule allows and the gradient is asked for, tp <= 32 (one merging
 * warp), the device has the resident ring (sm_90), no shard is empty and the widest shard's
 * row is at least CE_RES_MIN_SLICE bytes (cross-entropy's own bound for the ring), and the
 * ring plans; else chunked. Chunked rows: a->chunk_rows, or an eighth of L2 over the WIDEST
 * shard's row, so that every rank picks the same chunks when V % tp != 0. */
static lf_status tp_lsa_plan(const tp_ce_args *a, const tp_exchange *ex, tp_run *r, int64_t *C_out, cudaError_t *cuda_err)
{
    TP_TRY(tp_ce_plan(a, r, cuda_err, false));
    if (!ex->peers || !ex->win_buf || a->lsa_timeout_ms < 0) return LF_ERR_ARG;
    if (a->lsa_schedule < TP_LSA_AUTO || a->lsa_schedule > TP_LSA_RESIDENT || a->max_ctas < 0) return LF_ERR_ARG;
    if (a->n_rows > ex->lsa_rows) return LF_ERR_SIZE;
    const int64_t N = a->n_rows;
    int dev = 0, l2 = 0, cc = 0;
    CE_CHECK(cudaGetDevice(&dev));
    CE_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    CE_CHECK(cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, dev));
    int64_t widest = 1, narrowest = a->vocab;
    for (int q = 0; q < a->tp; ++q) {
        int64_t v0, v1;
        lf_tp_shard(a->vocab, a->tp, q, &v0, &v1);
        if (v1 - v0 > widest) widest = v1 - v0;
        if (v1 - v0 < narrowest) narrowest = v1 - v0;
    }
    r->res = false;
    r->widest = widest;
    /* automatic: chunk_rows > 0 asks for the chunked schedule */
    if (a->lsa_schedule == TP_LSA_RESIDENT || (a->lsa_schedule == TP_LSA_AUTO && a->chunk_rows == 0)) {
        const bool fits = a->grad && a->tp <= 32 && cc >= 9 && narrowest >= 1 &&
                          widest * (int64_t)lf_dtype_size(a->dtype) >= CE_RES_MIN_SLICE;
        if (fits && N > 0) { /* does the ring plan (host queries only)? */
            tp_res_xchg xc;
            memset(&xc, 0, sizeof xc);
            r->res = true;
            const lf_status st = tp_res_run(*r, xc, r->max_ctas, true, nullptr, 0, cuda_err);
            if (st == LF_ERR_DEVICE) return st;
            r->res = st == LF_OK;
        } else {
            r->res = fits;
        }
        if (a->lsa_schedule == TP_LSA_RESIDENT && !r->res) return LF_ERR_ARG;
    }
    if (r->res) {
        *C_out = N > 0 ? N : 1;
        return LF_OK;
    }
    if (2 * N * (int64_t)r->p.nsplit >= ((int64_t)1 << 32) - 1) return LF_ERR_SIZE; /* 32-bit work counter */
    int64_t C = a->chunk_rows > 0 ? a->chunk_rows : (int64_t)l2 / 8 / (widest * (int64_t)lf_dtype_size(a->dtype));
    if (C < 1) C = 1;
    if (C > N) C = N > 0 ? N : 1;
    *C_out = C;
    return LF_OK;
}

static lf_status tp_ce_launch_lsa(const tp_ce_args *a, tp_exchange *ex, cudaStream_t stream, cudaError_t *cuda_err)
{
    tp_run r;
    int64_t C = 1;
    TP_TRY(tp_lsa_plan(a, ex, &r, &C, cuda_err));
    const int64_t N = a->n_rows;
    tp_lsa L;
    memset(&L, 0, sizeof L);
    L.peers = ex->peers;
    L.local = ex->win_buf;
    L.rows = ex->lsa_rows;
    L.gen_off = tp_lsa_gen_offset(ex->lsa_rows, a->tp);
    /* The generation is the device's: tp_prep_kernel advances this rank's generation word before
     * the launch's kernels (tp_lsa_now, tp_res_xchg::generation), so a replay of a captured
     * launch takes the next one.
     * ex->gen counts the launches enqueued here once their prep is (not while capturing:
     * tp_ce_replay counts the replays). A launch without rows runs no kernel, so it takes no
     * generation: the parities of the ranks' next launches stay in step with launches that
     * synchronise them. */
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    CE_CHECK(cudaStreamIsCapturing(stream, &cap));
    /* (read before the prep is enqueued: once it runs, its copy into ctl[3] would count it twice) */
    const unsigned next = tp_lsa_generation(ex) + 1u;
    auto count = [&]() {
        if (N > 0 && cap == cudaStreamCaptureStatusNone) ex->gen = next;
    };
    unsigned *const gen_word = reinterpret_cast<unsigned *>(ex->win_buf + L.gen_off);
    unsigned *const gen_mirror = ex->ctl_dev ? ex->ctl_dev + 3 : nullptr;
    L.C = C;
    L.K = (N + C - 1) / C;
    L.lag = a->lsa_lag > 0 ? a->lsa_lag : 6; /* H200 x2, 8 MB chunks: lag 2 / 4 / 6 waited 27 / 5 / 2% */
    L.ticket = r.p.cnt + N;
    L.done = L.ticket + 1;
    L.hints = a->lsa_hints > 0 ? 1 : a->lsa_hints < 0 ? 0 : TP_LSA_HINTS;
    L.prof = ex->prof;
    L.abort_req = ex->ctl_dev;
    L.report = ex->ctl_dev ? ex->ctl_dev + 1 : nullptr;
    L.timeout_ns = (unsigned long long)a->lsa_timeout_ms * 1000000ull;
    r.p.shares = reinterpret_cast<lf_tp_share *>(ex->win_buf); /* (the kernel takes its parity's, tp_lsa_now) */
    if (a->plan) {
        a->plan->chunk_rows = C;
        a->plan->chunks = L.K;
        a->plan->resident = r.res;
        a->plan->cluster = a->plan->stages = a->plan->ctas = 0;
    }
    if (r.res) { /* prep, then the row-resident kernel with the exchange hook (it sums the batch) */
        tp_res_xchg xc;
        memset(&xc, 0, sizeof xc);
        xc.V = r.p.V;
        xc.v0 = r.p.v0;
        xc.P = a->tp;
        xc.rank = a->rank;
        xc.class_w = r.p.class_w;
        xc.ws = r.p.ws;
        xc.eps = r.p.eps;
        xc.L = L;
        xc.L.fail_off = tp_lsa_fail_offset(ex->lsa_rows, a->tp, 0);
        xc.slots_off = tp_lsa_slots_offset(ex->lsa_rows, a->tp, 0);
        xc.slots_stride = tp_lsa_slots_offset(ex->lsa_rows, a->tp, 1) - xc.slots_off;
        xc.done_off = tp_lsa_done_offset(ex->lsa_rows, a->tp);
        TP_TRY(tp_ce_prep(r, stream, cuda_err, gen_word, gen_mirror));
        count();
        if (N == 0) return tp_ce_reduce(r, stream, cuda_err);
        ce_plan pl;
        memset(&pl, 0, sizeof pl);
        TP_TRY(tp_res_run(r, xc, r.max_ctas, false, &pl, stream, cuda_err));
        ex->grid = pl.ctas;
        if (a->plan) {
            a->plan->cluster = pl.cluster;
            a->plan->stages = pl.stages;
            a->plan->ctas = pl.ctas;
        }
        return LF_OK;
    }
    TP_TRY(tp_ce_prep(r, stream, cuda_err, gen_word, gen_mirror));
    count();
    if (N > 0) {
        CE_CHECK(cudaMemsetAsync(L.ticket, 0, sizeof(unsigned) * (size_t)(L.K + 1), stream));
        const int n = a->lsa_ctas_per_sm;
        if (r.dt == LF_F32) TP_TRY(tp_persist_dispatch<float>(r, L, n, stream, &ex->grid, cuda_err));
        else if (r.dt == LF_BF16) TP_TRY(tp_persist_dispatch<__nv_bfloat16>(r, L, n, stream, &ex->grid, cuda_err));
        else TP_TRY(tp_persist_dispatch<__half>(r, L, n, stream, &ex->grid, cuda_err));
    }
    return tp_ce_reduce(r, stream, cuda_err);
}

/* One rank's whole step on `stream` (one process per GPU; or ex == NULL: no exchange, the other
 * ranks' shares already in place). Launches: prep, then for j = 0 .. K + 1 one step kernel
 * (gradient of chunk j - 2, statistics of chunk j) with, around it, the wait for the exchange
 * of chunk j - 2 and the exchange of chunk j on ex->comm_stream; then the reduction. The chunk
 * whose gradient is written was read two steps ago and is still in L2. No host
 * synchronisation; capturable in a CUDA graph (tp_ce_capture), the read-once launches too (each
 * launch, replays included, takes its generation from the device: tp_prep_kernel). Returns LF_OK,
 * LF_ERR_* for bad arguments (nothing launched), or LF_ERR_DEVICE with *cuda_err set. */
static lf_status tp_ce_launch(const tp_ce_args *a, tp_exchange *ex, cudaStream_t stream, cudaError_t *cuda_err)
{
    if (ex && ex->lsa) return tp_ce_launch_lsa(a, ex, stream, cuda_err);
    tp_run r;
    TP_TRY(tp_ce_plan(a, &r, cuda_err));
    TP_TRY(tp_ce_prep(r, stream, cuda_err));
    for (int64_t j = 0; j < r.K + TP_LAG; ++j) {
        const int64_t kg = j - TP_LAG, ks = j < r.K ? j : -1;
        if (ex && kg >= 0) TP_TRY(tp_ce_wait_exchange(kg, ex, stream, cuda_err));
        TP_TRY(tp_ce_step(r, kg, ks, stream, cuda_err));
        if (ex && ks >= 0) {
            TP_TRY(tp_ce_exchange(r, ks, ex, stream, cuda_err));
            TP_TRY(tp_ce_exchange_done(ks, ex, cuda_err));
        }
    }
    return tp_ce_reduce(r, stream, cuda_err);
}

/* One rank's step captured into a CUDA graph (tp_ce_capture) and whether a replay of it takes a
 * read-once generation (for the host's count: tp_ce_replay). */
typedef struct tp_ce_graph {
    cudaGraphExec_t exec;
    int takes_gen;
} tp_ce_graph;

/* One rank's step (tp_ce_launch) captured from `stream` into a CUDA graph, instantiated into
 * g->exec: replay it with tp_ce_replay on a stream of this rank's device, the same buffers each
 * time (the arguments are fixed at capture: pointers, N, options). `stream` must not be the
 * legacy default stream; capture runs nothing. Call tp_ce_launch once before (its first launch
 * sets kernel attributes up, which is not a stream operation). One rank per capture: where one
 * thread drives several GPUs the all-gather exchange must group their collectives
 * (tp_ce_nccl), which a capture per rank cannot; tp_nccl_ranks::capture takes the read-once
 * window only. Every rank replays its graph as it would launch (with the read-once window: the
 * ranks' kernels must run at once, the same launches in the same order on every rank); each
 * replay takes the next generation on the device. Returns what tp_ce_launch returns (then no
 * graph: g->exec = NULL), or LF_ERR_DEVICE where the capture or the instantiation failed. */
[[maybe_unused]] static lf_status tp_ce_capture(const tp_ce_args *a, tp_exchange *ex, cudaStream_t stream, tp_ce_graph *g,
                                                cudaError_t *cuda_err)
{
    g->exec = nullptr;
    g->takes_gen = ex && ex->lsa && a->n_rows > 0;
    CE_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const lf_status st = tp_ce_launch(a, ex, stream, cuda_err);
    cudaGraph_t gr = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream, &gr); /* always ended, whatever tp_ce_launch said */
    if (st != LF_OK || e != cudaSuccess) {
        if (gr) cudaGraphDestroy(gr);
        if (st == LF_OK && cuda_err) *cuda_err = e;
        return st != LF_OK ? st : LF_ERR_DEVICE;
    }
    const cudaError_t ei = cudaGraphInstantiate(&g->exec, gr, 0);
    cudaGraphDestroy(gr);
    if (ei != cudaSuccess) {
        g->exec = nullptr;
        if (cuda_err) *cuda_err = ei;
        return LF_ERR_DEVICE;
    }
    return LF_OK;
}

/* One replay of a captured step on `stream`, counted like a launch (ex->gen: tp_lsa_abort then
 * reaches it before it begins, and tp_lsa_generation knows it). */
[[maybe_unused]] static lf_status tp_ce_replay(const tp_ce_graph *g, tp_exchange *ex, cudaStream_t stream, cudaError_t *cuda_err)
{
    const unsigned next = ex ? tp_lsa_generation(ex) + 1u : 0u; /* (before the replay can begin) */
    CE_CHECK(cudaGraphLaunch(g->exec, stream));
    if (g->takes_gen && ex) ex->gen = next;
    return LF_OK;
}

/* Frees a captured step (on its device; a NULL exec is none). */
[[maybe_unused]] static void tp_ce_graph_destroy(tp_ce_graph *g)
{
    if (g->exec) cudaGraphExecDestroy(g->exec);
    g->exec = nullptr;
}

/* ============================================================================================
 * 4. Drivers: the single-GPU simulation and one process driving every GPU over NCCL
 * ========================================================================================== */

/* All tp ranks on the current device, one after another: every rank's statistics (their shares
 * land in the one shares buffer they all point to: that IS the all-gather), then every rank's
 * gradient. The arithmetic is that of the real thing; the L2 schedule is not. */
static lf_status tp_ce_simulate(const tp_ce_args *args, int tp, cudaStream_t stream, cudaError_t *cuda_err)
{
    std::vector<tp_run> runs(tp);
    for (int r = 0; r < tp; ++r) {
        if (args[r].shares != args[0].shares || args[r].tp != tp || args[r].rank != r) return LF_ERR_ARG;
        TP_TRY(tp_ce_plan(&args[r], &runs[r], cuda_err));
    }
    for (int r = 0; r < tp; ++r) {
        if (runs[r].C != runs[0].C) return LF_ERR_ARG; /* the chunk layout of the shares must agree */
        TP_TRY(tp_ce_prep(runs[r], stream, cuda_err));
        for (int64_t k = 0; k < runs[r].K; ++k) TP_TRY(tp_ce_step(runs[r], -1, k, stream, cuda_err));
    }
    for (int r = 0; r < tp; ++r) {
        for (int64_t k = 0; k < runs[r].K; ++k) TP_TRY(tp_ce_step(runs[r], k, -1, stream, cuda_err));
        TP_TRY(tp_ce_reduce(runs[r], stream, cuda_err));
    }
    return LF_OK;
}

#ifdef LF_HAVE_NCCL
/* Whether the ranks' arguments agree wherever a mismatch would hang their collectives or waits
 * (tp_ce_nccl, tp_nccl_ranks::capture): rank r's at args[r], one exchange kind for all. */
static bool tp_ranks_agree(const tp_ce_args *args, int tp, const tp_exchange *ex)
{
    for (int r = 0; r < tp; ++r)
        if (args[r].tp != tp || args[r].rank != r || args[r].n_rows != args[0].n_rows || args[r].vocab != args[0].vocab ||
            args[r].chunk_rows != args[0].chunk_rows || ex[r].lsa != ex[0].lsa ||
            args[r].lsa_schedule != args[0].lsa_schedule || args[r].max_ctas != args[0].max_ctas)
            return false;
    return true;
}

/* Every rank's read-once plan on its device, before any rank launches (a rank that failed after
 * the others launched would leave them waiting for its flags), all on one schedule (LF_ERR_ARG
 * where they differ, e.g. unlike GPUs); runs: [tp] or NULL. */
static lf_status tp_lsa_plan_ranks(const tp_ce_args *args, int tp, const int *devs, tp_exchange *ex, tp_run *runs,
                                   cudaError_t *cuda_err)
{
    bool res0 = false;
    for (int r = 0; r < tp; ++r) {
        CE_CHECK(cudaSetDevice(devs[r]));
        tp_run run;
        int64_t C = 1;
        TP_TRY(tp_lsa_plan(&args[r], &ex[r], &run, &C, cuda_err));
        if (runs) runs[r] = run;
        if (r == 0) res0 = run.res;
        if (run.res != res0) return LF_ERR_ARG;
    }
    return LF_OK;
}

/* One thread drives rank r on devs[r] (streams[r], exchanges[r] with their communicators): the
 * same schedule as tp_ce_launch, chunk by chunk over the ranks, each chunk's all-gathers in one
 * NCCL group (one thread issuing several ranks' collectives must group them). */
static lf_status tp_ce_nccl(const tp_ce_args *args, int tp, const int *devs, tp_exchange *ex, const cudaStream_t *streams,
                            cudaError_t *cuda_err)
{
    std::vector<tp_run> runs(tp);
    if (!tp_ranks_agree(args, tp, ex)) return LF_ERR_ARG; /* mismatched collectives would hang */
    if (ex[0].lsa) { /* no collective to group: each rank's launches, one GPU after the other,
                      * once every rank has been planned */
        TP_TRY(tp_lsa_plan_ranks(args, tp, devs, ex, runs.data(), cuda_err));
        for (int r = 0; r < tp; ++r) {
            const cudaError_t e = cudaSetDevice(devs[r]);
            if (e != cudaSuccess && cuda_err) *cuda_err = e;
            const lf_status st = e == cudaSuccess ? tp_ce_launch_lsa(&args[r], &ex[r], streams[r], cuda_err) : LF_ERR_DEVICE;
            if (st != LF_OK) { /* the ranks launched before wait for this one's flags: end them */
                for (int q = 0; q < r; ++q) tp_lsa_abort(&ex[q]);
                return st;
            }
        }
        return LF_OK;
    }
    for (int r = 0; r < tp; ++r) {
        CE_CHECK(cudaSetDevice(devs[r]));
        TP_TRY(tp_ce_plan(&args[r], &runs[r], cuda_err));
        if (runs[r].C != runs[0].C) return LF_ERR_ARG;
        TP_TRY(tp_ce_prep(runs[r], streams[r], cuda_err));
    }
    const int64_t K = runs[0].K;
    for (int64_t j = 0; j < K + TP_LAG; ++j) {
        const int64_t kg = j - TP_LAG, ks = j < K ? j : -1;
        for (int r = 0; r < tp; ++r) {
            CE_CHECK(cudaSetDevice(devs[r]));
            if (kg >= 0) TP_TRY(tp_ce_wait_exchange(kg, &ex[r], streams[r], cuda_err));
            TP_TRY(tp_ce_step(runs[r], kg, ks, streams[r], cuda_err));
        }
        if (ks < 0) continue;
        if (ncclGroupStart() != ncclSuccess) return LF_ERR_DEVICE;
        lf_status st = LF_OK;
        for (int r = 0; r < tp && st == LF_OK; ++r) {
            if (cudaSetDevice(devs[r]) != cudaSuccess) st = LF_ERR_DEVICE;
            else st = tp_ce_exchange(runs[r], ks, &ex[r], streams[r], cuda_err);
        }
        if (ncclGroupEnd() != ncclSuccess && st == LF_OK) st = LF_ERR_DEVICE; /* the group is always closed */
        TP_TRY(st);
        for (int r = 0; r < tp; ++r) {
            CE_CHECK(cudaSetDevice(devs[r]));
            TP_TRY(tp_ce_exchange_done(ks, &ex[r], cuda_err));
        }
    }
    for (int r = 0; r < tp; ++r) {
        CE_CHECK(cudaSetDevice(devs[r]));
        TP_TRY(tp_ce_reduce(runs[r], streams[r], cuda_err));
    }
    return LF_OK;
}
#endif

/* Streams and events of an exchange (comm set by the caller); the all-gather exchange until
 * tp_lsa_create gives it a window. */
[[maybe_unused]] static lf_status tp_exchange_create(tp_exchange *ex, cudaError_t *cuda_err)
{
    ex->lsa = 0;
    ex->win_buf = nullptr;
    ex->peers = nullptr;
    ex->lsa_rows = 0;
    ex->gen = 0;
    ex->prof = nullptr;
    ex->grid = 0;
    ex->ctl = ex->ctl_dev = nullptr;
#ifdef TP_HAVE_LSA
    ex->win = nullptr;
#endif
    CE_CHECK(cudaStreamCreateWithFlags(&ex->comm_stream, cudaStreamNonBlocking));
    CE_CHECK(cudaEventCreateWithFlags(&ex->ev_stats, cudaEventDisableTiming));
    CE_CHECK(cudaEventCreateWithFlags(&ex->ev_ag[0], cudaEventDisableTiming));
    CE_CHECK(cudaEventCreateWithFlags(&ex->ev_ag[1], cudaEventDisableTiming));
    return LF_OK;
}

[[maybe_unused]] static void tp_exchange_destroy(tp_exchange *ex)
{
    if (ex->ctl) cudaFreeHost(ex->ctl);
    ex->ctl = ex->ctl_dev = nullptr;
    cudaEventDestroy(ex->ev_stats);
    cudaEventDestroy(ex->ev_ag[0]);
    cudaEventDestroy(ex->ev_ag[1]);
    cudaStreamDestroy(ex->comm_stream);
}

/* The read-once schedules simulated on ONE GPU (the tests; no NCCL needed): tp ranks on the
 * current device, each with its own window (plain device memory, which every rank addresses
 * directly: the peers array is the same for all) and its own blocking stream (the inputs are
 * written on the legacy default stream). run() plans every rank first, then launches each on
 * its stream with at most max_ctas CTAs, so that every rank's CTAs are resident at once (their
 * waits need each other), and waits for them all. */
struct tp_sim_windows {
    int P = 0;
    int64_t max_ctas = 0;
    std::vector<tp_exchange> ex;
    std::vector<cudaStream_t> streams;
    std::vector<char *> win;
    char **peers = nullptr;

    lf_status init(int tp, int64_t rows, cudaError_t *cuda_err)
    {
        int dev = 0, sms = 0;
        CE_CHECK(cudaGetDevice(&dev));
        CE_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        /* a share of the SMs each, less a margin: a cluster needs its SMs in one GPC, and the
         * ranks' clusters must all find room */
        max_ctas = sms / tp - 8;
        if (max_ctas < 1) max_ctas = 1;
        ex.assign(tp, tp_exchange{});
        streams.assign(tp, nullptr);
        win.assign(tp, nullptr);
        const size_t wb = tp_lsa_window_bytes(rows > 0 ? rows : 1, tp);
        for (int r = 0; r < tp; ++r) {
            CE_CHECK(cudaMalloc(&win[r], wb));
            CE_CHECK(cudaMemset(win[r], 0, wb));
        }
        CE_CHECK(cudaMalloc(&peers, sizeof(char *) * (size_t)tp));
        CE_CHECK(cudaMemcpy(peers, win.data(), sizeof(char *) * (size_t)tp, cudaMemcpyHostToDevice));
        for (int r = 0; r < tp; ++r) {
            CE_CHECK(cudaStreamCreate(&streams[r]));
            P = r + 1; /* the destructor frees rank r's stream and exchange from here on */
            TP_TRY(tp_exchange_create(&ex[r], cuda_err));
            TP_TRY(tp_lsa_ctl_create(&ex[r], cuda_err));
            ex[r].lsa = 1;
            ex[r].lsa_rows = rows > 0 ? rows : 1;
            ex[r].win_buf = win[r];
            ex[r].peers = peers;
        }
        return LF_OK;
    }
    /* args: [P], rank r's at args[r]; their max_ctas (0) becomes the share of the SMs. After a
     * failed launch the ranks' generations disagree: every later run() refuses (LF_ERR_DEVICE). */
    bool failed = false;
    /* args: [P], rank r's at args[r], into *a with their max_ctas (0) made the share of the SMs;
     * every rank planned before any launches (run, capture), all on one schedule. */
    lf_status plan(const tp_ce_args *args, std::vector<tp_ce_args> *a, cudaError_t *cuda_err)
    {
        if (failed) return LF_ERR_DEVICE;
        a->assign(args, args + P);
        bool res0 = false;
        for (int r = 0; r < P; ++r) /* all checked before any rank's max_ctas is filled in */
            if ((*a)[r].tp != P || (*a)[r].rank != r || (*a)[r].lsa_schedule != (*a)[0].lsa_schedule || (*a)[r].max_ctas != (*a)[0].max_ctas)
                return LF_ERR_ARG;
        for (int r = 0; r < P; ++r) {
            if ((*a)[r].max_ctas == 0) (*a)[r].max_ctas = max_ctas;
            tp_run run;
            int64_t C = 1;
            TP_TRY(tp_lsa_plan(&(*a)[r], &ex[r], &run, &C, cuda_err));
            if (r == 0) res0 = run.res;
            if (run.res != res0) return LF_ERR_ARG;
        }
        return LF_OK;
    }
    lf_status run(const tp_ce_args *args, cudaError_t *cuda_err)
    {
        std::vector<tp_ce_args> a;
        TP_TRY(plan(args, &a, cuda_err));
        return start([&](int r) { return tp_ce_launch_lsa(&a[r], &ex[r], streams[r], cuda_err); }, cuda_err);
    }
    /* Every rank's launch (or replay) start(r) on its stream, then wait(); a rank that could not
     * start ends the ranks started before it (they would wait for it) and marks this failed. */
    template <class F> lf_status start(const F &one, cudaError_t *cuda_err)
    {
        for (int r = 0; r < P; ++r) {
            const lf_status st = one(r);
            if (st != LF_OK) {
                for (int q = 0; q < r; ++q) tp_lsa_abort(&ex[q]);
                failed = true;
                return st;
            }
        }
        return wait(cuda_err);
    }
    /* Every rank's step captured into a CUDA graph (tp_ce_capture; gs[r] rank r's, each to be
     * replayed on streams[r]); planned as run() plans, nothing runs. Run once before. */
    lf_status capture(const tp_ce_args *args, tp_ce_graph *gs, cudaError_t *cuda_err)
    {
        for (int r = 0; r < P; ++r) gs[r].exec = nullptr;
        std::vector<tp_ce_args> a;
        TP_TRY(plan(args, &a, cuda_err));
        for (int r = 0; r < P; ++r) {
            const lf_status st = tp_ce_capture(&a[r], &ex[r], streams[r], &gs[r], cuda_err);
            if (st != LF_OK) {
                for (int q = 0; q < r; ++q) tp_ce_graph_destroy(&gs[q]);
                return st;
            }
        }
        return LF_OK;
    }
    /* One replay of capture()'s graphs, every rank on its stream at once; then as run(). */
    lf_status replay(const tp_ce_graph *gs, cudaError_t *cuda_err)
    {
        if (failed) return LF_ERR_DEVICE;
        return start([&](int r) { return tp_ce_replay(&gs[r], &ex[r], streams[r], cuda_err); }, cuda_err);
    }
    /* Waits for every rank; LF_ERR_DEVICE where the last launch gave up (tp_lsa_last_failed). */
    lf_status wait(cudaError_t *cuda_err)
    {
        lf_status st = LF_OK;
        for (int r = 0; r < P; ++r) {
            CE_CHECK(cudaStreamSynchronize(streams[r]));
            if (tp_lsa_last_failed(&ex[r])) st = LF_ERR_DEVICE;
        }
        CE_CHECK(cudaGetLastError());
        return st;
    }
    ~tp_sim_windows()
    {
        for (int r = 0; r < P; ++r) {
            cudaStreamSynchronize(streams[r]);
            tp_exchange_destroy(&ex[r]);
            cudaStreamDestroy(streams[r]);
        }
        for (char *w : win)
            if (w) cudaFree(w);
        if (peers) cudaFree(peers);
    }
};

#ifdef TP_HAVE_LSA
__global__ void tp_lsa_peers_kernel(ncclWindow_t w, int P, char **out)
{
    for (int q = threadIdx.x; q < P; q += blockDim.x) out[q] = (char *)ncclGetPeerPointer(w, 0, q);
}

/* The read-once schedule's window, in two parts. tp_lsa_alloc (per rank, on its device):
 * the symmetric buffer (ncclMemAlloc), zeroed. Then every rank calls ncclCommWindowRegister
 * (a collective: inside one ncclGroupStart / End when one thread drives several ranks; see
 * tp_nccl_ranks). tp_lsa_finish (per rank): checks that every rank's memory is reachable by
 * loads and stores (one NVLink domain: NCCL's LSA team is the whole communicator) and maps the
 * peers' bases; on LF_ERR_ARG the caller keeps the all-gather exchange. */
static lf_status tp_lsa_alloc(tp_exchange *ex, int tp, int64_t rows, cudaError_t *cuda_err)
{
    ex->lsa_rows = rows > 0 ? rows : 1;
    const size_t bytes = tp_lsa_window_bytes(ex->lsa_rows, tp);
    if (ncclMemAlloc((void **)&ex->win_buf, bytes) != ncclSuccess) return LF_ERR_DEVICE;
    CE_CHECK(cudaMemset(ex->win_buf, 0, bytes));
    if (!ex->ctl) TP_TRY(tp_lsa_ctl_create(ex, cuda_err));
    else memset(ex->ctl, 0, 4 * sizeof(unsigned)); /* a new window counts from 0: no old abort request or record */
    CE_CHECK(cudaDeviceSynchronize());
    return LF_OK;
}

static lf_status tp_lsa_register(tp_exchange *ex, int tp)
{
    if (tp == 1) return LF_OK; /* one rank: its own buffer is the whole window */
    return ncclCommWindowRegister(ex->comm, ex->win_buf, tp_lsa_window_bytes(ex->lsa_rows, tp), &ex->win,
                                  NCCL_WIN_COLL_SYMMETRIC) == ncclSuccess ? LF_OK : LF_ERR_DEVICE;
}

static lf_status tp_lsa_finish(tp_exchange *ex, int tp, cudaError_t *cuda_err)
{
    if (tp > 1 && (!ex->win || ncclTeamLsa(ex->comm).nRanks != tp)) return LF_ERR_ARG;
    CE_CHECK(cudaMalloc(&ex->peers, sizeof(char *) * (size_t)tp));
    if (tp > 1) {
        tp_lsa_peers_kernel<<<1, 64>>>(ex->win, tp, ex->peers);
        CE_CHECK(cudaGetLastError());
        CE_CHECK(cudaDeviceSynchronize());
    }
    /* this rank's own window by its ordinary address (no detour through the peer mapping) */
    int me = 0;
    if (ncclCommUserRank(ex->comm, &me) != ncclSuccess || me < 0 || me >= tp) return LF_ERR_DEVICE;
    CE_CHECK(cudaMemcpy(ex->peers + me, &ex->win_buf, sizeof(char *), cudaMemcpyHostToDevice));
    ex->gen = 0;
    ex->lsa = 1;
    return LF_OK;
}

/* Per rank, after every rank's stream is idle; ncclCommWindowDeregister is collective like the
 * registration (group it the same way). */
static void tp_lsa_release(tp_exchange *ex)
{
    if (ex->peers) cudaFree(ex->peers);
    if (ex->win_buf) ncclMemFree(ex->win_buf);
    ex->peers = nullptr;
    ex->win_buf = nullptr;
    ex->lsa = 0;
}

/* One process per GPU: every rank calls these (ex->comm set, tp_exchange_create done). After
 * tp_lsa_create, tp_ce_launch(a, ex, ...) runs the read-once schedule for up to `rows` rows. */
static inline lf_status tp_lsa_create(tp_exchange *ex, int tp, int64_t rows, cudaError_t *cuda_err)
{
    TP_TRY(tp_lsa_alloc(ex, tp, rows, cuda_err));
    TP_TRY(tp_lsa_register(ex, tp));
    return tp_lsa_finish(ex, tp, cuda_err);
}

static inline void tp_lsa_destroy(tp_exchange *ex)
{
    if (ex->win) ncclCommWindowDeregister(ex->comm, ex->win);
    ex->win = nullptr;
    tp_lsa_release(ex);
}
#endif

#ifdef LF_HAVE_NCCL
/* One process driving GPUs 0 .. tp-1, one rank each: communicators (ncclCommInitAll), a compute
 * stream and an exchange per rank. The destructor waits for the streams and frees it all, so an
 * early return cannot leak a communicator. */
struct tp_nccl_ranks {
    std::vector<int> devs;
    std::vector<ncclComm_t> comms;
    std::vector<cudaStream_t> streams;
    std::vector<tp_exchange> ex;
    int made = 0; /* ranks whose stream and exchange exist */

    bool windows = false; /* every rank's tp_lsa window registered */
    bool aborted = false; /* abort(): the communicators are gone */

    /* After a failure that may leave NCCL mid-way (a registration group that failed, windows
     * half registered; a step whose collectives some ranks enqueued and others did not), the
     * streams could wait forever and a collective teardown with them: ncclCommAbort needs no
     * peer. Also ends the read-once launches (tp_lsa_abort). The windows go with their
     * communicators (only the buffers are left to free); run() then refuses. */
    void abort()
    {
        for (int r = 0; r < made; ++r) tp_lsa_abort(&ex[r]);
        for (int r = 0; r < (int)comms.size(); ++r) {
            if (comms[r]) ncclCommAbort(comms[r]);
            comms[r] = nullptr;
            if (r < (int)ex.size()) {
                ex[r].comm = nullptr;
#ifdef TP_HAVE_LSA
                ex[r].win = nullptr;
#endif
            }
        }
        windows = false;
        aborted = true;
    }

    /* lsa_rows > 0: also the read-once schedule's windows for up to lsa_rows rows (then
     * ex[r].lsa = 1); LF_ERR_ARG from tp_lsa_finish (GPUs not in one NVLink domain) leaves the
     * all-gathers. */
    lf_status init(int tp, cudaError_t *cuda_err, int64_t lsa_rows = 0)
    {
        devs.resize(tp);
        comms.assign(tp, nullptr);
        streams.assign(tp, nullptr);
        ex.assign(tp, tp_exchange{});
        for (int r = 0; r < tp; ++r) devs[r] = r;
        if (ncclCommInitAll(comms.data(), tp, devs.data()) != ncclSuccess) {
            comms.clear();
            return LF_ERR_DEVICE;
        }
        for (int r = 0; r < tp; ++r) {
            CE_CHECK(cudaSetDevice(r));
            /* a blocking stream: it waits for work on the legacy default stream (the callers'
             * cudaMemset / cudaMemcpy of the inputs) */
            CE_CHECK(cudaStreamCreate(&streams[r]));
            TP_TRY(tp_exchange_create(&ex[r], cuda_err));
            ex[r].comm = comms[r];
            made = r + 1;
        }
        if (lsa_rows <= 0) return LF_OK;
#ifdef TP_HAVE_LSA
        if (tp == 1) { /* one rank: as a process of its own would (tp_lsa_create) */
            CE_CHECK(cudaSetDevice(0));
            return tp_lsa_create(&ex[0], 1, lsa_rows, cuda_err);
        }
        for (int r = 0; r < tp; ++r) {
            CE_CHECK(cudaSetDevice(r));
            TP_TRY(tp_lsa_alloc(&ex[r], tp, lsa_rows, cuda_err));
        }
        lf_status st = LF_OK;
        if (ncclGroupStart() != ncclSuccess) return LF_ERR_DEVICE;
        for (int r = 0; r < tp && st == LF_OK; ++r) {
            if (cudaSetDevice(r) != cudaSuccess) st = LF_ERR_DEVICE;
            else st = tp_lsa_register(&ex[r], tp);
        }
        if (ncclGroupEnd() != ncclSuccess && st == LF_OK) st = LF_ERR_DEVICE;
        if (st != LF_OK) { /* some windows may be registered: their buffers must outlive them */
            abort();
            return st;
        }
        windows = true;
        for (int r = 0; r < tp; ++r) {
            CE_CHECK(cudaSetDevice(r));
            TP_TRY(tp_lsa_finish(&ex[r], tp, cuda_err));
        }
        return LF_OK;
#else
        return LF_ERR_ARG; /* this NCCL has no symmetric windows (2.28 or later needed) */
#endif
    }
    /* A failure other than a refused argument (LF_ERR_ARG, LF_ERR_SIZE: nothing was enqueued)
     * aborts the communicators: make a new tp_nccl_ranks to go on. */
    lf_status run(const tp_ce_args *args, cudaError_t *cuda_err)
    {
        if (aborted) return LF_ERR_DEVICE;
        const lf_status st = tp_ce_nccl(args, (int)devs.size(), devs.data(), ex.data(), streams.data(), cuda_err);
        if (st != LF_OK && st != LF_ERR_ARG && st != LF_ERR_SIZE) abort();
        return st;
    }
    /* Every rank's step captured into a CUDA graph (tp_ce_capture: gs[r] on devs[r], to be
     * replayed on streams[r]: replay()), with the read-once window only (the all-gathers of
     * several GPUs driven by one thread must be grouped, which captures per rank cannot);
     * checked and planned as run() (tp_ce_nccl) does, nothing runs. Run once before. */
    lf_status capture(const tp_ce_args *args, tp_ce_graph *gs, cudaError_t *cuda_err)
    {
        const int P = (int)devs.size();
        for (int r = 0; r < P; ++r) gs[r].exec = nullptr;
        if (aborted) return LF_ERR_DEVICE;
        if (P < 1 || !ex[0].lsa || !tp_ranks_agree(args, P, ex.data())) return LF_ERR_ARG;
        TP_TRY(tp_lsa_plan_ranks(args, P, devs.data(), ex.data(), nullptr, cuda_err));
        for (int r = 0; r < P; ++r) {
            lf_status st = cudaSetDevice(devs[r]) == cudaSuccess ? LF_OK : LF_ERR_DEVICE;
            if (st == LF_OK) st = tp_ce_capture(&args[r], &ex[r], streams[r], &gs[r], cuda_err);
            if (st != LF_OK) {
                for (int q = 0; q < r; ++q) {
                    cudaSetDevice(devs[q]);
                    tp_ce_graph_destroy(&gs[q]);
                }
                return st;
            }
        }
        return LF_OK;
    }
    /* One replay of capture()'s graphs on every rank's stream (then sync()). A replay that could
     * not be launched on some rank aborts the others' (as run()). */
    lf_status replay(const tp_ce_graph *gs, cudaError_t *cuda_err)
    {
        if (aborted) return LF_ERR_DEVICE;
        for (int r = 0; r < (int)devs.size(); ++r) {
            const cudaError_t e = cudaSetDevice(devs[r]);
            const lf_status st = e == cudaSuccess ? tp_ce_replay(&gs[r], &ex[r], streams[r], cuda_err) : LF_ERR_DEVICE;
            if (st != LF_OK) {
                if (e != cudaSuccess && cuda_err) *cuda_err = e;
                abort();
                return st;
            }
        }
        return LF_OK;
    }
    /* Waits for every rank's stream; LF_ERR_DEVICE also where a read-once launch of the last
     * generation gave up (tp_lsa_failure: its outputs are NaN). */
    lf_status sync(cudaError_t *cuda_err)
    {
        lf_status st = LF_OK;
        for (int r = 0; r < made; ++r) {
            CE_CHECK(cudaSetDevice(devs[r]));
            CE_CHECK(cudaStreamSynchronize(streams[r]));
            CE_CHECK(cudaGetLastError());
            if (tp_lsa_last_failed(&ex[r])) st = LF_ERR_DEVICE;
        }
        return st;
    }
    ~tp_nccl_ranks()
    {
        for (int r = 0; r < made; ++r) {
            cudaSetDevice(devs[r]);
            cudaStreamSynchronize(streams[r]);
        }
#ifdef TP_HAVE_LSA
        if (windows) {
            bool ok = ncclGroupStart() == ncclSuccess;
            for (int r = 0; r < made; ++r) {
                cudaSetDevice(devs[r]);
                if (ex[r].win && ncclCommWindowDeregister(comms[r], ex[r].win) != ncclSuccess) ok = false;
            }
            if (ncclGroupEnd() != ncclSuccess) ok = false;
            if (!ok) abort(); /* then no collective teardown below */
        }
        for (int r = 0; r < (int)ex.size(); ++r) {
            cudaSetDevice(devs[r]);
            if (ex.size() == 1) tp_lsa_destroy(&ex[r]);
            else tp_lsa_release(&ex[r]);
        }
#endif
        for (int r = 0; r < made; ++r) {
            cudaSetDevice(devs[r]);
            tp_exchange_destroy(&ex[r]);
            cudaStreamDestroy(streams[r]);
        }
        for (ncclComm_t c : comms)
            if (c) ncclCommDestroy(c);
        cudaSetDevice(0);
    }
};

/* Per-GPU time of the whole step over NCCL: on each rank's stream an event before the step and
 * one after; a run's time is the largest of the ranks' elapsed times (a rank that waits in the
 * all-gather for a slower one counts the wait). Median of `iters` after two warm-up runs. */
static lf_status tp_time_nccl(tp_nccl_ranks &g, const tp_ce_args *args, int iters, double *ms, cudaError_t *cuda_err)
{
    const int P = (int)g.devs.size();
    std::vector<cudaEvent_t> e0(P, nullptr), e1(P, nullptr);
    std::vector<float> t;
    lf_status st = LF_OK;
    for (int r = 0; r < P && st == LF_OK; ++r) {
        if (cudaSetDevice(g.devs[r]) != cudaSuccess || cudaEventCreate(&e0[r]) != cudaSuccess || cudaEventCreate(&e1[r]) != cudaSuccess)
            st = LF_ERR_DEVICE;
    }
    for (int it = 0; st == LF_OK && it < iters + 2; ++it) {
        for (int r = 0; r < P && st == LF_OK; ++r)
            if (cudaSetDevice(g.devs[r]) != cudaSuccess || cudaEventRecord(e0[r], g.streams[r]) != cudaSuccess) st = LF_ERR_DEVICE;
        if (st == LF_OK) st = g.run(args, cuda_err);
        for (int r = 0; r < P && st == LF_OK; ++r)
            if (cudaSetDevice(g.devs[r]) != cudaSuccess || cudaEventRecord(e1[r], g.streams[r]) != cudaSuccess) st = LF_ERR_DEVICE;
        float worst = 0.0f;
        for (int r = 0; r < P && st == LF_OK; ++r) {
            float m = 0.0f;
            if (cudaSetDevice(g.devs[r]) != cudaSuccess || cudaEventSynchronize(e1[r]) != cudaSuccess ||
                cudaEventElapsedTime(&m, e0[r], e1[r]) != cudaSuccess)
                st = LF_ERR_DEVICE;
            worst = m > worst ? m : worst;
        }
        if (st == LF_OK && it >= 2) t.push_back(worst);
    }
    if (st == LF_OK && cuda_err && (*cuda_err = cudaGetLastError()) != cudaSuccess) st = LF_ERR_DEVICE;
    for (int r = 0; r < P; ++r) {
        cudaSetDevice(g.devs[r]);
        if (e0[r]) cudaEventDestroy(e0[r]);
        if (e1[r]) cudaEventDestroy(e1[r]);
    }
    cudaSetDevice(0);
    if (st != LF_OK) return st;
    std::sort(t.begin(), t.end());
    *ms = t[t.size() / 2];
    return LF_OK;
}
/* One process per GPU: the rank of this process over its communicator (made by the caller, e.g.
 * ncclCommInitRank with an id shared by the processes; tp_demo_procs), with its own exchange
 * and a blocking stream (it waits for inputs written on the legacy default stream). This is
 * the plain use of tp_ce_launch: every process calls launch() for its rank with the same
 * arguments but its own shard; the all-gather (or, with lsa_rows > 0, the read-once window)
 * joins them. The destructor waits for the stream and frees what init made; the window's
 * deregistration there is collective (every rank's process must get there, as with NCCL's
 * communicator teardown). */
struct tp_one_rank {
    tp_exchange x{};
    cudaStream_t s = nullptr;
    bool made = false;

    lf_status init(ncclComm_t comm, int tp, int64_t lsa_rows, cudaError_t *cuda_err)
    {
        CE_CHECK(cudaStreamCreate(&s));
        TP_TRY(tp_exchange_create(&x, cuda_err));
        made = true;
        x.comm = comm;
        if (lsa_rows <= 0) return LF_OK;
#ifdef TP_HAVE_LSA
        return tp_lsa_create(&x, tp, lsa_rows, cuda_err);
#else
        (void)tp;
        return LF_ERR_ARG; /* this NCCL has no symmetric windows (2.28 or later needed) */
#endif
    }
    lf_status launch(const tp_ce_args *a, cudaError_t *cuda_err) { return tp_ce_launch(a, &x, s, cuda_err); }
    /* waits for the stream; LF_ERR_DEVICE also where the last read-once launch that took a
     * generation gave up (NaN outputs; a launch without rows takes none, so after a failed
     * launch a rowless one still reports it) */
    lf_status wait(cudaError_t *cuda_err)
    {
        CE_CHECK(cudaStreamSynchronize(s));
        CE_CHECK(cudaGetLastError());
        if (tp_lsa_last_failed(&x)) return LF_ERR_DEVICE;
        return LF_OK;
    }
    /* launch and wait */
    lf_status run(const tp_ce_args *a, cudaError_t *cuda_err)
    {
        TP_TRY(launch(a, cuda_err));
        return wait(cuda_err);
    }
    /* This rank's step captured into a CUDA graph on its stream (tp_ce_capture), with either
     * exchange: the all-gather here is this rank's own collective on its own communicator, so
     * unlike tp_nccl_ranks it is captured too. Every rank's process captures the same step and
     * replays it in step with the others. Run the step once before. */
    lf_status capture(const tp_ce_args *a, tp_ce_graph *g, cudaError_t *cuda_err) { return tp_ce_capture(a, &x, s, g, cuda_err); }
    /* one replay of capture()'s graph, then wait() */
    lf_status replay(const tp_ce_graph *g, cudaError_t *cuda_err)
    {
        TP_TRY(tp_ce_replay(g, &x, s, cuda_err));
        return wait(cuda_err);
    }
    ~tp_one_rank()
    {
        if (s) cudaStreamSynchronize(s);
        if (made) {
#ifdef TP_HAVE_LSA
            tp_lsa_destroy(&x);
#endif
            tp_exchange_destroy(&x);
        }
        if (s) cudaStreamDestroy(s);
    }
};
#endif

/* ============================================================================================
 * 5. Demo and check: tp shards of one batch against the single-GPU cross-entropy of the full
 *    vocabulary (tp_demo_run; the GPU tests call it with many configurations)
 * ========================================================================================== */

typedef struct tp_demo {
    int tp;
    int64_t N, V;
    lf_dtype dt;
    lf_ce_opts opts;      /* class_weights: set to any non-NULL value to use random weights */
    lf_reduction reduction;
    int use_divisor;      /* reduction mean: pass a device divisor (divisor_value) */
    float divisor_value;
    int use_dloss;        /* an upstream gradient (device) */
    float grad_scale;
    int in_place, forward_only, labels_i64;
    int64_t pad;          /* shard row stride = shard columns + pad */
    int64_t chunk_rows;   /* 0: automatic */
    double ignore_frac, bad_frac;
    int edge_labels;      /* labels on the shard boundaries */
    int neg_inf, nan_rows, all_ignored;
    float logit_offset;   /* added to every finite logit (e.g. 1e4 with fp32: |lse| ~ 1e4, where one
                           * float lse would carry ~2^-24 |lse| into every p_j of the gradient;
                           * fp32's gradient is then held to the per-element bound of test_ce_gpu) */
    int fmin_rows;        /* masks at the dtype's lowest finite value (torch.finfo(dtype).min): in
                           * every 13th row from row 3, alternately a whole shard of some rank or
                           * every 11th entry, the label's entry kept */
    int repeat;           /* run 1 + repeat times: every run bit-identical to the first (loss, gradient) */
    int graph;            /* with repeat, the read-once drivers (sim_lsa, or use_nccl with lsa),
                           * or one_rank with either exchange: the repeats replay each rank's step
                           * captured into a CUDA graph after the first run (tp_ce_capture),
                           * alternating with plain launches from the third run on (graph,
                           * launch, graph, ...) */
    int launch_single;    /* tp = 1 only: run tp_ce_launch (the pipelined schedule) instead of
                           * the simulation driver */
    int64_t check_rows;   /* 0: every row; else this many rows (first, last, spread) */
    int use_nccl;
    int lsa;              /* with use_nccl: the read-once schedule over NCCL symmetric windows */
    int one_rank;         /* with use_nccl: one process per GPU (tp_demo_procs): this process
                           * holds rank mp_rank only, on device mp_dev, over its communicator
                           * mp_comm, and runs it with tp_ce_launch (its own exchange, on its own
                           * stream); the reference runs on mp_dev too and only that rank's
                           * shard is checked (the processes compare out_hash) */
    int mp_rank, mp_dev;
#ifdef LF_HAVE_NCCL
    ncclComm_t mp_comm;
#endif
    int lsa_lag, lsa_ctas_per_sm, lsa_hints; /* its knobs (tp_ce_args; 0: defaults) */
    int lsa_schedule;     /* the read-once schedule (tp_ce_args; 0: automatic) */
    int sim_lsa;          /* without use_nccl: the read-once schedules simulated on this GPU, every
                           * rank with its own window and stream (tp_sim_windows) */
    int lsa_prof;         /* with time_iters: also measure the time its CTAs wait (lsa_wait_frac) */
    uint64_t seed;
    int report_memory;    /* opt-in: run the sharded step once more between two cudaMemGetInfo
                           * readings (what it allocates beyond the caller's buffers: nothing) */
    int time_iters;       /* > 0: also time, medians of time_iters, in place. Simulation: rank
                           * 0's step alone (tp_ce_launch, no exchange: the per-GPU work) as
                           * configured, the same pipelined in chunks of a quarter of L2 (with and
                           * without programmatic dependent launch). NCCL: the whole step on every
                           * GPU at once, exchange included (per-GPU time: the slowest rank's),
                           * as configured and in chunks of a quarter of L2. Both: the single-GPU
                           * kernel on the full V (on GPU 0) */
} tp_demo;

typedef struct tp_demo_result {
    lf_status st;
    cudaError_t cuda;
    double loss, loss_ref, loss_err, lse_err, grad_err; /* errors in units of their tolerance */
    double z_err;         /* z_loss_out against the single GPU's, in units of its tolerance */
    int64_t rows_checked, rank_mismatch, nondeterministic;
    int64_t unwritten;    /* loss, z and lse words still holding the poison, every rank */
    int64_t pad_written;  /* gradient padding elements changed (separate gradient), every rank */
    unsigned errors, errors_ref;
    unsigned errors_not_rank0; /* bad labels counted by ranks other than 0 (none should) */
    size_t ws_bytes, shares_bytes, gathered_bytes;
    tp_plan plan;
    double ms_tp, ms_tp_chunked, ms_tp_chunked_nopdl, ms_single; /* with time_iters */
    long long step_alloc_bytes;   /* with report_memory: device memory the step took (free before - after) */
    size_t rank_buffers_bytes;    /* what rank 0's step touches: shard, gradient, workspace, shares */
    int64_t chunked_rows;                                          /* the chunks of ms_tp_chunked */
    double lsa_wait_frac;         /* with lsa_prof: the share of a CTA's time spent waiting for chunks,
                                   * mean over CTAs and ranks */
    int lsa_grid;
    int graph_replays;            /* with graph: the runs that replayed captured graphs */
    unsigned lsa_generation;      /* read-once drivers: rank r0's generation after the runs, as the
                                   * device counted it (tp_lsa_device_generation) */
    uint64_t out_hash;            /* FNV-1a of the checked rank's loss, z-loss and lse outputs: the
                                   * same on every rank (one_rank: compared across the processes) */
    int ok;
} tp_demo_result;

static uint64_t tp_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Logits like a language model's (a bulk of width ~4, rare +-30 outliers), optionally with
 * masked (-inf) entries; |x - offset| <= 30 otherwise. */
template <typename T>
__global__ void tp_gen_logits(T *x, int64_t n, uint64_t seed, int neg_inf, float offset)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = (uint64_t)i * 0x9e3779b97f4a7c15ull ^ seed;
        z = (z ^ (z >> 31)) * 0xbf58476d1ce4e5b9ull;
        z ^= z >> 29;
        const float u = (float)(z >> 40) * (1.0f / 16777216.0f), v = (float)((z >> 16) & 0xffffff) * (1.0f / 16777216.0f);
        float x0 = 4.0f * (u + v - 1.0f);
        if ((z & 0x3ff) == 7) x0 = (z & 0x400) ? 30.0f : -30.0f;
        x0 += offset;
        if (neg_inf && (z & 0x7f) == 9) x0 = -INFINITY;
        x[i] = lf_elem<T>::from_f32(x0);
    }
}

static double tp_elem(const std::vector<char> &h, size_t i, lf_dtype dt)
{
    if (dt == LF_F32) return ((const float *)h.data())[i];
    const uint16_t b = ((const uint16_t *)h.data())[i];
    return dt == LF_BF16 ? lf_bf16_to_f32(b) : lf_f16_to_f32(b);
}

#define TPD_TRY(call)                                                                               \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            res.cuda = e_;                                                                          \
            res.st = LF_ERR_DEVICE;                                                                 \
            return res;                                                                             \
        }                                                                                           \
    } while (0)

/* The demo's graph runs (tp_demo.graph): every share left in a read-once window (both parities:
 * the chunked schedule's shares, the resident slots' values) made NaN; the slots' generations,
 * the flags, failure, done and generation words kept. */
__global__ void tp_demo_poison_window(char *win, int64_t rows, int P)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, t0 = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned *sh = reinterpret_cast<unsigned *>(win);
    const int64_t nsh = (int64_t)(2 * tp_lsa_shares_bytes(rows, P) / 4);
    for (int64_t i = t0; i < nsh; i += stride) sh[i] = 0x7fc00000u;
    lf_tp_slot *sl = reinterpret_cast<lf_tp_slot *>(win + tp_lsa_slots_offset(rows, P, 0));
    const int64_t nsl = 2 * rows * (P - 1);
    for (int64_t i = t0; i < nsl; i += stride)
        for (int k = 0; k < 3; ++k) sl[i].w[k] = (sl[i].w[k] & 0xffffffff00000000ull) | 0x7fc00000ull;
}

static tp_demo_result tp_demo_run(const tp_demo *d)
{
    tp_demo_result res;
    memset(&res, 0, sizeof res);
    res.cuda = cudaSuccess;
    const int P = d->tp;
    const int64_t N = d->N, V = d->V, ign = d->opts.ignore_index;
    const int esz = lf_dtype_size(d->dt);
    const bool nccl = d->use_nccl != 0;
    const bool one = nccl && d->one_rank != 0; /* one process per GPU: this process's rank only */
    /* the rank whose outputs are checked first (one: the only one here), the reference's device */
    const int r0 = one ? d->mp_rank : 0, dev0 = one ? d->mp_dev : 0;
    auto here = [&](int r) { return !one || r == r0; };
    auto dev_of = [&](int r) { return one ? dev0 : nccl ? r : 0; };
    if (one && (r0 < 0 || r0 >= P)) {
        res.st = LF_ERR_ARG;
        return res;
    }
    uint64_t rs = tp_mix(d->seed);
    auto rnd = [&](uint64_t n) { rs = tp_mix(rs); return n ? rs % n : 0; };

    /* labels, weights (host) */
    std::vector<int64_t> lab(N > 0 ? N : 1);
    for (int64_t i = 0; i < N; ++i) {
        const double u = (double)rnd(1u << 30) / (double)(1u << 30);
        lab[i] = (int64_t)rnd((uint64_t)V);
        if (d->edge_labels && i % 5 == 0) { /* first or last column of some shard */
            int64_t a, b;
            lf_tp_shard(V, P, (int)rnd((uint64_t)P), &a, &b);
            if (b > a) lab[i] = rnd(2) ? a : b - 1;
        }
        if (u < d->ignore_frac) lab[i] = ign;
        else if (u < d->ignore_frac + d->bad_frac) lab[i] = rnd(2) ? V + (int64_t)rnd(3) : -5;
        if (d->all_ignored) lab[i] = ign;
    }
    std::vector<float> cw(V);
    for (int64_t j = 0; j < V; ++j) cw[j] = rnd(10) == 0 ? 0.0f : 0.25f + 2.0f * (float)rnd(1000) / 1000.0f;
    const bool weights = d->opts.class_weights != NULL;
    std::vector<int32_t> lab32(N > 0 ? N : 1);
    for (int64_t i = 0; i < N; ++i) lab32[i] = (int32_t)lab[i];

    /* the full logits and the single-GPU reference on device 0 */
    const size_t nel = (size_t)N * V;
    res.gathered_bytes = nel * esz;
    void *xg = NULL, *gref = NULL, *wsr = NULL, *labd = NULL;
    float *cwd0 = NULL, *ref_out = NULL; /* ref_out: loss [N or 1], z, lse [N], divisor, dloss [N] */
    unsigned *erref = NULL;
    const size_t wsrb = ce_workspace_bytes(N);
    const size_t nout = 3 * (size_t)N + 4;
    TPD_TRY(cudaSetDevice(dev0));
    TPD_TRY(cudaMalloc(&xg, nel * esz + 16));
    TPD_TRY(cudaMalloc(&gref, nel * esz + 16));
    TPD_TRY(cudaMalloc(&labd, 8 * (N + 1)));
    TPD_TRY(cudaMalloc(&cwd0, 4 * V));
    TPD_TRY(cudaMalloc(&ref_out, 4 * (nout + N)));
    TPD_TRY(cudaMalloc(&erref, 4));
    TPD_TRY(cudaMalloc(&wsr, wsrb));
    TPD_TRY(cudaMemset(wsr, 0, wsrb));
    TPD_TRY(cudaMemset(erref, 0, 4));
    TPD_TRY(cudaMemset(ref_out, 0, 4 * (nout + N)));
    if (nel) {
        const uint64_t sd = d->seed * 31 + 5;
        const float off = d->logit_offset;
        if (d->dt == LF_F32) tp_gen_logits<float><<<2048, 256>>>((float *)xg, (int64_t)nel, sd, d->neg_inf, off);
        else if (d->dt == LF_BF16) tp_gen_logits<__nv_bfloat16><<<2048, 256>>>((__nv_bfloat16 *)xg, (int64_t)nel, sd, d->neg_inf, off);
        else tp_gen_logits<__half><<<2048, 256>>>((__half *)xg, (int64_t)nel, sd, d->neg_inf, off);
        TPD_TRY(cudaGetLastError());
    }
    if (d->nan_rows)
        for (int64_t i = 5; i < N; i += 17) { /* one NaN in some rows, in a random shard */
            const int64_t j = (int64_t)rnd((uint64_t)V);
            const uint32_t nanv = d->dt == LF_F32 ? 0x7fc00000u : 0x7fc0u;
            TPD_TRY(cudaMemcpy((char *)xg + ((size_t)i * V + j) * esz, &nanv, esz, cudaMemcpyHostToDevice));
        }
    if (d->fmin_rows && N > 3) {
        /* bf16 and fp32's lowest values overflow x log2(e) to -inf (fp16's -65504 does not); a
         * whole shard so masked makes that rank's share m = finfo.min, which the merge must move
         * to the global max without NaN (its terms are exactly 0 there, as in the reference).
         * Every other whole-shard row (k % 4 == 2) has its valid label moved into that shard and
         * masked too: a shard with no mass holding the label (lf_tp_share_from), whose loss is
         * the single GPU's finite (M - z_y) + log S ~ 3.4e38 (+inf with smoothing) */
        const float fm = d->dt == LF_F32 ? -FLT_MAX : d->dt == LF_BF16 ? -3.3895314e38f : -65504.0f;
        const uint16_t fm16 = d->dt == LF_BF16 ? lf_f32_to_bf16(fm) : lf_f32_to_f16(fm);
        std::vector<char> h((size_t)V * esz);
        for (int64_t i = 3; i < N; i += 13) {
            const int64_t k = (i - 3) / 13;
            int64_t a = 0, e = V;
            if (k % 2 == 0) lf_tp_shard(V, P, (int)((k / 2) % P), &a, &e);
            const bool with_label = P > 1 && k % 4 == 2 && lab[i] != ign && lab[i] >= 0 && lab[i] < V && e > a;
            if (with_label) {
                lab[i] = a + (e - a) / 2;
                lab32[i] = (int32_t)lab[i];
            }
            TPD_TRY(cudaMemcpy(h.data(), (char *)xg + (size_t)i * V * esz, V * esz, cudaMemcpyDeviceToHost));
            for (int64_t j = a; j < e; ++j) {
                if ((j == lab[i] && !with_label) || (k % 2 == 1 && j % 11 != 4)) continue;
                if (d->dt == LF_F32) ((float *)h.data())[j] = fm;
                else ((uint16_t *)h.data())[j] = fm16;
            }
            TPD_TRY(cudaMemcpy((char *)xg + (size_t)i * V * esz, h.data(), V * esz, cudaMemcpyHostToDevice));
        }
    }
    TPD_TRY(cudaMemcpy(labd, d->labels_i64 ? (const void *)lab.data() : (const void *)lab32.data(), (d->labels_i64 ? 8 : 4) * N,
                       cudaMemcpyHostToDevice));
    TPD_TRY(cudaMemcpy(cwd0, cw.data(), 4 * V, cudaMemcpyHostToDevice));
    float *const divd0 = ref_out + 3 * N + 2, *const dlossd0 = ref_out + nout;
    {
        std::vector<float> dl(N > 0 ? N : 1);
        for (int64_t i = 0; i < N; ++i) dl[i] = 0.5f + (float)rnd(1000) / 1000.0f;
        TPD_TRY(cudaMemcpy(dlossd0, dl.data(), 4 * N, cudaMemcpyHostToDevice));
        TPD_TRY(cudaMemcpy(divd0, &d->divisor_value, 4, cudaMemcpyHostToDevice));
    }
    ce_args cref = ce_args_default(); /* the reference's arguments (the timing reuses them, in place) */
    {
        ce_args &c = cref;
        c.logits = xg;
        c.dtype = d->dt;
        c.n_rows = N;
        c.vocab = c.stride = V;
        c.labels = labd;
        c.labels_i64 = d->labels_i64;
        c.opts = d->opts;
        c.opts.class_weights = weights ? cwd0 : NULL;
        c.reduction = d->reduction;
        c.divisor = d->use_divisor ? divd0 : NULL;
        c.dloss = d->use_dloss ? dlossd0 : NULL;
        c.grad_scale = d->grad_scale;
        c.grad = d->forward_only ? NULL : gref;
        c.grad_stride = V;
        c.loss = ref_out;
        c.z_loss_out = ref_out + N + 1;
        c.lse = ref_out + 2 * N + 2;
        c.n_errors = erref;
        c.workspace = wsr;
        c.workspace_bytes = wsrb;
        if ((res.st = ce_launch(&c, 0, &res.cuda)) != LF_OK) return res;
        TPD_TRY(cudaGetLastError());
        TPD_TRY(cudaDeviceSynchronize());
    }
    std::vector<float> refh(nout);
    TPD_TRY(cudaMemcpy(refh.data(), ref_out, 4 * nout, cudaMemcpyDeviceToHost));
    TPD_TRY(cudaMemcpy(&res.errors_ref, erref, 4, cudaMemcpyDeviceToHost));
    const size_t nloss = d->reduction == LF_REDUCE_NONE ? (size_t)N : 1;
    res.loss_ref = nloss ? refh[0] : 0.0;

    /* the shards: rank r on device 0 (simulation), device r (NCCL), or only this process's rank */
    std::vector<tp_ce_args> args(P);
    std::vector<void *> xs(P), gs(P), ws(P), lbd(P), dls(P);
    std::vector<float *> outs(P), cwd(P);
    std::vector<unsigned *> errs(P);
    std::vector<lf_tp_share *> shr(P);
    const size_t shb = tp_ce_shares_bytes(N, P);
    res.shares_bytes = shb;
    for (int r = 0; r < P; ++r) {
        if (!here(r)) continue;
        int64_t v0, v1;
        lf_tp_shard(V, P, r, &v0, &v1);
        const int64_t vs = v1 - v0, st = vs + d->pad;
        TPD_TRY(cudaSetDevice(dev_of(r)));
        TPD_TRY(cudaMalloc(&xs[r], (size_t)N * st * esz + 64));
        if (N > 0 && vs > 0)
            TPD_TRY(cudaMemcpy2D(xs[r], st * esz, (char *)xg + v0 * esz, V * esz, vs * esz, N, cudaMemcpyDefault));
        if (!d->in_place && !d->forward_only) TPD_TRY(cudaMalloc(&gs[r], (size_t)N * st * esz + 64));
        TPD_TRY(cudaMalloc(&outs[r], 4 * (3 * N + 4)));
        TPD_TRY(cudaMalloc(&errs[r], 4));
        TPD_TRY(cudaMemset(errs[r], 0, 4));
        const size_t wsb = tp_ce_workspace_bytes(N, vs, d->dt);
        res.ws_bytes = wsb > res.ws_bytes ? wsb : res.ws_bytes;
        TPD_TRY(cudaMalloc(&ws[r], wsb));
        TPD_TRY(cudaMemset(ws[r], 0, wsb));
        if (nccl || r == 0) TPD_TRY(cudaMalloc(&shr[r], shb + 16));
        else shr[r] = shr[0]; /* the simulation's one shares buffer */
        TPD_TRY(cudaMalloc(&lbd[r], 8 * (N + 1)));
        TPD_TRY(cudaMemcpy(lbd[r], d->labels_i64 ? (const void *)lab.data() : (const void *)lab32.data(), (d->labels_i64 ? 8 : 4) * N,
                           cudaMemcpyHostToDevice));
        TPD_TRY(cudaMalloc(&cwd[r], 4 * (V + 1)));
        TPD_TRY(cudaMemcpy(cwd[r], cw.data(), 4 * V, cudaMemcpyHostToDevice));
        TPD_TRY(cudaMalloc(&dls[r], 4 * (N + 2)));
        TPD_TRY(cudaMemcpy(dls[r], dlossd0, 4 * N, cudaMemcpyDefault));
        TPD_TRY(cudaMemcpy((float *)dls[r] + N, &d->divisor_value, 4, cudaMemcpyHostToDevice));
        tp_ce_args &a = args[r];
        a = tp_ce_args_default();
        a.logits = xs[r];
        a.dtype = d->dt;
        a.n_rows = N;
        a.vocab = V;
        a.stride = st;
        a.tp = P;
        a.rank = r;
        a.labels = lbd[r];
        a.labels_i64 = d->labels_i64;
        a.opts = d->opts;
        a.opts.class_weights = weights ? cwd[r] : NULL;
        a.reduction = d->reduction;
        a.divisor = d->use_divisor ? (float *)dls[r] + N : NULL;
        a.dloss = d->use_dloss ? (float *)dls[r] : NULL;
        a.grad_scale = d->grad_scale;
        a.grad = d->forward_only ? NULL : d->in_place ? xs[r] : gs[r];
        a.grad_stride = st;
        a.loss = outs[r];
        a.z_loss_out = outs[r] + N + 1;
        a.lse = outs[r] + 2 * N + 2;
        a.n_errors = errs[r];
        a.shares = shr[r];
        a.shares_bytes = shb;
        a.workspace = ws[r];
        a.workspace_bytes = wsb;
        a.chunk_rows = d->chunk_rows;
        a.lsa_lag = d->lsa_lag;
        a.lsa_ctas_per_sm = d->lsa_ctas_per_sm;
        a.lsa_hints = d->lsa_hints;
        a.lsa_schedule = d->lsa_schedule;
        a.plan = r == r0 ? &res.plan : NULL;
        if (d->graph) a.lsa_timeout_ms = 20000; /* a replay that waited on a stale generation fails, not hangs */
    }
#ifdef LF_HAVE_NCCL
    /* the read-once window: for one row at least, so that a batch without rows still takes the
     * read-once path (as it would in a window made for a user's largest batch); no window, the
     * all-gathers */
    const int64_t win_rows = d->lsa ? (N > 0 ? N : 1) : 0;
    tp_nccl_ranks ranks; /* made once, used by every run and the timing below */
    if (nccl && !one && (res.st = ranks.init(P, &res.cuda, win_rows)) != LF_OK) return res;
    tp_one_rank mpx; /* one: this process's exchange and stream */
    if (one && (res.st = mpx.init(d->mp_comm, P, win_rows, &res.cuda)) != LF_OK) return res;
#endif
    float *bar = nullptr; /* one, graph: the ranks' meeting point between runs (below) */
    if (one && d->graph && d->lsa) {
        TPD_TRY(cudaSetDevice(dev0));
        TPD_TRY(cudaMalloc(&bar, 4));
        TPD_TRY(cudaMemset(bar, 0, 4));
    }
    tp_sim_windows simw; /* sim_lsa: the windows of every rank on this GPU */
    if (!nccl && d->sim_lsa) {
        TPD_TRY(cudaSetDevice(0));
        if ((res.st = simw.init(P, N, &res.cuda)) != LF_OK) return res;
    }
    /* graph: the repeats 1, 3, 5, ... replay every rank's step captured once (made at the first of
     * them; freed on every return, each on its rank's device) */
    const bool graph_ok = d->graph && (one || (nccl ? d->lsa != 0 : d->sim_lsa != 0));
    auto by_graph = [&](int rep) { return graph_ok && rep % 2 == 1; };
    struct tp_graphs {
        std::vector<tp_ce_graph> g; /* [P] once captured (a failed capture leaves every exec NULL) */
        std::vector<int> devs;
        bool made = false;
        ~tp_graphs()
        {
            for (size_t r = 0; r < g.size(); ++r) {
                if (r < devs.size()) cudaSetDevice(devs[r]);
                tp_ce_graph_destroy(&g[r]);
            }
        }
    } graphs;
    for (int r = 0; r < P; ++r) graphs.devs.push_back(dev_of(r));
    /* a graph run with any driver: capture(g) once (g: the [P] graphs), then replay(g) */
    auto graph_run = [&](const auto &capture, const auto &replay) -> lf_status {
        if (!graphs.made) {
            graphs.g.assign(P, tp_ce_graph{nullptr, 0});
            const lf_status st = capture(graphs.g.data());
            if (st != LF_OK) return st;
            graphs.made = true;
        }
        return replay(graphs.g.data());
    };
    /* rank r's read-once exchange, if the driver has one here */
    auto lsa_ex = [&](int r) -> tp_exchange * {
#ifdef LF_HAVE_NCCL
        if (nccl && !one && d->lsa && r < (int)ranks.ex.size()) return &ranks.ex[r];
        if (one && d->lsa && r == r0) return &mpx.x;
#endif
        if (!nccl && d->sim_lsa && r < (int)simw.ex.size()) return &simw.ex[r];
        return nullptr;
    };
    /* poison every output (NaN in every dtype), then run (twice with repeat). The loss, z and lse
     * words get TPD_POISON, a signalling NaN that no arithmetic writes (it would be quieted), so
     * that an unwritten word is told from a NaN output (a NaN row's) below. */
    const uint32_t TPD_POISON = 0x7FBADBADu;
    const std::vector<uint32_t> out_poison(nout, TPD_POISON);
    std::vector<std::vector<char>> first_grad(P);
    std::vector<std::vector<float>> first_out(P);
    for (int rep = 0; rep < 1 + (d->repeat > 0 ? d->repeat : 0); ++rep) {
        for (int r = 0; r < P; ++r) {
            if (!here(r)) continue;
            TPD_TRY(cudaSetDevice(dev_of(r)));
            int64_t v0, v1;
            lf_tp_shard(V, P, r, &v0, &v1);
            if (gs[r]) TPD_TRY(cudaMemset(gs[r], 0xff, (size_t)N * (v1 - v0 + d->pad) * esz));
            if (rep > 0 && d->in_place && !d->forward_only && N > 0 && v1 > v0) /* the logits again: the last run overwrote them */
                TPD_TRY(cudaMemcpy2D(xs[r], (v1 - v0 + d->pad) * esz, (char *)xg + v0 * esz, V * esz, (v1 - v0) * esz, N,
                                     cudaMemcpyDefault));
            TPD_TRY(cudaMemcpy(outs[r], out_poison.data(), 4 * nout, cudaMemcpyHostToDevice));
            TPD_TRY(cudaMemset(errs[r], 0, 4)); /* counted afresh each run */
        }
        /* the shares an earlier launch left in every window made NaN, their generations, flags
         * and done words kept: a launch or replay that took a stale generation (on every rank
         * alike) would take them for this launch's and give NaN outputs; with the inputs
         * unchanged, stale shares would be the same bits. With a process per rank, each poisons
         * its own window, then the ranks meet (an all-reduce on the communicator, waited for):
         * a peer that finished the last run first must not publish this run's shares before. */
        if (graph_ok && rep > 0)
            for (int r = 0; r < P; ++r) {
                const tp_exchange *x = lsa_ex(r);
                if (!x || !here(r)) continue;
                TPD_TRY(cudaSetDevice(dev_of(r)));
                tp_demo_poison_window<<<256, 256>>>(x->win_buf, x->lsa_rows, P);
                TPD_TRY(cudaGetLastError());
                TPD_TRY(cudaDeviceSynchronize());
#ifdef LF_HAVE_NCCL
                if (one) {
                    if (ncclAllReduce(bar, bar, 1, ncclFloat, ncclSum, mpx.x.comm, mpx.s) != ncclSuccess) {
                        res.st = LF_ERR_DEVICE;
                        return res;
                    }
                    TPD_TRY(cudaStreamSynchronize(mpx.s));
                }
#endif
            }
        res.graph_replays += by_graph(rep);
        if (one) {
#ifdef LF_HAVE_NCCL
            if (by_graph(rep)) /* (the other ranks' processes replay theirs in step) */
                res.st = graph_run([&](tp_ce_graph *g) { return mpx.capture(&args[r0], &g[r0], &res.cuda); },
                                   [&](const tp_ce_graph *g) { return mpx.replay(&g[r0], &res.cuda); });
            else res.st = mpx.run(&args[r0], &res.cuda);
            if (res.st != LF_OK) return res;
#else
            res.st = LF_ERR_ARG; /* built without NCCL */
            return res;
#endif
        } else if (nccl) {
#ifdef LF_HAVE_NCCL
            if (by_graph(rep))
                res.st = graph_run([&](tp_ce_graph *g) { return ranks.capture(args.data(), g, &res.cuda); },
                                   [&](const tp_ce_graph *g) { return ranks.replay(g, &res.cuda); });
            else res.st = ranks.run(args.data(), &res.cuda);
            if (res.st != LF_OK) return res;
            if ((res.st = ranks.sync(&res.cuda)) != LF_OK) return res;
#else
            res.st = LF_ERR_ARG; /* built without NCCL */
            return res;
#endif
        } else {
            TPD_TRY(cudaSetDevice(0));
            if (d->sim_lsa && by_graph(rep))
                res.st = graph_run([&](tp_ce_graph *g) { return simw.capture(args.data(), g, &res.cuda); },
                                   [&](const tp_ce_graph *g) { return simw.replay(g, &res.cuda); });
            else if (d->sim_lsa) res.st = simw.run(args.data(), &res.cuda);
            else if (d->launch_single && P == 1) res.st = tp_ce_launch(&args[0], NULL, 0, &res.cuda);
            else res.st = tp_ce_simulate(args.data(), P, 0, &res.cuda);
            if (res.st != LF_OK) return res;
            TPD_TRY(cudaGetLastError());
            TPD_TRY(cudaDeviceSynchronize());
        }
        if (d->repeat) { /* keep every rank's outputs of the first run, compare the later runs' bits
                          * (graph replays included: the last run is a plain launch), and each
                          * run's loss, z and lse across the ranks */
            for (int r = 0; r < P; ++r) {
                if (!here(r)) continue;
                TPD_TRY(cudaSetDevice(dev_of(r)));
                std::vector<float> lo(nout);
                TPD_TRY(cudaMemcpy(lo.data(), outs[r], 4 * nout, cudaMemcpyDeviceToHost));
                int64_t v0, v1;
                lf_tp_shard(V, P, r, &v0, &v1);
                const void *gbuf = d->forward_only ? NULL : d->in_place ? xs[r] : gs[r];
                const size_t gb = gbuf ? (size_t)N * (v1 - v0 + d->pad) * esz : 0;
                std::vector<char> g(gb);
                if (gb) TPD_TRY(cudaMemcpy(g.data(), gbuf, gb, cudaMemcpyDeviceToHost));
                if (rep == 0) {
                    first_out[r] = lo;
                    first_grad[r] = g;
                } else {
                    res.nondeterministic += memcmp(lo.data(), first_out[r].data(), 4 * nout) != 0;
                    res.nondeterministic += gb && memcmp(g.data(), first_grad[r].data(), gb) != 0;
                }
                if (r != r0 && here(r0) && !first_out[r0].empty() && rep == 0)
                    res.rank_mismatch += memcmp(lo.data(), first_out[r0].data(), 4 * nout) != 0;
            }
        }
    }

    if (const tp_exchange *x = lsa_ex(r0)) res.lsa_generation = tp_lsa_device_generation(x);
    /* compare */
    const double unit_r = d->dt == LF_BF16 ? 0x1p-8 : d->dt == LF_F16 ? 0x1p-11 : 0x1p-23;
    const double eps = d->opts.label_smoothing, lam = d->opts.z_loss, scale = d->opts.logit_scale;
    const double zabs = (30.0 + fabs((double)d->logit_offset)) * fabs(scale);
    const double zmax = d->opts.softcap > 0.0f ? fmin(zabs, (double)d->opts.softcap) : zabs;
    double W = 0.0;
    for (int64_t j = 0; j < V; ++j) W += weights ? cw[j] : 1.0;
    std::vector<float> dlh(N > 0 ? N : 1);
    TPD_TRY(cudaSetDevice(dev0));
    TPD_TRY(cudaMemcpy(dlh.data(), dlossd0, 4 * N, cudaMemcpyDeviceToHost));
    double divisor = 0.0;
    for (int64_t i = 0; i < N; ++i)
        if (lab[i] != ign && lab[i] >= 0 && lab[i] < V) divisor += weights ? cw[lab[i]] : 1.0;
    if (d->reduction == LF_REDUCE_MEAN && d->use_divisor) divisor = d->divisor_value;
    /* per row: both lse's are fp32 sums of MUFU exponentials in different orders: apart by at
     * most 2^-20 (1 + |lse|) (measured well below); the loss by its coefficients times that
     * plus its own rounding (and, with smoothing, the cancellation in W lse - sum w z: 2^-20 of
     * eps W zmax / V) */
    std::vector<double> tol_row(N > 0 ? N : 1, 0.0), tolz_row(N > 0 ? N : 1, 0.0);
    double tol_sum = 0.0, tolz_sum = 0.0;
    for (int64_t i = 0; i < N; ++i) {
        if (lab[i] == ign || lab[i] < 0 || lab[i] >= V) continue;
        const double L = fabs(refh[2 * N + 2 + i]) < INFINITY ? fabs(refh[2 * N + 2 + i]) : 0.0;
        const double wy = weights ? cw[lab[i]] : 1.0, A = (1.0 - eps) * wy + eps * W / V;
        tol_row[i] = (A + 2.0 * lam * L) * 0x1p-20 * (1.0 + L) + 0x1p-21 * (A * (L + zmax) + lam * L * L) +
                     0x1p-20 * eps * W * zmax / V + 1e-30;
        tol_sum += tol_row[i] * (d->use_dloss && d->reduction == LF_REDUCE_NONE ? 1.0 : 1.0);
        /* the z-loss term lam lse^2: the lse's error (its check's tolerance, 2^-20 (1 + L)) times
         * 2 lam L, plus fp32's rounding of the product */
        const double dl = 0x1p-20 * (1.0 + L);
        tolz_row[i] = lam * (2.0 * L * dl + dl * dl) + 0x1p-22 * lam * L * L + 1e-30;
        tolz_sum += tolz_row[i];
    }
    const double red_div = d->reduction == LF_REDUCE_MEAN ? (divisor != 0.0 ? fabs(divisor) : INFINITY) : 1.0;
    std::vector<float> oh(nout), o0(nout);
    int64_t v00, v01;
    lf_tp_shard(V, P, r0, &v00, &v01);
    for (int r = 0; r < P; ++r) {
        if (!here(r)) continue;
        TPD_TRY(cudaSetDevice(dev_of(r)));
        TPD_TRY(cudaDeviceSynchronize());
        unsigned e;
        TPD_TRY(cudaMemcpy(&e, errs[r], 4, cudaMemcpyDeviceToHost));
        if (r == 0) res.errors += e;
        else res.errors_not_rank0 += e;
        TPD_TRY(cudaMemcpy(oh.data(), outs[r], 4 * nout, cudaMemcpyDeviceToHost));
        if (r == r0) o0 = oh;
        /* every word of loss, z and lse written (the NaN comparisons below cannot tell) */
        auto poisoned = [&](size_t q) {
            uint32_t b;
            memcpy(&b, &oh[q], 4);
            return b == TPD_POISON;
        };
        for (size_t q = 0; q < nloss; ++q) res.unwritten += poisoned(q) + poisoned(N + 1 + q);
        for (int64_t i = 0; i < N; ++i) res.unwritten += poisoned(2 * N + 2 + i);
        /* every rank holds the same bits: loss, z, lse */
        if (memcmp(oh.data(), o0.data(), 4 * nout) != 0 && r > 0) ++res.rank_mismatch; /* all poisoned alike first */
        if (r == r0) {
            res.loss = nloss ? oh[0] : 0.0;
            for (size_t q = 0; q < nloss; ++q) {
                const double want = refh[q], got = oh[q];
                const double tl = d->reduction == LF_REDUCE_NONE ? tol_row[q] : tol_sum / red_div + 0x1p-22 * fabs(want) + 1e-30;
                res.loss_err = fmax(res.loss_err, lf_check_err(got, want, tl));
                /* z_loss_out, shaped like the loss: lam lse^2 of the same rows */
                const double zw = refh[N + 1 + q], zg = oh[N + 1 + q];
                const double tz = d->reduction == LF_REDUCE_NONE ? tolz_row[q] : tolz_sum / red_div + 0x1p-22 * fabs(zw) + 1e-30;
                res.z_err = fmax(res.z_err, lf_check_err(zg, zw, tz));
            }
            for (int64_t i = 0; i < N; ++i) {
                const double want = refh[2 * N + 2 + i], got = oh[2 * N + 2 + i];
                const double tl = 0x1p-20 * (1.0 + (fabs(want) < INFINITY ? fabs(want) : 0.0));
                res.lse_err = fmax(res.lse_err, lf_check_err(got, want, tl));
            }
        }
        if (d->forward_only) continue;
        /* gradient rows against the unsharded ones, column by column */
        int64_t v0, v1;
        lf_tp_shard(V, P, r, &v0, &v1);
        const int64_t vs = v1 - v0, st = vs + d->pad;
        if (vs == 0) continue;
        std::vector<char> gh((size_t)st * esz), rh((size_t)V * esz), xh((size_t)V * esz);
        /* fp32 without a softcap: both kernels take p_j against their row maximum (the global one
         * for the shards: lf_grad_coef_onto_max_for), so each p_j's error is relative to |z_j -
         * m| <= |z_j - lse| + log V, not to |lse| (test_ce_gpu's per-element bound, once for each
         * kernel; both see the same fp32 z_j = x_j scale) */
        const bool tight = d->dt == LF_F32 && d->opts.softcap == 0.0f;
        const double logV = log((double)V + 1.0);
        const int64_t nchk = d->check_rows > 0 && d->check_rows < N ? d->check_rows : N;
        for (int64_t c = 0; c < nchk; ++c) {
            const int64_t i = nchk == N ? c : (c == nchk - 1 ? N - 1 : c * (N / nchk));
            if (r == r0) ++res.rows_checked;
            TPD_TRY(cudaMemcpy(gh.data(), (char *)(d->in_place ? xs[r] : gs[r]) + (size_t)i * st * esz, st * esz, cudaMemcpyDefault));
            /* a separate gradient's padding columns keep their poison (0xff bytes) */
            if (!d->in_place)
                for (int64_t j = vs; j < st; ++j) {
                    bool kept = true;
                    for (int q = 0; q < esz; ++q) kept = kept && (unsigned char)gh[(size_t)j * esz + q] == 0xffu;
                    res.pad_written += !kept;
                }
            TPD_TRY(cudaMemcpy(rh.data(), (char *)gref + (size_t)i * V * esz, V * esz, cudaMemcpyDefault));
            if (tight) TPD_TRY(cudaMemcpy(xh.data(), (char *)xg + (size_t)i * V * esz, V * esz, cudaMemcpyDefault));
            const bool valid = lab[i] != ign && lab[i] >= 0 && lab[i] < V;
            const double L = valid && fabs(refh[2 * N + 2 + i]) < INFINITY ? fabs(refh[2 * N + 2 + i]) : 0.0;
            /* the gradient's scale: upstream x grad_scale / divisor x logit scale; its smoothing
             * term e w_j and label term b (section 6 of lossfuse_cuda.cuh) */
            double gsc = d->grad_scale * (d->use_dloss ? dlh[d->reduction == LF_REDUCE_NONE ? i : 0] : 1.0) * scale;
            if (d->reduction == LF_REDUCE_MEAN) gsc = divisor == 0.0 ? 0.0 : gsc / divisor;
            const double wy = valid && weights ? cw[lab[i]] : 1.0;
            const double rho = 0x1p-20 * (1.0 + L) + 0x1p-21, lse = refh[2 * N + 2 + i];
            /* z-loss: p_j's factor 1 + 2 lam lse, with the two kernels' lse apart by up to 2^-20 (1 + L) */
            const double rho_z = 2.0 * lam * 0x1p-20 * (1.0 + L);
            for (int64_t j = 0; j < vs; ++j) {
                const double g = tp_elem(gh, j, d->dt), want = tp_elem(rh, v0 + j, d->dt);
                const double zj = tight ? (double)((float)tp_elem(xh, v0 + j, d->dt) * scale) : 0.0;
                const double rho_j = tight && fabs(lse) < INFINITY && fabs(zj) < INFINITY
                                         ? fmin(rho, 2.0 * (1e-6 + 0x1p-22 * (4.0 + fabs(zj - lse) + logV)) + rho_z)
                                         : rho;
                const double e = fabs(gsc) * eps / V * (weights ? cw[v0 + j] : 1.0);
                const double b = (v0 + j == lab[i]) ? fabs(gsc) * (1.0 - eps) * wy : 0.0;
                /* two roundings to the dtype, the lse difference on the p_j term (which may
                 * cancel against e and b: bounded by their sizes), fp16's subnormal step */
                const double tl = 2.0 * unit_r * fmax(fabs(g), fabs(want)) + rho_j * (fabs(want) + 2.0 * e + b) +
                                  (d->dt == LF_F16 ? 0x1p-24 : 0.0) + 1e-30;
                res.grad_err = fmax(res.grad_err, lf_check_err(g, want, tl));
            }
        }
    }
    res.out_hash = 0xcbf29ce484222325ull;
    for (size_t q = 0; q < 4 * nout; ++q) res.out_hash = (res.out_hash ^ ((const unsigned char *)o0.data())[q]) * 0x100000001b3ull;
    /* rank 0 counts the bad labels: a process holding another rank counts none */
    const unsigned errors_want = r0 == 0 ? res.errors_ref : 0u;
    res.ok = res.st == LF_OK && res.loss_err <= 1.0 && res.z_err <= 1.0 && res.lse_err <= 1.0 && res.grad_err <= 1.0 &&
             res.rank_mismatch == 0 && res.nondeterministic == 0 && res.unwritten == 0 && res.pad_written == 0 &&
             res.errors == errors_want && res.errors_not_rank0 == 0 &&
             (!d->graph || res.graph_replays == (d->repeat + 1) / 2);
    if (d->report_memory && !nccl) {
        size_t f0 = 0, f1 = 0, tot = 0;
        TPD_TRY(cudaSetDevice(0));
        TPD_TRY(cudaDeviceSynchronize());
        TPD_TRY(cudaMemGetInfo(&f0, &tot));
        if ((res.st = tp_ce_simulate(args.data(), P, 0, &res.cuda)) != LF_OK) return res;
        TPD_TRY(cudaDeviceSynchronize());
        TPD_TRY(cudaMemGetInfo(&f1, &tot));
        res.step_alloc_bytes = (long long)f0 - (long long)f1;
        const size_t shard = (size_t)N * (v01 - v00 + d->pad) * esz;
        res.rank_buffers_bytes = shard * (d->in_place || d->forward_only ? 1 : 2) + res.ws_bytes + res.shares_bytes;
    }
    if (d->time_iters > 0 && !nccl && !d->sim_lsa && N > 0) {
        /* timings (the data is overwritten in place: the values no longer matter) */
        TPD_TRY(cudaSetDevice(0));
        auto time_it = [&](auto &&step, double *ms) { return ce_time_median(step, d->time_iters, ms); };
        for (int r = 0; r < P; ++r) args[r].grad = d->forward_only ? NULL : xs[r];
        args[0].plan = NULL;
        if ((res.st = time_it([&]() { return tp_ce_launch(&args[0], NULL, 0, &res.cuda); }, &res.ms_tp)) != LF_OK) return res;
        /* chunks of a quarter of L2 (the shares' layout changes with the chunks: simulate first) */
        int l2 = 0;
        TPD_TRY(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
        res.chunked_rows = (int64_t)l2 / 4 / ((v01 - v00 > 0 ? v01 - v00 : 1) * esz);
        if (res.chunked_rows < 1) res.chunked_rows = 1;
        for (int r = 0; r < P; ++r) args[r].chunk_rows = res.chunked_rows;
        if ((res.st = tp_ce_simulate(args.data(), P, 0, &res.cuda)) != LF_OK) return res;
        if ((res.st = time_it([&]() { return tp_ce_launch(&args[0], NULL, 0, &res.cuda); }, &res.ms_tp_chunked)) != LF_OK)
            return res;
        args[0].no_pdl = 1;
        if ((res.st = time_it([&]() { return tp_ce_launch(&args[0], NULL, 0, &res.cuda); }, &res.ms_tp_chunked_nopdl)) != LF_OK)
            return res;
        ce_args c = cref;
        c.grad = d->forward_only ? NULL : xg;
        if ((res.st = time_it([&]() { return ce_launch(&c, 0, &res.cuda); }, &res.ms_single)) != LF_OK) return res;
        TPD_TRY(cudaGetLastError());
    }
#ifdef LF_HAVE_NCCL
    if (d->time_iters > 0 && one && N > 0) {
        /* this rank's whole step, exchange included (the other processes' ranks run theirs at
         * the same time: their collectives keep the steps in step, so a rank waiting for a slower
         * one counts the wait), then the single-GPU kernel on the full V on this GPU; in place */
        TPD_TRY(cudaSetDevice(dev0));
        args[r0].grad = d->forward_only ? NULL : xs[r0];
        args[r0].plan = NULL;
        if ((res.st = ce_time_median([&]() { return mpx.launch(&args[r0], &res.cuda); }, d->time_iters, &res.ms_tp)) != LF_OK)
            return res;
        res.lsa_grid = mpx.x.grid;
        ce_args c = cref;
        c.grad = d->forward_only ? NULL : xg;
        if ((res.st = ce_time_median([&]() { return ce_launch(&c, 0, &res.cuda); }, d->time_iters, &res.ms_single)) != LF_OK)
            return res;
        TPD_TRY(cudaGetLastError());
    }
    if (d->time_iters > 0 && nccl && !one && N > 0) {
        /* the whole step on every GPU at once, the exchange included (default plan, then chunks of
         * a quarter of L2), and the single-GPU kernel on the full V on GPU 0; in place */
        for (int r = 0; r < P; ++r) args[r].grad = d->forward_only ? NULL : xs[r];
        args[0].plan = NULL;
        std::vector<unsigned long long *> prof(P, nullptr);
        if (d->lsa && d->lsa_prof)
            for (int r = 0; r < P; ++r) {
                TPD_TRY(cudaSetDevice(r));
                TPD_TRY(cudaMalloc(&prof[r], 16));
                TPD_TRY(cudaMemset(prof[r], 0, 16));
                ranks.ex[r].prof = prof[r];
            }
        if ((res.st = tp_time_nccl(ranks, args.data(), d->time_iters, &res.ms_tp, &res.cuda)) != LF_OK) return res;
        res.lsa_grid = ranks.ex[0].grid;
        if (d->lsa && d->lsa_prof) {
            double ns = 0.0, cta_ns = 0.0;
            for (int r = 0; r < P; ++r) {
                unsigned long long h[2];
                TPD_TRY(cudaSetDevice(r));
                TPD_TRY(cudaMemcpy(h, prof[r], 16, cudaMemcpyDeviceToHost));
                TPD_TRY(cudaFree(prof[r]));
                ranks.ex[r].prof = nullptr;
                ns += (double)h[0];
                /* the waiters: each CTA (chunked), each warp group of a CTA (resident) */
                cta_ns += (double)ranks.ex[r].grid * (res.plan.resident ? tp_res_xchg::groups : 1) * (d->time_iters + 2) * res.ms_tp * 1e6;
            }
            res.lsa_wait_frac = cta_ns > 0.0 ? ns / cta_ns : 0.0;
        }
        if (!d->lsa) { /* the all-gathers pipelined in chunks (the read-once schedule is chunked already) */
            int l2 = 0;
            TPD_TRY(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, 0));
            res.chunked_rows = (int64_t)l2 / 4 / ((v01 - v00 > 0 ? v01 - v00 : 1) * esz);
            if (res.chunked_rows < 1) res.chunked_rows = 1;
            for (int r = 0; r < P; ++r) args[r].chunk_rows = res.chunked_rows;
            if ((res.st = tp_time_nccl(ranks, args.data(), d->time_iters, &res.ms_tp_chunked, &res.cuda)) != LF_OK) return res;
        }
        TPD_TRY(cudaSetDevice(0));
        ce_args c = cref;
        c.grad = d->forward_only ? NULL : xg;
        if ((res.st = ce_time_median([&]() { return ce_launch(&c, 0, &res.cuda); }, d->time_iters, &res.ms_single)) != LF_OK)
            return res;
        TPD_TRY(cudaGetLastError());
    }
#endif
    for (int r = 0; r < P; ++r) {
        if (!here(r)) continue;
        TPD_TRY(cudaSetDevice(dev_of(r)));
        for (void *q : {xs[r], gs[r], (void *)outs[r], (void *)errs[r], ws[r], lbd[r], (void *)cwd[r], dls[r]})
            if (q) TPD_TRY(cudaFree(q));
        if (nccl || r == 0) TPD_TRY(cudaFree(shr[r]));
    }
    TPD_TRY(cudaSetDevice(dev0));
    for (void *q : {xg, gref, wsr, labd, (void *)cwd0, (void *)ref_out, (void *)erref, (void *)bar})
        if (q) TPD_TRY(cudaFree(q));
    return res;
}
#undef TPD_TRY

#ifdef LF_HAVE_NCCL
/* One rank of a tp_demo over its own communicator (one process, or one thread, per GPU): GPU
 * `rank`, ncclCommInitRank with the id the ranks share, tp_demo_run holding that rank alone
 * (one_rank), then the communicator destroyed (aborted after a failure: a peer may be left
 * mid-collective). LF_ERR_DEVICE where the GPU or the communicator could not be had. */
[[maybe_unused]] static tp_demo_result tp_demo_run_rank(const tp_demo *d, const ncclUniqueId &id, int rank)
{
    tp_demo_result r;
    memset(&r, 0, sizeof r);
    r.st = LF_ERR_DEVICE;
    ncclComm_t comm = nullptr;
    if ((r.cuda = cudaSetDevice(rank)) != cudaSuccess || ncclCommInitRank(&comm, d->tp, id, rank) != ncclSuccess) return r;
    tp_demo e = *d;
    e.one_rank = 1;
    e.mp_rank = e.mp_dev = rank;
    e.mp_comm = comm;
    r = tp_demo_run(&e);
    if (r.st == LF_OK) ncclCommDestroy(comm);
    else ncclCommAbort(comm);
    return r;
}
#endif

/* ============================================================================================
 * 6. main: one configuration, checked, with the memory it takes
 * ========================================================================================== */
#ifndef TP_NO_MAIN
/* No device: the shares at work on the host (one row of V = 6 over tp = 3), said plainly. */
static int tp_host_demo(void)
{
    const float x[6] = {1.0f, 3.0f, -2.0f, 0.5f, 3.0f, 0.0f};
    lf_tp_share g[3];
    printf("no CUDA device found: one row of V = 6 over tp = 3 on the host only\n");
    for (int r = 0; r < 3; ++r) {
        int64_t v0, v1;
        lf_tp_acc acc = lf_tp_acc_init();
        lf_tp_shard(6, 3, r, &v0, &v1);
        for (int64_t j = v0; j < v1; ++j) lf_tp_acc_push(&acc, x[j], 1.0f, j == 4, 0);
        g[r] = lf_tp_share_make(acc, 1.0f, (float)(v1 - v0), 6, 0.0f);
        printf("rank %d: columns [%lld, %lld) share m=%g s=%g t=%g\n", r, (long long)v0, (long long)v1, g[r].m, g[r].s, g[r].t);
    }
    float lse;
    const float loss = lf_tp_loss(lf_tp_merge(g, 1, 3, 0, 4, 1.0f, NULL, 6, 0.0f), 0.0f, &lse);
    const lf_ce_opts o = lf_ce_opts_default();
    const lf_ce_row ref = lf_ref_ce_row(x, 6, 4, &o, NULL);
    printf("merged: lse %.7f, loss %.7f (label 4); unsharded reference: lse %.7f, loss %.7f\n", lse, loss, ref.lse, ref.loss);
    return 0;
}

#ifdef LF_HAVE_NCCL
/* Modes mp / mplsa: one process per GPU, as a training job runs (here forked from this one; a
 * launcher such as torchrun or mpirun would start them instead). Rank 0's process makes the
 * NCCL id and hands it over through shared memory, every process calls ncclCommInitRank and
 * runs tp_demo_run for its rank alone (tp_demo.one_rank: tp_ce_launch over its own exchange),
 * and reports back here; the loss / lse bits of the ranks are compared by hash. The parent
 * itself never initialises CUDA (a process that forks children using CUDA must not). */
typedef struct tp_proc_report {
    int done;
    char device[256];
    tp_demo_result res;
} tp_proc_report;

typedef struct tp_procs_shared {
    ncclUniqueId id;
    int id_state; /* 0: not yet, 1: ready, -1: ncclGetUniqueId failed */
    tp_proc_report rep[TP_MAX_RANKS];
} tp_procs_shared;

/* The number of devices, asked in a child process (so that this one stays without CUDA); -1 if
 * the child could not run. */
static int tp_probe_devices(void)
{
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        int n = 0;
        if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
        _exit(n > 100 ? 100 : n);
    }
    int wst = 0;
    if (waitpid(pid, &wst, 0) != pid || !WIFEXITED(wst)) return -1;
    return WEXITSTATUS(wst);
}

[[noreturn]] static void tp_proc_rank(const tp_demo &d, tp_procs_shared *sh, int rank)
{
    if (rank == 0) {
        const bool ok = ncclGetUniqueId(&sh->id) == ncclSuccess;
        __atomic_store_n(&sh->id_state, ok ? 1 : -1, __ATOMIC_RELEASE);
        if (!ok) _exit(2);
    } else {
        while (__atomic_load_n(&sh->id_state, __ATOMIC_ACQUIRE) == 0) usleep(1000); /* the parent's deadline bounds it */
        if (sh->id_state < 0) _exit(2);
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, rank) == cudaSuccess) snprintf(sh->rep[rank].device, sizeof sh->rep[rank].device, "%s", prop.name);
    const tp_demo_result r = tp_demo_run_rank(&d, sh->id, rank);
    sh->rep[rank].res = r;
    __atomic_store_n(&sh->rep[rank].done, 1, __ATOMIC_RELEASE);
    _exit(r.ok && r.st == LF_OK ? 0 : 1); /* (st: a timing run after the checks may have failed) */
}

/* The parent: the processes, a deadline (a rank stuck in a collective whose peer failed is
 * killed, not waited for), the reports. */
static int tp_demo_procs(const tp_demo *d, const char *mode, int timeout_s)
{
    const int ndev = tp_probe_devices();
    if (ndev < 0) {
        fprintf(stderr, "%s mode: could not start a process to count the devices\n", mode);
        return 1;
    }
    if (ndev == 0) return tp_host_demo();
    if (d->tp < 1 || d->tp > ndev || d->tp > TP_MAX_RANKS) {
        fprintf(stderr, "%s mode: tp = %d ranks need %d GPUs (one process each), %d visible\n", mode, d->tp, d->tp, ndev);
        return 1;
    }
    tp_procs_shared *sh = (tp_procs_shared *)mmap(NULL, sizeof(tp_procs_shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    memset(sh, 0, sizeof *sh);
    std::vector<pid_t> pids(d->tp, -1);
    std::vector<int> status(d->tp, -1); /* exit codes; -2 killed at the deadline, -3 died */
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < d->tp; ++r) {
        const pid_t pid = fork();
        if (pid == 0) tp_proc_rank(*d, sh, r);
        if (pid < 0) {
            perror("fork");
            if (r == 0) return 1;
            /* the ranks started wait for this one in ncclCommInitRank: the deadline ends them */
            break;
        }
        pids[r] = pid;
    }
    const time_t t_end = time(NULL) + timeout_s;
    for (int left = d->tp; left > 0;) {
        int wst = 0;
        const pid_t p = waitpid(-1, &wst, WNOHANG);
        if (p > 0) {
            for (int r = 0; r < d->tp; ++r)
                if (pids[r] == p) {
                    status[r] = WIFEXITED(wst) ? WEXITSTATUS(wst) : -3;
                    pids[r] = -1;
                    --left;
                }
            continue;
        }
        if (p < 0) break; /* no children left */
        if (time(NULL) > t_end) {
            for (int r = 0; r < d->tp; ++r)
                if (pids[r] > 0) {
                    kill(pids[r], SIGKILL);
                    waitpid(pids[r], NULL, 0);
                    status[r] = -2;
                }
            break;
        }
        usleep(10000);
    }
    bool ok = true, same = true;
    double ms_tp = 0.0;
    const tp_demo_result &r0 = sh->rep[0].res;
    printf("device: %s  tp=%d (one process per GPU, %s)  N=%lld  V=%lld bf16, smoothing 0.1, z-loss 1e-4, 10%% ignored, in place\n",
           sh->rep[0].device[0] ? sh->rep[0].device : "?", d->tp, d->lsa ? "NCCL symmetric windows, read once" : "NCCL all-gather",
           (long long)d->N, (long long)d->V);
    for (int r = 0; r < d->tp; ++r) {
        const tp_proc_report &q = sh->rep[r];
        if (status[r] == -2) printf("rank %d: killed at the %d s deadline\n", r, timeout_s);
        else if (!q.done) printf("rank %d: exited (%d) before its report\n", r, status[r]);
        else
            printf("rank %d (%s): %s%s%s; loss %.7f (%.3f of tolerance), z-loss %.3f, lse worst %.3f, gradient worst %.3f (%lld rows), "
                   "bad labels %u\n",
                   r, q.device, lf_status_str(q.res.st), q.res.st == LF_OK ? "" : " / ", q.res.st == LF_OK ? "" : cudaGetErrorString(q.res.cuda),
                   q.res.loss, q.res.loss_err, q.res.z_err, q.res.lse_err, q.res.grad_err, (long long)q.res.rows_checked, q.res.errors);
        ok = ok && q.done && q.res.ok && q.res.st == LF_OK && status[r] == 0;
        same = same && q.done && q.res.out_hash == r0.out_hash;
        if (q.done && q.res.ms_tp > ms_tp) ms_tp = q.res.ms_tp;
    }
    ok = ok && same;
    printf("loss %.7f, single GPU %.7f; every rank the same bits: %s; bad labels %u (single GPU %u)\n", r0.loss, r0.loss_ref,
           same ? "yes" : "NO", r0.errors, r0.errors_ref);
    if (d->graph)
        printf("CUDA graphs: rank 0 replayed its captured step in %d of %d runs, every run the first run's bits: %s\n",
               r0.graph_replays, 1 + d->repeat, r0.nondeterministic ? "NO" : "yes");
    printf("memory per rank: workspace %zu B + shares %zu B; gathering the logits instead would take %zu B\n", r0.ws_bytes,
           r0.shares_bytes, r0.gathered_bytes);
    if (d->time_iters && sh->rep[0].done && r0.ms_single > 0.0)
        printf("time: per-GPU step %.3f ms (the slowest rank's median, exchange included); single GPU, full V: %.3f ms; ratio %.3f\n",
               ms_tp, r0.ms_single, ms_tp / r0.ms_single);
    munmap(sh, sizeof *sh);
    printf("%s\n", ok ? "OK" : "MISMATCH");
    return ok ? 0 : 1;
}
#endif

int main(int argc, char **argv)
{
    tp_demo d;
    memset(&d, 0, sizeof d);
    d.tp = argc > 1 ? atoi(argv[1]) : 2;
    d.N = argc > 2 ? atoll(argv[2]) : 2048;
    d.V = argc > 3 ? atoll(argv[3]) : 151936;
    const char *mode = argc > 4 ? argv[4] : "sim";
    const bool procs = !strcmp(mode, "mp") || !strcmp(mode, "mplsa");
    d.use_nccl = procs || !strcmp(mode, "nccl") || !strcmp(mode, "lsa");
    d.lsa = !strcmp(mode, "lsa") || !strcmp(mode, "mplsa");
    d.sim_lsa = !strcmp(mode, "simlsa");
    const char *bad_opt = nullptr;
    for (int i = 5; i < argc; ++i) {
        if (!strcmp(argv[i], "mem")) d.report_memory = 1;
        else if (!strcmp(argv[i], "graph")) d.graph = 1;
        else bad_opt = argv[i];
    }
    /* graph: each rank's step captured (after a plain first run), replayed in runs 1 and 3 */
    if (d.graph) d.repeat = 4;
    if ((strcmp(mode, "sim") && !d.sim_lsa && !d.use_nccl) || bad_opt || (d.graph && !d.sim_lsa && !d.lsa && !procs)) {
        fprintf(stderr, "usage: %s [tp] [N] [V] [sim|simlsa|nccl|lsa|mp|mplsa] [mem] [graph]  (mode '%s'%s%s; graph: with simlsa, "
                "lsa, mp or mplsa)\n", argv[0], mode, bad_opt ? ", unknown option " : "", bad_opt ? bad_opt : "");
        return 2;
    }
    if (d.tp < 1 || d.N < 0 || d.V < 1) {
        fprintf(stderr, "tp >= 1, N >= 0 and V >= 1 please (tp = %d, N = %lld, V = %lld)\n", d.tp, (long long)d.N, (long long)d.V);
        return 2;
    }
    d.dt = LF_BF16;
    d.opts = lf_ce_opts_default();
    d.opts.label_smoothing = 0.1f;
    d.opts.z_loss = 1e-4f;
    d.reduction = LF_REDUCE_MEAN;
    d.grad_scale = 1.0f;
    d.in_place = 1;
    d.ignore_frac = 0.1;
    d.bad_frac = 0.001;
    d.edge_labels = 1;
    d.check_rows = 64;
    d.seed = 20261123;
    d.time_iters = (d.use_nccl && !procs) || d.sim_lsa ? 0 : 10;
    if (procs) { /* before any CUDA call in this process */
#ifdef LF_HAVE_NCCL
        return tp_demo_procs(&d, mode, 300);
#else
        fprintf(stderr, "built without NCCL: rebuild with -DLF_HAVE_NCCL -lnccl\n");
        return 1;
#endif
    }
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) return tp_host_demo();
#ifndef LF_HAVE_NCCL
    if (d.use_nccl) {
        fprintf(stderr, "built without NCCL: rebuild with -DLF_HAVE_NCCL -lnccl\n");
        return 1;
    }
#endif
    if (d.use_nccl && d.tp > ndev) {
        fprintf(stderr, "nccl mode: tp = %d ranks need %d GPUs, %d visible\n", d.tp, d.tp, ndev);
        return 1;
    }
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return 1;
    printf("device: %s  tp=%d (%s)  N=%lld  V=%lld bf16, smoothing 0.1, z-loss 1e-4, 10%% ignored, in place\n", prop.name, d.tp,
           d.lsa       ? "NCCL symmetric windows, read once, one GPU per rank"
           : d.use_nccl ? "NCCL all-gather, one GPU per rank"
           : d.sim_lsa  ? "read once, every rank's window on one GPU"
                        : "simulated on one GPU",
           (long long)d.N, (long long)d.V);
    const tp_demo_result r = tp_demo_run(&d);
    if (r.st != LF_OK) {
        fprintf(stderr, "tp_demo_run: %s (%s)\n", lf_status_str(r.st), cudaGetErrorString(r.cuda));
        return 1;
    }
    if (r.plan.resident)
        printf("plan: resident, %d CTAs per row (a cluster), %d stages each, %d CTAs\n", r.plan.cluster, r.plan.stages, r.plan.ctas);
    else
        printf("plan: %lld rows per chunk, %lld chunks, %d CTAs per row\n", (long long)r.plan.chunk_rows, (long long)r.plan.chunks,
               r.plan.nsplit);
    printf("loss %.7f, single GPU %.7f (%.3f of tolerance); z-loss %.3f, lse worst %.3f, gradient worst %.3f of tolerance (%lld rows)\n",
           r.loss, r.loss_ref, r.loss_err, r.z_err, r.lse_err, r.grad_err, (long long)r.rows_checked);
    printf("every rank the same bits: %s; bad labels %u (single GPU %u)\n", r.rank_mismatch ? "NO" : "yes", r.errors, r.errors_ref);
    if (d.graph)
        printf("CUDA graphs: %d of %d runs replayed every rank's captured step; every run the first run's bits: %s\n", r.graph_replays,
               1 + d.repeat, r.nondeterministic ? "NO" : "yes");
    printf("memory per rank: workspace %zu B + shares %zu B; gathering the logits instead would take %zu B\n", r.ws_bytes,
           r.shares_bytes, r.gathered_bytes);
    if (d.report_memory && !d.use_nccl)
        printf("memory report: net device memory the step allocated: %lld B (cudaMemGetInfo around a second run); rank 0's "
               "step touches %zu B of "
               "caller buffers (its shard in place, workspace, shares)\n", r.step_alloc_bytes, r.rank_buffers_bytes);
    if (d.time_iters)
        printf("time: rank 0's step %.3f ms (pipelined in %lld-row chunks: %.3f ms, %.3f without programmatic dependent launch); "
               "single GPU, full V: %.3f ms; ratio %.3f (exchange not included: simulated)\n", r.ms_tp, (long long)r.chunked_rows,
               r.ms_tp_chunked, r.ms_tp_chunked_nopdl, r.ms_single, r.ms_tp / r.ms_single);
    printf("%s\n", r.ok ? "OK" : "MISMATCH");
    return r.ok ? 0 : 1;
}
#endif /* TP_NO_MAIN */
