// Synthetic-weight llama models of real shapes, for timing (their outputs are meaningless).
//
// Shapes (Hugging Face config.json of each model): SmolLM2-135M: vocab 49152, hidden 576,
// 30 layers, 9 heads, 3 KV heads, FFN 1536, RoPE theta 100000, tied embeddings; SmolLM2-360M:
// vocab 49152, hidden 960, 32 layers, 15 heads, 5 KV heads, FFN 2560, theta 100000, tied;
// TinyLlama-1.1B (v1.0): vocab 32000, hidden 2048, 22 layers, 32 heads, 4 KV heads, FFN 5632,
// theta 10000, untied output. RMSNorm eps 1e-5 for all. Plus `tiny` (vocab 320, hidden 64,
// 2 layers, 4 heads, 2 KV heads, FFN 128) for tests.
//
// The file is a GGUF v3 of llama.cpp's "llama" naming (model/llama.h), written by
// format/gguf_writer.h: 2-D weights (and token_embd, output) in the requested type, norm
// vectors in F32 (all ones). Weights are uniform in ±sqrt(3 / cols) (unit-variance products),
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
  /// Parameters (elements of every tensor).
  int64_t n_params() const;
};

/// Names of the known shapes ("smollm2-135m", "smollm2-360m", "tinyllama-1.1b", "tiny").
std::vector<std::string> synth_shape_names();

/// Shape by name; throws kvevict::Error listing the known names.
SynthShape synth_shape(const std::string& name);

/// Parses a weight type for synth models: "f32", "f16", "q8_0", "q4_0" (Error otherwise).
GgmlType parse_synth_type(const std::string& name);

/// Writes the synthetic model to `path`. Throws kvevict::Error when the shape is inconsistent
/// (dim % heads, heads % kv_heads, quantised type with dim or FFN not a multiple of 32) or the
/// file cannot be written.
void write_synth_gguf(const SynthShape& shape, GgmlType type, uint64_t seed, const std::string& path);

}  // namespace kvevict
