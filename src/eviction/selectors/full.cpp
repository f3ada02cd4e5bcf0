// `full`: no eviction; the reference every policy is compared with (docs/eviction-spec.md §3).
#include "eviction/registry.h"

namespace kvevict {

const PolicyInfo& policy_full() {
  static const PolicyInfo info{.name = "full",
                               .summary = "No eviction: the whole cache is kept (the reference).",
                               .source = "docs/eviction-spec.md §3",
                               .evicts = false,
                               .protect_prompt = false,
                               .sinks = 0};
  return info;
}

}  // namespace kvevict
