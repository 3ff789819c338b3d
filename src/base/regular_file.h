// Reading a file named by untrusted input (a checkpoint directory's JSON, a tokenizer, a delta path): regular
// files only, refused by kind (a FIFO, a directory, /dev/zero), and a size bound checked before and during the
// read, so no input hangs the process or grows it past the bound (bad_inputs: a FIFO as config.json hung, a
// delta path of /dev/zero grew to 2 GB, a directory as tokenizer.json reported 2^63 - 1 bytes).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/error.h"

namespace mxq {

// The whole file; nullopt when the path does not exist. Refuses another kind of file and one of more than
// `max_bytes` bytes, each by path.
Result<std::optional<std::string>> read_regular_file(const std::string& path, uint64_t max_bytes);

// Its first `n` bytes (fewer when the file is shorter), for a magic or header check before the whole file
// is read. Refuses a missing path and another kind of file.
Result<std::string> read_regular_file_head(const std::string& path, size_t n);

}  // namespace mxq
