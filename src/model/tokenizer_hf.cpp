// Tokenizer::from_hf: the vocabulary, special tokens and BOS/EOS rules of a Hugging Face
// checkpoint's tokenizer files (see tokenizer.h); the encoding pipeline is tokenizer/hf.h.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "model/tokenizer.h"
#include "model/tokenizer/bpe.h"
#include "model/tokenizer/hf.h"
#include "util/error.h"
#include "util/json_file.h"

namespace kvevict {
namespace {

using json = nlohmann::json;

// tokenizer.json of the largest vocabularies is ~35 MB (Gemma); the other files are small.
constexpr int64_t kMaxTokenizerJson = int64_t{512} << 20;
constexpr int64_t kMaxSmallJson = int64_t{64} << 20;

std::optional<json> read_optional(const std::string& path) {
  if (!std::filesystem::exists(path)) return std::nullopt;
  json j = read_json_file(path, kMaxSmallJson);
  if (!j.is_object()) throw Error(fmt::format("{}: is a JSON {}, expected an object", path, j.type_name()));
  return j;
}

// A special token named in tokenizer_config.json: a string, or an AddedToken object {content}.
// Returns "" for null/absent.
std::string token_text(const json& cfg, const char* key, const std::string& path) {
  const auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  throw Error(
      fmt::format("{}: {} is a {}, expected a string or an object with \"content\"", path, key, it->type_name()));
}

std::optional<bool> opt_bool(const json& cfg, const char* key, const std::string& path) {
  const auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) throw Error(fmt::format("{}: {} is a {}, expected a boolean", path, key, it->type_name()));
  return it->get<bool>();
}

// Token ids of `key` in a config file: an integer or a list of integers (generation_config's
// eos_token_id may list several).
std::vector<int64_t> id_list(const json& cfg, const char* key, const std::string& path) {
  const auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return {};
  const auto one = [&](const json& v) -> int64_t {
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      throw Error(fmt::format("{}: {} holds {}, expected a non-negative integer token id", path, key, v.dump()));
    return v.get<int64_t>();
  };
  if (it->is_array()) {
    std::vector<int64_t> out;
    for (const json& v : *it) out.push_back(one(v));
    return out;
  }
  return {one(*it)};
}

// The ids TemplateProcessing puts before and after the sequence ($A) of a single input.
struct Template {
  bool present = false;
  std::vector<int32_t> prefix, suffix;
};

void parse_post_processor(const json& pp, const std::string& where, Template& t) {
  if (pp.is_null()) return;
  if (!pp.is_object() || !pp.contains("type") || !pp["type"].is_string())
    throw Error(fmt::format("{}: post_processor has no \"type\"", where));
  const std::string type = pp["type"].get<std::string>();
  if (type == "Sequence") {
    if (!pp.contains("processors") || !pp["processors"].is_array())
      throw Error(fmt::format("{}: post_processor.processors is not an array", where));
    for (const json& p : pp["processors"]) parse_post_processor(p, where, t);
    return;
  }
  if (type == "ByteLevel") return;  // offsets only (trim_offsets); ids unchanged
  if (type != "TemplateProcessing")
    throw Error(
        fmt::format("{}: post_processor '{}' is not implemented (supported: TemplateProcessing, ByteLevel, "
                    "Sequence)",
                    where, type));
  t.present = true;
  if (!pp.contains("single") || !pp["single"].is_array())
    throw Error(fmt::format("{}: post_processor.single is not an array", where));
  const json specials = pp.value("special_tokens", json::object());
  bool seen_sequence = false;
  for (const json& item : pp["single"]) {
    if (item.contains("Sequence")) {
      if (seen_sequence) throw Error(fmt::format("{}: post_processor.single holds two sequences", where));
      seen_sequence = true;
      continue;
    }
    if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id") ||
        !item["SpecialToken"]["id"].is_string())
      throw Error(fmt::format("{}: post_processor.single has an item that is neither Sequence nor SpecialToken: {}",
                              where, item.dump()));
    const std::string name = item["SpecialToken"]["id"].get<std::string>();
    const auto st = specials.find(name);
    if (st == specials.end() || !st->contains("ids") || !(*st)["ids"].is_array() || (*st)["ids"].size() != 1 ||
        !(*st)["ids"][0].is_number_integer())
      throw Error(fmt::format("{}: post_processor.special_tokens['{}'] must list exactly one id", where, name));
    const int64_t id = (*st)["ids"][0].get<int64_t>();
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      throw Error(fmt::format("{}: post_processor.special_tokens['{}'] id {} is out of range", where, name, id));
    (seen_sequence ? t.suffix : t.prefix).push_back(static_cast<int32_t>(id));
  }
  if (t.prefix.size() > 1 || t.suffix.size() > 1)
    throw Error(
        fmt::format("{}: post_processor.single adds {} tokens before and {} after the text; kvevict "
                    "implements at most one BOS and one EOS",
                    where, t.prefix.size(), t.suffix.size()));
}

}  // namespace

Tokenizer Tokenizer::from_hf(const std::string& dir, int64_t n_vocab_rows) {
  const std::string tpath = dir + "/tokenizer.json";
  if (!std::filesystem::exists(tpath))
    throw Error(
        fmt::format("{}: no tokenizer.json (kvevict reads the `tokenizers` file; a SentencePiece "
                    "tokenizer.model alone is not supported)",
                    dir));
  const json tj = read_json_file(tpath, kMaxTokenizerJson);
  if (!tj.is_object()) throw Error(fmt::format("{}: is a JSON {}, expected an object", tpath, tj.type_name()));
  const std::string cpath = dir + "/tokenizer_config.json", gpath = dir + "/generation_config.json",
                    mpath = dir + "/config.json";
  const std::optional<json> tc = read_optional(cpath), gc = read_optional(gpath), mc = read_optional(mpath);

  // Vocabulary: model.vocab (piece -> id) and added_tokens (id, content).
  const auto mit = tj.find("model");
  if (mit == tj.end() || !mit->is_object()) throw Error(fmt::format("{}: model is missing or not an object", tpath));
  const auto vit = mit->find("vocab");
  if (vit == mit->end() || !vit->is_object())
    throw Error(fmt::format("{}: model.vocab is missing or not an object (piece -> id)", tpath));
  std::map<int64_t, std::string> by_id;
  const auto add = [&](const std::string& piece, const json& idv, const std::string& ctx) {
    if (!idv.is_number_integer() || idv.get<int64_t>() < 0 || idv.get<int64_t>() >= std::numeric_limits<int32_t>::max())
      throw Error(fmt::format("{}: {} has id {}, expected an integer in [0, 2^31 - 1)", tpath, ctx, idv.dump()));
    const int64_t id = idv.get<int64_t>();
    const auto [it, fresh] = by_id.emplace(id, piece);
    if (!fresh && it->second != piece)
      throw Error(fmt::format("{}: id {} is given to both '{}' and '{}' ({})", tpath, id, it->second, piece, ctx));
  };
  for (const auto& [piece, idv] : vit->items()) add(piece, idv, "model.vocab['" + piece + "']");
  std::vector<std::pair<int64_t, bool>> added;  // id, special
  if (const auto at = tj.find("added_tokens"); at != tj.end() && at->is_array()) {
    for (size_t i = 0; i < at->size(); ++i) {
      const json& a = (*at)[i];
      if (!a.is_object() || !a.contains("content") || !a["content"].is_string() || !a.contains("id"))
        throw Error(fmt::format("{}: added_tokens[{}] needs \"id\" and a string \"content\"", tpath, i));
      add(a["content"].get<std::string>(), a["id"], fmt::format("added_tokens[{}]", i));
      added.emplace_back(a["id"].get<int64_t>(), a.value("special", false));
    }
  }
  if (by_id.empty()) throw Error(fmt::format("{}: model.vocab is empty", tpath));
  const int64_t n_ids = by_id.rbegin()->first + 1;
  if (n_vocab_rows > 0 && n_ids > n_vocab_rows)
    throw Error(fmt::format("{}: token id {} ('{}') is beyond the {} rows of the embedding (config vocab_size)", tpath,
                            n_ids - 1, by_id.rbegin()->second, n_vocab_rows));
  const int64_t n = std::max(n_ids, n_vocab_rows);

  Tokenizer t;
  t.pieces_.resize(static_cast<size_t>(n));
  t.types_.assign(static_cast<size_t>(n), static_cast<int32_t>(TokenType::UNUSED));
  for (int64_t i = 0; i < n; ++i) t.pieces_[static_cast<size_t>(i)] = fmt::format("[PAD{}]", i);
  for (const auto& [id, piece] : by_id) {
    t.pieces_[static_cast<size_t>(id)] = piece;
    t.types_[static_cast<size_t>(id)] = static_cast<int32_t>(TokenType::NORMAL);
  }
  for (const auto& [id, special] : added)
    t.types_[static_cast<size_t>(id)] = static_cast<int32_t>(special ? TokenType::CONTROL : TokenType::USER_DEFINED);
  t.build_tables();
  // tokenizers resolves an added token's text through the added vocabulary first.
  for (const auto& [id, special] : added)
    t.index_.insert_or_assign(t.pieces_[static_cast<size_t>(id)], static_cast<int32_t>(id));

  auto pipe = std::make_shared<const tok::HfPipeline>(tj, t.index_, tpath);
  t.kind_ = pipe->byte_level() ? Kind::BPE : Kind::SPM;
  t.add_space_prefix_ = false;  // the pipeline's normalizer / pre-tokenizer decide
  if (const auto u = mit->find("unk_token"); u != mit->end() && u->is_string()) {
    t.unk_id_ = t.token_id(u->get<std::string>());
    if (t.unk_id_ >= 0) t.types_[static_cast<size_t>(t.unk_id_)] = static_cast<int32_t>(TokenType::UNKNOWN);
  }
  if (!pipe->byte_level() && mit->value("byte_fallback", false)) {
    for (unsigned b = 0; b < 256; ++b) {
      static constexpr char kHex[] = "0123456789ABCDEF";
      const int32_t id = t.token_id(std::string{'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'});
      if (id >= 0 && t.types_[static_cast<size_t>(id)] == static_cast<int32_t>(TokenType::NORMAL))
        t.types_[static_cast<size_t>(id)] = static_cast<int32_t>(TokenType::BYTE);
    }
  }
  t.hf_ = pipe;

  // BOS / EOS: tokenizer_config.json names them; config.json's ids are the fallback.
  const auto named_id = [&](const char* key) -> int32_t {
    if (!tc) return -1;
    const std::string text = token_text(*tc, key, cpath);
    if (text.empty()) return -1;
    const int32_t id = t.token_id(text);
    if (id < 0) throw Error(fmt::format("{}: {} '{}' is not in the vocabulary of {}", cpath, key, text, tpath));
    return id;
  };
  const auto config_id = [&](const char* key) -> int32_t {
    if (!mc) return -1;
    const std::vector<int64_t> ids = id_list(*mc, key, mpath);
    if (ids.empty()) return -1;
    if (ids[0] >= n)
      throw Error(fmt::format("{}: {} = {} is outside the vocabulary of {} tokens", mpath, key, ids[0], n));
    return static_cast<int32_t>(ids[0]);
  };
  t.bos_id_ = named_id("bos_token");
  if (t.bos_id_ < 0) t.bos_id_ = config_id("bos_token_id");
  t.eos_id_ = named_id("eos_token");
  if (t.eos_id_ < 0) t.eos_id_ = config_id("eos_token_id");

  Template tmpl;
  if (const auto pp = tj.find("post_processor"); pp != tj.end()) parse_post_processor(*pp, tpath, tmpl);
  for (const int32_t id : tmpl.prefix)
    if (id >= n) throw Error(fmt::format("{}: post_processor adds id {}, outside the vocabulary", tpath, id));
  for (const int32_t id : tmpl.suffix)
    if (id >= n) throw Error(fmt::format("{}: post_processor adds id {}, outside the vocabulary", tpath, id));
  const std::optional<bool> cfg_bos = tc ? opt_bool(*tc, "add_bos_token", cpath) : std::nullopt;
  const std::optional<bool> cfg_eos = tc ? opt_bool(*tc, "add_eos_token", cpath) : std::nullopt;
  t.add_bos_ = cfg_bos ? *cfg_bos : !tmpl.prefix.empty();
  t.add_eos_ = cfg_eos ? *cfg_eos : !tmpl.suffix.empty();
  // What the template adds is what tokenizers adds; it names BOS/EOS when the config does not.
  if (!cfg_bos && !tmpl.prefix.empty()) t.bos_id_ = tmpl.prefix[0];
  if (!cfg_eos && !tmpl.suffix.empty()) t.eos_id_ = tmpl.suffix[0];
  if (t.add_bos_ && t.bos_id_ < 0)
    throw Error(fmt::format("{}: add_bos_token is true but no BOS token is named (bos_token)", cpath));
  if (t.add_eos_ && t.eos_id_ < 0)
    throw Error(fmt::format("{}: add_eos_token is true but no EOS token is named (eos_token)", cpath));

  t.find_eog(-1, -1);
  // Every eos id of generation_config.json / config.json ends generation (transformers'
  // generate stops at any of them).
  std::vector<int32_t> eog = t.eog_;
  for (const auto& [cfg, path] : {std::pair{&gc, &gpath}, std::pair{&mc, &mpath}}) {
    if (!*cfg) continue;
    for (const int64_t id : id_list(**cfg, "eos_token_id", *path)) {
      if (id >= n) throw Error(fmt::format("{}: eos_token_id {} is outside the vocabulary of {} tokens", *path, id, n));
      eog.push_back(static_cast<int32_t>(id));
    }
  }
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
  t.eog_ = std::move(eog);
  t.build_special_cache(false);
  return t;
}

}  // namespace kvevict
