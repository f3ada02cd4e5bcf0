// `kvevict generate`: text generation under a KV budget, one summary line at the end.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <optional>
#include <random>

#include "cli/common.h"
#include "engine/engine.h"
#include "engine/generation.h"
#include "eval/keeplog.h"
#include "eval/perplexity.h"
#include "model/chat_template.h"
#include "model/model.h"
#include "util/error.h"

namespace kvevict::cli {
namespace {

using Clock = std::chrono::steady_clock;

// -n: -1 (llama.cpp's "until the end of generation or the context") or 1 .. limits::kTokens.
CLI::Validator n_predict_check() {
  return CLI::Validator(
      [](std::string& in) -> std::string {
        if (in == "-1") return {};
        std::string v = in;
        if (int_range(1, limits::kTokens)(v).empty()) return {};
        return fmt::format("must be -1 (until the end of generation or the context) or in [1, {}] (got {})",
                           limits::kTokens, in);
      },
      "");
}

struct GenerateArgs {
  std::string model, prompt;
  bool prompt_given = false;  ///< -p was on the command line (an empty -p is an error, not "no -p")
  std::string file;           ///< -f FILE: the prompt read from a file instead of -p
  int64_t n = 256;            ///< -n; -1: until the end of generation or the context
  int64_t ctx = 0;            ///< -c: context size in tokens (0: the model's context_length)
  bool ctx_given = false;     ///< -c was on the command line
  bool random_seed = false;   ///< --seed -1: the seed was drawn (and is printed)
  float temp = 0.6f, top_p = 0.95f;
  float min_p = 0.0f;  ///< --min-p: drop tokens below min_p x the top probability (llama.cpp's --min-p)
  int top_k = 0;
  int threads = 0;
  std::string kv_type = "f32";  ///< --kv-type: element type of the KV cache
  bool ignore_eos = false;
  std::string keep_log;  ///< --keep-log FILE: one JSON line per round and layer
  bool keep_log_positions = false;
  bool chat = false;          ///< --chat: wrap the prompt in the model's chat template
  bool no_think = false;      ///< --no-think: enable_thinking=false (Qwen3, DeepSeek-R1 templates)
  std::string chat_template;  ///< --chat-template NAME: template family instead of the GGUF's
  PolicyArgs policy;
};

// Tokens to generate after a prompt of `prompt` tokens: -n, or with -n -1 what the context
// leaves (llama.cpp's -n -1: until the end of generation or a full context). With -c the
// context caps prompt + generated tokens, as llama.cpp without context shift; without -c the
// context is the model's context_length and caps only -n -1. Throws kvevict::Error when the
// prompt leaves no room, or -n -1 would exceed limits::kTokens.
int64_t generation_length(const GenerateArgs& a, int64_t prompt, int64_t model_context) {
  const int64_t context = a.ctx > 0 ? a.ctx : model_context;
  if (!a.ctx_given && a.n > 0) return a.n;
  const std::string which = a.ctx > 0 ? fmt::format("-c {}", a.ctx) : fmt::format("context_length {}", context);
  if (prompt >= context)
    throw Error(fmt::format("the prompt has {} tokens: the context ({}) leaves no room to generate{}", prompt, which,
                            a.ctx > 0 ? "" : "; pass a larger -c"));
  const int64_t room = context - prompt;
  if (a.n > 0) return std::min(a.n, room);
  if (room > limits::kTokens)
    throw Error(fmt::format("-n -1: the context ({}) leaves {} tokens, above the limit of {}; pass -c or -n", which,
                            room, limits::kTokens));
  return room;
}

int run_generate(const GenerateArgs& a) {
  // Options first, then the model, then what needs its shape: all before the first token.
  if (!a.chat_template.empty()) (void)ChatTemplate::by_name(a.chat_template);  // bad name: fail before loading
  const CheckedPolicy kv = build_policy_config(policy_settings(a.policy));
  const Policy& policy = kv.policy();
  const EvictionConfig& cfg = kv.eviction();
  if (const std::string w = unused_schedule_warning(a.policy, {policy}); !w.empty()) warn(w);
  SamplerConfig sc{a.temp, a.top_p, a.top_k, a.policy.seed};
  sc.min_p = a.min_p;
  validate_sampler(sc);
  if (a.n < 1 && a.n != -1) throw Error(fmt::format("-n {}: must be -1 or >= 1", a.n));
  if (!a.prompt_given && a.file.empty()) throw Error("no prompt: give -p TEXT or -f FILE");
  // llama.cpp's -f: the file's text, one trailing newline dropped.
  std::string user_text = a.prompt;
  if (!a.file.empty()) {
    user_text = read_file(a.file, "-f");
    if (!user_text.empty() && user_text.back() == '\n') user_text.pop_back();
  }
  // As the server's /v1/completions: an empty prompt is refused, not run from BOS alone.
  // With --chat the template still renders a user turn (the server's chat endpoint takes it too).
  if (user_text.empty() && !a.chat)
    throw Error(a.file.empty() ? std::string("-p \"\": the prompt must not be empty")
                               : fmt::format("-f {}: the prompt must not be empty", a.file));
  if (a.random_seed) fmt::print(stderr, "kvevict: seed {} (drawn for --seed -1)\n", a.policy.seed);
  // -c is the context size the model runs with, as llama.cpp's: it picks the LongRoPE set too.
  const auto model = Model::load(a.model, LoadOptions{.context_size = a.ctx});
  const Tokenizer& tok = model->tokenizer();
  // With --chat the user's text becomes one user turn (no system prompt, generation prompt
  // added, as the paper runs its models); the rendered text holds special tokens as text.
  std::string prompt_text = user_text;
  bool add_special = true, parse_special = false;
  if (a.chat) {
    const ChatTemplate chat =
        ChatTemplate::from_text(model->chat_template(), model->path(), model->chat_template_key(), a.chat_template);
    if (a.no_think && !chat.can_disable_thinking())
      warn(fmt::format("--no-think has no effect with the {} chat template", chat.name()));
    prompt_text = chat.render({{"user", user_text}}, ChatOptions{true, !a.no_think});
    add_special = !chat.renders_bos();
    parse_special = true;
  }
  const std::vector<int32_t> prompt = tok.encode(prompt_text, add_special, parse_special);
  const int64_t n = generation_length(a, static_cast<int64_t>(prompt.size()), model->config().context_length);
  if (auto w = long_prompt_warning(cfg, policy, static_cast<int64_t>(prompt.size()), flag_name); !w.empty()) warn(w);
  if (!policy.evicts && static_cast<int64_t>(prompt.size()) + n > model->config().context_length)
    warn(fmt::format("{} tokens exceed the model's stated context of {}", prompt.size() + static_cast<size_t>(n),
                     model->config().context_length));

  Engine engine(*model, a.threads, parse_kv_type(a.kv_type));
  check_kv_type(engine.kv_type(), kv);
  if (policy.selector) (void)policy.selector->make_state(engine.kv_shape());  // another model's statistics
  std::optional<KeepLogWriter> keep_log;
  if (!a.keep_log.empty()) keep_log.emplace(a.keep_log, a.keep_log_positions);
  GenerationConfig gen;
  gen.sampler = sc;
  gen.max_new_tokens = n;
  gen.ignore_eos = a.ignore_eos;
  gen.keep_incomplete_tail = true;  // the terminal gets every byte
  GenerationCallbacks cb;
  cb.on_token = [](size_t, const StepResult& step) {
    fmt::print("{}{}", step.text, step.tail);
    std::fflush(stdout);
  };
  int64_t rounds_logged = 0;
  if (keep_log)
    cb.on_decode = [&](size_t, const Sequence& seq) {
      if (seq.stats.rounds == rounds_logged) return;
      rounds_logged = seq.stats.rounds;
      keep_log->write_round(seq);
    };
  fmt::print("{}", prompt_text);
  std::fflush(stdout);
  const auto t0 = Clock::now();
  const GenerationOutput out = generate(engine, kv, {0, prompt}, gen, cb);
  const auto generated = static_cast<int64_t>(out.result.tokens.size());
  const Sequence& seq = *out.seq;
  // Decode time: the prefill (inside generate) is not part of the tokens-per-second figure.
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count() - seq.stats.prefill_ms / 1000.0;
  const SequenceStats& s = seq.stats;
  const int64_t thinking = thinking_trace_tokens(tok, out.result.tokens);
  fmt::print("\n");
  std::fflush(stdout);
  // The summary goes to stderr: stdout is the text alone (pipe it, diff it).
  fmt::print(
      stderr,
      "[kvevict] policy {} | prompt {} tok | generated {} tok | {:.1f} tok/s | eviction rounds {} | "
      "peak slots/KV head {} ({} = {}) | KV bytes {} | score {:.3f} ms/round | compact {:.3f} ms/round{}{}\n",
      policy.name, prompt.size(), generated, secs > 0 ? static_cast<double>(generated) / secs : 0.0, s.rounds,
      s.peak_slots, cfg.interval > 0 && policy.evicts ? "B+s" : "B+r",
      policy.evicts ? fmt::format("{}", cfg.budget + cfg.round_interval()) : std::string("n/a"),
      seq.kv.allocated_bytes(), s.rounds ? s.score_ms / static_cast<double>(s.rounds) : 0.0,
      s.rounds ? s.compact_ms / static_cast<double>(s.rounds) : 0.0,
      // Per-token selector work (query windows, H2O's accumulation) happens outside the rounds.
      policy.selector && policy.selector->needs().any()
          ? fmt::format(" | observe {:.4f} ms/token",
                        s.observe_ms / static_cast<double>(prompt.size() + static_cast<size_t>(s.decode_steps)))
          : std::string(),
      // Reasoning models: tokens up to and including the first </think>, and the answer after it.
      thinking > 0 ? fmt::format(" | thinking {} tok | answer {} tok", thinking, generated - thinking) : std::string());
  return 0;
}

}  // namespace

void add_generate(CLI::App& root, std::vector<Command>& out) {
  auto g = std::make_shared<GenerateArgs>();
  auto* gen = root.add_subcommand("generate", "Generate text with eviction active and print a summary line");
  gen->add_option("-m,--model", g->model, model_help())->required()->check(CLI::ExistingPath);
  auto* prompt = gen->add_option("-p,--prompt", g->prompt, "Prompt text (or -f)")->each([g](const std::string&) {
    g->prompt_given = true;
  });
  gen->add_option("-f,--file", g->file, "Read the prompt from this file (one trailing newline dropped, as llama.cpp)")
      ->check(CLI::ExistingFile)
      ->excludes(prompt);
  gen->add_option("-n,--n-predict", g->n, "Tokens to generate; -1: until the end of generation or the context (-c)")
      ->check(n_predict_check())
      ->capture_default_str();
  gen->add_option("-c,--ctx-size", g->ctx,
                  "Context size in tokens: prompt + generated tokens stop there (llama.cpp without context shift); "
                  "picks the LongRoPE factor set; 0 = the model's context_length")
      ->check(int_range(0, limits::kTokens))
      ->each([g](const std::string&) { g->ctx_given = true; });
  gen->add_option("--temp", g->temp, "Temperature (0 = greedy)")->capture_default_str();
  gen->add_option("--top-p", g->top_p, "Nucleus sampling threshold (1 = off)")->capture_default_str();
  gen->add_option("--top-k", g->top_k, "Top-k (0 = off)")->check(int_range(0, limits::kTokens))->capture_default_str();
  gen->add_option("--min-p", g->min_p, "Min-p: drop tokens below this fraction of the top probability (0 = off)")
      ->capture_default_str();
  add_threads_option(*gen, g->threads);
  gen->add_option("--kv-type", g->kv_type, "KV cache element type: f32 or f16 (half the memory)")
      ->check(CLI::IsMember({"f32", "f16"}))
      ->capture_default_str();
  gen->add_flag("--ignore-eos", g->ignore_eos, "Keep generating after the end-of-sequence token");
  auto* keep_log =
      gen->add_option("--keep-log", g->keep_log,
                      "Write one JSON line per eviction round and layer: prompt survival per KV head, cross-head union "
                      "survival, pairwise Jaccard, slot coverage, survival by position band (see kvevict keeplog)");
  gen->add_flag("--keep-log-positions", g->keep_log_positions, "With --keep-log: also write the kept positions")
      ->needs(keep_log);
  auto* chat = gen->add_flag("--chat", g->chat,
                             "Wrap the prompt in the model's chat template as one user turn (no system prompt, "
                             "generation prompt added); stops at every end-of-generation token");
  gen->add_flag("--no-think", g->no_think, "With --chat: thinking off (Qwen3 / DeepSeek-R1 enable_thinking=false)")
      ->needs(chat);
  gen->add_option("--chat-template", g->chat_template,
                  "With --chat: template to use instead of the GGUF's (" + ChatTemplate::names() + ")")
      ->needs(chat);
  add_policy_options(*gen, g->policy);
  // llama.cpp's --seed -1: a random seed, printed so the run can be repeated.
  gen->get_option("--seed")
      ->description("Base seed of every random choice; -1: a random seed, printed")
      ->transform(CLI::Validator(
          [g](std::string& in) -> std::string {
            if (in != "-1") return {};
            std::random_device rd;
            in = std::to_string((static_cast<uint64_t>(rd()) << 32) | rd());
            g->random_seed = true;
            return {};
          },
          "", "random seed"));
  out.push_back({gen, [g] { return run_generate(*g); }});
}

}  // namespace kvevict::cli
