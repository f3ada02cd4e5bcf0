// Byte layouts of ggml's quantised blocks: the one definition every kernel reads them through.
//
// Source: ggml's block definitions (ggml-common.h: "block_q4_0" ... "block_q8_K") and the GGUF
// specification's type table (ggml docs/gguf.md). All scales are IEEE half (fp16) bit patterns
// except Q8_K's, which is a float. "Element e" is the e-th value of the block in row order.
//
// Legacy blocks (32 elements): nibble j of qs holds element j (low nibble) and element j + 16
// (high nibble); Q5_* keep bit e of the 32-bit qh as the fifth bit of element e.
//   Q4_0: x = d * (q - 8)        Q4_1: x = d * q + m
//   Q5_0: x = d * (q - 16)       Q5_1: x = d * q + m        Q8_0: x = d * q (q signed)
// K-quant super-blocks (256 elements):
//   Q2_K: 16 sub-blocks of 16; scales[i] = scale (low 4 bits) | min (high 4 bits);
//         x = d * scale * q - dmin * min, q the 2-bit value of element e at bits 2 * ((e % 128) / 32)
//         of qs[32 * (e / 128) + e % 32].
//   Q3_K: 16 sub-blocks of 16 with 6-bit scales (stored + 32, packed in 12 bytes: low 4 bits in
//         bytes 0..7, low then high nibble; high 2 bits in bytes 8..11); the 2 low bits as in Q2_K,
//         bit 3 from hmask[e % 32] bit (e / 32); x = d * (scale - 32) * (q - 4 if the hmask bit is clear, else q).
//   Q4_K: 8 sub-blocks of 32 with 6-bit scale and 6-bit min packed in 12 bytes; element e of
//         sub-block pair p = e / 64 is the low (e % 64 < 32) or high nibble of qs[32 p + e % 32];
//         x = d * scale * q - dmin * min.
//   Q5_K: as Q4_K plus the fifth bit of element e in qh[e % 32] bit (e / 32).
//   Q6_K: 16 sub-blocks of 16 with int8 scales; 4 low bits in ql, 2 high bits in qh;
//         x = d * scale * (q - 32).
//   Q8_K: float d, 256 int8 q, and the 16 sums of q over each group of 16 (activations only).
#pragma once

#include <cstdint>

namespace kvevict::ggml {

inline constexpr int kQK = 32;    ///< elements per legacy block (QK4_0 .. QK8_0)
inline constexpr int kQKK = 256;  ///< elements per K-quant super-block (QK_K)

struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK / 2];
};
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[kQK / 2];
};
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // little-endian uint32, bit e = fifth bit of element e
  uint8_t qs[kQK / 2];
};
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK];
};
struct BlockQ2_K {
  uint8_t scales[kQKK / 16];
  uint8_t qs[kQKK / 4];
  uint16_t d, dmin;
};
struct BlockQ3_K {
  uint8_t hmask[kQKK / 8];
  uint8_t qs[kQKK / 4];
  uint8_t scales[12];
  uint16_t d;
};
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[kQKK / 2];
};
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[kQKK / 8];
  uint8_t qs[kQKK / 2];
};
struct BlockQ6_K {
  uint8_t ql[kQKK / 2];
  uint8_t qh[kQKK / 4];
  int8_t scales[kQKK / 16];
  uint16_t d;
};
struct BlockQ8_K {
  float d;
  int8_t qs[kQKK];
  int16_t bsums[kQKK / 16];
};

// Sizes of the GGUF type table (gguf.quants.GGML_QUANT_SIZES agrees).
static_assert(sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20 && sizeof(BlockQ5_0) == 22 &&
                  sizeof(BlockQ5_1) == 24 && sizeof(BlockQ8_0) == 34,
              "ggml legacy block sizes");
static_assert(sizeof(BlockQ2_K) == 84 && sizeof(BlockQ3_K) == 110 && sizeof(BlockQ4_K) == 144 &&
                  sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210 && sizeof(BlockQ8_K) == 292,
              "ggml K-quant block sizes");

/// Scale (sc) and min (m) j (0..7) of a Q4_K / Q5_K block's 12 packed bytes, 6 bits each:
/// j < 4: low 6 bits of bytes j and j + 4; j >= 4: low nibble / high nibble of byte j + 4 with
/// the top 2 bits of bytes j - 4 / j as their bits 4..5.
inline void k4_scale_min(const uint8_t* q, int j, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

/// Scale i (0..15) of a Q3_K block as a signed value (stored 6-bit value minus 32).
inline int q3k_scale(const uint8_t* s, int i) {
  const int low = i < 8 ? (s[i] & 0xF) : (s[i - 8] >> 4);
  const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
  return (low | (high << 4)) - 32;
}

}  // namespace kvevict::ggml
