#!/usr/bin/env python3
"""A full-size Hugging Face checkpoint with random weights, for measurements on a machine with no
internet: a preset config (configs/*.json), random fp16/bf16 weights written by transformers as
sharded safetensors, and a tokenizer directory's files copied beside them (so the checkpoint can
generate text, e.g. tests/fixtures/hf/tokenizers/spm_llama, Llama 2's 32000-token vocabulary).

With --awq GROUP the layers' projections are written as an AutoAWQ gemm checkpoint instead
(4-bit, that group size, random integers, zero points and fp16 scales; quantization_config as
AutoAWQ writes it): the GPU's 4-bit loader and kernels on a full-size file.

usage: make_random_hf_model.py CONFIG.json OUT_DIR [--tokenizer DIR] [--dtype bf16] [--shard 5GB]
                               [--awq 128]
"""
import argparse
import json
import shutil
import time
from pathlib import Path

import torch


PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def save_awq(model, cfg, out: Path, group: int) -> None:
    """The model's state with each layer projection X.weight [out, in] replaced by AWQ gemm's
    X.qweight I32 [in, out / 8], X.qzeros I32 [in / group, out / 8] and X.scales F16 [in / group, out]."""
    from safetensors.torch import save_file
    out.mkdir(parents=True, exist_ok=True)
    state, shard, shards, size = {}, {}, [], 0
    gen = torch.Generator(device="cpu").manual_seed(0)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and getattr(cfg, "tie_word_embeddings", False):
            continue  # the embeddings' own tensor (safetensors stores no shared tensors)
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        if module is not None and module.split(".")[-1] in PROJECTIONS:
            rows, cols = t.shape
            words = lambda r, c: torch.randint(-2**31, 2**31 - 1, (r, c), dtype=torch.int32, generator=gen)
            shard[module + ".qweight"] = words(cols, rows // 8)
            shard[module + ".qzeros"] = words(cols // group, rows // 8)
            # (q - z) spans -15..15: scales near 1 / (15 sqrt(in)) keep the activations in range.
            shard[module + ".scales"] = (torch.rand(cols // group, rows, generator=gen) * 0.5 + 0.75).div(
                15 * cols ** 0.5).to(torch.float16)
        else:
            shard[name] = t.detach().to("cpu").contiguous()
        size = sum(v.numel() * v.element_size() for v in shard.values())
        if size > 4 << 30:
            shards.append(shard)
            shard = {}
    shards.append(shard)
    index = {}
    for i, sh in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(sh, out / fname, metadata={"format": "pt"})
        index.update({k: fname for k in sh})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    c = cfg.to_dict()
    c["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
                                "version": "gemm", "modules_to_not_convert": None}
    c["torch_dtype"] = "float16"
    (out / "config.json").write_text(json.dumps(c, indent=2))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("out")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16"])
    ap.add_argument("--shard", default="5GB")
    ap.add_argument("--awq", type=int, default=0, help="write an AWQ gemm checkpoint with this group size")
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
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        except TypeError:  # transformers before 4.56 names it torch_dtype
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)
    if a.awq:
        save_awq(model, cfg, out, a.awq)
    else:
        model.save_pretrained(out, safe_serialization=True, max_shard_size=a.shard)
    if a.tokenizer:
        for f in Path(a.tokenizer).iterdir():
            if f.name != "reference.json":
                shutil.copy(f, out / f.name)
    size = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    print(json.dumps({"dir": str(out), "bytes": size, "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
