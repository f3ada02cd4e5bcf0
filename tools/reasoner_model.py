"""The small llama-architecture decoder kvevict ships, and its character vocabulary.

Shared by tools/train_reasoner.py and tools/export_gguf.py. The layout matches what kvevict's
GGUF loader expects (src/model/loader.cpp): RMSNorm, RoPE in the GGUF adjacent-pair layout
(pairs x[2i], x[2i+1] rotated by pos * theta^(-2i/d), applied directly, so Q/K rows need no
permutation on export), grouped-query attention, SwiGLU feed-forward, tied input/output
embeddings (no output.weight tensor).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------------------------------------
# Vocabulary: llama SPM layout. 0 <unk>, 1 <s>, 2 </s>, 3..258 the byte-fallback tokens <0xNN>,
# then one token per character of the task alphabet (tasks/generator.h). Space is stored as
# U+2581 like every SPM vocabulary, so plain text with spaces still tokenizes.
UNK, BOS, EOS = 0, 1, 2
# The first 53 characters are the vocabulary of the 2-layer models (models/reasoner-small/,
# models/reasoner-kv/: 312 tokens); the last four came with the recall / revisit families (316).
CHARS = (list("ABCDEFGHIJKLMNOPQRSTUVWXYZ") + list("0123456789")
         + ["\n", ">", "+", "=", "#", "?", "$", "@", "\\", "b", "o", "x", "e", "d", "{", "}", "\u2581"]
         + ["%", "^", "&", "!"])
TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL, TOKEN_TYPE_BYTE = 1, 2, 3, 6


def vocab_pieces():
    """(pieces, token_types) of the whole vocabulary, in id order."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + CHARS
    types = ([TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_CONTROL, TOKEN_TYPE_CONTROL] + [TOKEN_TYPE_BYTE] * 256
             + [TOKEN_TYPE_NORMAL] * len(CHARS))
    return pieces, types


PIECES, TYPES = vocab_pieces()
CHAR_ID = {c: 259 + i for i, c in enumerate(CHARS)}
CHAR_ID[" "] = CHAR_ID["\u2581"]
VOCAB_SIZE = len(PIECES)


def vocab_for(vocab_size):
    """(pieces, types) of the first `vocab_size` tokens (an older model's vocabulary is a prefix)."""
    if vocab_size > len(PIECES):
        raise ValueError(f"vocabulary of {vocab_size} tokens is larger than this code's {len(PIECES)}")
    return PIECES[:vocab_size], TYPES[:vocab_size]


def encode(text):
    """Token ids of `text` (no BOS). Every character of the task alphabet is one token; this is
    exactly what kvevict's SPM tokenizer produces for this vocabulary with add_space_prefix=false
    (no multi-character pieces exist, so no merges happen). Raises KeyError on other characters."""
    return [CHAR_ID[c] for c in text]


def decode(ids):
    out = []
    for i in ids:
        if i >= 259:
            p = PIECES[i]
            out.append(" " if p == "\u2581" else p)
    return "".join(out)


# ---------------------------------------------------------------------------------------------
class Config:
    def __init__(self, dim=128, n_layers=3, n_heads=4, n_kv_heads=2, hidden_dim=384, context_length=2048,
                 rope_theta=10000.0, rms_eps=1e-5, vocab_size=VOCAB_SIZE, head_dim=None):
        """head_dim: size of each query/key/value head; default dim // n_heads. Another value makes
        the attention width n_heads * head_dim differ from dim (GGUF attention.key_length, as
        Qwen3 does)."""
        self.dim, self.n_layers, self.n_heads, self.n_kv_heads = dim, n_layers, n_heads, n_kv_heads
        self.hidden_dim, self.context_length, self.rope_theta, self.rms_eps = hidden_dim, context_length, rope_theta, rms_eps
        self.vocab_size = vocab_size
        self.head_dim = head_dim or dim // n_heads

    def to_dict(self):
        return dict(self.__dict__)

    @staticmethod
    def from_dict(d):
        return Config(**dict(d))


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(head_dim, length, theta):
    """cos, sin of shape [length, head_dim/2] for pair i at position p: p * theta^(-2i/d)."""
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    ang = torch.arange(length, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    """x: [B, H, T, D]; rotates adjacent pairs (x[2i], x[2i+1]) (GGUF / llama.cpp 'normal' mode)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    r0 = x0 * cos - x1 * sin
    r1 = x0 * sin + x1 * cos
    return torch.stack((r0, r1), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.attn_norm = RMSNorm(c.dim, c.rms_eps)
        self.wq = nn.Linear(c.dim, c.n_heads * c.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * c.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * c.head_dim, c.dim, bias=False)
        self.ffn_norm = RMSNorm(c.dim, c.rms_eps)
        self.w_gate = nn.Linear(c.dim, c.hidden_dim, bias=False)
        self.w_up = nn.Linear(c.dim, c.hidden_dim, bias=False)
        self.w_down = nn.Linear(c.hidden_dim, c.dim, bias=False)

    def forward(self, x, cos, sin, mask, attn_out=None):
        """attn_out: optional list; the attention probabilities [B, n_heads, T, T] are appended."""
        c = self.c
        B, T, _ = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(B, T, c.n_heads, c.head_dim).transpose(1, 2)
        k = self.wk(h).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        v = self.wv(h).view(B, T, c.n_kv_heads, c.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        group = c.n_heads // c.n_kv_heads
        # GQA: query heads [g*group, (g+1)*group) share KV head g.
        q = q.view(B, c.n_kv_heads, group, T, c.head_dim)
        att = torch.matmul(q, k.unsqueeze(2).transpose(-1, -2)) / math.sqrt(c.head_dim)
        att = att + mask
        att = torch.softmax(att, dim=-1)
        if attn_out is not None:
            attn_out.append(att.reshape(B, c.n_heads, T, T).detach())
        o = torch.matmul(att, v.unsqueeze(2)).reshape(B, c.n_heads, T, c.head_dim)
        o = o.transpose(1, 2).reshape(B, T, c.n_heads * c.head_dim)
        x = x + self.wo(o)
        h = self.ffn_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class Reasoner(nn.Module):
    def __init__(self, c, shared_embed=0.0):
        """shared_embed: initial value of embedding dimension 0 for every token (0 = plain init).
        A component shared by all tokens lets attention form position-only (e.g. previous-token)
        patterns from the start, which the lookup's induction circuit needs."""
        super().__init__()
        self.c = c
        self.tok = nn.Embedding(c.vocab_size, c.dim)
        self.blocks = nn.ModuleList([Block(c) for _ in range(c.n_layers)])
        self.norm = RMSNorm(c.dim, c.rms_eps)
        cos, sin = rope_tables(c.head_dim, c.context_length, c.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        nn.init.normal_(self.tok.weight, std=0.02)
        if shared_embed:
            with torch.no_grad():
                self.tok.weight[:, 0] = shared_embed
        for b in self.blocks:
            for lin in (b.wq, b.wk, b.wv, b.w_gate, b.w_up):
                nn.init.normal_(lin.weight, std=0.02)
            for lin in (b.wo, b.w_down):
                nn.init.normal_(lin.weight, std=0.02 / math.sqrt(2 * c.n_layers))

    def forward(self, ids, hide=None, attn_out=None):
        """ids: [B, T] -> logits [B, T, vocab]. Causal; right padding needs no extra mask.
        hide: optional bool [B, T, T], True where query position i must not see key position j
        (on top of causality; used by tools/ablate_prompt.py). attn_out: optional list that gets
        each layer's attention probabilities [B, n_heads, T, T] (query head h uses KV head
        h // (n_heads / n_kv_heads)); tools/head_similarity.py reads them."""
        B, T = ids.shape
        x = self.tok(ids)
        cos, sin = self.cos[:T], self.sin[:T]
        mask = torch.full((T, T), float("-inf"), device=ids.device).triu(1)
        if hide is not None:
            mask = mask.expand(B, T, T).masked_fill(hide, float("-inf"))[:, None, None]
        for b in self.blocks:
            x = b(x, cos, sin, mask, attn_out)
        return F.linear(self.norm(x), self.tok.weight)


# ---------------------------------------------------------------------------------------------
GGUF_NAMES = {"attn_norm": "attn_norm.weight", "attn_q": "wq.weight", "attn_k": "wk.weight", "attn_v": "wv.weight",
              "attn_output": "wo.weight", "ffn_norm": "ffn_norm.weight", "ffn_gate": "w_gate.weight",
              "ffn_up": "w_up.weight", "ffn_down": "w_down.weight"}


def convert_kv_heads(ck, n_kv_heads):
    """Returns a copy of checkpoint `ck` ({"config": dict, "model": state dict}, as load_gguf or a
    final.pt) with `n_kv_heads` KV heads instead of its own, by the standard multi-head -> grouped
    conversion (Ainslie et al. 2023, "GQA: Training Generalized Multi-Query Transformer Models from
    Multi-Head Checkpoints", section 2.1: a new KV head's key and value projections are the mean of
    the old heads it replaces; the converted model is then uptrained).
    - Fewer KV heads (n_old a multiple of n_kv_heads): new head j = mean of old heads
      [j*f, (j+1)*f), f = n_old / n_kv_heads. Query head h keeps its group: it used old head
      h // (n_heads / n_old), which lies in that range. Changes the function (e.g. 2 -> 1 = MQA).
    - More KV heads (n_kv_heads a multiple of n_old, at most n_heads): new head j = a copy of old
      head j // (n_kv_heads / n_old), the one query heads of new group j used, so the model computes
      exactly the same function at step 0 (e.g. 2 -> 4 = MHA for 4 query heads).
    Only attn_k / attn_v (wk, wv: [n_kv_heads * head_dim, dim], one row block per head) change.
    Raises ValueError naming both counts when they do not divide or n_kv_heads does not divide
    the query heads."""
    c = Config.from_dict(ck["config"])
    old = c.n_kv_heads
    if n_kv_heads < 1 or c.n_heads % n_kv_heads != 0 or (old % n_kv_heads != 0 and n_kv_heads % old != 0):
        raise ValueError(f"cannot convert {old} KV heads to {n_kv_heads} with {c.n_heads} query heads "
                         "(one count must divide the other, and the new count must divide the query heads)")
    sd = {k: v.clone() for k, v in ck["model"].items()}
    for layer in range(c.n_layers):
        for name in ("wk", "wv"):
            key = f"blocks.{layer}.{name}.weight"
            w = sd[key].view(old, c.head_dim, c.dim)
            if n_kv_heads <= old:
                w = w.view(n_kv_heads, old // n_kv_heads, c.head_dim, c.dim).mean(dim=1)
            else:
                w = w.repeat_interleave(n_kv_heads // old, dim=0)
            sd[key] = w.reshape(n_kv_heads * c.head_dim, c.dim).contiguous()
    cfg = ck["config"] if isinstance(ck["config"], dict) else c.to_dict()
    cfg = dict(cfg)
    cfg["n_kv_heads"] = n_kv_heads
    return {"config": Config.from_dict(cfg).to_dict(), "model": sd}


def load_gguf(path):
    """Reads a GGUF written by tools/export_gguf.py back into {"config": dict, "model": state dict}
    (the format of a train_reasoner.py final.pt), with the `gguf` Python package. Only F32 tensors
    and the llama keys export_gguf.py writes; raises ValueError naming the file and key otherwise.
    Lets `train_reasoner.py --init models/reasoner/reasoner.gguf` fine-tune the shipped weights."""
    import gguf
    import numpy as np

    r = gguf.GGUFReader(path)

    def field(key):
        f = r.fields.get(key)
        if f is None:
            raise ValueError(f"{path}: missing key {key}")
        return f.parts[f.data[0]][0].item()

    n_vocab = len(r.fields["tokenizer.ggml.tokens"].data)
    key_length = field("llama.attention.key_length") if "llama.attention.key_length" in r.fields else None
    c = Config(dim=field("llama.embedding_length"), n_layers=field("llama.block_count"),
               n_heads=field("llama.attention.head_count"), n_kv_heads=field("llama.attention.head_count_kv"),
               hidden_dim=field("llama.feed_forward_length"), context_length=field("llama.context_length"),
               rope_theta=float(f'{field("llama.rope.freq_base"):.7g}'),
               rms_eps=float(f'{field("llama.attention.layer_norm_rms_epsilon"):.7g}'),  # float32 -> 1e-05
               vocab_size=n_vocab, head_dim=key_length)
    tensors = {}
    for t in r.tensors:
        if t.tensor_type != gguf.GGMLQuantizationType.F32:
            raise ValueError(f"{path}: tensor {t.name} is {t.tensor_type.name}, only F32 is supported")
        shape = [int(d) for d in reversed(t.shape.tolist())]  # GGUF ne[0] is the innermost
        tensors[t.name] = torch.from_numpy(np.array(t.data, dtype=np.float32).reshape(shape))
    sd = {"tok.weight": tensors["token_embd.weight"], "norm.weight": tensors["output_norm.weight"]}
    for layer in range(c.n_layers):
        for gg, pt in GGUF_NAMES.items():
            key = f"blk.{layer}.{gg}.weight"
            if key not in tensors:
                raise ValueError(f"{path}: missing tensor {key}")
            sd[f"blocks.{layer}.{pt}"] = tensors[key]
    return {"config": c.to_dict(), "model": sd}


def load_weights(path):
    """{"config": dict, "model": state dict} from a GGUF (load_gguf) or a train_reasoner.py
    checkpoint (final.pt / ckpt.pt / stageN.pt, read onto the CPU whatever device wrote it)."""
    if path.endswith(".gguf"):
        return load_gguf(path)
    return torch.load(path, map_location="cpu", weights_only=False)


def load_reasoner(path):
    """The Reasoner of load_weights(path), in eval mode (its config: model.c)."""
    ck = load_weights(path)
    model = Reasoner(Config.from_dict(ck["config"]))
    model.load_state_dict(ck["model"])
    model.eval()
    return model
