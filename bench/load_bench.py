#!/usr/bin/env python3
"""Model load time on the GPU machine: fdpp's streaming loader against reading the files once
(cat > /dev/null) and transformers' from_pretrained(..., device_map="cuda"), cold and warm.

  load_bench.py make DIR --size 7b|13b     random Llama-2-shaped bf16 checkpoint, sharded safetensors
  load_bench.py evict DIR                  drop DIR's files from the page cache (fadvise, no root)
  load_bench.py hf DIR                     one from_pretrained, prints JSON {seconds, peak_rss_bytes}
  load_bench.py run DIR --fdpp BIN [--label 7b]   the measurements, a table and JSON lines

Cold runs evict the files first (posix_fadvise DONTNEED of clean pages: no root needed; pages
still mapped elsewhere stay, so "cold-ish"); warm runs follow a run that read them.
"""
import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time

SIZES = {  # Llama-2 shapes (configs/ has the same)
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32),
    "13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
                num_key_value_heads=40),
}


def files_of(d):
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".safetensors"))


def make(d, size):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    if os.path.exists(os.path.join(d, "model.safetensors.index.json")):
        print(f"{d}: exists, kept", file=sys.stderr)
        return
    os.makedirs(d, exist_ok=True)
    cfg = LlamaConfig(vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      **SIZES[size])
    t0 = time.time()
    torch.manual_seed(0)
    with torch.device("cuda"):
        torch.set_default_dtype(torch.bfloat16)
        model = LlamaForCausalLM(cfg)
        torch.set_default_dtype(torch.float32)
    with torch.no_grad():
        for p in model.parameters():  # random, scaled like a trained model
            if p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
            else:
                p.normal_(1.0, 0.1)
    model.save_pretrained(d, max_shard_size="5GB", safe_serialization=True)
    del model
    torch.cuda.empty_cache()
    total = sum(os.path.getsize(f) for f in files_of(d))
    print(f"{d}: {total / 1e9:.2f} GB in {len(files_of(d))} shards, written in {time.time() - t0:.1f} s",
          file=sys.stderr)


def evict(d):
    os.sync()
    for f in files_of(d):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def peak_rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def hf(d):
    import torch
    from transformers import AutoModelForCausalLM
    torch.cuda.init()
    torch.zeros(1, device="cuda")  # CUDA context outside the timing, as fdpp's is inside (conservative for us)
    t0 = time.time()
    try:
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float16, device_map="cuda")
    except TypeError:
        m = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float16, device_map="cuda")
    torch.cuda.synchronize()
    s = time.time() - t0
    print(json.dumps({"seconds": s, "peak_rss_bytes": peak_rss(), "params": sum(p.numel() for p in m.parameters())}))


def timed(cmd, **kw):
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    return time.time() - t0, r


def run_cat(d):
    s, r = timed(["bash", "-c", "cat \"$@\" > /dev/null", "cat"] + files_of(d))
    return {"seconds": s}


def run_fdpp(d, fdpp, out):
    cmd = [fdpp, "logits", "--model", d, "--token-ids", "1,2,3", "--out", out, "--device", "cuda"]
    s, r = timed(cmd)
    if r.returncode != 0:
        return {"error": r.stderr.strip()[-400:], "seconds": s}
    row = {"seconds": s}
    m = re.search(r"load: ([\d.]+) s \((\w+)\), peak RSS ([\d.]+) GiB(?:, weights ([\d.]+) GB in ([\d.]+) s)?", r.stderr)
    if m:
        row.update(load_seconds=float(m.group(1)), path=m.group(2), peak_rss_gib=float(m.group(3)))
        if m.group(5):
            row.update(weights_seconds=float(m.group(5)))
    else:
        row["stderr"] = r.stderr[-400:]
    return row


def run_hf(d):
    s, r = timed([sys.executable, os.path.abspath(__file__), "hf", d])
    if r.returncode != 0:
        return {"error": r.stderr.strip()[-400:], "seconds": s}
    row = json.loads(r.stdout.strip().splitlines()[-1])
    return {"seconds": s, "load_seconds": row["seconds"], "peak_rss_gib": row["peak_rss_bytes"] / 2**30}


def run(d, fdpp, label):
    size = sum(os.path.getsize(f) for f in files_of(d))
    rows = []

    def add(what, temp, row):
        row.update(model=label, what=what, cache=temp, gb=size / 1e9)
        rows.append(row)
        print(json.dumps(row), flush=True)

    evict(d)
    add("cat", "cold", run_cat(d))
    add("cat", "warm", run_cat(d))
    evict(d)
    add("fdpp", "cold", run_fdpp(d, fdpp, "/tmp/load_bench_logits.npy"))
    add("fdpp", "warm", run_fdpp(d, fdpp, "/tmp/load_bench_logits.npy"))
    add("fdpp", "warm", run_fdpp(d, fdpp, "/tmp/load_bench_logits.npy"))
    evict(d)
    add("transformers", "cold", run_hf(d))
    add("transformers", "warm", run_hf(d))

    warm_cat = min(r["seconds"] for r in rows if r["what"] == "cat" and r["cache"] == "warm")
    print(f"\n{label}: {size / 1e9:.2f} GB in {len(files_of(d))} shards")
    print(f"{'what':14} {'cache':5} {'wall s':>8} {'load s':>8} {'weights s':>9} {'GB/s':>6} {'x cat':>6} {'peak RSS GiB':>12}")
    for r in rows:
        load = r.get("load_seconds", r["seconds"])
        w = r.get("weights_seconds")
        basis = w if w else load
        rss = f"{r['peak_rss_gib']:.2f}" if "peak_rss_gib" in r else "-"
        ws = f"{w:.2f}" if w else "-"
        print(f"{r['what']:14} {r['cache']:5} {r['seconds']:8.2f} {load:8.2f} {ws:>9} "
              f"{size / 1e9 / basis:6.2f} {basis / warm_cat:6.2f} {rss:>12}"
              + (f"  ERROR {r['error']}" if "error" in r else ""))
    print("x cat: the load (fdpp: its weight streaming; transformers: from_pretrained) over the warm cat time. "
          "Goal: fdpp warm <= 1.3, below transformers; peak RSS <= ~1 GiB (pread: no file pages are mapped)")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("make"); a.add_argument("dir"); a.add_argument("--size", default="7b", choices=SIZES)
    a = sub.add_parser("evict"); a.add_argument("dir")
    a = sub.add_parser("hf"); a.add_argument("dir")
    a = sub.add_parser("run"); a.add_argument("dir"); a.add_argument("--fdpp", required=True); a.add_argument("--label", default="")
    args = ap.parse_args()
    if args.cmd == "make": make(args.dir, args.size)
    elif args.cmd == "evict": evict(args.dir)
    elif args.cmd == "hf": hf(args.dir)
    else: run(args.dir, args.fdpp, args.label or os.path.basename(args.dir.rstrip("/")))


if __name__ == "__main__":
    main()
