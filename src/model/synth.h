// Synthetic-weight models of real shapes, any family of model/arch.h, for timing (their outputs
// are meaningless).
//
// Shapes (Hugging Face config.json of each model): SmolLM2-135M: vocab 49152, hidden 576,
// 30 layers, 9 heads, 3 KV heads, FFN 1536, RoPE theta 100000, tied embeddings; SmolLM2-360M:
// vocab 49152, hidden 960, 32 layers, 15 heads, 5 KV heads, FFN 2560, theta 100000, tied;
// TinyLlama-1.1B (v1.0): vocab 32000, hidden 2048, 22 layers, 32 heads, 4 KV heads, FFN 5632,
// theta 10000, untied output. RMSNorm eps 1e-5 for all. Plus `tiny` (vocab 320, hidden 64,
// 2 layers, 4 heads, 2 KV heads, FFN 128) for tests.
// Other families: Qwen3-0.6B (qwen3): vocab 151936, hidden 1024, 28 layers, 16 heads, 8 KV
// heads, head_dim 128, FFN 3072, theta 1e6, eps 1e-6, tied; DeepSeek-R1-Distill-Qwen-1.5B
// (qwen2): vocab 151936, hidden 1536, 28 layers, 12 heads, 2 KV heads, FFN 8960, theta 10000,
// eps 1e-6, untied; Phi-3-mini-4k (phi3): vocab 32064, hidden 3072, 32 layers, 32 heads and KV
// heads, FFN 8192, theta 10000, eps 1e-5, untied. Plus `tiny-qwen2`, `tiny-qwen3` (head_dim 32)
// and `tiny-phi3` (partial rotary: 12 of 16 dims) for tests. The tensor set follows the family's
// row of the architecture table (model/arch.h), never its name: fused attn_qkv and ffn_up
// [gate | up] (phi3), Q/K/V biases when required (qwen2; random), Q/K norms (qwen3; ones).
//
// The file is a GGUF v3 of llama.cpp's tensor naming (model/model.h), written by
// format/gguf_writer.h: 2-D weights (and token_embd, output) in the requested type or mix
// (SynthTypes), norm vectors in F32 (all ones). Weights are uniform in ±sqrt(3 / cols) (unit-variance products),
// drawn from xoshiro256** streams keyed by (seed, tensor index, row), so the file is a pure
// function of (shape, type, seed). Tokenizer: SPM ("llama") with <unk>, <s>, </s>, the 256
// byte tokens <0x00>..<0xFF>, the space piece U+2581 and filler pieces up to the vocabulary size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/ggml_types.h"

namespace kvevict {

/// Hyper-parameters of a synthetic model.
struct SynthShape {
  std::string name;
  int n_vocab = 0, dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, hidden_dim = 0;
  int context_length = 0;
  float rope_theta = 10000.0f;
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;
  /// Family (model/arch.h: "llama", "qwen2", "qwen3", "phi3"). Its table row decides the tensor
  /// set; its name is the metadata key prefix.
  std::string arch = "llama";
  int head_dim = 0;  ///< per-head width; 0 means dim / n_heads (written as attention.key_length otherwise)
  int n_rot = 0;     ///< rotated dims (rope.dimension_count); 0 means head_dim
  /// LongRoPE (families with ArchInfo::longrope; model/model.h LongRopeInfo): when set, written as the F32 tensors
  /// rope_factors_short.weight and rope_factors_long.weight [n_rot / 2] (both or neither).
  std::vector<float> rope_factors_short{}, rope_factors_long{};
  int original_context_length = 0;  ///< `rope.scaling.original_context_length`, written when > 0
  float rope_attn_factor = 0.0f;    ///< `rope.scaling.attn_factor`, written when > 0
  /// head_dim, or dim / n_heads when it is 0.
  int head_dim_or_default() const { return head_dim > 0 ? head_dim : dim / n_heads; }
  /// Parameters (elements of every tensor).
  int64_t n_params() const;
};

/// Turns `shape` (a phi3 shape) into a LongRoPE model the way Phi-3.5-mini extends Phi-3-mini:
/// original context = the shape's context_length, new context_length = 32 x that; short
/// factors rise linearly from 1.0 to 1.1 over the rotated bands, long factors geometrically from
/// 1 to 32 (LongRoPE stretches low frequencies most); attention factor sqrt(1 + ln 32 / ln
/// original), convert_hf_to_gguf.py's formula for Phi-3 LongRoPE. The values are illustrative,
/// not any real model's. Throws kvevict::Error when the shape's family has no LongRoPE
/// (ArchInfo::longrope, model/arch.h).
void synth_add_longrope(SynthShape& shape);

/// Names of the known shapes ("smollm2-135m", "smollm2-360m", "tinyllama-1.1b", "tiny", ...).
std::vector<std::string> synth_shape_names();

/// The real-model shape used for `arch` when no shape is named: the family's
/// ArchInfo::synth_shape (llama -> tinyllama-1.1b, qwen2 -> r1-distill-qwen-1.5b, qwen3 ->
/// qwen3-0.6b, phi3 -> phi3-mini-4k). Throws kvevict::Error for an architecture without one.
std::string synth_default_shape(const std::string& arch);

/// Shape by name; throws kvevict::Error listing the known names.
SynthShape synth_shape(const std::string& name);

/// Parses a single weight type for synth models: any supported ggml type by its name ("f32",
/// "f16", "bf16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k" .. "q6_k"); Error otherwise.
GgmlType parse_synth_type(const std::string& name);

/// The weight types of a synthetic model: one type for every matrix, or a llama.cpp-style
/// K-quant mix. Mixes follow llama.cpp's llama_tensor_get_type for these file types:
/// "q4_k_m" / "q5_k_m": Q4_K / Q5_K everywhere except attn_v (or a fused attn_qkv) and ffn_down of the layers
/// use_more_bits picks (the first and last eighth, and every third layer between) and the
/// output matrix, which are Q6_K (a tied embedding counts as the output). Any K-quant matrix
/// whose row length is not a multiple of 256 falls back as llama.cpp does: Q4_K -> Q5_0,
/// Q5_K -> Q5_1, Q6_K -> Q8_0, and Q2_K / Q3_K -> Q4_0 (llama.cpp uses IQ4_NL, which kvevict
/// does not implement).
struct SynthTypes {
  std::string name;                ///< as given: "q8_0", "q4_k_m", ...
  GgmlType base = GgmlType::Q8_0;  ///< the type of every matrix not promoted by the mix
  bool k_m = false;                ///< a "_k_m" mix
  /// Type of matrix `tensor` ("token_embd", "output", "attn_q", "attn_k", "attn_v",
  /// "attn_output", "ffn_gate", "ffn_up", "ffn_down") of layer `layer` (-1 outside layers) of
  /// n_layers, whose rows have `cols` elements; tied: the embedding doubles as the output.
  GgmlType tensor_type(const std::string& tensor, int layer, int n_layers, int64_t cols, bool tied) const;
  /// llama.cpp's general.file_type value (LLAMA_FTYPE_*) for this choice.
  uint32_t file_type() const;
};

/// Parses `--type` of synth-gguf: a single type (parse_synth_type) or "q4_k_m" / "q5_k_m".
SynthTypes parse_synth_types(const std::string& name);

/// Writes the synthetic model to `path`. Throws kvevict::Error when the shape is inconsistent
/// (dim % heads without head_dim, heads % kv_heads, odd head_dim or n_rot, quantised type with
/// dim or FFN not a multiple of the block, LongRoPE factors on a family without them, only one
/// set, or a set of other than n_rot / 2 entries), the architecture is unknown, or the file
/// cannot be written.
void write_synth_gguf(const SynthShape& shape, GgmlType type, uint64_t seed, const std::string& path);
/// As above with per-tensor types (SynthTypes).
void write_synth_gguf(const SynthShape& shape, const SynthTypes& types, uint64_t seed, const std::string& path);

}  // namespace kvevict
