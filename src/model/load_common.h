// What the two model loaders (GGUF files: model/loader.cpp; Hugging Face checkpoint directories:
// model/hf_checkpoint.cpp) share: the tensor table the weight reader works on, and the LongRoPE
// set choice. Internal to the model layer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "format/ggml_types.h"
#include "model/model.h"

namespace kvevict {

/// One stored tensor as the loader sees it, whatever file it came from. Tensors are asked for by
/// llama.cpp's GGUF names (model/arch.h); messages name them as stored.
struct TensorEntry {
  std::string name;              ///< name the loader asks for ("blk.0.attn_q.weight")
  std::string stored_name;       ///< name in its file (HF: "model.layers.0.self_attn.q_proj.weight")
  std::string file;              ///< path of the file holding it
  std::vector<int64_t> dims;     ///< GGUF order: dims[0] is the innermost (contiguous) dimension
  bool row_major = false;        ///< messages print shapes outermost first (safetensors' order)
  std::string dtype;             ///< stored type name ("F32", "BF16", "q4_k", ...)
  std::optional<GgmlType> type;  ///< nullopt: a type kvevict does not compute with
  const uint8_t* data = nullptr;
  int64_t n_bytes = 0;
};

/// Chooses the LongRoPE factor set for the context size the model runs with (LongRopeInfo in
/// model/model.h; llama.cpp's get_rope_factors) and fills c.rope.freq_factors and `note`.
/// c.longrope must hold both sets and original_context. `path`, `context_key`, `original_key` and
/// the two set sources name where the figures came from, for the note. Throws kvevict::Error for
/// a negative options.context_size.
void choose_longrope(ModelConfig& c, const LoadOptions& options, const std::string& path,
                     const std::string& context_key, const std::string& original_key, const std::string& short_source,
                     const std::string& long_source, std::string& note);

/// What a Hugging Face checkpoint directory holds, read and checked (model/hf_checkpoint.cpp):
/// the hyper-parameters, the weights under GGUF names, the chat template.
struct HfCheckpoint {
  ModelConfig config;  ///< n_vocab from config.json's vocab_size (checked against the embedding)
  const ArchInfo* arch = nullptr;
  std::vector<SafetensorsFile> files;
  std::vector<TensorEntry> tensors;
  std::vector<std::vector<uint64_t>> copies;  ///< 8-byte-aligned copies of misaligned tensors
  std::vector<std::string> warnings;
  std::string rope_note;
  std::string chat_template;  ///< chat_template.jinja or tokenizer_config.json's; "" when none
};

/// Reads `dir` (config.json, the safetensors weights — one file or shards listed in
/// model.safetensors.index.json — and the chat template). Throws kvevict::Error as Model::load
/// documents for directories.
HfCheckpoint read_hf_checkpoint(const std::string& dir, const LoadOptions& options);

/// The Hugging Face parameter name of a tensor the loader asks for by its GGUF name
/// ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"; phi3's fused
/// "ffn_up.weight" -> "mlp.gate_up_proj.weight"); the name itself when it has no counterpart.
std::string hf_tensor_name(const std::string& gguf_name, const ArchInfo& arch);

}  // namespace kvevict
