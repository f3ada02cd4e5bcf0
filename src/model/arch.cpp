#include "model/arch.h"

#include <fmt/format.h>

#include "util/error.h"

namespace kvevict {
namespace {

const std::vector<ArchInfo>& table() {
  // name, rope style, QKV bias, Q/K norm, fused QKV, fused gate/up, rope_freqs, ignore SWA, longrope
  static const std::vector<ArchInfo> t = {
      {"llama", RopeStyle::Adjacent, TensorUse::Optional, false, false, false, true, false, false},
      {"qwen2", RopeStyle::Neox, TensorUse::Required, false, false, false, false, false, false},
      {"qwen3", RopeStyle::Neox, TensorUse::None, true, false, false, false, false, false},
      {"phi3", RopeStyle::Neox, TensorUse::None, false, true, true, false, true, true},
  };
  return t;
}

}  // namespace

const ArchInfo& arch_info(const std::string& name, const std::string& path) {
  for (const ArchInfo& a : table())
    if (a.name == name) return a;
  throw Error(fmt::format("{}: general.architecture = '{}' is not supported (supported: {})", path, name,
                          fmt::join(supported_architectures(), ", ")));
}

std::vector<std::string> supported_architectures() {
  std::vector<std::string> out;
  for (const ArchInfo& a : table()) out.push_back(a.name);
  return out;
}

}  // namespace kvevict
