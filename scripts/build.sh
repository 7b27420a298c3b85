#!/usr/bin/env bash
# Configures (once) and builds sinkd into ./build.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -f build/build.ninja ] || meson setup build
ninja -C build
