// Chat replies' thinking traces over HTTP: message.reasoning_content / delta.reasoning_content
// (vLLM's reasoning parsers, llama-server's --reasoning-format deepseek), the thinking budget
// (llama-server's --reasoning-budget, vLLM's thinking_token_budget) and
// usage.completion_tokens_details.reasoning_tokens, on the tiny-random Qwen3 GGUF with its own
// chat template (and the deepseek-r1 / chatml templates by name). The weights are random, so the
// tests steer the tokens: greedy decoding, a logit bias on "<think>", and references taken from
// the same server with the split switched off (reasoning_format "none": the raw text) or from
// /v1/completions on the rendered prompt (the greedy tokens before the budget bites). Expected
// token counts come from the model's tokenizer encoding the template's end-of-thinking text.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "model/chat_template.h"
#include "serve_fixture.h"
#include "test_paths.h"

namespace kvevict {
namespace {

using json = nlohmann::json;

std::string qwen3_path() { return test::shared_path("models/tiny-random/tiny-random-qwen3-f16.gguf"); }

// A server on the tiny Qwen3 with chat template `name` ("" = the GGUF's own).
struct ChatServer {
  std::unique_ptr<Model> model;  // the test's own copy: tokenizer and template for references
  std::unique_ptr<TestServer> server;
  explicit ChatServer(const std::string& name) {
    model = Model::load(qwen3_path());
    const ChatTemplate chat =
        ChatTemplate::from_text(model->chat_template(), model->path(), model->chat_template_key(), name);
    serve::ApiOptions ao;
    serve::use_chat_template(ao, chat, model->tokenizer());
    server = std::make_unique<TestServer>(qwen3_path(), small_opts(), ao);
  }
  int32_t token(const std::string& text) const {
    const auto ids = model->tokenizer().encode(text, false, true);
    EXPECT_EQ(ids.size(), 1u) << text;
    return ids.at(0);
  }
  int64_t count(const std::string& text) const {
    return static_cast<int64_t>(model->tokenizer().encode(text, false, true).size());
  }
  json post(const std::string& path, const json& body, int* status = nullptr) const {
    auto r = server->client()->Post(path, body.dump(), "application/json");
    if (!r) return json{{"transport_error", httplib::to_string(r.error())}};
    if (status) *status = r->status;
    return json::parse(r->body, nullptr, false);
  }
};

// A streamed chat reply: the deltas concatenated.
struct ChatStream {
  std::string reasoning, content;
  bool saw_reasoning = false, done = false;
  json usage;
};

ChatStream post_chat_stream(int port, json body) {
  ChatStream out;
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(60, 0);
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  std::string buf;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    buf.append(d, n);
    size_t pos;
    while ((pos = buf.find("\n\n")) != std::string::npos) {
      const std::string ev = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      if (ev == "data: [DONE]") out.done = true;
      if (ev.rfind("data: {", 0) != 0) continue;
      const json j = json::parse(ev.substr(6));
      if (j.contains("usage")) out.usage = j["usage"];
      for (const json& ch : j.value("choices", json::array())) {
        const json& delta = ch["delta"];
        if (delta.contains("reasoning_content")) {
          out.saw_reasoning = true;
          out.reasoning += delta["reasoning_content"].get<std::string>();
        }
        if (delta.contains("content")) out.content += delta["content"].get<std::string>();
      }
    }
    return true;
  };
  auto r = c.send(req);
  EXPECT_TRUE(r && r->status == 200);
  return out;
}

std::string repeat(const std::string& s, int64_t n) {
  std::string out;
  for (int64_t i = 0; i < n; ++i) out += s;
  return out;
}

const json kHi = json::array({{{"role", "user"}, {"content", "Hi"}}});

TEST(ServeReasoning, Qwen3TraceTheModelOpensIsSplitBoundedAndCounted) {
  if (!std::filesystem::exists(qwen3_path())) GTEST_SKIP() << "missing " << qwen3_path();
  ChatServer cs("");  // the GGUF's Qwen3 template: the model writes "<think>" itself
  const int32_t think = cs.token("<think>");
  const int64_t close_len = cs.count("\n</think>\n\n");
  // Greedy with "<think>" at +100: the reply is "<think>" repeated, so where the budget closes the
  // trace is plain to see. Budget 2: "<think>" opens, two more are the trace, then the close.
  json body = {{"messages", kHi},           {"temperature", 0},
               {"max_tokens", 10},          {"logit_bias", {{std::to_string(think), 100}}},
               {"thinking_token_budget", 2}};
  const std::string raw = repeat("<think>", 3) + "\n</think>\n\n" + repeat("<think>", 10 - 3 - close_len);

  json none = body;
  none["reasoning_format"] = "none";
  int status = 0;
  json r = cs.post("/v1/chat/completions", none, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["content"], raw);
  EXPECT_FALSE(r["choices"][0]["message"].contains("reasoning_content"));

  r = cs.post("/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  const json& msg = r["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "<think><think>\n");
  EXPECT_EQ(msg["content"], "\n\n" + repeat("<think>", 10 - 3 - close_len));
  EXPECT_EQ(r["usage"]["completion_tokens"], 10);
  // "<think>", 2 trace tokens, then the end-of-thinking tokens up to and including "</think>".
  EXPECT_EQ(r["usage"]["completion_tokens_details"]["reasoning_tokens"], 3 + cs.count("\n</think>"));

  const ChatStream st = post_chat_stream(cs.server->port(), body);
  EXPECT_TRUE(st.done);
  EXPECT_EQ(st.reasoning, msg["reasoning_content"]);
  EXPECT_EQ(st.content, msg["content"]);
  EXPECT_EQ(st.usage["completion_tokens_details"], r["usage"]["completion_tokens_details"]);

  // Without the bias the random model does not open a trace: all content, no reasoning_content.
  json plain = {{"messages", kHi}, {"temperature", 0}, {"max_tokens", 8}};
  r = cs.post("/v1/chat/completions", plain, &status);
  ASSERT_EQ(status, 200) << r.dump();
  plain["reasoning_format"] = "none";
  const json raw_plain = cs.post("/v1/chat/completions", plain);
  ASSERT_NE(raw_plain["choices"][0]["message"]["content"].get<std::string>().rfind("<think>", 0), 0u);
  EXPECT_EQ(r["choices"][0]["message"]["content"], raw_plain["choices"][0]["message"]["content"]);
  EXPECT_FALSE(r["choices"][0]["message"].contains("reasoning_content"));
  EXPECT_EQ(r["usage"]["completion_tokens_details"]["reasoning_tokens"], 0);
}

TEST(ServeReasoning, R1TemplateOpensTheTraceAndTheBudgetKeepsTheGreedyPrefix) {
  if (!std::filesystem::exists(qwen3_path())) GTEST_SKIP() << "missing " << qwen3_path();
  ChatServer cs("deepseek-r1");  // the generation prompt ends with "<think>\n"
  const ChatTemplate r1 = ChatTemplate::by_name("deepseek-r1");
  const std::string prompt = r1.render({{"user", "Hi"}}, ChatOptions{});
  ASSERT_TRUE(r1.opens_thinking());
  const auto ids = cs.model->tokenizer().encode(prompt, !r1.renders_bos(), true);
  // Reference: the first 4 greedy tokens of the same prompt, through /v1/completions.
  json ref = cs.post("/v1/completions", {{"prompt", ids}, {"max_tokens", 4}, {"temperature", 0}, {"ignore_eos", true}});
  const std::string first4 = ref["choices"][0]["text"];
  ASSERT_EQ(first4.find("</think>"), std::string::npos);
  json body = {{"messages", kHi},      {"temperature", 0}, {"max_tokens", 14},
               {"ignore_eos", true},   {"thinking_token_budget", 4}};
  int status = 0;
  json r = cs.post("/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  const json& msg = r["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], first4 + "\n");
  ASSERT_EQ(msg["content"].get<std::string>().rfind("\n\n", 0), 0u) << msg.dump();
  EXPECT_EQ(r["usage"]["completion_tokens_details"]["reasoning_tokens"], 4 + cs.count("\n</think>"));
  json none = body;
  none["reasoning_format"] = "none";
  EXPECT_EQ(cs.post("/v1/chat/completions", none)["choices"][0]["message"]["content"],
            first4 + "\n</think>" + msg["content"].get<std::string>());
  const ChatStream st = post_chat_stream(cs.server->port(), body);
  EXPECT_EQ(st.reasoning, msg["reasoning_content"]);
  EXPECT_EQ(st.content, msg["content"]);

  // No budget: the trace never closes, so all of it is reasoning and every token counts.
  body.erase("thinking_token_budget");
  r = cs.post("/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["content"], "");
  EXPECT_EQ(r["choices"][0]["message"]["reasoning_content"].get<std::string>().rfind(first4, 0), 0u);
  EXPECT_EQ(r["usage"]["completion_tokens_details"]["reasoning_tokens"], 14);
  const ChatStream st2 = post_chat_stream(cs.server->port(), body);
  EXPECT_EQ(st2.reasoning, r["choices"][0]["message"]["reasoning_content"]);
  EXPECT_TRUE(st2.content.empty());
}

TEST(ServeReasoning, TemplateWithoutThinkingHasNoReasoningContentAndRefusesABudget) {
  if (!std::filesystem::exists(qwen3_path())) GTEST_SKIP() << "missing " << qwen3_path();
  ChatServer cs("chatml");
  const int32_t think = cs.token("<think>");
  json body = {{"messages", kHi}, {"temperature", 0}, {"max_tokens", 4}, {"logit_bias", {{std::to_string(think), 100}}}};
  int status = 0;
  json r = cs.post("/v1/chat/completions", body, &status);
  ASSERT_EQ(status, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["content"], repeat("<think>", 4));
  EXPECT_FALSE(r["choices"][0]["message"].contains("reasoning_content"));
  EXPECT_EQ(r["usage"]["completion_tokens_details"]["reasoning_tokens"], 0);
  const ChatStream st = post_chat_stream(cs.server->port(), body);
  EXPECT_FALSE(st.saw_reasoning);
  EXPECT_EQ(st.content, repeat("<think>", 4));

  body["thinking_token_budget"] = 2;
  r = cs.post("/v1/chat/completions", body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(r["error"]["param"], "thinking_token_budget") << r.dump();
  body.erase("thinking_token_budget");
  body["reasoning_format"] = "parsed";
  r = cs.post("/v1/chat/completions", body, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(r["error"]["param"], "reasoning_format") << r.dump();
  // The fields belong to chat: /v1/completions refuses them by name.
  r = cs.post("/v1/completions", {{"prompt", "Hi"}, {"reasoning_format", "none"}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(r["error"]["param"], "reasoning_format") << r.dump();
}

}  // namespace
}  // namespace kvevict
