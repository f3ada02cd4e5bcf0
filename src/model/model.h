// A decoder-only model loaded from a GGUF file or a Hugging Face checkpoint directory — any family
// of model/arch.h (llama, qwen2, qwen3, phi3): hyper-parameters, weights (in place in the file
// mappings, plus a row-interleaved copy of each quantised matmul weight for the integer kernels:
// kernels/x16.h) and the tokenizer. Immutable after load, so one model serves any number of
// sequences. The family is ModelConfig::arch.
//
// Source: llama.cpp's GGUF naming (keys `<arch>.*`, tensors `token_embd`,
// `blk.N.attn_{norm,q,k,v,qkv,q_norm,k_norm,output}`, `blk.N.ffn_{norm,gate,up,down}`,
// `output_norm`, optional `output` — tied to `token_embd` when absent, optional `rope_freqs`);
// for directories, Hugging Face transformers' config.json fields and parameter names of
// LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM / Phi3ForCausalLM, mapped onto the
// same names (model/hf_checkpoint.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "format/safetensors.h"
#include "kernels/matmul.h"
#include "kernels/rope.h"
#include "model/arch.h"
#include "model/tokenizer.h"

namespace kvevict {

/// LongRoPE as a file states it (phi3: Phi-3.5, Phi-4-mini). Two sets of per-band frequency
/// divisors; one is chosen at load for the context size the model is run with, as llama.cpp's
/// get_rope_factors does: the long set when that context size exceeds the original (pre-extension)
/// context length, else the short set. The choice is fixed for the model's lifetime, so every
/// key of a cache is rotated with the same frequencies (re-rotation and TriAttention's
/// statistics included). HF transformers switches per forward call by sequence length instead
/// (long when seq_len > original), which re-rotates nothing already cached.
/// Source: llama.cpp get_rope_factors / n_ctx_orig_yarn, convert_hf_to_gguf.py Phi3MiniModel
/// (tensors, `rope.scaling.original_context_length`, attn_factor = sqrt(1 + ln s / ln original),
/// s = context_length / original); LongRoPE (arXiv 2402.13753) §3.
struct LongRopeInfo {
  std::vector<float> short_factors;  ///< rope_factors_short.weight [n_rot / 2]; empty: no LongRoPE
  std::vector<float> long_factors;   ///< rope_factors_long.weight [n_rot / 2]
  int original_context = 0;          ///< `rope.scaling.original_context_length` (tokens), else context_length
  int64_t context_size = 0;          ///< context size the set was chosen for (tokens)
  bool use_long = false;             ///< context_size > original_context
  bool present() const { return !short_factors.empty(); }
};

/// Hyper-parameters of a model (any supported architecture).
struct ModelConfig {
  std::string arch = "llama";                              ///< `general.architecture` (config.json: its family)
  int n_vocab = 0;                                         ///< tokens
  int dim = 0;                                             ///< model width (embedding_length)
  int n_layers = 0;                                        ///< block_count
  int n_heads = 0;                                         ///< query heads
  int n_kv_heads = 0;                                      ///< key/value heads (GQA: n_heads % n_kv_heads == 0)
  int head_dim = 0;                                        ///< `<arch>.attention.key_length`, else dim / n_heads
  int hidden_dim = 0;                                      ///< SwiGLU width (feed_forward_length)
  int context_length = 0;                                  ///< trained context as the file states it (tokens)
  float rms_eps = 1e-5f;                                   ///< RMSNorm epsilon
  float rope_theta = 10000.0f;                             ///< RoPE base frequency (also rope.theta)
  RopeConfig rope;                                         ///< full RoPE description (style, n_rot, factors, scaling)
  LongRopeInfo longrope;                                   ///< LongRoPE sets (phi3); the one in use is in rope
  int group_size() const { return n_heads / n_kv_heads; }  ///< query heads per KV head
};

/// A 2-D weight [rows, cols] stored row-major in its GGUF type (cols = GGUF dims[0]); the same
/// view the matmul kernels take. Parts of a fused tensor (phi3 attn_qkv, ffn_up) are views of
/// row ranges of it.
using WeightMatrix = WeightView;

/// Weights of one transformer block. Norm weights are converted to float32 at load.
struct LayerWeights {
  std::vector<float> attn_norm;       ///< [dim]
  WeightMatrix wq;                    ///< [n_heads * head_dim, dim]
  WeightMatrix wk;                    ///< [n_kv_heads * head_dim, dim]
  WeightMatrix wv;                    ///< [n_kv_heads * head_dim, dim]
  std::vector<float> bq, bk, bv;      ///< Q/K/V biases [q_dim], [kv_dim], [kv_dim]; empty when absent
  std::vector<float> q_norm, k_norm;  ///< per-head Q/K RMSNorm weights [head_dim]; empty when absent
  WeightMatrix wo;                    ///< [dim, n_heads * head_dim]
  std::vector<float> ffn_norm;        ///< [dim]
  WeightMatrix w_gate;                ///< [hidden_dim, dim]
  WeightMatrix w_up;                  ///< [hidden_dim, dim]
  WeightMatrix w_down;                ///< [dim, hidden_dim]
};

/// Options of Model::load.
struct LoadOptions {
  /// Build the tokenizer from the file's vocabulary. Tests of the forward pass alone pass false
  /// (a byte-level BPE vocabulary's 150k+ merges take a while to load) and feed token ids
  /// directly; tokenizer() then throws.
  bool tokenizer = true;
  /// Print load warnings (ignored metadata such as phi3's sliding window) and the LongRoPE
  /// choice to stderr.
  bool print_warnings = true;
  /// Context size (tokens) the model will be run with; picks the LongRoPE factor set (see
  /// LongRopeInfo). 0 means the file's `context_length`, which is also the longest sequence the
  /// CLI runs without eviction (llama.cpp's `-c 0`). Files without LongRoPE ignore it.
  int64_t context_size = 0;
};

/// A loaded model. Keeps the file mappings alive; weights point into them.
class Model {
 public:
  /// Loads `path`: a GGUF file, or a Hugging Face checkpoint directory (config.json, *.safetensors
  /// with F32/F16/BF16 weights — one file or shards named by model.safetensors.index.json —
  /// tokenizer.json and optionally tokenizer_config.json / generation_config.json /
  /// chat_template.jinja). Throws kvevict::Error (naming file and key/tensor) when the file is not
  /// GGUF,
  /// `general.architecture` is not supported (model/arch.h), a required key or tensor is
  /// missing, a tensor has the wrong shape, head counts or head_dim are inconsistent, or the file
  /// asks for a computation that is not implemented (rope scaling yarn, sliding window outside
  /// phi3, experts), naming the key, or carries inconsistent LongRoPE data (one factor tensor
  /// without the other, a set of other than n_rot / 2 entries, a factor that is not finite and
  /// > 0, `rope.scaling.attn_factor` not finite and > 0, `rope.scaling.type = longrope` without
  /// factor tensors, LongRoPE combined with a linear `rope.scaling.factor`), naming the tensor or
  /// key. A negative options.context_size is refused too. For a directory the same rules apply to
  /// config.json's fields (architectures / model_type, hidden_act, rope_scaling, sliding_window,
  /// attention_bias, mlp_bias, tie_word_embeddings against the stored tensors, expert and
  /// quantization keys, ...) and to its tensors (every stored tensor must be used; dtypes other
  /// than F32/F16/BF16 are refused), and to the safetensors files themselves
  /// (format/safetensors.h); model/hf_checkpoint.cpp lists them.
  static std::unique_ptr<Model> load(const std::string& path, const LoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  /// The family's description (model/arch.h).
  const ArchInfo& arch() const { return *arch_; }
  /// The tokenizer. Throws kvevict::Error when the model was loaded without one.
  const Tokenizer& tokenizer() const;
  /// Metadata the loader accepted but does not apply, one line each (also printed at load).
  const std::vector<std::string>& warnings() const { return warnings_; }
  /// One line saying which LongRoPE set is in use and why (context sizes, attention factor);
  /// empty for files without LongRoPE. Printed at load with print_warnings.
  const std::string& rope_note() const { return rope_note_; }
  /// The GGUF file the model was loaded from. Throws kvevict::Error when it came from a
  /// checkpoint directory (is_gguf() false).
  const GgufFile& gguf() const;
  bool is_gguf() const { return gguf_ != nullptr; }
  /// The path given to load() (file or directory).
  const std::string& path() const { return path_; }
  /// The chat template's Jinja text (`tokenizer.chat_template`; for a directory
  /// chat_template.jinja, else tokenizer_config.json's `chat_template`), or "" when there is none.
  const std::string& chat_template() const { return chat_template_; }
  /// Where the chat template is read from, for messages: "tokenizer.chat_template" (GGUF) or
  /// "chat_template (tokenizer_config.json / chat_template.jinja)".
  std::string chat_template_key() const {
    return gguf_ ? "tokenizer.chat_template" : "chat_template (tokenizer_config.json / chat_template.jinja)";
  }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const WeightMatrix& token_embedding() const { return token_embd_; }     ///< [n_vocab, dim]
  const WeightMatrix& output() const { return output_; }                  ///< [n_vocab, dim]
  const std::vector<float>& output_norm() const { return output_norm_; }  ///< [dim]
  /// Bytes of weights as stored (what a decode step streams from memory).
  int64_t weight_bytes() const { return weight_bytes_; }
  /// Weight type of the attention/FFN matrices of layer 0 (for display).
  GgmlType weight_type() const { return layers_.empty() ? GgmlType::F32 : layers_[0].wq.type; }

 private:
  Model() = default;
  void read_config();
  void read_rope();
  std::string path_, chat_template_;
  std::unique_ptr<GgufFile> gguf_;
  std::vector<SafetensorsFile> safetensors_;
  std::vector<std::vector<uint64_t>> copies_;  ///< aligned copies of misaligned safetensors data
  ModelConfig config_;
  const ArchInfo* arch_ = nullptr;
  std::vector<std::string> warnings_;
  std::string rope_note_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<LayerWeights> layers_;
  WeightMatrix token_embd_, output_;
  std::vector<std::vector<uint8_t>> x16_;  ///< interleaved copies of the matmul weights (kernels/x16.h)
  std::vector<float> output_norm_;
  int64_t weight_bytes_ = 0;
};

}  // namespace kvevict
