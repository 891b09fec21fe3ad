"""bench/gpu_busy.py on synthetic traces written here in the format of tools/gpu_trace/trace_file.h:
the union of the intervals, the idle gaps by length, the window choices, a trace cut short, nsys's
SQLite export and the figure. (tests/gpu_trace_test.py checks the C++ writer against the reader.)"""

from __future__ import annotations

import importlib.util
import json
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_busy.py"
KERNEL, MEMCPY, MEMSET = 1, 2, 3
US, MS, S = 1_000, 1_000_000, 1_000_000_000


def load_module():
    spec = importlib.util.spec_from_file_location("gpu_busy", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def chunk(kind: int, payload: bytes) -> bytes:
    return struct.pack("<II", kind, len(payload)) + payload


def write_trace(path: Path, records, names: dict[int, str], clocks=(), end=True, dropped=0, untimed=0) -> str:
    """records: (start, end, kind, name_id[, graph[, stream[, device]]])."""
    out = b"FDPPGPUT" + struct.pack("<II", 1, 32)
    for c in clocks:
        out += chunk(1, struct.pack("<QQ", *c))
    for i, n in names.items():
        out += chunk(2, struct.pack("<I", i) + n.encode())
    recs = b""
    for r in records:
        s, e, kind, name, graph, stream, dev = (tuple(r) + (0, 7, 0)[len(r) - 4:])[:7]
        recs += struct.pack("<QQIIIHBB", s, e, stream, name, graph, dev, kind, 0)
    out += chunk(3, recs)
    out += chunk(4, struct.pack("<QQ", dropped, untimed))
    if end:
        out += chunk(5, b"")
    path.write_bytes(out)
    return str(path)


def run(trace: str, tmp_path: Path, *args: str) -> tuple[dict, str]:
    js = tmp_path / "busy.json"
    p = subprocess.run([sys.executable, str(SCRIPT), trace, "--json", str(js), *args],
                       capture_output=True, text=True, check=True)
    return json.loads(js.read_text()), p.stdout + p.stderr


NAMES = {1: "void decode_attention_kernel<128>(Args)", 2: "gemv_kernel", 3: "rms_norm_kernel"}


def step_trace(tmp_path: Path) -> str:
    # Loading (a copy before any attention kernel), then a step: kernels that overlap, touch, nest
    # inside a copy, and leave gaps of 4 us, 40 us, 400 us and 4 ms.
    return write_trace(tmp_path / "t.gputrace", [
        (0, 2 * MS, MEMCPY, 0),
        (10 * MS, 10 * MS + 100 * US, KERNEL, 1, 5),
        (10 * MS + 50 * US, 10 * MS + 150 * US, KERNEL, 2, 5),   # overlaps the one before
        (10 * MS + 150 * US, 10 * MS + 200 * US, KERNEL, 3, 5),  # touches: no gap
        (10 * MS + 204 * US, 10 * MS + 300 * US, MEMCPY, 0),     # 4 us gap
        (10 * MS + 210 * US, 10 * MS + 250 * US, KERNEL, 2),     # inside the copy
        (10 * MS + 340 * US, 10 * MS + 400 * US, MEMSET, 0),     # 40 us gap
        (10 * MS + 800 * US, 11 * MS, KERNEL, 1),                # 400 us gap
        (15 * MS, 15 * MS + 100 * US, KERNEL, 2),                # 4 ms gap
    ], NAMES)


def test_union_and_gaps_by_length(tmp_path: Path) -> None:
    r, text = run(step_trace(tmp_path), tmp_path)
    assert (r["window"]["start_ns"], r["window"]["end_ns"]) == (10 * MS, 15 * MS + 100 * US)
    busy = 200 * US + 96 * US + 60 * US + 200 * US + 100 * US
    assert r["busy_s"] == pytest.approx(busy / S, abs=1e-15)
    assert r["busy_fraction"] == pytest.approx(busy / (5 * MS + 100 * US))
    gaps = r["idle_by_gap"]
    assert [gaps[k]["count"] for k in ("<10us", "10-100us", "100us-1ms", ">1ms")] == [1, 1, 1, 1]
    assert gaps["<10us"]["idle_s"] == pytest.approx(4e-6)
    assert gaps[">1ms"]["idle_s"] == pytest.approx(4e-3)
    # Kernels alone: 10.0-10.2 ms, 10.21-10.25, 10.8-11.0, 15.0-15.1.
    assert r["kernel_busy_fraction"] == pytest.approx((200 + 40 + 200 + 100) * US / (5 * MS + 100 * US))
    assert r["counts"] == {"kernel": 6, "memcpy": 1, "memset": 1, "kernels_in_graphs": 3}
    top = r["top_kernels"][0]
    assert (top["name"], top["count"], top["time_s"]) == (NAMES[1], 2, pytest.approx(300e-6))
    assert r["trace_complete"] and "warning" not in text


def test_auto_window_takes_the_busiest_stretch(tmp_path: Path) -> None:
    # A server: warm-up steps, 3 s waiting for the benchmark, the run (1 s, 90% busy), idle until stopped.
    recs = [(0, 5 * MS, KERNEL, 1), (20 * MS, 30 * MS, KERNEL, 2)]
    t0 = 3 * S
    for i in range(100):
        recs.append((t0 + i * 10 * MS, t0 + i * 10 * MS + 9 * MS, KERNEL, 1 + i % 2))
    recs.append((t0 + 5 * S, t0 + 5 * S + MS, KERNEL, 2))  # a stray step long after
    trace = write_trace(tmp_path / "t.gputrace", recs, NAMES)
    r, _ = run(trace, tmp_path)
    assert (r["window"]["start_ns"], r["window"]["end_ns"]) == (t0, t0 + 99 * 10 * MS + 9 * MS)
    assert r["busy_fraction"] == pytest.approx(900 / 999)
    assert "busiest of 3 stretches" in r["window"]["how"]
    r, _ = run(trace, tmp_path, "--window", "first-attention")
    assert (r["window"]["start_ns"], r["window"]["end_ns"]) == (0, t0 + 5 * S + MS)
    r, _ = run(trace, tmp_path, "--skip-seconds", "0.5")
    assert r["window"]["start_ns"] == t0 + S // 2
    r, _ = run(trace, tmp_path, "--window-start-ns", str(t0), "--window-end-ns", str(t0 + 15 * MS))
    assert r["busy_s"] == pytest.approx(14e-3)


def test_serve_bench_interval_through_the_clock_records(tmp_path: Path) -> None:
    # The trace's clock runs 1,000 s behind the wall clock (drifting by 2 us over the run).
    unix0 = 1_800_000_000 * S
    clocks = [(5 * S, unix0 + 1000 * S), (9 * S, unix0 + 1004 * S + 2 * US)]
    recs = [(6 * S + i * MS, 6 * S + i * MS + MS // 2, KERNEL, 1) for i in range(1000)]
    trace = write_trace(tmp_path / "t.gputrace", recs, NAMES, clocks=clocks)
    bench = tmp_path / "served.json"
    # The benchmark ran from trace time 6.1 s to 6.5 s.
    bench.write_text(json.dumps({"runs": [{"started_unix": (unix0 + 1001.1 * S) / S, "ended_unix": (unix0 + 1001.5 * S) / S}]}))
    r, _ = run(trace, tmp_path, "--serve-bench", str(bench))
    assert r["window"]["start_ns"] == pytest.approx(6.1 * S, abs=2 * US)
    assert r["window"]["end_ns"] == pytest.approx(6.5 * S, abs=2 * US)
    assert r["busy_fraction"] == pytest.approx(0.5, abs=1e-3)


def test_trace_cut_short_still_reads(tmp_path: Path) -> None:
    full = Path(step_trace(tmp_path)).read_bytes()
    # Drop the end record, the stats and half of the records chunk: a process killed mid-write.
    cut = tmp_path / "cut.gputrace"
    cut.write_bytes(full[:-8 - 24 - 100])
    t = load_module().read_trace(str(cut))
    assert not t.complete and t.records == [] and len(t.names) == 3
    # With whole chunks the records count; the missing end is reported.
    write_trace(cut, [(0, MS, KERNEL, 1), (2 * MS, 3 * MS, KERNEL, 2)], NAMES, end=False, dropped=5)
    r, text = run(str(cut), tmp_path)
    assert not r["trace_complete"] and r["records_dropped"] == 5 and r["busy_fraction"] == pytest.approx(2 / 3)
    assert "no end record" in text and "5 records dropped" in text


def test_nsys_sqlite_export(tmp_path: Path) -> None:
    db_path = tmp_path / "run.sqlite"
    db = sqlite3.connect(db_path)
    db.execute("CREATE TABLE StringIds (id INTEGER, value TEXT)")
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(7, NAMES[1]), (8, NAMES[2])])
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT, streamId INT, deviceId INT, demangledName INT)")
    db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 7, 0, ?)",
                   [(10 * MS, 11 * MS, 7), (11 * MS, 12 * MS, 8), (13 * MS, 14 * MS, 7)])
    db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INT, end INT, streamId INT, deviceId INT, copyKind INT)")
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, 7, 0, 1)", (0, 5 * MS))
    db.commit()
    db.close()
    r, _ = run(str(db_path), tmp_path)
    assert r["source"] == "nsys" and r["window"]["start_ns"] == 10 * MS
    assert r["busy_fraction"] == pytest.approx(3 / 4)
    assert r["counts"]["kernel"] == 3 and r["counts"]["memcpy"] == 0


def test_busy_per_bin() -> None:
    gb = load_module()
    # Bins of 10 ns over [0, 25): the last bin is 5 ns long.
    assert gb.busy_per_bin([(0, 5), (8, 12), (20, 25)], 0, 25, 10) == [0.7, 0.2, 1.0]


def test_figure(tmp_path: Path) -> None:
    png = tmp_path / "busy.png"
    _, text = run(step_trace(tmp_path), tmp_path, "--plot", str(png), "--zoom-ms", "1")
    if importlib.util.find_spec("matplotlib") is None:
        assert "no matplotlib; no figure" in text and not png.exists()
    else:
        assert png.stat().st_size > 10_000
