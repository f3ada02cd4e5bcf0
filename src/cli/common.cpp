#include "cli/common.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "util/error.h"

namespace kvevict::cli {

void add_policy_options(CLI::App& cmd, PolicyArgs& a, bool with_policy) {
  if (with_policy)
    cmd.add_option("--policy", a.policy,
                   "Eviction policy: " + policy_names() + " (any may take +prompt); default: random with --budget, else full");
  cmd.add_option("--budget,-B", a.budget, "Budget B: slots per (layer, KV head) after a round, prompt and recent buffer included")
      ->check(at_least(1));
  cmd.add_option("--buffer,-r", a.recent, "Recent buffer r: newest slots never evicted")->capture_default_str();
  cmd.add_option("--sinks", a.sinks, "Pin the first S positions (default: the policy's; streaming = 4)");
  cmd.add_flag("--protect-prompt", a.protect_prompt, "Pin the prompt inside K_sel (default: the policy's)");
  cmd.add_flag("--no-protect-prompt", a.no_protect_prompt, "Do not pin the prompt");
  cmd.add_option("--long-prompt", a.long_prompt,
                 "Prompt longer than K_sel-1: pin-head (pin its first K_sel-1 tokens, budget holds) or "
                 "skip (never evict that sequence)")
      ->check(CLI::IsMember({"pin-head", "skip"}))->capture_default_str();
  cmd.add_option("--position-mode", a.position_mode,
                 "RoPE positions: logical (tokens seen) or cache (slot index, keys re-rotated; StreamingLLM)")
      ->check(CLI::IsMember({"logical", "cache"}))->capture_default_str();
  cmd.add_option("--seed", a.seed, "Base seed of every random choice")->check(seed_value())->capture_default_str();
  cmd.add_option("--param", a.params, "Selector parameter name=value (repeatable)");
}

CLI::Validator at_least(long long lo) {
  return CLI::Validator(
      [lo](std::string& in) -> std::string {
        long long v = 0;
        size_t used = 0;
        try {
          v = std::stoll(in, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != in.size() || v < lo) return fmt::format("must be an integer >= {} (got {})", lo, in);
        return {};
      },
      fmt::format(">= {}", lo));
}

CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        if (in.empty() || in.find_first_not_of("0123456789") != std::string::npos)
          return fmt::format("must be an unsigned integer (got {})", in);
        return {};
      },
      "UINT");
}

std::string default_policy(const PolicyArgs& a) {
  if (!a.policy.empty()) return a.policy;
  return a.budget > 0 ? "random" : "full";
}

Policy build_policy(const PolicyArgs& a, const std::string& name, const SelectorParams* params) {
  if (a.protect_prompt && a.no_protect_prompt)
    throw Error("--protect-prompt and --no-protect-prompt are mutually exclusive");
  std::optional<bool> protect;
  if (a.protect_prompt) protect = true;
  if (a.no_protect_prompt) protect = false;
  if (params) return make_policy(name, protect, a.sinks, *params, /*check_params=*/false);
  return make_policy(name, protect, a.sinks, SelectorParams::parse(a.params));
}

EvictionConfig build_eviction(const PolicyArgs& a, const Policy& p) {
  EvictionConfig c;
  c.budget = a.budget;
  c.recent = a.recent;
  c.seed = a.seed;
  c.long_prompt = a.long_prompt == "skip" ? LongPromptMode::Skip : LongPromptMode::PinHead;
  c.positions = a.position_mode == "cache" ? PositionMode::Cache : PositionMode::Logical;
  if (p.evicts && a.budget == 0) throw Error(fmt::format("policy '{}' needs --budget B", p.name));
  validate_eviction(c, p);
  return c;
}

void warn(const std::string& msg) { fmt::print(stderr, "kvevict: warning: {}\n", msg); }

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("{}: cannot open file", path));
  std::ostringstream ss;
  ss << f.rdbuf();
  if (f.bad()) throw Error(fmt::format("{}: read error", path));
  return ss.str();
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
