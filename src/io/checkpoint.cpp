#include "io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>

#include "base/regular_file.h"

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

// Whether `p` is there; refuses something there that is not a regular file (a FIFO index or a directory
// named model.safetensors was skipped in silence, and the checkpoint read another way).
Result<bool> present_file(const fs::path& p) {
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);  // follows symlinks
  if (st.type() == fs::file_type::not_found) return false;
  if (ec) return fail("{}: cannot stat: {}", p.string(), ec.message());
  if (st.type() != fs::file_type::regular) {
    const char* kind = st.type() == fs::file_type::directory ? "a directory"
                       : st.type() == fs::file_type::fifo    ? "a FIFO"
                       : st.type() == fs::file_type::character || st.type() == fs::file_type::block
                           ? "a device"
                           : "not a regular file";
    return fail("{}: expected a regular file, got {}", p.string(), kind);
  }
  return true;
}

// A shard name must be a plain file name in the checkpoint directory: no separators, no "." or "..".
Status check_shard_name(std::string_view shard, std::string_view where) {
  const std::string shown = printable(shard);
  const bool plain = !shard.empty() &&
                     shard.find_first_of(std::string_view("/\\\0", 3)) == std::string_view::npos &&
                     shard != "." && shard != ".." && shard.size() <= 255;
  if (!plain)
    return fail("{}: shard {}, expected a plain file name in the checkpoint directory", where, shown);
  if (!shard.ends_with(".safetensors"))
    return fail("{}: shard {}, expected a *.safetensors file", where, shown);
  return {};
}

Result<std::string> read_index(const std::string& path) {
  auto text = read_regular_file(path, kMaxIndexBytes);
  if (!text) return fail("index too large or unreadable: {}", text.error().message);
  if (!*text) return fail("{}: no such index file", path);
  return std::move(**text);
}

// Collects weight_map entries from SAX events. Every object's keys are checked for duplicates (nlohmann's DOM
// would keep the last of two, L-07) and nesting stops at kMaxIndexDepth at its first event (L-05); everything
// outside "weight_map" (e.g. "metadata") is only checked, not kept.
class IndexSax {
 public:
  explicit IndexSax(std::string_view label) : label_(label) {}

  bool null() { return value("null"); }
  bool boolean(bool) { return value("a boolean"); }
  bool number_integer(json::number_integer_t) { return value("a number"); }
  bool number_unsigned(json::number_unsigned_t) { return value("a number"); }
  bool number_float(json::number_float_t, const json::string_t&) { return value("a number"); }
  bool binary(json::binary_t&) { return value("binary"); }
  bool string(json::string_t& v) {
    if (in_weight_map()) {
      entries_.emplace_back(std::move(frames_.back().key), std::move(v));
      return true;
    }
    return value("a string");
  }
  bool start_object(size_t) {
    if (!enter("an object")) return false;
    frames_.push_back(Frame{true, false, {}, {}});
    frames_.back().is_weight_map = frames_.size() == 2 && frames_[0].key == "weight_map";
    if (frames_.back().is_weight_map) saw_weight_map_ = true;
    return true;
  }
  bool key(json::string_t& k) {
    Frame& f = frames_.back();
    if (!f.keys.insert(k).second) {
      return error("{}: duplicate key {}, expected each key once", label_, printable(k));
    }
    f.key = std::move(k);
    return true;
  }
  bool end_object() {
    frames_.pop_back();
    return frames_.empty() ? finish() : true;
  }
  bool start_array(size_t) {
    if (!enter("an array")) return false;
    frames_.push_back(Frame{false, false, {}, {}});
    return true;
  }
  bool end_array() {
    frames_.pop_back();
    return true;
  }
  bool parse_error(size_t position, const std::string& token, const nlohmann::detail::exception&) {
    return error("{}: not valid JSON at byte {} (last read '{}')", label_, position, printable(token));
  }

  const std::string& message() const { return message_; }
  std::vector<std::pair<std::string, std::string>> take_entries() { return std::move(entries_); }

 private:
  struct Frame {
    bool is_object;
    bool is_weight_map;
    std::set<std::string> keys;
    std::string key;  // the key whose value comes next
  };

  template <class... Args>
  bool error(fmt::format_string<Args...> f, Args&&... args) {
    if (message_.empty()) message_ = fmt::format(f, std::forward<Args>(args)...);
    return false;
  }
  bool in_weight_map() const { return !frames_.empty() && frames_.back().is_weight_map; }
  bool at_weight_map_key() const {
    return frames_.size() == 1 && frames_[0].is_object && frames_[0].key == "weight_map";
  }
  // A value of `kind` is about to start (objects and arrays included): check it fits where it stands.
  bool enter(std::string_view kind) {
    if (frames_.size() >= static_cast<size_t>(kMaxIndexDepth)) {
      return error("{}: nested too deep, expected at most {} levels", label_, kMaxIndexDepth);
    }
    if (frames_.empty() && kind != "an object")
      return error("{}: expected a JSON object, got {}", label_, kind);
    if (at_weight_map_key() && kind != "an object") {
      return error("{}: weight_map, expected an object, got {}", label_, kind);
    }
    if (in_weight_map()) {
      return error("{}: weight_map: {}, expected a shard file name (string), got {}", label_,
                   printable(frames_.back().key), kind);
    }
    return true;
  }
  bool value(std::string_view kind) { return enter(kind); }
  bool finish() {
    if (!saw_weight_map_) return error("{}: expected an object with a \"weight_map\" object", label_);
    return true;
  }

  std::string_view label_;
  std::vector<Frame> frames_;
  bool saw_weight_map_ = false;
  std::vector<std::pair<std::string, std::string>> entries_;
  std::string message_;
};

}  // namespace

Result<std::vector<std::pair<std::string, std::string>>> parse_safetensors_index(std::string_view text,
                                                                                 std::string_view label) {
  IndexSax sax(label);
  bool ok = false;
  try {
    ok = json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const std::exception& e) {  // nlohmann reports through parse_error; this is belt and braces
    return fail("{}: not valid JSON: {}", label, printable(e.what()));
  }
  if (!ok) return tl::unexpected(Error{sax.message()});
  return sax.take_entries();
}

Result<Checkpoint> Checkpoint::open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return fail("{}: not a directory", dir);
  Checkpoint ck;
  ck.dir_ = dir;
  const fs::path root(dir);

  std::vector<std::string> shards;  // file names inside dir
  std::vector<std::pair<std::string, std::string>> weight_map;
  const std::string index_path = (root / kIndexFileName).string();
  // note: transformers' precedence: model.safetensors wins over an index. With an index, files it does not
  // name (e.g. Mistral's consolidated.safetensors beside the HF shards) are never opened.
  auto single_present = present_file(root / kSingleFileName);
  if (!single_present) return tl::unexpected(single_present.error());
  const bool single = *single_present;
  auto index_present = single ? Result<bool>(false) : present_file(index_path);
  if (!index_present) return tl::unexpected(index_present.error());
  const bool sharded = *index_present;
  if (single) {
    shards.emplace_back(kSingleFileName);
  } else if (sharded) {
    Result<std::string> text = read_index(index_path);
    if (!text) return tl::unexpected(text.error());
    Result<std::vector<std::pair<std::string, std::string>>> parsed =
        parse_safetensors_index(*text, index_path);
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
    // No index: every *.safetensors file, sorted so that file order and errors are deterministic. The
    // writer's temp files ("x.safetensors.tmp.XXXXXX") do not match.
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.ends_with(".safetensors") && is_file(it->path())) shards.push_back(name);
    }
    if (ec) return fail("{}: cannot list: {}", dir, ec.message());
    std::sort(shards.begin(), shards.end());
    if (shards.empty()) {
      return fail("{}: no checkpoint, expected {}, {} or *.safetensors files", dir, kSingleFileName,
                  kIndexFileName);
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
        return fail("{}: {}: listed in shard {}, which lacks it", index_path, printable(name),
                    printable(shard));
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
