// The accuracy cost of `kvevict serve`'s default f16 KV cache (llama.cpp's default) against f32:
// the same text, teacher-forced token by token through Engine::decode (every step reads the
// cache), once with each KV type; per position the KL divergence KL(p_f32 || p_f16) of the
// next-token distributions (log-softmax computed here in double), the top-1 agreement and each
// run's perplexity. Prints the figures docs/serving.md quotes and bounds them loosely (the
// bound is what "negligible" means there: mean KL below 1e-3 nats, top-1 agreement >= 98%).
// Text: the first 512 tokens of ../shared/data/tinystories/tinystories_sample.txt for the
// TinyStories models; for the default model (models/reasoner) a `chain` task of `kvevict tasks
// gen` (seed 0, its problem and worked trace: the text it was trained on).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "eviction/registry.h"
#include "model/model.h"
#include "tasks/generator.h"
#include "test_paths.h"

namespace kvevict {
namespace {

struct KvTypeFigures {
  double mean_kl = 0, max_kl = 0, top1_agree = 0, ppl_f32 = 0, ppl_f16 = 0;
  int64_t tokens = 0;
};

std::vector<double> log_softmax(const std::vector<float>& x) {
  double mx = -INFINITY;
  for (const float v : x) mx = std::max(mx, static_cast<double>(v));
  double s = 0;
  for (const float v : x) s += std::exp(static_cast<double>(v) - mx);
  const double lse = mx + std::log(s);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = static_cast<double>(x[i]) - lse;
  return out;
}

KvTypeFigures measure(const std::string& model_path, const std::string& text, int64_t n_tokens) {
  const auto model = Model::load(model_path);
  std::vector<int32_t> toks = model->tokenizer().encode(text.substr(0, 8 * static_cast<size_t>(n_tokens)), true);
  if (static_cast<int64_t>(toks.size()) > n_tokens) toks.resize(static_cast<size_t>(n_tokens));
  n_tokens = std::min<int64_t>(static_cast<int64_t>(toks.size()), model->config().context_length);
  Engine e32(*model, 1, KvType::F32), e16(*model, 1, KvType::F16);
  auto s32 = e32.new_sequence(0, make_policy("full"), {}, 1, n_tokens);
  auto s16 = e16.new_sequence(0, make_policy("full"), {}, 1, n_tokens);
  std::vector<float> l32, l16;
  e32.prefill(*s32, std::span<const int32_t>(toks.data(), 1), l32);
  e16.prefill(*s16, std::span<const int32_t>(toks.data(), 1), l16);
  KvTypeFigures r;
  double nll32 = 0, nll16 = 0;
  int64_t agree = 0;
  for (int64_t t = 1; t < n_tokens; ++t) {
    const std::vector<double> a = log_softmax(l32), b = log_softmax(l16);
    double kl = 0;
    size_t am = 0, bm = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      kl += std::exp(a[i]) * (a[i] - b[i]);
      if (a[i] > a[am]) am = i;
      if (b[i] > b[bm]) bm = i;
    }
    r.mean_kl += kl;
    r.max_kl = std::max(r.max_kl, kl);
    agree += am == bm;
    const auto next = static_cast<size_t>(toks[static_cast<size_t>(t)]);
    nll32 -= a[next];
    nll16 -= b[next];
    e32.decode(*s32, toks[static_cast<size_t>(t)], l32);
    e16.decode(*s16, toks[static_cast<size_t>(t)], l16);
  }
  r.tokens = n_tokens - 1;
  r.mean_kl /= static_cast<double>(r.tokens);
  r.top1_agree = static_cast<double>(agree) / static_cast<double>(r.tokens);
  r.ppl_f32 = std::exp(nll32 / static_cast<double>(r.tokens));
  r.ppl_f16 = std::exp(nll16 / static_cast<double>(r.tokens));
  return r;
}

std::string tinystories() {
  std::ifstream f(test::shared_path("data/tinystories/tinystories_sample.txt"));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void report(const std::string& name, const std::string& model_path, const std::string& text) {
  if (!std::filesystem::exists(model_path) || text.empty()) GTEST_SKIP() << "missing " << model_path << " or its text";
  const KvTypeFigures r = measure(model_path, text, 512);
  std::printf("[kv f16 vs f32] %s: %lld tokens, mean KL %.3g nats, max KL %.3g, top-1 agreement %.4f, "
              "perplexity f32 %.4f f16 %.4f\n",
              name.c_str(), static_cast<long long>(r.tokens), r.mean_kl, r.max_kl, r.top1_agree, r.ppl_f32, r.ppl_f16);
  EXPECT_LT(r.mean_kl, 1e-3);
  EXPECT_GE(r.top1_agree, 0.98);
  EXPECT_GT(r.max_kl, 0.0);  // the two runs differ at all: f16 is in use
}

TEST(ServeKvType, F16AgainstF32OnTheDefaultModel) {
  const Task t = generate_task(TaskFamily::Chain, TaskSize{steps_for_trace_length(TaskFamily::Chain, 520), 20, 0, 1},
                               0, 0);
  report("reasoner", kvevict::test::reasoner_model(), t.problem + t.trace);
}

TEST(ServeKvType, F16AgainstF32OnStories260K) { report("stories260K", test::stories260k(), tinystories()); }

TEST(ServeKvType, F16AgainstF32OnTinyStories656K) {
  report("tinystories-656k", test::shared_path("models/tinystories-656k"), tinystories());
}

}  // namespace
}  // namespace kvevict
