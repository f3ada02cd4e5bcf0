// The forward pass over a sequence's budgeted KV cache, one for every family of model/arch.h.
//
// Source: LLaMA (arXiv 2302.13971) §2: pre-norm RMSNorm (Zhang & Sennrich, arXiv 1910.07467),
// SwiGLU FFN (Shazeer, arXiv 2002.05202), RoPE (kernels/rope.h: adjacent or NEOX pairs, partial
// rotary, frequency factors); grouped-query attention (Ainslie et al., arXiv 2305.13245): query
// head h reads KV head h / group_size. Family options (model/arch.h), applied between the Q/K/V
// projections and RoPE: Q/K/V biases (Qwen2), per-head RMSNorm of Q and K (Qwen3); fused
// projections (Phi-3) are split into views at load, so the pass does not see them.
// Activations are float32. Kernels: kernels/matmul.h (weights of any supported type; Q8_0/Q4_0
// weights take Q8_0-quantised activations), kernels/attention.h (tiled online softmax, one pass
// per GQA group, f32 or f16 cache).
//
// Batching: a forward call runs any number of *segments* — (cache, tokens) pairs of different
// sequences — through one set of matmuls, so each weight matrix is streamed once per call.
// Attention runs per segment over its own cache. A segment's results do not depend on which
// other segments share the call (every kernel computes each output row independently).
#pragma once

#include <atomic>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/matmul.h"
#include "kernels/rope.h"
#include "kvcache/kv_cache.h"
#include "model/model.h"
#include "model/observer.h"

namespace kvevict {

class ThreadPool;

/// Number of attention-probability rows written since start (one per query head and token).
/// Only the two-pass kernel (segments with want_probs) increments it; tests use it to prove
/// that policies which need no scores never cause probabilities to be computed or stored.
extern std::atomic<int64_t> g_attention_probability_rows;

/// Which logits a forward call returns.
enum class LogitsWanted { None, Last, All };

/// Scratch activations reused across calls (sized on demand; one per concurrently running call).
struct ForwardBuffers {
  std::vector<float> x, xn, q, k, v, att, hidden_gate, hidden_up, tmp, probs;
  std::vector<float> attn_part;  ///< partial softmaxes of split attention rows
  MatmulScratch mm;
};

/// One sequence's part of a forward call.
struct ForwardSegment {
  SequenceKv* kv = nullptr;         ///< its cache (appended to)
  std::span<const int32_t> tokens;  ///< its new tokens [T_i] (T_i >= 1)
  int64_t pos0 = 0;                 ///< logical position of tokens[0]
  PositionMode mode = PositionMode::Logical;
  AttentionObserver* observer = nullptr;  ///< receives queries (and probs with want_probs)
  bool want_probs = false;
  bool is_prefill = false;  ///< passed on as AttentionObservation::prefill
};

/// What a forward call runs with (the model, its RoPE tables, threads and scratch) and what it
/// writes. Written with designated initialisers at the call: {.model = m, .rope = r, .pool = p,
/// .buf = b, .wanted = LogitsWanted::All, .allow_blas = true}.
struct ForwardArgs {
  const Model& model;
  const Rope& rope;  ///< built from model.config().rope
  ThreadPool& pool;
  ForwardBuffers& buf;  ///< one per concurrently running call
  LogitsWanted wanted = LogitsWanted::Last;
  /// Matmuls with at least 16 rows may use BLAS (prefill; slightly different rounding, and
  /// results that depend on how many rows a call has).
  bool allow_blas = false;
};

/// Runs every segment's tokens through the model in one pass (weights streamed once).
/// Per segment the semantics are model_forward's. logits: Last -> [n_segments, n_vocab] (each
/// segment's last token); All -> [Σ T_i, n_vocab] in segment order; None -> untouched.
/// Throws kvevict::Error as model_forward for any segment (before any cache is modified).
void model_forward_segments(const ForwardArgs& args, std::span<const ForwardSegment> segments,
                            std::vector<float>& logits);

/// Runs one segment's tokens [T] through the model. Token t has logical position pos0 + t and
/// is appended at slot length(layer) + t of every (layer, KV head) of segment.kv; it attends to
/// slots [0, length + t] (causal). RoPE position: pos0 + t (PositionMode::Logical) or its slot
/// index (PositionMode::Cache). logits: [n_vocab] (Last) or [T, n_vocab] (All), resized here.
/// observer: when non-null, each token's post-RoPE queries are delivered per layer, and with
/// want_probs also its attention probabilities; without want_probs none are computed.
/// is_prefill is passed on to the observer (AttentionObservation::prefill).
/// Throws kvevict::Error when a token id is out of range or the cache lacks room for T slots.
void model_forward(const ForwardArgs& args, const ForwardSegment& segment, std::vector<float>& logits);

/// y[T, W.rows] = x[T, W.cols] · Wᵀ, rows split across the pool (each output computed by one
/// thread in a fixed order, so results do not depend on the thread count). Q8_0/Q4_0 weights
/// use Q8_0-quantised activations (kernels/matmul.h).
void matmul(const WeightMatrix& W, const float* x, int64_t T, float* y, ThreadPool& pool);

}  // namespace kvevict
