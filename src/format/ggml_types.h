// Tensor element types of the GGUF format and their row kernels (dequantise, dot product).
//
// Source: GGUF specification (ggml docs/gguf.md, "GGML types") and ggml's block layouts:
//   F32, F16 (IEEE half), BF16 (bfloat16), Q8_0 (blocks of 32: fp16 scale d, 32 x int8 q;
//   x = d * q), Q4_0 (blocks of 32: fp16 scale d, 16 bytes of nibbles; low nibbles are elements
//   0..15, high nibbles 16..31; x = d * (nibble - 8)).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvevict {

/// ggml tensor type ids as stored in a GGUF tensor info (uint32). Only the ones kvevict
/// computes with are named; any other id is "unknown" and rejected by the reader.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q8_0 = 8,
  BF16 = 30,
};

/// True when `id` is a type kvevict can read (F32, F16, BF16, Q8_0, Q4_0).
bool ggml_type_supported(uint32_t id);

/// Human-readable name ("f32", "q8_0", ...); "type#<id>" for unknown ids.
std::string ggml_type_name(uint32_t id);

/// Elements per block (1 for F32/F16/BF16, 32 for Q8_0/Q4_0).
int64_t ggml_block_elems(GgmlType t);

/// Bytes per block (4, 2, 2, 34, 18).
int64_t ggml_block_bytes(GgmlType t);

/// Bytes of a row of `n` elements. Throws kvevict::Error if n is not a multiple of the block size.
int64_t ggml_row_bytes(GgmlType t, int64_t n);

/// IEEE 754 half <-> single conversions (round-to-nearest-even on the way down).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
/// bfloat16 <-> single (round-to-nearest-even on the way down).
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

/// Dequantises one row: src holds ggml_row_bytes(t, n) bytes, dst receives n floats.
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

/// Dot product of one stored row (n elements of type t) with float vector x[n], accumulated in
/// float32 (Q8_0/Q4_0: per-block integer-free float sums scaled by the block's d).
float dot_row(GgmlType t, const void* row, const float* x, int64_t n);

/// Quantises n floats (n % 32 == 0) into Q8_0 blocks as ggml does (d = max|x| / 127, q = round(x / d)).
void quantize_row_q8_0(const float* src, void* dst, int64_t n);

/// Quantises n floats (n % 32 == 0) into Q4_0 blocks as ggml does (d = max-by-abs / -8).
void quantize_row_q4_0(const float* src, void* dst, int64_t n);

}  // namespace kvevict
