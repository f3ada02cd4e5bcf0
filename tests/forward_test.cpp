// Forward pass and perplexity parity: kvevict vs llama.cpp's figures in
// ../shared/reference/stories260K.json (an independent implementation), and vs the naive
// reference model in reference_model.h.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <numeric>
#include <set>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "eval/perplexity.h"
#include "model_fixture.h"
#include "reference_model.h"

namespace kvevict {
namespace {

nlohmann::json reference() {
  std::ifstream f(test::shared_path("reference/stories260K.json"));
  return nlohmann::json::parse(f);
}

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(Forward, LastTokenLogitsMatchLlamaCpp) {
  KVEVICT_REQUIRE_MODEL(m);
  // Expected: llama.cpp's full logit vector after "Once upon a time, there was a little"
  // (reference/stories260K.json "logits"). Measured here: max |diff| = 4.2e-4 of the largest
  // |logit| (7e-3 absolute), while kvevict agrees with the float64-accumulating naive reference
  // to 2e-5 (PrefillAndDecodeMatchNaiveReference). The gap is llama.cpp's, consistent with its
  // default F16 KV cache and F16 attention accumulation; its chunked perplexity still agrees
  // with ours to 0.005% (ChunkedPerplexity below). So the bound here is 1e-3 of the largest
  // |logit|, plus an exact argmax and the same top-10 set.
  const auto ref = reference()["logits"];
  const auto ids = m->tokenizer().encode(ref["prompt"], true);
  Engine engine(*m, 1);
  auto seq = engine.new_sequence(0, make_policy("full"), {}, static_cast<int64_t>(ids.size()), 0);
  std::vector<float> logits;
  engine.prefill(*seq, ids, logits);
  const auto expected = ref["last_token_logits"].get<std::vector<float>>();
  ASSERT_EQ(logits.size(), expected.size());
  float scale = 0, worst = 0;
  for (float e : expected) scale = std::max(scale, std::abs(e));
  for (size_t i = 0; i < expected.size(); ++i) worst = std::max(worst, std::abs(logits[i] - expected[i]));
  EXPECT_LE(worst / scale, 1e-3) << "max abs diff " << worst;
  EXPECT_EQ(argmax(logits), argmax(expected));
  const auto top10 = [](std::vector<float> v) {
    std::vector<int> idx(v.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + 10, idx.end(),
                      [&](int a, int b) { return v[static_cast<size_t>(a)] > v[static_cast<size_t>(b)]; });
    return std::set<int>(idx.begin(), idx.begin() + 10);
  };
  EXPECT_EQ(top10(logits), top10(expected));
}

TEST(Forward, GreedyTokensMatchLlamaCpp) {
  KVEVICT_REQUIRE_MODEL(m);
  // Expected: the 64 greedy ids after "Once upon a time" (reference "greedy"), decoded one token
  // at a time through the decode path.
  const auto ref = reference()["greedy"];
  const auto prompt = m->tokenizer().encode(ref["prompt"], true);
  const auto expected = ref["ids"].get<std::vector<int32_t>>();
  Engine engine(*m, 2);
  auto seq = engine.new_sequence(0, make_policy("full"), {}, static_cast<int64_t>(prompt.size()), 64);
  std::vector<float> logits;
  engine.prefill(*seq, prompt, logits);
  std::vector<int32_t> got;
  for (size_t i = 0; i < expected.size(); ++i) {
    got.push_back(argmax(logits));
    engine.decode(*seq, got.back(), logits);
  }
  EXPECT_EQ(got, expected);
  EXPECT_EQ(m->tokenizer().decode(got), ref["text"].get<std::string>());
}

TEST(Forward, PrefillAndDecodeMatchNaiveReference) {
  KVEVICT_REQUIRE_MODEL(m);
  // Expected: reference_model.h (float64 sums, no cache) run over the same tokens with every
  // position visible; float32 vs float64 accumulation bounds the difference.
  const auto ids = m->tokenizer().encode("Lily saw a big dog. The dog was happy and ran to the park.", true);
  const size_t split = 6;  // prefill the first 6 tokens, decode the rest one by one
  Engine engine(*m, 2);
  auto seq = engine.new_sequence(0, make_policy("full"), {}, split, static_cast<int64_t>(ids.size()));
  std::vector<std::vector<float>> got;
  std::vector<float> logits;
  engine.prefill(*seq, std::span<const int32_t>(ids).first(split), logits, true);
  const int64_t V = m->config().n_vocab;
  for (size_t t = 0; t < split; ++t)
    got.emplace_back(logits.begin() + static_cast<int64_t>(t) * V, logits.begin() + static_cast<int64_t>(t + 1) * V);
  for (size_t t = split; t < ids.size(); ++t) {
    engine.decode(*seq, ids[t], logits);
    got.push_back(logits);
  }
  const auto ref = test::ReferenceLlama(*m).run(ids, [](int, int, int, int) { return true; });
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t i = 0; i < V; ++i)
      ASSERT_NEAR(got[t][static_cast<size_t>(i)], ref[t][static_cast<size_t>(i)], 2e-5)
          << "token " << t << " logit " << i;
}

struct ChunkCase {
  const char* name;
  const char* file;
  int64_t ctx, chunks;
};

class ChunkedPerplexity : public ::testing::TestWithParam<ChunkCase> {};

TEST_P(ChunkedPerplexity, MatchesLlamaCpp) {
  KVEVICT_REQUIRE_MODEL(m);
  // Expected: llama-perplexity's "Final estimate" for the same file and flags
  // (reference/stories260K.json "perplexity_chunked"); the target is agreement within 0.5%.
  const ChunkCase c = GetParam();
  nlohmann::json row;
  const nlohmann::json ref = reference();
  for (const auto& r : ref["perplexity_chunked"])
    if (r["text"] == std::string("data/") + c.file) row = r;
  ASSERT_FALSE(row.is_null());
  const auto tokens = m->tokenizer().encode(slurp(test::shared_path(std::string("data/") + c.file)), true);
  Engine engine(*m, 2);
  const auto r = perplexity_chunked(engine, make_policy("full"), {}, tokens, c.ctx, c.chunks);
  std::printf("kvevict PPL %.4f +/- %.5f (first chunk %.4f); llama.cpp %.4f +/- %.5f (first chunk %.4f)\n", r.ppl,
              r.ppl_stderr, r.running_ppl.front(), row["ppl"].get<double>(), row["ppl_stderr"].get<double>(),
              row["first_chunk_ppl"].get<double>());
  EXPECT_NEAR(r.ppl, row["ppl"].get<double>(), 0.005 * row["ppl"].get<double>());
  EXPECT_NEAR(r.running_ppl.front(), row["first_chunk_ppl"].get<double>(),
              0.005 * row["first_chunk_ppl"].get<double>());
  EXPECT_NEAR(r.ppl_stderr, row["ppl_stderr"].get<double>(), 0.02 * row["ppl_stderr"].get<double>());
}

INSTANTIATE_TEST_SUITE_P(Reference, ChunkedPerplexity,
                         ::testing::Values(ChunkCase{"Wikitext_c128", "wikitext-2-raw/wiki.test.raw", 128, 50},
                                           ChunkCase{"Gutenberg10146_c256", "gutenberg-pg19-test-books/10146.txt", 256,
                                                     20},
                                           ChunkCase{"TinyStories_c64", "tinystories/tinystories_sample.txt", 64, 10}),
                         [](const ::testing::TestParamInfo<ChunkCase>& i) { return std::string(i.param.name); });

TEST(Perplexity, TokenByTokenFullEqualsPrefillChunk) {
  KVEVICT_REQUIRE_MODEL(m);
  // Expected: with `full`, decoding token by token must give the same NLLs as one prefill of
  // the whole chunk (two code paths, one quantity).
  const auto tokens = m->tokenizer().encode(slurp(test::shared_path("data/tinystories/tinystories_sample.txt")), true);
  std::vector<int32_t> head(tokens.begin(), tokens.begin() + 200);
  Engine engine(*m, 2);
  const auto dec = perplexity_decode(engine, make_policy("full"), {}, head);
  auto seq = engine.new_sequence(0, make_policy("full"), {}, 200, 0);
  std::vector<float> logits;
  engine.prefill(*seq, head, logits, true);
  const int64_t V = m->config().n_vocab;
  for (size_t i = 0; i + 1 < head.size(); ++i)
    ASSERT_NEAR(dec.nll[i],
                token_nll(std::span<const float>(logits).subspan(i * static_cast<size_t>(V), static_cast<size_t>(V)),
                          head[i + 1]),
                1e-4);
}

}  // namespace
}  // namespace kvevict
