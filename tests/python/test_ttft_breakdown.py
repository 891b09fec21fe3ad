"""bench/ttft_breakdown.py on synthetic inputs in the shapes of bench/gpu_busy.py --json (fdpp's
trace) and bench/peers/prefill_peers.py --kernels --json (HF's forward): the kernel classes, the
division by the trace's prefill passes, and the refusals of inputs it cannot read."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "ttft_breakdown.py"


def load_module():
    spec = importlib.util.spec_from_file_location("ttft_breakdown", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def kernel(name: str, count: int, time_s: float) -> dict:
    return {"name": name, "count": count, "time_s": time_s}


def write(path: Path, doc) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def table_rows(stdout: str) -> dict[str, list[str]]:
    rows = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("class", "---"):
            rows[cells[0]] = cells[1:]
    return rows


def test_classes_of_both_engines_kernels():
    classify = load_module().classify
    assert classify("void fdpp::cuda::prefill_attention_ws_kernel<__half, 128, 6, false>(PrefillArgs, KvTmaMaps)") == "attention"
    assert classify("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false>>(Flash_fwd_params)") == "attention"
    assert classify("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3") == "attention"
    assert classify("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1") == "gemm"
    assert classify("nvjet_hsh_256x128_64x4_2x1_v_bz_coopA_NNT") == "gemm"
    assert classify("void fdpp::cuda::gemv_kernel<__half, 8>(GemvArgs)") == "gemm"
    assert classify("void fdpp::cuda::residual_norm_kernel<__half>(...)") == "norm"
    assert classify("void fdpp::cuda::rope_qk_cache_kernel<__half>(...)") == "rope"
    assert classify("void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel(...)>") == "activation"
    assert classify("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>") == "sampling"
    assert classify("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>") \
        == "elementwise and copies"
    assert classify("some_unknown_kernel") == "other"


def test_table_divides_fdpp_by_its_passes(tmp_path):
    # Three prefill passes of a 2-layer model (6 attention launches); HF's one forward.
    fdpp = write(tmp_path / "fdpp.json", {"top_kernels": [
        kernel("prefill_attention_ws_kernel", 6, 0.30),
        kernel("sm90_xmma_gemm_f16f16", 24, 0.60),
        kernel("residual_norm_kernel", 12, 0.03),
        kernel("decode_attention_kernel", 2, 0.003)]})
    hf = write(tmp_path / "hf.json", [
        {"n_tokens": 1024, "ms": 10.0, "kernels": [kernel("flash_fwd_kernel", 2, 0.001)]},
        {"n_tokens": 32000, "ms": 400.0, "kernels": [
            kernel("flash_fwd_kernel", 2, 0.15), kernel("nvjet_hsh_256x128", 8, 0.22)]}])
    r = run("--fdpp", fdpp, "--layers", "2", "--hf", hf)
    assert r.returncode == 0, r.stderr
    assert "3 prefill passes" in r.stdout
    rows = table_rows(r.stdout)
    assert rows["attention"][0] == "101.0"  # (0.30 + 0.003) s / 3 passes
    assert rows["attention"][1] == "150.0"  # the last HF row: 32000 tokens
    assert rows["gemm"][:2] == ["200.0", "220.0"]
    assert rows["norm"][:2] == ["10.0", "0.0"]
    assert rows["all kernels"][:2] == ["311.0", "370.0"]
    # --length picks another HF row.
    r = run("--fdpp", fdpp, "--layers", "2", "--hf", hf, "--length", "1024")
    assert r.returncode == 0, r.stderr
    assert table_rows(r.stdout)["attention"][1] == "1.0"


def test_refusals(tmp_path):
    fdpp = write(tmp_path / "fdpp.json", {"top_kernels": [kernel("prefill_attention_kernel", 5, 0.1)]})
    r = run("--fdpp", fdpp, "--layers", "2")
    assert r.returncode != 0 and "not a multiple of 2 layers" in r.stderr
    no_attention = write(tmp_path / "none.json", {"top_kernels": [kernel("gemv_kernel", 4, 0.1)]})
    r = run("--fdpp", no_attention, "--layers", "2")
    assert r.returncode != 0 and "0 prefill attention launches" in r.stderr
    good = write(tmp_path / "good.json", {"top_kernels": [kernel("prefill_attention_kernel", 4, 0.1)]})
    hf_untraced = write(tmp_path / "hf.json", [{"n_tokens": 32000, "ms": 400.0}])
    r = run("--fdpp", good, "--layers", "2", "--hf", hf_untraced)
    assert r.returncode != 0 and "--kernels" in r.stderr
    r = run("--fdpp", str(tmp_path / "missing.json"), "--layers", "2")
    assert r.returncode != 0 and "ttft_breakdown:" in r.stderr and "Traceback" not in r.stderr
