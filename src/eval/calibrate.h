// Calibration of TriAttention's query statistics: run a corpus through the model and average the
// pre-RoPE queries per (layer, query head, RoPE band).
//
// Source: TriAttention (arXiv 2604.04921) §3 (offline query centres, ~50k tokens);
// docs/eviction-spec.md §3 row `triattention` ("calibrate on text that is not the evaluation set").
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "eviction/query_stats.h"
#include "model/model.h"

namespace kvevict {

class ThreadPool;

/// Runs `tokens` through `model` in consecutive chunks of `ctx` tokens, each a one-pass prefill
/// into a fresh cache at positions 0 .. ctx-1 (the last chunk may be shorter); chunks after the
/// first start with BOS in place of their first token, as llama.cpp's perplexity chunks do. Every
/// query of every chunk, un-rotated to pre-RoPE with its position, adds to the sums behind
/// E[q_f] and E|q_f| (accumulated in double). No attention probabilities are computed.
/// ctx: tokens per chunk, 0 = the model's context length. Returns statistics with
/// tokens = tokens.size() and model/source left empty for the caller.
/// Throws kvevict::Error when fewer than 2 tokens are given or ctx is 1 or negative.
/// `on_chunk(tokens_done, tokens_total)`, when set, is called after each chunk (progress).
QueryStats calibrate_query_stats(const Model& model, std::span<const int32_t> tokens, int64_t ctx,
                                 ThreadPool& pool, const std::function<void(int64_t, int64_t)>& on_chunk = nullptr);

}  // namespace kvevict
