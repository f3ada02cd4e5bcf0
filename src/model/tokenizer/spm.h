// SentencePiece-style (GGUF `tokenizer.ggml.model = "llama"`) merging of one text fragment.
//
// Algorithm as llama.cpp's SPM tokenizer: the fragment (spaces already escaped to U+2581, the
// optional prefix space already added) is split into UTF-8 characters, and adjacent symbols are
// merged greedily by the vocabulary score of the merged piece (highest score first, leftmost on
// ties); a final symbol missing from the vocabulary is emitted as byte tokens (`<0xNN>`).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "model/tokenizer/vocab.h"

namespace kvevict::tok {

/// Appends the token ids of `escaped` (UTF-8, spaces as U+2581, at most 2 GiB) to `out`.
/// `scores[id]` is the merge score of piece `id`; `byte_ids[b]` the fallback token of raw byte b
/// (-1: none). Throws kvevict::Error when the text is too long or a byte has no fallback token.
void spm_tokenize(std::string_view escaped, const PieceIndex& index, const std::vector<float>& scores,
                  const int32_t (&byte_ids)[256], std::vector<int32_t>& out);

}  // namespace kvevict::tok
