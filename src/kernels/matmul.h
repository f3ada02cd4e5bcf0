// Matrix-vector and small-batch matrix products y = x · Wᵀ for weights stored in a ggml type.
//
// Source: ggml block layouts (format/ggml_blocks.h). For the legacy quantised weights (Q4_0,
// Q4_1, Q5_0, Q5_1, Q8_0) the activation rows are quantised once to Q8_0 blocks (d = max|x| /
// 127, q = round(x / d), as ggml's quantize_row_q8_0) and each 32-element block product is an
// exact integer dot product scaled by d_w · d_x in float32 — the approach of ggml's
// vec_dot_q*_q8_0 / q8_1 kernels. For the K-quants (Q2_K .. Q6_K) the activations are quantised
// per 256 elements to Q8_K blocks with 16-element sums (ggml's Q8_K), the sub-block products are
// integer sums times the integer sub-block scales, and the min/offset terms use the block sums
// (ggml's vec_dot_q*_K_q8_K). matmul_jobs computes the quantised products with the tiled
// kernels of kernels/qgemm.h (each weight block unpacked once for up to 4 activation rows),
// bit-identical to the one-row dots declared below. Every quantised result is within the
// activation quantisation error of the float product of the dequantised weights (kernels_test,
// quant_test). F32,
// F16 and BF16 weights use dot_row (float32 FMA accumulation), so the F32 path is bit-identical
// to the scalar-order kernel the parity tests were written against. Prefill (many rows) may use
// OpenBLAS sgemm on float32 weight tiles (dequantised on the fly for other types).
//
// Determinism: every output element y[t, r] is computed by one thread with a fixed order of
// operations that depends only on (W row r, x row t) — never on T, the row split or the thread
// count — except on the BLAS path, whose results depend on T (used only when allow_blas).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "format/ggml_types.h"
#include "kernels/activation_quant.h"
#include "kernels/dot_row.h"
#include "kernels/qgemm.h"

namespace kvevict {

class ThreadPool;

/// A weight matrix [rows, cols] stored row-major in a ggml type (rows of row_bytes bytes), in
/// place (e.g. inside a GGUF mapping). The model's weights are these views (model/model.h).
struct WeightView {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_bytes = 0;
  const uint8_t* row(int64_t r) const { return data + r * row_bytes; }
};

/// One product of a fused matmul call: y[t * rows + r] = dot(W row r, x row t).
struct MatmulJob {
  WeightView w;
  float* y = nullptr;  ///< [T, w.rows]
};

/// Scratch a matmul call reuses (quantised activations, dequantised tiles).
struct MatmulScratch {
  PackedActivations act;       ///< the activations for the tiled kernels
  std::vector<uint8_t> xq;     ///< T rows of Q8_0 blocks (builds without the tiled kernels)
  std::vector<uint8_t> xqk;    ///< T rows of Q8_K blocks (idem)
};

/// How matmul_jobs runs; the defaults are what the model uses. Results never depend on isa or
/// row_chunk (tests vary them to prove it).
struct MatmulOptions {
  /// When T >= 16, products may go through OpenBLAS sgemm (prefill of float weights); results
  /// then differ from the per-row kernel in the last bits.
  bool allow_blas = false;
  std::optional<KernelIsa> isa;  ///< tiled-kernel variant; default: the widest compiled
  int64_t row_chunk = 0;         ///< weight rows per work item; 0: derived from the shape
};

/// Runs every job over the same input x[T, cols] (all jobs must share cols) as one parallel
/// loop on `pool` (rows split into fixed chunks, so no result depends on the thread count).
/// Throws kvevict::Error when cols differ, a quantised type's cols is not a multiple of its block
/// size (32, or 256 for K-quants) or options.isa is not compiled into this build.
void matmul_jobs(std::span<const MatmulJob> jobs, const float* x, int64_t T, ThreadPool& pool, MatmulScratch& scratch,
                 const MatmulOptions& options);

/// matmul_jobs with default options, sgemm allowed or not (see MatmulOptions::allow_blas).
void matmul_jobs(std::span<const MatmulJob> jobs, const float* x, int64_t T, ThreadPool& pool, MatmulScratch& scratch,
                 bool allow_blas = false);

/// Dot product of a Q8_0 (or Q4_0) weight row of n elements with a Q8_0-quantised activation
/// row (both n / 32 blocks): sum over blocks of d_w · d_x · Σ q_w q_x, the integer sums exact
/// (8 lanes of 4 products per block), scaled and accumulated per lane in float32 with FMA, the
/// lanes added at the end. AVX2 (maddubs) with a scalar twin of identical result.
float dot_q8_0_q8_0(const void* w, const void* xq, int64_t n);
float dot_q4_0_q8_0(const void* w, const void* xq, int64_t n);

/// Scalar references of the two above (same lane layout and operation order): for tests.
float dot_q8_0_q8_0_ref(const void* w, const void* xq, int64_t n);
float dot_q4_0_q8_0_ref(const void* w, const void* xq, int64_t n);

/// Integer dot products of one weight row of n elements with its quantised activation row
/// (activation_quant of the type): Σ over sub-blocks of d_w · d_x · scale · Σ q_w q_x, minus
/// the min (Q4_1/Q5_1/Q2_K/Q4_K/Q5_K) or offset (Q3_K/Q6_K) term from the activation block sums;
/// float32 results. AVX2 kernels with a scalar fallback (dot_quantised_ref). Source: the block
/// formulas of format/ggml_blocks.h; ggml's vec_dot_*_q8_0 / *_q8_K for the decomposition.
float dot_q4_1_q8_0(const void* w, const void* xq, int64_t n);
float dot_q5_0_q8_0(const void* w, const void* xq, int64_t n);
float dot_q5_1_q8_0(const void* w, const void* xq, int64_t n);
float dot_q2_k_q8_k(const void* w, const void* xq, int64_t n);
float dot_q3_k_q8_k(const void* w, const void* xq, int64_t n);
float dot_q4_k_q8_k(const void* w, const void* xq, int64_t n);
float dot_q5_k_q8_k(const void* w, const void* xq, int64_t n);
float dot_q6_k_q8_k(const void* w, const void* xq, int64_t n);

/// The kernel above for weight type t (Q8_0 and Q4_0 included). Throws kvevict::Error for
/// float types.
float dot_quantised(GgmlType t, const void* w, const void* xq, int64_t n);

/// Scalar reference of dot_quantised: dequantised weights times dequantised activations in
/// float32 (for tests; not bit-identical to the AVX2 kernels).
float dot_quantised_ref(GgmlType t, const void* w, const void* xq, int64_t n);

}  // namespace kvevict
