// The settings builder (engine/policy_settings.h): the policy and schedule every front end gets
// from the same settings, and errors that name the field instead of a front end's spelling.
// Expected values: docs/eviction-spec.md §2 (B > r >= 1, sinks < K_sel, §2.5 long prompts) and §3
// (defaults: random pins the prompt, streaming keeps 4 sinks, VaSE keeps 4 sinks of its own),
// restated here.
#include <gtest/gtest.h>

#include <string>

#include "engine/engine.h"
#include "engine/policy_settings.h"
#include "model_fixture.h"
#include "serve/request.h"
#include "util/field_error.h"

namespace kvevict {
namespace {

// The field a builder call names, or nullopt when it does not throw a FieldError.
template <typename F>
std::optional<Field> field_of(F&& f, std::string* message = nullptr) {
  try {
    f();
  } catch (const FieldError& e) {
    if (message) *message = e.what();
    return e.field();
  }
  return std::nullopt;
}

TEST(PolicySettings, BuildsThePolicyAndScheduleAsGiven) {
  PolicySettings s;
  EXPECT_EQ(policy_name(s), "full");  // no budget: nothing to evict
  s.budget = 128;
  EXPECT_EQ(policy_name(s), "random");  // a budget alone: the paper's policy
  s.recent = 16;
  s.seed = 7;
  s.long_prompt = LongPromptMode::Skip;
  s.positions = PositionMode::Cache;
  const CheckedPolicy kv = build_policy_config(s);
  EXPECT_EQ(kv.policy().name, "random");
  EXPECT_TRUE(kv.policy().evicts);
  EXPECT_TRUE(kv.policy().protect_prompt);  // random's default (spec §3)
  EXPECT_EQ(kv.eviction().budget, 128);
  EXPECT_EQ(kv.eviction().recent, 16);
  EXPECT_EQ(kv.eviction().seed, 7u);
  EXPECT_EQ(kv.eviction().long_prompt, LongPromptMode::Skip);
  EXPECT_EQ(kv.eviction().positions, PositionMode::Cache);

  s.policy = "streaming";
  s.sinks = 2;
  s.protect_prompt = true;
  const CheckedPolicy st = build_policy_config(s);
  EXPECT_EQ(st.policy().sinks, 2);
  EXPECT_TRUE(st.policy().protect_prompt);
  s.sinks.reset();
  EXPECT_EQ(build_policy_config(s).policy().sinks, 4);  // StreamingLLM's default

  // A parameter reaches the policy that takes it; one nobody takes is refused.
  s.policy = "snapkv";
  s.params = {"window=8"};
  EXPECT_NO_THROW(build_policy_config(s));
  s.params = {"windw=8"};
  EXPECT_EQ(field_of([&] { build_policy_config(s); }), Field::Param);
}

TEST(PolicySettings, ErrorsNameTheField) {
  PolicySettings s;
  s.policy = "random";
  std::string msg;
  // An evicting policy without a budget.
  EXPECT_EQ(field_of([&] { build_policy_config(s); }, &msg), Field::Budget);
  EXPECT_EQ(msg, "policy 'random' needs budget B");
  // B <= r, r < 1, sinks >= K_sel (spec §2).
  s.budget = 64;
  EXPECT_EQ(field_of([&] { build_policy_config(s); }, &msg), Field::Budget);
  EXPECT_EQ(msg, "budget 64 must be greater than the recent buffer r = 64 (K_sel = B - r must be >= 1)");
  s.budget = 128;
  s.recent = 0;
  EXPECT_EQ(field_of([&] { build_policy_config(s); }), Field::Recent);
  s.recent = 64;
  // The round interval s, when given, in [1, 2^20] (unset = r).
  s.interval = 0;
  EXPECT_EQ(field_of([&] { build_policy_config(s); }, &msg), Field::RoundInterval);
  EXPECT_EQ(msg, "round interval 0: must be in [1, 1048576]");
  s.interval = 16;
  EXPECT_EQ(build_policy_config(s).eviction().round_interval(), 16);
  s.interval.reset();
  EXPECT_EQ(build_policy_config(s).eviction().round_interval(), 64);
  s.sinks = 64;
  EXPECT_EQ(field_of([&] { build_policy_config(s); }, &msg), Field::Sinks);
  EXPECT_EQ(msg, "sinks 64 must be smaller than K_sel = B - r = 64");
  s.sinks = -1;
  EXPECT_EQ(field_of([&] { build_policy_config(s); }), Field::Sinks);
  s.sinks.reset();
  // Upper bounds shared with every front end (util/limits.h).
  s.budget = (1 << 20) + 1;
  EXPECT_EQ(field_of([&] { build_policy_config(s); }), Field::Budget);
  s.budget = 128;
  // Unknown policy: a message that does not spell the field (front ends add it).
  s.policy = "nope";
  EXPECT_EQ(field_of([&] { build_policy_config(s); }, &msg), Field::Policy);
  EXPECT_NE(msg.find("unknown policy 'nope'"), std::string::npos) << msg;
  // +prompt against an explicit "no".
  s.policy = "random+prompt";
  s.protect_prompt = false;
  EXPECT_EQ(field_of([&] { build_policy_config(s); }), Field::ProtectPrompt);
  // +prompt on a policy that keeps every token: a pin that changes nothing is refused.
  s.protect_prompt.reset();
  s.policy = "full+prompt";
  EXPECT_EQ(field_of([&] { build_policy_config(s); }, &msg), Field::Policy);
  EXPECT_NE(msg.find("'full' keeps every token"), std::string::npos) << msg;
  s.policy = "full";
  EXPECT_NO_THROW(build_policy_config(s));
  EXPECT_EQ(field_of([] { parse_long_prompt("pinhead"); }), Field::LongPrompt);
  EXPECT_EQ(field_of([] { parse_position_mode("slot"); }), Field::PositionMode);
}

TEST(PolicySettings, ConstraintsDeclaredByThePolicy) {
  // StreamingLLM without sinks would be `recency`; VaSE keeps 4 sinks, so K_sel >= 4.
  PolicySettings s;
  s.budget = 128;
  s.policy = "streaming";
  s.sinks = 0;
  std::string msg;
  EXPECT_EQ(field_of([&] { build_policy_config(s); }, &msg), Field::Sinks);
  EXPECT_NE(msg.find("'recency'"), std::string::npos) << msg;
  s.sinks = 1;
  EXPECT_NO_THROW(build_policy_config(s));
  s.sinks.reset();
  s.policy = "vase";
  s.budget = 67;  // K_sel = 3
  EXPECT_EQ(field_of([&] { build_policy_config(s); }, &msg), Field::Budget);
  EXPECT_NE(msg.find("K_sel = B - r = 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("B >= 68"), std::string::npos) << msg;
  s.budget = 68;
  EXPECT_NO_THROW(build_policy_config(s));
  // The same constraints hold for a schedule built by hand (validate_eviction reads PolicyInfo).
  EXPECT_EQ(make_policy("vase").info->min_k_sel, 4);
  EXPECT_EQ(make_policy("streaming").info->min_sinks, 1);
}

TEST(PolicySettings, FieldErrorSpellsTheFieldAsTheFrontEndAsks) {
  const FieldError e(Field::Budget, "policy 'random' needs ", " B");
  EXPECT_EQ(e.message("--budget"), "policy 'random' needs --budget B");
  EXPECT_EQ(e.message("kv_budget"), "policy 'random' needs kv_budget B");
  EXPECT_EQ(std::string(e.what()), "policy 'random' needs budget B");
  const FieldError p = FieldError::plain(Field::Policy, "unknown policy 'x'");
  EXPECT_FALSE(p.names_field());
  EXPECT_EQ(p.message("--policy"), "unknown policy 'x'");
}

TEST(PolicySettings, TheServerSpellsFieldsAsRequestFields) {
  const serve::ApiError b = serve::api_error(FieldError(Field::Budget, "", " 8 must be greater than r = 8"));
  EXPECT_EQ(b.param, "kv_budget");
  EXPECT_EQ(b.message, "kv_budget 8 must be greater than r = 8");
  const serve::ApiError p = serve::api_error(FieldError::plain(Field::Policy, "unknown policy 'x'"));
  EXPECT_EQ(p.param, "kv_policy");
  EXPECT_EQ(p.message, "kv_policy: unknown policy 'x'");
  // A setting no request gives (the server's --param) is reported against kv_policy.
  const serve::ApiError q = serve::api_error(FieldError(Field::Param, "policy 'triattention' needs ", " stats=FILE"));
  EXPECT_EQ(q.param, "kv_policy");
  EXPECT_EQ(q.message, "kv_policy: policy 'triattention' needs --param stats=FILE");
  EXPECT_EQ(serve::api_field_name(Field::Temperature), "temperature");
}

TEST(PolicySettings, CheckedPolicyRunsWithoutRevalidation) {
  KVEVICT_REQUIRE_MODEL(model);
  Engine engine(*model, 1, KvType::F16);
  PolicySettings s;
  s.budget = 32;
  s.recent = 8;
  const CheckedPolicy kv = build_policy_config(s);
  auto seq = engine.new_sequence(3, kv, 5, 10);
  EXPECT_EQ(seq->id, 3u);
  EXPECT_EQ(seq->eviction.budget, 32);
  EXPECT_EQ(seq->policy.name, "random");
  // An f16 cache cannot run cache positions (keys re-rotated in float32): the engine names KvType.
  s.positions = PositionMode::Cache;
  const CheckedPolicy cache = build_policy_config(s);
  EXPECT_EQ(field_of([&] { (void)engine.new_sequence(0, cache, 5, 10); }), Field::KvType);
  EXPECT_EQ(field_of([&] { check_kv_type(KvType::F16, cache); }), Field::KvType);
  EXPECT_EQ(field_of([&] { check_kv_type(KvType::F32, cache); }), std::nullopt);
}

}  // namespace
}  // namespace kvevict
