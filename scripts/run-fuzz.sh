#!/usr/bin/env bash
# Runs every libFuzzer target of a -Dfuzzing=true build for a bounded time
# under its sanitizers, starting from the seed corpus in tests/fuzz/corpus
# (the corpus in the repo is read, never written: new inputs go to a
# temporary folder). A crash, leak, timeout or broken invariant fails the
# run and leaves the input in $SK_FUZZ_OUT (default build dir/fuzz-out)
# for tests/fuzz/regress/<target>/ once fixed.
# Each target starts from the random seed SK_FUZZ_SEED (default 1;
# 0 lets libFuzzer pick one, to explore). A fixed seed does not make two
# machines try the same inputs: libFuzzer's start depends on the order in
# which the file system lists the corpus, and a timed run on a faster
# machine goes further. A failure is replayed from the input it leaves.
# The inputs of tests/fuzz/regress/<target>/ join the starting corpus.
#   scripts/run-fuzz.sh BUILD_DIR [SECONDS_PER_TARGET (default 60)]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: run-fuzz.sh BUILD_DIR [SECONDS]}
seconds=${2:-60}
seed=${SK_FUZZ_SEED:-1}
out=${SK_FUZZ_OUT:-$build/fuzz-out}
shared=${SK_SHARED_DIR:-../shared}
export SK_MODEL=${SK_MODEL:-$(cd "$shared" && pwd)/models/stories260K.gguf}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
mkdir -p "$out"
status=0
summary=()
for t in frame server gguf tokenizer chat http config; do
  bin="$build/tests/fuzz/fuzz-$t"
  [ -x "$bin" ] || { echo "run-fuzz: $bin missing (configure with -Dfuzzing=true)" >&2; exit 1; }
  work=$(mktemp -d "${TMPDIR:-/tmp}/sinkd-fuzz-$t.XXXXXX")
  log="$out/fuzz-$t.log"
  echo "== fuzz-$t: ${seconds} s" >&2
  regress=()
  [ -d "tests/fuzz/regress/$t" ] && regress=("tests/fuzz/regress/$t")
  rc=0
  "$bin" -seed="$seed" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2560 -print_final_stats=1 \
    -artifact_prefix="$out/$t-" "$work" "tests/fuzz/corpus/$t" "${regress[@]}" >"$log" 2>&1 || rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
  corpus=$(find "$work" -type f | wc -l)
  rm -rf "$work"
  if [ "$rc" -ne 0 ]; then
    status=1
    echo "fuzz-$t FAILED (exit $rc); the end of $log:" >&2
    tail -60 "$log" >&2
    ls -l "$out/$t-"* >&2 2>/dev/null || true
    summary+=("fuzz-$t: FAILED after ${runs:-?} inputs (exit $rc), see $log")
  else
    summary+=("fuzz-$t: ${runs:-0} inputs in ${seconds} s, 0 crashes, ${corpus} new corpus entries, peak RSS ${rss:-?} MiB")
  fi
done
for line in "${summary[@]}"; do echo "figures: $line"; done | tee "$out/figures.txt"
exit $status
