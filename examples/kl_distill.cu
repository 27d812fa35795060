/* examples/kl_distill.cu — distillation losses from raw logits, built from lossfuse's two
 * headers: forward KL, reverse KL, generalised JSD, soft-target cross-entropy, total variation.
 * (A sparse teacher's forward KL and soft CE run examples/cross_entropy.cu's row-resident kernel,
 * included here as dpo_packed.cu and the parallel examples include it: one kernel, not two.)
 *
 * Build and run (from the repository root; meson does the same, see README.md):
 *     nvcc -O3 -std=c++17 -arch=sm_90 -I. examples/kl_distill.cu -o kl_distill
 *     ./kl_distill [N=4096] [V=32768] [forward|reverse|jsd|softce|tvd] [bf16|fp16|fp32]
 *
 * What it does
 *   A student row x_s and a teacher row x_t per token (each bf16, fp16 or fp32, independently;
 *   the teacher may also be given as log-probabilities or probabilities). Both are turned into
 *   softmax logits alike, z = softcap(x) / tau, p = softmax(z_s), q = softmax(z_t), and per row
 *       forward KL(q || p), reverse KL(p || q), JSD_beta, soft CE -sum q log p, TVD 1/2 |p - q|_1
 *   Or a SPARSE teacher (offline distillation): per row only its top-k (index, log-probability)
 *   pairs, the rest of the mass dropped or spread over the other V - k entries (kl_args.topk_*,
 *   lossfuse.h lf_ref_kl_sparse_teacher). Only the student is read from HBM. Forward KL and soft
 *   CE (16-bit student, sm_90, k <= KL_SOFT_MAX_K, no reverse-KL output) take the soft-target
 *   path (kl_launch_soft): the teacher is then cross-entropy's target, q_j = q_r everywhere but
 *   at the k listed entries, so the loss is examples/cross_entropy.cu's row-resident kernel with
 *   label smoothing's per-row mass q_r and k patched labels (its hook ce_soft), each student row
 *   read once: soft CE = lse - sum_j q_j z_j, forward KL = soft CE - H(q), H(q) and the
 *   teacher's lse per row from its k + 1 values (kl_topk_prep_kernel, in double). Reverse KL
 *   (and JSD at beta 1) takes it too where neither kl_fwd nor ent_s is asked for (its hook
 *   ce_soft_rev: KL = sum_j p_j (log p_j - log q_j), each entry's -log q_j carried in the
 *   entropy sum of the student's online softmax; where q_r > 0 the listed entries leave the
 *   row's pass and their holders add them, so the unlisted mass is summed, not found as 1 minus
 *   the listed; gradient p_j (log p_j - log q_j - KL) with the listed entries patched; the
 *   entropy of p is then not available). Every other
 *   case builds the teacher in shared memory, piece by piece (fill with the rest value, scatter
 *   the pairs), and runs the dense passes: every loss and option above works with it.
 *   (definitions and gradients: lossfuse.h section 8, lf_ref_kl_row). Forward + backward in ONE
 *   launch, gradient with respect to the student only, in place over the student logits or to
 *   another buffer; forward only without a gradient buffer. Options: temperature tau (and the
 *   customary tau^2 scale), logit softcap, a per-token mask (labels == ignore_index and/or mask
 *   bytes), per-token weights, reduction none / sum / mean with the mean's divisor a DEVICE
 *   scalar, an upstream gradient. Per-row outputs for logging: both KLs and both entropies.
 *
 * How a row pair is read (and where it is read twice)
 *   Persistent CTAs of 256 threads (two per SM) stage the two rows in shared memory with
 *   cp.async, in pieces of 8-element units (lossfuse_cuda.cuh section 8): two 48 KB buffers,
 *   each holding a piece of the student AND the same elements of the teacher (12K elements of
 *   a bf16 pair), so the next piece's copies are in flight while the current one is reduced.
 *   Every loss here needs a statistic of the whole row (both lse; JSD and TVD a second sum that
 *   needs both lse) before any gradient element can be written, so the kernel streams a row as
 *       pass 1 (statistics)      pieces 0 .. n-1 from HBM
 *       pass 2 (JSD, TVD only)   piece n-1 while still staged, then n-2 .. 0 read again
 *       gradient                 the piece still staged first, then the others read again
 *   The second reads come, most recent first, from L2 where the pair was just read. CHOSEN and
 *   MEASURED (bench/RESULTS.md): the tile shape (2 CTAs x 2 x 48 KB beat 3 x 2 x 32 KB, which
 *   also spills registers, and 1 x 512 threads x 2 x 96 KB at V = 32K; the latter is ~13% faster
 *   at V >= 152K); deeper pipelines (3-4 buffers) gained nothing. Where the time goes now is
 *   the per-piece work outside the element loops (bench/RESULTS.md, design log).
 *   On sm_90 a second schedule reads each pair from HBM exactly once (kl_res_kernel, as
 *   examples/cross_entropy.cu's row-resident one): a ring of whole row-pair slices in shared
 *   memory, filled by the copy engine, rows wider than three stages split over a cluster whose
 *   CTAs exchange their states over DSMEM. MEASURED (bench/RESULTS.md, session 15): forward /
 *   reverse KL at 88-96% of the copy bandwidth on an H100 and 67-85% on an H200 (where these
 *   kernels are bound by the SMs, not by memory), 1.2-1.4x the streamed kernel at every V on
 *   the H200; JSD 1.15-1.28x on the H200 at every V (session 20, after its pass 2 and gradient
 *   lost their per-pair tests; at 40-49% of copy there it is bound by its arithmetic: 8 MUFU
 *   operations and ~42 instructions per pair over its three sweeps). The automatic plan takes
 *   it where it applies (kl_launch_any). Its rows are handed out dynamically, except JSD's on
 *   clusters of 16 where no side CTAs run (kl_args.static_rows). Side CTAs (kl_side_kernel,
 *   kl_args.side_ctas): where the clusters leave SMs idle and the device is bound by its SMs
 *   (an H200: 120 or 112 of 132 busy on clusters of 8 or 16), a second grid on those SMs takes
 *   whole rows from the same counter, each computed as a cluster would (the same bits), its
 *   slices staged through its own ring of bulk copies: 5-17% faster on the H200 at V >= 131K
 *   than without them (bench/RESULTS.md, session 23, design logs 68-69). JSD's pass 2 keeps
 *   log2 p - log2 M in the shared memory the stages leave (~24% of a slice), so its gradient
 *   computes only p there (kl_args.jsd_keep: +0.5-1.5 points against the same code without
 *   them, but JSD is not faster than before they came: design log 73, not resolved). JSD and
 *   TVD run kernels of their own (template parameter THREE), whose pass 1 sums the two lse
 *   alone (LF_DUAL_LSE, not forward KL's cross term): JSD 2.3-4.0% faster on an H200 (session
 *   47). At 8 MUFU operations per pair the H200's MUFU rate alone caps JSD at ~74% of copy. On
 *   the H200 the rest of forward / reverse KL's gap is the latency of each row's block merge
 *   and cluster exchange (timing probes: forward KL at 87-95% of copy without them, design
 *   log 72; the probes, which gave wrong results by design, are in commit 0f06ffe's file).
 *   KL_RES_TRACE (a diagnostic build) stamps each CTA's entry, first stage, row-loop end and
 *   exit, which bench_kl prints: what a launch's fixed cost is made of.
 * Contract (as DESIGN.md and examples/cross_entropy.cu)
 *   - Masked rows (mask byte 0, or label == ignore_index) have loss 0, zero gradient, weight 0.
 *     A label outside [0, V) that is not ignore_index adds 1 to *n_errors and masks the row;
 *     the mask byte is looked at first, so a row it masks is not checked (no error counted for
 *     its label, nor for its top-k pairs). A zero divisor: the sum times 0 (NaN where it is
 *     NaN or infinite, e.g. a +inf forward KL).
 *   - NaN or +inf in a valid row (either side), or a side with no mass: NaN loss and an all-NaN
 *     gradient row. Reverse KL where the teacher has no mass but the student has: +inf loss,
 *     NaN gradient. Forward KL / soft CE where the student has none: +inf loss, finite gradient.
 *   - An entry at a 16-bit side's lowest finite value (masking with torch.finfo(bf16).min) has
 *     probability exactly 0, as in the double reference, even where w log2(e) / tau overflows (tau
 *     below ~1.44): no NaN from it (tested: both sides at it; the student alone for reverse KL, JSD
 *     and TVD; the teacher alone for forward KL, soft CE, JSD and TVD; reverse KL with the teacher
 *     alone at it where the student's p_j is below fp32's range, 120 nats under its maximum:
 *     gradient 0 there). Forward KL / soft CE with the student alone at it: the true loss is ~1e38
 *     q_j, which fp32 may round to +inf (not tested). Reverse KL with the TEACHER alone at it where
 *     the student has mass: the true loss is ~3.4e38 / tau times the student's mass on those
 *     entries. Pass 1 sums e_s (w_s - w_t) in fp32; where that sum overflows, or the loss is past
 *     FLT_MAX ln 2 (~2.36e38 nats: the gradient's log2 form cannot hold it, lf_kl_rev_fit), the row is
 *     taken as a support mismatch, as if the entries were -inf: +inf loss, NaN gradient. Where
 *     neither, the loss is the finite literal value (as the double reference's), and the gradient
 *     on those entries is the reference's finite p_j (z_s - z_t) / tau-sized value where the 16-bit
 *     kernels' fast form computes it and it fits a float, else +inf (the exact form, which fp32
 *     students, the streamed schedule and pieces with -inf or NaN entries take: its log2 q_j
 *     overflows). Which form a row takes depends on the row (tested on an H200: V = 1000 gave
 *     either, V = 50257 the support mismatch). Not a supported input: mask the teacher with -inf,
 *     or the student too. A side with nothing else has no mass (NaN), as an all -inf side
 *     (lossfuse.h lf_massless; tested: the student, and the teacher, entirely at it).
 *   - Accuracy: the forward and reverse KL are rb / st + dl and ra / ss - dl, dl = (ms - mt) +
 *     (log ss - log st) (lossfuse.h section 3b; soft CE adds H(q) = log st - ut / st), with
 *     both sides' sums relative to their maxima themselves (lossfuse_cuda.cuh
 *     lf_impl_acc_fold: the rounding of each side's shift m log2 e / tau is taken out of its
 *     sums), so a small KL between rows of large logits keeps its digits: fp32 rounding of the
 *     cross terms w_t - w_s and of ms - mt, for |m| / tau up to ~1.2e7, where both sides are
 *     linear (logits without a cap, or a log-prob teacher: with a cap or a probs teacher each z
 *     carries ~2^-24 |z|) and at a temperature that is a power of 2 (another temperature's m /
 *     tau carries ~2^-24 |m| / tau). JSD and TVD take p_j = exp2(w cs - lse log2 e) in their
 *     second pass, whose shift carries ~2^-24 |lse| in every p_j and q_j: their loss is off by
 *     about that much absolute (a few 1e-4 nats at |lse| ~ 8e3), even where it is 0. The
 *     soft-target path's loss is lse_s - sum_j q_j z_j (- H(q) for forward KL, H(q) in double):
 *     fp32 sums of z over the row, good to ~2^-24 (|lse| + max |z|) relative per term, not the
 *     cross terms' form above (a KL far below that, between rows of large logits, loses its
 *     digits there). Under the cap every path's gradient carries dz/dx = (1 - tanh^2) / tau from
 *     an fp32 tanh: ~2^-21 / tau absolute in the factor, so an entry far past the cap (|x| >
 *     ~4 cap, factor < 1e-3) has its tiny gradient to that absolute size, not relative.
 *   - Deterministic: fixed-order reductions within a row and over rows; no float atomics.
 *   - No host synchronisation; CUDA-graph capturable; N = 0 launches nothing.
 *
 * Sections: 1. API   2. kernels   3. launcher   4. main (make data, check, time)
 */
#include "lossfuse_cuda.cuh"
#ifndef CE_NO_MAIN
#define CE_NO_MAIN
#endif
#ifndef CE_RESIDENT_ONLY
#define CE_RESIDENT_ONLY /* its ce_launch_resident only */
#endif
#include "examples/cross_entropy.cu" /* a sparse teacher's forward KL / soft CE: ce_resident_kernel with ce_soft */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <type_traits>

/* ============================================================================================
 * 1. API
 * ========================================================================================== */

/* What the teacher tensor holds (the temperature applies to all three; the softcap only to
 * logits): log-probabilities and probabilities at temperature 1, as stored by offline
 * distillation pipelines — softmax(log q / tau) is the teacher at temperature tau. */
typedef enum kl_teacher_kind {
    KL_TEACHER_LOGITS = LF_SIDE_LOGITS,
    KL_TEACHER_LOGPROBS = LF_SIDE_LOGPROBS,
    KL_TEACHER_PROBS = LF_SIDE_PROBS
} kl_teacher_kind;

typedef struct kl_args {
    /* inputs */
    const void *student;   /* [N, V] logits, row stride s_stride (elements) */
    lf_dtype s_dtype;      /* of the student and the gradient */
    int64_t n_rows, vocab, s_stride;
    const void *teacher;   /* [N, V], row stride t_stride; NULL with a sparse teacher */
    lf_dtype t_dtype;
    int64_t t_stride;
    kl_teacher_kind teacher_kind;
    /* OR a sparse teacher (offline distillation): per row the top-k (index, log-probability at
     * temperature 1) pairs, the rest of the mass dropped or spread evenly over the other V - k
     * entries (lossfuse.h lf_ref_kl_sparse_teacher). Temperature applies as to log-probabilities,
     * the softcap only to the student. A row whose indices are outside [0, V) or repeated counts
     * in *n_errors and is masked; a NaN or +inf log-probability makes the row NaN. */
    const int32_t *topk_idx; /* [N, k], row stride topk_stride (elements) */
    const float *topk_lp;    /* [N, k], the same stride */
    int64_t topk, topk_stride; /* 0 <= k <= V (else LF_ERR_SIZE); the teacher is sparse when
                                * topk_idx, topk_lp or topk is set, so k = 0 (the whole mass
                                * spread, or none) needs the two pointers set, not read */
    lf_kl_rest topk_rest;    /* LF_KL_REST_DROP or LF_KL_REST_SPREAD (else LF_ERR_ARG). Spread with pairs that carry
                              * all the mass (sum exp(lp) >= 1 after rounding) leaves no rest:
                              * the others are then -inf as with drop (reverse KL +inf where the
                              * student has mass there) -- store top-k lists with the rest > 0 */
    lf_kl_opts opts;       /* kind, beta, temperature, tau2, softcap (lossfuse.h section 8) */
    const void *labels;    /* optional [N] int32/int64: rows with ignore_index are masked */
    int labels_i64;
    int64_t ignore_index;  /* default -100 */
    const uint8_t *mask;   /* optional [N]: 0 masks the row */
    const float *weights;  /* optional [N]: per-row loss weights */
    lf_reduction reduction;
    const float *divisor;  /* device scalar for LF_REDUCE_MEAN, or NULL: sum of the weights of
                            * unmasked rows (their count without weights), counted by a small
                            * kernel before the loss's own; N without it where no mask, labels,
                            * weights or sparse teacher are given */
    const float *dloss;    /* device upstream gradient: [1] for sum/mean, [N] for none; NULL = 1 */
    float grad_scale;      /* host multiplier of the gradient */
    /* outputs (device pointers) */
    void *grad;            /* NULL: forward only; == student: in place */
    int64_t grad_stride;
    float *loss;           /* [N] (weighted) for none, [1] otherwise; required */
    float *kl_fwd, *kl_rev;   /* optional [N]: KL(q||p), KL(p||q) of z (no tau^2, no weight) */
    float *ent_s, *ent_t;     /* optional [N]: entropies of p and q in nats */
    unsigned int *n_errors;   /* optional: += rows with a bad label */
    void *workspace;       /* kl_workspace_bytes(n_rows) bytes, zeroed once before first use */
    size_t workspace_bytes;
    int schedule;          /* KL_SCHED_AUTO (0), _STREAM or _RESIDENT: see kl_schedule */
    int max_cluster;       /* resident: at most this many CTAs per cluster (0: automatic) */
    int stages;            /* resident: shared-memory stages per CTA, 3..8 (0: automatic) */
    int static_rows;       /* resident: 0 (default, automatic) hands the rows out from an atomic
                            * counter in the workspace as the CTAs free their stages (the faster SMs
                            * take more), except JSD on clusters of 16 without side CTAs (a fixed
                            * share: measured faster there, bench/RESULTS.md design log 67); 1: a fixed share per
                            * cluster; -1: the counter always. The results are the same bits either way */
                           /* (the soft-target path: max_cluster and stages as for cross-entropy's ring,
                            * static_rows 1 a fixed share, otherwise the counter; no side CTAs) */
    int side_ctas;         /* resident with rows from the counter: 0 (default) automatic, side CTAs on the
                            * SMs that the clusters leave idle where the device is bound by its SMs
                            * (kl_side_kernel; an H200, not an H100); -1: none; n > 0: n side CTAs, which
                            * draw rows from the first one on (for tests). None on a forward-only launch of
                            * a one-pass kind (forward / reverse KL, soft CE), nor where the plan is not
                            * resident with rows from the counter on clusters of 2 or more (a forced count
                            * is then dropped: kl_plan.side_ctas says what ran). The same bits either way */
    int side_take_rest;    /* for tests, with side CTAs: 1 = the clusters take only the rows of their rings'
                            * first stages and the side CTAs every later row, whatever the order in which the
                            * two grids run (compute-sanitizer runs them one after the other); 0 (default):
                            * both draw from the counter. Ignored where no side CTAs run */
    int jsd_keep;          /* resident JSD with a gradient: 0 (default): pass 2 keeps its log2 p - log2 M of as
                            * many pairs as the shared memory beside the stages holds (32 bytes per 8 pairs
                            * and warp group; none where that is less than a unit per thread), and the
                            * gradient pass computes neither q nor log2 M again for them (2 of a pair's 8
                            * MUFU operations); -1: never. The same bits either way. (Room for the whole
                            * slice, with larger clusters, measured slower: bench/RESULTS.md, design log 73) */
    struct kl_plan *plan;  /* optional host out */
} kl_args;

/* How row pairs are read.
 *   KL_SCHED_STREAM    any GPU, any dtypes, dense or sparse teacher: persistent CTAs stream
 *                      pieces with per-thread cp.async; passes after the first re-read the
 *                      pieces that are no longer staged (from L2 when still there).
 *   KL_SCHED_RESIDENT  sm_90, 16-bit student and dense 16-bit teacher: one CTA per SM holds
 *                      whole row-pair slices in a ring of stages filled by the copy engine;
 *                      pairs too wide for three stages are split over a cluster. Each pair is
 *                      read from HBM once. With a sparse teacher: the soft-target path (forward
 *                      KL or soft CE without a kl_rev output, or reverse KL without kl_fwd and
 *                      ent_s outputs; 16-bit student, k <= KL_SOFT_MAX_K; kl_launch_soft), each
 *                      student row read once. Where it does not apply,
 *                      LF_ERR_ARG (or, for the device, LF_ERR_DEVICE; the soft-target path where
 *                      its ring cannot hold a row, or n_rows >= 2^32: LF_ERR_SIZE).
 *   KL_SCHED_AUTO      resident for forward + backward of every kind where it applies (a
 *                      pair's slices fit a cluster of up to 16 CTAs: V up to ~300K in bf16),
 *                      else streamed: where it measured faster (kl_launch_any). A sparse
 *                      teacher: the soft-target path where it applies and its rows are at least
 *                      CE_RES_MIN_SLICE bytes (forward only too), else streamed. */
enum kl_schedule { KL_SCHED_AUTO = 0, KL_SCHED_STREAM = 1, KL_SCHED_RESIDENT = 2 };

typedef struct kl_plan {
    int schedule;    /* KL_SCHED_STREAM or KL_SCHED_RESIDENT */
    int pieces;      /* streamed: pieces per row pair; 1 = each pair read from HBM once */
    int piece_units; /* 8-element units per piece (resident: per CTA slice) */
    int cluster;     /* resident: CTAs per cluster sharing a row pair (1: none) */
    int stages;      /* resident: row-pair slices staged per CTA */
    int ctas;        /* persistent CTAs launched */
    int dynamic;     /* resident: rows handed out from the workspace's counter (kl_args.static_rows) */
    int side_ctas;   /* resident, dynamic: CTAs of the side grid on the SMs the clusters leave idle (kl_args.side_ctas) */
    int jsd_keep;    /* resident JSD: units of a CTA's slice whose pass-2 values each group keeps (kl_args.jsd_keep) */
    int soft_target; /* a sparse teacher run as cross-entropy with a soft target (kl_launch_soft): cluster,
                      * stages, ctas and dynamic are that kernel's */
} kl_plan;

static kl_args kl_args_default(void)
{
    kl_args a;
    memset(&a, 0, sizeof a);
    a.s_dtype = a.t_dtype = LF_BF16;
    a.teacher_kind = KL_TEACHER_LOGITS;
    a.opts = lf_kl_opts_default();
    a.ignore_index = -100;
    a.reduction = LF_REDUCE_MEAN;
    a.grad_scale = 1.0f;
    return a;
}

/* Workspace: a 64-byte header (completion counter, row counter, default divisor), three words
 * per row (the row's loss; with a sparse teacher its rest value and status), four more per row
 * and cross-entropy's workspace for a sparse teacher's soft-target path (kl_launch_soft). Zero it
 * once; every launch leaves the counters at zero again. One per launch in flight. */
typedef struct kl_ws_header {
    unsigned long long rows_done;
    unsigned long long row_next; /* row-resident, dynamic: the next row to hand out (lf_ring_draw) */
    float divisor;
    unsigned int side_rows;      /* row-resident, side CTAs: rows they took in this launch so far */
    unsigned int side_rows_last; /* ... in the last launch that had side CTAs (set by its last CTA) */
    float pad[9];
} kl_ws_header;
static_assert(sizeof(kl_ws_header) == 64, "kl_workspace_bytes documents a 64-byte header");

static size_t kl_workspace_bytes(int64_t n_rows)
{
    const size_t n = (size_t)(n_rows > 0 ? n_rows : 0);
    return ((sizeof(kl_ws_header) + 7 * sizeof(float) * n + 15) & ~(size_t)15) + ce_workspace_bytes((int64_t)n);
}

/* the soft-target path's cross-entropy workspace: the last part of kl_workspace_bytes */
static ce_ws_header *kl_soft_ce_ws(void *ws, int64_t n_rows)
{
    return (ce_ws_header *)((char *)ws + ((sizeof(kl_ws_header) + 7 * sizeof(float) * (size_t)n_rows + 15) & ~(size_t)15));
}

/* ============================================================================================
 * 2. Kernels
 * ========================================================================================== */

#ifndef KL_THREADS
#define KL_THREADS 256
#endif
#ifndef KL_CTAS_PER_SM
#define KL_CTAS_PER_SM 2
#endif
#ifndef KL_PIECE_BYTES
#define KL_PIECE_BYTES 49152 /* per buffer (student and teacher parts together); two buffers */
#endif
#define KL_ROW_CACHE 512
#define KL_SMEM_BYTES (2 * KL_PIECE_BYTES + KL_ROW_CACHE * 8)
/* A sparse teacher: rows' rest values cached too, and three rows' top-k lists (up to
 * KL_TOPK_SMEM pairs each; longer lists are read from global memory) and edge values. */
#ifndef KL_TOPK_SMEM
#define KL_TOPK_SMEM 256
#endif
/* The soft-target path (kl_launch_soft) takes top-k lists of up to this many pairs per row */
#define KL_SOFT_MAX_K (CE_SOFT_PAIRS * CE_RES_GROUP)
#define KL_SMEM_SPARSE_BYTES (KL_SMEM_BYTES + KL_ROW_CACHE * 4 + 3 * (KL_TOPK_SMEM * 8 + 16 * 4))

typedef struct kl_kparams {
    const void *student, *teacher;
    int64_t s_stride, t_stride, n_rows, vocab;
    int kind;
    float beta, tau2_scale;
    lf_kl_xf xf;
    int terms;     /* LF_DUAL_LSE / _RB / _RA / _FULL: what pass 1 computes (the loss and the outputs asked for) */
    int piece_units;
    const void *labels;
    int labels_i64;
    int64_t ignore_index;
    const uint8_t *mask;
    const float *weights;
    int reduction;
    const float *divisor, *dloss;
    float divisor_n; /* mean: the divisor when no row can be masked and none is weighted (no mask,
                      * labels, weights or sparse teacher): n_rows, known on the host, so no
                      * divisor kernel runs (0: *divisor, or the divisor kernel's ws->divisor) */
    float grad_scale;
    void *grad;
    int64_t grad_stride;
    float *loss, *kl_fwd, *kl_rev, *ent_s, *ent_t;
    unsigned int *n_errors;
    const int32_t *topk_idx;
    const float *topk_lp;
    int64_t topk, topk_stride;
    int topk_rest;
    kl_ws_header *ws;
    int64_t ctas_all; /* CTAs that count in the batch sum's completion counter (0: the grid's) */
    int cluster_no_draw; /* dynamic, with side CTAs and kl_args.side_take_rest: the clusters draw no rows */
    int jsd_keep;        /* resident JSD: units of its slice whose pass-2 values a group keeps (kl_args.jsd_keep) */
    float *ws_loss;
    float *ws_rest; /* sparse teacher: per row, written by kl_topk_prep_kernel */
    int *ws_status;
    /* A sparse teacher as cross-entropy's soft target (kl_launch_soft; soft = 1): per row, from
     * kl_topk_prep_kernel, the label (0, or -100 for a masked row), the teacher's lse at tau
     * (shift), q of an untracked entry (rest) and H(q) (ent_t) */
    int soft;
    double tau;
    int32_t *s_label;
    float *s_shift, *s_rest, *s_ent_t;
} kl_kparams;

/* 0 valid, 1 masked, 2 bad label or bad top-k pairs (also masked; with_pairs false: the pairs'
 * status, which kl_topk_prep_kernel writes, left out) */
static __device__ __forceinline__ int kl_row_status(const kl_kparams &p, int64_t row, bool with_pairs = true)
{
    if (p.mask && !p.mask[row]) return 1;
    if (p.labels) {
        const int64_t y = p.labels_i64 ? ((const int64_t *)p.labels)[row] : (int64_t)((const int32_t *)p.labels)[row];
        if (y == p.ignore_index) return 1;
        if (y < 0 || y >= p.vocab) return 2;
    }
    return with_pairs && p.ws_status ? p.ws_status[row] : 0;
}

/* The mean's divisor: the caller's device scalar, else the host's n_rows where nothing can mask
 * or weight a row, else what kl_divisor_kernel counted (the same value where both apply: a sum
 * of n ones in double is n). */
static __device__ __forceinline__ float kl_mean_divisor(const kl_kparams &p)
{
    return p.divisor ? *p.divisor : p.divisor_n > 0.0f ? p.divisor_n : p.ws->divisor;
}

/* A sparse teacher's rows, one warp each, before the main kernel: the pairs checked (indices
 * in [0, V) and distinct) and the raw value of the V - k untracked entries,
 *     spread:  log((1 - sum_i exp(lp_i)) / (V - k)), the sum in double;
 *     -inf when dropped, when nothing is left (the sum >= 1) or k = V;
 *     NaN when a log-probability is NaN or +inf (the row's outputs NaN, as for dense input).
 * For the soft-target path (p.soft, kl_launch_soft) also, in double: the teacher at tau, l_i =
 * lp_i / tau and r / tau for the others, its lse (s_shift), q_r = exp(r / tau - lse) (s_rest;
 * for reverse KL its log, r / tau - lse, or -inf where there is no rest: ce_soft_rev),
 * H(q) = lse - sum_j q_j l_j (s_ent_t), all NaN for a row without mass or with a bad value; and
 * the row's label for cross-entropy (0, or -100 where the row is masked: mask byte, ignore_index,
 * a bad label or bad pairs, which count in *n_errors here).
 * Distinct indices: rows of k <= 32 x KL_PREP_REG pairs (every k of the soft-target path) hold
 * their pairs in registers, KL_PREP_REG per lane, and insert them into the warp's hash table in
 * dynamic shared memory (KL_PREP_SMEM, launched only for such k; open addressing, at most half
 * full; an index found there is a repeat), O(k) per row; longer rows compare each pair with the
 * later ones, k^2 / 64 loads per lane. (Measured
 * on an H100 at 4096 rows of 64 pairs, before the table: 11.8 us, as long as a warp's row: the
 * compares' loads one after another, bench/RESULTS.md, session 50.) */
#define KL_PREP_REG 16
#define KL_PREP_HASH_BITS 10
#define KL_PREP_HASH (1 << KL_PREP_HASH_BITS)
static_assert(KL_PREP_HASH >= 2 * 32 * KL_PREP_REG, "the table at most half full");
#define KL_PREP_SMEM (8 * KL_PREP_HASH * (int)sizeof(int32_t)) /* a table per warp, 8 warps */

/* Inserts index id (>= 0) into a warp's table (empty slots -1): its slot, or -1 where it was there
 * already (*bad set). */
static __device__ __forceinline__ int kl_prep_insert(int32_t *tab, int32_t id, int *bad)
{
    unsigned h = ((unsigned)id * 2654435761u) >> (32 - KL_PREP_HASH_BITS);
    for (;;) {
        const int32_t old = atomicCAS(&tab[h], -1, id);
        if (old == -1) return (int)h;
        if (old == id) {
            *bad = 1;
            return -1;
        }
        h = (h + 1) & (KL_PREP_HASH - 1);
    }
}

__global__ void __launch_bounds__(256) kl_topk_prep_kernel(const kl_kparams p)
{
    extern __shared__ int32_t tab_all[]; /* KL_PREP_SMEM bytes where hashed, else none */
    const int lane = (int)(threadIdx.x & 31u);
    const int64_t warps = (int64_t)gridDim.x * 8, w0 = (int64_t)blockIdx.x * 8 + threadIdx.x / 32;
    const int64_t k = p.topk;
    const bool hashed = k <= 32 * KL_PREP_REG;
    int32_t *tab = tab_all + (threadIdx.x / 32) * KL_PREP_HASH;
    if (hashed) {
        for (int t = lane; t < KL_PREP_HASH; t += 32) tab[t] = -1;
        __syncwarp();
    }
    for (int64_t row = w0; row < p.n_rows; row += warps) {
        const int32_t *idx = p.topk_idx + row * p.topk_stride;
        const float *lp = p.topk_lp + row * p.topk_stride;
        /* the mask's and the label's status (loaded before the pairs' work, not after it) */
        const int st0 = p.soft && lane == 0 ? kl_row_status(p, row, false) : 0;
        int bad = 0, nonfinite = 0;
        double in = 0.0;
        if (hashed) {
            int32_t id[KL_PREP_REG];
            float l[KL_PREP_REG];
            int slot[KL_PREP_REG];
#pragma unroll
            for (int u = 0; u < KL_PREP_REG; ++u) {
                const int64_t i = lane + 32 * u;
                id[u] = i < k ? idx[i] : -1;
                l[u] = i < k ? lp[i] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < KL_PREP_REG; ++u) {
                slot[u] = -1;
                if (lane + 32 * u < k) { /* (in the order of the loop below: the same sum) */
                    nonfinite |= !(l[u] < LF_INF_F);
                    in += l[u] < LF_INF_F ? exp((double)l[u]) : 0.0;
                    if (id[u] < 0 || id[u] >= p.vocab) bad = 1;
                    else slot[u] = kl_prep_insert(tab, id[u], &bad);
                }
            }
            __syncwarp(); /* every lane's inserts and finds done: empty the table for the next row */
#pragma unroll
            for (int u = 0; u < KL_PREP_REG; ++u)
                if (slot[u] >= 0) tab[slot[u]] = -1;
            __syncwarp();
        } else {
            for (int64_t i = lane; i < k; i += 32) {
                const int32_t id = idx[i];
                const float l = lp[i];
                bad |= id < 0 || id >= p.vocab;
                for (int64_t j = i + 1; j < k; ++j) bad |= idx[j] == id;
                nonfinite |= !(l < LF_INF_F);
                in += l < LF_INF_F ? exp((double)l) : 0.0;
            }
        }
        bad = __any_sync(0xffffffffu, bad);
        nonfinite = __any_sync(0xffffffffu, nonfinite);
        in = lf_warp_sum_f64(in); /* (every lane has the sum) */
        const double rest = nonfinite ? (double)NAN
                            : (p.topk_rest == LF_KL_REST_SPREAD && k < p.vocab && in < 1.0) ? log((1.0 - in) / (double)(p.vocab - k))
                                                                                            : -(double)LF_INF_F;
        if (lane == 0) {
            p.ws_status[row] = bad ? 2 : 0;
            p.ws_rest[row] = (float)rest;
        }
        if (!p.soft) continue;
        /* the teacher at tau: its maximum, then sum_j e_j and sum_j e_j l_j with e_j = exp(l_j - M)
         * (the V - k untracked entries by lane 0) */
        const double rt = rest / p.tau, nr = (double)(p.vocab - k);
        const bool has_rest = rest > -(double)LF_INF_F && k < p.vocab; /* (false for NaN) */
        double M = has_rest ? rt : -(double)LF_INF_F;
        for (int64_t i = lane; i < k; i += 32) {
            const double l = (double)lp[i] / p.tau;
            if (l > M) M = l;
        }
        M = lf_warp_max_f64(M);
        double S = 0.0, A = 0.0;
        if (lane == 0 && has_rest) {
            const double e = nr * exp(rt - M);
            S = e;
            A = e * rt;
        }
        for (int64_t i = lane; i < k; i += 32) {
            const double l = (double)lp[i] / p.tau;
            if (l > -(double)LF_INF_F) {
                const double e = exp(l - M);
                S += e;
                A += e * l;
            }
        }
        S = lf_warp_sum_f64(S);
        A = lf_warp_sum_f64(A);
        if (lane != 0) continue;
        int st = st0; /* mask and label first: a row they mask is not checked */
        if (st == 0 && bad) st = 2;
        if (st == 2 && p.n_errors) atomicAdd(p.n_errors, 1u);
        p.s_label[row] = st == 0 ? 0 : -100;
        const bool ok = !nonfinite && M > -(double)LF_INF_F; /* values, and some mass */
        const double lse = M + log(S);
        p.s_shift[row] = ok ? (float)lse : NAN;
        /* (a rest with mass stays > 0 where fp32 flushes it: its student -inf entries make +inf) */
        if (p.kind == LF_KL_REVERSE) p.s_rest[row] = !ok ? NAN : has_rest ? (float)(rt - lse) : -LF_INF_F;
        else p.s_rest[row] = !ok ? NAN : has_rest ? fmaxf((float)exp(rt - lse), FLT_TRUE_MIN) : 0.0f;
        p.s_ent_t[row] = ok ? (float)(lse - A / S) : NAN;
    }
}

/* The default mean divisor, sum of the weights of unmasked rows, in a fixed order (one CTA). */
__global__ void __launch_bounds__(1024) kl_divisor_kernel(const kl_kparams p)
{
    __shared__ double scratch[1024 / 32];
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < p.n_rows; i += 1024)
        if (kl_row_status(p, i) == 0) acc += p.weights ? (double)p.weights[i] : 1.0;
    acc = lf_block_sum_f64<1024>(acc, scratch);
    if (threadIdx.x == 0) p.ws->divisor = (float)acc;
}

/* A row's outputs (one thread). A row without two distributions (NaN, +inf, no mass on a side)
 * is NaN throughout, as in lf_ref_kl_row: no output of it may look like a number. */
static __device__ __forceinline__ void kl_row_outputs(const kl_kparams &p, int64_t row, const lf_dual_out &o, float loss)
{
    const bool ok = fabsf(o.lse_a) < LF_INF_F && fabsf(o.lse_b) < LF_INF_F;
    if (p.kl_fwd) p.kl_fwd[row] = o.kl_fwd;
    if (p.kl_rev) p.kl_rev[row] = o.kl_rev;
    if (p.ent_s) p.ent_s[row] = ok ? o.ent_a : NAN;
    if (p.ent_t) p.ent_t[row] = ok ? o.ent_b : NAN;
    if (p.reduction == LF_REDUCE_NONE) p.loss[row] = loss;
    else p.ws_loss[row] = loss;
}

/* The outputs of a masked row: all zero. */
static __device__ __forceinline__ lf_dual_out kl_dual_out_zero(void)
{
    lf_dual_out o;
    memset(&o, 0, sizeof o);
    return o;
}

/* After a CTA's rows (sum / mean, and every launch that hands rows out dynamically; THREADS
 * threads of the CTA call it, bar their barrier as lf_block_bar): the CTA that completes the
 * count sums all rows' losses in row order (the same bits whichever CTA took which row) and sets
 * the workspace's counters back to zero for the next launch. */
template <int THREADS>
static __device__ __forceinline__ void kl_batch_reduce(const kl_kparams &p, double *fin, int *is_last, int bar)
{
    if (threadIdx.x == 0) {
        __threadfence();
        const unsigned long long all = p.ctas_all ? (unsigned long long)p.ctas_all : gridDim.x;
        *is_last = atomicAdd(&p.ws->rows_done, 1ull) == all - 1ull;
    }
    lf_block_bar<THREADS>(bar);
    if (!*is_last) return;
    if (threadIdx.x == 0 && p.ctas_all) { /* a launch with side CTAs: their row count, for the tests */
        p.ws->side_rows_last = p.ws->side_rows;
        p.ws->side_rows = 0u;
    }
    if (p.reduction == LF_REDUCE_NONE) {
        if (threadIdx.x == 0) {
            p.ws->row_next = 0ull;
            p.ws->rows_done = 0;
        }
        return;
    }
    __threadfence();
    double a = 0.0;
    for (int64_t i = threadIdx.x; i < p.n_rows; i += THREADS) a += (double)__ldcg(p.ws_loss + i);
    a = lf_block_sum_f64<THREADS>(a, fin, bar);
    if (threadIdx.x == 0) {
        if (p.reduction == LF_REDUCE_MEAN) {
            const double d = (double)kl_mean_divisor(p);
            a = d == 0.0 ? a * 0.0 : a / d; /* 0, or NaN when a row is NaN: never hidden */
        }
        p.loss[0] = (float)a;
        p.ws->row_next = 0ull;
        p.ws->rows_done = 0;
    }
}

typedef struct kl_job {
    int64_t row, lr;
    const void *xs, *xt; /* the row pair (set with the row: no address arithmetic per job) */
    int k, status;
    float w;
    float rest; /* sparse teacher: the untracked entries' raw value */
    lf_dual_span sp;
} kl_job;

/* The persistent kernel: CTA b takes rows b, b + nctas, ...; a row is J jobs (module comment).
 * SPARSE (TT = float): the teacher is built in the teacher part of each piece from its top-k
 * pairs (lossfuse_cuda.cuh section 8, "a teacher that is not a row in memory"); a barrier per
 * job orders the fill, the scatter and the readers. Row r's pair list and edge values live in
 * slot r mod 3: a thread is at most one job behind the others, and a job's issue may start
 * the next row while the current row's last job (which reads its edge values) still runs. */
template <typename TS, typename TT, bool LIN, bool SPARSE>
__global__ void __launch_bounds__(KL_THREADS, KL_CTAS_PER_SM) kl_kernel(const kl_kparams p, int npieces, int nctas)
{
    extern __shared__ uint4 kl_smem[];
    __shared__ lf_dual_acc red[2][KL_THREADS / 32]; /* alternate rows: one barrier per merge */
    __shared__ float2 red2[2][KL_THREADS / 32];
    __shared__ double fin[KL_THREADS / 32];
    __shared__ int is_last;
    const int PU = p.piece_units;
    const int svecs = lf_dual_part_vecs<TS>(PU), bvecs = svecs + lf_dual_part_vecs<TT>(PU);
    int *const st_cache = reinterpret_cast<int *>(kl_smem + 2 * bvecs);
    float *const w_cache = reinterpret_cast<float *>(st_cache + KL_ROW_CACHE);
    float *const r_cache = w_cache + KL_ROW_CACHE;                             /* SPARSE only */
    int32_t *const k_idx = reinterpret_cast<int32_t *>(r_cache + KL_ROW_CACHE); /* [3][KL_TOPK_SMEM] */
    float *const k_lp = reinterpret_cast<float *>(k_idx + 3 * KL_TOPK_SMEM);     /* [3][KL_TOPK_SMEM] */
    float *const k_edge = k_lp + 3 * KL_TOPK_SMEM;                               /* [3][16] */

    const int64_t N = p.n_rows, V = p.vocab, cid = blockIdx.x;
    const int64_t my_rows = cid < N ? (N - 1 - cid) / nctas + 1 : 0;
    const int n = npieces;
    const bool three = p.kind == LF_KL_JSD || p.kind == LF_KL_TVD;
    const bool grad = p.grad != nullptr;
    const int J = three ? (grad ? 3 * n - 2 : 2 * n - 1) : (grad ? 2 * n - 1 : n);
    const int64_t njobs = my_rows * J;
    const float dl_all = (grad && p.dloss && p.reduction != LF_REDUCE_NONE) ? p.dloss[0] : 1.0f;
    float inv_div = 1.0f;
    if (grad && p.reduction == LF_REDUCE_MEAN) {
        const float d = kl_mean_divisor(p);
        inv_div = d == 0.0f ? 0.0f : 1.0f / d;
    }

    auto piece_of = [&](int k) { return k < n ? k : k < 2 * n - 1 ? 2 * n - 2 - k : k - (2 * n - 2); };
    auto start_job = [&](int64_t jj, const kl_job &prev) -> kl_job {
        kl_job j = prev;
        if (jj == 0) {
            j.k = 0;
            j.lr = 0;
        } else if (prev.k + 1 < J) {
            j.k = prev.k + 1;
            return j;
        } else {
            j.k = 0;
            j.lr = prev.lr + 1;
        }
        if (j.lr % KL_ROW_CACHE == 0) { /* status and weight of the next rows, one parallel load */
            __syncthreads();
            for (int64_t i = threadIdx.x; i < KL_ROW_CACHE && j.lr + i < my_rows; i += KL_THREADS) {
                const int64_t r = cid + (j.lr + i) * nctas;
                st_cache[i] = kl_row_status(p, r);
                w_cache[i] = p.weights ? p.weights[r] : 1.0f;
                if (SPARSE) r_cache[i] = p.ws_rest[r];
            }
            __syncthreads();
        }
        j.row = cid + j.lr * nctas;
        j.status = st_cache[j.lr % KL_ROW_CACHE];
        j.w = w_cache[j.lr % KL_ROW_CACHE];
        const TS *xs = (const TS *)p.student + j.row * p.s_stride;
        j.xs = xs;
        if (SPARSE) {
            j.xt = nullptr;
            j.rest = r_cache[j.lr % KL_ROW_CACHE];
            j.sp = lf_dual_span_make(xs, xs, V); /* the student's alignment alone */
        } else {
            const TT *xt = (const TT *)p.teacher + j.row * p.t_stride;
            j.xt = xt;
            j.sp = lf_dual_span_make(xs, xt, V);
        }
        return j;
    };
    const bool list_smem = p.topk <= KL_TOPK_SMEM;
    auto issue = [&](const kl_job &j, uint4 *b) {
        if (SPARSE) { /* every job, masked or not, passes the barrier */
            const int slot3 = (int)(j.lr % 3);
            int32_t *ki = k_idx + slot3 * KL_TOPK_SMEM;
            float *kx = k_lp + slot3 * KL_TOPK_SMEM, *ke = j.k == 0 ? k_edge + 16 * slot3 : nullptr;
            const int32_t *gi = p.topk_idx + j.row * p.topk_stride;
            const float *gx = p.topk_lp + j.row * p.topk_stride;
            const int pc = piece_of(j.k);
            const int ub = min(j.sp.nunit, pc * PU), ue = min(j.sp.nunit, ub + PU);
            if (!j.status) {
                lf_dual_part_load<KL_THREADS, TS>(b, (const TS *)j.xs, j.sp, ub, ue, PU);
                lf_dual_part_fill<KL_THREADS>(b + svecs, ub, ue, j.rest, PU, ke, j.sp.nedge);
                if (j.k == 0 && list_smem)
                    for (int i = (int)threadIdx.x; i < (int)p.topk; i += KL_THREADS) {
                        ki[i] = gi[i];
                        kx[i] = gx[i];
                    }
            }
            __syncthreads();
            if (!j.status)
                lf_dual_part_scatter<KL_THREADS>(b + svecs, ub, ue, PU, j.sp, list_smem ? ki : gi, list_smem ? kx : gx,
                                                 (int)p.topk, ke);
            return;
        }
        if (j.status) return;
        const int pc = piece_of(j.k);
        const int ub = min(j.sp.nunit, pc * PU), ue = min(j.sp.nunit, ub + PU);
        lf_dual_piece_load<KL_THREADS, TS, TT>(b, b + svecs, (const TS *)j.xs, (const TT *)j.xt, j.sp, ub, ue, PU);
    };

    lf_dual_acc acc = lf_dual_acc_init();
    float2 acc2 = make_float2(0.0f, 0.0f);
    lf_kl_coef coef;
    memset(&coef, 0, sizeof coef);
    lf_dual_out dout;
    memset(&dout, 0, sizeof dout);
    int slot = 0;

    auto row_outputs = [&](int64_t row, float loss) { kl_row_outputs(p, row, dout, loss); };

    /* The pipeline: job jj is processed while the copies of job jj+1 are in flight into the
     * other buffer (more stages were measured: no gain, bench/RESULTS.md). A thread only ever
     * reads back its own copies, so cp.async.wait_group is all the synchronisation it needs. */
    uint4 *const buf0 = kl_smem, *const buf1 = kl_smem + bvecs;
    kl_job cur;
    memset(&cur, 0, sizeof cur);
    if (njobs > 0) {
        cur = start_job(0, cur);
        issue(cur, buf0);
    }
    lf_cp_async_commit();
    for (int64_t jj = 0; jj < njobs; ++jj) {
        uint4 *const b = (jj & 1) ? buf1 : buf0;
        kl_job nxt = cur;
        if (jj + 1 < njobs) {
            nxt = start_job(jj + 1, cur);
            issue(nxt, (jj & 1) ? buf0 : buf1); /* that buffer held job jj-1: already consumed */
        } else if (SPARSE) {
            __syncthreads(); /* the last job's scatter (in the previous issue) before its readers */
        }
        lf_cp_async_commit();
        lf_cp_async_wait<1>(); /* job jj's copies (this thread's) have landed */

        const int64_t row = cur.row;
        const int k = cur.k;
        TS *out = grad ? (TS *)p.grad + row * p.grad_stride : nullptr;
        if (cur.status) {
            if (k == 0) {
                if (grad)
                    for (int64_t j = threadIdx.x; j < V; j += KL_THREADS) out[j] = lf_elem<TS>::from_f32(0.0f);
                if (threadIdx.x == 0) {
                    if (cur.status == 2 && p.n_errors) atomicAdd(p.n_errors, 1u);
                    memset(&dout, 0, sizeof dout);
                    row_outputs(row, 0.0f);
                }
            }
        } else {
            const TS *xs = (const TS *)cur.xs;
            const TT *xt = (const TT *)cur.xt;
            const float *xe = k_edge + 16 * (int)(cur.lr % 3); /* SPARSE: the teacher's edge values */
            const int pc = piece_of(k);
            const int ub = min(cur.sp.nunit, pc * PU), nu = min(cur.sp.nunit, ub + PU) - ub;
            const uint4 *bs = b, *bt = b + svecs;
            const bool s1 = k < n, m1 = k == n - 1, B = k >= n && k < 2 * n - 1;
            const bool s2 = three && (m1 || B);
            const bool m2 = s2 && pc == 0;
            const bool g = grad && (three ? (m2 || k >= 2 * n - 1) : (m1 || B));
            if (s1) {
                if (k == 0) {
                    acc = lf_dual_acc_init();
                    if (SPARSE) lf_dual_edge_stats_xe<KL_THREADS, TS, LIN, LF_DUAL_FULL>(acc, xs, xe, cur.sp, p.xf);
                    else lf_dual_edge_stats<KL_THREADS, TS, TT, LIN, LF_DUAL_FULL>(acc, xs, xt, cur.sp, p.xf);
                }
                /* (LF_DUAL_LSE, JSD / TVD, takes RB's sweep here: rb is not used, and this kernel's
                 * gradient takes the tested forms whatever pass 1 saw) */
                if (p.terms == LF_DUAL_RB || p.terms == LF_DUAL_LSE)
                    lf_dual_piece_stats<KL_THREADS, TS, TT, LIN, LF_DUAL_RB>(acc, bs, bt, nu, PU, p.xf);
                else if (p.terms == LF_DUAL_RA) lf_dual_piece_stats<KL_THREADS, TS, TT, LIN, LF_DUAL_RA>(acc, bs, bt, nu, PU, p.xf);
                else lf_dual_piece_stats<KL_THREADS, TS, TT, LIN, LF_DUAL_FULL>(acc, bs, bt, nu, PU, p.xf);
            }
            if (m1) {
                const lf_dual_acc racc = lf_block_dual_acc<KL_THREADS>(acc, p.xf.cs, red[slot]);
                dout = lf_dual_final(lf_dual_acc_final(racc, p.xf));
                lf_kl_rev_fit(p.kind, dout); /* a KL past FLT_MAX ln 2: a support mismatch */
                const float gs = grad ? p.grad_scale * (p.reduction == LF_REDUCE_NONE ? (p.dloss ? p.dloss[row] : 1.0f) : dl_all) *
                                            inv_div * cur.w * p.tau2_scale
                                      : 0.0f;
                coef = lf_kl_coef_make(p.kind, p.beta, gs, dout, p.xf, LIN);
                /* an fp32 student: p_j and q_j against each side's maximum, not one rounded lse
                 * (the passes below take that form for it: lf_kl_split) */
                if (lf_kl_split<TS>::value) lf_kl_coef_onto_max(coef, racc);
                acc2 = make_float2(0.0f, 0.0f);
                if (!three && threadIdx.x == 0) {
                    const float l = p.kind == LF_KL_FORWARD ? dout.kl_fwd
                                    : p.kind == LF_KL_REVERSE ? dout.kl_rev
                                                              : dout.kl_fwd + dout.ent_b; /* soft CE */
                    row_outputs(row, l * p.tau2_scale * cur.w);
                }
            }
            if (s2) {
                lf_kl_piece_stats2<KL_THREADS, TS, TT, LIN>(acc2, bs, bt, nu, PU, p.xf, coef);
                if (pc == 0 && SPARSE) lf_kl_edge_stats2_xe<KL_THREADS, TS, LIN>(acc2, xs, xe, cur.sp, p.xf, coef);
                else if (pc == 0) lf_kl_edge_stats2<KL_THREADS, TS, TT, LIN>(acc2, xs, xt, cur.sp, p.xf, coef);
            }
            if (m2) {
                const float2 sums = lf_block_sum2_f32<KL_THREADS>(acc2, red2[slot]);
                float l = lf_kl_coef_set_stats2(coef, sums);
                if (!(fabsf(dout.lse_a) < LF_INF_F) || !(fabsf(dout.lse_b) < LF_INF_F)) l = NAN;
                if (threadIdx.x == 0) row_outputs(row, l * p.tau2_scale * cur.w);
            }
            if (g) {
                const bool vec_ok = ((uintptr_t)(out + cur.sp.head) & 15u) == 0;
                lf_kl_piece_grad<KL_THREADS, TS, TT, LIN>(out, vec_ok, bs, bt, cur.sp, ub, nu, PU, p.xf, coef);
                if (pc == 0 && SPARSE) lf_kl_edge_grad_xe<KL_THREADS, TS, LIN>(out, xs, xe, cur.sp, p.xf, coef);
                else if (pc == 0) lf_kl_edge_grad<KL_THREADS, TS, TT, LIN>(out, xs, xt, cur.sp, p.xf, coef);
            }
            if ((three && m2) || (!three && m1)) slot ^= 1;
        }
        cur = nxt;
    }
    lf_cp_async_wait<0>();
    if (p.reduction != LF_REDUCE_NONE) kl_batch_reduce<KL_THREADS>(p, fin, &is_last, 0);
}

/* ---- The row-resident schedule (sm_90, 16-bit student and teacher, dense teacher) ----------
 * As examples/cross_entropy.cu's ce_resident_kernel: each CTA (or CTA of a cluster: its slice
 * of the row pair) holds a ring of `nstages` shared-memory stages, each one row slice of BOTH
 * rows ([student units | teacher units], su units each), loaded by two bulk copies (the copy
 * engine) that complete on the stage's mbarrier. So each pair is read from HBM once, then from
 * shared memory: pass 1, JSD / TVD's pass 2 and the gradient never go back to global memory.
 * Two warp groups (blockDim = (KL_RES_GROUP, 2)) take alternate rows and share the ring; each
 * merges with its own named barrier and, in a cluster, exchanges its rows' states with the same
 * group of the other CTAs (lf_cluster_post / _posts_wait, no cluster barrier per row). The
 * stage ticket (lf_ticket_*) orders a group's parity wait after the stage's previous use.
 * Per row: wait for the stage, pass 1, block + cluster merge, (pass 2, its merges,) the
 * gradient from the stage, the group barrier, then thread 0 reloads the stage with the CTA's
 * next row and prefetches the one after into L2. Rank 0 of a cluster also takes the row's edge
 * elements (from global memory) and writes the row's outputs. 16-bit sides only: a bulk copy
 * cannot split an fp32 side's units into the two halves that the unit loops read (section 8's
 * piece layout).
 *   Why two groups taking alternate rows: a row's merges are a chain of waits (its block
 * barrier, the peers' records) during which its group has nothing else to do, and the other
 * group's row fills the SM meanwhile. Measured on an H200 and not kept (bench/RESULTS.md,
 * design logs 75-78): one group of 512 threads, even with the next row's pass 1 run ahead of
 * the exchange (1.4-1.6x the time: nothing covers its own stage waits); the two groups
 * splitting each row, pass 1 in one and the rest in the other (21-27% slower); larger groups
 * (fewer registers); every warp posting its record to the cluster instead of a block merge
 * first (slower on clusters of 8-16). More rows in flight need more stages, hence larger
 * clusters, and those cost more than they hide (design log 79: five stages 19-33 points of
 * copy slower, the look-ahead on them no gain); smaller clusters bought by reading the teacher
 * from L2 instead of staging it cost more still (design log 80: 1.5-1.9x the time).
 *   Which rows a CTA takes: static, a fixed share per cluster (cid, cid + nclusters, ...; the
 * next row's status read when a row starts). Dynamic (DYN, the default) as cross_entropy.cu's
 * ring: the first nstages rows that share, then rows drawn from the workspace's counter
 * (lf_ring_draw) by rank 0's thread 0 once its stage's row is known to exist; the drawn row's
 * status is read during pass 1 and its slice prefetched into L2, and in a cluster the row and
 * status go to the peers with pass 1's exchange (lf_ring_next, on the same mbarrier phase;
 * a masked row, which has no statistics, still exchanges), who prefetch their slices. A draw
 * past the last row ends the group: it passes the end on to its stage's next user and stops.
 * The batch sum adds the rows' losses in row order (kl_batch_reduce): the same bits either way. */
#ifndef KL_RES_GROUP
#define KL_RES_GROUP 256
#endif
#define KL_RES_GROUPS 2
#define KL_RES_THREADS (KL_RES_GROUP * KL_RES_GROUPS)
#define KL_RES_MIN_STAGES 3
#define KL_RES_MAX_STAGES 8
/* KL_RES_TRACE (a diagnostic build, off by default; bench_kl prints TIMES lines from it): per
 * CTA of the last launch, %globaltimer ns at its entry, its first stage landed, the end of its
 * row loop (the later group) and its exit, as cross_entropy.cu's CE_RES_TRACE; the cluster CTAs
 * in kl_res_times (the first 1024), the side CTAs in kl_side_times (the first 256: entry, -, the
 * end of their rows, exit after the wait for the cluster grid). What a launch's fixed cost is
 * made of: the ring's fill, the spread of the CTAs' ends, the batch sum. */
#ifdef KL_RES_TRACE
__device__ unsigned long long kl_res_times[1024][4];
__device__ unsigned long long kl_side_times[256][4];
#define KL_TR_SET(arr, j)                                                                          \
    do {                                                                                           \
        if (threadIdx.x == 0 && blockIdx.x < sizeof(arr) / sizeof(arr[0])) arr[blockIdx.x][j] = lf_globaltimer_ns(); \
    } while (0)
#define KL_TR_MAX(arr, j)                                                                          \
    do {                                                                                           \
        if (threadIdx.x == 0 && blockIdx.x < sizeof(arr) / sizeof(arr[0])) atomicMax(&arr[blockIdx.x][j], lf_globaltimer_ns()); \
    } while (0)
#else
#define KL_TR_SET(arr, j) \
    do {                  \
    } while (0)
#define KL_TR_MAX(arr, j) \
    do {                  \
    } while (0)
#endif

/* The factors of a row's gradient scale that hold for the whole launch: the upstream gradient
 * of a reduced loss and the mean's 1 / divisor (0 for a zero divisor). */
static __device__ __forceinline__ void kl_grad_consts(const kl_kparams &p, float *dl_all, float *inv_div)
{
    const bool grad = p.grad != nullptr;
    *dl_all = (grad && p.dloss && p.reduction != LF_REDUCE_NONE) ? p.dloss[0] : 1.0f;
    *inv_div = 1.0f;
    if (grad && p.reduction == LF_REDUCE_MEAN) {
        const float d = kl_mean_divisor(p);
        *inv_div = d == 0.0f ? 0.0f : 1.0f / d;
    }
}

/* The resident kernels' row steps, shared by the cluster CTAs and the side CTAs (the same code,
 * so the same bits). kl_with_terms: f(std::integral_constant<int, T>) for the pass-1 terms the
 * loss needs (T = p.terms). THREE: the kernel of the three-pass kinds (JSD, TVD: LF_DUAL_LSE or
 * _FULL), else of the others (forward / reverse KL, soft CE: _RB, _RA or _FULL). Two kernels:
 * with JSD's pass 1 (LF_DUAL_LSE) as a fourth variant in the one kernel of every kind, forward KL
 * ran 0.4-1.4% slower on an H200 (the same work, other code); so each family has its own. */
template <bool THREE, typename F> static __device__ __forceinline__ void kl_with_terms(int terms, F &&f)
{
    if constexpr (THREE) {
        if (terms == LF_DUAL_LSE) f(std::integral_constant<int, LF_DUAL_LSE>());
        else f(std::integral_constant<int, LF_DUAL_FULL>());
    } else {
        if (terms == LF_DUAL_RB) f(std::integral_constant<int, LF_DUAL_RB>());
        else if (terms == LF_DUAL_RA) f(std::integral_constant<int, LF_DUAL_RA>());
        else f(std::integral_constant<int, LF_DUAL_FULL>());
    }
}

/* A row's statistics from its merged pass-1 state (the terms of T). */
template <int T>
static __device__ __forceinline__ lf_dual_out kl_row_final(const lf_dual_acc &acc, const lf_kl_xf &xf, int kind)
{
    lf_dual_out d = lf_impl_dual_final(lf_dual_acc_final(acc, xf), T == LF_DUAL_FULL, (T & LF_DUAL_RB) != 0, (T & LF_DUAL_RA) != 0);
    if constexpr ((T & LF_DUAL_RA) != 0) lf_kl_rev_fit(kind, d); /* reverse KL's terms only (RB: no kl_rev) */
    return d;
}

/* A row's gradient coefficients: the scale (dl: the row's upstream gradient with reduction
 * none; dl_all, inv_div: kl_grad_consts; w: its weight) and the statistics. (For the resident
 * and side kernels, whose students are 16-bit: the one-float lse, no lf_kl_coef_onto_max.) */
template <bool LIN>
static __device__ __forceinline__ lf_kl_coef kl_row_coef(const kl_kparams &p, const lf_dual_out &dout, float w, float dl,
                                                         float dl_all, float inv_div)
{
    const float gs = p.grad ? p.grad_scale * (p.reduction == LF_REDUCE_NONE ? dl : dl_all) * inv_div * w * p.tau2_scale : 0.0f;
    return lf_kl_coef_make(p.kind, p.beta, gs, dout, p.xf, LIN);
}

/* A row's loss (before tau^2 and its weight); JSD / TVD (three): pass 2's sums set into coef
 * first, NaN where either side's lse is not finite. */
static __device__ __forceinline__ float kl_row_loss(const kl_kparams &p, const lf_dual_out &dout, lf_kl_coef &coef, bool three,
                                                   float2 sums)
{
    if (three) {
        const float l = lf_kl_coef_set_stats2(coef, sums);
        return (fabsf(dout.lse_a) < LF_INF_F && fabsf(dout.lse_b) < LF_INF_F) ? l : NAN;
    }
    return p.kind == LF_KL_FORWARD ? dout.kl_fwd : p.kind == LF_KL_REVERSE ? dout.kl_rev : dout.kl_fwd + dout.ent_b;
}

/* Fill a ring stage ([student units | teacher units], su units each) with nu units of each row
 * (one thread): two bulk copies completing on the stage's mbarrier `full`; with nu = 0 a plain
 * arrive, so the stage's phase still turns (masked rows, rows past the last). */
template <typename TS, typename TT>
static __device__ __forceinline__ void kl_stage_fill(uint4 *stage, int su, uint64_t *full, const TS *xs, const TT *xt, int nu)
{
    if (nu == 0) {
        lf_mbar_arrive(full);
        return;
    }
    lf_mbar_arrive_tx(full, 32u * (uint32_t)nu);
    lf_bulk_load(stage, xs, 16u * (uint32_t)nu, full);
    lf_bulk_load(stage + su, xt, 16u * (uint32_t)nu, full);
}

template <typename TS, typename TT, bool LIN, bool DYN, bool THREE>
__global__ void __launch_bounds__(KL_RES_THREADS, 1)
    kl_res_kernel(const kl_kparams p, int nranks, int nstages, int su, int nclusters)
{
    constexpr int TH = KL_RES_GROUP, G = KL_RES_GROUPS;
    /* DYN, a template parameter as in cross_entropy.cu (a runtime flag there cost 3% where not taken) */
    constexpr bool dyn = DYN;
    static_assert(sizeof(TS) == 2 && sizeof(TT) == 2, "the resident schedule stages 16-bit sides");
    static_assert(!DYN || G <= 2, "dynamic rows: the end-of-rows hand-off below holds for at most two groups");
    /* [nstages][2 su], aligned to 128 bytes (as cross_entropy.cu's ring: where the static
     * variables leave the stages matters, measured there) */
    extern __shared__ __align__(128) uint4 kl_res_smem[];
    __shared__ uint64_t full[KL_RES_MAX_STAGES];
    __shared__ int stage_st[KL_RES_MAX_STAGES];    /* the status of the row in the stage */
    __shared__ uint32_t stage_row[KL_RES_MAX_STAGES]; /* dynamic: the row in the stage, UINT32_MAX: no more */
    __shared__ int64_t stage_k[KL_RES_MAX_STAGES]; /* the ticket: local row last loaded, -1 none */
    __shared__ int st0[KL_RES_MAX_STAGES + G];     /* statuses of the first rows */
    __shared__ lf_dual_acc red[G][2][TH / 32];
    __shared__ float2 red2[G][2][TH / 32];
    __shared__ lf_dual_acc xa[G][2][16]; /* cluster exchange, pass 1: per group, two sets */
    __shared__ float2 xb[G][2][16];      /* ... pass 2 */
    __shared__ lf_ring_next xnx[G][2];   /* ... and, dynamic, rank 0's next row (with pass 1) */
    __shared__ uint64_t xbar[G][2][2];   /* [group][pass][set] */
    __shared__ double fin[TH / 32];
    __shared__ int is_last;

    if (p.ctas_all) lf_pdl_trigger(); /* side CTAs follow (kl_side_kernel): they may start now */
    const int grp = (int)threadIdx.y, bar = 1 + grp;
    if (grp == 0) KL_TR_SET(kl_res_times, 0);
    const int rank = (int)(blockIdx.x % nranks);
    const int64_t cid = blockIdx.x / nranks, N = p.n_rows, V = p.vocab;
    /* Rows: static, this cluster's cid, cid + nclusters, ... (local row k is the k-th); dynamic,
     * the first nstages the same, then whichever row the workspace's counter hands out (from
     * nclusters * nstages on, lf_ring_draw) when a stage is reloaded; in a cluster rank 0 draws
     * and posts the row and its status with pass 1's exchange. */
    const int64_t my_rows = dyn ? INT64_MAX : cid < N ? (N - 1 - cid) / nclusters + 1 : 0;
    const int64_t drawn0 = (int64_t)nclusters * nstages;
    /* JSD, TVD: in the THREE kernel at compile time; the other one keeps the test and pass 2's
     * code, which it never runs: without them forward KL ran 0.9-2.2% slower at V = 32768 and
     * 0.6-1.1% at 151936 (reverse KL 0.9-1.4% faster) on an H200, the same work in other code */
    const bool three = THREE || p.kind == LF_KL_JSD || p.kind == LF_KL_TVD;
    const bool grad = p.grad != nullptr;
    /* JSD: this group's kept pass-2 values (p.jsd_keep units, two planes), after the stages */
    uint4 *const keep = p.jsd_keep > 0 ? kl_res_smem + (size_t)nstages * 2 * su + (size_t)grp * 2 * p.jsd_keep : nullptr;
    if (threadIdx.x == 0 && grp == 0) {
        for (int q = 0; q < nstages; ++q) {
            lf_mbar_init(&full[q], 1);
            stage_k[q] = -1;
        }
        for (int g = 0; g < G; ++g)
            for (int i = 0; i < 4; ++i) lf_mbar_init(&xbar[g][i >> 1][i & 1], 1u); /* lf_cluster_post */
        lf_mbar_init_fence();
    }
    /* local row kk's row while it is known in advance (static: all; dynamic: the ring's first
     * nstages), -1 past the rows */
    auto row_of = [&](int64_t kk) -> int64_t {
        const int64_t r = cid + kk * nclusters;
        return kk < my_rows && r < N ? r : -1;
    };
    if (grp == G - 1 && (int)threadIdx.x < nstages + (dyn ? 0 : G) && row_of(threadIdx.x) >= 0)
        st0[threadIdx.x] = kl_row_status(p, row_of(threadIdx.x));
    __syncthreads();
    if (nranks > 1) lf_cluster_sync(); /* every CTA's mbarriers exist before any post */

    float dl_all, inv_div;
    kl_grad_consts(p, &dl_all, &inv_div);
    auto status_of = [&](int64_t kk) -> int { /* static */
        if (kk >= my_rows) return 1;
        return kk < nstages + G ? st0[kk] : kl_row_status(p, row_of(kk));
    };
    /* This CTA's units of `row`: the first, the count, and the two rows' bodies. */
    auto slice_of = [&](int64_t row, const TS **xs, const TT **xt, int *ub, int *nu) {
        *xs = (const TS *)p.student + row * p.s_stride;
        *xt = (const TT *)p.teacher + row * p.t_stride;
        const lf_dual_span sp = lf_dual_span_make(*xs, *xt, V);
        *ub = rank * su;
        *nu = max(0, min(su, sp.nunit - *ub));
        *xs += sp.head + 8 * (int64_t)*ub;
        *xt += sp.head + 8 * (int64_t)*ub;
    };
    /* Load `row` (-1: none, no more rows) into stage q as local row kk: by one thread. */
    auto load = [&](int q, int64_t kk, int64_t row, int status) {
        stage_st[q] = status; /* published by the arrive (release) */
        stage_row[q] = row < 0 ? UINT32_MAX : (uint32_t)row;
        lf_ticket_store(&stage_k[q], kk);
        const TS *xs = nullptr;
        const TT *xt = nullptr;
        int ub, nu = 0;
        if (row >= 0 && !status) slice_of(row, &xs, &xt, &ub, &nu);
        kl_stage_fill(kl_res_smem + (size_t)q * 2 * su, su, &full[q], xs, xt, nu);
    };
    auto prefetch = [&](int64_t row, int status) { /* one thread: this CTA's slice of `row` into L2 */
        if (row < 0 || status) return;
        const TS *xs;
        const TT *xt;
        int ub, nu;
        slice_of(row, &xs, &xt, &ub, &nu);
        if (nu == 0) return;
        lf_bulk_prefetch_l2(xs, 16u * (uint32_t)nu);
        lf_bulk_prefetch_l2(xt, 16u * (uint32_t)nu);
    };
    if (threadIdx.x == 0 && grp == 0) {
        if (dyn) { /* every stage is loaded, past the last row with the end */
            for (int q = 0; q < nstages; ++q) load(q, q, row_of(q), row_of(q) >= 0 ? st0[q] : 1);
        } else {
            for (int q = 0; q < nstages && q < my_rows; ++q) load(q, q, row_of(q), st0[q]);
            if (nstages < my_rows) prefetch(row_of(nstages), st0[nstages]);
        }
    }

    unsigned x_phase = 0; /* bit 2 pass + set: the parity of xbar[grp][pass][set]'s next phase */
    int xq = 0, par = 0, q = grp;
    unsigned use_par = 0;
    for (int64_t k = grp; k < my_rows; k += G) {
        int64_t row = row_of(k); /* static; dynamic: known once the stage has landed */
        const int64_t k_next = k + nstages;
        int st_next = 1, st_pf = 1; /* static, thread 0: the rows it loads / prefetches after this one */
        if (!dyn && threadIdx.x == 0) {
            st_next = status_of(k_next);
            st_pf = status_of(k_next + 1);
        }
        if ((threadIdx.x & 31u) == 0)
            while (lf_ticket_load(&stage_k[q]) != k) {
            }
        __syncwarp();
        lf_mbar_wait(&full[q], use_par);
        if (k == 0) KL_TR_SET(kl_res_times, 1);
        int64_t r_next = -1; /* dynamic: the row this stage takes next, and its status */
        int st_dyn = 1;
        if (dyn) {
            row = stage_row[q] == UINT32_MAX ? -1 : (int64_t)stage_row[q];
            if (row < 0) {
                /* No more rows: the stage passes the end on to its next user (after the group's
                 * barrier: no thread still waits on its phase) and the group stops (as in
                 * cross_entropy.cu's ring; every CTA of a cluster meets it at the same local row) */
                lf_block_bar<TH>(bar);
                if (threadIdx.x == 0) load(q, k_next, -1, 1);
                break;
            }
            /* the next row, drawn once this one is known to exist (every draw is used); its
             * status is read after pass 1's element loops, when it is posted to the peers */
            if (threadIdx.x == 0 && rank == 0) r_next = p.cluster_no_draw ? -1 : lf_ring_draw(&p.ws->row_next, drawn0, N);
        }
        const TS *xs = (const TS *)p.student + row * p.s_stride;
        const TT *xt = (const TT *)p.teacher + row * p.t_stride;
        const lf_dual_span sp = lf_dual_span_make(xs, xt, V);
        TS *out = grad ? (TS *)p.grad + row * p.grad_stride : nullptr;
        const float w = p.weights ? p.weights[row] : 1.0f;
        const float dl = (grad && p.dloss && p.reduction == LF_REDUCE_NONE) ? p.dloss[row] : 1.0f;
        /* dynamic, thread 0 of rank 0: the drawn row's status and its slice's L2 prefetch */
        auto draw_status = [&]() {
            if (dyn && threadIdx.x == 0 && rank == 0 && r_next >= 0) {
                st_dyn = kl_row_status(p, r_next);
                prefetch(r_next, st_dyn);
            }
        };
        /* pass 1's exchange: rank 0 also stores the drawn row and its status into every CTA's
         * xnx on the same phase (thread 0's values, by lanes 0 .. nranks-1 of warp 0), which
         * each CTA expects before its own post; after the wait every CTA's thread 0 takes them */
        auto exchange1 = [&](const lf_dual_acc &acc) {
            if (dyn) {
                const int64_t rn = __shfl_sync(0xffffffffu, r_next, 0);
                const int sn = __shfl_sync(0xffffffffu, st_dyn, 0);
                if ((int)threadIdx.x == rank) lf_mbar_expect_tx(&xbar[grp][0][xq], (uint32_t)sizeof(lf_ring_next));
                if (rank == 0 && (int)threadIdx.x < nranks)
                    lf_cluster_store(lf_ring_next_make(rn, sn), &xnx[grp][xq], &xbar[grp][0][xq], (int)threadIdx.x);
            }
            lf_cluster_post(acc, xa[grp][xq], &xbar[grp][0][xq], rank, nranks);
            lf_cluster_posts_wait(&xbar[grp][0][xq], (x_phase >> xq) & 1u);
            x_phase ^= 1u << xq;
            if (dyn && threadIdx.x == 0 && rank != 0) {
                const lf_ring_next nx = xnx[grp][xq];
                r_next = lf_ring_next_row(nx);
                st_dyn = nx.tag;
                prefetch(r_next, st_dyn);
            }
        };
        const int status = stage_st[q];
        const int ub = rank * su, nu = max(0, min(su, sp.nunit - ub));
        if (status) {
            draw_status();
            if (grad) { /* this CTA's units and, on rank 0, the edges */
                const TS z = lf_elem<TS>::from_f32(0.0f);
                for (int64_t j = sp.head + 8 * (int64_t)ub + threadIdx.x; j < sp.head + 8 * (int64_t)(ub + nu); j += TH) out[j] = z;
                if (rank == 0)
                    for (int e = (int)threadIdx.x; e < sp.nedge; e += TH) out[lf_dual_edge_index(sp, e)] = z;
            }
            if (dyn && nranks > 1) { /* no statistics, but the next row to hand on (no barrier needed:
                                      * the row-end barrier lies between the last collect and this post) */
                exchange1(lf_dual_acc_init());
                xq ^= 1;
            }
            if (rank == 0 && threadIdx.x == 0) {
                if (status == 2 && p.n_errors) atomicAdd(p.n_errors, 1u);
                kl_row_outputs(p, row, kl_dual_out_zero(), 0.0f);
            }
        } else {
            const uint4 *bs = kl_res_smem + (size_t)q * 2 * su, *bt = bs + su;
            /* pass 1, its merges and the row's statistics, for the terms the loss needs (T);
             * exact: this thread's units may hold special values (the gradient's tested forms) */
            lf_dual_out dout;
            bool exact = false;
            auto pass1 = [&](auto terms) {
                constexpr int T = decltype(terms)::value;
                lf_dual_acc acc = lf_dual_acc_init();
                if (rank == 0) lf_dual_edge_stats<TH, TS, TT, LIN, LF_DUAL_FULL>(acc, xs, xt, sp, p.xf);
                exact = lf_dual_piece_stats<TH, TS, TT, LIN, T>(acc, bs, bt, nu, su, p.xf);
                draw_status();
                acc = lf_block_dual_acc<TH, T>(acc, p.xf.cs, red[grp][par], bar);
                if (nranks > 1) {
                    exchange1(acc);
                    acc = lf_dual_acc_merge_warp<T>(xa[grp][xq], nranks, p.xf.cs);
                }
                dout = kl_row_final<T>(acc, p.xf, p.kind);
            };
            kl_with_terms<THREE>(p.terms, pass1);
            lf_kl_coef coef = kl_row_coef<LIN>(p, dout, w, dl, dl_all, inv_div);
            float2 sums = make_float2(0.0f, 0.0f);
            if (three) {
                float2 acc2 = make_float2(0.0f, 0.0f);
                exact |= lf_kl_piece_stats2<TH, TS, TT, LIN>(acc2, bs, bt, nu, su, p.xf, coef, keep, p.jsd_keep);
                if (rank == 0) lf_kl_edge_stats2<TH, TS, TT, LIN>(acc2, xs, xt, sp, p.xf, coef);
                sums = lf_block_sum2_f32<TH>(acc2, red2[grp][par], bar);
                if (nranks > 1) {
                    lf_cluster_post(sums, xb[grp][xq], &xbar[grp][1][xq], rank, nranks);
                    lf_cluster_posts_wait(&xbar[grp][1][xq], (x_phase >> (2 + xq)) & 1u);
                    x_phase ^= 1u << (2 + xq);
                    sums = xb[grp][xq][0];
                    for (int r = 1; r < nranks; ++r) {
                        sums.x += xb[grp][xq][r].x;
                        sums.y += xb[grp][xq][r].y;
                    }
                }
            }
            const float l = kl_row_loss(p, dout, coef, three, sums);
            if (nranks > 1) xq ^= 1;
            par ^= 1;
            if (grad) {
                const bool vec_ok = ((uintptr_t)(out + sp.head) & 15u) == 0;
                lf_kl_piece_grad<TH, TS, TT, LIN>(out, vec_ok, bs, bt, sp, ub, nu, su, p.xf, coef, exact, keep, p.jsd_keep);
                if (rank == 0) lf_kl_edge_grad<TH, TS, TT, LIN>(out, xs, xt, sp, p.xf, coef);
            }
            if (rank == 0 && threadIdx.x == 0) kl_row_outputs(p, row, dout, l * p.tau2_scale * w);
        }
        /* the group is done with the stage: its thread 0 reloads it */
        lf_block_bar<TH>(bar);
        if (threadIdx.x == 0 && dyn) {
            load(q, k_next, r_next, st_dyn);
        } else if (threadIdx.x == 0 && k_next < my_rows) {
            load(q, k_next, row_of(k_next), st_next);
            prefetch(row_of(k_next + 1), st_pf);
        }
        q += G;
        if (q >= nstages) {
            q -= nstages;
            use_par ^= 1u;
        }
    }
    KL_TR_MAX(kl_res_times, 2);
    __syncthreads();
    if (nranks > 1) lf_cluster_sync(); /* no CTA leaves while a peer may still post to it */
    /* the batch sum (its rows' losses are in row order in the workspace: the same bits whichever
     * CTA took a row); dynamic, also with reduction none: the last CTA resets the row counter */
    if ((p.reduction != LF_REDUCE_NONE || dyn) && grp == 0) kl_batch_reduce<TH>(p, fin, &is_last, bar);
    if (grp == 0) KL_TR_SET(kl_res_times, 3);
}

/* Side CTAs: the SMs a cluster grid leaves idle, filled. A grid of clusters of c CTAs runs on
 * fewer SMs than the device has (a cluster lives in one GPC: an H200 runs 15 clusters of 8 =
 * 120 of its 132 SMs, 7 of 16 = 112), and on an H200 the resident kernel is bound by its SMs,
 * not by memory (bench/RESULTS.md, session 21). kl_side_kernel runs on those SMs, launched
 * after kl_res_kernel with programmatic dependent launch: every kl_res_kernel CTA triggers at
 * its start, so the side grid starts once the clusters are resident, and it cannot share their
 * SMs (they hold all the registers). Its CTAs draw rows from the same counter and compute each
 * one as a whole cluster would, slice by slice: the same per-slice merges into records (slice r
 * by group r % 2), the same record merge, the same gradient forms. So a row has the same bits
 * whichever grid took it, and the launch stays deterministic.
 *   The slices come through a ring of `nstages` shared-memory stages filled by bulk copies, as
 * in the clusters, but a side CTA's row does not fit: each pass visits the row's c slices in
 * turn (pass 1; JSD / TVD's pass 2; the gradient), so a slice is copied once per pass, from L2
 * (the row is prefetched there when it is drawn). Visit v of the CTA (row j = v / nv, pass,
 * slice r; nv = passes x c visits per row, masked rows too, with nothing copied) goes to stage
 * v % nstages; the group that finishes it reloads that stage with visit v + nstages (the stage
 * ticket orders the consumer's parity wait, as in kl_res_kernel). The next row is drawn when a
 * row starts and read by the loaders only after the row's first pass barrier, so a pass's
 * loads reach the next row only from the second pass on: nstages <= (passes - 1) x c (the
 * launcher's rule; a forward-only launch, one pass, takes no side CTAs).
 *   A side CTA takes a whole row, c / 2 times as long as a cluster group would at the same speed
 * per SM, and holds the next row it drew: it stops drawing while `reserve` rows are left for
 * the clusters, KL_SIDE_RESERVE per cluster CTA, 0 when forced (the tests). The clusters finish
 * R x c rows per cluster in R x c / 2 group-row times, and a side CTA's last two rows take c
 * such times at full speed per SM: R = 2 covers that, 3 covers a side SM at 2/3 of a cluster
 * SM's speed (a side SM did 76% of a cluster SM's work at 4096 x 131072 on an H200, its idle
 * end included: session 23's test_kl_gpu, reserve 4). Measured (bench/RESULTS.md, design log
 * 69): at 4096 rows 2, 3 and 4 within 0.7 points of copy of each other, 2 and 3 ahead of 4 by
 * 0-0.8; at 16384 rows the calls were too noisy to choose.
 *   At the end a side CTA waits for the cluster grid to complete (griddepcontrol.wait) before
 * it counts itself done: the launch's last CTA is then a side CTA, the batch sum sees every
 * row, and the kernels after this launch on the stream also wait for both grids. */
#ifndef KL_SIDE_RESERVE
#define KL_SIDE_RESERVE 3 /* rows left to the clusters at the end: this many per CTA of theirs */
#endif
template <typename TS, typename TT, bool LIN, bool THREE>
__global__ void __launch_bounds__(KL_RES_THREADS, 1)
    kl_side_kernel(const kl_kparams p, int nranks, int nstages, int su, int64_t first, int64_t reserve)
{
    constexpr int TH = KL_RES_GROUP, G = KL_RES_GROUPS;
    extern __shared__ __align__(128) uint4 kl_side_smem[]; /* [nstages][2 su], as kl_res_kernel's ring */
    __shared__ uint64_t full[KL_RES_MAX_STAGES];
    __shared__ int64_t stage_k[KL_RES_MAX_STAGES]; /* the ticket: the visit last loaded, -1 none */
    __shared__ lf_dual_acc red[G][2][TH / 32];
    __shared__ float2 red2[G][2][TH / 32];
    __shared__ lf_dual_acc xa[16];
    __shared__ float2 xb[16];
    __shared__ int64_t s_row[2];
    __shared__ int s_st[2];
    __shared__ double fin[TH / 32];
    __shared__ int is_last;
    const int grp = (int)threadIdx.y, bar = 1 + grp;
    const bool lead = threadIdx.x == 0 && grp == 0;
    if (grp == 0) KL_TR_SET(kl_side_times, 0);
    const int64_t N = p.n_rows, V = p.vocab;
    const bool three = THREE || p.kind == LF_KL_JSD || p.kind == LF_KL_TVD; /* as kl_res_kernel's */
    const bool grad = p.grad != nullptr;
    const int passes = 1 + (int)three + (int)grad, nv = passes * nranks;
    float dl_all, inv_div;
    kl_grad_consts(p, &dl_all, &inv_div);
    /* a row while more than `reserve` are left (a relaxed look, then the draw: a race takes one
     * of the reserved rows, which is still a row owed and done) into slot b, with its status;
     * its pair prefetched into L2, from where the stages are loaded */
    auto draw = [&](int b) {
        const unsigned long long c = *(volatile const unsigned long long *)&p.ws->row_next;
        const int64_t r = (int64_t)c + first + reserve >= N ? -1 : lf_ring_draw(&p.ws->row_next, first, N);
        const int st = r >= 0 ? kl_row_status(p, r) : 1;
        if (r >= 0 && !st) {
            const TS *xs = (const TS *)p.student + r * p.s_stride;
            const TT *xt = (const TT *)p.teacher + r * p.t_stride;
            const lf_dual_span sp = lf_dual_span_make(xs, xt, V);
            if (sp.nunit > 0) {
                lf_bulk_prefetch_l2(xs + sp.head, 16u * (uint32_t)sp.nunit);
                lf_bulk_prefetch_l2(xt + sp.head, 16u * (uint32_t)sp.nunit);
            }
        }
        s_row[b] = r;
        s_st[b] = st;
    };
    /* Load visit v into its stage (one thread; nothing past the last row): slice v % nranks of
     * row v / nv, whose slot is known to this thread (see above). */
    auto load = [&](int64_t v) {
        const int b = (int)((v / nv) & 1);
        const int64_t row = s_row[b];
        if (row < 0) return;
        const int q = (int)(v % nstages), r = (int)(v % nranks);
        lf_ticket_store(&stage_k[q], v);
        int nu = 0;
        const TS *xs = (const TS *)p.student + row * p.s_stride;
        const TT *xt = (const TT *)p.teacher + row * p.t_stride;
        if (!s_st[b]) {
            const lf_dual_span sp = lf_dual_span_make(xs, xt, V);
            nu = max(0, min(su, sp.nunit - r * su));
            xs += sp.head + 8 * (int64_t)r * su;
            xt += sp.head + 8 * (int64_t)r * su;
        }
        kl_stage_fill(kl_side_smem + (size_t)q * 2 * su, su, &full[q], xs, xt, nu);
    };
    /* Visit v: wait for its stage, f(student slice, teacher slice), then the group's barrier
     * (no thread reads the stage any more) and its thread 0 reloads the stage with v + nstages. */
    auto visit = [&](int64_t v, auto &&f) {
        const int q = (int)(v % nstages);
        if ((threadIdx.x & 31u) == 0)
            while (lf_ticket_load(&stage_k[q]) != v) {
            }
        __syncwarp();
        lf_mbar_wait(&full[q], (unsigned)((v / nstages) & 1));
        const uint4 *bs = kl_side_smem + (size_t)q * 2 * su;
        f(bs, bs + su);
        lf_block_bar<TH>(bar);
        if (threadIdx.x == 0) load(v + nstages);
    };
    if (lead) {
        for (int q = 0; q < nstages; ++q) {
            lf_mbar_init(&full[q], 1);
            stage_k[q] = -1;
        }
        lf_mbar_init_fence();
        draw(0);
    }
    __syncthreads();
    if (lead)
        for (int v = 0; v < nstages; ++v) load(v); /* nstages <= nv: row 0's */
    int par = 0;
    for (int64_t j = 0;; ++j) {
        const int buf = (int)(j & 1);
        const int64_t row = s_row[buf];
        if (row < 0) break;
        if (lead) { /* the next row (read by the loaders after this row's first pass barrier) */
            draw(buf ^ 1);
            atomicAdd(&p.ws->side_rows, 1u);
        }
        const int status = s_st[buf];
        const int64_t v0 = j * nv;
        const TS *xs = (const TS *)p.student + row * p.s_stride;
        const TT *xt = (const TT *)p.teacher + row * p.t_stride;
        const lf_dual_span sp = lf_dual_span_make(xs, xt, V);
        TS *out = grad ? (TS *)p.grad + row * p.grad_stride : nullptr;
        const int tid = (int)threadIdx.x + TH * grp;
        if (status) { /* the whole row's gradient zero, its outputs zero (as every rank of a cluster);
                       * its visits still pass through the ring, with nothing copied */
            if (grad) {
                const TS z = lf_elem<TS>::from_f32(0.0f);
                for (int64_t j2 = tid; j2 < V; j2 += TH * G) out[j2] = z;
            }
            if (lead) {
                if (status == 2 && p.n_errors) atomicAdd(p.n_errors, 1u);
                kl_row_outputs(p, row, kl_dual_out_zero(), 0.0f);
            }
            for (int pass = 0; pass < passes; ++pass) {
                for (int r = grp; r < nranks; r += G) visit(v0 + pass * nranks + r, [](const uint4 *, const uint4 *) {});
                __syncthreads(); /* as an unmasked row's pass barrier: the next row's slot is read after it */
            }
        } else {
            const float w = p.weights ? p.weights[row] : 1.0f;
            const float dl = (grad && p.dloss && p.reduction == LF_REDUCE_NONE) ? p.dloss[row] : 1.0f;
            unsigned exact = 0u; /* bit r: rank r's slice went the long way (its lf_kl_piece_grad `exact`) */
            auto units = [&](int r) { return max(0, min(su, sp.nunit - r * su)); };
            lf_dual_out dout;
            auto pass1 = [&](auto terms) {
                constexpr int T = decltype(terms)::value;
                for (int r = grp; r < nranks; r += G) {
                    lf_dual_acc acc = lf_dual_acc_init();
                    if (r == 0) lf_dual_edge_stats<TH, TS, TT, LIN, LF_DUAL_FULL>(acc, xs, xt, sp, p.xf);
                    visit(v0 + r, [&](const uint4 *bs, const uint4 *bt) {
                        if (lf_dual_piece_stats<TH, TS, TT, LIN, T>(acc, bs, bt, units(r), su, p.xf)) exact |= 1u << r;
                    });
                    acc = lf_block_dual_acc<TH, T>(acc, p.xf.cs, red[grp][par], bar);
                    par ^= 1;
                    if (threadIdx.x == 0) xa[r] = acc;
                }
                __syncthreads();
                dout = kl_row_final<T>(lf_dual_acc_merge_warp<T>(xa, nranks, p.xf.cs), p.xf, p.kind);
            };
            kl_with_terms<THREE>(p.terms, pass1);
            lf_kl_coef coef = kl_row_coef<LIN>(p, dout, w, dl, dl_all, inv_div);
            float2 sums = make_float2(0.0f, 0.0f);
            if (three) {
                for (int r = grp; r < nranks; r += G) {
                    float2 acc2 = make_float2(0.0f, 0.0f);
                    visit(v0 + nranks + r, [&](const uint4 *bs, const uint4 *bt) {
                        if (lf_kl_piece_stats2<TH, TS, TT, LIN>(acc2, bs, bt, units(r), su, p.xf, coef)) exact |= 1u << r;
                    });
                    if (r == 0) lf_kl_edge_stats2<TH, TS, TT, LIN>(acc2, xs, xt, sp, p.xf, coef);
                    const float2 s2 = lf_block_sum2_f32<TH>(acc2, red2[grp][par], bar);
                    par ^= 1;
                    if (threadIdx.x == 0) xb[r] = s2;
                }
                __syncthreads();
                sums = xb[0]; /* in rank order, as the cluster adds its peers' sums */
                for (int r = 1; r < nranks; ++r) {
                    sums.x += xb[r].x;
                    sums.y += xb[r].y;
                }
            }
            const float l = kl_row_loss(p, dout, coef, three, sums);
            if (grad) {
                const bool vec_ok = ((uintptr_t)(out + sp.head) & 15u) == 0;
                for (int r = grp; r < nranks; r += G) {
                    visit(v0 + (passes - 1) * nranks + r, [&](const uint4 *bs, const uint4 *bt) {
                        lf_kl_piece_grad<TH, TS, TT, LIN>(out, vec_ok, bs, bt, sp, r * su, units(r), su, p.xf, coef,
                                                          (exact >> r) & 1u);
                    });
                    if (r == 0) lf_kl_edge_grad<TH, TS, TT, LIN>(out, xs, xt, sp, p.xf, coef);
                }
            }
            if (lead) kl_row_outputs(p, row, dout, l * p.tau2_scale * w);
        }
        __syncthreads(); /* xa, xb and s_row[buf] free again */
    }
    if (grp == 0) KL_TR_SET(kl_side_times, 2);
    lf_pdl_wait(); /* the cluster grid has completed and its rows' losses are visible */
    if (grp == 0) kl_batch_reduce<TH>(p, fin, &is_last, bar);
    if (grp == 0) KL_TR_SET(kl_side_times, 3);
}

/* ============================================================================================
 * 3. Launcher
 * ========================================================================================== */

#define KL_CHECK(call)                                                                              \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            if (cuda_err) *cuda_err = e_;                                                           \
            return LF_ERR_DEVICE;                                                                   \
        }                                                                                           \
    } while (0)

#ifndef KL_MAX_DEVICES
#define KL_MAX_DEVICES 64 /* devices a process may launch on (per-device launch setup) */
#endif

template <typename TS, typename TT, bool LIN, bool SPARSE>
static lf_status kl_launch_kernel(kl_kparams p, kl_plan *plan, cudaStream_t stream, cudaError_t *cuda_err)
{
    auto kernel = kl_kernel<TS, TT, LIN, SPARSE>;
    const int smem = SPARSE ? KL_SMEM_SPARSE_BYTES : KL_SMEM_BYTES;
    /* per instantiation and per device (cudaFuncSetAttribute holds for the current device only),
     * once: the shared-memory opt-in and the occupancy */
    static int ready_d[KL_MAX_DEVICES], active_d[KL_MAX_DEVICES];
    int dev = 0;
    KL_CHECK(cudaGetDevice(&dev));
    if (dev < 0 || dev >= KL_MAX_DEVICES) return LF_ERR_DEVICE;
    int &active = active_d[dev];
    if (!ready_d[dev]) {
        int sms = 0, per_sm = 0;
        KL_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        KL_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        KL_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, KL_THREADS, smem));
        if (per_sm == 0) return LF_ERR_DEVICE;
        active = sms * per_sm;
        ready_d[dev] = 1;
    }
    p.piece_units = KL_PIECE_BYTES / (8 * (int)(sizeof(TS) + sizeof(TT)));
    const int64_t units = (p.vocab + 7) / 8;
    const int npieces = (int)((units + p.piece_units - 1) / p.piece_units);
    const int nctas = (int)(p.n_rows < active ? p.n_rows : active);
    if (plan) {
        plan->schedule = KL_SCHED_STREAM;
        plan->pieces = npieces < 1 ? 1 : npieces;
        plan->piece_units = p.piece_units;
        plan->cluster = 1;
        plan->stages = 0;
        plan->ctas = nctas;
        plan->dynamic = 0;
        plan->side_ctas = 0;
        plan->jsd_keep = 0;
        plan->soft_target = 0;
    }
    kernel<<<nctas, KL_THREADS, smem, stream>>>(p, npieces < 1 ? 1 : npieces, nctas);
    KL_CHECK(cudaGetLastError());
    return LF_OK;
}

/* The row-resident schedule, if it applies (else *launched = false and nothing happens; with
 * `forced` an error instead). Plan (lossfuse_cuda.cuh, lf_ring_plan_make): the cluster size
 * whose slices of the pair (student + teacher units) fit `stages` stages (automatic: at least
 * KL_RES_MIN_STAGES, as many as fit, at most KL_RES_MAX_STAGES) and keeps the most CTAs
 * resident, the smaller on a tie. */
template <typename TS, typename TT, bool LIN, bool THREE>
static lf_status kl_launch_resident(kl_kparams p, const kl_args *a, bool forced, cudaStream_t stream, cudaError_t *cuda_err,
                                    bool *launched)
{
    *launched = false;
    kl_plan *const plan = a->plan;
    if constexpr (sizeof(TS) != 2 || sizeof(TT) != 2) {
        return forced ? LF_ERR_ARG : LF_OK;
    } else {
        auto kernel = kl_res_kernel<TS, TT, LIN, false, THREE>;
        auto kernel_dyn = kl_res_kernel<TS, TT, LIN, true, THREE>;
        static lf_ring_device ring_d[KL_MAX_DEVICES], ring_dyn_d[KL_MAX_DEVICES]; /* per instantiation and device: set up once */
        int dev = 0;
        KL_CHECK(cudaGetDevice(&dev));
        if (dev < 0 || dev >= KL_MAX_DEVICES) return LF_ERR_DEVICE;
        KL_CHECK(lf_ring_setup(kernel, dev, &ring_d[dev]));
        if (ring_d[dev].dyn_max <= 0) return forced ? LF_ERR_DEVICE : LF_OK;
        /* units of a pair: 8 elements of each row, 32 bytes; a pair's own span may have one less */
        lf_ring_req r = lf_ring_req_make(p.vocab / 8, 32, p.n_rows);
        r.max_cluster = a->max_cluster;
        r.stages = a->stages;
        r.min_stages = KL_RES_MIN_STAGES;
        r.max_stages = KL_RES_MAX_STAGES;
        r.groups_per_cta = KL_RES_GROUPS;
        const dim3 block(KL_RES_GROUP, KL_RES_GROUPS, 1);
        lf_ring_plan pl;
        KL_CHECK(lf_ring_plan_make(kernel, block, dev, &ring_d[dev], r, &pl));
        if (pl.cluster == 0) return forced ? LF_ERR_SIZE : LF_OK;
        /* JSD with a gradient: each group keeps pass 2's log2 p - log2 M for the gradient pass in
         * what shared memory the stages leave (32 bytes per unit and group; kl_args.jsd_keep) */
        p.jsd_keep = 0;
        if (p.kind == LF_KL_JSD && p.grad && a->jsd_keep == 0) {
            /* both kernels' shared-memory opt-in: the dynamic one is set up here too */
            KL_CHECK(lf_ring_setup(kernel_dyn, dev, &ring_dyn_d[dev]));
            const int64_t dmax = ring_d[dev].dyn_max < ring_dyn_d[dev].dyn_max ? ring_d[dev].dyn_max : ring_dyn_d[dev].dyn_max;
            const size_t stage_bytes = (size_t)pl.stages * 32 * pl.slice_units;
            const int64_t room = (dmax - (int64_t)stage_bytes) / (32 * KL_RES_GROUPS);
            p.jsd_keep = (int)(room < pl.slice_units ? room : pl.slice_units);
            if (p.jsd_keep < KL_RES_GROUP) p.jsd_keep = 0; /* not one unit per thread: not worth a second loop */
            pl.dyn_bytes = stage_bytes + (size_t)p.jsd_keep * 32 * KL_RES_GROUPS;
        }
        /* Rows handed out dynamically (unless static_rows; fewer than 2^32 rows): every resident
         * cluster starts, and those on faster SMs take more rows (cross_entropy.cu measured its
         * CTAs' fixed shares finishing up to 17% apart on an H200). All resident clusters, not
         * lf_ring_plan's `streaming` count: that rule was measured with the cross-entropy's
         * 4 B/elem, not here. */
        bool dyn = a->static_rows <= 0 && p.n_rows < ((int64_t)1 << 32);
        if (dyn) { /* the dynamic kernel's own shared-memory opt-in; the plan's stages must fit it too */
            KL_CHECK(lf_ring_setup(kernel_dyn, dev, &ring_dyn_d[dev]));
            dyn = ring_dyn_d[dev].dyn_max >= (int)pl.dyn_bytes;
        }
        int64_t nclusters = dyn ? (pl.resident < p.n_rows ? pl.resident : p.n_rows) : pl.clusters;
        int64_t ctas = nclusters * pl.cluster;
        const int64_t first = nclusters * pl.stages; /* dynamic: the rows of the rings' first stages */
        /* Side CTAs (kl_side_kernel) on the SMs the clusters leave idle, with dynamic rows only.
         * Automatic where the device's memory wants more CTAs than the clusters have (lf_ring_plan's
         * `streaming` rule, LF_RING_CTA_BW: an H200, not an H100) and more rows are left after the
         * rings' first stages than the side CTAs leave to the clusters at the end (`reserve`,
         * KL_SIDE_RESERVE). Forced: that many, reserve 0. */
        int64_t side = 0, reserve = 0;
        /* Their ring (kl_side_kernel): the clusters' stages, at most (passes - 1) x cluster (a
         * pass's loads reach the next row from the second pass on: a forward-only launch takes no
         * side CTAs), at least 2 (one per group). */
        const int passes = 1 + (p.kind == LF_KL_JSD || p.kind == LF_KL_TVD) + (p.grad != nullptr);
        const int side_stages = pl.stages < (passes - 1) * pl.cluster ? pl.stages : (passes - 1) * pl.cluster;
        if (dyn && a->side_ctas >= 0 && pl.cluster > 1 && side_stages >= 2) {
            /* per device: the shared-memory opt-in, the SM count, and the occupancy at the last
             * ring size asked for (1 CTA per SM wherever it was measured: 512 threads) */
            static lf_ring_device side_d[KL_MAX_DEVICES];
            static int sms_d[KL_MAX_DEVICES], side_per_sm_d[KL_MAX_DEVICES];
            static size_t side_bytes_d[KL_MAX_DEVICES];
            KL_CHECK(lf_ring_setup(kl_side_kernel<TS, TT, LIN, THREE>, dev, &side_d[dev]));
            if (!sms_d[dev]) KL_CHECK(cudaDeviceGetAttribute(&sms_d[dev], cudaDevAttrMultiProcessorCount, dev));
            const size_t side_bytes = (size_t)side_stages * 32 * pl.slice_units;
            /* The ring fits wherever the clusters' does (no more stages, less static shared
             * memory), so this check is only a guard; the occupancy is taken at its real size. */
            if ((int64_t)side_bytes <= side_d[dev].dyn_max && side_bytes != side_bytes_d[dev]) {
                KL_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&side_per_sm_d[dev], kl_side_kernel<TS, TT, LIN, THREE>,
                                                                       KL_RES_THREADS, side_bytes));
                side_bytes_d[dev] = side_bytes;
            }
            if ((int64_t)side_bytes <= side_d[dev].dyn_max && side_per_sm_d[dev] > 0) {
                const int64_t idle = ((int64_t)sms_d[dev] - ctas) * side_per_sm_d[dev];
                if (a->side_ctas > 0) {
                    side = a->side_ctas;
                } else {
                    reserve = KL_SIDE_RESERVE * nclusters * pl.cluster;
                    if (idle > 0 && ring_dyn_d[dev].peak_bw / LF_RING_CTA_BW > (double)ctas && p.n_rows - first > reserve + idle)
                        side = idle;
                }
            }
        }
        /* Automatic: JSD on clusters of 16 without side CTAs takes fixed shares, 2-3 points of
         * copy faster than the counter at V = 256K on the H200 and the H100 in three sessions'
         * runs (design log 67; not explained, and not so for TVD, nor at smaller clusters). With
         * side CTAs (an H200) the counter and they are 2.6-3.2% faster than fixed shares
         * (design log 68). */
        if (dyn && a->static_rows == 0 && side == 0 && p.kind == LF_KL_JSD && pl.cluster >= 16) {
            dyn = false;
            nclusters = pl.clusters;
            ctas = nclusters * pl.cluster;
        }
        p.ctas_all = side > 0 ? ctas + side : 0;
        p.cluster_no_draw = side > 0 && a->side_take_rest; /* then the side CTAs take every row after the first stages' */
        if (plan) {
            plan->side_ctas = (int)side;
            plan->schedule = KL_SCHED_RESIDENT;
            plan->pieces = 1;
            plan->piece_units = (int)pl.slice_units;
            plan->cluster = pl.cluster;
            plan->stages = pl.stages;
            plan->ctas = (int)ctas;
            plan->dynamic = dyn;
            plan->jsd_keep = p.jsd_keep;
            plan->soft_target = 0;
        }
        KL_CHECK(lf_launch_clusters(dyn ? kernel_dyn : kernel, ctas, pl.cluster, block, pl.dyn_bytes, stream, false, p, pl.cluster,
                                    pl.stages, (int)pl.slice_units, (int)nclusters));
        if (side > 0)
            KL_CHECK(lf_launch_clusters(kl_side_kernel<TS, TT, LIN, THREE>, side, 1, block, (size_t)side_stages * 32 * pl.slice_units,
                                        stream, true, p, pl.cluster, side_stages, (int)pl.slice_units, first, reserve));
        *launched = true;
        return LF_OK;
    }
}

/* A sparse teacher's forward KL, soft CE (X = ce_soft) or reverse KL (X = ce_soft_rev),
 * student-only (kl_launch_soft's cross-entropy kernel): plan it (dry) or launch it. */
template <typename TS, bool GRAD, bool SOFTCAP, class X>
static lf_status kl_soft_ce(const kl_kparams &p, const kl_args *a, bool dry, cudaStream_t s, cudaError_t *e, bool *launched)
{
    ce_kparams c;
    memset(&c, 0, sizeof c);
    c.logits = a->student;
    c.stride = a->s_stride;
    c.n_rows = a->n_rows;
    c.vocab = a->vocab;
    c.labels = p.s_label;
    c.ignore_index = -100;
    /* KL's z = softcap(x) / tau is cross-entropy's softcap(x / tau) with the cap over tau */
    const float tau = a->opts.temperature;
    c.xf = lf_xform_make(1.0f / tau, SOFTCAP ? a->opts.softcap / tau : 0.0f);
    c.reduction = (int)a->reduction;
    /* the mean's divisor: the caller's, or what kl_divisor_kernel counts (the kernel waits for it
     * where it reads it: programmatic dependent launch) */
    c.divisor = a->divisor ? a->divisor : a->reduction == LF_REDUCE_MEAN ? &p.ws->divisor : nullptr;
    c.dloss = a->dloss;
    c.grad_scale = a->grad_scale * p.tau2_scale;
    c.grad = a->grad;
    c.grad_stride = a->grad_stride;
    c.loss = a->loss;
    c.ws = kl_soft_ce_ws(a->workspace, a->n_rows);
    c.ws_loss = (float *)(c.ws + 1);
    c.ws_z = c.ws_loss + a->n_rows;
    X xc;
    xc.idx = a->topk_idx;
    xc.lq = a->topk_lp;
    xc.k = a->topk;
    xc.ld = a->topk_stride;
    xc.lq_scale = 1.0f / tau;
    xc.shift = p.s_shift;
    xc.rest = p.s_rest;
    xc.ent_q = p.s_ent_t;
    xc.w = a->weights;
    xc.sub_ent = p.kind == LF_KL_FORWARD;
    xc.loss_scale = p.tau2_scale;
    xc.kl_out = X::rev ? a->kl_rev : a->kl_fwd;
    xc.ent_p_out = X::rev ? nullptr : a->ent_s; /* (reverse KL: none, kl_soft_plan) */
    xc.ent_q_out = a->ent_t;
    ce_plan cp;
    memset(&cp, 0, sizeof cp);
    cudaError_t ce_err = cudaSuccess;
    const bool after_divisor = a->reduction == LF_REDUCE_MEAN && !a->divisor;
    const lf_status st = ce_launch_resident<TS, GRAD, true, SOFTCAP, X>(c, a->max_cluster, a->stages, a->static_rows == 1,
                                                                              a->schedule == KL_SCHED_RESIDENT, after_divisor, &cp,
                                                                              s, &ce_err, launched, xc, 0, dry);
    if (e && ce_err != cudaSuccess) *e = ce_err;
    if (st == LF_OK && *launched && a->plan) {
        kl_plan *pl = a->plan;
        memset(pl, 0, sizeof *pl);
        pl->schedule = KL_SCHED_RESIDENT;
        pl->pieces = 1;
        pl->cluster = cp.cluster;
        pl->stages = cp.stages;
        pl->ctas = cp.ctas;
        pl->dynamic = cp.dynamic;
        pl->soft_target = 1;
    }
    return st;
}

template <class X>
static lf_status kl_soft_go_x(const kl_kparams &p, const kl_args *a, bool dry, cudaStream_t s, cudaError_t *e, bool *launched)
{
    const bool g = a->grad != nullptr, cap = a->opts.softcap > 0.0f;
    if (a->s_dtype == LF_BF16) {
        if (g) return cap ? kl_soft_ce<__nv_bfloat16, true, true, X>(p, a, dry, s, e, launched)
                          : kl_soft_ce<__nv_bfloat16, true, false, X>(p, a, dry, s, e, launched);
        return cap ? kl_soft_ce<__nv_bfloat16, false, true, X>(p, a, dry, s, e, launched)
                   : kl_soft_ce<__nv_bfloat16, false, false, X>(p, a, dry, s, e, launched);
    }
    if (g) return cap ? kl_soft_ce<__half, true, true, X>(p, a, dry, s, e, launched) : kl_soft_ce<__half, true, false, X>(p, a, dry, s, e, launched);
    return cap ? kl_soft_ce<__half, false, true, X>(p, a, dry, s, e, launched) : kl_soft_ce<__half, false, false, X>(p, a, dry, s, e, launched);
}
static lf_status kl_soft_go(const kl_kparams &p, const kl_args *a, bool dry, cudaStream_t s, cudaError_t *e, bool *launched)
{
    return p.kind == LF_KL_REVERSE ? kl_soft_go_x<ce_soft_rev>(p, a, dry, s, e, launched) : kl_soft_go_x<ce_soft>(p, a, dry, s, e, launched);
}

/* Whether a sparse teacher's launch takes the soft-target path (kl_args.schedule): forward KL
 * or soft CE (JSD at beta 0 too) without a reverse-KL output, or reverse KL (JSD at beta 1 too)
 * without forward-KL and student-entropy outputs; a 16-bit student, at most KL_SOFT_MAX_K pairs
 * per row, not streamed by request, and the cross-entropy plan resident (sm_90). */
static lf_status kl_soft_plan(const kl_kparams &p, const kl_args *a, cudaStream_t s, cudaError_t *e, bool *soft)
{
    *soft = false;
    const bool kind_ok = p.kind == LF_KL_REVERSE ? !a->kl_fwd && !a->ent_s
                                                 : (p.kind == LF_KL_FORWARD || p.kind == LF_KL_SOFT_CE) && !a->kl_rev;
    const bool fits = kind_ok && (a->s_dtype == LF_BF16 || a->s_dtype == LF_F16) && a->topk <= KL_SOFT_MAX_K;
    if (a->schedule == KL_SCHED_STREAM || !fits) return a->schedule == KL_SCHED_RESIDENT ? LF_ERR_ARG : LF_OK;
    return kl_soft_go(p, a, true, s, e, soft);
}

/* The soft-target path after kl_topk_prep_kernel: the mean's divisor where it is counted
 * (kl_divisor_kernel), then the cross-entropy kernel, which writes every output. */
static lf_status kl_launch_soft(const kl_kparams &p, const kl_args *a, cudaStream_t stream, cudaError_t *cuda_err)
{
    if (p.reduction == LF_REDUCE_MEAN && !p.divisor) {
        kl_divisor_kernel<<<1, 1024, 0, stream>>>(p);
        KL_CHECK(cudaGetLastError());
    }
    bool launched = false;
    const lf_status st = kl_soft_go(p, a, false, stream, cuda_err, &launched);
    if (st != LF_OK) return st;
    return launched ? LF_OK : LF_ERR_DEVICE; /* (planned just before: launched) */
}

template <typename TS, typename TT, bool LIN, bool SPARSE>
static lf_status kl_launch_any(const kl_kparams &p, const kl_args *a, cudaStream_t s, cudaError_t *e)
{
    const int schedule = a->schedule;
    /* Automatically resident for forward + backward, every kind and cluster size (bench_kl
     * --variants, H200, 2026-11-25): forward / reverse KL (and soft CE) 1.2-1.4x streamed at
     * V = 32K-152K and 1.2-1.3x on clusters of 16 (V = 256K); JSD, since its pass 2 and gradient
     * lost their per-pair tests, 1.15-1.28x streamed on clusters of 2-16 (before that it paid
     * only on clusters of 2). TVD has JSD's structure with less arithmetic per pair. */
    if (!SPARSE && (schedule == KL_SCHED_RESIDENT || (schedule == KL_SCHED_AUTO && p.grad))) {
        bool launched = false;
        const bool three = p.kind == LF_KL_JSD || p.kind == LF_KL_TVD; /* a kernel of their own (kl_with_terms) */
        const lf_status st = three ? kl_launch_resident<TS, TT, LIN, true>(p, a, schedule == KL_SCHED_RESIDENT, s, e, &launched)
                                   : kl_launch_resident<TS, TT, LIN, false>(p, a, schedule == KL_SCHED_RESIDENT, s, e, &launched);
        if (st != LF_OK || launched) return st;
    } else if (schedule == KL_SCHED_RESIDENT) {
        return LF_ERR_ARG; /* a sparse teacher is built in shared memory, piece by piece: streamed */
    }
    return kl_launch_kernel<TS, TT, LIN, SPARSE>(p, a->plan, s, e);
}

template <typename TS>
static lf_status kl_dispatch_t(const kl_kparams &p, lf_dtype tt, bool lin, const kl_args *a, cudaStream_t s, cudaError_t *e)
{
    if (p.topk_idx) /* a sparse teacher, built as fp32 in shared memory */
        return lin ? kl_launch_any<TS, float, true, true>(p, a, s, e) : kl_launch_any<TS, float, false, true>(p, a, s, e);
    switch (tt) {
    case LF_F32: return lin ? kl_launch_any<TS, float, true, false>(p, a, s, e) : kl_launch_any<TS, float, false, false>(p, a, s, e);
    case LF_BF16:
        return lin ? kl_launch_any<TS, __nv_bfloat16, true, false>(p, a, s, e)
                   : kl_launch_any<TS, __nv_bfloat16, false, false>(p, a, s, e);
    default: return lin ? kl_launch_any<TS, __half, true, false>(p, a, s, e) : kl_launch_any<TS, __half, false, false>(p, a, s, e);
    }
}

/* Validate, then launch (one kernel; one more for reduction mean without a divisor where a mask,
 * labels, weights or a sparse teacher are given, kl_divisor_kernel, and one more with a sparse
 * teacher: kl_topk_prep_kernel, O(k) per row to k = 512 and k^2 / 64 compares past it; the
 * soft-target path: the prep, the divisor kernel where it runs, the cross-entropy kernel).
 * Returns LF_OK,
 * LF_ERR_* for bad arguments (nothing launched), or LF_ERR_DEVICE with *cuda_err set. */
static lf_status kl_launch(const kl_args *a, cudaStream_t stream, cudaError_t *cuda_err)
{
    if (cuda_err) *cuda_err = cudaSuccess;
    if (!a) return LF_ERR_NULL;
    lf_status st = lf_check_kl_opts(&a->opts);
    if (st != LF_OK) return st;
    const bool sparse = a->topk_idx || a->topk_lp || a->topk;
    if (a->n_rows < 0 || a->vocab < 1 || a->vocab > 0x7fffffff || a->s_stride < a->vocab) return LF_ERR_SIZE;
    if (sparse) {
        if (a->teacher) return LF_ERR_ARG; /* one teacher or the other */
        if (a->topk < 0 || a->topk > a->vocab || a->topk_stride < a->topk) return LF_ERR_SIZE;
        if (a->topk_rest != LF_KL_REST_DROP && a->topk_rest != LF_KL_REST_SPREAD) return LF_ERR_ARG;
        if (a->n_rows > 0 && (!a->topk_idx || !a->topk_lp)) return LF_ERR_NULL;
    } else {
        if (a->t_stride < a->vocab) return LF_ERR_SIZE;
        if (a->t_dtype != LF_F32 && a->t_dtype != LF_BF16 && a->t_dtype != LF_F16) return LF_ERR_ARG;
        if ((int)a->teacher_kind < 0 || (int)a->teacher_kind > 2) return LF_ERR_ARG;
    }
    if (a->s_dtype != LF_F32 && a->s_dtype != LF_BF16 && a->s_dtype != LF_F16) return LF_ERR_ARG;
    if ((int)a->reduction < 0 || (int)a->reduction > 2) return LF_ERR_ARG;
    if (a->schedule < KL_SCHED_AUTO || a->schedule > KL_SCHED_RESIDENT || a->max_cluster < 0) return LF_ERR_ARG;
    if (a->stages != 0 && (a->stages < KL_RES_GROUPS + 1 || a->stages > KL_RES_MAX_STAGES)) return LF_ERR_ARG;
    if (a->static_rows < -1 || a->static_rows > 1) return LF_ERR_ARG;
    if (a->side_ctas < -1 || a->side_ctas > 4096) return LF_ERR_ARG;
    if (a->jsd_keep < -1 || a->jsd_keep > 0) return LF_ERR_ARG;
    if (a->side_take_rest < 0 || a->side_take_rest > 1) return LF_ERR_ARG;
    if (a->grad && a->grad_stride < a->vocab) return LF_ERR_SIZE;
    if (a->grad && a->n_rows > 0) {
        /* In place means the student's own rows; any other overlap with the student or the
         * teacher would race. */
        auto span = [&](const void *base, int64_t stride, lf_dtype dt, const char **lo, const char **hi) {
            *lo = (const char *)base;
            *hi = *lo + ((size_t)(a->n_rows - 1) * stride + a->vocab) * lf_dtype_size(dt);
        };
        const char *g0, *g1, *s0, *s1, *t0, *t1;
        span(a->grad, a->grad_stride, a->s_dtype, &g0, &g1);
        span(a->student, a->s_stride, a->s_dtype, &s0, &s1);
        const bool same = a->grad == a->student && a->grad_stride == a->s_stride;
        if (!same && g0 < s1 && s0 < g1) return LF_ERR_ARG;
        if (!sparse) {
            span(a->teacher, a->t_stride, a->t_dtype, &t0, &t1);
            if (g0 < t1 && t0 < g1) return LF_ERR_ARG;
        } else if (a->topk > 0) {
            for (const void *q : {(const void *)a->topk_idx, (const void *)a->topk_lp}) {
                t0 = (const char *)q;
                t1 = t0 + ((size_t)(a->n_rows - 1) * a->topk_stride + a->topk) * 4;
                if (g0 < t1 && t0 < g1) return LF_ERR_ARG;
            }
        }
    }
    if (a->n_rows == 0) {
        if (a->reduction != LF_REDUCE_NONE && a->loss) KL_CHECK(cudaMemsetAsync(a->loss, 0, sizeof(float), stream));
        return LF_OK;
    }
    if (!a->student || (!sparse && !a->teacher) || !a->loss || !a->workspace) return LF_ERR_NULL;
    if (a->workspace_bytes < kl_workspace_bytes(a->n_rows)) return LF_ERR_SIZE;

    kl_kparams p;
    memset(&p, 0, sizeof p);
    p.student = a->student;
    p.teacher = a->teacher;
    p.s_stride = a->s_stride;
    p.t_stride = a->t_stride;
    p.n_rows = a->n_rows;
    p.vocab = a->vocab;
    p.kind = (int)a->opts.kind;
    p.beta = a->opts.beta;
    if (p.kind == LF_KL_JSD && p.beta == 0.0f) p.kind = LF_KL_FORWARD; /* the limits (lossfuse.h §8) */
    if (p.kind == LF_KL_JSD && p.beta == 1.0f) p.kind = LF_KL_REVERSE;
    const float tau = a->opts.temperature;
    p.tau2_scale = a->opts.tau2 ? tau * tau : 1.0f;
    const int tmode = sparse ? LF_SIDE_LOGPROBS : (int)a->teacher_kind; /* top-k pairs are log-probabilities */
    const lf_kl_side ss = {LF_SIDE_LOGITS, a->opts.softcap, 0.0f}, ts = {tmode, a->opts.softcap, 0.0f};
    const bool lin = lf_kl_side_lin(ss) && lf_kl_side_lin(ts);
    p.xf = lf_kl_xf_make(tau, LF_SIDE_LOGITS, a->opts.softcap, tmode, a->opts.softcap, lin);
    /* pass 1 computes what the loss needs, everything when a per-row output asks for more */
    p.terms = (a->kl_fwd || a->kl_rev || a->ent_s || a->ent_t || p.kind == LF_KL_SOFT_CE) ? LF_DUAL_FULL
              : p.kind == LF_KL_REVERSE                                                 ? LF_DUAL_RA
              : p.kind == LF_KL_FORWARD                                                 ? LF_DUAL_RB
                                                                                        : LF_DUAL_LSE;
    p.labels = a->labels;
    p.labels_i64 = a->labels_i64;
    p.ignore_index = a->ignore_index;
    p.mask = a->mask;
    p.weights = a->weights;
    p.reduction = (int)a->reduction;
    p.divisor = a->divisor;
    p.dloss = a->dloss;
    p.grad_scale = a->grad_scale;
    p.grad = a->grad;
    p.grad_stride = a->grad_stride;
    p.loss = a->loss;
    p.kl_fwd = a->kl_fwd;
    p.kl_rev = a->kl_rev;
    p.ent_s = a->ent_s;
    p.ent_t = a->ent_t;
    p.n_errors = a->n_errors;
    p.ws = (kl_ws_header *)a->workspace;
    p.ws_loss = (float *)((char *)a->workspace + sizeof(kl_ws_header));

    if (sparse) {
        p.topk_idx = a->topk_idx;
        p.topk_lp = a->topk_lp;
        p.topk = a->topk;
        p.topk_stride = a->topk_stride;
        p.topk_rest = (int)a->topk_rest;
        p.ws_rest = p.ws_loss + a->n_rows;
        p.ws_status = reinterpret_cast<int *>(p.ws_rest + a->n_rows);
        bool soft = false;
        st = kl_soft_plan(p, a, stream, cuda_err, &soft);
        if (st != LF_OK) return st;
        if (soft) {
            p.soft = 1;
            p.tau = (double)tau;
            p.s_label = reinterpret_cast<int32_t *>(p.ws_status + a->n_rows);
            p.s_shift = reinterpret_cast<float *>(p.s_label + a->n_rows);
            p.s_rest = p.s_shift + a->n_rows;
            p.s_ent_t = p.s_rest + a->n_rows;
        }
        const int64_t blocks = (a->n_rows + 7) / 8;
        const int prep_smem = a->topk <= 32 * KL_PREP_REG ? KL_PREP_SMEM : 0; /* the hash tables */
        kl_topk_prep_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, prep_smem, stream>>>(p);
        KL_CHECK(cudaGetLastError());
        if (soft) return kl_launch_soft(p, a, stream, cuda_err);
    }
    if (a->reduction == LF_REDUCE_MEAN && !a->divisor) {
        /* Nothing can mask or weight a row: the divisor is n_rows, and the launch has no kernel
         * before its own (bench_kl, which masks nothing: the divisor kernel cost forward KL ~10 us
         * of 250 at 4096 x 32768 on an H200; a programmatic dependent launch after it, the rings
         * filling while it ran, gained nothing: bench/RESULTS.md, session 46) */
        if (!a->labels && !a->mask && !a->weights && !sparse) p.divisor_n = (float)a->n_rows;
        else {
            kl_divisor_kernel<<<1, 1024, 0, stream>>>(p);
            KL_CHECK(cudaGetLastError());
        }
    }
    switch (a->s_dtype) {
    case LF_F32: return kl_dispatch_t<float>(p, a->t_dtype, lin, a, stream, cuda_err);
    case LF_BF16: return kl_dispatch_t<__nv_bfloat16>(p, a->t_dtype, lin, a, stream, cuda_err);
    default: return kl_dispatch_t<__half>(p, a->t_dtype, lin, a, stream, cuda_err);
    }
}

#undef KL_CHECK

/* ============================================================================================
 * 4. main: make a student and a related teacher, run forward+backward in place, check rows
 *    against lf_ref_kl_row, time it.
 * ========================================================================================== */
#ifndef KL_NO_MAIN

#define CHECK_CUDA(call)                                                                            \
    do {                                                                                            \
        cudaError_t e_ = (call);                                                                    \
        if (e_ != cudaSuccess) {                                                                    \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));  \
            exit(1);                                                                                \
        }                                                                                           \
    } while (0)

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static double rng_uniform(void) /* splitmix64 -> [0, 1) */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return (double)((z ^ (z >> 31)) >> 11) * (1.0 / 9007199254740992.0);
}

/* Student logits like a language model's (normal bulk, strong candidates, rare outliers); the
 * teacher is the student plus noise, so the two distributions are close but not equal. */
static float make_logit(void)
{
    double u = rng_uniform(), n = 0.0;
    for (int k = 0; k < 4; ++k) n += rng_uniform() - 0.5;
    if (u < 1e-4) return (float)(40.0 * (rng_uniform() - 0.3));
    if (u < 1e-2) return (float)(8.0 + 4.0 * n);
    return (float)(2.0 * n * 1.7);
}

static uint16_t to_half_bits(float v, lf_dtype t) { return t == LF_BF16 ? lf_f32_to_bf16(v) : lf_f32_to_f16(v); }
static float from_half_bits(uint16_t h, lf_dtype t) { return t == LF_BF16 ? lf_bf16_to_f32(h) : lf_f16_to_f32(h); }
static float round_to(float v, lf_dtype t) { return t == LF_F32 ? v : from_half_bits(to_half_bits(v, t), t); }
static void put(void *h, size_t i, float v, lf_dtype t)
{
    if (t == LF_F32) ((float *)h)[i] = v;
    else ((uint16_t *)h)[i] = to_half_bits(v, t);
}

int main(int argc, char **argv)
{
    int64_t N = argc > 1 ? atoll(argv[1]) : 4096;
    int64_t V = argc > 2 ? atoll(argv[2]) : 32768;
    lf_kl_opts o = lf_kl_opts_default();
    const char *kname = argc > 3 ? argv[3] : "forward";
    o.kind = !strcmp(kname, "reverse") ? LF_KL_REVERSE : !strcmp(kname, "jsd") ? LF_KL_JSD
             : !strcmp(kname, "softce") ? LF_KL_SOFT_CE : !strcmp(kname, "tvd") ? LF_KL_TVD : LF_KL_FORWARD;
    lf_dtype dt = LF_BF16;
    if (argc > 4) dt = !strcmp(argv[4], "fp32") ? LF_F32 : !strcmp(argv[4], "fp16") ? LF_F16 : LF_BF16;
    const char *dname = dt == LF_F32 ? "fp32" : dt == LF_F16 ? "fp16" : "bf16";
    const int esz = lf_dtype_size(dt);
    o.temperature = 2.0f;
    o.tau2 = 1;

    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
        /* Say so plainly, and still show the host reference at work. */
        const int64_t n = 8, v = 1000;
        float *xs = (float *)malloc(sizeof(float) * n * v), *xt = (float *)malloc(sizeof(float) * n * v);
        for (int64_t i = 0; i < n * v; ++i) {
            xs[i] = make_logit();
            xt[i] = xs[i] + (float)(rng_uniform() - 0.5);
        }
        double loss = 0.0;
        lf_status st = lf_ref_kl(n, v, xs, v, xt, v, NULL, NULL, &o, LF_REDUCE_MEAN, -1.0, &loss, NULL);
        printf("no CUDA device found: ran the host reference only\n");
        printf("lf_ref_kl N=%lld V=%lld %s tau=2 (tau^2 scaled): status=%s mean loss=%.6f\n", (long long)n,
               (long long)v, kname, lf_status_str(st), loss);
        free(xs);
        free(xt);
        return st == LF_OK ? 0 : 1;
    }

    cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s (sm_%d%d)  N=%lld V=%lld %s %s  tau=2 (tau^2 scaled)\n", prop.name, prop.major, prop.minor,
           (long long)N, (long long)V, kname, dname);

    const size_t nel = (size_t)N * (size_t)V;
    float *xsf = (float *)malloc(nel * sizeof(float)), *xtf = (float *)malloc(nel * sizeof(float));
    void *xsh = malloc(nel * esz), *xth = malloc(nel * esz);
    for (size_t i = 0; i < nel; ++i) {
        const float s = round_to(make_logit(), dt), t = round_to(s + (float)(1.5 * (rng_uniform() - 0.5)), dt);
        put(xsh, i, s, dt);
        put(xth, i, t, dt);
        xsf[i] = s; /* the reference sees exactly what the kernel sees */
        xtf[i] = t;
    }

    void *xs_d, *xt_d, *ws_d, *pristine;
    float *loss_d, *kf_d, *kr_d;
    const size_t wsb = kl_workspace_bytes(N);
    CHECK_CUDA(cudaMalloc(&xs_d, nel * esz));
    CHECK_CUDA(cudaMalloc(&xt_d, nel * esz));
    CHECK_CUDA(cudaMalloc(&pristine, nel * esz));
    CHECK_CUDA(cudaMalloc(&loss_d, sizeof(float)));
    CHECK_CUDA(cudaMalloc(&kf_d, N * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&kr_d, N * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&ws_d, wsb));
    CHECK_CUDA(cudaMemset(ws_d, 0, wsb));
    CHECK_CUDA(cudaMemcpy(pristine, xsh, nel * esz, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(xs_d, xsh, nel * esz, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(xt_d, xth, nel * esz, cudaMemcpyHostToDevice));

    /* forward + backward in place, mean over rows */
    kl_args a = kl_args_default();
    a.student = xs_d;
    a.s_dtype = dt;
    a.teacher = xt_d;
    a.t_dtype = dt;
    a.n_rows = N;
    a.vocab = V;
    a.s_stride = a.t_stride = V;
    a.opts = o;
    a.grad = xs_d;
    a.grad_stride = V;
    a.loss = loss_d;
    a.kl_fwd = kf_d;
    a.kl_rev = kr_d;
    a.workspace = ws_d;
    a.workspace_bytes = wsb;
    kl_plan plan;
    a.plan = &plan;
    cudaError_t ce;
    lf_status st = kl_launch(&a, 0, &ce);
    if (st != LF_OK) {
        fprintf(stderr, "kl_launch: %s (%s)\n", lf_status_str(st), cudaGetErrorString(ce));
        return 1;
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    float mean_loss;
    CHECK_CUDA(cudaMemcpy(&mean_loss, loss_d, sizeof(float), cudaMemcpyDeviceToHost));
    float *kfh = (float *)malloc(N * sizeof(float));
    CHECK_CUDA(cudaMemcpy(kfh, kf_d, N * sizeof(float), cudaMemcpyDeviceToHost));

    /* 16 rows (first, last, random) against the double reference. The KL is a difference of
     * fp32 terms of the size of the row's logits and lse: 2^-19 (1 + |lse_s| + |lse_t| + max|z|
     * + log V) absolute, plus 1e-5 relative. A bf16 / fp16 gradient may differ from the exact
     * one by its rounding (2^-8 / 2^-11 relative); fp32 by the kernel's arithmetic (2^-17);
     * plus 1e-6 of the row's largest entry for the cancellation in p - q. Errors are reported
     * as fractions of these tolerances (1.0 = exactly at tolerance). */
    double *dx = (double *)malloc(V * sizeof(double)), max_kl_err = 0.0, max_grad_err = 0.0;
    const double unit = dt == LF_BF16 ? 0x1p-8 : dt == LF_F16 ? 0x1p-11 : 0x1p-17;
    void *grow = malloc(V * esz);
    for (int k = 0; k < 16; ++k) {
        const int64_t i = k == 0 ? 0 : k == 1 ? N - 1 : (int64_t)(rng_uniform() * N);
        const lf_kl_row r = lf_ref_kl_row(xsf + i * V, xtf + i * V, V, &o, dx);
        double zmax = 0.0;
        for (int64_t j = 0; j < V; ++j) zmax = fmax(zmax, fmax(fabs(xsf[i * V + j]), fabs(xtf[i * V + j])) / o.temperature);
        const double tol_kl = 1e-5 * fabs(r.kl_fwd) + 0x1p-19 * (1.0 + fabs(r.lse_s) + fabs(r.lse_t) + zmax + log((double)V));
        max_kl_err = fmax(max_kl_err, fabs(kfh[i] - r.kl_fwd) / tol_kl);
        CHECK_CUDA(cudaMemcpy(grow, (char *)xs_d + (size_t)i * V * esz, V * esz, cudaMemcpyDeviceToHost));
        double rowmax = 0.0;
        for (int64_t j = 0; j < V; ++j) rowmax = fmax(rowmax, fabs(dx[j] / N));
        for (int64_t j = 0; j < V; ++j) {
            const double gj = dt == LF_F32 ? ((float *)grow)[j] : from_half_bits(((uint16_t *)grow)[j], dt);
            const double want = dx[j] / N;
            max_grad_err = fmax(max_grad_err, fabs(gj - want) / (fabs(want) * unit + 1e-6 * rowmax + 1e-30));
        }
    }

    /* time the fused forward + backward in place (student restored before every run, untimed) */
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int it = 0; it < 6; ++it) {
        CHECK_CUDA(cudaMemcpy(xs_d, pristine, nel * esz, cudaMemcpyDeviceToDevice));
        CHECK_CUDA(cudaEventRecord(e0));
        st = kl_launch(&a, 0, &ce);
        CHECK_CUDA(cudaEventRecord(e1));
        CHECK_CUDA(cudaEventSynchronize(e1));
        if (st != LF_OK) return 1;
        float ms;
        CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
        if (it > 0 && ms < best) best = ms;
    }
    if (plan.schedule == KL_SCHED_RESIDENT)
        printf("plan         : row-resident, clusters of %d, %d stages of %d units, %d CTAs, rows %s\n", plan.cluster, plan.stages,
               plan.piece_units, plan.ctas, plan.dynamic ? "handed out dynamically" : "in fixed shares");
    else
        printf("plan         : streamed, %d piece(s) of %d units per row pair, %d CTAs\n", plan.pieces, plan.piece_units, plan.ctas);
    printf("fwd+bwd      : mean loss %.6f; 16 rows vs lf_ref: KL(q||p) max err %.3f, gradient max err %.3f of tolerance\n",
           mean_loss, max_kl_err, max_grad_err);
    printf("fwd+bwd time : %.3f ms, %.1f GB/s (read student + teacher, write gradient = %d B/elem)\n", best,
           3.0 * nel * esz / (best * 1e6), 3 * esz);
    const int ok = max_kl_err <= 1.0 && max_grad_err <= 1.0;
    printf("%s\n", ok ? "OK" : "MISMATCH");
    return ok ? 0 : 1;
}
#endif /* KL_NO_MAIN */
