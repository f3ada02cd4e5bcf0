#include "eval/prompt.h"

#include <fmt/format.h>

#include "model/model.h"
#include "util/error.h"

namespace kvevict {
TemplateChoice parse_template_choice(const std::string& name) {
  if (name == "auto") return TemplateChoice::Auto;
  if (name == "plain") return TemplateChoice::Plain;
  if (name == "chat") return TemplateChoice::Chat;
  throw Error(fmt::format("--template '{}': expected auto, plain or chat", name));
}

PromptBuilder::PromptBuilder(const Model& model, const PromptOptions& opts,
                             const std::function<void(const std::string&)>& warn, const ChatPromptOptions& chat)
    : model_(model), opts_(opts), chat_opts_(chat) {
  if (opts.choice == TemplateChoice::Plain) return;
  const auto use = [&](const ChatTemplate& c) {
    chat_ = c;
    template_ = c.name();
    if (!chat.enable_thinking && c.can_disable_thinking()) template_ += "+no-think";
  };
  if (!chat.chat_template.empty()) {
    use(ChatTemplate::by_name(chat.chat_template));
    return;
  }
  const std::string& tmpl = model.chat_template();
  if (tmpl.find("[INST]") != std::string::npos) {
    template_ = "llama2";
    return;
  }
  if (tmpl.empty()) {
    if (opts.choice == TemplateChoice::Chat)
      throw Error(fmt::format("{}: --template chat: the model has no {} (pass --chat-template NAME: {})", model.path(),
                              model.chat_template_key(), ChatTemplate::names()));
    return;
  }
  try {
    use(ChatTemplate::detect(tmpl, model.path()));
  } catch (const Error& e) {
    if (opts.choice == TemplateChoice::Chat) throw;
    if (warn) warn(fmt::format("{}; using the plain template", e.what()));
  }
}

std::string PromptBuilder::user_text(const std::string& problem) const {
  return opts_.math_suffix ? problem + "\n" + kMathSuffix : problem;
}

std::string PromptBuilder::text(const std::string& problem) const {
  const std::string user = user_text(problem);
  if (template_ == "llama2") return "[INST] " + user + " [/INST]";
  if (chat_) return chat_->render({{"user", user}}, ChatOptions{true, chat_opts_.enable_thinking});
  return user;
}

std::vector<int32_t> PromptBuilder::tokens(const std::string& problem) const {
  const Tokenizer& tok = model_.tokenizer();
  if (chat_) return tok.encode(text(problem), !chat_->renders_bos(), true);
  return tok.encode(text(problem), tok.bos_id() >= 0);
}

}  // namespace kvevict
