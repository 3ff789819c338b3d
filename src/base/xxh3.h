// XXH3-64 from Debian's libxxhash header in its inline mode (XXH_INLINE_ALL), so it compiles with libmxq's
// -march=x86-64-v3 (AVX2) instead of running the shared library's baseline (SSE2) build: the same hash, faster
// (a 36 MB delta body: 1.5 ms against 1.9-2.8 ms on the build machine). For the host's hot hashes: delta
// bodies, canonical checksums of host planes.
#pragma once

#define XXH_INLINE_ALL
#include <xxhash.h>
