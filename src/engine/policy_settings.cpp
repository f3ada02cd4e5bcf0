#include "engine/policy_settings.h"

#include <fmt/format.h>

#include "util/field_error.h"
#include "util/limits.h"

namespace kvevict {

std::string policy_name(const PolicySettings& s) {
  if (s.custom) return s.custom->name;
  if (!s.policy.empty()) return s.policy;
  return s.budget > 0 ? "random" : "full";
}

Policy build_policy(const PolicySettings& s, const std::string& name, bool check_params) {
  if (s.sinks && (*s.sinks < 0 || *s.sinks > limits::kTokens))
    throw FieldError(Field::Sinks, "", fmt::format(" {}: must be in [0, {}]", *s.sinks, limits::kTokens));
  if (s.custom) {
    if (!s.params.empty())
      throw FieldError(Field::Param, "",
                       fmt::format(": policy '{}' is defined outside the registry and takes none (give its settings "
                                   "to the selector itself)",
                                   name));
    return make_policy(*s.custom, name, false, s.protect_prompt, s.sinks, {}, false);
  }
  if (check_params && !s.params.empty()) check_param_items(s.params, {name});
  Policy p = make_policy(name, s.protect_prompt, s.sinks, SelectorParams::parse(params_for_policy(s.params, name)),
                         /*check_params=*/false);
  // A pin on a policy that evicts nothing would change nothing: refused, as no setting is ignored.
  if (!p.evicts && name.ends_with("+prompt"))
    throw FieldError::plain(Field::Policy,
                            fmt::format("policy '{}': +prompt pins the prompt against eviction, but '{}' keeps "
                                        "every token (use '{}')",
                                        name, p.info->name, p.info->name));
  return p;
}

CheckedPolicy build_schedule(const PolicySettings& s, const Policy& policy) {
  if (s.budget < 0 || s.budget > limits::kTokens)
    throw FieldError(Field::Budget, "", fmt::format(" {}: must be in [1, {}]", s.budget, limits::kTokens));
  if (s.recent < 1 || s.recent > limits::kTokens)
    throw FieldError(Field::Recent, "", fmt::format(" {}: must be in [1, {}]", s.recent, limits::kTokens));
  if (s.interval && (*s.interval < 1 || *s.interval > limits::kTokens))
    throw FieldError(Field::RoundInterval, "",
                     fmt::format(" {}: must be in [1, {}]", *s.interval, limits::kTokens));
  EvictionConfig c;
  c.budget = s.budget;
  c.recent = s.recent;
  c.interval = s.interval.value_or(0);
  c.seed = s.seed;
  c.long_prompt = s.long_prompt;
  c.positions = s.positions;
  if (policy.evicts && s.budget == 0)
    throw FieldError(Field::Budget, fmt::format("policy '{}' needs ", policy.name), " B");
  return CheckedPolicy::check(policy, c);
}

CheckedPolicy build_policy_config(const PolicySettings& s) {
  return build_schedule(s, build_policy(s, policy_name(s)));
}

LongPromptMode parse_long_prompt(std::string_view text) {
  if (text == "pin-head") return LongPromptMode::PinHead;
  if (text == "skip") return LongPromptMode::Skip;
  throw FieldError(Field::LongPrompt, "", fmt::format(" '{}': must be pin-head or skip", text));
}

PositionMode parse_position_mode(std::string_view text) {
  if (text == "logical") return PositionMode::Logical;
  if (text == "cache") return PositionMode::Cache;
  throw FieldError(Field::PositionMode, "", fmt::format(" '{}': must be logical or cache", text));
}

}  // namespace kvevict
