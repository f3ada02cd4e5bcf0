// Calibrated pre-RoPE query statistics, the input of the TriAttention selector, and their JSON
// file format (written by `kvevict calibrate`, read by `--policy triattention --param stats=FILE`).
//
// A RoPE band f of a head vector x[head_dim] is the complex number x_f = x[a_f] + i·x[b_f]
// (kernels/rope.h: adjacent pairs for llama, NEOX halves for qwen2/qwen3/phi3), rotated at
// position p by exp(i·p·ω_f) with the model's ω_f (0 for the unrotated bands of partial rotary). Per (layer, query
// head, band) the file holds E[x_f] (real and imaginary part) and E|x_f| over the pre-RoPE queries of a calibration
// corpus.
//
// Source: TriAttention (arXiv 2604.04921) §3 (query centres per frequency band);
// docs/eviction-spec.md §3 row `triattention`.
//
// File format (JSON object):
//   "format": "kvevict-query-stats", "version": 1,
//   "model", "source": provenance strings (file names),
//   "n_layers", "n_heads", "n_kv_heads", "head_dim", "rope_theta", "tokens",
//   "q_mean_re", "q_mean_im", "q_abs_mean": arrays [n_layers][n_heads][head_dim / 2],
//   optional "rope_inv_freq": [head_dim / 2] ω_f of the RoPE the queries were un-rotated with
//   (absent in files written before it was recorded; then only rope_theta is checked).
// The statistics carry the model's RoPE attention factor (LongRoPE files): un-rotation is a
// pure rotation, so the rotated bands keep it, exactly as the cached keys they are scored against.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kvevict {

/// Mean pre-RoPE query per (layer, query head, band) and the mean band magnitude.
struct QueryStats {
  int n_layers = 0;
  int n_heads = 0;  ///< query heads
  int n_kv_heads = 0;
  int head_dim = 0;  ///< bands = head_dim / 2
  double rope_theta = 0;
  /// ω_f per band [head_dim / 2] (radians per token) of the calibration model's RoPE: LongRoPE
  /// factor set, rope_freqs and linear scaling included. Empty: not recorded (older files).
  std::vector<double> rope_inv_freq;
  int64_t tokens = 0;  ///< query tokens averaged (per layer and head)
  std::string model;   ///< model file the statistics came from (provenance only)
  std::string source;  ///< corpus file (provenance only)
  /// [n_layers][n_heads][n_bands] row-major: E[Re q_f], E[Im q_f], E|q_f|.
  std::vector<double> mean_re, mean_im, mean_abs;

  int n_bands() const { return head_dim / 2; }
  size_t index(int layer, int head, int band) const {
    return (static_cast<size_t>(layer) * static_cast<size_t>(n_heads) + static_cast<size_t>(head)) *
        static_cast<size_t>(n_bands()) +
        static_cast<size_t>(band);
  }
  /// Throws kvevict::Error (prefixed with `what`) unless the shape is positive and consistent
  /// (even head_dim, n_heads a multiple of n_kv_heads, array sizes, rope_inv_freq empty or of
  /// head_dim / 2 values >= 0) and every value is finite.
  void validate(const std::string& what) const;
};

/// Writes `stats` as JSON to `path`. Throws kvevict::Error when the file cannot be written.
void save_query_stats(const QueryStats& stats, const std::string& path);

/// Reads a file written by save_query_stats. Throws kvevict::Error naming the path and the key
/// when the file is missing, not JSON, of another format/version, or inconsistent.
QueryStats load_query_stats(const std::string& path);

}  // namespace kvevict
