// kvevict._kvevict: the Python binding (nanobind) of the engine. It adds no engine logic of its
// own: policies and schedules come from the one settings builder (engine/policy_settings.h),
// generation from the one generation loop (engine/generation.h), perplexity from eval/perplexity.h. Errors keep the engine's
// messages, with the field a FieldError names spelled as this package's keyword (`buffer`,
// `top_p`, ...). Compute runs with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "engine/engine.h"
#include "engine/generation.h"
#include "engine/policy_settings.h"
#include "engine/sampler.h"
#include "eval/perplexity.h"
#include "eviction/registry.h"
#include "kvcache/kv_cache.h"
#include "model/chat_template.h"
#include "model/model.h"
#include "util/error.h"
#include "util/field_error.h"
#include "util/limits.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvevict::py {
namespace {

/// How this package spells a setting: the keyword argument that sets it.
std::string_view keyword(Field f) {
  switch (f) {
    case Field::Policy: return "policy";
    case Field::Budget: return "budget";
    case Field::Recent: return "buffer";
    case Field::Sinks: return "sinks";
    case Field::ProtectPrompt: return "protect_prompt";
    case Field::Param: return "params";
    case Field::KvType: return "kv_type";
    case Field::Seed: return "seed";
    case Field::MaxNewTokens: return "max_tokens";
    case Field::Temperature: return "temperature";
    case Field::TopP: return "top_p";
    case Field::TopK: return "top_k";
    default: return field_name(f);
  }
}

/// Keyword arguments of generate/perplexity that describe the policy and its schedule.
struct PolicyKwargs {
  std::string policy;
  int64_t budget = 0, buffer = 0;
  std::optional<int> sinks;
  std::optional<bool> protect_prompt;
  uint64_t seed = 0;
  std::vector<std::string> params;
};

/// The one settings builder, fed from keyword arguments.
CheckedPolicy checked_policy(const PolicyKwargs& k) {
  PolicySettings s;
  s.policy = k.policy;
  s.budget = k.budget;
  s.recent = k.buffer;
  s.sinks = k.sinks;
  s.protect_prompt = k.protect_prompt;
  s.seed = k.seed;
  s.params = k.params;
  return build_policy_config(s);
}

/// What generate() returns.
struct Generation {
  std::string text;                    ///< generated text (the prompt excluded)
  std::vector<int32_t> prompt_tokens;  ///< the prompt's token ids as run
  std::vector<int32_t> tokens;         ///< generated token ids (end-of-generation token excluded)
  std::string finish_reason;           ///< "stop" (end-of-generation token) or "length" (max_tokens)
  std::string policy;
  SequenceStats stats;
  int64_t kv_bytes = 0;  ///< bytes allocated for the KV cache
};

/// What perplexity() returns.
struct Perplexity {
  double ppl = 0;
  std::vector<double> nll;  ///< nats, one per scored token
  std::string policy;
  SequenceStats stats;
  int64_t kv_bytes = 0;
};

using Prompt = std::variant<std::string, std::vector<int32_t>>;

class PyModel {
 public:
  explicit PyModel(const std::string& path) {
    nb::gil_scoped_release release;
    model_ = Model::load(path);
  }
  const Model& model() const { return *model_; }
  const Tokenizer& tok() const { return model_->tokenizer(); }

  std::vector<int32_t> tokenize(const std::string& text, bool add_special, bool parse_special) const {
    return tok().encode(text, add_special, parse_special);
  }

  std::string detokenize(const std::vector<int32_t>& ids, bool special) const { return tok().decode(ids, special); }

  std::string chat_prompt(const nb::list& messages, bool add_generation_prompt, bool enable_thinking,
                          const std::string& template_name) const {
    std::vector<ChatMessage> msgs;
    for (size_t i = 0; i < messages.size(); ++i) {
      nb::handle m = messages[i];
      if (!nb::isinstance<nb::dict>(m))
        throw Error(fmt::format("messages[{}]: must be a dict with 'role' and 'content'", i));
      nb::dict d = nb::borrow<nb::dict>(m);
      for (const char* key : {"role", "content"})
        if (!d.contains(key) || !nb::isinstance<nb::str>(d[key]))
          throw Error(fmt::format("messages[{}]: needs a string '{}'", i, key));
      msgs.push_back({nb::cast<std::string>(d["role"]), nb::cast<std::string>(d["content"])});
    }
    const ChatTemplate chat = ChatTemplate::from_text(model_->chat_template(), model_->path(),
                                                      model_->chat_template_key(), template_name);
    return chat.render(msgs, ChatOptions{add_generation_prompt, enable_thinking});
  }

  /// A str prompt as the CLI's -p (BOS as the model says, special-token text left as text), or
  /// with `special` as its --chat (special-token text parsed, BOS added unless the text has it).
  std::vector<int32_t> prompt_ids(const Prompt& prompt, bool special) const {
    if (const auto* ids = std::get_if<std::vector<int32_t>>(&prompt)) {
      if (ids->empty()) throw Error("prompt: the token list must not be empty");
      return *ids;
    }
    const std::string& text = std::get<std::string>(prompt);
    if (text.empty()) throw Error("prompt: must not be empty");
    if (!special) return tok().encode(text, true, false);
    std::vector<int32_t> ids = tok().encode(text, false, true);
    if (tok().add_bos() && tok().bos_id() >= 0 && (ids.empty() || ids[0] != tok().bos_id()))
      ids.insert(ids.begin(), tok().bos_id());
    return ids;
  }

  // The engine's one generation loop (engine/generation.h), as `kvevict generate` runs it.
  Generation generate(const Prompt& prompt, const PolicyKwargs& pk, const GenerationConfig& gc, bool special,
                      const std::string& kv_type, int threads) const {
    const CheckedPolicy kv = checked_policy(pk);
    validate_generation(gc, tok().n_vocab());
    if (threads < 0) throw Error(fmt::format("threads {}: must be >= 0 (0 = all cores)", threads));
    const KvType kt = parse_kv_type(kv_type);
    const std::vector<int32_t> ids = prompt_ids(prompt, special);
    Generation g;
    g.prompt_tokens = ids;
    g.policy = kv.policy().name;
    nb::gil_scoped_release release;
    Engine engine(*model_, threads, kt);
    check_kv_type(engine.kv_type(), kv);
    if (kv.policy().selector) (void)kv.policy().selector->make_state(engine.kv_shape());
    GenerationOutput out = kvevict::generate(engine, kv, GenerationInput{0, ids}, gc);
    g.text = std::move(out.result.text);
    g.tokens = std::move(out.result.tokens);
    g.finish_reason = finish_reason(out.result.stop);
    g.stats = out.seq->stats;
    g.kv_bytes = out.seq->kv.allocated_bytes();
    return g;
  }

  Perplexity perplexity(const Prompt& text, const PolicyKwargs& pk, int threads) const {
    const CheckedPolicy kv = checked_policy(pk);
    if (threads < 0) throw Error(fmt::format("threads {}: must be >= 0 (0 = all cores)", threads));
    // As `kvevict perplexity -f`: the text with the model's BOS.
    std::vector<int32_t> ids;
    if (const auto* given = std::get_if<std::vector<int32_t>>(&text))
      ids = *given;
    else
      ids = tok().encode(std::get<std::string>(text), true);
    if (ids.size() < 2) throw Error(fmt::format("text: {} token(s); perplexity needs at least 2", ids.size()));
    Perplexity p;
    p.policy = kv.policy().name;
    nb::gil_scoped_release release;
    Engine engine(*model_, threads);
    DecodePerplexity r = perplexity_decode(engine, kv.policy(), kv.eviction(), ids);
    p.ppl = r.ppl;
    p.nll = std::move(r.nll);
    p.stats = r.stats;
    p.kv_bytes = r.kv_bytes;
    return p;
  }

 private:
  std::unique_ptr<Model> model_;
};

template <class T>
void bind_stats(nb::class_<T>& c) {
  c.def_prop_ro("eviction_rounds", [](const T& r) { return r.stats.rounds; }, "Eviction rounds run.")
      .def_prop_ro("peak_slots", [](const T& r) { return r.stats.peak_slots; },
                   "Most live slots ever held by one (layer, KV head); at most budget + buffer when the policy "
                   "evicts.")
      .def_prop_ro("kv_bytes", [](const T& r) { return r.kv_bytes; },
                   "Bytes allocated for the KV cache (all layers, K and V).")
      .def_prop_ro("prefill_ms", [](const T& r) { return r.stats.prefill_ms; }, "Time in prefill, ms.")
      .def_prop_ro("decode_ms", [](const T& r) { return r.stats.decode_ms; },
                   "Time in decode forward passes (eviction rounds excluded), ms.")
      .def_prop_ro("decode_steps", [](const T& r) { return r.stats.decode_steps; }, "Decode steps run.")
      .def_prop_ro("score_ms", [](const T& r) { return r.stats.score_ms; },
                   "Total time in selector scoring over all eviction rounds, ms.")
      .def_prop_ro("compact_ms", [](const T& r) { return r.stats.compact_ms; },
                   "Total time in keep-set choice and cache compaction over all eviction rounds, ms.")
      .def_ro("policy", &T::policy, "The policy run, as named (e.g. 'random', 'snapkv+prompt').");
}

std::string param_default(const ParamSpec& p) { return p.fallback; }

}  // namespace
}  // namespace kvevict::py

NB_MODULE(_kvevict, m) {
  using namespace kvevict;
  using namespace kvevict::py;
  m.doc() = "Binding of the kvevict engine; import the `kvevict` package, not this module.";

  // The module holds the type; a raw pointer avoids a static Python object outliving the interpreter.
  static PyObject* error = nb::exception<kvevict::Error>(m, "Error", PyExc_ValueError).ptr();
  // One translator for the engine's errors: a FieldError names the field as this package's keyword.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const FieldError& e) {
      PyErr_SetString(error, e.message(keyword(e.field())).c_str());
    } catch (const kvevict::Error& e) {
      PyErr_SetString(error, e.what());
    }
  });

  nb::class_<ParamSpec>(m, "ParamSpec", "One selector parameter: name, type, default and allowed range or values.")
      .def_ro("name", &ParamSpec::name, "Name as given in params=['NAME=VALUE'].")
      .def_ro("type", &ParamSpec::type, "'number', 'integer' or 'text'.")
      .def_prop_ro("default", &param_default, "The default, as text ('' for a text parameter without one).")
      .def_ro("lo", &ParamSpec::lo, "Smallest allowed value (number and integer parameters).")
      .def_ro("hi", &ParamSpec::hi, "Largest allowed value (number and integer parameters).")
      .def_ro("allowed", &ParamSpec::allowed, "Allowed values of a text choice (empty: any text).")
      .def("__repr__", [](const ParamSpec& p) {
        return fmt::format("ParamSpec(name='{}', type='{}', default='{}')", p.name, p.type, p.fallback);
      });

  nb::class_<PolicyInfo>(m, "PolicyInfo", "A registered eviction policy (docs/eviction-spec.md §3).")
      .def_ro("name", &PolicyInfo::name, "Policy name, e.g. 'random'; 'NAME+prompt' also pins the prompt.")
      .def_ro("summary", &PolicyInfo::summary, "One sentence.")
      .def_ro("source", &PolicyInfo::source, "Paper and section, or spec section.")
      .def_ro("evicts", &PolicyInfo::evicts, "False only for 'full' (no eviction).")
      .def_ro("protect_prompt", &PolicyInfo::protect_prompt, "Whether the prompt is pinned by default.")
      .def_ro("sinks", &PolicyInfo::sinks, "Default number of pinned first positions (attention sinks).")
      .def_prop_ro("params", [](const PolicyInfo& p) { return policy_params(p); },
                   "The selector's parameters (list of ParamSpec) with their defaults.")
      .def("__repr__", [](const PolicyInfo& p) {
        return fmt::format("PolicyInfo(name='{}', evicts={}, sinks={})", p.name, p.evicts ? "True" : "False",
                           p.sinks);
      });

  m.def(
      "policies",
      [] {
        std::vector<PolicyInfo> out;
        for (const PolicyInfo* p : all_policies()) out.push_back(*p);
        return out;
      },
      "The registered eviction policies, in registry order (list of PolicyInfo).");

  nb::class_<Generation> gen(m, "Generation", "Result of Model.generate.");
  gen.def_ro("text", &Generation::text, "Generated text (the prompt excluded).")
      .def_ro("tokens", &Generation::tokens, "Generated token ids (the end-of-generation token excluded).")
      .def_ro("prompt_tokens", &Generation::prompt_tokens, "The prompt's token ids as run.")
      .def_ro("finish_reason", &Generation::finish_reason,
              "'stop' (end-of-generation token) or 'length' (max_tokens reached).");
  bind_stats(gen);

  nb::class_<Perplexity> ppl(m, "Perplexity", "Result of Model.perplexity.");
  ppl.def_ro("ppl", &Perplexity::ppl, "exp(mean nll).")
      .def_ro("nll", &Perplexity::nll, "-log p(token[i+1] | tokens[0..i]) in nats, one per scored token (N - 1).");
  bind_stats(ppl);

  // Defaults and docstrings live in the Python wrapper (python/kvevict/__init__.py), once.
  nb::class_<PyModel>(m, "Model")
      .def(nb::init<const std::string&>(), "path"_a)
      .def_prop_ro("path", [](const PyModel& p) { return p.model().path(); })
      .def_prop_ro("arch", [](const PyModel& p) { return p.model().config().arch; })
      .def_prop_ro("n_layers", [](const PyModel& p) { return p.model().config().n_layers; })
      .def_prop_ro("n_heads", [](const PyModel& p) { return p.model().config().n_heads; })
      .def_prop_ro("n_kv_heads", [](const PyModel& p) { return p.model().config().n_kv_heads; })
      .def_prop_ro("head_dim", [](const PyModel& p) { return p.model().config().head_dim; })
      .def_prop_ro("n_vocab", [](const PyModel& p) { return p.model().config().n_vocab; })
      .def_prop_ro("context_length", [](const PyModel& p) { return p.model().config().context_length; })
      .def_prop_ro("bos_id", [](const PyModel& p) { return p.tok().bos_id(); })
      .def_prop_ro("eos_id", [](const PyModel& p) { return p.tok().eos_id(); })
      .def("tokenize", &PyModel::tokenize, "text"_a, "add_special"_a, "parse_special"_a)
      .def("detokenize", &PyModel::detokenize, "ids"_a, "special"_a)
      .def("chat_prompt", &PyModel::chat_prompt, "messages"_a, "add_generation_prompt"_a, "enable_thinking"_a,
           "template"_a)
      .def(
          "generate",
          [](const PyModel& self, const Prompt& prompt, const std::string& policy, int64_t budget, int64_t buffer,
             std::optional<int> sinks, std::optional<bool> protect_prompt, std::vector<std::string> params,
             int64_t max_tokens, float temperature, float top_p, int top_k, uint64_t seed, bool ignore_eos,
             std::vector<std::string> stop, bool special, const std::string& kv_type, int threads) {
            GenerationConfig gc;
            gc.sampler.temperature = temperature;
            gc.sampler.top_p = top_p;
            gc.sampler.top_k = top_k;
            gc.sampler.seed = seed;
            gc.max_new_tokens = max_tokens;
            gc.ignore_eos = ignore_eos;
            gc.stop = std::move(stop);
            // As `kvevict generate`: an incomplete trailing character is handed out verbatim.
            gc.keep_incomplete_tail = true;
            return self.generate(prompt, PolicyKwargs{policy, budget, buffer, sinks, protect_prompt, seed, params},
                                 gc, special, kv_type, threads);
          },
          "prompt"_a, "policy"_a, "budget"_a, "buffer"_a, "sinks"_a.none(), "protect_prompt"_a.none(), "params"_a,
          "max_tokens"_a, "temperature"_a, "top_p"_a, "top_k"_a, "seed"_a, "ignore_eos"_a, "stop"_a, "special"_a,
          "kv_type"_a, "threads"_a)
      .def(
          "perplexity",
          [](const PyModel& self, const Prompt& text, const std::string& policy, int64_t budget, int64_t buffer,
             std::optional<int> sinks, std::optional<bool> protect_prompt, std::vector<std::string> params,
             uint64_t seed, int threads) {
            return self.perplexity(text, PolicyKwargs{policy, budget, buffer, sinks, protect_prompt, seed, params},
                                   threads);
          },
          "text"_a, "policy"_a, "budget"_a, "buffer"_a, "sinks"_a.none(), "protect_prompt"_a.none(), "params"_a,
          "seed"_a, "threads"_a);
}
