// The thinking trace of a reasoning model's reply, apart from its answer: `<think>` ... `</think>`
// (Qwen3, DeepSeek-R1 and their distills, QwQ, Phi-4-reasoning).
//
// The split follows vLLM's reasoning parsers (vllm/reasoning/deepseek_r1_reasoning_parser.py,
// qwen3_reasoning_parser.py) and llama-server's `--reasoning-format deepseek`: a trace is open
// either from the first output token (the chat template's generation prompt ended with
// "<think>\n", DeepSeek-R1) or when the output begins with "<think>" (Qwen3 writes the tag
// itself; leading whitespace allowed); it ends at the first "</think>". The text inside is the
// reasoning, the text after it the content; the tags belong to neither. A trace still open at the
// end is all reasoning (a reply cut by max_tokens mid-thought). Nothing is stripped, as vLLM, so
// streamed pieces concatenate to exactly the non-streamed strings.
#pragma once

#include <string>
#include <string_view>

namespace kvevict {

/// The tags of a thinking trace.
inline constexpr std::string_view kThinkOpen = "<think>";
inline constexpr std::string_view kThinkClose = "</think>";

/// Reasoning and content text (either may be empty).
struct ReasoningText {
  std::string reasoning;
  std::string content;
};

/// Splits output text, fed in pieces of any size, into reasoning and content. The result does not
/// depend on how the text is cut into pieces: a piece that might be the start of a tag is held
/// back until it is decided.
class ReasoningSplitter {
 public:
  enum class Phase {
    Start,   ///< no text decided yet (only whitespace or a prefix of "<think>" so far)
    Trace,   ///< inside the trace
    Answer,  ///< after the trace, or no trace at all
  };
  /// starts_open: the prompt opened the trace (ChatTemplate::opens_thinking with thinking on).
  explicit ReasoningSplitter(bool starts_open) : phase_(starts_open ? Phase::Trace : Phase::Start) {}
  /// Appends output text; returns what became final.
  ReasoningText push(std::string_view text);
  /// End of the output: hands out what was held back (an undecided start is content; a held-back
  /// part of a tag inside an unclosed trace is reasoning).
  ReasoningText flush();
  Phase phase() const { return phase_; }
  /// Whether a trace was opened (by the prompt or by the output).
  bool had_trace() const { return had_trace_ || phase_ == Phase::Trace; }

 private:
  Phase phase_;
  bool had_trace_ = false;
  std::string held_;
};

/// Whole text at once: ReasoningSplitter(starts_open).push(text) + flush(). `had_trace` (optional)
/// receives whether a trace was opened.
ReasoningText split_reasoning(std::string_view text, bool starts_open, bool* had_trace = nullptr);

}  // namespace kvevict
