#include "engine/reasoning.h"

#include <algorithm>

namespace kvevict {

namespace {

// Length of the longest suffix of `s` that is a proper prefix of `tag` (text that may still
// become the tag).
size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n)
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  return 0;
}

}  // namespace

ReasoningText ReasoningSplitter::push(std::string_view text) {
  ReasoningText out;
  held_ += text;
  if (phase_ == Phase::Start) {
    const size_t b = held_.find_first_not_of(" \t\r\n");
    const std::string_view rest = b == std::string::npos ? std::string_view() : std::string_view(held_).substr(b);
    if (rest.size() < kThinkOpen.size() && kThinkOpen.substr(0, rest.size()) == rest) return out;  // undecided
    if (rest.substr(0, kThinkOpen.size()) == kThinkOpen) {
      phase_ = Phase::Trace;
      had_trace_ = true;
      held_.erase(0, b + kThinkOpen.size());  // the whitespace before the tag and the tag: neither part
    } else {
      phase_ = Phase::Answer;
    }
  }
  if (phase_ == Phase::Trace) {
    had_trace_ = true;
    const size_t close = held_.find(kThinkClose);
    if (close == std::string::npos) {
      const size_t keep = partial_tag_suffix(held_, kThinkClose);
      out.reasoning = held_.substr(0, held_.size() - keep);
      held_.erase(0, held_.size() - keep);
      return out;
    }
    out.reasoning = held_.substr(0, close);
    held_.erase(0, close + kThinkClose.size());
    phase_ = Phase::Answer;
  }
  out.content += held_;
  held_.clear();
  return out;
}

ReasoningText ReasoningSplitter::flush() {
  ReasoningText out;
  (phase_ == Phase::Trace ? out.reasoning : out.content) = std::move(held_);
  held_.clear();
  return out;
}

ReasoningText split_reasoning(std::string_view text, bool starts_open, bool* had_trace) {
  ReasoningSplitter s(starts_open);
  ReasoningText out = s.push(text);
  ReasoningText tail = s.flush();
  out.reasoning += tail.reasoning;
  out.content += tail.content;
  if (had_trace) *had_trace = s.had_trace();
  return out;
}

}  // namespace kvevict
