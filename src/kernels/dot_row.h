// Dot products of one stored weight row with a float activation row: the kernel of every matmul
// with float weights (F32, F16, BF16), and a float-activation path for the quantised types.
//
// Source: the block formulas of format/ggml_blocks.h (via dequantize_row for the types without a
// dedicated loop). Quantised weights normally take the integer kernels of kernels/matmul.h, which
// quantise the activations first; this path keeps them in float32.
#pragma once

#include <cstdint>

#include "format/ggml_types.h"

namespace kvevict {

/// Dot product of one stored row (n elements of type t) with float vector x[n], accumulated in
/// float32 (AVX2 + FMA: four 8-lane accumulators over 32 elements, lanes added at the end, a scalar
/// tail; F16 loads through F16C. Q8_0/Q4_0: per-block float sums scaled by the block's d; the
/// other quantised types dequantise one block at a time and use the float kernel).
/// Throws kvevict::Error when n is not a multiple of the block size.
float dot_row(GgmlType t, const void* row, const float* x, int64_t n);

}  // namespace kvevict
