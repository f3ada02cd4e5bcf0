// `full`: no eviction; the reference every policy is compared with (eviction-spec.md §3).
#include "eviction/registry.h"

namespace kvevict {

const PolicyInfo& policy_full() {
  static const PolicyInfo info{"full", "No eviction: the whole cache is kept (the reference).",
                               "eviction-spec.md §3", /*evicts=*/false, false, 0, nullptr};
  return info;
}

}  // namespace kvevict
