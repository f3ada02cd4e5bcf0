#include "cli/grid.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "cli/common.h"
#include "util/error.h"

namespace kvevict::cli {

std::vector<int64_t> parse_int_list(const std::string& s, const std::string& option, int64_t min) {
  std::vector<int64_t> out;
  for (const std::string& part : split_list(s, option)) {
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != part.size() || v < min)
      throw Error(fmt::format("{} {}: '{}' must be an integer >= {}", option, s, part, min));
    if (std::find(out.begin(), out.end(), v) != out.end())
      throw Error(fmt::format("{} '{}': {} given twice", option, s, v));
    out.push_back(v);
  }
  return out;
}

std::vector<int64_t> budget_grid(const std::string& list, int64_t single) {
  if (!list.empty() && single != 0) throw Error("give either --budgets or --budget, not both");
  if (!list.empty()) {
    std::vector<int64_t> out = parse_int_list(list, "--budgets", 1);
    for (const int64_t b : out)
      if (b > limits::kTokens)
        throw Error(fmt::format("--budgets {}: {} must be <= {}", list, b, limits::kTokens));
    return out;
  }
  if (single != 0) return {single};
  return {};
}

std::vector<GridEntry> policy_grid(const PolicyArgs& a, const std::vector<std::string>& names,
                                   const std::vector<int64_t>& budgets) {
  std::vector<GridEntry> grid;
  std::set<std::string> seen;
  const PolicySettings settings = policy_settings(a);
  check_param_items(settings.params, names);
  const auto add = [&](const std::string& name, const Policy& p, int64_t budget) {
    PolicySettings with = settings;
    with.budget = budget;
    GridEntry e;
    e.name = name;
    e.kv = build_schedule(with, p);
    grid.push_back(std::move(e));
  };
  for (const std::string& name : names) {
    if (!seen.insert(name).second) throw Error(fmt::format("--policies: '{}' given twice", name));
    const Policy p = build_policy(settings, name, /*check_params=*/false);
    if (!p.evicts) {
      add(name, p, 0);
      continue;
    }
    if (budgets.empty())
      throw Error(fmt::format("policy '{}' evicts and needs --budget B or --budgets B1,B2,...", name));
    for (const int64_t b : budgets) add(name, p, b);
  }
  return grid;
}

}  // namespace kvevict::cli
