// kvevict._kvevict: the Python binding (nanobind) of the engine. It adds no engine logic of its
// own: policies and schedules come from the one settings builder (engine/policy_settings.h),
// generation from the one generation loop (engine/generation.h), perplexity from eval/perplexity.h. Errors keep the engine's
// messages, with the field a FieldError names spelled as this package's keyword (`buffer`,
// `top_p`, ...). Compute runs with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <array>
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
#include "eval/prompt.h"
#include "eval/results.h"
#include "eval/runner.h"
#include "eval/summary.h"
#include "eval/task_file.h"
#include "eviction/external.h"
#include "eviction/query_window.h"
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
    case Field::RoundInterval: return "round_interval";
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
  const PolicyInfo* custom = nullptr;  ///< a Python selector's policy (PyPolicy), or null
  std::optional<int64_t> round_interval = std::nullopt;  ///< s, decode steps between rounds; unset = buffer
};

/// The one settings builder, fed from keyword arguments.
CheckedPolicy checked_policy(const PolicyKwargs& k) {
  PolicySettings s;
  s.policy = k.policy;
  s.budget = k.budget;
  s.recent = k.buffer;
  s.interval = k.round_interval;
  s.sinks = k.sinks;
  s.protect_prompt = k.protect_prompt;
  s.seed = k.seed;
  s.params = k.params;
  s.custom = k.custom;
  return build_policy_config(s);
}


/// What a Python selector's `score(c)` receives for one (layer, KV head) of a round: the round's
/// numbers and, on first access, read-only NumPy arrays of the candidates. Each array is a copy
/// that owns its memory (a capsule frees it), because the engine's buffers behind it (the cache,
/// compacted after the round and freed with the sequence; the round's gathered queries, freed
/// when the round ends) do not outlive the call: an array kept past the call reads stale but
/// valid data, never freed memory. PySelector still refuses a kept array or `c` (an Error),
/// since stale data kept by mistake is a bug in the selector. Each array is made once per call.
struct Candidates {
  const RoundInput* in = nullptr;
  const HeadCandidates* c = nullptr;
  bool valid = true;
  std::array<nb::object, 7> arrays;  ///< keys, values, positions, attention, queries, queries_pre, query_positions
  const HeadCandidates& head() const {
    if (!valid)
      throw Error("selector candidates: used after the selector's call returned (copy what you keep: numpy.array(x))");
    return *c;
  }
};

/// The read-only NumPy array of `data` [shape], copied into memory the array owns; made on first
/// access and cached in self.arrays[slot].
template <class T, size_t N>
nb::object view(Candidates& self, size_t slot, const T* data, const std::array<size_t, N>& shape, const char* what) {
  if (!data) throw Error(fmt::format("selector candidates: '{}' was not asked for (add it to the selector's needs)", what));
  nb::object& cached = self.arrays[slot];
  if (!cached.is_valid()) {
    size_t n = 1;
    for (size_t d : shape) n *= d;
    T* copy = new T[n > 0 ? n : 1];
    std::copy(data, data + n, copy);
    nb::capsule owner(copy, [](void* p) noexcept { delete[] static_cast<T*>(p); });
    cached = nb::cast(nb::ndarray<nb::numpy, const T>(copy, N, shape.data(), owner));
  }
  return cached;
}

/// A policy whose selector is Python code: the registry entry (PolicyInfo) the settings builder
/// runs like a built-in one, and the adapter it calls (kvevict._selector_adapter: validation and
/// conversion of the returned scores or indices).
struct PyPolicy {
  PolicyInfo info;
  nb::object adapter;
  ExternalNeeds needs;
};

/// A Python selector as the eviction layer sees it (eviction/external.h). score_round takes the
/// GIL once per round and calls the adapter for each (layer, KV head), layer-major, on the thread
/// that runs the round, so a selector's calls come in a fixed order whatever the thread count.
class PySelector final : public ExternalSelector {
 public:
  PySelector(nb::object adapter, ExternalNeeds needs, std::string name)
      : ExternalSelector(needs), adapter_(std::move(adapter)), name_(std::move(name)) {}
  ~PySelector() override {
    nb::gil_scoped_acquire gil;
    adapter_.reset();
  }
  void score_round(const RoundInput& in, std::span<const HeadCandidates> heads, std::span<float> scores) const override {
    nb::gil_scoped_acquire gil;
    const auto n = static_cast<size_t>(in.n_candidates);
    for (size_t i = 0; i < heads.size(); ++i) {
      auto* cand = new Candidates{&in, &heads[i], true, {}};
      nb::object obj = nb::cast(cand, nb::rv_policy::take_ownership);
      struct Invalidate {
        Candidates* c;
        ~Invalidate() { c->valid = false; }
      } invalidate{cand};
      {
        nb::object r = adapter_(obj);
        const auto a = nb::cast<nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>>(r);
        if (a.shape(0) != n)
          throw Error(fmt::format("selector '{}': {} scores for {} candidates", name_, a.shape(0), n));
        std::copy(a.data(), a.data() + n, scores.begin() + static_cast<std::ptrdiff_t>(i * n));
      }
      bool kept = Py_REFCNT(obj.ptr()) != 1;
      for (const nb::object& a : cand->arrays) kept = kept || (a.is_valid() && Py_REFCNT(a.ptr()) != 1);
      if (kept)
        throw Error(fmt::format("selector '{}' (layer {}, KV head {}): kept its candidates or a view of them past the "
                                "call; after it they hold stale data the round is about to evict (copy what you keep: "
                                "numpy.array(x))",
                                name_, heads[i].layer, heads[i].kv_head));
    }
  }

 private:
  nb::object adapter_;
  std::string name_;
};

PyPolicy* make_py_policy(const std::string& name, nb::object adapter, bool queries, bool queries_pre, bool attention,
                         int window, bool protect_prompt, int sinks) {
  if (name.empty()) throw Error("selector name: must not be empty");
  for (const PolicyInfo* p : all_policies())
    if (p->name == name)
      throw Error(fmt::format("selector name '{}': a built-in policy has it; choose another", name));
  if (sinks < 0) throw Error(fmt::format("selector sinks {}: must be >= 0", sinks));
  if (window < 1 || window > kMaxQueryWindow)
    throw Error(fmt::format("selector window {}: must be in [1, {}] (as snapkv's window)", window, kMaxQueryWindow));
  auto* p = new PyPolicy;
  p->adapter = std::move(adapter);
  p->needs = ExternalNeeds{queries, queries_pre, attention, window};
  p->info.name = name;
  p->info.summary = "A selector written in Python.";
  p->info.source = "kvevict.Selector (docs/python.md)";
  p->info.protect_prompt = protect_prompt;
  p->info.sinks = sinks;
  p->info.make = [p](const SelectorParams&) -> std::unique_ptr<Selector> {
    nb::gil_scoped_acquire gil;
    return std::make_unique<PySelector>(p->adapter, p->needs, p->info.name);
  };
  return p;
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
  // Per decode step (index t = the step that appended generated token t): recorded after the step
  // and any eviction round it triggered.
  std::vector<int64_t> step_slots;      ///< live slots per (layer, KV head)
  std::vector<int64_t> step_rounds;     ///< eviction rounds run so far
  std::vector<double> step_decode_ms;   ///< this step's forward pass, ms
  std::vector<double> step_round_ms;    ///< this step's eviction round (scoring + compaction), ms; 0 without one
  // Keep log (keep_log=True): after each round, the positions every (layer, KV head) holds.
  bool keep_requested = false;
  int n_layers = 0, n_kv_heads = 0;
  int64_t keep_width = 0;               ///< B: slots after a round
  std::vector<int32_t> keep_positions;  ///< [rounds][n_layers][n_kv_heads][B]
  std::vector<int64_t> keep_steps;      ///< [rounds] decode step after which the round ran
  std::vector<int64_t> keep_n_seen;     ///< [rounds] tokens processed when it ran
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
                      const std::string& kv_type, int threads, bool keep_log) const {
    const CheckedPolicy kv = checked_policy(pk);
    validate_generation(gc, tok().n_vocab());
    if (threads < 0) throw Error(fmt::format("threads {}: must be >= 0 (0 = all cores)", threads));
    const KvType kt = parse_kv_type(kv_type);
    const std::vector<int32_t> ids = prompt_ids(prompt, special);
    Generation g;
    g.prompt_tokens = ids;
    g.keep_requested = keep_log;
    g.n_layers = model_->config().n_layers;
    g.n_kv_heads = model_->config().n_kv_heads;
    g.keep_width = kv.policy().evicts ? kv.eviction().budget : 0;
    g.policy = kv.policy().name;
    nb::gil_scoped_release release;
    Engine engine(*model_, threads, kt);
    check_kv_type(engine.kv_type(), kv);
    if (kv.policy().selector) (void)kv.policy().selector->make_state(engine.kv_shape());
    GenerationCallbacks cb;
    SequenceStats last;
    cb.on_decode = [&](size_t, const Sequence& seq) {
      const SequenceStats& st = seq.stats;
      g.step_slots.push_back(seq.kv.length(0));
      g.step_rounds.push_back(st.rounds);
      g.step_decode_ms.push_back(st.decode_ms - last.decode_ms);
      g.step_round_ms.push_back(st.score_ms + st.compact_ms - last.score_ms - last.compact_ms);
      if (keep_log && st.rounds > last.rounds) {
        const KvShape& shape = seq.kv.shape();
        g.keep_width = seq.kv.length(0);
        for (int l = 0; l < shape.n_layers; ++l)
          for (int h = 0; h < shape.n_kv_heads; ++h) {
            const int32_t* pos = seq.kv.positions(l, h);
            g.keep_positions.insert(g.keep_positions.end(), pos, pos + seq.kv.length(l));
          }
        g.keep_steps.push_back(static_cast<int64_t>(g.step_slots.size()) - 1);
        g.keep_n_seen.push_back(seq.n_seen);
      }
      last = st;
    };
    GenerationOutput out = kvevict::generate(engine, kv, GenerationInput{0, ids}, gc, cb);
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

/// One (policy, budget) column of an evaluate() grid as Python gives it: a policy name, or a
/// Python selector's policy.
struct GridPolicy {
  std::string name;
  const PyPolicy* custom = nullptr;
};

/// What evaluate() returns before Python shapes it: the rollouts and the report, as the CLI's
/// rollouts.jsonl lines and summary.{csv,md,json}.
struct EvalOutput {
  std::vector<std::string> rollouts;  ///< RolloutRecord::to_json().dump() per rollout, in grid order
  std::string csv, markdown, json;
};

/// `kvevict eval` in memory (cli/eval.cpp's run without the output directory, progress bar and
/// shards): the same grid of cells (a policy that does not evict runs once), prompts
/// (eval/prompt.h), rollouts (eval/runner.h run_grid) and report (eval/summary.h), so the same
/// settings give the CLI's rollouts and summary.csv.
EvalOutput evaluate(const PyModel& pm, const std::string& tasks_path, const std::vector<GridPolicy>& policies,
                    const std::vector<int64_t>& budgets, const PolicyKwargs& shared, const std::string& reference,
                    int rollouts, float temperature, float top_p, int top_k, int64_t max_length, int64_t max_new_tokens,
                    const std::string& tmpl, std::optional<bool> math_suffix, int64_t limit, int bootstrap,
                    int threads) {
  SamplerConfig sampler{temperature, top_p, top_k, shared.seed};
  validate_sampler(sampler);
  if (rollouts < 1 || rollouts > limits::kRollouts)
    throw Error(fmt::format("rollouts {}: must be in [1, {}]", rollouts, limits::kRollouts));
  if (max_length < 2) throw Error(fmt::format("max_length {}: must be >= 2", max_length));
  if (max_new_tokens < 0) throw Error(fmt::format("max_new_tokens {}: must be >= 0", max_new_tokens));
  if (limit < 0) throw Error(fmt::format("limit {}: must be >= 0", limit));
  if (bootstrap < 100) throw Error(fmt::format("bootstrap {}: use at least 100 resamples", bootstrap));
  if (threads < 0) throw Error(fmt::format("threads {}: must be >= 0 (0 = all cores)", threads));
  if (policies.empty()) throw Error("policies: must name at least one policy");
  std::vector<std::string> names;
  for (const GridPolicy& g : policies) {
    if (std::find(names.begin(), names.end(), g.name) != names.end())
      throw Error(fmt::format("policies: '{}' is given twice", g.name));
    names.push_back(g.name);
  }
  if (std::find(names.begin(), names.end(), reference) == names.end())
    throw Error(fmt::format("reference '{}' is not among the policies", reference));
  std::vector<std::string> builtin;
  for (const GridPolicy& g : policies)
    if (!g.custom) builtin.push_back(g.name);
  if (!shared.params.empty()) check_param_items(shared.params, builtin);
  for (int64_t b : budgets)
    if (b < 1) throw Error(fmt::format("budgets: {} is not a positive integer", b));
  std::vector<EvalCell> cells;
  for (const GridPolicy& g : policies) {
    PolicySettings ps;
    ps.policy = g.name;
    ps.recent = shared.buffer;
    ps.interval = shared.round_interval;
    ps.sinks = shared.sinks;
    ps.protect_prompt = shared.protect_prompt;
    ps.seed = shared.seed;
    ps.params = g.custom ? std::vector<std::string>{} : shared.params;
    ps.custom = g.custom ? &g.custom->info : nullptr;
    const Policy policy = build_policy(ps, g.name, /*check_params=*/false);
    if (!policy.evicts) {
      cells.push_back(EvalCell{{g.name, 0}, build_schedule(ps, policy)});
      continue;
    }
    if (budgets.empty()) throw Error(fmt::format("policy '{}' evicts and needs budgets=[B1, B2, ...]", g.name));
    for (int64_t b : budgets) {
      ps.budget = b;
      cells.push_back(EvalCell{{g.name, b}, build_schedule(ps, policy)});
    }
  }
  TaskReadOptions ro;
  ro.limit = limit;
  ro.max_bytes = limits::kFileBytes;
  ro.option = "tasks";
  const EvalTaskFile tf = read_tasks(tasks_path, ro);
  PromptOptions po;
  po.choice = parse_template_choice(tmpl);
  po.math_suffix = math_suffix.value_or(tf.format != TaskFormat::Kvevict);
  const PromptBuilder prompts(pm.model(), po);

  EvalSettings st;
  st.model_file = std::filesystem::path(pm.model().path()).filename().string();
  st.tasks_file = std::filesystem::path(tasks_path).filename().string();
  st.tasks_format = task_format_name(tf.format);
  st.n_tasks = static_cast<int64_t>(tf.tasks.size());
  st.tasks_digest = tasks_digest(tf.tasks);
  for (const EvalCell& c : cells) st.cells.push_back(c.spec);
  st.reference = reference;
  st.rollouts = rollouts;
  st.temperature = temperature;
  st.top_p = top_p;
  st.top_k = top_k;
  st.max_length = max_length;
  st.max_new_tokens = max_new_tokens;
  st.seed = shared.seed;
  st.prompt_template = prompts.template_name();
  st.math_suffix = po.math_suffix;
  st.bootstrap_resamples = bootstrap;

  RolloutOptions opts;
  opts.rollouts = rollouts;
  opts.sampler = sampler;
  opts.max_length = max_length;
  opts.max_new_tokens = max_new_tokens;
  std::vector<std::vector<int32_t>> prompt_ids;
  for (const EvalTask& t : tf.tasks) prompt_ids.push_back(prompts.tokens(t.problem));

  EvalOutput out;
  std::vector<RolloutRecord> records;
  {
    nb::gil_scoped_release release;
    Engine engine(pm.model(), threads);
    for (const EvalCell& c : cells)
      if (c.kv.policy().selector) (void)c.kv.policy().selector->make_state(engine.kv_shape());
    run_grid(
        engine, tf.tasks, prompt_ids, cells, opts, [](const std::string&) { return false; },
        [&](RolloutRecord&& rec) {
          out.rollouts.push_back(rec.to_json().dump());
          records.push_back(std::move(rec));
        });
  }
  const EvalSummary summary = summarize(st, records);
  out.csv = summary_csv(summary);
  out.markdown = summary_markdown(summary);
  out.json = summary_json(summary).dump();
  return out;
}

template <class T>
void bind_stats(nb::class_<T>& c) {
  c.def_prop_ro("eviction_rounds", [](const T& r) { return r.stats.rounds; }, "Eviction rounds run.")
      .def_prop_ro("peak_slots", [](const T& r) { return r.stats.peak_slots; },
                   "Most live slots ever held by one (layer, KV head); at most budget + round_interval "
                   "(default: + buffer) when the policy evicts.")
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

/// A NumPy array owning a copy of `v`, shaped `shape` (product = v.size()).
template <class T>
nb::ndarray<nb::numpy, T> owned(const std::vector<T>& v, std::vector<size_t> shape) {
  auto* copy = new std::vector<T>(v);
  nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(copy->data(), shape.size(), shape.data(), owner);
}

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

  nb::class_<Candidates>(m, "Candidates",
                         "The candidate slots of one (layer, KV head) at an eviction round, as a Python selector's "
                         "score(c) receives them (docs/eviction-spec.md §2). Arrays are read-only NumPy arrays "
                         "copied from the engine's memory on first access, for use during the call: keeping one (or "
                         "c) past it is an Error; copy what you keep (numpy.array(x)).")
      .def_prop_ro("layer", [](const Candidates& c) { return c.head().layer; }, "Layer index.")
      .def_prop_ro("kv_head", [](const Candidates& c) { return c.head().kv_head; }, "KV head index.")
      .def_prop_ro("n_candidates", [](const Candidates& c) { return c.head().n_candidates; },
                   "Candidates: every live slot but the recent buffer, oldest first.")
      .def_prop_ro("head_dim", [](const Candidates& c) { return c.head().head_dim; })
      .def_prop_ro("group_size", [](const Candidates& c) { return c.head().group_size; },
                   "Query heads of this KV head's GQA group (0 when no queries were asked for).")
      .def_prop_ro("round", [](const Candidates& c) { (void)c.head(); return c.in->round; },
                   "0-based eviction round of the sequence.")
      .def_prop_ro("n_seen", [](const Candidates& c) { (void)c.head(); return c.in->n_seen; },
                   "Tokens processed so far (logical position of the next token).")
      .def_prop_ro("prompt_len", [](const Candidates& c) { (void)c.head(); return c.in->prompt_len; })
      .def_prop_ro("budget", [](const Candidates& c) { (void)c.head(); return c.in->budget; },
                   "B: slots per (layer, KV head) after the round.")
      .def_prop_ro("buffer", [](const Candidates& c) { (void)c.head(); return c.in->recent; },
                   "r: the recent buffer (never a candidate).")
      .def_prop_ro("k_sel", [](const Candidates& c) { (void)c.head(); return c.in->k_sel(); },
                   "K_sel = B - r: candidates the round keeps, pinned ones included.")
      .def_prop_ro("n_pinned", [](const Candidates& c) { (void)c.head(); return c.in->n_pinned; },
                   "Positions [0, n_pinned) are kept whatever the score (prompt pin, sinks).")
      .def_prop_ro("seed", [](const Candidates& c) { (void)c.head(); return c.in->seed; }, "The run's base seed.")
      .def_prop_ro("stream", [](const Candidates& c) { return c.head().stream; },
                   "A seed for this (sequence, round, layer, KV head) derived from the run's seed: "
                   "numpy.random.default_rng(c.stream) makes a seeded choice reproducible.")
      .def_prop_ro("keys", [](Candidates& c) {
            const HeadCandidates& h = c.head();
            return view<float, 2>(c, 0, h.keys, {static_cast<size_t>(h.n_candidates), static_cast<size_t>(h.head_dim)}, "keys");
          }, "[n_candidates, head_dim] float32 post-RoPE keys.")
      .def_prop_ro("values", [](Candidates& c) {
            const HeadCandidates& h = c.head();
            return view<float, 2>(c, 1, h.values, {static_cast<size_t>(h.n_candidates), static_cast<size_t>(h.head_dim)}, "values");
          }, "[n_candidates, head_dim] float32 values.")
      .def_prop_ro("positions", [](Candidates& c) {
            const HeadCandidates& h = c.head();
            return view<int32_t, 1>(c, 2, h.positions, {static_cast<size_t>(h.n_candidates)}, "positions");
          }, "[n_candidates] int32 logical positions, increasing.")
      .def_prop_ro("attention", [](Candidates& c) {
            const HeadCandidates& h = c.head();
            return view<double, 1>(c, 3, h.attention, {static_cast<size_t>(h.n_candidates)}, "attention");
          }, "[n_candidates] float64: attention each slot received since it entered the cache, summed over the "
             "group's query heads (H2O's score; needs 'attention').")
      .def_prop_ro("queries", [](Candidates& c) {
            const HeadCandidates& h = c.head();
            return view<float, 3>(c, 4, h.queries, {static_cast<size_t>(h.n_queries), static_cast<size_t>(h.group_size),
                                                 static_cast<size_t>(h.head_dim)}, "queries");
          }, "[n_queries, group_size, head_dim] float32: the layer's last `window` post-RoPE queries of this "
             "group, oldest first (needs 'queries').")
      .def_prop_ro("queries_pre", [](Candidates& c) {
            const HeadCandidates& h = c.head();
            return view<float, 3>(c, 5, h.queries_pre, {static_cast<size_t>(h.n_queries), static_cast<size_t>(h.group_size),
                                                     static_cast<size_t>(h.head_dim)}, "queries_pre");
          }, "The same queries un-rotated to their pre-RoPE form (needs 'queries_pre').")
      .def_prop_ro("query_positions", [](Candidates& c) {
            const HeadCandidates& h = c.head();
            return view<int64_t, 1>(c, 6, h.query_positions, {static_cast<size_t>(h.n_queries)}, "queries");
          }, "[n_queries] int64 logical positions of the held queries.");

  nb::class_<PyPolicy>(m, "PythonPolicy", "A Python selector registered for one run (made by kvevict.Selector).");
  m.attr("MAX_QUERY_WINDOW") = kMaxQueryWindow;
  m.def("_python_policy", &make_py_policy, "name"_a, "adapter"_a, "queries"_a, "queries_pre"_a, "attention"_a,
        "window"_a, "protect_prompt"_a, "sinks"_a, nb::rv_policy::take_ownership);

  nb::class_<GridPolicy>(m, "_GridPolicy")
      .def(nb::init<std::string, const PyPolicy*>(), "name"_a, "custom"_a.none(), nb::keep_alive<1, 3>());
  nb::class_<EvalOutput>(m, "_EvalOutput")
      .def_ro("rollouts", &EvalOutput::rollouts)
      .def_ro("csv", &EvalOutput::csv)
      .def_ro("markdown", &EvalOutput::markdown)
      .def_ro("json", &EvalOutput::json);
  m.def(
      "_evaluate",
      [](const PyModel& model, const std::string& tasks, const std::vector<GridPolicy>& policies,
         const std::vector<int64_t>& budgets, int64_t buffer, std::optional<int64_t> round_interval,
         std::optional<int> sinks, std::optional<bool> protect_prompt, std::vector<std::string> params, uint64_t seed,
         const std::string& reference, int rollouts, float temperature, float top_p, int top_k, int64_t max_length,
         int64_t max_new_tokens, const std::string& tmpl, std::optional<bool> math_suffix, int64_t limit,
         int bootstrap, int threads) {
        PolicyKwargs shared{"", 0, buffer, sinks, protect_prompt, seed, std::move(params)};
        shared.round_interval = round_interval;
        return evaluate(model, tasks, policies, budgets, shared, reference, rollouts, temperature, top_p, top_k,
                        max_length, max_new_tokens, tmpl, math_suffix, limit, bootstrap, threads);
      },
      "model"_a, "tasks"_a, "policies"_a, "budgets"_a, "buffer"_a, "round_interval"_a.none(), "sinks"_a.none(),
      "protect_prompt"_a.none(),
      "params"_a, "seed"_a, "reference"_a, "rollouts"_a, "temperature"_a, "top_p"_a, "top_k"_a, "max_length"_a,
      "max_new_tokens"_a, "template"_a, "math_suffix"_a.none(), "limit"_a, "bootstrap"_a, "threads"_a);

  nb::class_<Generation> gen(m, "Generation", "Result of Model.generate.");
  gen.def_ro("text", &Generation::text, "Generated text (the prompt excluded).")
      .def_ro("tokens", &Generation::tokens, "Generated token ids (the end-of-generation token excluded).")
      .def_ro("prompt_tokens", &Generation::prompt_tokens, "The prompt's token ids as run.")
      .def_ro("finish_reason", &Generation::finish_reason,
              "'stop' (end-of-generation token) or 'length' (max_tokens reached).");
  bind_stats(gen);

  gen.def_prop_ro(
         "steps",
         [](const Generation& g) {
           const size_t n = g.step_slots.size();
           nb::dict d;
           d["live_slots"] = owned(g.step_slots, {n});
           d["eviction_rounds"] = owned(g.step_rounds, {n});
           d["decode_ms"] = owned(g.step_decode_ms, {n});
           d["round_ms"] = owned(g.step_round_ms, {n});
           return d;
         },
         "Per decode step (one entry per step, in order), a dict of NumPy arrays: 'live_slots' (slots per "
         "(layer, KV head) after the step and any round it triggered), 'eviction_rounds' (rounds run so far), "
         "'decode_ms' (the step's forward pass), 'round_ms' (its eviction round: scoring + compaction; 0 without one).")
      .def_prop_ro(
          "keep_log",
          [](const Generation& g) -> nb::object {
            if (!g.keep_requested) return nb::none();
            const size_t r = g.keep_steps.size();
            nb::dict d;
            d["positions"] = owned(g.keep_positions, {r, static_cast<size_t>(g.n_layers),
                                                      static_cast<size_t>(g.n_kv_heads), static_cast<size_t>(g.keep_width)});
            d["step"] = owned(g.keep_steps, {r});
            d["n_seen"] = owned(g.keep_n_seen, {r});
            return d;
          },
          "With generate(keep_log=True), a dict of NumPy arrays: 'positions' [rounds, n_layers, n_kv_heads, "
          "budget] int32, the logical positions each (layer, KV head) holds right after each eviction round "
          "(ascending; the last `buffer` are the recent buffer); 'step' [rounds], the decode step after which "
          "the round ran; 'n_seen' [rounds], tokens processed then. None without keep_log.");

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
          [](const PyModel& self, const Prompt& prompt, const std::string& policy, const PyPolicy* custom,
             int64_t budget, int64_t buffer, std::optional<int64_t> round_interval, std::optional<int> sinks,
             std::optional<bool> protect_prompt, std::vector<std::string> params, int64_t max_tokens, float temperature, float top_p, int top_k,
             uint64_t seed, bool ignore_eos, std::vector<std::string> stop, bool special, const std::string& kv_type,
             int threads, bool keep_log) {
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
            return self.generate(prompt,
                                 PolicyKwargs{policy, budget, buffer, sinks, protect_prompt, seed, params,
                                              custom ? &custom->info : nullptr, round_interval},
                                 gc, special, kv_type, threads, keep_log);
          },
          "prompt"_a, "policy"_a, "custom"_a.none(), "budget"_a, "buffer"_a, "round_interval"_a.none(), "sinks"_a.none(), "protect_prompt"_a.none(), "params"_a,
          "max_tokens"_a, "temperature"_a, "top_p"_a, "top_k"_a, "seed"_a, "ignore_eos"_a, "stop"_a, "special"_a,
          "kv_type"_a, "threads"_a, "keep_log"_a)
      .def(
          "perplexity",
          [](const PyModel& self, const Prompt& text, const std::string& policy, const PyPolicy* custom,
             int64_t budget, int64_t buffer, std::optional<int64_t> round_interval, std::optional<int> sinks,
             std::optional<bool> protect_prompt, std::vector<std::string> params, uint64_t seed, int threads) {
            return self.perplexity(text,
                                   PolicyKwargs{policy, budget, buffer, sinks, protect_prompt, seed, params,
                                                custom ? &custom->info : nullptr, round_interval},
                                   threads);
          },
          "text"_a, "policy"_a, "custom"_a.none(), "budget"_a, "buffer"_a, "round_interval"_a.none(), "sinks"_a.none(), "protect_prompt"_a.none(), "params"_a,
          "seed"_a, "threads"_a);
}
