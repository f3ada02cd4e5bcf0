// Grid options shared by `kvevict eval`, `perplexity` and `probe`: integer lists and the budget
// grid (--budgets B1,B2,... or the shared single --budget).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "eviction/registry.h"
#include "eviction/schedule.h"

namespace kvevict::cli {

struct PolicyArgs;

/// Parses "a,b,c" into integers >= `min`. Throws kvevict::Error naming `option` and the bad
/// entry (not an integer, below min, empty entry, or repeated).
std::vector<int64_t> parse_int_list(const std::string& s, const std::string& option, int64_t min);

/// The budgets to run: --budgets (`list`) when given, else the single --budget (`single`, 0 =
/// not given) as a one-entry grid, else none. Throws kvevict::Error when both are given or an
/// entry is not a positive integer.
std::vector<int64_t> budget_grid(const std::string& list, int64_t single);

/// One validated (policy, budget) entry of a grid.
struct GridEntry {
  std::string name;  ///< the policy as typed, e.g. "snapkv+prompt"
  CheckedPolicy kv;  ///< policy and schedule; eviction().budget = 0 for a policy that does not evict
  const Policy& policy() const { return kv.policy(); }
  const EvictionConfig& eviction() const { return kv.eviction(); }
};

/// names x budgets with the shared schedule options `a`: a policy that does not evict appears
/// once, every other once per budget, in the order given. Throws kvevict::Error for a repeated or
/// unknown name, an evicting policy without budgets ("policy 'X' evicts and needs --budget B or
/// --budgets B1,B2,..."), or a budget the schedule refuses (B <= r, sinks >= K_sel).
std::vector<GridEntry> policy_grid(const PolicyArgs& a, const std::vector<std::string>& names,
                                   const std::vector<int64_t>& budgets);

}  // namespace kvevict::cli
