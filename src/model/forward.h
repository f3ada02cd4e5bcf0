// The llama forward pass over a sequence's budgeted KV cache.
//
// Source: LLaMA (arXiv 2302.13971) §2: pre-norm RMSNorm (Zhang & Sennrich, arXiv 1910.07467),
// SwiGLU FFN (Shazeer, arXiv 2002.05202), RoPE (model/rope.h); grouped-query attention
// (Ainslie et al., arXiv 2305.13245): query head h reads KV head h / group_size.
// Everything is float32, accumulated in float32.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvcache/kv_cache.h"
#include "model/llama.h"
#include "model/rope.h"

namespace kvevict {

class SelectorState;
class ThreadPool;

/// Which logits a forward call returns.
enum class LogitsWanted { None, Last, All };

/// Scratch activations reused across calls (sized on demand; one per concurrently running call).
struct ForwardBuffers {
  std::vector<float> x, xn, q, k, v, att, hidden_gate, hidden_up, tmp, probs;
};

/// Runs `tokens` [T] through the model. Token t has logical position pos0 + t and is appended at
/// slot length(layer) + t of every (layer, KV head); it attends to slots [0, length + t] (causal).
/// RoPE position: pos0 + t (PositionMode::Logical) or its slot index (PositionMode::Cache).
/// logits: [n_vocab] (Last) or [T, n_vocab] (All), resized here.
/// observer: when non-null, each token's post-RoPE queries are delivered per layer, and with
/// want_probs also its attention probabilities; without want_probs none are computed.
/// is_prefill is passed on to the observer (AttentionObservation::prefill).
/// Throws kvevict::Error when a token id is out of range or the cache lacks room for T slots.
void llama_forward(const LlamaModel& model, const Rope& rope, SequenceKv& kv,
                   std::span<const int32_t> tokens, int64_t pos0, PositionMode mode,
                   LogitsWanted wanted, std::vector<float>& logits, SelectorState* observer,
                   bool want_probs, bool is_prefill, ThreadPool& pool, ForwardBuffers& buf);

/// y[T, W.rows] = x[T, W.cols] · Wᵀ, rows split across the pool (each output computed by one
/// thread in a fixed order, so results do not depend on the thread count).
void matmul(const WeightMatrix& W, const float* x, int64_t T, float* y, ThreadPool& pool);

/// out[n] = x[n] / sqrt(mean(x²) + eps) * w[n].
void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out);

}  // namespace kvevict
