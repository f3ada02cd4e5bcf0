#include "serve/scheduler.h"

#include <fmt/format.h>

#include <algorithm>

#include "util/error.h"
#include "util/memory.h"

namespace kvevict::serve {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Cancelled:
      return "abort";
    case FinishReason::Error:
      return "error";
  }
  return "error";
}

std::optional<RequestEvent> Request::next_event(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  RequestEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

std::vector<ChoiceOutcome> Request::outcomes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outcomes_;
}

void Request::push(RequestEvent e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_all();
  if (listener_) listener_();
}

namespace {
// The pool reservation of one shared prompt segment. Every running request that reads the
// segment holds it (Request::segment_lease_), so the pool counts the segment once however many
// requests read it; the last one to end releases it. A cache entry only observes it (weak_ptr):
// what the cache holds is counted in the cache's own budget, not in the pool.
struct PoolLease {
  PoolLease(KvMemoryPool& p, std::atomic<int64_t>& g, int64_t b) : pool(p), gauge(g), bytes(b) { gauge += bytes; }
  ~PoolLease() {
    pool.release(bytes);
    gauge -= bytes;
  }
  PoolLease(const PoolLease&) = delete;
  PoolLease& operator=(const PoolLease&) = delete;
  KvMemoryPool& pool;
  std::atomic<int64_t>& gauge;  // Scheduler::shared_bytes_
  const int64_t bytes;
};

// HTTP status of a sequence that could not be made: 503 when the memory check refused it (memory
// taken by something else since the pool was sized: the request may fit later), else 500.
int start_error_status(const std::exception& e) { return dynamic_cast<const MemoryError*>(&e) ? 503 : 500; }
}  // namespace

// One running sequence (one choice of one request).
struct Scheduler::Active {
  std::shared_ptr<Request> req;
  int choice = 0;
  std::unique_ptr<Sequence> seq;
  // Every per-token decision (sampling stream of sequence id = choice, stops, text held back).
  GenerationState gen;
  int64_t bytes = 0;      // reserved in the pool
  int64_t prefilled = 0;  // prompt tokens already run
  bool decoding = false;  // gen.tokens().back() is appended by the next decode step
  bool follower = false;  // forked from choice 0 once its prefill ends (seq is null until then)
  // A prompt-cache hit: forked from the cached template, samples its first token from these
  // logits at the start of the next step (no prefill).
  std::shared_ptr<const std::vector<float>> first_logits;
  bool done = false;
  Clock::time_point last_token;
  Active(std::shared_ptr<Request> r, int c, std::unique_ptr<Sequence> s, int64_t b, const Tokenizer& tok)
      : req(std::move(r)),
        choice(c),
        seq(std::move(s)),
        gen(tok, req->params.generation, static_cast<uint64_t>(c), req->params.prompt),
        bytes(b) {}
};

Scheduler::Scheduler(const Model& model, SchedulerOptions opt)
    : model_(model),
      opt_(opt),
      engine_(model, opt.threads, opt.kv_type),
      pool_(opt.kv_memory_bytes),
      cache_(opt.prompt_cache_bytes) {
  if (opt.prompt_cache_bytes > 0 && !opt.share_prompt)
    throw Error("--prompt-cache needs shared prompt KV: it cannot be combined with --no-share-prompt");
  if (opt.max_seqs < 1) throw Error(fmt::format("--max-seqs {}: must be >= 1", opt.max_seqs));
  // Every request passes through the queue, so 0 would refuse everything.
  if (opt.max_queue < 1) throw Error(fmt::format("--max-queue {}: must be >= 1", opt.max_queue));
  if (opt.prefill_chunk < 1 || opt.prefill_chunk > kMaxPrefillChunk)
    throw Error(fmt::format("--prefill-chunk {}: must be in [1, {}]", opt.prefill_chunk, kMaxPrefillChunk));
  thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() {
  if (thread_.joinable()) shutdown(std::chrono::milliseconds(0));
}

namespace {
// Engine::sequence_kv_bytes of one choice of `p`.
Engine::KvBytes choice_kv_bytes(const Engine& engine, const GenerationParams& p, bool share_prompt) {
  const auto prompt_len = static_cast<int64_t>(p.prompt.size());
  return engine.sequence_kv_bytes(p.kv, prompt_len, std::max<int64_t>(0, generation_limit(p.generation, prompt_len)),
                                  share_prompt);
}
}  // namespace

int64_t Scheduler::sequence_bytes(const GenerationParams& p) const { return choice_kv_bytes(engine_, p, false).own; }

Scheduler::RequestKvBytes Scheduler::request_bytes(const GenerationParams& p) const {
  // One choice shares with nobody unless the prompt cache may hand its segment on.
  const bool share = opt_.share_prompt && (p.n >= 2 || cache_.enabled());
  const Engine::KvBytes b = choice_kv_bytes(engine_, p, share);
  return RequestKvBytes{b.shared, b.own, b.shared_slots, b.capacity};
}

Admission Scheduler::submit(const std::shared_ptr<Request>& req) {
  const int64_t need = request_bytes(req->params).total(req->params.n);
  if (!pool_.could_fit(need) || req->params.n > opt_.max_seqs) return Admission::TooLarge;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepting_) return Admission::ShuttingDown;
    if (static_cast<int64_t>(waiting_.size()) >= opt_.max_queue) return Admission::QueueFull;
    waiting_.push_back(req);
  }
  cv_.notify_all();
  return Admission::Queued;
}

MetricsGauges Scheduler::gauges() const {
  MetricsGauges g;
  {
    std::lock_guard<std::mutex> lock(mu_);
    g.requests_waiting = static_cast<int64_t>(waiting_.size());
  }
  g.requests_running = running_requests_.load();
  g.sequences_running = running_seqs_.load();
  g.peak_sequences_running = peak_seqs_.load();
  g.kv_pool_used_bytes = pool_.used();
  g.kv_shared_prompt_bytes = shared_bytes_.load();
  g.kv_pool_free_bytes = pool_.free();
  g.kv_pool_capacity_bytes = pool_.capacity();
  g.prompt_cache_hits = cache_.hits();
  g.prompt_cache_misses = cache_.misses();
  g.prompt_cache_evictions = cache_.evictions();
  g.prompt_cache_entries = cache_.entries();
  g.prompt_cache_bytes = cache_.bytes();
  g.prompt_cache_capacity_bytes = cache_.budget();
  return g;
}

void Scheduler::shutdown(std::chrono::milliseconds grace) {
  std::deque<std::shared_ptr<Request>> refused;
  {
    std::lock_guard<std::mutex> lock(mu_);
    accepting_ = false;
    stop_ = true;
    refused.swap(waiting_);
  }
  for (auto& r : refused) {
    metrics_.requests_rejected += 1;
    r->push({RequestEvent::Kind::Failed, 0, "the server is shutting down; the request was not started",
             FinishReason::Error, 503, {}});
  }
  cv_.notify_all();
  if (!thread_.joinable()) return;
  const auto deadline = Clock::now() + grace;
  while (running_seqs_.load() > 0 && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_running_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Scheduler::admit_locked() {
  // Strict FIFO: the head of the queue blocks the rest until it fits (no starvation of large
  // requests by small ones).
  while (!waiting_.empty()) {
    const std::shared_ptr<Request>& req = waiting_.front();
    if (req->cancelled()) {
      req->push({RequestEvent::Kind::Failed, 0, "cancelled before it started", FinishReason::Cancelled, 499, {}});
      metrics_.requests_cancelled += 1;
      waiting_.pop_front();
      continue;
    }
    const int n = req->params.n;
    const RequestKvBytes kvb = request_bytes(req->params);
    const int64_t per_seq = kvb.per_choice;
    const bool shared = kvb.shared > 0;
    const auto prompt_len = static_cast<int64_t>(req->params.prompt.size());
    // Prompt cache: only for a request whose choices would share a segment anyway (a policy
    // that pins the prompt, Engine::shared_prompt_slots), with a key that fixes the prefill.
    std::optional<PromptCacheKey> key;
    PromptCacheEntry* hit = nullptr;
    if (shared && cache_.enabled() && req->params.prompt_cache) {
      key = PromptCacheKey::make(req->params.prompt, req->params.kv, kvb.capacity);
      hit = cache_.peek(*key);
    }
    // The same key's prefill is running and will fill the cache: wait for it (a hit then)
    // instead of prefilling the same prompt again. Prefill is one chunk per step in admission
    // order, so this request's own prefill could not have started before that one ends anyway.
    if (key && !hit)
      for (const auto& ap : active_)
        if (!ap->done && ap->req->cache_key_ && *ap->req->cache_key_ == *key) return;
    // A segment that a running request already reads is already in the pool: counted once.
    std::shared_ptr<const void> lease = hit ? hit->in_use.lock() : nullptr;
    const int64_t need = kvb.total(n) - (lease ? kvb.shared : 0);
    if (running_seqs_.load() + n > opt_.max_seqs) return;
    if (!pool_.try_reserve(need)) return;
    std::shared_ptr<Request> r = req;
    waiting_.pop_front();
    // Allocate every choice's cache first, so a refusal (allocation failure) leaves nothing
    // half-started. With a shared prompt only choice 0's: the others are forked from it after
    // its prefill (their reservation is already taken). On a cache hit every choice is forked
    // from the cached template now and nothing is prefilled.
    std::vector<std::unique_ptr<Sequence>> seqs;
    try {
      const int64_t max_new = std::max<int64_t>(0, generation_limit(r->params.generation, prompt_len));
      for (int c = 0; c < n; ++c)
        // The choice index is the sequence id: random streams depend on (seed, choice), never
        // on the server's state.
        if (hit) {
          auto seq = engine_.fork(*hit->tmpl, static_cast<uint64_t>(c));
          // The request's own schedule (its seed): the key equals it in everything else.
          seq->policy = r->params.kv.policy();
          seq->eviction = r->params.kv.eviction();
          seqs.push_back(std::move(seq));
        } else if (!shared) {
          seqs.push_back(engine_.new_sequence(static_cast<uint64_t>(c), r->params.kv, prompt_len, max_new));
        } else {
          seqs.push_back(c == 0 ? engine_.new_shared_sequence(0, r->params.kv, prompt_len, max_new) : nullptr);
        }
      if (shared && seqs[0]->kv.shared_slots() != kvb.shared_slots)
        throw Error(fmt::format("shared prompt of {} slots, {} reserved", seqs[0]->kv.shared_slots(),
                                kvb.shared_slots));
      if (hit && seqs[0]->kv.capacity() != kvb.capacity)
        throw Error(fmt::format("cached prompt of capacity {}, {} reserved", seqs[0]->kv.capacity(), kvb.capacity));
    } catch (const std::exception& e) {
      pool_.release(need);
      metrics_.requests_failed += 1;
      r->push({RequestEvent::Kind::Failed, 0, fmt::format("cannot start the request: {}", e.what()),
               FinishReason::Error, start_error_status(e), {}});
      continue;
    }
    r->remaining_ = n;
    r->shared_kv_bytes_ = kvb.shared;
    if (shared) {
      if (!lease) lease = std::make_shared<PoolLease>(pool_, shared_bytes_, kvb.shared);
      r->segment_lease_ = lease;
    }
    if (hit) {
      cache_.use(*hit);
      hit->in_use = lease;
      r->cached_tokens_ = prompt_len;
    } else if (key) {
      cache_.count_miss();
      r->cache_key_ = std::move(key);
    }
    {
      std::lock_guard<std::mutex> rl(r->mu_);
      r->outcomes_.assign(static_cast<size_t>(n), ChoiceOutcome{});
    }
    running_requests_ += 1;
    for (int c = 0; c < n; ++c) {
      running_seqs_ += 1;
      peak_seqs_.store(std::max(peak_seqs_.load(), running_seqs_.load()));
      active_.push_back(
          std::make_unique<Active>(r, c, std::move(seqs[static_cast<size_t>(c)]), per_seq, model_.tokenizer()));
      active_.back()->follower = shared && c > 0 && !hit;
      if (hit) {
        active_.back()->first_logits = hit->logits;
        active_.back()->prefilled = prompt_len;
      }
    }
  }
}

void Scheduler::finish(Active& a, FinishReason why, const std::string& error, int status) {
  if (a.done) return;
  a.done = true;
  // The reservation is released the step the sequence ends, and its cache freed with it.
  pool_.release(a.bytes);
  const SequenceStats st = a.seq ? a.seq->stats : SequenceStats{};  // a follower may end before its fork
  a.seq.reset();
  running_seqs_ -= 1;
  Request& r = *a.req;
  {
    std::lock_guard<std::mutex> lock(r.mu_);
    ChoiceOutcome& o = r.outcomes_[static_cast<size_t>(a.choice)];
    o.text = a.gen.text();
    o.finish = why;
    o.completion_tokens = a.gen.sampled();
    o.reasoning_tokens = a.gen.reasoning_tokens();
    o.logprobs = a.gen.logprobs();
    o.eviction_rounds = st.rounds;
    o.peak_slots = st.peak_slots;
    o.kv_bytes = a.bytes;
    if (a.choice == 0) {
      o.shared_kv_bytes = r.shared_kv_bytes_;
      o.cached_prompt_tokens = r.cached_tokens_;
    }
  }
  if (why == FinishReason::Error && !r.failure_) r.failure_ = Request::Failure{error, status};
  r.push({RequestEvent::Kind::ChoiceDone, a.choice, error, why, 200, {}});
  if (--r.remaining_ == 0) {
    // Every choice's sequence is gone: so is this request's hold on the prompt segment (the
    // pool releases it with the last request that reads it).
    r.segment_lease_.reset();
    r.cache_key_.reset();
    running_requests_ -= 1;
    metrics_.e2e_seconds.observe(std::chrono::duration<double>(Clock::now() - r.arrival).count());
    if (r.failure_) {
      metrics_.requests_failed += 1;
      r.push({RequestEvent::Kind::Failed, 0, r.failure_->message.empty() ? "engine error" : r.failure_->message,
              FinishReason::Error, r.failure_->status, {}});
    } else if (r.cancelled()) {
      metrics_.requests_cancelled += 1;
      r.push({RequestEvent::Kind::Failed, 0, "the request was cancelled (client disconnected or server shutting down)",
              FinishReason::Cancelled, 503, {}});
    } else {
      metrics_.requests_success += 1;
      r.push({RequestEvent::Kind::Done, 0, {}, why, 200, {}});
    }
  }
}

void Scheduler::on_step(Active& a, std::span<const float> logits) {
  const StepResult r = a.gen.step(logits);
  const auto now = Clock::now();
  metrics_.generation_tokens += 1;
  if (a.gen.sampled() == 1)
    metrics_.ttft_seconds.observe(std::chrono::duration<double>(now - a.req->arrival).count());
  else
    metrics_.itl_seconds.observe(std::chrono::duration<double>(now - a.last_token).count());
  a.last_token = now;
  if (!r.text.empty() || r.logprobs) {
    RequestEvent e{RequestEvent::Kind::Text, a.choice, r.text, FinishReason::Stop, 200, {}};
    if (r.logprobs) e.logprobs.push_back(*r.logprobs);
    a.req->push(std::move(e));
  }
  if (!r.tail.empty()) a.req->push({RequestEvent::Kind::Text, a.choice, r.tail, FinishReason::Stop, 200, {}});
  if (r.stop != StopCause::None)
    return finish(a, r.stop == StopCause::Length ? FinishReason::Length : FinishReason::Stop);
  a.decoding = true;
}

void Scheduler::start_cache_hits() {
  // Each choice of a prompt-cache hit samples its first token from the cached prefill's logits,
  // in choice order as after a prefill; then it decodes with the others.
  for (auto& ap : active_)
    if (ap->first_logits && !ap->done) {
      const auto logits = std::move(ap->first_logits);
      on_step(*ap, *logits);
    }
}

void Scheduler::step(StepRecord& rec) {
  start_cache_hits();
  // The next prompt chunk (first sequence still in prefill, admission order) and every decoding
  // sequence go through one forward pass, so a long prompt delays running sequences by one
  // chunk's rows per step and the weights are streamed once.
  Active* pre = nullptr;
  std::span<const int32_t> chunk;
  for (auto& ap : active_)
    if (!ap->done && !ap->decoding && !ap->follower && !ap->first_logits) {
      pre = ap.get();
      const auto& prompt = pre->req->params.prompt;
      const int64_t n = std::min<int64_t>(opt_.prefill_chunk, static_cast<int64_t>(prompt.size()) - pre->prefilled);
      chunk = std::span<const int32_t>(prompt).subspan(static_cast<size_t>(pre->prefilled), static_cast<size_t>(n));
      break;
    }
  std::vector<Active*> batch;
  std::vector<Sequence*> seqs;
  std::vector<int32_t> toks;
  for (auto& ap : active_)
    if (!ap->done && ap->decoding) {
      batch.push_back(ap.get());
      seqs.push_back(ap->seq.get());
      toks.push_back(ap->gen.tokens().back());
    }
  if (batch.empty() && !pre) return;
  for (const Active* a : batch) rec.decoded.push_back(a->req.get());
  std::vector<int64_t> rounds0(batch.size());
  std::vector<double> round_ms0(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    rounds0[i] = seqs[i]->stats.rounds;
    round_ms0[i] = seqs[i]->stats.score_ms + seqs[i]->stats.compact_ms;
  }
  const auto V = static_cast<size_t>(model_.config().n_vocab);
  std::vector<bool> ok(batch.size(), true);
  bool pre_ok = pre != nullptr;
  std::vector<StepFailure> step_failures;
  try {
    // Row-exact kernels throughout: the output does not depend on --prefill-chunk or on which
    // sequences share the pass (engine.h).
    if (pre)
      engine_.decode_batch_with_chunk(seqs, toks, *pre->seq, chunk, logits_, &step_failures);
    else
      engine_.decode_batch(seqs, toks, logits_, &step_failures);
  } catch (const std::exception&) {
    // The pass modified no cache: run the parts one by one so only a faulty one fails.
    std::vector<float> all((batch.size() + (pre ? 1 : 0)) * V), one;
    for (size_t i = 0; i < batch.size(); ++i) {
      try {
        engine_.decode(*seqs[i], toks[i], one);
        std::copy(one.begin(), one.end(), all.begin() + static_cast<std::ptrdiff_t>(i * V));
      } catch (const std::exception& e) {
        ok[i] = false;
        finish(*batch[i], FinishReason::Error, e.what());
      }
    }
    if (pre) {
      try {
        engine_.prefill_chunk(*pre->seq, chunk, one);
        std::copy(one.begin(), one.end(), all.begin() + static_cast<std::ptrdiff_t>(batch.size() * V));
      } catch (const std::exception& e) {
        pre_ok = false;
        finish(*pre, FinishReason::Error, e.what());
      }
    }
    logits_.swap(all);
  }
  // A sequence whose round or observation threw after the pass ran (every row of logits_ is
  // valid): only that sequence ends.
  for (const StepFailure& f : step_failures) {
    const bool is_pre = f.index == batch.size();
    Active& a = is_pre ? *pre : *batch[f.index];
    if (is_pre)
      pre_ok = false;
    else
      ok[f.index] = false;
    try {
      std::rethrow_exception(f.error);
    } catch (const std::exception& x) {
      finish(a, FinishReason::Error, x.what(), start_error_status(x));
    } catch (...) {
      finish(a, FinishReason::Error, "the eviction policy failed");
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!ok[i]) continue;
    Active& a = *batch[i];
    const int64_t new_rounds = a.seq->stats.rounds - rounds0[i];
    if (new_rounds > 0) {
      metrics_.eviction_rounds += static_cast<uint64_t>(new_rounds);
      const double ms = a.seq->stats.score_ms + a.seq->stats.compact_ms - round_ms0[i];
      metrics_.round_seconds.observe(ms / 1000.0 / static_cast<double>(new_rounds));
    }
    on_step(a, std::span<const float>(logits_.data() + i * V, V));
  }
  if (pre_ok) {
    Active& a = *pre;
    const auto n = static_cast<int64_t>(chunk.size());
    a.prefilled += n;
    metrics_.prompt_tokens += static_cast<uint64_t>(n);
    metrics_.prefill_chunks += 1;
    rec.prefill_request = a.req.get();
    rec.prefill_choice = a.choice;
    rec.prefill_tokens = n;
    rec.prefill_done = a.prefilled;
    if (a.prefilled == static_cast<int64_t>(a.req->params.prompt.size())) {
      const std::span<const float> first(logits_.data() + batch.size() * V, V);
      // The other choices start from this prefill (forked before choice 0 may end), then every
      // choice samples its first token from the same logits, in choice order.
      std::vector<Active*> followers;
      for (auto& ap : active_)
        if (ap->follower && !ap->done && ap->req == a.req) {
          try {
            ap->seq = engine_.fork(*a.seq, static_cast<uint64_t>(ap->choice));
            ap->follower = false;
            ap->prefilled = a.prefilled;
            followers.push_back(ap.get());
          } catch (const std::exception& e) {
            finish(*ap, FinishReason::Error, fmt::format("cannot start choice {}: {}", ap->choice, e.what()),
                   start_error_status(e));
          }
        }
      // A cache miss stores a template of this prefill (before choice 0 decodes), so later
      // requests with the same key fork from it instead of prefilling.
      if (a.req->cache_key_) {
        const std::vector<float> logits(first.begin(), first.end());
        if (cache_.fits(*a.req->cache_key_, PromptCache::entry_bytes(*a.seq, logits))) {
          try {
            cache_.insert(std::move(*a.req->cache_key_), engine_.fork(*a.seq, 0), logits, a.req->segment_lease_);
          } catch (const std::exception&) {
            // Not cached (the fork could not allocate): the request itself goes on.
          }
        }
        a.req->cache_key_.reset();
      }
      on_step(a, first);
      for (Active* f : followers) on_step(*f, first);
    }
  }
  // A request whose choice 0 failed in prefill leaves its followers nothing to fork from.
  if (pre && !pre_ok)
    for (auto& ap : active_)
      if (ap->follower && !ap->done && ap->req == pre->req) finish(*ap, FinishReason::Error, "prefill failed");
}

void Scheduler::drop_finished() {
  active_.erase(std::remove_if(active_.begin(), active_.end(), [](const auto& a) { return a->done; }), active_.end());
}

void Scheduler::loop() {
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return !active_.empty() || !waiting_.empty() || stop_; });
      if (cancel_running_) {
        lock.unlock();
        for (auto& a : active_) {
          a->req->cancel();
          finish(*a, FinishReason::Cancelled);
        }
        active_.clear();
        return;
      }
      if (stop_ && active_.empty() && waiting_.empty()) {
        // Wait for shutdown() to end the grace period (nothing runs, so it ends at once).
        cv_.wait(lock, [&] { return cancel_running_; });
        return;
      }
      admit_locked();
    }
    // A failed choice fails its whole request (one Failed event, no partial result), so its
    // other choices would only spend steps and KV memory on output nobody gets: end them now.
    for (auto& a : active_)
      if (!a->done && (a->req->cancelled() || a->req->failure_)) finish(*a, FinishReason::Cancelled);
    drop_finished();
    StepRecord rec;
    step(rec);
    if (opt_.on_step) opt_.on_step(rec);
    drop_finished();
  }
}

}  // namespace kvevict::serve
