#!/usr/bin/env python3
"""Reference side of tests/hf_checkpoint_test.cpp: Hugging Face checkpoint directories, computed
without kvevict.

  hf_reference.py logits DIR IDS              last-token logits of a float64 NumPy forward pass
                                               over DIR's safetensors (HF layout, rotate-half RoPE),
                                               ids comma-separated; prints JSON {"logits": [...]}
  hf_reference.py greedy DIR IDS N             N greedy tokens after IDS (same forward pass)
  hf_reference.py tokenize DIR STRINGS OUT     the `tokenizers` package on DIR/tokenizer.json:
                                               for every string of the JSON list STRINGS, ids with
                                               and without special tokens added, and with special
                                               tokens not parsed (encode_special_tokens)
  hf_reference.py retype DIR OUT DTYPE         copy of checkpoint DIR with 2-D weights stored as
                                               DTYPE (F16 or BF16), in two shards + index
  hf_reference.py convert GGUF OUT             a Hugging Face checkpoint made from a tiny-random
                                               GGUF (read here by the GGUF spec): config.json, weights
                                               (llama Q/K rows un-permuted back to rotate-half
                                               order), tokenizer.json + tokenizer_config.json
                                               built from the GGUF vocabulary

Sources: transformers' modelling code for Llama / Qwen2 / Qwen3 / Phi3 (RMSNorm, rotate_half,
GQA repeat_kv, SwiGLU; llama3 and longrope frequencies from modeling_rope_utils); the
safetensors format (header parsed here with json + struct, F16/BF16 decoded by bit patterns);
llama.cpp's convert_hf_to_gguf.py for the GGUF <-> HF names and LlamaModel.permute;
transformers' SentencePieceExtractor for the merges of a SentencePiece vocabulary.
"""
import json
import math
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_reference import encode, save  # noqa: E402


# ---------------------------------------------------------------- safetensors, read by hand
def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    base = 8 + n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        buf = raw[base + b: base + e]
        shape = info["shape"]
        dt = info["dtype"]
        if dt == "F32":
            a = np.frombuffer(buf, dtype="<f4")
        elif dt == "F16":
            a = np.frombuffer(buf, dtype="<f2")
        elif dt == "BF16":
            a = (np.frombuffer(buf, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{path}: {name} has dtype {dt}")
        out[name] = a.astype(np.float64).reshape(shape)
    return out


def load_dir(d):
    cfg = json.load(open(os.path.join(d, "config.json")))
    idx = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(idx))["weight_map"].values())) if os.path.exists(idx) else ["model.safetensors"]
    w = {}
    for f in files:
        w.update(read_safetensors(os.path.join(d, f)))
    return cfg, w


# ---------------------------------------------------------------- forward pass (transformers' math)
def inv_freq(cfg, head_dim):
    rot = int(head_dim * cfg.get("partial_rotary_factor", 1.0))
    theta = cfg.get("rope_theta", 10000.0)
    inv = 1.0 / theta ** (np.arange(0, rot, 2, dtype=np.float64) / rot)
    rs = cfg.get("rope_scaling") or {}
    t = rs.get("rope_type", rs.get("type", "default"))
    if t == "linear":
        inv = inv / rs["factor"]
    elif t == "llama3":  # modeling_rope_utils._compute_llama3_parameters
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv / factor + smooth * inv
        inv = np.where(wavelen > old / low, inv / factor, np.where(wavelen < old / high, inv, smoothed))
    elif t not in ("default",):
        raise SystemExit(f"rope type {t} not in this reference")
    return inv, rot


def rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rotate(x, pos, inv, rot):
    # x: [T, H, D]; rotate_half on the first `rot` dims
    ang = pos[:, None] * inv[None, :]                      # [T, rot/2]
    cos = np.concatenate([np.cos(ang)] * 2, -1)[:, None, :]
    sin = np.concatenate([np.sin(ang)] * 2, -1)[:, None, :]
    xr, xp = x[..., :rot], x[..., rot:]
    h = rot // 2
    rh = np.concatenate([-xr[..., h:], xr[..., :h]], -1)
    return np.concatenate([xr * cos + rh * sin, xp], -1)


def forward(cfg, w, ids):
    mt = cfg.get("model_type")
    H, KV = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    D = cfg.get("head_dim") or cfg["hidden_size"] // H
    eps = cfg.get("rms_norm_eps", 1e-6)
    emb = w.get("model.embed_tokens.weight", w.get("lm_head.weight"))
    head = w.get("lm_head.weight", emb) if not cfg.get("tie_word_embeddings", False) else emb
    x = emb[np.array(ids)]
    T = len(ids)
    pos = np.arange(T, dtype=np.float64)
    inv, rot = inv_freq(cfg, D)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = rms(x, w[p + "input_layernorm.weight"], eps)
        if mt == "phi3":
            qkv = h @ w[p + "self_attn.qkv_proj.weight"].T
            q, k, v = np.split(qkv, [H * D, H * D + KV * D], -1)
        else:
            q = h @ w[p + "self_attn.q_proj.weight"].T
            k = h @ w[p + "self_attn.k_proj.weight"].T
            v = h @ w[p + "self_attn.v_proj.weight"].T
            if p + "self_attn.q_proj.bias" in w:
                q, k, v = q + w[p + "self_attn.q_proj.bias"], k + w[p + "self_attn.k_proj.bias"], v + w[p + "self_attn.v_proj.bias"]
        q, k, v = q.reshape(T, H, D), k.reshape(T, KV, D), v.reshape(T, KV, D)
        if mt == "qwen3":
            q = rms(q, w[p + "self_attn.q_norm.weight"], eps)
            k = rms(k, w[p + "self_attn.k_norm.weight"], eps)
        q, k = rotate(q, pos, inv, rot), rotate(k, pos, inv, rot)
        k, v = np.repeat(k, H // KV, axis=1), np.repeat(v, H // KV, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / math.sqrt(D) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, H * D)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"], eps)
        if mt == "phi3":
            gate, up = np.split(h @ w[p + "mlp.gate_up_proj.weight"].T, 2, -1)
        else:
            gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"], eps)
    return x @ head.T


# ---------------------------------------------------------------- tokenizers package
def tokenize(d, strings_path, out_path):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    strings = json.load(open(strings_path))
    res = []
    for s in strings:
        tok.encode_special_tokens = False
        a = tok.encode(s, add_special_tokens=True).ids
        b = tok.encode(s, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        c = tok.encode(s, add_special_tokens=False).ids
        res.append({"text": s, "ids_add_special": a, "ids": b, "ids_no_parse_special": c})
    json.dump(res, open(out_path, "w"), ensure_ascii=False)


# ---------------------------------------------------------------- writing checkpoints
def write_weights(out, tensors, dtype_of, shards=1):
    names = list(tensors)
    if shards == 1:
        save({n: encode(tensors[n], dtype_of(n, tensors[n])) for n in names}, os.path.join(out, "model.safetensors"),
             {"format": "pt"})
        return
    per = (len(names) + shards - 1) // shards
    wm = {}
    for s in range(shards):
        fn = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s * per:(s + 1) * per]
        save({n: encode(tensors[n], dtype_of(n, tensors[n])) for n in part}, os.path.join(out, fn), {"format": "pt"})
        wm.update({n: fn for n in part})
    json.dump({"metadata": {}, "weight_map": wm}, open(os.path.join(out, "model.safetensors.index.json"), "w"), indent=1)


def copy_small_files(src, out, skip=()):
    for f in os.listdir(src):
        if f.endswith(".json") and f not in skip and not f.startswith("model.safetensors"):
            with open(os.path.join(src, f), "rb") as a, open(os.path.join(out, f), "wb") as b:
                b.write(a.read())


def retype(d, out, dtype):
    os.makedirs(out, exist_ok=True)
    _, w = load_dir(d)
    copy_small_files(d, out)
    write_weights(out, w, lambda n, a: dtype if a.ndim == 2 else "F32", shards=2)


# ---------------------------------------------------------------- GGUF -> HF
def read_gguf(path):
    """GGUF v2/v3 by the spec (ggml docs/gguf.md), enough for the tiny-random files: every
    metadata value, F32/F16 tensors as NumPy arrays in row-major [rows, cols] order."""
    raw = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, raw, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = raw[pos:pos + n].decode("utf-8")
        pos += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            if et in scalar and et != 7:
                nonlocal pos
                dt = np.dtype("<" + scalar[et])
                a = np.frombuffer(raw, dtype=dt, count=n, offset=pos)
                pos += n * dt.itemsize
                return a.tolist()
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert raw[:4] == b"GGUF" and take("4s") == b"GGUF" and take("I") in (2, 3)
    n_t, n_kv = take("Q"), take("Q")
    kv = {}
    for _ in range(n_kv):
        k = string()
        kv[k] = value(take("I"))
    infos = []
    for _ in range(n_t):
        name = string()
        dims = [take("Q") for _ in range(take("I"))]
        infos.append((name, dims, take("I"), take("Q")))
    align = kv.get("general.alignment", 32)
    data = (pos + align - 1) // align * align
    tensors = {}
    for name, dims, ty, off in infos:
        dt = {0: np.float32, 1: np.float16}[ty]
        n = int(np.prod(dims))
        tensors[name] = np.frombuffer(raw, dtype=dt, count=n, offset=data + off).reshape(dims[::-1])
    return kv, tensors


def convert(gguf_path, out):
    kv, t = read_gguf(gguf_path)

    def val(k, default=None):
        return kv.get(k, default)

    arch = val("general.architecture")
    a = arch + "."
    H, KV = val(a + "attention.head_count"), val(a + "attention.head_count_kv")
    n_embd = val(a + "embedding_length")
    D = val(a + "attention.key_length", n_embd // H)
    L = val(a + "block_count")
    tied = "output.weight" not in t
    cfg = {
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                           "phi3": "Phi3ForCausalLM"}[arch]],
        "model_type": arch, "hidden_size": n_embd, "num_hidden_layers": L, "num_attention_heads": H,
        "num_key_value_heads": KV, "intermediate_size": val(a + "feed_forward_length"),
        "max_position_embeddings": val(a + "context_length"), "rms_norm_eps": float(val(a + "attention.layer_norm_rms_epsilon")),
        "rope_theta": float(val(a + "rope.freq_base", 10000.0)), "vocab_size": t["token_embd.weight"].shape[0],
        "tie_word_embeddings": tied, "hidden_act": "silu", "torch_dtype": "float16",
    }
    if arch == "qwen3":
        cfg["head_dim"] = D
    if arch == "qwen2":
        cfg.update({"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": L})
    if arch == "phi3":
        cfg["sliding_window"] = val(a + "attention.sliding_window")
        cfg["original_max_position_embeddings"] = val(a + "rope.scaling.original_context_length", cfg["max_position_embeddings"])
        cfg["partial_rotary_factor"] = val(a + "rope.dimension_count", D) / D
    if "rope_freqs.weight" in t:
        # The tiny-random llama3 file: Llama-3.1 scaling constants (README-families.md); check
        # they give the file's factors before writing them as rope_scaling.
        rs = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
        cfg["rope_scaling"] = rs
        inv, _ = inv_freq(cfg, D)
        plain = 1.0 / cfg["rope_theta"] ** (np.arange(0, D, 2) / D)
        if not np.allclose(plain / inv, t["rope_freqs.weight"], rtol=1e-5):
            raise SystemExit("rope_freqs.weight does not match llama3 scaling (8, 1, 4, 8192)")
    hf = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
          "output.weight": "lm_head.weight"}
    blk = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
           "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
           "attn_v.weight": "self_attn.v_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
           "attn_k.bias": "self_attn.k_proj.bias", "attn_v.bias": "self_attn.v_proj.bias",
           "attn_output.weight": "self_attn.o_proj.weight", "attn_qkv.weight": "self_attn.qkv_proj.weight",
           "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
           "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
           "ffn_up.weight": "mlp.gate_up_proj.weight" if arch == "phi3" else "mlp.up_proj.weight"}

    def unpermute(w, n_head):
        # inverse of convert_hf_to_gguf.py LlamaModel.permute
        return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    out_t = {}
    for name, data in t.items():
        if name == "rope_freqs.weight":
            continue
        if name.startswith("blk."):
            _, l, rest = name.split(".", 2)
            hn = f"model.layers.{l}." + blk[rest]
            if arch == "llama" and rest == "attn_q.weight":
                data = unpermute(data, H)
            if arch == "llama" and rest == "attn_k.weight":
                data = unpermute(data, KV)
        else:
            hn = hf[name]
        out_t[hn] = data
    os.makedirs(out, exist_ok=True)
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"), indent=1)
    write_weights(out, out_t, lambda n, a: "F16" if a.dtype == np.float16 else "F32",
                  shards=2 if arch == "qwen2" else 1)
    write_tokenizer(val, out)


def write_tokenizer(val, out):
    """tokenizer.json (+ tokenizer_config.json) from the GGUF vocabulary, as transformers'
    converters lay them out (Qwen2/Llama-3: byte-level BPE with a Split regex; Phi-3:
    SentencePiece-style BPE with byte fallback, merges by SentencePieceExtractor)."""
    model = val("tokenizer.ggml.model")
    tokens = list(val("tokenizer.ggml.tokens"))
    types = list(val("tokenizer.ggml.token_type"))
    bos, eos = val("tokenizer.ggml.bos_token_id"), val("tokenizer.ggml.eos_token_id")
    add_bos = bool(val("tokenizer.ggml.add_bos_token", model == "llama"))
    added, vocab = [], {}
    for i, (p, ty) in enumerate(zip(tokens, types)):
        if ty == 5:  # UNUSED padding ([PAD<id>]) is not part of the tokenizer
            continue
        if ty in (3, 4) or (model == "llama" and ty == 2):
            special = ty != 4
            rstrip = model == "llama" and ty == 3 and p not in ("<unk>", "<s>", "<|endoftext|>")
            added.append({"id": i, "content": p, "single_word": False, "lstrip": False, "rstrip": rstrip,
                          "normalized": False, "special": special})
        vocab[p] = i
    tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added}
    if model == "gpt2":
        pre = val("tokenizer.ggml.pre")
        regex = {"qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
                 "llama3": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"}
        kind = "llama3" if pre in ("llama-bpe", "llama3") else "qwen2"
        tj["normalizer"] = {"type": "NFC"} if kind == "qwen2" else None
        tj["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex[kind]}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
        tj["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
        merges = list(val("tokenizer.ggml.merges"))
        tj["model"] = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                       "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                       "ignore_merges": kind == "llama3", "vocab": vocab, "merges": merges}
    else:
        scores = list(val("tokenizer.ggml.scores"))
        # transformers SentencePieceExtractor.extract(vocab_scores): every split of a piece into two
        # pieces is a merge, ordered by the piece's score (highest first), ties by the parts' ids.
        merges = []
        for piece, i in vocab.items():
            if types[i] != 1:
                continue
            local = [(piece[:k], piece[k:], scores[i]) for k in range(1, len(piece))
                     if piece[:k] in vocab and piece[k:] in vocab]
            merges.extend(sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]])))
        merges.sort(key=lambda x: x[2], reverse=True)
        tj["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                                {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
        tj["pre_tokenizer"] = None
        tj["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
        tj["model"] = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                       "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                       "vocab": vocab, "merges": [f"{a} {b}" for a, b, _ in merges]}
    if add_bos:
        bt = tokens[bos]
        tj["post_processor"] = {"type": "TemplateProcessing",
                                "single": [{"SpecialToken": {"id": bt, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                                "pair": [{"SpecialToken": {"id": bt, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                         {"Sequence": {"id": "B", "type_id": 1}}],
                                "special_tokens": {bt: {"id": bt, "ids": [bos], "tokens": [bt]}}}
    else:
        tj["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False} \
            if model == "gpt2" else None
    json.dump(tj, open(os.path.join(out, "tokenizer.json"), "w"), ensure_ascii=False)
    tc = {"bos_token": tokens[bos] if add_bos else None, "eos_token": tokens[eos],
          "chat_template": val("tokenizer.chat_template")}
    json.dump(tc, open(os.path.join(out, "tokenizer_config.json"), "w"), ensure_ascii=False, indent=1)


def main():
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "logits" and len(sys.argv) == 4:
        cfg, w = load_dir(sys.argv[2])
        ids = [int(x) for x in sys.argv[3].split(",")]
        print(json.dumps({"logits": forward(cfg, w, ids)[-1].tolist()}))
    elif cmd == "greedy" and len(sys.argv) == 5:
        cfg, w = load_dir(sys.argv[2])
        ids = [int(x) for x in sys.argv[3].split(",")]
        gen = []
        for _ in range(int(sys.argv[4])):
            nxt = int(np.argmax(forward(cfg, w, ids + gen)[-1]))
            gen.append(nxt)
        print(json.dumps({"greedy": gen}))
    elif cmd == "tokenize" and len(sys.argv) == 5:
        tokenize(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "retype" and len(sys.argv) == 5:
        retype(sys.argv[2], sys.argv[3], sys.argv[4])
    elif cmd == "convert" and len(sys.argv) == 4:
        convert(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
