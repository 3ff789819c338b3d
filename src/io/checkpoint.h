// An HF model directory's tensors: one model.safetensors, or model.safetensors.index.json and its shards, or
// several *.safetensors without an index. Every file is validated at open (io/safetensors.h).
#pragma once

#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/error.h"
#include "io/safetensors.h"
#include "io/tensor_meta.h"

namespace mxq {

inline constexpr std::string_view kSingleFileName = "model.safetensors";
inline constexpr std::string_view kIndexFileName = "model.safetensors.index.json";

// The weight_map of a model.safetensors.index.json text, tensor -> shard file name, in file order. Refuses
// invalid JSON, duplicate keys in any object (the parser callback sees every key: nlohmann alone keeps the
// last of two), nesting past 16 levels, and a weight_map that is missing or maps to non-strings. Shard names
// are checked by Checkpoint::open. `label` names the file in errors. The fuzz harness drives this directly.
Result<std::vector<std::pair<std::string, std::string>>> parse_safetensors_index(std::string_view text,
                                                                                 std::string_view label);

// What check_names does with tensors the caller did not ask for (L-21).
enum class ExtraTensors { kReject, kIgnore };

class Checkpoint {  // move-only: owns the mappings
 public:
  // Picks the files as transformers does: model.safetensors if present; else the index and exactly the shards
  // it names; else every *.safetensors in `dir` (sorted). Refused (L-20): a missing shard, a shard name that
  // is not a plain "*.safetensors" file name, a tensor in two files, an index entry its shard lacks, a shard
  // tensor the index does not list, duplicate keys in the index. Tensor names never become paths (L-17).
  static Result<Checkpoint> open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  // Every tensor's dtype and shape, by name.
  TensorMetaMap meta() const;
  const TensorEntry* find(std::string_view name) const;
  // The file that holds `name`, or nullptr.
  const SafetensorsFile* file_of(std::string_view name) const;
  // Guarded copy of a tensor's bytes (SafetensorsFile::read); an unknown name is an error.
  Status read(std::string_view name, std::span<uint8_t> dst) const;
  // L-21: every name in `required` must exist; with kReject, so must nothing else. The error names the first
  // missing (or unexpected) tensor and how many there are.
  Status check_names(std::span<const std::string> required, ExtraTensors extra) const;

 private:
  struct Location {
    size_t file;  // index into files_
    const TensorEntry* entry;
  };
  Checkpoint() = default;
  Status index_tensors();

  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, Location, std::less<>> where_;
};

}  // namespace mxq
