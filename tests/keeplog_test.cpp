// Keep-set instrumentation, TriAttention calibration, and the new subcommands
// as a user runs them. Expected keep-log values are worked out by hand in the comments from the
// definitions in eval/keeplog.h; calibration is checked against layer-0 queries computed here
// directly from the weights (for layer 0 the pre-RoPE query depends only on the token).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>

#include "cli_run.h"
#include "eval/calibrate.h"
#include "eval/keeplog.h"
#include "format/ggml_types.h"
#include "model_fixture.h"
#include "test_paths.h"
#include "test_tmp.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

std::string temp_path(const std::string& name) { return test::tmp_path("kl_" + name); }

/// Two KV heads, 8 live slots of which the last 2 are the recent buffer, 300 tokens seen,
/// prompt of 4 tokens.
SequenceKv hand_cache() {
  SequenceKv kv(KvShape{1, 2, 2}, 8);
  const int32_t h0[8] = {0, 1, 2, 3, 100, 260, 298, 299};
  const int32_t h1[8] = {0, 1, 5, 100, 270, 280, 298, 299};
  std::copy(h0, h0 + 8, kv.positions(0, 0));
  std::copy(h1, h1 + 8, kv.positions(0, 1));
  kv.set_length(0, 8);
  return kv;
}

TEST(KeepLog, LayerStatsByHand) {
  const SequenceKv kv = hand_cache();
  const LayerKeepStats s = layer_keep_stats(kv, 0, /*recent=*/2, /*prompt=*/4, /*n_seen=*/300, /*round=*/3, true);
  EXPECT_EQ(s.k_sel, 6);
  // Prompt {0,1,2,3}: head 0 keeps all 4, head 1 keeps {0,1}; together all 4.
  EXPECT_EQ(s.prompt_survival, (std::vector<double>{1.0, 0.5}));
  EXPECT_DOUBLE_EQ(s.prompt_union_survival, 1.0);
  // Union of kept positions: {0,1,2,3,5,100,260,270,280,298,299} = 11 of 300 seen.
  EXPECT_DOUBLE_EQ(s.union_survival, 11.0 / 300);
  // Selected (first 6): {0,1,2,3,100,260} and {0,1,5,100,270,280}: ∩ = {0,1,100}, ∪ = 9.
  EXPECT_DOUBLE_EQ(s.jaccard, 3.0 / 9);
  EXPECT_DOUBLE_EQ(s.coverage, 9.0 / 12);  // 9 distinct positions in 2 x 6 selected slots
  // Bands [0,256) and [256,300): head 0 keeps 5 and 3, head 1 keeps 4 and 4.
  ASSERT_EQ(s.bands, (std::vector<std::pair<int64_t, int64_t>>{{0, 256}, {256, 300}}));
  EXPECT_EQ(s.band_survival, (std::vector<std::vector<double>>{{5.0 / 256, 3.0 / 44}, {4.0 / 256, 4.0 / 44}}));
  ASSERT_EQ(s.positions.size(), 2u);
  EXPECT_EQ(s.positions[1].back(), 299);
  EXPECT_THROW(layer_keep_stats(kv, 1, 2, 4, 300, 0, false), Error);
}

TEST(KeepLog, BandsDouble) {
  EXPECT_EQ(keep_log_bands(0).size(), 0u);
  EXPECT_EQ(keep_log_bands(100), (std::vector<std::pair<int64_t, int64_t>>{{0, 100}}));
  EXPECT_EQ(keep_log_bands(3000),
            (std::vector<std::pair<int64_t, int64_t>>{{0, 256}, {256, 512}, {512, 1024}, {1024, 2048}, {2048, 3000}}));
}

TEST(KeepLog, SummarizeAverages) {
  // Two lines: the hand cache (layer 0) and the same with head 1 made equal to head 0 (layer 1).
  const std::string path = temp_path("log.jsonl");
  SequenceKv kv = hand_cache();
  const LayerKeepStats a = layer_keep_stats(kv, 0, 2, 4, 300, 0, false);
  std::copy(kv.positions(0, 0), kv.positions(0, 0) + 8, kv.positions(0, 1));
  LayerKeepStats b = layer_keep_stats(kv, 0, 2, 4, 300, 0, false);
  b.layer = 1;
  { std::ofstream(path) << keep_log_line(a, "snapkv") << '\n' << keep_log_line(b, "snapkv") << '\n'; }
  const auto rows = summarize_keep_log(path, true);
  ASSERT_EQ(rows.size(), 3u);  // all, layer 0, layer 1
  EXPECT_EQ(rows[0].layer, -1);
  EXPECT_EQ(rows[0].lines, 2);
  EXPECT_EQ(rows[0].rounds, 1);
  EXPECT_DOUBLE_EQ(rows[0].prompt_survival, (0.75 + 1.0) / 2);  // head means 0.75 and 1
  EXPECT_DOUBLE_EQ(rows[0].jaccard, (1.0 / 3 + 1.0) / 2);
  EXPECT_DOUBLE_EQ(rows[0].coverage, (0.75 + 0.5) / 2);
  EXPECT_DOUBLE_EQ(rows[2].union_survival, 8.0 / 300);
  ASSERT_EQ(rows[0].band_survival.size(), 2u);
  EXPECT_DOUBLE_EQ(rows[0].band_survival[0], ((5.0 + 4.0) / 2 / 256 + 5.0 / 256) / 2);
  const std::string table = format_keep_log_table(rows);
  EXPECT_NE(table.find("snapkv"), std::string::npos);
  EXPECT_NE(table.find("256-511"), std::string::npos);
  { std::ofstream(path) << "{\"round\": 1}\n"; }
  EXPECT_THROW(summarize_keep_log(path, false), Error);
  EXPECT_THROW(summarize_keep_log(temp_path("missing.jsonl"), false), Error);
  std::filesystem::remove(path);
}

TEST(Calibrate, Layer0MatchesDirectQueries) {
  KVEVICT_REQUIRE_MODEL(m);
  const ModelConfig& c = m->config();
  std::vector<int32_t> tokens =
      m->tokenizer().encode("Once upon a time, there was a little girl named Lily. She loved to play.", true);
  ThreadPool pool(2);
  const int64_t ctx = 8;
  const QueryStats st = calibrate_query_stats(*m, tokens, ctx, pool);
  EXPECT_EQ(st.tokens, static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(st.n_layers, c.n_layers);
  EXPECT_NO_THROW(st.validate("calibrated"));
  // Direct: chunks of 8 with BOS replacing each later chunk's first token; layer-0 pre-RoPE query
  // = Wq · rmsnorm(embedding(token)) in double.
  for (size_t i = static_cast<size_t>(ctx); i < tokens.size(); i += static_cast<size_t>(ctx))
    tokens[i] = m->tokenizer().bos_id();
  const LayerWeights& L = m->layers()[0];
  const int F = c.head_dim / 2;
  std::vector<double> re(static_cast<size_t>(c.n_heads * F)), im(re.size()), ab(re.size());
  std::vector<float> x(static_cast<size_t>(c.dim)), w(static_cast<size_t>(c.dim));
  for (int32_t t : tokens) {
    dequantize_row(m->token_embedding().type, m->token_embedding().row(t), x.data(), c.dim);
    double ss = 0;
    for (float v : x) ss += double(v) * v;
    const double scale = 1.0 / std::sqrt(ss / c.dim + c.rms_eps);
    std::vector<double> q(static_cast<size_t>(c.n_heads * c.head_dim));
    for (size_t r = 0; r < q.size(); ++r) {
      dequantize_row(L.wq.type, L.wq.row(static_cast<int64_t>(r)), w.data(), c.dim);
      for (int d = 0; d < c.dim; ++d)
        q[r] +=
            double(w[static_cast<size_t>(d)]) * x[static_cast<size_t>(d)] * scale * L.attn_norm[static_cast<size_t>(d)];
    }
    for (int h = 0; h < c.n_heads; ++h)
      for (int f = 0; f < F; ++f) {
        const double a = q[static_cast<size_t>(h * c.head_dim + 2 * f)],
                     b = q[static_cast<size_t>(h * c.head_dim + 2 * f + 1)];
        re[static_cast<size_t>(h * F + f)] += a / static_cast<double>(tokens.size());
        im[static_cast<size_t>(h * F + f)] += b / static_cast<double>(tokens.size());
        ab[static_cast<size_t>(h * F + f)] += std::hypot(a, b) / static_cast<double>(tokens.size());
      }
  }
  for (int h = 0; h < c.n_heads; ++h)
    for (int f = 0; f < F; ++f) {
      const size_t k = st.index(0, h, f), j = static_cast<size_t>(h * F + f);
      EXPECT_NEAR(st.mean_re[k], re[j], 1e-4 * (1 + std::abs(re[j])));
      EXPECT_NEAR(st.mean_im[k], im[j], 1e-4 * (1 + std::abs(im[j])));
      EXPECT_NEAR(st.mean_abs[k], ab[j], 1e-4 * (1 + ab[j]));
    }
  EXPECT_THROW(calibrate_query_stats(*m, std::vector<int32_t>{1}, 0, pool), Error);
  EXPECT_THROW(calibrate_query_stats(*m, tokens, 1, pool), Error);
}

// ---- the binary ----

using test::CliResult;
CliResult run(const std::string& args) { return test::run_cli(args); }

TEST(Cli, CalibrateGenerateKeepLogSummarize) {
  KVEVICT_REQUIRE_MODEL(m);
  const std::string stats = temp_path("cli_stats.json"), log = temp_path("cli_keep.jsonl");
  const std::string model = test::stories260k();
  CliResult r = run("calibrate -m " + model + " -f " + test::shared_path("data/tinystories/tinystories_sample.txt") +
                    " -o " + stats + " --tokens 100000");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("fewer than --tokens 100000"), std::string::npos) << r.out;  // the sample is short
  r = run("generate -m " + model +
          " -p 'Once upon a time' -n 300 --ignore-eos --budget 128 --policy triattention --param stats=" + stats +
          " --keep-log " + log + " --keep-log-positions");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(
      std::regex_search(r.out, std::regex(R"(policy triattention .* eviction rounds 2 .* score [0-9.]+ ms/round)")))
      << r.out;
  int lines = 0;
  std::ifstream f(log);
  for (std::string line; std::getline(f, line);) {
    ++lines;
    EXPECT_NE(line.find("\"positions\""), std::string::npos);
  }
  EXPECT_EQ(lines, 2 * m->config().n_layers);  // rounds x layers
  r = run("keeplog summarize " + log + " --by-layer");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("triattention"), std::string::npos) << r.out;
  // User errors: one line, exit code 2.
  for (const std::string& bad : {std::string("generate -m ") + model + " -p hi --budget 128 --policy triattention",
                                 std::string("keeplog summarize /nonexistent.jsonl"),
                                 std::string("calibrate -m ") + model + " -f /nonexistent.txt -o " + stats}) {
    r = run(bad);
    EXPECT_EQ(r.code, 2) << bad << "\n" << r.out;
    EXPECT_EQ(r.out.rfind("kvevict: error: ", 0), 0u) << r.out;
  }
  std::filesystem::remove(stats);
  std::filesystem::remove(log);
}

}  // namespace
}  // namespace kvevict
