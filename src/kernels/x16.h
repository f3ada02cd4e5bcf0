// The row-interleaved ("x16") weight layout of the integer matmul kernels (kernels/qgemm.h):
// groups of 16 weight rows whose blocks are interleaved so that one 64-byte load holds 4
// consecutive quantised values of each of the 16 rows (one 32-bit lane per row). A dot-product
// instruction against 4 activation bytes broadcast to every lane then advances 16 (row, token)
// products at once, each lane's integer sum staying one row's — the idea of llama.cpp's
// repacked Q4_0 "4x4/8x8" layouts (ggml-cpu/repack.cpp), applied to every quantised type.
//
// Block b of a group (every block of a group has the same size) holds, in this order (G4(o):
// for rows 0..15, the 4 bytes at offset o of that row's block: 64 bytes; D16: the 16 rows' fp16
// values; rows beyond the matrix are zero blocks):
//   Q8_0  D16(d) | G4(qs + 4g), g = 0..7                                        544 = 16 x 34
//   Q4_0  D16(d) | G4(qs + 4k), k = 0..3 (low nibbles: elements 4k.., high: 16 + 4k..)    288
//   Q4_1  D16(d) | D16(m) | G4(qs + 4k)                                                 320
//   Q5_0  D16(d) | M[8] | G4(qs + 4k)   M[g]: 64-bit mask, bit 4r + i = fifth bit of
//                                       element 4g + i of row r                          352
//   Q5_1  D16(d) | D16(m) | M[8] | G4(qs + 4k)                                          384
//   Q2_K  D16(d) | D16(dmin) | S[16][16] (scales byte of sub-block s, rows) | G4(qs + 32h + 4k),
//         h = 0..1, k = 0..7                                                       1344 = 16 x 84
//   Q3_K  D16(d) | S[16][16] (signed scale - 32) | G4(hmask + 4k) | G4(qs + 32h + 4k)    1824
//   Q4_K  D16(d) | D16(dmin) | S[8][16] (scales) | M[8][16] (mins) | G4(qs + 32p + 4k),
//         p = 0..3                                                                       2368
//   Q5_K  as Q4_K, then G4(qh + 4k)                                                      2880
//   Q6_K  D16(d) | S[16][16] (int8 scales) | G4(ql + 64h + 32a + 4k), a = 0..1 |
//         G4(qh + 32h + 4k)                                                        3360 = 16 x 210
// The K-quant scales are stored decoded (one byte per sub-block and row), 2.8-3.6 % more bytes
// than the packed 12-byte form for Q3_K/Q4_K/Q5_K; the other types keep their size.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "format/ggml_types.h"
#include "kernels/weight_view.h"

namespace kvevict {

/// Rows per group of the layout.
inline constexpr int64_t kX16Rows = 16;

/// Bytes of one interleaved block (16 rows), 0 for a type without the layout (float types).
int64_t x16_block_bytes(GgmlType type);

/// Bytes of one group of 16 rows of `cols` elements (cols a multiple of the block size).
int64_t x16_group_bytes(GgmlType type, int64_t cols);

/// Interleaves n_rows <= 16 rows (rows[r] at src + r * row_bytes, each `cols` elements of `type`)
/// into one group at out[x16_group_bytes(type, cols)]; rows n_rows..15 become zero blocks.
/// Throws kvevict::Error for a type without the layout or n_rows outside [1, 16].
void x16_pack_group(GgmlType type, const uint8_t* src, int64_t row_bytes, int n_rows, int64_t cols, uint8_t* out);

/// All rows of a matrix, ceil(rows / 16) groups one after another.
std::vector<uint8_t> x16_pack(GgmlType type, const uint8_t* data, int64_t rows, int64_t cols, int64_t row_bytes);

/// Gives every view whose type has the layout an interleaved copy (sets its x16), appended to
/// `storage`, which must outlive the views; the matrices are packed in parallel on `threads`
/// threads (0: all cores), and `packed` (if set) is called with each view's rows once its copy
/// is made (from the packing threads). Views of other types are left as they are.
void x16_attach(std::span<WeightView* const> views, std::vector<std::vector<uint8_t>>& storage, int threads = 0,
                const std::function<void(const WeightView&)>& packed = {});

}  // namespace kvevict
