// The thinking trace (engine/reasoning.h) and its budget in the generation loop
// (engine/generation.h, ThinkingConfig). References are written in the test: the split of a whole
// string by plain searches (vLLM's DeepSeek-R1 / Qwen3 reasoning parsers: the text before the
// first "</think>" is reasoning, "<think>" opens a trace only at the start), and token sequences
// spelled out by hand from hand-made logits.
#include <gtest/gtest.h>

#include <map>

#include "engine/generation.h"
#include "engine/reasoning.h"

namespace kvevict {
namespace {

// Reference split of a whole text: plain string searches, no incremental state.
ReasoningText reference_split(const std::string& text, bool starts_open, bool* had) {
  std::string body = text;
  *had = starts_open;
  if (!starts_open) {
    const size_t b = text.find_first_not_of(" \t\r\n");
    if (b == std::string::npos || text.compare(b, 7, "<think>") != 0) return {"", text};
    body = text.substr(b + 7);
    *had = true;
  }
  const size_t close = body.find("</think>");
  if (close == std::string::npos) return {body, ""};
  return {body.substr(0, close), body.substr(close + 8)};
}

TEST(Reasoning, SplitDoesNotDependOnHowTheTextIsCut) {
  const std::vector<std::string> texts = {
      "<think>\nplan</think>\n\nanswer", "  \n<think>a</think>b", "<thin", "<think>unclosed </thi",
      "no trace <think>x</think>", "", "\n\n", "<think></think>", "<think>a<think>b</think>c</think>d",
      "</think>after", "<th>not a tag", "answer with </think> inside"};
  for (const bool open : {false, true})
    for (const std::string& t : texts) {
      bool had_ref = false;
      const ReasoningText ref = reference_split(t, open, &had_ref);
      // Whole, then every cut into pieces of 1, 2 and 3 bytes.
      bool had = false;
      const ReasoningText whole = split_reasoning(t, open, &had);
      EXPECT_EQ(whole.reasoning, ref.reasoning) << t << " open=" << open;
      EXPECT_EQ(whole.content, ref.content) << t << " open=" << open;
      EXPECT_EQ(had, had_ref) << t << " open=" << open;
      for (size_t step = 1; step <= 3; ++step) {
        ReasoningSplitter s(open);
        ReasoningText sum;
        for (size_t i = 0; i < t.size(); i += step) {
          const ReasoningText r = s.push(std::string_view(t).substr(i, step));
          sum.reasoning += r.reasoning, sum.content += r.content;
        }
        const ReasoningText r = s.flush();
        sum.reasoning += r.reasoning, sum.content += r.content;
        EXPECT_EQ(sum.reasoning, ref.reasoning) << t << " step " << step;
        EXPECT_EQ(sum.content, ref.content) << t << " step " << step;
      }
    }
}

// A vocabulary with the trace tags as tokens: 0 <unk>, 1 <s>, 2 </s> (EOS), 3..258 bytes, then
// "a", "b", "<think>", "</think>".
Tokenizer vocab() {
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    pieces.emplace_back(buf);
  }
  for (const char* p : {"a", "b", "<think>", "</think>"}) pieces.emplace_back(p);
  std::vector<float> scores(pieces.size(), 0.0f);
  return Tokenizer(std::move(pieces), std::move(scores), {}, 1, 2, 0, false);
}
constexpr int32_t kEos = 2, kA = 259, kB = 260, kOpen = 261, kClose = 262, kNl = 3 + '\n';
// "\n</think>\n\n" as the tokens a template's end-of-thinking text could tokenise to.
const std::vector<int32_t> kCloseText = {kNl, kClose, kNl, kNl};

std::vector<float> favour(const Tokenizer& tok, int32_t t) {
  std::vector<float> l(static_cast<size_t>(tok.n_vocab()), -5.0f);
  l[static_cast<size_t>(t)] = 5.0f;
  return l;
}

// Runs a state on logits that favour first[i] at step i and `then` afterwards.
std::vector<int32_t> run(GenerationState& st, const Tokenizer& tok, std::vector<int32_t> first, int32_t then) {
  std::vector<int32_t> out;
  for (size_t i = 0; !st.finished(); ++i) {
    const StepResult r = st.step(favour(tok, i < first.size() ? first[i] : then));
    out.push_back(r.token);
  }
  return out;
}

GenerationConfig thinking(int64_t budget, bool starts_open, int64_t max_new) {
  GenerationConfig c;
  c.sampler.temperature = 0.0f;
  c.max_new_tokens = max_new;
  c.thinking.track = true;
  c.thinking.starts_open = starts_open;
  c.thinking.budget = budget;
  if (budget >= 0) c.thinking.close_tokens = kCloseText;
  return c;
}

TEST(Reasoning, BudgetGivesExactlyNTraceTokensThenTheEndOfThinkingTokens) {
  const Tokenizer tok = vocab();
  const std::vector<int32_t> prompt = {1};
  // The model writes "<think>", then would think ("a") forever, even wanting to end (EOS) during
  // the forced close: the forced tokens are output regardless, then sampling resumes ("b").
  for (const int64_t n : {0, 1, 3}) {
    GenerationConfig c = thinking(n, /*starts_open=*/false, 12);
    GenerationState st(tok, c, 0, prompt);
    std::vector<int32_t> first = {kOpen};
    for (int64_t i = 0; i < n; ++i) first.push_back(kA);
    for (int i = 0; i < 4; ++i) first.push_back(kEos);  // the forced steps' logits
    const std::vector<int32_t> got = run(st, tok, first, kB);
    std::vector<int32_t> want = {kOpen};
    for (int64_t i = 0; i < n; ++i) want.push_back(kA);
    want.insert(want.end(), kCloseText.begin(), kCloseText.end());
    while (want.size() < 12) want.push_back(kB);
    EXPECT_EQ(got, want) << "budget " << n;
    EXPECT_EQ(st.trace_tokens(), n);
    // "<think>", the n trace tokens, "\n" and "</think>": up to and including the closing tag.
    EXPECT_EQ(st.reasoning_tokens(), 1 + n + 2);
    EXPECT_EQ(st.stop_cause(), StopCause::Length);
    bool had = false;
    const ReasoningText rt = split_reasoning(st.text(), false, &had);
    EXPECT_TRUE(had);
    EXPECT_EQ(rt.reasoning, std::string(static_cast<size_t>(n), 'a') + "\n");
  }
  // The prompt opened the trace (DeepSeek-R1): the first token is already inside it.
  GenerationState st(tok, thinking(2, /*starts_open=*/true, 8), 0, prompt);
  const std::vector<int32_t> got = run(st, tok, {kA, kA, kEos, kEos, kEos, kEos}, kEos);
  EXPECT_EQ(got, (std::vector<int32_t>{kA, kA, kNl, kClose, kNl, kNl, kEos}));
  EXPECT_EQ(st.stop_cause(), StopCause::Eog);  // once the forced tokens are out, EOS ends it
  EXPECT_EQ(st.trace_tokens(), 2);
  EXPECT_EQ(st.reasoning_tokens(), 4);
}

TEST(Reasoning, TraceTokensAreCountedWithoutABudgetAndOnlyAtTheStart) {
  const Tokenizer tok = vocab();
  const std::vector<int32_t> prompt = {1};
  {  // The model closes its own trace after 3 tokens: 5 reasoning tokens ("<think>" a a a "</think>").
    GenerationState st(tok, thinking(-1, false, 8), 0, prompt);
    run(st, tok, {kOpen, kA, kA, kA, kClose}, kB);
    EXPECT_EQ(st.reasoning_tokens(), 5);
    EXPECT_EQ(st.trace_tokens(), 3);
  }
  {  // An unclosed trace: every token is reasoning.
    GenerationState st(tok, thinking(-1, false, 6), 0, prompt);
    run(st, tok, {kOpen}, kA);
    EXPECT_EQ(st.reasoning_tokens(), 6);
  }
  {  // "<think>" after other text opens nothing; a budget never forces anything.
    GenerationState st(tok, thinking(1, false, 6), 0, prompt);
    const std::vector<int32_t> got = run(st, tok, {kA, kOpen}, kA);
    EXPECT_EQ(got, (std::vector<int32_t>{kA, kOpen, kA, kA, kA, kA}));
    EXPECT_EQ(st.reasoning_tokens(), 0);
  }
  {  // Tracking off (a template without a trace): nothing counted.
    GenerationConfig c = thinking(-1, false, 4);
    c.thinking.track = false;
    GenerationState st(tok, c, 0, prompt);
    run(st, tok, {kOpen, kA, kClose}, kB);
    EXPECT_EQ(st.reasoning_tokens(), 0);
  }
}

TEST(Reasoning, SameSeedSameOutputAndTheBudgetKeepsTheSampledPrefix) {
  const Tokenizer tok = vocab();
  const std::vector<int32_t> prompt = {1};
  // Flat logits over a, b and the bytes: sampled at temperature 1, trace open from the prompt.
  std::vector<float> flat(static_cast<size_t>(tok.n_vocab()), -30.0f);
  for (int32_t t : {kA, kB, 3 + 'x', 3 + 'y'}) flat[static_cast<size_t>(t)] = 0.0f;
  auto sample = [&](int64_t budget) {
    GenerationConfig c = thinking(budget, true, 20);
    c.sampler.temperature = 1.0f;
    c.sampler.seed = 42;
    GenerationState st(tok, c, 7, prompt);
    std::vector<int32_t> out;
    while (!st.finished()) out.push_back(st.step(flat).token);
    return out;
  };
  const std::vector<int32_t> free = sample(-1), a = sample(5), b = sample(5);
  EXPECT_EQ(a, b);
  // The first 5 tokens are the unbounded run's (the sampling stream of step t is the same), then
  // the end-of-thinking tokens; the answer after them is sampled from steps 9.. of the stream.
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.begin() + 5), std::vector<int32_t>(free.begin(), free.begin() + 5));
  EXPECT_EQ(std::vector<int32_t>(a.begin() + 5, a.begin() + 9), kCloseText);
  EXPECT_NE(a, free);
}

TEST(Reasoning, ABudgetNeedsATraceAndItsEndTokens) {
  const Tokenizer tok = vocab();
  GenerationConfig c = thinking(3, false, 4);
  c.thinking.close_tokens.clear();
  EXPECT_THROW(validate_generation(c, tok.n_vocab()), FieldError);
  c = thinking(3, false, 4);
  c.thinking.track = false;
  EXPECT_THROW(validate_generation(c, tok.n_vocab()), FieldError);
  c = thinking(-2, false, 4);
  EXPECT_THROW(validate_generation(c, tok.n_vocab()), FieldError);
  c = thinking(3, false, 4);
  c.thinking.close_tokens = {tok.n_vocab()};
  EXPECT_THROW(validate_generation(c, tok.n_vocab()), FieldError);
  EXPECT_NO_THROW(validate_generation(thinking(3, false, 4), tok.n_vocab()));
}

}  // namespace
}  // namespace kvevict
