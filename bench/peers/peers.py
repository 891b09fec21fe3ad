#!/usr/bin/env python3
"""Peers measured on the same GPU, same shapes, in the same run as fdpp's benchmarks.

  cuBLAS (torch F.linear, fp16) for a model's four linear shapes at M = batch, graph-timed with
  the weights rotated past the 60 MB L2;
  torch SDPA decode attention (q_len 1) with the cuDNN and FlashAttention backends;
  HF transformers decode (eager and sdpa attention) with random weights of the preset config;
  --compiled B,...: the same model as a gpt-fast style decoder: a static KV cache and the decode
  step under torch.compile (mode "reduce-overhead": CUDA graphs), greedy, at those batch sizes (each
  compiles for about 45 s for Llama-2-7B on the H200 machine).

usage: peers.py CONFIG.json [--batches 1,8,32] [--context 1024] [--hf-steps 16] [--compiled 1,8]
                [--json OUT]
Prints a markdown table; --json writes every number.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

READ_BW = 4.46e12  # DESIGN.md


def graph_time_us(fn, reps=50):
    """Median microseconds of fn() replayed from a CUDA graph (one call per replay)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def linear_shapes(cfg):
    h = cfg["hidden_size"]
    heads = cfg.get("num_attention_heads")
    kvh = cfg.get("num_key_value_heads", cfg.get("multi_query_group_num", heads))
    hd = cfg.get("head_dim", cfg.get("kv_channels", h // heads))
    ff = cfg.get("intermediate_size", cfg.get("ffn_dim", cfg.get("ffn_hidden_size")))
    gated = cfg.get("model_type") != "opt"
    return {"qkv": (heads * hd + 2 * kvh * hd, h), "o": (h, heads * hd),
            "gate_up" if gated else "fc1": ((2 if gated else 1) * ff, h), "down": (h, ff)}


def bench_cublas(cfg, batches):
    rows = []
    for name, (n, k) in linear_shapes(cfg).items():
        copies = max(2, int(256e6 // (n * k * 2)) + 1)  # > 60 MB L2 worth of weights, rotated
        ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) for _ in range(copies)]
        for m in batches:
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)

            def fn():
                # The graph replays one capture; capture all copies in sequence and divide.
                for w in ws:
                    F.linear(x, w)
            us = graph_time_us(fn) / len(ws)
            byts = n * k * 2 + m * k * 2 + m * n * 2
            rows.append({"peer": "cublas", "shape": name, "N": n, "K": k, "M": m, "us": us,
                         "pct_bw": 100 * byts / (us * 1e-6) / READ_BW})
        del ws
    return rows


def bench_sdpa(cfg, batches, context):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    h = cfg["num_attention_heads"]
    kvh = cfg.get("num_key_value_heads", cfg.get("multi_query_group_num", h))
    d = cfg.get("head_dim", cfg.get("kv_channels", cfg["hidden_size"] // h))
    rows = []
    for b in batches:
        q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.float16)
        k = torch.randn(b, kvh, context, d, device="cuda", dtype=torch.float16)
        v = torch.randn_like(k)
        for backend, label in [(SDPBackend.CUDNN_ATTENTION, "sdpa-cudnn"), (SDPBackend.FLASH_ATTENTION, "sdpa-flash")]:
            try:
                with sdpa_kernel(backend):
                    us = graph_time_us(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=kvh != h))
            except Exception as e:  # a backend may refuse a shape
                rows.append({"peer": label, "B": b, "L": context, "error": str(e).splitlines()[0]})
                continue
            byts = 2 * b * kvh * context * d * 2
            rows.append({"peer": label, "B": b, "L": context, "us": us, "pct_bw": 100 * byts / (us * 1e-6) / READ_BW})
    return rows


def bench_hf(cfg_path, batches, context, steps):
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(cfg_path)
    rows = []
    for impl in ["eager", "sdpa"]:
        cfg._attn_implementation = impl
        with torch.device("cuda"):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float16).eval()
        for b in batches:
            ids = torch.randint(0, cfg.vocab_size, (b, context), device="cuda")
            with torch.no_grad():
                out = model(ids, use_cache=True)
                past = out.past_key_values
                nxt = out.logits[:, -1:].argmax(-1)
                times = []
                for _ in range(steps):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    out = model(nxt, past_key_values=past, use_cache=True)
                    past = out.past_key_values
                    nxt = out.logits[:, -1:].argmax(-1)
                    torch.cuda.synchronize()
                    times.append(time.perf_counter() - t0)
            rows.append({"peer": f"hf-{impl}", "B": b, "L": context, "ms_per_step": 1e3 * statistics.median(times),
                         "transformers": transformers.__version__})
        del model
        torch.cuda.empty_cache()
    return rows


def bench_compiled(cfg_path, batches, context, steps, device="cuda"):
    """ms per decode step of HF's model with a StaticCache and the step torch.compile'd."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, StaticCache
    cfg = AutoConfig.from_pretrained(cfg_path)
    cfg._attn_implementation = "sdpa"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float16 if device == "cuda" else torch.float32).eval()
    warmup = 4  # the first calls compile and record the graphs
    rows = []
    for b in batches:
        cache = StaticCache(config=cfg, max_cache_len=context + warmup + steps + 1)

        def step(ids, pos):
            out = model(input_ids=ids, past_key_values=cache, cache_position=pos, use_cache=True)
            return out.logits[:, -1:].argmax(-1)

        compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
        ids = torch.randint(0, cfg.vocab_size, (b, context), device=device)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        with torch.no_grad():
            nxt = step(ids, torch.arange(context, device=device))  # the prompt, not compiled
            t_compile = time.perf_counter()
            for i in range(warmup):
                nxt = compiled(nxt.clone(), torch.tensor([context + i], device=device))
            sync()
            t_compile = time.perf_counter() - t_compile
            times = []
            for i in range(steps):
                pos = torch.tensor([context + warmup + i], device=device)
                sync()
                t0 = time.perf_counter()
                nxt = compiled(nxt.clone(), pos)
                sync()
                times.append(time.perf_counter() - t0)
        rows.append({"peer": "torch.compile static cache", "B": b, "L": context,
                     "ms_per_step": 1e3 * statistics.median(times), "compile_s": t_compile,
                     "transformers": transformers.__version__, "torch": torch.__version__})
        del compiled, cache
        torch._dynamo.reset()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--hf-steps", type=int, default=16)
    ap.add_argument("--no-hf", action="store_true")
    ap.add_argument("--compiled", default="", help="batch sizes for the torch.compile'd decoder (slow to compile)")
    ap.add_argument("--json")
    a = ap.parse_args()
    cfg = json.load(open(a.config))
    batches = [int(x) for x in a.batches.split(",")]
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "config": a.config,
           "cublas": bench_cublas(cfg, batches), "sdpa": bench_sdpa(cfg, batches, a.context)}
    if not a.no_hf:
        res["hf"] = bench_hf(a.config, batches, a.context, a.hf_steps)
    if a.compiled:
        res["compiled"] = bench_compiled(a.config, [int(x) for x in a.compiled.split(",")], a.context, a.hf_steps)
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)
    print(f"peers on {res['gpu']} (torch {res['torch']}), {a.config}")
    print("| peer | shape | M/B | time | % of 4.46 TB/s |\n| --- | --- | ---: | ---: | ---: |")
    for r in res["cublas"]:
        print(f"| cuBLAS | {r['shape']} [{r['N']},{r['K']}] | {r['M']} | {r['us']:.1f} us | {r['pct_bw']:.0f} |")
    for r in res["sdpa"]:
        if "error" in r:
            print(f"| {r['peer']} | L={r['L']} | {r['B']} | {r['error']} | |")
        else:
            print(f"| {r['peer']} | L={r['L']} | {r['B']} | {r['us']:.1f} us | {r['pct_bw']:.0f} |")
    for r in res.get("hf", []) + res.get("compiled", []):
        print(f"| {r['peer']} | ctx {r['L']} | {r['B']} | {r['ms_per_step']:.2f} ms/step | |")


if __name__ == "__main__":
    main()
