// Request bodies as JSON, with the limits a server needs that the JSON library does not set: a
// nesting depth (nlohmann-json parses any depth, but copying or printing a value recurses once
// per level, so 100,000 nested arrays overflow the stack) and short quotations of bad values in
// error messages (a 4 MiB string must not come back in a 400).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace kvevict::serve {

/// Deepest nesting of arrays and objects a request body may have. The OpenAI request shapes nest
/// at most 6 levels (messages[].content[].text; a JSON schema in response_format goes deeper),
/// so 64 refuses no real request.
inline constexpr int kMaxJsonDepth = 64;

/// Longest quotation of a request value in an error message, in bytes (before "...").
inline constexpr size_t kMaxQuotedBytes = 64;

/// Nesting depth of the JSON text `text` (0 for a scalar, 1 for [] or {}), counting brackets
/// outside strings, without parsing; stops counting at `limit + 1`. Linear time, no recursion.
int json_depth(std::string_view text, int limit = kMaxJsonDepth);

/// Parses a request body: the body must be valid UTF-8, at most kMaxJsonDepth levels deep and
/// valid JSON, with no key repeated within one object. Throws ApiError 400 naming the problem (the
/// depth and the limit; the parser's position of a syntax error; the repeated key, quoted).
nlohmann::json parse_json_body(const std::string& body);

/// The compact JSON text of `v` for an error message: at most kMaxQuotedBytes bytes, cut on a
/// UTF-8 character boundary and followed by "..." when longer. `v` must be within kMaxJsonDepth
/// (as every value from parse_json_body is).
std::string quote_value(const nlohmann::json& v);

/// `s` cut to at most kMaxQuotedBytes bytes on a UTF-8 character boundary, "..." appended when cut.
std::string quote_text(std::string_view s);

}  // namespace kvevict::serve
