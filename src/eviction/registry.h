// Policy registry: maps a policy name ("random", "snapkv+prompt", ...) to its selector and its
// default protection. Adding a selector = one file in eviction/selectors/ defining
// `const PolicyInfo& policy_<id>()` plus one entry in KVEVICT_POLICIES (registry.cpp).
//
// Source: docs/eviction-spec.md §3 (policy table, defaults) and its `+prompt` / `--sinks` rule.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "eviction/selector.h"

namespace kvevict {

/// Static description of one policy, written with designated initializers in its selector file
/// (`.name = "snapkv", .summary = ..., .make = ...`). Its parameters (names, defaults, ranges)
/// are not listed here: policy_params() records them from `make`'s SelectorParams::get* calls.
struct PolicyInfo {
  std::string name = {};        ///< CLI name, e.g. "random-unprotected"
  std::string summary = {};     ///< one sentence for --help and README
  std::string source = {};      ///< paper / spec section
  bool evicts = true;           ///< false only for `full`
  bool protect_prompt = false;  ///< default prompt pinning (spec §3)
  int sinks = 0;                ///< default sink count (StreamingLLM: 4)
  /// Builds the selector; reads its parameters from `params` (empty for `full`).
  std::function<std::unique_ptr<Selector>(const SelectorParams& params)> make = {};
  /// Fewest sinks the policy runs with; with fewer it would be another policy (StreamingLLM
  /// without sinks is the sliding window `recency`). validate_eviction refuses fewer, quoting
  /// `min_sinks_reason` ("keeps no attention sinks, which is policy 'recency' ...").
  int min_sinks = 0;
  std::string min_sinks_reason = {};
  /// Smallest K_sel = B - r the selector can honour (VaSE always keeps its 4 sinks, so 4).
  /// validate_eviction refuses a smaller K_sel, quoting `min_k_sel_reason` ("keeps 4 sinks").
  int64_t min_k_sel = 1;
  std::string min_k_sel_reason = {};
};

/// A policy ready to run: selector plus the protection actually in force.
struct Policy {
  std::string name;  ///< as given, e.g. "snapkv+prompt"
  const PolicyInfo* info = nullptr;
  bool evicts = true;
  bool protect_prompt = false;               ///< pin the first min(prompt_len, K_sel - 1) positions
  int sinks = 0;                             ///< pin the first `sinks` positions
  std::shared_ptr<const Selector> selector;  ///< null for `full`
};

/// Every registered policy, in registry order.
const std::vector<const PolicyInfo*>& all_policies();

/// Names of every policy, comma-separated (for messages).
std::string policy_names();

/// Builds a policy from `spec` = name or name+prompt. `protect_prompt` and `sinks` override the
/// policy's defaults when set. Throws kvevict::Error for an unknown name (listing the known
/// ones), negative sinks, or (with check_params) parameters the selector does not take. A grid
/// of policies passes check_params = false and calls params.check_all_used once at the end, so a
/// parameter needs only one policy of the grid that takes it.
Policy make_policy(const std::string& spec, std::optional<bool> protect_prompt = std::nullopt,
                   std::optional<int> sinks = std::nullopt, const SelectorParams& params = {},
                   bool check_params = true);

/// make_policy for a policy described by `info` itself rather than found by name: how a selector
/// defined outside the registry (eviction/external.h, the Python package's) runs under the same
/// schedule. `spec` is the name results carry; plus_prompt: it came with "+prompt". `info` must
/// outlive the returned policy. Throws as make_policy.
Policy make_policy(const PolicyInfo& info, const std::string& spec, bool plus_prompt,
                   std::optional<bool> protect_prompt, std::optional<int> sinks, const SelectorParams& params,
                   bool check_params);

/// The parameters policy `info` reads (name, type, default, range), found by running its
/// factory on a recording SelectorParams (eviction/selector.h): a new selector is described
/// without extra code. Empty for `full`.
std::vector<ParamSpec> policy_params(const PolicyInfo& info);

/// The `--param` items that apply to policy `spec` (name or name+prompt). An item is
/// `[POLICY:]NAME=VALUE`: with a POLICY prefix (a registered name, "+prompt" optional) it applies
/// to that policy only and is returned without the prefix; without one it applies to every
/// policy that takes NAME. A ':' after the '=' belongs to the value (`stats=C:/x.json`). Throws
/// kvevict::Error for an unknown POLICY prefix (with a "did you mean").
std::vector<std::string> params_for_policy(const std::vector<std::string>& items, const std::string& spec);

/// Checks `items` against the policies `specs` of one run: every item must be taken by at least
/// one of them (a prefixed item by its policy). Builds each policy once (so a parameter's value
/// and files are checked too). Throws kvevict::Error naming the first item nobody takes.
void check_param_items(const std::vector<std::string>& items, const std::vector<std::string>& specs);

}  // namespace kvevict
