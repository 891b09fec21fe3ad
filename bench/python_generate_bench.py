#!/usr/bin/env python3
"""Throughput of fdpp's Python API against the engine's own benchmark, on the same GPU and batch.

    python bench/python_generate_bench.py [--model PATH] [--fdpp build-gpu/fdpp] [--prompts 256]
        [--batch 64] [--prompt-len 16] [--max-tokens 256] [--json OUT.json]

Runs llm.generate over --prompts prompts of --prompt-len random token ids (greedy, ignore_eos, so
every request makes exactly --max-tokens tokens) with max_num_seqs = --batch, then
`fdpp bench -b BATCH -c CTX -p PROMPT_LEN --json` with CTX the average context of a decode step
(prompt + max_tokens / 2). Short prompts and long outputs make the job decode-bound, so the
comparison is generated tokens/s against bench's tg rate at the same batch; the expected time
(prefill at bench's pp rate + decode steps at bench's ms/step) is printed beside the measured one.
Issue 16's goal: within 10% of fdpp bench.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import time

import fdpp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file or HF directory (default: the default model)")
    ap.add_argument("--fdpp", default="build-gpu/fdpp", help="the CLI, for `fdpp bench` (CUDA build)")
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64, help="max_num_seqs, and bench's -b")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--dtype", default="f16", choices=["f16", "bf16"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default=None, help="write the numbers to this file")
    a = ap.parse_args()

    llm = fdpp.LLM(a.model, device=a.device, dtype=a.dtype, max_num_seqs=a.batch,
                   max_model_len=a.prompt_len + a.max_tokens + 16)
    rng = random.Random(16)
    # Ids from the middle of the vocabulary: plain text pieces, no control tokens.
    lo, hi = 1000, min(llm.vocab_size - 1, 20000)
    prompts = [[rng.randint(lo, hi) for _ in range(a.prompt_len)] for _ in range(a.prompts)]
    sp = fdpp.SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)

    # No progress bar: its output would mix with the report, and the measurement stays as it was.
    llm.generate(prompts[: a.batch], fdpp.SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
                 use_tqdm=False)  # warm-up
    steps0 = llm.stats()["steps"]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp, use_tqdm=False)
    wall = time.perf_counter() - t0
    steps = llm.stats()["steps"] - steps0
    generated = sum(len(o.token_ids) for o in outs)
    assert generated == a.prompts * a.max_tokens, generated
    py_tps = generated / wall

    # fdpp bench needs the GPU memory this LLM's KV cache holds (sized to all but 512 MiB).
    model_path, device = llm.model_path, llm.device
    del llm
    gc.collect()

    ctx = a.prompt_len + a.max_tokens // 2
    cmd = [a.fdpp, "bench", "-b", str(a.batch), "-c", str(ctx), "-p", str(a.prompt_len), "--dtype", a.dtype, "--json"]
    if a.model:
        cmd += ["--model", a.model]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}", file=sys.stderr)
        return 1
    bench = json.loads(p.stdout)
    tg = next(r for r in bench["results"] if r["test"].startswith("tg"))
    pp = next(r for r in bench["results"] if r["test"].startswith("pp"))
    waves = -(-a.prompts // a.batch)
    expected = a.prompts * pp["seconds"] + waves * a.max_tokens * tg["ms_per_step"] / 1e3

    print(f"model {model_path} on {device}, {a.prompts} prompts x {a.prompt_len} ids -> {a.max_tokens} tokens, "
          f"batch {a.batch}")
    print(f"llm.generate : {wall:8.3f} s  {py_tps:10.1f} generated tokens/s  ({steps} scheduler steps)")
    print(f"fdpp bench   : tg{a.batch}@{ctx} {tg['ms_per_step']:.3f} ms/step = {tg['tokens_per_second']:10.1f} tokens/s; "
          f"pp{a.prompt_len} {pp['seconds'] * 1e3:.3f} ms")
    print(f"expected from bench (prefill one by one + {waves} x {a.max_tokens} decode steps): {expected:.3f} s")
    ratio = py_tps / tg["tokens_per_second"]
    print(f"generate / bench decode rate: {ratio:.3f}   measured / expected time: {wall / expected:.3f}   "
          f"goal: within 10% ({'met' if ratio >= 0.9 else 'NOT met'})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "generate_seconds": wall, "generate_tokens_per_second": py_tps,
                       "scheduler_steps": steps, "bench": bench, "expected_seconds": expected,
                       "ratio_to_bench_decode": ratio}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
