// Incremental output text of one generated sequence: stop strings matched across token
// boundaries and never emitted, and no partial UTF-8 character handed out mid-stream.
//
// Source: OpenAI API `stop` ("up to 4 sequences where the API will stop generating; the returned
// text will not contain the stop sequence"); vLLM and llama-server hold back text that could
// still become a stop string, which is what this does. UTF-8 lead-byte lengths: RFC 3629.
#pragma once

#include <string>
#include <vector>

namespace kvevict {

/// Feeds token pieces in, hands out text that is safe to show.
class TextStream {
 public:
  /// stops: stop strings (empty strings are ignored).
  explicit TextStream(std::vector<std::string> stops);

  /// Appends one token's bytes. Returns the text that became final: everything except a tail
  /// that is a prefix of some stop string or an incomplete UTF-8 character. Once a stop string
  /// is found, returns the text before it and stopped() turns true; later calls return "".
  /// With match_stops false (before min_tokens) a complete stop string does not stop the
  /// stream, but a tail that could still become one is held back as usual.
  std::string push(const std::string& piece, bool match_stops = true);
  /// Text still held back (at the end of a sequence that did not stop): returned once. An
  /// incomplete trailing UTF-8 character is dropped rather than emitted as invalid bytes, unless
  /// keep_incomplete (then the bytes are returned verbatim, as a terminal prints them).
  std::string flush(bool keep_incomplete = false);
  /// True when a stop string was matched.
  bool stopped() const { return stopped_; }
  /// Everything emitted so far (push + flush results concatenated).
  const std::string& text() const { return emitted_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;  ///< bytes received but not yet emitted
  std::string emitted_;
  bool stopped_ = false;
};

/// Length of the longest prefix of `s` that ends on a UTF-8 character boundary, i.e. `s` minus
/// an incomplete trailing multi-byte sequence (at most 3 bytes are cut).
size_t utf8_complete_prefix(const std::string& s);

}  // namespace kvevict
