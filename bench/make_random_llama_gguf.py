#!/usr/bin/env python3
"""Writes a llama-architecture GGUF with random weights in the real Llama-2-7B shapes (32 layers,
hidden 4096, FFN 11008, 32 heads, vocab 32000) or Llama-3-8B's (--shape llama3-8b: FFN 14336, 8 KV
heads, vocab 128256): a stand-in for a downloaded 7B/8B file when measuring CPU speed and memory
(fdpp bench --device cpu, llama-bench, /usr/bin/time -v).

--mix q4_k (the default, as before): matrices Q4_K, output.weight Q6_K. --mix q4_k_m: llama.cpp's
Q4_K_M choice for llama models: attn_v and ffn_down Q6_K in the first and last eighth of the layers
and every third layer between, the rest Q4_K, output Q6_K. --mix q4_0: Q4_0 matrices, output Q6_K
(llama.cpp's Q4_0). --mix q8_0: everything Q8_0. Norms are F32. Blocks are
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
    elif qtype == Q.Q4_0:
        # x = d * (q - 8), q uniform in 0..15: std ~4.6 d.
        raw[:, 0:2] = np.frombuffer(np.float16(4e-3).tobytes(), dtype=np.uint8)
    elif qtype == Q.Q8_0:
        # x = d * q, q uniform in -128..127: std ~74 d.
        raw[:, 0:2] = np.frombuffer(np.float16(2.5e-4).tobytes(), dtype=np.uint8)
    else:
        raise ValueError(qtype)
    return raw.reshape(rows, cols // block_elems * block_bytes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--shape", choices=["llama2-7b", "llama3-8b"], default="llama2-7b")
    ap.add_argument("--mix", choices=["q4_k", "q4_k_m", "q4_0", "q8_0"], default="q4_k")
    a = ap.parse_args()

    if a.shape == "llama2-7b":
        hidden, ffn, heads, kv_heads, vocab, ctx, rope_base = 4096, 11008, 32, 32, 32000, 4096, 10000.0
    else:
        hidden, ffn, heads, kv_heads, vocab, ctx, rope_base = 4096, 14336, 32, 8, 128256, 8192, 500000.0
    kv_dim = hidden // heads * kv_heads
    base = {"q4_k": Q.Q4_K, "q4_k_m": Q.Q4_K, "q4_0": Q.Q4_0, "q8_0": Q.Q8_0}[a.mix]
    out_type = Q.Q8_0 if a.mix == "q8_0" else Q.Q6_K
    file_type = {"q4_k": gguf.LlamaFileType.MOSTLY_Q4_K_M, "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M,
                 "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[a.mix]

    def more_bits(i):  # llama.cpp's use_more_bits for Q4_K_M's attn_v / ffn_down
        n = a.layers
        return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

    def vd_type(i):
        return Q.Q6_K if a.mix == "q4_k_m" and more_bits(i) else base
    rng = np.random.default_rng(a.seed)
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(f"random-{a.shape}-shape")
    w.add_context_length(ctx)
    w.add_embedding_length(hidden)
    w.add_block_count(a.layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(rope_base)
    w.add_file_type(file_type)

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
    specs = [("token_embd.weight", vocab, hidden, base)]
    for i in range(a.layers):
        p = f"blk.{i}."
        specs += [
            (p + "attn_norm.weight", hidden, None, None),
            (p + "attn_q.weight", hidden, hidden, base),
            (p + "attn_k.weight", kv_dim, hidden, base),
            (p + "attn_v.weight", kv_dim, hidden, vd_type(i)),
            (p + "attn_output.weight", hidden, hidden, base),
            (p + "ffn_norm.weight", hidden, None, None),
            (p + "ffn_gate.weight", ffn, hidden, base),
            (p + "ffn_up.weight", ffn, hidden, base),
            (p + "ffn_down.weight", hidden, ffn, vd_type(i)),
        ]
    specs += [("output_norm.weight", hidden, None, None), ("output.weight", vocab, hidden, out_type)]

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
