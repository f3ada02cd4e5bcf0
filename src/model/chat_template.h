// Chat templates of the reasoning-model families, rendered natively.
//
// GGUF files carry their chat template as Jinja text (`tokenizer.chat_template`). No maintained
// C++ Jinja engine is packaged in Debian (checked: `apt-cache search jinja` / `inja` list only
// Python and editor packages), so the families' templates are implemented directly, detected
// from the template text, and tested against the Python `jinja2` package rendering each GGUF's
// own template (tests/chat_template_test.cpp). Families:
//  * "qwen3"       ChatML with thinking (Qwen3): reasoning of assistant turns before the last
//                  user message is dropped; enable_thinking=false appends an empty think block;
//  * "chatml"      plain ChatML (`<|im_start|>role\n...<|im_end|>\n`);
//  * "deepseek-r1" DeepSeek-R1 / R1-Distill (`<｜User｜>...<｜Assistant｜>`), assistant turns
//                  cut to the text after `</think>`; generation prompt opens `<think>\n`;
//  * "llama3"      Llama-3.1/3.2 Instruct (system header with "Cutting Knowledge Date" block);
//  * "phi3"        Phi-3-mini (`<|user|>\n...<|end|>\n<|assistant|>\n`, system ignored);
//  * "phi4"        Phi-4 (`<|im_start|>role<|im_sep|>...<|im_end|>`).
// Tools / tool calls are not rendered (kvevict has no tool use).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvevict {

class GgufFile;
class Tokenizer;

/// Length in tokens of the thinking trace at the start of `generated`: the tokens up to and
/// including the first "</think>" (matched in the text, so a marker split over several tokens
/// counts too), or 0 when none appears. Reasoning models (Qwen3, DeepSeek-R1, Phi-4-reasoning)
/// close their trace this way. Throws kvevict::Error for an id outside the vocabulary.
int64_t thinking_trace_tokens(const Tokenizer& tok, const std::vector<int32_t>& generated);

/// One chat turn. role: "system", "user" or "assistant".
struct ChatMessage {
  std::string role;
  std::string content;
};

/// Rendering options, as the Jinja variables of the same names.
struct ChatOptions {
  bool add_generation_prompt = true;  ///< end with the opening of an assistant turn
  bool enable_thinking = true;        ///< false: Qwen3 / R1 templates pre-close the think block
};

/// A recognised chat template family. Immutable; cheap to copy.
class ChatTemplate {
 public:
  /// Detects the family from the model's `tokenizer.chat_template` text, or takes
  /// `override_name` when non-empty (see by_name). Throws kvevict::Error naming the file when the
  /// model has no template or its text matches no implemented family (the message lists the
  /// valid --chat-template names).
  static ChatTemplate from_gguf(const GgufFile& gguf, const std::string& override_name = "");
  /// As from_gguf for a model's template text (Model::chat_template(); "" when it has none);
  /// `where` and `key` (Model::path(), Model::chat_template_key()) name the model and the field
  /// in errors.
  static ChatTemplate from_text(const std::string& template_text, const std::string& where, const std::string& key,
                                const std::string& override_name = "");
  /// Detects the family from template text; `where` prefixes errors (e.g. the file path).
  /// Throws kvevict::Error when no family matches.
  static ChatTemplate detect(const std::string& template_text, const std::string& where);
  /// The family called `name`. Throws kvevict::Error on an unknown name, listing valid ones.
  static ChatTemplate by_name(const std::string& name);
  /// Valid names, comma-separated.
  static std::string names();

  /// The prompt text for `messages` (roles other than system/user/assistant are refused with a
  /// kvevict::Error naming the role). Special tokens appear as text: tokenize the result with
  /// parse_special=true (and add_special=!renders_bos()).
  std::string render(const std::vector<ChatMessage>& messages, const ChatOptions& opt) const;
  /// Family name ("qwen3", "chatml", "deepseek-r1", "llama3", "phi3", "phi4").
  const std::string& name() const { return name_; }
  /// Whether the rendered text already begins with BOS text (then tokenize with add_special=false).
  bool renders_bos() const;

  // What the template can do. Front ends ask these instead of testing a template's name.

  /// Whether ChatOptions::enable_thinking = false changes the rendering: Qwen3, and DeepSeek-R1
  /// templates that pre-close the think block (those that mention enable_thinking, as llama.cpp's
  /// copy does). Where false, a request to switch thinking off has no effect (say so).
  bool can_disable_thinking() const;
  /// Whether the generation prompt (thinking on) opens a thinking trace, i.e. ends with
  /// "<think>\n" (DeepSeek-R1 templates that write it): the model's first token is then inside
  /// the trace and the opening tag is not part of its output.
  bool opens_thinking() const;
  /// Whether replies may hold a thinking trace "<think>...</think>" (Qwen3, DeepSeek-R1): the
  /// server splits it off as reasoning_content, counts its tokens and can bound it.
  bool has_thinking() const;
  /// The text that ends a thinking trace in this family's assistant turns, "\n</think>\n\n"
  /// (Qwen3's template writes "<think>\n" + reasoning + "\n</think>\n\n" + answer; DeepSeek-R1
  /// models close their trace the same way); "" when !has_thinking(). A reasoning budget forces it.
  std::string thinking_end_text() const;
  /// Whether a system message appears in the rendered text (Phi-3-mini's template drops it).
  bool renders_system() const;

 private:
  enum class Family { Qwen3, ChatML, DeepSeekR1, Llama3, Phi3, Phi4 };
  ChatTemplate(Family f, std::string name) : family_(f), name_(std::move(name)) {}
  std::string render_qwen3(const std::vector<ChatMessage>& m, const ChatOptions& opt) const;
  std::string render_deepseek(const std::vector<ChatMessage>& m, const ChatOptions& opt) const;
  std::string render_llama3(const std::vector<ChatMessage>& m, const ChatOptions& opt) const;

  Family family_;
  std::string name_;
  bool r1_think_prompt_ = true;  ///< deepseek-r1: generation prompt opens "<think>\n"
  bool r1_close_think_ = true;   ///< deepseek-r1: enable_thinking=false appends "</think>"
};

}  // namespace kvevict
