#!/usr/bin/env python3
"""Writes fuzz/corpus/gguf/tiny-llama.gguf: a 1-layer llama (dim 8, 2 heads, FFN 16, vocab 8,
SPM vocabulary) with fixed small weights, written by llama.cpp's `gguf` Python package, so the
GGUF fuzzer starts from a file that passes the reader and the model loader. Usage: make_gguf_seed.py OUT"""
import sys

import numpy as np
import gguf

out = sys.argv[1]
w = gguf.GGUFWriter(out, "llama")
w.add_context_length(64)
w.add_embedding_length(8)
w.add_block_count(1)
w.add_feed_forward_length(16)
w.add_head_count(2)
w.add_head_count_kv(2)
w.add_layer_norm_rms_eps(1e-5)
w.add_rope_dimension_count(4)
w.add_tokenizer_model("llama")
w.add_token_list(["<unk>", "<s>", "</s>", "\u2581a", "\u2581b", "a", "b", "<0x0A>"])
w.add_token_scores([0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, 0.0])
w.add_token_types([2, 3, 3, 1, 1, 1, 1, 6])
w.add_bos_token_id(1)
w.add_eos_token_id(2)
rng = np.random.default_rng(0)


def t(name, *shape):
    w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))


t("token_embd.weight", 8, 8)
w.add_tensor("blk.0.attn_norm.weight", np.ones(8, dtype=np.float32))
for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
    t(f"blk.0.{n}.weight", 8, 8)
w.add_tensor("blk.0.ffn_norm.weight", np.ones(8, dtype=np.float32))
t("blk.0.ffn_gate.weight", 16, 8)
t("blk.0.ffn_up.weight", 16, 8)
t("blk.0.ffn_down.weight", 8, 16)
w.add_tensor("output_norm.weight", np.ones(8, dtype=np.float32))
t("output.weight", 8, 8)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
