// h2o: accumulated attention keyed by position across two rounds, and the heavy / recent keep
// rule of spec §3, against a reference written here.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "selector_fixture.h"

namespace kvevict {
namespace {

using namespace selector_fixture;

TEST(H2o, KeepSetMatchesAccumulatedAttentionAcrossRounds) {
  // Reference: accumulators keyed by *position* (not slot): every observation adds each query
  // head's probability of each live slot to the position that slot holds, summed over the group.
  // Two rounds with new slots appended in between, so the slot-aligned state must follow the
  // compaction. Keep rule (spec §3): pins, then the newest (free - heavy) unpinned candidates,
  // then the heaviest, free = K_sel - pinned candidates, heavy = floor(free * 0.5).
  for (const std::string spec : {"h2o", "h2o+prompt"}) {
    SCOPED_TRACE(spec);
    const Policy p = make_policy(spec);
    const int64_t n_pinned = p.protect_prompt ? kPrompt : 0;
    HandCache c(15, false);
    auto st = p.selector->make_state(c.kv.shape());
    std::mt19937_64 gen(7);
    std::uniform_real_distribution<float> uni(0.0f, 1.0f);
    std::map<std::pair<int, int>, std::map<int32_t, double>> acc;
    const auto feed = [&](int64_t n_slots) {
      for (int l = 0; l < kLayers; ++l) {
        std::vector<float> probs(static_cast<size_t>(kHeads * n_slots));
        for (float& x : probs) x = uni(gen) * uni(gen);  // skewed, not normalised: only sums matter
        observe(*st, l, random_query(gen), n_slots, probs.data());
        for (int hq = 0; hq < kHeads; ++hq)
          for (int64_t s = 0; s < n_slots; ++s)
            acc[{l, hq / kGroup}][c.kv.positions(l, hq / kGroup)[s]] += probs[static_cast<size_t>(hq * n_slots + s)];
      }
    };
    const auto expected = [&] {
      std::vector<std::vector<int32_t>> out;
      for (int l = 0; l < kLayers; ++l)
        for (int h = 0; h < kKvHeads; ++h) {
          const auto pos = c.positions(l, h);
          int64_t pinned = 0;
          for (int64_t i = 0; i < kCand; ++i) pinned += pos[static_cast<size_t>(i)] < n_pinned;
          const int64_t free = kKsel - pinned, heavy = free / 2;
          std::vector<double> ref(static_cast<size_t>(kCand));
          int64_t recent_left = free - heavy;
          for (int64_t i = kCand - 1; i >= 0; --i) {
            ref[static_cast<size_t>(i)] = acc[{l, h}][pos[static_cast<size_t>(i)]];
            if (pos[static_cast<size_t>(i)] >= n_pinned && recent_left > 0)
              ref[static_cast<size_t>(i)] = 1e300, --recent_left;
          }
          out.push_back(brute_keep(ref, pos, n_pinned));
        }
      return out;
    };
    for (int64_t n = kLen - 3; n <= kLen; ++n) feed(n);  // slots entering over time
    auto expect = expected();
    EXPECT_EQ(run_one_round(c, p, st.get()), expect);
    // Append kLen - kBudget fresh slots at newer positions, observe, and run a second round.
    for (int l = 0; l < kLayers; ++l) {
      for (int h = 0; h < kKvHeads; ++h)
        for (int64_t s = kBudget; s < kLen; ++s) {
          c.kv.positions(l, h)[s] = static_cast<int32_t>(kSeen + s - kBudget);
          for (int d = 0; d < kHd; ++d)
            c.kv.keys(l, h)[s * kHd + d] = c.kv.values(l, h)[s * kHd + d] = 0.1f * static_cast<float>(d);
        }
      c.kv.set_length(l, kLen);
    }
    feed(kLen);
    feed(kLen);
    expect = expected();
    run_round(c.kv, p, st.get(), config(), kPrompt, kSeen + kLen - kBudget, 7, 1, rope(), nullptr);
    for (int l = 0; l < kLayers; ++l)
      for (int h = 0; h < kKvHeads; ++h) EXPECT_EQ(c.positions(l, h), expect[static_cast<size_t>(l * kKvHeads + h)]);
  }
}

}  // namespace
}  // namespace kvevict
