#!/usr/bin/env python3
"""Serving benchmark for `fdpp serve` (the shape of vLLM's benchmark_serving.py): requests arrive
as a Poisson process at --request-rate (inf: all at once), with random token-id prompts of
--input-len and outputs of exactly --output-len tokens (ignore_eos), streamed from
/v1/completions; reports request throughput, output tokens/s and TTFT / TPOT / ITL / end-to-end
latency percentiles as a table and as JSON.

Plain HTTP (aiohttp, else httpx) and numpy only: it runs on the GPU machine, which has no
internet and no openai package.

  # one rate against a running server
  python3 bench/serve_bench.py --base-url http://127.0.0.1:8080 --num-prompts 256 \\
      --input-len 512 --output-len 128 --request-rate inf
  # start the server, sweep rates, stop it, write everything to one JSON file
  python3 bench/serve_bench.py --launch "build-gpu/fdpp serve --load-format dummy \\
      --config configs/llama-2-7b.json --port 8080" --sweep 1,2,4,8,16,inf --result-json out/sweep.json

Definitions (as vLLM's): TTFT = arrival of the first streamed token - request sent; TPOT = (end -
first token) / (output tokens - 1) per request; ITL = gaps between streamed chunks, a chunk that
carries k tokens counting as k gaps of 1/k each (the server merges tokens when the client reads
slower than they come); E2EL = end - request sent. Token counts come from the server
(return_token_ids / usage), not from re-tokenized text. While a run goes, /metrics is sampled
every 0.25 s for the scheduler's running batch (max and mean while non-empty) and the preemption
counter.

Prefix caching workloads (issue 43): --shared-prefix-len N puts the same N random tokens (a system
prompt) before every prompt; --turns T makes each of --num-prompts users hold a conversation of T
turns, each turn resending the whole conversation so far (its prompts and the returned token ids)
plus --input-len new tokens. The server's usage.prompt_tokens_details.cached_tokens is summed
("cached_prompt_tokens"). Compare a run against one of a server started with --no-prefix-cache:

  # 64 users x 8 turns, 128 new tokens a turn (about 4K tokens by the last), all at once
  python3 bench/serve_bench.py --num-prompts 64 --turns 8 --input-len 128 --output-len 128 --request-rate inf
  # a 4K-token shared system prompt before 64-token questions
  python3 bench/serve_bench.py --num-prompts 256 --shared-prefix-len 4096 --input-len 64 --output-len 128
"""
import argparse
import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import numpy as np

try:
    import aiohttp
except ImportError:  # httpx fallback
    aiohttp = None
    import httpx


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8080")
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--model", default=None, help="model id (default: the one /v1/models lists)")
    p.add_argument("--api-key", default=os.environ.get("FDPP_API_KEY"))
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--request-rate", type=float, default=float("inf"), help="requests/s (Poisson); inf = all at once")
    p.add_argument("--sweep", default=None, help="comma-separated request rates (inf allowed): one run per rate")
    p.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of the inter-arrival times (1 = Poisson, <1 burstier), as vLLM")
    p.add_argument("--max-concurrency", type=int, default=None, help="at most this many requests in flight")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths drawn uniformly from [len*(1-r), len*(1+r)] (0: fixed)")
    p.add_argument("--vocab-size", type=int, default=None, help="token ids are drawn from [10, vocab) "
                   "(default: the server's vocab_size from /v1/models, else 32000)")
    p.add_argument("--shared-prefix-len", type=int, default=0,
                   help="the same random tokens (a system prompt) before every prompt (prefix caching)")
    p.add_argument("--turns", type=int, default=1,
                   help="turns per user: each resends the conversation so far plus --input-len new tokens")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=2, help="requests before the measured ones (CUDA graphs, caches)")
    p.add_argument("--timeout", type=float, default=3600, help="seconds for one request")
    p.add_argument("--launch", default=None, help="command that starts the server; it is stopped (SIGTERM) at the end")
    p.add_argument("--launch-timeout", type=float, default=900)
    p.add_argument("--result-json", default=None, help="write the results here")
    p.add_argument("--write-prompts", default=None,
                   help="write the (first) run's requests as a JSON Lines prompts file for `fdpp generate -f` "
                        "and exit; needs --vocab-size")
    p.add_argument("--label", default="", help="free text stored with the results (e.g. the server command)")
    return p.parse_args()


# ----------------------------------------------------------------------------- HTTP (two clients)

class Http:
    def __init__(self, base, api_key, timeout):
        self.base = base.rstrip("/")
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout

    async def __aenter__(self):
        if aiohttp:
            conn = aiohttp.TCPConnector(limit=0, force_close=False)
            self.s = aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=self.timeout))
        else:
            self.s = httpx.AsyncClient(timeout=self.timeout, limits=httpx.Limits(max_connections=None))
        return self

    async def __aexit__(self, *a):
        await (self.s.close() if aiohttp else self.s.aclose())

    async def get(self, path):
        if aiohttp:
            async with self.s.get(self.base + path, headers=self.headers) as r:
                return r.status, await r.text()
        r = await self.s.get(self.base + path, headers=self.headers)
        return r.status_code, r.text

    async def stream_lines(self, path, body):
        """Yields (status, line) for each line of the response body as it arrives."""
        data = json.dumps(body)
        if aiohttp:
            async with self.s.post(self.base + path, data=data, headers=self.headers) as r:
                if r.status != 200:
                    yield r.status, await r.text()
                    return
                buf = b""
                async for chunk in r.content.iter_any():
                    buf += chunk
                    while b"\n" in buf:
                        line, buf = buf.split(b"\n", 1)
                        yield 200, line.decode("utf-8", "replace")
        else:
            async with self.s.stream("POST", self.base + path, content=data, headers=self.headers) as r:
                if r.status_code != 200:
                    yield r.status_code, (await r.aread()).decode()
                    return
                async for line in r.aiter_lines():
                    yield 200, line


# ----------------------------------------------------------------------------- one request

async def one_request(http, args, model, prompt, out_len):
    body = {"model": model, "prompt": prompt, "max_tokens": out_len, "temperature": args.temperature,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            "return_token_ids": True}
    rec = {"prompt_len": len(prompt), "output_len": 0, "ttft": None, "itl": [], "latency": None, "error": None,
           "cached": 0, "output_ids": []}
    start = time.perf_counter()
    last = None
    try:
        async for status, line in http.stream_lines(args.endpoint, body):
            if status != 200:
                rec["error"] = f"HTTP {status}: {line[:200]}"
                break
            if not line.startswith("data: "):
                continue
            payload = line[6:]
            if payload == "[DONE]":
                break
            j = json.loads(payload)
            if "error" in j:
                rec["error"] = j["error"].get("message")
                break
            if j.get("usage"):
                rec["output_len"] = j["usage"]["completion_tokens"]
                rec["cached"] = (j["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            if not j.get("choices"):
                continue
            ids = j["choices"][0].get("token_ids") or []
            rec["output_ids"].extend(ids)
            n = len(ids)
            if n == 0:
                continue
            now = time.perf_counter()
            if rec["ttft"] is None:
                rec["ttft"] = now - start
                n -= 1  # the first token's time is the TTFT, the rest of its chunk are gaps of 0
                rec["itl"].extend([0.0] * n)
            else:
                rec["itl"].extend([(now - last) / n] * n)
            last = now
    except Exception as e:  # a dropped connection is a failed request, not the end of the run
        rec["error"] = f"{type(e).__name__}: {e}"
    rec["latency"] = time.perf_counter() - start
    if rec["error"] is None and rec["output_len"] != out_len:
        rec["error"] = f"expected {out_len} tokens, got {rec['output_len']}"
    return rec


# ----------------------------------------------------------------------------- a run

async def sample_metrics(http, stop, out):
    """Polls /metrics for the running batch size and preemptions while a run goes."""
    while not stop.is_set():
        try:
            status, text = await http.get("/metrics")
            if status == 200:
                m = {}
                for line in text.splitlines():
                    if line and not line.startswith("#"):
                        k, v = line.rsplit(" ", 1)
                        m[k] = float(v)
                out.append(m)
        except Exception:
            pass
        try:
            await asyncio.wait_for(stop.wait(), 0.25)
        except asyncio.TimeoutError:
            pass


def percentiles(xs, scale=1000.0):
    if not xs:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    a = np.asarray(xs) * scale
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}


def warmup_prompts(args, vocab, rng):
    return [rng.integers(10, vocab, 16).tolist() for _ in range(args.warmup)]


def draw_job(args, vocab, rng):
    """The run's prompts (token ids) and output lengths, drawn after the warm-up's."""
    lo = lambda n: max(1, int(n * (1 - args.range_ratio)))
    hi = lambda n: max(1, int(n * (1 + args.range_ratio)))
    in_lens = rng.integers(lo(args.input_len), hi(args.input_len) + 1, args.num_prompts)
    out_lens = rng.integers(lo(args.output_len), hi(args.output_len) + 1, args.num_prompts)
    prefix = rng.integers(10, vocab, args.shared_prefix_len).tolist() if args.shared_prefix_len else []
    prompts = [prefix + rng.integers(10, vocab, int(n)).tolist() for n in in_lens]
    return prompts, out_lens


def write_prompts(args):
    """The first run's job as a prompts file for `fdpp generate -f` (the same requests offline)."""
    rng = np.random.default_rng(args.seed)
    warmup_prompts(args, args.vocab_size, rng)
    prompts, out_lens = draw_job(args, args.vocab_size, rng)
    with open(args.write_prompts, "w") as f:
        for p, o in zip(prompts, out_lens):
            f.write(json.dumps({"prompt_token_ids": p, "max_tokens": int(o), "ignore_eos": True,
                                "temperature": args.temperature}) + "\n")


async def run_once(args, http, model, vocab, rate, rng):
    prompts, out_lens = draw_job(args, vocab, rng)
    # Later turns' new tokens, drawn up front so that a run's prompts do not depend on timing.
    more = [[rng.integers(10, vocab, args.input_len).tolist() for _ in range(args.turns - 1)]
            for _ in range(args.num_prompts)]

    sem = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None

    async def one(p, o):
        if sem is None:
            return await one_request(http, args, model, p, int(o))
        async with sem:
            return await one_request(http, args, model, p, int(o))

    async def limited(p, o, user=0):
        # One user's conversation: each turn resends everything so far (a list of records).
        recs = []
        for turn in range(args.turns):
            rec = await one(p, o)
            recs.append(rec)
            if rec["error"] is not None or turn + 1 == args.turns:
                break
            p = p + rec["output_ids"] + more[user][turn]
        return recs

    samples, stop = [], asyncio.Event()
    sampler = asyncio.create_task(sample_metrics(http, stop, samples))
    tasks = []
    # Wall-clock bounds too, so that other logs (a GPU trace: bench/gpu_busy.py --serve-bench) can
    # cut the same interval.
    started_unix = time.time()
    t0 = time.perf_counter()
    for i in range(args.num_prompts):
        tasks.append(asyncio.create_task(limited(prompts[i], out_lens[i], i)))
        if rate != float("inf") and i + 1 < args.num_prompts:
            # Gamma inter-arrival times with mean 1/rate (shape 1: exponential, i.e. Poisson).
            await asyncio.sleep(rng.gamma(args.burstiness, 1.0 / (rate * args.burstiness)))
    recs = [r for user in await asyncio.gather(*tasks) for r in user]
    duration = time.perf_counter() - t0
    ended_unix = time.time()
    stop.set()
    await sampler

    ok = [r for r in recs if r["error"] is None]
    out_tokens = sum(r["output_len"] for r in ok)
    in_tokens = sum(r["prompt_len"] for r in ok)
    tpot = [(r["latency"] - r["ttft"]) / (r["output_len"] - 1) for r in ok if r["output_len"] > 1 and r["ttft"]]
    running = [m.get("fdpp_requests_running", 0) for m in samples]
    busy = [x for x in running if x > 0]
    pre = [m.get("fdpp_preemptions_total", 0) for m in samples]
    evicted = [m.get("fdpp_prefix_cache_evictions_total", 0) for m in samples]
    return {
        "request_rate": "inf" if rate == float("inf") else rate,
        "max_concurrency": args.max_concurrency,
        "num_prompts": args.num_prompts,
        "turns": args.turns,
        "shared_prefix_len": args.shared_prefix_len,
        "cached_prompt_tokens": sum(r["cached"] for r in ok),
        "completed": len(ok),
        "failed": len(recs) - len(ok),
        "errors": sorted({r["error"] for r in recs if r["error"]})[:5],
        "duration_s": duration,
        "started_unix": started_unix,
        "ended_unix": ended_unix,
        "total_input_tokens": in_tokens,
        "total_output_tokens": out_tokens,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_token_throughput": (in_tokens + out_tokens) / duration,
        "ttft_ms": percentiles([r["ttft"] for r in ok if r["ttft"] is not None]),
        "tpot_ms": percentiles(tpot),
        "itl_ms": percentiles([x for r in ok for x in r["itl"]]),
        "e2el_ms": percentiles([r["latency"] for r in ok]),
        "scheduler_running_max": max(running) if running else None,
        "scheduler_running_mean": float(np.mean(busy)) if busy else None,
        "preemptions": (pre[-1] - pre[0]) if len(pre) >= 2 else None,
        "prefix_cache_evictions": (evicted[-1] - evicted[0]) if len(evicted) >= 2 else None,
    }


def print_table(res):
    w = 44
    print("=" * w + "\n" + f" Serving benchmark, rate {res['request_rate']} req/s ".center(w, "=") + "\n" + "=" * w)
    rows = [("Successful requests", res["completed"]), ("Failed requests", res["failed"]),
            ("Benchmark duration (s)", f"{res['duration_s']:.2f}"),
            ("Total input tokens", res["total_input_tokens"]), ("Total generated tokens", res["total_output_tokens"]),
            ("Cached prompt tokens", res["cached_prompt_tokens"]),
            ("Request throughput (req/s)", f"{res['request_throughput']:.2f}"),
            ("Output token throughput (tok/s)", f"{res['output_throughput']:.2f}"),
            ("Total token throughput (tok/s)", f"{res['total_token_throughput']:.2f}"),
            ("Scheduler running batch max / mean", f"{res['scheduler_running_max']} / "
             f"{res['scheduler_running_mean'] if res['scheduler_running_mean'] is None else round(res['scheduler_running_mean'], 1)}"),
            ("Preemptions", res["preemptions"]), ("Prefix cache evictions", res["prefix_cache_evictions"])]
    for k, v in rows:
        print(f"{k:<34}{v!s:>10}")
    for name, key in (("Time to First Token", "ttft_ms"), ("Time per Output Token (excl. 1st)", "tpot_ms"),
                      ("Inter-token Latency", "itl_ms"), ("End-to-end Latency", "e2el_ms")):
        print(f"{name:-^{w}}")
        for stat in ("mean", "p50", "p90", "p99", "max"):
            v = res[key][stat]
            print(f"{stat.upper() + ' (ms)':<34}{'-' if v is None else f'{v:.2f}':>10}")
    if res["errors"]:
        print("errors:", *res["errors"], sep="\n  ")
    print("=" * w, flush=True)


async def main_async(args):
    async with Http(args.base_url, args.api_key, args.timeout) as http:
        status, text = await http.get("/v1/models")
        if status != 200:
            sys.exit(f"serve_bench: GET /v1/models answered {status}: {text[:200]}")
        info = json.loads(text)["data"][0]
        model = args.model or info["id"]
        vocab = args.vocab_size or info.get("vocab_size") or 32000
        rng = np.random.default_rng(args.seed)
        if args.warmup:
            w = await asyncio.gather(*[one_request(http, args, model, p, 4) for p in warmup_prompts(args, vocab, rng)])
            bad = [r["error"] for r in w if r["error"]]
            if bad:
                sys.exit(f"serve_bench: warm-up failed: {bad[0]}")
        rates = [float(x) for x in args.sweep.split(",")] if args.sweep else [args.request_rate]
        results = []
        for rate in rates:
            res = await run_once(args, http, model, vocab, rate, rng)
            print_table(res)
            results.append(res)
        return {"model": model, "base_url": args.base_url, "label": args.label,
                "input_len": args.input_len, "output_len": args.output_len, "range_ratio": args.range_ratio,
                "temperature": args.temperature, "client": "aiohttp" if aiohttp else "httpx", "runs": results}


def wait_healthy(base, timeout, proc):
    import urllib.request
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"serve_bench: the server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    sys.exit("serve_bench: the server did not become healthy")


def main():
    args = parse_args()
    if args.turns < 1 or args.shared_prefix_len < 0:
        sys.exit("serve_bench: --turns must be >= 1 and --shared-prefix-len >= 0")
    if args.write_prompts:
        if not args.vocab_size:
            sys.exit("serve_bench: --write-prompts needs --vocab-size")
        if args.turns > 1:
            sys.exit("serve_bench: --write-prompts cannot write --turns (later turns hold the server's answers)")
        write_prompts(args)
        return
    proc = None
    if args.launch:
        proc = subprocess.Popen(shlex.split(args.launch))
        wait_healthy(args.base_url.rstrip("/"), args.launch_timeout, proc)
        args.label = args.label or args.launch
    try:
        out = asyncio.run(main_async(args))
    finally:
        if proc:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
    text = json.dumps(out, indent=2)
    if args.result_json:
        os.makedirs(os.path.dirname(os.path.abspath(args.result_json)), exist_ok=True)
        with open(args.result_json, "w") as f:
            f.write(text + "\n")
    print(text)
    if any(r["failed"] for r in out["runs"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
