// Error type used across kvevict. Every failure that a user can cause (bad file, bad option,
// unsupported model) is reported as a kvevict::Error whose message names the file, key, value
// and limit involved; the CLI prints it on one line and exits with code 2.
#pragma once

#include <stdexcept>
#include <string>

namespace kvevict {

/// A user-facing error: bad input, unsupported model, invalid option.
/// The message is complete and self-contained (file, field, value, limit).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace kvevict
