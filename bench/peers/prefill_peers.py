#!/usr/bin/env python3
"""Time to first token of HF transformers on the same GPU, same shapes, same run as `fdpp bench -p`:
one forward of a random prompt (batch 1) with random fp16 weights of a preset config, sdpa
attention (cuBLAS + FlashAttention-2/cuDNN inside SDPA), logits of the last position only
(logits_to_keep=1, as a server computes them), the first token taken by argmax. CUDA-event timed,
median of --reps after a warm-up.

usage: prefill_peers.py CONFIG.json --lengths 1024,4096 [--reps 3] [--json OUT]
"""
import argparse
import json
import statistics

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--lengths", default="1024,4096")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json")
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
        print(f"| hf-sdpa | {a.config.split('/')[-1]} | pp{n} | {ms:.1f} ms | {n / ms * 1e3:.0f} tok/s |", flush=True)
        torch.cuda.empty_cache()
    if a.json:
        json.dump(rows, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
