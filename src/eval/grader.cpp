#include "eval/grader.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <vector>

namespace kvevict {
namespace {

constexpr size_t npos = std::string_view::npos;

bool is_alpha(char c) { return std::isalpha(static_cast<unsigned char>(c)) != 0; }
bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }
bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool is_word(char c) { return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_'; }

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

// For every unescaped '{' of s, the index of the '}' that closes it (npos when none); npos at
// every other index. One pass with an explicit stack, so nesting depth costs no call stack.
// A backslash escapes the next character (`\{`, `\}` and `\\` are not braces).
std::vector<size_t> brace_matches(std::string_view s) {
  std::vector<size_t> match(s.size(), npos);
  std::vector<size_t> open;
  for (size_t k = 0; k < s.size(); ++k) {
    if (s[k] == '\\' && k + 1 < s.size()) {
      ++k;
      continue;
    }
    if (s[k] == '{')
      open.push_back(k);
    else if (s[k] == '}' && !open.empty()) {
      match[open.back()] = k;
      open.pop_back();
    }
  }
  return match;
}

// True when s[i..] starts with the LaTeX command `cmd` (e.g. "\\dfrac") that is not the prefix of
// a longer command name.
bool command_at(std::string_view s, size_t i, std::string_view cmd) {
  return s.compare(i, cmd.size(), cmd) == 0 && (i + cmd.size() >= s.size() || !is_alpha(s[i + cmd.size()]));
}

// Replaces every occurrence of the command `cmd` (not a prefix of a longer name) by `with`.
std::string replace_command(std::string_view s, std::string_view cmd, std::string_view with) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (s[i] == '\\' && command_at(s, i, cmd)) {
      out += with;
      i += cmd.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

// Replaces every non-overlapping occurrence of `from` (left to right) by `to`; one pass.
std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  for (size_t p = s.find(from); p != npos; p = s.find(from, i)) {
    out.append(s.substr(i, p - i));
    out += to;
    i = p + from.size();
  }
  out.append(s.substr(i));
  return out;
}

// Braces the brace-less arguments of `\frac` (two) and `\sqrt` (one): `\frac43` -> `\frac{4}{3}`,
// `\frac\pi2` -> `\frac{\pi}{2}`, `\sqrt2` -> `\sqrt{2}`. An argument is a brace group, a command
// name or one character; a `\frac` or `\sqrt` whose arguments are incomplete is left as it is,
// as is `\sqrt[n]`. One left-to-right pass: braced arguments are scanned in place, brace-less ones
// are skipped (they cannot contain a macro), and the added braces are recorded per position.
std::string brace_macro_args(const std::string& s) {
  const size_t n = s.size();
  const std::vector<size_t> match = brace_matches(s);
  std::vector<uint8_t> open_at(n + 1, 0), close_at(n + 1, 0);  // braces to add before index
  std::vector<size_t> skip_to(n + 1, npos);                    // brace-less argument [i, skip_to[i])
  // End of the argument that starts at s[j], or npos when there is none.
  const auto arg_end = [&](size_t j, bool& braced) -> size_t {
    braced = false;
    if (j >= n) return npos;
    if (s[j] == '{') {
      braced = true;
      return match[j] == npos ? npos : match[j] + 1;
    }
    if (s[j] == '\\') {
      size_t e = j + 1;
      while (e < n && is_alpha(s[e])) ++e;
      return e == j + 1 ? npos : e;
    }
    if (s[j] == '}') return npos;
    return j + 1;
  };
  for (size_t i = 0; i < n;) {
    if (skip_to[i] != npos) {
      i = skip_to[i];
      continue;
    }
    int n_args = 0;
    if (s[i] == '\\' && command_at(s, i, "\\frac"))
      n_args = 2;
    else if (s[i] == '\\' && command_at(s, i, "\\sqrt") && !(i + 5 < n && s[i + 5] == '['))
      n_args = 1;
    if (n_args == 0) {
      ++i;
      continue;
    }
    std::array<size_t, 2> b{}, e{};
    std::array<bool, 2> braced{};
    size_t j = i + 5;
    bool ok = true;
    for (int a = 0; a < n_args && ok; ++a) {
      b[a] = j;
      e[a] = arg_end(j, braced[a]);
      ok = e[a] != npos;
      j = e[a];
    }
    if (ok) {
      for (int a = 0; a < n_args; ++a) {
        if (braced[a]) continue;
        open_at[b[a]] = 1;
        close_at[e[a]] = 1;
        skip_to[b[a]] = e[a];
      }
    }
    i += 5;
  }
  std::string out;
  out.reserve(n + 8);
  for (size_t i = 0; i <= n; ++i) {
    if (close_at[i]) out += '}';
    if (open_at[i]) out += '{';
    if (i < n) out += s[i];
  }
  return out;
}

// Removes the wrapper of `\text{X}`-like commands, keeping X (nested wrappers too).
std::string unwrap_text_commands(const std::string& s) {
  static constexpr std::array<std::string_view, 6> kWrappers = {"\\text",   "\\textbf", "\\textrm",
                                                                "\\mathrm", "\\mathbf", "\\mbox"};
  const std::vector<size_t> match = brace_matches(s);
  std::vector<uint8_t> drop(s.size(), 0);
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\') continue;
    for (const std::string_view w : kWrappers) {
      const size_t len = w.size();
      if (s.compare(i, len, w) == 0 && i + len < s.size() && s[i + len] == '{') {
        if (match[i + len] == npos) break;
        std::fill(drop.begin() + static_cast<std::ptrdiff_t>(i),
                  drop.begin() + static_cast<std::ptrdiff_t>(i + len + 1), 1);
        drop[match[i + len]] = 1;
        i += len;  // continue inside the group
        break;
      }
    }
  }
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i)
    if (!drop[i]) out += s[i];
  return out;
}

// Start of a power suffix `^2`, `^3`, `^{2}`, `^{3}` (also `^{2`, `^2}`) that ends at s[end - 1],
// or npos.
size_t power_suffix_start(std::string_view s, size_t end) {
  size_t t = end;
  if (t > 0 && s[t - 1] == '}') --t;
  if (t == 0 || (s[t - 1] != '2' && s[t - 1] != '3')) return npos;
  --t;
  if (t > 0 && s[t - 1] == '{') --t;
  if (t == 0 || s[t - 1] != '^') return npos;
  return t - 1;
}

// Drops trailing units written `\text{..}`, `\mbox{..}`, `\textrm{..}`, `\mathrm{..}` (the group
// holding no braces), each optionally raised to ^2 / ^3, while something non-blank precedes them
// and that something does not end in '^' or '_' (then the text is an argument, not a unit).
std::string strip_trailing_text_unit(const std::string& s) {
  static constexpr std::array<std::string_view, 4> kUnits = {"text", "mbox", "textrm", "mathrm"};
  size_t end = s.size();
  // Index where the head before a unit that ends at `e` ends (trailing blanks excluded), or npos.
  const auto head_end = [&](size_t e) -> size_t {
    while (e > 0 && is_space(s[e - 1])) --e;
    if (e == 0 || s[e - 1] != '}') return npos;
    size_t t = e - 1;
    while (t > 0 && s[t - 1] != '{' && s[t - 1] != '}') --t;
    if (t == 0 || s[t - 1] != '{') return npos;
    const size_t name_end = t - 1;
    size_t u = name_end;
    while (u > 0 && is_alpha(s[u - 1])) --u;
    if (u == 0 || s[u - 1] != '\\') return npos;
    const std::string_view name(s.data() + u, name_end - u);
    if (std::find(kUnits.begin(), kUnits.end(), name) == kUnits.end()) return npos;
    size_t h = u - 1;
    while (h > 0 && is_space(s[h - 1])) --h;
    return h == 0 ? npos : h;
  };
  for (;;) {
    size_t e = end;
    while (e > 0 && is_space(s[e - 1])) --e;
    size_t h = npos;
    if (const size_t p = power_suffix_start(s, e); p != npos) h = head_end(p);
    if (h == npos) h = head_end(e);
    if (h == npos || s[h - 1] == '^' || s[h - 1] == '_') break;
    end = h;
  }
  return s.substr(0, end);
}

// Drops a unit word after a plain number ("5 cm", "12 inches^2", "3 square feet", "7 sq ft.").
std::string strip_trailing_unit_word(const std::string& s) {
  static constexpr std::array<std::string_view, 45> kWords = {
      "unit",    "units", "cm",     "mm",     "km",      "m",       "meter",   "meters", "metre",
      "metres",  "inch",  "inches", "in",     "feet",    "foot",    "ft",      "yard",   "yards",
      "yd",      "mile",  "miles",  "mi",     "degree",  "degrees", "cent",    "cents",  "dollar",
      "dollars", "hour",  "hours",  "minute", "minutes", "second",  "seconds", "day",    "days",
      "week",    "weeks", "year",   "years",  "pound",   "pounds",  "ounce",   "ounces", "kg"};
  static constexpr std::array<std::string_view, 3> kMoreWords = {"gram", "grams", "g"};
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  if (i < s.size() && is_digit(s[i])) {
    while (i < s.size() && (is_digit(s[i]) || s[i] == '.' || s[i] == ',')) ++i;
  } else if (i + 1 < s.size() && s[i] == '.' && is_digit(s[i + 1])) {
    ++i;
    while (i < s.size() && is_digit(s[i])) ++i;
  } else {
    return s;
  }
  const size_t number_end = i;
  while (i < s.size() && is_space(s[i])) ++i;
  if (i == number_end) return s;
  size_t e = s.size();
  if (e > i && s[e - 1] == '.') --e;
  if (const size_t p = power_suffix_start(s, e); p != npos && p > i) e = p;
  const std::string_view word(s.data() + i, e - i);
  const auto all_word_chars = [](std::string_view w) { return !w.empty() && std::all_of(w.begin(), w.end(), is_word); };
  bool unit = std::find(kWords.begin(), kWords.end(), word) != kWords.end() ||
      std::find(kMoreWords.begin(), kMoreWords.end(), word) != kMoreWords.end();
  if (!unit && word.starts_with("square")) {  // "square feet"
    size_t k = 6;
    while (k < word.size() && is_space(word[k])) ++k;
    unit = k > 6 && all_word_chars(word.substr(k));
  }
  if (!unit && word.starts_with("sq")) {  // "sq ft", "sqft"
    size_t k = 2;
    while (k < word.size() && is_space(word[k])) ++k;
    unit = all_word_chars(word.substr(k));
  }
  return unit ? s.substr(0, number_end) : s;
}

// Drops a leading one- or two-letter name (optionally subscripted) followed by `=` or `\in`:
// "x = 5" -> "5", "a_1=3" -> "3", "x \in [-2,7]" -> "[-2,7]". Kept when the rest holds another
// '=' (an equation, not an assignment) or is blank.
std::string strip_leading_assignment(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && is_space(s[i])) ++i;
  size_t letters = 0;
  while (i + letters < s.size() && is_alpha(s[i + letters])) ++letters;
  if (letters < 1 || letters > 2) return s;
  i += letters;
  if (i < s.size() && s[i] == '_') {
    size_t k = i + 1;
    const bool brace = k < s.size() && s[k] == '{';
    if (brace) ++k;
    const size_t start = k;
    while (k < s.size() && std::isalnum(static_cast<unsigned char>(s[k]))) ++k;
    if (k == start) return s;
    if (k < s.size() && s[k] == '}') ++k;
    i = k;
  }
  while (i < s.size() && is_space(s[i])) ++i;
  if (i < s.size() && s[i] == '=')
    ++i;
  else if (s.compare(i, 3, "\\in") == 0 && !(i + 3 < s.size() && is_alpha(s[i + 3])))
    i += 3;
  else
    return s;
  const std::string rest = trim(std::string_view(s).substr(i));
  if (rest.empty() || rest.find('=') != std::string::npos) return s;
  return rest;
}

// "1,234" / "-12,345,678.5": a number with comma thousands separators.
bool is_thousands_number(std::string_view s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
  const size_t lead = i;
  while (i < s.size() && is_digit(s[i])) ++i;
  if (i - lead < 1 || i - lead > 3) return false;
  int groups = 0;
  while (i + 3 < s.size() && s[i] == ',' && is_digit(s[i + 1]) && is_digit(s[i + 2]) && is_digit(s[i + 3])) {
    i += 4;
    ++groups;
    if (i < s.size() && is_digit(s[i])) return false;
  }
  if (groups == 0) return false;
  if (i < s.size() && s[i] == '.') {
    const size_t f = ++i;
    while (i < s.size() && is_digit(s[i])) ++i;
    if (i == f) return false;
  }
  return i == s.size();
}

// An exact rational num/den (den > 0, reduced) in 128-bit integers.
struct Rational {
  __int128 num = 0;
  __int128 den = 1;
};

__int128 gcd128(__int128 a, __int128 b) {
  if (a < 0) a = -a;
  while (b != 0) {
    const __int128 t = a % b;
    a = b;
    b = t < 0 ? -t : t;
  }
  return a;
}

void reduce(Rational& r) {
  const __int128 g = gcd128(r.num, r.den);
  if (g > 1) r.num /= g, r.den /= g;
}

// A parsed number: exact when it fits the 128-bit rational, otherwise approximate only.
struct Number {
  bool exact = false;
  Rational r;
  long double value = 0;
  bool decimal = false;  // written with a decimal point
};

// `[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)`.
bool parse_plain_number(std::string_view s, Number& out) {
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
  size_t int_digits = 0, frac_digits = 0;
  bool point = false, overflow = false;
  Rational r{0, 1};
  constexpr __int128 kLimit = (static_cast<__int128>(1) << 120);
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '.' && !point) {
      point = true;
      continue;
    }
    if (!is_digit(c)) return false;
    (point ? frac_digits : int_digits)++;
    if (r.num >= kLimit / 10 || r.den >= kLimit / 10) {
      overflow = true;
      continue;
    }
    r.num = r.num * 10 + (c - '0');
    if (point) r.den *= 10;
  }
  if (int_digits == 0 && frac_digits == 0) return false;
  if (int_digits == 0 && !point) return false;
  out.decimal = point;
  out.value = std::strtold(std::string(s).c_str(), nullptr);
  if (!std::isfinite(out.value)) return false;
  out.exact = !overflow;
  if (out.exact) {
    if (neg) r.num = -r.num;
    reduce(r);
    out.r = r;
  }
  return true;
}

bool checked_mul(__int128 a, __int128 b, __int128& out) { return !__builtin_mul_overflow(a, b, &out); }

// a / b (b != 0) into out; false when b is 0.
bool divide(const Number& a, const Number& b, Number& out) {
  if (b.value == 0 && (!b.exact || b.r.num == 0)) return false;
  out.decimal = a.decimal || b.decimal;
  out.value = a.value / b.value;
  out.exact = false;
  if (a.exact && b.exact && b.r.num != 0) {
    Rational r;
    if (checked_mul(a.r.num, b.r.den, r.num) && checked_mul(a.r.den, b.r.num, r.den)) {
      if (r.den < 0) r.num = -r.num, r.den = -r.den;
      reduce(r);
      out.r = r;
      out.exact = true;
    }
  }
  return std::isfinite(out.value);
}

// `{X}` at s[i..] with no brace inside X: sets inner to X and returns the index past '}'.
size_t simple_group(std::string_view s, size_t i, std::string_view& inner) {
  if (i >= s.size() || s[i] != '{') return npos;
  const size_t close = s.find_first_of("{}", i + 1);
  if (close == npos || s[close] != '}') return npos;
  inner = s.substr(i + 1, close - i - 1);
  return close + 1;
}

// Parses the numeric forms listed on numeric_value.
std::optional<Number> parse_number(std::string_view s) {
  Number n;
  if (parse_plain_number(s, n)) return n;
  const auto negate = [](Number& x) {
    x.value = -x.value;
    x.r.num = -x.r.num;
  };
  // [-+]?\frac{A}{B} and [-+]?W\frac{A}{B} (mixed; W, A, B unsigned integers).
  size_t i = 0;
  bool neg = false;
  if (i < s.size() && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
  const size_t w_start = i;
  while (i < s.size() && is_digit(s[i])) ++i;
  const std::string_view whole = s.substr(w_start, i - w_start);
  if (s.compare(i, 5, "\\frac") == 0) {
    std::string_view a, b;
    size_t j = simple_group(s, i + 5, a);
    if (j != npos) j = simple_group(s, j, b);
    Number na, nb, q;
    if (j == s.size() && parse_plain_number(a, na) && parse_plain_number(b, nb)) {
      if (whole.empty()) {
        if (!divide(na, nb, q)) return std::nullopt;
        if (neg) negate(q);
        return q;
      }
      // Mixed number: unsigned integer parts only.
      const auto is_uint = [](std::string_view x) { return !x.empty() && std::all_of(x.begin(), x.end(), is_digit); };
      Number nw;
      if (!is_uint(a) || !is_uint(b) || !parse_plain_number(whole, nw) || !divide(na, nb, q)) return std::nullopt;
      Number sum = q;
      sum.value = nw.value + q.value;
      sum.exact = false;
      __int128 wd = 0;
      if (nw.exact && q.exact && checked_mul(nw.r.num, q.r.den, wd) &&
          !__builtin_add_overflow(wd, q.r.num, &sum.r.num)) {
        sum.r.den = q.r.den;
        reduce(sum.r);
        sum.exact = true;
      }
      if (neg) negate(sum);
      return sum;
    }
    return std::nullopt;
  }
  // A/B with signed plain numbers.
  if (const size_t slash = s.find('/'); slash != npos) {
    Number na, nb, q;
    if (parse_plain_number(s.substr(0, slash), na) && parse_plain_number(s.substr(slash + 1), nb) && divide(na, nb, q))
      return q;
  }
  return std::nullopt;
}

// True when the reduced rational has a finite decimal expansion (denominator 2^a 5^b).
bool terminates(const Rational& r) {
  __int128 d = r.den;
  while (d % 2 == 0) d /= 2;
  while (d % 5 == 0) d /= 5;
  return d == 1;
}

bool within_decimal_tolerance(long double a, long double b) {
  return std::fabs(a - b) <= static_cast<long double>(kDecimalRelTol) * std::max(std::fabs(a), std::fabs(b));
}

}  // namespace

std::optional<BoxedRange> last_boxed_range(std::string_view text) {
  const std::vector<size_t> match = brace_matches(text);
  size_t best_pos = npos, best_begin = 0, best_end = 0;
  for (const std::string_view cmd : {std::string_view("\\boxed"), std::string_view("\\fbox")}) {
    for (size_t p = text.find(cmd); p != npos; p = text.find(cmd, p + 1)) {
      const size_t j = p + cmd.size();
      if (j < text.size() && is_alpha(text[j])) continue;  // a longer command name
      size_t k = j, b = 0, e = 0;
      bool found = false;
      while (k < text.size() && text[k] == ' ') ++k;
      if (k < text.size() && text[k] == '{') {
        if (match[k] != npos) b = k + 1, e = match[k], found = true;
      } else if (k > j) {  // "\boxed 5": argument up to whitespace or '$'
        size_t x = k;
        while (x < text.size() && !is_space(text[x]) && text[x] != '$') ++x;
        if (x > k) b = k, e = x, found = true;
      }
      if (found && (best_pos == npos || p >= best_pos)) best_pos = p, best_begin = b, best_end = e;
    }
  }
  if (best_pos == npos) return std::nullopt;
  return BoxedRange{best_begin, best_end};
}

std::optional<std::string> extract_last_boxed(std::string_view text) {
  const std::optional<BoxedRange> r = last_boxed_range(text);
  if (!r) return std::nullopt;
  return std::string(text.substr(r->begin, r->end - r->begin));
}

std::string normalize_math_answer(std::string_view answer) {
  std::string s = trim(answer);
  // Dollar signs: currency (\$) and math delimiters ($).
  s = replace_all(s, "\\$", "");
  std::erase(s, '$');
  // Spacing commands and the sizing of delimiters; a double backslash is kept as it is.
  {
    std::string out;
    out.reserve(s.size());
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
    s = std::move(out);
  }
  s = replace_command(s, "\\left", "");
  s = replace_command(s, "\\right", "");
  s = replace_command(s, "\\displaystyle", "");
  s = replace_command(s, "\\dfrac", "\\frac");
  s = replace_command(s, "\\tfrac", "\\frac");
  // Degrees and percent.
  s = replace_all(s, "^{\\circ}", "");
  s = replace_all(s, "^\\circ", "");
  s = replace_all(s, "\xc2\xb0", "");
  s = replace_command(s, "\\degree", "");
  s = replace_all(s, "\\%", "");
  std::erase(s, '%');
  s = trim(s);
  // Units, then the remaining text wrappers.
  s = strip_trailing_text_unit(s);
  s = unwrap_text_commands(s);
  s = trim(strip_trailing_unit_word(trim(s)));
  s = strip_leading_assignment(s);
  std::erase_if(s, [](char c) { return is_space(c); });
  s = brace_macro_args(s);
  // Thousands separators in a single number.
  s = replace_all(s, "{,}", "");
  if (is_thousands_number(s)) std::erase(s, ',');
  if (s.size() > 1 && s.back() == '.') s.pop_back();
  if (s.size() > 1 && s[0] == '.' && is_digit(s[1])) s.insert(s.begin(), '0');
  if (s.size() > 2 && (s[0] == '-' || s[0] == '+') && s[1] == '.' && is_digit(s[2])) s.insert(s.begin() + 1, '0');
  // A lone multiple-choice letter: "(C)" -> "C".
  if (s.size() == 3 && s[0] == '(' && s[2] == ')' && std::isupper(static_cast<unsigned char>(s[1]))) s = s.substr(1, 1);
  return s;
}

std::optional<double> numeric_value(std::string_view normalized) {
  const std::optional<Number> n = parse_number(normalized);
  if (!n) return std::nullopt;
  return static_cast<double>(n->value);
}

bool math_answers_equal(std::string_view gold, std::string_view predicted) {
  if (gold.size() > kMaxAnswerBytes || predicted.size() > kMaxAnswerBytes) return false;
  const std::string g = normalize_math_answer(gold), p = normalize_math_answer(predicted);
  if (g.empty() || p.empty()) return false;
  if (g == p) return true;
  const std::optional<Number> gv = parse_number(g), pv = parse_number(p);
  if (!gv || !pv) return false;
  if (gv->exact && pv->exact) {
    if (gv->r.num == pv->r.num && gv->r.den == pv->r.den) return true;
    // A rounded decimal stands for a value that has no finite decimal expansion.
    if ((gv->decimal && !terminates(pv->r)) || (pv->decimal && !terminates(gv->r)))
      return within_decimal_tolerance(gv->value, pv->value);
    return false;
  }
  // Beyond 128-bit exactness: only a decimal side gets the tolerance.
  if (gv->decimal || pv->decimal) return within_decimal_tolerance(gv->value, pv->value);
  return false;
}

std::optional<std::string> gsm8k_gold(std::string_view answer_field) {
  const size_t p = answer_field.rfind("####");
  if (p == npos) return std::nullopt;
  std::string s = trim(answer_field.substr(p + 4));
  if (const size_t nl = s.find('\n'); nl != std::string::npos) s = trim(s.substr(0, nl));
  std::erase(s, ',');
  if (s.empty()) return std::nullopt;
  return s;
}

Grade grade_response(std::string_view response, std::string_view gold, Grading grading) noexcept {
  Grade g;
  try {
    g.extracted = extract_last_boxed(response);
    if (!g.extracted && grading == Grading::Gsm8k) g.extracted = gsm8k_gold(response);
    if (!g.extracted) {
      g.outcome = GradeOutcome::NoAnswer;
      return g;
    }
    if (g.extracted->size() > kMaxAnswerBytes) {
      g.extracted.reset();
      g.outcome = GradeOutcome::AnswerTooLong;
      return g;
    }
    if (gold.size() > kMaxAnswerBytes) {
      g.outcome = GradeOutcome::GoldTooLong;
      return g;
    }
    if (grading == Grading::Exact) {
      g.extracted = trim(*g.extracted);
      g.correct = *g.extracted == trim(gold);
    } else {
      g.correct = math_answers_equal(gold, *g.extracted);
    }
  } catch (const std::exception& e) {
    g = Grade{};
    g.outcome = GradeOutcome::GraderError;
    g.error = e.what();
  }
  return g;
}

const char* grade_outcome_name(GradeOutcome o) {
  switch (o) {
    case GradeOutcome::Graded:
      return "graded";
    case GradeOutcome::NoAnswer:
      return "no_answer";
    case GradeOutcome::AnswerTooLong:
      return "answer_too_long";
    case GradeOutcome::GoldTooLong:
      return "gold_too_long";
    case GradeOutcome::GraderError:
      return "grader_error";
  }
  return "?";
}

}  // namespace kvevict
