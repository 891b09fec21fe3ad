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

    python bench/structured_output_bench.py --launch "fdpp serve --load-format dummy --config
        configs/llama-3-8b.json --dtype bf16 --max-num-seqs 64 --port 8093" --base-url
        http://127.0.0.1:8093 --batch 64 --max-tokens 128

measures the same through a server instead (the GPU machine has no Python package): --batch
concurrent streamed /v1/completions requests per mode, response_format json_object and json_schema
against none, with the median time per output token after the first (TPOT; the text chunks'
arrival, so the step is the server's). Standard library only in this mode.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shlex
import subprocess
import time
import urllib.error
import urllib.request

SCHEMA = {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 64}
LONG_SCHEMA = {"type": "object", "properties": {"text": {"type": "string", "minLength": 2000}}, "required": ["text"],
               "additionalProperties": False}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", default=None)
    ap.add_argument("--base-url", default=None, help="measure through this server's /v1/completions instead")
    ap.add_argument("--launch", default=None, help="command that starts the server (stopped at the end)")
    ap.add_argument("--launch-timeout", type=float, default=600)
    a = ap.parse_args()
    if a.base_url:
        results = run_served(a)
    else:
        results = run_in_process(a)
    plain = results["unconstrained"]

    def change(x, base):
        return f"{100 * (x / base - 1):+.1f}%" if base > 0 else "n/a"

    for name, r in results.items():
        r["slowdown"] = 1 - r["tokens_per_s"] / plain["tokens_per_s"]
        line = (f"{name:14s} batch {a.batch:3d}: {r['tokens']:6d} tokens in {r['seconds']:7.2f} s = "
                f"{r['tokens_per_s']:8.1f} tokens/s  ({100 * r['slowdown']:+.1f}% slower than unconstrained), "
                f"median time per output token {r['tpot_ms_median']:.2f} ms "
                f"({change(r['tpot_ms_median'], plain['tpot_ms_median'])})")
        if "itl_ms_median" in r:
            line += (f", median gap between tokens {r['itl_ms_median']:.2f} ms "
                     f"({change(r['itl_ms_median'], plain['itl_ms_median'])})")
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": "server" if a.base_url else a.device, "batch": a.batch, "max_tokens": a.max_tokens,
                       "results": results}, f, indent=1)
    return 0


def run_served(a):
    """Each mode twice (the second counts) as --batch concurrent completions; per request, its
    latency over its tokens (the median is printed)."""
    base = a.base_url.rstrip("/")
    proc = subprocess.Popen(shlex.split(a.launch)) if a.launch else None
    try:
        deadline = time.time() + a.launch_timeout
        while True:
            try:
                with urllib.request.urlopen(base + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if proc is not None and proc.poll() is not None:
                raise SystemExit(f"the server exited with {proc.returncode} before it was healthy")
            if time.time() > deadline:
                raise SystemExit(f"{base}/health: no answer within {a.launch_timeout} s")
            time.sleep(1)
        with urllib.request.urlopen(base + "/v1/models", timeout=30) as r:
            model = json.load(r)["data"][0]["id"]
        # The short formats end where the model closes them (random weights close them early);
        # the long ones cannot end before max_tokens, so every mode's batch stays full as long.
        modes = {"unconstrained": {}, "json_object": {"response_format": {"type": "json_object"}},
                 "json_schema": {"response_format": {"type": "json_schema",
                                                     "json_schema": {"name": "words", "schema": SCHEMA}}},
                 "json_long_string": {"response_format": {"type": "json_schema",
                                                          "json_schema": {"name": "text", "schema": LONG_SCHEMA}}},
                 "regex_long": {"guided_regex": "[a-z ]{2000}"}}

        def post(body):
            """Streamed: (tokens, seconds from the first token to the last, the gaps between text chunks)."""
            body = dict(body, stream=True, stream_options={"include_usage": True})
            req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            first = last = None
            tokens = 0
            gaps = []
            with urllib.request.urlopen(req, timeout=600) as r:
                for raw in r:
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    j = json.loads(line[6:])
                    if j.get("usage"):
                        tokens = j["usage"]["completion_tokens"]
                    if j.get("choices") and j["choices"][0].get("text"):
                        now = time.perf_counter()
                        if last is not None:
                            gaps.append(now - last)
                        last = now
                        first = first or last
            return tokens, (last - first) if first is not None else 0.0, gaps

        results = {}
        with concurrent.futures.ThreadPoolExecutor(a.batch) as pool:
            for name, extra in modes.items():
                for rep in range(2):
                    bodies = [{"model": model, "prompt": f"List some words about topic number {i}, as JSON.",
                               "max_tokens": a.max_tokens, "temperature": 1.0, "seed": i, **extra}
                              for i in range(a.batch)]
                    t0 = time.perf_counter()
                    outs = list(pool.map(post, bodies))
                    dt = time.perf_counter() - t0
                tokens = sum(n for n, _, _ in outs)
                # Time per output token after the first (TPOT): the answers' lengths differ by mode,
                # and the first token carries the prompt's prefill. A short answer's TPOT also
                # carries the steps that still prefill other requests' prompts, so the median gap
                # between tokens (ITL, every request's gaps pooled) is printed beside it: the step.
                per_token = sorted(t / (n - 1) for n, t, _ in outs if n > 2)
                gaps = sorted(g for _, _, gs in outs for g in gs)
                results[name] = {"tokens": tokens, "seconds": dt, "tokens_per_s": tokens / dt,
                                 "tpot_ms_median": 1000 * per_token[len(per_token) // 2] if per_token else 0.0,
                                 "itl_ms_median": 1000 * gaps[len(gaps) // 2] if gaps else 0.0}
        return results
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)


def run_in_process(a):
    import fdpp
    from fdpp import StructuredOutputsParams
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
    return results


if __name__ == "__main__":
    raise SystemExit(main())
