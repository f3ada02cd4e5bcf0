// Hugging Face checkpoint directories: config.json -> ModelConfig, safetensors tensors -> the
// loader's GGUF-named table (model/load_common.h), chat template.
//
// Sources: transformers' configuration classes and modelling code for LlamaForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM and Phi3ForCausalLM (field names, their defaults when a
// config omits them, parameter names), `modeling_rope_utils` (rope_scaling types default /
// linear / llama3 / longrope and their parameters), and llama.cpp's convert_hf_to_gguf.py, whose
// name mapping and llama3 / LongRoPE factor derivation the GGUF path already follows, so that
// a directory and its converted GGUF load to the same computation.
//
// RoPE layout. Hugging Face stores q_proj / k_proj in rotate-half order: RoPE band f of a head
// pairs coordinates (f, f + n_rot/2). llama.cpp's converter permutes the Q/K rows of `llama`
// models so that band f becomes the adjacent pair (2f, 2f+1) its NORM rope mode rotates. Here the
// rows are left as stored and the NEOX pairing (RopeStyle::Neox) is selected instead: each band
// is rotated by the same angle applied to the same two values, only their place in the head
// differs, and q·k sums the same products, so the result equals the converted GGUF's up to the
// float summation order of the dot product — with no copy of the weights (they stay mapped).
// qwen2, qwen3 and phi3 use NEOX in both formats; nothing changes for them.
//
// Weights: F32, F16 and BF16 are kept as stored (the matmul kernels read all three); a tensor
// whose data is not aligned to its element size in the file is copied once into aligned memory.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>

#include "model/load_common.h"
#include "util/error.h"
#include "util/file.h"
#include "util/json_file.h"

namespace kvevict {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int64_t kMaxConfigJson = int64_t{16} << 20;
constexpr int64_t kMaxIndexJson = int64_t{64} << 20;
constexpr int64_t kMaxTemplate = int64_t{4} << 20;

// One supported family: its HF class, model_type and the transformers config defaults the
// loader needs when a config.json omits a field.
struct HfFamily {
  const char* arch;        // kvevict/GGUF family
  const char* class_name;  // `architectures` entry
  const char* model_type;
  double rms_eps;        // rms_norm_eps
  int max_positions;     // max_position_embeddings
  int default_head_dim;  // head_dim when absent; 0: hidden_size / num_attention_heads
  // The config switches sliding-window attention on with `use_sliding_window` (a `sliding_window`
  // size alone is inert); otherwise a `sliding_window` size itself asks for it.
  bool window_switch;
};
constexpr HfFamily kFamilies[] = {
    {"llama", "LlamaForCausalLM", "llama", 1e-6, 2048, 0, false},
    {"qwen2", "Qwen2ForCausalLM", "qwen2", 1e-6, 32768, 0, true},
    {"qwen3", "Qwen3ForCausalLM", "qwen3", 1e-6, 32768, 128, true},
    {"phi3", "Phi3ForCausalLM", "phi3", 1e-5, 4096, 0, false},
};

// HF parameter suffix of a block tensor <-> GGUF suffix. `fused_only` / `split_only`: used when
// the family does / does not fuse gate and up (phi3's gate_up_proj is GGUF's ffn_up).
struct NameMap {
  const char* hf;
  const char* gguf;
};
constexpr NameMap kBlockNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},      {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},      {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},          {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"}, {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"}, {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},       {"mlp.down_proj.weight", "ffn_down.weight"},
};
constexpr NameMap kGlobalNames[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};
const char* up_name(const ArchInfo& arch) {
  return arch.fused_gate_up ? "mlp.gate_up_proj.weight" : "mlp.up_proj.weight";
}

// "model.layers.<N>.<rest>" -> N and rest; false otherwise.
bool parse_layer_name(const std::string& name, int64_t& layer, std::string& rest) {
  static const std::string kPrefix = "model.layers.";
  if (name.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  size_t i = kPrefix.size(), digits = 0;
  int64_t n = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && digits < 9) {
    n = n * 10 + (name[i] - '0');
    ++i;
    ++digits;
  }
  if (digits == 0 || i >= name.size() || name[i] != '.' || (digits > 1 && name[kPrefix.size()] == '0')) return false;
  layer = n;
  rest = name.substr(i + 1);
  return true;
}

// GGUF name of a stored HF tensor, or "" when the family has no such tensor.
std::string gguf_name_of(const std::string& hf, const ArchInfo& arch, int n_layers) {
  for (const NameMap& m : kGlobalNames)
    if (hf == m.hf) return m.gguf;
  int64_t layer = 0;
  std::string rest;
  if (!parse_layer_name(hf, layer, rest) || layer >= n_layers) return "";
  const std::string p = fmt::format("blk.{}.", layer);
  if (rest == up_name(arch)) return p + "ffn_up.weight";
  // Q/K/V biases exist in HF only where the family always has them (qwen2): Llama's
  // attention_bias is refused in config.json, so stored biases there are unused tensors.
  if (arch.qkv_bias != TensorUse::Required && rest.size() > 5 && rest.compare(rest.size() - 5, 5, ".bias") == 0)
    return "";
  for (const NameMap& m : kBlockNames)
    if (rest == m.hf) return p + m.gguf;
  return "";
}

// ---- config.json fields, typed, every error naming the file and key.
class Config {
 public:
  Config(json j, std::string path) : j_(std::move(j)), path_(std::move(path)) {}
  const std::string& path() const { return path_; }
  const json* get(const std::string& key) const {
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& msg) const {
    throw Error(fmt::format("{}: {} {}", path_, key, msg));
  }
  int positive(const std::string& key, std::optional<int> fallback = std::nullopt) const {
    const json* v = get(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      fail(key, "is missing");
    }
    if (!v->is_number_integer()) fail(key, fmt::format("= {} is not an integer", v->dump()));
    const int64_t x = v->get<int64_t>();
    if (x < 1 || x > (int64_t{1} << 30)) fail(key, fmt::format("= {} is out of range (1 .. 2^30)", x));
    return static_cast<int>(x);
  }
  double number(const std::string& key, double fallback) const {
    const json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_number()) fail(key, fmt::format("= {} is not a number", v->dump()));
    return v->get<double>();
  }
  bool boolean(const std::string& key, bool fallback) const {
    const json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail(key, fmt::format("= {} is not a boolean", v->dump()));
    return v->get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) const {
    const json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) fail(key, fmt::format("= {} is not a string", v->dump()));
    return v->get<std::string>();
  }
  const json& raw() const { return j_; }

 private:
  json j_;
  std::string path_;
};

// A value that leaves the computation as kvevict runs it: absent, null, false, 0, "" or [].
bool inert(const json& v) {
  return v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_number() && v.get<double>() == 0.0) ||
      (v.is_string() && v.get<std::string>().empty()) || (v.is_array() && v.empty());
}

// Keys of other transformers models that change the computation; refused unless inert.
constexpr const char* kRefusedKeys[] = {
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "n_shared_experts",
    "decoder_sparse_step",
    "mlp_only_layers",
    "router_aux_loss_coef_enabled",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "logit_scale",
    "embedding_multiplier",
    "residual_multiplier",
    "attention_multiplier",
    "logits_scaling",
    "query_pre_attn_scalar",
    "clip_qkv",
    "use_qk_norm",
    "qk_layernorm",
    "no_rope_layers",
    "use_parallel_residual",
    "alibi",
    "position_embedding_type_alibi",
    "quantization_config",
    "attention_chunk_size",
    "cross_attention_layers",
};

// The family from `architectures` and `model_type` (both when given must agree).
const HfFamily& family_of(const Config& cfg) {
  const auto names = [](auto field) {
    std::string out;
    for (const HfFamily& f : kFamilies) out += (out.empty() ? "" : ", ") + std::string(field(f));
    return out;
  };
  const HfFamily* by_class = nullptr;
  if (const json* a = cfg.get("architectures")) {
    if (!a->is_array() || a->size() != 1 || !(*a)[0].is_string())
      cfg.fail("architectures", fmt::format("= {} must list one class name", a->dump()));
    const std::string cls = (*a)[0].get<std::string>();
    for (const HfFamily& f : kFamilies)
      if (cls == f.class_name) by_class = &f;
    if (by_class == nullptr)
      cfg.fail("architectures",
               fmt::format("= ['{}'] is not supported (supported: {})", cls,
                           names([](const HfFamily& f) { return f.class_name; })));
  }
  const HfFamily* by_type = nullptr;
  if (cfg.get("model_type") != nullptr) {
    const std::string t = cfg.string("model_type", "");
    for (const HfFamily& f : kFamilies)
      if (t == f.model_type) by_type = &f;
    if (by_type == nullptr)
      cfg.fail("model_type", fmt::format("= '{}' is not supported (supported: {})", t, names([](const HfFamily& f) {
                                           return f.model_type;
                                         })));
  }
  if (by_class == nullptr && by_type == nullptr) cfg.fail("architectures", "and model_type are both missing");
  if (by_class != nullptr && by_type != nullptr && by_class != by_type)
    cfg.fail("model_type",
             fmt::format("= '{}' contradicts architectures = ['{}']", by_type->model_type, by_class->class_name));
  return by_class != nullptr ? *by_class : *by_type;
}

// A float array of n finite positive values (LongRoPE factors).
std::vector<float> factor_list(const Config& cfg, const json& v, const std::string& key, int n) {
  if (!v.is_array()) cfg.fail(key, fmt::format("is a {}, expected an array of numbers", v.type_name()));
  if (static_cast<int>(v.size()) != n)
    cfg.fail(key, fmt::format("has {} entries, expected {} (one per rotated band, n_rot {} / 2)", v.size(), n, 2 * n));
  std::vector<float> out;
  for (size_t i = 0; i < v.size(); ++i) {
    const double x = v[i].is_number() ? v[i].get<double>() : NAN;
    if (!(std::isfinite(x) && x > 0.0))
      cfg.fail(key, fmt::format("holds {} at band {}; LongRoPE factors must be finite and > 0", v[i].dump(), i));
    out.push_back(static_cast<float>(x));
  }
  return out;
}

// RoPE: theta, partial rotary (phi3), and the scaling types the GGUF path implements.
void read_rope(const Config& cfg, const HfFamily& fam, const ArchInfo& arch, const LoadOptions& options, ModelConfig& c,
               std::string& note) {
  RopeConfig& r = c.rope;
  r.head_dim = c.head_dim;
  r.style = RopeStyle::Neox;  // HF rotate-half layout, for every family (file comment)
  // transformers >= 5 groups theta and scaling under rope_parameters; older configs use
  // rope_theta and rope_scaling.
  const json* params = cfg.get("rope_parameters");
  const json* scaling = cfg.get("rope_scaling");
  if (params != nullptr && scaling != nullptr)
    cfg.fail("rope_parameters", "and rope_scaling are both given; which one applies is ambiguous");
  const std::string skey = params != nullptr ? "rope_parameters" : "rope_scaling";
  const json* rs = params != nullptr ? params : scaling;
  if (rs != nullptr && !rs->is_object()) cfg.fail(skey, fmt::format("= {} is not an object", rs->dump()));
  double theta = cfg.number("rope_theta", 10000.0);
  if (rs != nullptr && rs->contains("rope_theta")) {
    if (!(*rs)["rope_theta"].is_number()) cfg.fail(skey + ".rope_theta", "is not a number");
    theta = (*rs)["rope_theta"].get<double>();
  }
  if (!(std::isfinite(theta) && theta > 1.0))
    cfg.fail("rope_theta", fmt::format("= {} must be a finite value > 1", theta));
  c.rope_theta = static_cast<float>(theta);
  r.theta = c.rope_theta;

  const double partial = cfg.number("partial_rotary_factor", 1.0);
  if (partial != 1.0 && !arch.longrope)  // phi3 is the family whose forward rotates part of a head
    cfg.fail("partial_rotary_factor", fmt::format("= {} is not implemented for '{}'", partial, fam.arch));
  const double rot = c.head_dim * partial;
  if (!(rot >= 2 && rot <= c.head_dim && rot == std::floor(rot) && static_cast<int>(rot) % 2 == 0))
    cfg.fail("partial_rotary_factor",
             fmt::format("= {} gives {} rotated dims of head_dim {}; need an even count in [2, "
                         "head_dim]",
                         partial, rot, c.head_dim));
  r.n_rot = static_cast<int>(rot);

  std::string type = "default";
  if (rs != nullptr) {
    const auto t = rs->contains("rope_type") ? rs->find("rope_type") : rs->find("type");
    if (t != rs->end()) {
      if (!t->is_string()) cfg.fail(skey + ".rope_type", fmt::format("= {} is not a string", t->dump()));
      type = t->get<std::string>();
    }
  }
  if (type == "su") type = "longrope";  // Phi-3's early name, accepted by transformers too
  // The parameters each type reads; any other key could change the computation.
  std::set<std::string> allowed = {"type", "rope_type", "rope_theta"};
  if (type == "linear") allowed.insert("factor");
  if (type == "llama3")
    allowed.insert({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  if (type == "longrope")
    allowed.insert({"short_factor", "long_factor", "original_max_position_embeddings", "attention_factor", "factor"});
  const auto param = [&](const char* k, std::optional<double> fallback) -> double {
    if (rs == nullptr || !rs->contains(k) || (*rs)[k].is_null()) {
      if (!fallback) cfg.fail(skey + "." + k, fmt::format("is missing (needed by rope type '{}')", type));
      return *fallback;
    }
    const json& v = (*rs)[k];
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
      cfg.fail(skey + "." + k, fmt::format("= {} must be a finite number > 0", v.dump()));
    return v.get<double>();
  };
  const bool known = type == "default" || type == "linear" || type == "llama3" || type == "longrope";
  if (!known)
    cfg.fail(skey + ".rope_type",
             fmt::format("= '{}' is not implemented (supported: default, linear, llama3 for llama, "
                         "longrope for phi3)",
                         type));
  if (type == "llama3" && !arch.rope_freqs)
    cfg.fail(skey + ".rope_type", fmt::format("= 'llama3' is not implemented for '{}'", fam.arch));
  if (type == "longrope" && !arch.longrope)
    cfg.fail(skey + ".rope_type", fmt::format("= 'longrope' is not implemented for '{}'", fam.arch));
  if (rs != nullptr)
    for (const auto& [k, v] : rs->items())
      if (!allowed.count(k) && !v.is_null())
        cfg.fail(skey + "." + k, fmt::format("= {} is not implemented for rope type '{}'", v.dump(), type));

  if (type == "linear") r.freq_scale = 1.0 / param("factor", std::nullopt);
  if (type == "llama3") {
    // convert_hf_to_gguf.py LlamaModel (rope_freqs) = transformers _compute_llama3_parameters:
    // band f of wavelength λ is slowed by `factor` when λ > original / low_freq_factor, kept when
    // λ < original / high_freq_factor, and interpolated smoothly between.
    const double factor = param("factor", std::nullopt), low = param("low_freq_factor", std::nullopt),
                 high = param("high_freq_factor", std::nullopt),
                 orig = param("original_max_position_embeddings", std::nullopt);
    if (!(high > low))
      cfg.fail(skey + ".high_freq_factor", fmt::format("= {} must exceed low_freq_factor {}", high, low));
    const double low_wavelen = orig / low, high_wavelen = orig / high;
    for (int f = 0; f < r.n_rot / 2; ++f) {
      const double freq = 1.0 / std::pow(theta, 2.0 * f / r.n_rot);
      const double wavelen = 2.0 * std::numbers::pi / freq;
      double div = 1.0;
      if (wavelen > low_wavelen) {
        div = factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (orig / wavelen - low) / (high - low);
        div = 1.0 / ((1.0 - smooth) / factor + smooth);
      }
      r.freq_factors.push_back(static_cast<float>(div));
    }
  }
  if (type == "longrope") {
    LongRopeInfo& lr = c.longrope;
    const int n = r.n_rot / 2;
    lr.short_factors =
        factor_list(cfg, rs->contains("short_factor") ? (*rs)["short_factor"] : json(), skey + ".short_factor", n);
    lr.long_factors =
        factor_list(cfg, rs->contains("long_factor") ? (*rs)["long_factor"] : json(), skey + ".long_factor", n);
    // Phi3Config keeps original_max_position_embeddings at the top level; rope_parameters may
    // hold it too.
    std::string orig_key = "original_max_position_embeddings";
    int orig = 0;
    if (rs->contains("original_max_position_embeddings")) {
      orig = static_cast<int>(param("original_max_position_embeddings", std::nullopt));
      orig_key = skey + ".original_max_position_embeddings";
    } else {
      orig = cfg.positive("original_max_position_embeddings", c.context_length);
    }
    lr.original_context = orig;
    // transformers _compute_longrope_parameters = convert_hf_to_gguf.py Phi3MiniModel:
    // sqrt(1 + ln s / ln original) with s = max_position_embeddings / original, 1 when s <= 1.
    const double s = static_cast<double>(c.context_length) / orig;
    r.attn_factor = rs->contains("attention_factor") && !(*rs)["attention_factor"].is_null()
        ? param("attention_factor", std::nullopt)
        : (s > 1.0 ? std::sqrt(1.0 + std::log(s) / std::log(static_cast<double>(orig))) : 1.0);
    if (rs->contains("factor") && !(*rs)["factor"].is_null() && std::abs(param("factor", std::nullopt) - s) > 1e-6 * s)
      cfg.fail(skey + ".factor",
               fmt::format("= {} differs from max_position_embeddings / original ({}); which one "
                           "sets the attention factor is ambiguous",
                           (*rs)["factor"].dump(), s));
    choose_longrope(c, options, cfg.path(), "max_position_embeddings", orig_key, skey + ".short_factor",
                    skey + ".long_factor", note);
  }
}

// Every config.json field that would change the computation kvevict runs.
void read_config(const Config& cfg, const HfFamily& fam, const ArchInfo& arch, const LoadOptions& options,
                 ModelConfig& c, std::vector<std::string>& warnings, std::string& note) {
  c.arch = fam.arch;
  c.dim = cfg.positive("hidden_size");
  c.n_layers = cfg.positive("num_hidden_layers");
  c.n_heads = cfg.positive("num_attention_heads");
  c.n_kv_heads = cfg.positive("num_key_value_heads", c.n_heads);
  c.hidden_dim = cfg.positive("intermediate_size");
  c.n_vocab = cfg.positive("vocab_size");
  c.context_length = cfg.positive("max_position_embeddings", fam.max_positions);
  const double eps = cfg.number("rms_norm_eps", fam.rms_eps);
  if (!(std::isfinite(eps) && eps > 0.0 && eps < 1.0))
    cfg.fail("rms_norm_eps", fmt::format("= {} must be a finite value in (0, 1)", eps));
  c.rms_eps = static_cast<float>(eps);
  if (c.n_heads % c.n_kv_heads != 0)
    cfg.fail("num_attention_heads",
             fmt::format("= {} is not a multiple of num_key_value_heads {}", c.n_heads, c.n_kv_heads));
  if (cfg.get("head_dim") != nullptr) {
    c.head_dim = cfg.positive("head_dim");
  } else if (fam.default_head_dim > 0) {
    c.head_dim = fam.default_head_dim;  // Qwen3Config's default
  } else {
    if (c.dim % c.n_heads != 0)
      cfg.fail(
          "hidden_size",
          fmt::format("= {} is not a multiple of num_attention_heads {} and there is no head_dim", c.dim, c.n_heads));
    c.head_dim = c.dim / c.n_heads;
  }
  if (c.head_dim % 2 != 0) cfg.fail("head_dim", fmt::format("= {} is odd; RoPE needs pairs", c.head_dim));

  const std::string act = cfg.string("hidden_act", cfg.string("hidden_activation", "silu"));
  if (act != "silu" && act != "swish")
    cfg.fail(cfg.get("hidden_act") != nullptr ? "hidden_act" : "hidden_activation",
             fmt::format("= '{}' is not implemented (supported: silu)", act));
  if (cfg.boolean("mlp_bias", false)) cfg.fail("mlp_bias", "= true (biases on the MLP projections) is not implemented");
  if (cfg.boolean("attention_bias", false)) {
    // Llama puts the bias on o_proj too; Qwen3 has none in kvevict's forward pass.
    cfg.fail("attention_bias",
             fmt::format("= true is not implemented for '{}'{}", fam.arch,
                         arch.qkv_bias == TensorUse::None ? "" : " (it adds an o_proj bias)"));
  }
  for (const char* k : kRefusedKeys)
    if (const json* v = cfg.get(k); v != nullptr && !inert(*v))
      cfg.fail(k, fmt::format("= {} is not implemented (refused rather than ignored)", v->dump()));
  // Sliding-window attention: qwen2/qwen3 enable it with use_sliding_window (or per-layer
  // layer_types); phi3's window is ignored as the GGUF path and llama.cpp do.
  if (const json* lt = cfg.get("layer_types")) {
    if (!lt->is_array()) cfg.fail("layer_types", "is not an array");
    for (const json& t : *lt)
      if (!(t.is_string() && t.get<std::string>() == "full_attention"))
        cfg.fail("layer_types", fmt::format("holds {}: only full_attention layers are implemented", t.dump()));
  }
  const json* sw = cfg.get("sliding_window");
  if (fam.window_switch) {
    if (cfg.boolean("use_sliding_window", false))
      cfg.fail("use_sliding_window",
               fmt::format("= true (sliding_window = {}): sliding-window attention is not "
                           "implemented",
                           sw != nullptr ? sw->dump() : "null"));
  } else if (sw != nullptr && !inert(*sw)) {
    if (!arch.ignore_sliding_window)
      cfg.fail("sliding_window", fmt::format("= {}: sliding-window attention is not implemented", sw->dump()));
    warnings.push_back(
        fmt::format("{}: sliding_window = {} ignored: full attention over the whole context, as "
                    "llama.cpp does for phi3 (transformers applies the window beyond {} tokens)",
                    cfg.path(), sw->dump(), sw->dump()));
  }
  read_rope(cfg, fam, arch, options, c, note);
}

std::optional<GgmlType> ggml_type_of(const std::string& dtype) {
  if (dtype == "F32") return GgmlType::F32;
  if (dtype == "F16") return GgmlType::F16;
  if (dtype == "BF16") return GgmlType::BF16;
  return std::nullopt;
}

// The safetensors files of the checkpoint: the shards model.safetensors.index.json names, else
// model.safetensors. Shard names must be plain file names inside the directory.
std::vector<std::string> weight_files(const std::string& dir, std::map<std::string, std::string>& weight_map) {
  const std::string index = dir + "/model.safetensors.index.json";
  if (fs::exists(index)) {
    const json j = read_json_file(index, kMaxIndexJson);
    const auto wm = j.is_object() ? j.find("weight_map") : j.end();
    if (wm == j.end() || !wm->is_object())
      throw Error(fmt::format("{}: weight_map is missing or not an object (tensor name -> file)", index));
    std::set<std::string> files;
    for (const auto& [name, file] : wm->items()) {
      if (!file.is_string()) throw Error(fmt::format("{}: weight_map['{}'] is not a file name", index, name));
      const std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        throw Error(
            fmt::format("{}: weight_map['{}'] = '{}' is not a file name in the checkpoint directory", index, name, f));
      weight_map[name] = f;
      files.insert(f);
    }
    if (files.empty()) throw Error(fmt::format("{}: weight_map is empty", index));
    return {files.begin(), files.end()};
  }
  if (fs::exists(dir + "/model.safetensors")) return {"model.safetensors"};
  std::vector<std::string> found;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0) found.push_back(n);
  }
  if (!found.empty())
    throw Error(
        fmt::format("{}: has {} .safetensors file(s) ({}) but neither model.safetensors nor "
                    "model.safetensors.index.json",
                    dir, found.size(), found[0]));
  if (fs::exists(dir + "/pytorch_model.bin") || fs::exists(dir + "/pytorch_model.bin.index.json"))
    throw Error(
        fmt::format("{}: holds PyTorch pickle weights (pytorch_model.bin) only; kvevict reads safetensors", dir));
  throw Error(fmt::format("{}: no model.safetensors or model.safetensors.index.json", dir));
}

// The chat template: chat_template.jinja (transformers >= 4.43 saves it apart), else
// tokenizer_config.json's chat_template (a string, or a list of {name, template}: "default").
std::string read_chat_template(const std::string& dir) {
  const std::string jinja = dir + "/chat_template.jinja";
  if (fs::exists(jinja)) return read_file_limited(jinja, kMaxTemplate, "");
  const std::string tc = dir + "/tokenizer_config.json";
  if (!fs::exists(tc)) return "";
  const json j = read_json_file(tc, int64_t{64} << 20);
  const auto it = j.is_object() ? j.find("chat_template") : j.end();
  if (it == j.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_array()) {
    for (const json& t : *it)
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
        return t["template"].get<std::string>();
    throw Error(fmt::format("{}: chat_template lists no template named 'default'", tc));
  }
  throw Error(fmt::format("{}: chat_template is a {}, expected a string", tc, it->type_name()));
}

}  // namespace

std::string hf_tensor_name(const std::string& gguf_name, const ArchInfo& arch) {
  for (const NameMap& m : kGlobalNames)
    if (gguf_name == m.gguf) return m.hf;
  static const std::string kBlk = "blk.";
  if (gguf_name.compare(0, kBlk.size(), kBlk) != 0) return gguf_name;
  const size_t dot = gguf_name.find('.', kBlk.size());
  if (dot == std::string::npos) return gguf_name;
  const std::string layer = gguf_name.substr(kBlk.size(), dot - kBlk.size()), rest = gguf_name.substr(dot + 1);
  if (rest == "ffn_up.weight") return "model.layers." + layer + "." + up_name(arch);
  for (const NameMap& m : kBlockNames)
    if (rest == m.gguf) return "model.layers." + layer + "." + m.hf;
  return gguf_name;
}

HfCheckpoint read_hf_checkpoint(const std::string& dir, const LoadOptions& options) {
  HfCheckpoint ck;
  const std::string cpath = dir + "/config.json";
  if (!fs::exists(cpath))
    throw Error(
        fmt::format("{}: no config.json (a Hugging Face checkpoint directory holds config.json, "
                    "*.safetensors and tokenizer.json)",
                    dir));
  json cj = read_json_file(cpath, kMaxConfigJson);
  if (!cj.is_object()) throw Error(fmt::format("{}: is a JSON {}, expected an object", cpath, cj.type_name()));
  const Config cfg(std::move(cj), cpath);
  const HfFamily& fam = family_of(cfg);
  ck.arch = &arch_info(fam.arch, cpath);
  read_config(cfg, fam, *ck.arch, options, ck.config, ck.warnings, ck.rope_note);
  const ModelConfig& c = ck.config;

  // Weights.
  std::map<std::string, std::string> weight_map;
  const std::vector<std::string> names = weight_files(dir, weight_map);
  std::map<std::string, std::string> seen;  // tensor -> file
  for (const std::string& n : names) {
    const std::string path = dir + "/" + n;
    if (!fs::exists(path))
      throw Error(fmt::format("{}/model.safetensors.index.json: names '{}', which does not exist", dir, n));
    ck.files.push_back(SafetensorsFile::open(path));
    const SafetensorsFile& f = ck.files.back();
    for (const SafetensorsTensor& t : f.tensors()) {
      if (const auto [it, fresh] = seen.emplace(t.name, n); !fresh)
        throw Error(fmt::format("{}: tensor '{}' is stored in both {} and {}", dir, t.name, it->second, n));
      if (!weight_map.empty()) {
        const auto w = weight_map.find(t.name);
        if (w == weight_map.end() || w->second != n)
          throw Error(fmt::format("{}: tensor '{}' is not listed for this file in model.safetensors.index.json{}", path,
                                  t.name, w == weight_map.end() ? "" : " (it names " + w->second + ")"));
      }
    }
  }
  for (const auto& [name, file] : weight_map)
    if (!seen.count(name))
      throw Error(fmt::format("{}/model.safetensors.index.json: tensor '{}' is listed in {} but not stored there", dir,
                              name, file));

  for (const SafetensorsFile& f : ck.files) {
    for (const SafetensorsTensor& t : f.tensors()) {
      TensorEntry e;
      e.stored_name = t.name;
      e.name = gguf_name_of(t.name, *ck.arch, c.n_layers);
      if (e.name.empty()) e.name = t.name;  // no counterpart: refused as unused by the loader
      e.file = f.path();
      e.dims.assign(t.shape.rbegin(), t.shape.rend());
      e.row_major = true;
      e.dtype = t.dtype;
      e.type = ggml_type_of(t.dtype);
      e.data = t.data;
      e.n_bytes = static_cast<int64_t>(t.n_bytes());
      const size_t align = e.type ? static_cast<size_t>(ggml_block_bytes(*e.type)) : 1;
      if (e.data != nullptr && reinterpret_cast<uintptr_t>(e.data) % align != 0) {
        // The matmul kernels read typed elements; give them an aligned copy.
        std::vector<uint64_t>& buf = ck.copies.emplace_back((t.n_bytes() + 7) / 8);
        std::memcpy(buf.data(), e.data, t.n_bytes());
        e.data = reinterpret_cast<const uint8_t*>(buf.data());
      }
      ck.tensors.push_back(std::move(e));
    }
  }

  // Tied embeddings: one matrix serves as input embedding and LM head.
  const bool tie = cfg.boolean("tie_word_embeddings", false);
  const auto find = [&](const char* gguf) {
    return std::find_if(ck.tensors.begin(), ck.tensors.end(), [&](const TensorEntry& e) { return e.name == gguf; });
  };
  auto embed = find("token_embd.weight"), head = find("output.weight");
  const bool has_embed = embed != ck.tensors.end(), has_head = head != ck.tensors.end();
  if (tie && has_head) {
    if (!has_embed) {
      // Stored once under the head's name (safetensors' shared-tensor saving; TinyStories-656K).
      head->name = "token_embd.weight";
    } else if (head->dtype == embed->dtype && head->dims == embed->dims && head->n_bytes == embed->n_bytes &&
               std::memcmp(head->data, embed->data, static_cast<size_t>(head->n_bytes)) == 0) {
      ck.tensors.erase(head);  // a second copy of the same matrix
    } else {
      throw Error(
          fmt::format("{}: tie_word_embeddings = true, but lm_head.weight and model.embed_tokens.weight "
                      "differ (which one is the LM head is ambiguous)",
                      cpath));
    }
  } else if (!tie && !has_head) {
    throw Error(fmt::format("{}: tie_word_embeddings = false, but no lm_head.weight is stored", cpath));
  }
  ck.chat_template = read_chat_template(dir);
  return ck;
}

}  // namespace kvevict
