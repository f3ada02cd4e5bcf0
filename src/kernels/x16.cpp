// The row-interleaved weight layout (see x16.h): scalar repacking, done once per matrix at load.
#include "kernels/x16.h"

#include <fmt/format.h>

#include <atomic>
#include <cstring>

#include "format/ggml_blocks.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace kvevict {
namespace {

constexpr int kR = static_cast<int>(kX16Rows);

// Writes block b of every row into one interleaved block through `put(row block, out)`.
// D16 / G4 / S helpers below append to `o`.
struct Writer {
  uint8_t* o;
  void d16(const uint16_t* const (&v)[kR]) {
    for (int r = 0; r < kR; ++r) std::memcpy(o + 2 * r, v[r], 2);
    o += 32;
  }
  void g4(const uint8_t* const (&rows)[kR], int offset) {
    for (int r = 0; r < kR; ++r) std::memcpy(o + 4 * r, rows[r] + offset, 4);
    o += 64;
  }
  // Bytes [s][r] from value(r, s) for s = 0..n-1.
  template <class F>
  void bytes(int n, F value) {
    for (int s = 0; s < n; ++s)
      for (int r = 0; r < kR; ++r) o[kR * s + r] = static_cast<uint8_t>(value(r, s));
    o += kR * n;
  }
  // Q5 fifth-bit masks: M[g] bit 4r + i = bit 4g + i of row r's 32-bit qh.
  void masks(const uint8_t* const (&qh)[kR]) {
    for (int g = 0; g < 8; ++g) {
      uint64_t m = 0;
      for (int r = 0; r < kR; ++r) {
        uint32_t h;
        std::memcpy(&h, qh[r], 4);
        m |= static_cast<uint64_t>((h >> (4 * g)) & 0xF) << (4 * r);
      }
      std::memcpy(o, &m, 8);
      o += 8;
    }
  }
};

template <class Block>
struct Rows {
  const Block* b[kR];
};

template <class Block, class Pack>
void pack_blocks(const uint8_t* src, int64_t row_bytes, int n_rows, int64_t nb, int64_t block_bytes, uint8_t* out,
                 Pack pack) {
  static const Block zero{};
  for (int64_t ib = 0; ib < nb; ++ib) {
    Rows<Block> rows;
    for (int r = 0; r < kR; ++r)
      rows.b[r] = r < n_rows ? reinterpret_cast<const Block*>(src + r * row_bytes) + ib : &zero;
    Writer w{out + ib * block_bytes};
    pack(rows, w);
    if (w.o != out + (ib + 1) * block_bytes) throw Error("x16 layout: block size mismatch (internal)");
  }
}

// Field pointers of the 16 rows of a block.
#define KV_X16_FIELD(rows, field, var)                                    \
  const uint8_t* var[kR];                                                 \
  for (int r_ = 0; r_ < kR; ++r_) var[r_] = reinterpret_cast<const uint8_t*>(rows.b[r_]->field)
#define KV_X16_HALF(rows, field, var) \
  const uint16_t* var[kR];            \
  for (int r_ = 0; r_ < kR; ++r_) var[r_] = &rows.b[r_]->field

}  // namespace

int64_t x16_block_bytes(GgmlType type) {
  switch (type) {
    case GgmlType::Q8_0:
      return 544;
    case GgmlType::Q4_0:
      return 288;
    case GgmlType::Q4_1:
      return 320;
    case GgmlType::Q5_0:
      return 352;
    case GgmlType::Q5_1:
      return 384;
    case GgmlType::Q2_K:
      return 1344;
    case GgmlType::Q3_K:
      return 1824;
    case GgmlType::Q4_K:
      return 2368;
    case GgmlType::Q5_K:
      return 2880;
    case GgmlType::Q6_K:
      return 3360;
    default:
      return 0;
  }
}

int64_t x16_group_bytes(GgmlType type, int64_t cols) {
  ggml_check_row_length(type, cols, "x16_group_bytes");
  return cols / ggml_block_elems(type) * x16_block_bytes(type);
}

void x16_pack_group(GgmlType type, const uint8_t* src, int64_t row_bytes, int n_rows, int64_t cols, uint8_t* out) {
  if (x16_block_bytes(type) == 0)
    throw Error("x16_pack_group: no interleaved layout for " + ggml_type_name(static_cast<uint32_t>(type)));
  if (n_rows < 1 || n_rows > kR) throw Error(fmt::format("x16_pack_group: {} rows outside [1, 16]", n_rows));
  ggml_check_row_length(type, cols, "x16_pack_group");
  const int64_t nb = cols / ggml_block_elems(type), bb = x16_block_bytes(type);
  switch (type) {
    case GgmlType::Q8_0:
      return pack_blocks<ggml::BlockQ8_0>(src, row_bytes, n_rows, nb, bb, out, [](const auto& rows, Writer& w) {
        KV_X16_HALF(rows, d, d);
        KV_X16_FIELD(rows, qs, qs);
        w.d16(d);
        for (int g = 0; g < 8; ++g) w.g4(qs, 4 * g);
      });
    case GgmlType::Q4_0:
      return pack_blocks<ggml::BlockQ4_0>(src, row_bytes, n_rows, nb, bb, out, [](const auto& rows, Writer& w) {
        KV_X16_HALF(rows, d, d);
        KV_X16_FIELD(rows, qs, qs);
        w.d16(d);
        for (int k = 0; k < 4; ++k) w.g4(qs, 4 * k);
      });
    case GgmlType::Q4_1:
      return pack_blocks<ggml::BlockQ4_1>(src, row_bytes, n_rows, nb, bb, out, [](const auto& rows, Writer& w) {
        KV_X16_HALF(rows, d, d);
        KV_X16_HALF(rows, m, m);
        KV_X16_FIELD(rows, qs, qs);
        w.d16(d);
        w.d16(m);
        for (int k = 0; k < 4; ++k) w.g4(qs, 4 * k);
      });
    case GgmlType::Q5_0:
      return pack_blocks<ggml::BlockQ5_0>(src, row_bytes, n_rows, nb, bb, out, [](const auto& rows, Writer& w) {
        KV_X16_HALF(rows, d, d);
        KV_X16_FIELD(rows, qh, qh);
        KV_X16_FIELD(rows, qs, qs);
        w.d16(d);
        w.masks(qh);
        for (int k = 0; k < 4; ++k) w.g4(qs, 4 * k);
      });
    case GgmlType::Q5_1:
      return pack_blocks<ggml::BlockQ5_1>(src, row_bytes, n_rows, nb, bb, out, [](const auto& rows, Writer& w) {
        KV_X16_HALF(rows, d, d);
        KV_X16_HALF(rows, m, m);
        KV_X16_FIELD(rows, qh, qh);
        KV_X16_FIELD(rows, qs, qs);
        w.d16(d);
        w.d16(m);
        w.masks(qh);
        for (int k = 0; k < 4; ++k) w.g4(qs, 4 * k);
      });
    case GgmlType::Q2_K:
      return pack_blocks<ggml::BlockQ2_K>(src, row_bytes, n_rows, nb, bb, out, [](const auto& rows, Writer& w) {
        KV_X16_HALF(rows, d, d);
        KV_X16_HALF(rows, dmin, dmin);
        KV_X16_FIELD(rows, qs, qs);
        w.d16(d);
        w.d16(dmin);
        w.bytes(16, [&](int r, int s) { return rows.b[r]->scales[s]; });
        for (int h = 0; h < 2; ++h)
          for (int k = 0; k < 8; ++k) w.g4(qs, 32 * h + 4 * k);
      });
    case GgmlType::Q3_K:
      return pack_blocks<ggml::BlockQ3_K>(src, row_bytes, n_rows, nb, bb, out, [](const auto& rows, Writer& w) {
        KV_X16_HALF(rows, d, d);
        KV_X16_FIELD(rows, hmask, hm);
        KV_X16_FIELD(rows, qs, qs);
        w.d16(d);
        w.bytes(16, [&](int r, int s) { return static_cast<int8_t>(ggml::q3k_scale(rows.b[r]->scales, s)); });
        for (int k = 0; k < 8; ++k) w.g4(hm, 4 * k);
        for (int h = 0; h < 2; ++h)
          for (int k = 0; k < 8; ++k) w.g4(qs, 32 * h + 4 * k);
      });
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: {
      const auto pack = [](const auto& rows, Writer& w) {
        KV_X16_HALF(rows, d, d);
        KV_X16_HALF(rows, dmin, dmin);
        KV_X16_FIELD(rows, qs, qs);
        w.d16(d);
        w.d16(dmin);
        const auto sc_min = [&](int r, int s, bool min) {
          uint8_t sc, m;
          ggml::k4_scale_min(rows.b[r]->scales, s, sc, m);
          return min ? m : sc;
        };
        w.bytes(8, [&](int r, int s) { return sc_min(r, s, false); });
        w.bytes(8, [&](int r, int s) { return sc_min(r, s, true); });
        for (int p = 0; p < 4; ++p)
          for (int k = 0; k < 8; ++k) w.g4(qs, 32 * p + 4 * k);
        if constexpr (requires { rows.b[0]->qh; }) {
          KV_X16_FIELD(rows, qh, qh);
          for (int k = 0; k < 8; ++k) w.g4(qh, 4 * k);
        }
      };
      if (type == GgmlType::Q4_K) return pack_blocks<ggml::BlockQ4_K>(src, row_bytes, n_rows, nb, bb, out, pack);
      return pack_blocks<ggml::BlockQ5_K>(src, row_bytes, n_rows, nb, bb, out, pack);
    }
    case GgmlType::Q6_K:
      return pack_blocks<ggml::BlockQ6_K>(src, row_bytes, n_rows, nb, bb, out, [](const auto& rows, Writer& w) {
        KV_X16_HALF(rows, d, d);
        KV_X16_FIELD(rows, ql, ql);
        KV_X16_FIELD(rows, qh, qh);
        w.d16(d);
        w.bytes(16, [&](int r, int s) { return rows.b[r]->scales[s]; });
        for (int h = 0; h < 2; ++h)
          for (int a = 0; a < 2; ++a)
            for (int k = 0; k < 8; ++k) w.g4(ql, 64 * h + 32 * a + 4 * k);
        for (int h = 0; h < 2; ++h)
          for (int k = 0; k < 8; ++k) w.g4(qh, 32 * h + 4 * k);
      });
    default:
      break;
  }
}

std::vector<uint8_t> x16_pack(GgmlType type, const uint8_t* data, int64_t rows, int64_t cols, int64_t row_bytes) {
  const int64_t gb = x16_group_bytes(type, cols), groups = (rows + kX16Rows - 1) / kX16Rows;
  std::vector<uint8_t> out(static_cast<size_t>(groups * gb));
  for (int64_t g = 0; g < groups; ++g) {
    const int n = static_cast<int>(std::min(kX16Rows, rows - g * kX16Rows));
    x16_pack_group(type, data + g * kX16Rows * row_bytes, row_bytes, n, cols, out.data() + g * gb);
  }
  return out;
}

void x16_attach(std::span<WeightView* const> views, std::vector<std::vector<uint8_t>>& storage, int threads,
                const std::function<void(const WeightView&)>& on_packed) {
  std::vector<WeightView*> todo;
  for (WeightView* v : views)
    if (x16_block_bytes(v->type) > 0) todo.push_back(v);
  std::vector<std::vector<uint8_t>> packed(todo.size());
  ThreadPool pool(threads);
  std::atomic<size_t> next{0};
  pool.parallel_for(pool.size(), [&](int64_t, int64_t) {
    for (size_t i = next.fetch_add(1); i < todo.size(); i = next.fetch_add(1)) {
      packed[i] = x16_pack(todo[i]->type, todo[i]->data, todo[i]->rows, todo[i]->cols, todo[i]->row_bytes);
      if (on_packed) on_packed(*todo[i]);
    }
  });
  for (size_t i = 0; i < todo.size(); ++i) {
    storage.push_back(std::move(packed[i]));
    todo[i]->x16 = storage.back().data();
  }
}

}  // namespace kvevict
