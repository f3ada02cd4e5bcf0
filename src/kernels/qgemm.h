// Tiled integer matmul kernels for quantised weights: y[t, r] = dot(W row r, x row t) for a
// tile of weight rows × activation rows at once, each weight block unpacked once per tile and
// multiplied against every activation row of the tile (register tiles, AVX2 or AVX-512 VNNI).
//
// Source: the block formulas of format/ggml_blocks.h; the decomposition of ggml's
// vec_dot_*_q8_0 / *_q8_K kernels (integer sub-block sums, float block scales, min/offset terms
// from the activation sums), as kernels/matmul.h describes.
//
// Determinism: every output is computed with one fixed sequence of operations, the one of the
// one-row dot kernels in kernels/matmul.h (dot_q8_0_q8_0 ... dot_q6_k_q8_k): the integer lane
// sums of each block are exact (so the width and instructions that produce them do not matter)
// and the float steps (block scale products, FMA chains, final lane reduction) are the same, in
// the same order. Results therefore do not depend on the tile shape, the number of activation
// rows, the row split, the thread count or the instruction-set variant.
#pragma once

#include <cstdint>
#include <vector>

#include "format/ggml_types.h"

namespace kvevict {

/// Instruction-set variants of the tiled kernels; all compute bit-identical results.
enum class KernelIsa {
  Avx2,      ///< 256-bit, maddubs/madd integer dots (AVX2 + FMA + F16C)
  Avx2Vnni,  ///< 256-bit with VNNI dot instructions (AVX-VNNI, or AVX-512 VL + VNNI)
  Avx512,    ///< 512-bit (AVX-512 F/BW/VL/VNNI): two 32-element blocks per register
};

/// The variants compiled into this build, narrowest first (empty without AVX2 + FMA + F16C);
/// the last one is what matmul_jobs uses by default.
std::vector<KernelIsa> compiled_kernel_isas();

/// "avx2", "avx2-vnni" or "avx512".
const char* kernel_isa_name(KernelIsa isa);

/// Activation rows of one matmul call, quantised for the tiled kernels.
struct PackedActivations {
  int64_t T = 0, cols = 0;
  /// Q8_0 (weights Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), cols / 32 blocks per row, split into arrays:
  std::vector<int8_t> q8;    ///< [T, cols] quantised values
  std::vector<float> d8;     ///< [T, cols / 32] block scales (the fp16 scale as float)
  std::vector<int32_t> ls8;  ///< [T, cols / 32, 8] lane sums: lane k = Σ q over elements 4k..4k+3
  /// Q8_K (weights Q2_K .. Q6_K): T rows of cols / 256 ggml::BlockQ8_K.
  std::vector<uint8_t> qk;
};

/// Fills a's Q8_0 arrays from x[T, cols] (cols % 32 == 0): the values quantize_rows_q8_0 writes.
void pack_activations_q8_0(const float* x, int64_t T, int64_t cols, PackedActivations& a);

/// Fills a's Q8_K rows from x[T, cols] (cols % 256 == 0): quantize_rows_q8_k.
void pack_activations_q8_k(const float* x, int64_t T, int64_t cols, PackedActivations& a);

/// True for the weight types the tiled kernels compute (the quantised types).
bool qgemm_supports(GgmlType type);

/// y[t * ldy + r] for r in [r0, r1) and t in [0, x.T): the dot of weight row r (rows of
/// row_bytes bytes of `type` from w) with activation row t, bit-identical to the one-row dot
/// kernels of kernels/matmul.h on the same quantised activations. The activations must hold the
/// type's quantisation (Q8_0 or Q8_K arrays). Throws kvevict::Error for a type outside
/// qgemm_supports or an ISA variant this build lacks.
void qgemm_rows(KernelIsa isa, GgmlType type, const uint8_t* w, int64_t row_bytes, int64_t r0, int64_t r1,
                const PackedActivations& x, float* y, int64_t ldy);

}  // namespace kvevict
