// Prompt KV shared across sequences (kvcache/kv_cache.h SharedPromptKv, Engine::fork,
// generate_batch's PromptSharing). The references are the unshared runs: the same sequences
// prefilled and stored separately, as before sharing existed; every comparison is bit for bit
// (sharing changes where rows live, never the arithmetic). Byte counts come from the layout
// written out in the test (keys + values: 2 × head_dim × element bytes per slot and KV head;
// positions: 4 bytes).
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <random>

#include "engine/generation.h"
#include "engine/policy_settings.h"
#include "kernels/attention.h"
#include "kvcache/kv_pool.h"
#include "model_fixture.h"

namespace kvevict {
namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The split kernels against the contiguous ones on the same rows: split points inside and at the
// edges of the 8-slot blocks and 256-slot tiles, rows longer than a tile, f32 and f16.
TEST(PromptSharing, SplitAttentionEqualsContiguousBitForBit) {
  const int G = 3, hd = 16;
  const float scale = 0.25f;
  for (const int64_t n : {1, 7, 9, 300, 600}) {
    const auto K = random_floats(static_cast<size_t>(n * hd), 1), V = random_floats(static_cast<size_t>(n * hd), 2);
    const auto q = random_floats(static_cast<size_t>(G * hd), 3);
    std::vector<uint16_t> Kh(K.size()), Vh(V.size());
    fp32_to_fp16_row(K.data(), Kh.data(), n * hd);
    fp32_to_fp16_row(V.data(), Vh.data(), n * hd);
    for (const int64_t ns : std::vector<int64_t>{0, 1, 5, 8, n / 2, 255, 256, 257, n}) {
      if (ns > n) continue;
      // Shared rows and own rows in separate buffers, as a SharedPromptKv and a SequenceKv hold them.
      const std::vector<float> K0(K.begin(), K.begin() + ns * hd), V0(V.begin(), V.begin() + ns * hd);
      const std::vector<float> K1(K.begin() + ns * hd, K.end()), V1(V.begin() + ns * hd, V.end());
      const SplitKv<float> split{K0.data(), V0.data(), ns, K1.data(), V1.data()};
      std::vector<float> want(static_cast<size_t>(G * hd)), got(want.size());
      attend_group(q.data(), G, K.data(), V.data(), n, hd, scale, want.data());
      attend_group(q.data(), G, split, n, hd, scale, got.data());
      EXPECT_TRUE(same_bits(want, got)) << "f32 n=" << n << " shared=" << ns;

      const std::vector<uint16_t> Kh0(Kh.begin(), Kh.begin() + ns * hd), Vh0(Vh.begin(), Vh.begin() + ns * hd);
      const std::vector<uint16_t> Kh1(Kh.begin() + ns * hd, Kh.end()), Vh1(Vh.begin() + ns * hd, Vh.end());
      const SplitKv<uint16_t> splith{Kh0.data(), Vh0.data(), ns, Kh1.data(), Vh1.data()};
      attend_group(q.data(), G, Kh.data(), Vh.data(), n, hd, scale, want.data());
      attend_group(q.data(), G, splith, n, hd, scale, got.data());
      EXPECT_TRUE(same_bits(want, got)) << "f16 n=" << n << " shared=" << ns;

      // A chunk [begin, n) of a split row (long rows are split into chunks).
      const int64_t begin = n / 3;
      std::vector<float> acc_w(static_cast<size_t>(G * hd)), acc_g(acc_w.size()), m_w(G), m_g(G), l_w(G), l_g(G);
      attend_group_partial(q.data(), G, K.data() + begin * hd, V.data() + begin * hd, n - begin, hd, scale,
                           acc_w.data(), m_w.data(), l_w.data());
      attend_group_partial(q.data(), G, split, begin, n - begin, hd, scale, acc_g.data(), m_g.data(), l_g.data());
      EXPECT_TRUE(same_bits(acc_w, acc_g) && same_bits(m_w, m_g) && same_bits(l_w, l_g))
          << "partial n=" << n << " shared=" << ns;

      // One head with its probabilities (H2O's kernel).
      std::vector<float> pw(static_cast<size_t>(n)), pg(pw.size()), ow(static_cast<size_t>(hd)), og(ow.size());
      attend_probs(q.data(), K.data(), V.data(), n, hd, scale, ow.data(), pw.data());
      attend_probs(q.data(), split, n, hd, scale, og.data(), pg.data());
      EXPECT_TRUE(same_bits(ow, og) && same_bits(pw, pg)) << "probs n=" << n << " shared=" << ns;
    }
  }
}

TEST(PromptSharing, StorageIsReadOnlyOnceForkedAndCountedOnce) {
  const KvShape shape{2, 3, 8, KvType::F32};
  const int64_t cap = 20, ns = 5;
  auto sp = std::make_shared<SharedPromptKv>(shape, ns);
  SequenceKv a(shape, cap, sp);
  const auto rows = random_floats(static_cast<size_t>(cap * 8 * 2), 7);
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 3; ++h)
      for (int64_t s = 0; s < 9; ++s) {
        a.store(l, h, s, rows.data() + s * 16, rows.data() + s * 16 + 8);
        a.positions(l, h)[s] = static_cast<int32_t>(s);
      }
    a.set_length(l, 9);
  }
  // Bytes: own keys/values of cap - ns slots and positions of all cap slots; the segment's keys
  // and values of ns slots.
  const int64_t kv_slot = 2 * 3 * (2 * 8 * 4), pos_slot = 2 * 3 * 4;
  EXPECT_EQ(a.allocated_bytes(), (cap - ns) * kv_slot + cap * pos_slot);
  EXPECT_EQ(sp->bytes(), ns * kv_slot);
  EXPECT_EQ(kv_bytes_for_capacity(shape, cap, ns), a.allocated_bytes());
  EXPECT_EQ(shared_prompt_bytes(shape, ns), sp->bytes());

  SequenceKv b = a.fork();
  EXPECT_EQ(sp.use_count(), 3);  // the test, a, b
  EXPECT_TRUE(sp->frozen());
  EXPECT_THROW(a.store(0, 0, ns - 1, rows.data(), rows.data()), Error);  // shared slot: read-only
  EXPECT_NO_THROW(b.store(0, 0, ns, rows.data(), rows.data()));          // own slot
  EXPECT_THROW(b.keys(0, 0), Error);  // mutable whole-block access would reach the shared rows
  // The gathered float32 view is the rows as stored.
  const SequenceKv& ca = a;
  for (int64_t s = 0; s < 9; ++s)
    EXPECT_EQ(std::memcmp(ca.keys(1, 2) + s * 8, rows.data() + s * 16, 8 * sizeof(float)), 0) << s;
  // A keep-set must keep the shared slots in place.
  const std::vector<int32_t> drops = {0, 1, 2, 3, 5, 6}, keeps = {0, 1, 2, 3, 4, 7, 8};
  EXPECT_THROW(a.compact(0, 0, drops), Error);
  a.compact(1, 1, keeps);
  EXPECT_EQ(std::memcmp(ca.keys(1, 1) + 5 * 8, rows.data() + 7 * 16, 8 * sizeof(float)), 0);
}

struct GroupRun {
  std::vector<std::vector<float>> logits;  // per step: [n, n_vocab]
  int64_t rounds = 0, shared_slots = 0, own_bytes = 0;
};

// n sequences of one prompt: forked from one prefill (shared) or each prefilled (unshared), then
// decoded together with the same token streams (token t of sequence i: argmax of its logits,
// shifted by i so the sequences differ).
GroupRun decode_group(const Model& m, const CheckedPolicy& kv, KvType type, int threads, bool share, int n, int steps) {
  Engine engine(m, threads, type);
  const auto prompt = m.tokenizer().encode("Once upon a time, Lily and Ben found a small red box", true);
  const auto P = static_cast<int64_t>(prompt.size());
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<float> first;
  if (share) {
    seqs.push_back(engine.new_shared_sequence(0, kv, P, steps));
    engine.prefill(*seqs[0], prompt, first);
    for (int i = 1; i < n; ++i) seqs.push_back(engine.fork(*seqs[0], static_cast<uint64_t>(i)));
  } else {
    for (int i = 0; i < n; ++i) {
      seqs.push_back(engine.new_sequence(static_cast<uint64_t>(i), kv, P, steps));
      engine.prefill(*seqs.back(), prompt, first);
    }
  }
  const auto V = static_cast<size_t>(m.config().n_vocab);
  std::vector<float> logits;
  for (int i = 0; i < n; ++i) logits.insert(logits.end(), first.begin(), first.end());
  GroupRun r;
  std::vector<Sequence*> ptrs;
  for (auto& s : seqs) ptrs.push_back(s.get());
  for (int t = 0; t < steps; ++t) {
    std::vector<int32_t> toks;
    for (int i = 0; i < n; ++i) {
      const float* row = logits.data() + static_cast<size_t>(i) * V;
      const auto best = static_cast<int32_t>(std::max_element(row, row + V) - row);
      toks.push_back(static_cast<int32_t>((best + i) % static_cast<int32_t>(V)));
    }
    engine.decode_batch(ptrs, toks, logits);
    r.logits.push_back(logits);
  }
  for (auto& s : seqs) {
    r.rounds += s->stats.rounds;
    r.own_bytes += s->kv.allocated_bytes();
  }
  r.shared_slots = seqs[0]->kv.shared_slots();
  return r;
}

TEST(PromptSharing, ForkedSequencesEqualSeparatelyPrefilledOnesThroughEvictionRounds) {
  KVEVICT_REQUIRE_MODEL(model);
  const int n = 4, steps = 40;
  struct Case {
    std::string policy;
    int64_t budget;
    KvType type;
  };
  // random and h2o+prompt evict (B = 24, r = 4: a round every 4 steps once past B); h2o copies
  // its accumulator state and reads probabilities; full shares the whole prompt.
  for (const Case& c : {Case{"random", 24, KvType::F32}, Case{"random", 24, KvType::F16},
                        Case{"h2o+prompt", 24, KvType::F32}, Case{"full", 0, KvType::F32}}) {
    PolicySettings ps;
    ps.policy = c.policy;
    ps.budget = c.budget;
    ps.recent = 4;
    ps.seed = 11;
    const CheckedPolicy kv = build_policy_config(ps);
    const GroupRun ref = decode_group(*model, kv, c.type, 1, false, n, steps);
    for (const int threads : {1, 2}) {
      const GroupRun got = decode_group(*model, kv, c.type, threads, true, n, steps);
      EXPECT_GT(got.shared_slots, 0) << c.policy;
      ASSERT_EQ(got.logits.size(), ref.logits.size());
      for (size_t t = 0; t < ref.logits.size(); ++t)
        ASSERT_TRUE(same_bits(got.logits[t], ref.logits[t])) << c.policy << " threads " << threads << " step " << t;
      EXPECT_EQ(got.rounds, ref.rounds) << c.policy;
      EXPECT_LT(got.own_bytes, ref.own_bytes) << c.policy;
    }
    if (c.budget > 0) {
      EXPECT_GT(ref.rounds, 0) << c.policy;
    }
  }
}

TEST(PromptSharing, WhatIsSharedFollowsThePin) {
  KVEVICT_REQUIRE_MODEL(model);
  Engine engine(*model, 1);
  const auto slots = [&](const std::string& policy, int64_t budget, int64_t prompt, PositionMode mode) {
    PolicySettings ps;
    ps.policy = policy;
    ps.budget = budget;
    ps.recent = 4;
    ps.positions = mode;
    return engine.shared_prompt_slots(build_policy_config(ps), prompt);
  };
  EXPECT_EQ(slots("random", 24, 10, PositionMode::Logical), 10);       // whole prompt pinned
  EXPECT_EQ(slots("random", 24, 30, PositionMode::Logical), 24 - 4 - 1);  // pin-head: K_sel - 1
  EXPECT_EQ(slots("full", 0, 30, PositionMode::Logical), 30);          // never evicts
  EXPECT_EQ(slots("recency", 24, 10, PositionMode::Logical), 0);       // no pin
  EXPECT_EQ(slots("snapkv+prompt", 24, 10, PositionMode::Logical), 10);
  EXPECT_EQ(slots("random", 24, 10, PositionMode::Cache), 0);          // keys re-rotated
}

// generate_batch (what `eval --rollouts K` and the server's n run): same seeds, sharing on and
// off, identical tokens and log-probabilities.
TEST(PromptSharing, GenerateBatchOutputsDoNotDependOnSharing) {
  KVEVICT_REQUIRE_MODEL(model);
  PolicySettings ps;
  ps.budget = 24;
  ps.recent = 4;
  ps.seed = 5;
  const CheckedPolicy kv = build_policy_config(ps);
  GenerationConfig c;
  c.sampler.temperature = 0.8f;
  c.sampler.seed = 5;
  c.max_new_tokens = 40;
  c.ignore_eos = true;
  c.logprobs = 3;
  const auto p1 = model->tokenizer().encode("Once upon a time", true);
  const auto p2 = model->tokenizer().encode("The dog", true);
  const std::vector<GenerationInput> in = {{0, p1}, {1, p1}, {2, p2}, {3, p1}, {4, p1}};
  const auto run = [&](PromptSharing sharing, int threads) {
    Engine engine(*model, threads);
    std::map<uint64_t, GenerationResult> out;
    std::map<uint64_t, int64_t> shared;
    GenerationCallbacks cb;
    cb.on_finished = [&](size_t, std::unique_ptr<Sequence> seq, GenerationResult r) {
      EXPECT_GT(seq->stats.rounds, 0);
      shared[r.id] = seq->kv.shared_slots();
      out[r.id] = std::move(r);
    };
    generate_batch(engine, kv, in, c, cb, sharing);
    return std::make_pair(out, shared);
  };
  const auto [off, off_shared] = run(PromptSharing::Off, 1);
  for (const int threads : {1, 2}) {
    const auto [on, on_shared] = run(PromptSharing::On, threads);
    for (const auto& [id, r] : off) {
      EXPECT_EQ(on.at(id).tokens, r.tokens) << id;
      ASSERT_EQ(on.at(id).logprobs.size(), r.logprobs.size());
      for (size_t t = 0; t < r.logprobs.size(); ++t) {
        EXPECT_EQ(on.at(id).logprobs[t].logprob, r.logprobs[t].logprob) << id << " step " << t;
        EXPECT_EQ(on.at(id).logprobs[t].top, r.logprobs[t].top);
      }
      EXPECT_EQ(off_shared.at(id), 0);
    }
    EXPECT_EQ(on_shared.at(0), static_cast<int64_t>(p1.size()));  // four sequences of p1 share it
    EXPECT_EQ(on_shared.at(4), static_cast<int64_t>(p1.size()));
    EXPECT_EQ(on_shared.at(2), 0);  // p2 has one sequence: nothing to share
  }
}

}  // namespace
}  // namespace kvevict
