#!/usr/bin/env python3
"""Time to first token by kernel class, fdpp against HF transformers, from one run of each:

    CUDA_INJECTION64_PATH=build-gpu/libfdpp_gpu_trace.so FDPP_GPU_TRACE_OUT=pp.gputrace \\
        fdpp bench --load-format dummy --config configs/llama-3.1-8b.json -b 1 -c 1024 --steps 1 \\
        --mixed-chunk 0 -p 32000 -r 1
    python3 bench/gpu_busy.py pp.gputrace --window first-attention --top 1000 --json fdpp.json
    python3 bench/peers/prefill_peers.py configs/llama-3.1-8b.json --lengths 32000 --kernels --json hf.json
    python3 bench/ttft_breakdown.py --fdpp fdpp.json --layers 32 --hf hf.json

fdpp's trace holds every prefill pass of the bench (its warm-up and timed runs) and a few decode
steps: the kernel times are divided by the passes, counted as prefill attention launches over
--layers (the prompt goes in one step, one attention launch per layer). The decode steps' kernels
stay in (a few ms against a prefill of a second). HF's JSON holds one forward per length.
Standard library only.
"""
import argparse
import json
import re
import sys

# Kernel name -> class, first match wins. Names: fdpp's kernels (src/backend/cuda), cuBLAS/cuBLASLt
# (sm90_xmma_*, nvjet_*, cutlass_*), FlashAttention-2 and cuDNN inside torch's SDPA, and torch's
# elementwise and reduction kernels.
CLASSES = [
    ("attention", r"attention|flash|fmha|sdpa|attn"),
    ("gemm", r"gemm|gemv|xmma|nvjet|cutlass|matmul|cublas|splitk"),
    ("norm", r"norm"),
    ("rope", r"rope|rotary"),
    ("kv cache write", r"kv_cache_write|reshape_and_cache"),
    ("activation", r"silu|swiglu|gelu|act_and_mul|relu"),
    ("sampling", r"argmax|sample|softmax|topk|top_k|drawn"),
    ("elementwise and copies", r"elementwise|vectorized|unrolled|copy|cat|add|mul|fill|convert|gather|embedding|index"),
]


def classify(name):
    for cls, pattern in CLASSES:
        if re.search(pattern, name, re.IGNORECASE):
            return cls
    return "other"


def by_class(kernels, divide=1.0):
    out = {}
    for k in kernels:
        cls = classify(k["name"])
        t, top = out.get(cls, (0.0, []))
        out[cls] = (t + k["time_s"] / divide, top + [(k["time_s"] / divide, k["name"])])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fdpp", required=True, help="bench/gpu_busy.py --json of fdpp bench's trace")
    ap.add_argument("--layers", type=int, required=True, help="the model's layers (attention launches per pass)")
    ap.add_argument("--hf", help="bench/peers/prefill_peers.py --kernels --json")
    ap.add_argument("--length", type=int, default=None, help="which of the HF rows (default: the last)")
    a = ap.parse_args()
    try:
        fdpp = json.load(open(a.fdpp))["top_kernels"]
        hf_rows = json.load(open(a.hf)) if a.hf else []
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"ttft_breakdown: {e}")
    launches = sum(k["count"] for k in fdpp if re.search(r"prefill_attention", k["name"]))
    if launches == 0 or launches % a.layers:
        sys.exit(f"ttft_breakdown: {launches} prefill attention launches in {a.fdpp}, not a multiple of {a.layers} layers")
    passes = launches // a.layers
    ours = by_class(fdpp, passes)
    hf = {}
    if hf_rows:
        row = next((r for r in hf_rows if r["n_tokens"] == a.length), None) if a.length else hf_rows[-1]
        if row is None or "kernels" not in row:
            sys.exit(f"ttft_breakdown: no kernel list for length {a.length} in {a.hf} (run prefill_peers.py --kernels)")
        hf = by_class(row["kernels"])
    print(f"fdpp: {passes} prefill passes in the trace; ms per pass (HF: one forward)")
    print("| class | fdpp ms | HF ms | fdpp's longest kernel | HF's longest kernel |")
    print("| --- | ---: | ---: | --- | --- |")
    classes = [c for c, _ in CLASSES] + ["other"]
    total = [0.0, 0.0]
    for cls in classes:
        if cls not in ours and cls not in hf:
            continue
        t0, top0 = ours.get(cls, (0.0, []))
        t1, top1 = hf.get(cls, (0.0, []))
        total[0] += t0
        total[1] += t1
        name0 = max(top0)[1][:60] if top0 else ""
        name1 = max(top1)[1][:60] if top1 else ""
        hf_ms = f"{1e3 * t1:.1f}" if hf else ""
        print(f"| {cls} | {1e3 * t0:.1f} | {hf_ms} | {name0} | {name1} |")
    print(f"| all kernels | {1e3 * total[0]:.1f} | {f'{1e3 * total[1]:.1f}' if hf else ''} | | |")


if __name__ == "__main__":
    main()
