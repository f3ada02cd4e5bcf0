// Chat templates: each tiny-random GGUF's own `tokenizer.chat_template` text is rendered by the
// Python jinja2 package (tests/chat_template_jinja.py, the independent reference) for several
// conversations and compared with ChatTemplate::render; the reference JSON's
// `chat_template_rendered` (rendered by jinja2 when the files were made) is checked too, and its
// tokenization with parse_special against llama.cpp's ids in tokenizer_bpe_test.cpp.
#include "model/chat_template.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "model/tokenizer.h"
#include "test_paths.h"
#include "test_tmp.h"
#include "util/error.h"

namespace kvevict {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Case {
  std::vector<ChatMessage> messages;
  ChatOptions opt;
};

// Conversations: one user turn; system + user; multi-turn with an assistant reply holding a
// think block (historic reasoning is dropped by qwen3 / deepseek-r1); thinking off; a final
// assistant turn without generation prompt (qwen3 keeps its reasoning); padded text (llama3 trims).
std::vector<Case> cases() {
  const ChatMessage sys{"system", "You are a helpful assistant."};
  const ChatMessage user{"user", "What is 2+2?"};
  const ChatMessage reply{"assistant", "<think>\nThe user adds two and two.\n</think>\n\n2+2 = 4."};
  const ChatMessage user2{"user", "And 3+3?"};
  return {
      {{user}, {true, true}},
      {{sys, user}, {true, true}},
      {{user, reply, user2}, {true, true}},
      {{sys, user, reply, user2}, {true, true}},
      {{user}, {true, false}},
      {{user, reply}, {false, true}},
      {{{"system", "  Be brief.\n"}, {"user", "\n  Hi there  \n"}}, {true, true}},
  };
}

bool jinja2_available() { return std::system("python3 -c 'import jinja2' >/dev/null 2>&1") == 0; }

bool in_ci() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

// Renders every case with jinja2 from the GGUF's own template text.
std::vector<std::string> jinja_render(const GgufFile& g, const std::vector<Case>& cs, const std::string& tag) {
  const auto tokens = g.get_string_array("tokenizer.ggml.tokens");
  json in;
  in["template"] = g.get_string("tokenizer.chat_template");
  in["bos_token"] = tokens.at(g.get_uint("tokenizer.ggml.bos_token_id"));
  in["eos_token"] = tokens.at(g.get_uint("tokenizer.ggml.eos_token_id"));
  in["cases"] = json::array();
  for (const Case& c : cs) {
    json msgs = json::array();
    for (const ChatMessage& m : c.messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
    in["cases"].push_back({{"messages", msgs},
                           {"add_generation_prompt", c.opt.add_generation_prompt},
                           {"enable_thinking", c.opt.enable_thinking}});
  }
  const fs::path dir = test::fresh_dir("chat_" + tag);
  const fs::path in_path = dir / (tag + "_in.json"), out_path = dir / (tag + "_out.json");
  std::ofstream(in_path) << in.dump();
  const std::string script = kvevict::test::source_path("tests/chat_template_jinja.py");
  const std::string cmd = "python3 '" + script + "' '" + in_path.string() + "' '" + out_path.string() + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream out(out_path);
  const json rendered = json::parse(out);
  fs::remove_all(dir);
  return rendered.get<std::vector<std::string>>();
}

json family_json(const std::string& family) {
  std::ifstream in(test::shared_path("reference/tiny-random-" + family + ".json"));
  if (!in) throw std::runtime_error("cannot open reference/tiny-random-" + family + ".json");
  return json::parse(in);
}

void check_family(const std::string& family, const std::string& expect_name) {
  const GgufFile g = GgufFile::open(test::shared_path("models/tiny-random/tiny-random-" + family + "-f16.gguf"));
  const ChatTemplate t = ChatTemplate::from_gguf(g);
  EXPECT_EQ(t.name(), expect_name);
  // Reference JSON: system + user, generation prompt on (rendered by jinja2 at creation).
  const json ref = family_json(family);
  EXPECT_EQ(t.render({{"system", "You are a helpful assistant."}, {"user", "What is 2+2?"}}, {true, true}),
            ref.at("chat_template_rendered").get<std::string>());
  if (!jinja2_available()) {
    if (in_ci()) FAIL() << "python3 jinja2 missing under CI=true (scripts/setup.sh installs python3-jinja2)";
    GTEST_SKIP() << "python3 jinja2 not installed (apt-get install python3-jinja2)";
  }
  const std::vector<Case> cs = cases();
  const std::vector<std::string> want = jinja_render(g, cs, family);
  ASSERT_EQ(want.size(), cs.size());
  for (size_t i = 0; i < cs.size(); ++i)
    EXPECT_EQ(t.render(cs[i].messages, cs[i].opt), want[i]) << family << " case " << i;
}

TEST(ChatTemplate, Qwen3MatchesJinja2) { check_family("qwen3", "qwen3"); }
TEST(ChatTemplate, DeepSeekR1MatchesJinja2) { check_family("qwen2", "deepseek-r1"); }
TEST(ChatTemplate, Llama3MatchesJinja2) { check_family("llama3", "llama3"); }
TEST(ChatTemplate, Phi3MatchesJinja2) { check_family("phi3", "phi3"); }

// Expected: the rendered prompt tokenizes (parse_special, no add_special when the text holds BOS)
// to llama.cpp's ids for the same text (reference JSON's last tokenize entry).
TEST(ChatTemplate, RenderedPromptTokenizesLikeLlamaCpp) {
  for (const char* family : {"qwen2", "qwen3", "llama3", "phi3"}) {
    const GgufFile g =
        GgufFile::open(test::shared_path(std::string("models/tiny-random/tiny-random-") + family + "-f16.gguf"));
    const ChatTemplate t = ChatTemplate::from_gguf(g);
    const Tokenizer tok = Tokenizer::from_gguf(g);
    const json ref = family_json(family);
    const std::string text = t.render({{"system", "You are a helpful assistant."}, {"user", "What is 2+2?"}}, {});
    const json& last = ref.at("tokenize").back();
    ASSERT_EQ(last.at("text").get<std::string>(), text) << family;
    EXPECT_EQ(tok.encode(text, !t.renders_bos(), true), last.at("ids_parse_special").get<std::vector<int32_t>>())
        << family;
  }
}

// Expected: the generic families follow their published formats (ChatML: `<|im_start|>role\n
// ...<|im_end|>\n`; Phi-4: `<|im_start|>role<|im_sep|>...<|im_end|>`), written out by hand here
// because no GGUF with these templates is in shared/.
TEST(ChatTemplate, ChatMlAndPhi4Formats) {
  const std::vector<ChatMessage> m = {{"system", "S"}, {"user", "U"}};
  EXPECT_EQ(ChatTemplate::by_name("chatml").render(m, {}),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(
      ChatTemplate::by_name("phi4").render(m, {}),
      "<|im_start|>system<|im_sep|>S<|im_end|><|im_start|>user<|im_sep|>U<|im_end|><|im_start|>assistant<|im_sep|>");
  EXPECT_FALSE(ChatTemplate::by_name("chatml").renders_bos());
  EXPECT_TRUE(ChatTemplate::by_name("llama3").renders_bos());
}

// What each template can do, stated by hand from the published templates (Qwen3 and llama.cpp's
// DeepSeek-R1 copy honour enable_thinking; that R1 copy and the 2025 R1 templates end the
// generation prompt with "<think>\n", older R1 ones do neither; Phi-3-mini drops system turns),
// and each property checked against what render() does, so a capability cannot claim what the
// rendering does not do.
TEST(ChatTemplate, CapabilitiesAgreeWithTheRendering) {
  struct Expect {
    ChatTemplate tmpl;
    bool disable_thinking, opens_thinking, renders_system;
  };
  const std::string r1_old = "{{ '<｜User｜>' + m }}{{ '<｜Assistant｜>' }}";
  const std::string r1_think = "{{ '<｜User｜>' + m }}{{ '<｜Assistant｜><think>\\n' }}";
  const std::string r1_switch = r1_think + "{% if enable_thinking is false %}</think>{% endif %}";
  const std::vector<Expect> all = {
      {ChatTemplate::by_name("qwen3"), true, false, true},
      {ChatTemplate::by_name("deepseek-r1"), true, true, true},
      {ChatTemplate::detect(r1_old, "r1-old"), false, false, true},
      {ChatTemplate::detect(r1_think, "r1-think"), false, true, true},
      {ChatTemplate::detect(r1_switch, "r1-switch"), true, true, true},
      {ChatTemplate::by_name("chatml"), false, false, true},
      {ChatTemplate::by_name("llama3"), false, false, true},
      {ChatTemplate::by_name("phi3"), false, false, false},
      {ChatTemplate::by_name("phi4"), false, false, true},
  };
  const ChatMessage user{"user", "What is 2+2?"};
  for (const Expect& e : all) {
    const ChatTemplate& t = e.tmpl;
    EXPECT_EQ(t.can_disable_thinking(), e.disable_thinking) << t.name();
    EXPECT_EQ(t.opens_thinking(), e.opens_thinking) << t.name();
    EXPECT_EQ(t.renders_system(), e.renders_system) << t.name();
    const std::string on = t.render({user}, {true, true}), off = t.render({user}, {true, false});
    EXPECT_EQ(t.can_disable_thinking(), on != off) << t.name();
    EXPECT_EQ(t.opens_thinking(), on.size() >= 8 && on.compare(on.size() - 8, 8, "<think>\n") == 0) << t.name() << on;
    const std::string with_system = t.render({{"system", "SYSTEM-MARKER"}, user}, {true, true});
    EXPECT_EQ(t.renders_system(), with_system.find("SYSTEM-MARKER") != std::string::npos) << t.name();
  }
}

// Expected: clear errors naming the problem and listing valid names.
TEST(ChatTemplate, Errors) {
  try {
    ChatTemplate::by_name("vicuna");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vicuna"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("qwen3"), std::string::npos) << e.what();
  }
  try {
    ChatTemplate::detect("{{ messages[0].content }}", "model.gguf");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.gguf"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos) << e.what();
  }
  EXPECT_THROW(ChatTemplate::by_name("chatml").render({{"tool", "x"}}, {}), Error);
  EXPECT_THROW(ChatTemplate::by_name("chatml").render({}, {}), Error);
  // stories260K has no chat template.
  const GgufFile g = GgufFile::open(test::stories260k());
  EXPECT_THROW(ChatTemplate::from_gguf(g), Error);
  EXPECT_EQ(ChatTemplate::from_gguf(g, "chatml").name(), "chatml");
}

// Expected: counted by hand from the reference ids of the same text: qwen3 encodes
// "<think>\nabc\n</think>\n\nok" with <think>/</think> as single tokens (151667/151668), so the
// trace ends at the token 151668; a text without the marker gives 0.
TEST(ChatTemplate, ThinkingTraceTokens) {
  const Tokenizer tok =
      Tokenizer::from_gguf(GgufFile::open(test::shared_path("models/tiny-random/tiny-random-qwen3-f16.gguf")));
  const std::vector<int32_t> ids = tok.encode("<think>\nabc\n</think>\n\nok", false, false);
  size_t close = 0;
  while (close < ids.size() && ids[close] != 151668) ++close;
  ASSERT_LT(close, ids.size());
  EXPECT_EQ(thinking_trace_tokens(tok, ids), static_cast<int64_t>(close + 1));
  EXPECT_EQ(thinking_trace_tokens(tok, tok.encode("no marker here", false, false)), 0);
  // Split over plain-text tokens (stories260K has no </think> token).
  const Tokenizer spm = Tokenizer::from_gguf(GgufFile::open(test::stories260k()));
  const std::vector<int32_t> split = spm.encode("a</think>b", false, false);
  const int64_t n = thinking_trace_tokens(spm, split);
  ASSERT_GT(n, 0);
  EXPECT_NE(spm.decode({split.begin(), split.begin() + n}).find("</think>"), std::string::npos);
  EXPECT_EQ(spm.decode({split.begin(), split.begin() + n - 1}).find("</think>"), std::string::npos);
}

}  // namespace
}  // namespace kvevict
