// kvevict command-line interface. Each subcommand lives in its own file and registers itself
// through one add_* line below. Every user error (bad option, missing file, B <= r, unknown
// policy) prints one line and exits with code 2.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <new>
#include <string>
#include <vector>

#include "cli/common.h"
#include "util/error.h"
#include "util/suggest.h"

namespace {

// CLI11 reports a failed check as "NAME: MESSAGE"; the checks of cli/common (int_range, at_least,
// seed_value, the thread cap) write MESSAGE as "must be ... (got VALUE)". Rewritten here into the
// wording of every other option error, "NAME VALUE: must be ...", as is CLI11's "Could not
// convert: NAME = VALUE" (a number option given a non-number; integer options are checked before
// conversion). Other messages stay as they are.
std::string option_error(const std::string& what) {
  if (const std::string conv = "Could not convert: "; what.rfind(conv, 0) == 0) {
    const size_t eq = what.find(" = ", conv.size());
    if (eq == std::string::npos) return what;
    return fmt::format("{} {}: must be a number", what.substr(conv.size(), eq - conv.size()), what.substr(eq + 3));
  }
  const size_t colon = what.find(": must be ");
  const size_t got = what.rfind(" (got ");
  if (colon == std::string::npos || got == std::string::npos || got < colon || what.back() != ')') return what;
  const std::string value = what.substr(got + 6, what.size() - got - 7);
  return fmt::format("{} {}: {}", what.substr(0, colon), value, what.substr(colon + 2, got - colon - 2));
}

}  // namespace

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
  add_divergence(app, commands);
  add_serve(app, commands);

  if (argc < 2) {
    fmt::print(stderr, "kvevict: error: no command given (try `kvevict --help`, or `kvevict COMMAND --help`)\n");
    return 2;
  }
  if (argv[1][0] != '-') {
    std::string known;
    std::vector<std::string> names;
    bool found = false;
    for (const Command& c : commands) {
      known += (known.empty() ? "" : ", ") + c.app->get_name();
      names.push_back(c.app->get_name());
      found |= c.app->get_name() == argv[1];
    }
    if (!found) {
      const std::string guess = kvevict::closest_match(argv[1], names);
      fmt::print(stderr, "kvevict: error: unknown command '{}' ({}commands: {}; see `kvevict --help`)\n", argv[1],
                 guess.empty() ? "" : fmt::format("did you mean '{}'? ", guess), known);
      return 2;
    }
  }
  // Old option spellings become the current ones; CLI11 then sees one vocabulary.
  std::vector<std::string> args = apply_aliases(std::vector<std::string>(argv, argv + argc));
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  try {
    app.parse(static_cast<int>(cargs.size()), cargs.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ExtrasError& e) {
    // The deepest subcommand that parsed holds the arguments CLI11 could not place.
    const CLI::App* sub = &app;
    for (bool deeper = true; deeper;) {
      deeper = false;
      for (const CLI::App* c : sub->get_subcommands())
        if (c->parsed()) sub = c, deeper = true;
    }
    const std::string hint = suggest_options(*sub, sub->remaining());
    fmt::print(stderr, "kvevict: error: {}{} (see `kvevict {}--help`)\n", e.what(),
               hint.empty() ? "" : " (" + hint + ")", sub == &app ? "" : sub->get_name() + " ");
    return 2;
  } catch (const CLI::RequiredError& e) {
    fmt::print(stderr, "kvevict: error: {} (see `--help`)\n", e.what());
    return 2;
  } catch (const CLI::ValidationError& e) {
    fmt::print(stderr, "kvevict: error: {}\n", option_error(e.what()));
    return 2;
  } catch (const CLI::ConversionError& e) {
    fmt::print(stderr, "kvevict: error: {}\n", option_error(e.what()));
    return 2;
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
