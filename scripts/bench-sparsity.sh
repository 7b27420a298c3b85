#!/bin/sh
# Decode speed of MLP contextual sparsity against dense decode, in one
# daemon (doc/sparsity.md, "Speed").
#
#   scripts/bench-sparsity.sh BUILD_DIR OUT_DIR MODEL CALIBRATION [LEVEL]
#
# Starts sinkd on MODEL with the sparsity calibration CALIBRATION (made by
# sinkd --calibrate for that model), opens two streaming sessions, one
# dense and one at sparsity LEVEL (default 0.5), gives both the same
# prompt, then for ROUNDS rounds (default 6) has each generate TOKENS
# tokens (default 32, EOS ignored), one after the other, the two taking
# turns at going first, so that the machine's swings fall on both. Prints
# tokens/s of each round, the daemon's CPU time per token (all its
# threads, /proc/PID/stat: less disturbed by other processes than wall
# time) and the ratios (sparse over dense speed), the medians, and the weight
# bytes one token reads in each session (stats: weight_bytes_per_token,
# from the neurons the sparse session kept). THREADS (default 2) compute
# threads. Prints the machine load before and after: shared machines
# are noisy. Leaves the daemon's log in OUT_DIR.
set -eu
build=$1
out=$2
model=$3
calib=$4
level=${5:-0.5}
rounds=${ROUNDS:-6}
tokens=${TOKENS:-32}
threads=${THREADS:-2}
mkdir -p "$out"
sinkd="$build/daemon/sinkd"
ctl="$build/client/sinkctl"
sock="$out/sinkd-sparsity.sock"
state="$out/state-sparsity"
rm -rf "$state"
"$sinkd" --config /dev/null --model "$model" --sparsity-file "$calib" --socket "$sock" \
  --state-dir "$state" --threads "$threads" 2>"$out/sinkd-sparsity.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
i=0
until [ -S "$sock" ] || [ $i -gt 1200 ]; do sleep 0.1; i=$((i + 1)); done
[ -S "$sock" ] || { echo "sinkd did not start; see $out/sinkd-sparsity.log" >&2; exit 1; }

echo "load before: $(uptime | sed 's/.*load/load/')"
dense=$("$ctl" -s "$sock" open --policy streaming)
sparse=$("$ctl" -s "$sock" open --policy streaming --sparsity "$level")
prompt="Once upon a time there was a little dog who liked to run in the park."
"$ctl" -s "$sock" generate --session "$dense" -n 1 "$prompt" >/dev/null
"$ctl" -s "$sock" generate --session "$sparse" -n 1 "$prompt" >/dev/null

# the daemon's CPU time so far (all threads), in clock ticks
cpu() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
tck=$(getconf CLK_TCK)
# gen SESSION -> "tokens/s CPU-ms/token" of one generate of $tokens tokens
gen() {
  c0=$(cpu)
  t0=$(date +%s.%N)
  n=$("$ctl" -s "$sock" --json generate --session "$1" --max-tokens "$tokens" --ignore-eos \
    | sed -n 's/.*"completion_tokens": \([0-9]*\).*/\1/p')
  t1=$(date +%s.%N)
  c1=$(cpu)
  awk -v n="$n" -v a="$t0" -v b="$t1" -v c="$((c1 - c0))" -v k="$tck" \
    'BEGIN { printf "%.3f %.1f", n / (b - a), 1000 * c / k / n }'
}

printf '%-6s %12s %12s %8s %14s %14s %8s\n' round "dense tok/s" "$level tok/s" ratio \
  "dense cpu ms" "$level cpu ms" ratio
all_d="" all_s="" all_cd="" all_cs=""
r=1
while [ $r -le "$rounds" ]; do
  if [ $((r % 2)) -eq 1 ]; then dd=$(gen "$dense"); ss=$(gen "$sparse")
  else ss=$(gen "$sparse"); dd=$(gen "$dense"); fi
  d=${dd% *} cd=${dd#* } s=${ss% *} cs=${ss#* }
  printf '%-6s %12s %12s %8s %14s %14s %8s\n' "$r" "$d" "$s" \
    "$(awk -v d="$d" -v s="$s" 'BEGIN { printf "%.3f", s / d }')" "$cd" "$cs" \
    "$(awk -v d="$cd" -v s="$cs" 'BEGIN { printf "%.3f", d / s }')"
  all_d="$all_d $d" all_s="$all_s $s" all_cd="$all_cd $cd" all_cs="$all_cs $cs"
  r=$((r + 1))
done
median() { echo "$@" | tr ' ' '\n' | sed '/^$/d' | sort -g | awk '{ v[NR] = $1 } END {
  if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
md=$(median "$all_d")
ms=$(median "$all_s")
echo "median: dense $md tok/s, sparsity $level $ms tok/s, ratio $(awk -v d="$md" -v s="$ms" 'BEGIN { printf "%.3f", s / d }')"
mcd=$(median "$all_cd")
mcs=$(median "$all_cs")
echo "median CPU time per token (all daemon threads): dense $mcd ms, sparsity $level $mcs ms," \
  "ratio $(awk -v d="$mcd" -v s="$mcs" 'BEGIN { printf "%.3f", d / s }')"
bytes() { "$ctl" -s "$sock" --json stats "$1" | sed -n 's/.*"weight_bytes_per_token": \([0-9.e+]*\).*/\1/p'; }
bd=$(bytes "$dense")
bs=$(bytes "$sparse")
echo "weights read per token: dense $(awk -v b="$bd" 'BEGIN { printf "%.1f", b / 1e6 }') MB," \
  "sparsity $level $(awk -v b="$bs" 'BEGIN { printf "%.1f", b / 1e6 }') MB" \
  "(ratio $(awk -v d="$bd" -v s="$bs" 'BEGIN { printf "%.3f", d / s }'))"
"$ctl" -s "$sock" stats "$sparse" | grep '^sparsity'
echo "load after: $(uptime | sed 's/.*load/load/')"
