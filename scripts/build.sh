#!/usr/bin/env bash
# Configures (once) and builds sinkd into ./build, warnings as errors (the
# project's own builds and CI; meson's default leaves them warnings, for
# distributions' compilers and flags). Arguments are meson options for
# ./build (-Dtests=false builds without the test suite and its
# dependencies), applied to an existing build folder too.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f build/build.ninja ]; then
  [ $# -eq 0 ] || meson configure build "$@" >/dev/null
else
  meson setup build -Dwerror=true "$@"
fi
ninja -C build
