// Continuous batching over a KV memory pool: one thread owns the Engine, admits queued requests
// when their worst-case KV footprint fits the pool, and per iteration runs one forward pass with
// the next chunk of a prompt in prefill and one decode step of every running sequence
// (Engine::decode_batch_with_chunk). Sequences join and leave between steps.
//
// Source: Orca's iteration-level scheduling (Yu et al., OSDI 2022 §3) and vLLM's admission by KV
// memory (Kwon et al., arXiv 2309.06180 §4.2, FIFO); chunked prefill as Sarathi (Agrawal et al.,
// arXiv 2308.16369) so a long prompt delays running sequences by at most one chunk per step.
// Per-request determinism: a request's sequences get ids 0..n-1 (its choice index) and its own
// seed, so eviction draws (stream_id(seed, sequence id, round, ...)) and sampling draws
// (stream_id(seed, sequence id, step)) never depend on batch position or on other requests; and
// decode_batch is bit-identical to sequential decode (engine.h).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "engine/generation.h"
#include "eviction/registry.h"
#include "eviction/schedule.h"
#include "kvcache/kv_pool.h"
#include "serve/metrics.h"
#include "serve/prompt_cache.h"

namespace kvevict::serve {

using Clock = std::chrono::steady_clock;

/// Why a sequence ended.
enum class FinishReason { Stop, Length, Cancelled, Error };
/// OpenAI's name: "stop", "length", "abort" (cancelled), "error".
const char* finish_reason_name(FinishReason r);

/// Everything needed to run one request (already validated by the caller: validate_generation
/// and the settings builder).
struct GenerationParams {
  std::vector<int32_t> prompt;  ///< token ids, BOS included when the model adds one
  int n = 1;                    ///< choices: independent sequences sharing the prompt
  /// Per-choice generation: sampler (its seed seeds sampling and eviction), max_new_tokens (>= 1),
  /// stop strings, ignore_eos, ... Each choice runs its own GenerationState with sequence id =
  /// its index.
  GenerationConfig generation;
  CheckedPolicy kv;  ///< policy and schedule (engine/policy_settings.h); kv.eviction().seed == sampler.seed
  /// May read and fill the prompt cache (SchedulerOptions::prompt_cache_bytes). The HTTP layer
  /// sets false for a request whose selector object is its own (a kv_policy other than the
  /// server's): the cache key holds the selector object, so no later request could hit it.
  bool prompt_cache = true;
};

/// One thing that happened to a request, in order. Text events carry output text; ChoiceDone
/// ends one choice; Done ends the request (after every ChoiceDone); Failed ends it with an error.
struct RequestEvent {
  enum class Kind { Text, ChoiceDone, Done, Failed } kind = Kind::Text;
  int choice = 0;
  std::string text;                          ///< Text: delta; Failed: error message
  FinishReason finish = FinishReason::Stop;  ///< ChoiceDone
  int status = 500;                          ///< Failed: HTTP status (503 when shut down)
  /// Text: the log-probabilities of the tokens sampled since the choice's previous Text event
  /// (when generation.logprobs >= 0; the text may lag behind them while a possible stop string
  /// is held back).
  std::vector<TokenLogprobs> logprobs;
};

/// Per-choice outcome, complete once the request's Done event was delivered.
struct ChoiceOutcome {
  std::string text;
  FinishReason finish = FinishReason::Stop;
  int64_t completion_tokens = 0;
  int64_t reasoning_tokens = 0;  ///< GenerationState::reasoning_tokens (thinking trace, chat)
  std::vector<TokenLogprobs> logprobs;  ///< per sampled token when generation.logprobs >= 0
  int64_t eviction_rounds = 0;
  int64_t peak_slots = 0;  ///< max live slots per (layer, KV head)
  /// Bytes reserved in the pool for this sequence; when the choices share their prompt's KV,
  /// its own slots only (the shared segment: RequestKvBytes::shared, once per request).
  int64_t kv_bytes = 0;
  /// Bytes of the prompt segment the request's choices share: on choice 0 only (0 on the
  /// others and without sharing), so a sum over choices counts it once.
  int64_t shared_kv_bytes = 0;
  /// Prompt tokens served from the prompt cache (PromptCache) instead of being prefilled: the
  /// whole prompt on a hit, else 0; on choice 0 only, as shared_kv_bytes (OpenAI's
  /// usage.prompt_tokens_details.cached_tokens).
  int64_t cached_prompt_tokens = 0;
};

/// A request shared between the HTTP thread that submitted it and the scheduler thread.
class Request {
 public:
  /// Records the arrival time (TTFT and end-to-end latency count from here).
  explicit Request(GenerationParams p) : params(std::move(p)), arrival(Clock::now()) {}
  const GenerationParams params;
  const Clock::time_point arrival;

  /// Next event, waiting up to `timeout`; nullopt on timeout.
  std::optional<RequestEvent> next_event(std::chrono::milliseconds timeout);
  /// Asks the scheduler to stop this request (client gone). Its reservation is released within
  /// one scheduler step; its remaining events end with ChoiceDone(Cancelled) and Done.
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }
  /// Outcomes per choice (read after Done).
  std::vector<ChoiceOutcome> outcomes() const;
  /// Called after each event is queued, on the thread that queued it (the scheduler's): an
  /// event-driven HTTP layer wakes the connection that waits for it instead of blocking a
  /// thread in next_event(). Must be cheap and must not call back into this Request. Set it
  /// before submit().
  void set_event_listener(std::function<void()> f) { listener_ = std::move(f); }

 private:
  friend class Scheduler;
  void push(RequestEvent e);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<RequestEvent> events_;
  std::vector<ChoiceOutcome> outcomes_;
  std::atomic<bool> cancelled_{false};
  std::function<void()> listener_;
  int remaining_ = 0;  ///< choices not yet finished (scheduler thread only)
  /// Bytes of the prompt segment its choices read (reported in ChoiceOutcome::shared_kv_bytes).
  int64_t shared_kv_bytes_ = 0;
  /// The pool reservation of that segment, shared with every running request that reads the
  /// same segment (a prompt-cache hit while another request still runs): the pool counts a
  /// segment once, and releases it when the last of them ends (reset with the last choice).
  std::shared_ptr<const void> segment_lease_;
  /// Prompt tokens served from the prompt cache (ChoiceOutcome::cached_prompt_tokens).
  int64_t cached_tokens_ = 0;
  /// Set on a prompt-cache miss that may fill the cache: the template is stored under this key
  /// when choice 0's prefill ends.
  std::optional<PromptCacheKey> cache_key_;
  /// The first failing choice's message and HTTP status (503 for MemoryError: may fit later),
  /// reported for the whole request when its last choice ends; set, the request's other choices
  /// are ended within one scheduler step (scheduler thread only).
  struct Failure {
    std::string message;
    int status = 500;
  };
  std::optional<Failure> failure_;
};

/// What one scheduler iteration ran: one forward pass with at most one prefill chunk and a
/// decode step of every decoding sequence. Passed to
/// SchedulerOptions::on_step (tests and diagnostics observe the interleaving with it).
struct StepRecord {
  const Request* prefill_request = nullptr;  ///< whose prompt got a chunk (nullptr: none)
  int prefill_choice = 0;                    ///< which of its choices
  int64_t prefill_tokens = 0;                ///< chunk length, tokens
  int64_t prefill_done = 0;                  ///< prompt tokens of that choice prefilled so far
  std::vector<const Request*> decoded;       ///< one entry per sequence the decode step advanced
};

/// Largest --prefill-chunk: a chunk's activations grow as tokens × (4·dim + 2·q + 2·kv + 2·hidden)
/// floats (ForwardBuffers; about 0.8 GiB at 4096 tokens for a Llama-3-8B shape) and the stall it puts on running
/// sequences grows linearly, while prefill gets only a few percent faster per token beyond a few
/// hundred rows per call (measured on a SmolLM2-135M-shape Q8_0 model, 2 threads: 512 prompt
/// tokens in 1 call 3.3 s, 2 chunks 3.4 s, 8 chunks 3.8 s, 32 chunks 5.0 s).
inline constexpr int64_t kMaxPrefillChunk = 4096;

/// Settings of the scheduler.
struct SchedulerOptions {
  int threads = 0;  ///< engine worker threads (0 = all cores)
  KvType kv_type = KvType::F32;
  int64_t kv_memory_bytes = 0;  ///< pool size (> 0)
  int max_seqs = 64;            ///< sequences running at once (>= 1)
  int max_queue = 256;          ///< requests waiting at once (>= 1); more are refused
  /// Prompt tokens per prefill call, in [1, kMaxPrefillChunk]. One chunk shares each iteration's
  /// forward pass with the decode step, so running sequences wait at most one chunk's rows per token. 64 = the
  /// default --max-seqs: a chunk is as many matmul rows as a full decode step, so a long prompt
  /// delays the batch by about one step per iteration (measured, SmolLM2-135M-shape Q8_0,
  /// 2 threads: a 64-token chunk 0.48 s vs a 64-sequence decode step 0.39 s; a 256-token chunk
  /// 1.7 s), for +15% total prefill time against one call. Larger values favour time to first
  /// token, smaller ones inter-token latency. The chunk size never changes a request's output
  /// (Engine::prefill_chunk is bit-identical for any split).
  int64_t prefill_chunk = 64;
  /// Choices of one request (n > 1) share their prompt's KV when the policy allows it
  /// (Engine::shared_prompt_slots): choice 0 is prefilled, the others are forked from it and
  /// the shared segment is reserved once. Outputs do not change (Engine::fork).
  bool share_prompt = true;
  /// Byte budget of the prefix cache of pinned prompts (serve/prompt_cache.h, --prompt-cache):
  /// requests whose prompt and policy settings equal an earlier request's fork their choices
  /// from its cached prefill and skip their own. 0 = off (the default). Needs share_prompt.
  /// These bytes are on top of kv_memory_bytes: cached entries that no running request reads
  /// are not in the pool.
  int64_t prompt_cache_bytes = 0;
  /// Called on the scheduler thread after every iteration that ran anything (may be empty).
  std::function<void(const StepRecord&)> on_step;
};

/// Outcome of submit().
enum class Admission { Queued, QueueFull, TooLarge, ShuttingDown };

/// Owns the engine and its thread. Thread-safe: any thread may submit, cancel and read gauges.
class Scheduler {
 public:
  /// Starts the scheduler thread. Throws kvevict::Error on invalid options (prompt_cache_bytes
  /// < 0, or > 0 with share_prompt off).
  Scheduler(const Model& model, SchedulerOptions opt);
  ~Scheduler();  ///< shutdown(0) when still running

  /// Bytes one sequence of `p` reserves: required_capacity (eviction/schedule.h) slots per
  /// (layer, KV head) × the model's bytes per slot (keys, values, position over all layers and
  /// KV heads).
  int64_t sequence_bytes(const GenerationParams& p) const;
  /// What a request of `p` reserves in the pool: `shared` bytes of the prompt segment its
  /// choices share (0 when they do not: n = 1, sharing off, or a policy that does not allow it)
  /// and `per_choice` bytes each of its n choices owns.
  /// `capacity`: slots per (layer, KV head) of each choice's cache. A request shares a segment
  /// when n >= 2 or the prompt cache is on (so a later request can reuse it).
  struct RequestKvBytes {
    int64_t shared = 0, per_choice = 0, shared_slots = 0, capacity = 0;
    int64_t total(int n) const { return shared + per_choice * n; }
  };
  RequestKvBytes request_bytes(const GenerationParams& p) const;
  /// Queues the request FIFO. TooLarge: request_bytes exceeds the whole pool, or n exceeds
  /// max_seqs (it would never run); QueueFull: max_queue requests already wait; ShuttingDown: shutdown() began.
  Admission submit(const std::shared_ptr<Request>& req);
  /// Stops admitting; waiting requests fail with 503; running ones may finish for `grace`,
  /// then are cancelled (their streams get ChoiceDone(Cancelled) + Failed 503). Joins the thread.
  void shutdown(std::chrono::milliseconds grace);

  /// Instantaneous values for /metrics (requests running and waiting, pool bytes, ...).
  MetricsGauges gauges() const;
  /// Counters and histograms (the HTTP layer adds its rejections).
  const ServerMetrics& metrics() const { return metrics_; }
  ServerMetrics& metrics() { return metrics_; }
  /// The KV memory pool (bytes reserved by running sequences).
  const KvMemoryPool& pool() const { return pool_; }
  /// The model the engine runs.
  const Model& model() const { return model_; }
  /// The options the scheduler was started with.
  const SchedulerOptions& options() const { return opt_; }
  /// The prefix cache of pinned prompts (its counters may be read from any thread).
  const PromptCache& prompt_cache() const { return cache_; }

 private:
  struct Active;
  void loop();
  void admit_locked();
  void step(StepRecord& rec);
  void on_step(Active& a, std::span<const float> logits);
  void finish(Active& a, FinishReason why, const std::string& error = {}, int status = 500);
  void drop_finished();
  void start_cache_hits();

  const Model& model_;
  SchedulerOptions opt_;
  Engine engine_;
  KvMemoryPool pool_;
  ServerMetrics metrics_;
  PromptCache cache_;  ///< scheduler thread only (but its counters)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> waiting_;
  bool accepting_ = true;
  bool stop_ = false;            ///< shutdown: exit once nothing runs
  bool cancel_running_ = false;  ///< shutdown grace over: cancel what runs
  std::atomic<int64_t> running_requests_{0};
  std::atomic<int64_t> running_seqs_{0};
  std::atomic<int64_t> peak_seqs_{0};
  std::atomic<int64_t> shared_bytes_{0};  ///< pool bytes of shared prompt segments now

  std::vector<std::unique_ptr<Active>> active_;  ///< scheduler thread only, admission order
  std::vector<float> logits_;
  std::thread thread_;
};

}  // namespace kvevict::serve
