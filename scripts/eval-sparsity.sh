#!/bin/sh
# The perplexity-against-sparsity curve of doc/sparsity.md: calibrates
# MODEL's MLP sparsity thresholds (levels 0.1 ... 0.7) on CALIB_TEXT,
# starts sinkd with them and streams TEXT through `sinkctl eval` at a
# budget of 256 (4 sinks + 252), with a dense MLP and at each level.
# Writes OUT.calib, OUT.txt (the table) and OUT.csv; stops the daemon.
#
#   scripts/eval-sparsity.sh BUILD_DIR MODEL TEXT CALIB_TEXT OUT [TOKENS]
#
# TOKENS (default 4000) scored tokens. The calibration text must not be
# the scored text. THREADS (default 2) compute threads. Run it under nice
# on a shared machine.
set -eu
build=$1
model=$2
text=$3
calib=$4
out=$5
tokens=${6:-4000}
threads=${THREADS:-2}
"$build/daemon/sinkd" --config /dev/null --model "$model" --calibrate "$calib" \
  --sparsity-file "$out.calib" --threads "$threads" 2>/dev/null
dir=$(mktemp -d "${TMPDIR:-/tmp}/sinkd-sparsity.XXXXXX")
state=$(mktemp -d /dev/shm/sinkd-sparsity.XXXXXX 2>/dev/null || echo "$dir/state")
"$build/daemon/sinkd" --config /dev/null --model "$model" --sparsity-file "$out.calib" \
  --socket "$dir/sock" --state-dir "$state" --threads "$threads" 2>"$dir/sinkd.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir" "$state"' EXIT
i=0
until "$build/client/sinkctl" --socket "$dir/sock" ping >/dev/null 2>&1; do
  kill -0 $pid 2>/dev/null || { cat "$dir/sinkd.log" >&2; exit 1; }
  [ $i -lt 600 ] || { echo "sinkd did not start" >&2; exit 1; }
  sleep 0.1
  i=$((i + 1))
done
set -- --tokens "$tokens" --budget 256 --span 1000 --csv "$out.csv" --run streaming:sinks=4
for level in 0.1 0.2 0.3 0.4 0.5 0.6 0.7; do
  set -- "$@" --run "streaming:sinks=4,sparsity=$level"
done
"$build/client/sinkctl" --socket "$dir/sock" eval "$@" "$text" >"$out.txt"
