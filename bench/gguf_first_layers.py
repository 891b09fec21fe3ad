#!/usr/bin/env python3
"""A GGUF model's first N layers, small enough to carry to the GPU machine (whose calls take 64 MiB),
for measurements that need a real model's activations on real text: the unified max's fallback
rate in prefill attention (issue 41) and the like. Layers 0 .. N-1 compute exactly what they
compute in the whole model; the final norm and the output head stay. With --keep-tokens-of, every
token embedding row that the given texts do not use is zeroed (its blocks then compress to almost
nothing): the model's outputs for those texts are unchanged, except that the head of a tied model
gives the zeroed tokens logit 0.

    python3 bench/gguf_first_layers.py MODEL.gguf --layers 10 -o first10.gguf \
        --keep-tokens-of prompt1.txt prompt2.txt --fdpp build/fdpp

Needs the gguf package (pip install gguf); --keep-tokens-of runs `fdpp tokenize --json` for the
token ids, so that the tokenizer is the engine's own.
"""
import argparse
import json
import subprocess
import sys

import numpy as np

try:
    import gguf
except ImportError:
    sys.exit("gguf_first_layers: needs the gguf package (pip install gguf)")


def token_ids(fdpp, model, paths):
    ids = set()
    for p in paths:
        with open(p, encoding="utf-8") as f:
            text = f.read()
        r = subprocess.run([fdpp, "tokenize", "-m", model, "-p", "-", "--json"], input=text, capture_output=True,
                           text=True)
        if r.returncode != 0:
            sys.exit(f"gguf_first_layers: fdpp tokenize {p}: {r.stderr.strip()}")
        ids.update(json.loads(r.stdout)["token_ids"])
    return ids


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--layers", type=int, required=True, help="layers kept (the first N)")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--keep-tokens-of", nargs="*", default=[], help="texts whose tokens keep their embeddings")
    ap.add_argument("--fdpp", default="build/fdpp", help="the fdpp binary (for tokenize)")
    a = ap.parse_args()

    reader = gguf.GGUFReader(a.model)
    arch = reader.fields["general.architecture"].contents()
    count_key = f"{arch}.block_count"
    blocks = reader.fields[count_key].contents()
    if not 1 <= a.layers <= blocks:
        sys.exit(f"gguf_first_layers: --layers {a.layers} must be in 1..{blocks}")
    keep = token_ids(a.fdpp, a.model, a.keep_tokens_of) if a.keep_tokens_of else None

    def kept(name):
        if not name.startswith("blk."):
            return True
        return int(name.split(".")[1]) < a.layers

    writer = gguf.GGUFWriter(a.output, arch=arch, endianess=reader.endianess)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = a.layers if field.name == count_key else field.contents()
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, kind, sub_type=sub)
    tensors = [t for t in reader.tensors if kept(t.name)]
    for t in tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in tensors:
        data = t.data
        if keep is not None and t.name == "token_embd.weight":
            # One row per token (quantized rows are whole blocks): zero the rows of unused tokens.
            data = np.array(data)
            unused = np.ones(data.shape[0], dtype=bool)
            unused[sorted(i for i in keep if i < data.shape[0])] = False
            data[unused] = 0
        writer.write_tensor_data(data, tensor_endianess=reader.endianess)
    writer.close()
    print(f"{a.output}: layers 0..{a.layers - 1} of {blocks}, {len(tensors)} tensors"
          + (f", {len(keep)} token embeddings kept" if keep is not None else ""))


if __name__ == "__main__":
    main()
