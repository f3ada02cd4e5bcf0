// Failures inside a batched scheduler step end only what failed (engine.h StepFailure):
//   - a request with n choices fails whole when one choice fails (one Failed event with the first
//     error, no partial result: scheduler.h, docs/serving.md), so its other choices must end
//     within a scheduler step instead of decoding to max_tokens for nobody;
//   - a request whose selector state throws while observing the pass (after other requests'
//     caches of the same pass were written) fails alone, and a request beside it produces the
//     tokens it produces alone, bit for bit, instead of being retried into a token written twice.
// The faults are selectors defined outside the registry (as the Python package's are).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "eviction/registry.h"
#include "model/model.h"
#include "model/observer.h"
#include "serve/scheduler.h"
#include "util/error.h"
#include "test_paths.h"

namespace kvevict {
namespace {

using serve::FinishReason;
using serve::GenerationParams;
using serve::Request;
using serve::RequestEvent;
using serve::Scheduler;
using serve::SchedulerOptions;

constexpr const char* kFault = "injected selector fault on sequence 1";

// Uniform scores for every sequence but 1, whose first eviction round throws.
class FailOnSequence1 final : public PerHeadSelector {
 public:
  void score_head(const RoundInput& in, const SelectorState*, int, int, std::span<float> out) const override {
    if (in.sequence_id == 1) throw Error(kFault);
    for (float& s : out) s = 0.5f;
  }
};

const PolicyInfo& fail_on_sequence_1() {
  static const PolicyInfo info{.name = "fail-on-sequence-1",
                               .summary = "test fault",
                               .source = "this test",
                               .evicts = true,
                               .protect_prompt = true,
                               .sinks = 0,
                               .make = [](const SelectorParams&) { return std::make_unique<FailOnSequence1>(); }};
  return info;
}

constexpr const char* kObserveFault = "injected observation fault at position 40";

// Asks for the queries (so its state observes every pass) and throws observing position 40 in
// layer 1, after layer 0 of the whole batch was written.
class FailingObservation final : public PerHeadSelector {
 public:
  class State final : public SelectorState {
   public:
    void observe(const AttentionObservation& obs) override {
      if (obs.position == 40 && obs.layer == 1) throw Error(kObserveFault);
    }
  };
  SelectorNeeds needs() const override { return {.queries = true}; }
  std::unique_ptr<SelectorState> make_state(const KvShape&) const override { return std::make_unique<State>(); }
  void score_head(const RoundInput&, const SelectorState*, int, int, std::span<float> out) const override {
    for (float& s : out) s = 0.5f;
  }
};

const PolicyInfo& failing_observation() {
  static const PolicyInfo info{.name = "failing-observation",
                               .summary = "test fault",
                               .source = "this test",
                               .evicts = true,
                               .protect_prompt = true,
                               .sinks = 0,
                               .make = [](const SelectorParams&) { return std::make_unique<FailingObservation>(); }};
  return info;
}

GenerationParams sampled(std::vector<int32_t> prompt, int64_t max_tokens, const Policy& policy, uint64_t seed) {
  GenerationParams p;
  p.prompt = std::move(prompt);
  p.generation.max_new_tokens = max_tokens;
  p.generation.ignore_eos = true;
  p.generation.sampler.temperature = 0.8f;
  p.generation.sampler.seed = seed;
  EvictionConfig e;
  e.budget = 64;
  e.recent = 16;
  e.seed = seed;
  p.kv = CheckedPolicy::check(policy, e);
  return p;
}

// Runs `reqs` to their last event; returns each one's last event kind (Done / Failed / none).
std::vector<std::optional<RequestEvent>> run_all(const std::vector<std::shared_ptr<Request>>& reqs) {
  std::vector<std::optional<RequestEvent>> last(reqs.size());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  for (size_t i = 0; i < reqs.size(); ++i)
    while (!last[i] && std::chrono::steady_clock::now() < deadline) {
      auto ev = reqs[i]->next_event(std::chrono::milliseconds(100));
      if (ev && (ev->kind == RequestEvent::Kind::Done || ev->kind == RequestEvent::Kind::Failed)) last[i] = ev;
    }
  return last;
}

TEST(ServeChoiceFailure, AFailedObservationEndsOnlyItsRequestAndTheBatchNeighbourIsUnchanged) {
  const auto m = Model::load(kvevict::test::reasoner_model());
  SchedulerOptions so;
  so.threads = 1;
  so.kv_memory_bytes = 64 << 20;
  const Policy bad = make_policy(failing_observation(), "failing-observation", false, std::nullopt, std::nullopt, {}, true);
  const Policy good = make_policy("random");
  // Reference: the neighbour alone (sampled at temperature 0.8: a token written twice in its
  // cache would change the text that follows).
  std::string alone;
  {
    Scheduler s(*m, so);
    auto b = std::make_shared<Request>(sampled({1, 7, 3}, 120, good, 5));
    ASSERT_EQ(s.submit(b), serve::Admission::Queued);
    const auto last = run_all({b});
    s.shutdown(std::chrono::milliseconds(0));
    ASSERT_TRUE(last[0] && last[0]->kind == RequestEvent::Kind::Done);
    ASSERT_EQ(b->outcomes()[0].completion_tokens, 120);
    alone = b->outcomes()[0].text;
  }
  Scheduler s(*m, so);
  auto a = std::make_shared<Request>(sampled({1, 5, 9}, 120, bad, 3));
  auto b = std::make_shared<Request>(sampled({1, 7, 3}, 120, good, 5));
  ASSERT_EQ(s.submit(a), serve::Admission::Queued);
  ASSERT_EQ(s.submit(b), serve::Admission::Queued);
  const auto last = run_all({a, b});
  s.shutdown(std::chrono::milliseconds(0));
  ASSERT_TRUE(last[0] && last[1]);
  EXPECT_EQ(last[0]->kind, RequestEvent::Kind::Failed);
  EXPECT_NE(last[0]->text.find(kObserveFault), std::string::npos) << last[0]->text;
  // A failed decoding position 40, its 38th sampled token (positions 0-2 are its prompt), with B
  // in the same pass.
  EXPECT_EQ(a->outcomes()[0].completion_tokens, 38);
  EXPECT_EQ(last[1]->kind, RequestEvent::Kind::Done) << last[1]->text;
  EXPECT_EQ(b->outcomes()[0].completion_tokens, 120);
  EXPECT_EQ(b->outcomes()[0].text, alone);
}

TEST(ServeChoiceFailure, AFailedChoiceEndsItsSiblingsAndTheRequestReportsTheFirstError) {
  const auto m = Model::load(kvevict::test::reasoner_model());
  SchedulerOptions so;
  so.threads = 1;
  so.kv_memory_bytes = 64 << 20;
  Scheduler s(*m, so);

  constexpr int64_t kMaxTokens = 400;
  GenerationParams p;
  p.prompt = {1, 5, 9};
  p.n = 2;
  p.generation.max_new_tokens = kMaxTokens;
  p.generation.ignore_eos = true;
  p.generation.sampler.temperature = 0.8f;
  p.generation.sampler.seed = 3;
  EvictionConfig e;
  e.budget = 64;
  e.recent = 16;
  e.seed = 3;
  p.kv = CheckedPolicy::check(
      make_policy(fail_on_sequence_1(), "fail-on-sequence-1", false, std::nullopt, std::nullopt, {}, true), e);
  auto r = std::make_shared<Request>(std::move(p));
  ASSERT_EQ(s.submit(r), serve::Admission::Queued);

  std::vector<RequestEvent> done;  // ChoiceDone events, in order
  std::optional<RequestEvent> last;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (std::chrono::steady_clock::now() < deadline) {
    auto ev = r->next_event(std::chrono::milliseconds(100));
    if (!ev) continue;
    if (ev->kind == RequestEvent::Kind::ChoiceDone) done.push_back(*ev);
    if (ev->kind == RequestEvent::Kind::Done || ev->kind == RequestEvent::Kind::Failed) {
      last = std::move(ev);
      break;
    }
  }
  s.shutdown(std::chrono::milliseconds(0));
  ASSERT_TRUE(last) << "the request did not end within 120 s";
  EXPECT_EQ(last->kind, RequestEvent::Kind::Failed);
  EXPECT_NE(last->text.find(kFault), std::string::npos) << last->text;
  EXPECT_EQ(last->status, 500);

  // Choice 1 fails first; choice 0 is then ended (cancelled), not run to max_tokens.
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].choice, 1);
  EXPECT_EQ(done[0].finish, FinishReason::Error);
  EXPECT_EQ(done[1].choice, 0);
  EXPECT_EQ(done[1].finish, FinishReason::Cancelled);
  const auto out = r->outcomes();
  ASSERT_EQ(out.size(), 2u);
  // The first round is due when the cache holds B + s = 64 + 16 slots (eviction-spec.md §2.3):
  // 3 prompt tokens and 77 decoded ones.
  EXPECT_EQ(out[1].completion_tokens, 77);
  // Choice 0's round in the same batched step ran, so it samples once more (its row of that
  // pass) and no further: without the fix it decoded to max_tokens; with the old retry of the
  // batch one sequence at a time it appended its token twice and failed on a full cache.
  EXPECT_EQ(out[0].completion_tokens, 78);
  EXPECT_LT(out[0].completion_tokens, kMaxTokens);
}

}  // namespace
}  // namespace kvevict
