// Counter-based seeding for every random choice in kvevict.
//
// A draw is identified by a tuple of integers (seed, sequence, round, layer, KV head, ...). The
// tuple is hashed into the state of a small PRNG, so a draw never depends on which thread ran it
// or in which order draws happened (the same idea as gemma.cpp's RngStream).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <utility>
#include <vector>

namespace kvevict {

/// SplitMix64 finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mix.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// Hashes an ordered tuple of integers into one 64-bit stream id.
inline uint64_t stream_id(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x6A09E667F3BCC909ull;
  for (uint64_t p : parts) h = splitmix64(h ^ splitmix64(p));
  return h;
}

/// xoshiro256** (Blackman & Vigna 2018) seeded from one 64-bit stream id via SplitMix64.
/// Satisfies UniformRandomBitGenerator, so it can drive <random> distributions, but kvevict
/// uses its own `uniform()` so results do not depend on the standard library's distributions.
class Rng {
 public:
  using result_type = uint64_t;
  explicit Rng(uint64_t stream) {
    uint64_t x = stream;
    for (auto& w : s_) {
      x += 0x9E3779B97F4A7C15ull;
      w = splitmix64(x);
    }
  }
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return ~0ull; }
  result_type operator()() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  /// Uniform double in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>((*this)() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

/// A random permutation of 0..n-1 (Fisher-Yates from the top, each swap index drawn as
/// floor(uniform() * (i + 1))), so the same stream gives the same order on every platform.
inline std::vector<int64_t> random_permutation(Rng& rng, int64_t n) {
  std::vector<int64_t> order(static_cast<size_t>(n > 0 ? n : 0));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(order[static_cast<size_t>(i)],
              order[static_cast<size_t>(rng.uniform() * static_cast<double>(i + 1))]);
  return order;
}

}  // namespace kvevict
