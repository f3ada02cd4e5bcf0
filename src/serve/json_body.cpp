#include "serve/json_body.h"

#include <fmt/format.h>

#include <set>
#include <vector>

#include "serve/api_error.h"
#include "util/utf8.h"

namespace kvevict::serve {

using json = nlohmann::json;

int json_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest && (deepest = depth) > limit) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

std::string quote_text(std::string_view s) {
  if (s.size() <= kMaxQuotedBytes) return std::string(s);
  size_t cut = kMaxQuotedBytes;
  // Back up to the first byte of a character (continuation bytes are 10xxxxxx).
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return std::string(s.substr(0, cut)) + "...";
}

std::string quote_value(const json& v) { return quote_text(v.dump(-1, ' ', false, json::error_handler_t::replace)); }

json parse_json_body(const std::string& body) {
  if (!utf8_valid(body)) throw ApiError{400, "the request body is not valid UTF-8", ""};
  if (const int depth = json_depth(body); depth > kMaxJsonDepth)
    throw ApiError{400,
                   fmt::format("the request body nests arrays/objects more than {} levels deep (the limit)",
                               kMaxJsonDepth),
                   ""};
  // Keys seen in each open object, innermost last: a repeated key is refused, not resolved (RFC 8259
  // §4 leaves duplicates undefined; nlohmann-json keeps the last, another client's parser the first).
  std::vector<std::set<std::string>> keys;
  const json::parser_callback_t check_keys = [&keys](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      keys.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      if (!keys.empty()) keys.pop_back();
    } else if (event == json::parse_event_t::key && !keys.empty()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!keys.back().insert(key).second)
        throw ApiError{400, fmt::format("the request body repeats the key {} in one object", quote_value(json(key))),
                       key.size() <= kMaxQuotedBytes ? key : ""};
    }
    return true;
  };
  try {
    return json::parse(body, check_keys);
  } catch (const json::exception& e) {  // syntax errors, and numbers that overflow a double (1e999)
    // The parser's message quotes the token it stopped in, which can be most of the body.
    // nlohmann-json words it "...; last read: 'TOKEN'" or "...; last read: 'TOKEN'; expected ...".
    const std::string what = e.what();
    const std::string mark = "last read: '";
    std::string shown = what;
    if (const size_t at = what.find(mark); at != std::string::npos) {
      size_t end = what.find("'; expected", at + mark.size());
      if (end == std::string::npos) end = what.size() - (what.back() == '\'' ? 1 : 0);
      shown = what.substr(0, at + mark.size()) + quote_text(what.substr(at + mark.size(), end - at - mark.size())) +
          what.substr(end);
    }
    throw ApiError{400, fmt::format("the request body is not valid JSON: {}", shown), ""};
  }
}

}  // namespace kvevict::serve
