#include "eval/perplexity.h"

#include <fmt/format.h>

#include <cmath>
#include <string_view>

#include "util/error.h"

namespace kvevict {

double token_nll(std::span<const float> logits, int32_t token) {
  float maxl = logits[0];
  for (float l : logits) maxl = std::max(maxl, l);
  double sum = 0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - maxl);
  return -(static_cast<double>(logits[static_cast<size_t>(token)]) - maxl - std::log(sum));
}

DecodePerplexity perplexity_decode(Engine& engine, const Policy& policy, const EvictionConfig& cfg,
                                   std::span<const int32_t> tokens, int64_t report_every,
                                   const std::function<void(int64_t, double)>& progress) {
  const auto n = static_cast<int64_t>(tokens.size());
  if (n < 2) throw Error(fmt::format("perplexity needs at least 2 tokens, got {}", n));
  auto seq = engine.new_sequence(0, policy, cfg, 1, n - 1);
  DecodePerplexity r;
  r.nll.reserve(static_cast<size_t>(n - 1));
  std::vector<float> logits;
  engine.prefill(*seq, tokens.first(1), logits);
  double sum = 0;
  for (int64_t i = 1; i < n; ++i) {
    const double v = token_nll(logits, tokens[static_cast<size_t>(i)]);
    r.nll.push_back(v);
    sum += v;
    if (progress && report_every > 0 && i % report_every == 0) progress(i, std::exp(sum / static_cast<double>(i)));
    if (i + 1 < n) engine.decode(*seq, tokens[static_cast<size_t>(i)], logits);
  }
  r.ppl = std::exp(sum / static_cast<double>(n - 1));
  r.stats = seq->stats;
  r.kv_bytes = seq->kv.allocated_bytes();
  return r;
}

ChunkedPerplexity perplexity_chunked(Engine& engine, const Policy& policy, const EvictionConfig& cfg,
                                     std::span<const int32_t> tokens, int64_t n_ctx, int64_t chunks,
                                     const std::function<void(int64_t, double)>& progress) {
  if (n_ctx < 4) throw Error(fmt::format("-c {}: context must be at least 4 tokens", n_ctx));
  const auto n_tok = static_cast<int64_t>(tokens.size());
  // llama-perplexity refuses fewer than 2 n_ctx tokens; so do we, so one chunk is never all there is.
  if (n_tok < 2 * n_ctx)
    throw Error(fmt::format("text has {} tokens; the chunked mode needs at least 2 x -c = {} (as llama-perplexity)",
                            n_tok, 2 * n_ctx));
  int64_t n_chunks = n_tok / n_ctx;
  if (chunks > 0) n_chunks = std::min(n_chunks, chunks);
  const int64_t first = n_ctx / 2;
  const int32_t bos = engine.model().tokenizer().bos_id();
  ChunkedPerplexity r;
  double nll = 0, nll2 = 0;
  std::vector<float> logits;
  std::vector<int32_t> chunk(static_cast<size_t>(n_ctx));
  for (int64_t c = 0; c < n_chunks; ++c) {
    std::copy(tokens.begin() + c * n_ctx, tokens.begin() + (c + 1) * n_ctx, chunk.begin());
    // As llama.cpp's perplexity: a chunk starts with BOS only when the model adds one
    // (`tokenizer.ggml.add_bos_token`; Qwen3 files say no).
    if (engine.model().tokenizer().add_bos()) chunk[0] = bos;
    const auto add = [&](std::span<const float> row, int64_t j) {
      const double v = token_nll(row, chunk[static_cast<size_t>(j + 1)]);
      nll += v;
      nll2 += v * v;
      r.count += 1;
    };
    const int64_t vocab = engine.model().config().n_vocab;
    if (!policy.evicts) {
      auto seq = engine.new_sequence(c, policy, cfg, n_ctx, 0);
      engine.prefill(*seq, chunk, logits, /*all_logits=*/true);
      for (int64_t j = first; j < n_ctx - 1; ++j)
        add(std::span<const float>(logits).subspan(static_cast<size_t>(j * vocab), static_cast<size_t>(vocab)), j);
    } else {
      auto seq = engine.new_sequence(c, policy, cfg, 1, n_ctx - 1);
      engine.prefill(*seq, std::span<const int32_t>(chunk).first(1), logits);
      for (int64_t j = 0; j < n_ctx - 1; ++j) {
        if (j >= first) add(logits, j);
        if (j + 1 < n_ctx - 1) engine.decode(*seq, chunk[static_cast<size_t>(j + 1)], logits);
      }
    }
    r.running_ppl.push_back(std::exp(nll / static_cast<double>(r.count)));
    if (progress) progress(c + 1, r.running_ppl.back());
  }
  const double mean = nll / static_cast<double>(r.count);
  r.ppl = std::exp(mean);
  const double var = nll2 / static_cast<double>(r.count) - mean * mean;
  r.ppl_stderr = (var > 0 && r.count > 1) ? r.ppl * std::sqrt(var / static_cast<double>(r.count - 1)) : 0.0;
  return r;
}

namespace {
// Offset of a "***" that is followed (after optional spaces) by `word`, or npos. Project
// Gutenberg files write both "*** START OF" and "***START OF".
size_t find_gutenberg_marker(const std::string& text, std::string_view word) {
  for (size_t at = text.find("***"); at != std::string::npos; at = text.find("***", at + 3)) {
    size_t i = at + 3;
    while (i < text.size() && text[i] == ' ') ++i;
    if (text.compare(i, word.size(), word) == 0) return at;
  }
  return std::string::npos;
}
}  // namespace

std::string gutenberg_body(const std::string& text) {
  const size_t start = find_gutenberg_marker(text, "START OF");
  const size_t end = find_gutenberg_marker(text, "END OF");
  if (start == std::string::npos || end == std::string::npos || end <= start) return text;
  // The START marker may wrap onto a second line ("...DAYS IN\nST. PAUL***"): the body begins
  // after the line holding its closing "***" (or after the marker's own line without one).
  const size_t line1 = text.find('\n', start);
  const size_t line2 = line1 == std::string::npos ? std::string::npos : text.find('\n', line1 + 1);
  size_t close = text.find("***", start + 3);
  if (close == std::string::npos || close >= end || close > line2) close = start;
  const size_t body = text.find('\n', close);
  if (body == std::string::npos || body >= end) return text;
  return text.substr(body + 1, end - body - 1);
}

}  // namespace kvevict
