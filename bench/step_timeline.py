#!/usr/bin/env python3
"""Summary of a scheduler step log (`--step-log FILE` of fdpp serve, `fdpp generate -f` and
fdpp.LLM): where the wall time of a run went, step by step.

    python3 bench/step_timeline.py STEPS.jsonl [--json OUT.json] [--plot OUT.png]

Each line of the log is one step: start_ms (since the scheduler was made), schedule_ms (the host
choosing rows and reserving cache before the engine runs), engine_ms (Engine::begin_step to
end_step: inputs, the launches and the wait for the sampled tokens; render_ms of it is the host
rendering the previous step's text while the device computes: detokenizing, stop strings,
deliveries), emit_ms (the host taking the tokens in), the step's rows and tokens, and graph_captures (the CUDA
graphs the engine has captured so far: a step that captures one also pays for it on the host).

The engine holds the GPU from shortly after engine_ms begins until it returns (the step ends with
the wait for its tokens); schedule_ms, emit_ms and the gaps between steps are time the GPU has no
work from this scheduler. So engine share = sum(engine_ms) / wall is an upper bound of the GPU's
busy fraction, and the rest is host time that overlapping steps would hide. Logs of overlapped
steps (the CUDA engine's default: "overlapped" true where a step was scheduled and launched while
the previous one computed) split engine_ms into launch_ms (begin_step) and wait_ms (end_step: the
host waiting for the device); there the host's schedule, emit and render time runs beside the
device, the intervals of consecutive steps interleave, and the GPU's busy time is measured with
bench/gpu_busy.py instead. Standard library only (the plot needs matplotlib).
"""
import argparse
import json
import sys


def load(path):
    steps = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                steps.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"step_timeline: {path}:{n}: not JSON ({e})")
    if not steps:
        sys.exit(f"step_timeline: {path}: no steps")
    return steps


def fit(rows):
    """Least squares y = c0 + c1 x1 + c2 x2 over rows of (x1, x2, y); None when underdetermined."""
    n = 3
    a = [[0.0] * (n + 1) for _ in range(n)]
    for x1, x2, y in rows:
        v = (1.0, float(x1), float(x2))
        for i in range(n):
            for j in range(n):
                a[i][j] += v[i] * v[j]
            a[i][n] += v[i] * y
    for c in range(n):  # Gauss-Jordan with partial pivoting
        p = max(range(c, n), key=lambda r: abs(a[r][c]))
        if abs(a[p][c]) < 1e-9:
            return None
        a[c], a[p] = a[p], a[c]
        for r in range(n):
            if r != c:
                f = a[r][c] / a[c][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c])]
    return [a[i][n] / a[i][i] for i in range(n)]


def summarize(steps):
    first = steps[0]["start_ms"]
    last = steps[-1]
    wall = last["start_ms"] + last["schedule_ms"] + last["engine_ms"] + last["emit_ms"] - first
    gaps = [b["start_ms"] - (a["start_ms"] + a["schedule_ms"] + a["engine_ms"] + a["emit_ms"])
            for a, b in zip(steps, steps[1:])]
    kinds = {}
    for s in steps:
        kind = "decode" if s["prefill_rows"] == 0 else ("prefill" if s["decode_rows"] == 0 else "mixed")
        k = kinds.setdefault(kind, {"steps": 0, "engine_ms": 0.0, "host_ms": 0.0, "rows": 0, "prefill_tokens": 0})
        k["steps"] += 1
        k["engine_ms"] += s["engine_ms"]
        k["host_ms"] += s["schedule_ms"] + s["emit_ms"]
        k["rows"] += s["decode_rows"] + s["prefill_rows"]
        k["prefill_tokens"] += s["prefill_tokens"]
    total = lambda key: sum(s[key] for s in steps)
    # Steps during which the engine captured a new graph (logs written before the field: none).
    captures = [s for a, s in zip([None] + steps, steps)
                if s.get("graph_captures", 0) > (a.get("graph_captures", 0) if a else 0)]
    # What a step costs: engine ms against its decode rows and prefill tokens, over the steps that
    # carry prefill (the slope per prefill token compares with fdpp bench's prefill rate).
    mixed = [(s["decode_rows"], s["prefill_tokens"], s["engine_ms"]) for s in steps if s["prefill_rows"] > 0]
    cost = fit(mixed) if len(mixed) >= 8 else None
    return {
        "mixed_step_fit": None if cost is None else {"ms": cost[0], "ms_per_decode_row": cost[1],
                                                       "ms_per_prefill_token": cost[2]},
        "steps": len(steps),
        "wall_ms": wall,
        "engine_ms": total("engine_ms"),
        "schedule_ms": total("schedule_ms"),
        "emit_ms": total("emit_ms"),
        "gap_ms": sum(gaps),
        "engine_share": total("engine_ms") / wall if wall > 0 else 0.0,
        "decode_tokens": total("decode_rows"),
        "prefill_tokens": total("prefill_tokens"),
        "max_running": max(s["running"] for s in steps),
        "render_ms": sum(s.get("render_ms", 0.0) for s in steps),
        "overlapped_steps": sum(1 for s in steps if s.get("overlapped")),
        "launch_ms": sum(s.get("launch_ms", 0.0) for s in steps),
        "wait_ms": sum(s.get("wait_ms", 0.0) for s in steps),
        "capture_steps": len(captures),
        "capture_steps_engine_ms": sum(s["engine_ms"] for s in captures),
        "kinds": kinds,
    }


def print_summary(r):
    w = r["wall_ms"]
    pct = lambda x: f"{100 * x / w:.1f}%" if w > 0 else "-"
    print(f"{r['steps']} steps over {w / 1000:.2f} s; running max {r['max_running']}; "
          f"{r['decode_tokens']} decode rows, {r['prefill_tokens']} prefill tokens")
    print(f"engine {r['engine_ms'] / 1000:.2f} s ({pct(r['engine_ms'])}), schedule {r['schedule_ms'] / 1000:.2f} s "
          f"({pct(r['schedule_ms'])}), emit {r['emit_ms'] / 1000:.2f} s ({pct(r['emit_ms'])}), between steps "
          f"{r['gap_ms'] / 1000:.2f} s ({pct(r['gap_ms'])})")
    if r.get("overlapped_steps"):
        print(f"{r['overlapped_steps']} steps scheduled and launched while the previous one computed; launches "
              f"{r['launch_ms'] / 1000:.2f} s ({pct(r['launch_ms'])}), waiting for the device {r['wait_ms'] / 1000:.2f} s "
              f"({pct(r['wait_ms'])}); schedule, emit and between-steps time overlap the device there")
    if r.get("render_ms"):
        print(f"text rendered while the device computes (inside engine): {r['render_ms'] / 1000:.2f} s ({pct(r['render_ms'])})")
    if r.get("capture_steps"):
        print(f"{r['capture_steps']} steps captured a CUDA graph (their engine time {r['capture_steps_engine_ms'] / 1000:.2f} s)")
    f = r.get("mixed_step_fit")
    if f:
        print(f"steps with prefill: engine ms = {f['ms']:.2f} + {f['ms_per_decode_row'] * 1e3:.1f} us x decode rows + "
              f"{f['ms_per_prefill_token'] * 1e3:.1f} us x prefill tokens (least squares; "
              f"{1e3 / f['ms_per_prefill_token'] if f['ms_per_prefill_token'] > 0 else float('nan'):.0f} prefill tokens/s at the margin)")
    print("| step kind | steps | mean engine ms | mean host ms | mean rows | prefill tokens |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for kind, k in sorted(r["kinds"].items()):
        n = k["steps"]
        print(f"| {kind} | {n} | {k['engine_ms'] / n:.2f} | {k['host_ms'] / n:.3f} | {k['rows'] / n:.1f} | "
              f"{k['prefill_tokens']} |")


def plot(steps, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    t0 = steps[0]["start_ms"]
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(12, 5), sharex=True)
    for s in steps:
        a = (s["start_ms"] - t0) / 1000
        e = a + s["schedule_ms"] / 1000
        color = "tab:blue" if s["prefill_rows"] == 0 else "tab:orange"
        ax.broken_barh([(a, s["schedule_ms"] / 1000)], (0, 1), color="tab:gray")
        ax.broken_barh([(e, s["engine_ms"] / 1000)], (0, 1), color=color)
        ax.broken_barh([(e + s["engine_ms"] / 1000, s["emit_ms"] / 1000)], (0, 1), color="tab:red")
    ax.set_yticks([])
    ax.set_title("steps: engine (blue: decode only, orange: with prefill), host schedule (gray), emit (red)")
    bx.plot([(s["start_ms"] - t0) / 1000 for s in steps], [s["running"] for s in steps], label="running")
    bx.plot([(s["start_ms"] - t0) / 1000 for s in steps], [s["decode_rows"] for s in steps], label="decode rows")
    bx.set_xlabel("seconds")
    bx.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("log")
    ap.add_argument("--json", default=None, help="write the summary here")
    ap.add_argument("--plot", default=None, help="draw the timeline into this PNG (matplotlib)")
    args = ap.parse_args()
    steps = load(args.log)
    r = summarize(steps)
    print_summary(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)
    if args.plot:
        try:
            plot(steps, args.plot)
        except ImportError:
            print("step_timeline: no matplotlib; no plot", file=sys.stderr)


if __name__ == "__main__":
    main()
