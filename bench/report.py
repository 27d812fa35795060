#!/usr/bin/env python3
"""Turn benchmark logs into a markdown table and a chart.

    python3 bench/report.py LOG [LOG...] --md bench/results_table.md --png bench/results.png
    some_bench | python3 bench/report.py - --md table.md

Reads RESULT / COPY / DEVICE lines (from bench/torch_peers.py and from the CUDA bench, which
prints the same format with impl=lossfuse and COPY impl=cuda); any other line, and any unknown
key=value on a known line, is ignored. A keyword may be preceded by other text (timestamps).

  RESULT impl=... mode=... N=... V=... ms=... bytes=... [extra_bytes=...] [status=...]
  COPY impl=cuda|torch gbps=... [bytes=...]
  DEVICE name=...

GB/s = bytes / ms / 1e6 (bytes is the floor traffic of the op); % of copy = GB/s / copy GB/s.
The copy bandwidth is the one from COPY impl=cuda when present, else impl=torch (else any).
When a (mode, N, V, impl) appears more than once, the last line wins (a note goes to stderr).
Impls measured for a mode but absent for one of its shapes get a row with status=missing.
"""
import argparse
import math
import re
import sys

IMPL_ORDER = ["lossfuse", "lossfuse_streamed", "lossfuse_nocluster", "lossfuse_warp", "torch_compile", "torch_eager_bf16", "torch_eager_fp32"]
MODE_ORDER = ["fwdbwd", "fwd", "kl_fwd", "kl_rev", "jsd", "softce", "tvd"]
KEYWORD_RE = re.compile(r"(?:^|\s)(RESULT|COPY|DEVICE)(?=\s|$)(.*)$")


def warn(msg):
    print(f"report.py: {msg}", file=sys.stderr)


def parse_kv(rest):
    kv = {}
    for tok in rest.split():
        if "=" in tok:
            k, _, v = tok.partition("=")
            if k:
                kv[k] = v
    return kv


def to_float(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return float("nan")


def to_int(s):
    try:
        return int(s)
    except (TypeError, ValueError):
        f = to_float(s)
        return int(f) if math.isfinite(f) else None


def parse(streams):
    results = {}   # (mode, N, V, impl) -> dict
    copies = []    # (impl, gbps)
    devices = []
    for name, fh in streams:
        for lineno, line in enumerate(fh, 1):
            m = KEYWORD_RE.search(line.rstrip("\n"))
            if not m:
                continue
            kind, kv = m.group(1), parse_kv(m.group(2))
            where = f"{name}:{lineno}"
            if kind == "DEVICE":
                if "name" in kv and kv["name"] not in devices:
                    devices.append(kv["name"])
            elif kind == "COPY":
                g = to_float(kv.get("gbps"))
                if math.isfinite(g) and g > 0:
                    copies.append((kv.get("impl", "?"), g))
                else:
                    warn(f"{where}: COPY line without a usable gbps, ignored")
            else:
                try:
                    key = (kv["mode"], int(kv["N"]), int(kv["V"]), kv["impl"])
                except (KeyError, ValueError):
                    warn(f"{where}: RESULT line without mode/N/V/impl, ignored")
                    continue
                ms = to_float(kv.get("ms"))
                nbytes = to_int(kv.get("bytes"))
                status = kv.get("status", "ok")
                if status == "ok" and not (math.isfinite(ms) and ms > 0):
                    status = "bad_ms"
                if key in results:
                    warn(f"{where}: duplicate {key}, keeping the last one")
                results[key] = {"ms": ms, "bytes": nbytes, "status": status,
                                "extra": to_int(kv.get("extra_bytes"))}
    return results, copies, devices


def pick_copy(copies):
    for want in ("cuda", "torch"):
        found = [g for impl, g in copies if impl == want]
        if found:
            return want, found[-1]
    if copies:
        return copies[-1]
    return None, None


def order_key(order, x):
    return (order.index(x), "") if x in order else (len(order), x)


def fill_missing(results):
    """Adds status=missing rows for impls measured in a mode but absent for some of its shapes."""
    rows = dict(results)
    modes = {k[0] for k in results}
    for mode in modes:
        impls = {k[3] for k in results if k[0] == mode}
        shapes = {(k[1], k[2]) for k in results if k[0] == mode}
        for (n, v) in shapes:
            for impl in impls:
                if (mode, n, v, impl) not in rows:
                    rows[(mode, n, v, impl)] = {"ms": float("nan"), "bytes": None,
                                                "status": "missing", "extra": None}
    return rows


def sorted_keys(rows):
    return sorted(rows, key=lambda k: (order_key(MODE_ORDER, k[0]), k[1], k[2],
                                       order_key(IMPL_ORDER, k[3])))


def gbps_of(r):
    if r["status"] != "ok" or not r["bytes"] or not math.isfinite(r["ms"]) or r["ms"] <= 0:
        return float("nan")
    return r["bytes"] / r["ms"] / 1e6


def human_bytes(b):
    if b is None:
        return "-"
    if b == 0:
        return "0"
    if b < (1 << 30):
        return f"{b / (1 << 20):.1f} MiB"
    return f"{b / (1 << 30):.2f} GiB"


def v_label(v):
    if v % 1024 == 0:
        return f"{v // 1024}K"
    if v >= 1000:
        return f"{round(v / 1000)}K"
    return str(v)


def fmt(x, spec):
    return format(x, spec) if math.isfinite(x) else "-"


def markdown(rows, copy_src, copy_gbps, devices):
    lines = []
    lines.append(f"Device: {', '.join(d.replace('_', ' ') for d in devices) or 'unknown'}"
                 + ("  (WARNING: several devices in the logs)" if len(devices) > 1 else ""))
    lines.append("")
    if copy_gbps:
        lines.append(f"Copy bandwidth used for %: {copy_gbps:.1f} GB/s "
                     f"(COPY impl={copy_src}; read + written bytes / time)")
    else:
        lines.append("Copy bandwidth: none found in the logs, % column left empty")
    lines.append("")
    lines.append("GB/s = floor bytes / time (fwdbwd: N*V*4, read bf16 logits + write bf16 grad; "
                 "fwd: N*V*2; impl names ending in _f32: fp32 logits and grad, twice that; "
                 "distillation kl_fwd / kl_rev / jsd fwd+bwd: N*V*6, read student + teacher, "
                 "write the student's grad).")
    lines.append("")
    lines.append("| mode | N | V | impl | ms | GB/s | % of copy | extra mem | status |")
    lines.append("|---|---:|---:|---|---:|---:|---:|---:|---|")
    for k in sorted_keys(rows):
        mode, n, v, impl = k
        r = rows[k]
        g = gbps_of(r)
        pct = g / copy_gbps * 100 if copy_gbps else float("nan")
        ms = r["ms"] if r["status"] == "ok" else float("nan")
        lines.append(f"| {mode} | {n} | {v} | {impl} | {fmt(ms, '.3f')} | {fmt(g, '.0f')} | "
                     f"{fmt(pct, '.1f')} | {human_bytes(r['extra'])} | {r['status']} |")
    return "\n".join(lines) + "\n"


def chart(rows, copy_src, copy_gbps, devices, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(k[0], k[1]) for k in rows},
                    key=lambda p: (order_key(MODE_ORDER, p[0]), p[1]))
    if not panels:
        warn("no RESULT lines: no chart written")
        return
    vs = sorted({k[2] for k in rows})
    xpos = {v: i for i, v in enumerate(vs)}
    impls = sorted({k[3] for k in rows}, key=lambda x: order_key(IMPL_ORDER, x))
    cmap = plt.get_cmap("tab10")
    color = {impl: cmap(i % 10) for i, impl in enumerate(impls)}
    use_pct = bool(copy_gbps)

    modes = sorted({p[0] for p in panels}, key=lambda m: order_key(MODE_ORDER, m))
    ns = sorted({p[1] for p in panels})
    fig, axes = plt.subplots(len(modes), len(ns), figsize=(5.5 * len(ns), 4.2 * len(modes)),
                             squeeze=False, sharey=True)
    ymax = 110.0 if use_pct else 0.0
    for k, r in rows.items():
        g = gbps_of(r)
        y = g / copy_gbps * 100 if use_pct else g
        if math.isfinite(y):
            ymax = max(ymax, y * 1.08)

    for i, mode in enumerate(modes):
        for j, n in enumerate(ns):
            ax = axes[i][j]
            if (mode, n) not in panels:
                ax.set_visible(False)
                continue
            for impl in impls:
                xs, ys, oom_x = [], [], []
                for v in vs:
                    r = rows.get((mode, n, v, impl))
                    if r is None:
                        continue
                    g = gbps_of(r)
                    y = g / copy_gbps * 100 if use_pct else g
                    xs.append(xpos[v])
                    ys.append(y)  # NaN breaks the line at failed / missing points
                    if r["status"] not in ("ok", "missing"):
                        oom_x.append((xpos[v], r["status"]))
                if not xs:
                    continue
                ax.plot(xs, ys, marker="o", color=color[impl], label=impl)
                for x, st in oom_x:
                    ax.plot([x], [ymax * 0.03], marker="x", color=color[impl], markersize=9,
                            linestyle="none")
                    ax.annotate(st, (x, ymax * 0.03), textcoords="offset points",
                                xytext=(5, 3 + 9 * impls.index(impl)), fontsize=7,
                                color=color[impl])
            if use_pct:
                ax.axhline(90, color="gray", linestyle="--", linewidth=1)
                ax.text(-0.35, 90, "90%", va="bottom", ha="left", fontsize=8, color="gray")
            ax.set_xticks(range(len(vs)))
            ax.set_xticklabels([v_label(v) for v in vs])
            ax.set_xlim(-0.4, len(vs) - 0.6)
            ax.set_ylim(0, ymax)
            ax.set_title(f"{mode}, N={n}")
            ax.set_xlabel("V (vocabulary)")
            if j == 0:
                ax.set_ylabel("% of D2D copy bandwidth" if use_pct else "GB/s (floor bytes)")
            ax.grid(True, alpha=0.3)
    dev = ", ".join(d.replace("_", " ") for d in devices) or "unknown device"
    sub = (f"copy {copy_gbps:.0f} GB/s (impl={copy_src})" if use_pct
           else "no copy bandwidth in the logs")
    fig.suptitle(f"{dev}: effective bandwidth (floor bytes / time) vs device copy, {sub}")
    handles = [plt.Line2D([], [], color=color[impl], marker="o", label=impl) for impl in impls]
    fig.legend(handles=handles, loc="lower center", ncol=len(impls), fontsize=9,
               frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main():
    ap = argparse.ArgumentParser(description="markdown table + chart from benchmark logs")
    ap.add_argument("logs", nargs="*", help="log files; none or '-' reads stdin")
    ap.add_argument("--md", help="also write the markdown table to this file")
    ap.add_argument("--png", help="write the chart to this PNG file")
    args = ap.parse_args()

    streams, opened = [], []
    for p in args.logs or ["-"]:
        if p == "-":
            streams.append(("<stdin>", sys.stdin))
        else:
            fh = open(p, encoding="utf-8", errors="replace")
            opened.append(fh)
            streams.append((p, fh))
    results, copies, devices = parse(streams)
    for fh in opened:
        fh.close()

    if not results:
        warn("no RESULT lines found")
    copy_src, copy_gbps = pick_copy(copies)
    rows = fill_missing(results)
    md = markdown(rows, copy_src, copy_gbps, devices)
    sys.stdout.write(md)
    if args.md:
        with open(args.md, "w", encoding="utf-8") as f:
            f.write(md)
    if args.png:
        chart(rows, copy_src, copy_gbps, devices, args.png)


if __name__ == "__main__":
    main()
