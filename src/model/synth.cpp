#include "model/synth.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "format/gguf_writer.h"
#include "model/arch.h"
#include "util/error.h"
#include "util/rng.h"

namespace kvevict {
namespace {

const std::vector<SynthShape>& shapes() {
  static const std::vector<SynthShape> list = {
      {"smollm2-135m", 49152, 576, 30, 9, 3, 1536, 8192, 100000.0f, 1e-5f, true},
      {"smollm2-360m", 49152, 960, 32, 15, 5, 2560, 8192, 100000.0f, 1e-5f, true},
      {"tinyllama-1.1b", 32000, 2048, 22, 32, 4, 5632, 2048, 10000.0f, 1e-5f, false},
      {"tiny", 320, 64, 2, 4, 2, 128, 4096, 10000.0f, 1e-5f, false},
      {"qwen3-0.6b", 151936, 1024, 28, 16, 8, 3072, 40960, 1000000.0f, 1e-6f, true, "qwen3", 128},
      {"r1-distill-qwen-1.5b", 151936, 1536, 28, 12, 2, 8960, 131072, 10000.0f, 1e-6f, false, "qwen2"},
      {"phi3-mini-4k", 32064, 3072, 32, 32, 32, 8192, 4096, 10000.0f, 1e-5f, false, "phi3"},
      {"tiny-qwen2", 320, 64, 2, 4, 2, 128, 4096, 10000.0f, 1e-6f, true, "qwen2"},
      {"tiny-qwen3", 320, 64, 2, 4, 2, 128, 4096, 1000000.0f, 1e-6f, true, "qwen3", 32},
      {"tiny-phi3", 320, 64, 2, 4, 2, 128, 4096, 10000.0f, 1e-5f, false, "phi3", 0, 12},
  };
  return list;
}

// Fills a [rows, cols] matrix of `type` with uniform(-a, a) values, one RNG stream per row.
GgufWriter::Fill random_matrix(GgmlType type, int64_t rows, int64_t cols, uint64_t seed, uint64_t tensor) {
  return [=](uint8_t* dst, int64_t n_bytes) {
    const int64_t row_bytes = ggml_row_bytes(type, cols);
    if (row_bytes * rows != n_bytes) throw Error("synth: tensor size mismatch");
    const float a = std::sqrt(3.0f / static_cast<float>(cols));
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      Rng rng(stream_id({seed, tensor, static_cast<uint64_t>(r)}));
      for (float& v : row) v = static_cast<float>((2.0 * rng.uniform() - 1.0) * a);
      quantize_row(type, row.data(), dst + r * row_bytes, cols);
    }
  };
}

// F32 vector uniform in ±a (biases).
GgufWriter::Fill random_vector(int64_t n, float a, uint64_t seed, uint64_t tensor) {
  return [=](uint8_t* dst, int64_t n_bytes) {
    if (n_bytes != n * 4) throw Error("synth: bias size mismatch");
    Rng rng(stream_id({seed, tensor, 0}));
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>((2.0 * rng.uniform() - 1.0) * a);
      std::memcpy(dst + 4 * i, &v, 4);
    }
  };
}

GgufWriter::Fill ones(int64_t n) {
  return [n](uint8_t* dst, int64_t n_bytes) {
    if (n_bytes != n * 4) throw Error("synth: norm size mismatch");
    const float one = 1.0f;
    for (int64_t i = 0; i < n; ++i) std::memcpy(dst + 4 * i, &one, 4);
  };
}

}  // namespace

int64_t SynthShape::n_params() const {
  const ArchInfo& a = arch_info(arch, fmt::format("synth shape '{}'", name));
  const int64_t hd = head_dim_or_default(), qd = int64_t{n_heads} * hd, kvd = int64_t{n_kv_heads} * hd;
  int64_t per_layer = 2 * int64_t{dim} + qd * dim * 2 + kvd * dim * 2 + 3 * int64_t{hidden_dim} * dim;
  if (a.qkv_bias == TensorUse::Required) per_layer += qd + 2 * kvd;  // written only when required
  if (a.qk_norm) per_layer += 2 * hd;
  return int64_t{n_vocab} * dim * (tied_embeddings ? 1 : 2) + dim + per_layer * n_layers;
}

std::vector<std::string> synth_shape_names() {
  std::vector<std::string> out;
  for (const SynthShape& s : shapes()) out.push_back(s.name);
  return out;
}

SynthShape synth_shape(const std::string& name) {
  std::string known;
  for (const SynthShape& s : shapes()) {
    if (s.name == name) return s;
    known += (known.empty() ? "" : ", ") + s.name;
  }
  throw Error(fmt::format("unknown model shape '{}' (known: {})", name, known));
}

std::string synth_default_shape(const std::string& arch) {
  for (const ArchInfo& a : architectures())
    if (a.name == arch && !a.synth_shape.empty()) return a.synth_shape;
  throw Error(
      fmt::format("unknown architecture '{}' for synthetic models ({})", arch,
                  fmt::join(architectures_where([](const ArchInfo& a) { return !a.synth_shape.empty(); }), ", ")));
}

GgmlType parse_synth_type(const std::string& name) {
  for (uint32_t id = 0; id < 64; ++id)
    if (ggml_type_supported(id) && ggml_type_name(id) == name) return static_cast<GgmlType>(id);
  throw Error(fmt::format("weight type '{}' is not supported for synthetic models ({}, or the mixes q4_k_m, q5_k_m)",
                          name, ggml_supported_type_names()));
}

SynthTypes parse_synth_types(const std::string& name) {
  SynthTypes t;
  t.name = name;
  if (name == "q4_k_m" || name == "q5_k_m") {
    t.base = name == "q4_k_m" ? GgmlType::Q4_K : GgmlType::Q5_K;
    t.k_m = true;
  } else {
    t.base = parse_synth_type(name);
  }
  return t;
}

namespace {
// llama.cpp's use_more_bits(i, n): the layers a _M mix promotes.
bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// llama.cpp's fallback for a K-quant whose rows are not whole super-blocks.
GgmlType k_fallback(GgmlType t) {
  switch (t) {
    case GgmlType::Q4_K:
      return GgmlType::Q5_0;
    case GgmlType::Q5_K:
      return GgmlType::Q5_1;
    case GgmlType::Q6_K:
      return GgmlType::Q8_0;
    case GgmlType::Q2_K:
    case GgmlType::Q3_K:
      return GgmlType::Q4_0;
    default:
      return t;
  }
}
}  // namespace

GgmlType SynthTypes::tensor_type(const std::string& tensor, int layer, int n_layers, int64_t cols, bool tied) const {
  GgmlType t = base;
  if (k_m) {
    const bool output = tensor == "output" || (tied && tensor == "token_embd");
    if (output ||
        ((tensor == "attn_v" || tensor == "attn_qkv" || tensor == "ffn_down") && layer >= 0 &&
         use_more_bits(layer, n_layers)))
      t = GgmlType::Q6_K;
  }
  if (ggml_is_k_quant(t) && cols % 256 != 0) t = k_fallback(t);
  return t;
}

uint32_t SynthTypes::file_type() const {
  if (k_m) return base == GgmlType::Q4_K ? 15 : 17;  // LLAMA_FTYPE_MOSTLY_Q4_K_M / Q5_K_M
  switch (base) {
    case GgmlType::F32:
      return 0;
    case GgmlType::F16:
      return 1;
    case GgmlType::Q4_0:
      return 2;
    case GgmlType::Q4_1:
      return 3;
    case GgmlType::Q8_0:
      return 7;
    case GgmlType::Q5_0:
      return 8;
    case GgmlType::Q5_1:
      return 9;
    case GgmlType::Q2_K:
      return 10;
    case GgmlType::Q3_K:
      return 11;  // Q3_K_S
    case GgmlType::Q4_K:
      return 14;  // Q4_K_S
    case GgmlType::Q5_K:
      return 16;  // Q5_K_S
    case GgmlType::Q6_K:
      return 18;
    case GgmlType::BF16:
      return 32;
  }
  return 0;
}

void synth_add_longrope(SynthShape& s) {
  if (!arch_info(s.arch, fmt::format("synth shape '{}'", s.name)).longrope)
    throw Error(fmt::format("synth shape '{}': LongRoPE factors are a {} feature (architecture is '{}')", s.name,
                            fmt::join(architectures_where([](const ArchInfo& a) { return a.longrope; }), " / "),
                            s.arch));
  const int hd = s.head_dim_or_default(), n_rot = s.n_rot > 0 ? s.n_rot : hd, R = n_rot / 2;
  const double scale = 32.0;
  s.original_context_length = s.context_length;
  s.context_length = static_cast<int>(scale * s.context_length);
  s.rope_factors_short.resize(static_cast<size_t>(R));
  s.rope_factors_long.resize(static_cast<size_t>(R));
  for (int i = 0; i < R; ++i) {
    const double u = R > 1 ? static_cast<double>(i) / (R - 1) : 0.0;
    s.rope_factors_short[static_cast<size_t>(i)] = static_cast<float>(1.0 + 0.1 * u);
    s.rope_factors_long[static_cast<size_t>(i)] = static_cast<float>(std::pow(scale, u));
  }
  s.rope_attn_factor =
      static_cast<float>(std::sqrt(1.0 + std::log(scale) / std::log(static_cast<double>(s.original_context_length))));
}

void write_synth_gguf(const SynthShape& s, GgmlType type, uint64_t seed, const std::string& path) {
  write_synth_gguf(s, parse_synth_types(ggml_type_name(static_cast<uint32_t>(type))), seed, path);
}

void write_synth_gguf(const SynthShape& s, const SynthTypes& wtypes, uint64_t seed, const std::string& path) {
  if (s.n_heads <= 0 || s.n_kv_heads <= 0 || (s.head_dim <= 0 && s.dim % s.n_heads != 0) ||
      s.n_heads % s.n_kv_heads != 0)
    throw Error(
        fmt::format("synth shape '{}': need dim % heads == 0 (or a head_dim) and heads % kv_heads == 0", s.name));
  const ArchInfo& arch = arch_info(s.arch, fmt::format("synth shape '{}'", s.name));
  const int hd = s.head_dim_or_default(), n_rot = s.n_rot > 0 ? s.n_rot : hd;
  if (hd % 2 != 0 || n_rot % 2 != 0 || n_rot > hd)
    throw Error(
        fmt::format("synth shape '{}': head_dim {} and n_rot {} must be even, n_rot <= head_dim", s.name, hd, n_rot));
  // K-quants fall back per tensor (SynthTypes); every other block size must divide the rows.
  const int64_t blk = ggml_is_k_quant(wtypes.base) ? 32 : ggml_block_elems(wtypes.base);
  if (s.dim % blk != 0 || s.hidden_dim % blk != 0)
    throw Error(fmt::format("synth shape '{}': dim {} and FFN {} must be multiples of {} for {}", s.name, s.dim,
                            s.hidden_dim, blk, wtypes.name));
  if (s.n_vocab < 260)
    throw Error(fmt::format("synth shape '{}': vocabulary {} < 260 (specials, bytes, space)", s.name, s.n_vocab));
  const int64_t qd = int64_t{s.n_heads} * hd, kvd = int64_t{s.n_kv_heads} * hd;
  const std::string a = s.arch + ".";
  const bool longrope = !s.rope_factors_short.empty() || !s.rope_factors_long.empty();
  if (longrope && !arch.longrope)
    throw Error(fmt::format("synth shape '{}': LongRoPE factors are not part of architecture '{}'", s.name, s.arch));
  if (longrope &&
      (s.rope_factors_short.size() != static_cast<size_t>(n_rot / 2) ||
       s.rope_factors_long.size() != static_cast<size_t>(n_rot / 2)))
    throw Error(
        fmt::format("synth shape '{}': LongRoPE needs short and long factor sets of n_rot / 2 = {} (got {}, {})",
                    s.name, n_rot / 2, s.rope_factors_short.size(), s.rope_factors_long.size()));

  GgufWriter w;
  w.add_string("general.architecture", s.arch);
  w.add_string("general.name", fmt::format("kvevict synthetic {} ({}, seed {})", s.name, wtypes.name, seed));
  w.add_uint32("general.file_type", wtypes.file_type());
  w.add_uint32(a + "context_length", static_cast<uint32_t>(s.context_length));
  w.add_uint32(a + "embedding_length", static_cast<uint32_t>(s.dim));
  w.add_uint32(a + "block_count", static_cast<uint32_t>(s.n_layers));
  w.add_uint32(a + "feed_forward_length", static_cast<uint32_t>(s.hidden_dim));
  w.add_uint32(a + "attention.head_count", static_cast<uint32_t>(s.n_heads));
  w.add_uint32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_kv_heads));
  if (s.head_dim > 0) {
    w.add_uint32(a + "attention.key_length", static_cast<uint32_t>(hd));
    w.add_uint32(a + "attention.value_length", static_cast<uint32_t>(hd));
  }
  w.add_uint32(a + "rope.dimension_count", static_cast<uint32_t>(n_rot));
  w.add_float32(a + "rope.freq_base", s.rope_theta);
  if (s.original_context_length > 0)
    w.add_uint32(a + "rope.scaling.original_context_length", static_cast<uint32_t>(s.original_context_length));
  if (s.rope_attn_factor > 0.0f) w.add_float32(a + "rope.scaling.attn_factor", s.rope_attn_factor);
  w.add_float32(a + "attention.layer_norm_rms_epsilon", s.rms_eps);
  w.add_uint32(a + "vocab_size", static_cast<uint32_t>(s.n_vocab));

  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(fmt::format("<0x{:02X}>", b));
    types.push_back(6);
  }
  tokens.push_back("\xE2\x96\x81");  // U+2581, the SPM space, so spaces decode as spaces
  types.push_back(1);
  for (int i = static_cast<int>(tokens.size()); i < s.n_vocab; ++i) {
    tokens.push_back(fmt::format("<synth{}>", i));
    types.push_back(1);
  }
  std::vector<float> scores(tokens.size(), 0.0f);
  w.add_string("tokenizer.ggml.model", "llama");
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_float32_array("tokenizer.ggml.scores", scores);
  w.add_int32_array("tokenizer.ggml.token_type", types);
  w.add_uint32("tokenizer.ggml.unknown_token_id", 0);
  w.add_uint32("tokenizer.ggml.bos_token_id", 1);
  w.add_uint32("tokenizer.ggml.eos_token_id", 2);

  uint64_t tensor = 0;
  // name: "blk.<layer>.<kind>.weight" or "<kind>.weight"; the kind and layer pick the type.
  const auto matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    int layer = -1;
    std::string kind = name.substr(0, name.size() - 7);  // drop ".weight"
    if (kind.rfind("blk.", 0) == 0) {
      const size_t dot = kind.find('.', 4);
      layer = std::stoi(kind.substr(4, dot - 4));
      kind = kind.substr(dot + 1);
    }
    const GgmlType type = wtypes.tensor_type(kind, layer, s.n_layers, cols, s.tied_embeddings);
    w.add_tensor(name, {cols, rows}, type, random_matrix(type, rows, cols, seed, tensor++));
  };
  const auto bias = [&](const std::string& name, int64_t n) {
    w.add_tensor(name, {n}, GgmlType::F32, random_vector(n, 0.1f, seed, tensor++));
  };
  if (longrope) {
    const auto f32 = [&](const char* name, const std::vector<float>& v) {
      w.add_tensor(name, {static_cast<int64_t>(v.size())}, GgmlType::F32,
                   [v](uint8_t* dst, int64_t n) { std::memcpy(dst, v.data(), static_cast<size_t>(n)); });
    };
    f32("rope_factors_long.weight", s.rope_factors_long);
    f32("rope_factors_short.weight", s.rope_factors_short);
  }
  matrix("token_embd.weight", s.n_vocab, s.dim);
  w.add_tensor("output_norm.weight", {s.dim}, GgmlType::F32, ones(s.dim));
  if (!s.tied_embeddings) matrix("output.weight", s.n_vocab, s.dim);
  for (int l = 0; l < s.n_layers; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    w.add_tensor(p + "attn_norm.weight", {s.dim}, GgmlType::F32, ones(s.dim));
    if (arch.fused_qkv) {
      matrix(p + "attn_qkv.weight", qd + 2 * kvd, s.dim);
    } else {
      matrix(p + "attn_q.weight", qd, s.dim);
      matrix(p + "attn_k.weight", kvd, s.dim);
      matrix(p + "attn_v.weight", kvd, s.dim);
    }
    if (arch.qkv_bias == TensorUse::Required) {
      bias(p + "attn_q.bias", qd);
      bias(p + "attn_k.bias", kvd);
      bias(p + "attn_v.bias", kvd);
    }
    if (arch.qk_norm) {
      w.add_tensor(p + "attn_q_norm.weight", {hd}, GgmlType::F32, ones(hd));
      w.add_tensor(p + "attn_k_norm.weight", {hd}, GgmlType::F32, ones(hd));
    }
    matrix(p + "attn_output.weight", s.dim, qd);
    w.add_tensor(p + "ffn_norm.weight", {s.dim}, GgmlType::F32, ones(s.dim));
    if (arch.fused_gate_up) {
      matrix(p + "ffn_up.weight", 2 * int64_t{s.hidden_dim}, s.dim);
    } else {
      matrix(p + "ffn_gate.weight", s.hidden_dim, s.dim);
      matrix(p + "ffn_up.weight", s.hidden_dim, s.dim);
    }
    matrix(p + "ffn_down.weight", s.dim, s.hidden_dim);
  }
  w.write(path);
}

}  // namespace kvevict
