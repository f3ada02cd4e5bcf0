// One temporary folder per run of the test program: $TMPDIR/kvevict-tests-<pid> (TMPDIR unset:
// the system's temporary folder). Every test writes its files there, under a name of its own;
// the folder and everything in it are removed when the program ends (test_tmp.cpp registers a
// GoogleTest environment that does it), so a run leaves nothing behind, whatever a test wrote.
// CTest runs each test as its own process, so each gets its own folder.
#pragma once

#include <string>

namespace kvevict::test {

/// This process's temporary folder (created on first use).
std::string tmp_dir();

/// tmp_dir() + "/" + name. Names need not be unique across test programs, only within one.
std::string tmp_path(const std::string& name);

/// A fresh, empty folder tmp_dir()/name (removed and re-created).
std::string fresh_dir(const std::string& name);

}  // namespace kvevict::test
