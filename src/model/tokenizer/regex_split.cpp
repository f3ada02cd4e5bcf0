// PCRE2 split (see regex_split.h).
#include "model/tokenizer/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "util/error.h"

namespace kvevict::tok {

RegexSplitter::RegexSplitter(const std::string& pattern, const std::string& where) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &err, &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(where + ": pre-tokenizer regex does not compile at offset " + std::to_string(err_off) + ": " +
                reinterpret_cast<const char*>(msg));
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // best effort: without JIT the interpreter runs
  code_ = std::shared_ptr<void>(code, [](void* p) { pcre2_code_free(static_cast<pcre2_code*>(p)); });
}

std::vector<std::string_view> RegexSplitter::split(std::string_view text) const {
  std::vector<std::string_view> words;
  auto* code = static_cast<pcre2_code*>(code_.get());
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> md(pcre2_match_data_create_from_pattern(code, nullptr),
                                                                    pcre2_match_data_free);
  if (!md) throw Error("Tokenizer: out of memory for regex match data");
  const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap = 0, pos = 0;  // gap: start of the text not yet emitted; pos: where the search resumes
  while (pos < text.size()) {
    int rc = pcre2_match(code, subject, text.size(), pos, 0, md.get(), nullptr);
    // A very long whitespace run can exhaust the JIT stack; the interpreter uses the heap.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_JIT, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;  // the rest is one gap (e.g. invalid UTF-8 bytes)
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw Error("Tokenizer: pre-tokenizer regex failed at byte " + std::to_string(pos) + ": " +
                  reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t s = ov[0], e = ov[1];
    if (e <= s) {
      // An empty match splits nothing (as in tokenizers, empty pieces are dropped): search on
      // from the next character; the text stays part of the current gap.
      pos = s + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (s > gap) words.push_back(text.substr(gap, s - gap));
    words.push_back(text.substr(s, e - s));
    gap = pos = e;
  }
  if (gap < text.size()) words.push_back(text.substr(gap));
  return words;
}

}  // namespace kvevict::tok
