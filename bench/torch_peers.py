#!/usr/bin/env python3
"""PyTorch peers for the lossfuse benchmark: the same ops, the same shapes, the same output format.

Run (on a GPU machine, from the repository root):

    python3 bench/torch_peers.py                                   # everything (several minutes)
    python3 bench/torch_peers.py --shapes 4096x32768 --iters 20 \
        --impls eager_bf16,eager_fp32,compile --modes fwdbwd,fwd | tee bench/torch_peers.log
    python3 bench/report.py bench/torch_peers.log cuda_bench.log \
        --md bench/results_table.md --png bench/results.png

What it measures, for each shape [N, V] (bf16 logits, int64 labels, ~5% ignore_index=-100):

  mode=fwdbwd  cross-entropy, mean over the non-ignored tokens, forward + loss.backward(); the
               gradient w.r.t. the bf16 logits leaf (a new bf16 [N, V] buffer: PyTorch cannot
               write it in place over the logits).
                 torch_eager_bf16  F.cross_entropy(logits, labels)           (bf16 math in ATen)
                 torch_eager_fp32  F.cross_entropy(logits.float(), labels)
                 torch_compile     torch.compile(<the fp32 one>, dynamic=False), mode default
  mode=fwd     forward only, under torch.no_grad(): per-token label log-prob (0 for ignored
               tokens), lse, entropy and argmax.
                 torch_eager_fp32  x = logits.float(); lse = logsumexp(x); lp = log_softmax(x);
                                   logprob = lp.gather(labels.clamp(min=0)); entropy =
                                   -(lp.exp() * lp).sum(-1); argmax = logits.argmax(-1)
                                   (x is dropped before the entropy, which keeps the peak
                                   memory at ~3 fp32 copies of the logits instead of 4)
                 torch_eager_bf16  the same on the bf16 logits (bf16 intermediates, the entropy
                                   summed in fp32): the least traffic eager can do, lower accuracy
                 torch_compile     torch.compile(<the fp32 one>, dynamic=False)

  mode=kl_fwd, kl_rev, jsd   distillation from a bf16 student and a bf16 teacher (the student
               plus uniform noise of width 1.5), forward + backward w.r.t. the student, mean over
               rows: lp = log_softmax(student.float()), lq = log_softmax(teacher.float()), then
               F.kl_div(lp, lq, log_target=True, reduction="batchmean") (KL(q||p)), the same with
               the roles swapped (KL(p||q)), and the generalised JSD at beta = 0.5 through
               logaddexp; torch_eager_fp32 and torch_compile of it (floor: N*V*6 bytes).
  mode=kl_fwd_top64, kl_rev_top64, jsd_top64   the same losses against a SPARSE teacher: per
               row 64 (index, log-prob) pairs, the rest of the mass spread over the other V - 64
               entries (lossfuse.h lf_ref_kl_sparse_teacher at tau 1), as users write it: the
               dense teacher log-probs built with full_like(lp, log rest).scatter_(idx, lp_k),
               then the dense formulas (floor: N*V*4 + N*64*8 bytes; bench_kl --topk 64 times
               lossfuse on the same pairs).

Timing: CUDA events around ONLY the op (fwdbwd: forward + backward; logits.grad = None before
each iteration, outside the timed region). fwdbwd and the others: before each timed iteration a
256 MiB scratch buffer is written (untimed) to flush L2. fwd (read-only): the iterations
alternate between two copies of the logits with no flush, as bench_ce does (a launch starts with
L2 in the state a launch of its kind leaves: a read-only pass should not pay for writing back the
flush's dirty lines), each after a ~50 us GPU spin (torch.cuda._sleep), which keeps the host's
launch latency out of the events as the flush does. Then the events are recorded around the op
and the device is synchronised after it; launch overheads of eager's several kernels are therefore included, as
a user would see them (part of the first launch hides behind the flush). 3 warm-up iterations
(compile: compilation + 5), then --iters timed ones; the MEDIAN is reported.

Extra device memory: after warm-up, with the inputs alive and logits.grad = None, the peak stats
are reset, baseline = memory_allocated(), one iteration runs, extra = max_memory_allocated() -
baseline. For fwdbwd it includes the bf16 gradient buffer (N*V*2 bytes): fair, PyTorch has to
allocate it.

bytes= in the output is the FLOOR traffic of the op: fwdbwd N*V*4 (read bf16 logits once,
write the bf16 gradient once), fwd N*V*2 (read once). GB/s = bytes / time, so the figure is
an "effective" bandwidth comparable with the device-to-device copy bandwidth measured at the
start (COPY line: dst.copy_(src) of 2 GiB, median of 10, bandwidth = 2 * bytes / time).

Output (stdout, one line per measurement, key=value, no spaces inside values):
    DEVICE name=NVIDIA_H100_80GB_HBM3
    COPY impl=torch gbps=2950.1 bytes=2147483648
    RESULT impl=torch_eager_bf16 mode=fwdbwd N=4096 V=32768 dtype=bf16 ms=1.2340 bytes=536870912 extra_bytes=123456 status=ok
status is ok, OOM (ms=nan) or ERROR (ms=nan, an ERROR line with the message precedes it).
INFO / NOTE / WARNING lines are human-readable context; report.py ignores them.

--device cpu exists only to smoke-test this script's logic without a GPU (wall-clock timer, no
memory stats, no L2 flush); its numbers mean nothing.
"""
import argparse
import gc
import logging
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

DEFAULT_SHAPES = [(n, v) for n in (4096, 16384) for v in (32768, 131072, 151936, 262144)]
ALL_IMPLS = ["eager_bf16", "eager_fp32", "compile"]
ALL_MODES = ["fwdbwd", "fwd", "kl_fwd", "kl_rev", "jsd"]
KL_MODES = ("kl_fwd", "kl_rev", "jsd")  # distillation, fwd+bwd w.r.t. the student; eager is fp32 only
TOPK = 64
TOPK_MODES = tuple(f"{m}_top{TOPK}" for m in KL_MODES)  # the same against a sparse teacher
ALL_MODES += list(TOPK_MODES)
TP_MODES = ("tp2_rank", "tp4_rank")  # one rank's share of the vocabulary-parallel pattern
ALL_MODES += list(TP_MODES)
IMPL_NAME = {"eager_bf16": "torch_eager_bf16", "eager_fp32": "torch_eager_fp32",
             "compile": "torch_compile"}
IGNORE_INDEX = -100
FLUSH_BYTES = 256 << 20
COPY_BYTES = 2 << 30


def out(line):
    print(line, flush=True)


# --------------------------------------------------------------------------------------------
# The ops
# --------------------------------------------------------------------------------------------
def ce_bf16(logits, labels):
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)


def ce_fp32(logits, labels):
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX)


def stats_fp32(logits, labels):
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)
    lp = torch.log_softmax(x, dim=-1)
    del x  # eager: frees the fp32 copy before the entropy's temporaries (no-op for compile)
    valid = labels != IGNORE_INDEX
    logprob = lp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    logprob = torch.where(valid, logprob, torch.zeros_like(logprob))
    entropy = -(lp.exp() * lp).sum(dim=-1)
    argmax = logits.argmax(dim=-1)
    return logprob, lse, entropy, argmax


def stats_bf16(logits, labels):
    lse = torch.logsumexp(logits, dim=-1)              # bf16 output
    lp = torch.log_softmax(logits, dim=-1)             # bf16 [N, V]
    valid = labels != IGNORE_INDEX
    logprob = lp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    logprob = torch.where(valid, logprob, torch.zeros_like(logprob))
    entropy = -(lp.exp() * lp).sum(dim=-1, dtype=torch.float32)
    argmax = logits.argmax(dim=-1)
    return logprob, lse, entropy, argmax


def tp_rank_ce(shard, labels, v0):
    """One rank's part of the vocabulary-parallel cross-entropy as Megatron-style code writes it
    (max, sum of exp and the label's logit, each followed by an all-reduce over the TP group,
    which one GPU cannot do: they are left out, so this is the rank's compute alone)."""
    x = shard.float()
    m = x.max(dim=-1).values  # all_reduce(MAX)
    x = x - m.unsqueeze(-1)
    vs = shard.shape[-1]
    valid = labels != IGNORE_INDEX
    here = valid & (labels >= v0) & (labels < v0 + vs)
    idx = (labels - v0).clamp(0, vs - 1)
    zy = torch.where(here, x.gather(-1, idx.unsqueeze(-1)).squeeze(-1), torch.zeros_like(m))  # all_reduce(SUM)
    s = x.exp().sum(dim=-1)  # all_reduce(SUM)
    loss = torch.where(valid, s.log() - zy, torch.zeros_like(m))
    return loss.sum() / valid.sum().clamp(min=1)


def kl_loss(mode, student, teacher):
    """Distillation as users write it: log_softmax of .float() logits, F.kl_div, batchmean."""
    lp = torch.log_softmax(student.float(), dim=-1)
    lq = torch.log_softmax(teacher.float(), dim=-1)
    return kl_from_logprobs(mode, lp, lq)


def kl_from_logprobs(mode, lp, lq):
    if mode == "kl_fwd":  # KL(q || p)
        return F.kl_div(lp, lq, log_target=True, reduction="batchmean")
    if mode == "kl_rev":  # KL(p || q)
        return F.kl_div(lq, lp, log_target=True, reduction="batchmean")
    beta = 0.5           # generalised JSD, beta = 0.5
    lm = torch.logaddexp(lq + math.log(beta), lp + math.log(1.0 - beta))
    return (beta * F.kl_div(lm, lq, log_target=True, reduction="batchmean")
            + (1.0 - beta) * F.kl_div(lm, lp, log_target=True, reduction="batchmean"))


def topk_teacher(n, v, device):
    """The pairs bench_kl --topk uses: distinct indices (i*7919 + q*(V//k)) % V, log-probs
    -2 - 0.2 q (their mass 0.75), as (idx int64 [N, k], lp fp32 [N, k])."""
    k = min(TOPK, v)
    rows = torch.arange(n, device=device, dtype=torch.int64).unsqueeze(1)
    q = torch.arange(k, device=device, dtype=torch.int64).unsqueeze(0)
    idx = (rows * 7919 + q * (v // k)) % v
    lpk = (-2.0 - 0.2 * q.float()).expand(n, k).contiguous()
    return idx, lpk


def kl_topk_loss(mode, student, pairs):
    """A sparse teacher densified (the rest mass spread), then kl_loss's formulas."""
    idx, lpk = pairs
    lp = torch.log_softmax(student.float(), dim=-1)
    v, k = lp.shape[-1], idx.shape[-1]
    rest = (1.0 - lpk.exp().sum(dim=-1, keepdim=True)).clamp_min(0.0) / max(v - k, 1)
    lq = torch.log(rest).expand_as(lp).clone().scatter_(-1, idx, lpk)
    return kl_from_logprobs(mode.split("_top")[0], lp, lq)


# --------------------------------------------------------------------------------------------
# Device helpers (CUDA; a CPU fallback only for smoke tests)
# --------------------------------------------------------------------------------------------
class Dev:
    def __init__(self, kind):
        self.kind = kind
        self.cuda = kind == "cuda"
        self.device = torch.device(kind)
        self.scratch = None
        self.flush_count = 0

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def make_scratch(self):
        if self.cuda and self.scratch is None:
            self.scratch = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device=self.device)

    def flush_l2(self):
        if self.scratch is not None:
            self.flush_count += 1
            self.scratch.fill_(float(self.flush_count & 0xFFFF))

    def time_once(self, op, flush=True):
        """ms of one call of op(), device-timed; flushes L2 before (untimed) if flush."""
        if flush:
            self.flush_l2()
        elif self.cuda:
            torch.cuda._sleep(100_000)  # ~50 us of GPU spin, no memory traffic: the host's launch
            #                             latency hides behind it as it does behind the flush
        if self.cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            op()
            end.record()
            end.synchronize()
            return start.elapsed_time(end)
        t0 = time.perf_counter()
        op()
        return (time.perf_counter() - t0) * 1e3

    def reset_peak(self):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def allocated(self):
        return torch.cuda.memory_allocated() if self.cuda else 0

    def peak(self):
        return torch.cuda.max_memory_allocated() if self.cuda else 0

    def free(self):
        gc.collect()
        if self.cuda:
            torch.cuda.empty_cache()


def is_oom(exc):
    """True when exc, or any exception it chains to (compile wraps errors), is an OOM."""
    seen = set()
    e = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, torch.cuda.OutOfMemoryError):
            return True
        msg = str(e)
        if "out of memory" in msg.lower() or "CUDA_ERROR_OUT_OF_MEMORY" in msg:
            return True
        e = e.__cause__ or e.__context__
    return False


def one_line(s, limit=300):
    s = " ".join(str(s).split())
    return s if len(s) <= limit else s[:limit] + "..."


# --------------------------------------------------------------------------------------------
# torch.compile bookkeeping
# --------------------------------------------------------------------------------------------
class LimitWatcher(logging.Handler):
    """Catches dynamo's 'hit config.recompile_limit / cache_size_limit' warning."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.hits = []

    def emit(self, record):
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001
            return
        if "recompile_limit" in msg or "cache_size_limit" in msg:
            self.hits.append(one_line(msg, 200))


def setup_dynamo():
    import torch._dynamo
    cfg = torch._dynamo.config
    for name, val in (("cache_size_limit", 64), ("recompile_limit", 64),
                      ("accumulated_cache_size_limit", 1024),
                      ("accumulated_recompile_limit", 1024)):
        if hasattr(cfg, name):
            try:
                setattr(cfg, name, val)
            except Exception:  # noqa: BLE001
                pass
    watcher = LimitWatcher()
    logging.getLogger("torch._dynamo").addHandler(watcher)
    return watcher


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------
def make_data(dev, n, v, seed):
    torch.manual_seed(seed)
    logits = torch.randn(n, v, dtype=torch.bfloat16, device=dev.device)
    logits.mul_(2.0)
    n_out = max(1, (n * v) // 10000)  # 0.01% outliers at +-30
    idx = torch.randint(0, n * v, (n_out,), device=dev.device)
    sign = torch.randint(0, 2, (n_out,), device=dev.device).to(torch.bfloat16).mul_(60.0).sub_(30.0)
    logits.view(-1)[idx] = sign
    labels = torch.randint(0, v, (n,), dtype=torch.int64, device=dev.device)
    ignore = torch.rand(n, device=dev.device) < 0.05
    labels[ignore] = IGNORE_INDEX
    logits.requires_grad_(True)
    dev.sync()
    return logits, labels


def build_op(impl, mode, logits, labels, teacher=None):
    """Returns (op, warmup_iters). op() runs one forward(+backward) and keeps nothing alive."""
    if mode in TP_MODES:
        P = int(mode[2])
        v = logits.shape[-1]
        vs = (v + P - 1) // P  # rank 0's shard (lf_tp_shard: the first V % P ranks get one more)
        shard = logits.detach()[:, :vs].contiguous().requires_grad_(True)
        fn = tp_rank_ce if impl != "compile" else torch.compile(tp_rank_ce, dynamic=False)

        def op():
            shard.grad = None
            loss = fn(shard, labels, 0)
            loss.backward()
    elif mode in KL_MODES or mode in TOPK_MODES:
        base = kl_loss if mode in KL_MODES else kl_topk_loss
        fn = base if impl == "eager_fp32" else torch.compile(base, dynamic=False)

        def op():
            loss = fn(mode, logits, teacher)
            loss.backward()
    elif mode == "fwdbwd":
        if impl == "eager_bf16":
            fn = ce_bf16
        elif impl == "eager_fp32":
            fn = ce_fp32
        else:
            fn = torch.compile(ce_fp32, dynamic=False)

        def op():
            loss = fn(logits, labels)
            loss.backward()
    else:
        if impl == "eager_bf16":
            fn = stats_bf16
        elif impl == "eager_fp32":
            fn = stats_fp32
        else:
            fn = torch.compile(stats_fp32, dynamic=False)

        def op():
            with torch.no_grad():
                fn(logits, labels)
    return op, (6 if impl == "compile" else 3)


def measure(dev, impl, mode, logits, labels, iters, teacher=None):
    """Returns (median_ms, extra_bytes, compile_s or None)."""
    op, warmup = build_op(impl, mode, logits, labels, teacher)
    # forward only: alternate between two copies of the logits with no flush (see the docstring)
    ops = [op, build_op(impl, mode, logits.detach().clone(), labels, teacher)[0]] if mode == "fwd" else [op]
    compile_s = None
    for i in range(warmup):
        logits.grad = None
        dev.sync()
        t0 = time.perf_counter()
        op()
        dev.sync()
        if i == 0 and impl == "compile":
            compile_s = time.perf_counter() - t0

    if len(ops) > 1:
        ops[1]()  # (compile: the second tensor must not recompile inside the timed loop)
        dev.sync()
    times = []
    for i in range(iters):
        logits.grad = None
        dev.sync()
        times.append(dev.time_once(ops[i % len(ops)], flush=len(ops) == 1))
    del ops

    # extra device memory of one call
    logits.grad = None
    dev.sync()
    dev.reset_peak()
    base = dev.allocated()
    op()
    dev.sync()
    extra = max(0, dev.peak() - base)
    logits.grad = None
    return statistics.median(times), extra, compile_s


def result_line(impl, mode, n, v, ms, extra, status):
    floor = n * v * (6 if mode in KL_MODES else 4 if mode == "fwdbwd" else 2)
    if mode in TOPK_MODES:
        floor = n * v * 4 + n * min(TOPK, v) * 8
    if mode in TP_MODES:
        floor = n * ((v + int(mode[2]) - 1) // int(mode[2])) * 4
    ms_s = "nan" if ms is None or (isinstance(ms, float) and math.isnan(ms)) else f"{ms:.4f}"
    ex_s = "nan" if extra is None else str(int(extra))
    return (f"RESULT impl={IMPL_NAME[impl]} mode={mode} N={n} V={v} dtype=bf16 ms={ms_s} "
            f"bytes={floor} extra_bytes={ex_s} status={status}")


def copy_bandwidth(dev, reps=10):
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=dev.device)
    dst = torch.empty_like(src)
    src.fill_(1)
    for _ in range(2):
        dst.copy_(src)
    dev.sync()
    times = []
    for _ in range(reps):
        if dev.cuda:
            s = torch.cuda.Event(enable_timing=True)
            e = torch.cuda.Event(enable_timing=True)
            s.record()
            dst.copy_(src)
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        else:
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append((time.perf_counter() - t0) * 1e3)
    ms = statistics.median(times)
    del src, dst
    dev.free()
    return 2.0 * COPY_BYTES / (ms * 1e-3) / 1e9


def parse_shapes(s):
    shapes = []
    for tok in s.split(","):
        tok = tok.strip().lower()
        if not tok:
            continue
        a, b = tok.split("x")
        shapes.append((int(a), int(b)))
    return shapes


def parse_list(s, allowed, what):
    items = [t.strip() for t in s.split(",") if t.strip()]
    bad = [t for t in items if t not in allowed]
    if bad:
        sys.exit(f"unknown {what}: {','.join(bad)} (choose from {','.join(allowed)})")
    return items


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(f"{n}x{v}" for n, v in DEFAULT_SHAPES),
                    help="comma-separated NxV list")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--impls", default=",".join(ALL_IMPLS))
    ap.add_argument("--modes", default=",".join(ALL_MODES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-copy", action="store_true", help="skip the copy-bandwidth measurement")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: smoke test of the script only, meaningless numbers")
    args = ap.parse_args()

    shapes = parse_shapes(args.shapes)
    impls = parse_list(args.impls, ALL_IMPLS, "impls")
    modes = parse_list(args.modes, ALL_MODES, "modes")
    if args.iters < 1:
        sys.exit("--iters must be >= 1")

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("CUDA is not available (use --device cpu only for a smoke test)")
    dev = Dev(args.device)

    name = torch.cuda.get_device_name() if dev.cuda else "cpu"
    out(f"DEVICE name={'_'.join(name.split())}")
    out(f"INFO torch={torch.__version__} cuda={torch.version.cuda} iters={args.iters} "
        f"impls={','.join(impls)} modes={','.join(modes)} "
        f"shapes={','.join(f'{n}x{v}' for n, v in shapes)}")
    if "eager_bf16" in impls and "fwd" in modes:
        out("NOTE torch_eager_bf16 mode=fwd computes log_softmax/logsumexp in bf16 "
            "(bf16 intermediates, entropy summed in fp32): fastest eager, lower accuracy")

    watcher = setup_dynamo() if "compile" in impls else None

    if not args.no_copy:
        try:
            gbps = copy_bandwidth(dev)
            out(f"COPY impl=torch gbps={gbps:.1f} bytes={COPY_BYTES}")
        except Exception as e:  # noqa: BLE001
            out(f"WARNING copy bandwidth failed: {one_line(e)}")
        dev.free()

    dev.make_scratch()
    t_start = time.perf_counter()
    for (n, v) in shapes:
        data_err = None
        logits = labels = None
        try:
            logits, labels = make_data(dev, n, v, args.seed)
        except Exception as e:  # noqa: BLE001
            data_err = "OOM" if is_oom(e) else "ERROR"
            if data_err == "ERROR":
                out(f"ERROR making data N={n} V={v}: {one_line(e)}")
        if data_err is not None:
            logits = labels = None
            dev.free()
            for mode in modes:
                for impl in impls:
                    out(result_line(impl, mode, n, v, float("nan"), None, data_err))
            continue

        teacher = None
        if any(m in KL_MODES for m in modes):
            teacher = (logits.detach() + torch.rand_like(logits, dtype=torch.float32).sub_(0.5).mul_(1.5)
                       .to(torch.bfloat16))
        pairs = topk_teacher(n, v, logits.device) if any(m in TOPK_MODES for m in modes) else None
        for mode in modes:
            for impl in impls:
                if (mode in KL_MODES or mode in TOPK_MODES or mode in TP_MODES) and impl == "eager_bf16":
                    continue  # the KL peers are the fp32 forms users write (issue 3)
                status, ms, extra, compile_s, err = "ok", float("nan"), None, None, None
                if impl == "compile":
                    torch._dynamo.reset()  # compile once per shape, fresh cache
                    hits_before = len(watcher.hits)
                try:
                    ms, extra, compile_s = measure(dev, impl, mode, logits, labels, args.iters,
                                                   pairs if mode in TOPK_MODES else teacher)
                except Exception as e:  # noqa: BLE001
                    status = "OOM" if is_oom(e) else "ERROR"
                    err = one_line(e)
                    ms, extra = float("nan"), None
                # the exception (and the frames holding big temporaries) is gone here
                logits.grad = None
                dev.free()
                if status == "ERROR":
                    out(f"ERROR impl={IMPL_NAME[impl]} mode={mode} N={n} V={v}: {err}")
                if impl == "compile":
                    for h in watcher.hits[hits_before:]:
                        out(f"WARNING impl=torch_compile mode={mode} N={n} V={v} dynamo "
                            f"recompile limit hit, may have fallen back to eager: {h}")
                    if compile_s is not None:
                        out(f"INFO impl=torch_compile mode={mode} N={n} V={v} "
                            f"first_call_s={compile_s:.1f}")
                out(result_line(impl, mode, n, v, ms, extra, status))
        del logits, labels, teacher, pairs
        dev.free()
    out(f"INFO done elapsed_s={time.perf_counter() - t_start:.1f}")


if __name__ == "__main__":
    main()
