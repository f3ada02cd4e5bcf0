// `logprobs` / `top_logprobs` in the server's answers (OpenAI's shapes: completions' legacy
// {tokens, token_logprobs, top_logprobs, text_offset}; chat's choices[].logprobs.content[]),
// plain and streamed. Reference: the test runs the model itself (Engine, full cache, the
// row-exact prefill_chunk the server's scheduler uses, then one decode per token), takes the
// greedy token as the argmax of those logits and computes log-softmax in double here, so neither
// the token choice nor the numbers come from the sampler or the response code under test.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "eviction/registry.h"
#include "model/chat_template.h"
#include "serve_fixture.h"
#include "test_paths.h"

namespace kvevict {
namespace {

using json = nlohmann::json;
constexpr const char* kJson = "application/json";
constexpr double kTol = 1e-5;  // the brief's margin: float logits, log-softmax in double

// Per step of greedy decoding from `prompt`: the log-softmax of the model's logits (double).
struct RefStep {
  int32_t token = -1;          // argmax
  std::vector<double> logp;    // [n_vocab]
  std::vector<int32_t> order;  // token ids by decreasing logit (stable: lower id first)
};

std::vector<RefStep> reference(const Model& m, const std::vector<int32_t>& prompt, int steps,
                               int32_t biased = -1) {
  Engine engine(m, 1);
  auto seq = engine.new_sequence(0, make_policy("full"), {}, static_cast<int64_t>(prompt.size()), steps);
  std::vector<float> logits;
  engine.prefill_chunk(*seq, prompt, logits);
  std::vector<RefStep> out;
  for (int s = 0; s < steps; ++s) {
    RefStep r;
    const double mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (const float x : logits) sum += std::exp(static_cast<double>(x) - mx);
    const double lse = mx + std::log(sum);
    for (const float x : logits) r.logp.push_back(static_cast<double>(x) - lse);
    r.order.resize(logits.size());
    std::iota(r.order.begin(), r.order.end(), 0);
    std::stable_sort(r.order.begin(), r.order.end(),
                     [&](int32_t a, int32_t b) { return logits[static_cast<size_t>(a)] > logits[static_cast<size_t>(b)]; });
    // The greedy token: the argmax of the logits, with -100 added to `biased`'s (logit_bias).
    r.token = r.order[0];
    if (r.token == biased) {
      const float alt = logits[static_cast<size_t>(r.order[1])];
      if (logits[static_cast<size_t>(biased)] - 100.0f < alt) r.token = r.order[1];
    }
    out.push_back(r);
    if (s + 1 < steps) engine.decode(*seq, r.token, logits);
  }
  return out;
}

struct LogprobsServer : ::testing::Test {
  static serve::ApiOptions chat_opts() {
    serve::ApiOptions ao;
    static const std::unique_ptr<Model> m = Model::load(test::reasoner_model());  // its tokenizer
    serve::use_chat_template(ao, ChatTemplate::by_name("chatml"), m->tokenizer());
    return ao;
  }
  TestServer srv{test::reasoner_model(), small_opts(), chat_opts()};
  const Tokenizer& tok() const { return srv.model().tokenizer(); }
  json post(const std::string& path, const std::string& body, int want = 200) {
    auto r = srv.client()->Post(path, body, kJson);
    EXPECT_TRUE(r);
    if (!r) return json();
    EXPECT_EQ(r->status, want) << r->body;
    return json::parse(r->body);
  }
  // The `data:` objects of a streamed answer.
  std::vector<json> stream(const std::string& path, const std::string& body) {
    auto r = srv.client()->Post(path, body, kJson);
    EXPECT_TRUE(r && r->status == 200);
    std::vector<json> out;
    if (!r) return out;
    size_t at = 0;
    while ((at = r->body.find("data: ", at)) != std::string::npos) {
      const size_t end = r->body.find("\n\n", at);
      const std::string d = r->body.substr(at + 6, end - at - 6);
      if (d != "[DONE]") out.push_back(json::parse(d));
      at = end;
    }
    return out;
  }
};

const std::string kPrompt = "AB\nBC\n?";

TEST_F(LogprobsServer, CompletionsLogprobsEqualTheModelsLogSoftmax) {
  const int steps = 6, top = 3;
  const json r = post("/v1/completions", R"({"prompt": )" + json(kPrompt).dump() +
                                             R"(, "max_tokens": 6, "temperature": 0, "ignore_eos": true, "logprobs": 3})");
  const std::vector<RefStep> ref = reference(srv.model(), tok().encode(kPrompt, true), steps);
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), static_cast<size_t>(steps)) << r.dump();
  size_t offset = 0;
  for (int s = 0; s < steps; ++s) {
    const RefStep& f = ref[static_cast<size_t>(s)];
    const std::string piece = tok().piece(f.token, true);
    EXPECT_EQ(lp["tokens"][s], piece) << "step " << s;
    EXPECT_NEAR(lp["token_logprobs"][s].get<double>(), f.logp[static_cast<size_t>(f.token)], kTol) << "step " << s;
    EXPECT_EQ(lp["text_offset"][s].get<size_t>(), offset);
    // Characters of the output text (a special token adds none): code-point starts of its piece.
    for (const unsigned char b : tok().piece(f.token)) offset += (b < 0x80 || b >= 0xC0);
    // top_logprobs: the 3 most likely tokens, and the sampled one (here the most likely).
    const json& t = lp["top_logprobs"][s];
    EXPECT_EQ(t.size(), static_cast<size_t>(top)) << t.dump();
    for (int k = 0; k < top; ++k) {
      const int32_t id = f.order[static_cast<size_t>(k)];
      ASSERT_TRUE(t.contains(tok().piece(id, true))) << "step " << s << " rank " << k << ": " << t.dump();
      EXPECT_NEAR(t[tok().piece(id, true)].get<double>(), f.logp[static_cast<size_t>(id)], kTol);
    }
  }
  EXPECT_EQ(r["choices"][0]["text"], tok().decode(std::vector<int32_t>{ref[0].token, ref[1].token, ref[2].token,
                                                                       ref[3].token, ref[4].token, ref[5].token}));
}

TEST_F(LogprobsServer, ChatLogprobsHaveOpenAIsShapeAndTheModelsValues) {
  const int steps = 5, top = 2;
  const std::string msgs = R"("messages": [{"role": "user", "content": "AB"}])";
  const json r = post("/v1/chat/completions", "{" + msgs +
                                                  R"(, "max_tokens": 5, "temperature": 0, "ignore_eos": true,)"
                                                  R"( "logprobs": true, "top_logprobs": 2})");
  const ChatTemplate chat = ChatTemplate::by_name("chatml");
  const std::vector<int32_t> prompt = tok().encode(chat.render({{"user", "AB"}}, {}), !chat.renders_bos(), true);
  const std::vector<RefStep> ref = reference(srv.model(), prompt, steps);
  const json& content = r["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), static_cast<size_t>(steps)) << r.dump();
  EXPECT_TRUE(r["choices"][0]["logprobs"]["refusal"].is_null());
  for (int s = 0; s < steps; ++s) {
    const RefStep& f = ref[static_cast<size_t>(s)];
    const json& c = content[s];
    const std::string piece = tok().piece(f.token, true);
    EXPECT_EQ(c["token"], piece);
    EXPECT_NEAR(c["logprob"].get<double>(), f.logp[static_cast<size_t>(f.token)], kTol);
    EXPECT_EQ(c["bytes"], json(std::vector<int>(piece.begin(), piece.end())));
    ASSERT_EQ(c["top_logprobs"].size(), static_cast<size_t>(top));
    for (int k = 0; k < top; ++k) {
      const int32_t id = f.order[static_cast<size_t>(k)];
      EXPECT_EQ(c["top_logprobs"][k]["token"], tok().piece(id, true)) << "step " << s << " rank " << k;
      EXPECT_NEAR(c["top_logprobs"][k]["logprob"].get<double>(), f.logp[static_cast<size_t>(id)], kTol);
    }
  }
  // Without logprobs: null, as OpenAI.
  const json plain = post("/v1/chat/completions", "{" + msgs + R"(, "max_tokens": 2})");
  EXPECT_TRUE(plain["choices"][0]["logprobs"].is_null());
}

TEST_F(LogprobsServer, StreamedLogprobsAddUpToTheUnstreamedOnes) {
  const std::string body = R"({"prompt": "AB\nBC\n?", "max_tokens": 8, "temperature": 0, "ignore_eos": true,)"
                           R"( "logprobs": 2)";
  const json whole = post("/v1/completions", body + "}")["choices"][0]["logprobs"];
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (const json& ev : stream("/v1/completions", body + R"(, "stream": true})"))
    for (const json& ch : ev["choices"])
      if (!ch["logprobs"].is_null())
        for (size_t k = 0; k < ch["logprobs"]["tokens"].size(); ++k) {
          tokens.push_back(ch["logprobs"]["tokens"][k]);
          values.push_back(ch["logprobs"]["token_logprobs"][k]);
          tops.push_back(ch["logprobs"]["top_logprobs"][k]);
          offsets.push_back(ch["logprobs"]["text_offset"][k]);
        }
  EXPECT_EQ(tokens, whole["tokens"]);
  EXPECT_EQ(values, whole["token_logprobs"]);
  EXPECT_EQ(tops, whole["top_logprobs"]);
  EXPECT_EQ(offsets, whole["text_offset"]);

  const std::string cbody = R"({"messages": [{"role": "user", "content": "AB"}], "max_tokens": 6, "temperature": 0,)"
                            R"( "ignore_eos": true, "logprobs": true, "top_logprobs": 1)";
  const json cwhole = post("/v1/chat/completions", cbody + "}")["choices"][0]["logprobs"]["content"];
  json content = json::array();
  for (const json& ev : stream("/v1/chat/completions", cbody + R"(, "stream": true})"))
    for (const json& ch : ev["choices"])
      if (!ch["logprobs"].is_null())
        for (const json& c : ch["logprobs"]["content"]) content.push_back(c);
  EXPECT_EQ(content, cwhole);
  EXPECT_EQ(content.size(), 6u);
}

TEST_F(LogprobsServer, LogitBiasMinus100OnTheGreedyTokenChangesItAndLogprobsStayTheModels) {
  const std::vector<RefStep> plain = reference(srv.model(), tok().encode(kPrompt, true), 1);
  const int32_t t0 = plain[0].token;
  const json r = post("/v1/completions", R"({"prompt": "AB\nBC\n?", "max_tokens": 3, "temperature": 0,)"
                                         R"( "ignore_eos": true, "logprobs": 1, "logit_bias": {")" +
                                             std::to_string(t0) + R"(": -100}})");
  const std::vector<RefStep> ref = reference(srv.model(), tok().encode(kPrompt, true), 3, t0);
  const json& lp = r["choices"][0]["logprobs"];
  ASSERT_NE(ref[0].token, t0);
  EXPECT_EQ(lp["tokens"][0], tok().piece(ref[0].token, true));
  // Log-probabilities are the model's (before the bias), as OpenAI's and vLLM's.
  EXPECT_NEAR(lp["token_logprobs"][0].get<double>(), ref[0].logp[static_cast<size_t>(ref[0].token)], kTol);
  for (int s = 1; s < 3; ++s)
    EXPECT_NEAR(lp["token_logprobs"][s].get<double>(), ref[static_cast<size_t>(s)].logp[static_cast<size_t>(ref[static_cast<size_t>(s)].token)],
                kTol);
}

TEST_F(LogprobsServer, OutOfRangeOrMisplacedLogprobsAreA400NamingTheField) {
  auto param = [&](const std::string& path, const std::string& body) {
    return post(path, body, 400)["error"]["param"].get<std::string>();
  };
  const std::string c = "/v1/completions", ch = "/v1/chat/completions";
  const std::string m = R"("messages": [{"role": "user", "content": "AB"}])";
  EXPECT_EQ(param(c, R"({"prompt": "A", "logprobs": 21})"), "logprobs");
  EXPECT_EQ(param(c, R"({"prompt": "A", "logprobs": -1})"), "logprobs");
  EXPECT_EQ(param(c, R"({"prompt": "A", "logprobs": true})"), "logprobs");
  EXPECT_EQ(param(c, R"({"prompt": "A", "top_logprobs": 2})"), "top_logprobs");
  EXPECT_EQ(param(ch, "{" + m + R"(, "logprobs": true, "top_logprobs": 21})"), "top_logprobs");
  EXPECT_EQ(param(ch, "{" + m + R"(, "top_logprobs": 2})"), "top_logprobs");
  EXPECT_EQ(param(ch, "{" + m + R"(, "logprobs": 3})"), "logprobs");
  // The edges are accepted.
  post(c, R"({"prompt": "A", "max_tokens": 1, "logprobs": 20})");
  post(ch, "{" + m + R"(, "max_tokens": 1, "logprobs": true, "top_logprobs": 20})");
  post(c, R"({"prompt": "A", "max_tokens": 1, "logprobs": false})");
}


// The reproducer: text_offset counted UTF-8 bytes, so a Python client's text[offset:] missed the
// token after the first multi-byte character. On the tiny random Qwen3 (its greedy text after "The" mixes Cyrillic, CJK and ASCII
// characters) every offset must index the text decoded to code points.
std::u32string decode_utf8(const std::string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    char32_t c = n == 1 ? b : b & (0x7F >> n);
    for (int k = 1; k < n && i + k < s.size(); ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(c);
    i += static_cast<size_t>(n);
  }
  return out;
}

TEST(ServeLogprobsText, TextOffsetsCountCharactersNotBytes) {
  TestServer srv(test::shared_path("models/tiny-random/tiny-random-qwen3-f16.gguf"), small_opts(), {});
  auto r = srv.client()->Post("/v1/completions",
                              R"({"prompt": "The", "max_tokens": 12, "temperature": 0, "logprobs": 0})", "application/json");
  ASSERT_TRUE(r && r->status == 200) << (r ? r->body : "no answer");
  const json j = json::parse(r->body);
  const std::string text = j["choices"][0]["text"];
  const std::u32string text32 = decode_utf8(text);
  ASSERT_GT(text.size(), text32.size()) << "the greedy text has no multi-byte character: the test shows nothing";
  const json& lp = j["choices"][0]["logprobs"];
  int checked = 0;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    const std::string piece = lp["tokens"][i];
    const std::u32string piece32 = decode_utf8(piece);
    const size_t off = lp["text_offset"][i];
    ASSERT_LE(off, text32.size());
    EXPECT_EQ(text32.substr(off, piece32.size()), piece32) << "token " << i << " at offset " << off;
    ++checked;
  }
  EXPECT_EQ(checked, 12);
}

}  // namespace
}  // namespace kvevict
