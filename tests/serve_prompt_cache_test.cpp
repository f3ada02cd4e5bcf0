// The server's prefix cache of pinned prompts (serve/prompt_cache.h, --prompt-cache): a request
// served from the cache gives the same tokens and log-probabilities as on a server without it;
// hits, misses, LRU eviction under the byte budget, an entry in use is never evicted; the pool
// counts a shared segment once and returns to 0 (cached entries are in the cache's budget); a
// policy without a prompt pin never uses it. References are servers started with the cache off
// (and with other thread counts / prefill chunks), never values the cache produced.
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <functional>
#include <set>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/engine.h"
#include "engine/policy_settings.h"
#include "model/model.h"
#include "serve/prompt_cache.h"
#include "serve/scheduler.h"
#include "util/error.h"
#include "serve_fixture.h"

namespace kvevict {
namespace {

using json = nlohmann::json;

json post(const TestServer& s, const json& body, int* status = nullptr) {
  auto r = s.client()->Post("/v1/completions", body.dump(), "application/json");
  if (!r) return json{{"transport_error", httplib::to_string(r.error())}};
  if (status) *status = r->status;
  return json::parse(r->body, nullptr, false);
}

json ok(const TestServer& s, const json& body) {
  int st = 0;
  json j = post(s, body, &st);
  EXPECT_EQ(st, 200) << j.dump();
  return j;
}

// The server's own policy: the cache key holds the selector object, and only requests on the
// server's policy share it (a request naming another policy gets a selector of its own).
serve::ApiOptions api(const std::string& policy = "random") {
  serve::ApiOptions ao;
  ao.policy_settings.policy = policy;
  ao.policy_settings.budget = 16;
  ao.policy_settings.recent = 4;
  ao.policy = build_policy(ao.policy_settings, policy);
  return ao;
}

int64_t cached_tokens(const json& r) { return r["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(); }

serve::SchedulerOptions opts(int64_t cache_bytes, int threads = 1, int64_t chunk = 64) {
  serve::SchedulerOptions so = small_opts();
  so.threads = threads;
  so.prefill_chunk = chunk;
  so.prompt_cache_bytes = cache_bytes;
  return so;
}

// A prompt longer than the pin under B = 16, r = 4 (K_sel - 1 = 11 slots; checked below): the rest sit in each sequence's own slots until the first round, so the cached template carries
// both the shared segment and own rows.
const std::string kLong = "AB AB AB AB AB AB AB AB AB AB AB AB AB";
const std::string kShort = "AB AB";  // wholly pinned

json request(const std::string& prompt, uint64_t seed, double temperature, int n) {
  return json{{"prompt", prompt}, {"max_tokens", 40},    {"kv_policy", "random"}, {"kv_budget", 16},
              {"kv_buffer", 4},   {"n", n},              {"seed", seed},          {"temperature", temperature},
              {"logprobs", 2},    {"ignore_eos", true}};
}

// Tokens and log-probabilities of a cache hit equal those of the same request on a server
// without the cache, for greedy and seeded sampling, n = 1 and 3, a prompt longer than the pin
// and one inside it, a hit whose seed differs from the request that filled the cache, and any
// thread count / prefill chunk.
TEST(ServePromptCache, HitsGiveTheSameTokensAndLogprobsAsNoCache) {
  struct Case {
    std::string prompt;
    double temperature;
    int n;
  };
  const std::vector<Case> cases = {{kLong, 0.0, 1}, {kLong, 1.0, 1}, {kLong, 1.0, 3}, {kShort, 1.0, 3}};
  std::vector<json> ref;
  {
    TestServer off(test::reasoner_model(), opts(0), api());
    for (const Case& c : cases) ref.push_back(ok(off, request(c.prompt, 9, c.temperature, c.n)));
  }
  for (const auto& [threads, chunk] : {std::pair<int, int64_t>{1, 64}, {2, 3}}) {
    TestServer on(test::reasoner_model(), opts(64 << 20, threads, chunk), api());
    std::set<std::string> seen;
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      const int64_t P = ref[i]["usage"]["prompt_tokens"].get<int64_t>();
      // Fill the cache with another seed (the first time a prompt comes; the key holds neither
      // the seed, the temperature nor n), then the hit runs with the reference's seed.
      const json fill = ok(on, request(c.prompt, 1234, c.temperature, c.n));
      EXPECT_EQ(cached_tokens(fill), seen.insert(c.prompt).second ? 0 : P) << i;
      const json hit = ok(on, request(c.prompt, 9, c.temperature, c.n));
      EXPECT_EQ(cached_tokens(hit), P) << i;
      EXPECT_EQ(hit["choices"], ref[i]["choices"]) << "case " << i << " threads " << threads << " chunk " << chunk;
      EXPECT_EQ(hit["usage"]["kv"]["eviction_rounds"], ref[i]["usage"]["kv"]["eviction_rounds"]) << i;
      if (c.temperature > 0 && c.n > 1) {
        EXPECT_NE(hit["choices"][0]["text"], hit["choices"][1]["text"]);
      }
    }
    EXPECT_EQ(on.metric("kvevict:prompt_cache_hits_total"), 6);
    EXPECT_EQ(on.metric("kvevict:prompt_cache_misses_total"), 2);  // the first kLong and kShort
    EXPECT_EQ(on.metric("kvevict:prompt_cache_entries"), 2);
  }
  EXPECT_GT(ref[0]["usage"]["kv"]["eviction_rounds"].get<int64_t>(), 0);
  EXPECT_GT(ref[0]["usage"]["prompt_tokens"].get<int64_t>(), 11);  // longer than the pin
  EXPECT_LT(ref[3]["usage"]["prompt_tokens"].get<int64_t>(), 11);  // inside it
}

// Two concurrent requests with the same prompt (whichever comes first fills the cache, the other
// waits for that prefill and hits) and a later one: all equal the cache-off reference.
TEST(ServePromptCache, ConcurrentSamePromptRequestsAreUnchanged) {
  const json req = request(kLong, 5, 1.0, 2);
  json ref;
  {
    TestServer off(test::reasoner_model(), opts(0), api());
    ref = ok(off, req);
  }
  TestServer on(test::reasoner_model(), opts(64 << 20), api());
  json got[2];
  std::thread t0([&] { got[0] = ok(on, req); });
  std::thread t1([&] { got[1] = ok(on, req); });
  t0.join();
  t1.join();
  const json later = ok(on, req);
  EXPECT_EQ(got[0]["choices"], ref["choices"]);
  EXPECT_EQ(got[1]["choices"], ref["choices"]);
  EXPECT_EQ(later["choices"], ref["choices"]);
  EXPECT_EQ(cached_tokens(later), ref["usage"]["prompt_tokens"].get<int64_t>());
  // Whichever is admitted first prefills; the other waits for that prefill and hits.
  EXPECT_EQ(on.metric("kvevict:prompt_cache_misses_total"), 1);
  EXPECT_EQ(on.metric("kvevict:prompt_cache_hits_total"), 2);
  EXPECT_EQ(on.metric("kvevict:prompt_tokens_total"), ref["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(on.metric("kvevict:kv_pool_used_bytes"), 0);
  EXPECT_EQ(on.metric("kvevict:kv_shared_prompt_bytes"), 0);
}

// Bytes of one entry by the KvShape arithmetic (f32 KV): the template's own allocation (keys and
// values of capacity - S slots, positions of all), the S-slot segment, the logits.
int64_t entry_bytes(const Model& m, int64_t capacity, int64_t S) {
  const ModelConfig& c = m.config();
  const int64_t heads = int64_t{c.n_layers} * c.n_kv_heads;
  const int64_t kv_row = 2 * int64_t{c.head_dim} * 4;
  return heads * ((capacity - S) * kv_row + capacity * 4) + heads * S * kv_row + int64_t{c.n_vocab} * 4;
}

json short_request(const std::string& prompt) {
  return json{{"prompt", prompt}, {"max_tokens", 3},  {"kv_policy", "random"},
              {"kv_budget", 16},  {"kv_buffer", 4},   {"temperature", 0.0}};
}

// Repeated prompt: hit; new prompt: miss; the budget holds two entries of these prompts, so a
// third evicts the least recently used one; pool bytes return to 0 while the cache holds its
// entries (counted in its own budget).
TEST(ServePromptCache, HitsMissesAndLruEvictionUnderTheBudget) {
  const auto m = Model::load(test::reasoner_model());
  const std::vector<std::string> prompts = {"AB", "BA", "AA"};
  std::vector<int64_t> P;
  for (const auto& p : prompts) P.push_back(static_cast<int64_t>(m->tokenizer().encode(p, true).size()));
  ASSERT_EQ(P[0], P[1]);
  ASSERT_EQ(P[0], P[2]);
  ASSERT_LT(P[0], 11);  // wholly pinned: S = P, capacity = B + r = 20
  const int64_t one = entry_bytes(*m, 20, P[0]);
  TestServer s(test::reasoner_model(), opts(2 * one + one / 2), api());
  auto metric = [&](const char* name) { return s.metric(std::string("kvevict:prompt_cache_") + name); };
  EXPECT_EQ(cached_tokens(ok(s, short_request("AB"))), 0);  // miss, stored
  EXPECT_EQ(metric("bytes"), one);
  EXPECT_EQ(cached_tokens(ok(s, short_request("AB"))), P[0]);  // hit
  EXPECT_EQ(cached_tokens(ok(s, short_request("BA"))), 0);     // miss, stored: 2 entries
  EXPECT_EQ(metric("entries"), 2);
  EXPECT_EQ(metric("bytes"), 2 * one);
  EXPECT_EQ(cached_tokens(ok(s, short_request("AB"))), P[0]);  // hit: "BA" is now least recent
  EXPECT_EQ(cached_tokens(ok(s, short_request("AA"))), 0);     // miss: evicts "BA"
  EXPECT_EQ(metric("evictions_total"), 1);
  EXPECT_EQ(metric("entries"), 2);
  EXPECT_EQ(cached_tokens(ok(s, short_request("AB"))), P[0]);  // still cached
  EXPECT_EQ(cached_tokens(ok(s, short_request("AA"))), P[0]);
  EXPECT_EQ(metric("hits_total"), 4);
  EXPECT_EQ(metric("misses_total"), 3);
  EXPECT_EQ(metric("capacity_bytes"), 2 * one + one / 2);
  EXPECT_EQ(s.metric("kvevict:kv_pool_used_bytes"), 0);
  EXPECT_EQ(s.metric("kvevict:kv_shared_prompt_bytes"), 0);
  EXPECT_EQ(metric("bytes"), 2 * one);
}

// An entry a running request reads is never evicted, and while it runs a hit reserves only its
// own slots (the segment is in the pool once). The long request is a stream held open until the
// other requests are done, then dropped.
TEST(ServePromptCache, AnEntryInUseIsNotEvictedAndItsSegmentIsCountedOnce) {
  const auto m = Model::load(test::reasoner_model());
  const int64_t P = static_cast<int64_t>(m->tokenizer().encode("AB", true).size());
  const int64_t one = entry_bytes(*m, 20, P);
  std::atomic<int64_t> max_used{0};
  serve::SchedulerOptions so = opts(one + one / 2);  // room for one entry
  std::atomic<TestServer*> srv{nullptr};
  so.on_step = [&](const serve::StepRecord&) {
    if (TestServer* p = srv.load()) max_used.store(std::max(max_used.load(), p->sched().pool().used()));
  };
  TestServer s(test::reasoner_model(), so, api());
  srv = &s;
  const ModelConfig& c = m->config();
  const int64_t heads = int64_t{c.n_layers} * c.n_kv_heads;
  const int64_t seg = heads * P * 2 * c.head_dim * 4;
  const int64_t own = heads * ((20 - P) * 2 * c.head_dim * 4 + 20 * 4);

  httplib::Client lc("127.0.0.1", s.port());
  lc.set_read_timeout(120, 0);
  httplib::Request lr;
  lr.method = "POST";
  lr.path = "/v1/completions";
  lr.set_header("Content-Type", "application/json");
  json lb = short_request("AB");
  lb["max_tokens"] = 2000;
  lb["ignore_eos"] = true;
  lb["stream"] = true;
  lr.body = lb.dump();
  bool checked = false;
  json hit, other;
  int64_t hit_max = 0, used_during = 0;
  lr.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
    if (checked) return false;
    checked = true;
    // The long request runs and its entry ("AB") is in the cache, in use.
    used_during = s.metric("kvevict:kv_pool_used_bytes");
    max_used = 0;
    hit = ok(s, short_request("AB"));
    hit_max = max_used.load();
    other = ok(s, short_request("BA"));  // miss; storing it would need "AB" evicted
    return false;                        // hang up: the long request is cancelled
  };
  lc.send(lr);
  ASSERT_TRUE(checked);
  EXPECT_EQ(used_during, seg + own);
  EXPECT_EQ(cached_tokens(hit), P);
  // The hit ran next to the long request: one segment, two own allocations.
  EXPECT_EQ(hit_max, seg + 2 * own);
  EXPECT_EQ(cached_tokens(other), 0);
  EXPECT_EQ(s.metric("kvevict:prompt_cache_evictions_total"), 0);
  EXPECT_EQ(s.metric("kvevict:prompt_cache_entries"), 1);
  for (int i = 0; i < 1000 && s.metric("kvevict:requests_cancelled_total") != 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // The premise: the long request was still running (it ends cancelled, not finished).
  ASSERT_EQ(s.metric("kvevict:requests_cancelled_total"), 1);
  EXPECT_EQ(s.metric("kvevict:kv_pool_used_bytes"), 0);
  // Now unused: a new prompt evicts it.
  EXPECT_EQ(cached_tokens(ok(s, short_request("BA"))), 0);
  EXPECT_EQ(s.metric("kvevict:prompt_cache_evictions_total"), 1);
  EXPECT_EQ(cached_tokens(ok(s, short_request("BA"))), P);
  EXPECT_EQ(s.metric("kvevict:kv_pool_used_bytes"), 0);
  srv = nullptr;
}

// A policy without a prompt pin (h2o: its keep-set may drop prompt tokens) never shares its
// prompt, so it never reads or fills the cache: every request prefills. Nor does a request that
// names a policy other than the server's (its selector is its own object).
TEST(ServePromptCache, APolicyWithoutAPromptPinNeverUsesTheCache) {
  TestServer s(test::reasoner_model(), opts(64 << 20), api("h2o"));
  json req = short_request("AB AB AB");
  req.erase("kv_policy");  // the server's h2o
  const json a = ok(s, req);
  const json b = ok(s, req);
  EXPECT_EQ(cached_tokens(a), 0);
  EXPECT_EQ(cached_tokens(b), 0);
  EXPECT_EQ(s.metric("kvevict:prompt_cache_hits_total"), 0);
  EXPECT_EQ(s.metric("kvevict:prompt_cache_misses_total"), 0);
  EXPECT_EQ(s.metric("kvevict:prompt_cache_entries"), 0);
  EXPECT_EQ(s.metric("kvevict:prompt_tokens_total"), 2 * a["usage"]["prompt_tokens"].get<int64_t>());
  const json r1 = ok(s, short_request("AB AB AB"));  // kv_policy random: not the server's
  EXPECT_EQ(cached_tokens(ok(s, short_request("AB AB AB"))), 0);
  EXPECT_EQ(s.metric("kvevict:prompt_cache_entries"), 0);
  // The same on a server whose policy is random: a hit skips the prefill, the prompt tokens
  // counter does not grow.
  TestServer r(test::reasoner_model(), opts(64 << 20), api("random"));
  ok(r, short_request("AB AB AB"));
  const double before = r.metric("kvevict:prompt_tokens_total");
  const json r2 = ok(r, short_request("AB AB AB"));
  EXPECT_EQ(cached_tokens(r2), r1["usage"]["prompt_tokens"].get<int64_t>());
  EXPECT_EQ(r.metric("kvevict:prompt_tokens_total"), before);
}

TEST(ServePromptCache, BadSettingsAreRefused) {
  const auto m = Model::load(test::reasoner_model());
  serve::SchedulerOptions so = opts(-1);
  EXPECT_THROW((serve::Scheduler{*m, so}), Error);
  so = opts(1 << 20);
  so.share_prompt = false;
  try {
    serve::Scheduler sched(*m, so);
    ADD_FAILURE() << "accepted --prompt-cache with --no-share-prompt";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--no-share-prompt"), std::string::npos) << e.what();
  }
  EXPECT_THROW(serve::PromptCache{-5}, Error);
}

}  // namespace
}  // namespace kvevict
