// "Did you mean" suggestions for mistyped names (options, policies, subcommands).
#pragma once

#include <string>
#include <vector>

namespace kvevict {

/// Levenshtein edit distance between `a` and `b` (insertions, deletions, substitutions; each
/// costs 1). O(|a|·|b|) time, O(|b|) memory.
size_t edit_distance(const std::string& a, const std::string& b);

/// The candidate closest to `word` by edit distance, or "" when none is close enough: the
/// distance must be at most max(1, |word| / 3) (so "randon" -> "random", "--bugdet" -> "--budget",
/// but "xyz" suggests nothing). Ties go to the earlier candidate.
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace kvevict
