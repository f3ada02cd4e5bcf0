#!/usr/bin/env python3
"""Writes fuzz/corpus/safetensors/tiny-llama.safetensors: the weights of the tiny llama that
fuzz_safetensors.cpp's config.json describes (hidden 8, 1 layer, 2 heads, FFN 16, vocabulary 8,
tied embeddings) in Hugging Face names, F32 with two tensors in F16 and BF16, written by the PyPI
`safetensors` package, so the fuzzer starts from a file that passes the reader and the loader.
Usage: make_safetensors_seed.py OUT"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from safetensors_reference import encode, save  # noqa: E402

rng = np.random.default_rng(0)


def t(*shape):
    return (rng.standard_normal(shape) * 0.1).astype(np.float32)


w = {"model.embed_tokens.weight": t(8, 8), "model.norm.weight": t(8),
     "model.layers.0.input_layernorm.weight": t(8), "model.layers.0.post_attention_layernorm.weight": t(8),
     "model.layers.0.self_attn.q_proj.weight": t(8, 8), "model.layers.0.self_attn.k_proj.weight": t(8, 8),
     "model.layers.0.self_attn.v_proj.weight": t(8, 8), "model.layers.0.self_attn.o_proj.weight": t(8, 8),
     "model.layers.0.mlp.gate_proj.weight": t(16, 8), "model.layers.0.mlp.up_proj.weight": t(16, 8),
     "model.layers.0.mlp.down_proj.weight": t(8, 16)}
dtype = {"model.layers.0.mlp.up_proj.weight": "F16", "model.layers.0.mlp.down_proj.weight": "BF16"}
save({n: encode(a, dtype.get(n, "F32")) for n, a in w.items()}, sys.argv[1], {"format": "pt"})
