#include "model/llama.h"

#include <fmt/format.h>

#include <cmath>

#include "util/error.h"

namespace kvevict {
namespace {

WeightMatrix matrix(const GgufFile& f, const std::string& name, int64_t rows, int64_t cols) {
  const GgufTensor& t = f.tensor(name);
  if (t.dims.size() != 2 || t.dims[0] != cols || t.dims[1] != rows)
    throw Error(fmt::format("{}: tensor '{}' has shape [{}], expected [{}, {}] (GGUF order: cols, rows)",
                            f.path(), name, fmt::join(t.dims, ", "), cols, rows));
  WeightMatrix m;
  m.type = t.ggml_type();
  m.data = t.data;
  m.rows = rows;
  m.cols = cols;
  m.row_bytes = ggml_row_bytes(m.type, cols);
  return m;
}

std::vector<float> vector_f32(const GgufFile& f, const std::string& name, int64_t n) {
  const GgufTensor& t = f.tensor(name);
  if (t.n_elements() != n)
    throw Error(fmt::format("{}: tensor '{}' has {} elements, expected {}", f.path(), name,
                            t.n_elements(), n));
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(t.ggml_type(), t.data, out.data(), n);
  return out;
}

int positive(const GgufFile& f, const std::string& key) {
  const uint64_t v = f.get_uint(key);
  if (v == 0 || v > (1u << 30))
    throw Error(fmt::format("{}: key '{}' = {} is out of range (1 .. 2^30)", f.path(), key, v));
  return static_cast<int>(v);
}

}  // namespace

std::unique_ptr<LlamaModel> LlamaModel::load(const std::string& path) {
  std::unique_ptr<LlamaModel> m(new LlamaModel(GgufFile::open(path)));
  const GgufFile& f = m->file_;
  const std::string arch = f.get_string("general.architecture");
  if (arch != "llama")
    throw Error(fmt::format("{}: general.architecture = '{}' is not supported (supported: llama)",
                            path, arch));
  LlamaConfig& c = m->config_;
  c.dim = positive(f, "llama.embedding_length");
  c.n_layers = positive(f, "llama.block_count");
  c.n_heads = positive(f, "llama.attention.head_count");
  c.n_kv_heads = f.has("llama.attention.head_count_kv") ? positive(f, "llama.attention.head_count_kv")
                                                        : c.n_heads;
  c.hidden_dim = positive(f, "llama.feed_forward_length");
  c.context_length = positive(f, "llama.context_length");
  c.rms_eps = static_cast<float>(f.get_float("llama.attention.layer_norm_rms_epsilon"));
  c.rope_theta = static_cast<float>(f.get_float_or("llama.rope.freq_base", 10000.0));
  if (!(std::isfinite(c.rms_eps) && c.rms_eps > 0.0f && c.rms_eps < 1.0f))
    throw Error(fmt::format("{}: llama.attention.layer_norm_rms_epsilon = {} must be a finite value in (0, 1)",
                            path, c.rms_eps));
  if (!(std::isfinite(c.rope_theta) && c.rope_theta > 1.0f))
    throw Error(fmt::format("{}: llama.rope.freq_base = {} must be a finite value > 1", path, c.rope_theta));
  if (c.dim % c.n_heads != 0 || c.n_heads % c.n_kv_heads != 0)
    throw Error(fmt::format("{}: inconsistent heads: embedding_length {} / head_count {} / "
                            "head_count_kv {} (need dim % heads == 0 and heads % kv_heads == 0)",
                            path, c.dim, c.n_heads, c.n_kv_heads));
  c.head_dim = c.dim / c.n_heads;
  if (c.head_dim % 2 != 0)
    throw Error(fmt::format("{}: head dimension {} is odd; RoPE needs pairs", path, c.head_dim));
  const uint64_t rope_dims = f.get_uint_or("llama.rope.dimension_count", c.head_dim);
  if (rope_dims != static_cast<uint64_t>(c.head_dim))
    throw Error(fmt::format("{}: llama.rope.dimension_count = {} but head dimension is {}; partial "
                            "RoPE is not supported", path, rope_dims, c.head_dim));

  m->tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(f));
  c.n_vocab = m->tokenizer_->n_vocab();

  const int64_t q_dim = int64_t{c.n_heads} * c.head_dim, kv_dim = int64_t{c.n_kv_heads} * c.head_dim;
  m->token_embd_ = matrix(f, "token_embd.weight", c.n_vocab, c.dim);
  m->output_norm_ = vector_f32(f, "output_norm.weight", c.dim);
  m->tied_output_ = f.find_tensor("output.weight") == nullptr;
  m->output_ = m->tied_output_ ? m->token_embd_ : matrix(f, "output.weight", c.n_vocab, c.dim);
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    LlamaLayer L;
    L.attn_norm = vector_f32(f, p + "attn_norm.weight", c.dim);
    L.wq = matrix(f, p + "attn_q.weight", q_dim, c.dim);
    L.wk = matrix(f, p + "attn_k.weight", kv_dim, c.dim);
    L.wv = matrix(f, p + "attn_v.weight", kv_dim, c.dim);
    L.wo = matrix(f, p + "attn_output.weight", c.dim, q_dim);
    L.ffn_norm = vector_f32(f, p + "ffn_norm.weight", c.dim);
    L.w_gate = matrix(f, p + "ffn_gate.weight", c.hidden_dim, c.dim);
    L.w_up = matrix(f, p + "ffn_up.weight", c.hidden_dim, c.dim);
    L.w_down = matrix(f, p + "ffn_down.weight", c.dim, c.hidden_dim);
    m->layers_.push_back(std::move(L));
  }
  int64_t bytes = 0;
  for (const GgufTensor& t : f.tensors()) bytes += t.n_bytes;
  m->weight_bytes_ = bytes;
  return m;
}

}  // namespace kvevict
