#include "eval/prompt.h"

#include <fmt/format.h>

#include "model/llama.h"
#include "util/error.h"

namespace kvevict {
namespace {
constexpr const char* kChatTemplateKey = "tokenizer.chat_template";
}  // namespace

TemplateChoice parse_template_choice(const std::string& name) {
  if (name == "auto") return TemplateChoice::Auto;
  if (name == "plain") return TemplateChoice::Plain;
  if (name == "chat") return TemplateChoice::Chat;
  throw Error(fmt::format("--template '{}': expected auto, plain or chat", name));
}

PromptBuilder::PromptBuilder(const LlamaModel& model, const PromptOptions& opts,
                             const std::function<void(const std::string&)>& warn)
    : model_(model), opts_(opts) {
  if (opts.choice == TemplateChoice::Plain) return;
  const GgufFile& g = model.gguf();
  const std::string tmpl = g.has(kChatTemplateKey) ? g.get_string(kChatTemplateKey) : std::string();
  if (tmpl.find("[INST]") != std::string::npos) {
    template_ = "llama2";
    return;
  }
  if (opts.choice == TemplateChoice::Chat)
    throw Error(fmt::format("{}: --template chat: {} (kvevict renders only the Llama-2 [INST] form)", g.path(),
                            tmpl.empty() ? "the GGUF carries no chat template" : "its chat template is not supported"));
  if (!tmpl.empty() && warn)
    warn(fmt::format("{}: chat template not supported (kvevict renders only the Llama-2 [INST] form); using the "
                     "plain template", g.path()));
}

std::string PromptBuilder::user_text(const std::string& problem) const {
  return opts_.math_suffix ? problem + "\n" + kMathSuffix : problem;
}

std::string PromptBuilder::text(const std::string& problem) const {
  const std::string user = user_text(problem);
  if (template_ == "llama2") return "[INST] " + user + " [/INST]";
  return user;
}

std::vector<int32_t> PromptBuilder::tokens(const std::string& problem) const {
  const Tokenizer& tok = model_.tokenizer();
  return tok.encode(text(problem), tok.bos_id() >= 0);
}

}  // namespace kvevict
