#!/bin/sh
# Benchmarks sinkd on synthetic models (README, "Performance").
#
#   scripts/bench.sh BUILD_DIR OUT_DIR [decode|aggregate|positions]...
#
# Writes the models (sinkd-mkmodel, random weights, real shapes) into
# OUT_DIR (never into the source tree: they are outputs), starts sinkd on
# each with 1 and 2 compute threads on a socket in OUT_DIR, runs
# sinkd-bench --json against it and keeps one JSON file per run in OUT_DIR.
# Prints the machine load before each run: shared machines are noisy.
set -eu
build=$1
out=$2
shift 2
parts=${*:-decode aggregate positions}
mkdir -p "$out"
mk="$build/tools/sinkd-mkmodel"
bench="$build/tools/sinkd-bench"
sinkd="$build/daemon/sinkd"

model() { # shape type -> path
  f="$out/$1-$2.gguf"
  [ -f "$f" ] || "$mk" --shape "$1" --type "$2" -o "$f" >&2
  echo "$f"
}

# run NAME MODEL THREADS BENCH_ARGS... (daemon options in $DAEMON_ARGS)
run() {
  name=$1 m=$2 t=$3
  shift 3
  sock="$out/sinkd.sock"
  state="$out/state-$name"
  rm -rf "$state"
  "$sinkd" --config /dev/null --model "$m" --socket "$sock" --state-dir "$state" \
    --threads "$t" --max-sessions 80 --max-user-sessions 80 ${DAEMON_ARGS:-} \
    2>"$out/$name.log" &
  pid=$!
  i=0
  until [ -S "$sock" ] || [ $i -gt 300 ]; do sleep 0.1; i=$((i + 1)); done
  echo "== $name ($(uptime | sed 's/.*load/load/'))" >&2
  status=0
  "$bench" --socket "$sock" --json "$@" >"$out/$name.json" || status=$?
  kill "$pid"
  wait "$pid" || true
  [ $status -eq 0 ] || exit $status
  rm -rf "$state"
  cat "$out/$name.json"
}

for part in $parts; do
  case $part in
  decode)
    for shape in 15M 110M; do
      for type in f32 q8_0; do
        for t in 1 2; do
          run "decode-$shape-$type-t$t" "$(model $shape $type)" $t \
            --no-concurrency --no-positions --prefill 128 --gen 128 --reps 3
        done
      done
    done
    ;;
  aggregate)
    # f32 KV caches (the default), then f16 (llama.cpp's default cache)
    for kv in f32 f16; do
      for t in 1 2; do
        DAEMON_ARGS="--kv-type $kv" run "aggregate-110M-q8_0-t$t-kv$kv" "$(model 110M q8_0)" $t \
          --no-prefill --no-positions --concurrency 1,4,16,64 --gen 128
      done
    done
    ;;
  positions)
    run "positions-260K-f32-t1" "$(model 260K f32)" 1 \
      --no-prefill --no-decode --no-concurrency --positions 1e3,1e4,1e5,1e6 --pos-gen 1024 \
      --window 1024 --sinks 4
    ;;
  *)
    echo "unknown part $part (decode, aggregate, positions)" >&2
    exit 2
    ;;
  esac
done
