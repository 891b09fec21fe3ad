#!/usr/bin/env python3
"""A full-size Hugging Face checkpoint with random weights, for measurements on a machine with no
internet: a preset config (configs/*.json), random fp16/bf16 weights written by transformers as
sharded safetensors, and a tokenizer directory's files copied beside them (so the checkpoint can
generate text, e.g. tests/fixtures/hf/tokenizers/spm_llama, Llama 2's 32000-token vocabulary).

usage: make_random_hf_model.py CONFIG.json OUT_DIR [--tokenizer DIR] [--dtype bf16] [--shard 5GB]
"""
import argparse
import json
import shutil
import time
from pathlib import Path

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--shard", default="5GB")
    a = ap.parse_args()
    from transformers import AutoConfig, AutoModelForCausalLM
    out = Path(a.out)
    if (out / "config.json").exists():
        print(f"{out}: exists, kept")
        return
    t0 = time.time()
    cfg = AutoConfig.from_pretrained(a.config)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    model.save_pretrained(out, safe_serialization=True, max_shard_size=a.shard)
    if a.tokenizer:
        for f in Path(a.tokenizer).iterdir():
            if f.name != "reference.json":
                shutil.copy(f, out / f.name)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(json.dumps({"dir": str(out), "bytes": size, "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
