// Keep-set instrumentation: what each eviction round kept, per layer, as JSON lines
// (`kvevict generate --keep-log FILE`), and the table of averages over a log
// (`kvevict keeplog summarize FILE...`).
//
// Metrics of one (round, layer), computed from the cache right after the round (positions are
// logical; "kept" = still in the cache, recent buffer included, unless said otherwise):
//   prompt_survival[h]     fraction of prompt positions [0, prompt_len) kept by KV head h
//   prompt_union_survival  fraction of prompt positions kept by at least one KV head
//   union_survival         cross-head union survival: fraction of all positions seen so far
//                          [0, n_seen) kept by at least one KV head
//   jaccard                mean over KV-head pairs of |A ∩ B| / |A ∪ B| of the selected slots
//                          (the K_sel chosen by the round; the shared recent buffer is left out)
//   coverage               slot coverage: distinct positions among the heads' selected slots /
//                          (KV heads × K_sel); 1/H when every head keeps the same, 1 when disjoint
//   band_survival[h][b]    fraction of the positions of band b (positions [0, 256), [256, 512),
//                          [512, 1024), [1024, 2048), …, cut at n_seen) kept by KV head h
//   positions[h]           the kept positions (only with --keep-log-positions)
// Source: the union / Jaccard / coverage / prompt-retention definitions follow
// the Random Attention code's KEEPLOG logger (`kvcompress/engine/cache_utils.py`).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"

namespace kvevict {

/// Position bands [lo, hi) covering [0, n_seen): [0, 256), then [256·2^(k-1), 256·2^k); the last
/// band is cut at n_seen. Empty when n_seen <= 0.
std::vector<std::pair<int64_t, int64_t>> keep_log_bands(int64_t n_seen);

/// Keep-set metrics of one layer after one round (see the file comment).
struct LayerKeepStats {
  int64_t round = 0, layer = 0, n_seen = 0, prompt_len = 0, slots = 0, k_sel = 0;
  std::vector<double> prompt_survival;  ///< [n_kv_heads]
  double prompt_union_survival = 0, union_survival = 0, jaccard = 0, coverage = 0;
  std::vector<std::pair<int64_t, int64_t>> bands;  ///< [n_bands]
  std::vector<std::vector<double>> band_survival;  ///< [n_kv_heads][n_bands]
  std::vector<std::vector<int32_t>> positions;     ///< [n_kv_heads][slots], only if asked
};

/// Computes the metrics of `layer` from the live slots of `kv`: the first length - recent slots
/// of each head are the selected ones, the rest the recent buffer. prompt_len >= 1 and
/// n_seen >= length. Throws kvevict::Error on a layer out of range or recent > length.
LayerKeepStats layer_keep_stats(const SequenceKv& kv, int layer, int64_t recent, int64_t prompt_len, int64_t n_seen,
                                int64_t round, bool with_positions);

/// One JSON object (one line of the log) for `s`, tagged with the policy name.
std::string keep_log_line(const LayerKeepStats& s, const std::string& policy);

/// Appends a sequence's rounds to a keep log, one line per layer per round.
class KeepLogWriter {
 public:
  /// Opens (truncates) `path`. Throws kvevict::Error when it cannot be opened.
  KeepLogWriter(const std::string& path, bool with_positions);
  /// Writes the lines of the round `seq` just ran (round index seq.stats.rounds - 1). Throws
  /// kvevict::Error on a write failure.
  void write_round(const Sequence& seq);

 private:
  std::string path_;
  bool with_positions_;
  std::ofstream out_;
};

/// Averages of a keep log (or of one layer of it).
struct KeepLogAverages {
  std::string label;           ///< file, and policy when the lines name one
  int layer = -1;              ///< -1: every layer
  int64_t lines = 0;           ///< (round, layer) lines averaged
  int64_t rounds = 0;          ///< distinct rounds
  double prompt_survival = 0;  ///< mean over lines and KV heads
  double prompt_union_survival = 0, union_survival = 0, jaccard = 0, coverage = 0;
  std::vector<double> band_survival;  ///< per band: mean over the lines reaching it and KV heads
};

/// Reads a keep log and averages it: the first row covers every line, followed by one row per
/// layer when `by_layer`. Throws kvevict::Error naming the file and line on malformed input or an
/// empty log.
std::vector<KeepLogAverages> summarize_keep_log(const std::string& path, bool by_layer);

/// Formats rows (from one or more logs) as an aligned text table with one column per band.
std::string format_keep_log_table(const std::vector<KeepLogAverages>& rows);

}  // namespace kvevict
