// PNG figures through tools/plot_kvevict.py (matplotlib). kvevict itself links no plotting
// library: it finds a Python 3 that can import matplotlib (Debian: python3-matplotlib) and runs
// the script; without one, plots are skipped with a reason and nothing else fails.
#pragma once

#include <string>
#include <vector>

namespace kvevict {

/// Name of the plotting script inside the tools directory.
inline constexpr const char* kPlotScript = "plot_kvevict.py";

/// A Python 3 interpreter that can import matplotlib: $KVEVICT_PYTHON if set, else
/// /usr/bin/python3 (Debian's, where python3-matplotlib installs), else `python3` on PATH
/// (which may be a pyenv shim without matplotlib). "" when none can. Probed once per process.
std::string find_matplotlib_python();

/// Directory holding kPlotScript: $KVEVICT_TOOLS_DIR if set, else the first `tools/` or
/// `share/kvevict/` holding it found walking up from the running executable's directory (a build
/// directory inside the source tree finds <source>/tools; an installed <prefix>/bin/kvevict finds
/// <prefix>/share/kvevict). "" when none.
std::string find_tools_dir();

/// Runs `python kPlotScript args...`. Returns "" on success, else a one-line reason (no
/// interpreter with matplotlib, no script, or the script's exit status); never throws.
std::string run_plot_script(const std::vector<std::string>& args);

}  // namespace kvevict
