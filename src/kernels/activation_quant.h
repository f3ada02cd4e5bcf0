// Activation quantisation for the integer matmul kernels (kernels/matmul.h): float activation
// rows to ggml's Q8_0 (32-element blocks) or Q8_K (256-element blocks with 16-element sums).
//
// Source: ggml's quantize_row_q8_0 / quantize_row_q8_K (ggml-quants.c) and the block layouts of
// format/ggml_blocks.h. The vectorised bodies reproduce the scalar definitions exactly.
#pragma once

#include <cstdint>

#include "format/ggml_types.h"

namespace kvevict {

/// How a weight type's matmul quantises the activations: Q8_0 (32-element blocks) for the
/// legacy quants, Q8_K (256-element blocks with 16-element sums) for the K-quants, None for
/// float types (they use dot_row on the float activations).
enum class ActivationQuant { None, Q8_0, Q8_K };
ActivationQuant activation_quant(GgmlType t);

/// Quantises T rows of n floats (n % 32 == 0) to Q8_0 blocks into dst[T * n / 32 * 34 bytes],
/// byte for byte what format/ggml_types.h's quantize_row_q8_0 writes (d = max|x| / 127 stored as
/// fp16, q = round(x / d) with halves away from zero). Throws kvevict::Error when n % 32 != 0.
void quantize_rows_q8_0(const float* x, int64_t T, int64_t n, uint8_t* dst);

/// The same quantisation as quantize_rows_q8_0 in the layout of the integer kernels
/// (kernels/qgemm.h): q[T * n] the values, d[T * n / 32] the block scales (the fp16 value as
/// float), sums[T * n / 32] the blocks' sums Σ q.
void quantize_rows_q8_0_split(const float* x, int64_t T, int64_t n, int8_t* q, float* d, int32_t* sums);

/// Quantises n floats (n % 256 == 0) to Q8_K blocks (ggml::BlockQ8_K): d = max|x| / 127
/// (float), q = round(x / d), bsums = sums of q over each 16 elements. Throws kvevict::Error
/// when n % 256 != 0.
void quantize_row_q8_k(const float* src, void* dst, int64_t n);

/// Quantises T rows of n floats (n % 256 == 0) to Q8_K blocks into dst[T * n / 256 * 292 bytes].
void quantize_rows_q8_k(const float* x, int64_t T, int64_t n, uint8_t* dst);

}  // namespace kvevict
