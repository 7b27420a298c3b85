#!/bin/sh
# The StreamingLLM comparison of doc/eval.md for one model and one cache
# budget: starts sinkd on MODEL, streams TEXT through `sinkctl eval` with
# dense (to the model's context), window, streaming with 1, 2, 4 and 8
# sinks, h2o, sink_h2o and both recompute variants, and writes the table
# (OUT.txt), the CSV (OUT.csv) and the plot (OUT.png). Stops the daemon.
#
#   scripts/eval-policies.sh BUILD_DIR MODEL TEXT BUDGET STRIDE OUT [TOKENS]
#
# STRIDE is --recompute-stride: the recompute runs score every STRIDE-th
# token (a fresh session per scored token costs a prefill of the whole
# window). TOKENS (default: the whole text) limits the scored tokens.
# THREADS (default 1) compute threads. Run it under nice on a shared
# machine: `nice scripts/eval-policies.sh ...`.
set -eu
build=$1
model=$2
text=$3
budget=$4
stride=$5
out=$6
tokens=${7:-}
threads=${THREADS:-1}
dir=$(mktemp -d "${TMPDIR:-/tmp}/sinkd-eval.XXXXXX")
# the session store on tmpfs where there is one (else it writes through)
state=$(mktemp -d /dev/shm/sinkd-eval.XXXXXX 2>/dev/null || echo "$dir/state")
"$build/daemon/sinkd" --config /dev/null --model "$model" --socket "$dir/sock" \
  --state-dir "$state" --threads "$threads" 2>"$dir/sinkd.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir" "$state"' EXIT
i=0
until "$build/client/sinkctl" --socket "$dir/sock" ping >/dev/null 2>&1; do
  kill -0 $pid 2>/dev/null || { cat "$dir/sinkd.log" >&2; exit 1; }
  [ $i -lt 600 ] || { echo "sinkd did not start" >&2; exit 1; }
  sleep 0.1
  i=$((i + 1))
done
set -- --budget "$budget" --span 1000 --recompute-stride "$stride" \
  --run dense --run window --run streaming:sinks=1 --run streaming:sinks=2 \
  --run streaming:sinks=4 --run streaming:sinks=8 --run h2o --run sink_h2o \
  --run recompute --run recompute:bos=0 --csv "$out.csv" --plot "$out.png"
[ -z "$tokens" ] || set -- "$@" --tokens "$tokens"
start=$(date +%s)
"$build/client/sinkctl" --socket "$dir/sock" eval "$@" "$text" >"$out.txt"
echo "$(basename "$model"), budget $budget: $(($(date +%s) - start)) s" >&2
