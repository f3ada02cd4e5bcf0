// What a reasoner reads, measured through kvevict's own engine: positions are removed from every
// (layer, KV head) of a `full` cache the moment they are written (SequenceKv::compact, the eviction
// machinery's compaction; logical RoPE positions, so nothing is re-rotated), so no later token
// attends to them at any layer: an attention mask over those keys. Then the model's next-token
// prediction (teacher-forced trace) or its greedy answer is scored.
//   - recall, R = 1: hiding the value's one copy in the trace and the phase-A digits it is
//     computed from (generator.h: V is carried only by its copies, its computation and the
//     prompt facts) drops the recalled digit to chance (0.1); the copy alone hidden is printed
//     (a model may add phase A's last sum and value again at the answer). With R = 2 and the
//     computation hidden, hiding both copies drops it. For a model that claims to read any
//     surviving copy: hiding the first leaves it right (the restatement serves), and with R = 4,
//     keeping only the first restatement leaves it right.
//   - hiding the prompt's fact lines drops the greedy answers to chance.
// The tests run on every model of kAblationModels (and on KVEVICT_ABLATION_MODEL when set, taken
// as trained on every family); a test that needs a family the model was not trained on is
// skipped and says so. Expected values: the task generator's gold answers (tasks/generator.h);
// the chance bounds are binomial tails (above_chance, checked against SciPy below).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <ostream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "eval/grader.h"
#include "eviction/registry.h"
#include "model/model.h"
#include "tasks/generator.h"
#include "test_paths.h"

namespace kvevict {
namespace {

/// A model the ablations run on and the task families it was trained on (its model card).
struct AblationModel {
  std::string name;  ///< test-name suffix
  std::string path;
  std::set<TaskFamily> trained;
  /// Empty when the model's card claims it reads any surviving copy of a recall value, not only
  /// the memo line or the nearest copy; else the card's measurement that it does not, which
  /// RecallReadsAnySurvivingCopy gives as its reason to skip (a model is added to the table for
  /// what its card claims, so its other tests guard it in CI).
  std::string not_any_copy;
};

/// Test names show the model's path (not its bytes).
void PrintTo(const AblationModel& m, std::ostream* os) { *os << m.path; }

std::vector<AblationModel> ablation_models() {
  const std::string dir = kvevict::test::source_path("models/");
  std::vector<AblationModel> out = {
      // models/reasoner/MODEL_CARD.md: chain, running, once (not recall: its recall test is skipped).
      {"shipped", dir + "reasoner/reasoner.gguf", {TaskFamily::Chain, TaskFamily::Running, TaskFamily::Once}, ""},
      // models/trace-reasoner/MODEL_CARD.md: every family; "What it reads": the first of four
      // restatements alone 20/20, but R = 2's restatement alone 14/20, under this test's 18.
      {"trace", dir + "trace-reasoner/trace-reasoner.gguf",
       {all_task_families().begin(), all_task_families().end()},
       "its model card measures that it does not read every surviving copy (R = 2, restatement alone: 14/20)"},
  };
  if (const char* env = std::getenv("KVEVICT_ABLATION_MODEL"); env && *env)
    out.push_back({"env", env, {all_task_families().begin(), all_task_families().end()}, ""});
  return out;
}

/// Tasks per condition: `n`, or KVEVICT_ABLATION_N when set (the model card's larger runs; the
/// assertions then scale with it).
int tasks_per_condition(int n) {
  const char* env = std::getenv("KVEVICT_ABLATION_N");
  return env && std::atoi(env) > 0 ? std::atoi(env) : n;
}

/// Drops the slots holding logical positions `hidden` from every (layer, KV head) of `seq`.
void hide_positions(Sequence& seq, const std::set<int64_t>& hidden) {
  const KvShape s = seq.kv.shape();
  for (int l = 0; l < s.n_layers; ++l) {
    int64_t kept = 0;
    for (int h = 0; h < s.n_kv_heads; ++h) {
      std::vector<int32_t> keep;
      const int32_t* pos = seq.kv.positions(l, h);
      for (int64_t i = 0; i < seq.kv.length(l); ++i)
        if (!hidden.count(pos[i])) keep.push_back(static_cast<int32_t>(i));
      seq.kv.compact(l, h, keep);
      kept = static_cast<int64_t>(keep.size());
    }
    seq.kv.set_length(l, kept);
  }
}

/// Feeds tokens[0, n) into a new `full` sequence with room for `extra` more tokens, removing each
/// position in `hidden` (all < n) from the cache right after it is processed; `logits` = those
/// after the last token. The first piece is one prefill, the rest prefill_chunk pieces, cut after
/// each hidden position.
std::unique_ptr<Sequence> feed_with_hidden(Engine& engine, const std::vector<int32_t>& tokens, int64_t n,
                                           const std::set<int64_t>& hidden, int64_t extra, uint64_t id,
                                           std::vector<float>& logits) {
  auto seq = engine.new_sequence(id, make_policy("full"), EvictionConfig{}, n, extra);
  int64_t done = 0;
  std::vector<int64_t> cuts(hidden.begin(), hidden.end());
  cuts.push_back(n - 1);
  for (int64_t cut : cuts) {
    if (cut < done) continue;
    const std::span<const int32_t> piece(tokens.data() + done, static_cast<size_t>(cut + 1 - done));
    if (done == 0)
      engine.prefill(*seq, piece, logits);
    else
      engine.prefill_chunk(*seq, piece, logits);
    done = cut + 1;
    if (hidden.count(cut)) hide_positions(*seq, {cut});
  }
  return seq;
}

/// The logits after tokens[0, n) with `hidden` positions masked (feed_with_hidden).
std::vector<float> logits_with_hidden(Engine& engine, const std::vector<int32_t>& tokens, int64_t n,
                                      const std::set<int64_t>& hidden, uint64_t id) {
  std::vector<float> logits;
  feed_with_hidden(engine, tokens, n, hidden, 1, id, logits);
  return logits;
}

/// Greedy answer of `t` with the prompt positions in `hidden` masked from the start; decoding
/// stops when a \boxed{} closes or after the gold trace length + 16 tokens.
std::string greedy_with_hidden_prompt(Engine& engine, const Model& model, const Task& t,
                                      const std::set<int64_t>& hidden, uint64_t id) {
  const std::vector<int32_t> prompt = model.tokenizer().encode(t.problem, true);
  const auto max_new = static_cast<int64_t>(t.trace.size()) + 16;
  std::vector<float> logits;
  auto seq = feed_with_hidden(engine, prompt, static_cast<int64_t>(prompt.size()), hidden, max_new, id, logits);
  std::string out;
  for (int64_t i = 0; i < max_new; ++i) {
    const int32_t next = argmax(logits);
    if (model.tokenizer().is_eog(next)) break;
    out += model.tokenizer().piece(next);
    if (out.back() == '}' && extract_last_boxed(out)) break;
    engine.decode(*seq, next, logits);
  }
  return extract_last_boxed(out).value_or("");
}

/// Token positions (BOS = 0) of the prompt's fact lines "XY\n".
std::set<int64_t> fact_positions(const Task& t) {
  std::set<int64_t> out;
  for (size_t i = 0; i + 2 < t.problem.size(); i += 3)
    if (std::isupper(static_cast<unsigned char>(t.problem[i])) &&
        std::isupper(static_cast<unsigned char>(t.problem[i + 1])) && t.problem[i + 2] == '\n')
      for (size_t k = 0; k < 3; ++k) out.insert(static_cast<int64_t>(1 + i + k));
  return out;
}

/// Character offsets into a recall/revisit trace of phase A's digits: d and s of each running
/// line "cccX=Yds" and d of the last one "cccX=Yd&V" (V itself is a copy: value_copy_offsets).
/// Phase A ends at the first line with '&' (generator.h).
std::vector<int64_t> phase_a_digit_offsets(const std::string& trace) {
  std::vector<int64_t> out;
  for (size_t pos = 0; pos < trace.size();) {
    const size_t end = std::min(trace.find('\n', pos), trace.size());
    const std::string_view line(trace.data() + pos, end - pos);
    if (line.size() >= 8 && std::isdigit(static_cast<unsigned char>(line[6]))) {
      out.push_back(static_cast<int64_t>(pos + 6));
      if (line.size() == 8) out.push_back(static_cast<int64_t>(pos + 7));
    }
    if (line.size() == 9 && line[7] == '&') break;
    pos = end + 1;
  }
  return out;
}

struct RecallCounts {
  int full = 0, hidden = 0, n = 0;
};

/// Teacher-forced recall: BOS + problem + trace up to the answer's '&'; the prediction after it
/// must be V. `hide(copies)` picks which copy positions (token positions of V) to hide; with
/// `computation`, phase A's digits are hidden too (phase_a_digit_offsets). Phase B has `lo`..`hi`
/// lines (R = 2 restates once when it has more than 80).
template <class Pick>
RecallCounts recall_ablation(const Model& model, int64_t restate, int64_t lo, int64_t hi, int n, bool computation,
                             Pick hide) {
  Engine engine(model, 1);
  RecallCounts c;
  for (const Task& t : generate_tasks(TaskFamily::Recall, {kDefaultDepth + lo, kDefaultDepth + hi}, {kDefaultFacts, 26},
                                      5100 + static_cast<uint64_t>(restate), n, 0, {kDefaultDepth, kDefaultDepth},
                                      {restate})) {
    const std::string text = t.problem + t.trace;
    const std::vector<int32_t> tokens = model.tokenizer().encode(text, true);
    const auto answer_amp = static_cast<int64_t>(1 + t.problem.size() + t.trace.rfind('&'));  // token position
    const int32_t gold = tokens[static_cast<size_t>(answer_amp + 1)];
    const auto token_pos = [&](int64_t trace_offset) { return 1 + static_cast<int64_t>(t.problem.size()) + trace_offset; };
    std::vector<int64_t> copies;
    for (int64_t o : value_copy_offsets(TaskFamily::Recall, t.trace)) copies.push_back(token_pos(o));
    std::set<int64_t> hidden = hide(copies);
    if (computation)
      for (int64_t o : phase_a_digit_offsets(t.trace)) hidden.insert(token_pos(o));
    c.full += argmax(logits_with_hidden(engine, tokens, answer_amp + 1, {}, 0)) == gold;
    c.hidden += argmax(logits_with_hidden(engine, tokens, answer_amp + 1, hidden, 1)) == gold;
    ++c.n;
  }
  return c;
}

/// The smallest k with P(X >= k) <= 0.001 for X ~ Binomial(n, p), summed exactly: a count of k or
/// more right answers is not chance.
int above_chance(int n, double p) {
  double tail = 1;  // P(X >= k), from k = 0 up
  double pmf = std::pow(1 - p, n);  // P(X = 0)
  for (int k = 0; k <= n; ++k) {
    if (tail <= 0.001) return k;
    tail -= pmf;
    pmf *= static_cast<double>(n - k) / static_cast<double>(k + 1) * p / (1 - p);
  }
  return n + 1;
}

TEST(TraceAblationBound, ChanceBoundMatchesScipy) {
  // min k with scipy.stats.binom.sf(k - 1, n, p) <= 0.001
  EXPECT_EQ(above_chance(30, 0.1), 10);
  EXPECT_EQ(above_chance(20, 0.1), 8);
  EXPECT_EQ(above_chance(20, 1.0 / 12), 7);
  EXPECT_EQ(above_chance(200, 0.1), 35);
}

TEST(TraceAblationBound, PhaseADigitsAreTheRunningValuesAndSums) {
  // K = 6 phase-A lines: 5 running lines (d, s) and the memo line (d): 11 digits, each d the
  // value of the letter before it (generator.h), all before the first copy of V.
  const Task t = generate_task(TaskFamily::Recall, {40, kDefaultFacts, kDefaultDepth, 1}, 5300, 0);
  const std::vector<int64_t> digits = phase_a_digit_offsets(t.trace);
  ASSERT_EQ(digits.size(), static_cast<size_t>(2 * kDefaultDepth - 1)) << t.trace;
  EXPECT_LT(digits.back(), value_copy_offsets(TaskFamily::Recall, t.trace).at(0));
  for (size_t i = 0; i < digits.size(); i += 2) {
    const auto d = static_cast<size_t>(digits[i]);
    EXPECT_EQ(t.trace[d], '0' + letter_value(t.trace[d - 1])) << t.trace.substr(0, d + 1);
  }
}

class TraceAblation : public ::testing::TestWithParam<AblationModel> {
 protected:
  /// Whether the model was trained on every family of `needs`.
  bool trained_on(std::initializer_list<TaskFamily> needs) const {
    for (TaskFamily f : needs)
      if (!GetParam().trained.count(f)) return false;
    return true;
  }
  std::unique_ptr<Model> load() const {
    EXPECT_TRUE(std::filesystem::exists(GetParam().path)) << GetParam().path;
    return Model::load(GetParam().path);
  }
};

TEST_P(TraceAblation, RecallReadsItsCopiesInTheTrace) {
  if (!trained_on({TaskFamily::Recall}))
    GTEST_SKIP() << GetParam().path << " was not trained on recall; this test needs a model that was";
  const auto model = load();
  const auto all = [](const std::vector<int64_t>& c) { return std::set<int64_t>(c.begin(), c.end()); };
  // R = 1, phase B of 40-60 lines: the value's only copy hidden, with and without phase A's
  // digits. Chance is 0.1 (10 digits).
  const int n1 = tasks_per_condition(30);
  const RecallCounts copy_only = recall_ablation(*model, 1, 40, 60, n1, false, all);
  const RecallCounts one = recall_ablation(*model, 1, 40, 60, n1, true, all);
  std::fprintf(stderr, "recall R=1: full %d/%d, copy hidden %d/%d, copy and phase-A digits hidden %d/%d (chance bound %d)\n",
               one.full, one.n, copy_only.hidden, copy_only.n, one.hidden, one.n, above_chance(one.n, 0.1));
  EXPECT_GE(one.full, one.n * 9 / 10);
  EXPECT_LT(one.hidden, above_chance(one.n, 0.1));
  // R = 2, phase B of 85-100 lines (a restatement after line c = 80), phase A's digits hidden:
  // hiding both copies leaves nothing.
  const int n2 = tasks_per_condition(20);
  const RecallCounts none = recall_ablation(*model, 2, 85, 100, n2, true, all);
  std::fprintf(stderr, "recall R=2: full %d/%d, both copies hidden %d/%d\n", none.full, none.n, none.hidden, none.n);
  EXPECT_GE(none.full, none.n * 9 / 10);
  EXPECT_LT(none.hidden, above_chance(none.n, 0.1));
}

TEST_P(TraceAblation, RecallReadsAnySurvivingCopy) {
  if (!trained_on({TaskFamily::Recall}))
    GTEST_SKIP() << GetParam().path << " was not trained on recall; this test needs a model that was";
  if (!GetParam().not_any_copy.empty())
    GTEST_SKIP() << GetParam().path << ": " << GetParam().not_any_copy << ", so it is not held to this";
  const auto model = load();
  // R = 2, phase B of 85-100 lines (a restatement after line c = 80), phase A's digits hidden:
  // hiding the first copy leaves the restatement.
  const int n2 = tasks_per_condition(20);
  const RecallCounts keep_one = recall_ablation(*model, 2, 85, 100, n2, true, [](const std::vector<int64_t>& c) {
    return std::set<int64_t>{c.at(0)};
  });
  std::fprintf(stderr, "recall R=2: full %d/%d, first copy hidden %d/%d\n", keep_one.full, keep_one.n,
               keep_one.hidden, keep_one.n);
  EXPECT_GE(keep_one.full, keep_one.n * 9 / 10);
  EXPECT_GE(keep_one.hidden, keep_one.n * 9 / 10);
  // R = 4, phase B of 125-140 lines (restatements after lines c = 120, 80, 40: four copies), phase
  // A's digits hidden, only the first restatement kept: the copy the model reads need not be the
  // memo line or the nearest one (~80 lines, ~600 tokens, before the answer).
  const RecallCounts second = recall_ablation(*model, 4, 125, 140, n2, true, [](const std::vector<int64_t>& c) {
    std::set<int64_t> hidden(c.begin(), c.end());
    hidden.erase(c.at(1));
    return hidden;
  });
  std::fprintf(stderr, "recall R=4: full %d/%d, all copies but the first restatement hidden %d/%d\n", second.full,
               second.n, second.hidden, second.n);
  EXPECT_GE(second.full, second.n * 9 / 10);
  EXPECT_GE(second.hidden, second.n * 9 / 10);
}

TEST_P(TraceAblation, HidingThePromptFactsDropsAnswersToChance) {
  // Short traces (greedy decoding runs token by token): chain with 17 steps and, where the model
  // was trained on it, recall with 17 phase-B lines (17 is no multiple of a cycle's length here,
  // so the answer is never the start letter). Chance: 1/20 for chain's letter; recall needs its
  // cycle-B letter (<= 1/12) and the digit.
  std::vector<TaskFamily> families = {TaskFamily::Chain};
  if (trained_on({TaskFamily::Recall})) families.push_back(TaskFamily::Recall);
  const auto model = load();
  Engine engine(*model, 1);
  int full = 0, hidden = 0, n = 0;
  for (TaskFamily f : families) {
    const int64_t steps = f == TaskFamily::Chain ? 17 : kDefaultDepth + 17;
    for (uint64_t i = 0; i < static_cast<uint64_t>(tasks_per_condition(20)); ++i) {
      const Task t = generate_task(f, {steps, kDefaultFacts}, 5200, i);
      full += greedy_with_hidden_prompt(engine, *model, t, {}, i) == t.answer;
      hidden += greedy_with_hidden_prompt(engine, *model, t, fact_positions(t), i) == t.answer;
      ++n;
    }
  }
  std::fprintf(stderr, "prompt facts hidden: full %d/%d, hidden %d/%d\n", full, n, hidden, n);
  EXPECT_GE(full, n * 9 / 10);
  EXPECT_LT(hidden, above_chance(n, 1.0 / 12));
}

INSTANTIATE_TEST_SUITE_P(Models, TraceAblation, ::testing::ValuesIn(ablation_models()),
                         [](const ::testing::TestParamInfo<AblationModel>& p) { return p.param.name; });

}  // namespace
}  // namespace kvevict
