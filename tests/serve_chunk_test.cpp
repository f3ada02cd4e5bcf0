// Chunked prefill in the serving scheduler: a long prompt admitted while another sequence decodes
// is prefilled one --prefill-chunk at a time, the running sequence gets a token between
// consecutive chunks, and the long request's output does not depend on the chunk size.
// Observed through SchedulerOptions::on_step (one record per scheduler iteration).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "eviction/registry.h"
#include "model/model.h"
#include "serve/scheduler.h"
#include "util/error.h"
#include "util/rng.h"
#include "test_paths.h"

namespace kvevict {
namespace {

using serve::GenerationParams;
using serve::Request;
using serve::RequestEvent;
using serve::Scheduler;
using serve::SchedulerOptions;
using serve::StepRecord;

std::unique_ptr<Model> reasoner() { return Model::load(kvevict::test::reasoner_model()); }

GenerationParams params(std::vector<int32_t> prompt, int64_t max_tokens, const std::string& policy, uint64_t seed) {
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
  p.kv = CheckedPolicy::check(make_policy(policy), e);
  return p;
}

std::vector<int32_t> long_prompt(const Model& m, int64_t n) {
  Rng rng(stream_id({77, 0x4C4F4E47ULL}));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = static_cast<int32_t>(1 + rng() % static_cast<uint64_t>(m.config().n_vocab - 1));
  return ids;
}

// Waits for an event of `kind` (bounded: 60 s); false on timeout or a Failed event.
bool wait_for(Request& r, RequestEvent::Kind kind) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    auto e = r.next_event(std::chrono::milliseconds(100));
    if (!e) continue;
    if (e->kind == kind) return true;
    if (e->kind == RequestEvent::Kind::Failed) return false;
  }
  return false;
}

struct StepLog {
  std::mutex mu;
  std::vector<StepRecord> steps;
};

SchedulerOptions opts(int64_t chunk, StepLog* log) {
  SchedulerOptions so;
  so.threads = 1;
  so.kv_memory_bytes = 64 << 20;
  so.prefill_chunk = chunk;
  if (log)
    so.on_step = [log](const StepRecord& r) {
      std::lock_guard<std::mutex> lock(log->mu);
      log->steps.push_back(r);
    };
  return so;
}

TEST(ServeChunkedPrefill, RunningSequenceGetsATokenBetweenConsecutiveChunksOfALongPrompt) {
  const auto m = reasoner();
  const auto prompt = long_prompt(*m, 400);
  StepLog log;
  Scheduler s(*m, opts(64, &log));
  // A decodes 300 tokens; B (400-token prompt) arrives once A has produced its first token.
  auto a = std::make_shared<Request>(params({1, 5, 9}, 300, "full", 3));
  ASSERT_EQ(s.submit(a), serve::Admission::Queued);
  ASSERT_TRUE(wait_for(*a, RequestEvent::Kind::Text));
  auto b = std::make_shared<Request>(params(prompt, 8, "random", 4));
  ASSERT_EQ(s.submit(b), serve::Admission::Queued);
  ASSERT_TRUE(wait_for(*b, RequestEvent::Kind::Done));
  ASSERT_TRUE(wait_for(*a, RequestEvent::Kind::Done));
  s.shutdown(std::chrono::milliseconds(0));

  std::lock_guard<std::mutex> lock(log.mu);
  std::vector<size_t> chunk_steps;  // iterations that prefilled a chunk of B
  int64_t total = 0;
  for (size_t i = 0; i < log.steps.size(); ++i)
    if (log.steps[i].prefill_request == b.get()) {
      chunk_steps.push_back(i);
      EXPECT_LE(log.steps[i].prefill_tokens, 64);
      total += log.steps[i].prefill_tokens;
      EXPECT_EQ(log.steps[i].prefill_done, total);
    }
  // 400 = 6 x 64 + 16: seven chunks, never the whole prompt in one iteration.
  ASSERT_EQ(chunk_steps.size(), 7u);
  EXPECT_EQ(total, 400);
  const auto decoded_a = [&](size_t i) {
    for (const Request* r : log.steps[i].decoded)
      if (r == a.get()) return true;
    return false;
  };
  // Between one chunk and the next (the chunk's own iteration included: its forward pass also
  // carries the decode step), A advanced at least one token.
  for (size_t k = 0; k + 1 < chunk_steps.size(); ++k) {
    bool got = false;
    for (size_t i = chunk_steps[k]; i < chunk_steps[k + 1]; ++i) got = got || decoded_a(i);
    EXPECT_TRUE(got) << "no token for the running sequence between chunk " << k << " and " << k + 1;
  }
  EXPECT_EQ(a->outcomes()[0].completion_tokens, 300);
  EXPECT_EQ(b->outcomes()[0].completion_tokens, 8);
  EXPECT_EQ(s.metrics().prefill_chunks.load(), 1u + 7u);  // A's 3-token prompt + B's seven
}

TEST(ServeChunkedPrefill, OutputDoesNotDependOnTheChunkSize) {
  // The same long request served with chunks of 1, 7, 64 tokens and in one call (4096 >= 400):
  // identical text, eviction rounds and token counts (Engine::prefill_chunk is bit-identical
  // for any split; a random policy with B = 64 evicts from the 16th decode step on).
  const auto m = reasoner();
  const auto prompt = long_prompt(*m, 400);
  std::vector<serve::ChoiceOutcome> outs;
  for (const int64_t chunk : {int64_t{4096}, int64_t{1}, int64_t{7}, int64_t{64}}) {
    Scheduler s(*m, opts(chunk, nullptr));
    auto r = std::make_shared<Request>(params(prompt, 40, "random", 11));
    ASSERT_EQ(s.submit(r), serve::Admission::Queued);
    ASSERT_TRUE(wait_for(*r, RequestEvent::Kind::Done)) << "chunk " << chunk;
    s.shutdown(std::chrono::milliseconds(0));
    outs.push_back(r->outcomes()[0]);
    EXPECT_EQ(s.metrics().prefill_chunks.load(), static_cast<uint64_t>((400 + chunk - 1) / chunk));
  }
  ASSERT_GE(outs[0].eviction_rounds, 1);
  ASSERT_EQ(outs[0].completion_tokens, 40);
  for (size_t i = 1; i < outs.size(); ++i) {
    EXPECT_EQ(outs[i].text, outs[0].text) << i;
    EXPECT_EQ(outs[i].eviction_rounds, outs[0].eviction_rounds);
    EXPECT_EQ(outs[i].completion_tokens, outs[0].completion_tokens);
  }
}

TEST(ServeChunkedPrefill, ChunkSizeOutsideItsRangeIsRefused) {
  const auto m = reasoner();
  EXPECT_THROW(Scheduler(*m, opts(0, nullptr)), Error);
  EXPECT_THROW(Scheduler(*m, opts(serve::kMaxPrefillChunk + 1, nullptr)), Error);
}

}  // namespace
}  // namespace kvevict
