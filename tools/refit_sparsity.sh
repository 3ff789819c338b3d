#!/usr/bin/env bash
# Device wrapper for tools/refit_sparsity.py: finds or builds a CPU-only mxq binary (only `mxq delta` is
# needed), puts the Debian runtime libraries it links on LD_LIBRARY_PATH, runs the measurement and writes the
# log, sparsity.md and sparsity.json to $OUT (default /tmp/refit_sparsity_out); the tables print last.
# mxq binary, first that runs: $MXQ; prebuilt/mxq (a CPU-only mxq_cli built on the development machine and
# carried); else a fresh CPU-only build of the mxq_cli target (-DMXQ_CUDA=OFF, 16 jobs) into /tmp/mxq-cpu from
# $MXQ_SRC (default: this tree). Debian .debs come from $MXQ_DEBS or the first of .deps, ../../.deps.
# Usage: tools/refit_sparsity.sh [refit_sparsity.py arguments], e.g.
#   tools/refit_sparsity.sh --large --large-train-s 120 --large-steps 8
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/refit_sparsity_out}
mkdir -p "$OUT"
debs=${MXQ_DEBS:-}
if [ -z "$debs" ]; then
  for d in .deps ../../.deps; do [ -d "$d" ] && debs=$d && break; done
fi
prefix=/tmp/deps
if [ -n "$debs" ]; then
  mkdir -p "$prefix"
  for f in "$debs"/*.deb; do dpkg -x "$f" "$prefix"; done
  export CPATH=$prefix/usr/include${CPATH:+:$CPATH}
  export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
mxq=${MXQ:-}
if [ -z "$mxq" ] && [ -x prebuilt/mxq ] && prebuilt/mxq delta --help >/dev/null 2>&1; then mxq=prebuilt/mxq; fi
if [ -z "$mxq" ]; then
  echo "refit_sparsity.sh: no runnable prebuilt mxq; building mxq_cli (CPU only)"
  [ -x prebuilt/mxq ] && { prebuilt/mxq delta --help 2>&1 | head -5; }
  src=${MXQ_SRC:-.}
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  if ! { cmake -S "$src" -B /tmp/mxq-cpu "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMXQ_CUDA=OFF \
      -DCMAKE_PREFIX_PATH="$prefix/usr" -DCMAKE_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu" &&
      cmake --build /tmp/mxq-cpu -j16 --target mxq_cli; } >"$OUT/build.log" 2>&1; then
    tail -30 "$OUT/build.log"
    exit 1
  fi
  mxq=/tmp/mxq-cpu/mxq
fi
model=models/default
[ -f "$model/config.json" ] || model=../../models/default
echo "refit_sparsity.sh: mxq $mxq, model $model, $(nproc) cores"
PYTHONUNBUFFERED=1 python3 tools/refit_sparsity.py --mxq "$mxq" --model "$model" --out "$OUT" "$@" 2>&1 |
  tee "$OUT/log.txt"
