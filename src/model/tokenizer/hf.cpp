// tokenizer.json pipeline (see hf.h for the behaviour and its source).
#include "model/tokenizer/hf.h"

#include <fmt/format.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "util/error.h"
#include "util/utf8.h"

namespace kvevict::tok {
namespace {

using json = nlohmann::json;

// GPT-2's pre-tokenizer pattern (tokenizers' ByteLevel with use_regex = true).
constexpr const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581

std::string type_of(const json& j) { return j.type_name(); }

const json* field(const json& obj, const char* key) {
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

std::string get_string(const json& obj, const char* key, const std::string& ctx, const std::string& where) {
  const json* v = field(obj, key);
  if (v == nullptr) throw Error(fmt::format("{}: {}.{} is missing", where, ctx, key));
  if (!v->is_string()) throw Error(fmt::format("{}: {}.{} is a {}, expected a string", where, ctx, key, type_of(*v)));
  return v->get<std::string>();
}

bool get_bool(const json& obj, const char* key, bool fallback, const std::string& ctx, const std::string& where) {
  const json* v = field(obj, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) throw Error(fmt::format("{}: {}.{} is a {}, expected a boolean", where, ctx, key, type_of(*v)));
  return v->get<bool>();
}

// The "type" of a component object, or an error naming the component.
std::string component_type(const json& c, const std::string& ctx, const std::string& where) {
  if (!c.is_object()) throw Error(fmt::format("{}: {} is a {}, expected an object", where, ctx, type_of(c)));
  return get_string(c, "type", ctx, where);
}

[[noreturn]] void not_implemented(const std::string& where, const std::string& ctx, const std::string& what) {
  throw Error(fmt::format("{}: {} {} is not implemented (refused rather than ignored)", where, ctx, what));
}

// The pattern of a Split / Replace: {"Regex": "..."} or {"String": "..."}.
struct Pattern {
  bool regex;
  std::string text;
};
Pattern get_pattern(const json& c, const std::string& ctx, const std::string& where) {
  const json* p = field(c, "pattern");
  if (p == nullptr || !p->is_object())
    throw Error(fmt::format("{}: {}.pattern is missing or not an object", where, ctx));
  if (const json* r = field(*p, "Regex"); r != nullptr && r->is_string()) return {true, r->get<std::string>()};
  if (const json* s = field(*p, "String"); s != nullptr && s->is_string()) return {false, s->get<std::string>()};
  throw Error(fmt::format("{}: {}.pattern has neither a \"Regex\" nor a \"String\" entry", where, ctx));
}

// A PCRE2 pattern matching `s` literally.
std::string quote_regex(const std::string& s) {
  std::string out;
  for (const char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}-/#").find(c) != std::string_view::npos) out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// Rust's char::is_whitespace: the Unicode White_Space property.
bool is_white(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
      (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Decodes the valid UTF-8 character at s[i] into cp and returns its length, or 0 when the bytes
// there are not a well-formed character.
size_t decode_char(std::string_view s, size_t i, uint32_t& cp) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
  if (n == 0 || i + n > s.size() || !utf8_valid(s.substr(i, n))) return 0;
  cp = n == 1 ? c : n == 2 ? (c & 0x1Fu) : n == 3 ? (c & 0x0Fu) : (c & 0x07u);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
  return n;
}

// Bytes of whitespace at the start of s.
size_t leading_white(std::string_view s) {
  size_t i = 0;
  uint32_t cp = 0;
  while (i < s.size()) {
    const size_t n = decode_char(s, i, cp);
    if (n == 0 || !is_white(cp)) break;
    i += n;
  }
  return i;
}

// Start of the whitespace run that ends s (s.size() when none).
size_t trailing_white_start(std::string_view s) {
  size_t start = s.size();
  while (start > 0) {
    size_t i = start - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    uint32_t cp = 0;
    if (decode_char(s, i, cp) != start - i || !is_white(cp)) break;
    start = i;
  }
  return start;
}

std::string nfc_valid(std::string_view s) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &out,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    std::free(out);
    throw Error(std::string("Tokenizer: NFC normalization failed: ") + utf8proc_errmsg(n));
  }
  std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

}  // namespace

std::string nfc(std::string_view s) {
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
    return std::string(s);
  std::string out;
  size_t run = 0, i = 0;
  uint32_t cp = 0;
  while (i < s.size()) {
    const size_t n = decode_char(s, i, cp);
    if (n > 0) {
      i += n;
      continue;
    }
    if (i > run) out += nfc_valid(s.substr(run, i - run));
    out.push_back(s[i]);  // an invalid byte stays as it is
    run = ++i;
  }
  if (i > run) out += nfc_valid(s.substr(run, i - run));
  return out;
}

HfPipeline::HfPipeline(const json& tj, const PieceIndex& index, const std::string& where) {
  // Added tokens (ids resolved by the caller's index; contents checked there too).
  if (const json* at = field(tj, "added_tokens")) {
    if (!at->is_array()) throw Error(fmt::format("{}: added_tokens is a {}, expected an array", where, type_of(*at)));
    for (size_t i = 0; i < at->size(); ++i) {
      const json& t = (*at)[i];
      const std::string ctx = fmt::format("added_tokens[{}]", i);
      if (!t.is_object()) throw Error(fmt::format("{}: {} is a {}, expected an object", where, ctx, type_of(t)));
      HfAddedToken a;
      a.content = get_string(t, "content", ctx, where);
      if (a.content.empty()) throw Error(fmt::format("{}: {}.content is empty", where, ctx));
      a.id = find_piece(index, a.content);
      a.special = get_bool(t, "special", false, ctx, where);
      a.normalized = get_bool(t, "normalized", !a.special, ctx, where);
      a.lstrip = get_bool(t, "lstrip", false, ctx, where);
      a.rstrip = get_bool(t, "rstrip", false, ctx, where);
      if (get_bool(t, "single_word", false, ctx, where))
        not_implemented(where, ctx + " ('" + a.content + "')", "single_word = true");
      added_.push_back(std::move(a));
    }
  }
  if (const json* n = field(tj, "normalizer")) parse_normalizer(*n, where);
  if (const json* p = field(tj, "pre_tokenizer")) parse_pre_tokenizer(*p, where);
  for (const HfAddedToken& a : added_) patterns_.push_back(a.normalized ? normalize(a.content) : a.content);

  // Model: BPE only.
  const json* m = field(tj, "model");
  if (m == nullptr) throw Error(fmt::format("{}: model is missing", where));
  const std::string mtype = m->is_object() && m->contains("type") ? component_type(*m, "model", where) : "BPE";
  if (mtype != "BPE") not_implemented(where, "model.type", "'" + mtype + "' (supported: BPE)");
  if (const json* d = field(*m, "dropout"); d != nullptr && !(d->is_number() && d->get<double>() == 0.0))
    not_implemented(where, "model.dropout", d->dump() + " (BPE dropout is random)");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* v = field(*m, k); v != nullptr && !(v->is_string() && v->get<std::string>().empty()))
      not_implemented(where, std::string("model.") + k, v->dump());
  BpeOptions o;
  o.byte_level = byte_level_;
  o.byte_fallback = get_bool(*m, "byte_fallback", false, "model", where);
  o.fuse_unk = get_bool(*m, "fuse_unk", false, "model", where);
  o.ignore_merges = get_bool(*m, "ignore_merges", false, "model", where);
  o.last_duplicate_wins = true;
  o.strict_merges = true;
  if (const json* u = field(*m, "unk_token")) {
    if (!u->is_string()) throw Error(fmt::format("{}: model.unk_token is a {}, expected a string", where, type_of(*u)));
    o.unk_id = find_piece(index, u->get<std::string>());
    if (o.unk_id < 0)
      throw Error(fmt::format("{}: model.unk_token '{}' is not in the vocabulary", where, u->get<std::string>()));
  }
  if (byte_level_ && (o.byte_fallback || o.unk_id >= 0)) {
    // Harmless for a byte-level model (every byte has a piece), but not what tokenizers does:
    // it would apply them to the byte characters. Refuse the unusual combination.
    if (o.byte_fallback) not_implemented(where, "model.byte_fallback", "= true with a ByteLevel pre-tokenizer");
  }
  std::vector<std::pair<std::string, std::string>> merges;
  if (const json* mg = field(*m, "merges")) {
    if (!mg->is_array()) throw Error(fmt::format("{}: model.merges is a {}, expected an array", where, type_of(*mg)));
    merges.reserve(mg->size());
    for (size_t i = 0; i < mg->size(); ++i) {
      const json& e = (*mg)[i];
      if (e.is_string()) {
        const std::string& s = e.get_ref<const std::string&>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos)
          throw Error(fmt::format("{}: model.merges[{}] = '{}' has no space separating its two parts", where, i, s));
        merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      } else {
        throw Error(fmt::format("{}: model.merges[{}] is neither \"left right\" nor [left, right]", where, i));
      }
    }
  }
  bpe_.emplace(index, merges, o, where + ": model.merges");

  // Decoder: must undo what the model does, token by token (Tokenizer::piece).
  const json* dec = field(tj, "decoder");
  if (dec == nullptr) not_implemented(where, "decoder", "null");
  std::vector<const json*> parts;
  if (component_type(*dec, "decoder", where) == "Sequence") {
    const json* ds = field(*dec, "decoders");
    if (ds == nullptr || !ds->is_array()) throw Error(fmt::format("{}: decoder.decoders is not an array", where));
    for (const json& d : *ds) parts.push_back(&d);
  } else {
    parts.push_back(dec);
  }
  for (const json* d : parts) {
    const std::string t = component_type(*d, "decoder", where);
    const bool ok = byte_level_ ? t == "ByteLevel"
                                : t == "ByteFallback" || t == "Fuse" ||
            (t == "Replace" && get_pattern(*d, "decoder", where).text == kSpaceMark &&
             get_string(*d, "content", "decoder", where) == " ") ||
            (t == "Strip" && get_string(*d, "content", "decoder", where) == " ") ||
            (t == "Metaspace" && get_string(*d, "replacement", "decoder", where) == kSpaceMark);
    if (!ok)
      not_implemented(where, "decoder",
                      "'" + t + "' with a " + (byte_level_ ? "ByteLevel" : "non-ByteLevel") +
                          " pre-tokenizer (supported: ByteLevel; or Replace U+2581 -> ' ', ByteFallback, Fuse, "
                          "Strip, Metaspace)");
  }
}

void HfPipeline::parse_normalizer(const json& n, const std::string& where) {
  const std::string t = component_type(n, "normalizer", where);
  if (t == "Sequence") {
    const json* ns = field(n, "normalizers");
    if (ns == nullptr || !ns->is_array()) throw Error(fmt::format("{}: normalizer.normalizers is not an array", where));
    for (const json& c : *ns) parse_normalizer(c, where);
  } else if (t == "NFC") {
    norm_.push_back({NormStep::Nfc, {}, {}});
  } else if (t == "Prepend") {
    norm_.push_back({NormStep::Prepend, get_string(n, "prepend", "normalizer", where), {}});
  } else if (t == "Replace") {
    const Pattern p = get_pattern(n, "normalizer", where);
    if (p.regex) not_implemented(where, "normalizer Replace", "with a Regex pattern");
    if (p.text.empty()) not_implemented(where, "normalizer Replace", "with an empty pattern");
    norm_.push_back({NormStep::Replace, p.text, get_string(n, "content", "normalizer", where)});
  } else {
    not_implemented(where, "normalizer", "'" + t + "' (supported: NFC, Prepend, Replace, Sequence)");
  }
}

void HfPipeline::parse_pre_tokenizer(const json& p, const std::string& where) {
  const std::string t = component_type(p, "pre_tokenizer", where);
  const std::string ctx = "pre_tokenizer " + t;
  if (t == "Sequence") {
    const json* ps = field(p, "pretokenizers");
    if (ps == nullptr || !ps->is_array())
      throw Error(fmt::format("{}: pre_tokenizer.pretokenizers is not an array", where));
    for (const json& c : *ps) parse_pre_tokenizer(c, where);
  } else if (t == "Split") {
    const Pattern pat = get_pattern(p, ctx, where);
    const std::string behavior = get_string(p, "behavior", ctx, where);
    if (behavior != "Isolated") not_implemented(where, ctx, "behavior '" + behavior + "' (supported: Isolated)");
    if (get_bool(p, "invert", false, ctx, where)) not_implemented(where, ctx, "invert = true");
    PreStep s;
    s.kind = PreStep::Split;
    s.regex = std::make_shared<const RegexSplitter>(pat.regex ? pat.text : quote_regex(pat.text), where + ": " + ctx);
    pre_.push_back(std::move(s));
  } else if (t == "ByteLevel") {
    PreStep s;
    s.kind = PreStep::ByteLevel;
    s.add_prefix_space = get_bool(p, "add_prefix_space", true, ctx, where);
    if (get_bool(p, "use_regex", true, ctx, where))
      s.regex = std::make_shared<const RegexSplitter>(kGpt2Regex, where + ": " + ctx);
    pre_.push_back(std::move(s));
    byte_level_ = true;
  } else if (t == "Metaspace") {
    PreStep s;
    s.kind = PreStep::Metaspace;
    s.replacement = get_string(p, "replacement", ctx, where);
    if (s.replacement != kSpaceMark)
      not_implemented(where, ctx, "replacement '" + s.replacement + "' (supported: U+2581)");
    std::string scheme = "always";
    if (field(p, "prepend_scheme") != nullptr) {
      scheme = get_string(p, "prepend_scheme", ctx, where);
    } else if (!get_bool(p, "add_prefix_space", true, ctx, where)) {
      scheme = "never";  // the older spelling of prepend_scheme
    }
    if (scheme == "always") {
      s.prepend = PreStep::Always;
    } else if (scheme == "first") {
      s.prepend = PreStep::First;
    } else if (scheme == "never") {
      s.prepend = PreStep::Never;
    } else {
      not_implemented(where, ctx, "prepend_scheme '" + scheme + "'");
    }
    s.split = get_bool(p, "split", true, ctx, where);
    pre_.push_back(std::move(s));
  } else {
    not_implemented(where, "pre_tokenizer", "'" + t + "' (supported: Split, ByteLevel, Metaspace, Sequence)");
  }
}

std::string HfPipeline::normalize(std::string_view s) const {
  std::string cur(s);
  for (const NormStep& n : norm_) {
    switch (n.kind) {
      case NormStep::Nfc:
        cur = nfc(cur);
        break;
      case NormStep::Prepend:
        if (!cur.empty()) cur.insert(0, n.a);
        break;
      case NormStep::Replace:
        cur = replace_all(cur, n.a, n.b);
        break;
    }
  }
  return cur;
}

// Cuts the added tokens of one pass (normalized or not) out of every text piece: leftmost-longest
// over all tokens of the pass, lstrip/rstrip, special ones skipped (left as text) unless
// parse_special.
void HfPipeline::split_added(std::vector<Piece>& pieces, bool normalized_pass, bool parse_special) const {
  // Candidates by first byte, longest pattern first (so the first hit at a position is the
  // longest).
  std::array<std::vector<size_t>, 256> cands;
  bool any = false;
  for (size_t k = 0; k < added_.size(); ++k) {
    if (added_[k].normalized != normalized_pass || added_[k].id < 0 || patterns_[k].empty()) continue;
    cands[static_cast<unsigned char>(patterns_[k][0])].push_back(k);
    any = true;
  }
  if (!any) return;
  for (auto& c : cands)
    std::stable_sort(c.begin(), c.end(), [&](size_t a, size_t b) { return patterns_[a].size() > patterns_[b].size(); });
  std::vector<Piece> out;
  for (Piece& p : pieces) {
    if (p.token >= 0) {
      out.push_back(std::move(p));
      continue;
    }
    const std::string_view s = p.text;
    size_t start_offset = 0, pos = 0;
    const auto emit_text = [&](size_t a, size_t b) {
      if (b > a) out.push_back(Piece{std::string(s.substr(a, b - a)), -1, p.at_start && a == 0});
    };
    while (pos < s.size()) {
      size_t hit = SIZE_MAX;
      for (const size_t k : cands[static_cast<unsigned char>(s[pos])]) {
        if (s.compare(pos, patterns_[k].size(), patterns_[k]) == 0) {
          hit = k;
          break;
        }
      }
      if (hit == SIZE_MAX) {
        ++pos;
        continue;
      }
      const HfAddedToken& a = added_[hit];
      size_t start = pos, stop = pos + patterns_[hit].size();
      pos = stop;
      if (a.special && !parse_special) continue;  // matched, then skipped: its text stays text
      if (a.lstrip) start = std::max(start_offset, trailing_white_start(s.substr(0, start)));
      if (a.rstrip) stop += leading_white(s.substr(stop));
      emit_text(start_offset, start);
      out.push_back(Piece{std::string(), a.id, false});
      start_offset = pos = stop;
    }
    emit_text(start_offset, s.size());
  }
  pieces.swap(out);
}

void HfPipeline::pre_tokenize(const Piece& p, std::vector<std::string>& words) const {
  struct Word {
    std::string text;
    bool at_start;
  };
  std::vector<Word> cur{{p.text, p.at_start}}, next;
  for (const PreStep& st : pre_) {
    next.clear();
    for (Word& w : cur) {
      if (st.kind == PreStep::Metaspace) {
        std::string t = replace_all(w.text, " ", st.replacement);
        const bool starts = t.compare(0, st.replacement.size(), st.replacement) == 0;
        if (!t.empty() && !starts && (st.prepend == PreStep::Always || (st.prepend == PreStep::First && w.at_start)))
          t.insert(0, st.replacement);
        if (!st.split) {
          next.push_back({std::move(t), w.at_start});
          continue;
        }
        // MergedWithNext: every replacement character starts a new piece.
        size_t a = 0, search = 0;
        bool first = true;
        while (true) {
          const size_t b = t.find(st.replacement, search);
          if (b == std::string::npos) break;
          if (b > a) {
            next.push_back({t.substr(a, b - a), w.at_start && first});
            first = false;
            a = b;
          }
          search = b + st.replacement.size();
        }
        if (a < t.size()) next.push_back({t.substr(a), w.at_start && first});
        continue;
      }
      std::string t = std::move(w.text);
      if (st.kind == PreStep::ByteLevel && st.add_prefix_space && !t.empty() && t[0] != ' ') t.insert(0, " ");
      if (!st.regex) {
        next.push_back({std::move(t), w.at_start});
        continue;
      }
      bool first = true;
      for (const std::string_view v : st.regex->split(t)) {
        next.push_back({std::string(v), w.at_start && first});
        first = false;
      }
    }
    cur.swap(next);
  }
  for (Word& w : cur)
    if (!w.text.empty()) words.push_back(std::move(w.text));
}

void HfPipeline::encode(std::string_view text, bool parse_special, const PieceIndex& index,
                        std::vector<int32_t>& out) const {
  std::vector<Piece> pieces;
  if (!text.empty()) pieces.push_back(Piece{std::string(text), -1, true});
  split_added(pieces, false, parse_special);
  for (Piece& p : pieces)
    if (p.token < 0) p.text = normalize(p.text);
  split_added(pieces, true, parse_special);
  std::vector<std::string> words;
  for (const Piece& p : pieces) {
    if (p.token >= 0) {
      out.push_back(p.token);
      continue;
    }
    words.clear();
    pre_tokenize(p, words);
    for (const std::string& w : words) bpe_->tokenize_word(w, index, out);
  }
}

}  // namespace kvevict::tok
