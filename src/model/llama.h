// Llama-architecture model loaded from GGUF: hyper-parameters, weights (in place in the mapping)
// and the tokenizer. Immutable after load, so one model serves any number of sequences.
//
// Source: llama.cpp's GGUF naming for `general.architecture = "llama"` (keys `llama.*`, tensors
// `token_embd`, `blk.N.attn_{norm,q,k,v,output}`, `blk.N.ffn_{norm,gate,up,down}`,
// `output_norm`, optional `output` — tied to `token_embd` when absent).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "kernels/matmul.h"
#include "model/tokenizer.h"

namespace kvevict {

/// Hyper-parameters of a llama-architecture model.
struct LlamaConfig {
  int n_vocab = 0;       ///< tokens
  int dim = 0;           ///< model width (embedding_length)
  int n_layers = 0;      ///< block_count
  int n_heads = 0;       ///< query heads
  int n_kv_heads = 0;    ///< key/value heads (GQA: n_heads % n_kv_heads == 0)
  int head_dim = 0;      ///< dim / n_heads
  int hidden_dim = 0;    ///< SwiGLU width (feed_forward_length)
  int context_length = 0;  ///< trained context as stated in the GGUF (tokens)
  float rms_eps = 1e-5f;   ///< RMSNorm epsilon
  float rope_theta = 10000.0f;  ///< RoPE base frequency
  int group_size() const { return n_heads / n_kv_heads; }  ///< query heads per KV head
};

/// A 2-D weight [rows, cols] stored row-major in its GGUF type (cols = GGUF dims[0]); the same
/// view the matmul kernels take.
using WeightMatrix = WeightView;

/// Weights of one transformer block. Norm weights are converted to float32 at load.
struct LlamaLayer {
  std::vector<float> attn_norm;  ///< [dim]
  WeightMatrix wq;               ///< [n_heads * head_dim, dim]
  WeightMatrix wk;               ///< [n_kv_heads * head_dim, dim]
  WeightMatrix wv;               ///< [n_kv_heads * head_dim, dim]
  WeightMatrix wo;               ///< [dim, n_heads * head_dim]
  std::vector<float> ffn_norm;   ///< [dim]
  WeightMatrix w_gate;           ///< [hidden_dim, dim]
  WeightMatrix w_up;             ///< [hidden_dim, dim]
  WeightMatrix w_down;           ///< [dim, hidden_dim]
};

/// A loaded llama model. Keeps the GGUF mapping alive; weights point into it.
class LlamaModel {
 public:
  /// Loads `path`. Throws kvevict::Error (naming file and key/tensor) when the file is not GGUF,
  /// `general.architecture` is not "llama", a required key or tensor is missing, a tensor has
  /// the wrong shape, or head counts are inconsistent.
  static std::unique_ptr<LlamaModel> load(const std::string& path);

  const LlamaConfig& config() const { return config_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const GgufFile& gguf() const { return file_; }
  const std::vector<LlamaLayer>& layers() const { return layers_; }
  const WeightMatrix& token_embedding() const { return token_embd_; }  ///< [n_vocab, dim]
  const WeightMatrix& output() const { return output_; }               ///< [n_vocab, dim]
  const std::vector<float>& output_norm() const { return output_norm_; }  ///< [dim]
  bool tied_output() const { return tied_output_; }
  /// Bytes of weights as stored (what a decode step streams from memory).
  int64_t weight_bytes() const { return weight_bytes_; }
  /// Weight type of the attention/FFN matrices of layer 0 (for display).
  GgmlType weight_type() const { return layers_.empty() ? GgmlType::F32 : layers_[0].wq.type; }

 private:
  explicit LlamaModel(GgufFile f) : file_(std::move(f)) {}
  GgufFile file_;
  LlamaConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<LlamaLayer> layers_;
  WeightMatrix token_embd_, output_;
  std::vector<float> output_norm_;
  bool tied_output_ = false;
  int64_t weight_bytes_ = 0;
};

}  // namespace kvevict
