// Pre-tokenizer regex split: cuts a text into the regex's matches and the gaps between them, in
// order (Hugging Face tokenizers' `Split` with behaviour "Isolated", llama.cpp's BPE
// pre-tokenizer). Runs on PCRE2 in UTF + Unicode-property mode; invalid UTF-8 is matched as
// PCRE2_MATCH_INVALID_UTF allows (bytes no alternative covers become pieces of their own).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvevict::tok {

/// A compiled split pattern. Immutable after construction; safe to share across threads.
class RegexSplitter {
 public:
  /// Compiles `pattern` (PCRE2 syntax; the Oniguruma patterns of tokenizer.json files and
  /// llama.cpp's pre-tokenizers use only the common subset). Throws kvevict::Error, prefixed
  /// with `where`, naming the offset and PCRE2's message when it does not compile.
  RegexSplitter(const std::string& pattern, const std::string& where);

  /// Consecutive pieces covering `text`: every match and every non-empty gap between matches.
  /// Throws kvevict::Error when the regex engine fails.
  std::vector<std::string_view> split(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  std::shared_ptr<void> code_;  ///< pcre2_code_8, freed with pcre2_code_free_8
};

}  // namespace kvevict::tok
