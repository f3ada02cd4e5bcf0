// Integer matmul kernels for quantised weights on the row-interleaved layout (kernels/x16.h):
// one call computes y[t, r] = dot(W row r, x row t) for groups of 16 weight rows and every
// activation row t, each weight load serving up to 8 activation rows (AVX2, AVX2 + VNNI or
// AVX-512 VNNI).
//
// The products computed (the definition every variant reproduces bit for bit, and
// kernels/matmul.h's scalar dot_quantised spells out), per weight row and activation row, with
// float32 arithmetic and the integer sums exact:
//   legacy types (32-element blocks b; activations quantised to Q8_0, values x, scale dx):
//     s_b = Σ_e q_e x_e with q the weight's signed value (Q8_0 q, Q4_0 q - 8, Q5_0 q - 16) or its
//     unsigned value (Q4_1, Q5_1); acc = fma(d_b · dx_b, float(s_b), acc) over b in order;
//     Q4_1 / Q5_1 also accm = fma(m_b · dx_b, float(Σ_e x_e), accm); y = acc (+ accm).
//   K-quants (256-element blocks; activations Q8_K):
//     s_b = Σ_j scale_j · Σ_{e in sub-block j} q_e x_e (Q3_K q - 4, Q6_K q - 32, signed scales);
//     acc = fma(d_b · dx_b, float(s_b), acc); Q2_K / Q4_K / Q5_K also
//     accm = fma(dmin_b · dx_b, float(Σ_j min_j · Σ_{e in j} x_e), accm); y = acc (- accm).
// Source: the block formulas of format/ggml_blocks.h; the decomposition is that of ggml's
// vec_dot_*_q8_0 / *_q8_K and its repacked GEMM kernels (ggml-cpu/repack.cpp): integer
// (sub-)block sums, float block scales, min and offset terms from the activation sums.
//
// Determinism: each output is one lane of one register through the whole row, with the steps
// above in block order, so no result depends on the number of activation rows, the group of
// rows it is computed with, the row split, the thread count or the instruction-set variant.
#pragma once

#include <cstdint>
#include <vector>

#include "format/ggml_types.h"
#include "kernels/weight_view.h"

namespace kvevict {

/// Instruction-set variants of the kernels; all compute bit-identical results.
enum class KernelIsa {
  Avx2,      ///< 256-bit, maddubs/madd integer dots (AVX2 + FMA + F16C)
  Avx2Vnni,  ///< 256-bit with VNNI dot instructions (AVX-VNNI, or AVX-512 VL + VNNI)
  Avx512,    ///< 512-bit (AVX-512 F/BW/VL/VNNI): 16 rows in one register
};

/// The variants compiled into this build, narrowest first (empty without AVX2 + FMA + F16C);
/// the last one is what matmul_jobs uses by default.
std::vector<KernelIsa> compiled_kernel_isas();

/// "avx2", "avx2-vnni" or "avx512".
const char* kernel_isa_name(KernelIsa isa);

/// Activation rows of one matmul call, quantised for the kernels.
struct PackedActivations {
  int64_t T = 0, cols = 0;
  /// Q8_0 (weights Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), cols / 32 blocks per row, split into arrays:
  std::vector<int8_t> q8;   ///< [T, cols] quantised values
  std::vector<float> d8;    ///< [T, cols / 32] block scales (the fp16 scale as float)
  std::vector<int32_t> s8;  ///< [T, cols / 32] block sums Σ q
  /// Q8_K (weights Q2_K .. Q6_K): T rows of cols / 256 ggml::BlockQ8_K.
  std::vector<uint8_t> qk;
};

/// Fills a's Q8_0 arrays from x[T, cols] (cols % 32 == 0): the values quantize_rows_q8_0 writes.
void pack_activations_q8_0(const float* x, int64_t T, int64_t cols, PackedActivations& a);

/// Fills a's Q8_K rows from x[T, cols] (cols % 256 == 0): quantize_rows_q8_k.
void pack_activations_q8_k(const float* x, int64_t T, int64_t cols, PackedActivations& a);

/// True for the weight types the kernels compute (the quantised types).
bool qgemm_supports(GgmlType type);

/// y[t * ldy + r] for the rows r of groups [g0, g1) of W (group g: rows 16 g .. 16 g + 15, the
/// last one possibly partial) and t in [0, x.T): the products defined above. Reads W.x16 when
/// set, else interleaves each group on the fly. The activations must hold W.type's quantisation
/// (Q8_0 or Q8_K arrays). Throws kvevict::Error for a type outside qgemm_supports or a variant
/// this build lacks.
void qgemm_groups(KernelIsa isa, const WeightView& W, int64_t g0, int64_t g1, const PackedActivations& x, float* y,
                  int64_t ldy);

}  // namespace kvevict
