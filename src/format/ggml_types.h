// Tensor element types of the GGUF format: the type table, fp16/bf16 conversions, and reading
// (dequantise) and writing (quantise) rows in their block layouts. The compute kernels on these
// layouts (dots, activation quantisation) live in kernels/.
//
// Source: GGUF specification (ggml docs/gguf.md, "GGML types") and ggml's block layouts, which
// format/ggml_blocks.h describes: F32, F16 (IEEE half), BF16 (bfloat16), the legacy 32-element
// blocks Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and the 256-element K-quants Q2_K .. Q6_K.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvevict {

/// ggml tensor type ids as stored in a GGUF tensor info (uint32). Only the ones kvevict
/// computes with are named; any other id is rejected by the reader (ggml_type_supported).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  BF16 = 30,
};

/// True when `id` is a type kvevict can read (the GgmlType values).
bool ggml_type_supported(uint32_t id);

/// The supported types' names, comma-separated (for error messages).
std::string ggml_supported_type_names();

/// Name of any ggml type id as ggml spells it in lower case ("f32", "q4_k", "iq2_xxs",
/// "tq1_0", ...), also for ids kvevict does not support; "type#<id>" for ids ggml does not define.
std::string ggml_type_name(uint32_t id);

/// Elements per block (1 for F32/F16/BF16, 32 for the legacy quants, 256 for the K-quants).
/// Throws kvevict::Error for an id outside GgmlType.
int64_t ggml_block_elems(GgmlType t);

/// Bytes per block (F32 4, F16/BF16 2, Q4_0 18, Q4_1 20, Q5_0 22, Q5_1 24, Q8_0 34, Q2_K 84,
/// Q3_K 110, Q4_K 144, Q5_K 176, Q6_K 210). Throws kvevict::Error for an id outside GgmlType.
int64_t ggml_block_bytes(GgmlType t);

/// True for the 256-element K-quants (Q2_K .. Q6_K).
bool ggml_is_k_quant(GgmlType t);

/// Bytes of a row of `n` elements. Throws kvevict::Error if n is not a multiple of the block size.
int64_t ggml_row_bytes(GgmlType t, int64_t n);

/// Throws kvevict::Error ("<what>: row of <n> elements is not a multiple of the <type> block size
/// <k>") unless n is a non-negative multiple of t's block size.
void ggml_check_row_length(GgmlType t, int64_t n, const char* what);

/// IEEE 754 half <-> single conversions (round-to-nearest-even on the way down).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
/// bfloat16 <-> single (round-to-nearest-even on the way down).
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

/// Dequantises one row: src holds ggml_row_bytes(t, n) bytes, dst receives n floats (the
/// formulas of format/ggml_blocks.h, in float32 as ggml's dequantize_row_* computes them).
/// Throws kvevict::Error when n is not a multiple of the block size.
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);

/// Quantises n floats into a row of type t (any GgmlType; float types convert with rounding
/// to nearest even). Q8_0 and Q4_0 follow ggml's reference quantisers; the others are a plain
/// round-to-nearest per block (see quantize_row_* in ggml_types.cpp), valid blocks but not
/// llama.cpp's error-minimising search. Throws kvevict::Error when n is not a multiple of the
/// block size.
void quantize_row(GgmlType t, const float* src, void* dst, int64_t n);

/// Quantises n floats (n % 32 == 0) into Q8_0 blocks as ggml does (d = max|x| / 127, q = round(x / d),
/// halves away from zero), scalar: the definition kernels/activation_quant.h's vectorised
/// quantize_rows_q8_0 reproduces byte for byte.
void quantize_row_q8_0(const float* src, void* dst, int64_t n);

/// Quantises n floats (n % 32 == 0) into Q4_0 blocks as ggml does (d = max-by-abs / -8).
void quantize_row_q4_0(const float* src, void* dst, int64_t n);

}  // namespace kvevict
