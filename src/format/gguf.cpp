// GGUF v2/v3 reader: see gguf.h for the layout and the error contract.
//
// The file is mapped read-only and parsed through a bounds-checked cursor; tensor data is never
// copied. Every size computed from file contents is checked for overflow before it is used, so
// a corrupt or hostile file yields a kvevict::Error, never an out-of-bounds read.
#include "format/gguf.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string_view>
#include <utility>

#include "util/error.h"
#include "util/utf8.h"

namespace kvevict {
namespace {

constexpr uint64_t kDefaultAlignment = 32;  // spec: used when general.alignment is absent
constexpr uint32_t kMaxDims = 4;            // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 16;          // deeper nesting is corruption, and would blow the stack
// Spec: general.alignment "must be a multiple of 8"; ggml also needs a power of two. The upper
// bound is ours: 64 KiB covers every page size, and larger is only padding (or a corrupt file).
constexpr uint64_t kMinAlignment = 8;
constexpr uint64_t kMaxAlignment = 65536;

// Keys whose array element type is fixed (llama.cpp's reader asserts these types too); any
// other element type is refused rather than converted, so a u8 score table cannot load.
struct TypedArrayKey {
  const char* key;
  GgufValueType elem;
};
constexpr TypedArrayKey kTypedArrays[] = {
    {"tokenizer.ggml.tokens", GgufValueType::STRING},       {"tokenizer.ggml.scores", GgufValueType::FLOAT32},
    {"tokenizer.ggml.token_type", GgufValueType::INT32},    {"tokenizer.ggml.merges", GgufValueType::STRING},
    {"tokenizer.ggml.added_tokens", GgufValueType::STRING},
};

template <class... A>
std::string cat(const A&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

uint64_t saturating_add(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

bool valid_value_type(uint32_t id) { return id <= static_cast<uint32_t>(GgufValueType::FLOAT64); }

// Smallest encoding of one value of type t: lets us reject element counts that cannot fit.
uint64_t min_value_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::UINT8:
    case GgufValueType::INT8:
    case GgufValueType::BOOL:
      return 1;
    case GgufValueType::UINT16:
    case GgufValueType::INT16:
      return 2;
    case GgufValueType::UINT32:
    case GgufValueType::INT32:
    case GgufValueType::FLOAT32:
      return 4;
    case GgufValueType::STRING:
      return 8;  // length prefix
    case GgufValueType::ARRAY:
      return 12;  // element type + count
    default:
      return 8;  // 64-bit scalars
  }
}

bool is_unsigned(GgufValueType t) {
  return t == GgufValueType::UINT8 || t == GgufValueType::UINT16 || t == GgufValueType::UINT32 ||
      t == GgufValueType::UINT64;
}
bool is_signed(GgufValueType t) {
  return t == GgufValueType::INT8 || t == GgufValueType::INT16 || t == GgufValueType::INT32 ||
      t == GgufValueType::INT64;
}
bool is_float(GgufValueType t) { return t == GgufValueType::FLOAT32 || t == GgufValueType::FLOAT64; }

std::string describe(const GgufValue& v) {
  return v.type == GgufValueType::ARRAY ? "array of " + gguf_value_type_name(v.elem_type)
                                        : gguf_value_type_name(v.type);
}

// Bounds-checked little-endian cursor over the mapping. `context` names the structure being
// parsed ("header", "key 'x'", "tensor 'y'") so errors can say where the file went wrong.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* base, uint64_t size) : path_(path), base_(base), size_(size) {}

  uint64_t pos() const { return pos_; }
  std::string context = "the header";

  [[noreturn]] void fail(const std::string& msg) const { throw Error(path_ + ": " + msg); }

  void need(uint64_t n, const char* what) const {
    if (n > size_ - pos_) {
      fail(cat("truncated file: reading the ", what, " of ", context, " needs ", n, " bytes at byte offset ", pos_,
               " but the file size is ", size_));
    }
  }

  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));  // memcpy: the file gives no alignment guarantee
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const char* what) {
    const uint64_t at = pos_;
    const uint64_t len = read<uint64_t>(what);
    if (len > size_) {
      fail(cat("truncated or corrupt file: string length ", len, " of the ", what, " of ", context, " at byte offset ",
               at, " exceeds the file size ", size_));
    }
    need(len, what);
    std::string s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }

  // Rejects a count that could not fit in the whole file even at `min_bytes` per item;
  // returns a safe capacity hint for reserve().
  uint64_t check_count(uint64_t count, uint64_t min_bytes, const char* what, uint64_t at) const {
    if (count > size_ / min_bytes) {
      fail(cat("truncated or corrupt file: ", what, " ", count, " of ", context, " at byte offset ", at,
               " needs at least ", min_bytes, " bytes per item, more than the file size ", size_, " allows"));
    }
    return std::min(count, (size_ - pos_) / min_bytes);
  }

  GgufValueType read_value_type(const char* what) {
    const uint64_t at = pos_;
    const uint32_t id = read<uint32_t>(what);
    if (!valid_value_type(id)) fail(cat(context, " has unknown ", what, " id ", id, " at byte offset ", at));
    return static_cast<GgufValueType>(id);
  }

  GgufValue read_value(GgufValueType type, int depth) {
    GgufValue v;
    v.type = type;
    switch (type) {
      case GgufValueType::UINT8:
        v.scalar = uint64_t{read<uint8_t>("uint8 value")};
        break;
      case GgufValueType::INT8:
        v.scalar = int64_t{read<int8_t>("int8 value")};
        break;
      case GgufValueType::UINT16:
        v.scalar = uint64_t{read<uint16_t>("uint16 value")};
        break;
      case GgufValueType::INT16:
        v.scalar = int64_t{read<int16_t>("int16 value")};
        break;
      case GgufValueType::UINT32:
        v.scalar = uint64_t{read<uint32_t>("uint32 value")};
        break;
      case GgufValueType::INT32:
        v.scalar = int64_t{read<int32_t>("int32 value")};
        break;
      case GgufValueType::UINT64:
        v.scalar = read<uint64_t>("uint64 value");
        break;
      case GgufValueType::INT64:
        v.scalar = read<int64_t>("int64 value");
        break;
      case GgufValueType::FLOAT32:
        v.scalar = double{read<float>("float32 value")};
        break;
      case GgufValueType::FLOAT64:
        v.scalar = read<double>("float64 value");
        break;
      case GgufValueType::BOOL:
        v.scalar = read<uint8_t>("bool value") != 0;
        break;
      case GgufValueType::STRING:
        v.scalar = read_string("string value");
        break;
      case GgufValueType::ARRAY: {
        if (depth >= kMaxArrayDepth) fail(cat(context, " nests arrays deeper than ", kMaxArrayDepth, " levels"));
        v.elem_type = read_value_type("array element type");
        const uint64_t at = pos_;
        const uint64_t n = read<uint64_t>("array length");
        v.array.reserve(check_count(n, min_value_bytes(v.elem_type), "array length", at));
        for (uint64_t i = 0; i < n; ++i) v.array.push_back(read_value(v.elem_type, depth + 1));
        break;
      }
    }
    return v;
  }

 private:
  const std::string& path_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

}  // namespace

std::string gguf_value_type_name(GgufValueType t) {
  static const char* const kNames[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                       "bool",  "string", "array",  "uint64", "int64",  "float64"};
  const auto id = static_cast<uint32_t>(t);
  return valid_value_type(id) ? kNames[id] : "type#" + std::to_string(id);
}

int64_t GgufTensor::n_elements() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;  // cannot overflow: the reader checked the product
  return n;
}

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.path_ = path;
  f.file_ = MappedFile::open(path);
  f.base_ = f.file_.data();  // nullptr for an empty file, which parse() reports as truncated
  f.size_ = f.file_.size();
  f.parse();  // on throw, f's destructor unmaps
  return f;
}

void GgufFile::release(const void* p, uint64_t n) const {
  const auto* b = static_cast<const uint8_t*>(p);
  if (!base_ || b < base_ || n > size_ || b - base_ > static_cast<std::ptrdiff_t>(size_ - n)) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t first = (reinterpret_cast<uintptr_t>(b) + page - 1) / page * page;
  const uintptr_t last = (reinterpret_cast<uintptr_t>(b) + n) / page * page;
  // Advice only: a failure leaves the pages resident, which is what not asking would do.
  if (first < last) (void)madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void GgufFile::parse() {
  Cursor c(path_, base_, size_);
  c.need(4, "magic");
  if (std::memcmp(base_, "GGUF", 4) != 0) {
    char got[16];
    std::snprintf(got, sizeof got, "%02x %02x %02x %02x", base_[0], base_[1], base_[2], base_[3]);
    c.fail(cat("not a GGUF file: magic bytes are ", got, ", expected 47 47 55 46 (\"GGUF\")"));
  }
  c.read<uint32_t>("magic");
  version_ = c.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3) {
    // A byte-swapped small number means a big-endian file, which the spec allows from v3 on.
    const std::string hint = (version_ & 0xFFFFu) == 0 ? " (looks like a big-endian file)" : "";
    c.fail(cat("unsupported GGUF version ", version_, hint, " (supported: 2, 3)"));
  }
  uint64_t at = c.pos();
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  c.check_count(n_tensors, 32, "tensor count", at);  // smallest tensor info: 1 dim, empty name
  at = c.pos();
  const uint64_t n_kv = c.read<uint64_t>("metadata key/value count");
  c.check_count(n_kv, 13, "metadata key/value count", at);  // empty key + type + 1-byte value

  for (uint64_t i = 0; i < n_kv; ++i) {
    c.context = cat("metadata entry #", i);
    std::string key = c.read_string("key");
    if (key.empty()) c.fail(cat(c.context, " has an empty key"));
    if (!utf8_valid(key)) c.fail(cat(c.context, " has a key that is not valid UTF-8"));
    c.context = "key '" + key + "'";
    const GgufValueType type = c.read_value_type("value type");
    GgufValue value = c.read_value(type, 0);
    if (!kv_.emplace(key, std::move(value)).second) c.fail("duplicate metadata " + c.context);
  }

  tensors_.reserve(std::min<uint64_t>(n_tensors, (size_ - c.pos()) / 32));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensor t;
    c.context = cat("tensor info #", i);
    t.name = c.read_string("name");
    if (t.name.empty()) c.fail(cat(c.context, " has an empty name"));
    if (!utf8_valid(t.name)) c.fail(cat(c.context, " has a name that is not valid UTF-8"));
    c.context = "tensor '" + t.name + "'";
    const uint32_t n_dims = c.read<uint32_t>("n_dims");
    if (n_dims == 0 || n_dims > kMaxDims)
      c.fail(cat(c.context, " has n_dims ", n_dims, " (must be 1..", kMaxDims, ")"));
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = c.read<uint64_t>("dimension");
      if (dim > static_cast<uint64_t>(INT64_MAX)) c.fail(cat(c.context, " has absurd dimension ", d, " = ", dim));
      if (dim == 0) c.fail(cat(c.context, " has dimension ", d, " = 0 (every dimension must be >= 1)"));
      t.dims.push_back(static_cast<int64_t>(dim));
    }
    t.type = c.read<uint32_t>("type");
    t.offset = c.read<uint64_t>("data offset");
    if (!ggml_type_supported(t.type)) {
      c.fail(cat(c.context, " has type ", ggml_type_name(t.type), " (id ", t.type,
                 "), which kvevict does not support (supported: ", ggml_supported_type_names(), ")"));
    }
    if (!tensor_index_.emplace(t.name, tensors_.size()).second) c.fail("duplicate " + c.context);
    tensors_.push_back(std::move(t));
  }

  if (has("general.alignment")) {
    alignment_ = get_uint("general.alignment");
    if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0 || alignment_ < kMinAlignment ||
        alignment_ > kMaxAlignment) {
      c.fail(cat("general.alignment = ", alignment_, " must be a power of two from ", kMinAlignment, " to ",
                 kMaxAlignment, " (GGUF spec: a multiple of 8)"));
    }
  } else {
    alignment_ = kDefaultAlignment;
  }
  // Data starts at the end of the tensor infos rounded up to the alignment (saturating: a huge
  // alignment then simply puts every tensor outside the file).
  data_offset_ = saturating_add(c.pos(), alignment_ - 1) & ~(alignment_ - 1);

  for (GgufTensor& t : tensors_) {
    const std::string what = "tensor '" + t.name + "'";
    if (t.offset % alignment_ != 0) {
      c.fail(cat(what, " data offset ", t.offset, " is not a multiple of the alignment ", alignment_));
    }
    const auto type = t.ggml_type();
    if (t.dims[0] % ggml_block_elems(type) != 0) {
      c.fail(cat(what, " dims[0] = ", t.dims[0], " is not a multiple of the ", ggml_type_name(t.type), " block size ",
                 ggml_block_elems(type)));
    }
    // Elements and bytes must both fit in int64 (4 bytes per element bounds every supported type).
    int64_t n_elems = t.dims[0];
    for (size_t d = 1; d < t.dims.size(); ++d) {
      if (__builtin_mul_overflow(n_elems, t.dims[d], &n_elems)) n_elems = INT64_MAX;
    }
    if (n_elems > INT64_MAX / 4) c.fail(cat(what, " has too many elements (size overflows 64 bits)"));
    t.n_bytes = ggml_row_bytes(type, t.dims[0]) * (t.dims[0] == 0 ? 0 : n_elems / t.dims[0]);
    const uint64_t begin = saturating_add(data_offset_, t.offset);
    const uint64_t end = saturating_add(begin, static_cast<uint64_t>(t.n_bytes));
    if (end > size_) c.fail(cat(what, " data [", begin, ", ", end, ") lies outside the file (size ", size_, ")"));
    t.data = base_ + begin;
  }
  // No two tensors may share bytes (a retyped tensor inside another's bytes would load garbage).
  std::vector<const GgufTensor*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const GgufTensor& t : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensor& a = *by_offset[i - 1];
    const GgufTensor& b = *by_offset[i];
    if (a.offset + static_cast<uint64_t>(a.n_bytes) > b.offset) {
      c.fail(cat("tensors '", a.name, "' (data [", a.offset, ", ", a.offset + static_cast<uint64_t>(a.n_bytes),
                 ")) and '", b.name, "' (data [", b.offset, ", ", b.offset + static_cast<uint64_t>(b.n_bytes),
                 ")) overlap (offsets relative to the data section)"));
    }
  }
  for (const TypedArrayKey& k : kTypedArrays) {
    const auto it = kv_.find(k.key);
    if (it == kv_.end()) continue;
    const GgufValue& v = it->second;
    if (v.type != GgufValueType::ARRAY || v.elem_type != k.elem) {
      c.fail(cat("key '", k.key, "' has type ", describe(v), ", the spec requires array of ",
                 gguf_value_type_name(k.elem)));
    }
  }
}

GgufFile::GgufFile(GgufFile&& o) noexcept { *this = std::move(o); }

GgufFile& GgufFile::operator=(GgufFile&& o) noexcept {
  if (this != &o) {
    path_ = std::move(o.path_);
    file_ = std::move(o.file_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    version_ = o.version_;
    alignment_ = o.alignment_;
    data_offset_ = o.data_offset_;
    kv_ = std::move(o.kv_);
    tensors_ = std::move(o.tensors_);  // data pointers stay valid: the mapping moved with them
    tensor_index_ = std::move(o.tensor_index_);
  }
  return *this;
}

GgufFile::~GgufFile() = default;

const GgufValue& GgufFile::get(const std::string& key) const {
  auto it = kv_.find(key);
  if (it == kv_.end()) throw Error(path_ + ": missing required key '" + key + "'");
  return it->second;
}

namespace {
[[noreturn]] void wrong_type(const std::string& path, const std::string& key, const GgufValue& v,
                             const std::string& expected) {
  throw Error(path + ": key '" + key + "' has type " + describe(v) + ", expected " + expected);
}

// Numeric scalar as double (integers convert; 64-bit ones may round).
double as_double(const GgufValue& v) {
  if (is_unsigned(v.type)) return static_cast<double>(std::get<uint64_t>(v.scalar));
  if (is_signed(v.type)) return static_cast<double>(std::get<int64_t>(v.scalar));
  return std::get<double>(v.scalar);
}
}  // namespace

std::string GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufValueType::STRING) wrong_type(path_, key, v, "string");
  return std::get<std::string>(v.scalar);
}

uint64_t GgufFile::get_uint(const std::string& key) const {
  const GgufValue& v = get(key);
  if (is_unsigned(v.type)) return std::get<uint64_t>(v.scalar);
  if (!is_signed(v.type)) wrong_type(path_, key, v, "an unsigned integer");
  const int64_t s = std::get<int64_t>(v.scalar);
  if (s < 0) throw Error(cat(path_, ": key '", key, "' = ", s, " is negative, expected an unsigned integer"));
  return static_cast<uint64_t>(s);
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = get(key);
  if (!is_float(v.type) && !is_unsigned(v.type) && !is_signed(v.type)) wrong_type(path_, key, v, "a number");
  return as_double(v);
}

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufValueType::ARRAY || v.elem_type != GgufValueType::STRING)
    wrong_type(path_, key, v, "array of string");
  std::vector<std::string> out;
  out.reserve(v.array.size());
  for (const GgufValue& e : v.array) out.push_back(std::get<std::string>(e.scalar));
  return out;
}

std::vector<float> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = get(key);
  const GgufValueType et = v.elem_type;
  if (v.type != GgufValueType::ARRAY || !(is_float(et) || is_unsigned(et) || is_signed(et))) {
    wrong_type(path_, key, v, "array of numbers");
  }
  std::vector<float> out;
  out.reserve(v.array.size());
  for (const GgufValue& e : v.array) out.push_back(static_cast<float>(as_double(e)));
  return out;
}

std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = get(key);
  if (v.type != GgufValueType::ARRAY || !(is_unsigned(v.elem_type) || is_signed(v.elem_type))) {
    wrong_type(path_, key, v, "array of integers");
  }
  std::vector<int64_t> out;
  out.reserve(v.array.size());
  for (const GgufValue& e : v.array) {
    if (is_signed(e.type)) {
      out.push_back(std::get<int64_t>(e.scalar));
      continue;
    }
    const uint64_t u = std::get<uint64_t>(e.scalar);
    if (u > static_cast<uint64_t>(INT64_MAX))
      throw Error(cat(path_, ": key '", key, "' element ", u, " exceeds int64"));
    out.push_back(static_cast<int64_t>(u));
  }
  return out;
}

uint64_t GgufFile::get_uint_or(const std::string& key, uint64_t fallback) const {
  return has(key) ? get_uint(key) : fallback;
}

double GgufFile::get_float_or(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

const GgufTensor* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  const GgufTensor* t = find_tensor(name);
  if (t == nullptr) throw Error(path_ + ": missing tensor '" + name + "'");
  return *t;
}

}  // namespace kvevict
