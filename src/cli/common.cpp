#include "cli/common.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "eval/task_file.h"
#include "model/arch.h"
#include "util/error.h"
#include "util/file.h"
#include "util/suggest.h"

namespace kvevict::cli {

void add_policy_options(CLI::App& cmd, PolicyArgs& a, bool with_policy) {
  if (with_policy)
    cmd.add_option(
        "--policy", a.policy,
        "Eviction policy: " + policy_names() + " (any may take +prompt); default: random with --budget, else full");
  cmd.add_option("--budget,-B", a.budget,
                 "Budget B: slots per (layer, KV head) after a round, prompt and recent buffer included")
      ->check(int_range(1, limits::kTokens));
  cmd.add_option("--buffer,-r", a.recent, "Recent buffer r: newest slots never evicted (must be < B)")
      ->check(int_range(1, limits::kTokens))
      ->each([&a](const std::string&) { a.recent_given = true; })
      ->capture_default_str();
  cmd.add_option("--round-interval", a.interval,
                 "Round interval s: decode steps between eviction rounds, the cache peaking at B + s "
                 "(default: r; R-KV's and TriAttention's code use 128)")
      ->check(int_range(1, limits::kTokens));
  cmd.add_option("--sinks", a.sinks, "Pin the first S positions (default: the policy's; streaming = 4)")
      ->check(int_range(0, limits::kTokens));
  cmd.add_flag("--protect-prompt", a.protect_prompt, "Pin the prompt inside K_sel (default: the policy's)");
  cmd.add_flag("--no-protect-prompt", a.no_protect_prompt, "Do not pin the prompt (default: the policy's)");
  cmd.add_option("--long-prompt", a.long_prompt,
                 "Prompt longer than K_sel-1: pin-head (pin its first K_sel-1 tokens, budget holds) or "
                 "skip (never evict that sequence)")
      ->check(CLI::IsMember({"pin-head", "skip"}))
      ->capture_default_str();
  cmd.add_option("--position-mode", a.position_mode,
                 "RoPE positions: logical (tokens seen) or cache (slot index, keys re-rotated; StreamingLLM)")
      ->check(CLI::IsMember({"logical", "cache"}))
      ->capture_default_str();
  cmd.add_option("-s,--seed", a.seed, "Base seed of every random choice")->check(seed_value())->capture_default_str();
  cmd.add_option("--param", a.params,
                 "Selector parameter [POLICY:]NAME=VALUE (repeatable; with POLICY: only that policy, e.g. "
                 "triattention:stats=FILE; `kvevict policies` lists them)");
}

namespace {
// `in` as a whole base-10 integer (std::stoll's syntax, nothing after it), or nullopt.
std::optional<long long> whole_integer(const std::string& in) {
  size_t used = 0;
  try {
    const long long v = std::stoll(in, &used);
    if (used == in.size()) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}
}  // namespace

CLI::Validator at_least(long long lo) {
  return CLI::Validator(
      [lo](std::string& in) -> std::string {
        const std::optional<long long> v = whole_integer(in);
        if (!v) return fmt::format("must be an integer >= {} (got {})", lo, in);
        if (*v < lo) return fmt::format("must be >= {} (got {})", lo, in);
        return {};
      },
      fmt::format(">= {}", lo));
}

CLI::Validator int_range(long long lo, long long hi) {
  return CLI::Validator(
      [lo, hi](std::string& in) -> std::string {
        const std::optional<long long> v = whole_integer(in);
        if (!v) return fmt::format("must be an integer in [{}, {}] (got {})", lo, hi, in);
        if (*v < lo || *v > hi) return fmt::format("must be in [{}, {}] (got {})", lo, hi, in);
        return {};
      },
      "");
}

int max_threads() {
  return limits::kThreadsPerCore * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

void add_threads_option(CLI::App& cmd, int& threads, const std::string& help) {
  auto force = std::make_shared<bool>(false);
  const std::string range =
      fmt::format("[0, {}] ({} x {} cores; up to {} with --force-threads)", max_threads(), limits::kThreadsPerCore,
                  max_threads() / limits::kThreadsPerCore, limits::kThreadsForced);
  cmd.add_option("-t,--threads", threads,
                 fmt::format("{}; at most {} = {} x cores without --force-threads", help, max_threads(),
                             limits::kThreadsPerCore))
      ->check(CLI::Validator(
          [range](std::string& in) -> std::string {
            const std::optional<long long> v = whole_integer(in);
            if (!v) return fmt::format("must be an integer in {} (got {})", range, in);
            if (*v < 0 || *v > limits::kThreadsForced) return fmt::format("must be in {} (got {})", range, in);
            return {};
          },
          ""))
      ->capture_default_str();
  cmd.add_flag("--force-threads", *force, "Allow -t above 4 x cores (oversubscribed; results do not depend on it)");
  cmd.parse_complete_callback([&threads, force] {
    if (!*force && threads > max_threads())
      throw CLI::ValidationError(
          fmt::format("--threads {}: must be <= {} = {} x {} cores (pass --force-threads to run anyway)", threads,
                      max_threads(), limits::kThreadsPerCore, max_threads() / limits::kThreadsPerCore));
  });
}

std::vector<std::string> apply_aliases(const std::vector<std::string>& args) {
  // subcommand -> {old spelling, current spelling}
  static const std::map<std::string, std::map<std::string, std::string>> table = {
      {"eval", {{"--tasks", "--file"}, {"--out", "--output"}, {"--max-new-tokens", "--n-predict"}}},
      {"merge", {{"--out", "--output"}}},
      {"calibrate", {{"--ctx", "--ctx-size"}}},
      {"tasks", {{"--n", "--count"}, {"-i", "-f"}, {"--input", "--file"}, {"-j", "-t"}, {"--jobs", "--threads"}}},
  };
  std::vector<std::string> out = args;
  if (out.size() < 2) return out;
  const auto it = table.find(out[1]);
  if (it == table.end()) return out;
  for (size_t i = 2; i < out.size(); ++i) {
    std::string& a = out[i];
    if (a == "--") break;
    const auto eq = a.find('=');
    const std::string name = a.substr(0, eq);
    if (const auto m = it->second.find(name); m != it->second.end())
      a = m->second + (eq == std::string::npos ? std::string() : a.substr(eq));
  }
  return out;
}

std::string suggest_options(const CLI::App& cmd, const std::vector<std::string>& extras) {
  std::vector<std::string> names;
  for (const CLI::App* app = &cmd; app != nullptr; app = app->get_parent())
    for (const CLI::Option* o : app->get_options()) {
      if (o->get_group().empty()) continue;  // hidden
      for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
      for (const std::string& s : o->get_snames()) names.push_back("-" + s);
    }
  std::string out;
  for (const std::string& e : extras) {
    if (e.size() < 2 || e[0] != '-') continue;
    const std::string word = e.substr(0, e.find('='));
    if (const std::string g = closest_match(word, names); !g.empty())
      out += fmt::format("{}did you mean {}?", out.empty() ? "" : "; ", g);
  }
  return out;
}

CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        if (in.empty() || in.find_first_not_of("0123456789") != std::string::npos)
          return fmt::format("must be an unsigned integer (got {})", in);
        return {};
      },
      "");
}

PolicySettings policy_settings(const PolicyArgs& a) {
  if (a.protect_prompt && a.no_protect_prompt)
    throw Error("--protect-prompt and --no-protect-prompt are mutually exclusive");
  PolicySettings s;
  s.policy = a.policy;
  s.budget = a.budget;
  s.recent = a.recent;
  s.interval = a.interval;
  s.sinks = a.sinks;
  if (a.protect_prompt) s.protect_prompt = true;
  if (a.no_protect_prompt) s.protect_prompt = false;
  s.long_prompt = parse_long_prompt(a.long_prompt);
  s.positions = parse_position_mode(a.position_mode);
  s.seed = a.seed;
  s.params = a.params;
  return s;
}

std::string unused_schedule_warning(const PolicyArgs& a, const std::vector<Policy>& policies) {
  std::string names;
  for (const Policy& p : policies) {
    if (p.evicts) return {};
    names += (names.empty() ? "'" : ", '") + p.name + "'";
  }
  std::vector<std::string> unused;
  if (a.budget > 0) unused.push_back(fmt::format("--budget {}", a.budget));
  if (a.recent_given) unused.push_back(fmt::format("--buffer {}", a.recent));
  if (a.interval) unused.push_back(fmt::format("--round-interval {}", *a.interval));
  if (a.sinks) unused.push_back(fmt::format("--sinks {}", *a.sinks));
  if (unused.empty() || names.empty()) return {};
  return fmt::format("{} {} {} every token: {} {} unused", policies.size() == 1 ? "policy" : "policies", names,
                     policies.size() == 1 ? "keeps" : "keep", fmt::join(unused, ", "),
                     unused.size() == 1 ? "is" : "are");
}

std::string model_display_name(const std::string& path, bool with_extension) {
  std::filesystem::path p(path);
  if (!p.has_filename()) p = p.parent_path();  // "dir/" -> "dir"
  if (with_extension || std::filesystem::is_directory(p)) return p.filename().string();
  return p.stem().string();
}

namespace {

/// The files of a -m path: the path itself, or a checkpoint directory's regular files in name
/// order (subdirectories and broken links skipped). error_code overloads throughout: a file
/// removed while the directory is read is an Error, not a crash.
std::vector<std::filesystem::path> model_path_files(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return {path};
  std::vector<fs::path> files;
  for (fs::directory_iterator it(path, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) files.push_back(it->path());
  if (ec) throw Error(fmt::format("{}: cannot list the model directory: {}", path, ec.message()));
  std::sort(files.begin(), files.end());
  return files;
}

uintmax_t model_file_size(const std::filesystem::path& f) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(f, ec);
  if (ec) throw Error(fmt::format("{}: cannot read the size of this model file: {}", f.string(), ec.message()));
  return size;
}

}  // namespace

uint64_t model_path_bytes(const std::string& path) {
  uint64_t n = 0;
  for (const std::filesystem::path& f : model_path_files(path)) n += model_file_size(f);
  return n;
}

std::string model_path_digest(const std::string& path) {
  const std::vector<std::filesystem::path> files = model_path_files(path);
  uint64_t h = fnv1a64("");
  std::vector<char> buf(1 << 20);
  for (const std::filesystem::path& f : files) {
    if (files.size() > 1) h = fnv1a64(fmt::format("{}:{}:", f.filename().string(), model_file_size(f)), h);
    std::ifstream in(f, std::ios::binary);
    if (!in) throw Error(fmt::format("{}: cannot open to compute the model digest", f.string()));
    while (in) {
      in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
      h = fnv1a64(std::string_view(buf.data(), static_cast<size_t>(in.gcount())), h);
    }
    if (in.bad()) throw Error(fmt::format("{}: read error while computing the model digest", f.string()));
  }
  return fmt::format("{:016x}", h);
}

void warn(const std::string& msg) { fmt::print(stderr, "kvevict: warning: {}\n", msg); }

void warn_if_recent_looks_like_reps(int64_t r, const std::string& repetitions) {
  if (r > 10) return;
  warn(
      fmt::format("-r {} sets the recent buffer r (newest slots never evicted), not the repetitions as in "
                  "llama-bench; repetitions are {}",
                  r, repetitions));
}

std::string model_help() {
  return fmt::format("{} (architectures: {})", kModelHelp, fmt::join(supported_architectures(), ", "));
}

std::string read_file(const std::string& path, const std::string& option) {
  return read_file_limited(path, limits::kFileBytes, option);
}

std::vector<std::string> split_list(const std::string& s, const std::string& option) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = s.find(',', start);
    std::string part = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (part.empty()) throw Error(fmt::format("{} '{}': empty list entry", option, s));
    out.push_back(part);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace kvevict::cli
