// The server's API beyond generation fields: sampling defaults (`serve --temp ...`, request
// fields override), GET /props, POST /tokenize and /detokenize (llama-server's shapes), `prompt`
// as an array (one choice per prompt × n, OpenAI's index order), warnings for what a chat
// template drops, bad roles quoted, duplicate JSON keys refused, --cors-origin checked. Expected
// values come from the tokenizer called directly, from single-prompt requests, or are written
// out by hand from the OpenAI / llama-server documentation.
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "model/chat_template.h"
#include "serve/http_transport.h"
#include "serve/request.h"
#include "serve_fixture.h"
#include "test_paths.h"

namespace kvevict {
namespace {

using json = nlohmann::json;
constexpr const char* kJson = "application/json";

json post(const TestServer& s, const std::string& path, const std::string& body, int want = 200) {
  auto r = s.client()->Post(path, body, kJson);
  EXPECT_TRUE(r);
  if (!r) return json();
  EXPECT_EQ(r->status, want) << path << " " << body << " -> " << r->body;
  return json::parse(r->body);
}

// The reasoner's tokenizer (every server here runs the reasoner) tokenises a thinking template's
// end-of-thinking text.
const Tokenizer& reasoner_tokenizer() {
  static const std::unique_ptr<Model> m = Model::load(test::reasoner_model());
  return m->tokenizer();
}

serve::ApiOptions with_template(const std::string& name) {
  serve::ApiOptions ao;
  serve::use_chat_template(ao, ChatTemplate::by_name(name), reasoner_tokenizer());
  return ao;
}

TEST(ServeApi, SamplingDefaultsApplyUnlessTheRequestGivesTheField) {
  serve::ApiOptions ao;
  ao.sampling = {0.6, 0.95, 20, 0.05};
  ao.max_tokens_limit = 64;
  const auto model = Model::load(test::reasoner_model());
  std::atomic<uint64_t> counter{0};
  auto parse = [&](const std::string& fields) {
    return serve::parse_generation_request(R"({"prompt": "AB")" + fields + "}", serve::Endpoint::Completions,
                                           model->tokenizer(), model->config().context_length, ao, counter)
        .gen.generation.sampler;
  };
  const SamplerConfig d = parse("");
  EXPECT_FLOAT_EQ(d.temperature, 0.6f);
  EXPECT_FLOAT_EQ(d.top_p, 0.95f);
  EXPECT_EQ(d.top_k, 20);
  EXPECT_FLOAT_EQ(d.min_p, 0.05f);
  const SamplerConfig o = parse(R"(, "temperature": 0, "top_p": 1, "top_k": 0, "min_p": 0)");
  EXPECT_FLOAT_EQ(o.temperature, 0.0f);
  EXPECT_FLOAT_EQ(o.top_p, 1.0f);
  EXPECT_EQ(o.top_k, 0);
  EXPECT_FLOAT_EQ(o.min_p, 0.0f);

  // Through the server: default temperature 0 is greedy, so a request without temperature and
  // seed gives the text of an explicit temperature 0.
  serve::ApiOptions greedy;
  greedy.sampling.temperature = 0;
  TestServer s(test::reasoner_model(), small_opts(), greedy);
  const json a = post(s, "/v1/completions", R"({"prompt": "AB\nBC\n?", "max_tokens": 8, "ignore_eos": true})");
  const json b = post(s, "/v1/completions",
                      R"({"prompt": "AB\nBC\n?", "max_tokens": 8, "ignore_eos": true, "temperature": 0, "seed": 9})");
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
}

TEST(ServeApi, PropsReportsContextTemplateDefaultsAndKv) {
  serve::ApiOptions ao = with_template("phi3");
  ao.sampling = {0.7, 0.9, 40, 0.05};
  ao.max_tokens_limit = 100;
  ao.policy_settings.seed = 42;
  serve::SchedulerOptions so = small_opts();
  so.kv_type = KvType::F16;
  TestServer s(test::reasoner_model(), so, ao);
  for (const char* path : {"/props", "/v1/props"}) {
    auto r = s.client()->Get(path);
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << path;
    const json p = json::parse(r->body);
    EXPECT_EQ(p["n_ctx"], s.model().config().context_length);
    EXPECT_EQ(p["max_tokens"], 100);
    EXPECT_EQ(p["chat_template"], "phi3");
    EXPECT_EQ(p["chat_template_caps"]["renders_system"], false);
    const json& g = p["default_generation_settings"]["params"];
    EXPECT_DOUBLE_EQ(g["temperature"].get<double>(), 0.7);
    EXPECT_DOUBLE_EQ(g["top_p"].get<double>(), 0.9);
    EXPECT_EQ(g["top_k"], 40);
    EXPECT_DOUBLE_EQ(g["min_p"].get<double>(), 0.05);
    EXPECT_EQ(g["seed"], 42);
    EXPECT_EQ(g["max_tokens"]["completions"], 16);
    EXPECT_EQ(g["max_tokens"]["chat"], 100);
    EXPECT_EQ(p["kv"]["type"], "f16");
    EXPECT_EQ(p["kv"]["memory_bytes"], 64 << 20);
    EXPECT_EQ(p["kv"]["policy"], "full");
  }
  EXPECT_EQ(s.client()->Post("/props", "{}", kJson)->status, 405);
}

TEST(ServeApi, PropsReportsTheDefaultPolicysSchedule) {
  // kv.round_interval is the schedule's s: r when --round-interval is not given (spec §2.3), the
  // given s otherwise, null under `full` (as budget and buffer).
  for (const auto& [interval, want] : {std::pair<std::optional<int64_t>, int64_t>{std::nullopt, 8}, {24, 24}}) {
    serve::ApiOptions ao;
    ao.policy_settings.policy = "random";
    ao.policy_settings.budget = 32;
    ao.policy_settings.recent = 8;
    ao.policy_settings.interval = interval;
    ao.policy = build_policy(ao.policy_settings, "random");
    TestServer s(test::reasoner_model(), small_opts(), ao);
    const json kv = json::parse(s.client()->Get("/props")->body)["kv"];
    EXPECT_EQ(kv["policy"], "random");
    EXPECT_EQ(kv["budget"], 32);
    EXPECT_EQ(kv["buffer"], 8);
    EXPECT_EQ(kv["round_interval"], want);
  }
  TestServer full(test::reasoner_model(), small_opts(), {});
  EXPECT_TRUE(json::parse(full.client()->Get("/props")->body)["kv"]["round_interval"].is_null());
}

TEST(ServeApi, TokenizeAndDetokenizeInLlamaServersShape) {
  TestServer s(test::reasoner_model(), small_opts(), {});
  const Tokenizer& tok = s.model().tokenizer();
  const std::string text = "AB\nBC\n? 12";
  const std::vector<int32_t> plain = tok.encode(text, false, true), bos = tok.encode(text, true, true);
  for (const char* path : {"/tokenize", "/v1/tokenize"}) {
    EXPECT_EQ(post(s, path, json{{"content", text}}.dump())["tokens"], json(plain));  // add_special false by default
    EXPECT_EQ(post(s, path, json{{"content", text}, {"add_special", true}}.dump())["tokens"], json(bos));
  }
  const json pieces = post(s, "/tokenize", json{{"content", text}, {"with_pieces", true}}.dump())["tokens"];
  ASSERT_EQ(pieces.size(), plain.size());
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(pieces[i]["id"], plain[i]);
    EXPECT_EQ(pieces[i]["piece"], tok.piece(plain[i], true));
  }
  for (const char* path : {"/detokenize", "/v1/detokenize"})
    EXPECT_EQ(post(s, path, json{{"tokens", plain}}.dump())["content"], text);
  // Bad input: 400 naming the field.
  auto param = [&](const std::string& path, const std::string& body) {
    return post(s, path, body, 400)["error"]["param"];
  };
  EXPECT_EQ(param("/tokenize", R"({"content": 5})"), "content");
  EXPECT_EQ(param("/tokenize", R"({})"), "content");
  EXPECT_EQ(param("/tokenize", R"({"content": "a", "with_pieces": "yes"})"), "with_pieces");
  EXPECT_EQ(param("/tokenize", R"({"content": "a", "contnet": "b"})"), "contnet");
  EXPECT_EQ(param("/detokenize", R"({"tokens": "12"})"), "tokens");
  const json e = post(s, "/detokenize", R"({"tokens": [1, 2, 99999]})", 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("tokens[2] = 99999"), std::string::npos) << e.dump();
  EXPECT_EQ(post(s, "/tokenize", "[1]", 400)["error"]["code"], 400);
}

TEST(ServeApi, PromptArraysGiveOneChoicePerPromptTimesNInOpenAIsOrder) {
  TestServer s(test::reasoner_model(), small_opts(), {});
  const Tokenizer& tok = s.model().tokenizer();
  const std::vector<int32_t> ids = tok.encode("BC\nCD\n?", true);
  const std::string common = R"(, "max_tokens": 6, "n": 2, "seed": 5, "temperature": 1, "ignore_eos": true})";
  const json both = post(s, "/v1/completions", R"({"prompt": ["AB\nBC\n?", )" + json(ids).dump() + "]" + common);
  const json first = post(s, "/v1/completions", R"({"prompt": "AB\nBC\n?")" + common);
  const json second = post(s, "/v1/completions", R"({"prompt": )" + json(ids).dump() + common);
  ASSERT_EQ(both["choices"].size(), 4u) << both.dump();
  // OpenAI's order: prompt-major, then the n choices of each; each as its own request would be.
  for (size_t c = 0; c < 2; ++c) {
    EXPECT_EQ(both["choices"][c]["index"], c);
    EXPECT_EQ(both["choices"][c]["text"], first["choices"][c]["text"]);
    EXPECT_EQ(both["choices"][2 + c]["index"], 2 + c);
    EXPECT_EQ(both["choices"][2 + c]["text"], second["choices"][c]["text"]);
  }
  EXPECT_EQ(both["usage"]["prompt_tokens"],
            first["usage"]["prompt_tokens"].get<int>() + second["usage"]["prompt_tokens"].get<int>());
  EXPECT_EQ(both["usage"]["completion_tokens"], 24);
  // An array of token-id arrays, streamed: the indices 0..3 each end once.
  auto r = s.client()->Post("/v1/completions",
                            R"({"prompt": [)" + json(ids).dump() + "," + json(ids).dump() + R"(], "stream": true)" +
                                common,
                            kJson);
  ASSERT_TRUE(r && r->status == 200);
  std::vector<int> ends(4, 0);
  size_t at = 0;
  while ((at = r->body.find("data: {", at)) != std::string::npos) {
    const size_t end = r->body.find("\n\n", at);
    const json ev = json::parse(r->body.substr(at + 6, end - at - 6));
    for (const json& ch : ev["choices"])
      if (!ch["finish_reason"].is_null()) ends.at(ch["index"].get<size_t>()) += 1;
    at = end;
  }
  EXPECT_EQ(ends, std::vector<int>(4, 1));
  // Bad prompts: 400 naming the prompt's index and the token's.
  const int V = tok.n_vocab();
  auto message = [&](const std::string& prompt) {
    return post(s, "/v1/completions", R"({"prompt": )" + prompt + "}", 400)["error"]["message"].get<std::string>();
  };
  EXPECT_EQ(message("[[1, 2], [3, " + std::to_string(V) + "]]"),
            "prompt[1]: token 1 = " + std::to_string(V) + ": must be a token id in [0, " + std::to_string(V) + ")");
  EXPECT_EQ(message(R"(["AB", ""])"), "prompt[1]: must not be empty");
  EXPECT_EQ(message(R"(["AB", 5])"), "prompt[1]: 5: must be a string or an array of token ids");
  EXPECT_EQ(message(R"(["AB", []])"), "prompt[1]: must not be empty");
  EXPECT_NE(message("[]").find("prompt: must be"), std::string::npos);
  json many = json::array();
  for (int i = 0; i <= serve::kMaxPrompts; ++i) many.push_back("A");
  EXPECT_NE(message(many.dump()).find("more than the 64"), std::string::npos);
  // max_tokens past the context names the longest prompt.
  const std::string longp = json(std::vector<int32_t>(2000, 5)).dump();
  const json e = post(s, "/v1/completions", R"({"prompt": ["A", )" + longp + R"(], "max_tokens": 100})", 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("prompt[1]'s 2000 tokens"), std::string::npos) << e.dump();
}

TEST(ServeApi, DroppedSystemMessageAndUselessThinkingSwitchAreWarned) {
  // phi3 (Phi-3-mini's template) renders no system message; chatml has no thinking switch.
  TestServer phi(test::reasoner_model(), small_opts(), with_template("phi3"));
  const std::string sys = R"({"role": "system", "content": "You answer in French. Always. Every time."})";
  const std::string user = R"({"role": "user", "content": "AB"})";
  testing::internal::CaptureStderr();
  const json with = post(phi, "/v1/chat/completions", R"({"max_tokens": 2, "messages": [)" + sys + "," + user + "]}");
  const std::string log = testing::internal::GetCapturedStderr();
  const json without = post(phi, "/v1/chat/completions", R"({"max_tokens": 2, "messages": [)" + user + "]}");
  ASSERT_EQ(with["warnings"].size(), 1u) << with.dump();
  EXPECT_NE(with["warnings"][0].get<std::string>().find("system message was dropped"), std::string::npos);
  EXPECT_NE(log.find("warning: the system message was dropped"), std::string::npos) << log;
  EXPECT_NE(log.find(with["id"].get<std::string>()), std::string::npos) << log;
  EXPECT_FALSE(without.contains("warnings"));
  // Dropped indeed: the same prompt tokens either way.
  EXPECT_EQ(with["usage"]["prompt_tokens"], without["usage"]["prompt_tokens"]);
  // Streamed: the first event carries it.
  auto r = phi.client()->Post("/v1/chat/completions",
                              R"({"max_tokens": 2, "stream": true, "messages": [)" + sys + "," + user + "]}", kJson);
  ASSERT_TRUE(r);
  const size_t at = r->body.find("data: ");
  const json first = json::parse(r->body.substr(at + 6, r->body.find("\n\n") - at - 6));
  EXPECT_EQ(first["warnings"], with["warnings"]);

  // chatml renders the system message (no warning) and has no thinking switch (a warning).
  TestServer chatml(test::reasoner_model(), small_opts(), with_template("chatml"));
  const json c = post(chatml, "/v1/chat/completions",
                      R"({"max_tokens": 2, "chat_template_kwargs": {"enable_thinking": false}, "messages": [)" + sys +
                          "," + user + "]}");
  ASSERT_EQ(c["warnings"].size(), 1u) << c.dump();
  EXPECT_NE(c["warnings"][0].get<std::string>().find("enable_thinking has no effect"), std::string::npos);
  // qwen3 has the switch: no warning.
  TestServer qwen(test::reasoner_model(), small_opts(), with_template("qwen3"));
  const json q = post(qwen, "/v1/chat/completions",
                      R"({"max_tokens": 2, "chat_template_kwargs": {"enable_thinking": false}, "messages": [)" + sys +
                          "," + user + "]}");
  EXPECT_FALSE(q.contains("warnings")) << q.dump();
  // ... but a thinking budget with thinking switched off bounds nothing: a warning (was silent).
  const json qb = post(qwen, "/v1/chat/completions",
                       R"({"max_tokens": 2, "thinking_token_budget": 3, "chat_template_kwargs": {"enable_thinking": false}, "messages": [)" +
                           user + "]}");
  ASSERT_EQ(qb["warnings"].size(), 1u) << qb.dump();
  EXPECT_NE(qb["warnings"][0].get<std::string>().find("thinking_token_budget has no effect"), std::string::npos);
  // A message's name / an assistant's reasoning_content are rendered by no template: warned.
  const json named = post(chatml, "/v1/chat/completions",
                          R"({"max_tokens": 2, "messages": [{"role": "user", "content": "AB", "name": "ann"},
                              {"role": "assistant", "content": "B", "reasoning_content": "x"}, )" + user + "]}");
  ASSERT_EQ(named["warnings"].size(), 2u) << named.dump();
  EXPECT_NE(named["warnings"][0].get<std::string>().find("messages[0].name was not rendered"), std::string::npos);
  // Any other key in a message or in stream_options is a 400 naming it (were accepted silently).
  const json unknown = post(chatml, "/v1/chat/completions",
                            R"({"messages": [{"role": "user", "content": "AB", "bogus": 1}]})", 400);
  EXPECT_NE(unknown["error"]["message"].get<std::string>().find("messages[0]: unknown key \"bogus\""), std::string::npos)
      << unknown.dump();
  const json tools = post(chatml, "/v1/chat/completions",
                          R"({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "1"}]}, )" + user + "]}", 400);
  EXPECT_NE(tools["error"]["message"].get<std::string>().find("tool calls are not supported"), std::string::npos);
  const json so = post(chatml, "/v1/chat/completions",
                       R"({"stream": true, "stream_options": {"bogus": true}, "messages": [)" + user + "]}", 400);
  EXPECT_NE(so["error"]["message"].get<std::string>().find("unknown key \"bogus\""), std::string::npos) << so.dump();
  // A bad role is quoted (its first 64 bytes), with the message's index.
  const json bad = post(chatml, "/v1/chat/completions",
                        R"({"messages": [)" + user + R"(, {"role": ")" + std::string(200, 'x') +
                            R"(", "content": "a"}]})",
                        400);
  EXPECT_EQ(bad["error"]["message"], "messages: messages[1]: role \"" + std::string(63, 'x') +
                                         "... is not one of system, user, assistant, developer, tool");
}

TEST(ServeApi, SpecialTokenTextInACompletionsPromptIsTheSpecialToken) {
  // The reproducer: "<|im_end|>" in a completions prompt was read as 6 plain-text tokens, where
  // /tokenize (parse_special: true), llama-server and vLLM give the one special token.
  TestServer s(test::shared_path("models/tiny-random/tiny-random-qwen3-f16.gguf"), small_opts(), {});
  const json t = post(s, "/tokenize", R"({"content": "<|im_end|>"})");
  ASSERT_EQ(t["tokens"].size(), 1u) << t.dump();
  const json r = post(s, "/v1/completions", R"({"prompt": "<|im_end|>", "max_tokens": 1})");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 1) << r.dump();  // no BOS on this file, and the one special token
}

TEST(ServeApi, APoolTooSmallForThePromptSaysThePromptSetsTheSize) {
  // The reproducer: a 1,500-token prompt at kv_budget 64 was told to "lower kv_budget", which
  // cannot help: the prompt is held whole until the first eviction round.
  TestServer s(test::reasoner_model(), small_opts(/*pool=*/256 << 10), {});
  json body = {{"prompt", std::vector<int>(1500, 5)}, {"max_tokens", 2}, {"n", 4},
               {"kv_policy", "random-unprotected"}, {"kv_budget", 64}, {"kv_buffer", 8}};
  const json r = post(s, "/v1/completions", body.dump(), 400);
  EXPECT_EQ(r["error"]["param"], "prompt") << r.dump();
  EXPECT_NE(r["error"]["message"].get<std::string>().find("held whole until the first eviction round"), std::string::npos)
      << r.dump();
  // A short prompt: the budget sets the size, and the advice names it.
  body["prompt"] = "AB";
  body["kv_budget"] = 4000;
  body["kv_buffer"] = 64;
  const json b = post(s, "/v1/completions", body.dump(), 400);
  EXPECT_EQ(b["error"]["param"], "kv_budget") << b.dump();
}

TEST(ServeApi, DuplicateKeysAreA400NamingTheKey) {
  TestServer s(test::reasoner_model(), small_opts(), with_template("chatml"));
  json e = post(s, "/v1/completions", R"({"prompt": "A", "max_tokens": 2, "max_tokens": 3})", 400);
  EXPECT_EQ(e["error"]["param"], "max_tokens");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("repeats the key \"max_tokens\""), std::string::npos);
  e = post(s, "/v1/completions", R"({"prompt": "A", "logit_bias": {"5": 1, "6": 2, "5": 3}})", 400);
  EXPECT_EQ(e["error"]["param"], "5");
  // The same key in different objects is fine.
  post(s, "/v1/chat/completions",
       R"({"max_tokens": 1, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},)"
       R"( {"role": "user", "content": "c"}]})");
}

TEST(ServeApi, CorsOriginsAreCheckedAtStartUp) {
  // RFC 6454 §6.2: scheme "://" host [":" port]; what a browser's Origin header can hold.
  for (const char* ok : {"*", "http://localhost:3000", "https://example.com", "http://127.0.0.1", "http://[::1]:8080",
                         "chrome-extension://abcdef"})
    EXPECT_TRUE(serve::valid_cors_origin(ok)) << ok;
  for (const char* bad : {"", "localhost:3000", "http://example.com/", "http://example.com/app", "http://",
                          "http://host:", "http://host:99999", "http://host:8a", "://host", "http://ho st",
                          "http://[::1"})
    EXPECT_FALSE(serve::valid_cors_origin(bad)) << bad;
  EXPECT_THROW(serve::check_cors_origins({"*", "http://example.com/"}), Error);
  serve::ApiOptions ao;
  ao.cors_origins = {"example.com"};
  const auto model = Model::load(test::reasoner_model());
  serve::Scheduler sched(*model, small_opts());
  ao.max_tokens_limit = 16;
  EXPECT_THROW(serve::ApiServer(sched, ao), Error);
  sched.shutdown(std::chrono::milliseconds(0));
}

TEST(ServeApi, FullPlusPromptIsRefused) {
  TestServer s(test::reasoner_model(), small_opts(), {});
  const json e = post(s, "/v1/completions", R"({"prompt": "A", "kv_policy": "full+prompt"})", 400);
  EXPECT_EQ(e["error"]["param"], "kv_policy");
  EXPECT_NE(e["error"]["message"].get<std::string>().find("keeps every token"), std::string::npos) << e.dump();
}

}  // namespace
}  // namespace kvevict
