// `divergence_text` and `attention_mass` (eval/divergence.h) against independent computations:
// separately run sequences with a log-softmax written here, and the naive reference forward pass
// (tests/reference_model.h) for the attention probabilities.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_run.h"
#include "eval/divergence.h"
#include "util/error.h"
#include "model_fixture.h"
#include "reference_model.h"
#include "test_tmp.h"

namespace kvevict {
namespace {

using test::greedy_story_tokens;

// Mean KL(full || other) and mean NLLs from two lists of logits rows, in long double: the
// reference the engine's lockstep batch must reproduce.
struct RefKl {
  long double kl = 0, nll_full = 0, nll_other = 0;
};
RefKl reference_kl(const std::vector<std::vector<float>>& full, const std::vector<std::vector<float>>& other,
                   const std::vector<int32_t>& targets) {
  RefKl r;
  for (size_t i = 0; i < full.size(); ++i) {
    auto lsm = [](const std::vector<float>& x) {
      long double mx = x[0], s = 0;
      for (float v : x) mx = std::max(mx, static_cast<long double>(v));
      for (float v : x) s += std::exp(static_cast<long double>(v) - mx);
      std::vector<long double> out;
      for (float v : x) out.push_back(static_cast<long double>(v) - mx - std::log(s));
      return out;
    };
    const auto p = lsm(full[i]), q = lsm(other[i]);
    long double kl = 0;
    for (size_t k = 0; k < p.size(); ++k) kl += std::exp(p[k]) * (p[k] - q[k]);
    r.kl += kl;
    r.nll_full -= p[static_cast<size_t>(targets[i])];
    r.nll_other -= q[static_cast<size_t>(targets[i])];
  }
  const auto n = static_cast<long double>(full.size());
  r.kl /= n;
  r.nll_full /= n;
  r.nll_other /= n;
  return r;
}

// One sequence decoded on its own (Engine::decode, not batched): the logits predicting
// tokens[P..N-1].
std::vector<std::vector<float>> solo_rows(Engine& engine, const Policy& p, const EvictionConfig& cfg,
                                          const std::vector<int32_t>& tokens, int64_t prompt, uint64_t id) {
  const auto n = static_cast<int64_t>(tokens.size());
  auto seq = engine.new_sequence(id, p, cfg, prompt, n - prompt);
  std::vector<float> logits;
  engine.prefill(*seq, std::span<const int32_t>(tokens).first(static_cast<size_t>(prompt)), logits);
  std::vector<std::vector<float>> rows;
  for (int64_t i = prompt; i < n; ++i) {
    rows.push_back(logits);
    if (i + 1 < n) engine.decode(*seq, tokens[static_cast<size_t>(i)], logits);
  }
  return rows;
}

TEST(Divergence, CellWithoutRoundsHasZeroKl) {
  KVEVICT_REQUIRE_MODEL(model);
  const auto tokens = greedy_story_tokens(*model, 90);
  Engine engine(*model, 2);
  EvictionConfig cfg;
  cfg.budget = 120;  // above the text length: no round is ever due
  cfg.recent = 8;
  const std::vector<DivergenceCell> cells = {{"random@120", make_policy("random"), cfg}};
  const DivergenceText r = divergence_text(engine, tokens, 20, cells, 3);
  EXPECT_EQ(r.all.n, 70);
  EXPECT_EQ(r.answer.n, 0);  // no answer start given
  EXPECT_EQ(r.stats[0].rounds, 0);
  EXPECT_EQ(r.all.kl[0], 0.0);
  EXPECT_EQ(r.all.nll[0], r.all.full_nll);
  EXPECT_EQ(r.all.top1[0], 1.0);
}

TEST(Divergence, EqualsSeparateRunsAndLogSoftmaxWrittenHere) {
  KVEVICT_REQUIRE_MODEL(model);
  const auto tokens = greedy_story_tokens(*model, 140);
  const int64_t prompt = 24;
  Engine engine(*model, 2);
  EvictionConfig cfg;
  cfg.budget = 40;
  cfg.recent = 8;
  cfg.seed = 11;
  const std::vector<DivergenceCell> cells = {{"random@40", make_policy("random"), cfg},
                                             {"h2o@40", make_policy("h2o"), cfg},
                                             {"recency@40", make_policy("recency"), cfg}};
  const uint64_t id = 5;
  const int64_t answer_from = 125;  // the last 15 positions as the "answer" span
  const DivergenceText r = divergence_text(engine, tokens, prompt, cells, id, answer_from);
  const std::vector<int32_t> targets(tokens.begin() + prompt, tokens.end());
  const auto full = solo_rows(engine, make_policy("full"), {}, tokens, prompt, id);
  ASSERT_EQ(r.answer.n, 140 - answer_from);
  const auto tail = [&](const auto& v) { return std::vector(v.begin() + (answer_from - prompt), v.end()); };
  for (size_t c = 0; c < cells.size(); ++c) {
    SCOPED_TRACE(cells[c].label);
    const auto other = solo_rows(engine, cells[c].policy, cells[c].eviction, tokens, prompt, id);
    const RefKl ref = reference_kl(full, other, targets);
    EXPECT_GT(r.stats[c].rounds, 5);
    EXPECT_GT(r.all.kl[c], 1e-4);  // eviction did change the distributions
    EXPECT_NEAR(r.all.kl[c], static_cast<double>(ref.kl), 1e-9 * std::max(1.0, static_cast<double>(ref.kl)));
    EXPECT_NEAR(r.all.nll[c], static_cast<double>(ref.nll_other), 1e-9);
    EXPECT_NEAR(r.all.full_nll, static_cast<double>(ref.nll_full), 1e-9);
    // The answer span: the same reference over the last positions only.
    const RefKl ans = reference_kl(tail(full), tail(other), tail(targets));
    EXPECT_GT(r.answer.kl[c], 1e-6);
    EXPECT_NEAR(r.answer.kl[c], static_cast<double>(ans.kl), 1e-9 * std::max(1.0, static_cast<double>(ans.kl)));
    EXPECT_NEAR(r.answer.nll[c], static_cast<double>(ans.nll_other), 1e-9);
    EXPECT_NEAR(r.answer.full_nll, static_cast<double>(ans.nll_full), 1e-9);
  }
}

TEST(Divergence, AttentionMassMatchesReferenceForward) {
  KVEVICT_REQUIRE_MODEL(model);
  const auto a = greedy_story_tokens(*model, 48);
  auto b = model->tokenizer().encode("The cat sat on the mat and looked at the big red ball for a long time", true);
  const std::vector<std::vector<int32_t>> texts = {a, b};
  const int k = 4;
  const int64_t min_pos = 10;
  ThreadPool pool(2);
  const AttentionMass m = attention_mass(*model, texts, k, min_pos, pool);
  const ModelConfig& c = model->config();
  std::vector<double> want(static_cast<size_t>(c.n_layers * c.n_heads), 0.0);
  int64_t queries = 0;
  double uniform = 0;
  const test::ReferenceLlama ref(*model);
  for (const auto& t : texts) {
    ref.run(t, [](int, int, int, int) { return true; },
            [&](int tq, int layer, int head, const std::vector<double>& w) {
              if (tq < min_pos) return;
              double s = 0;
              for (int p = 0; p < k; ++p) s += w[static_cast<size_t>(p)];
              want[static_cast<size_t>(layer * c.n_heads + head)] += s;
              if (layer == 0 && head == 0) {
                ++queries;
                uniform += static_cast<double>(k) / (tq + 1);
              }
            });
  }
  ASSERT_EQ(m.queries, queries);
  EXPECT_NEAR(m.uniform, uniform / static_cast<double>(queries), 1e-12);
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(m.mass[i], want[i] / static_cast<double>(queries), 1e-4) << i;
}

TEST(Divergence, RefusesBadInput) {
  KVEVICT_REQUIRE_MODEL(model);
  Engine engine(*model, 1);
  const auto tokens = greedy_story_tokens(*model, 30);
  EXPECT_THROW(divergence_text(engine, tokens, 30, {}, 0), Error);
  const std::vector<DivergenceCell> full_cell = {{"full", make_policy("full"), {}}};
  EXPECT_THROW(divergence_text(engine, tokens, 10, full_cell, 0), Error);
  EvictionConfig cfg;
  cfg.budget = 16;
  cfg.recent = 4;
  const std::vector<DivergenceCell> random_cell = {{"random@16", make_policy("random"), cfg}};
  EXPECT_THROW(divergence_text(engine, tokens, 10, random_cell, 0, 5), Error);   // answer inside the prompt
  EXPECT_THROW(divergence_text(engine, tokens, 10, random_cell, 0, 30), Error);  // answer past the text
  ThreadPool pool(1);
  const std::vector<std::vector<int32_t>> texts = {tokens};
  EXPECT_THROW(attention_mass(*model, texts, 4, 2, pool), Error);
  EXPECT_THROW(attention_mass(*model, texts, 4, 64, pool), Error);  // no text reaches position 64
}

TEST(DivergenceCli, ErrorsNameTheOption) {
  KVEVICT_REQUIRE_MODEL(model);
  const std::string m = "-m " + test::stories260k();
  const std::string wiki = test::shared_dir() + "/data/wikitext-2-raw/wiki.test.raw";
  auto r = test::run_cli("divergence " + m + " -f " + wiki + " --policies random --budget-fractions 1.5 -r 8");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--budget-fractions: '1.5' must be a number in (0, 1]"), std::string::npos) << r.out;
  r = test::run_cli("divergence " + m + " -f " + wiki + " --policies random --budget-fractions 0.02 --length 256 -r 8");
  EXPECT_EQ(r.code, 2);  // B = 5 <= r = 8
  r = test::run_cli("divergence " + m + " -f " + wiki + " --length 64 --prompt-tokens 64 --budgets 32 -r 8");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--prompt-tokens 64"), std::string::npos) << r.out;
}

TEST(DivergenceCli, RunsOnTextAndTaskFiles) {
  KVEVICT_REQUIRE_MODEL(model);
  const std::string m = "-m " + test::stories260k();
  const std::string wiki = test::shared_dir() + "/data/wikitext-2-raw/wiki.test.raw";
  auto r = test::run_cli("divergence " + m + " -f " + wiki +
                         " --texts 2 --length 96 --prompt-tokens 16 --policies random,recency --budget-fractions 0.4 -r 8 "
                         "--sink-mass -t 1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("wiki.test.raw: 2 texts"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attention mass on the first 4 positions"), std::string::npos) << r.out;
}

// Task files: the final answer's tokens (inside the last \boxed{} and its closing brace) get
// their own columns and table; a text file's rows leave them empty. The expected span length
// comes from the task's own answer field, tokenized here.
TEST(DivergenceCli, TaskFilesScoreTheFinalAnswerApart) {
  const std::string model = test::source_path("models/trace-reasoner/trace-reasoner.gguf");
  const std::string dir = test::fresh_dir("divergence_answer");
  auto r = test::run_cli("tasks gen --family recall --steps 30 --depth 4 --restate 2 --count 3 --seed 9 -o " + dir +
                         "/tasks.jsonl");
  ASSERT_EQ(r.code, 0) << r.out;
  r = test::run_cli("divergence -m " + model + " -f " + dir + "/tasks.jsonl --texts 3 --policies random,recency " +
                    "--budgets 64 -r 8 --bootstrap 200 -t 1 -o " + dir + "/out");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("final answer tokens only"), std::string::npos) << r.out;
  const auto m = Model::load(model);
  std::ifstream tasks(dir + "/tasks.jsonl");
  std::vector<size_t> want;
  for (std::string line; std::getline(tasks, line);)
    want.push_back(m->tokenizer().encode(nlohmann::json::parse(line)["answer"].get<std::string>() + "}", false).size());
  ASSERT_EQ(want.size(), 3u);
  std::ifstream csv(dir + "/out/divergence.csv");
  std::string header, row;
  std::getline(csv, header);
  ASSERT_NE(header.find(",answer_tokens,answer_kl,answer_nll,answer_full_nll,answer_top1"), std::string::npos);
  int rows = 0;
  while (std::getline(csv, row)) {
    std::vector<std::string> f;
    std::stringstream ss(row);
    for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
    ASSERT_GE(f.size(), 16u) << row;
    EXPECT_EQ(std::stoul(f[11]), want[std::stoul(f[1])]) << row;
    EXPECT_GE(std::stod(f[12]), 0.0) << row;
    ++rows;
  }
  EXPECT_EQ(rows, 6);  // 3 texts x 2 cells
  std::ifstream js(dir + "/out/summary.json");
  const auto summary = nlohmann::json::parse(js);
  ASSERT_FALSE(summary.empty());
  EXPECT_EQ(summary[0]["answer"]["texts"].get<int>(), 3);
}

}  // namespace
}  // namespace kvevict
