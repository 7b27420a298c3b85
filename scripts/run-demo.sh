#!/usr/bin/env bash
# Installs what building and running need (not the test toolchain),
# builds without the test suite, starts sinkd on the test model and
# prints a story generated through sinkctl; then stops the daemon.
#   MODEL=path/to/model.gguf PROMPT="..." ./scripts/run-demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/deps.sh
./scripts/build.sh -Dtests=false
model=${MODEL:-../shared/models/stories260K.gguf}
prompt=${PROMPT:-Once upon a time}
dir=$(mktemp -d "${TMPDIR:-/tmp}/sinkd-demo.XXXXXX")
sock="$dir/sinkd.sock"
./build/daemon/sinkd --model "$model" --socket "$sock" --state-dir "$dir/state" 2>"$dir/sinkd.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
  ./build/client/sinkctl --socket "$sock" ping >/dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { cat "$dir/sinkd.log" >&2; exit 1; }
  sleep 0.1
done
echo "sinkd is up (pid $pid, socket $sock); generating:" >&2
./build/client/sinkctl --socket "$sock" generate --max-tokens 200 --seed 42 "$prompt"
