#include "model/forward.h"

#include <fmt/format.h>

#include <atomic>
#include <cmath>

#include "eviction/selector.h"
#include "kernels/attention.h"
#include "model/attention.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict {

void matmul(const WeightMatrix& W, const float* x, int64_t T, float* y, ThreadPool& pool) {
  MatmulScratch scratch;
  const MatmulJob job{W, y};
  matmul_jobs(std::span<const MatmulJob>(&job, 1), x, T, pool, scratch);
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

// Rotates x[hd] by the angles whose cos/sin are cs[2 * i], cs[2 * i + 1] — the arithmetic of
// Rope::rotate (double precision), with the trigonometry done once per token, not per head.
inline void rotate_cs(float* x, const double* cs, int hd) {
  for (int i = 0; i < hd / 2; ++i) {
    const double c = cs[2 * i], sn = cs[2 * i + 1];
    const double x0 = x[2 * i], x1 = x[2 * i + 1];
    x[2 * i] = static_cast<float>(x0 * c - x1 * sn);
    x[2 * i + 1] = static_cast<float>(x0 * sn + x1 * c);
  }
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

void run_jobs(std::initializer_list<MatmulJob> jobs, const float* x, int64_t T, ThreadPool& pool,
              ForwardBuffers& buf, bool allow_blas) {
  matmul_jobs(std::span<const MatmulJob>(jobs.begin(), jobs.size()), x, T, pool, buf.mm, allow_blas);
}
}  // namespace

void llama_forward_segments(const LlamaModel& model, const Rope& rope, std::span<const ForwardSegment> segments,
                            LogitsWanted wanted, std::vector<float>& logits, ThreadPool& pool,
                            ForwardBuffers& buf, bool allow_blas) {
  const LlamaConfig& c = model.config();
  if (segments.empty()) throw Error("forward pass called with no sequences");
  const auto n_seg = static_cast<int64_t>(segments.size());
  // Per segment: first global token row, cache length before the call.
  std::vector<int64_t> row0(static_cast<size_t>(n_seg + 1), 0), len0(static_cast<size_t>(n_seg));
  for (int64_t s = 0; s < n_seg; ++s) {
    const ForwardSegment& seg = segments[static_cast<size_t>(s)];
    const auto T = static_cast<int64_t>(seg.tokens.size());
    if (T == 0) throw Error("forward pass called with no tokens");
    if (!seg.kv) throw Error("forward pass: segment without a KV cache");
    const int64_t len = seg.kv->length(0);
    if (len + T > seg.kv->capacity())
      throw Error(fmt::format("KV cache full: {} slots + {} new tokens exceed capacity {}", len, T, seg.kv->capacity()));
    for (int32_t t : seg.tokens)
      if (t < 0 || t >= c.n_vocab) throw Error(fmt::format("token id {} outside vocabulary [0, {})", t, c.n_vocab));
    for (int64_t o = 0; o < s; ++o)
      if (segments[static_cast<size_t>(o)].kv == seg.kv) throw Error("forward pass: two segments share one KV cache");
    row0[static_cast<size_t>(s + 1)] = row0[static_cast<size_t>(s)] + T;
    len0[static_cast<size_t>(s)] = len;
  }
  const int64_t T = row0.back();

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
  // Probabilities of segments that asked for them: rows of stride (len0 + T_i), one block per
  // segment, at prob_off[s].
  std::vector<int64_t> prob_off(static_cast<size_t>(n_seg + 1), 0);
  for (int64_t s = 0; s < n_seg; ++s) {
    const ForwardSegment& seg = segments[static_cast<size_t>(s)];
    const int64_t Ts = static_cast<int64_t>(seg.tokens.size());
    prob_off[static_cast<size_t>(s + 1)] =
        prob_off[static_cast<size_t>(s)] + ((seg.observer && seg.want_probs) ? Ts * nh * (len0[static_cast<size_t>(s)] + Ts) : 0);
  }
  float* probs = prob_off.back() > 0 ? sized(buf.probs, prob_off.back()) : nullptr;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  for (int64_t s = 0; s < n_seg; ++s) {
    const ForwardSegment& seg = segments[static_cast<size_t>(s)];
    for (size_t t = 0; t < seg.tokens.size(); ++t)
      dequantize_row(model.token_embedding().type, model.token_embedding().row(seg.tokens[t]),
                     x + (row0[static_cast<size_t>(s)] + static_cast<int64_t>(t)) * dim, dim);
  }
  // Attention work items: (segment token row, KV head); a segment asking for probabilities runs
  // per query head (two-pass kernel), others per GQA group (one pass over K/V for G heads).
  std::vector<int32_t> seg_of_row(static_cast<size_t>(T));
  for (int64_t s = 0; s < n_seg; ++s)
    for (int64_t r = row0[static_cast<size_t>(s)]; r < row0[static_cast<size_t>(s + 1)]; ++r) seg_of_row[static_cast<size_t>(r)] = static_cast<int32_t>(s);

  // cos/sin of every token's RoPE angles, shared by all layers and heads.
  std::vector<double> cs(static_cast<size_t>(T * hd));
  for (int64_t s = 0; s < n_seg; ++s) {
    const ForwardSegment& seg = segments[static_cast<size_t>(s)];
    for (int64_t t = 0; t < static_cast<int64_t>(seg.tokens.size()); ++t) {
      const int64_t rope_pos = seg.mode == PositionMode::Logical ? seg.pos0 + t : len0[static_cast<size_t>(s)] + t;
      double* row = cs.data() + (row0[static_cast<size_t>(s)] + t) * hd;
      for (int i = 0; i < hd / 2; ++i) {
        const double a = static_cast<double>(rope_pos) * rope.inv_freq()[static_cast<size_t>(i)];
        row[2 * i] = std::cos(a);
        row[2 * i + 1] = std::sin(a);
      }
    }
  }

  std::vector<AttnItem> items;
  std::vector<float> merge_m, merge_l;
  for (int l = 0; l < c.n_layers; ++l) {
    const LlamaLayer& L = model.layers()[static_cast<size_t>(l)];
    for (int64_t t = 0; t < T; ++t) rmsnorm(x + t * dim, L.attn_norm.data(), dim, c.rms_eps, xn + t * dim);
    run_jobs({{L.wq, q}, {L.wk, k}, {L.wv, v}}, xn, T, pool, buf, allow_blas);
    for (int64_t s = 0; s < n_seg; ++s) {
      const ForwardSegment& seg = segments[static_cast<size_t>(s)];
      const int64_t Ts = static_cast<int64_t>(seg.tokens.size()), base = len0[static_cast<size_t>(s)];
      for (int64_t t = 0; t < Ts; ++t) {
        const int64_t row = row0[static_cast<size_t>(s)] + t;
        const double* rcs = cs.data() + row * hd;
        for (int h = 0; h < nh; ++h) rotate_cs(q + row * qd + int64_t{h} * hd, rcs, hd);
        for (int h = 0; h < nkv; ++h) {
          float* kh = k + row * kvd + int64_t{h} * hd;
          rotate_cs(kh, rcs, hd);
          seg.kv->store(l, h, base + t, kh, v + row * kvd + int64_t{h} * hd);
          seg.kv->positions(l, h)[base + t] = static_cast<int32_t>(seg.pos0 + t);
        }
      }
      seg.kv->set_length(l, base + Ts);
    }

    // Work items: (row, KV head, chunk of slots). Rows with more than kSplitSlots slots are
    // split into fixed chunks (a function of the slot count only) whose partial softmaxes are
    // merged in chunk order afterwards, so one long sequence still spreads over every thread
    // and results never depend on the batch or the thread count.
    items.clear();
    int64_t scratch_floats = 0;
    int64_t attn_work = 0;  // multiply-adds: scores and values, every query head
    for (int64_t row = 0; row < T; ++row) {
      const auto s = static_cast<size_t>(seg_of_row[static_cast<size_t>(row)]);
      const int64_t n_slots = len0[s] + (row - row0[s]) + 1;
      attn_work += n_slots * nkv * group * hd * 2;
      const bool probs_row = segments[s].observer && segments[s].want_probs;
      const int64_t chunk = probs_row ? n_slots : attention_chunk(n_slots);
      for (int kvh = 0; kvh < nkv; ++kvh)
        for (int64_t c0 = 0; c0 < n_slots; c0 += chunk) {
          items.push_back({row, kvh, c0, std::min(n_slots, c0 + chunk), n_slots, scratch_floats});
          if (chunk < n_slots) scratch_floats += int64_t{group} * (hd + 2);
        }
    }
    float* part = scratch_floats > 0 ? sized(buf.attn_part, scratch_floats) : nullptr;
    std::atomic<int64_t> next{0};
    const auto n_items = static_cast<int64_t>(items.size());
    pool.parallel_for(std::min<int64_t>(pool.size(), n_items), [&](int64_t, int64_t) {
      for (int64_t i = next.fetch_add(1); i < n_items; i = next.fetch_add(1)) {
        const AttnItem& it = items[static_cast<size_t>(i)];
        const auto s = static_cast<size_t>(seg_of_row[static_cast<size_t>(it.row)]);
        const ForwardSegment& seg = segments[s];
        const int64_t t = it.row - row0[s], Ts = static_cast<int64_t>(seg.tokens.size());
        const SequenceKv& kv = *seg.kv;
        const int kvh = it.kv_head;
        const float* qg = q + it.row * qd + int64_t{kvh} * group * hd;
        float* out = att + it.row * qd + int64_t{kvh} * group * hd;
        const bool f16 = kv.type() == KvType::F16;
        if (seg.observer && seg.want_probs) {
          for (int gi = 0; gi < group; ++gi) {
            const int h = kvh * group + gi;
            float* pr = probs + prob_off[s] + (t * nh + h) * (len0[s] + Ts);
            if (f16) attend_probs(qg + int64_t{gi} * hd, kv.keys_f16(l, kvh), kv.values_f16(l, kvh), it.n_slots, hd, scale, out + int64_t{gi} * hd, pr);
            else attend_probs(qg + int64_t{gi} * hd, kv.keys(l, kvh), kv.values(l, kvh), it.n_slots, hd, scale, out + int64_t{gi} * hd, pr);
            g_attention_probability_rows.fetch_add(1, std::memory_order_relaxed);
          }
        } else if (it.end - it.begin == it.n_slots) {
          if (f16) attend_group(qg, group, kv.keys_f16(l, kvh), kv.values_f16(l, kvh), it.n_slots, hd, scale, out);
          else attend_group(qg, group, kv.keys(l, kvh), kv.values(l, kvh), it.n_slots, hd, scale, out);
        } else {
          float* acc = part + it.scratch;
          float* mm = acc + int64_t{group} * hd;
          float* ll = mm + group;
          const int64_t off = it.begin * hd, n = it.end - it.begin;
          if (f16) attend_group_partial(qg, group, kv.keys_f16(l, kvh) + off, kv.values_f16(l, kvh) + off, n, hd, scale, acc, mm, ll);
          else attend_group_partial(qg, group, kv.keys(l, kvh) + off, kv.values(l, kvh) + off, n, hd, scale, acc, mm, ll);
        }
      }
    }, attn_work);
    // Merge split rows: items of one (row, KV head) are consecutive, in chunk order; their
    // scratch blocks are consecutive too (acc, m, l per chunk), so gather m/l then merge.
    for (size_t i = 0; i < items.size();) {
      const AttnItem& first = items[i];
      size_t j = i;
      while (j < items.size() && items[j].row == first.row && items[j].kv_head == first.kv_head) ++j;
      const int n_chunks = static_cast<int>(j - i);
      if (first.end - first.begin != first.n_slots) {
        const int64_t stride = int64_t{group} * (hd + 2);
        merge_m.resize(static_cast<size_t>(n_chunks * group));
        merge_l.resize(static_cast<size_t>(n_chunks * group));
        for (int c = 0; c < n_chunks; ++c)
          for (int g2 = 0; g2 < group; ++g2) {
            merge_m[static_cast<size_t>(c * group + g2)] = part[first.scratch + c * stride + int64_t{group} * hd + g2];
            merge_l[static_cast<size_t>(c * group + g2)] = part[first.scratch + c * stride + int64_t{group} * hd + group + g2];
          }
        attend_merge(n_chunks, group, hd, part + first.scratch, stride, merge_m.data(), merge_l.data(),
                     att + first.row * qd + int64_t{first.kv_head} * group * hd);
      }
      i = j;
    }
    for (int64_t s = 0; s < n_seg; ++s) {
      const ForwardSegment& seg = segments[static_cast<size_t>(s)];
      if (!seg.observer) continue;
      const int64_t Ts = static_cast<int64_t>(seg.tokens.size()), base = len0[static_cast<size_t>(s)];
      for (int64_t t = 0; t < Ts; ++t) {
        const int64_t row = row0[static_cast<size_t>(s)] + t;
        AttentionObservation obs;
        obs.layer = l;
        obs.position = seg.pos0 + t;
        obs.prefill = seg.is_prefill;
        obs.n_heads = nh;
        obs.group_size = group;
        obs.head_dim = hd;
        obs.n_slots = base + t + 1;
        obs.queries = q + row * qd;
        std::vector<float> packed;
        if (seg.want_probs) {
          // Rows of the token's heads are strided by base + Ts; repack to [n_heads, n_slots].
          const float* pr = probs + prob_off[static_cast<size_t>(s)];
          packed.resize(static_cast<size_t>(nh * obs.n_slots));
          for (int h = 0; h < nh; ++h)
            std::copy(pr + (t * nh + h) * (base + Ts), pr + (t * nh + h) * (base + Ts) + obs.n_slots,
                      packed.begin() + h * obs.n_slots);
          obs.probs = packed.data();
        }
        seg.observer->observe(obs);
      }
    }
    run_jobs({{L.wo, tmp}}, att, T, pool, buf, allow_blas);
    for (int64_t i = 0; i < T * dim; ++i) x[i] += tmp[i];

    for (int64_t t = 0; t < T; ++t) rmsnorm(x + t * dim, L.ffn_norm.data(), dim, c.rms_eps, xn + t * dim);
    run_jobs({{L.w_gate, g}, {L.w_up, u}}, xn, T, pool, buf, allow_blas);
    for (int64_t i = 0; i < T * c.hidden_dim; ++i) g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];  // SiLU(g)·u
    run_jobs({{L.w_down, tmp}}, g, T, pool, buf, allow_blas);
    for (int64_t i = 0; i < T * dim; ++i) x[i] += tmp[i];
  }

  if (wanted == LogitsWanted::None) return;
  // Rows whose logits are wanted, packed.
  std::vector<int64_t> out_rows;
  if (wanted == LogitsWanted::All) {
    for (int64_t r = 0; r < T; ++r) out_rows.push_back(r);
  } else {
    for (int64_t s = 0; s < n_seg; ++s) out_rows.push_back(row0[static_cast<size_t>(s + 1)] - 1);
  }
  const auto n_out = static_cast<int64_t>(out_rows.size());
  for (int64_t i = 0; i < n_out; ++i)
    rmsnorm(x + out_rows[static_cast<size_t>(i)] * dim, model.output_norm().data(), dim, c.rms_eps, xn + i * dim);
  logits.resize(static_cast<size_t>(n_out * c.n_vocab));
  run_jobs({{model.output(), logits.data()}}, xn, n_out, pool, buf, allow_blas);
}

void llama_forward(const LlamaModel& model, const Rope& rope, SequenceKv& kv,
                   std::span<const int32_t> tokens, int64_t pos0, PositionMode mode,
                   LogitsWanted wanted, std::vector<float>& logits, SelectorState* observer,
                   bool want_probs, bool is_prefill, ThreadPool& pool, ForwardBuffers& buf) {
  const ForwardSegment seg{&kv, tokens, pos0, mode, observer, want_probs, is_prefill};
  llama_forward_segments(model, rope, std::span<const ForwardSegment>(&seg, 1), wanted, logits, pool, buf,
                         /*allow_blas=*/true);
}

}  // namespace kvevict
