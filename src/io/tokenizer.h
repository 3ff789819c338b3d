// Byte-level BPE tokenizer read from an HF tokenizer.json (the Qwen2/Qwen3 and GPT-2 kind). Encode and decode
// are byte-exact with the `tokenizers` library on the parts it supports; every other component is refused
// at load by name. Pipeline: added tokens (non-normalized) -> NFC -> added tokens (normalized) ->
// pre-tokenizer (regex splits, ByteLevel) -> BPE. No post-processor template: Qwen and GPT-2 add no BOS.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"

namespace mxq {

class Tokenizer {
 public:
  static Result<Tokenizer> load(const std::string& path);
  // `where` names the source in errors (a path, or "<memory>").
  static Result<Tokenizer> from_json_text(std::string_view json_text, std::string_view where);

  // parse_special=false encodes special added tokens typed in the text as plain text (HF's
  // encode_special_tokens); non-special added tokens (Qwen's <think>) always match. Bytes that are not UTF-8
  // are encoded as U+FFFD, as Python's decode('utf-8', 'replace') would hand them to `tokenizers`.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // As encode, but refuses text that is not UTF-8 or longer than max_bytes (H-08, H-11), naming the offset.
  Result<std::vector<int32_t>> encode_checked(std::string_view text, bool parse_special,
                                              size_t max_bytes) const;

  // Ids outside the vocabulary are skipped (as HF does); invalid UTF-8 in the bytes becomes U+FFFD.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  // As decode, but an id outside the vocabulary is an error naming the id and the vocab size (H-07).
  Result<std::string> decode_checked(std::span<const int32_t> ids, bool skip_special = false) const;

  // One past the largest id (BPE vocab and added tokens): the embedding rows the model needs.
  int32_t vocab_size() const;
  // Id of a token as tokenizer.json spells it: added-token content, or the byte-level vocab string.
  std::optional<int32_t> token_id(std::string_view token) const;
  bool is_special(int32_t id) const;
  // Raw bytes that id decodes to (before UTF-8 repair); nullptr for an id outside the vocabulary.
  const std::string* token_bytes(int32_t id) const;

 private:
  Tokenizer() = default;  // only load/from_json_text make one, so impl_ is never null
  struct Impl;
  std::shared_ptr<const Impl> impl_;  // immutable after load; copies share it (the BPE cache is locked)
};

// Turns a stream of generated ids into text for a terminal: each push returns only whole UTF-8 characters and
// keeps a trailing partial character until its remaining bytes arrive. The concatenation of all push() and
// finish() results equals Tokenizer::decode of the whole sequence. The tokenizer must outlive the decoder.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false) : tok_(&tok), skip_(skip_special) {}
  std::string push(int32_t id);
  std::string finish();  // flushes a dangling partial character as U+FFFD

 private:
  const Tokenizer* tok_;
  bool skip_;
  std::string pending_;  // bytes not yet returned: a prefix of one UTF-8 character
};

}  // namespace mxq
