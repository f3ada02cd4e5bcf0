// `kvevict serve`: text streaming with stop strings, the KV pool's admission arithmetic,
// per-request determinism under continuous batching, disconnects, every bad request of the API
// and a bounded load test. Servers run in-process on an ephemeral 127.0.0.1 port and are
// stopped by the test; request loops are bounded.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/text_stream.h"
#include "format/gguf.h"
#include "kvcache/kv_pool.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "serve/http_server.h"
#include "serve/load_client.h"
#include "serve/request.h"
#include "serve/scheduler.h"
#include "util/error.h"
#include "util/rng.h"
#include "util/utf8.h"
#include "raw_http.h"
#include "serve_fixture.h"
#include "test_paths.h"

namespace kvevict {
namespace {

using json = nlohmann::json;
using kvevict::TextStream;

TEST(ServeText, StopStringAcrossTokensIsCutAndNeverEmitted) {
  // Expected by hand: "##" arrives split over two pushes; the text before it is "ab", and the
  // held-back "#" is never emitted.
  TextStream t({"##"});
  EXPECT_EQ(t.push("a"), "a");
  EXPECT_EQ(t.push("b#"), "b");
  EXPECT_FALSE(t.stopped());
  EXPECT_EQ(t.push("#c"), "");
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(t.text(), "ab");
  EXPECT_EQ(t.push("zzz"), "");
}

TEST(ServeText, HeldBackPrefixIsReleasedWhenItDoesNotComplete) {
  TextStream t({"END"});
  EXPECT_EQ(t.push("xE"), "x");
  EXPECT_EQ(t.push("N"), "");
  EXPECT_EQ(t.push("D?"), "");  // "END" complete: stop, nothing after it
  EXPECT_EQ(t.text(), "x");
  TextStream u({"END"});
  EXPECT_EQ(u.push("EN"), "");
  EXPECT_EQ(u.push("x"), "ENx");  // "ENx" can no longer become "END"
  EXPECT_EQ(u.flush(), "");
}

TEST(ServeText, IncompleteUtf8IsHeldUntilComplete) {
  // U+00E9 is C3 A9; U+20AC is E2 82 AC (RFC 3629 table).
  TextStream t({});
  EXPECT_EQ(t.push("a\xC3"), "a");
  EXPECT_EQ(t.push("\xA9"), "\xC3\xA9");
  EXPECT_EQ(t.push("\xE2\x82"), "");
  EXPECT_EQ(t.flush(), "");  // a character that never completed is dropped, not sent broken
  EXPECT_TRUE(utf8_valid("a\xC3\xA9\xE2\x82\xAC"));
  EXPECT_FALSE(utf8_valid("\xFF"));
  EXPECT_FALSE(utf8_valid("\xC0\xAF"));      // overlong '/'
  EXPECT_FALSE(utf8_valid("\xED\xA0\x80"));  // surrogate U+D800
}

TEST(ServePool, ReservesOnlyWhatFitsAndRefusesOverRelease) {
  KvMemoryPool p(100);
  EXPECT_TRUE(p.try_reserve(60));
  EXPECT_FALSE(p.try_reserve(41));
  EXPECT_TRUE(p.try_reserve(40));
  EXPECT_EQ(p.free(), 0);
  p.release(100);
  EXPECT_EQ(p.used(), 0);
  EXPECT_THROW(p.release(1), Error);
  EXPECT_THROW(KvMemoryPool(0), Error);
  // Bytes per slot by the KvShape formula: 2 layers x 2 KV heads x (2 x 32 x 4 + 4) = 1040.
  EXPECT_EQ(kv_bytes_for_capacity(KvShape{2, 2, 32, KvType::F32}, 10), 10400);
  EXPECT_EQ(SequenceKv(KvShape{2, 2, 32, KvType::F32}, 10).allocated_bytes(), 10400);
}

// The request parser alone (no socket, no weights): what fuzz/fuzz_request.cpp drives. Expected
// values: the limits passed in, and the reasoner tokenizer's own encoding of the prompt.
// The request parser alone, on the default model's vocabulary, with --max-tokens 32.
struct RequestParser {
  GgufFile file = GgufFile::open(kvevict::test::reasoner_model());
  Tokenizer tok = Tokenizer::from_gguf(file);
  serve::ApiOptions opt = [] {
    serve::ApiOptions o;
    o.max_tokens_limit = 32;
    return o;
  }();
  std::atomic<uint64_t> counter{0};
  serve::ParsedRequest operator()(const std::string& body, int64_t context = 2048) {
    return serve::parse_generation_request(body, serve::Endpoint::Completions, tok, context, opt, counter);
  }
};

// chat_template_kwargs: enable_thinking reaches the renderer; any other key is a 400 naming it
// (a misspelt "enable_thinkin" changed nothing before). The renderer here records its argument.
TEST(ServeRequest, ChatTemplateKwargsAreCheckedNotIgnored) {
  RequestParser parse;
  bool seen_thinking = true;
  parse.opt.chat = [&](const std::vector<std::pair<std::string, std::string>>&, bool thinking) {
    seen_thinking = thinking;
    return serve::ChatPrompt{"AB", true};
  };
  auto chat = [&](const std::string& body) {
    return serve::parse_generation_request(body, serve::Endpoint::Chat, parse.tok, 2048, parse.opt, parse.counter);
  };
  const std::string msgs = R"("messages": [{"role": "user", "content": "hi"}], "max_tokens": 4)";
  (void)chat("{" + msgs + R"(, "chat_template_kwargs": {"enable_thinking": false}})");
  EXPECT_FALSE(seen_thinking);
  try {
    (void)chat("{" + msgs + R"(, "chat_template_kwargs": {"enable_thinkin": false}})");
    ADD_FAILURE() << "an unknown chat_template_kwargs key was accepted";
  } catch (const serve::ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(e.message.find("enable_thinkin"), std::string::npos) << e.message;
  }
}

TEST(ServeRequest, ParsesABodyWithoutASocket) {
  RequestParser parse;
  const Tokenizer& tok = parse.tok;
  std::atomic<uint64_t>& counter = parse.counter;
  const serve::ParsedRequest p = parse(R"({"prompt": "AB", "max_tokens": 4, "seed": 9})");
  EXPECT_EQ(p.gen.prompt, tok.encode("AB", true));
  EXPECT_EQ(p.gen.generation.max_new_tokens, 4);
  EXPECT_EQ(p.gen.generation.sampler.seed, 9u);
  EXPECT_EQ(counter.load(), 0u);  // a request with a seed takes no derived one
  (void)parse(R"({"prompt": "AB"})");
  EXPECT_EQ(counter.load(), 1u);
  auto status_of = [&](const std::string& body, int64_t context = 2048) {
    try {
      (void)parse(body, context);
    } catch (const serve::ApiError& e) {
      return e.status;
    }
    return 200;
  };
  EXPECT_EQ(status_of(""), 400);
  EXPECT_EQ(status_of("{"), 400);
  EXPECT_EQ(status_of(R"({"prompt": "AB", "max_tokens": 33})"), 400);
  EXPECT_EQ(status_of(R"({"prompt": [1, 2]})", 3), 200);
  EXPECT_EQ(status_of(R"({"prompt": [1, 2, 3]})", 3), 400);  // no room left to generate
  EXPECT_EQ(status_of(R"({"prompt": {"a": 1}})"), 400);
}

TEST(ServeRequest, HugeNumbersAreOutOfRangeNotWrapped) {
  // Expected: integers written as huge floats or above INT64_MAX get a 400 naming the value as
  // sent and the field's real range (converting 1e300 to int64 is undefined behaviour; the
  // message used to show -9223372036854775808). Ranges: max_tokens [1, --max-tokens = 32],
  // kv_budget [1, 2^20], n [1, max_n], top_k [-1, n_vocab].
  RequestParser parse;
  auto message_of = [&](const std::string& field) {
    try {
      (void)parse(R"({"prompt": "AB", )" + field + "}");
    } catch (const serve::ApiError& e) {
      EXPECT_EQ(e.status, 400) << field;
      return e.message;
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message_of(R"("max_tokens": 1e300)"),
            "max_tokens 1e+300: must be in [1, 32] (the upper limit is the server's --max-tokens)");
  EXPECT_EQ(message_of(R"("max_tokens": 9300000000000000000)"),
            "max_tokens 9300000000000000000: must be in [1, 32] (the upper limit is the server's --max-tokens)");
  EXPECT_EQ(message_of(R"("kv_budget": -1e300)"), "kv_budget -1e+300: must be in [1, 1048576]");
  EXPECT_NE(message_of(R"("n": 1e19)").find("n 1e+19: must be in [1, "), std::string::npos);
  EXPECT_NE(message_of(R"("top_k": 1e300)").find("top_k 1e+300: must be in [-1, "), std::string::npos);
  EXPECT_EQ(message_of(R"("max_tokens": 4.0)"), "accepted");
}

json post(const TestServer& s, const std::string& path, const json& body, int* status = nullptr) {
  auto r = s.client()->Post(path, body.dump(), "application/json");
  if (!r) return json{{"transport_error", httplib::to_string(r.error())}};
  if (status) *status = r->status;
  return json::parse(r->body, nullptr, false);
}

// A streamed request: every event, the text, the finish reason.
struct Streamed {
  int status = 0;
  bool done = false;
  std::string text, finish;
  json usage, error;
  int chunks = 0;
};

// keep_going(first): called after each read (first = it brought the first event); false hangs up.
Streamed post_stream(int port, const json& body, int stop_after_chunks = -1,
                     const std::function<bool(bool)>& keep_going = nullptr) {
  Streamed out;
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(120, 0);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.set_header("Content-Type", "application/json");
  json b = body;
  b["stream"] = true;
  b["stream_options"] = {{"include_usage", true}};
  req.body = b.dump();
  std::string buf;
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    // One read may carry several events (the server writes every event ready since its last
    // write at once): `first` means this read brought the first one.
    const int before = out.chunks;
    buf.append(d, n);
    size_t pos;
    while ((pos = buf.find("\n\n")) != std::string::npos) {
      const std::string ev = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      if (ev == "data: [DONE]") {
        out.done = true;
        continue;
      }
      const json j = json::parse(ev.substr(6));
      out.chunks += 1;
      if (j.contains("error")) out.error = j["error"];
      if (j.contains("usage")) out.usage = j["usage"];
      for (const json& ch : j.value("choices", json::array())) {
        out.text += ch.value("text", "");
        if (ch["finish_reason"].is_string()) out.finish = ch["finish_reason"];
      }
    }
    if (keep_going && !keep_going(before == 0 && out.chunks > 0)) return false;
    return stop_after_chunks < 0 || out.chunks < stop_after_chunks;
  };
  auto r = c.send(req);
  if (r) out.status = r->status;
  return out;
}

// Reference: the request's sequence run alone through the Engine with `kvevict generate`'s
// sampling streams (seed, sequence 0, step), independent of the scheduler and HTTP layers.
std::string reference_text(const Model& m, const std::string& prompt, const Policy& policy,
                           const EvictionConfig& cfg, const SamplerConfig& sc, int64_t max_tokens, int64_t* rounds) {
  Engine e(m, 1);
  const auto ids = m.tokenizer().encode(prompt, true);
  auto seq = e.new_sequence(0, policy, cfg, static_cast<int64_t>(ids.size()), max_tokens);
  std::vector<float> logits;
  e.prefill(*seq, ids, logits);
  std::string text;
  for (int64_t i = 0; i < max_tokens; ++i) {
    Rng rng(stream_id({sc.seed, 0, static_cast<uint64_t>(i), 0x5A4D504CULL}));
    const int32_t t = sample_token(logits, sc, rng);
    if (t == m.tokenizer().eos_id()) break;
    text += m.tokenizer().piece(t);
    if (i + 1 < max_tokens) e.decode(*seq, t, logits);
  }
  *rounds = seq->stats.rounds;
  return text.substr(0, utf8_complete_prefix(text));
}

TEST(Serve, SameSeedSameTokensAloneAndAmong15ConcurrentRequests) {
  TestServer s(test::reasoner_model(), small_opts(), {});
  // random with B = 24, r = 8 over 120 tokens: several eviction rounds with seeded draws.
  const json target = {
      {"prompt", "AB\nCD\nEF\n"}, {"max_tokens", 120}, {"temperature", 0.9}, {"top_k", 20},       {"seed", 4242},
      {"kv_policy", "random"},    {"kv_budget", 24},   {"kv_buffer", 8},     {"ignore_eos", true}};
  int64_t ref_rounds = 0;
  EvictionConfig cfg;
  cfg.budget = 24;
  cfg.recent = 8;
  cfg.seed = 4242;
  const std::string ref = reference_text(s.model(), "AB\nCD\nEF\n", make_policy("random"), cfg,
                                         SamplerConfig{0.9f, 1.0f, 20, 4242}, 120, &ref_rounds);
  ASSERT_GT(ref_rounds, 0);
  int st = 0;
  const json alone = post(s, "/v1/completions", target, &st);
  ASSERT_EQ(st, 200) << alone.dump();
  EXPECT_EQ(alone["choices"][0]["text"], ref);
  EXPECT_EQ(alone["usage"]["kv"]["eviction_rounds"], ref_rounds);
  EXPECT_EQ(alone["usage"]["completion_tokens"], 120);
  // The target at two different positions among 15 other requests (other seeds, prompts,
  // policies), all in flight together.
  for (int where : {0, 11}) {
    std::vector<std::thread> th;
    std::vector<std::string> texts(16);
    for (int k = 0; k < 16; ++k)
      th.emplace_back([&, k] {
        json b = target;
        if (k != where) {
          b["seed"] = 100 + k;
          b["prompt"] = std::string(static_cast<size_t>(1 + k % 5), static_cast<char>('A' + k)) + "\n";
          b["kv_policy"] = (k % 3 == 0) ? "full" : (k % 3 == 1 ? "h2o" : "random");
        }
        texts[static_cast<size_t>(k)] = post_stream(s.port(), b).text;
      });
    for (auto& t : th) t.join();
    EXPECT_EQ(texts[static_cast<size_t>(where)], ref) << "target at position " << where;
  }
  EXPECT_GE(s.metric("kvevict:num_sequences_running_peak"), 8);  // the 16 actually overlapped
}

TEST(Serve, RoundIntervalPerRequestMatchesTheEngine) {
  TestServer s(test::reasoner_model(), small_opts(), {});
  // kv_round_interval 16 with r = 8: rounds every 16 tokens, peak B + s = 40 slots per KV head.
  const json b = {{"prompt", "AB\nCD\n"}, {"max_tokens", 100},     {"temperature", 0.9}, {"seed", 77},
                  {"top_k", 20},           {"kv_policy", "random"}, {"kv_budget", 24},       {"kv_buffer", 8},     {"kv_round_interval", 16},
                  {"ignore_eos", true}};
  EvictionConfig cfg;
  cfg.budget = 24;
  cfg.recent = 8;
  cfg.interval = 16;
  cfg.seed = 77;
  int64_t ref_rounds = 0;
  const std::string ref = reference_text(s.model(), "AB\nCD\n", make_policy("random"), cfg,
                                         SamplerConfig{0.9f, 1.0f, 20, 77}, 100, &ref_rounds);
  ASSERT_GT(ref_rounds, 0);
  int st = 0;
  const json out = post(s, "/v1/completions", b, &st);
  ASSERT_EQ(st, 200) << out.dump();
  EXPECT_EQ(out["choices"][0]["text"], ref);
  EXPECT_EQ(out["usage"]["kv"]["eviction_rounds"], ref_rounds);
  EXPECT_EQ(out["usage"]["kv"]["round_interval"], 16);
  EXPECT_EQ(out["usage"]["kv"]["peak_slots_per_kv_head"], 40);
  // Without it the interval is r: more rounds over the same tokens.
  json plain = b;
  plain.erase("kv_round_interval");
  const json p = post(s, "/v1/completions", plain, &st);
  ASSERT_EQ(st, 200) << p.dump();
  EXPECT_EQ(p["usage"]["kv"]["round_interval"], 8);
  EXPECT_GT(p["usage"]["kv"]["eviction_rounds"].get<int64_t>(), ref_rounds);
}

TEST(Serve, StreamedTextEqualsNonStreamedAndStopStringsAreCut) {
  TestServer s(test::reasoner_model(), small_opts(), {});
  const json b = {{"prompt", "QR\nST\n"}, {"max_tokens", 60}, {"temperature", 0.8}, {"seed", 9}, {"ignore_eos", true}};
  const json full = post(s, "/v1/completions", b);
  const Streamed st = post_stream(s.port(), b);
  EXPECT_TRUE(st.done);
  EXPECT_EQ(st.text, full["choices"][0]["text"]);
  EXPECT_EQ(st.finish, "length");
  EXPECT_EQ(st.usage["completion_tokens"], 60);
  // Stop at the first occurrence of a 2-character string found in the unstopped text.
  const std::string text = full["choices"][0]["text"];
  ASSERT_GE(text.size(), 10u);
  const std::string stop = text.substr(5, 2);
  json bs = b;
  bs["stop"] = json::array({stop});
  const json cut = post(s, "/v1/completions", bs);
  EXPECT_EQ(cut["choices"][0]["text"], text.substr(0, text.find(stop)));
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
  const Streamed cuts = post_stream(s.port(), bs);
  EXPECT_EQ(cuts.text, text.substr(0, text.find(stop)));
}

TEST(Serve, PoolAdmitsExactlyNBoundedSequencesAndTheNextWaits) {
  // B = 32, r = 8, prompt <= B: each sequence reserves (B + r) slots x layers x KV heads x
  // (2 x head_dim x 4 + 4) bytes (the issue's formula, computed here from the model's shape).
  const auto m = Model::load(test::reasoner_model());
  const ModelConfig& c = m->config();
  const int64_t per_seq = int64_t{40} * c.n_layers * c.n_kv_heads * (2 * c.head_dim * 4 + 4);
  TestServer s(test::reasoner_model(), small_opts(3 * per_seq + per_seq / 2), {});
  const json b = {{"prompt", "AB\n"},      {"max_tokens", 2000}, {"ignore_eos", true},
                  {"kv_policy", "random"}, {"kv_budget", 32},    {"kv_buffer", 8}};
  std::vector<Streamed> res(4);
  std::vector<std::thread> th;
  // Four clients at once: three are admitted, one waits. Once that was seen, the clients that
  // were streaming hang up (freeing their reservations) and the waiting one runs to the end.
  std::atomic<bool> release{false};
  std::atomic<int> waiter{-1};
  for (int k = 0; k < 4; ++k)
    th.emplace_back([&, k] {
      res[static_cast<size_t>(k)] = post_stream(s.port(), b, -1, [&, k](bool first) {
        if (first && release) waiter = k;  // its first token came after the release: it waited
        return !(release && waiter != k);
      });
    });
  bool saw = false;
  for (int i = 0; i < 5000 && !saw; ++i) {
    const double run = s.metric("kvevict:num_sequences_running"), wait = s.metric("kvevict:num_requests_waiting");
    const double used = s.metric("kvevict:kv_pool_used_bytes");
    if (run == 3 && wait == 1) {
      EXPECT_EQ(used, 3 * per_seq);
      saw = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_TRUE(saw) << "never saw 3 running and 1 waiting";
  release = true;
  for (auto& t : th) t.join();
  ASSERT_GE(waiter.load(), 0) << "no client waited for admission";
  const Streamed& w = res[static_cast<size_t>(waiter.load())];
  EXPECT_TRUE(w.done);
  EXPECT_EQ(w.finish, "length");
  EXPECT_EQ(w.usage["kv"]["kv_bytes_reserved"], per_seq);
  EXPECT_LE(w.usage["kv"]["peak_slots_per_kv_head"].get<int64_t>(), 40);
  for (int i = 0; i < 500 && s.metric("kvevict:kv_pool_used_bytes") != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(s.metric("kvevict:kv_pool_used_bytes"), 0);
  EXPECT_EQ(s.metric("kvevict:num_sequences_running"), 0);
}

TEST(Serve, FullReservesPromptPlusMaxTokensSoFewerSequencesFit) {
  // Pool of 4 bounded sequences (B = 32, r = 8: 40 slots each). `full` with prompt 3 +
  // max_tokens 77 needs 80 slots per sequence (prompt + max_tokens), so 2 fit; and a `full`
  // request of 2000 tokens is larger than the whole pool: 400 at once.
  const auto m = Model::load(test::reasoner_model());
  const ModelConfig& c = m->config();
  const int64_t slot = int64_t{c.n_layers} * c.n_kv_heads * (2 * c.head_dim * 4 + 4);
  TestServer s(test::reasoner_model(), small_opts(4 * 40 * slot), {});
  EXPECT_EQ(s.sched().pool().capacity() / (80 * slot), 2);
  int st = 0;
  const json big = post(s, "/v1/completions", {{"prompt", "AB"}, {"max_tokens", 2000}, {"kv_policy", "full"}}, &st);
  EXPECT_EQ(st, 400);
  EXPECT_NE(big["error"]["message"].get<std::string>().find("KV pool"), std::string::npos) << big.dump();
  // n = 2 choices: two sequences, one reservation each, different sampling streams.
  const json two = post(s, "/v1/completions",
                        {{"prompt", "AB"},
                         {"max_tokens", 77},
                         {"kv_policy", "full"},
                         {"n", 2},
                         {"seed", 5},
                         {"temperature", 1.0},
                         {"ignore_eos", true}},
                        &st);
  ASSERT_EQ(st, 200) << two.dump();
  ASSERT_EQ(two["choices"].size(), 2u);
  // `full` never evicts, so the two choices share the whole prompt's keys and values (P slots,
  // reserved once; positions stay per choice): 2 × 80 slots less one copy of P slots' K/V.
  const int64_t P = two["usage"]["prompt_tokens"].get<int64_t>();
  const int64_t kv_slot = int64_t{c.n_layers} * c.n_kv_heads * 2 * c.head_dim * 4;
  EXPECT_EQ(two["usage"]["kv"]["kv_bytes_reserved"], 2 * 80 * slot - P * kv_slot);
  EXPECT_EQ(two["usage"]["kv"]["kv_shared_prompt_bytes"], P * kv_slot);
  EXPECT_EQ(two["usage"]["completion_tokens"], 2 * 77);
  EXPECT_NE(two["choices"][0]["text"], two["choices"][1]["text"]);
  // Three concurrent `full` requests of 80 slots: never more than 2 run at once (the n = 2
  // request above already made the peak 2), and all three complete.
  std::vector<std::thread> th;
  std::vector<int> codes(3, 0);
  for (int k = 0; k < 3; ++k)
    th.emplace_back([&, k] {
      post(s, "/v1/completions", {{"prompt", "AB"}, {"max_tokens", 77}, {"kv_policy", "full"}, {"ignore_eos", true}},
           &codes[static_cast<size_t>(k)]);
    });
  for (auto& t : th) t.join();
  EXPECT_EQ(codes, std::vector<int>({200, 200, 200}));
  EXPECT_EQ(s.metric("kvevict:num_sequences_running_peak"), 2);
  const json many =
      post(s, "/v1/completions", {{"prompt", "AB"}, {"n", 16}, {"kv_policy", "full"}, {"max_tokens", 5}}, &st);
  EXPECT_EQ(st, 200) << many.dump();  // 16 x 8 slots (3 prompt + 5) fit in 160
  EXPECT_EQ(s.metric("kvevict:num_sequences_running_peak"), 16);
}

// n choices of one request read one shared copy of the prompt's pinned KV (kv_cache.h): the
// reference is the same request on a server started with sharing off (--no-share-prompt), which
// must give the same texts (logits bit for bit: PromptSharing tests); bytes by the KvShape formula.
TEST(Serve, ChoicesShareThePinnedPromptKvWithUnchangedOutputs) {
  const json req = {{"prompt", "AB AB AB"}, {"max_tokens", 40}, {"kv_policy", "random"}, {"kv_budget", 16},
                    {"kv_buffer", 4},       {"n", 4},           {"seed", 7},             {"temperature", 1.0},
                    {"ignore_eos", true}};
  json got[2];
  double shared_after[2], used_after[2];
  for (const bool share : {false, true}) {
    serve::SchedulerOptions so = small_opts();
    so.share_prompt = share;
    TestServer s(test::reasoner_model(), so, {});
    int st = 0;
    got[share] = post(s, "/v1/completions", req, &st);
    ASSERT_EQ(st, 200) << got[share].dump();
    shared_after[share] = s.metric("kvevict:kv_shared_prompt_bytes");
    used_after[share] = s.metric("kvevict:kv_pool_used_bytes");
  }
  const json& off = got[0];
  const json& on = got[1];
  ASSERT_EQ(on["choices"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(on["choices"][i]["text"], off["choices"][i]["text"]) << i;
  }
  EXPECT_NE(on["choices"][0]["text"], on["choices"][1]["text"]);
  EXPECT_GT(on["usage"]["kv"]["eviction_rounds"].get<int64_t>(), 0);
  const auto m = Model::load(test::reasoner_model());
  const ModelConfig& c = m->config();
  const int64_t slot = int64_t{c.n_layers} * c.n_kv_heads * (2 * c.head_dim * 4 + 4);
  const int64_t kv_slot = int64_t{c.n_layers} * c.n_kv_heads * 2 * c.head_dim * 4;
  const int64_t P = on["usage"]["prompt_tokens"].get<int64_t>();
  ASSERT_LT(P, 16 - 4 - 1);  // the prompt pin (K_sel - 1 = 11 slots) holds the whole prompt
  const int64_t cap = 16 + 4;  // max(B, P) + r
  EXPECT_EQ(off["usage"]["kv"]["kv_bytes_reserved"], 4 * cap * slot);
  EXPECT_EQ(off["usage"]["kv"]["kv_shared_prompt_bytes"], 0);
  EXPECT_EQ(on["usage"]["kv"]["kv_shared_prompt_bytes"], P * kv_slot);
  EXPECT_EQ(on["usage"]["kv"]["kv_bytes_reserved"], 4 * cap * slot - 3 * P * kv_slot);
  EXPECT_EQ(shared_after[1], 0);  // released with the last choice
  EXPECT_EQ(used_after[1], 0);
}

TEST(Serve, DisconnectMidStreamFreesTheReservation) {
  TestServer s(test::reasoner_model(), small_opts(), {});
  const json b = {{"prompt", "AB\n"}, {"max_tokens", 2000}, {"ignore_eos", true}};
  const Streamed st = post_stream(s.port(), b, 5);  // hang up after 5 events
  EXPECT_FALSE(st.done);
  for (int i = 0; i < 1000 && s.metric("kvevict:requests_cancelled_total") != 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(s.metric("kvevict:requests_cancelled_total"), 1);
  EXPECT_EQ(s.metric("kvevict:kv_pool_used_bytes"), 0);
  EXPECT_LT(s.metric("kvevict:generation_tokens_total"), 2000);
  int code = 0;
  post(s, "/v1/completions", {{"prompt", "AB"}, {"max_tokens", 3}}, &code);
  EXPECT_EQ(code, 200);
}

void expect_error(const httplib::Result& r, int status, const std::string& needle) {
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, status) << r->body;
  const json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string() && e.contains("type") && e.contains("param") && e.contains("code")) << r->body;
  EXPECT_NE(e["message"].get<std::string>().find(needle), std::string::npos) << "'" << needle << "' not in " << r->body;
  EXPECT_EQ(e["code"], status);
}

TEST(Serve, EveryBadRequestGetsItsStatusAndErrorObject) {
  serve::ApiOptions ao;
  ao.max_tokens_limit = 512;
  ao.http.max_body_bytes = 4096;
  TestServer s(test::reasoner_model(), small_opts(), ao);
  auto c = s.client();
  const std::string J = "application/json";
  expect_error(c->Post("/v1/completions", "{\"prompt\": ", J), 400, "not valid JSON");
  expect_error(c->Post("/v1/completions", "{\"prompt\": \"a\xFF\"}", J), 400, "not valid UTF-8");
  expect_error(c->Post("/v1/completions", "[1,2]", J), 400, "JSON object");
  expect_error(c->Post("/v1/completions", R"({"prompt": ""})", J), 400, "prompt");
  expect_error(c->Post("/v1/completions", R"({"max_tokens": 5})", J), 400, "prompt");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "max_tokens": 0})", J), 400, "max_tokens");
  // Range errors read as the CLI's: "FIELD VALUE: must be ...".
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "max_tokens": 513})", J), 400,
               "max_tokens 513: must be in [1, 512]");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "max_completion_tokens": -1})", J), 400,
               "max_completion_tokens");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "max_tokens": "ten"})", J), 400, "integer");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "temperature": -1})", J), 400, "temperature");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "top_p": 0})", J), 400, "top_p");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "n": 0})", J), 400, "n");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "stop": 5})", J), 400, "stop");
  expect_error(c->Post("/v1/completions", R"({"prompt": [1, 99999]})", J), 400, "prompt: token 1 = 99999: must be a token id in [0, ");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "kv_policy": "bogus"})", J), 400, "bogus");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "kv_policy": "random"})", J), 400, "kv_budget");
  expect_error(
      c->Post("/v1/completions", R"({"prompt": "A", "kv_policy": "random", "kv_budget": 8, "kv_buffer": 8})", J), 400,
      "kv_b");
  expect_error(c->Post("/v1/completions",
                       R"({"prompt": "A", "kv_policy": "random", "kv_budget": 16, "kv_buffer": 4, "kv_sinks": 99})", J),
               400, "sinks");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "seed": -3})", J), 400, "seed -3: must be >= 0");
  // A number that overflows a double is malformed JSON (400), not a server error (was 500).
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "temperature": 1e999})", J), 400, "not valid JSON");
  // kv_budget has the CLI's upper bound on token counts (2^20), checked before admission.
  expect_error(c->Post("/v1/completions",
                       R"({"prompt": "A", "kv_policy": "random", "kv_budget": 100000000, "kv_buffer": 8})", J),
               400, "kv_budget 100000000: must be in [1, 1048576]");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "stream_options": {"include_usage": true}})", J), 400,
               "stream");
  // A model without a chat template: 400 naming the problem.
  expect_error(c->Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})", J), 400,
               "chat template");
  expect_error(c->Post("/v1/chat/completions", R"({"messages": []})", J), 400, "messages");
  expect_error(c->Get("/v1/nothing"), 404, "/v1/nothing");
  // No field is silently ignored: a misspelt one is unknown, an OpenAI one kvevict does not
  // implement is named as unsupported (an explicit null asks for nothing and passes), and a chat
  // field on the completions endpoint is unknown there.
  // kv_* fields under a policy that keeps every token would change nothing: refused.
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "kv_policy": "full", "kv_budget": 64})", J), 400,
               "kv_budget: is unused: policy 'full'");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "kv_policy": "full", "kv_round_interval": 8})", J), 400,
               "kv_round_interval: is unused: policy 'full'");
  expect_error(c->Post("/v1/completions",
                       R"({"prompt": "A", "kv_policy": "random", "kv_budget": 16, "kv_round_interval": 0})", J),
               400, "kv_round_interval 0: must be in [1, 1048576]");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "max_tokns": 4})", J), 400,
               "max_tokns: unknown field for /v1/completions");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "response_format": {"type": "json_object"}})", J), 400,
               "response_format: is not supported");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "tools": []})", J), 400, "tools: is not supported");
  expect_error(c->Post("/v1/completions", R"({"prompt": "A", "messages": []})", J), 400, "messages: unknown field");
  {
    auto null_tools = c->Post("/v1/completions", R"({"prompt": "A", "max_tokens": 2, "tools": null, "user": "u1"})", J);
    ASSERT_TRUE(null_tools);
    EXPECT_EQ(null_tools->status, 200) << null_tools->body;
  }
  expect_error(c->Post("/v1/completions", std::string(5000, ' '), J), 413, "4096");
  // The server keeps serving.
  auto ok = c->Post("/v1/completions", R"({"prompt": "AB", "max_tokens": 4})", J);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(json::parse(ok->body)["usage"]["completion_tokens"].get<int>() <= 4, true);
}

// Reproducers: an empty POST answered {"message": "HTTP 400"}; GET on a POST route answered 404;
// a prompt longer than the model's context (reasoner: 2048, the GGUF's llama.context_length)
// was run. Expected: RFC 9110's 405 with Allow, and OpenAI error objects naming the problem.
TEST(Serve, EmptyBodyWrongMethodAndPromptOverTheContext) {
  TestServer s(test::reasoner_model(), small_opts(), {});
  auto c = s.client();
  const std::string J = "application/json";
  expect_error(c->Post("/v1/completions", "", J), 400, "the request body is empty");
  expect_error(c->Post("/v1/chat/completions", " \n", J), 400, "the request body is empty");
  const std::string no_length =
      test::raw_http(s.port(), "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(no_length.rfind("HTTP/1.1 400", 0), 0u) << no_length;
  EXPECT_NE(no_length.find("\"message\":\"the request has no body"), std::string::npos) << no_length;

  auto get = c->Get("/v1/completions");
  expect_error(get, 405, "use POST");
  EXPECT_EQ(get->get_header_value("Allow"), "POST");
  auto on_get_route = c->Post("/v1/models", "{}", J);
  expect_error(on_get_route, 405, "use GET");
  EXPECT_EQ(on_get_route->get_header_value("Allow"), "GET");
  expect_error(c->Get("/v1/nothing"), 404, "/v1/nothing");

  ASSERT_EQ(s.model().config().context_length, 2048);
  json over = {{"prompt", std::vector<int>(2049, 5)}, {"max_tokens", 1}};
  int status = 0;
  json r = post(s, "/v1/completions", over, &status);
  EXPECT_EQ(status, 400) << r.dump();
  const std::string msg = r["error"]["message"];
  EXPECT_NE(msg.find("2049 tokens"), std::string::npos) << msg;
  EXPECT_NE(msg.find("context of 2048 tokens"), std::string::npos) << msg;
  EXPECT_EQ(r["error"]["param"], "prompt");
  // A prompt of the whole context leaves no room (prompt + max_tokens <= context, as vLLM).
  json whole = {{"prompt", std::vector<int>(2048, 5)}, {"max_tokens", 1}};
  r = post(s, "/v1/completions", whole, &status);
  EXPECT_EQ(status, 400) << r.dump();
  EXPECT_EQ(r["error"]["param"], "prompt");
  // Up to the context it runs: 2,047 + 1 = 2,048.
  json at = {{"prompt", std::vector<int>(2047, 5)}, {"max_tokens", 1}};
  r = post(s, "/v1/completions", at, &status);
  EXPECT_EQ(status, 200) << r.dump();
  // Prompt + max_tokens past the context: 400 with the numbers (was 200 and 2,112 tokens).
  json past = {{"prompt", std::vector<int>(2047, 5)}, {"max_tokens", 64}};
  r = post(s, "/v1/completions", past, &status);
  EXPECT_EQ(status, 400) << r.dump();
  EXPECT_EQ(r["error"]["param"], "max_tokens");
  EXPECT_NE(r["error"]["message"].get<std::string>().find("at most 1"), std::string::npos) << r.dump();
  // Without max_tokens the default shrinks to what is left: 2,040 prompt tokens, 8 generated at most.
  json fill = {{"prompt", std::vector<int>(2040, 5)}, {"ignore_eos", true}};
  r = post(s, "/v1/completions", fill, &status);
  EXPECT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["usage"]["completion_tokens"], 8) << r.dump();
}

TEST(Serve, ApiKeyAndQueueLimit) {
  serve::ApiOptions ao;
  ao.api_key = "sekrit";
  TestServer s(test::reasoner_model(), small_opts(64 << 20, /*max_seqs=*/1, /*max_queue=*/1), ao);
  auto c = s.client();
  expect_error(c->Post("/v1/completions", R"({"prompt": "A"})", "application/json"), 401, "API key");
  expect_error(c->Get("/v1/models"), 401, "API key");
  EXPECT_EQ(c->Get("/health")->status, 200);
  c->set_bearer_token_auth("sekrit");
  auto models = c->Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "test-model");
  // One running (max_seqs 1), one waiting (max_queue 1): the third gets 429 with Retry-After.
  const std::string longreq = R"({"prompt": "AB", "max_tokens": 2000, "ignore_eos": true})";
  std::thread t1([&] {
    httplib::Client k("127.0.0.1", s.port());
    k.set_bearer_token_auth("sekrit");
    k.set_read_timeout(120, 0);
    k.Post("/v1/completions", longreq, "application/json");
  });
  for (int i = 0; i < 1000 && s.sched().gauges().sequences_running != 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::thread t2([&] {
    httplib::Client k("127.0.0.1", s.port());
    k.set_bearer_token_auth("sekrit");
    k.set_read_timeout(120, 0);
    k.Post("/v1/completions", longreq, "application/json");
  });
  for (int i = 0; i < 1000 && s.sched().gauges().requests_waiting != 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto r = c->Post("/v1/completions", R"({"prompt": "A"})", "application/json");
  expect_error(r, 429, "queue is full");
  EXPECT_EQ(r->get_header_value("Retry-After"), "1");
  t1.join();
  t2.join();
  auto m = c->Get("/metrics");
  EXPECT_EQ(serve::metric_value(m->body, "kvevict:requests_rejected_total"), 1);
}

TEST(Serve, LoadTest64ConcurrentStreamingClients) {
  TestServer s(test::reasoner_model(), small_opts(), {});
  serve::LoadOptions lo;
  lo.port = s.port();
  lo.clients = 64;
  lo.requests = 320;
  lo.time_limit_s = 120;
  lo.body = {{"prompt", "AB\nCD\n"}, {"max_tokens", 24}, {"ignore_eos", true}, {"temperature", 0.7}};
  const serve::LoadResult r = serve::run_load(lo);
  EXPECT_EQ(r.errors, 0) << (r.error_messages.empty() ? "" : r.error_messages[0]);
  EXPECT_EQ(r.ok, 320);
  EXPECT_EQ(r.output_tokens, 320 * 24);
  for (const auto& t : r.texts) EXPECT_FALSE(t.empty());
  EXPECT_GE(r.peak_sequences, 16);
  std::printf(
      "[load test] %lld requests, 64 clients, %lld errors, %.2f s, %.0f tok/s, latency p50 %.3f s p99 %.3f s, "
      "TTFT p99 %.3f s, ITL p99 %.1f ms, peak %lld sequences\n",
      static_cast<long long>(r.ok), static_cast<long long>(r.errors), r.wall_s,
      static_cast<double>(r.output_tokens) / r.wall_s, serve::quantile(r.latency_s, 0.5),
      serve::quantile(r.latency_s, 0.99), serve::quantile(r.ttft_s, 0.99), 1000 * serve::quantile(r.itl_s, 0.99),
      static_cast<long long>(r.peak_sequences));
  EXPECT_EQ(s.metric("kvevict:kv_pool_used_bytes"), 0);
}

}  // namespace
}  // namespace kvevict
