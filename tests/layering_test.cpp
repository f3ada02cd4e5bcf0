// The layering rule of CONTRIBUTING.md ("Layering"), checked on every `#include "..."` under src/:
// a file may include headers of its own folder and of folders to its left in
//   util -> format -> kernels -> kvcache -> model -> eviction -> engine -> serve / eval / tasks / bench -> cli
// never of a folder to its right, and never of a peer (folders joined by " / " do not include
// each other). The order is read from CONTRIBUTING.md itself, so the rule and its check cannot
// drift apart; a folder of src/ that the order does not name is an error too.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "test_tmp.h"
#include "test_paths.h"

namespace kvevict {
namespace {

namespace fs = std::filesystem;

/// Rank of each folder: peers share a rank. Parsed from the first line of `contributing` that
/// starts with "util ->" (stripped), e.g. "util -> format -> ... -> serve / eval -> cli".
std::map<std::string, int> layer_ranks(const std::string& contributing) {
  std::ifstream in(contributing);
  std::string line;
  while (std::getline(in, line)) {
    const size_t b = line.find_first_not_of(' ');
    if (b == std::string::npos || line.compare(b, 7, "util ->") != 0) continue;
    std::map<std::string, int> rank;
    std::stringstream ss(line.substr(b));
    std::string word;
    int r = 0;
    while (ss >> word) {
      if (word == "->") {
        ++r;
      } else if (word != "/") {
        rank[word] = r;
      }
    }
    return rank;
  }
  return {};
}

/// One message per include that breaks the order: "FILE:LINE: includes "X" (a higher layer / a
/// peer / an unknown layer)". Includes without a folder ("x.h") are relative to the including
/// file's folder and always allowed.
std::vector<std::string> layering_violations(const fs::path& src, const std::map<std::string, int>& rank) {
  static const std::regex include_re(R"(^\s*#\s*include\s*"([^"]+)\")");
  std::vector<std::string> out;
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    if (!entry.is_regular_file()) continue;
    const fs::path rel = fs::relative(entry.path(), src);
    const std::string ext = rel.extension().string();
    if (ext != ".h" && ext != ".cpp" && ext != ".hpp" && ext != ".inc") continue;
    const std::string from = rel.begin()->string();
    const auto from_rank = rank.find(from);
    if (from_rank == rank.end()) {
      out.push_back(rel.string() + ": folder '" + from + "' is not in the layer order of CONTRIBUTING.md");
      continue;
    }
    std::ifstream in(entry.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      std::smatch m;
      if (!std::regex_search(line, m, include_re)) continue;
      const std::string target = m[1];
      const size_t slash = target.find('/');
      if (slash == std::string::npos) continue;
      const std::string to = target.substr(0, slash);
      const std::string where = rel.string() + ":" + std::to_string(n) + ": includes \"" + target + "\"";
      const auto to_rank = rank.find(to);
      if (to_rank == rank.end()) {
        out.push_back(where + " (folder '" + to + "' is not in the layer order)");
      } else if (to_rank->second > from_rank->second) {
        out.push_back(where + " (" + to + " is a higher layer than " + from + ")");
      } else if (to_rank->second == from_rank->second && to != from) {
        out.push_back(where + " (" + to + " and " + from + " are peers)");
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

const std::string kSource = kvevict::test::source_dir();

TEST(Layering, OrderIsReadFromContributing) {
  const auto rank = layer_ranks(kSource + "/CONTRIBUTING.md");
  ASSERT_FALSE(rank.empty()) << "CONTRIBUTING.md has no line starting with \"util ->\"";
  EXPECT_LT(rank.at("util"), rank.at("format"));
  EXPECT_LT(rank.at("engine"), rank.at("serve"));
  EXPECT_EQ(rank.at("serve"), rank.at("eval"));
  EXPECT_EQ(rank.at("eval"), rank.at("tasks"));
  EXPECT_EQ(rank.at("tasks"), rank.at("bench"));
  EXPECT_LT(rank.at("bench"), rank.at("cli"));
}

TEST(Layering, SourceTreeFollowsTheOrder) {
  const auto rank = layer_ranks(kSource + "/CONTRIBUTING.md");
  ASSERT_FALSE(rank.empty());
  const auto bad = layering_violations(kSource + "/src", rank);
  std::string all;
  for (const std::string& b : bad) all += "\n  " + b;
  EXPECT_TRUE(bad.empty()) << bad.size() << " include(s) break the layer order of CONTRIBUTING.md:" << all;
}

// The check itself, on a small tree with one include of each kind: it must report exactly the
// upward include, the peer include and the unknown folders, and nothing else.
TEST(Layering, ReportsUpwardPeerAndUnknownIncludes) {
  const fs::path root = test::fresh_dir("layering");
  const auto write = [&](const std::string& rel, const std::string& text) {
    fs::create_directories((root / rel).parent_path());
    std::ofstream(root / rel) << text;
  };
  write("util/a.h", "#include <vector>\n#include \"util/b.h\"\n");
  write("util/b.h", "#include \"b_detail.h\"\n");
  write("model/m.cpp", "#include \"util/a.h\"\n  #  include \"engine/e.h\"  // upward\n");
  write("engine/e.h", "#include \"model/m.h\"\n");
  write("eval/x.cpp", "#include \"tasks/t.h\"\n#include \"engine/e.h\"\n");
  write("tasks/t.cpp", "#include \"tasks/t.h\"\n");
  write("cli/main.cpp", "#include \"eval/x.h\"\n#include \"tasks/t.h\"\n#include \"nowhere/n.h\"\n");
  write("extra/z.h", "\n");
  write("util/notes.txt", "#include \"cli/main.h\"\n");
  const std::map<std::string, int> rank = {{"util", 0}, {"model", 1}, {"engine", 2},
                                           {"eval", 3}, {"tasks", 3}, {"cli", 4}};
  const std::vector<std::string> expected = {
      "cli/main.cpp:3: includes \"nowhere/n.h\" (folder 'nowhere' is not in the layer order)",
      "eval/x.cpp:1: includes \"tasks/t.h\" (tasks and eval are peers)",
      "extra/z.h: folder 'extra' is not in the layer order of CONTRIBUTING.md",
      "model/m.cpp:2: includes \"engine/e.h\" (engine is a higher layer than model)",
  };
  EXPECT_EQ(layering_violations(root, rank), expected);
}

}  // namespace
}  // namespace kvevict
