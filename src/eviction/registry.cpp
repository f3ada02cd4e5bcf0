#include "eviction/registry.h"

#include <fmt/format.h>

#include "util/error.h"

// One line per policy: id is the suffix of the factory `policy_<id>()` in eviction/selectors/.
#define KVEVICT_POLICIES(X) \
  X(full)                   \
  X(random)                 \
  X(random_unprotected)     \
  X(recency)                \
  X(streaming)              \
  X(random_shared)          \
  X(snapkv)                 \
  X(rkv)                    \
  X(vase)                   \
  X(h2o)                    \
  X(tova)                   \
  X(triattention)           \
  X(random_beacon)

namespace kvevict {

#define KVEVICT_DECLARE(id) const PolicyInfo& policy_##id();
KVEVICT_POLICIES(KVEVICT_DECLARE)
#undef KVEVICT_DECLARE

const std::vector<const PolicyInfo*>& all_policies() {
#define KVEVICT_ENTRY(id) &policy_##id(),
  static const std::vector<const PolicyInfo*> list = {KVEVICT_POLICIES(KVEVICT_ENTRY)};
#undef KVEVICT_ENTRY
  return list;
}

std::string policy_names() {
  std::string s;
  for (const PolicyInfo* p : all_policies()) s += (s.empty() ? "" : ", ") + p->name;
  return s;
}

Policy make_policy(const std::string& spec, std::optional<bool> protect_prompt,
                   std::optional<int> sinks, const SelectorParams& params, bool check_params) {
  std::string name = spec;
  bool plus_prompt = false;
  if (const auto plus = spec.rfind("+prompt"); plus != std::string::npos && plus + 7 == spec.size()) {
    name = spec.substr(0, plus);
    plus_prompt = true;
  }
  const PolicyInfo* info = nullptr;
  for (const PolicyInfo* p : all_policies())
    if (p->name == name) info = p;
  if (!info) throw Error(fmt::format("unknown policy '{}' (known: {}; any may take +prompt)", spec, policy_names()));
  if (sinks && *sinks < 0) throw Error(fmt::format("--sinks {}: must be >= 0", *sinks));
  if (plus_prompt && protect_prompt && !*protect_prompt)
    throw Error(fmt::format("policy '{}' asks for prompt protection but --no-protect-prompt was given", spec));
  Policy p;
  p.name = spec;
  p.info = info;
  p.evicts = info->evicts;
  p.protect_prompt = plus_prompt || protect_prompt.value_or(info->protect_prompt);
  p.sinks = sinks.value_or(info->sinks);
  if (info->make) p.selector = info->make(params);
  if (check_params) params.check_all_used(spec);
  return p;
}

}  // namespace kvevict
