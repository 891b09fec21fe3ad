#!/usr/bin/env python3
"""Time to first token of HF transformers on the same GPU, same shapes, same run as `fdpp bench -p`:
one forward of a random prompt (batch 1) with random fp16 weights of a preset config, sdpa
attention (cuBLAS + FlashAttention-2/cuDNN inside SDPA), logits of the last position only
(logits_to_keep=1, as a server computes them), the first token taken by argmax. CUDA-event timed,
median of --reps after a warm-up.

usage: prefill_peers.py CONFIG.json --lengths 1024,4096 [--reps 3] [--json OUT] [--kernels]

--kernels: one more forward per length under torch.profiler; the JSON rows then list its CUDA
kernels by name (count, seconds), the shape bench/ttft_breakdown.py compares with fdpp's trace.
"""
import argparse
import collections
import json
import os
import statistics
import tempfile

import torch


def forward_kernels(model, ids):
    """The CUDA kernels of one forward, by name: [{"name", "count", "time_s"}], longest first (from
    the profiler's Chrome trace, whose kernel events keep their names across torch versions)."""
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        out = model(ids, use_cache=True, logits_to_keep=1)
        out.logits[:, -1].argmax(-1)
        torch.cuda.synchronize()
    del out
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        events = json.load(open(path))
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
    per_name = collections.defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("cat") == "kernel" and e.get("ph") == "X":
            per_name[e["name"]][0] += 1
            per_name[e["name"]][1] += float(e.get("dur", 0)) * 1e-6  # microseconds
    return [{"name": k, "count": n, "time_s": t} for k, (n, t) in sorted(per_name.items(), key=lambda x: -x[1][1])]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--kernels", action="store_true", help="list one forward's CUDA kernels in the JSON rows")
    a = ap.parse_args()
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(a.config)
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float16).eval()
    rows = []
    for n in [int(x) for x in a.lengths.split(",")]:
        ids = torch.randint(0, cfg.vocab_size, (1, n), device="cuda")
        times = []
        with torch.no_grad():
            for r in range(a.reps + 1):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                out = model(ids, use_cache=True, logits_to_keep=1)
                out.logits[:, -1].argmax(-1)
                e.record()
                e.synchronize()
                if r > 0:
                    times.append(s.elapsed_time(e))
                del out
        ms = statistics.median(times)
        rows.append({"peer": "hf-sdpa", "config": a.config, "n_tokens": n, "ms": ms, "tokens_per_second": n / ms * 1e3,
                     "transformers": transformers.__version__, "torch": torch.__version__})
        if a.kernels:
            rows[-1]["kernels"] = forward_kernels(model, ids)
        print(f"| hf-sdpa | {a.config.split('/')[-1]} | pp{n} | {ms:.1f} ms | {n / ms * 1e3:.0f} tok/s |", flush=True)
        torch.cuda.empty_cache()
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
