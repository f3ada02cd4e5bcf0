// Task readers. Expected values: the real MATH-500 / GSM8K files' own fields (first lines, read
// with nlohmann::json here), and small files written by the tests with known bad lines.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "eval/task_file.h"
#include "test_paths.h"
#include "test_tmp.h"
#include "util/error.h"

namespace kvevict {
namespace {

namespace fs = std::filesystem;

fs::path scratch_dir() { return test::tmp_dir(); }

std::string write_temp(const std::string& name, const std::string& text) {
  const fs::path& dir = scratch_dir();
  fs::create_directories(dir);
  const std::string path = (dir / name).string();
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(EvalTasks, Math500FirstProblems) {
  const std::string path = test::shared_path("data/math500/test.jsonl");
  if (!fs::exists(path)) KVEVICT_SKIP_UNLESS_CI(path << " not found");
  TaskReadOptions o;
  o.limit = 5;
  const EvalTaskFile f = read_tasks(path, o);
  EXPECT_EQ(f.format, TaskFormat::Math500);
  ASSERT_EQ(f.tasks.size(), 5u);
  std::ifstream in(path);
  std::string line;
  for (size_t i = 0; i < 5; ++i) {
    std::getline(in, line);
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(f.tasks[i].id, j["unique_id"].get<std::string>());
    EXPECT_EQ(f.tasks[i].problem, j["problem"].get<std::string>());
    EXPECT_EQ(f.tasks[i].answer, j["answer"].get<std::string>());
    EXPECT_EQ(f.tasks[i].grading, Grading::Math);
    EXPECT_EQ(f.tasks[i].index, static_cast<int64_t>(i));
    EXPECT_EQ(f.tasks[i].line, static_cast<int64_t>(i + 1));
  }
}

TEST(EvalTasks, Gsm8kFirstProblems) {
  const std::string path = test::shared_path("data/gsm8k/test.jsonl");
  if (!fs::exists(path)) KVEVICT_SKIP_UNLESS_CI(path << " not found");
  TaskReadOptions o;
  o.limit = 3;
  const EvalTaskFile f = read_tasks(path, o);
  EXPECT_EQ(f.format, TaskFormat::Gsm8k);
  ASSERT_EQ(f.tasks.size(), 3u);
  EXPECT_EQ(f.tasks[0].id, "gsm8k-1");
  EXPECT_EQ(f.tasks[0].answer, "18");  // the file's first answer ends "#### 18"
  EXPECT_EQ(f.tasks[0].grading, Grading::Gsm8k);
}

TEST(EvalTasks, ProjectFormatIgnoresUnknownFields) {
  const std::string path = write_temp("own.jsonl",
                                      "{\"id\": \"chain-0\", \"problem\": \"AB\\nBC\\n? A 02\", \"answer\": \"C\", "
                                      "\"family\": \"chain\", \"trace\": \"...\"}\n"
                                      "\n"
                                      "{\"id\": 7, \"problem\": \"x\", \"answer\": 42}\n");
  const EvalTaskFile f = read_tasks(path, {});
  EXPECT_EQ(f.format, TaskFormat::Kvevict);
  ASSERT_EQ(f.tasks.size(), 2u);
  EXPECT_EQ(f.tasks[0].id, "chain-0");
  EXPECT_EQ(f.tasks[0].answer, "C");
  EXPECT_EQ(f.tasks[0].grading, Grading::Exact);
  EXPECT_EQ(f.tasks[1].id, "7");
  EXPECT_EQ(f.tasks[1].answer, "42");
  EXPECT_EQ(f.tasks[1].line, 3);
}

TEST(EvalTasks, BadLinesStopOrSkipWithFileAndLine) {
  const std::string path = write_temp("bad.jsonl",
                                      "{\"id\": \"a\", \"problem\": \"p\", \"answer\": \"1\"}\n"
                                      "{\"id\": \"b\", \"problem\": \"p\", \"answer\": \n"  // line 2: not JSON
                                      "{\"id\": \"c\", \"problem\": \"p\"}\n"               // line 3: no answer
                                      "[1, 2]\n"                                            // line 4: not an object
                                      "{\"id\": \"a\", \"problem\": \"q\", \"answer\": \"2\"}\n"  // line 5: repeated id
                                      "{\"id\": \"d\", \"problem\": \"p\", \"answer\": \"3\"}\n");
  const std::string stop = error_of([&] { read_tasks(path, {}); });
  EXPECT_NE(stop.find(path + ":2: not valid JSON"), std::string::npos) << stop;
  EXPECT_EQ(stop.find('\n'), std::string::npos);

  std::vector<std::string> warnings;
  TaskReadOptions o;
  o.on_bad_line = BadLinePolicy::Skip;
  o.warn = [&](const std::string& w) { warnings.push_back(w); };
  const EvalTaskFile f = read_tasks(path, o);
  ASSERT_EQ(f.tasks.size(), 2u);
  EXPECT_EQ(f.tasks[1].id, "d");
  EXPECT_EQ(f.tasks[1].index, 1);
  EXPECT_EQ(f.skipped, 4);
  ASSERT_EQ(warnings.size(), 4u);
  EXPECT_NE(warnings[0].find(path + ":2:"), std::string::npos);
  EXPECT_NE(warnings[1].find(path + ":3: missing field 'answer'"), std::string::npos) << warnings[1];
  EXPECT_NE(warnings[2].find(path + ":4: expected a JSON object"), std::string::npos) << warnings[2];
  EXPECT_NE(warnings[3].find(path + ":5: duplicate id 'a' (first on line 1)"), std::string::npos) << warnings[3];
}

TEST(EvalTasks, FormatErrors) {
  const std::string unknown = write_temp("unknown.jsonl", "{\"text\": \"?\"}\n");
  EXPECT_NE(error_of([&] { read_tasks(unknown, {}); }).find("cannot tell the task format"), std::string::npos);
  const std::string empty = write_temp("empty.jsonl", "\n\n");
  EXPECT_NE(error_of([&] { read_tasks(empty, {}); }).find("no tasks"), std::string::npos);
  EXPECT_NE(error_of([&] { read_tasks("/nonexistent/tasks.jsonl", {}); }).find("/nonexistent/tasks.jsonl"),
            std::string::npos);
  const std::string gsm = write_temp("gsm.jsonl", "{\"question\": \"q\", \"answer\": \"no final line\"}\n");
  EXPECT_NE(error_of([&] { read_tasks(gsm, {}); }).find(":1: field 'answer' has no '#### N'"), std::string::npos);
  EXPECT_THROW(parse_task_format("csv"), Error);
}

TEST(EvalTasks, DigestIdentifiesContent) {
  EvalTask a{"x", 0, 1, "problem", "1", Grading::Exact};
  EvalTask b = a;
  EXPECT_EQ(tasks_digest({a}), tasks_digest({b}));
  b.answer = "2";
  EXPECT_NE(tasks_digest({a}), tasks_digest({b}));
  // Field boundaries matter: ("ab", "c") differs from ("a", "bc").
  EvalTask c{"ab", 0, 1, "c", "", Grading::Exact}, d{"a", 0, 1, "bc", "", Grading::Exact};
  EXPECT_NE(tasks_digest({c}), tasks_digest({d}));
  // FNV-1a 64 reference values (Fowler-Noll-Vo test vectors): "" and "a".
  EXPECT_EQ(fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(fnv1a64("a"), 0xaf63dc4c8601ec8cull);
}

}  // namespace
}  // namespace kvevict
