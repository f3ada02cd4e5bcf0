// The forward pass, step by step. model_forward_segments at the bottom reads top to bottom:
// plan the batch, embed, RoPE angles, then per layer attention (project, RoPE + store, attend,
// merge split rows, observe, output projection) and FFN, then the logits.
#include "model/forward.h"

#include <fmt/format.h>

#include <atomic>
#include <cmath>

#include "kernels/attention.h"
#include "kernels/rmsnorm.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict {

std::atomic<int64_t> g_attention_probability_rows{0};

void matmul(const WeightMatrix& W, const float* x, int64_t T, float* y, ThreadPool& pool) {
  MatmulScratch scratch;
  const MatmulJob job{W, y};
  matmul_jobs(std::span<const MatmulJob>(&job, 1), x, T, pool, scratch);
}

namespace {

template <typename T>
T* sized(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}
inline size_t at(int64_t i) { return static_cast<size_t>(i); }

// Where each segment's tokens sit in the call: rows [row0[s], row0[s+1]) of every activation,
// cache slots from len0[s], probabilities (segments that want them) from prob_off[s].
struct Batch {
  std::span<const ForwardSegment> seg;
  std::vector<int64_t> row0, len0, prob_off;
  std::vector<int32_t> seg_of_row;
  int64_t T = 0;  ///< rows (tokens) in the call
  int64_t tokens(size_t s) const { return static_cast<int64_t>(seg[s].tokens.size()); }
  bool wants_probs(size_t s) const { return seg[s].observer && seg[s].want_probs; }
};

// Checks every segment (before any cache is modified) and lays out the rows.
Batch plan_batch(const ModelConfig& c, std::span<const ForwardSegment> segments) {
  if (segments.empty()) throw Error("forward pass called with no sequences");
  Batch b;
  b.seg = segments;
  const size_t n = segments.size();
  b.row0.assign(n + 1, 0);
  b.len0.assign(n, 0);
  b.prob_off.assign(n + 1, 0);
  for (size_t s = 0; s < n; ++s) {
    const ForwardSegment& seg = segments[s];
    const int64_t Ts = b.tokens(s);
    if (Ts == 0) throw Error("forward pass called with no tokens");
    if (!seg.kv) throw Error("forward pass: segment without a KV cache");
    const int64_t len = seg.kv->length(0);
    if (len + Ts > seg.kv->capacity())
      throw Error(
          fmt::format("KV cache full: {} slots + {} new tokens exceed capacity {}", len, Ts, seg.kv->capacity()));
    for (int32_t t : seg.tokens)
      if (t < 0 || t >= c.n_vocab) throw Error(fmt::format("token id {} outside vocabulary [0, {})", t, c.n_vocab));
    for (size_t o = 0; o < s; ++o)
      if (segments[o].kv == seg.kv) throw Error("forward pass: two segments share one KV cache");
    b.row0[s + 1] = b.row0[s] + Ts;
    b.len0[s] = len;
    // Probability rows of stride (len0 + T_s), one block per segment that asked for them.
    b.prob_off[s + 1] = b.prob_off[s] + (b.wants_probs(s) ? Ts * c.n_heads * (len + Ts) : 0);
  }
  b.T = b.row0.back();
  b.seg_of_row.resize(at(b.T));
  for (size_t s = 0; s < n; ++s)
    for (int64_t r = b.row0[s]; r < b.row0[s + 1]; ++r) b.seg_of_row[at(r)] = static_cast<int32_t>(s);
  return b;
}

// One attention work item: slots [begin, end) of a row's n_slots for one KV head; scratch: float
// offset of its partial (acc[G*hd], m[G], l[G]) when the row is split.
struct AttnItem {
  int64_t row;
  int kv_head;
  int64_t begin, end, n_slots, scratch;
};

// Slots per attention chunk: rows up to 512 slots are one chunk; longer rows are split into
// chunks of max(512, ceil(n / 64)) slots (at most 64 chunks, what attend_merge combines).
int64_t attention_chunk(int64_t n_slots) {
  constexpr int64_t kSplitSlots = 512;
  if (n_slots <= kSplitSlots) return n_slots;
  return std::max(kSplitSlots, (n_slots + 63) / 64);
}

// The forward pass of one call: activations sized for the batch, one method per step.
class ForwardPass {
 public:
  ForwardPass(const Model& model, const Rope& rope, const Batch& b, ThreadPool& pool, ForwardBuffers& buf,
              bool allow_blas)
      : m_(model), c_(model.config()), rope_(rope), b_(b), pool_(pool), buf_(buf), blas_(allow_blas) {
    const int64_t T = b.T;
    qd_ = int64_t{c_.n_heads} * c_.head_dim;
    kvd_ = int64_t{c_.n_kv_heads} * c_.head_dim;
    x_ = sized(buf.x, T * c_.dim);
    xn_ = sized(buf.xn, T * c_.dim);
    q_ = sized(buf.q, T * qd_);
    k_ = sized(buf.k, T * kvd_);
    v_ = sized(buf.v, T * kvd_);
    att_ = sized(buf.att, T * qd_);
    gate_ = sized(buf.hidden_gate, T * c_.hidden_dim);
    up_ = sized(buf.hidden_up, T * c_.hidden_dim);
    tmp_ = sized(buf.tmp, T * c_.dim);
    probs_ = b.prob_off.back() > 0 ? sized(buf.probs, b.prob_off.back()) : nullptr;
  }

  // x[row] = token embedding of every segment's tokens.
  void embed_tokens() {
    const WeightMatrix& E = m_.token_embedding();
    for (size_t s = 0; s < b_.seg.size(); ++s)
      for (int64_t t = 0; t < b_.tokens(s); ++t)
        dequantize_row(E.type, E.row(b_.seg[s].tokens[at(t)]), x_ + (b_.row0[s] + t) * c_.dim, c_.dim);
  }

  // cos/sin of every token's RoPE angles (logical position, or slot index in cache mode),
  // shared by all layers and heads.
  void rope_angles() {
    const int nr = rope_.n_rot();
    cs_.assign(at(b_.T * nr), 0.0);
    for (size_t s = 0; s < b_.seg.size(); ++s) {
      const ForwardSegment& seg = b_.seg[s];
      for (int64_t t = 0; t < b_.tokens(s); ++t) {
        const int64_t pos = seg.mode == PositionMode::Logical ? seg.pos0 + t : b_.len0[s] + t;
        rope_.angles(pos, cs_.data() + (b_.row0[s] + t) * nr);
      }
    }
  }

  // Pre-norm attention block: x += Wo · attention(RoPE(project(rmsnorm(x)))).
  void attention_block(int l) {
    const LayerWeights& L = m_.layers()[at(l)];
    project_qkv(L);
    rope_and_store(l);
    plan_attention();
    run_attention(l);
    merge_split_rows();
    observe(l);
    run_jobs({{L.wo, tmp_}}, att_, b_.T);
    for (int64_t i = 0; i < b_.T * c_.dim; ++i) x_[i] += tmp_[i];
  }

  // Pre-norm SwiGLU block: x += W_down · (SiLU(W_gate · h) ⊙ (W_up · h)), h = rmsnorm(x).
  void ffn_block(int l) {
    const LayerWeights& L = m_.layers()[at(l)];
    const int64_t T = b_.T;
    for (int64_t t = 0; t < T; ++t) rmsnorm(x_ + t * c_.dim, L.ffn_norm.data(), c_.dim, c_.rms_eps, xn_ + t * c_.dim);
    run_jobs({{L.w_gate, gate_}, {L.w_up, up_}}, xn_, T);
    for (int64_t i = 0; i < T * c_.hidden_dim; ++i) gate_[i] = gate_[i] / (1.0f + std::exp(-gate_[i])) * up_[i];
    run_jobs({{L.w_down, tmp_}}, gate_, T);
    for (int64_t i = 0; i < T * c_.dim; ++i) x_[i] += tmp_[i];
  }

  // Final RMSNorm and LM head for the wanted rows (packed): Last -> each segment's last token.
  void output_logits(LogitsWanted wanted, std::vector<float>& logits) {
    if (wanted == LogitsWanted::None) return;
    std::vector<int64_t> rows;
    if (wanted == LogitsWanted::All) {
      for (int64_t r = 0; r < b_.T; ++r) rows.push_back(r);
    } else {
      for (size_t s = 0; s < b_.seg.size(); ++s) rows.push_back(b_.row0[s + 1] - 1);
    }
    const auto n = static_cast<int64_t>(rows.size());
    for (int64_t i = 0; i < n; ++i)
      rmsnorm(x_ + rows[at(i)] * c_.dim, m_.output_norm().data(), c_.dim, c_.rms_eps, xn_ + i * c_.dim);
    logits.resize(at(n * c_.n_vocab));
    run_jobs({{m_.output(), logits.data()}}, xn_, n);
  }

 private:
  void run_jobs(std::initializer_list<MatmulJob> jobs, const float* x, int64_t T) {
    matmul_jobs(std::span<const MatmulJob>(jobs.begin(), jobs.size()), x, T, pool_, buf_.mm, blas_);
  }

  // q, k, v = projections of rmsnorm(x), plus biases (qwen2) and per-head Q/K RMSNorm (qwen3).
  void project_qkv(const LayerWeights& L) {
    const int64_t T = b_.T;
    const int hd = c_.head_dim;
    for (int64_t t = 0; t < T; ++t) rmsnorm(x_ + t * c_.dim, L.attn_norm.data(), c_.dim, c_.rms_eps, xn_ + t * c_.dim);
    run_jobs({{L.wq, q_}, {L.wk, k_}, {L.wv, v_}}, xn_, T);
    const auto add_bias = [T](float* y, const std::vector<float>& bias, int64_t width) {
      if (bias.empty()) return;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < width; ++i) y[t * width + i] += bias[at(i)];
    };
    add_bias(q_, L.bq, qd_);
    add_bias(k_, L.bk, kvd_);
    add_bias(v_, L.bv, kvd_);
    const auto head_norm = [&](float* y, const std::vector<float>& w, int64_t n_heads) {
      if (w.empty()) return;
      for (int64_t h = 0; h < T * n_heads; ++h) rmsnorm(y + h * hd, w.data(), hd, c_.rms_eps, y + h * hd);
    };
    head_norm(q_, L.q_norm, c_.n_heads);
    head_norm(k_, L.k_norm, c_.n_kv_heads);
  }

  // Rotates q and k in place and appends k, v and the logical positions to each segment's cache.
  void rope_and_store(int l) {
    const int hd = c_.head_dim, nr = rope_.n_rot();
    for (size_t s = 0; s < b_.seg.size(); ++s) {
      const ForwardSegment& seg = b_.seg[s];
      const int64_t base = b_.len0[s];
      for (int64_t t = 0; t < b_.tokens(s); ++t) {
        const int64_t row = b_.row0[s] + t;
        const double* rcs = cs_.data() + row * nr;
        for (int h = 0; h < c_.n_heads; ++h) rope_.apply(q_ + row * qd_ + int64_t{h} * hd, rcs);
        for (int h = 0; h < c_.n_kv_heads; ++h) {
          float* kh = k_ + row * kvd_ + int64_t{h} * hd;
          rope_.apply(kh, rcs);
          seg.kv->store(l, h, base + t, kh, v_ + row * kvd_ + int64_t{h} * hd);
          seg.kv->positions(l, h)[base + t] = static_cast<int32_t>(seg.pos0 + t);
        }
      }
      seg.kv->set_length(l, base + b_.tokens(s));
    }
  }

  // Work items: (row, KV head, chunk of slots). Rows with more than 512 slots are split into
  // fixed chunks (a function of the slot count only) whose partial softmaxes are merged in chunk
  // order afterwards, so one long sequence still spreads over every thread and results never
  // depend on the batch or the thread count. A segment asking for probabilities runs per query
  // head, whole rows (two-pass kernel); others per GQA group (one pass over K/V for G heads).
  void plan_attention() {
    const int group = c_.group_size(), nkv = c_.n_kv_heads;
    items_.clear();
    scratch_floats_ = 0;
    attn_work_ = 0;  // multiply-adds: scores and values, every query head
    for (int64_t row = 0; row < b_.T; ++row) {
      const auto s = at(b_.seg_of_row[at(row)]);
      const int64_t n_slots = b_.len0[s] + (row - b_.row0[s]) + 1;
      attn_work_ += n_slots * nkv * group * c_.head_dim * 2;
      const int64_t chunk = b_.wants_probs(s) ? n_slots : attention_chunk(n_slots);
      for (int kvh = 0; kvh < nkv; ++kvh)
        for (int64_t c0 = 0; c0 < n_slots; c0 += chunk) {
          items_.push_back({row, kvh, c0, std::min(n_slots, c0 + chunk), n_slots, scratch_floats_});
          if (chunk < n_slots) scratch_floats_ += int64_t{group} * (c_.head_dim + 2);
        }
    }
    part_ = scratch_floats_ > 0 ? sized(buf_.attn_part, scratch_floats_) : nullptr;
  }

  // Runs every work item on the pool (items handed out in order through an atomic counter).
  void run_attention(int l) {
    std::atomic<int64_t> next{0};
    const auto n_items = static_cast<int64_t>(items_.size());
    pool_.parallel_for(
        std::min<int64_t>(pool_.size(), n_items),
        [&](int64_t, int64_t) {
          for (int64_t i = next.fetch_add(1); i < n_items; i = next.fetch_add(1)) attend_item(l, items_[at(i)]);
        },
        attn_work_);
  }

  template <typename KvT>
  void attend_item_typed(const AttnItem& it, const KvT* K, const KvT* V) {
    const int group = c_.group_size(), hd = c_.head_dim;
    const auto s = at(b_.seg_of_row[at(it.row)]);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const float* qg = q_ + it.row * qd_ + int64_t{it.kv_head} * group * hd;
    float* out = att_ + it.row * qd_ + int64_t{it.kv_head} * group * hd;
    if (b_.wants_probs(s)) {
      const int64_t t = it.row - b_.row0[s], stride = b_.len0[s] + b_.tokens(s);
      for (int gi = 0; gi < group; ++gi) {
        const int h = it.kv_head * group + gi;
        float* pr = probs_ + b_.prob_off[s] + (t * c_.n_heads + h) * stride;
        attend_probs(qg + int64_t{gi} * hd, K, V, it.n_slots, hd, scale, out + int64_t{gi} * hd, pr);
        g_attention_probability_rows.fetch_add(1, std::memory_order_relaxed);
      }
    } else if (it.end - it.begin == it.n_slots) {
      attend_group(qg, group, K, V, it.n_slots, hd, scale, out);
    } else {
      float* acc = part_ + it.scratch;
      float* mx = acc + int64_t{group} * hd;
      float* sum = mx + group;
      const int64_t off = it.begin * hd;
      attend_group_partial(qg, group, K + off, V + off, it.end - it.begin, hd, scale, acc, mx, sum);
    }
  }

  // A sequence reading a shared prompt (kv_cache.h): the same arithmetic as attend_item_typed,
  // rows addressed through the two parts.
  template <typename KvT>
  void attend_item_split(const AttnItem& it, const SplitKv<KvT>& kv) {
    const int group = c_.group_size(), hd = c_.head_dim;
    const auto s = at(b_.seg_of_row[at(it.row)]);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const float* qg = q_ + it.row * qd_ + int64_t{it.kv_head} * group * hd;
    float* out = att_ + it.row * qd_ + int64_t{it.kv_head} * group * hd;
    if (b_.wants_probs(s)) {
      const int64_t t = it.row - b_.row0[s], stride = b_.len0[s] + b_.tokens(s);
      for (int gi = 0; gi < group; ++gi) {
        const int h = it.kv_head * group + gi;
        float* pr = probs_ + b_.prob_off[s] + (t * c_.n_heads + h) * stride;
        attend_probs(qg + int64_t{gi} * hd, kv, it.n_slots, hd, scale, out + int64_t{gi} * hd, pr);
        g_attention_probability_rows.fetch_add(1, std::memory_order_relaxed);
      }
    } else if (it.end - it.begin == it.n_slots) {
      attend_group(qg, group, kv, it.n_slots, hd, scale, out);
    } else {
      float* acc = part_ + it.scratch;
      float* mx = acc + int64_t{group} * hd;
      float* sum = mx + group;
      attend_group_partial(qg, group, kv, it.begin, it.end - it.begin, hd, scale, acc, mx, sum);
    }
  }

  void attend_item(int l, const AttnItem& it) {
    const SequenceKv& kv = *b_.seg[at(b_.seg_of_row[at(it.row)])].kv;
    if (const SharedPromptKv* sp = kv.shared_prompt()) {
      const int h = it.kv_head;
      if (kv.type() == KvType::F16)
        attend_item_split(it, SplitKv<uint16_t>{static_cast<const uint16_t*>(sp->keys(l, h)),
                                                static_cast<const uint16_t*>(sp->values(l, h)), sp->n_slots(),
                                                static_cast<const uint16_t*>(kv.own_keys(l, h)),
                                                static_cast<const uint16_t*>(kv.own_values(l, h))});
      else
        attend_item_split(it, SplitKv<float>{static_cast<const float*>(sp->keys(l, h)),
                                             static_cast<const float*>(sp->values(l, h)), sp->n_slots(),
                                             static_cast<const float*>(kv.own_keys(l, h)),
                                             static_cast<const float*>(kv.own_values(l, h))});
      return;
    }
    if (kv.type() == KvType::F16)
      attend_item_typed(it, kv.keys_f16(l, it.kv_head), kv.values_f16(l, it.kv_head));
    else
      attend_item_typed(it, kv.keys(l, it.kv_head), kv.values(l, it.kv_head));
  }

  // Split-softmax merge: items of one (row, KV head) are consecutive, in chunk order, and so are
  // their scratch blocks (acc, m, l per chunk); gather m and l, then merge into att.
  void merge_split_rows() {
    const int group = c_.group_size(), hd = c_.head_dim;
    const int64_t stride = int64_t{group} * (hd + 2);
    for (size_t i = 0; i < items_.size();) {
      const AttnItem& first = items_[i];
      size_t j = i;
      while (j < items_.size() && items_[j].row == first.row && items_[j].kv_head == first.kv_head) ++j;
      const int n_chunks = static_cast<int>(j - i);
      if (first.end - first.begin != first.n_slots) {
        merge_m_.resize(at(int64_t{n_chunks} * group));
        merge_l_.resize(at(int64_t{n_chunks} * group));
        for (int ch = 0; ch < n_chunks; ++ch)
          for (int g = 0; g < group; ++g) {
            const float* block = part_ + first.scratch + ch * stride + int64_t{group} * hd;
            merge_m_[at(int64_t{ch} * group + g)] = block[g];
            merge_l_[at(int64_t{ch} * group + g)] = block[group + g];
          }
        attend_merge(n_chunks, group, hd, part_ + first.scratch, stride, merge_m_.data(), merge_l_.data(),
                     att_ + first.row * qd_ + int64_t{first.kv_head} * group * hd);
      }
      i = j;
    }
  }

  // Delivers each observed token's post-RoPE queries (and probabilities, repacked to
  // [n_heads, n_slots]) to its segment's observer.
  void observe(int l) {
    for (size_t s = 0; s < b_.seg.size(); ++s) {
      const ForwardSegment& seg = b_.seg[s];
      if (!seg.observer) continue;
      const int64_t Ts = b_.tokens(s), base = b_.len0[s];
      for (int64_t t = 0; t < Ts; ++t) {
        AttentionObservation obs;
        obs.layer = l;
        obs.position = seg.pos0 + t;
        obs.prefill = seg.is_prefill;
        obs.n_heads = c_.n_heads;
        obs.group_size = c_.group_size();
        obs.head_dim = c_.head_dim;
        obs.n_slots = base + t + 1;
        obs.queries = q_ + (b_.row0[s] + t) * qd_;
        if (seg.want_probs) {
          const float* pr = probs_ + b_.prob_off[s];
          packed_.resize(at(c_.n_heads * obs.n_slots));
          for (int h = 0; h < c_.n_heads; ++h) {
            const float* src = pr + (t * c_.n_heads + h) * (base + Ts);
            std::copy(src, src + obs.n_slots, packed_.begin() + h * obs.n_slots);
          }
          obs.probs = packed_.data();
        }
        seg.observer->observe(obs);
      }
    }
  }

  const Model& m_;
  const ModelConfig& c_;
  const Rope& rope_;
  const Batch& b_;
  ThreadPool& pool_;
  ForwardBuffers& buf_;
  bool blas_;
  int64_t qd_ = 0, kvd_ = 0;
  float *x_, *xn_, *q_, *k_, *v_, *att_, *gate_, *up_, *tmp_, *probs_;
  std::vector<double> cs_;  ///< [T, n_rot] cos/sin per rotated band
  std::vector<AttnItem> items_;
  int64_t scratch_floats_ = 0, attn_work_ = 0;
  float* part_ = nullptr;
  std::vector<float> merge_m_, merge_l_, packed_;
};

}  // namespace

void model_forward_segments(const ForwardArgs& args, std::span<const ForwardSegment> segments,
                            std::vector<float>& logits) {
  const Batch batch = plan_batch(args.model.config(), segments);
  ForwardPass pass(args.model, args.rope, batch, args.pool, args.buf, args.allow_blas);
  pass.embed_tokens();
  pass.rope_angles();
  for (int l = 0; l < args.model.config().n_layers; ++l) {
    pass.attention_block(l);
    pass.ffn_block(l);
  }
  pass.output_logits(args.wanted, logits);
}

void model_forward(const ForwardArgs& args, const ForwardSegment& segment, std::vector<float>& logits) {
  model_forward_segments(args, std::span<const ForwardSegment>(&segment, 1), logits);
}

}  // namespace kvevict
