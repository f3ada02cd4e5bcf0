// libFuzzer harness: the server's request parser (serve::parse_generation_request), the code
// between the HTTP body and the scheduler, called without a socket. The input is a request body,
// parsed for /v1/completions and /v1/chat/completions (chat rendered with the chatml template)
// with the vocabulary of the shared stories260K model. Every body must either parse into a
// request the scheduler accepts (a non-empty prompt within the context, 1 <= max_tokens <= the
// limit, n in [1, max_n]) or throw serve::ApiError with status 400; any other exception, crash
// or sanitizer report is a finding.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "format/gguf.h"
#include "fuzz_util.h"
#include "model/chat_template.h"
#include "model/tokenizer.h"
#include "serve/request.h"

namespace {

struct Setup {
  std::unique_ptr<kvevict::Tokenizer> tok;
  kvevict::serve::ApiOptions opt;
};

const Setup& setup() {
  static const std::unique_ptr<Setup> s = [] {
    auto out = std::make_unique<Setup>();
    const kvevict::GgufFile f =
        kvevict::GgufFile::open(kvevict::fuzz::shared_dir() + "/models/stories260K/stories260K.gguf");
    out->tok = std::make_unique<kvevict::Tokenizer>(kvevict::Tokenizer::from_gguf(f));
    out->opt.model_name = "fuzz";
    out->opt.max_tokens_limit = 512;
    kvevict::serve::use_chat_template(out->opt, kvevict::ChatTemplate::by_name("chatml"));
    return out;
  }();
  return *s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Setup& s = setup();
  const std::string body(reinterpret_cast<const char*>(data), size);
  // Smaller than stories260K's 2048, so short bodies reach the over-the-context refusal too.
  constexpr int64_t kContext = 64;
  std::atomic<uint64_t> counter{0};
  for (const auto ep : {kvevict::serve::Endpoint::Completions, kvevict::serve::Endpoint::Chat}) {
    try {
      const kvevict::serve::ParsedRequest p =
          kvevict::serve::parse_generation_request(body, ep, *s.tok, kContext, s.opt, counter);
      const auto& g = p.gen;
      const int64_t max_new = g.generation.max_new_tokens;
      if (max_new < 1 || max_new > s.opt.max_tokens_limit) __builtin_trap();
      if (p.prompts.empty() || p.prompts.size() > static_cast<size_t>(kvevict::serve::kMaxPrompts) ||
          p.prompts.front() != g.prompt)
        __builtin_trap();
      for (const auto& prompt : p.prompts) {
        if (prompt.empty() || static_cast<int64_t>(prompt.size()) > kContext) __builtin_trap();
        // Prompt + generated tokens fit the context (as vLLM's max_model_len).
        if (static_cast<int64_t>(prompt.size()) + max_new > kContext) __builtin_trap();
        for (const int32_t id : prompt)
          if (id < 0 || id >= s.tok->n_vocab()) __builtin_trap();
      }
      if (g.n < 1 || g.n > s.opt.max_n) __builtin_trap();
      if (g.generation.logprobs < -1 || g.generation.logprobs > kvevict::kMaxLogprobs) __builtin_trap();
    } catch (const kvevict::serve::ApiError& e) {
      if (e.status != 400 || e.message.empty()) __builtin_trap();
    }
  }
  return 0;
}
