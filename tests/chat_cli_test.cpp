// `kvevict generate --chat / --no-think / --chat-template` and eval's prompt builder with chat
// templates. Expected texts come from the families' templates as rendered by jinja2 (see
// chat_template_test.cpp) and from the CLI contract (bad input: one line, exit code 2).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>

#include "cli_run.h"
#include "eval/prompt.h"
#include "model/model.h"
#include "model_fixture.h"
#include "test_paths.h"
#include "util/error.h"

namespace kvevict {
namespace {

std::string stories() { return test::stories260k(); }
std::string tiny(const std::string& stem) { return test::shared_path("models/tiny-random/" + stem + ".gguf"); }

TEST(ChatCli, ErrorsNameTheProblem) {
  test::CliResult r = test::run_cli("generate -m " + stories() + " -p hi --chat -n 2");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("tokenizer.chat_template"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--chat-template"), std::string::npos) << r.out;
  r = test::run_cli("generate -m " + stories() + " -p hi --chat --chat-template vicuna -n 2");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("vicuna"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("chatml"), std::string::npos) << r.out;
  r = test::run_cli("generate -m " + stories() + " -p hi --no-think");
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("--chat"), std::string::npos) << r.out;
}

// Expected: ChatML with one user turn and the generation prompt, printed before the output.
TEST(ChatCli, GenerateWithTemplateOverride) {
  const test::CliResult r =
      test::run_cli("generate -m " + stories() + " -p 'Once upon' --chat --chat-template chatml -n 4 --temp 0");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(r.out.rfind("<|im_start|>user\nOnce upon<|im_end|>\n<|im_start|>assistant\n", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("generated 4 tok"), std::string::npos) << r.out;
}

// Expected: the Llama-3 file's own template is detected; the rendered text carries
// <|begin_of_text|>, so the prompt holds exactly one BOS (128000) and the header tokens parse as
// special tokens (<|start_header_id|> = 128006, README-families.md / reference JSON ids).
TEST(ChatCli, EvalPromptBuilderUsesModelTemplate) {
  if (!std::filesystem::exists(tiny("tiny-random-llama3-f16"))) GTEST_SKIP() << "tiny-random files not found";
  std::unique_ptr<Model> m;
  try {
    m = Model::load(tiny("tiny-random-llama3-f16"));
  } catch (const Error& e) {
    GTEST_SKIP() << "model does not load on this branch: " << e.what();
  }
  const PromptBuilder p(*m, {TemplateChoice::Chat, false});
  EXPECT_EQ(p.template_name(), "llama3");
  EXPECT_EQ(p.text("Hi"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
            "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  const std::vector<int32_t> ids = p.tokens("Hi");
  ASSERT_GE(ids.size(), 3u);
  EXPECT_EQ(ids[0], 128000);
  EXPECT_EQ(ids[1], 128006);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 128000), 1);
  const PromptBuilder over(*m, {TemplateChoice::Auto, false}, {}, ChatPromptOptions{"chatml", true});
  EXPECT_EQ(over.template_name(), "chatml");
  // stories260K: no template, so Chat is an error and Auto stays plain.
  KVEVICT_REQUIRE_MODEL(s);
  EXPECT_THROW(PromptBuilder(*s, {TemplateChoice::Chat, false}), Error);
  EXPECT_EQ(PromptBuilder(*s, {TemplateChoice::Auto, false}).template_name(), "plain");
}

}  // namespace
}  // namespace kvevict
