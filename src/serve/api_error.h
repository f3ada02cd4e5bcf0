// The error every API answer that is not a success carries: an HTTP status and the fields of
// OpenAI's error object ({"error": {"message", "type", "param", "code"}}).
#pragma once

#include <string>

namespace kvevict::serve {

/// An API error: HTTP status and OpenAI error object fields.
struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  ///< empty -> null
};

}  // namespace kvevict::serve
