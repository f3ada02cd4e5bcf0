// Errors that name the setting they are about. Lower layers (eviction/, engine/) know a setting
// only by its field id; each front end spells the field its own way (the CLI as a flag such as
// `--budget`, the server as a JSON field such as `kv_budget`, the Python package as a keyword),
// so a message never carries one front end's spelling into another.
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "util/error.h"

namespace kvevict {

/// A setting a user gives by name. The neutral spelling (field_name) is what what() shows.
enum class Field {
  Policy,             ///< policy name (+prompt)
  Budget,             ///< B, slots per (layer, KV head)
  Recent,             ///< r, the recent buffer
  RoundInterval,      ///< s, decode steps between eviction rounds
  Sinks,              ///< pinned first positions
  ProtectPrompt,      ///< prompt pinning on/off
  LongPrompt,         ///< LongPromptMode
  PositionMode,       ///< PositionMode
  Param,              ///< a selector parameter NAME=VALUE
  KvType,             ///< KV cache element type
  Seed,               ///< base seed
  MaxNewTokens,       ///< tokens to generate at most
  MaxTotalTokens,     ///< prompt + generated tokens at most (context)
  MinTokens,          ///< tokens before end-of-generation and stops are allowed
  Stop,               ///< stop strings
  StopTokenIds,       ///< extra end-of-generation token ids
  Temperature,        ///< sampling temperature
  TopP,               ///< nucleus threshold
  TopK,               ///< top-k cut
  MinP,               ///< min-p cut
  RepetitionPenalty,  ///< multiplicative penalty on seen tokens
  PresencePenalty,    ///< additive penalty on generated tokens
  FrequencyPenalty,   ///< additive penalty per occurrence in the generated tokens
  LogitBias,          ///< additive bias per token id
  Logprobs,           ///< alternatives reported per step
  ReasoningBudget,    ///< tokens allowed inside the thinking trace
};

/// Neutral spelling of a field ("budget", "recent buffer", "top-p", ...).
std::string_view field_name(Field f);

/// How a front end spells a field.
using FieldSpeller = std::string_view (*)(Field);

/// A kvevict::Error about one field. The message is `before + <spelling> + after` when it names
/// the field (FieldError(field, before, after)), or a complete text that does not
/// (FieldError::plain): front ends then add the field themselves if they want to (the server's
/// `param`). what() spells the field with field_name.
class FieldError : public Error {
 public:
  /// A message that names the field: before + spelling + after, e.g. ("", " 64 must be ...").
  FieldError(Field field, std::string before, std::string after)
      : Error(before + std::string(field_name(field)) + after),
        field_(field),
        before_(std::move(before)),
        after_(std::move(after)),
        names_field_(true) {}
  /// A message about `field` that does not name it (e.g. "unknown policy 'x' (known: ...)").
  static FieldError plain(Field field, std::string message) { return FieldError(field, std::move(message)); }

  Field field() const { return field_; }
  /// True when the message names the field (message(spelling) then differs from what()).
  bool names_field() const { return names_field_; }
  /// The message with the field spelled `spelling` (the message itself when it names no field).
  std::string message(std::string_view spelling) const {
    return names_field_ ? before_ + std::string(spelling) + after_ : before_;
  }

 private:
  FieldError(Field field, std::string message)
      : Error(message), field_(field), before_(std::move(message)), names_field_(false) {}
  Field field_;
  std::string before_, after_;
  bool names_field_;
};

inline std::string_view field_name(Field f) {
  switch (f) {
    case Field::Policy: return "policy";
    case Field::Budget: return "budget";
    case Field::Recent: return "recent buffer";
    case Field::RoundInterval: return "round interval";
    case Field::Sinks: return "sinks";
    case Field::ProtectPrompt: return "prompt protection";
    case Field::LongPrompt: return "long-prompt mode";
    case Field::PositionMode: return "position mode";
    case Field::Param: return "selector parameter";
    case Field::KvType: return "KV type";
    case Field::Seed: return "seed";
    case Field::MaxNewTokens: return "max new tokens";
    case Field::MaxTotalTokens: return "max total tokens";
    case Field::MinTokens: return "min tokens";
    case Field::Stop: return "stop";
    case Field::StopTokenIds: return "stop token ids";
    case Field::Temperature: return "temperature";
    case Field::TopP: return "top-p";
    case Field::TopK: return "top-k";
    case Field::MinP: return "min-p";
    case Field::RepetitionPenalty: return "repetition penalty";
    case Field::PresencePenalty: return "presence penalty";
    case Field::FrequencyPenalty: return "frequency penalty";
    case Field::LogitBias: return "logit bias";
    case Field::Logprobs: return "logprobs";
    case Field::ReasoningBudget: return "reasoning budget";
  }
  return "setting";
}

/// The flag that sets `field` on kvevict's command line (`--budget`, `--buffer`, `--temp`, ...):
/// how the CLI spells the field a FieldError names (cli/main.cpp prints
/// e.message(flag_name(field))), and how the server names the settings only its own command line
/// gives (serve/request.cpp). One table for both, so the spellings cannot drift apart.
inline std::string_view flag_name(Field field) {
  switch (field) {
    case Field::Policy:
      return "--policy";
    case Field::Budget:
      return "--budget";
    case Field::Recent:
      return "--buffer";
    case Field::RoundInterval:
      return "--round-interval";
    case Field::Sinks:
      return "--sinks";
    case Field::ProtectPrompt:
      return "--protect-prompt";
    case Field::LongPrompt:
      return "--long-prompt";
    case Field::PositionMode:
      return "--position-mode";
    case Field::Param:
      return "--param";
    case Field::KvType:
      return "--kv-type";
    case Field::Seed:
      return "--seed";
    case Field::MaxNewTokens:
      return "-n";
    case Field::MaxTotalTokens:
      return "--max-length";
    case Field::MinTokens:
      return "--min-tokens";
    case Field::Stop:
      return "--stop";
    case Field::StopTokenIds:
      return "--stop-token-ids";
    case Field::Temperature:
      return "--temp";
    case Field::TopP:
      return "--top-p";
    case Field::TopK:
      return "--top-k";
    case Field::MinP:
      return "--min-p";
    case Field::RepetitionPenalty:
      return "--repeat-penalty";
    case Field::PresencePenalty:
      return "--presence-penalty";
    case Field::FrequencyPenalty:
      return "--frequency-penalty";
    case Field::LogitBias:
      return "--logit-bias";
    case Field::Logprobs:
      return "--logprobs";
    case Field::ReasoningBudget:
      return "--reasoning-budget";
  }
  return field_name(field);
}

}  // namespace kvevict
