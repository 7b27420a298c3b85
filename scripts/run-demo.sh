#!/usr/bin/env bash
# Installs what building and running need (not the test toolchain),
# builds without the test suite, starts sinkd on the test model and
# prints a story generated through sinkctl; then stops the daemon.
#   MODEL=path/to/model.gguf PROMPT="..." ./scripts/run-demo.sh
# A code model (pycode-*.gguf) samples at temperature 0.5 (seed 42) and
# stops at the end of a top-level definition (two blank lines): at the
# story model's 0.8 its code wanders, greedy it repeats itself.
# TEMPERATURE, SEED and MAX_TOKENS override the choice.
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
set -- --max-tokens "${MAX_TOKENS:-200}" --seed "${SEED:-42}"
case $(basename "$model") in
pycode*) set -- "$@" --temperature "${TEMPERATURE:-0.5}" --stop $'\n\n\n' ;;
*) [ -z "${TEMPERATURE:-}" ] || set -- "$@" --temperature "$TEMPERATURE" ;;
esac
./build/client/sinkctl --socket "$sock" generate "$@" "$prompt"
