#include "eviction/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "util/error.h"
#include "util/field_error.h"
#include "util/suggest.h"

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

Policy make_policy(const std::string& spec, std::optional<bool> protect_prompt, std::optional<int> sinks,
                   const SelectorParams& params, bool check_params) {
  std::string name = spec;
  bool plus_prompt = false;
  if (const auto plus = spec.rfind("+prompt"); plus != std::string::npos && plus + 7 == spec.size()) {
    name = spec.substr(0, plus);
    plus_prompt = true;
  }
  const PolicyInfo* info = nullptr;
  for (const PolicyInfo* p : all_policies())
    if (p->name == name) info = p;
  if (!info) {
    std::vector<std::string> names;
    for (const PolicyInfo* p : all_policies()) names.push_back(p->name);
    for (const PolicyInfo* p : all_policies()) names.push_back(p->name + "+prompt");
    const std::string guess = closest_match(spec, names);
    throw FieldError::plain(
        Field::Policy,
        fmt::format("unknown policy '{}' ({}known: {}; any may take +prompt)", spec,
                    guess.empty() ? "" : fmt::format("did you mean '{}'? ", guess), policy_names()));
  }
  return make_policy(*info, spec, plus_prompt, protect_prompt, sinks, params, check_params);
}

Policy make_policy(const PolicyInfo& info, const std::string& spec, bool plus_prompt,
                   std::optional<bool> protect_prompt, std::optional<int> sinks, const SelectorParams& params,
                   bool check_params) {
  if (sinks && *sinks < 0) throw FieldError(Field::Sinks, "", fmt::format(" {}: must be >= 0", *sinks));
  if (plus_prompt && protect_prompt && !*protect_prompt)
    throw FieldError(Field::ProtectPrompt, fmt::format("policy '{}' asks for prompt protection but ", spec),
                     " was turned off");
  Policy p;
  p.name = spec;
  p.info = &info;
  p.evicts = info.evicts;
  p.protect_prompt = plus_prompt || protect_prompt.value_or(info.protect_prompt);
  p.sinks = sinks.value_or(info.sinks);
  if (info.make) p.selector = info.make(params);
  if (check_params) params.check_all_used(spec);
  return p;
}

namespace {

/// "snapkv+prompt" -> "snapkv".
std::string base_name(const std::string& spec) {
  const auto plus = spec.rfind("+prompt");
  return plus != std::string::npos && plus + 7 == spec.size() ? spec.substr(0, plus) : spec;
}

/// The POLICY prefix of an item ("" when it has none).
std::string item_prefix(const std::string& item) {
  const auto colon = item.find(':'), eq = item.find('=');
  if (colon == std::string::npos || colon == 0 || (eq != std::string::npos && eq < colon)) return {};
  return item.substr(0, colon);
}

}  // namespace

std::vector<ParamSpec> policy_params(const PolicyInfo& info) {
  std::vector<ParamSpec> out;
  if (!info.make) return out;
  try {
    (void)info.make(SelectorParams::recording(&out));
  } catch (const Error&) {
    // A required parameter (triattention's stats file) is missing: what was read so far is recorded.
  }
  return out;
}

std::vector<std::string> params_for_policy(const std::vector<std::string>& items, const std::string& spec) {
  std::vector<std::string> mine;
  const std::string base = base_name(spec);
  for (const std::string& item : items) {
    const std::string prefix = item_prefix(item);
    if (prefix.empty()) {
      mine.push_back(item);
      continue;
    }
    std::vector<std::string> names;
    for (const PolicyInfo* p : all_policies()) names.push_back(p->name);
    if (std::find(names.begin(), names.end(), base_name(prefix)) == names.end()) {
      const std::string guess = closest_match(base_name(prefix), names);
      throw FieldError(Field::Param, "",
                       fmt::format(" '{}': unknown policy '{}'{} (the form is [POLICY:]NAME=VALUE)", item, prefix,
                                   guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess)));
    }
    if (prefix == spec || prefix == base) mine.push_back(item.substr(prefix.size() + 1));
  }
  return mine;
}

void check_param_items(const std::vector<std::string>& items, const std::vector<std::string>& specs) {
  (void)SelectorParams::parse(items);  // syntax errors first (missing '=')
  std::vector<bool> taken(items.size(), false);
  for (const std::string& spec : specs) {
    std::vector<std::string> mine;
    std::vector<size_t> index;
    for (size_t i = 0; i < items.size(); ++i) {
      const auto one = params_for_policy({items[i]}, spec);
      if (!one.empty()) mine.push_back(one[0]), index.push_back(i);
    }
    const SelectorParams params = SelectorParams::parse(mine);
    (void)make_policy(spec, std::nullopt, std::nullopt, params, /*check_params=*/false);
    const std::vector<std::string> unused = params.unused();
    for (size_t j = 0; j < mine.size(); ++j) {
      const std::string key = mine[j].substr(0, mine[j].find('='));
      if (std::find(unused.begin(), unused.end(), key) == unused.end()) taken[index[j]] = true;
    }
  }
  for (size_t i = 0; i < items.size(); ++i)
    if (!taken[i])
      throw FieldError(Field::Param, "",
                       fmt::format(" '{}': no policy of this run takes it (policies: {})", items[i],
                                   fmt::format("{}", fmt::join(specs, ","))));
}

}  // namespace kvevict
