#!/usr/bin/env python3
"""PyTorch's tensor- and context-parallel cross-entropy on P GPUs over NCCL: bench_parallel's peers.

Run (on a machine of P >= 2 GPUs, from the repository root; one process per GPU is spawned):

    python3 bench/torch_parallel_peers.py --tp 2 --shapes 4096x151936,8192x32768,4096x262144
    python3 bench/torch_parallel_peers.py --cp 2 --shapes 4096x151936,8192x32768,4096x262144

torch_peers.py --modes tp2_rank times one rank's compute alone on one GPU (no collectives), and
bench_parallel simulates context parallelism on one GPU. This script runs the whole step the way
parallel trainers write it, on P real GPUs with torch.distributed (backend nccl), forward +
loss.backward(), bf16 logits, the mean over the non-ignored tokens.

--tp P (mode tpP_nccl; shape N x V, V the full vocabulary): each rank holds the [N, V/P] shard of
bf16 logits that lf_tp_shard gives it (the first V % P ranks one column more) and the labels of
all N rows (~5% ignore_index = -100).
  torch_eager_fp32   the Megatron-style autograd function on shard.float(): row max of the shard,
                     all_reduce(MAX); subtract it in place; exp in place, row sum, and the label's
                     logit where this rank owns the label (0 elsewhere), both in ONE
                     all_reduce(SUM) of an [N, 2] tensor (Megatron's code issues two; one
                     collective fewer, not timed against two here; the issue's "all-reduce of
                     max, then of sum-exp and label logit"); loss = log(sum) - label logit; the softmax saved for backward
                     (exp / sum in place over the fp32 copy); backward: softmax minus one at the
                     owned labels, times dloss / count, cast to bf16 by .float()'s backward.
  torch_compile      the same collectives between three torch.compile'd local functions (the
                     best a user gets without a custom kernel: each reads the bf16 shard and
                     nothing [N, V/P] is kept between them): the row max; the row's sum of exp
                     and label logit; in backward the bf16 gradient written in one pass. Inductor
                     cannot fuse across a collective, so these are the pieces it can fuse.
  The count is local (every rank holds all labels), and every rank's loss is the global mean.

--cp C (mode cpC_nccl; shape T x V, T the packed batch's tokens): 16 packed sequences (lengths
multiples of 2C, random around T / 16, in all about T), global input ids, the first quarter of each
sequence a prompt (not predicted); the label of token t is the id of token t + 1 of the same
sequence unless that one is a prompt token or t is the sequence's last (ignored). Rank r holds
the [T / C, V] bf16 logits of its zigzag shard (each sequence cut into 2C chunks, rank r owns
chunks r and 2C - 1 - r), as the model gives them.
  torch_gather_eager_fp32 / torch_gather_compile
                     gather the logits (all_gather_into_tensor, [T, V] bf16 on every rank), put
                     them back in sequence order, then F.cross_entropy(full.float(), labels) on
                     the whole batch (eager, or torch.compile of it); backward: the gathered
                     gradient's rows of this rank (what the out-of-memory job did).
  torch_local_eager_fp32 / torch_local_compile
                     the local loss: labels shifted on the global ids, then taken at this rank's
                     positions; F.cross_entropy(local.float(), reduction="sum") (eager, or
                     compiled) divided by the global count of valid tokens (an all_reduce of the
                     local counts); the logged loss is the all_reduce of the ranks' parts.

Before timing, each implementation is checked on every rank against F.cross_entropy of the
unsharded logits in float64 (on that rank's GPU): a CHECK line with the loss's relative error (at
most 1e-5) and the largest gradient error on the rank's part in units of half a bf16 ulp of the
reference value (round to nearest: at most 1, and 1.01 allows for fp32 noise at a tie); both
checked on every rank (a NaN fails). Otherwise status=WRONG on the RESULT line, a FAILED line at
the end, and exit status 1. Every rank holds rank 0's data (broadcast).

Timing: each timed iteration starts with a barrier, a 256 MiB L2 flush on every rank (untimed),
then CUDA events around the forward + backward on each rank. ms is the slower rank's median of
--iters (as bench_parallel --nccl reports the lossfuse step), the launch and collective latencies
included, as a trainer sees them. extra_bytes is the slower rank's peak device memory above what
it held before the step (inputs alive, grad None): it includes the bf16 gradient buffer, and for
the gathering forms the gathered logits.

Output (rank 0, stdout), in bench_parallel's format (tp: the mode of bench_parallel --nccl's rows,
so report.py puts the peers beside them; cp: mode cpC_nccl, bench_parallel's simulation prints
cpC_rank with its own token count):
    DEVICE name=NVIDIA_H200
    COPY impl=torch gbps=4200.1 bytes=2147483648          (rank 0's GPU)
    RESULT impl=torch_eager_fp32 mode=tp2_nccl N=4096 V=151936 dtype=bf16 ms=... bytes=<2 N Vs 2>
           extra_bytes=... status=ok gpus=2
bytes is bench_parallel's floor for the rank: its part of the logits read once and its gradient
written once (tp: 2 N Vs 2 with rank 0's Vs; cp: 2 (T / C) V 2).

--device cpu runs the same code on P processes of the CPU with the gloo backend, only to smoke-test
this script without a GPU; its numbers mean nothing.
"""
import argparse
import math
import os
import socket
import statistics
import sys
import time

import torch
import torch._dynamo
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peers import IGNORE_INDEX, Dev, copy_bandwidth, make_data, one_line, parse_shapes  # noqa: E402

DEFAULT_SHAPES = "4096x151936,8192x32768,4096x262144"
DEFAULT_CP_SHAPES = DEFAULT_SHAPES  # bench_parallel's, for both (cp: N the batch's tokens, about)
IMPLS = ["eager_fp32", "compile"]


def shard_range(v, p, r):
    """lf_tp_shard: rank r's columns [v0, v1); the first v % p ranks get one more."""
    base, extra = divmod(v, p)
    v0 = r * base + min(r, extra)
    return v0, v0 + base + (1 if r < extra else 0)


# --------------------------------------------------------------------------------------------
# Eager: the Megatron-style function
# --------------------------------------------------------------------------------------------
class VocabParallelCE(torch.autograd.Function):
    """Per-row losses of fp32 shard logits x [N, Vs] (columns v0 .. v0 + Vs of the vocabulary)."""

    @staticmethod
    def forward(ctx, x, labels, v0):
        # x is the fp32 cast of the bf16 shard, a buffer of its own that the cast's backward does
        # not keep: worked on in place, as Megatron does (no second fp32 copy)
        m = x.max(dim=-1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        x.sub_(m.unsqueeze(-1))
        vs = x.shape[-1]
        valid = labels != IGNORE_INDEX
        here = valid & (labels >= v0) & (labels < v0 + vs)
        idx = (labels - v0).clamp(0, vs - 1)
        red = torch.empty(x.shape[0], 2, dtype=torch.float32, device=x.device)
        red[:, 1] = torch.where(here, x.gather(-1, idx.unsqueeze(-1)).squeeze(-1), 0.0)
        x.exp_()
        red[:, 0] = x.sum(dim=-1)
        dist.all_reduce(red, op=dist.ReduceOp.SUM)
        loss = torch.where(valid, red[:, 0].log() - red[:, 1], 0.0)
        x.div_(red[:, 0].unsqueeze(-1))  # the softmax, kept for backward
        ctx.save_for_backward(x, here, idx, valid)
        return loss

    @staticmethod
    def backward(ctx, dloss):
        sm, here, idx, valid = ctx.saved_tensors
        g = sm  # in place over the saved softmax, as Megatron does
        rows = torch.arange(g.shape[0], device=g.device)
        g[rows, idx] -= here.to(g.dtype)
        g.mul_(torch.where(valid, dloss, 0.0).unsqueeze(-1))  # an ignored row's loss is a constant 0
        return g, None, None


def eager_loss(shard, labels, v0, count):
    per_row = VocabParallelCE.apply(shard.float(), labels, v0)
    return per_row.sum() / count


# --------------------------------------------------------------------------------------------
# torch.compile: the local pieces compiled, the collectives between them
# --------------------------------------------------------------------------------------------
def local_max(shard):
    return shard.float().max(dim=-1).values


def local_sums(shard, m, labels, v0: int):
    x = shard.float() - m.unsqueeze(-1)
    vs = x.shape[-1]
    here = (labels != IGNORE_INDEX) & (labels >= v0) & (labels < v0 + vs)
    idx = (labels - v0).clamp(0, vs - 1)
    zy = torch.where(here, x.gather(-1, idx.unsqueeze(-1)).squeeze(-1), 0.0)
    return torch.stack([x.exp().sum(dim=-1), zy], dim=-1)


def local_grad(shard, m, lse, labels, v0: int, dloss):
    x = shard.float()
    vs = x.shape[-1]
    here = (labels != IGNORE_INDEX) & (labels >= v0) & (labels < v0 + vs)
    cols = torch.arange(vs, device=x.device) + v0
    onehot = (cols.unsqueeze(0) == labels.unsqueeze(-1)) & here.unsqueeze(-1)
    p = torch.exp(x - (m + lse).unsqueeze(-1))
    dl = torch.where(labels != IGNORE_INDEX, dloss, 0.0)  # an ignored row's loss is a constant 0
    return ((p - onehot.to(p.dtype)) * dl.unsqueeze(-1)).to(shard.dtype)


class CompiledFns:
    def __init__(self):
        self.max = torch.compile(local_max, dynamic=False)
        self.sums = torch.compile(local_sums, dynamic=False)
        self.grad = torch.compile(local_grad, dynamic=False)


class VocabParallelCECompiled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, shard, labels, v0, fns):
        m = fns.max(shard)
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        red = fns.sums(shard, m, labels, v0)
        dist.all_reduce(red, op=dist.ReduceOp.SUM)
        lse = red[:, 0].log()
        loss = torch.where(labels != IGNORE_INDEX, lse - red[:, 1], 0.0)
        ctx.save_for_backward(shard, m, lse, labels)
        ctx.v0, ctx.fns = v0, fns
        return loss

    @staticmethod
    def backward(ctx, dloss):
        shard, m, lse, labels = ctx.saved_tensors
        return ctx.fns.grad(shard, m, lse, labels, ctx.v0, dloss.contiguous()), None, None, None


def compiled_loss(fns):
    def f(shard, labels, v0, count):
        return VocabParallelCECompiled.apply(shard, labels, v0, fns).sum() / count
    return f


def tp_case(rank, P, logits, labels):
    """(floor bytes, the rank's leaf, {impl: step}, reference): a step runs forward + backward
    and returns the (global) loss; the reference gives the float64 loss and this rank's part of
    its gradient."""
    n, v = logits.shape
    v0, v1 = shard_range(v, P, rank)
    count = (labels != IGNORE_INDEX).sum().clamp(min=1).to(torch.float32)
    shard = logits.detach()[:, v0:v1].contiguous().requires_grad_(True)

    def stepper(fn):
        def step():
            loss = fn(shard, labels, v0, count)
            loss.backward()
            return loss.detach()
        return step

    def ref():
        full = logits.detach().double().requires_grad_(True)
        loss = F.cross_entropy(full, labels, ignore_index=IGNORE_INDEX)
        loss.backward()
        return loss.item(), full.grad[:, v0:v1]

    steps = {"torch_eager_fp32": lambda: stepper(eager_loss),
             "torch_compile": lambda: stepper(compiled_loss(CompiledFns()))}
    return 2 * n * shard_range(v, P, 0)[1] * 2, shard, steps, ref


# --------------------------------------------------------------------------------------------
# Context parallelism: gather then loss, or the local loss
# --------------------------------------------------------------------------------------------
def cp_layout(t, c, seed):
    """16 sequence lengths (multiples of 2c, around t / 16) and each rank's global positions
    (the zigzag shard: chunks r and 2c - 1 - r of every sequence)."""
    g = torch.Generator().manual_seed(seed)
    unit = 2 * c
    mean = max(unit, t // 16)
    lens = [max(1, round(mean * (0.5 + torch.rand(1, generator=g).item()) / unit)) * unit for _ in range(16)]
    starts = [sum(lens[:k]) for k in range(16)]
    rows = []
    for r in range(c):
        idx = []
        for s0, ln in zip(starts, lens):
            q = ln // unit
            idx += list(range(s0 + r * q, s0 + (r + 1) * q)) + list(range(s0 + (unit - 1 - r) * q, s0 + (unit - r) * q))
        rows.append(idx)
    return lens, starts, rows


def cp_labels(ids, lens, starts):
    """Shift within each sequence on the global ids; a prompt token (the first quarter of its
    sequence) is not predicted, nor is anything after a sequence's last token."""
    labels = torch.full_like(ids, IGNORE_INDEX)
    for s0, ln in zip(starts, lens):
        first = s0 + ln // 4  # the first predicted token
        lo = max(s0, first - 1)
        labels[lo:s0 + ln - 1] = ids[lo + 1:s0 + ln]
    return labels


class GatherZigzag(torch.autograd.Function):
    """The ranks' local logits gathered and put back in sequence order; backward: this rank's rows."""

    @staticmethod
    def forward(ctx, local, inv, mine, c):
        gathered = torch.empty(c * local.shape[0], local.shape[1], dtype=local.dtype, device=local.device)
        dist.all_gather_into_tensor(gathered, local.contiguous())
        ctx.save_for_backward(mine)
        return gathered.index_select(0, inv)

    @staticmethod
    def backward(ctx, g):
        (mine,) = ctx.saved_tensors
        return g.index_select(0, mine), None, None, None


def ce_mean_fp32(logits, labels):
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX)


def ce_sum_fp32(logits, labels):
    return F.cross_entropy(logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")


def cp_case(rank, C, logits, labels, rows):
    dev = logits.device
    t, v = logits.shape
    mine = torch.tensor(rows[rank], dtype=torch.int64, device=dev)
    inv = torch.argsort(torch.tensor([p for r in rows for p in r], dtype=torch.int64, device=dev))
    local = logits.detach().index_select(0, mine).contiguous().requires_grad_(True)
    local_labels = labels.index_select(0, mine)

    def gather_step(ce):
        def step():
            loss = ce(GatherZigzag.apply(local, inv, mine, C), labels)
            loss.backward()
            return loss.detach()
        return step

    def local_step(ce):
        def step():
            cnt = (local_labels != IGNORE_INDEX).sum().to(torch.float32)
            dist.all_reduce(cnt)
            part = ce(local, local_labels) / cnt.clamp(min=1)
            part.backward()
            loss = part.detach().clone()
            dist.all_reduce(loss)  # the logged loss
            return loss
        return step

    def ref():
        full = logits.detach().double().requires_grad_(True)
        loss = F.cross_entropy(full, labels, ignore_index=IGNORE_INDEX)
        loss.backward()
        return loss.item(), full.grad.index_select(0, mine)

    steps = {"torch_gather_eager_fp32": lambda: gather_step(ce_mean_fp32),
             "torch_gather_compile": lambda: gather_step(torch.compile(ce_mean_fp32, dynamic=False)),
             "torch_local_eager_fp32": lambda: local_step(ce_sum_fp32),
             "torch_local_compile": lambda: local_step(torch.compile(ce_sum_fp32, dynamic=False))}
    return 2 * (t // C) * v * 2, local, steps, ref


# --------------------------------------------------------------------------------------------
# One rank
# --------------------------------------------------------------------------------------------
def check(step, x, ref):
    """(loss relative error, the largest gradient error in bf16 rounding units, the worst element)."""
    x.grad = None
    loss = step().item()
    ref_loss, gref = ref()
    err = (x.grad.double() - gref).abs()
    # bf16 keeps 8 significant bits: for |ref| in [2^k, 2^(k+1)) its ulp is 2^(k-7), and rounding
    # to nearest is off by at most half of it, 2^(k-8) (frexp: |ref| = m 2^e, m in [0.5, 1), k = e - 1);
    # the floor (1e-6 of the largest) covers values that round to 0 or underflow
    e = torch.frexp(gref)[1]
    half_ulp = torch.ldexp(torch.ones_like(gref), (e - 9).to(torch.int32))
    units = err / (torch.where(gref != 0, half_ulp, 0.0) + gref.abs().max() * 1e-6)
    worst = int(units.argmax())
    r, c = divmod(worst, gref.shape[1])
    where = f"worst local row={r} col={c} grad={float(x.grad[r, c]):.6e} ref={float(gref[r, c]):.6e}"
    out = (abs(loss - ref_loss) / max(abs(ref_loss), 1e-30), units.max().item(), where)
    x.grad = None
    del gref, err, units
    return out


def worker(rank, args, port):
    P = args.ranks
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", rank=rank, world_size=P, device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group("gloo", rank=rank, world_size=P)
    dev = Dev(args.device)
    say = print if rank == 0 else (lambda *a, **k: None)

    def slowest(x):  # the largest value over the ranks (a float)
        t = torch.tensor([x], dtype=torch.float64, device=dev.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    mode = f"{args.kind}{P}_nccl"
    if rank == 0:
        name = torch.cuda.get_device_name() if cuda else "cpu"
        say(f"DEVICE name={'_'.join(name.split())}", flush=True)
        say(f"INFO torch={torch.__version__} cuda={torch.version.cuda} {args.kind}={P} iters={args.iters} "
            f"nccl={'.'.join(map(str, torch.cuda.nccl.version())) if cuda else 'none'}", flush=True)
        if not args.no_copy:
            say(f"COPY impl=torch gbps={copy_bandwidth(dev):.1f} bytes={2 << 30}", flush=True)
    torch._dynamo.config.cache_size_limit = 64
    dev.make_scratch()
    failed = 0
    for (n, v) in args.shapes:
        if args.kind == "tp":
            logits, labels = make_data(dev, n, v, args.seed)
        else:
            lens, starts, rows = cp_layout(n, P, args.seed)
            n = sum(lens)
            logits = make_data(dev, n, v, args.seed)[0]
            gen = torch.Generator().manual_seed(args.seed + 1)
            labels = cp_labels(torch.randint(0, v, (n,), generator=gen), lens, starts).to(dev.device)
        # rank 0's data on every rank: the same seed does not give the same logits everywhere
        # (make_data's outliers may land twice on one element, and which write wins is not fixed:
        # at 4096 x 262144 the two GPUs held a different row 1440, and the check caught it)
        dist.broadcast(logits.detach(), src=0)
        dist.broadcast(labels, src=0)
        floor, x, steps, ref = tp_case(rank, P, logits, labels) if args.kind == "tp" else cp_case(rank, P, logits, labels, rows)
        dev.free()
        for impl, make_step in steps.items():
            if args.impls and not any(impl.endswith(k) for k in args.impls):
                continue
            status, ms, extra = "ok", float("nan"), 0
            try:
                if impl.endswith("compile"):
                    torch._dynamo.reset()
                step = make_step()
                t0 = time.perf_counter()
                for _ in range(6 if impl.endswith("compile") else 3):  # warm-up (compile: compilation)
                    x.grad = None
                    step()
                    dev.sync()
                warm_s = slowest(time.perf_counter() - t0)
                if args.check:
                    dl, dg, where = check(step, x, ref)
                    # the loss: fp32 row sums and a mean of N of them (1e-5 relative, issue 2's
                    # accuracy); the gradient: within bf16's rounding of the reference. Judged on
                    # each rank (a NaN fails there; a MAX over the ranks might drop it), then the
                    # failures counted over the ranks
                    mine_ok = math.isfinite(dl) and math.isfinite(dg) and dl <= 1e-5 and dg <= 1.01
                    ok = slowest(0.0 if mine_ok else 1.0) == 0.0
                    dl_all, dg_all = slowest(dl), slowest(dg)
                    say(f"CHECK impl={impl} mode={mode} N={n} V={v} loss_rel_err={dl_all:.3e} "
                        f"grad_err_bf16_units={dg_all:.3f} {'ok' if ok else 'WRONG'} (rank 0: {where})", flush=True)
                    if not ok:
                        status = "WRONG"
                        failed += 1
                    dev.free()
                times = []
                for _ in range(args.iters):
                    x.grad = None
                    dist.barrier()
                    dev.sync()
                    times.append(dev.time_once(step))
                ms = slowest(statistics.median(times))
                x.grad = None
                dev.sync()
                dev.reset_peak()
                base = dev.allocated()
                step()
                dev.sync()
                extra = int(slowest(max(0, dev.peak() - base)))
                x.grad = None
                say(f"INFO impl={impl} mode={mode} N={n} V={v} warmup_s={warm_s:.1f}", flush=True)
            except Exception as e:  # noqa: BLE001
                # a rank that fails leaves the others in a collective: report and stop the run
                print(f"ERROR rank={rank} impl={impl} mode={mode} N={n} V={v}: {one_line(e)}", flush=True)
                os._exit(1)
            ms_s = f"{ms:.4f}" if ms == ms else "nan"
            say(f"RESULT impl={impl} mode={mode} N={n} V={v} dtype=bf16 ms={ms_s} bytes={floor} "
                f"extra_bytes={extra} status={status} gpus={P}", flush=True)
            x.grad = None
            step = None
            dev.free()
        logits = labels = x = steps = ref = None
        dev.free()
    dist.barrier()
    dist.destroy_process_group()
    if failed:
        say(f"FAILED {failed} check(s): see the CHECK lines", flush=True)
        sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    grp = ap.add_mutually_exclusive_group()
    grp.add_argument("--tp", type=int, help="tensor parallelism over this many GPUs (the default: 2)")
    grp.add_argument("--cp", type=int, help="context parallelism over this many GPUs")
    ap.add_argument("--shapes", help="comma-separated NxV list (tp: V the full vocabulary; cp: N the "
                    f"batch's tokens, about); default {DEFAULT_SHAPES}")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--impls", default="", help="comma-separated suffixes of the impl names to run "
                    "(eager_fp32, compile; default: all)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-check", dest="check", action="store_false",
                    help="skip the comparison with the float64 loss of the unsharded logits (its float64 copies)")
    ap.add_argument("--no-copy", action="store_true", help="skip the copy-bandwidth measurement")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: gloo on the CPU, a smoke test of the script only, meaningless numbers")
    args = ap.parse_args()
    args.kind, args.ranks = ("cp", args.cp) if args.cp is not None else ("tp", args.tp if args.tp is not None else 2)
    args.shapes = parse_shapes(args.shapes or (DEFAULT_SHAPES if args.kind == "tp" else DEFAULT_CP_SHAPES))
    args.impls = [t.strip() for t in args.impls.split(",") if t.strip()]
    bad = [t for t in args.impls if t not in IMPLS]
    if bad:
        sys.exit(f"unknown impls: {','.join(bad)} (choose from {','.join(IMPLS)})")
    if args.ranks < 1 or args.iters < 1:
        sys.exit("--tp / --cp and --iters must be >= 1")
    if args.device == "cuda" and torch.cuda.device_count() < args.ranks:
        print(f"torch_parallel_peers: {args.kind}={args.ranks} skipped, {torch.cuda.device_count()} GPU(s) seen", flush=True)
        return
    mp.spawn(worker, args=(args, free_port()), nprocs=args.ranks, join=True)


if __name__ == "__main__":
    main()
