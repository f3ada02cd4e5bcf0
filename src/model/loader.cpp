#include "model/model.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <set>

#include "kernels/x16.h"
#include "model/load_common.h"
#include "util/error.h"

namespace kvevict {
namespace {

// Reads tensors by name and remembers which were read, so tensors the architecture does not
// use are refused instead of silently ignored (llama.cpp refuses them too). Messages name each
// tensor as stored: GGUF names and order (cols, rows) for GGUF files, the Hugging Face name and
// row-major shape for safetensors.
class TensorReader {
 public:
  // `where` names the model in "missing tensor" messages; `stored_name` maps an asked-for name
  // to the name it would have in the files.
  TensorReader(const std::vector<TensorEntry>& tensors, std::string where,
               std::function<std::string(const std::string&)> stored_name)
      : tensors_(tensors), where_(std::move(where)), stored_name_(std::move(stored_name)) {
    for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  }

  bool has(const std::string& name) const { return index_.count(name) != 0; }

  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols) {
    const TensorEntry& t = get(name);
    if (t.dims.size() != 2 || t.dims[0] != cols || t.dims[1] != rows) {
      if (t.row_major)
        throw Error(fmt::format("{}: tensor '{}' has shape [{}], expected [{}, {}]", t.file, t.stored_name,
                                fmt::join(t.dims.rbegin(), t.dims.rend(), ", "), rows, cols));
      throw Error(fmt::format("{}: tensor '{}' has shape [{}], expected [{}, {}] (GGUF order: cols, rows)", t.file,
                              t.stored_name, fmt::join(t.dims, ", "), cols, rows));
    }
    WeightMatrix m;
    m.type = computable(t);
    m.data = t.data;
    m.rows = rows;
    m.cols = cols;
    m.row_bytes = ggml_row_bytes(m.type, cols);
    return m;
  }

  std::vector<float> vector_f32(const std::string& name, int64_t n) {
    const TensorEntry& t = get(name);
    int64_t elems = 1;
    for (const int64_t d : t.dims) elems *= d;
    if (elems != n)
      throw Error(fmt::format("{}: tensor '{}' has {} elements, expected {}", t.file, t.stored_name, elems, n));
    std::vector<float> out(static_cast<size_t>(n));
    dequantize_row(computable(t), t.data, out.data(), n);
    return out;
  }

  /// Rows of `name` as given (for the vocabulary size).
  int64_t rows_of(const std::string& name) const {
    const TensorEntry& t = find(name);
    if (t.dims.size() != 2) throw Error(fmt::format("{}: tensor '{}' is not 2-D", t.file, t.stored_name));
    return t.dims[1];
  }

  /// Throws naming the first stored tensor that no read asked for.
  void check_all_used(const std::string& arch) const {
    for (const TensorEntry& t : tensors_)
      if (!used_.count(t.name))
        throw Error(fmt::format("{}: tensor '{}' is not used by architecture '{}' (refused rather than ignored)",
                                t.file, t.stored_name, arch));
  }

 private:
  const TensorEntry& find(const std::string& name) const {
    const auto it = index_.find(name);
    if (it == index_.end()) throw Error(fmt::format("{}: missing tensor '{}'", where_, stored_name_(name)));
    return tensors_[it->second];
  }
  const TensorEntry& get(const std::string& name) {
    used_.insert(name);
    return find(name);
  }
  static GgmlType computable(const TensorEntry& t) {
    if (!t.type)
      throw Error(fmt::format("{}: tensor '{}' has dtype {}; kvevict computes with F32, F16 and BF16 weights", t.file,
                              t.stored_name, t.dtype));
    return *t.type;
  }
  const std::vector<TensorEntry>& tensors_;
  std::string where_;
  std::function<std::string(const std::string&)> stored_name_;
  std::map<std::string, size_t> index_;
  std::set<std::string> used_;
};

// Rows [r0, r0 + n) of a fused weight as a weight of its own (no copy).
WeightMatrix row_range(const WeightMatrix& w, int64_t r0, int64_t n) {
  WeightMatrix out = w;
  out.data = w.data + r0 * w.row_bytes;
  out.rows = n;
  return out;
}

// One block's weights; fused tensors are split into views, optional tensors read when present.
LayerWeights load_layer(TensorReader& tr, const ModelConfig& c, const ArchInfo& arch, int l) {
  const int64_t qd = int64_t{c.n_heads} * c.head_dim, kvd = int64_t{c.n_kv_heads} * c.head_dim;
  const std::string p = fmt::format("blk.{}.", l);
  LayerWeights L;
  L.attn_norm = tr.vector_f32(p + "attn_norm.weight", c.dim);
  if (arch.fused_qkv) {
    const WeightMatrix qkv = tr.matrix(p + "attn_qkv.weight", qd + 2 * kvd, c.dim);
    L.wq = row_range(qkv, 0, qd);
    L.wk = row_range(qkv, qd, kvd);
    L.wv = row_range(qkv, qd + kvd, kvd);
  } else {
    L.wq = tr.matrix(p + "attn_q.weight", qd, c.dim);
    L.wk = tr.matrix(p + "attn_k.weight", kvd, c.dim);
    L.wv = tr.matrix(p + "attn_v.weight", kvd, c.dim);
  }
  const bool bias =
      arch.qkv_bias == TensorUse::Required || (arch.qkv_bias == TensorUse::Optional && tr.has(p + "attn_q.bias"));
  if (bias) {
    L.bq = tr.vector_f32(p + "attn_q.bias", qd);
    L.bk = tr.vector_f32(p + "attn_k.bias", kvd);
    L.bv = tr.vector_f32(p + "attn_v.bias", kvd);
  }
  if (arch.qk_norm) {
    L.q_norm = tr.vector_f32(p + "attn_q_norm.weight", c.head_dim);
    L.k_norm = tr.vector_f32(p + "attn_k_norm.weight", c.head_dim);
  }
  L.wo = tr.matrix(p + "attn_output.weight", c.dim, qd);
  L.ffn_norm = tr.vector_f32(p + "ffn_norm.weight", c.dim);
  if (arch.fused_gate_up) {
    const WeightMatrix gate_up = tr.matrix(p + "ffn_up.weight", 2 * int64_t{c.hidden_dim}, c.dim);
    L.w_gate = row_range(gate_up, 0, c.hidden_dim);
    L.w_up = row_range(gate_up, c.hidden_dim, c.hidden_dim);
  } else {
    L.w_gate = tr.matrix(p + "ffn_gate.weight", c.hidden_dim, c.dim);
    L.w_up = tr.matrix(p + "ffn_up.weight", c.hidden_dim, c.dim);
  }
  L.w_down = tr.matrix(p + "ffn_down.weight", c.dim, c.hidden_dim);
  return L;
}

int positive(const GgufFile& f, const std::string& key) {
  const uint64_t v = f.get_uint(key);
  if (v == 0 || v > (1u << 30))
    throw Error(fmt::format("{}: key '{}' = {} is out of range (1 .. 2^30)", f.path(), key, v));
  return static_cast<int>(v);
}

}  // namespace

const Tokenizer& Model::tokenizer() const {
  if (!tokenizer_) throw Error(fmt::format("{}: model was loaded without its tokenizer", path_));
  return *tokenizer_;
}

// Shape keys of `<arch>.*` and the keys that change the computation in ways not implemented.
void Model::read_config() {
  const GgufFile& f = *gguf_;
  const std::string& path = f.path();
  ModelConfig& c = config_;
  arch_ = &arch_info(f.get_string("general.architecture"), path);
  c.arch = arch_->name;
  const std::string a = c.arch + ".";
  c.dim = positive(f, a + "embedding_length");
  c.n_layers = positive(f, a + "block_count");
  c.n_heads = positive(f, a + "attention.head_count");
  c.n_kv_heads = f.has(a + "attention.head_count_kv") ? positive(f, a + "attention.head_count_kv") : c.n_heads;
  c.hidden_dim = positive(f, a + "feed_forward_length");
  c.context_length = positive(f, a + "context_length");
  c.rms_eps = static_cast<float>(f.get_float(a + "attention.layer_norm_rms_epsilon"));
  c.rope_theta = static_cast<float>(f.get_float_or(a + "rope.freq_base", 10000.0));
  if (!(std::isfinite(c.rms_eps) && c.rms_eps > 0.0f && c.rms_eps < 1.0f))
    throw Error(fmt::format("{}: {}attention.layer_norm_rms_epsilon = {} must be a finite value in (0, 1)", path, a,
                            c.rms_eps));
  if (!(std::isfinite(c.rope_theta) && c.rope_theta > 1.0f))
    throw Error(fmt::format("{}: {}rope.freq_base = {} must be a finite value > 1", path, a, c.rope_theta));
  if (c.n_heads % c.n_kv_heads != 0)
    throw Error(fmt::format("{}: inconsistent heads: {}attention.head_count {} is not a multiple of head_count_kv {}",
                            path, a, c.n_heads, c.n_kv_heads));
  if (f.has(a + "attention.key_length")) {
    c.head_dim = positive(f, a + "attention.key_length");
  } else {
    if (c.dim % c.n_heads != 0)
      throw Error(
          fmt::format("{}: inconsistent heads: {}embedding_length {} is not a multiple of head_count {} "
                      "and there is no {}attention.key_length",
                      path, a, c.dim, c.n_heads, a));
    c.head_dim = c.dim / c.n_heads;
  }
  if (f.has(a + "attention.value_length") &&
      f.get_uint(a + "attention.value_length") != static_cast<uint64_t>(c.head_dim))
    throw Error(fmt::format("{}: {}attention.value_length = {} differs from the key head_dim {} (not supported)", path,
                            a, f.get_uint(a + "attention.value_length"), c.head_dim));
  if (c.head_dim % 2 != 0) throw Error(fmt::format("{}: head dimension {} is odd; RoPE needs pairs", path, c.head_dim));
  if (f.has(a + "expert_count") && f.get_uint(a + "expert_count") > 0)
    throw Error(fmt::format("{}: {}expert_count = {}: mixture-of-experts models are not supported", path, a,
                            f.get_uint(a + "expert_count")));
  // Keys of other llama.cpp architectures that would change the computation if they appeared.
  for (const char* k : {"attention.clamp_kqv", "attention.scale", "logit_scale", "attn_logit_softcapping",
                        "final_logit_softcapping", "residual_scale", "embedding_scale"})
    if (f.has(a + k)) throw Error(fmt::format("{}: key '{}{}' is not implemented for '{}'", path, a, k, c.arch));
  if (f.has(a + "attention.sliding_window")) {
    if (!arch_->ignore_sliding_window)
      throw Error(fmt::format("{}: {}attention.sliding_window = {}: sliding-window attention is not implemented", path,
                              a, f.get_uint(a + "attention.sliding_window")));
    // llama.cpp runs such a family (phi3) with full attention and says so; we do the same.
    warnings_.push_back(
        fmt::format("{}: {}attention.sliding_window = {} ignored: full attention over the whole "
                    "context, as llama.cpp does for {}",
                    path, a, f.get_uint(a + "attention.sliding_window"), c.arch));
  }
}

// RoPE: style from the architecture, rotated dims, linear scaling, attention factor; refuses the
// scaling types that are not implemented, naming the key. Factor tensors (rope_freqs, LongRoPE)
// are read in load() through the TensorReader.
void Model::read_rope() {
  const GgufFile& f = *gguf_;
  const std::string& path = f.path();
  ModelConfig& c = config_;
  const std::string a = c.arch + ".";
  RopeConfig& r = c.rope;
  r.head_dim = c.head_dim;
  r.theta = c.rope_theta;
  r.style = arch_->rope_style;
  const uint64_t n_rot = f.get_uint_or(a + "rope.dimension_count", static_cast<uint64_t>(c.head_dim));
  if (n_rot == 0 || n_rot > static_cast<uint64_t>(c.head_dim) || n_rot % 2 != 0)
    throw Error(fmt::format("{}: {}rope.dimension_count = {} must be even and in [2, head_dim {}]", path, a, n_rot,
                            c.head_dim));
  r.n_rot = static_cast<int>(n_rot);
  // llama.cpp's default scaling type is linear; a factor of 0 or 1 means none. "longrope" is
  // accepted when the factor tensors are there (checked in load()); converted Phi-3.5 files
  // state no type at all.
  const std::string type = f.has(a + "rope.scaling.type") ? f.get_string(a + "rope.scaling.type") : "linear";
  if (type != "none" && type != "linear" && type != "longrope")
    throw Error(fmt::format("{}: {}rope.scaling.type = '{}' is not implemented (supported: none, linear, longrope)",
                            path, a, type));
  double factor = f.get_float_or(a + "rope.scaling.factor", f.get_float_or(a + "rope.scale_linear", 0.0));
  if (type == "none") factor = 0.0;
  if (!(std::isfinite(factor) && factor >= 0.0))
    throw Error(fmt::format("{}: {}rope.scaling.factor = {} must be a finite value >= 0", path, a, factor));
  r.freq_scale = factor == 0.0 ? 1.0 : 1.0 / factor;
  // llama.cpp multiplies cos/sin by this for every file that states it (cparams.yarn_attn_factor
  // *= hparams.rope_attn_factor; ext_factor is 0 outside yarn, so nothing else scales them).
  r.attn_factor = f.get_float_or(a + "rope.scaling.attn_factor", 1.0);
  if (!(std::isfinite(r.attn_factor) && r.attn_factor > 0.0))
    throw Error(fmt::format("{}: {}rope.scaling.attn_factor = {} must be a finite value > 0", path, a, r.attn_factor));
}

namespace {

// One LongRoPE factor set: n_rot / 2 finite positive divisors.
std::vector<float> read_factor_set(TensorReader& tr, const std::string& path, const char* name, int n_rot) {
  std::vector<float> v;
  try {
    v = tr.vector_f32(name, n_rot / 2);
  } catch (const Error& e) {
    throw Error(
        fmt::format("{} (LongRoPE factors: one per rotated band, rope.dimension_count {} / 2)", e.what(), n_rot));
  }
  for (size_t i = 0; i < v.size(); ++i)
    if (!(std::isfinite(v[i]) && v[i] > 0.0f))
      throw Error(fmt::format("{}: tensor '{}' holds {} at band {}; LongRoPE factors must be finite and > 0", path,
                              name, v[i], i));
  return v;
}

// LongRoPE (phi3): both factor sets, the original context length, and the set for the context
// size the model runs with (LongRopeInfo). Refuses inconsistent files, naming the tensor/key.
void read_longrope(const GgufFile& f, TensorReader& tr, const ArchInfo& arch, const LoadOptions& options,
                   ModelConfig& c, std::string& note) {
  const std::string& path = f.path();
  const std::string a = c.arch + ".";
  const char* const kShort = tensor_name::kRopeFactorsShort;
  const char* const kLong = tensor_name::kRopeFactorsLong;
  const bool has_short = tr.has(kShort), has_long = tr.has(kLong);
  const std::string type = f.has(a + "rope.scaling.type") ? f.get_string(a + "rope.scaling.type") : "";
  if (!has_short && !has_long) {
    if (type == "longrope")
      throw Error(fmt::format("{}: {}rope.scaling.type = 'longrope' but the file has no '{}' / '{}' tensors", path, a,
                              kShort, kLong));
    return;
  }
  for (const char* t : {kShort, kLong})
    if (tr.has(t) && !arch.longrope)
      throw Error(fmt::format("{}: tensor '{}' is not used by architecture '{}' (refused rather than ignored)", path, t,
                              c.arch));
  if (has_short != has_long)
    throw Error(fmt::format("{}: tensor '{}' is present but '{}' is missing; LongRoPE needs both factor sets", path,
                            has_short ? kShort : kLong, has_short ? kLong : kShort));
  if (c.rope.freq_scale != 1.0)
    throw Error(
        fmt::format("{}: {}rope.scaling.factor = {} (linear scaling) together with LongRoPE factor tensors "
                    "is not supported",
                    path, a, 1.0 / c.rope.freq_scale));
  LongRopeInfo& lr = c.longrope;
  lr.short_factors = read_factor_set(tr, path, kShort, c.rope.n_rot);
  lr.long_factors = read_factor_set(tr, path, kLong, c.rope.n_rot);
  const bool orig_key = f.has(a + "rope.scaling.original_context_length");
  lr.original_context = orig_key ? positive(f, a + "rope.scaling.original_context_length")
                                 : c.context_length;  // llama.cpp: n_ctx_orig_yarn defaults to n_ctx_train
  choose_longrope(c, options, path, a + "context_length",
                  orig_key ? a + "rope.scaling.original_context_length" : a + "context_length", kShort, kLong, note);
}

// The weights every family shares the reading of: embedding, output, norms, blocks; then every
// stored tensor must have been used.
struct Weights {
  std::vector<LayerWeights> layers;
  WeightMatrix token_embd, output;
  std::vector<float> output_norm;
};
Weights read_weights(TensorReader& tr, const ModelConfig& c, const ArchInfo& arch) {
  Weights w;
  w.token_embd = tr.matrix(tensor_name::kTokenEmbd, c.n_vocab, c.dim);
  w.output_norm = tr.vector_f32(tensor_name::kOutputNorm, c.dim);
  w.output = tr.has(tensor_name::kOutput) ? tr.matrix(tensor_name::kOutput, c.n_vocab, c.dim) : w.token_embd;
  for (int l = 0; l < c.n_layers; ++l) w.layers.push_back(load_layer(tr, c, arch, l));
  tr.check_all_used(c.arch);
  return w;
}

// The GGUF file's tensors as loader entries (names, order and types as stored).
std::vector<TensorEntry> gguf_entries(const GgufFile& f) {
  std::vector<TensorEntry> out;
  out.reserve(f.tensors().size());
  for (const GgufTensor& t : f.tensors()) {
    TensorEntry e;
    e.name = e.stored_name = t.name;
    e.file = f.path();
    e.dims = t.dims;
    e.dtype = ggml_type_name(t.type);
    e.type = t.ggml_type();
    e.data = t.data;
    e.n_bytes = t.n_bytes;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

void choose_longrope(ModelConfig& c, const LoadOptions& options, const std::string& path,
                     const std::string& context_key, const std::string& original_key, const std::string& short_source,
                     const std::string& long_source, std::string& note) {
  if (options.context_size < 0)
    throw Error(fmt::format("{}: context size {} must be >= 0 (0: the file's {} {})", path, options.context_size,
                            context_key, c.context_length));
  LongRopeInfo& lr = c.longrope;
  lr.context_size = options.context_size > 0 ? options.context_size : c.context_length;
  // llama.cpp get_rope_factors: long iff n_ctx_per_seq > n_ctx_orig_yarn.
  lr.use_long = lr.context_size > lr.original_context;
  c.rope.freq_factors = lr.use_long ? lr.long_factors : lr.short_factors;
  note = fmt::format(
      "{}: LongRoPE: context size {}{} {} original context {} ({}): using the {} factors ({}), "
      "attention factor {:.6g}",
      path, lr.context_size, options.context_size > 0 ? "" : fmt::format(" ({})", context_key),
      lr.use_long ? ">" : "<=", lr.original_context, original_key, lr.use_long ? "long" : "short",
      lr.use_long ? long_source : short_source, c.rope.attn_factor);
}

const GgufFile& Model::gguf() const {
  if (!gguf_) throw Error(fmt::format("{}: is a checkpoint directory, not a GGUF file", path_));
  return *gguf_;
}

std::unique_ptr<Model> Model::load(const std::string& path, const LoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->path_ = path;
  ModelConfig& c = m->config_;
  std::vector<TensorEntry> entries;
  std::function<std::string(const std::string&)> stored_name = [](const std::string& n) { return n; };
  const bool dir = std::filesystem::is_directory(path);
  if (dir) {
    HfCheckpoint ck = read_hf_checkpoint(path, options);
    c = std::move(ck.config);
    m->arch_ = ck.arch;
    m->warnings_ = std::move(ck.warnings);
    m->rope_note_ = std::move(ck.rope_note);
    m->chat_template_ = std::move(ck.chat_template);
    m->safetensors_ = std::move(ck.files);  // the mappings move with their files: data pointers stay valid
    m->copies_ = std::move(ck.copies);
    entries = std::move(ck.tensors);
    const ArchInfo* arch = m->arch_;
    stored_name = [arch](const std::string& n) { return hf_tensor_name(n, *arch); };
  } else {
    m->gguf_ = std::make_unique<GgufFile>(GgufFile::open(path));
    m->read_config();
    m->read_rope();
    entries = gguf_entries(*m->gguf_);
    if (m->gguf_->has("tokenizer.chat_template")) m->chat_template_ = m->gguf_->get_string("tokenizer.chat_template");
  }
  const ArchInfo& arch = *m->arch_;
  TensorReader tr(entries, path, stored_name);
  if (!dir) {
    const GgufFile& f = *m->gguf_;
    if (tr.has(tensor_name::kRopeFreqs)) {
      if (!arch.rope_freqs)
        throw Error(fmt::format("{}: tensor '{}' is not used by architecture '{}' (refused rather than ignored)", path,
                                tensor_name::kRopeFreqs, c.arch));
      c.rope.freq_factors = tr.vector_f32(tensor_name::kRopeFreqs, c.rope.n_rot / 2);
      for (float v : c.rope.freq_factors)
        if (!(std::isfinite(v) && v > 0.0f))
          throw Error(fmt::format("{}: tensor '{}' holds {}; frequency factors must be finite and > 0", path,
                                  tensor_name::kRopeFreqs, v));
    }
    read_longrope(f, tr, arch, options, c, m->rope_note_);
  }

  const int64_t rows = tr.rows_of(tensor_name::kTokenEmbd);
  if (dir && rows != c.n_vocab)
    throw Error(fmt::format("{}/config.json: vocab_size = {} but '{}' has {} rows", path, c.n_vocab,
                            hf_tensor_name(tensor_name::kTokenEmbd, arch), rows));
  c.n_vocab = static_cast<int>(rows);
  if (options.tokenizer) {
    m->tokenizer_ =
        std::make_unique<Tokenizer>(dir ? Tokenizer::from_hf(path, c.n_vocab) : Tokenizer::from_gguf(*m->gguf_));
    if (m->tokenizer_->n_vocab() != c.n_vocab)
      throw Error(fmt::format("{}: the vocabulary has {} tokens but '{}' has {} rows", path, m->tokenizer_->n_vocab(),
                              tensor_name::kTokenEmbd, c.n_vocab));
  }

  Weights w = read_weights(tr, c, arch);
  m->layers_ = std::move(w.layers);
  m->token_embd_ = w.token_embd;
  m->output_ = w.output;
  m->output_norm_ = std::move(w.output_norm);
  // The matmul kernels read quantised weights row-interleaved: one copy per matrix, made once
  // (float weights, e.g. those of checkpoint directories, have none).
  std::vector<WeightMatrix*> matmuls = {&m->output_};
  for (LayerWeights& L : m->layers_)
    for (WeightMatrix* mat : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) matmuls.push_back(mat);
  // Their rows in a GGUF mapping are read again only for token embeddings (and by tests): each
  // matrix's pages go back to the kernel once it is copied, so the file is not resident twice.
  const GgufFile* gguf = m->gguf_.get();
  x16_attach(matmuls, m->x16_, 0, [gguf](const WeightMatrix& mat) {
    if (gguf) gguf->release(mat.data, static_cast<uint64_t>(mat.rows * mat.row_bytes));
  });
  int64_t bytes = 0;
  for (const TensorEntry& t : entries) bytes += t.n_bytes;
  m->weight_bytes_ = bytes;
  if (options.print_warnings) {
    for (const std::string& wn : m->warnings_) std::fprintf(stderr, "kvevict: warning: %s\n", wn.c_str());
    if (!m->rope_note_.empty()) std::fprintf(stderr, "kvevict: %s\n", m->rope_note_.c_str());
  }
  return m;
}

}  // namespace kvevict
