#include "io/safetensors_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>

namespace mxq {
namespace {

using ordered_json = nlohmann::ordered_json;

// nlohmann refuses to dump invalid UTF-8 by throwing; turn that into an error naming the string.
Result<std::string> dump(const ordered_json& j, std::string_view what) {
  try {
    return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict);
  } catch (const std::exception&) {
    return fail("{}: not valid UTF-8", what);
  }
}

Status check_tensor(const TensorToWrite& t, std::string_view path) {
  const std::string name = printable(t.name);
  if (t.name.empty()) return fail("{}: empty tensor name, expected a non-empty name", path);
  if (t.name == kMetadataKey) return fail("{}: tensor named {}, expected any other name", path, kMetadataKey);
  if (t.name.find('\0') != std::string::npos) return fail("{}: tensor {}: name contains NUL", path, name);
  if (t.name.size() > kMaxNameBytes) {
    return fail("{}: tensor {}: name too long, expected at most {} bytes, got {}", path, name, kMaxNameBytes,
                t.name.size());
  }
  if (Result<std::string> s = dump(ordered_json(t.name), fmt::format("{}: tensor {}", path, name)); !s) {
    return tl::unexpected(s.error());
  }
  if (t.dtype >= Dtype::kCount) {
    return fail("{}: {}: dtype, expected an enumerator below {}, got {}", path, name,
                static_cast<int>(Dtype::kCount), static_cast<int>(t.dtype));
  }
  if (t.shape.size() > kMaxRank) {
    return fail("{}: {}: rank, expected at most {}, got {}", path, name, kMaxRank, t.shape.size());
  }
  Result<uint64_t> want = tensor_nbytes(t.dtype, t.shape, fmt::format("{}: {}", path, name));
  if (!want) return tl::unexpected(want.error());
  if (*want != t.bytes.size()) {
    return fail("{}: {}: byte count for {} {}, expected {}, got {}", path, name, dtype_name(t.dtype),
                fmt::join(t.shape, "x"), *want, t.bytes.size());
  }
  return {};
}

Status write_all(int fd, const uint8_t* p, size_t n, const std::string& tmp) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return fail("{}: write failed: {}", tmp, std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return {};
}

// Creates `path`.tmp.XXXXXX beside the target, writes, fsyncs and renames; removes the temp file on failure.
Status write_atomically(const std::string& path, const std::string& header,
                        const std::vector<const TensorToWrite*>& order) {
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) return fail("{}: cannot create a temporary file beside it: {}", path, std::strerror(errno));
  Status s = [&]() -> Status {
    // note: 0644 like a file created under the usual umask; mkstemp's 0600 would hide weights from servers
    // running as another user.
    if (::fchmod(fd, 0644) != 0) return fail("{}: chmod failed: {}", tmp, std::strerror(errno));
    if (Status w = write_all(fd, reinterpret_cast<const uint8_t*>(header.data()), header.size(), tmp); !w) {
      return w;
    }
    for (const TensorToWrite* t : order)
      if (Status w = write_all(fd, t->bytes.data(), t->bytes.size(), tmp); !w) return w;
    if (::fsync(fd) != 0) return fail("{}: fsync failed: {}", tmp, std::strerror(errno));
    return {};
  }();
  if (::close(fd) != 0 && s) s = fail("{}: close failed: {}", tmp, std::strerror(errno));
  if (s && ::rename(tmp.c_str(), path.c_str()) != 0) {
    s = fail("{}: cannot rename {} over it: {}", path, tmp, std::strerror(errno));
  }
  if (!s) ::unlink(tmp.c_str());
  return s;
}

}  // namespace

Status write_safetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<const TensorToWrite*> order;
  order.reserve(tensors.size());
  std::set<std::string_view> names;
  for (const TensorToWrite& t : tensors) {
    if (Status s = check_tensor(t, path); !s) return s;
    if (!names.insert(t.name).second) {
      return fail("{}: duplicate tensor {}, expected each name once", path, printable(t.name));
    }
    order.push_back(&t);
  }
  std::sort(order.begin(), order.end(), [](const TensorToWrite* a, const TensorToWrite* b) {
    return a->dtype != b->dtype ? a->dtype > b->dtype : a->name < b->name;
  });

  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    header[std::string(kMetadataKey)] = std::move(m);
  }
  uint64_t offset = 0;
  for (const TensorToWrite* t : order) {
    const uint64_t end = offset + t->bytes.size();  // cannot wrap: each span lives in our address space
    header[t->name] = {
        {"dtype", std::string(dtype_name(t->dtype))}, {"shape", t->shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  Result<std::string> text = dump(header, fmt::format("{}: {}", path, kMetadataKey));
  if (!text) return tl::unexpected(text.error());
  // note: spaces pad the header to a multiple of 8 so the data section starts 8-aligned in the file.
  text->append((8 - text->size() % 8) % 8, ' ');
  std::string bytes(8, '\0');
  const uint64_t n = text->size();
  std::memcpy(bytes.data(), &n, 8);  // little-endian host (static_assert in safetensors.cpp)
  bytes += *text;
  return write_atomically(path, bytes, order);
}

}  // namespace mxq
