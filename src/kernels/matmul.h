// Matrix-vector and small-batch matrix products y = x · Wᵀ for weights stored in a ggml type.
//
// Source: ggml block layouts (format/ggml_types.h). For Q8_0/Q4_0 weights the activation rows
// are quantised once to Q8_0 blocks (d = max|x| / 127, q = round(x / d), as ggml's
// quantize_row_q8_0) and each 32-element block product is an exact integer dot product scaled
// by d_w · d_x in float32 — the approach of ggml's vec_dot_q8_0_q8_0 / vec_dot_q4_0_q8_0. F32,
// F16 and BF16 weights use dot_row (float32 FMA accumulation), so the F32 path is bit-identical
// to the scalar-order kernel the parity tests were written against. Prefill (many rows) may use
// OpenBLAS sgemm on float32 weight tiles (dequantised on the fly for other types).
//
// Determinism: every output element y[t, r] is computed by one thread with a fixed order of
// operations that depends only on (W row r, x row t) — never on T, the row split or the thread
// count — except on the BLAS path, whose results depend on T (used only when allow_blas).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "format/ggml_types.h"

namespace kvevict {

class ThreadPool;

/// A weight matrix [rows, cols] stored row-major in a ggml type (rows of row_bytes bytes), in
/// place (e.g. inside a GGUF mapping). The model's weights are these views (model/llama.h).
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
  std::vector<uint8_t> xq;  ///< T rows of Q8_0 blocks
};

/// Runs every job over the same input x[T, cols] (all jobs must share cols) as one parallel
/// loop on `pool` (rows split into fixed chunks, so no result depends on the thread count).
/// allow_blas: when T >= 16, products may go through OpenBLAS sgemm (prefill); results then
/// differ from the per-row kernel in the last bits. Throws kvevict::Error when cols differ or a
/// quantised type's cols is not a multiple of 32.
void matmul_jobs(std::span<const MatmulJob> jobs, const float* x, int64_t T, ThreadPool& pool,
                 MatmulScratch& scratch, bool allow_blas = false);

/// Quantises T rows of n floats (n % 32 == 0) to Q8_0 blocks into dst[T * n / 32 * 34 bytes].
void quantize_rows_q8_0(const float* x, int64_t T, int64_t n, uint8_t* dst);

/// Dot product of a Q8_0 (or Q4_0) weight row of n elements with a Q8_0-quantised activation
/// row (both n / 32 blocks): sum over blocks of d_w · d_x · Σ q_w q_x, the integer sums exact
/// (8 lanes of 4 products per block), scaled and accumulated per lane in float32 with FMA, the
/// lanes added at the end. AVX2 (maddubs) with a scalar twin of identical result.
float dot_q8_0_q8_0(const void* w, const void* xq, int64_t n);
float dot_q4_0_q8_0(const void* w, const void* xq, int64_t n);

/// Scalar references of the two above (same lane layout and operation order): for tests.
float dot_q8_0_q8_0_ref(const void* w, const void* xq, int64_t n);
float dot_q4_0_q8_0_ref(const void* w, const void* xq, int64_t n);

}  // namespace kvevict
