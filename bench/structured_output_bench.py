#!/usr/bin/env python3
"""Structured output's overhead per generated token, against unconstrained decode, at a batch size.

    python bench/structured_output_bench.py [--model PATH] [--device cpu|cuda] [--batch 64]
        [--max-tokens 128] [--json OUT.json]

Generates --batch chat answers at once (max_num_seqs = --batch) three ways: unconstrained,
response_format json_object, and a JSON schema (an array of short strings), sampled at temperature
1 with fixed seeds, and prints generated tokens/s for each and the slowdown against unconstrained.
Each mode runs twice and the second run counts (the first warms the engine and the grammar caches of
nothing: every request gets a fresh matcher, as in the server). The masks are computed on the
host, so the slowdown at batch 64 is the host's mask work per step against the GPU's step. The
modes' answers differ in length (a grammar ends a request when its format is complete), so the
median time per output token of the requests is printed beside the throughput.
"""

from __future__ import annotations

import argparse
import json
import time

import fdpp
from fdpp import StructuredOutputsParams

SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 64}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    llm = fdpp.LLM(a.model or fdpp.default_model_path(), device=a.device, max_model_len=512,
                   max_num_seqs=a.batch, kv_cache_tokens=a.batch * 512)
    prompts = [[{"role": "user", "content": f"List some words about topic number {i}, as JSON."}]
               for i in range(a.batch)]
    modes = {"unconstrained": None, "json_object": StructuredOutputsParams(json_object=True),
             "json_schema": StructuredOutputsParams(json=SCHEMA)}
    results = {}
    for name, so in modes.items():
        for rep in range(2):
            params = [fdpp.SamplingParams(temperature=1.0, seed=i, max_tokens=a.max_tokens, structured_outputs=so)
                      for i in range(a.batch)]
            t0 = time.perf_counter()
            outs = llm.chat(prompts, params, use_tqdm=False)
            dt = time.perf_counter() - t0
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        tpot = sorted(o.metrics.time_per_output_token for o in outs if len(o.outputs[0].token_ids) > 1)
        results[name] = {"tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt,
                         "tpot_ms_median": 1000 * tpot[len(tpot) // 2] if tpot else 0.0}
    base = results["unconstrained"]["tokens_per_s"]
    for name, r in results.items():
        r["slowdown"] = 1 - r["tokens_per_s"] / base
        print(f"{name:14s} batch {a.batch:3d}: {r['tokens']:6d} tokens in {r['seconds']:7.2f} s = "
              f"{r['tokens_per_s']:8.1f} tokens/s  ({100 * r['slowdown']:+.1f}% slower than unconstrained), "
              f"median time per output token {r['tpot_ms_median']:.2f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "batch": a.batch, "max_tokens": a.max_tokens, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
