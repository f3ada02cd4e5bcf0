// kvevict command-line interface. Each subcommand lives in its own file and registers itself
// through one add_* line below. Every user error (bad option, missing file, B <= r, unknown
// policy) prints one line and exits with code 2.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <new>

#include "cli/common.h"
#include "util/error.h"

int main(int argc, char** argv) {
  using namespace kvevict::cli;
  CLI::App app{"kvevict: LLM inference with a per-KV-head token budget and pluggable eviction"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");
  std::vector<Command> commands;
  add_generate(app, commands);
  add_perplexity(app, commands);
  add_policies(app, commands);
  add_tasks(app, commands);
  add_tools(app, commands);
  add_bench(app, commands);
  add_calibrate(app, commands);
  add_keeplog(app, commands);
  add_eval(app, commands);
  add_merge(app, commands);
  add_probe(app, commands);
  add_serve(app, commands);

  if (argc > 1 && argv[1][0] != '-') {
    std::string known;
    bool found = false;
    for (const Command& c : commands) {
      known += (known.empty() ? "" : ", ") + c.app->get_name();
      found |= c.app->get_name() == argv[1];
    }
    if (!found) {
      fmt::print(stderr, "kvevict: error: unknown command '{}' (commands: {})\n", argv[1], known);
      return 2;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "kvevict: error: {}\n", e.what());
    return 2;
  }
  try {
    for (const Command& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const kvevict::Error& e) {
    fmt::print(stderr, "kvevict: error: {}\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "kvevict: error: out of memory\n");
    return 2;
  }
  return 0;
}
