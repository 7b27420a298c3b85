#!/usr/bin/env bash
# Installs the dependencies, builds, and runs the whole test suite.
# The shared material (test model, llama.cpp reference values) is read from
# ../shared beside the checkout unless SK_SHARED_DIR names another folder.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh
meson test -C build --print-errorlogs "$@"
