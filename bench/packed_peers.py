#!/usr/bin/env python3
"""PyTorch peers of bench/bench_packed.cu (issue 4): same shapes, same output format.

Run (on a GPU machine, from the repository root):

    python3 bench/packed_peers.py [--modes dpo,pref,segsum] [--shapes 8192x32768,8192x151936]

  mode=dpo     sigmoid DPO from packed bf16 logits [T, V], 16 sequences (pairs of adjacent
               chosen / rejected, a quarter of each a prompt with ignore_index labels), with
               reference log-probabilities, forward + backward w.r.t. the logits:
                 lp = log_softmax(logits.float()); tok = lp.gather(labels) * mask;
                 seq = zeros(nseq).index_add_(0, seq_id, tok); h = (seq_c - ref_c) - (seq_r - ref_r);
                 loss = -logsigmoid(beta h).mean(); loss.backward()
               impl torch_eager_fp32 and torch_compile (of the same function). Floor: T*V*4.
  mode=pref    S = 12480 items, P = 50000 pairs, 32 bins: Bradley-Terry (hard 0/1 targets,
               per-pair weights, weighted mean) plus quadratic budget / coverage hinges on
               hist = zeros(B).index_add_(0, bin, mass * sigmoid(s)); forward + backward w.r.t.
               the scores. impl torch_eager, torch_eager_graph (the same captured with
               torch.cuda.graph, replayed), torch_compile, torch_compile_graph
               (mode="reduce-overhead"), torch_compile_captured (the compiled function's
               forward + backward, default mode, captured with torch.cuda.graph after its
               warm-up compiled both, replayed: no Python or autograd work per call, the form
               a graph-captured training step gets). ms is the mean over 200 back-to-back calls.
  mode=segsum  10^8 fp32 values, 10^5 sequences: torch_index_add (zeros(nseq).index_add_ with
               precomputed per-value sequence ids, not timed) and torch_segment_reduce
               (torch.segment_reduce(v, "sum", lengths=...)).

Timing as in bench/torch_peers.py (CUDA events, the median): dpo with L2 flushed before each
call; segsum (read-only) alternating between two copies of the values after a GPU spin, as
bench_packed times it; prints DEVICE / COPY / RESULT lines for bench/report.py.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_peers import COPY_BYTES, Dev, copy_bandwidth, is_oom, one_line, out  # noqa: E402



def dpo_loss(logits, labels, mask, seq_id, nseq, pc, pr, ref, beta):
    lp = torch.log_softmax(logits.float(), dim=-1)
    tok = lp.gather(-1, labels[:, None]).squeeze(-1) * mask
    seq = torch.zeros(nseq, dtype=torch.float32, device=logits.device).index_add_(0, seq_id, tok)
    h = (seq[pc] - ref[pc]) - (seq[pr] - ref[pr])
    return -F.logsigmoid(beta * h).mean()


def bench_dpo(dev, T, V, nseq, iters):
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(T, V, device="cuda", generator=g) * 2.0).to(torch.bfloat16).requires_grad_(True)
    bounds = [T * k // nseq for k in range(nseq + 1)]
    labels = torch.randint(0, V, (T,), device="cuda", generator=g)
    mask = torch.zeros(T, device="cuda")
    seq_id = torch.empty(T, dtype=torch.int64, device="cuda")
    for k in range(nseq):
        b, e = bounds[k], bounds[k + 1]
        seq_id[b:e] = k
        mask[b + (e - b) // 4:e - 1] = 1.0
    pc = torch.arange(0, nseq, 2, device="cuda")
    pr = pc + 1
    ref = torch.tensor([-2.0 * (bounds[k + 1] - bounds[k]) for k in range(nseq)], device="cuda")
    for impl in ("eager_fp32", "compile"):
        fn = dpo_loss if impl == "eager_fp32" else torch.compile(dpo_loss, dynamic=False)
        status, ms, extra = "ok", float("nan"), None
        try:
            def op():
                fn(logits, labels, mask, seq_id, nseq, pc, pr, ref, 0.1).backward()
            for _ in range(3 if impl == "eager_fp32" else 5):
                logits.grad = None
                op()
            times = []
            for _ in range(iters):
                logits.grad = None
                dev.sync()
                times.append(dev.time_once(op))
            ms = statistics.median(times)
            logits.grad = None
            dev.sync()
            dev.reset_peak()
            base = dev.allocated()
            op()
            dev.sync()
            extra = max(0, dev.peak() - base)
        except Exception as e:  # noqa: BLE001
            status = "OOM" if is_oom(e) else "ERROR"
            if status == "ERROR":
                out(f"ERROR dpo {impl} T={T} V={V}: {one_line(e)}")
        logits.grad = None
        name = "torch_eager_fp32" if impl == "eager_fp32" else "torch_compile"
        ms_s = "nan" if ms != ms else f"{ms:.4f}"
        ex_s = "nan" if extra is None else str(int(extra))
        out(f"RESULT impl={name} mode=dpo N={T} V={V} dtype=bf16 ms={ms_s} bytes={T * V * 4} extra_bytes={ex_s} status={status}")
        torch._dynamo.reset()
    del logits
    dev.free()


def pref_loss(s, pi, pj, t, w, bins, mass, budget, cov, nb):
    z = s[pi] - s[pj]
    lt = t * F.softplus(-z) + (1.0 - t) * F.softplus(z)
    pair = (w * lt).sum() / w.sum()
    hist = torch.zeros(nb, dtype=s.dtype, device=s.device).index_add_(0, bins, mass * torch.sigmoid(s))
    pen = 0.5 * torch.relu(hist - budget).square().sum() + 0.5 * torch.relu(cov - hist).square().sum()
    return pair + pen


def bench_pref(dev):
    S, P, B = 12480, 50000, 32
    g = torch.Generator(device="cuda").manual_seed(1)
    s = ((torch.rand(S, device="cuda", generator=g) - 0.5) * 3.0).requires_grad_(True)
    pi = torch.randint(0, S, (P,), device="cuda", generator=g)
    pj = (pi + torch.randint(1, S, (P,), device="cuda", generator=g)) % S
    t = (torch.rand(P, device="cuda", generator=g) < 0.5).float()
    w = 0.5 + torch.rand(P, device="cuda", generator=g)
    bins = torch.randint(0, B, (S,), device="cuda", generator=g)
    mass = 0.5 + torch.rand(S, device="cuda", generator=g)
    budget = torch.full((B,), 0.52 * S / B, device="cuda")
    cov = torch.full((B,), 0.45 * S / B, device="cuda")
    args = (pi, pj, t, w, bins, mass, budget, cov, B)
    reps = 200
    for impl in ("eager", "eager_graph", "compile", "compile_graph", "compile_captured"):
        status, ms = "ok", float("nan")
        try:
            if impl.startswith("compile"):
                torch._dynamo.reset()
                fn = torch.compile(pref_loss, dynamic=False, mode="reduce-overhead" if impl == "compile_graph" else "default")
            else:
                fn = pref_loss
            def op():
                s.grad = None
                fn(s, *args).backward()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(5):
                    op()
            torch.cuda.current_stream().wait_stream(side)
            run = op
            if impl in ("eager_graph", "compile_captured"):
                graph = torch.cuda.CUDAGraph()
                s.grad = None
                with torch.cuda.graph(graph):
                    fn(s, *args).backward()
                run = graph.replay
            for _ in range(10):
                run()
            dev.sync()
            rounds = []
            for _ in range(5):
                e0 = torch.cuda.Event(enable_timing=True)
                e1 = torch.cuda.Event(enable_timing=True)
                e0.record()
                for _ in range(reps):
                    run()
                e1.record()
                e1.synchronize()
                rounds.append(e0.elapsed_time(e1) / reps)
            ms = statistics.median(rounds)
        except Exception as e:  # noqa: BLE001
            status = "ERROR"
            out(f"ERROR pref {impl}: {one_line(e)}")
        ms_s = "nan" if ms != ms else f"{ms:.5f}"
        out(f"RESULT impl=torch_{impl} mode=pref N={S} V={P} dtype=fp32 ms={ms_s} bytes={P * 16 + S * 16} extra_bytes=nan "
            f"status={status}")
    torch._dynamo.reset()


def bench_segsum(dev, iters):
    T, nseq = 100_000_000, 100_000
    g = torch.Generator(device="cuda").manual_seed(2)
    cuts = torch.sort(torch.randint(0, T, (nseq - 1,), device="cuda", generator=g)).values
    bounds = torch.cat([torch.zeros(1, dtype=torch.int64, device="cuda"), cuts, torch.full((1,), T, device="cuda")])
    lengths = bounds[1:] - bounds[:-1]
    seq_id = torch.repeat_interleave(torch.arange(nseq, device="cuda"), lengths)
    # two copies, alternated: a read-only pass leaves L2 clean, so each timed call starts with
    # the other copy's tail in L2 and no dirty lines to write back (as bench_packed's segsum)
    vs = [torch.rand(T, device="cuda", generator=g) for _ in range(2)]
    ops = {
        "torch_index_add": lambda v: torch.zeros(nseq, device="cuda").index_add_(0, seq_id, v),
        "torch_segment_reduce": lambda v: torch.segment_reduce(v, "sum", lengths=lengths),
    }
    for name, op in ops.items():
        status, ms = "ok", float("nan")
        try:
            for i in range(3):
                op(vs[i & 1])
            ms = statistics.median([dev.time_once(lambda i=i: op(vs[i & 1]), flush=False) for i in range(iters)])
        except Exception as e:  # noqa: BLE001
            status = "ERROR"
            out(f"ERROR segsum {name}: {one_line(e)}")
        ms_s = "nan" if ms != ms else f"{ms:.4f}"
        out(f"RESULT impl={name} mode=segsum N={T} V={nseq} dtype=fp32 ms={ms_s} bytes={4 * T} extra_bytes=nan status={status}")
    del vs, seq_id
    dev.free()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="pref,segsum,dpo")
    ap.add_argument("--shapes", default="8192x32768,8192x151936")
    ap.add_argument("--seqs", type=int, default=16)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--no-copy", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("CUDA is not available")
    dev = Dev("cuda")
    out(f"DEVICE name={'_'.join(torch.cuda.get_device_name().split())}")
    if not a.no_copy:
        out(f"COPY impl=torch gbps={copy_bandwidth(dev):.1f} bytes={COPY_BYTES}")
    dev.make_scratch()
    t0 = time.perf_counter()
    modes = a.modes.split(",")
    if "pref" in modes:
        bench_pref(dev)
    if "segsum" in modes:
        bench_segsum(dev, a.iters)
    if "dpo" in modes:
        for tok in a.shapes.split(","):
            T, V = (int(x) for x in tok.lower().split("x"))
            bench_dpo(dev, T, V, a.seqs, a.iters)
    out(f"INFO packed_peers done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
