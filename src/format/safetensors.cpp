// Safetensors reader (see safetensors.h for the format and the error contract).
//
// The header is parsed with nlohmann-json's SAX interface into the format's fixed shape, so a
// header of any other shape is refused at the first wrong token (naming tensor and field),
// nesting is bounded (depth 3) before anything is built, and duplicate keys — which a DOM parse
// would silently collapse — are seen. Every size computed from the header is overflow-checked
// before use; a corrupt or hostile file yields a kvevict::Error, never an out-of-bounds read.
#include "format/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "util/error.h"

namespace kvevict {
namespace {

struct DtypeBits {
  const char* name;
  uint32_t bits;
};
// The spec's dtypes (safetensors README "Format" / src/tensor.rs Dtype).
constexpr DtypeBits kDtypes[] = {
    {"BOOL", 8}, {"U8", 8},   {"I8", 8},    {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"I16", 16},
    {"U16", 16}, {"F16", 16}, {"BF16", 16}, {"I32", 32},    {"U32", 32},    {"F32", 32},    {"F64", 64},
    {"I64", 64}, {"U64", 64}, {"C64", 64},  {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6},
};

using json = nlohmann::json;

// Builds the header's tensors and metadata from SAX events, refusing anything outside the
// format's shape: { name: {dtype: str, shape: [uint...], data_offsets: [uint, uint]}, ...,
// "__metadata__": {str: str, ...} }. Returns false (stopping the parse) after recording the
// first problem in `error`.
class HeaderSax {
 public:
  std::string error;
  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, std::string> metadata;

  bool null() { return bad_value("null"); }
  bool boolean(bool) { return bad_value("a boolean"); }
  bool number_integer(json::number_integer_t v) {
    if (v >= 0) return number_unsigned(static_cast<json::number_unsigned_t>(v));
    return bad_value(fmt::format("the negative number {}", v));
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (depth_ != 3) return bad_value("a number");
    if (v > static_cast<uint64_t>(INT64_MAX))
      return fail(fmt::format("{}: {} entry {} is too large", where(), field_, v));
    numbers_.push_back(v);
    return true;
  }
  bool number_float(json::number_float_t, const std::string& text) {
    return bad_value(fmt::format("the non-integer number {}", text));
  }
  bool string(std::string& s) {
    if (depth_ == 2 && in_metadata_) {
      metadata[key_] = s;
      return true;
    }
    if (depth_ == 2 && field_ == "dtype") {
      if (safetensors_dtype_bits(s) == 0)
        return fail(
            fmt::format("{}: unknown dtype '{}' (the format defines {})", where(), s, safetensors_dtype_names()));
      cur_.dtype = s;
      return true;
    }
    return bad_value("a string");
  }
  bool binary(json::binary_t&) { return bad_value("binary data"); }

  bool start_object(std::size_t) {
    if (depth_ == 0) {
      depth_ = 1;
      return true;
    }
    if (depth_ == 1) {
      depth_ = 2;
      in_metadata_ = name_ == "__metadata__";
      fields_.clear();
      cur_ = SafetensorsTensor{};
      cur_.name = name_;
      return true;
    }
    return bad_value("an object");
  }
  bool key(std::string& k) {
    if (depth_ == 1) {
      if (!names_.insert(k).second) return fail(fmt::format("duplicate key '{}' in the header", k));
      if (k.empty()) return fail("a tensor has an empty name");
      name_ = k;
      return true;
    }
    // depth 2: a field of a tensor, or a metadata key
    if (!fields_.insert(k).second) return fail(fmt::format("{}: duplicate key '{}'", where(), k));
    if (in_metadata_) {
      key_ = k;
      return true;
    }
    if (k != "dtype" && k != "shape" && k != "data_offsets")
      return fail(fmt::format("{}: unknown field '{}' (expected dtype, shape, data_offsets)", where(), k));
    field_ = k;
    return true;
  }
  bool end_object() {
    if (depth_ == 2) {
      depth_ = 1;
      if (in_metadata_) {
        in_metadata_ = false;
        return true;
      }
      for (const char* f : {"dtype", "shape", "data_offsets"})
        if (!fields_.count(f)) return fail(fmt::format("{}: missing field '{}'", where(), f));
      tensors.push_back(std::move(cur_));
      return true;
    }
    depth_ = 0;
    return true;
  }
  bool start_array(std::size_t) {
    if (depth_ != 2 || in_metadata_ || (field_ != "shape" && field_ != "data_offsets")) return bad_value("an array");
    depth_ = 3;
    numbers_.clear();
    return true;
  }
  bool end_array() {
    depth_ = 2;
    if (field_ == "shape") {
      cur_.shape.assign(numbers_.begin(), numbers_.end());
      return true;
    }
    if (numbers_.size() != 2)
      return fail(fmt::format("{}: data_offsets has {} entries, expected 2 [BEGIN, END]", where(), numbers_.size()));
    cur_.begin = numbers_[0];
    cur_.end = numbers_[1];
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
    // nlohmann's message already says "syntax error while parsing ... at line L, column C".
    std::string what = e.what();
    if (const size_t p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    return fail(fmt::format("header is not valid JSON (byte {} of the header): {}", position, what));
  }

 private:
  std::string where() const {
    return in_metadata_ ? std::string("__metadata__") : fmt::format("tensor '{}'", cur_.name);
  }
  bool fail(std::string msg) {
    if (error.empty()) error = std::move(msg);
    return false;
  }
  bool bad_value(const std::string& what) {
    if (depth_ == 0) return fail(fmt::format("header is {}, expected a JSON object", what));
    if (depth_ == 1) return fail(fmt::format("header entry '{}' is {}, expected an object", name_, what));
    if (in_metadata_) return fail(fmt::format("__metadata__ value of '{}' is {}, expected a string", key_, what));
    if (depth_ == 2 && field_ == "dtype") return fail(fmt::format("{}: dtype is {}, expected a string", where(), what));
    if (depth_ == 2) return fail(fmt::format("{}: {} is {}, expected an array of integers", where(), field_, what));
    return fail(fmt::format("{}: {} holds {}, expected non-negative integers", where(), field_, what));
  }

  int depth_ = 0;  // 0 outside, 1 in the header object, 2 in a tensor/metadata object, 3 in an array
  bool in_metadata_ = false;
  std::string name_, key_, field_;
  std::set<std::string> names_, fields_;
  SafetensorsTensor cur_;
  std::vector<uint64_t> numbers_;
};

}  // namespace

uint32_t safetensors_dtype_bits(std::string_view dtype) {
  for (const DtypeBits& d : kDtypes)
    if (dtype == d.name) return d.bits;
  return 0;
}

std::string safetensors_dtype_names() {
  std::string out;
  for (const DtypeBits& d : kDtypes) out += (out.empty() ? "" : ", ") + std::string(d.name);
  return out;
}

int64_t SafetensorsTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // cannot overflow: the reader checked the product
  return n;
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.file_ = MappedFile::open(path);
  f.parse();
  return f;
}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void SafetensorsFile::parse() {
  const std::string& p = path();
  const uint64_t size = file_.size();
  const uint8_t* base = file_.data();
  const auto fail = [&](const std::string& msg) -> void { throw Error(p + ": " + msg); };
  if (size < 8)
    fail(fmt::format("truncated file: {} bytes, but a safetensors file starts with an 8-byte header size", size));
  uint64_t n = 0;
  std::memcpy(&n, base, 8);  // little-endian hosts only (x86-64, as the kernels)
  if (n > kSafetensorsMaxHeader)
    fail(fmt::format("header size {} bytes exceeds the limit of {} bytes", n, kSafetensorsMaxHeader));
  if (n > size - 8) fail(fmt::format("header size {} bytes runs past the end of the file ({} bytes)", n, size));
  if (n < 2 || base[8] != '{')
    fail(fmt::format("header does not start with '{{' (header size {}); not a safetensors file", n));
  header_size_ = n;

  const char* hdr = reinterpret_cast<const char*>(base + 8);
  HeaderSax sax;
  const bool ok = json::sax_parse(hdr, hdr + n, &sax, nlohmann::detail::input_format_t::json, true, false);
  if (!ok || !sax.error.empty())
    fail(sax.error.empty() ? std::string("header is not a valid safetensors header") : sax.error);
  metadata_ = std::move(sax.metadata);
  tensors_ = std::move(sax.tensors);

  const uint64_t buffer = size - 8 - n;
  for (SafetensorsTensor& t : tensors_) {
    const std::string what = fmt::format("tensor '{}'", t.name);
    uint64_t elems = 1;
    for (size_t d = 0; d < t.shape.size(); ++d)
      if (__builtin_mul_overflow(elems, static_cast<uint64_t>(t.shape[d]), &elems) || elems > uint64_t{INT64_MAX})
        fail(fmt::format("{}: shape [{}] has too many elements (overflows 64 bits)", what, fmt::join(t.shape, ", ")));
    if (t.end < t.begin) fail(fmt::format("{}: data_offsets [{}, {}] end before they begin", what, t.begin, t.end));
    const uint64_t bits = safetensors_dtype_bits(t.dtype);
    uint64_t total_bits = 0;
    if (__builtin_mul_overflow(elems, bits, &total_bits))
      fail(fmt::format("{}: {} elements of {} overflow 64 bits", what, elems, t.dtype));
    if (total_bits % 8 != 0 || total_bits / 8 != t.end - t.begin)
      fail(fmt::format("{}: data_offsets [{}, {}] hold {} bytes, but shape [{}] of {} needs {}{}", what, t.begin, t.end,
                       t.end - t.begin, fmt::join(t.shape, ", "), t.dtype, total_bits / 8,
                       total_bits % 8 != 0 ? fmt::format(" and {} bits", total_bits % 8) : std::string()));
  }
  // The reference implementation's order: by (BEGIN, END); the buffer must be covered exactly.
  std::stable_sort(tensors_.begin(), tensors_.end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expect = 0;
  const SafetensorsTensor* prev = nullptr;
  for (const SafetensorsTensor& t : tensors_) {
    if (t.begin < expect)
      fail(fmt::format("tensors '{}' (data [{}, {}]) and '{}' (data [{}, {}]) overlap", prev->name, prev->begin,
                       prev->end, t.name, t.begin, t.end));
    if (t.begin > expect)
      fail(
          fmt::format("bytes [{}, {}) of the data buffer belong to no tensor (a hole before '{}'); the format "
                      "requires the buffer to be fully indexed",
                      expect, t.begin, t.name));
    expect = t.end;
    prev = &t;
  }
  if (expect != buffer)
    fail(fmt::format("the tensors cover {} bytes of data but the file holds {} bytes after the {}-byte header{}",
                     expect, buffer, n, expect > buffer ? " (truncated file)" : " (trailing bytes)"));
  for (size_t i = 0; i < tensors_.size(); ++i) {
    tensors_[i].data = base == nullptr ? nullptr : base + 8 + n + tensors_[i].begin;
    index_.emplace(tensors_[i].name, i);
  }
}

}  // namespace kvevict
