// The one builder from settings to a policy and its schedule, shared by every front end: the CLI
// fills PolicySettings from flags, the server from its flags and each request's kv_* fields, the
// Python package from keyword arguments; all get the same validated CheckedPolicy (Policy +
// EvictionConfig) and the same errors, which name the field (util/field_error.h) so each front
// end spells it its own way.
//
// Source: docs/eviction-spec.md §2 (schedule: B, r, pins, §2.5 long prompts) and §3 (policies,
// `+prompt`, sinks, selector parameters).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "eviction/registry.h"
#include "eviction/schedule.h"

namespace kvevict {

/// Policy and schedule settings as a user gives them (every field optional in spirit: the
/// defaults are the CLI's).
struct PolicySettings {
  std::string policy;                  ///< name or name+prompt; "" = `random` when budget > 0, else `full`
  int64_t budget = 0;                  ///< B, slots per (layer, KV head); 0 = not given
  int64_t recent = 64;                 ///< r, newest slots never evicted
  std::optional<int64_t> interval;     ///< s, decode steps between rounds; unset = r (spec §2.3)
  std::optional<int> sinks;            ///< pinned first positions; unset = the policy's default
  std::optional<bool> protect_prompt;  ///< pin the prompt inside K_sel; unset = the policy's default
  LongPromptMode long_prompt = LongPromptMode::PinHead;  ///< spec §2.5
  PositionMode positions = PositionMode::Logical;        ///< RoPE positions of cached keys (spec §2, §5)
  uint64_t seed = 0;                                     ///< base seed of every eviction draw
  std::vector<std::string> params;                       ///< selector parameters [POLICY:]NAME=VALUE
  /// A policy defined outside the registry (eviction/external.h: the Python package's selectors),
  /// run instead of looking `policy` up; it takes no `params`. Must outlive the policy built.
  const PolicyInfo* custom = nullptr;
};

/// The policy the settings name: custom->name, `policy`, or the default (`random` with a budget,
/// else `full`).
std::string policy_name(const PolicySettings& s);

/// Builds the policy `name` (one entry of a grid, or policy_name(s)) with the settings' sinks,
/// prompt protection and its share of `params` (params_for_policy). With check_params, a
/// parameter this policy does not take is an error; a grid passes false and calls
/// check_param_items once for all its policies. Throws FieldError (Policy, Sinks,
/// ProtectPrompt, Param); Policy also for `+prompt` on a policy that evicts nothing ("full+prompt").
Policy build_policy(const PolicySettings& s, const std::string& name, bool check_params = true);

/// The schedule of `policy` under the settings, validated once (validate_eviction): budget,
/// recent buffer, long-prompt mode, positions, seed. Throws FieldError: Budget when an evicting
/// policy has none or B is outside [1, limits::kTokens], Recent outside [1, limits::kTokens],
/// RoundInterval outside [1, limits::kTokens],
/// Sinks outside [0, limits::kTokens], and whatever validate_eviction refuses.
CheckedPolicy build_schedule(const PolicySettings& s, const Policy& policy);

/// build_schedule(s, build_policy(s, policy_name(s))): what a front end running one policy calls.
CheckedPolicy build_policy_config(const PolicySettings& s);

/// "pin-head" / "skip" -> LongPromptMode. Throws FieldError(LongPrompt) naming the choices.
LongPromptMode parse_long_prompt(std::string_view text);
/// "logical" / "cache" -> PositionMode. Throws FieldError(PositionMode) naming the choices.
PositionMode parse_position_mode(std::string_view text);

}  // namespace kvevict
