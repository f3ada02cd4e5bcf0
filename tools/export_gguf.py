#!/usr/bin/python3
"""Exports a tools/train_reasoner.py checkpoint as a GGUF file kvevict loads.

Usage:
    /usr/bin/python3 tools/export_gguf.py /work/reasoner-run/final.pt models/reasoner/reasoner.gguf

Writes GGUF version 3 by hand (little-endian; spec: ggml's docs/gguf.md): header, metadata
key/values, tensor infos, then the tensor data, each tensor aligned to 32 bytes. All tensors are
F32. Architecture `llama`; RoPE in the adjacent-pair layout the model was trained with, so Q/K
rows are written unpermuted. Embeddings are tied: no `output.weight` tensor. Tokenizer: SPM
(`tokenizer.ggml.model` = "llama") with one token per character, the 256 byte-fallback tokens,
and add_space_prefix = false. Head counts (query and KV heads, e.g. the 1/2/4-KV-head variants in
models/reasoner-kv/) come from the checkpoint's config.
"""

import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reasoner_model import BOS, EOS, UNK, Config, vocab_for  # noqa: E402

T_UINT32, T_INT32, T_FLOAT32, T_BOOL, T_STRING, T_ARRAY = 4, 5, 6, 7, 8, 9
GGML_F32 = 0
ALIGN = 32


def s(text):
    b = text.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv(key, vtype, value):
    out = s(key) + struct.pack("<I", vtype)
    if vtype == T_UINT32:
        out += struct.pack("<I", value)
    elif vtype == T_INT32:
        out += struct.pack("<i", value)
    elif vtype == T_FLOAT32:
        out += struct.pack("<f", value)
    elif vtype == T_BOOL:
        out += struct.pack("<B", 1 if value else 0)
    elif vtype == T_STRING:
        out += s(value)
    else:
        raise ValueError(vtype)
    return out


def kv_array(key, etype, values):
    out = s(key) + struct.pack("<I", T_ARRAY) + struct.pack("<IQ", etype, len(values))
    for v in values:
        if etype == T_STRING:
            out += s(v)
        elif etype == T_FLOAT32:
            out += struct.pack("<f", v)
        elif etype == T_INT32:
            out += struct.pack("<i", v)
    return out


def export(ckpt_path, out_path, name="kvevict-reasoner"):
    ck = torch.load(ckpt_path, map_location="cpu")
    c = Config.from_dict(ck["config"])
    sd = ck["model"]
    pieces, types = vocab_for(c.vocab_size)
    if tuple(sd["tok.weight"].shape) != (c.vocab_size, c.dim):
        raise ValueError(f"{ckpt_path}: token_embd is {tuple(sd['tok.weight'].shape)}, config says "
                         f"({c.vocab_size}, {c.dim})")
    meta = [
        kv("general.architecture", T_STRING, "llama"),
        kv("general.name", T_STRING, name),
        kv("general.alignment", T_UINT32, ALIGN),
        kv("llama.context_length", T_UINT32, c.context_length),
        kv("llama.embedding_length", T_UINT32, c.dim),
        kv("llama.block_count", T_UINT32, c.n_layers),
        kv("llama.feed_forward_length", T_UINT32, c.hidden_dim),
        kv("llama.attention.head_count", T_UINT32, c.n_heads),
        kv("llama.attention.head_count_kv", T_UINT32, c.n_kv_heads),
        kv("llama.rope.dimension_count", T_UINT32, c.head_dim),
    ] + ([kv("llama.attention.key_length", T_UINT32, c.head_dim), kv("llama.attention.value_length", T_UINT32, c.head_dim)]
         if c.head_dim * c.n_heads != c.dim else []) + [
        kv("llama.rope.freq_base", T_FLOAT32, c.rope_theta),
        kv("llama.attention.layer_norm_rms_epsilon", T_FLOAT32, c.rms_eps),
        kv("llama.vocab_size", T_UINT32, len(pieces)),
        kv("tokenizer.ggml.model", T_STRING, "llama"),
        kv_array("tokenizer.ggml.tokens", T_STRING, pieces),
        kv_array("tokenizer.ggml.scores", T_FLOAT32, [0.0] * len(pieces)),
        kv_array("tokenizer.ggml.token_type", T_INT32, types),
        kv("tokenizer.ggml.bos_token_id", T_UINT32, BOS),
        kv("tokenizer.ggml.eos_token_id", T_UINT32, EOS),
        kv("tokenizer.ggml.unknown_token_id", T_UINT32, UNK),
        kv("tokenizer.ggml.add_bos_token", T_BOOL, True),
        kv("tokenizer.ggml.add_space_prefix", T_BOOL, False),
    ]
    tensors = [("token_embd.weight", sd["tok.weight"]), ("output_norm.weight", sd["norm.weight"])]
    names = {"attn_norm": "attn_norm.weight", "attn_q": "wq.weight", "attn_k": "wk.weight", "attn_v": "wv.weight",
             "attn_output": "wo.weight", "ffn_norm": "ffn_norm.weight", "ffn_gate": "w_gate.weight",
             "ffn_up": "w_up.weight", "ffn_down": "w_down.weight"}
    for layer in range(c.n_layers):
        for gg, pt in names.items():
            tensors.append((f"blk.{layer}.{gg}.weight", sd[f"blocks.{layer}.{pt}"]))

    infos, blobs, offset = b"", [], 0
    for tname, t in tensors:
        a = t.detach().float().contiguous().numpy().astype("<f4")
        dims = list(reversed(a.shape))  # GGUF: ne[0] = innermost (columns)
        infos += s(tname) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", GGML_F32, offset)
        raw = a.tobytes()
        pad = (-len(raw)) % ALIGN
        blobs.append(raw + b"\0" * pad)
        offset += len(raw) + pad
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    head = header + b"".join(meta) + infos
    head += b"\0" * ((-len(head)) % ALIGN)
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    with open(out_path, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b)
    print(f"wrote {out_path}: {len(tensors)} tensors, {os.path.getsize(out_path)} bytes")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: export_gguf.py CHECKPOINT.pt OUT.gguf")
    export(sys.argv[1], sys.argv[2])
