#!/usr/bin/env python3
"""Writes a llama-architecture GGUF with random weights in the real Llama-2-7B shapes (32 layers,
hidden 4096, FFN 11008, 32 heads, vocab 32000): a stand-in for a downloaded 7B Q4_K_M file when
measuring CPU speed and memory (fdpp bench --device cpu, llama-bench, /usr/bin/time -v).

Matrices are Q4_K, output.weight Q6_K (as llama.cpp's Q4_K_M keeps it), norms F32. Blocks are
random bytes with their fp16 scales set to values that give weights of about N(0, 0.02)-sized
magnitude, so activations stay finite through 32 layers. The vocabulary is a SentencePiece-style
("llama") list of 32000 placeholder tokens with the 256 byte tokens, enough for both engines to
load it. Needs the gguf and numpy packages:

    python3 -m venv .venv && .venv/bin/pip install gguf numpy
    .venv/bin/python bench/make_random_llama_gguf.py /tmp/llama7b-random-q4_k.gguf [--layers 32]

Tensors are streamed to the file one at a time (about 100 MB of memory, not 3.8 GB).
"""
import argparse

import numpy as np
import gguf

Q = gguf.GGMLQuantizationType


def random_blocks(rng, qtype, rows, cols):
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    nb = rows * cols // block_elems
    raw = np.frombuffer(rng.bytes(nb * block_bytes), dtype=np.uint8).reshape(nb, block_bytes).copy()
    if qtype == Q.Q4_K:
        # x = d * sc * q - dmin * m with sc, m in 0..63 and q in 0..15: dmin = 7.5 d centres it.
        d = np.float16(1e-4)
        raw[:, 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
        raw[:, 2:4] = np.frombuffer(np.float16(7.5e-4).tobytes(), dtype=np.uint8)
    elif qtype == Q.Q6_K:
        # x = d * sc * (q - 32) with sc a random int8.
        raw[:, 208:210] = np.frombuffer(np.float16(2e-5).tobytes(), dtype=np.uint8)
    else:
        raise ValueError(qtype)
    return raw.reshape(rows, cols // block_elems * block_bytes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()

    hidden, ffn, heads, vocab, ctx = 4096, 11008, 32, 32000, 4096
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name("random-llama-2-7b-shape")
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)

    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    tokens += [f"\u2581t{i}" for i in range(vocab - len(tokens))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256 + [gguf.TokenType.NORMAL] * (vocab - 259)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(vocab)])
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    # (name, rows, cols, type); rows = out features. None type: F32 vector.
    specs = [("token_embd.weight", vocab, hidden, Q.Q4_K)]
    for i in range(a.layers):
        p = f"blk.{i}."
        specs += [
            (p + "attn_norm.weight", hidden, None, None),
            (p + "attn_q.weight", hidden, hidden, Q.Q4_K),
            (p + "attn_k.weight", hidden, hidden, Q.Q4_K),
            (p + "attn_v.weight", hidden, hidden, Q.Q4_K),
            (p + "attn_output.weight", hidden, hidden, Q.Q4_K),
            (p + "ffn_norm.weight", hidden, None, None),
            (p + "ffn_gate.weight", ffn, hidden, Q.Q4_K),
            (p + "ffn_up.weight", ffn, hidden, Q.Q4_K),
            (p + "ffn_down.weight", hidden, ffn, Q.Q4_K),
        ]
    specs += [("output_norm.weight", hidden, None, None), ("output.weight", vocab, hidden, Q.Q6_K)]

    for name, rows, cols, qtype in specs:
        if qtype is None:
            w.add_tensor_info(name, [rows], np.dtype(np.float32), rows * 4)
        else:
            be, bb = gguf.GGML_QUANT_SIZES[qtype]
            w.add_tensor_info(name, [rows, cols // be * bb], np.dtype(np.uint8), rows * cols // be * bb, qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, rows, cols, qtype in specs:
        if qtype is None:
            w.write_tensor_data(np.ones(rows, dtype=np.float32))
        else:
            w.write_tensor_data(random_blocks(rng, qtype, rows, cols))
    w.close()


if __name__ == "__main__":
    main()
