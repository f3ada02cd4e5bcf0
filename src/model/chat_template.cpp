// Chat template families (see chat_template.h). Each render_* follows the control flow of the
// family's published Jinja template for the system/user/assistant roles; Python string methods
// used there (split, strip('\n'), trim) are mirrored by the helpers below.
#include "model/chat_template.h"

#include <cstdint>

#include "format/gguf.h"
#include "model/tokenizer.h"
#include "util/error.h"

namespace kvevict {

namespace {

bool contains(const std::string& s, std::string_view what) { return s.find(what) != std::string::npos; }
bool starts_with(const std::string& s, std::string_view p) { return s.rfind(p, 0) == 0; }
bool ends_with(const std::string& s, std::string_view p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// Python s.lstrip('\n') / s.rstrip('\n') / s.strip('\n').
std::string lstrip_nl(const std::string& s) {
  const size_t b = s.find_first_not_of('\n');
  return b == std::string::npos ? std::string() : s.substr(b);
}
std::string rstrip_nl(const std::string& s) {
  const size_t e = s.find_last_not_of('\n');
  return e == std::string::npos ? std::string() : s.substr(0, e + 1);
}
std::string strip_nl(const std::string& s) { return lstrip_nl(rstrip_nl(s)); }

// Jinja's `trim` (Python str.strip()): ASCII whitespace and the separators Python counts as
// whitespace (U+001C..U+001F); non-ASCII spaces are kept (rare in prompts).
std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\v\f\x1c\x1d\x1e\x1f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return std::string();
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// Python s.split(sep)[-1] and s.split(sep)[0].
std::string after_last(const std::string& s, std::string_view sep) {
  const size_t p = s.rfind(sep);
  return p == std::string::npos ? s : s.substr(p + sep.size());
}
std::string before_first(const std::string& s, std::string_view sep) {
  const size_t p = s.find(sep);
  return p == std::string::npos ? s : s.substr(0, p);
}

void check_messages(const std::vector<ChatMessage>& messages) {
  if (messages.empty()) throw Error("chat template: no messages to render");
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      throw Error("chat template: message role '" + m.role + "' is not supported (valid: system, user, assistant)");
    }
  }
}

}  // namespace

int64_t thinking_trace_tokens(const Tokenizer& tok, const std::vector<int32_t>& generated) {
  constexpr std::string_view kClose = "</think>";
  std::string tail;  // last bytes of the text so far: enough to see a marker split over tokens
  for (size_t i = 0; i < generated.size(); ++i) {
    tail += tok.piece(generated[i], /*special=*/true);  // a CONTROL-typed </think> has no plain text
    if (tail.find(kClose) != std::string::npos) return static_cast<int64_t>(i + 1);
    if (tail.size() > kClose.size()) tail.erase(0, tail.size() - kClose.size());
  }
  return 0;
}

std::string ChatTemplate::names() { return "qwen3, chatml, deepseek-r1, llama3, phi3, phi4"; }

ChatTemplate ChatTemplate::by_name(const std::string& name) {
  if (name == "qwen3") return ChatTemplate(Family::Qwen3, name);
  if (name == "chatml") return ChatTemplate(Family::ChatML, name);
  if (name == "deepseek-r1") return ChatTemplate(Family::DeepSeekR1, name);
  if (name == "llama3") return ChatTemplate(Family::Llama3, name);
  if (name == "phi3") return ChatTemplate(Family::Phi3, name);
  if (name == "phi4") return ChatTemplate(Family::Phi4, name);
  throw Error("--chat-template '" + name + "' is not a known template (valid: " + names() + ")");
}

ChatTemplate ChatTemplate::detect(const std::string& t, const std::string& where) {
  const auto unrecognised = [&](const std::string& why) {
    return Error(where + ": tokenizer.chat_template is not recognised (" + why +
                 "); pass --chat-template NAME (valid: " + names() + ")");
  };
  if (contains(t, "<｜User｜>") && contains(t, "<｜Assistant｜>")) {
    ChatTemplate c(Family::DeepSeekR1, "deepseek-r1");
    // Older R1 templates end the prompt at <｜Assistant｜>; llama.cpp's copy also pre-closes
    // the think block when enable_thinking is false.
    c.r1_think_prompt_ = contains(t, "<｜Assistant｜><think>");
    c.r1_close_think_ = contains(t, "enable_thinking");
    return c;
  }
  if (contains(t, "<|start_header_id|>")) {
    if (contains(t, "Cutting Knowledge Date")) return ChatTemplate(Family::Llama3, "llama3");
    throw unrecognised("a Llama-3 header template without the Llama-3.1 system block");
  }
  if (contains(t, "<|im_sep|>")) {
    if (contains(t, "You are Phi")) throw unrecognised("Phi-4 template with a built-in system prompt");
    return ChatTemplate(Family::Phi4, "phi4");
  }
  if (contains(t, "<|im_start|>")) {
    if (contains(t, "enable_thinking")) return ChatTemplate(Family::Qwen3, "qwen3");
    if (contains(t, "<think>") || contains(t, "You are")) {
      throw unrecognised("ChatML variant with a default system prompt or thinking rules");
    }
    return ChatTemplate(Family::ChatML, "chatml");
  }
  if (contains(t, "<|user|>") && contains(t, "<|assistant|>") && contains(t, "<|end|>")) {
    if (contains(t, "<|system|>")) throw unrecognised("Phi-3.5/Phi-4-mini variant with a <|system|> turn");
    return ChatTemplate(Family::Phi3, "phi3");
  }
  throw unrecognised("no known family's markers");
}

ChatTemplate ChatTemplate::from_gguf(const GgufFile& gguf, const std::string& override_name) {
  return from_text(gguf.has("tokenizer.chat_template") ? gguf.get_string("tokenizer.chat_template") : std::string(),
                   gguf.path(), "tokenizer.chat_template", override_name);
}

ChatTemplate ChatTemplate::from_text(const std::string& template_text, const std::string& where, const std::string& key,
                                     const std::string& override_name) {
  if (!override_name.empty()) return by_name(override_name);
  if (template_text.empty())
    throw Error(where + ": has no " + key + "; pass --chat-template NAME (valid: " + names() + ")");
  return detect(template_text, where);
}

bool ChatTemplate::renders_bos() const {
  return family_ == Family::DeepSeekR1 || family_ == Family::Llama3 || family_ == Family::Phi3;
}

bool ChatTemplate::can_disable_thinking() const {
  return family_ == Family::Qwen3 || (family_ == Family::DeepSeekR1 && r1_close_think_);
}

bool ChatTemplate::opens_thinking() const { return family_ == Family::DeepSeekR1 && r1_think_prompt_; }

bool ChatTemplate::has_thinking() const { return family_ == Family::Qwen3 || family_ == Family::DeepSeekR1; }

std::string ChatTemplate::thinking_end_text() const { return has_thinking() ? "\n</think>\n\n" : ""; }

bool ChatTemplate::renders_system() const { return family_ != Family::Phi3; }

std::string ChatTemplate::render(const std::vector<ChatMessage>& m, const ChatOptions& opt) const {
  check_messages(m);
  std::string out;
  switch (family_) {
    case Family::Qwen3:
      return render_qwen3(m, opt);
    case Family::DeepSeekR1:
      return render_deepseek(m, opt);
    case Family::Llama3:
      return render_llama3(m, opt);
    case Family::ChatML:
      for (const ChatMessage& x : m) out += "<|im_start|>" + x.role + "\n" + x.content + "<|im_end|>\n";
      if (opt.add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    case Family::Phi4:
      for (const ChatMessage& x : m) out += "<|im_start|>" + x.role + "<|im_sep|>" + x.content + "<|im_end|>";
      if (opt.add_generation_prompt) out += "<|im_start|>assistant<|im_sep|>";
      return out;
    case Family::Phi3:
      // Phi-3-mini's template ignores system turns and opens the assistant turn after every
      // user turn (whatever add_generation_prompt says).
      out = "<s>";
      for (const ChatMessage& x : m) {
        if (x.role == "user") out += "<|user|>\n" + x.content + "<|end|>\n<|assistant|>\n";
        if (x.role == "assistant") out += x.content + "<|end|>\n";
      }
      return out;
  }
  return out;
}

std::string ChatTemplate::render_qwen3(const std::vector<ChatMessage>& m, const ChatOptions& opt) const {
  std::string out;
  if (m[0].role == "system") out += "<|im_start|>system\n" + m[0].content + "<|im_end|>\n";
  // Index of the last real user query: reasoning is only kept for assistant turns after it.
  int64_t last_query = static_cast<int64_t>(m.size()) - 1;
  for (int64_t i = last_query; i >= 0; --i) {
    const ChatMessage& x = m[static_cast<size_t>(i)];
    if (x.role == "user" && !(starts_with(x.content, "<tool_response>") && ends_with(x.content, "</tool_response>"))) {
      last_query = i;
      break;
    }
  }
  for (size_t i = 0; i < m.size(); ++i) {
    const ChatMessage& x = m[i];
    if (x.role == "user" || (x.role == "system" && i != 0)) {
      out += "<|im_start|>" + x.role + "\n" + x.content + "<|im_end|>\n";
    } else if (x.role == "assistant") {
      std::string content = x.content, reasoning;
      if (contains(x.content, "</think>")) {
        content = lstrip_nl(after_last(x.content, "</think>"));
        reasoning = lstrip_nl(after_last(rstrip_nl(before_first(x.content, "</think>")), "<think>"));
      }
      const bool last = i + 1 == m.size();
      if (static_cast<int64_t>(i) > last_query && (last || !reasoning.empty())) {
        out += "<|im_start|>assistant\n<think>\n" + strip_nl(reasoning) + "\n</think>\n\n" + lstrip_nl(content);
      } else {
        out += "<|im_start|>assistant\n" + content;
      }
      out += "<|im_end|>\n";
    }
  }
  if (opt.add_generation_prompt) {
    out += "<|im_start|>assistant\n";
    if (!opt.enable_thinking) out += "<think>\n\n</think>\n\n";
  }
  return out;
}

std::string ChatTemplate::render_deepseek(const std::vector<ChatMessage>& m, const ChatOptions& opt) const {
  // The (last) system prompt goes right after BOS, with no marker.
  std::string system;
  for (const ChatMessage& x : m) {
    if (x.role == "system") system = x.content;
  }
  std::string out = "<｜begin▁of▁sentence｜>" + system;
  for (const ChatMessage& x : m) {
    if (x.role == "user") out += "<｜User｜>" + x.content;
    if (x.role == "assistant") {
      const std::string content = contains(x.content, "</think>") ? after_last(x.content, "</think>") : x.content;
      out += "<｜Assistant｜>" + content + "<｜end▁of▁sentence｜>";
    }
  }
  if (opt.add_generation_prompt) {
    out += "<｜Assistant｜>";
    if (r1_think_prompt_) out += "<think>\n";
    if (r1_close_think_ && !opt.enable_thinking) out += "</think>";
  }
  return out;
}

std::string ChatTemplate::render_llama3(const std::vector<ChatMessage>& m, const ChatOptions& opt) const {
  size_t first = 0;
  std::string system;
  if (m[0].role == "system") {
    system = trim(m[0].content);
    first = 1;
  }
  // The template's default date_string (no strftime_now), so renders are reproducible.
  std::string out =
      "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
      "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" +
      system + "<|eot_id|>";
  for (size_t i = first; i < m.size(); ++i) {
    out += "<|start_header_id|>" + m[i].role + "<|end_header_id|>\n\n" + trim(m[i].content) + "<|eot_id|>";
  }
  if (opt.add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

}  // namespace kvevict
