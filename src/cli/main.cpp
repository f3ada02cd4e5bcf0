// kvevict command-line interface. Each subcommand lives in its own file and registers itself
// through one add_* line below. Every user error (bad option, missing file, B <= r, unknown
// policy) prints one line and exits with code 2.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cctype>
#include <filesystem>
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

// "bench decode" for the `decode` app under `bench`: the command as the user typed it.
std::string command_path(const CLI::App* app) {
  std::string path;
  for (; app != nullptr && app->get_parent() != nullptr; app = app->get_parent())
    path = app->get_name() + (path.empty() ? "" : " " + path);
  return path;
}

// The subcommand the arguments name (deepest match: `bench decode`), or `root`.
const CLI::App* typed_command(const CLI::App& root, const std::vector<std::string>& args) {
  const CLI::App* app = &root;
  for (size_t i = 1; i < args.size(); ++i) {
    const CLI::App* sub = nullptr;
    for (const CLI::App* c : app->get_subcommands({}))
      if (c->get_name() == args[i]) sub = c;
    if (sub == nullptr) break;
    app = sub;
  }
  return app;
}

// llama.cpp spells some options with one dash and several letters (-ngl, -ctk, -fa, -np); CLI11
// reads `-ngl 99` as `-n gl` followed by a stray 99. An argument of one dash and two or more
// letters whose first letter is a numeric option of the command cannot be meant that way: name
// it as an unknown option instead. Returns the error line, or "".
std::string llama_cpp_style_option(const CLI::App& root, const std::vector<std::string>& args) {
  const CLI::App* app = typed_command(root, args);
  for (size_t i = 2; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 3 || a[0] != '-' || !std::isalpha(static_cast<unsigned char>(a[1]))) continue;
    if (!std::all_of(a.begin() + 1, a.end(), [](unsigned char c) { return std::isalpha(c) != 0; })) continue;
    const CLI::Option* o = app->get_option_no_throw(std::string("-") + a[1]);
    if (o == nullptr) continue;
    const std::string type = o->get_type_name();
    if (type.rfind("INT", 0) != 0 && type.rfind("UINT", 0) != 0 && type.rfind("FLOAT", 0) != 0) continue;
    return fmt::format(
        "unknown option '{}' (options with one dash are one letter here: it would read as -{} {}; see `kvevict {} "
        "--help`)",
        a, a[1], a.substr(2), command_path(app));
  }
  return {};
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
  if (const std::string e = llama_cpp_style_option(app, args); !e.empty()) {
    fmt::print(stderr, "kvevict: error: {}\n", e);
    return 2;
  }
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
               hint.empty() ? "" : " (" + hint + ")", sub == &app ? "" : command_path(sub) + " ");
    return 2;
  } catch (const CLI::RequiredError& e) {
    const CLI::App* typed = typed_command(app, args);
    fmt::print(stderr, "kvevict: error: {} (see `kvevict {}--help`)\n", e.what(),
               typed == &app ? "" : command_path(typed) + " ");
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
  } catch (const kvevict::FieldError& e) {
    // Lower layers name the field; the CLI spells it as the flag that sets it.
    fmt::print(stderr, "kvevict: error: {}\n", e.message(kvevict::flag_name(e.field())));
    return 2;
  } catch (const kvevict::Error& e) {
    fmt::print(stderr, "kvevict: error: {}\n", e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "kvevict: error: out of memory\n");
    return 2;
  } catch (const std::filesystem::filesystem_error& e) {
    // A file that changes under a running command (removed, unreadable) is the environment's
    // doing, not a bug: say which file, do not abort.
    fmt::print(stderr, "kvevict: error: {}\n", e.what());
    return 2;
  }
  return 0;
}
