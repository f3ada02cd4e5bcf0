#include "model/arch.h"

#include <fmt/format.h>

#include "util/error.h"

namespace kvevict {
namespace {

// One row per family; a field not named keeps ArchInfo's default (plain llama behaviour). Sources
// of each row: arch.h's family notes.
const std::vector<ArchInfo>& table() {
  static const std::vector<ArchInfo> t = {
      {.name = "llama",
       .rope_style = RopeStyle::Adjacent,
       .qkv_bias = TensorUse::Optional,
       .rope_freqs = true,
       .synth_shape = "tinyllama-1.1b"},
      {.name = "qwen2",
       .rope_style = RopeStyle::Neox,
       .qkv_bias = TensorUse::Required,
       .synth_shape = "r1-distill-qwen-1.5b"},
      {.name = "qwen3",  //
       .rope_style = RopeStyle::Neox,
       .qk_norm = true,
       .synth_shape = "qwen3-0.6b"},
      {.name = "phi3",
       .rope_style = RopeStyle::Neox,
       .fused_qkv = true,
       .fused_gate_up = true,
       .ignore_sliding_window = true,
       .longrope = true,
       .rstrip_special_names = {"phi-3", "phi3"},
       .synth_shape = "phi3-mini-4k"},
  };
  return t;
}

}  // namespace

const std::vector<ArchInfo>& architectures() { return table(); }

const ArchInfo& arch_info(const std::string& name, const std::string& path) {
  for (const ArchInfo& a : table())
    if (a.name == name) return a;
  throw Error(fmt::format("{}: general.architecture = '{}' is not supported (supported: {})", path, name,
                          fmt::join(supported_architectures(), ", ")));
}

std::vector<std::string> supported_architectures() {
  return architectures_where([](const ArchInfo&) { return true; });
}

std::vector<std::string> architectures_where(bool (*pred)(const ArchInfo&)) {
  std::vector<std::string> out;
  for (const ArchInfo& a : table())
    if (pred(a)) out.push_back(a.name);
  return out;
}

}  // namespace kvevict
