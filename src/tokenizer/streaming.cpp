// StreamingDetokenizer: token text as it becomes complete UTF-8.
#include "tokenizer/internal.h"

namespace fdpp {

std::string StreamingDetokenizer::push(int32_t id) {
  // first_ is decode()'s at_start: the SentencePiece leading-space rule applies to the first token
  // emitted, so the pieces add up to decode(ids).
  tokenizer_.append_token_text(pending_, id, first_, skip_special_);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const std::string_view rest = std::string_view(pending_).substr(i);
    const size_t n = tok::utf8_valid_len(rest);
    if (n > 0) {
      out.append(rest.substr(0, n));
      i += n;
      continue;
    }
    // The tail may be a character whose remaining bytes come with the next token: hold it back.
    if (tok::utf8_incomplete_prefix(rest)) break;
    // Bytes that no continuation can make valid: one U+FFFD per maximal invalid subpart.
    out += "\xEF\xBF\xBD";
    i += tok::utf8_maximal_subpart(rest);
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamingDetokenizer::flush() {
  // Whatever is held back (an incomplete sequence at the end of the stream), as it is.
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace fdpp
