#include "model/forward.h"

#include <fmt/format.h>

#include <cmath>

#include "eviction/selector.h"
#include "model/attention.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict {

void matmul(const WeightMatrix& W, const float* x, int64_t T, float* y, ThreadPool& pool) {
  const int64_t rows = W.rows, cols = W.cols;
  // Small jobs are not worth waking the workers for.
  const int64_t grain = 16;
  const int64_t n_chunks = (rows + grain - 1) / grain;
  const auto body = [&](int64_t c0, int64_t c1) {
    for (int64_t r = c0 * grain; r < std::min(rows, c1 * grain); ++r) {
      const uint8_t* w = W.row(r);
      for (int64_t t = 0; t < T; ++t) y[t * rows + r] = dot_row(W.type, w, x + t * cols, cols);
    }
  };
  if (rows * cols * T < 32768) body(0, n_chunks);
  else pool.parallel_for(n_chunks, body);
}

void rmsnorm(const float* x, const float* w, int64_t n, float eps, float* out) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
}

namespace {
template <typename T>
T* sized(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}
}  // namespace

void llama_forward(const LlamaModel& model, const Rope& rope, SequenceKv& kv,
                   std::span<const int32_t> tokens, int64_t pos0, PositionMode mode,
                   LogitsWanted wanted, std::vector<float>& logits, SelectorState* observer,
                   bool want_probs, bool is_prefill, ThreadPool& pool, ForwardBuffers& buf) {
  const LlamaConfig& c = model.config();
  const auto T = static_cast<int64_t>(tokens.size());
  if (T == 0) throw Error("forward pass called with no tokens");
  const int64_t len0 = kv.length(0);
  if (len0 + T > kv.capacity())
    throw Error(fmt::format("KV cache full: {} slots + {} new tokens exceed capacity {}", len0, T, kv.capacity()));
  for (int32_t t : tokens)
    if (t < 0 || t >= c.n_vocab) throw Error(fmt::format("token id {} outside vocabulary [0, {})", t, c.n_vocab));

  const int dim = c.dim, hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads, group = c.group_size();
  const int64_t qd = int64_t{nh} * hd, kvd = int64_t{nkv} * hd;
  float* x = sized(buf.x, T * dim);
  float* xn = sized(buf.xn, T * dim);
  float* q = sized(buf.q, T * qd);
  float* k = sized(buf.k, T * kvd);
  float* v = sized(buf.v, T * kvd);
  float* att = sized(buf.att, T * qd);
  float* g = sized(buf.hidden_gate, T * c.hidden_dim);
  float* u = sized(buf.hidden_up, T * c.hidden_dim);
  float* tmp = sized(buf.tmp, T * dim);
  float* probs = (observer && want_probs) ? sized(buf.probs, T * nh * (len0 + T)) : nullptr;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  for (int64_t t = 0; t < T; ++t) dequantize_row(model.token_embedding().type, model.token_embedding().row(tokens[static_cast<size_t>(t)]), x + t * dim, dim);

  for (int l = 0; l < c.n_layers; ++l) {
    const LlamaLayer& L = model.layers()[static_cast<size_t>(l)];
    for (int64_t t = 0; t < T; ++t) rmsnorm(x + t * dim, L.attn_norm.data(), dim, c.rms_eps, xn + t * dim);
    matmul(L.wq, xn, T, q, pool);
    matmul(L.wk, xn, T, k, pool);
    matmul(L.wv, xn, T, v, pool);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t rope_pos = mode == PositionMode::Logical ? pos0 + t : len0 + t;
      for (int h = 0; h < nh; ++h) rope.rotate(q + t * qd + int64_t{h} * hd, rope_pos);
      for (int h = 0; h < nkv; ++h) {
        float* kh = k + t * kvd + int64_t{h} * hd;
        rope.rotate(kh, rope_pos);
        const int64_t slot = len0 + t;
        std::copy(kh, kh + hd, kv.keys(l, h) + slot * hd);
        std::copy(v + t * kvd + int64_t{h} * hd, v + t * kvd + int64_t{h + 1} * hd, kv.values(l, h) + slot * hd);
        kv.positions(l, h)[slot] = static_cast<int32_t>(pos0 + t);
      }
    }
    kv.set_length(l, len0 + T);

    // Attention: one work item per (token, query head); token t sees slots [0, len0 + t].
    pool.parallel_for(T * nh, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t t = i / nh;
        const int h = static_cast<int>(i % nh), kvh = h / group;
        const int64_t n_slots = len0 + t + 1;
        const float* qh = q + t * qd + int64_t{h} * hd;
        float* out = att + t * qd + int64_t{h} * hd;
        if (probs) attend_with_probs(qh, kv.keys(l, kvh), kv.values(l, kvh), n_slots, hd, scale, out, probs + (t * nh + h) * (len0 + T));
        else attend_online(qh, kv.keys(l, kvh), kv.values(l, kvh), n_slots, hd, scale, out);
      }
    });
    if (observer) {
      for (int64_t t = 0; t < T; ++t) {
        AttentionObservation obs;
        obs.layer = l;
        obs.position = pos0 + t;
        obs.prefill = is_prefill;
        obs.n_heads = nh;
        obs.group_size = group;
        obs.head_dim = hd;
        obs.n_slots = len0 + t + 1;
        obs.queries = q + t * qd;
        std::vector<float> packed;
        if (probs) {
          // Rows of the token's heads are strided by len0 + T; repack to [n_heads, n_slots].
          packed.resize(static_cast<size_t>(nh * obs.n_slots));
          for (int h = 0; h < nh; ++h)
            std::copy(probs + (t * nh + h) * (len0 + T), probs + (t * nh + h) * (len0 + T) + obs.n_slots,
                      packed.begin() + h * obs.n_slots);
          obs.probs = packed.data();
        }
        observer->observe(obs);
      }
    }
    matmul(L.wo, att, T, tmp, pool);
    for (int64_t i = 0; i < T * dim; ++i) x[i] += tmp[i];

    for (int64_t t = 0; t < T; ++t) rmsnorm(x + t * dim, L.ffn_norm.data(), dim, c.rms_eps, xn + t * dim);
    matmul(L.w_gate, xn, T, g, pool);
    matmul(L.w_up, xn, T, u, pool);
    for (int64_t i = 0; i < T * c.hidden_dim; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];  // SiLU(g)·u
    matmul(L.w_down, g, T, tmp, pool);
    for (int64_t i = 0; i < T * dim; ++i) x[i] += tmp[i];
  }

  if (wanted == LogitsWanted::None) return;
  const int64_t first = wanted == LogitsWanted::Last ? T - 1 : 0;
  const int64_t n_out = T - first;
  for (int64_t t = first; t < T; ++t) rmsnorm(x + t * dim, model.output_norm().data(), dim, c.rms_eps, xn + (t - first) * dim);
  logits.resize(static_cast<size_t>(n_out * c.n_vocab));
  matmul(model.output(), xn, n_out, logits.data(), pool);
}

}  // namespace kvevict
