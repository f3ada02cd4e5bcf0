// Hugging Face checkpoint directories (Model::load on a directory; model/hf_checkpoint.cpp,
// Tokenizer::from_hf).
//
// Where each expected value comes from:
//  * TinyStories-656K (../shared/models/tinystories-656k, real trained weights): the greedy text
//    recorded in ../shared/models/SOURCES.md; last-token logits of a float64 NumPy forward pass
//    over the safetensors in tests/hf_reference.py (transformers' equations written out, HF
//    rotate-half layout, nothing of kvevict). (Its tokenizer: tests/tokenizer_hf_test.cpp.)
//  * tiny-random families: hf_reference.py converts each GGUF of ../shared/models/tiny-random to
//    a checkpoint directory (GGUF read by the spec in Python; llama's Q/K rows un-permuted back to
//    HF order); its logits must equal the GGUF's (same weights, same engine: the RoPE layout is
//    the only difference) and transformers' figures in ../shared/reference
//    (transformers_same_weights).
//  * Malformed directories: the one-line errors documented in model/model.h.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli_run.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "eviction/registry.h"
#include "format/safetensors.h"
#include "hf_fixture.h"
#include "model/chat_template.h"
#include "model/model.h"
#include "test_paths.h"
#include "util/error.h"

namespace kvevict {
namespace {

using namespace test::hf;  // NOLINT: test helpers

std::vector<float> last_logits(const Model& m, const std::vector<int32_t>& ids) {
  Engine engine(m, 2);
  auto seq = engine.new_sequence(0, make_policy("full"), {}, static_cast<int64_t>(ids.size()), 1);
  std::vector<float> logits;
  engine.prefill(*seq, ids, logits);
  return logits;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

const Model& tinystories() {
  static const std::unique_ptr<Model> m = Model::load(tinystories_dir(), LoadOptions{.print_warnings = false});
  return *m;
}

// ------------------------------------------------------------------------------------------------
// TinyStories-656K

// Expected: config.json of the checkpoint (SOURCES.md lists the same figures); tied embeddings
// (only lm_head.weight is stored); tokenizer_config.json's BOS/EOS.
TEST(HfTinyStories, LoadsFromDirectory) {
  REQUIRE_TINYSTORIES();
  const Model& m = tinystories();
  const ModelConfig& c = m.config();
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.dim, 128);
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.hidden_dim, 384);
  EXPECT_EQ(c.n_vocab, 2048);
  EXPECT_EQ(c.context_length, 512);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  EXPECT_FLOAT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.rope.style, RopeStyle::Neox);  // HF rotate-half rows, not permuted (hf_checkpoint.cpp)
  EXPECT_EQ(m.output().data, m.token_embedding().data);
  EXPECT_EQ(m.weight_type(), GgmlType::F32);
  EXPECT_FALSE(m.is_gguf());
  EXPECT_THROW(m.gguf(), Error);
  EXPECT_TRUE(m.chat_template().empty());
  const Tokenizer& t = m.tokenizer();
  EXPECT_EQ(t.n_vocab(), 2048);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_TRUE(t.add_bos());
  EXPECT_FALSE(t.add_eos());
  EXPECT_TRUE(t.is_eog(2));
  EXPECT_EQ(t.kind(), Tokenizer::Kind::SPM);
}

// Expected: ../shared/models/SOURCES.md, "Checked here: a plain float32 forward pass from BOS,
// greedy, gives 'Once upon a time, there was a little girl named Lily. She had a toy car that she
// loved very much. One day, she went to the park …'".
TEST(HfTinyStories, GreedyContinuationOfBosMatchesSources) {
  REQUIRE_TINYSTORIES();
  const Model& m = tinystories();
  const std::string expect =
      "Once upon a time, there was a little girl named Lily. She had a toy car that she loved very much. One day, "
      "she went to the park";
  std::vector<int32_t> ids = {m.tokenizer().bos_id()};
  Engine engine(m, 2);
  auto seq = engine.new_sequence(0, make_policy("full"), {}, 1, 64);
  std::vector<float> logits;
  engine.prefill(*seq, ids, logits);
  std::string text;
  for (int i = 0; i < 48 && text.size() < expect.size(); ++i) {
    ids.push_back(argmax(logits));
    text = m.tokenizer().decode(std::vector<int32_t>(ids.begin() + 1, ids.end()));
    engine.decode(*seq, ids.back(), logits);
  }
  EXPECT_EQ(text.substr(0, expect.size()), expect) << text;
}

// Expected: float64 NumPy forward pass (tests/hf_reference.py) on the same safetensors, all 2048
// last-token logits within 1e-4 (float32 against float64 over two layers).
TEST(HfTinyStories, LogitsMatchNumpyReference) {
  REQUIRE_TINYSTORIES();
  REQUIRE_PYTHON("numpy");
  const Model& m = tinystories();
  const std::vector<int32_t> ids = m.tokenizer().encode("Once upon a time, there was a little", true);
  ASSERT_EQ(ids.front(), 1);
  const std::vector<float> got = last_logits(m, ids);
  const auto want =
      run_reference("logits '" + tinystories_dir() + "' " + join_ids(ids))["logits"].get<std::vector<float>>();
  const float d = max_abs_diff(got, want);
  std::printf("[hf] tinystories-656k F32: max|dlogit| vs NumPy float64 reference %.2e over %zu logits (%zu ids)\n", d,
              want.size(), ids.size());
  EXPECT_LE(d, 1e-4f);
  EXPECT_EQ(argmax(got), argmax(want));
}

// Expected: the same model re-stored as F16 and as BF16 in two shards with an index
// (hf_reference.py retype, through the safetensors package): kvevict computes with the 16-bit
// weights as stored, the NumPy reference with the same rounded weights; 1e-4. (This checkpoint's
// values were upcast from 16 bits — SOURCES.md — so both roundings happen to be exact and the
// copies also reproduce the F32 logits; a wrong F16/BF16 decoding would not.)
TEST(HfTinyStories, F16AndBf16ShardedCopiesMatchNumpyReference) {
  REQUIRE_TINYSTORIES();
  REQUIRE_PYTHON("numpy, safetensors");
  const std::vector<int32_t> ids = tinystories().tokenizer().encode("One day, a big dog", true);
  for (const std::string dtype : {"F16", "BF16"}) {
    const fs::path dir = temp_root() / ("tinystories-" + dtype);
    const test::CliResult r = test::run_shell("python3 '" + reference_script() + "' retype '" + tinystories_dir() +
                                              "' '" + dir.string() + "' " + dtype + " 2>&1");
    ASSERT_EQ(r.code, 0) << r.out;
    ASSERT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
    const auto m = Model::load(dir.string(), LoadOptions{.print_warnings = false});
    EXPECT_EQ(m->weight_type(), dtype == "F16" ? GgmlType::F16 : GgmlType::BF16);
    const std::vector<float> got = last_logits(*m, ids);
    const auto want =
        run_reference("logits '" + dir.string() + "' " + join_ids(ids))["logits"].get<std::vector<float>>();
    const float d = max_abs_diff(got, want);
    const float d32 = max_abs_diff(got, last_logits(tinystories(), ids));
    std::printf(
        "[hf] tinystories-656k %s (2 shards): max|dlogit| vs NumPy reference %.2e; vs the F32 checkpoint %.2e\n",
        dtype.c_str(), d, d32);
    EXPECT_LE(d, 1e-4f) << dtype;
  }
}

// ------------------------------------------------------------------------------------------------
// tiny-random families converted to checkpoint directories

class HfFamily : public ::testing::TestWithParam<Family> {};

json family_reference(const Family& f) {
  std::ifstream in(test::shared_path("reference/tiny-random-" + f.family + ".json"));
  return json::parse(in).at("files").at(f.stem);
}

// Expected: the GGUF's logits (same F16 weights, our engine; for llama the RoPE pairing is the
// only difference, so only the summation order differs) within 1e-4, and transformers'
// (transformers_same_weights, first 64 logits) within 1e-3 as in families_test; the
// directory's tokenizer gives llama.cpp's prompt ids of the reference.
TEST_P(HfFamily, LogitsEqualTheGgufAndTransformers) {
  const Family& f = GetParam();
  const std::string gguf = test::shared_path("models/tiny-random/" + f.stem + ".gguf");
  if (!fs::exists(gguf)) KVEVICT_SKIP_UNLESS_CI(gguf << " not found");
  REQUIRE_PYTHON("numpy, safetensors");
  const std::string dir = converted_dir(f.stem);
  const json ref = family_reference(f);
  const auto prompt = ref.at("prompt_ids").get<std::vector<int32_t>>();
  const auto md = Model::load(dir, LoadOptions{.print_warnings = false});
  const auto mg = Model::load(gguf, LoadOptions{.tokenizer = false, .print_warnings = false});
  EXPECT_EQ(md->config().arch, mg->config().arch);
  EXPECT_EQ(md->config().head_dim, mg->config().head_dim);
  EXPECT_EQ(md->config().rope.n_rot, mg->config().rope.n_rot);
  EXPECT_EQ(md->config().rope.style, RopeStyle::Neox);
  EXPECT_EQ(md->config().rope.freq_factors.size(), mg->config().rope.freq_factors.size());
  for (size_t i = 0; i < md->config().rope.freq_factors.size(); ++i)
    EXPECT_NEAR(md->config().rope.freq_factors[i], mg->config().rope.freq_factors[i], 1e-5f) << "band " << i;
  const auto got = last_logits(*md, prompt), gg = last_logits(*mg, prompt);
  const float d_gguf = max_abs_diff(got, gg);
  const auto hf64 = ref.at("transformers_same_weights").at("last_logits_first64").get<std::vector<float>>();
  float d_hf = 0;
  for (size_t i = 0; i < hf64.size(); ++i) d_hf = std::max(d_hf, std::abs(got[i] - hf64[i]));
  std::printf("[hf] %s directory: max|dlogit| vs the GGUF %.2e (all %zu), vs transformers %.2e (first 64)\n",
              f.stem.c_str(), d_gguf, got.size(), d_hf);
  EXPECT_LE(d_gguf, 1e-4f);
  EXPECT_LE(d_hf, 1e-3f);
  EXPECT_EQ(argmax(got), argmax(gg));
  // The chat template travels in tokenizer_config.json and is recognised as the GGUF's.
  EXPECT_EQ(ChatTemplate::from_text(md->chat_template(), md->path(), md->chat_template_key()).name(),
            ChatTemplate::from_gguf(GgufFile::open(gguf)).name());
  // The prompt "The capital of France is" through the directory's tokenizer.json.
  const std::string text = ref.at("prompt").get<std::string>();
  EXPECT_EQ(md->tokenizer().encode(text, true, true), prompt) << text;
}

INSTANTIATE_TEST_SUITE_P(TinyRandom, HfFamily,
                         ::testing::Values(Family{"qwen2", "tiny-random-qwen2-f16"},
                                           Family{"qwen3", "tiny-random-qwen3-f16"},
                                           Family{"llama3", "tiny-random-llama3-f16"},
                                           Family{"phi3", "tiny-random-phi3-f16"}),
                         [](const auto& info) { return info.param.family; });

// ------------------------------------------------------------------------------------------------
// Malformed directories

// A copy of TinyStories-656K with config.json edited by `edit`.
fs::path copy_tinystories(const std::string& name, const std::function<void(json&)>& edit = {}) {
  const fs::path dir = temp_root() / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(tinystories_dir())) fs::copy_file(e.path(), dir / e.path().filename());
  fs::permissions(dir / "config.json", fs::perms::owner_write, fs::perm_options::add);
  if (edit) {
    std::ifstream in(dir / "config.json");
    json j = json::parse(in);
    in.close();
    edit(j);
    fs::remove(dir / "config.json");
    std::ofstream(dir / "config.json") << j.dump(1);
  }
  return dir;
}

// A safetensors file from (name, dtype, shape, bytes), laid out in the given order, with the
// header padded by `pad` spaces (so tensor data can be put at any alignment).
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
void write_safetensors(const fs::path& path, const std::vector<RawTensor>& ts, size_t pad = 0,
                       const json& metadata = json()) {
  json h = json::object();
  if (!metadata.is_null()) h["__metadata__"] = metadata;
  uint64_t off = 0;
  for (const RawTensor& t : ts) {
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  const std::string hs = h.dump() + std::string(pad, ' ');
  const uint64_t n = hs.size();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << hs;
  for (const RawTensor& t : ts) out << t.bytes;
}
std::vector<RawTensor> tinystories_tensors() {
  const SafetensorsFile f = SafetensorsFile::open(tinystories_dir() + "/model.safetensors");
  std::vector<RawTensor> out;
  for (const SafetensorsTensor& t : f.tensors())
    out.push_back({t.name, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.n_bytes())});
  return out;
}

std::string load_error(const fs::path& dir) {
  try {
    (void)Model::load(dir.string(), LoadOptions{.print_warnings = false});
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Expected: one-line errors naming the file and the field / tensor (model/model.h).
TEST(HfMalformed, ConfigFieldsThatChangeTheComputationAreRefused) {
  REQUIRE_TINYSTORIES();
  struct Case {
    std::string name;
    std::function<void(json&)> edit;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"arch", [](json& j) { j["architectures"] = {"MistralForCausalLM"}; },
       "config.json: architectures = ['MistralForCausalLM'] is not supported (supported: LlamaForCausalLM"},
      {"model_type", [](json& j) { j["model_type"] = "qwen2"; }, "model_type = 'qwen2' contradicts architectures"},
      {"no_family",
       [](json& j) {
         j.erase("architectures");
         j.erase("model_type");
       },
       "architectures and model_type are both missing"},
      {"act", [](json& j) { j["hidden_act"] = "gelu"; }, "config.json: hidden_act = 'gelu' is not implemented"},
      {"yarn",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
       },
       "rope_scaling.rope_type = 'yarn' is not implemented"},
      {"dynamic",
       [](json& j) {
         j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
       },
       "rope_scaling.rope_type = 'dynamic' is not implemented"},
      {"longrope_llama",
       [](json& j) {
         j["rope_scaling"] = {{"type", "longrope"}};
       },
       "'longrope' is not implemented for 'llama'"},
      {"linear_extra",
       [](json& j) {
         j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}, {"mscale", 1.5}};
       },
       "rope_scaling.mscale = 1.5 is not implemented for rope type 'linear'"},
      {"llama3_missing",
       [](json& j) {
         j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
       },
       "rope_scaling.low_freq_factor is missing"},
      {"swa", [](json& j) { j["sliding_window"] = 256; },
       "config.json: sliding_window = 256: sliding-window attention is not implemented"},
      {"layer_types",
       [](json& j) {
         j["layer_types"] = {"full_attention", "sliding_attention"};
       },
       "layer_types holds \"sliding_attention\""},
      {"moe", [](json& j) { j["num_local_experts"] = 8; }, "config.json: num_local_experts = 8 is not implemented"},
      {"quant",
       [](json& j) {
         j["quantization_config"] = {{"quant_method", "gptq"}};
       },
       "quantization_config = {"},
      {"attn_bias", [](json& j) { j["attention_bias"] = true; },
       "attention_bias = true is not implemented for 'llama'"},
      {"mlp_bias", [](json& j) { j["mlp_bias"] = true; }, "mlp_bias = true"},
      {"softcap", [](json& j) { j["final_logit_softcapping"] = 30.0; },
       "final_logit_softcapping = 30.0 is not implemented"},
      {"partial", [](json& j) { j["partial_rotary_factor"] = 0.5; },
       "partial_rotary_factor = 0.5 is not implemented for 'llama'"},
      {"untied", [](json& j) { j["tie_word_embeddings"] = false; }, "missing tensor 'model.embed_tokens.weight'"},
      {"vocab", [](json& j) { j["vocab_size"] = 4096; },
       "config.json: vocab_size = 4096 but 'model.embed_tokens.weight' has 2048 rows"},
      {"heads", [](json& j) { j["num_key_value_heads"] = 3; },
       "num_attention_heads = 8 is not a multiple of num_key_value_heads 3"},
      {"hidden", [](json& j) { j["hidden_size"] = 64; }, "has shape [2048, 128], expected [2048, 64]"},
      {"eps", [](json& j) { j["rms_norm_eps"] = -1; }, "rms_norm_eps = -1 must be a finite value in (0, 1)"},
      {"missing", [](json& j) { j.erase("intermediate_size"); }, "config.json: intermediate_size is missing"},
      {"type", [](json& j) { j["num_hidden_layers"] = "2"; }, "num_hidden_layers = \"2\" is not an integer"},
      {"layers", [](json& j) { j["num_hidden_layers"] = 3; }, "missing tensor 'model.layers.2.input_layernorm.weight'"},
      {"fewer_layers", [](json& j) { j["num_hidden_layers"] = 1; }, "tensor 'model.layers.1."},
  };
  for (const Case& c : cases) {
    const fs::path dir = copy_tinystories("cfg_" + c.name, c.edit);
    const std::string err = load_error(dir);
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.name << ": " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << c.name << ": " << err;
    EXPECT_NE(err.find(dir.string()), std::string::npos) << c.name << " does not name the file: " << err;
  }
}

TEST(HfMalformed, FilesAndTensorsAreChecked) {
  REQUIRE_TINYSTORIES();
  const auto expect_error = [](const fs::path& dir, const std::string& want) {
    const std::string err = load_error(dir);
    EXPECT_NE(err.find(want), std::string::npos) << dir << ": " << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  };
  {
    const fs::path d = copy_tinystories("no_config");
    fs::remove(d / "config.json");
    expect_error(d, "no config.json");
  }
  {
    const fs::path d = copy_tinystories("bad_json");
    fs::remove(d / "config.json");
    std::ofstream(d / "config.json") << "{\"hidden_size\": 12";
    expect_error(d, (d / "config.json").string() + ": not valid JSON");
  }
  {
    const fs::path d = copy_tinystories("no_weights");
    fs::remove(d / "model.safetensors");
    expect_error(d, "no model.safetensors or model.safetensors.index.json");
  }
  {
    const fs::path d = copy_tinystories("no_tokenizer");
    fs::remove(d / "tokenizer.json");
    expect_error(d, "no tokenizer.json");
  }
  {
    const fs::path d = copy_tinystories("truncated");
    fs::resize_file(d / "model.safetensors", 1000000);
    expect_error(d, (d / "model.safetensors").string() + ": the tensors cover");
  }
  {  // an extra tensor: refused rather than ignored
    const fs::path d = copy_tinystories("extra");
    auto ts = tinystories_tensors();
    ts.push_back({"model.layers.0.self_attn.rotary_emb.scale", "F32", {1}, std::string(4, '\0')});
    write_safetensors(d / "model.safetensors", ts);
    expect_error(d, "tensor 'model.layers.0.self_attn.rotary_emb.scale' is not used by architecture 'llama'");
  }
  {  // a Q/K bias in a llama checkpoint whose config has no attention_bias: unused, refused
    const fs::path d = copy_tinystories("bias");
    auto ts = tinystories_tensors();
    ts.push_back({"model.layers.1.self_attn.q_proj.bias", "F32", {128}, std::string(512, '\0')});
    write_safetensors(d / "model.safetensors", ts);
    expect_error(d, "tensor 'model.layers.1.self_attn.q_proj.bias' is not used by architecture 'llama'");
  }
  {  // a weight in a dtype the kernels do not read
    const fs::path d = copy_tinystories("dtype");
    auto ts = tinystories_tensors();
    for (RawTensor& t : ts)
      if (t.name == "model.norm.weight") t.dtype = "I32";
    write_safetensors(d / "model.safetensors", ts);
    expect_error(d, "tensor 'model.norm.weight' has dtype I32; kvevict computes with F32, F16 and BF16 weights");
  }
  {  // untied, but only the embedding stored
    const fs::path d = copy_tinystories("no_head", [](json& j) { j["tie_word_embeddings"] = false; });
    auto ts = tinystories_tensors();
    ts[0].name = "model.embed_tokens.weight";
    write_safetensors(d / "model.safetensors", ts);
    expect_error(d, "config.json: tie_word_embeddings = false, but no lm_head.weight is stored");
  }
  {  // tied, but both matrices stored and different
    const fs::path d = copy_tinystories("two_heads");
    auto ts = tinystories_tensors();
    RawTensor emb = ts[0];
    ASSERT_EQ(emb.name, "lm_head.weight");
    emb.name = "model.embed_tokens.weight";
    emb.bytes[5] ^= 1;
    ts.push_back(emb);
    write_safetensors(d / "model.safetensors", ts);
    expect_error(d, "tie_word_embeddings = true, but lm_head.weight and model.embed_tokens.weight differ");
  }
  {  // shards: index naming a file outside the directory, a missing shard, a tensor not indexed
    const fs::path d = copy_tinystories("index");
    std::ofstream(d / "model.safetensors.index.json") << R"({"weight_map": {"lm_head.weight": "../x.safetensors"}})";
    expect_error(d, "weight_map['lm_head.weight'] = '../x.safetensors' is not a file name in the checkpoint directory");
    fs::remove(d / "model.safetensors.index.json");
    std::ofstream(d / "model.safetensors.index.json") << R"({"weight_map": {"lm_head.weight": "model-2.safetensors"}})";
    expect_error(d, "names 'model-2.safetensors', which does not exist");
    fs::remove(d / "model.safetensors.index.json");
    std::ofstream(d / "model.safetensors.index.json") << R"({"weight_map": {"lm_head.weight": "model.safetensors"}})";
    expect_error(
        d,
        "tensor 'model.layers.0.input_layernorm.weight' is not listed for this file in model.safetensors.index.json");
  }
}

// Expected: tensor data placed at odd addresses (header padded by 1 byte) is copied to aligned
// memory and gives exactly the logits of the aligned original.
TEST(HfMalformed, MisalignedTensorDataIsCopied) {
  REQUIRE_TINYSTORIES();
  const fs::path d = copy_tinystories("misaligned");
  write_safetensors(d / "model.safetensors", tinystories_tensors(), 1, json{{"format", "pt"}});
  const SafetensorsFile f = SafetensorsFile::open((d / "model.safetensors").string());
  ASSERT_NE(reinterpret_cast<uintptr_t>(f.tensors()[0].data) % 4, 0u);
  const auto m = Model::load(d.string(), LoadOptions{.print_warnings = false});
  const std::vector<int32_t> ids = {1, 400, 500, 600};
  EXPECT_EQ(last_logits(*m, ids), last_logits(tinystories(), ids));
}

// Expected: the CLI opens a directory wherever it opens a GGUF file (-m DIR); its greedy
// continuation is the NumPy reference's (hf_reference.py greedy), decoded.
TEST(HfCli, GenerateFromDirectory) {
  REQUIRE_TINYSTORIES();
  REQUIRE_PYTHON("numpy");
  const Tokenizer& t = tinystories().tokenizer();
  const std::string prompt = "Once upon a time";
  const auto ref = run_reference("greedy '" + tinystories_dir() + "' " + join_ids(t.encode(prompt, true)) + " 12");
  const std::string continuation = t.decode(ref["greedy"].get<std::vector<int32_t>>());
  const test::CliResult r =
      test::run_cli("generate -m '" + tinystories_dir() + "' -p '" + prompt + "' -n 12 --temp 0 --threads 1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(prompt + continuation), std::string::npos) << "expected '" << prompt + continuation << "' in\n"
                                                                  << r.out;
  const test::CliResult bad = test::run_cli("generate -m '" + temp_root().string() + "' -p x -n 1");
  EXPECT_EQ(bad.code, 2) << bad.out;
  EXPECT_NE(bad.out.find("no config.json"), std::string::npos) << bad.out;
}

}  // namespace
}  // namespace kvevict
