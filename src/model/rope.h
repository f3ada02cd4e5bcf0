// Rotary position embedding in the GGUF (llama.cpp "normal") layout: adjacent pairs
// (x[2i], x[2i+1]) of each head are rotated by angle pos * theta^(-2i/d).
//
// Source: RoFormer (Su et al., arXiv 2104.09864) §3.4; llama.cpp rope mode 0 for LLAMA, whose
// converter permutes Q/K rows so that adjacent-pair rotation reproduces the HF rotate-half form.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace kvevict {

/// Per-pair inverse frequencies theta^(-2i/d) for one head, i = 0 .. d/2-1. Computed in double
/// and applied in double so that rotating by a position delta later (re-rotation) matches a
/// direct rotation to the new position to float precision.
class Rope {
 public:
  Rope() = default;
  Rope(int head_dim, float theta) : inv_freq_(static_cast<size_t>(head_dim / 2)) {
    for (int i = 0; i < head_dim / 2; ++i)
      inv_freq_[static_cast<size_t>(i)] = std::pow(static_cast<double>(theta), -2.0 * i / head_dim);
  }
  /// Rotates one head vector x[head_dim] in place by position `pos` (tokens; may be negative,
  /// which un-rotates).
  void rotate(float* x, int64_t pos) const {
    for (size_t i = 0; i < inv_freq_.size(); ++i) {
      const double a = static_cast<double>(pos) * inv_freq_[i];
      const double c = std::cos(a), s = std::sin(a);
      const double x0 = x[2 * i], x1 = x[2 * i + 1];
      x[2 * i] = static_cast<float>(x0 * c - x1 * s);
      x[2 * i + 1] = static_cast<float>(x0 * s + x1 * c);
    }
  }
  int head_dim() const { return static_cast<int>(inv_freq_.size() * 2); }
  const std::vector<double>& inv_freq() const { return inv_freq_; }

 private:
  std::vector<double> inv_freq_;
};

}  // namespace kvevict
