#!/usr/bin/env python3
"""FlashInfer's paged decode attention (BatchDecodeWithPagedKVCacheWrapper) on the shapes of
`fdpp bench-attention`, in the same GPU run as fdpp's, timed as attention_peers.py times torch SDPA
(one CUDA graph of calls over several K/V copies whose total exceeds twice the L2, median replay).

FlashInfer compiles its kernels with the machine's nvcc at first use (JIT). The GPU machine has no
internet: the package travels as its source distribution and is installed with --no-deps there
(scripts/gpu-check.sh); a failure to install, import or compile is recorded, not fatal.

usage: flashinfer_decode.py --heads 32 --kv-heads 8 [--head-dim 128] [-b 1,8] [-c 1024,16384] [--json OUT]
"""
import argparse
import json
import math
import sys

import torch

from peers import graph_time_us  # same directory

L2 = 60e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("-b", "--batch", default="1,8,32")
    ap.add_argument("-c", "--context", default="1024,4096,16384")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = []
    try:
        import flashinfer
        version = getattr(flashinfer, "__version__", "?")
    except Exception as e:  # not installed, or its imports fail on this machine
        rows.append({"peer": "flashinfer", "error": f"import: {type(e).__name__}: {str(e).splitlines()[0][:200]}"})
        print(rows[-1]["error"], flush=True)
        version = None
    h, kvh, d, ps = a.heads, a.kv_heads, a.head_dim, a.page_size
    if version is not None:
        workspace = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
        for b in (int(x) for x in a.batch.split(",")):
            for L in (int(x) for x in a.context.split(",")):
                pages = math.ceil(L / ps)
                kv_bytes = 2 * b * L * kvh * d * 2
                copies = max(1, min(64, math.ceil(2 * L2 / kv_bytes)))
                try:
                    caches = [torch.empty(b * pages, 2, ps, kvh, d, device="cuda", dtype=torch.float16).uniform_(-1, 1)
                              for _ in range(copies)]
                    q = torch.empty(b, h, d, device="cuda", dtype=torch.float16).uniform_(-1, 1)
                    indptr = torch.arange(0, b + 1, device="cuda", dtype=torch.int32) * pages
                    indices = torch.arange(0, b * pages, device="cuda", dtype=torch.int32)
                    last = torch.full((b,), L - (pages - 1) * ps, device="cuda", dtype=torch.int32)
                    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=h // kvh >= 4)
                    w.plan(indptr, indices, last, h, kvh, d, ps, pos_encoding_mode="NONE", data_type=torch.float16)
                    fns = [lambda c=c: w.run(q, c) for c in caches]
                    us = graph_time_us(lambda: [f() for f in fns]) / len(fns)
                except Exception as e:
                    rows.append({"peer": "flashinfer", "heads": h, "kv_heads": kvh, "B": b, "L": L,
                                 "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"})
                    print(f"flashinfer {h}/{kvh} B {b} L {L}: {rows[-1]['error']}", flush=True)
                    continue
                rows.append({"peer": "flashinfer", "version": version, "heads": h, "kv_heads": kvh, "head_dim": d,
                             "B": b, "L": L, "us": us, "pct_design_bw": kv_bytes / (us * 1e-6) / 4.46e12})
                print(f"flashinfer {version} {h}/{kvh} D {d} B {b} L {L}: {us:.2f} us", flush=True)
                del caches
                torch.cuda.empty_cache()
    if a.json:
        json.dump({"rows": rows}, open(a.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
