// `random-beacon`: Random Attention plus a few attention-chosen "beacons". Per (layer, KV head), a
// round spends n_b = floor(share * K_sel) slots on beacons, the far candidates (logical position
// at least `distance` tokens older than the newest token) that the last w queries attend to most;
// the other slots of K_sel are drawn uniformly at random, as `random` draws them. Beacon mass =
// softmax(q·k/√d) of each held query and each query head of the KV head's group over the
// candidates, mean over queries and group (SnapKV's score without pooling). Candidates the schedule
// pins (the prompt by default, as `random`) are never beacons, so beacons are spent on the trace.
// Scores: beacons 1 + mass (above every random draw, ranked by mass should the pins leave fewer
// free slots than beacons), the rest U(0,1) from a stream seeded by (seed, sequence, round, layer,
// KV head) and a tag that keeps it apart from `random`'s stream.
// Parameters: share in [0, 1] (default 0.125), window=w (default 32), distance (tokens, default 64).
// Source: seed 000's BeaconKV question ("random plus beacons: does score-free eviction keep far
// revisits?"); the random part is Random Attention (arXiv 2609.03430) §3, the mass SnapKV's window
// score (arXiv 2404.14469 §4.2; eviction/query_window.h).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "eviction/query_window.h"
#include "eviction/registry.h"
#include "util/rng.h"

namespace kvevict {
namespace {

/// Tag mixed into the random stream so random-beacon's draws are not `random`'s draws.
constexpr uint64_t kBeaconStreamTag = 0xbeac0;

class RandomBeaconSelector final : public PerHeadSelector {
 public:
  RandomBeaconSelector(double share, int window, int64_t distance)
      : share_(share), window_(window), distance_(distance) {}
  SelectorNeeds needs() const override { return {.queries = true}; }
  std::unique_ptr<SelectorState> make_state(const KvShape& shape) const override {
    return std::make_unique<QueryWindowState>(shape.n_layers, window_);
  }

  void score_head(const RoundInput& in, const SelectorState* state, int layer, int kv_head,
                  std::span<float> out) const override {
    Rng rng(stream_id({in.seed, in.sequence_id, static_cast<uint64_t>(in.round), static_cast<uint64_t>(layer),
                       static_cast<uint64_t>(kv_head), kBeaconStreamTag}));
    for (float& s : out) s = static_cast<float>(rng.uniform());
    const auto n_beacons = static_cast<int64_t>(std::floor(share_ * static_cast<double>(in.k_sel())));
    if (n_beacons == 0) return;
    // Far, unpinned candidates only: a pinned slot is kept anyway, a near one is the recent
    // past that the random part covers.
    const int32_t* pos = in.kv.positions(layer, kv_head);
    std::vector<int32_t> far;
    for (int64_t i = 0; i < in.n_candidates; ++i)
      if (pos[i] >= in.n_pinned && in.n_seen - 1 - pos[i] >= distance_) far.push_back(static_cast<int32_t>(i));
    if (far.empty()) return;
    std::vector<float> mass(static_cast<size_t>(in.n_candidates));
    snapkv_scores(in, as_query_window(state, "random-beacon"), layer, kv_head, /*kernel=*/1, mass);
    const auto take = std::min<int64_t>(n_beacons, static_cast<int64_t>(far.size()));
    // Strict order (mass desc, slot asc): the beacon set does not depend on the sort algorithm.
    std::partial_sort(far.begin(), far.begin() + take, far.end(), [&](int32_t a, int32_t b) {
      const float ma = mass[static_cast<size_t>(a)], mb = mass[static_cast<size_t>(b)];
      return ma > mb || (ma == mb && a < b);
    });
    for (int64_t j = 0; j < take; ++j) {
      const auto s = static_cast<size_t>(far[static_cast<size_t>(j)]);
      out[s] = 1.0f + mass[s];
    }
  }

 private:
  double share_;
  int window_;
  int64_t distance_;
};

}  // namespace

const PolicyInfo& policy_random_beacon() {
  static const PolicyInfo info{
      "random-beacon",
      "Random plus beacons: a share of K_sel (default 1/8) keeps the far slots the last w queries attend to "
      "most; the rest is uniform random per KV head. Prompt pinned, as random.",
      "seed 000 BeaconKV question; arXiv 2609.03430 §3 + SnapKV window score",
      true,
      /*protect_prompt=*/true,
      0,
      [](const SelectorParams& params) {
        const double share = params.get("share", 0.125, 0.0, 1.0);
        const auto window = static_cast<int>(params.get_int("window", 32, 1, 1 << 16));
        const int64_t distance = params.get_int("distance", 64, 0, int64_t{1} << 40);
        return std::make_unique<RandomBeaconSelector>(share, window, distance);
      }};
  return info;
}

}  // namespace kvevict
