// libFuzzer harness for the sharded-checkpoint index reader (parse_safetensors_index on the text).
// Accepted text must yield what Checkpoint::open relies on; a violation traps (reported as a crash).
#include <cstddef>
#include <cstdint>
#include <set>
#include <string_view>

#include "io/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto entries = mxq::parse_safetensors_index(text, "fuzz.index.json");
  if (!entries) {
    if (entries.error().message.empty() || entries.error().message.find('\n') != std::string::npos) {
      __builtin_trap();
    }
    return 0;
  }
  std::set<std::string_view> names;  // duplicate keys were refused, so names are unique
  for (const auto& [name, shard] : *entries)
    if (!names.insert(name).second) __builtin_trap();
  return 0;
}
