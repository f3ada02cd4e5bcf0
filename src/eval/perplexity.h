// Perplexity under an eviction policy: token-by-token decoding (the policy active throughout),
// and llama.cpp's chunked protocol for parity with `llama-perplexity`.
//
// Source: chunked protocol of llama.cpp tools/perplexity (BOS at the start of each chunk of n_ctx
// tokens, score only the second half, PPL = exp(mean NLL), error = PPL * sqrt(var(NLL) /
// (count - 1))); token-by-token evaluation as StreamingLLM (arXiv 2309.17453) §4.1.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace kvevict {

/// -log softmax(logits)[token], computed in double (as llama.cpp's perplexity tool does).
double token_nll(std::span<const float> logits, int32_t token);

/// Result of a token-by-token run.
struct DecodePerplexity {
  std::vector<double> nll;  ///< nll[i] = -log p(tokens[i+1] | tokens[0..i]) ; size N - 1
  double ppl = 0;           ///< exp(mean nll)
  SequenceStats stats;
  int64_t kv_bytes = 0;  ///< bytes allocated for the cache
};

/// Feeds tokens[0] as the prompt, then decodes tokens[1..N-1] one at a time with `policy`
/// active, scoring each next token. progress(i, running_ppl) is called every `report_every`
/// tokens (0 = never). Throws kvevict::Error if N < 2.
DecodePerplexity perplexity_decode(Engine& engine, const Policy& policy, const EvictionConfig& cfg,
                                   std::span<const int32_t> tokens, int64_t report_every = 0,
                                   const std::function<void(int64_t, double)>& progress = {});

/// Result of the chunked protocol.
struct ChunkedPerplexity {
  std::vector<double> running_ppl;  ///< after each chunk, as llama.cpp prints [1]x,[2]y,...
  double ppl = 0;
  double ppl_stderr = 0;
  int64_t count = 0;  ///< scored tokens
};

/// llama.cpp chunked perplexity: n_chunks = min(chunks, N / n_ctx) (chunks <= 0: all);
/// chunk i covers tokens [i*n_ctx, (i+1)*n_ctx) with its first token replaced by BOS and a fresh
/// cache; tokens n_ctx/2 .. n_ctx-1 are scored. With `full` each chunk is one prefill; any other
/// policy decodes the chunk token by token with that policy active. Throws kvevict::Error when
/// fewer than 2 n_ctx tokens are given (llama-perplexity's rule) or n_ctx < 4.
ChunkedPerplexity perplexity_chunked(Engine& engine, const Policy& policy, const EvictionConfig& cfg,
                                     std::span<const int32_t> tokens, int64_t n_ctx, int64_t chunks,
                                     const std::function<void(int64_t, double)>& progress = {});

/// Returns the text between Project Gutenberg's "*** START OF" and "*** END OF" marker lines
/// (also written "***START OF", and with the START title wrapped over two lines), or the whole
/// text when the markers are absent. Never throws.
std::string gutenberg_body(const std::string& text);

}  // namespace kvevict
