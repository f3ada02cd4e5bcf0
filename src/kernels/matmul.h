// Matrix products y = x · Wᵀ for weights stored in a ggml type: decode (one activation row per
// sequence), batched decode and prefill (many rows) alike.
//
// Source: ggml block layouts (format/ggml_blocks.h). Quantised weights: the activation rows are
// quantised once per call — to Q8_0 (d = max|x| / 127, q = round(x / d), ggml's
// quantize_row_q8_0) for the legacy types Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, to Q8_K (256 elements,
// with 16-element sums) for the K-quants Q2_K .. Q6_K — and the integer kernels of
// kernels/qgemm.h compute exact integer (sub-)block sums scaled in float32 (qgemm.h defines the
// arithmetic; dot_quantised below is its scalar reference). Every quantised result is within the
// activation quantisation error of the float product of the dequantised weights (qgemm_test,
// kernels_test, quant_test). F32, F16 and BF16 weights use dot_row (float32 FMA accumulation),
// or OpenBLAS sgemm when allowed for many rows (prefill).
//
// Determinism: every output element y[t, r] is computed by one thread with a fixed order of
// operations that depends only on (W row r, x row t) — never on T, the row split, the thread
// count or the kernel variant — except on the sgemm path of float weights, whose results depend
// on T (used only with allow_blas).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "format/ggml_types.h"
#include "kernels/activation_quant.h"
#include "kernels/dot_row.h"
#include "kernels/qgemm.h"
#include "kernels/weight_view.h"

namespace kvevict {

class ThreadPool;

/// One product of a fused matmul call: y[t * rows + r] = dot(W row r, x row t).
struct MatmulJob {
  WeightView w;
  float* y = nullptr;  ///< [T, w.rows]
};

/// Scratch a matmul call reuses (quantised activations, dequantised tiles).
struct MatmulScratch {
  PackedActivations act;    ///< the activations of the integer kernels
  std::vector<uint8_t> xq;  ///< T rows of Q8_0 blocks (builds without the integer kernels)
  std::vector<uint8_t> xqk; ///< T rows of Q8_K blocks (idem)
};

/// How matmul_jobs runs; the defaults are what the model uses. Results never depend on isa or
/// row_chunk (tests vary them to prove it).
struct MatmulOptions {
  /// With T >= 16 rows, float weights (F32, F16, BF16) go through OpenBLAS sgemm (prefill);
  /// results then differ from dot_row in the last bits. Quantised weights always take the
  /// integer kernels.
  bool allow_blas = false;
  std::optional<KernelIsa> isa;  ///< kernel variant; default: the widest compiled
  int64_t row_chunk = 0;         ///< weight rows per work item (rounded up to a multiple of 16); 0: from the shape
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

/// Scalar reference of the integer products of kernels/qgemm.h for one weight row of n elements
/// of quantised type t (in its GGUF layout) and one activation row quantised as
/// activation_quant(t) (Q8_0 or Q8_K blocks): the same integer sums and float32 steps in the same
/// order, so the kernels' results equal it bit for bit. Throws kvevict::Error for float types or
/// when n is not a multiple of the block size.
float dot_quantised(GgmlType t, const void* w, const void* xq, int64_t n);

/// Independent float reference: dequantised weights times dequantised activations in float32
/// (for tests; within the activation quantisation error of dot_quantised, not bit-identical).
float dot_quantised_ref(GgmlType t, const void* w, const void* xq, int64_t n);

}  // namespace kvevict
