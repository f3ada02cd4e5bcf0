// `kvevict policies`: the registry as a table.
#include <fmt/format.h>

#include "cli/common.h"
#include "eviction/registry.h"

namespace kvevict::cli {
namespace {

int run_policies() {
  fmt::print("{:<20} {:>7} {:>6}  {}\n", "policy", "prompt", "sinks", "what it keeps");
  for (const PolicyInfo* p : all_policies())
    fmt::print("{:<20} {:>7} {:>6}  {}\n", p->name, p->evicts ? (p->protect_prompt ? "pinned" : "-") : "all",
               p->sinks, p->summary);
  return 0;
}


}  // namespace

void add_policies(CLI::App& root, std::vector<Command>& out) {
  auto* pol = root.add_subcommand("policies", "List the eviction policies with their default protection");
  out.push_back({pol, [] { return run_policies(); }});
}

}  // namespace kvevict::cli
