// `kvevict tools ...`: utilities. `tools synth-gguf` writes a synthetic-weight GGUF of a real
// model's shape, any family of model/arch.h (model/synth.h), for speed work.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <chrono>

#include "cli/common.h"
#include "model/model.h"
#include "model/synth.h"
#include "util/error.h"

namespace kvevict::cli {
namespace {

struct SynthArgs {
  std::string shape, type = "q8_0", out;
  uint64_t seed = 0;
  std::string arch;       ///< family; empty: the shape's own
  bool longrope = false;  ///< add LongRoPE factor sets (synth_add_longrope; families with LongRoPE)
};

int run_synth(const SynthArgs& a) {
  if (a.shape.empty() && a.arch.empty()) throw Error("tools synth-gguf: give --shape, --arch or both");
  SynthShape shape = synth_shape(a.shape.empty() ? synth_default_shape(a.arch) : a.shape);
  if (!a.arch.empty()) shape.arch = a.arch;
  if (a.longrope) synth_add_longrope(shape);
  const SynthTypes types = parse_synth_types(a.type);
  const auto t0 = std::chrono::steady_clock::now();
  write_synth_gguf(shape, types, a.seed, a.out);
  // Read it back through the real loader so a broken file never leaves this command.
  const auto model = Model::load(a.out);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("wrote {}: {} shape ({}), {} weights, seed {}, {:.1f}M parameters, {:.1f} MiB of tensors ({:.1f} s)\n",
             a.out, shape.name, shape.arch, a.type, a.seed, static_cast<double>(shape.n_params()) / 1e6,
             static_cast<double>(model->weight_bytes()) / (1 << 20), s);
  return 0;
}

}  // namespace

void add_tools(CLI::App& root, std::vector<Command>& out) {
  auto* tools = root.add_subcommand("tools", "Utilities (synth-gguf: synthetic-weight models of real shapes)");
  tools->require_subcommand(1);
  auto a = std::make_shared<SynthArgs>();
  auto* synth = tools->add_subcommand("synth-gguf", "Write a GGUF of a real model's shape with seeded random weights");
  std::string shapes;
  for (const std::string& s : synth_shape_names()) shapes += (shapes.empty() ? "" : ", ") + s;
  synth->add_option("--shape", a->shape, "Model shape: " + shapes + " (default with --arch: that family's shape)");
  synth->add_option("--arch", a->arch,
                    fmt::format("Architecture: {} (default: the shape's)", fmt::join(supported_architectures(), ", ")));
  synth
      ->add_option("--type", a->type,
                   "Weight type: " + ggml_supported_type_names() + ", or the llama.cpp mixes q4_k_m, q5_k_m")
      ->capture_default_str();
  synth->add_option("--seed", a->seed, "Seed of the random weights")->check(seed_value())->capture_default_str();
  synth->add_option("-o,--output", a->out, "Output GGUF path")->required();
  synth->add_flag("--longrope", a->longrope,
                  fmt::format("{} only: add LongRoPE (rope_factors_short/long.weight, "
                              "rope.scaling.original_context_length = the shape's context, context_length 32 x that, "
                              "rope.scaling.attn_factor), as in Phi-3.5-mini",
                              fmt::join(architectures_where([](const ArchInfo& f) { return f.longrope; }), ", ")));
  out.push_back({tools, [a, synth] {
                   if (synth->parsed()) return run_synth(*a);
                   return 2;
                 }});
}

}  // namespace kvevict::cli
