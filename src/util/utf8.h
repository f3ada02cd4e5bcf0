// UTF-8 checks shared by the GGUF reader (key and tensor names), the tokenizer's streaming decoder
// and the server (request bodies, streamed text).
//
// Source: RFC 3629 (well-formed UTF-8: no overlong forms, no surrogates, at most U+10FFFF).
#pragma once

#include <cstddef>
#include <string_view>

namespace kvevict {

/// True when `s` is well-formed UTF-8 (RFC 3629 §3–4). Never throws.
bool utf8_valid(std::string_view s);

/// Bytes at the end of `s` that begin a multi-byte sequence not yet complete (0–3): a streaming
/// decoder holds them back until the next token supplies the rest. 0 when `s` ends on a character
/// boundary, or when its tail is malformed anyway (nothing to wait for). Never throws.
size_t utf8_incomplete_tail(std::string_view s);

}  // namespace kvevict
