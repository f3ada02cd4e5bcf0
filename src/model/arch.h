// Per-architecture description of the GGUF model families kvevict runs with one forward pass
// (model/forward.h): which tensors a block has and which options change the computation.
//
// Families (`general.architecture`):
//   llama  — Llama 1/2/3.x, SmolLM, TinyLlama, DeepSeek-R1-Distill-Llama: separate Q/K/V
//            (optional biases), adjacent-pair RoPE, optional `rope_freqs.weight` (llama3 scaling).
//   qwen2  — Qwen2/2.5, DeepSeek-R1-Distill-Qwen: Q/K/V biases required, NEOX RoPE.
//   qwen3  — Qwen3: per-head RMSNorm of Q and K before RoPE, head_dim from key_length, NEOX RoPE.
//   phi3   — Phi-3/3.5, Phi-4(-mini, -reasoning): fused `attn_qkv` [Q|K|V] and fused `ffn_up`
//            [gate|up], NEOX RoPE over `rope.dimension_count` dims (partial rotary), optional
//            LongRoPE (`rope_factors_short/long.weight` + `rope.scaling.attn_factor`,
//            Phi-3.5 / Phi-4-mini; model/model.h says which set is used).
// Common to all: pre-norm RMSNorm blocks, SwiGLU FFN, GQA, tied output when `output.weight` is
// absent.
//
// Source: llama.cpp's GGUF tensor/key naming (llm_arch tables, gguf-py constants) and its
// builders for LLM_ARCH_LLAMA / QWEN2 / QWEN3 / PHI3 (rope type NORM for llama, NEOX for the
// others); ../shared/reference/README-families.md lists, per family, what a loader must do.
#pragma once

#include <string>
#include <vector>

#include "kernels/rope.h"

namespace kvevict {

/// Whether a tensor must be present, may be present, or is not part of the family.
enum class TensorUse { None, Optional, Required };

/// Everything that distinguishes one family from another: the loader, the forward pass, the
/// tokenizer and the synthetic-model writer read these fields and never test a family's name.
/// Rows are written with designated initialisers (arch.cpp); a field left out keeps the default
/// below, which is the plain llama behaviour.
struct ArchInfo {
  std::string name;  ///< `general.architecture` value; also the metadata key prefix
  RopeStyle rope_style = RopeStyle::Adjacent;
  TensorUse qkv_bias = TensorUse::None;  ///< blk.N.attn_{q,k,v}.bias, added before RoPE
  bool qk_norm = false;                  ///< blk.N.attn_{q,k}_norm.weight: RMSNorm per head before RoPE
  bool fused_qkv = false;                ///< blk.N.attn_qkv.weight rows [Q | K | V] instead of attn_q/k/v
  bool fused_gate_up = false;            ///< blk.N.ffn_up.weight rows [gate | up], no ffn_gate
  bool rope_freqs = false;               ///< may carry rope_freqs.weight (per-band frequency divisors)
  /// `<arch>.attention.sliding_window` is accepted and ignored (full attention) as llama.cpp
  /// does for phi3; for other families the key is refused.
  bool ignore_sliding_window = false;
  /// May carry LongRoPE factor sets rope_factors_short.weight and rope_factors_long.weight.
  bool longrope = false;
  /// Lower-case fragments of `general.name` for which whitespace after special tokens is dropped
  /// (llama.cpp's RSTRIP attribute for Phi-3 vocabularies, model/tokenizer.h). llama.cpp matches
  /// the model's name, not its architecture, so the tokenizer checks every row's fragments
  /// against every file.
  std::vector<std::string> rstrip_special_names{};
  /// Shape `kvevict tools synth-gguf --arch NAME` writes when no --shape is given (model/synth.h):
  /// the real model of the family whose size speed figures imitate.
  std::string synth_shape{};
};

/// Description of architecture `name`. Throws kvevict::Error naming `general.architecture`, the
/// value and the supported list when it is not one of supported_architectures(); `path` is the
/// file named in the message.
const ArchInfo& arch_info(const std::string& name, const std::string& path);

/// Every supported architecture, in table order (llama, qwen2, qwen3, phi3).
const std::vector<ArchInfo>& architectures();

/// Names of the supported architectures, in table order ("llama", "qwen2", "qwen3", "phi3").
std::vector<std::string> supported_architectures();

/// Names of the architectures whose row satisfies `pred`, in table order (for messages and help
/// texts, e.g. the families with LongRoPE).
std::vector<std::string> architectures_where(bool (*pred)(const ArchInfo&));

/// GGUF tensor names of one block (prefix "blk.N.") and the model (llama.cpp naming).
namespace tensor_name {
inline const char* const kTokenEmbd = "token_embd.weight";
inline const char* const kOutputNorm = "output_norm.weight";
inline const char* const kOutput = "output.weight";
inline const char* const kRopeFreqs = "rope_freqs.weight";
inline const char* const kRopeFactorsLong = "rope_factors_long.weight";
inline const char* const kRopeFactorsShort = "rope_factors_short.weight";
}  // namespace tensor_name

}  // namespace kvevict
