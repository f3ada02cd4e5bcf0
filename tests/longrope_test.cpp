// LongRoPE (phi3: Phi-3.5, Phi-4-mini): two per-band factor sets, one chosen by the context size
// the model runs with, and an attention factor on cos/sin (model/model.h LongRopeInfo,
// kernels/rope.h).
//
// Expected values are computed here, never by the code under test:
//  - the RoPE formula as published (LongRoPE, arXiv 2402.13753 §3; HF transformers
//    `_compute_longrope_parameters` + `apply_rotary_pos_emb` with NEOX `rotate_half`):
//    inv_freq_i = 1 / (f_i · base^(2i / n_rot)) for i < n_rot / 2, the pair (x_i, x_{i + n_rot/2})
//    maps to a·(x_i cos − x_{i+n_rot/2} sin, x_{i+n_rot/2} cos + x_i sin), the tail beyond n_rot
//    is unchanged; written out in double in `embed_ref`;
//  - the attention factor from convert_hf_to_gguf.py's Phi-3 rule, a = sqrt(1 + ln s / ln L),
//    s = context_length / L, L = original context length;
//  - the factor-set rule of llama.cpp's get_rope_factors: long iff n_ctx > n_ctx_orig;
//  - layer-0 pre-RoPE q/k computed from the file's own tensors (GGUF reader only);
//  - the naive masked reference (reference_model.h) given the expected factors explicitly.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "cli_run.h"
#include "engine/engine.h"
#include "eval/calibrate.h"
#include "eviction/query_stats.h"
#include "gguf_edit.h"
#include "masked_eviction.h"
#include "model/arch.h"
#include "model/forward.h"
#include "model/synth.h"
#include "reference_model.h"
#include "selector_budget.h"
#include "test_paths.h"
#include "test_tmp.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

// Temporary files of the running test; the fixture removes them even when an assertion returns
// early.
std::vector<std::string>& created_files() {
  static std::vector<std::string> files;
  return files;
}
std::string temp_path(const std::string& name) {
  const std::string p = test::tmp_path("longrope_" + name);
  created_files().push_back(p);
  return p;
}

class LongRope : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const std::string& p : created_files()) std::filesystem::remove(p);
    created_files().clear();
  }
};

// tiny-phi3: head_dim 16, n_rot 12 (6 rotated bands), 4 heads, 2 KV heads, 2 layers, vocab 320,
// context 4096. The LongRoPE variant states its own factors (not synth_add_longrope's, so the
// test does not depend on the tool's choice of numbers).
constexpr int kHd = 16, kRot = 12, kBands = kRot / 2;
constexpr int kOrig = 4096, kCtx = 32 * kOrig;
const std::vector<float> kShort = {1.0f, 1.02f, 1.05f, 1.1f, 1.2f, 1.25f};
const std::vector<float> kLong = {1.0f, 1.9f, 3.7f, 7.3f, 14.5f, 29.0f};
// convert_hf_to_gguf.py (Phi3MiniModel): sqrt(1 + ln(s) / ln(original)), s = 131072 / 4096.
const double kAttn = std::sqrt(1.0 + std::log(32.0) / std::log(4096.0));

SynthShape phi3_shape(bool longrope, std::vector<float> short_f = kShort, std::vector<float> long_f = kLong,
                      float attn = static_cast<float>(kAttn)) {
  SynthShape s = synth_shape("tiny-phi3");
  EXPECT_EQ(s.head_dim_or_default(), kHd);
  EXPECT_EQ(s.n_rot, kRot);
  s.context_length = kCtx;
  if (longrope) {
    s.rope_factors_short = std::move(short_f);
    s.rope_factors_long = std::move(long_f);
    s.original_context_length = kOrig;
    s.rope_attn_factor = attn;
  }
  return s;
}

std::string write_phi3(const std::string& name, const SynthShape& s) {
  const std::string p = temp_path(name + ".gguf");
  write_synth_gguf(s, GgmlType::F32, 11, p);
  return p;
}

std::unique_ptr<Model> load(const std::string& path, int64_t context_size = 0) {
  return Model::load(path, LoadOptions{.tokenizer = false, .print_warnings = false, .context_size = context_size});
}

// RoPE written from the formula in double (see the file comment); x: [head_dim].
std::vector<double> embed_ref(const std::vector<double>& x, int64_t pos, const std::vector<float>& f, double a,
                              double base = 10000.0) {
  std::vector<double> y = x;
  const int R = kRot / 2;
  for (int i = 0; i < R; ++i) {
    const double inv_freq = 1.0 / (double(f[static_cast<size_t>(i)]) * std::pow(base, 2.0 * i / kRot));
    const double th = double(pos) * inv_freq, c = std::cos(th), s = std::sin(th);
    const double x1 = x[static_cast<size_t>(i)], x2 = x[static_cast<size_t>(i + R)];
    y[static_cast<size_t>(i)] = a * (x1 * c - x2 * s);
    y[static_cast<size_t>(i + R)] = a * (x2 * c + x1 * s);
  }
  return y;
}

// Layer-0 pre-RoPE q [n_heads * hd] and k [n_kv_heads * hd] of `token`, from the file's F32
// tensors: RMSNorm(token_embd row) · attn_norm, then rows [0, qd) and [qd, qd + kvd) of
// blk.0.attn_qkv.weight. Independent of the loader's fused-tensor split and of the forward pass.
struct PreRope {
  std::vector<double> q, k;
};
PreRope layer0_pre_rope(const GgufFile& f, int32_t token) {
  const auto floats = [&](const std::string& name) {
    const GgufTensor& t = f.tensor(name);
    EXPECT_EQ(t.ggml_type(), GgmlType::F32) << name;
    return reinterpret_cast<const float*>(t.data);
  };
  const int dim = static_cast<int>(f.get_uint("phi3.embedding_length"));
  const int nh = static_cast<int>(f.get_uint("phi3.attention.head_count"));
  const int nkv = static_cast<int>(f.get_uint("phi3.attention.head_count_kv"));
  const double eps = f.get_float("phi3.attention.layer_norm_rms_epsilon");
  const float* e = floats("token_embd.weight") + int64_t{token} * dim;
  const float* g = floats("blk.0.attn_norm.weight");
  const float* w = floats("blk.0.attn_qkv.weight");
  double ss = 0;
  for (int i = 0; i < dim; ++i) ss += double(e[i]) * e[i];
  const double inv = 1.0 / std::sqrt(ss / dim + eps);
  std::vector<double> xn(static_cast<size_t>(dim));
  for (int i = 0; i < dim; ++i) xn[static_cast<size_t>(i)] = double(e[i]) * inv * g[i];
  const auto row = [&](int64_t r) {
    double s = 0;
    for (int i = 0; i < dim; ++i) s += double(w[r * dim + i]) * xn[static_cast<size_t>(i)];
    return s;
  };
  PreRope p;
  for (int r = 0; r < nh * kHd; ++r) p.q.push_back(row(r));
  for (int r = 0; r < nkv * kHd; ++r) p.k.push_back(row(nh * kHd + r));
  return p;
}

std::vector<double> head(const std::vector<double>& v, int h) {
  return {v.begin() + h * kHd, v.begin() + (h + 1) * kHd};
}

// Collects the post-RoPE queries of layer 0 by logical position.
class Layer0Queries final : public AttentionObserver {
 public:
  std::map<int64_t, std::vector<float>> q;
  void observe(const AttentionObservation& o) override {
    if (o.layer == 0) q[o.position].assign(o.queries, o.queries + int64_t{o.n_heads} * o.head_dim);
  }
};

std::vector<std::vector<float>> run_full(const Model& m, const std::vector<int32_t>& tokens, int64_t P) {
  Engine engine(m, 2);
  auto seq = engine.new_sequence(0, make_policy("full"), {}, P, static_cast<int64_t>(tokens.size()) - P);
  std::vector<std::vector<float>> out(1);
  engine.prefill(*seq, std::span<const int32_t>(tokens).first(static_cast<size_t>(P)), out[0]);
  for (size_t t = static_cast<size_t>(P); t < tokens.size(); ++t) {
    out.emplace_back();
    engine.decode(*seq, tokens[t], out.back());
  }
  return out;
}

std::vector<int32_t> some_tokens(int n) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(static_cast<int32_t>(1 + (i * 37 + 11) % 319));
  return t;
}

// ---- (a) RoPE against the published formula ----

TEST_F(LongRope, RopeEmbeddingEqualsThePublishedFormula) {
  // Rope with the long set and attention factor, NEOX, partial rotary (12 of 16), at several
  // positions; and rotate() stays a pure rotation: moving an embedded vector by d equals
  // embedding it at p + d (the attention factor is applied once).
  const Rope rope(RopeConfig{kHd, kRot, 10000.0f, RopeStyle::Neox, 1.0, kLong, kAttn});
  std::vector<double> x(kHd);
  for (int i = 0; i < kHd; ++i) x[static_cast<size_t>(i)] = std::cos(0.7 * i) + 0.05 * i;
  for (const int64_t pos : {0L, 1L, 7L, 1000L, 4097L, 65000L, 131071L}) {
    std::vector<float> y(x.begin(), x.end());
    std::vector<double> cs(kRot);
    rope.angles(pos, cs.data());
    rope.apply(y.data(), cs.data());
    const auto want = embed_ref(x, pos, kLong, kAttn);
    for (int i = 0; i < kHd; ++i)
      EXPECT_NEAR(y[static_cast<size_t>(i)], want[static_cast<size_t>(i)], 1e-5) << "pos " << pos << " dim " << i;
    auto moved = y;
    rope.rotate(moved.data(), 123);
    const auto want_moved = embed_ref(x, pos + 123, kLong, kAttn);
    for (int i = 0; i < kHd; ++i)
      EXPECT_NEAR(moved[static_cast<size_t>(i)], want_moved[static_cast<size_t>(i)], 2e-5) << "pos " << pos;
  }
}

TEST_F(LongRope, ForwardRotatesLayer0QueriesAndKeysByTheFormula) {
  // The loaded model (default context = the file's 131072 > original 4096: long set, factor a)
  // runs 6 tokens at logical positions 5000..5005; its layer-0 post-RoPE queries (observer) and
  // cached keys equal the formula applied to pre-RoPE q/k computed here from the file.
  const std::string p = write_phi3("fwd", phi3_shape(true));
  const auto m = load(p);
  ASSERT_TRUE(m->config().longrope.use_long);
  const GgufFile f = GgufFile::open(p);
  const std::vector<int32_t> tokens = {5, 77, 300, 12, 260, 141};
  const int64_t pos0 = 5000;
  const ModelConfig& c = m->config();
  SequenceKv kv(KvShape{c.n_layers, c.n_kv_heads, c.head_dim, KvType::F32}, 8);
  Layer0Queries obs;
  ThreadPool pool(2);
  ForwardBuffers buf;
  std::vector<float> logits;
  const Rope rope(c.rope);
  const ForwardSegment seg{&kv, tokens, pos0, PositionMode::Logical, &obs, /*want_probs=*/false, /*is_prefill=*/true};
  model_forward({.model = *m, .rope = rope, .pool = pool, .buf = buf, .allow_blas = true}, seg, logits);
  double worst = 0, worst_short = 0;
  for (size_t t = 0; t < tokens.size(); ++t) {
    const PreRope pre = layer0_pre_rope(f, tokens[t]);
    const int64_t pos = pos0 + static_cast<int64_t>(t);
    ASSERT_TRUE(obs.q.count(pos));
    for (int h = 0; h < c.n_heads; ++h) {
      const auto want = embed_ref(head(pre.q, h), pos, kLong, kAttn);
      const auto other = embed_ref(head(pre.q, h), pos, kShort, kAttn);
      for (int i = 0; i < kHd; ++i) {
        const double got = obs.q[pos][static_cast<size_t>(h * kHd + i)];
        worst = std::max(worst, std::abs(got - want[static_cast<size_t>(i)]));
        worst_short = std::max(worst_short, std::abs(got - other[static_cast<size_t>(i)]));
      }
    }
    for (int h = 0; h < c.n_kv_heads; ++h) {
      const auto want = embed_ref(head(pre.k, h), pos, kLong, kAttn);
      for (int i = 0; i < kHd; ++i)
        worst = std::max(
            worst, std::abs(double(kv.keys(0, h)[t * kHd + static_cast<size_t>(i)]) - want[static_cast<size_t>(i)]));
    }
  }
  EXPECT_LT(worst, 1e-4);
  // The check can fail: the short set gives other vectors at these positions.
  EXPECT_GT(worst_short, 1e-2);
  std::filesystem::remove(p);
}

// ---- (b) model level ----

TEST_F(LongRope, UnitFactorsAndUnitAttentionFactorEqualThePlainFile) {
  // All factors 1 and a = 1 is RoPE without scaling: logits bit-identical to the same weights
  // without LongRoPE tensors (same seed, same tensor streams).
  const std::vector<float> ones(kBands, 1.0f);
  const std::string a = write_phi3("ones", phi3_shape(true, ones, ones, 1.0f));
  const std::string b = write_phi3("plain", phi3_shape(false));
  const auto ma = load(a), mb = load(b);
  ASSERT_TRUE(ma->config().longrope.present());
  ASSERT_FALSE(mb->config().longrope.present());
  const auto tokens = some_tokens(20);
  const auto la = run_full(*ma, tokens, 8), lb = run_full(*mb, tokens, 8);
  for (size_t k = 0; k < la.size(); ++k)
    for (size_t i = 0; i < la[k].size(); ++i) ASSERT_EQ(la[k][i], lb[k][i]) << "step " << k << " logit " << i;
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

TEST_F(LongRope, RealFactorsChangeLogitsAndEqualTheNaiveReference) {
  // With real factors the logits differ from the plain file, and equal the naive reference
  // given the long set and a = sqrt(1 + ln 32 / ln 4096) explicitly (its own float RoPE).
  const std::string a = write_phi3("real", phi3_shape(true));
  const std::string b = write_phi3("plain2", phi3_shape(false));
  const auto ma = load(a), mb = load(b);
  const auto tokens = some_tokens(24);
  const auto la = run_full(*ma, tokens, 10), lb = run_full(*mb, tokens, 10);
  float differ = 0;
  for (size_t i = 0; i < la.back().size(); ++i) differ = std::max(differ, std::abs(la.back()[i] - lb.back()[i]));
  EXPECT_GT(differ, 1e-2);
  const auto ref =
      test::ReferenceLlama(*ma).with_rope_factors(kLong, kAttn).run(tokens, [](int, int, int, int) { return true; });
  // Dropping the attention factor (a = 1) would be visible: the reference then differs.
  const auto no_attn =
      test::ReferenceLlama(*ma).with_rope_factors(kLong, 1.0).run(tokens, [](int, int, int, int) { return true; });
  float attn_matters = 0;
  for (size_t i = 0; i < la.back().size(); ++i)
    attn_matters = std::max(attn_matters, std::abs(la.back()[i] - no_attn.back()[i]));
  EXPECT_GT(attn_matters, 1e-2);
  for (size_t k = 0; k < la.size(); ++k)
    for (size_t i = 0; i < la[k].size(); ++i) ASSERT_NEAR(la[k][i], ref[9 + k][i], 1e-4) << "step " << k;
  std::filesystem::remove(a);
  std::filesystem::remove(b);
}

// ---- (c) which set: llama.cpp's rule on the context size ----

TEST_F(LongRope, FactorSetFollowsTheContextSize) {
  const std::string p = write_phi3("select", phi3_shape(true));
  struct Case {
    int64_t context_size;
    bool want_long;
  };
  // 0: the file's context_length 131072 > 4096; 4096 is not > 4096 (short), 4097 is.
  for (const Case& cs : {Case{0, true}, Case{512, false}, Case{4096, false}, Case{4097, true}, Case{131072, true}}) {
    const auto m = load(p, cs.context_size);
    const LongRopeInfo& lr = m->config().longrope;
    EXPECT_EQ(lr.use_long, cs.want_long) << cs.context_size;
    EXPECT_EQ(lr.original_context, kOrig);
    EXPECT_EQ(lr.context_size, cs.context_size > 0 ? cs.context_size : kCtx);
    EXPECT_EQ(m->config().rope.freq_factors, cs.want_long ? kLong : kShort) << cs.context_size;
    EXPECT_EQ(lr.short_factors, kShort);
    EXPECT_EQ(lr.long_factors, kLong);
    // The attention factor applies with either set (llama.cpp and transformers both do).
    EXPECT_NEAR(m->config().rope.attn_factor, kAttn, 1e-6);
    const std::string& note = m->rope_note();
    EXPECT_NE(note.find(cs.want_long ? "using the long factors (rope_factors_long.weight)"
                                     : "using the short factors (rope_factors_short.weight)"),
              std::string::npos)
        << note;
    EXPECT_NE(note.find(cs.want_long ? "> original context 4096" : "<= original context 4096"), std::string::npos)
        << note;
  }
  EXPECT_NE(load(p)->rope_note().find("context size 131072 (phi3.context_length) > original context 4096 "
                                      "(phi3.rope.scaling.original_context_length)"),
            std::string::npos)
      << load(p)->rope_note();
  // The chosen set reaches the forward pass: the two loads give different logits.
  const auto tokens = some_tokens(16);
  const auto ls = run_full(*load(p, 4096), tokens, 16), ll = run_full(*load(p, 8192), tokens, 16);
  float differ = 0;
  for (size_t i = 0; i < ls[0].size(); ++i) differ = std::max(differ, std::abs(ls[0][i] - ll[0][i]));
  EXPECT_GT(differ, 1e-3);
  // Without rope.scaling.original_context_length the original is context_length (llama.cpp's
  // n_ctx_orig_yarn default), so the default context size picks the short set.
  const std::string q = temp_path("no_orig.gguf");
  test::rewrite_gguf(p, q, {.drop_keys = {"phi3.rope.scaling.original_context_length"}});
  const auto mq = load(q);
  EXPECT_FALSE(mq->config().longrope.use_long);
  EXPECT_EQ(mq->config().longrope.original_context, kCtx);
  EXPECT_NE(mq->rope_note().find("(phi3.context_length)"), std::string::npos) << mq->rope_note();
  // `rope.scaling.type = longrope` with the tensors is accepted.
  test::rewrite_gguf(p, q, {.set_string = {{"phi3.rope.scaling.type", "longrope"}}});
  EXPECT_EQ(load(q)->config().rope.freq_factors, kLong);
  std::filesystem::remove(p);
  std::filesystem::remove(q);
}

// ---- (d) refusals ----

TEST_F(LongRope, InconsistentFilesAreRefusedNamingTheTensorOrKey) {
  const std::string good = write_phi3("good", phi3_shape(true));
  const std::string plain = write_phi3("plain3", phi3_shape(false));
  SynthShape qwen = synth_shape("tiny-qwen3");
  const std::string qwen_path = temp_path("qwen3.gguf");
  write_synth_gguf(qwen, GgmlType::F32, 3, qwen_path);
  const float nan = std::nanf("");
  struct Case {
    std::string src;
    test::GgufEdit edit;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {good,
       {.drop_tensors = {"rope_factors_short.weight"}},
       "tensor 'rope_factors_long.weight' is present but 'rope_factors_short.weight' is missing"},
      {good,
       {.drop_tensors = {"rope_factors_long.weight"}},
       "tensor 'rope_factors_short.weight' is present but 'rope_factors_long.weight' is missing"},
      {good,
       {.f32_tensors = {{"rope_factors_long.weight", {1, 2, 3, 4, 5}}}},
       "tensor 'rope_factors_long.weight' has 5 elements, expected 6"},
      {good,
       {.f32_tensors = {{"rope_factors_short.weight", {1, 1, 1, 1, 1, 1, 1, 1}}}},
       "tensor 'rope_factors_short.weight' has 8 elements, expected 6"},
      {good,
       {.f32_tensors = {{"rope_factors_short.weight", {1, 1, 0, 1, 1, 1}}}},
       "tensor 'rope_factors_short.weight' holds 0 at band 2; LongRoPE factors must be finite and > 0"},
      {good,
       {.f32_tensors = {{"rope_factors_long.weight", {1, 2, 4, -8, 16, 32}}}},
       "tensor 'rope_factors_long.weight' holds -8 at band 3"},
      {good,
       {.f32_tensors = {{"rope_factors_long.weight", {1, 2, 4, 8, 16, nan}}}},
       "tensor 'rope_factors_long.weight' holds nan at band 5"},
      {good,
       {.set_float = {{"phi3.rope.scaling.attn_factor", 0.0f}}},
       "phi3.rope.scaling.attn_factor = 0 must be a finite value > 0"},
      {good,
       {.set_float = {{"phi3.rope.scaling.attn_factor", -1.5f}}},
       "phi3.rope.scaling.attn_factor = -1.5 must be a finite value > 0"},
      {good,
       {.set_uint = {{"phi3.rope.scaling.original_context_length", 0}}},
       "key 'phi3.rope.scaling.original_context_length' = 0 is out of range"},
      {good,
       {.set_float = {{"phi3.rope.scaling.factor", 4.0f}}},
       "phi3.rope.scaling.factor = 4 (linear scaling) together with LongRoPE factor tensors is not supported"},
      {good,
       {.set_string = {{"phi3.rope.scaling.type", "yarn"}}},
       "phi3.rope.scaling.type = 'yarn' is not implemented"},
      {plain,
       {.set_string = {{"phi3.rope.scaling.type", "longrope"}}},
       "phi3.rope.scaling.type = 'longrope' but the file has no 'rope_factors_short.weight' / "
       "'rope_factors_long.weight' tensors"},
      {qwen_path,
       {.f32_tensors = {{"rope_factors_long.weight", std::vector<float>(16, 1.0f)},
                        {"rope_factors_short.weight", std::vector<float>(16, 1.0f)}}},
       "is not used by architecture 'qwen3'"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const std::string p = temp_path("bad" + std::to_string(i++) + ".gguf");
    test::rewrite_gguf(c.src, p, c.edit);
    std::string err;
    try {
      load(p);
    } catch (const Error& e) {
      err = e.what();
    }
    EXPECT_NE(err.find(c.expect), std::string::npos) << "expected '" << c.expect << "' in '" << err << "'";
    EXPECT_NE(err.find(p), std::string::npos) << "error does not name the file: " << err;
    std::filesystem::remove(p);
  }
  // A negative context size is refused too.
  try {
    load(good, -1);
    ADD_FAILURE() << "context size -1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context size -1 must be >= 0"), std::string::npos) << e.what();
  }
  std::filesystem::remove(good);
  std::filesystem::remove(plain);
  std::filesystem::remove(qwen_path);
}

// ---- eviction with LongRoPE ----

TEST_F(LongRope, InteriorEvictionEqualsTheMaskedFullCache) {
  // As families_test's CompactedCacheEqualsMaskedFullCache, on a LongRoPE file: random evicts
  // interior slots; every later token equals the naive reference (long set and a given
  // explicitly) with the evicted positions masked out.
  const std::string path = write_phi3("evict", phi3_shape(true));
  const auto m = load(path);
  const int64_t P = 9, N = 56, B = 24, r = 4;
  const auto tokens = some_tokens(static_cast<int>(N));
  const auto tr = test::trace_random_eviction(*m, tokens, P, static_cast<int>(N), B, r, 7, N - P);
  ASSERT_GE(tr.rounds, 3);
  const auto ref =
      test::ReferenceLlama(*m).with_rope_factors(kLong, kAttn).run(tokens, [&](int t, int l, int h, int p) {
        return tr.sees(t, l, h, p);
      });
  ASSERT_NO_FATAL_FAILURE(test::expect_logits_near(tr, ref, 2e-4));
  EXPECT_TRUE(test::evicted_interior(tr, static_cast<int>(N), r));
  std::filesystem::remove(path);
}

TEST_F(LongRope, CacheModeRerotationKeepsTheAttentionFactorOnce) {
  // PositionMode::Cache re-rotates kept keys to their new slot. Each layer-0 key at slot j must
  // equal the formula applied to its token's pre-RoPE key at position j (long set, factor a
  // once): re-rotation that scaled by a again, or used other frequencies, fails here.
  const std::string path = write_phi3("cache", phi3_shape(true));
  const auto m = load(path);
  const GgufFile f = GgufFile::open(path);
  const int64_t P = 9, B = 24, r = 8;
  const auto tokens = some_tokens(60);
  Engine engine(*m, 1);
  EvictionConfig cfg;
  cfg.budget = B;
  cfg.recent = r;
  cfg.positions = PositionMode::Cache;
  auto seq = engine.new_sequence(0, make_policy("random"), cfg, P, 50);
  std::vector<float> logits;
  engine.prefill(*seq, std::span<const int32_t>(tokens).first(P), logits);
  for (size_t t = static_cast<size_t>(P); seq->stats.rounds == 0; ++t) engine.decode(*seq, tokens[t], logits);
  int moved = 0;
  double worst = 0;
  for (int h = 0; h < m->config().n_kv_heads; ++h)
    for (int64_t j = 0; j < seq->kv.length(0); ++j) {
      const int32_t p = seq->kv.positions(0, h)[j];
      moved += j != p;
      const auto want = embed_ref(head(layer0_pre_rope(f, tokens[static_cast<size_t>(p)]).k, h), j, kLong, kAttn);
      for (int i = 0; i < kHd; ++i)
        worst = std::max(worst, std::abs(double(seq->kv.keys(0, h)[j * kHd + i]) - want[static_cast<size_t>(i)]));
    }
  EXPECT_GT(moved, 0);
  EXPECT_LT(worst, 1e-4);
  std::filesystem::remove(path);
}

TEST_F(LongRope, SelectorsIncludingTriAttentionRunWithinBudget) {
  // Selectors reading queries, probabilities and calibrated pre-RoPE statistics (calibrated
  // here on this LongRoPE model, so with the same frequencies) run within the budget.
  const std::string path = write_phi3("selectors", phi3_shape(true));
  const auto m = load(path);
  const int64_t P = 12, N = 80, B = 32, r = 8;
  const auto tokens = some_tokens(300);
  ASSERT_NO_FATAL_FAILURE(test::expect_selectors_within_budget(
      *m, tokens, std::span<const int32_t>(tokens).subspan(100, 200), temp_path("stats.json"), P, N, B, r));
  std::filesystem::remove(path);
}

TEST_F(LongRope, TriAttentionRefusesStatisticsOfTheOtherFactorSet) {
  // Statistics record ω_f; calibrated with the long set (default context), they are refused by a
  // model loaded for a 4096-token context (short set) instead of scoring with wrong phases.
  const std::string path = write_phi3("tri_sets", phi3_shape(true));
  const auto long_model = load(path), short_model = load(path, 4096);
  const auto tokens = some_tokens(120);
  ThreadPool pool(1);
  const QueryStats st = calibrate_query_stats(*long_model, std::span<const int32_t>(tokens).first(100), 0, pool);
  ASSERT_EQ(st.rope_inv_freq.size(), static_cast<size_t>(kHd / 2));
  // Recorded ω_f: 1 / (f_i · 10000^(2i/12)) for the long set, 0 for the unrotated tail.
  for (int i = 0; i < kHd / 2; ++i) {
    const double want =
        i < kBands ? 1.0 / (double(kLong[static_cast<size_t>(i)]) * std::pow(10000.0, 2.0 * i / kRot)) : 0.0;
    EXPECT_NEAR(st.rope_inv_freq[static_cast<size_t>(i)], want, 1e-12 + 1e-9 * want) << i;
  }
  const std::string stats = temp_path("tri_sets.json");
  save_query_stats(st, stats);
  EXPECT_EQ(load_query_stats(stats).rope_inv_freq, st.rope_inv_freq);
  const auto run = [&](const Model& m) {
    Engine engine(m, 1);
    EvictionConfig cfg;
    cfg.budget = 24;
    cfg.recent = 4;
    auto seq = engine.new_sequence(
        0, make_policy("triattention", std::nullopt, std::nullopt, SelectorParams::parse({"stats=" + stats})), cfg, 8,
        40);
    std::vector<float> lg;
    engine.prefill(*seq, std::span<const int32_t>(tokens).first(8), lg);
    for (size_t t = 8; t < 48; ++t) engine.decode(*seq, tokens[t], lg);
    return seq->stats.rounds;
  };
  EXPECT_GT(run(*long_model), 0);
  try {
    run(*short_model);
    ADD_FAILURE() << "statistics of the long set accepted by the short-set model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("triattention: statistics were calibrated with RoPE frequency"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove(stats);
  std::filesystem::remove(path);
}

TEST_F(LongRope, NamesAndValuesAgreeWithTheGgufPackage) {
  // llama.cpp's Python package (tests/longrope_gguf_reference.py) states the tensor and key names
  // and which architectures carry the factor sets, and reads back what we wrote.
  if (std::system("python3 -c 'import gguf' >/dev/null 2>&1") != 0)
    KVEVICT_SKIP_UNLESS_CI("python3 with the `gguf` package not found (pip install gguf numpy)");
  const std::string path = write_phi3("pyref", phi3_shape(true));
  const std::string out = temp_path("pyref.json");
  const std::string script = kvevict::test::source_path("tests/longrope_gguf_reference.py");
  const std::string cmd = "python3 '" + script + "' '" + path + "' '" + out + "'";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["tensor_long"], tensor_name::kRopeFactorsLong);
  EXPECT_EQ(j["tensor_short"], tensor_name::kRopeFactorsShort);
  std::vector<std::string> ours;
  for (const std::string& a : supported_architectures())
    if (arch_info(a, "test").longrope) ours.push_back(a);
  EXPECT_EQ(j["archs_with_longrope"].get<std::vector<std::string>>(), ours);
  const auto m = load(path);
  const LongRopeInfo& lr = m->config().longrope;
  EXPECT_EQ(j["file"]["long"].get<std::vector<float>>(), lr.long_factors);
  EXPECT_EQ(j["file"]["short"].get<std::vector<float>>(), lr.short_factors);
  EXPECT_EQ(j["file"]["long"].get<std::vector<float>>(), kLong);
  EXPECT_EQ(j["file"]["original_context"].get<int>(), lr.original_context);
  EXPECT_EQ(j["file"]["context_length"].get<int>(), m->config().context_length);
  EXPECT_EQ(static_cast<float>(j["file"]["attn_factor"].get<double>()),
            static_cast<float>(m->config().rope.attn_factor));
  // The key names the loader reads are the package's (the file carries them, the loader used them).
  EXPECT_NE(m->rope_note().find(j["key_original_context"].get<std::string>()), std::string::npos) << m->rope_note();
  EXPECT_TRUE(m->gguf().has(j["key_attn_factor"].get<std::string>()));
  std::filesystem::remove(out);
  std::filesystem::remove(path);
}

// ---- tools synth-gguf --longrope ----

TEST_F(LongRope, SynthGgufWritesALongRopeFileAndTheLoaderSaysWhichSet) {
  const std::string out = temp_path("cli.gguf");
  const auto r = test::run_cli("tools synth-gguf --shape tiny-phi3 --type f32 --longrope -o " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  // The load-back prints the choice: default context = context_length 131072 (32 x 4096).
  EXPECT_NE(r.out.find("LongRoPE: context size 131072 (phi3.context_length) > original context 4096 "
                       "(phi3.rope.scaling.original_context_length): using the long factors"),
            std::string::npos)
      << r.out;
  const GgufFile f = GgufFile::open(out);
  EXPECT_EQ(f.tensor("rope_factors_long.weight").n_elements(), kBands);
  EXPECT_EQ(f.tensor("rope_factors_short.weight").n_elements(), kBands);
  EXPECT_NEAR(f.get_float("phi3.rope.scaling.attn_factor"), kAttn, 1e-6);
  EXPECT_EQ(f.get_uint("phi3.rope.scaling.original_context_length"), 4096u);
  EXPECT_EQ(f.get_uint("phi3.context_length"), 131072u);
  // perplexity -c N runs N-token chunks, as llama-perplexity -c does, and picks the set by N.
  const std::string text = temp_path("ppl.txt");
  {
    std::ofstream t(text);
    for (int i = 0; i < 12; ++i) t << "the quick brown fox jumps over the lazy dog. ";
  }
  const auto ppl = test::run_cli("perplexity -t 1 -m " + out + " -f " + text + " -c 64");
  EXPECT_EQ(ppl.code, 0) << ppl.out;
  EXPECT_NE(ppl.out.find("LongRoPE: context size 64 <= original context 4096 "
                         "(phi3.rope.scaling.original_context_length): using the short factors"),
            std::string::npos)
      << ppl.out;
  std::filesystem::remove(text);
  const auto bad = test::run_cli("tools synth-gguf --shape tiny-qwen3 --longrope -o " + out + ".q");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.out.find("LongRoPE factors are a phi3 feature"), std::string::npos) << bad.out;
  std::filesystem::remove(out);
}

}  // namespace
}  // namespace kvevict
