#!/usr/bin/env python3
"""The GPU's busy fraction of a run: the union of its kernel, copy and memset intervals over a window
of wall time, the idle gaps by length, and a timeline figure. Reads the trace of
libfdpp_gpu_trace.so (tools/gpu_trace/: CUPTI's activity records, one per kernel, kernels of CUDA
graphs one per node), or an Nsight Systems trace exported to SQLite.

    CUDA_INJECTION64_PATH=build-gpu/libfdpp_gpu_trace.so FDPP_GPU_TRACE_OUT=run.gputrace fdpp serve ...
    python3 bench/gpu_busy.py run.gputrace [--json OUT.json] [--plot OUT.png]
    python3 bench/gpu_busy.py run.sqlite       (nsys profile --cuda-graph-trace=node; nsys export --type sqlite)

The window, by default: from the first kernel whose name holds "attention" (the first engine step;
loading comes before it) to the last activity's end, cut at idle stretches longer than --split-gap
into segments, of which the one with the most busy time is the run (a server's warm-up, its wait for
the first request and its idle time before the stop signal fall outside). Instead:
--serve-bench RESULT.json takes bench/serve_bench.py's measured interval (its started_unix and
ended_unix, put on the GPU's clock by the trace's clock records), --window-start-ns/--window-end-ns
give the window in the trace's timestamps, --window first-attention keeps the whole span from the
first attention kernel. --skip-seconds drops the window's first seconds.

Idle gaps by length: under 10 us is launch and dependency latency inside a step, 10 us to 1 ms
mostly the host's share of a step, over 1 ms the host between steps (or no work). Standard library
only; the figure needs matplotlib.
"""
import argparse
import bisect
import json
import os
import sqlite3
import struct
import sys
from dataclasses import dataclass, field

MAGIC = b"FDPPGPUT"
RECORD = struct.Struct("<QQIIIHBB")  # tools/gpu_trace/trace_file.h: Record
KERNEL, MEMCPY, MEMSET = 1, 2, 3
KIND_NAMES = {KERNEL: "kernel", MEMCPY: "memcpy", MEMSET: "memset"}
GAP_BINS = (("<10us", 1e4), ("10-100us", 1e5), ("100us-1ms", 1e6), (">1ms", float("inf")))


@dataclass
class Trace:
    # (start_ns, end_ns, stream, name_id, graph_id, device, kind, detail) per activity
    records: list = field(default_factory=list)
    names: dict = field(default_factory=dict)  # name id -> kernel name
    clocks: list = field(default_factory=list)  # (trace ns, unix ns) read together
    dropped: int = 0
    untimed: int = 0
    complete: bool = True  # False: the end record is missing (the traced process died or is running)
    source: str = "fdpp_gpu_trace"


def read_fdpp_trace(data):
    t = Trace(complete=False)
    if len(data) < 16 or data[:8] != MAGIC:
        raise ValueError("not an fdpp GPU trace (no FDPPGPUT header)")
    version, rec_size = struct.unpack_from("<II", data, 8)
    if version != 1 or rec_size != RECORD.size:
        raise ValueError(f"trace version {version}, record size {rec_size}: this reader knows 1 and {RECORD.size}")
    pos = 16
    while pos + 8 <= len(data):
        kind, size = struct.unpack_from("<II", data, pos)
        pos += 8
        if pos + size > len(data):
            break  # a chunk cut short: the process died while writing it
        if kind == 1:
            t.clocks.append(struct.unpack_from("<QQ", data, pos))
        elif kind == 2:
            (nid,) = struct.unpack_from("<I", data, pos)
            t.names[nid] = data[pos + 4:pos + size].decode("utf-8", "replace")
        elif kind == 3:
            t.records.extend(RECORD.iter_unpack(data[pos:pos + size - size % RECORD.size]))
        elif kind == 4:
            t.dropped, t.untimed = struct.unpack_from("<QQ", data, pos)
        elif kind == 5:
            t.complete = True
        pos += size
    return t


def read_nsys_sqlite(path):
    t = Trace(source="nsys")
    db = sqlite3.connect(path)
    try:
        names = dict(db.execute("SELECT id, value FROM StringIds"))
    except sqlite3.OperationalError:
        names = {}
    ids = {}
    queries = ((KERNEL, "SELECT start, end, streamId, deviceId, demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL"),
               (MEMCPY, "SELECT start, end, streamId, deviceId, copyKind FROM CUPTI_ACTIVITY_KIND_MEMCPY"),
               (MEMSET, "SELECT start, end, streamId, deviceId, 0 FROM CUPTI_ACTIVITY_KIND_MEMSET"))
    for kind, q in queries:
        try:
            rows = db.execute(q).fetchall()
        except sqlite3.OperationalError:
            continue  # a trace without that kind of activity
        for s, e, stream, dev, x in rows:
            name = detail = 0
            if kind == KERNEL:
                name = ids.setdefault(x, len(ids) + 1)
                t.names[name] = names.get(x, "?")
            else:
                detail = x or 0
            t.records.append((s, e, stream, name, 0, dev, kind, detail))
    return t


def read_trace(path):
    with open(path, "rb") as f:
        head = f.read(16)
        if head.startswith(b"SQLite format 3"):
            return read_nsys_sqlite(path)
        return read_fdpp_trace(head + f.read())


def merge(spans):
    """The union of sorted (start, end) spans: the merged spans and the idle gaps between them."""
    merged, gaps = [], []
    cur_s = cur_e = None
    for s, e in spans:
        if cur_e is None:
            cur_s, cur_e = s, e
        elif s > cur_e:
            merged.append((cur_s, cur_e))
            gaps.append(s - cur_e)
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        merged.append((cur_s, cur_e))
    return merged, gaps


def clip(spans, lo, hi):
    return [(max(s, lo), min(e, hi)) for s, e in spans if e > lo and s < hi]


def gap_bins(gaps):
    out = {name: {"count": 0, "idle_s": 0.0} for name, _ in GAP_BINS}
    for g in gaps:
        for name, limit in GAP_BINS:
            if g < limit:
                out[name]["count"] += 1
                out[name]["idle_s"] += g / 1e9
                break
    return out


def clock_offset(trace):
    """unix ns minus trace ns, from the clock records (None without them)."""
    if not trace.clocks:
        return None
    offs = [u - c for c, u in trace.clocks]
    return sum(offs) // len(offs)


def segments(spans, lo, split_ns):
    """The busy stretches from lo on, split at idle gaps over split_ns: [(start, end, busy_ns)]."""
    merged, _ = merge(clip(spans, lo, float("inf")))
    segs = []
    for s, e in merged:
        if segs and s - segs[-1][1] <= split_ns:
            a, _, b = segs[-1]
            segs[-1] = (a, e, b + e - s)
        else:
            segs.append((s, e, e - s))
    return segs


def choose_window(trace, spans, kernels, args):
    """(start_ns, end_ns, how) of the window the busy fraction is of."""
    if args.window_start_ns is not None or args.window_end_ns is not None:
        lo = args.window_start_ns if args.window_start_ns is not None else spans[0][0]
        hi = args.window_end_ns if args.window_end_ns is not None else max(e for _, e in spans)
        return lo, hi, "given in trace ns"
    if args.serve_bench:
        off = clock_offset(trace)
        if off is None:
            sys.exit("gpu_busy: --serve-bench needs the trace's clock records (an fdpp_gpu_trace trace)")
        with open(args.serve_bench) as f:
            run = json.load(f)["runs"][args.serve_bench_run]
        if "started_unix" not in run:
            sys.exit(f"gpu_busy: {args.serve_bench} has no started_unix (a serve_bench.py older than this script)")
        # The clock records at the trace's start and end: how far the two clocks drifted apart.
        offs = [u - c for c, u in trace.clocks]
        return (int(run["started_unix"] * 1e9 - off), int(run["ended_unix"] * 1e9 - off),
                f"serve_bench's measured interval ({os.path.basename(args.serve_bench)}; "
                f"clocks drifted {(max(offs) - min(offs)) / 1e3:.0f} us over the trace)")
    marked = [r[0] for r in kernels if args.start_kernel in trace.names.get(r[3], "")]
    if marked:
        lo, how = min(marked), f"from the first kernel named *{args.start_kernel}*"
    else:
        lo, how = spans[0][0], f"from the first activity (no kernel named *{args.start_kernel}*)"
    if args.window == "first-attention":
        return lo, max(e for _, e in spans), how + " to the last activity"
    segs = segments(spans, lo, args.split_gap * 1e9)
    s, e, _ = max(segs, key=lambda x: x[2])
    return s, e, how + f", the busiest of {len(segs)} stretches split at idle gaps over {args.split_gap:g} s"


def summarize(trace, args):
    devices = {}
    for r in trace.records:
        if r[1] > r[0] and r[6] == KERNEL:
            devices[r[5]] = devices.get(r[5], 0) + 1
    if not devices:
        sys.exit("gpu_busy: no timed kernel in the trace")
    device = args.device if args.device is not None else max(devices, key=devices.get)
    recs = sorted(r for r in trace.records if r[5] == device and r[1] > r[0])
    bad = sum(1 for r in trace.records if r[5] == device and r[1] <= r[0])
    spans = [(r[0], r[1]) for r in recs]
    kernels = [r for r in recs if r[6] == KERNEL]
    lo, hi, how = choose_window(trace, spans, kernels, args)
    lo += int(args.skip_seconds * 1e9)
    if hi <= lo:
        sys.exit("gpu_busy: the window is empty")
    merged, gaps = merge(clip(spans, lo, hi))
    busy = sum(e - s for s, e in merged)
    # Idle at the window's edges counts as wall time too: as gaps of their own.
    if merged:
        gaps = ([merged[0][0] - lo] if merged[0][0] > lo else []) + gaps + ([hi - merged[-1][1]] if hi > merged[-1][1] else [])
    else:
        gaps = [hi - lo]
    kmerged, _ = merge(clip([(r[0], r[1]) for r in kernels], lo, hi))
    inside = [r for r in recs if r[1] > lo and r[0] < hi]
    counts = {name: sum(1 for r in inside if r[6] == k) for k, name in KIND_NAMES.items()}
    counts["kernels_in_graphs"] = sum(1 for r in inside if r[6] == KERNEL and r[4])
    per_name = {}
    for r in inside:
        if r[6] == KERNEL and (r[4] or not args.graphs_only):
            n, t = per_name.get(r[3], (0, 0))
            per_name[r[3]] = (n + 1, t + min(r[1], hi) - max(r[0], lo))
    top = sorted(per_name.items(), key=lambda x: -x[1][1])[:args.top]
    wall = hi - lo
    return {
        "trace": args.trace,
        "source": trace.source,
        "device": device,
        "other_devices": sorted(d for d in devices if d != device),
        "window": {"start_ns": lo, "end_ns": hi, "how": how + (f", first {args.skip_seconds:g} s skipped" if args.skip_seconds else "")},
        "wall_s": wall / 1e9,
        "busy_s": busy / 1e9,
        "busy_fraction": busy / wall,
        "kernel_busy_fraction": sum(e - s for s, e in kmerged) / wall,
        "idle_by_gap": gap_bins(gaps),
        "counts": counts,
        "top_kernels": [{"name": trace.names.get(nid, "?"), "count": n, "time_s": t / 1e9, "share_of_wall": t / wall}
                        for nid, (n, t) in top],
        "records_dropped": trace.dropped,
        "records_untimed": trace.untimed,
        "records_empty": bad,
        "trace_complete": trace.complete,
    }, merged


def busy_per_bin(merged, lo, hi, bin_ns):
    n = max(1, -(-(hi - lo) // bin_ns))
    busy = [0] * n
    for s, e in merged:
        i = (s - lo) // bin_ns
        while s < e:
            edge = min(e, lo + (i + 1) * bin_ns)
            busy[i] += edge - s
            s, i = edge, i + 1
    return [b / min(bin_ns, hi - (lo + i * bin_ns)) for i, b in enumerate(busy)]


def plot(r, merged, path, bin_ms, zoom_ms, zoom_at):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lo, hi = r["window"]["start_ns"], r["window"]["end_ns"]
    bin_ns = int(bin_ms * 1e6)
    frac = busy_per_bin(merged, lo, hi, bin_ns)
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(12, 6.5), gridspec_kw={"height_ratios": [3, 2]})
    ax.step([i * bin_ms / 1e3 for i in range(len(frac))], [100 * f for f in frac], where="post", lw=0.6,
            label=f"per {bin_ms:g} ms")
    if hi - lo >= 3e9:
        per_s = busy_per_bin(merged, lo, hi, 10**9)
        ax.step(range(len(per_s)), [100 * f for f in per_s], where="post", color="black", lw=1.2, label="per second")
    ax.axhline(97, color="gray", ls="--", lw=0.8, label="97%")
    ax.set_ylim(0, 102)
    ax.set_xlim(0, (hi - lo) / 1e9)
    ax.set_xlabel("seconds from the window's start")
    ax.set_ylabel("GPU busy, %")
    ax.set_title(f"GPU busy {100 * r['busy_fraction']:.1f}% of {r['wall_s']:.2f} s "
                 f"(device {r['device']}, {r['counts']['kernel']} kernels)", fontsize=10)
    z0 = lo + int(zoom_at * 1e9) if zoom_at is not None else lo + max(0, (hi - lo) // 2 - int(zoom_ms * 5e5))
    z1 = min(hi, z0 + int(zoom_ms * 1e6))
    ax.axvspan((z0 - lo) / 1e9, (z1 - lo) / 1e9, color="orange", alpha=0.3, label=f"zoom below ({zoom_ms:g} ms)")
    ax.legend(loc="lower right", fontsize=8)
    i = bisect.bisect_left(merged, (z0, 0))
    spans = clip(merged[max(0, i - 1):bisect.bisect_right(merged, (z1, z1))], z0, z1)
    bx.broken_barh([((s - z0) / 1e6, (e - s) / 1e6) for s, e in spans], (0.55, 0.8), color="tab:blue")
    idle = [(a[1], b[0]) for a, b in zip(spans, spans[1:]) if b[0] - a[1] >= 1e4]
    bx.broken_barh([((s - z0) / 1e6, (e - s) / 1e6) for s, e in idle], (0.1, 0.35), color="tab:red")
    bx.set_yticks([0.275, 0.95], ["idle >= 10 us", "busy"])
    bx.set_ylim(0, 1.45)
    bx.set_xlim(0, (z1 - z0) / 1e6)
    bx.set_xlabel(f"ms from {(z0 - lo) / 1e9:.3f} s")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="a libfdpp_gpu_trace.so trace, or an nsys SQLite export")
    ap.add_argument("--json", default=None, help="write the result here")
    ap.add_argument("--plot", default=None, help="draw the timeline into this PNG (matplotlib)")
    ap.add_argument("--window", choices=("auto", "first-attention"), default="auto")
    ap.add_argument("--start-kernel", default="attention", help="the window starts at the first kernel whose name holds this")
    ap.add_argument("--split-gap", type=float, default=1.0, help="auto window: idle seconds that end a stretch")
    ap.add_argument("--serve-bench", default=None, help="serve_bench.py's result JSON: its measured interval is the window")
    ap.add_argument("--serve-bench-run", type=int, default=0, help="which of its runs")
    ap.add_argument("--window-start-ns", type=int, default=None)
    ap.add_argument("--window-end-ns", type=int, default=None)
    ap.add_argument("--skip-seconds", type=float, default=0.0, help="drop the window's first seconds")
    ap.add_argument("--device", type=int, default=None, help="CUDA device (default: the one with the most kernels)")
    ap.add_argument("--top", type=int, default=10, help="kernels listed by time")
    ap.add_argument("--graphs-only", action="store_true",
                    help="list only kernels replayed from CUDA graphs (a static decode's steps, not its set-up)")
    ap.add_argument("--bin-ms", type=float, default=10.0, help="figure: busy fraction per bin of this many ms")
    ap.add_argument("--zoom-ms", type=float, default=50.0, help="figure: length of the zoomed stretch")
    ap.add_argument("--zoom-at", type=float, default=None, help="figure: the zoom's start, seconds into the window (default: the middle)")
    args = ap.parse_args()
    try:
        trace = read_trace(args.trace)
    except (OSError, ValueError) as e:
        sys.exit(f"gpu_busy: {args.trace}: {e}")
    r, merged = summarize(trace, args)
    idle = ", ".join(f"{k} {v['idle_s']:.3f} s in {v['count']}" for k, v in r["idle_by_gap"].items())
    c = r["counts"]
    print(f"GPU busy {r['busy_s']:.3f} s of {r['wall_s']:.3f} s: {100 * r['busy_fraction']:.2f}% "
          f"(kernels alone {100 * r['kernel_busy_fraction']:.2f}%), device {r['device']}; window {r['window']['how']}")
    print(f"  {c['kernel']} kernels ({c['kernels_in_graphs']} in CUDA graphs), {c['memcpy']} copies, {c['memset']} memsets; "
          f"idle by gap length: {idle}")
    for k in r["top_kernels"]:
        print(f"  {100 * k['share_of_wall']:5.1f}% {k['count']:>8} x {1e6 * k['time_s'] / k['count']:8.1f} us  {k['name'][:110]}")
    warn = []
    if r["records_dropped"]:
        warn.append(f"{r['records_dropped']} records dropped by CUPTI (missing from the union)")
    if r["records_untimed"]:
        warn.append(f"{r['records_untimed']} records without timestamps")
    if r["records_empty"]:
        warn.append(f"{r['records_empty']} records that end at or before their start (left out)")
    if not r["trace_complete"]:
        warn.append("the trace has no end record (the process was killed or is still running)")
    if r["other_devices"]:
        warn.append(f"devices {r['other_devices']} also ran kernels (--device picks one)")
    for w in warn:
        print(f"  warning: {w}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)
    if args.plot:
        try:
            plot(r, merged, args.plot, args.bin_ms, args.zoom_ms, args.zoom_at)
        except ImportError:
            print("gpu_busy: no matplotlib; no figure", file=sys.stderr)


if __name__ == "__main__":
    main()
