// Copies a GGUF file with changes (keys set or dropped, tensors dropped, added or replaced by
// float32 values or reshaped as zeros), so tests can make a bad or altered file from a valid synthetic one.
// Metadata values are copied by type (string, uint32, float32, bool, arrays of string / float32 /
// int32: every type the synthetic writer of model/synth.h emits).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "format/gguf.h"
#include "format/gguf_writer.h"

namespace kvevict::test {

/// One set of changes to a GGUF file.
struct GgufEdit {
  std::set<std::string> drop_keys{};
  std::map<std::string, uint32_t> set_uint{};
  std::map<std::string, float> set_float{};
  std::map<std::string, std::string> set_string{};
  std::set<std::string> drop_tensors{};
  /// Tensors written as 1-D float32 with these values (replacing a tensor of that name, or added).
  std::map<std::string, std::vector<float>> f32_tensors{};
  /// Tensors of this name rewritten as float32 zeros with these dims (a wrong shape for a test).
  std::map<std::string, std::vector<int64_t>> zero_tensors{};
};

inline void copy_gguf_value(GgufWriter& w, const std::string& key, const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::STRING:
      w.add_string(key, std::get<std::string>(v.scalar));
      break;
    case GgufValueType::UINT32:
      w.add_uint32(key, static_cast<uint32_t>(std::get<uint64_t>(v.scalar)));
      break;
    case GgufValueType::FLOAT32:
      w.add_float32(key, static_cast<float>(std::get<double>(v.scalar)));
      break;
    case GgufValueType::BOOL:
      w.add_bool(key, std::get<bool>(v.scalar));
      break;
    case GgufValueType::ARRAY: {
      if (v.elem_type == GgufValueType::STRING) {
        std::vector<std::string> a;
        for (const auto& e : v.array) a.push_back(std::get<std::string>(e.scalar));
        w.add_string_array(key, a);
      } else if (v.elem_type == GgufValueType::FLOAT32) {
        std::vector<float> a;
        for (const auto& e : v.array) a.push_back(static_cast<float>(std::get<double>(e.scalar)));
        w.add_float32_array(key, a);
      } else {
        std::vector<int32_t> a;
        for (const auto& e : v.array) a.push_back(static_cast<int32_t>(std::get<int64_t>(e.scalar)));
        w.add_int32_array(key, a);
      }
      break;
    }
    default:
      ADD_FAILURE() << "unexpected metadata type for " << key;
  }
}

/// Writes `src` with `e` applied to `dst`.
inline void rewrite_gguf(const std::string& src, const std::string& dst, const GgufEdit& e) {
  const GgufFile f = GgufFile::open(src);
  GgufWriter w;
  for (const auto& [key, v] : f.metadata()) {
    if (e.drop_keys.count(key) || e.set_uint.count(key) || e.set_float.count(key) || e.set_string.count(key)) continue;
    copy_gguf_value(w, key, v);
  }
  for (const auto& [k, v] : e.set_uint) w.add_uint32(k, v);
  for (const auto& [k, v] : e.set_float) w.add_float32(k, v);
  for (const auto& [k, v] : e.set_string) w.add_string(k, v);
  const auto add_f32 = [&](const std::string& name, const std::vector<float>& vals) {
    w.add_tensor(name, {static_cast<int64_t>(vals.size())}, GgmlType::F32,
                 [vals](uint8_t* out, int64_t n) { std::memcpy(out, vals.data(), static_cast<size_t>(n)); });
  };
  for (const GgufTensor& t : f.tensors()) {
    if (e.drop_tensors.count(t.name)) continue;
    if (const auto it = e.zero_tensors.find(t.name); it != e.zero_tensors.end()) {
      w.add_tensor(t.name, it->second, GgmlType::F32, [](uint8_t* out, int64_t n) { std::fill(out, out + n, 0); });
      continue;
    }
    if (const auto it = e.f32_tensors.find(t.name); it != e.f32_tensors.end()) {
      add_f32(t.name, it->second);
      continue;
    }
    const uint8_t* data = t.data;
    w.add_tensor(t.name, t.dims, t.ggml_type(), [data](uint8_t* out, int64_t n) { std::copy(data, data + n, out); });
  }
  for (const auto& [name, vals] : e.f32_tensors)
    if (!f.find_tensor(name)) add_f32(name, vals);
  w.write(dst);
}

}  // namespace kvevict::test
