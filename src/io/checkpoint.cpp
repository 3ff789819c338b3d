#include "io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

namespace mxq {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// note: a real index is ~100 bytes per tensor (DeepSeek-V3's 91k tensors: 9 MB); 64 MB bounds what we read.
constexpr uintmax_t kMaxIndexBytes = 64u << 20;
// note: a valid index nests 3 deep ({"weight_map": {name: file}}); metadata in the wild stays under 4.
constexpr int kMaxIndexDepth = 16;

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);  // follows symlinks, as HF cache snapshots need
}

// A shard name must be a plain file name in the checkpoint directory: no separators, no "." or "..".
Status check_shard_name(std::string_view shard, std::string_view where) {
  const std::string shown = printable(shard);
  const bool plain = !shard.empty() && shard.find_first_of(std::string_view("/\\\0", 3)) == std::string_view::npos &&
                     shard != "." && shard != ".." && shard.size() <= 255;
  if (!plain) return fail("{}: shard {}, expected a plain file name in the checkpoint directory", where, shown);
  if (!shard.ends_with(".safetensors")) return fail("{}: shard {}, expected a *.safetensors file", where, shown);
  return {};
}

// weight_map entries (tensor -> shard), from an index whose objects have no duplicate keys (L-07 rule: the
// parser callback sees every key; nlohmann alone would keep the last of two).
Result<std::vector<std::pair<std::string, std::string>>> parse_index(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return fail("{}: cannot stat: {}", path, ec.message());
  if (size > kMaxIndexBytes) return fail("{}: index too large, expected at most {} bytes, got {}", path, kMaxIndexBytes, size);
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) return fail("{}: cannot read", path);

  std::vector<std::set<std::string>> keys;  // one key set per open object
  std::string problem;
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxIndexDepth && problem.empty()) {
      problem = fmt::format("nested too deep, expected at most {} levels", kMaxIndexDepth);
    }
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
        problem.empty()) {
      problem = fmt::format("duplicate key {}, expected each key once", printable(parsed.get<std::string>()));
    }
    return true;
  };
  json j;
  try {
    j = json::parse(text.str(), check);
  } catch (const json::exception& e) {
    return fail("{}: not valid JSON: {}", path, printable(e.what()));
  }
  if (!problem.empty()) return fail("{}: {}", path, problem);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    return fail("{}: expected an object with a \"weight_map\" object", path);
  }
  std::vector<std::pair<std::string, std::string>> entries;
  for (const auto& [name, shard] : j["weight_map"].items()) {
    if (!shard.is_string()) {
      return fail("{}: weight_map: {}, expected a shard file name (string), got {}", path, printable(name),
                  shard.type_name());
    }
    entries.emplace_back(name, shard.get<std::string>());
  }
  return entries;
}

}  // namespace

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return fail("{}: not a directory", dir);
  Checkpoint ck;
  ck.dir_ = dir;
  const fs::path root(dir);

  std::vector<std::string> shards;  // file names inside dir
  std::vector<std::pair<std::string, std::string>> weight_map;
  const std::string index_path = (root / kIndexFileName).string();
  const bool single = is_file(root / kSingleFileName);
  const bool sharded = !single && is_file(index_path);
  if (single) {
    shards.emplace_back(kSingleFileName);
  } else if (sharded) {
    Result<std::vector<std::pair<std::string, std::string>>> parsed = parse_index(index_path);
    if (!parsed) return tl::unexpected(parsed.error());
    weight_map = std::move(*parsed);
    if (weight_map.empty()) return fail("{}: weight_map is empty, expected at least one tensor", index_path);
    std::set<std::string> distinct;
    for (const auto& [name, shard] : weight_map) {
      if (Status s = check_shard_name(shard, fmt::format("{}: {}", index_path, printable(name))); !s) {
        return tl::unexpected(s.error());
      }
      distinct.insert(shard);
    }
    for (const std::string& shard : distinct) {
      if (!is_file(root / shard)) {  // covers L-20 (missing shard)
        return fail("{}: shard {} is missing, expected it in {}", index_path, printable(shard), dir);
      }
    }
    shards.assign(distinct.begin(), distinct.end());
  } else {
    for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
      const std::string name = e.path().filename().string();
      if (name.ends_with(".safetensors") && is_file(e.path())) shards.push_back(name);
    }
    if (ec) return fail("{}: cannot list: {}", dir, ec.message());
    std::sort(shards.begin(), shards.end());
    if (shards.empty()) {
      return fail("{}: no checkpoint, expected {}, {} or *.safetensors files", dir, kSingleFileName, kIndexFileName);
    }
  }

  ck.files_.reserve(shards.size());
  for (const std::string& shard : shards) {
    Result<SafetensorsFile> f = SafetensorsFile::open((root / shard).string());
    if (!f) return tl::unexpected(f.error());
    ck.files_.push_back(std::move(*f));
  }
  if (Status s = ck.index_tensors(); !s) return tl::unexpected(s.error());

  if (sharded) {
    std::map<std::string_view, std::string_view> listed;
    for (const auto& [name, shard] : weight_map) listed.emplace(name, shard);
    for (const auto& [name, shard] : weight_map) {
      const SafetensorsFile* f = ck.file_of(name);
      if (f == nullptr) {  // covers L-20 (index names a tensor its shard lacks)
        return fail("{}: {}: listed in shard {}, which lacks it", index_path, printable(name), printable(shard));
      }
      const std::string actual = fs::path(f->path()).filename().string();
      if (actual != shard) {
        return fail("{}: {}: listed in shard {}, expected {} which holds it", index_path, printable(name),
                    printable(shard), printable(actual));
      }
    }
    for (const auto& [name, loc] : ck.where_) {
      if (listed.count(name) == 0) {  // covers L-20 (shard tensor the index does not list)
        return fail("{}: {}: tensor in {} is not listed in the index", index_path, printable(name),
                    ck.files_[loc.file].path());
      }
    }
  }
  return ck;
}

Status Checkpoint::index_tensors() {
  for (size_t i = 0; i < files_.size(); ++i) {
    for (const TensorEntry& t : files_[i].tensors()) {
      const auto [it, inserted] = where_.try_emplace(t.name, Location{i, &t});
      if (!inserted) {  // covers L-20 (tensor in two shards)
        return fail("{}: {}: tensor present twice, also in {}", files_[i].path(), printable(t.name),
                    files_[it->second.file].path());
      }
    }
  }
  return {};
}

TensorMetaMap Checkpoint::meta() const {
  TensorMetaMap out;
  for (const auto& [name, loc] : where_) {
    out.emplace(name, TensorMeta{std::string(dtype_name(loc.entry->dtype)), loc.entry->shape});
  }
  return out;
}

const TensorEntry* Checkpoint::find(std::string_view name) const {
  const auto it = where_.find(name);
  return it == where_.end() ? nullptr : it->second.entry;
}

const SafetensorsFile* Checkpoint::file_of(std::string_view name) const {
  const auto it = where_.find(name);
  return it == where_.end() ? nullptr : &files_[it->second.file];
}

Status Checkpoint::read(std::string_view name, std::span<uint8_t> dst) const {
  const auto it = where_.find(name);
  if (it == where_.end()) return fail("{}: {}: no such tensor in the checkpoint", dir_, printable(name));
  return files_[it->second.file].read(*it->second.entry, dst);
}

Status Checkpoint::check_names(std::span<const std::string> required, ExtraTensors extra) const {
  size_t missing = 0;
  const std::string* first_missing = nullptr;
  std::set<std::string_view> wanted;
  for (const std::string& name : required) {
    wanted.insert(name);
    if (where_.find(name) == where_.end() && missing++ == 0) first_missing = &name;
  }
  if (missing > 0) {  // covers L-21 (missing)
    return fail("{}: {}: required tensor missing, expected {} more tensor(s) in the checkpoint", dir_,
                printable(*first_missing), missing);
  }
  if (extra == ExtraTensors::kIgnore) return {};
  size_t unexpected = 0;
  std::string_view first_unexpected;
  for (const auto& [name, loc] : where_) {
    if (wanted.count(name) == 0 && unexpected++ == 0) first_unexpected = name;
  }
  if (unexpected > 0) {  // covers L-21 (extra)
    return fail("{}: {}: unexpected tensor, expected none beyond the {} required, got {} more", dir_,
                printable(first_unexpected), required.size(), unexpected);
  }
  return {};
}

}  // namespace mxq
