#include "eval/plots.h"

#include <fmt/format.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>

namespace kvevict {
namespace {

namespace fs = std::filesystem;

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (const char c : s) {
    if (c == '\'')
      q.append("'\\''");
    else
      q.push_back(c);
  }
  q.push_back('\'');
  return q;
}

bool can_import_matplotlib(const std::string& python) {
  const std::string cmd = shell_quote(python) + " -c 'import matplotlib' >/dev/null 2>&1";
  const int status = std::system(cmd.c_str());
  return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

}  // namespace

std::string find_matplotlib_python() {
  static const std::string found = [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("KVEVICT_PYTHON"); env && *env) candidates.emplace_back(env);
    candidates.emplace_back("/usr/bin/python3");
    candidates.emplace_back("python3");
    for (const std::string& c : candidates)
      if (can_import_matplotlib(c)) return c;
    return std::string();
  }();
  return found;
}

std::string find_tools_dir() {
  if (const char* env = std::getenv("KVEVICT_TOOLS_DIR"); env && *env) return env;
  std::error_code ec;
  fs::path dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  if (ec) return "";
  for (int up = 0; up < 4 && !dir.empty(); ++up, dir = dir.parent_path()) {
    if (fs::exists(dir / "tools" / kPlotScript, ec)) return (dir / "tools").string();
    // An installed binary: <prefix>/bin/kvevict finds <prefix>/share/kvevict/ (CMake install()).
    if (fs::exists(dir / "share" / "kvevict" / kPlotScript, ec)) return (dir / "share" / "kvevict").string();
    if (dir == dir.root_path()) break;
  }
  return "";
}

std::string run_plot_script(const std::vector<std::string>& args) {
  const std::string python = find_matplotlib_python();
  if (python.empty())
    return "no Python 3 with matplotlib found (tried $KVEVICT_PYTHON, /usr/bin/python3, python3); install "
           "python3-matplotlib";
  const std::string tools = find_tools_dir();
  if (tools.empty())
    return fmt::format("{} not found (set KVEVICT_TOOLS_DIR to kvevict's tools/ directory)", kPlotScript);
  std::string cmd = shell_quote(python);
  for (const std::string& a : std::vector<std::string>{(fs::path(tools) / kPlotScript).string()}) {
    cmd.push_back(' ');
    cmd.append(shell_quote(a));
  }
  for (const std::string& a : args) {
    cmd.push_back(' ');
    cmd.append(shell_quote(a));
  }
  cmd += " 1>&2";  // the script's messages go to stderr with kvevict's own
  const int status = std::system(cmd.c_str());
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return fmt::format("{} failed (status {})", kPlotScript, status == -1 ? -1 : WEXITSTATUS(status));
  return "";
}

}  // namespace kvevict
