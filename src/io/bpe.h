// The BPE model of a byte-level HF tokenizer.json: vocabulary, ranked merges, and the byte <-> symbol map.
// Merge semantics are HF's: lowest rank first, leftmost on ties, merges whose result is not the recorded
// token are skipped, and input symbols missing from the vocabulary are dropped (unk_token is refused).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/error.h"

namespace mxq {

// GPT-2's bytes_to_unicode: the symbol (a UTF-8 encoded code point) that stands for each byte.
std::string_view byte_symbol(uint8_t b);
// Bytes of a byte-level token string; nullopt when a character is not one of the 256 byte symbols.
std::optional<std::string> byte_level_to_bytes(std::string_view token);

// Ids a tokenizer of `entries` tokens may use: tables are indexed by id, so an id far past the entry count
// would size them without bound (real vocabularies are dense; a model may pad its vocab_size past them).
inline int64_t dense_id_bound(int64_t entries) { return 2 * entries + 65536; }

class BpeModel {
 public:
  static Result<BpeModel> from_json(const nlohmann::json& model, std::string_view where);

  // Appends the ids of one pre-tokenized piece of raw bytes.
  void encode_piece(std::string_view bytes, std::vector<int32_t>& out) const;

  std::optional<int32_t> token_id(std::string_view token) const;           // token as spelled in the vocab
  const std::string* token(int32_t id) const;                              // nullptr for ids not in the vocab
  int32_t id_end() const { return static_cast<int32_t>(tokens_.size()); }  // max id + 1
  int64_t size() const { return static_cast<int64_t>(vocab_.size()); }       // vocab entries

 private:
  struct TransparentHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using TokenMap = std::unordered_map<std::string, int32_t, TransparentHash, std::equal_to<>>;
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  struct Cache;  // piece bytes -> ids, shared by copies of the model, guarded by a mutex

  void merge_symbols(std::string_view bytes, std::vector<int32_t>& out) const;

  TokenMap vocab_;
  std::vector<std::string> tokens_;             // id -> token string ("" for gaps in the id space)
  std::vector<bool> present_;                   // id -> in the vocab
  std::array<int32_t, 256> byte_id_{};          // byte -> id of its single-symbol token, -1 when absent
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> rank and result id
  bool ignore_merges_ = false;
  std::shared_ptr<Cache> cache_;
};

}  // namespace mxq
