#!/usr/bin/env bash
# Configures (once) and builds sinkd into ./build. Arguments are meson
# options for ./build (-Dtests=false builds without the test suite and its
# dependencies), applied to an existing build folder too.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -f build/build.ninja ]; then
  [ $# -eq 0 ] || meson configure build "$@" >/dev/null
else
  meson setup build "$@"
fi
ninja -C build
