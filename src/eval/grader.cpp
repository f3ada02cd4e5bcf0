#include "eval/grader.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <regex>
#include <vector>

namespace kvevict {
namespace {

bool is_alpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }
bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }
bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

// Replaces every occurrence of the LaTeX command `cmd` (e.g. "\\dfrac") that is not the prefix of
// a longer command name by `with`.
std::string replace_command(const std::string& s, std::string_view cmd, std::string_view with) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, cmd.size(), cmd) == 0 && (i + cmd.size() >= s.size() || !is_alpha(s[i + cmd.size()]))) {
      out += with;
      i += cmd.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
}

// Index just past the brace group that opens at s[open] == '{' (escaped braces skipped), or npos.
size_t close_brace(std::string_view s, size_t open) {
  int depth = 0;
  for (size_t k = open; k < s.size(); ++k) {
    if (s[k] == '\\' && k + 1 < s.size()) {
      ++k;
      continue;
    }
    if (s[k] == '{') ++depth;
    if (s[k] == '}' && --depth == 0) return k + 1;
  }
  return std::string_view::npos;
}

// One macro argument starting at s[i]: a brace group (returned without its braces), a command
// (`\pi`) or one character. Sets `next` past it. Empty result: no argument there.
std::string macro_arg(const std::string& s, size_t i, size_t& next) {
  next = i;
  if (i >= s.size()) return "";
  if (s[i] == '{') {
    const size_t end = close_brace(s, i);
    if (end == std::string::npos) return "";
    next = end;
    return s.substr(i + 1, end - i - 2);
  }
  if (s[i] == '\\') {
    size_t j = i + 1;
    while (j < s.size() && is_alpha(s[j])) ++j;
    if (j == i + 1) return "";
    next = j;
    return s.substr(i, j - i);
  }
  if (s[i] == '}') return "";
  next = i + 1;
  return s.substr(i, 1);
}

// Rewrites `\frac43` -> `\frac{4}{3}` and `\sqrt2` -> `\sqrt{2}` (arguments that lack braces).
std::string brace_macro_args(const std::string& s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    int n_args = 0;
    size_t len = 0;
    if (s.compare(i, 5, "\\frac") == 0 && (i + 5 >= s.size() || !is_alpha(s[i + 5]))) n_args = 2, len = 5;
    else if (s.compare(i, 5, "\\sqrt") == 0 && (i + 5 >= s.size() || !is_alpha(s[i + 5]))) n_args = 1, len = 5;
    if (n_args == 0) {
      out += s[i++];
      continue;
    }
    std::string rebuilt = s.substr(i, len);
    size_t j = i + len;
    bool ok = true;
    for (int a = 0; a < n_args && ok; ++a) {
      size_t next = j;
      const std::string arg = macro_arg(s, j, next);
      if (next == j) {
        ok = false;
      } else {
        // Appended piecewise: GCC 12 reports a false -Wrestrict on "{" + std::string + "}".
        rebuilt += '{';
        rebuilt += brace_macro_args(arg);
        rebuilt += '}';
        j = next;
      }
    }
    if (!ok) {  // leave malformed input as it is
      out += s.substr(i, len);
      i += len;
      continue;
    }
    out += rebuilt;
    i = j;
  }
  return out;
}

// Removes the wrapper of `\text{X}`-like commands, keeping X.
std::string unwrap_text_commands(const std::string& s) {
  static const char* kWrappers[] = {"\\text", "\\textbf", "\\textrm", "\\mathrm", "\\mathbf", "\\mbox"};
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    bool done = false;
    if (s[i] == '\\') {
      for (const char* w : kWrappers) {
        const size_t len = std::char_traits<char>::length(w);
        if (s.compare(i, len, w) == 0 && i + len < s.size() && s[i + len] == '{') {
          const size_t end = close_brace(s, i + len);
          if (end == std::string::npos) break;
          out += unwrap_text_commands(s.substr(i + len + 1, end - i - len - 2));
          i = end;
          done = true;
          break;
        }
      }
    }
    if (!done) out += s[i++];
  }
  return out;
}

// Drops a trailing `\text{...}` / `\mbox{...}` (a unit), optionally raised to ^2 / ^3, when
// something precedes it.
std::string strip_trailing_text_unit(std::string s) {
  static const std::regex kUnit(R"(^(.*\S)\s*\\(text|mbox|textrm|mathrm)\{[^{}]*\}\s*(\^\{?[23]\}?)?\s*$)");
  std::smatch m;
  while (std::regex_match(s, m, kUnit)) {
    const std::string head = m[1].str();
    // "x^\text{..}" or "a_\text{..}": the text is an argument, not a unit.
    if (head.back() == '^' || head.back() == '_') break;
    s = head;
  }
  return s;
}

// Drops a unit word after a plain number ("5 cm", "12 inches^2").
std::string strip_trailing_unit_word(const std::string& s) {
  static const std::regex kWordUnit(
      R"(^([-+]?[0-9][0-9.,]*|[-+]?\.[0-9]+)\s+(units?|cm|mm|km|m|meters?|metres?|inch(es)?|in|feet|foot|ft|yards?|yd|miles?|mi|degrees?|cents?|dollars?|hours?|minutes?|seconds?|days?|weeks?|years?|pounds?|ounces?|grams?|kg|g|square\s+\w+|sq\s*\w+)(\^\{?[23]\}?)?\.?$)");
  std::smatch m;
  if (std::regex_match(s, m, kWordUnit)) return m[1].str();
  return s;
}

bool parse_plain_number(std::string_view s, double& v) {
  static const std::regex kNum(R"(^[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)$)");
  const std::string str(s);
  if (!std::regex_match(str, kNum)) return false;
  v = std::strtod(str.c_str(), nullptr);
  return std::isfinite(v);
}

}  // namespace

std::optional<std::string> extract_last_boxed(std::string_view text) {
  std::optional<std::string> found;
  size_t best_pos = 0;
  for (const std::string_view cmd : {std::string_view("\\boxed"), std::string_view("\\fbox")}) {
    for (size_t p = text.find(cmd); p != std::string_view::npos; p = text.find(cmd, p + 1)) {
      size_t j = p + cmd.size();
      if (j < text.size() && is_alpha(text[j])) continue;  // a longer command name
      std::optional<std::string> content;
      size_t k = j;
      while (k < text.size() && text[k] == ' ') ++k;
      if (k < text.size() && text[k] == '{') {
        const size_t end = close_brace(text, k);
        if (end != std::string_view::npos) content = std::string(text.substr(k + 1, end - k - 2));
      } else if (k > j) {  // "\boxed 5": argument up to whitespace or '$'
        size_t e = k;
        while (e < text.size() && !is_space(text[e]) && text[e] != '$') ++e;
        if (e > k) content = std::string(text.substr(k, e - k));
      }
      if (content && (!found || p >= best_pos)) {
        found = std::move(content);
        best_pos = p;
      }
    }
  }
  return found;
}

std::string normalize_math_answer(std::string_view answer) {
  std::string s = trim(answer);
  // Dollar signs: currency (\$) and math delimiters ($).
  replace_all(s, "\\$", "");
  std::erase(s, '$');
  // Spacing commands and the sizing of delimiters; a double backslash is kept as it is.
  {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\\' && i + 1 < s.size()) {
        const char c = s[i + 1];
        if (c == '!' || c == ',' || c == ';' || c == ':' || c == ' ') {
          ++i;
          continue;
        }
        if (c == '\\') {
          out += "\\\\";
          ++i;
          continue;
        }
      }
      if (s[i] == '~') continue;
      out += s[i];
    }
    s = out;
  }
  s = replace_command(s, "\\left", "");
  s = replace_command(s, "\\right", "");
  s = replace_command(s, "\\displaystyle", "");
  s = replace_command(s, "\\dfrac", "\\frac");
  s = replace_command(s, "\\tfrac", "\\frac");
  // Degrees and percent.
  replace_all(s, "^{\\circ}", "");
  replace_all(s, "^\\circ", "");
  replace_all(s, "\xc2\xb0", "");
  s = replace_command(s, "\\degree", "");
  replace_all(s, "\\%", "");
  std::erase(s, '%');
  s = trim(s);
  // Units, then the remaining text wrappers.
  s = strip_trailing_text_unit(s);
  s = unwrap_text_commands(s);
  s = trim(strip_trailing_unit_word(trim(s)));
  // A leading one- or two-letter name: "x = 5", "k=3", "x \in [-2,7]".
  {
    static const std::regex kAssign(R"(^\s*[A-Za-z]{1,2}(_\{?[A-Za-z0-9]+\}?)?\s*(=|\\in(?![A-Za-z]))\s*(.+)$)");
    std::smatch m;
    if (std::regex_match(s, m, kAssign) && m[3].str().find('=') == std::string::npos) s = m[3].str();
  }
  std::erase_if(s, [](char c) { return is_space(c); });
  s = brace_macro_args(s);
  // Thousands separators in a single number.
  replace_all(s, "{,}", "");
  {
    static const std::regex kThousands(R"(^[-+]?[0-9]{1,3}(,[0-9]{3})+(\.[0-9]+)?$)");
    if (std::regex_match(s, kThousands)) std::erase(s, ',');
  }
  if (s.size() > 1 && s.back() == '.') s.pop_back();
  if (s.size() > 1 && s[0] == '.' && is_digit(s[1])) s.insert(s.begin(), '0');
  if (s.size() > 2 && (s[0] == '-' || s[0] == '+') && s[1] == '.' && is_digit(s[2])) s.insert(s.begin() + 1, '0');
  // A lone multiple-choice letter: "(C)" -> "C".
  if (s.size() == 3 && s[0] == '(' && s[2] == ')' && std::isupper(static_cast<unsigned char>(s[1]))) s = s.substr(1, 1);
  return s;
}

std::optional<double> numeric_value(std::string_view normalized) {
  const std::string s(normalized);
  double v = 0;
  if (parse_plain_number(s, v)) return v;
  static const std::regex kFrac(R"(^([-+]?)\\frac\{([-+]?[0-9.]+)\}\{([-+]?[0-9.]+)\}$)");
  static const std::regex kSlash(R"(^([-+]?[0-9.]+)/([-+]?[0-9.]+)$)");
  static const std::regex kMixed(R"(^([-+]?)([0-9]+)\\frac\{([0-9]+)\}\{([0-9]+)\}$)");
  std::smatch m;
  double a = 0, b = 0, w = 0;
  if (std::regex_match(s, m, kFrac) && parse_plain_number(m[2].str(), a) && parse_plain_number(m[3].str(), b) && b != 0)
    return (m[1].str() == "-" ? -1.0 : 1.0) * a / b;
  if (std::regex_match(s, m, kSlash) && parse_plain_number(m[1].str(), a) && parse_plain_number(m[2].str(), b) && b != 0)
    return a / b;
  if (std::regex_match(s, m, kMixed) && parse_plain_number(m[2].str(), w) && parse_plain_number(m[3].str(), a) &&
      parse_plain_number(m[4].str(), b) && b != 0)
    return (m[1].str() == "-" ? -1.0 : 1.0) * (w + a / b);
  return std::nullopt;
}

bool math_answers_equal(std::string_view gold, std::string_view predicted) {
  const std::string g = normalize_math_answer(gold), p = normalize_math_answer(predicted);
  if (g.empty() || p.empty()) return false;
  if (g == p) return true;
  const auto gv = numeric_value(g), pv = numeric_value(p);
  if (gv && pv) return std::fabs(*gv - *pv) <= 1e-9 * std::max({1.0, std::fabs(*gv), std::fabs(*pv)});
  return false;
}

std::optional<std::string> gsm8k_gold(std::string_view answer_field) {
  const size_t p = answer_field.rfind("####");
  if (p == std::string_view::npos) return std::nullopt;
  std::string s = trim(answer_field.substr(p + 4));
  if (const size_t nl = s.find('\n'); nl != std::string::npos) s = trim(s.substr(0, nl));
  std::erase(s, ',');
  if (s.empty()) return std::nullopt;
  return s;
}

Grade grade_response(std::string_view response, std::string_view gold, Grading grading) {
  Grade g;
  g.extracted = extract_last_boxed(response);
  switch (grading) {
    case Grading::Exact:
      if (g.extracted) g.extracted = trim(*g.extracted);
      g.correct = g.extracted && *g.extracted == trim(gold);
      break;
    case Grading::Gsm8k:
      if (!g.extracted) g.extracted = gsm8k_gold(response);
      g.correct = g.extracted && math_answers_equal(gold, *g.extracted);
      break;
    case Grading::Math:
      g.correct = g.extracted && math_answers_equal(gold, *g.extracted);
      break;
  }
  return g;
}

const char* grading_name(Grading g) {
  switch (g) {
    case Grading::Math: return "math";
    case Grading::Gsm8k: return "gsm8k";
    case Grading::Exact: return "exact";
  }
  return "?";
}

}  // namespace kvevict
