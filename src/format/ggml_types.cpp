// The ggml tensor types kvevict reads (layouts: see ggml_types.h and ggml_blocks.h): the type
// table, fp16 / bf16 conversions, dequantisation and the weight quantisers.
//
// The quantisers for types other than Q8_0/Q4_0 are a plain round-to-nearest per (sub-)block,
// enough for synthetic models. Everything here is scalar: the vectorised row kernels (dots,
// activation quantisation) live in kernels/.
#include "format/ggml_types.h"

#include "format/ggml_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/error.h"

namespace kvevict {
namespace {

using ggml::BlockQ4_0;
using ggml::BlockQ8_0;
constexpr int64_t kQK = ggml::kQK;
constexpr int64_t kQKK = ggml::kQKK;

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Rounds `v >> shift` to nearest, ties to even (shift >= 1).
uint32_t shift_round_even(uint32_t v, int shift) {
  const uint32_t q = v >> shift;
  const uint32_t rem = v & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return (rem > half || (rem == half && (q & 1u))) ? q + 1 : q;
}

}  // namespace

void ggml_check_row_length(GgmlType t, int64_t n, const char* what) {
  const int64_t blk = ggml_block_elems(t);
  if (n < 0 || n % blk != 0) {
    throw Error(std::string(what) + ": row of " + std::to_string(n) + " elements is not a multiple of the " +
                ggml_type_name(static_cast<uint32_t>(t)) + " block size " + std::to_string(blk));
  }
}

namespace {

struct TypeInfo {
  GgmlType type;
  const char* name;
  int64_t block_elems, block_bytes;
};

// The supported types (sizes from ggml_blocks.h's structs).
constexpr TypeInfo kTypes[] = {
    {GgmlType::F32, "f32", 1, 4},
    {GgmlType::F16, "f16", 1, 2},
    {GgmlType::BF16, "bf16", 1, 2},
    {GgmlType::Q4_0, "q4_0", kQK, sizeof(ggml::BlockQ4_0)},
    {GgmlType::Q4_1, "q4_1", kQK, sizeof(ggml::BlockQ4_1)},
    {GgmlType::Q5_0, "q5_0", kQK, sizeof(ggml::BlockQ5_0)},
    {GgmlType::Q5_1, "q5_1", kQK, sizeof(ggml::BlockQ5_1)},
    {GgmlType::Q8_0, "q8_0", kQK, sizeof(ggml::BlockQ8_0)},
    {GgmlType::Q2_K, "q2_k", kQKK, sizeof(ggml::BlockQ2_K)},
    {GgmlType::Q3_K, "q3_k", kQKK, sizeof(ggml::BlockQ3_K)},
    {GgmlType::Q4_K, "q4_k", kQKK, sizeof(ggml::BlockQ4_K)},
    {GgmlType::Q5_K, "q5_k", kQKK, sizeof(ggml::BlockQ5_K)},
    {GgmlType::Q6_K, "q6_k", kQKK, sizeof(ggml::BlockQ6_K)},
};

// Every type id ggml defines (names as ggml / gguf-py's GGMLQuantizationType spell them), so
// an unsupported file is refused by name.
struct IdName {
  uint32_t id;
  const char* name;
};
constexpr IdName kAllNames[] = {
    {0, "f32"},      {1, "f16"},     {2, "q4_0"},     {3, "q4_1"},   {6, "q5_0"},    {7, "q5_1"},   {8, "q8_0"},
    {9, "q8_1"},     {10, "q2_k"},   {11, "q3_k"},    {12, "q4_k"},  {13, "q5_k"},   {14, "q6_k"},  {15, "q8_k"},
    {16, "iq2_xxs"}, {17, "iq2_xs"}, {18, "iq3_xxs"}, {19, "iq1_s"}, {20, "iq4_nl"}, {21, "iq3_s"}, {22, "iq2_s"},
    {23, "iq4_xs"},  {24, "i8"},     {25, "i16"},     {26, "i32"},   {27, "i64"},    {28, "f64"},   {29, "iq1_m"},
    {30, "bf16"},    {34, "tq1_0"},  {35, "tq2_0"},   {39, "mxfp4"}, {40, "nvfp4"},  {41, "q1_0"},
};

const TypeInfo* find_type(uint32_t id) {
  for (const TypeInfo& t : kTypes)
    if (static_cast<uint32_t>(t.type) == id) return &t;
  return nullptr;
}

const TypeInfo& type_info(GgmlType t, const char* what) {
  const TypeInfo* info = find_type(static_cast<uint32_t>(t));
  if (!info) throw Error(std::string(what) + ": unsupported ggml type " + ggml_type_name(static_cast<uint32_t>(t)));
  return *info;
}

}  // namespace

bool ggml_type_supported(uint32_t id) { return find_type(id) != nullptr; }

std::string ggml_supported_type_names() {
  std::string out;
  for (const TypeInfo& t : kTypes) out += (out.empty() ? "" : ", ") + std::string(t.name);
  return out;
}

std::string ggml_type_name(uint32_t id) {
  for (const IdName& n : kAllNames)
    if (n.id == id) return n.name;
  return "type#" + std::to_string(id);
}

int64_t ggml_block_elems(GgmlType t) { return type_info(t, "ggml_block_elems").block_elems; }

int64_t ggml_block_bytes(GgmlType t) { return type_info(t, "ggml_block_bytes").block_bytes; }

bool ggml_is_k_quant(GgmlType t) { return find_type(static_cast<uint32_t>(t)) && ggml_block_elems(t) == kQKK; }

int64_t ggml_row_bytes(GgmlType t, int64_t n) {
  ggml_check_row_length(t, n, "ggml_row_bytes");
  // n / blk * bytes <= n * 4 / 1 for every supported type; overflow only past 2^61 elements.
  if (n > INT64_MAX / 4) throw Error("ggml_row_bytes: row of " + std::to_string(n) + " elements is too large");
  return n / ggml_block_elems(t) * ggml_block_bytes(t);
}

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  int exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FFu;
  if (exp == 0x1F) return float_of(sign | 0x7F800000u | (mant << 13));  // inf / nan (payload kept)
  if (exp == 0) {
    if (mant == 0) return float_of(sign);  // +-0
    // Subnormal mant * 2^-24: shift the leading 1 up to the implicit-bit position.
    exp = 1;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    mant &= 0x3FFu;
  }
  // Rebias the exponent from 15 to 127 (exp may be <= 0 here for subnormals; the sum stays > 0).
  return float_of(sign | (static_cast<uint32_t>(exp + 112) << 23) | (mant << 13));
}

uint16_t fp32_to_fp16(float f) {
  const uint32_t bits = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return sign | 0x7E00u | ((abs >> 13) & 0x3FFu);  // nan stays a (quiet) nan
  if (abs >= 0x477FF000u) return sign | 0x7C00u;                          // >= 65520 (halfway past 65504) rounds to inf
  if (abs < 0x38800000u) {                                                // below 2^-14: half subnormal or zero
    if (abs <= 0x33000000u) return sign;                                  // <= 2^-25 (half of 2^-24, ties to even) -> 0
    // value / 2^-24 = mant * 2^(exp - 126); a carry into bit 10 correctly yields 2^-14.
    const uint32_t exp = abs >> 23, mant = (abs & 0x7FFFFFu) | 0x800000u;
    return sign | static_cast<uint16_t>(shift_round_even(mant, static_cast<int>(126 - exp)));
  }
  // Normal: rebias 127 -> 15 and drop 13 mantissa bits; a carry may bump the exponent (to inf
  // only above the threshold handled earlier).
  return sign | static_cast<uint16_t>(shift_round_even(abs - (112u << 23), 13));
}

float bf16_to_fp32(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

uint16_t fp32_to_bf16(float f) {
  const uint32_t bits = bits_of(f);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);  // quiet nan
  // Round to nearest even on the low 16 bits; overflow carries into the exponent (-> inf).
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

namespace {

// Per-block dequantisers (formulas in ggml_blocks.h). y receives the block's elements.
uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);  // little-endian, as GGUF stores it
  return v;
}

void dequant_block(const ggml::BlockQ4_1& b, float* y) {
  const float d = fp16_to_fp32(b.d), m = fp16_to_fp32(b.m);
  for (int j = 0; j < kQK / 2; ++j) {
    y[j] = d * static_cast<float>(b.qs[j] & 0x0F) + m;
    y[j + kQK / 2] = d * static_cast<float>(b.qs[j] >> 4) + m;
  }
}
void dequant_block(const ggml::BlockQ5_0& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  const uint32_t qh = load_u32(b.qh);
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = (b.qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (b.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo - 16);
    y[j + kQK / 2] = d * static_cast<float>(hi - 16);
  }
}
void dequant_block(const ggml::BlockQ5_1& b, float* y) {
  const float d = fp16_to_fp32(b.d), m = fp16_to_fp32(b.m);
  const uint32_t qh = load_u32(b.qh);
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = (b.qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (b.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    y[j] = d * static_cast<float>(lo) + m;
    y[j + kQK / 2] = d * static_cast<float>(hi) + m;
  }
}
void dequant_block(const ggml::BlockQ2_K& b, float* y) {
  const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
  for (int g = 0; g < 16; ++g) {  // groups of 16 sharing a scale and a min
    const float dl = d * static_cast<float>(b.scales[g] & 0xF), ml = dmin * static_cast<float>(b.scales[g] >> 4);
    for (int e = 16 * g; e < 16 * g + 16; ++e) {
      const int q = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
      y[e] = dl * static_cast<float>(q) - ml;
    }
  }
}
void dequant_block(const ggml::BlockQ3_K& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  float dl = 0.0f;
  for (int e = 0; e < kQKK; ++e) {
    if (e % 16 == 0) dl = d * static_cast<float>(ggml::q3k_scale(b.scales, e / 16));
    const int low = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    const bool high = (b.hmask[e % 32] >> (e / 32)) & 1;
    y[e] = dl * static_cast<float>(low - (high ? 0 : 4));
  }
}
template <class Block>
void dequant_k4_like(const Block& b, const uint8_t* qh, float* y) {
  const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
  for (int s = 0; s < 8; ++s) {  // sub-blocks of 32; scale and min unpacked once each
    uint8_t sc, m;
    ggml::k4_scale_min(b.scales, s, sc, m);
    const float ds = d * static_cast<float>(sc), ms = dmin * static_cast<float>(m);
    const uint8_t* qs = b.qs + 32 * (s / 2);
    for (int l = 0; l < 32; ++l) {
      int q = (s % 2 == 0) ? (qs[l] & 0xF) : (qs[l] >> 4);
      if (qh) q |= ((qh[l] >> s) & 1) << 4;
      y[32 * s + l] = ds * static_cast<float>(q) - ms;
    }
  }
}
void dequant_block(const ggml::BlockQ4_K& b, float* y) { dequant_k4_like(b, nullptr, y); }
void dequant_block(const ggml::BlockQ5_K& b, float* y) { dequant_k4_like(b, b.qh, y); }
void dequant_block(const ggml::BlockQ6_K& b, float* y) {
  const float d = fp16_to_fp32(b.d);
  // Within each half h of 128: group g (32 elements) takes the low (g < 2) or high nibble of
  // ql[64 h + 32 (g % 2) + l] and bits 2g..2g+1 of qh[32 h + l], l = element % 32.
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    float* yy = y + 128 * h;
    for (int g = 0; g < 4; ++g) {
      for (int half = 0; half < 2; ++half) {  // 16 elements sharing a scale
        const float ds = d * static_cast<float>(b.scales[8 * h + 2 * g + half]);
        for (int l = 16 * half; l < 16 * half + 16; ++l) {
          const uint8_t lb = ql[32 * (g % 2) + l];
          const int low = g < 2 ? (lb & 0xF) : (lb >> 4);
          const int high = (qh[l] >> (2 * g)) & 3;
          yy[32 * g + l] = ds * static_cast<float>((low | (high << 4)) - 32);
        }
      }
    }
  }
}

template <class Block>
void dequant_blocks(const void* src, float* dst, int64_t n, int64_t per_block) {
  const auto* b = static_cast<const Block*>(src);
  for (int64_t ib = 0; ib < n / per_block; ++ib) dequant_block(b[ib], dst + ib * per_block);
}

}  // namespace

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
  ggml_check_row_length(t, n, "dequantize_row");
  switch (t) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(h[i]);
      return;
    }
    case GgmlType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(h[i]);
      return;
    }
    case GgmlType::Q8_0: {
      const auto* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t ib = 0; ib < n / kQK; ++ib, dst += kQK) {
        const float d = fp16_to_fp32(b[ib].d);
        for (int j = 0; j < kQK; ++j) dst[j] = d * static_cast<float>(b[ib].qs[j]);
      }
      return;
    }
    case GgmlType::Q4_0: {
      const auto* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t ib = 0; ib < n / kQK; ++ib, dst += kQK) {
        const float d = fp16_to_fp32(b[ib].d);
        for (int j = 0; j < kQK / 2; ++j) {
          dst[j] = d * static_cast<float>((b[ib].qs[j] & 0x0F) - 8);
          dst[j + kQK / 2] = d * static_cast<float>((b[ib].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case GgmlType::Q4_1:
      return dequant_blocks<ggml::BlockQ4_1>(src, dst, n, kQK);
    case GgmlType::Q5_0:
      return dequant_blocks<ggml::BlockQ5_0>(src, dst, n, kQK);
    case GgmlType::Q5_1:
      return dequant_blocks<ggml::BlockQ5_1>(src, dst, n, kQK);
    case GgmlType::Q2_K:
      return dequant_blocks<ggml::BlockQ2_K>(src, dst, n, kQKK);
    case GgmlType::Q3_K:
      return dequant_blocks<ggml::BlockQ3_K>(src, dst, n, kQKK);
    case GgmlType::Q4_K:
      return dequant_blocks<ggml::BlockQ4_K>(src, dst, n, kQKK);
    case GgmlType::Q5_K:
      return dequant_blocks<ggml::BlockQ5_K>(src, dst, n, kQKK);
    case GgmlType::Q6_K:
      return dequant_blocks<ggml::BlockQ6_K>(src, dst, n, kQKK);
  }
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  ggml_check_row_length(GgmlType::Q8_0, n, "quantize_row_q8_0");
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t ib = 0; ib < n / kQK; ++ib, src += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(src[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;  // all-zero block -> d = 0, q = 0
    b[ib].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK; ++j) b[ib].qs[j] = static_cast<int8_t>(std::round(src[j] * id));
  }
}

void quantize_row_q4_0(const float* src, void* dst, int64_t n) {
  ggml_check_row_length(GgmlType::Q4_0, n, "quantize_row_q4_0");
  auto* b = static_cast<BlockQ4_0*>(dst);
  for (int64_t ib = 0; ib < n / kQK; ++ib, src += kQK) {
    // ggml keeps the sign of the largest-magnitude element so that it maps exactly to -8.
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (std::fabs(src[j]) > amax) {
        amax = std::fabs(src[j]);
        max = src[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[ib].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      // +8.5 then truncation rounds to nearest on the 0..16 range; 16 is clamped to 15.
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(src[j] * id + 8.5f)));
      const int q1 = std::min(15, static_cast<int>(static_cast<int8_t>(src[j + kQK / 2] * id + 8.5f)));
      b[ib].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

namespace {

// Round to nearest (halves away from zero), clamped to [lo, hi]; inputs are finite.
int round_clamp(float v, int lo, int hi) { return std::clamp(static_cast<int>(std::lround(v)), lo, hi); }

// The element of largest magnitude, with its sign (the first one on ties).
float signed_absmax(const float* x, int n) {
  float best = 0.0f;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(best)) best = x[i];
  return best;
}

// Legacy blocks with a 5th bit (qh != nullptr) or without: stores q[32] (0..31 or 0..15).
void pack_legacy(const int* q, uint8_t* qs, uint8_t* qh) {
  uint32_t h = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + kQK / 2] & 0xF) << 4));
    h |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    h |= static_cast<uint32_t>((q[j + kQK / 2] >> 4) & 1) << (j + kQK / 2);
  }
  if (qh) std::memcpy(qh, &h, 4);
}

// Affine blocks (Q4_1, Q5_1): d = (max - min) / levels, m = min; q nearest on the stored d, m.
void quant_affine(const float* x, int levels, uint16_t& d16, uint16_t& m16, uint8_t* qs, uint8_t* qh) {
  const auto [mn, mx] = std::minmax_element(x, x + kQK);
  d16 = fp32_to_fp16((*mx - *mn) / static_cast<float>(levels));
  m16 = fp32_to_fp16(*mn);
  const float d = fp16_to_fp32(d16), m = fp16_to_fp32(m16), id = d != 0.0f ? 1.0f / d : 0.0f;
  int q[kQK];
  for (int j = 0; j < kQK; ++j) q[j] = round_clamp((x[j] - m) * id, 0, levels);
  pack_legacy(q, qs, qh);
}

void quant_q5_0(const float* x, ggml::BlockQ5_0& b) {
  // As Q4_0 with 32 levels: the largest-magnitude element maps to -16.
  b.d = fp32_to_fp16(signed_absmax(x, kQK) / -16.0f);
  const float d = fp16_to_fp32(b.d), id = d != 0.0f ? 1.0f / d : 0.0f;
  int q[kQK];
  for (int j = 0; j < kQK; ++j) q[j] = round_clamp(x[j] * id, -16, 15) + 16;
  pack_legacy(q, b.qs, b.qh);
}

// Sub-block scale and min (>= 0, so the block's zero is representable) of an affine K-quant,
// then their integer codes on the super-block scales d, dmin (levels_sc codes each).
struct AffineSub {
  float scale, min;
};
AffineSub affine_sub(const float* x, int n, int levels) {
  float mn = 0.0f, mx = x[0];
  for (int i = 0; i < n; ++i) {
    mn = std::min(mn, x[i]);
    mx = std::max(mx, x[i]);
  }
  return {(mx - mn) / static_cast<float>(levels), -mn};
}

void quant_q2_k(const float* x, ggml::BlockQ2_K& b) {
  AffineSub sub[16];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int s = 0; s < 16; ++s) {
    sub[s] = affine_sub(x + 16 * s, 16, 3);
    max_scale = std::max(max_scale, sub[s].scale);
    max_min = std::max(max_min, sub[s].min);
  }
  b.d = fp32_to_fp16(max_scale / 15.0f);
  b.dmin = fp32_to_fp16(max_min / 15.0f);
  const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
  std::memset(b.qs, 0, sizeof b.qs);
  for (int s = 0; s < 16; ++s) {
    const int sc = d > 0.0f ? round_clamp(sub[s].scale / d, 0, 15) : 0;
    const int m = dmin > 0.0f ? round_clamp(sub[s].min / dmin, 0, 15) : 0;
    b.scales[s] = static_cast<uint8_t>(sc | (m << 4));
    const float ed = d * static_cast<float>(sc), em = dmin * static_cast<float>(m);
    for (int e = 16 * s; e < 16 * s + 16; ++e) {
      const int q = ed > 0.0f ? round_clamp((x[e] + em) / ed, 0, 3) : 0;
      b.qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>(q << (2 * ((e % 128) / 32)));
    }
  }
}

void quant_q3_k(const float* x, ggml::BlockQ3_K& b) {
  float scale[16];
  for (int s = 0; s < 16; ++s) scale[s] = signed_absmax(x + 16 * s, 16) / -4.0f;
  b.d = fp32_to_fp16(signed_absmax(scale, 16) / -32.0f);
  const float d = fp16_to_fp32(b.d);
  std::memset(b.hmask, 0, sizeof b.hmask);
  std::memset(b.qs, 0, sizeof b.qs);
  std::memset(b.scales, 0, sizeof b.scales);
  for (int s = 0; s < 16; ++s) {
    const int sc = d != 0.0f ? round_clamp(scale[s] / d, -32, 31) : 0;
    const int v = sc + 32;  // stored 6-bit code
    b.scales[s % 8] |= static_cast<uint8_t>((v & 0xF) << (s < 8 ? 0 : 4));
    b.scales[8 + s % 4] |= static_cast<uint8_t>((v >> 4) << (2 * (s / 4)));
    const float ed = d * static_cast<float>(sc);
    for (int e = 16 * s; e < 16 * s + 16; ++e) {
      const int u = (ed != 0.0f ? round_clamp(x[e] / ed, -4, 3) : 0) + 4;  // 0..7
      b.qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>((u & 3) << (2 * ((e % 128) / 32)));
      b.hmask[e % 32] |= static_cast<uint8_t>((u >> 2) << (e / 32));
    }
  }
}

// Q4_K / Q5_K: 8 sub-blocks of 32, 6-bit scale and min codes packed as k4_scale_min reads them.
template <class Block>
void quant_k4_like(const float* x, Block& b, int levels, uint8_t* qh) {
  AffineSub sub[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int s = 0; s < 8; ++s) {
    sub[s] = affine_sub(x + 32 * s, 32, levels);
    max_scale = std::max(max_scale, sub[s].scale);
    max_min = std::max(max_min, sub[s].min);
  }
  b.d = fp32_to_fp16(max_scale / 63.0f);
  b.dmin = fp32_to_fp16(max_min / 63.0f);
  const float d = fp16_to_fp32(b.d), dmin = fp16_to_fp32(b.dmin);
  std::memset(b.scales, 0, sizeof b.scales);
  std::memset(b.qs, 0, sizeof b.qs);
  if (qh) std::memset(qh, 0, kQKK / 8);
  for (int s = 0; s < 8; ++s) {
    const int sc = d > 0.0f ? round_clamp(sub[s].scale / d, 0, 63) : 0;
    const int m = dmin > 0.0f ? round_clamp(sub[s].min / dmin, 0, 63) : 0;
    if (s < 4) {
      b.scales[s] |= static_cast<uint8_t>(sc);
      b.scales[s + 4] |= static_cast<uint8_t>(m);
    } else {
      b.scales[s + 4] = static_cast<uint8_t>((sc & 0xF) | ((m & 0xF) << 4));
      b.scales[s - 4] |= static_cast<uint8_t>((sc >> 4) << 6);
      b.scales[s] |= static_cast<uint8_t>((m >> 4) << 6);
    }
    const float ed = d * static_cast<float>(sc), em = dmin * static_cast<float>(m);
    for (int e = 32 * s; e < 32 * s + 32; ++e) {
      const int q = ed > 0.0f ? round_clamp((x[e] + em) / ed, 0, levels) : 0;
      b.qs[32 * (e / 64) + e % 32] |= static_cast<uint8_t>((q & 0xF) << (e % 64 < 32 ? 0 : 4));
      if (qh) qh[e % 32] |= static_cast<uint8_t>((q >> 4) << (e / 32));
    }
  }
}

void quant_q6_k(const float* x, ggml::BlockQ6_K& b) {
  float scale[16];
  for (int s = 0; s < 16; ++s) scale[s] = signed_absmax(x + 16 * s, 16) / -32.0f;
  b.d = fp32_to_fp16(signed_absmax(scale, 16) / -128.0f);
  const float d = fp16_to_fp32(b.d);
  std::memset(b.ql, 0, sizeof b.ql);
  std::memset(b.qh, 0, sizeof b.qh);
  for (int s = 0; s < 16; ++s) {
    const int sc = d != 0.0f ? round_clamp(scale[s] / d, -128, 127) : 0;
    b.scales[s] = static_cast<int8_t>(sc);
    const float ed = d * static_cast<float>(sc);
    for (int e = 16 * s; e < 16 * s + 16; ++e) {
      const int u = (ed != 0.0f ? round_clamp(x[e] / ed, -32, 31) : 0) + 32;  // 0..63
      const int h = e / 128, g = (e % 128) / 32, l = e % 32;
      b.ql[64 * h + 32 * (g % 2) + l] |= static_cast<uint8_t>((u & 0xF) << (g < 2 ? 0 : 4));
      b.qh[32 * h + l] |= static_cast<uint8_t>((u >> 4) << (2 * g));
    }
  }
}

template <class Block, class Quant>
void quant_blocks(const float* src, void* dst, int64_t n, int64_t per_block, Quant quant) {
  auto* b = static_cast<Block*>(dst);
  for (int64_t ib = 0; ib < n / per_block; ++ib) quant(src + ib * per_block, b[ib]);
}

}  // namespace

void quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
  ggml_check_row_length(t, n, "quantize_row");
  auto* out = static_cast<uint8_t*>(dst);
  switch (t) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::F16:
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = t == GgmlType::F16 ? fp32_to_fp16(src[i]) : fp32_to_bf16(src[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GgmlType::Q8_0:
      return quantize_row_q8_0(src, dst, n);
    case GgmlType::Q4_0:
      return quantize_row_q4_0(src, dst, n);
    case GgmlType::Q4_1:
      return quant_blocks<ggml::BlockQ4_1>(
          src, dst, n, kQK, [](const float* x, ggml::BlockQ4_1& b) { quant_affine(x, 15, b.d, b.m, b.qs, nullptr); });
    case GgmlType::Q5_0:
      return quant_blocks<ggml::BlockQ5_0>(src, dst, n, kQK, quant_q5_0);
    case GgmlType::Q5_1:
      return quant_blocks<ggml::BlockQ5_1>(
          src, dst, n, kQK, [](const float* x, ggml::BlockQ5_1& b) { quant_affine(x, 31, b.d, b.m, b.qs, b.qh); });
    case GgmlType::Q2_K:
      return quant_blocks<ggml::BlockQ2_K>(src, dst, n, kQKK, quant_q2_k);
    case GgmlType::Q3_K:
      return quant_blocks<ggml::BlockQ3_K>(src, dst, n, kQKK, quant_q3_k);
    case GgmlType::Q4_K:
      return quant_blocks<ggml::BlockQ4_K>(
          src, dst, n, kQKK, [](const float* x, ggml::BlockQ4_K& b) { quant_k4_like(x, b, 15, nullptr); });
    case GgmlType::Q5_K:
      return quant_blocks<ggml::BlockQ5_K>(src, dst, n, kQKK,
                                           [](const float* x, ggml::BlockQ5_K& b) { quant_k4_like(x, b, 31, b.qh); });
    case GgmlType::Q6_K:
      return quant_blocks<ggml::BlockQ6_K>(src, dst, n, kQKK, quant_q6_k);
  }
}

}  // namespace kvevict
