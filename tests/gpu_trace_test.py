#!/usr/bin/env python3
"""The GPU tracer (tools/gpu_trace/) and bench/gpu_busy.py together. Standard library only.

    gpu_trace_test.py format WRITER   (label cpu) the C++ writer's synthetic trace, read by gpu_busy
    gpu_trace_test.py cuda LIB PROBE [FDPP]
                                      (label gpu) the probe's known kernels, copies and graph under
                                      libfdpp_gpu_trace.so, the flush at SIGTERM, and (with FDPP) an
                                      fdpp generate run on a tiny fixture; exit 77 without a GPU

ctest runs both (CMakeLists.txt); on the GPU machine scripts/gpu-check.sh's tests stage runs the
second.
"""
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = 77


def load_gpu_busy():
    spec = importlib.util.spec_from_file_location("gpu_busy", ROOT / "bench" / "gpu_busy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


gb = load_gpu_busy()


def busy(trace_path, *argv):
    out = Path(tempfile.mkdtemp()) / "busy.json"
    subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_busy.py"), str(trace_path), "--json", str(out), *argv],
                   check=True)
    return json.loads(out.read_text())


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def test_format(writer):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "synthetic.gputrace"
        subprocess.run([writer, str(path)], check=True)
        t = gb.read_trace(str(path))
        check(t.complete and t.dropped == 3 and t.untimed == 2, f"stats {t.complete} {t.dropped} {t.untimed}")
        check(len(t.records) == 9, f"{len(t.records)} records")
        check(t.names == {1: "void fdpp::cuda::decode_attention_kernel<128>(fdpp::cuda::DecodeArgs)", 2: "gemv_kernel"},
              t.names)
        check(t.clocks == [(10**9, 17 * 10**17), (2 * 10**9, 17 * 10**17 + 10**9 + 100)], t.clocks)
        check(t.records[2] == (10_100_005, 10_200_000, 13, 2, 4, 0, gb.KERNEL, 0), t.records[2])
        r = busy(path)
        # The window: the first attention kernel (10 ms) to the last end on device 0 (12.6 ms);
        # busy: 100 us + (10.100005 .. 10.25 ms) + 100 us + (12.4 .. 12.6 ms).
        check((r["window"]["start_ns"], r["window"]["end_ns"]) == (10_000_000, 12_600_000), r["window"])
        check(r["busy_s"] == 549_995e-9 and abs(r["busy_fraction"] - 549_995 / 2_600_000) < 1e-12, r["busy_s"])
        check([v["count"] for v in r["idle_by_gap"].values()] == [1, 1, 0, 1], r["idle_by_gap"])
        check(r["counts"] == {"kernel": 4, "memcpy": 1, "memset": 1, "kernels_in_graphs": 3}, r["counts"])
        check(r["device"] == 0 and r["other_devices"] == [1] and r["records_empty"] == 1, r)
    print("gpu_trace_test format: the C++ writer's trace reads back as written")


def run_traced(lib, out, argv, **kw):
    env = dict(os.environ, CUDA_INJECTION64_PATH=str(lib), FDPP_GPU_TRACE_OUT=str(out))
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, **kw)


def kernels_named(t, part):
    ids = {i for i, n in t.names.items() if part in n}
    return sorted(r for r in t.records if r[6] == gb.KERNEL and r[3] in ids)


def test_cuda(lib, probe, fdpp=None):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "probe.gputrace"
        p = run_traced(lib, path, [probe, "run"])
        if p.returncode == SKIP:
            print(f"gpu_trace_test cuda: skipped ({p.stderr.strip()})")
            return SKIP
        check(p.returncode == 0, f"probe run: exit {p.returncode}: {p.stderr}")
        check("fdpp_gpu_trace: recording kernels, copies and memsets" in p.stderr, f"the tracer did not start: {p.stderr}")
        expect = json.loads(p.stdout.strip().splitlines()[-1])
        t = gb.read_trace(str(path))
        check(t.complete, "no end record after a normal exit")
        check(t.dropped == 0 and t.untimed == 0, f"dropped {t.dropped}, untimed {t.untimed}")
        spin, graph, tail = (kernels_named(t, n) for n in ("probe_spin_kernel", "probe_graph_kernel", "probe_tail_kernel"))
        check((len(spin), len(graph), len(tail)) == (expect["spin"], expect["graph"], expect["tail"]),
              f"kernel records {len(spin)}, {len(graph)}, {len(tail)}; expected {expect}")
        for r in spin + graph + tail:
            check(r[0] < r[1] and r[1] - r[0] >= 0.9 * expect["kernel_ns"], f"kernel {r}: shorter than it spins")
        check(all(r[4] != 0 for r in graph) and all(r[4] == 0 for r in spin), "graph ids: kernels of the graph need one, others none")
        copies = [r for r in t.records if r[6] == gb.MEMCPY and r[7] == 1]  # HtoD
        sets = [r for r in t.records if r[6] == gb.MEMSET]
        check(copies and sets, f"{len(copies)} host-to-device copies, {len(sets)} memsets")
        # 200 kernels of 50 us queued back to back: the GPU idles only between launches.
        spans = sorted((r[0], r[1]) for r in t.records if spin[0][0] <= r[0] <= spin[-1][1])
        merged, _ = gb.merge(spans)
        frac = sum(e - s for s, e in merged) / (spin[-1][1] - spin[0][0])
        check(frac > 0.8, f"back-to-back kernels busy {frac:.3f}")
        # The whole run through the script: the 20 ms sleep is the one gap over 1 ms after the graph.
        r = busy(path, "--start-kernel", "probe_spin", "--window", "first-attention")
        check(r["counts"]["kernels_in_graphs"] == expect["graph"], r["counts"])
        check(r["idle_by_gap"][">1ms"]["idle_s"] >= 0.019, r["idle_by_gap"])
        print(f"gpu_trace_test cuda: probe traced: {len(spin) + len(graph) + len(tail)} kernels, back-to-back busy "
              f"{100 * frac:.1f}%, whole run {100 * r['busy_fraction']:.1f}%")

        # SIGTERM: the tracer flushes and the process still dies of the signal.
        path = Path(d) / "signal.gputrace"
        env = dict(os.environ, CUDA_INJECTION64_PATH=str(lib), FDPP_GPU_TRACE_OUT=str(path))
        p = subprocess.Popen([probe, "until-signal"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = p.stdout.readline()
        check(line.strip() == "ready", f"probe until-signal said {line!r}")
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        check(p.returncode == -signal.SIGTERM, f"exit {p.returncode} after SIGTERM: {err}")
        t = gb.read_trace(str(path))
        n = len(kernels_named(t, "probe_spin_kernel"))
        check(t.complete and n >= 1000, f"after SIGTERM: complete {t.complete}, {n} kernels")
        print(f"gpu_trace_test cuda: SIGTERM flushed {n} kernel records")

        if fdpp:
            # The engine: decode steps replay CUDA graphs; their kernels come one record per node.
            path = Path(d) / "fdpp.gputrace"
            fx = ROOT / "tests" / "fixtures" / "hf" / "llama_gqa_hd128_f16"
            p = run_traced(lib, path, [fdpp, "generate", "-m", str(fx), "--token-ids", "1,2,3,4,5", "-n", "32",
                                       "--temperature", "0", "--ignore-eos", "--device", "cuda"])
            check(p.returncode == 0, f"fdpp generate: exit {p.returncode}: {p.stderr[-2000:]}")
            t = gb.read_trace(str(path))
            att = kernels_named(t, "attention")
            check(att and all(r[0] < r[1] for r in att), f"{len(att)} attention kernels")
            check(any(r[4] for r in att), "no attention kernel came from a CUDA graph")
            r = busy(path)
            check(0 < r["busy_fraction"] <= 1, r["busy_fraction"])
            print(f"gpu_trace_test cuda: fdpp generate: {r['counts']['kernel']} kernels "
                  f"({r['counts']['kernels_in_graphs']} in graphs), busy {100 * r['busy_fraction']:.1f}%")
    return 0


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "format":
        test_format(sys.argv[2])
        return 0
    if len(sys.argv) >= 4 and sys.argv[1] == "cuda":
        return test_cuda(*sys.argv[2:5])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
