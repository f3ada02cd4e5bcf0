// A request with n choices fails whole when one choice fails (one Failed event with the first
// error, no partial result: scheduler.h, docs/serving.md), so its other choices must end within a
// scheduler step instead of decoding to max_tokens for nobody. The fault is a selector defined
// outside the registry (as the Python package's are) that throws in the eviction rounds of
// sequence 1 only: the scheduler numbers a request's sequences by choice index.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "eviction/registry.h"
#include "model/model.h"
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
