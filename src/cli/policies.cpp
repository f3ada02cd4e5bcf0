// `kvevict policies`: the registry as a table, or with --json as machine-readable records
// (name, protection defaults, parameters with type, default and range) for scripts.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <nlohmann/json.hpp>

#include "cli/common.h"
#include "eviction/registry.h"

namespace kvevict::cli {
namespace {

nlohmann::json param_json(const ParamSpec& p) {
  nlohmann::json j{{"name", p.name}, {"type", p.type}, {"default", p.fallback}};
  if (p.type == "number") j["default"] = std::stod(p.fallback);
  if (p.type == "integer") j["default"] = std::stoll(p.fallback);
  if (p.type != "text") j["min"] = p.lo, j["max"] = p.hi;
  if (!p.allowed.empty()) j["choices"] = p.allowed;
  return j;
}

/// One JSON object per policy, in registry order.
nlohmann::json policies_json() {
  nlohmann::json out = nlohmann::json::array();
  for (const PolicyInfo* p : all_policies()) {
    nlohmann::json params = nlohmann::json::array();
    for (const ParamSpec& s : policy_params(*p)) params.push_back(param_json(s));
    out.push_back({{"name", p->name},
                   {"summary", p->summary},
                   {"source", p->source},
                   {"evicts", p->evicts},
                   {"protect_prompt", p->protect_prompt},
                   {"sinks", p->sinks},
                   {"params", params}});
  }
  return out;
}

int run_policies(bool json) {
  if (json) {
    fmt::print("{}\n", policies_json().dump(2));
    return 0;
  }
  fmt::print("{:<20} {:>7} {:>6}  {}\n", "policy", "prompt", "sinks", "what it keeps");
  for (const PolicyInfo* p : all_policies())
    fmt::print("{:<20} {:>7} {:>6}  {}\n", p->name, p->evicts ? (p->protect_prompt ? "pinned" : "-") : "all", p->sinks,
               p->summary);
  return 0;
}

}  // namespace

void add_policies(CLI::App& root, std::vector<Command>& out) {
  auto* pol =
      root.add_subcommand("policies", "List the eviction policies with their default protection and parameters");
  auto json = std::make_shared<bool>(false);
  pol->add_flag("--json", *json,
                "Print a JSON array: name, summary, source, evicts, protect_prompt, sinks, params "
                "(name, type, default, min/max or choices)");
  out.push_back({pol, [json] { return run_policies(*json); }});
}

}  // namespace kvevict::cli
