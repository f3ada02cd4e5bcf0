#include "eval/results.h"

#include <errno.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstring>

#include <filesystem>
#include <fstream>
#include <set>

#include "util/error.h"

namespace kvevict {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Typed field access with errors that name the file and key.
template <typename T>
T field(const json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end()) throw Error(fmt::format("{}: missing field '{}'", where, key));
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw Error(fmt::format("{}: field '{}' has the wrong type ({})", where, key, it->type_name()));
  }
}

std::string short_dump(const json& j) {
  std::string s = j.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

std::string first_difference(const json& a, const json& b, const std::string& path) {
  if (a.type() != b.type() && !(a.is_number() && b.is_number()))
    return fmt::format("{}: {} (there) vs {} (here)", path.empty() ? "/" : path, short_dump(a), short_dump(b));
  if (a.is_object()) {
    std::set<std::string> keys;
    for (const auto& [k, v] : a.items()) keys.insert(k);
    for (const auto& [k, v] : b.items()) keys.insert(k);
    for (const std::string& k : keys) {
      const std::string p = path + "/" + k;
      if (!a.contains(k)) return fmt::format("{}: absent (there) vs {} (here)", p, short_dump(b[k]));
      if (!b.contains(k)) return fmt::format("{}: {} (there) vs absent (here)", p, short_dump(a[k]));
      if (std::string d = first_difference(a[k], b[k], p); !d.empty()) return d;
    }
    return "";
  }
  if (a.is_array()) {
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
      if (std::string d = first_difference(a[i], b[i], fmt::format("{}/{}", path, i)); !d.empty()) return d;
    if (a.size() != b.size())
      return fmt::format("{}: {} (there) vs {} (here)", path.empty() ? "/" : path, short_dump(a), short_dump(b));
    return "";
  }
  if (a != b)
    return fmt::format("{}: {} (there) vs {} (here)", path.empty() ? "/" : path, short_dump(a), short_dump(b));
  return "";
}

std::string torn_line_message(const std::string& path, int64_t bytes) {
  return fmt::format(
      "{}: dropping an incomplete last line ({} bytes; the previous run was interrupted while writing "
      "it, so that rollout runs again)",
      path, bytes);
}

}  // namespace

std::string CellSpec::label() const { return budget > 0 ? fmt::format("{}@{}", policy, budget) : policy; }

json EvalSettings::to_json() const {
  json cells_j = json::array();
  for (const CellSpec& c : cells) cells_j.push_back({{"policy", c.policy}, {"budget", c.budget}});
  return json{
      {"kvevict_eval_version", 1},
      {"model", model_digest.empty() ? json{{"file", model_file}, {"bytes", model_bytes}}
                                     : json{{"file", model_file}, {"bytes", model_bytes}, {"digest", model_digest}}},
      {"tasks", {{"file", tasks_file}, {"format", tasks_format}, {"count", n_tasks}, {"digest", tasks_digest}}},
      {"cells", cells_j},
      {"reference", reference},
      {"rollouts", rollouts},
      {"sampler", {{"temperature", temperature}, {"top_p", top_p}, {"top_k", top_k}}},
      {"max_length", max_length},
      {"max_new_tokens", max_new_tokens},
      {"seed", seed},
      {"eviction", eviction},
      {"prompt", {{"template", prompt_template}, {"math_suffix", math_suffix}}},
      {"bootstrap_resamples", bootstrap_resamples},
      {"shard", {{"index", shard_index}, {"count", shard_count}}},
  };
}

EvalSettings EvalSettings::from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw Error(fmt::format("{}: expected a JSON object", where));
  if (field<int>(j, "kvevict_eval_version", where) != 1)
    throw Error(fmt::format("{}: written by an incompatible kvevict version", where));
  EvalSettings s;
  const json model = field<json>(j, "model", where), tasks = field<json>(j, "tasks", where);
  s.model_file = field<std::string>(model, "file", where + " model");
  s.model_bytes = field<uint64_t>(model, "bytes", where + " model");
  // Optional: runs written before the digest existed are still readable (summaries, merge).
  if (model.contains("digest")) s.model_digest = field<std::string>(model, "digest", where + " model");
  s.tasks_file = field<std::string>(tasks, "file", where + " tasks");
  s.tasks_format = field<std::string>(tasks, "format", where + " tasks");
  s.n_tasks = field<int64_t>(tasks, "count", where + " tasks");
  s.tasks_digest = field<std::string>(tasks, "digest", where + " tasks");
  for (const json& c : field<json>(j, "cells", where))
    s.cells.push_back(
        {field<std::string>(c, "policy", where + " cells"), field<int64_t>(c, "budget", where + " cells")});
  s.reference = field<std::string>(j, "reference", where);
  s.rollouts = field<int>(j, "rollouts", where);
  const json sampler = field<json>(j, "sampler", where);
  s.temperature = field<double>(sampler, "temperature", where + " sampler");
  s.top_p = field<double>(sampler, "top_p", where + " sampler");
  s.top_k = field<int>(sampler, "top_k", where + " sampler");
  s.max_length = field<int64_t>(j, "max_length", where);
  s.max_new_tokens = field<int64_t>(j, "max_new_tokens", where);
  s.seed = field<uint64_t>(j, "seed", where);
  s.eviction = field<json>(j, "eviction", where);
  const json prompt = field<json>(j, "prompt", where);
  s.prompt_template = field<std::string>(prompt, "template", where + " prompt");
  s.math_suffix = field<bool>(prompt, "math_suffix", where + " prompt");
  s.bootstrap_resamples = field<int>(j, "bootstrap_resamples", where);
  const json shard = field<json>(j, "shard", where);
  s.shard_index = field<int>(shard, "index", where + " shard");
  s.shard_count = field<int>(shard, "count", where + " shard");
  if (s.shard_count < 1 || s.shard_index < 0 || s.shard_index >= s.shard_count || s.rollouts < 1 || s.n_tasks < 1)
    throw Error(fmt::format("{}: inconsistent shard, rollout or task counts", where));
  return s;
}

int64_t EvalSettings::problems_in_shard() const {
  if (n_tasks <= shard_index) return 0;
  return (n_tasks - shard_index + shard_count - 1) / shard_count;
}

std::string rollout_key(const std::string& policy, int64_t budget, const std::string& problem_id, int rollout) {
  return fmt::format("{}\x1f{}\x1f{}\x1f{}", policy, budget, problem_id, rollout);
}

std::string RolloutRecord::key() const { return rollout_key(policy, budget, problem_id, rollout); }

json RolloutRecord::to_json() const {
  json j{{"policy", policy},
         {"budget", budget > 0 ? json(budget) : json(nullptr)},
         {"problem_id", problem_id},
         {"problem_index", problem_index},
         {"rollout", rollout},
         {"prompt_tokens", prompt_tokens},
         {"generated_tokens", generated_tokens},
         {"finish", finish},
         {"extracted", extracted ? json(*extracted) : json(nullptr)},
         {"gold", gold},
         {"correct", correct},
         {"grade", grade},
         {"rounds", rounds},
         {"peak_slots", peak_slots},
         {"peak_kv_bytes", peak_kv_bytes},
         {"kv_bytes", kv_bytes},
         {"prefill_ms", prefill_ms},
         {"decode_ms", decode_ms},
         {"score_ms", score_ms},
         {"compact_ms", compact_ms},
         {"text", text}};
  if (fact_kept) j["fact_kept"] = *fact_kept;
  return j;
}

RolloutRecord RolloutRecord::from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw Error(fmt::format("{}: expected a JSON object", where));
  RolloutRecord r;
  r.policy = field<std::string>(j, "policy", where);
  r.budget = j.contains("budget") && j["budget"].is_null() ? 0 : field<int64_t>(j, "budget", where);
  r.problem_id = field<std::string>(j, "problem_id", where);
  r.problem_index = field<int64_t>(j, "problem_index", where);
  r.rollout = field<int>(j, "rollout", where);
  r.prompt_tokens = field<int64_t>(j, "prompt_tokens", where);
  r.generated_tokens = field<int64_t>(j, "generated_tokens", where);
  r.finish = field<std::string>(j, "finish", where);
  r.text = field<std::string>(j, "text", where);
  if (j.contains("extracted") && !j["extracted"].is_null()) r.extracted = field<std::string>(j, "extracted", where);
  r.gold = field<std::string>(j, "gold", where);
  r.correct = field<bool>(j, "correct", where);
  // Files written before the grade outcome was recorded: infer it from the extracted answer.
  if (j.contains("grade"))
    r.grade = field<std::string>(j, "grade", where);
  else
    r.grade = r.extracted ? "graded" : "no_answer";
  r.rounds = field<int64_t>(j, "rounds", where);
  r.peak_slots = field<int64_t>(j, "peak_slots", where);
  r.peak_kv_bytes = field<int64_t>(j, "peak_kv_bytes", where);
  r.kv_bytes = field<int64_t>(j, "kv_bytes", where);
  r.prefill_ms = field<double>(j, "prefill_ms", where);
  r.decode_ms = field<double>(j, "decode_ms", where);
  r.score_ms = field<double>(j, "score_ms", where);
  r.compact_ms = field<double>(j, "compact_ms", where);
  if (j.contains("fact_kept")) r.fact_kept = field<bool>(j, "fact_kept", where);
  return r;
}

std::string json_difference(const json& there, const json& here) { return first_difference(there, here, ""); }

RolloutFile read_rollouts(const std::string& path, bool keep_text,
                          const std::function<void(const std::string&)>& warn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open", path));
  RolloutFile out;
  std::set<std::string> keys;
  std::string text;
  int64_t line = 0;
  while (std::getline(in, text)) {
    if (in.eof()) {  // no newline after it: a write cut short
      out.torn_bytes = static_cast<int64_t>(text.size());
      if (warn) warn(torn_line_message(path, static_cast<int64_t>(text.size())));
      break;
    }
    out.complete_bytes += static_cast<int64_t>(text.size()) + 1;
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{}:{}", path, line);
    json j;
    try {
      j = json::parse(text);
    } catch (const json::parse_error&) {
      throw Error(fmt::format("{}: corrupt rollout record (not JSON); fix or remove that line", where));
    }
    RolloutRecord r = RolloutRecord::from_json(j, where);
    if (!keep_text) r.text = std::string();
    if (!keys.insert(r.key()).second)
      throw Error(fmt::format("{}: rollout {} of problem '{}' under {} appears twice", where, r.rollout, r.problem_id,
                              r.cell().label()));
    out.records.push_back(std::move(r));
  }
  if (in.bad()) throw Error(fmt::format("{}: read error", path));
  return out;
}

EvalSettings read_settings(const std::string& dir) {
  const std::string path = (fs::path(dir) / ResultsDir::kConfig).string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open (is {} an eval output directory?)", path, dir));
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error&) {
    throw Error(fmt::format("{}: not valid JSON", path));
  }
  return EvalSettings::from_json(j, path);
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(fmt::format("{}: cannot open for writing", tmp));
    out << text;
    out.flush();
    if (!out) throw Error(fmt::format("{}: write failed", tmp));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw Error(fmt::format("{}: cannot rename to {}: {}", tmp, path, ec.message()));
}

namespace {
// Whether `path` exists and holds a newline: a finished rollout (a torn line alone is a run killed
// in its first write). Stops at the first newline, so a long file is not read.
bool has_complete_line(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char c = 0;
  while (in.get(c))
    if (c == '\n') return true;
  return false;
}
}  // namespace

DirLock DirLock::acquire(const std::string& dir) {
  const std::string path = (fs::path(dir) / ".lock").string();
  DirLock l;
  l.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (l.fd_ < 0) throw Error(fmt::format("{}: cannot create the lock file: {}", path, std::strerror(errno)));
  if (::flock(l.fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK)
      throw Error(fmt::format("{} is in use by another kvevict run (it holds {}); wait for it to end or use another --out",
                              dir, path));
    ::close(l.fd_);
    l.fd_ = -1;  // no flock on this file system: unlocked, as before locks existed
  }
  return l;
}

DirLock& DirLock::operator=(DirLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

DirLock::~DirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the flock
}

bool check_settings_match(const std::string& dir, const EvalSettings& settings) {
  // A config.json beside no rollout (a run refused or stopped before its first rollout, e.g. by
  // the memory check) holds nothing to mix with: the folder is taken over, not refused, so a
  // retry with smaller settings needs no manual clean-up.
  if (fs::exists(fs::path(dir) / ResultsDir::kConfig)) {
    if (!has_complete_line(fs::path(dir) / ResultsDir::kRollouts)) return false;
    const EvalSettings there = read_settings(dir);
    if (there.model_digest.empty() && !settings.model_digest.empty())
      throw Error(fmt::format("{} was written by a kvevict that did not record the model's digest, so it cannot "
                              "tell whether its rollouts came from this model; it is not resumed: use another --out "
                              "or delete that directory (its summaries stay readable, and kvevict merge still "
                              "combines such directories with each other)",
                              dir));
    if (const std::string d = json_difference(there.to_json(), settings.to_json()); !d.empty())
      throw Error(
          fmt::format("{} holds a run with a different configuration ({}); refusing to mix runs: use "
                      "another --out or delete that directory",
                      dir, d));
    return true;
  }
  if (fs::exists(fs::path(dir) / ResultsDir::kRollouts))
    throw Error(fmt::format("{} holds {} but no {}; refusing to mix runs: use another --out", dir,
                            ResultsDir::kRollouts, ResultsDir::kConfig));
  return false;
}

ResultsDir ResultsDir::open(const std::string& dir, const EvalSettings& settings, bool resume,
                            const std::function<void(const std::string&)>& warn) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("{}: cannot create the output directory: {}", dir, ec.message()));
  const std::string config_path = (fs::path(dir) / kConfig).string();
  const std::string rollouts_path = (fs::path(dir) / kRollouts).string();
  ResultsDir r;
  r.lock_ = DirLock::acquire(dir);
  const bool has_config = check_settings_match(dir, settings), has_rollouts = fs::exists(rollouts_path);
  r.dir_ = dir;
  if (has_rollouts) {
    RolloutFile file = read_rollouts(rollouts_path, /*keep_text=*/false, {});
    if (!resume && !file.records.empty())
      throw Error(
          fmt::format("{} already holds {} finished rollouts of this configuration and --no-resume was "
                      "given; nothing was overwritten: use another --out or delete that directory",
                      dir, file.records.size()));
    if (file.torn_bytes > 0) {
      if (warn) warn(torn_line_message(rollouts_path, file.torn_bytes));
      fs::resize_file(rollouts_path, static_cast<uintmax_t>(file.complete_bytes), ec);
      if (ec) throw Error(fmt::format("{}: cannot truncate the incomplete last line: {}", rollouts_path, ec.message()));
    }
    r.existing_ = std::move(file.records);
  }
  if (!has_config) write_file_atomic(config_path, settings.to_json().dump(2) + "\n");
  r.out_.reset(std::fopen(rollouts_path.c_str(), "ab"));
  if (!r.out_) throw Error(fmt::format("{}: cannot open for appending", rollouts_path));
  return r;
}

void ResultsDir::append(const RolloutRecord& rec) {
  const std::string line = rec.to_json().dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), out_.get()) != line.size() || std::fflush(out_.get()) != 0)
    throw Error(fmt::format("{}/{}: write failed", dir_, kRollouts));
}

}  // namespace kvevict
