// libFuzzer harness: the eval task JSONL reader, in every format and both bad-line policies.
// Any input must either load or raise kvevict::Error.
#include <cstdint>

#include "eval/task_file.h"
#include "fuzz_util.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvevict::fuzz::write_scratch(data, size, ".jsonl");
  for (const auto format : {kvevict::TaskFormat::Auto, kvevict::TaskFormat::Math500, kvevict::TaskFormat::Gsm8k,
                            kvevict::TaskFormat::Kvevict}) {
    for (const auto policy : {kvevict::BadLinePolicy::Stop, kvevict::BadLinePolicy::Skip}) {
      kvevict::TaskReadOptions opts;
      opts.format = format;
      opts.on_bad_line = policy;
      opts.warn = [](const std::string&) {};
      try {
        const kvevict::EvalTaskFile f = kvevict::read_tasks(path, opts);
        (void)kvevict::tasks_digest(f.tasks);
      } catch (const kvevict::Error&) {
      }
    }
  }
  return 0;
}
