#!/usr/bin/env python3
"""torch SDPA decode attention (q_len 1) on the shapes of `fdpp bench-attention`, in the same GPU run.

Backends: cuDNN and FlashAttention (each forced with sdpa_kernel). Graph-timed like fdpp: one graph
holds calls on several K/V copies whose total exceeds twice the 60 MB L2, so no call reads its
inputs from L2; the time per call is the median over replays divided by the calls per replay.
K and V are dense [B, KVH, L, D] (SDPA has no paged cache): the same bytes per key as fdpp's.

usage: attention_peers.py --heads 32 --kv-heads 8 [--head-dim 128] [-b 1,8,32,64]
                          [-c 512,1024,4096,16384,65536] [--json OUT]
       attention_peers.py --prefill --heads 32 --kv-heads 8 [--points 1x1024,1x4096,1x16384,1x32768,8x2048]
                          [--json OUT]

--prefill: causal prefill (is_causal=True) of B sequences of L tokens, the points of
`fdpp bench-attention --prefill`; q [B, H, L, D], k/v [B, KVH, L, D] fp16, enable_gqa when KVH < H.
TFLOP/s counts what fdpp counts: 4 D H B L (L + 1) / 2 (the causal half, QK^T and PV).
"""
import argparse
import json
import math

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from peers import graph_time_us as peer_graph_time_us  # same directory

READ_BW = 4.46e12  # DESIGN.md: read-only streaming on the H200
L2 = 60e6


def graph_time_us(fns, replays=7):
    """Median microseconds per call of the calls in fns, all captured into one graph."""
    return peer_graph_time_us(lambda: [f() for f in fns], reps=replays) / len(fns)


def prefill_main(a):
    h, kvh, d = a.heads, a.kv_heads, a.head_dim
    rows = []
    for p in a.points.split(","):
        b, L = (int(x) for x in p.split("x"))
        flops = 4.0 * d * h * b * (L * (L + 1) / 2)
        calls = max(1, min(50, math.ceil(20e-3 / (flops / 400e12))))  # ~20 ms per replay, as fdpp
        try:
            def uniform(*shape):
                return torch.empty(*shape, device="cuda", dtype=torch.float16).uniform_(-1, 1)
            q, k, v = uniform(b, h, L, d), uniform(b, kvh, L, d), uniform(b, kvh, L, d)
        except torch.OutOfMemoryError:
            rows.append({"B": b, "L": L, "error": "out of memory"})
            continue
        for backend, label in [(SDPBackend.CUDNN_ATTENTION, "sdpa-cudnn"), (SDPBackend.FLASH_ATTENTION, "sdpa-flash")]:
            fns = [lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kvh != h)] * calls
            try:
                with sdpa_kernel(backend):
                    us = graph_time_us(fns)
            except Exception as e:  # a backend may refuse a shape
                rows.append({"peer": label, "B": b, "L": L, "error": str(e).splitlines()[0][:200]})
                print(f"{label} H {h}/{kvh} {b}x{L}: error {str(e).splitlines()[0][:120]}", flush=True)
                continue
            rows.append({"peer": label, "heads": h, "kv_heads": kvh, "head_dim": d, "B": b, "L": L, "us": us,
                         "tflops": flops / (us * 1e-6) / 1e12})
            print(f"{label} prefill H {h}/{kvh} D {d} {b}x{L}: {us:.1f} us, {flops / (us * 1e-6) / 1e12:.1f} TFLOP/s",
                  flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("-b", "--batch", default="1,8,32,64")
    ap.add_argument("-c", "--context", default="512,1024,4096,16384,65536")
    ap.add_argument("--json")
    ap.add_argument("--prefill", action="store_true")
    ap.add_argument("--points", default="1x1024,1x4096,1x16384,1x32768,8x2048")
    a = ap.parse_args()
    if a.prefill:
        res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "kernel": "prefill",
               "rows": prefill_main(a)}
        if a.json:
            json.dump(res, open(a.json, "w"), indent=1)
        return
    h, kvh, d = a.heads, a.kv_heads, a.head_dim
    rows = []
    for b in [int(x) for x in a.batch.split(",")]:
        for L in [int(x) for x in a.context.split(",")]:
            kv_bytes = 2 * b * kvh * L * d * 2
            copies = max(1, math.ceil(2 * L2 / kv_bytes))
            calls = max(copies, min(50, math.ceil(2e-3 / (kv_bytes / READ_BW))))
            try:
                def uniform(*shape):  # in place: no temporaries the size of K
                    return torch.empty(*shape, device="cuda", dtype=torch.float16).uniform_(-1, 1)
                q = uniform(b, h, 1, d)
                kvs = [(uniform(b, kvh, L, d), uniform(b, kvh, L, d)) for _ in range(copies)]
            except torch.OutOfMemoryError as e:
                rows.append({"B": b, "L": L, "error": "out of memory"})
                continue
            for backend, label in [(SDPBackend.CUDNN_ATTENTION, "sdpa-cudnn"), (SDPBackend.FLASH_ATTENTION, "sdpa-flash")]:
                fns = [lambda k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=kvh != h)
                       for k, v in (kvs[i % copies] for i in range(calls))]
                try:
                    with sdpa_kernel(backend):
                        us = graph_time_us(fns)
                except Exception as e:  # a backend may refuse a shape
                    rows.append({"peer": label, "B": b, "L": L, "error": str(e).splitlines()[0][:200]})
                    continue
                byts = kv_bytes + 2 * b * h * d * 2
                rows.append({"peer": label, "heads": h, "kv_heads": kvh, "head_dim": d, "B": b, "L": L, "us": us,
                             "pct_bw": byts / (us * 1e-6) / READ_BW})
                print(f"{label} H {h}/{kvh} B {b} L {L}: {us:.2f} us", flush=True)
            del kvs
            torch.cuda.empty_cache()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
