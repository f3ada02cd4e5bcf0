// Upper bounds on counts and sizes a user can ask for, shared by every front end (CLI flags,
// server fields, the settings builder). They are far above any sensible run and far below what
// would exhaust memory or never finish: a value past one is a typo (e.g. `--rollouts 100000000`),
// not a workload. docs/cli.md ("Errors") lists them; CONTRIBUTING.md names the options.
#pragma once

namespace kvevict::limits {

/// Token counts: generated tokens, context sizes, lengths, budget B, recent buffer r, sinks.
inline constexpr long long kTokens = 1 << 20;
inline constexpr long long kCorpusTokens = 100'000'000;  ///< tokens of a perplexity/calibration corpus
inline constexpr long long kRollouts = 1024;             ///< eval rollouts per problem (parallel sequences)
inline constexpr long long kBootstrap = 1'000'000;       ///< eval bootstrap resamples
inline constexpr long long kProblems = 10'000'000;       ///< problems, tasks, chunks
inline constexpr long long kShards = 100'000;            ///< eval shards N of i/N
inline constexpr long long kTrials = 100'000;            ///< probe trials and restatements
inline constexpr long long kReps = 1000;                 ///< benchmark repetitions
inline constexpr long long kBatch = 4096;                ///< benchmark batch sizes (sequences)
inline constexpr int kThreadsPerCore = 4;                ///< threads <= 4 x cores unless forced
inline constexpr long long kThreadsForced = 4096;        ///< threads when forced
/// Bytes of a file read whole into memory (a corpus, a task file, probe filler): 1 GiB, about
/// 250M tokens, above kCorpusTokens.
inline constexpr long long kFileBytes = 1LL << 30;

}  // namespace kvevict::limits
