// A weight matrix in place (e.g. inside a GGUF mapping), as every matmul reads it.
#pragma once

#include <cstdint>

#include "format/ggml_types.h"

namespace kvevict {

/// A weight matrix [rows, cols] stored row-major in a ggml type (rows of row_bytes bytes), in
/// place (e.g. inside a GGUF mapping). The model's weights are these views (model/model.h).
/// x16, when set, is the same matrix in the row-interleaved layout of kernels/x16.h
/// (ceil(rows / 16) groups), which the integer kernels read instead of the rows; without it
/// they interleave each group on the fly (same results, slower).
struct WeightView {
  GgmlType type = GgmlType::F32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_bytes = 0;
  const uint8_t* x16 = nullptr;
  const uint8_t* row(int64_t r) const { return data + r * row_bytes; }
};

}  // namespace kvevict
