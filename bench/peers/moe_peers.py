#!/usr/bin/env python3
"""HF transformers' own mixture-of-experts forward on random weights of a configs/ preset
(Qwen3-30B-A3B, Mixtral), in the same GPU run as `fdpp bench --config` on that preset: prefill of
P tokens (one forward, median of the repetitions after a warm-up) and decode at batch B with C
tokens of context (the cache made by one prefill of B x C; each step one forward of B tokens with
the cache, timed between device synchronizations, median of the steps).

Every experts backend of transformers 5 that loads is timed ("grouped_mm": tokens sorted by expert
into one torch._grouped_mm; "eager": a loop over the experts that got tokens); a backend the
installed version lacks is recorded as an error, not fatal.

usage: moe_peers.py CONFIG.json [-p 512,2048] [-b 1,64] [-c 1024] [--steps 16] [-r 3]
                    [--backends grouped_mm,eager] [--json OUT]
"""
import argparse
import gc
import json
import statistics
import time

import torch


def synced(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def load(cfg_path, backend):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(cfg_path)
    cfg._attn_implementation = "sdpa"
    with torch.device("cuda"):
        try:
            return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, experts_implementation=backend).eval()
        except TypeError:  # a version without the experts interface: only its own (eager) loop
            if backend != "eager":
                raise
            return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()


def bench_backend(cfg_path, backend, prompts, batches, context, steps, reps):
    rows = []
    try:
        model = load(cfg_path, backend)
    except Exception as e:  # the backend is missing or does not build here
        return [{"peer": f"hf-{backend}", "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}]
    vocab = model.config.vocab_size
    with torch.no_grad():
        for p in prompts:
            ids = torch.randint(0, vocab, (1, p), device="cuda")
            times = [synced(lambda: model(ids, use_cache=False, logits_to_keep=1))[0] for _ in range(reps + 1)][1:]
            t = statistics.median(times)
            rows.append({"peer": f"hf-{backend}", "test": f"pp{p}", "batch": 1, "ms": 1e3 * t, "tokens_per_second": p / t})
            print(f"hf-{backend} pp{p}: {1e3 * t:.1f} ms, {p / t:.0f} tok/s", flush=True)
        for b in batches:
            ids = torch.randint(0, vocab, (b, context), device="cuda")
            out = model(ids, use_cache=True, logits_to_keep=1)
            past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
            times = []
            for _ in range(steps + 2):
                t, out = synced(lambda: model(nxt, past_key_values=past, use_cache=True))
                past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
                times.append(t)
            t = statistics.median(times[2:])
            rows.append({"peer": f"hf-{backend}", "test": f"tg{b}@{context}", "batch": b, "ms": 1e3 * t,
                         "tokens_per_second": b / t})
            print(f"hf-{backend} tg{b}@{context}: {1e3 * t:.2f} ms/step", flush=True)
            del past, out
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("-p", "--prompts", default="512,2048")
    ap.add_argument("-b", "--batches", default="1,64")
    ap.add_argument("-c", "--context", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--backends", default="grouped_mm,eager")
    ap.add_argument("--json")
    a = ap.parse_args()
    import transformers
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
           "config": a.config, "rows": []}
    for backend in a.backends.split(","):
        res["rows"] += bench_backend(a.config, backend, [int(x) for x in a.prompts.split(",") if x],
                                     [int(x) for x in a.batches.split(",") if x], a.context, a.steps, a.repetitions)
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)
    print(f"HF transformers {res['transformers']} on {res['gpu']}, {a.config}")
    print("| peer | test | ms | tokens/s |\n| --- | --- | ---: | ---: |")
    for r in res["rows"]:
        if "error" in r:
            print(f"| {r['peer']} | | {r['error']} | |")
        else:
            print(f"| {r['peer']} | {r['test']} | {r['ms']:.2f} | {r['tokens_per_second']:.1f} |")


if __name__ == "__main__":
    main()
