// Prompt construction for `kvevict eval`: an optional math suffix and a template (plain text, or
// the model's chat template when it is one kvevict can render).
//
// Source: the paper's protocol (docs/eviction-spec.md §4): math prompts end with "Please reason step
// by step, and put your final answer within \boxed{}.". Chat templates: the Llama-2 form
// `[INST] {user} [/INST]` (Touvron et al., arXiv 2307.09288 §3; its markers are plain text for the
// SentencePiece tokenizer) and the reasoning families of model/chat_template.h (Qwen3, ChatML,
// DeepSeek-R1, Llama-3, Phi-3, Phi-4), applied as the paper does: the problem is one user turn, no
// system prompt, generation prompt added. A GGUF whose `tokenizer.chat_template` is none of these
// is run with the plain template (and a warning) under Auto.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model/chat_template.h"

namespace kvevict {

class Model;

/// The paper's math suffix.
inline constexpr const char* kMathSuffix = "Please reason step by step, and put your final answer within \\boxed{}.";

/// Which template to use.
enum class TemplateChoice {
  Auto,   ///< the GGUF's chat template when supported, else plain
  Plain,  ///< the problem text (plus suffix) as it is
  Chat,   ///< the GGUF's chat template; an error when it has none kvevict supports
};

/// Parses "auto", "plain" or "chat". Throws kvevict::Error listing the choices.
TemplateChoice parse_template_choice(const std::string& name);

/// Options of a PromptBuilder.
struct PromptOptions {
  TemplateChoice choice = TemplateChoice::Auto;
  bool math_suffix = true;  ///< append "\n" + kMathSuffix to the problem
};

/// Chat-template choices of a PromptBuilder (kept apart from PromptOptions so its brace
/// initialisations stay valid).
struct ChatPromptOptions {
  std::string chat_template;    ///< template family to use instead of the GGUF's ("" = detect)
  bool enable_thinking = true;  ///< false: Qwen3 / DeepSeek-R1 enable_thinking=false
};

/// Turns problem texts into prompt tokens for one model.
class PromptBuilder {
 public:
  /// Decides the template from `model`'s GGUF metadata (`tokenizer.chat_template`). `warn`
  /// receives one message when Auto falls back to plain although a template is present.
  /// Throws kvevict::Error when Chat was asked for and no supported template is present.
  /// `chat.chat_template` overrides the detected family (an unknown name throws).
  PromptBuilder(const Model& model, const PromptOptions& opts,
                const std::function<void(const std::string&)>& warn = {}, const ChatPromptOptions& chat = {});

  /// The user message: problem, then "\n" + kMathSuffix when math_suffix is set.
  std::string user_text(const std::string& problem) const;
  /// The full prompt text after templating (what is tokenized, BOS excluded).
  std::string text(const std::string& problem) const;
  /// Prompt token ids [T]: BOS first when the model's metadata adds one (or the chat template
  /// writes it); special tokens in a chat-templated text are parsed.
  std::vector<int32_t> tokens(const std::string& problem) const;
  /// "plain", "llama2" or a chat template name (with "+no-think" when thinking is switched off).
  const std::string& template_name() const { return template_; }

 private:
  const Model& model_;
  PromptOptions opts_;
  ChatPromptOptions chat_opts_;
  std::string template_ = "plain";
  std::optional<ChatTemplate> chat_;
};

}  // namespace kvevict
