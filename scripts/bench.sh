#!/bin/sh
# Benchmarks sinkd on synthetic models (doc/performance.md: the method
# and the latest figures).
#
#   scripts/bench.sh BUILD_DIR OUT_DIR
#     [decode|aggregate|positions|sidebyside|single|ratio|server|mixed|spec]...
#
# sidebyside needs LLAMA_BENCH, the path of llama.cpp's llama-bench
# (doc/performance.md says how to build it): for each shape, weight type and thread
# count it runs llama-bench tg64 and sinkd-bench's one-session decode of 64
# tokens in ROUNDS rounds (default 3), the two taking turns at going first,
# and prints one line per round and the median ratio, with the weight
# bytes each decoded token reads times tokens/s (GB/s; both engines read
# the same file's weights once per token), and the machine's sequential
# read bandwidth (sinkd-kbench --membw) before and after.
# SHAPES (default "15M 110M"), TYPES (default "f32 q8_0"; any type or
# preset sinkd-mkmodel writes, e.g. "q4_K_M q6_K q4_0", mixed as
# llama-quantize mixes them) and THREADS (default "1 2") choose the
# cells.
#
# single: one session's prefill and decode against llama.cpp's
# llama-bench (LLAMA_BENCH) and, if BASE_BUILD names another sinkd build
# (e.g. of the main branch), against that build, for each model of
# SINGLE_MODELS (default "1B:q4_K_M") with THREADS threads (default 2),
# ROUNDS rounds (default 3) taking turns at going first: sinkd-bench's
# one PREFILL-token append (default 512) and 64-token decode (medians of
# 3) against llama-bench's ppPREFILL and tg64 (averages of 3); per round
# the tokens/s, the decode's weight read rate (GB/s) and the ratios,
# then the median of each ratio.
#
# ratio: 16 sessions against one on the 110M shape, taking turns
# (1, 16, 1, 16, ... ROUNDS times, default 6) in one daemon per weight
# type (RATIO_TYPES, default "q8_0"; e.g. "q8_0 q4_K_M"), thread count
# and KV type (RATIO_KV, default "f16 f32"), so that the VM's swings
# fall on both; prints the medians, their ratio and the ratio of each
# round.
#
# server: many sessions against llama.cpp's llama-server (LLAMA_SERVER,
# its path), for each model of SERVER_MODELS (default "110M:q8_0
# 1B:q4_K_M", shape:type) with THREADS threads (default 2), ROUNDS rounds
# (default 3) taking turns at going first: sinkd-bench's 1, 16 and 64
# concurrent sessions (128 greedy tokens after a 16-token prompt) against
# llama-server -np 16 and -np 64 on the same file, threads and prompts,
# measured alike (scripts/llama-server-bench.py); per round the aggregate
# tokens/s and the ratios, then the median of each ratio.
#
# mixed: for each model of MIXED_MODELS (default as SERVER_MODELS) with
# THREADS threads, ROUNDS rounds of sinkd-bench --mixed MIXED_TOKENS
# (default 8000): the p50 and p99 inter-token gap of a generating session
# alone and beside a session prefilling that many tokens, and the median
# ratio of the p99s (DAEMON_ARGS, e.g. "--step-tokens 32", reach the
# daemon).
#
# spec: speculative decoding on the real pair of SHARED/models
# (pycode-29M, pycode-5M as its draft; SHARED defaults to ../shared
# beside the source tree), greedy continuations of SPEC_PROMPTS (8)
# prompts cut from SHARED/data/python-stdlib.txt, SPEC_ROUNDS (5)
# rounds in which the modes take turns at going first: one session with
# speculation off, draft and lookup (the outputs compared token for
# token), look-up on fortunes-en.txt (where it finds little), and
# SPEC_SESSIONS (16) sessions at once, off against draft; each daemon
# on SPEC_THREADS (2) threads. With LLAMA_SPECULATIVE (llama.cpp's
# llama-speculative) and/or LLAMA_SERVER (its llama-server, with -md;
# needs curl and jq) also their decode speed on the same prompts, model
# pair and threads, greedy, the same number of tokens, for
# --spec-draft-n-max in SPEC_LLAMA_DRAFT (3 8), beside sinkd's draft
# mode, in alternating rounds. SPEC_PARTS (code fortunes sessions side)
# picks what runs.
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
  # session caches on tmpfs, as a service keeps them (DESIGN: shared memory)
  if [ -d /dev/shm ] && [ -w /dev/shm ]; then state="/dev/shm/sinkd-bench-$name"; else state="$out/state-$name"; fi
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
    # f16 KV caches (the default, as llama.cpp's), then f32
    for kv in f16 f32; do
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
  sidebyside)
    : "${LLAMA_BENCH:?set LLAMA_BENCH to llama.cpp's llama-bench}"
    rounds=${ROUNDS:-3}
    "$build/tools/sinkd-kbench" --membw 1024 --samples 5
    printf '%-6s %-5s %-7s %-5s %10s %10s %7s %8s %8s\n' shape type threads round sinkd llama.cpp \
      ratio 'GB/s' 'GB/s'
    for shape in ${SHAPES:-15M 110M}; do
      for type in ${TYPES:-f32 q8_0}; do
        for t in ${THREADS:-1 2}; do
          m=$(model $shape $type)
          ratios=""
          r=1
          while [ $r -le "$rounds" ]; do
            for who in $( [ $((r % 2)) -eq 1 ] && echo "llama sinkd" || echo "sinkd llama"); do
              if [ "$who" = llama ]; then
                # csv: the last field of the data row is stddev_ts, the one before avg_ts
                l_tps=$("$LLAMA_BENCH" -m "$m" -p 0 -n 64 -t "$t" -r 3 -o csv 2>/dev/null |
                  tail -n 1 | tr -d '"' | awk -F, '{print $(NF-1)}')
              else
                json=$(run "sidebyside-$shape-$type-t$t-r$r" "$m" "$t" --no-prefill \
                  --no-concurrency --no-positions --gen 64 --reps 3)
                s_tps=$(echo "$json" | sed -n 's/.*"decode_tokens_per_s": \([0-9.]*\).*/\1/p')
                bytes=$(echo "$json" | sed -n 's/.*"weight_bytes": \([0-9]*\).*/\1/p')
              fi
            done
            ratio=$(awk -v a="$s_tps" -v b="$l_tps" 'BEGIN { printf "%.2f", a / b }')
            ratios="$ratios $ratio"
            printf '%-6s %-5s %-7s %-5s %10.1f %10.1f %7s %8.1f %8.1f\n' $shape $type $t $r "$s_tps" \
              "$l_tps" "$ratio" "$(awk -v a="$s_tps" -v b="$bytes" 'BEGIN { print a * b / 1e9 }')" \
              "$(awk -v a="$l_tps" -v b="$bytes" 'BEGIN { print a * b / 1e9 }')"
            r=$((r + 1))
          done
          echo "$shape $type t$t median ratio: $(echo $ratios | tr ' ' '\n' | sort -n |
            awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')"
        done
      done
    done
    "$build/tools/sinkd-kbench" --membw 1024 --samples 5
    ;;
  single)
    : "${LLAMA_BENCH:?set LLAMA_BENCH to llama.cpp's llama-bench}"
    rounds=${ROUNDS:-3}
    t=${THREADS:-2}
    pp=${PREFILL:-512}
    who_list="llama sinkd${BASE_BUILD:+ base}"
    for sm in ${SINGLE_MODELS:-1B:q4_K_M}; do
      shape=${sm%%:*} type=${sm#*:}
      m=$(model "$shape" "$type")
      rows=""
      r=1
      while [ $r -le "$rounds" ]; do
        # each round starts with the next of the engines
        order=$(echo $who_list |
          awk -v r=$r '{ for (i = 0; i < NF; i++) printf "%s ", $((r - 1 + i) % NF + 1) }')
        b_pp=0 b_tg=0
        for who in $order; do
          case $who in
          llama)
            # csv rows ppN then tg64; the field before the last is avg_ts
            csv=$("$LLAMA_BENCH" -m "$m" -p "$pp" -n 64 -t "$t" -r 3 -o csv 2>/dev/null |
              tail -n 2 | tr -d '"')
            l_pp=$(echo "$csv" | head -n 1 | awk -F, '{print $(NF-1)}')
            l_tg=$(echo "$csv" | tail -n 1 | awk -F, '{print $(NF-1)}')
            ;;
          sinkd | base)
            if [ "$who" = base ]; then
              sv_sinkd=$sinkd sv_bench=$bench
              sinkd="$BASE_BUILD/daemon/sinkd" bench="$BASE_BUILD/tools/sinkd-bench"
            fi
            json=$(run "single-$who-$shape-$type-t$t-r$r" "$m" "$t" --no-concurrency \
              --no-positions --prefill "$pp" --gen 64 --reps 3)
            v_pp=$(echo "$json" | sed -n 's/.*"prefill_tokens_per_s": \([0-9.]*\).*/\1/p')
            v_tg=$(echo "$json" | sed -n 's/.*"decode_tokens_per_s": \([0-9.]*\).*/\1/p')
            bytes=$(echo "$json" | sed -n 's/.*"weight_bytes": \([0-9]*\).*/\1/p')
            if [ "$who" = base ]; then
              sinkd=$sv_sinkd bench=$sv_bench b_pp=$v_pp b_tg=$v_tg
            else
              s_pp=$v_pp s_tg=$v_tg
            fi
            ;;
          esac
        done
        line=$(awk -v spp="$s_pp" -v stg="$s_tg" -v lpp="$l_pp" -v ltg="$l_tg" -v bpp="$b_pp" \
          -v btg="$b_tg" -v by="$bytes" 'BEGIN {
          printf "%.1f %.1f %.1f %.1f %.1f %.1f %.1f %.2f %.2f %.2f %.2f", spp, stg, lpp, ltg, bpp,
            btg, stg * by / 1e9, spp / lpp, stg / ltg, bpp ? spp / bpp : 0, btg ? stg / btg : 0 }')
        echo "$shape $type t$t round $r: sinkd pp$pp/tg64, llama.cpp pp$pp/tg64, base pp$pp/tg64," \
          "sinkd decode GB/s, pp vs llama.cpp, tg vs llama.cpp, pp vs base, tg vs base: $line"
        rows="$rows$line
"
        r=$((r + 1))
      done
      printf '%s' "$rows" | awk -v name="$shape $type, $t threads" -v pp="$pp" '
        function median(a, n,   i, j, t) {
          for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) {
            t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
          return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
        NF == 11 { n++; for (k = 1; k <= 11; k++) v[k, n] = $k }
        END {
          for (k = 1; k <= 11; k++) { for (i = 1; i <= n; i++) c[i] = v[k, i]; m[k] = median(c, n) }
          printf "%s (medians of %d rounds): sinkd pp%s %.1f, tg64 %.1f tokens/s (%.1f GB/s);", name,
            n, pp, m[1], m[2], m[7]
          printf " llama.cpp %.1f, %.1f; base %.1f, %.1f; pp vs llama.cpp %.2fx, tg %.2fx;", m[3],
            m[4], m[5], m[6], m[8], m[9]
          printf " pp vs base %.2fx, tg %.2fx\n", m[10], m[11] }'
    done
    ;;
  ratio)
    list=""
    r=0
    while [ $r -lt "${ROUNDS:-6}" ]; do list="$list${list:+,}1,16"; r=$((r + 1)); done
    for type in ${RATIO_TYPES:-q8_0}; do
    for kv in ${RATIO_KV:-f16 f32}; do
      for t in 1 2; do
        DAEMON_ARGS="--kv-type $kv" run "ratio-110M-$type-t$t-kv$kv" "$(model 110M $type)" $t \
          --no-prefill --no-decode --no-positions --concurrency "$list" --gen 128 |
          tr '{' '\n' | sed -n 's/.*"sessions": \([0-9]*\), "aggregate_tokens_per_s": \([0-9.]*\).*/\1 \2/p' |
          awk -v name="110M $type, $t thread(s), $kv KV" '
            function median(a, n,   i, j, t) {
              for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) {
                t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
              return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
            $1 == 1 { one[++n1] = $2; last = $2 }
            $1 == 16 { sixteen[++n16] = $2; rounds = rounds sprintf(" %.2f", $2 / last) }
            END {
              m1 = median(one, n1); m16 = median(sixteen, n16)
              printf "%s: one session %.1f, 16 sessions %.1f tokens/s (medians of %d), 16 / one %.2fx; rounds:%s\n",
                name, m1, m16, n16, m16 / m1, rounds }'
      done
    done
    done
    ;;
  server)
    : "${LLAMA_SERVER:?set LLAMA_SERVER to llama.cpp's llama-server}"
    rounds=${ROUNDS:-3}
    port=${LLAMA_PORT:-18419}
    here=$(dirname "$0")
    t=${THREADS:-2}
    "$build/tools/sinkd-kbench" --membw 1024 --samples 5
    for sm in ${SERVER_MODELS:-110M:q8_0 1B:q4_K_M}; do
      shape=${sm%%:*} type=${sm#*:}
      m=$(model "$shape" "$type")
      rows=""
      r=1
      while [ $r -le "$rounds" ]; do
        for who in $( [ $((r % 2)) -eq 1 ] && echo "llama sinkd" || echo "sinkd llama"); do
          if [ "$who" = sinkd ]; then
            json=$(run "server-$shape-$type-t$t-r$r" "$m" "$t" --no-prefill --no-decode \
              --no-positions --concurrency 1,16,64 --gen 128)
            agg=$(echo "$json" | tr '{' '\n' |
              sed -n 's/.*"sessions": \([0-9]*\), "aggregate_tokens_per_s": \([0-9.]*\).*/\1 \2/p')
            s1=$(echo "$agg" | awk '$1 == 1 { print $2 }')
            s16=$(echo "$agg" | awk '$1 == 16 { print $2 }')
            s64=$(echo "$agg" | awk '$1 == 64 { print $2 }')
          else
            for np in 16 64; do
              echo "== llama-server -np $np $shape $type t$t ($(uptime | sed 's/.*load/load/'))" >&2
              "$LLAMA_SERVER" -m "$m" -np $np -c $((np * 256)) -t "$t" -tb "$t" \
                --host 127.0.0.1 --port "$port" >"$out/llama-server-$np.log" 2>&1 &
              lpid=$!
              i=0
              until curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 || [ $i -gt 600 ]; do
                sleep 0.1
                i=$((i + 1))
              done
              lj=$(python3 "$here/llama-server-bench.py" --port "$port" --sessions $np --gen 128) ||
                { kill "$lpid"; exit 1; }
              kill "$lpid"
              wait "$lpid" || true
              echo "$lj" >"$out/llama-server-$shape-$type-t$t-np$np-r$r.json"
              v=$(echo "$lj" | sed -n 's/.*"aggregate_tokens_per_s": \([0-9.]*\).*/\1/p')
              if [ $np -eq 16 ]; then l16=$v; else l64=$v; fi
            done
          fi
        done
        line=$(awk -v s1="$s1" -v s16="$s16" -v s64="$s64" -v l16="$l16" -v l64="$l64" 'BEGIN {
          printf "%.1f %.1f %.1f %.1f %.1f %.2f %.2f %.2f %.2f", s1, s16, s64, l16, l64,
            s16 / l16, s64 / l64, s16 / s1, s64 / s16 }')
        echo "$shape $type t$t round $r: sinkd 1/16/64 sessions, llama-server -np 16/64," \
          "16/-np16, 64/-np64, 16/1, 64/16: $line"
        rows="$rows$line
"
        r=$((r + 1))
      done
      printf '%s' "$rows" | awk -v name="$shape $type, $t threads" '
        function median(a, n,   i, j, t) {
          for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) {
            t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
          return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
        NF == 9 { n++; for (k = 1; k <= 9; k++) v[k, n] = $k }
        END {
          for (k = 1; k <= 9; k++) { for (i = 1; i <= n; i++) c[i] = v[k, i]; m[k] = median(c, n) }
          printf "%s (medians of %d rounds): sinkd %.1f / %.1f / %.1f tokens/s (1 / 16 / 64",
            name, n, m[1], m[2], m[3]
          printf " sessions), llama-server %.1f / %.1f (-np 16 / 64); 16 vs -np 16 %.2fx,",
            m[4], m[5], m[6]
          printf " 64 vs -np 64 %.2fx, 16 vs 1 %.2fx, 64 vs 16 %.2fx\n", m[7], m[8], m[9] }'
    done
    "$build/tools/sinkd-kbench" --membw 1024 --samples 5
    ;;
  mixed)
    rounds=${ROUNDS:-3}
    t=${THREADS:-2}
    for sm in ${MIXED_MODELS:-${SERVER_MODELS:-110M:q8_0 1B:q4_K_M}}; do
      shape=${sm%%:*} type=${sm#*:}
      m=$(model "$shape" "$type")
      ratios=""
      r=1
      while [ $r -le "$rounds" ]; do
        json=$(run "mixed-$shape-$type-t$t-r$r" "$m" "$t" --no-prefill --no-decode \
          --no-concurrency --no-positions --mixed "${MIXED_TOKENS:-8000}")
        line=$(echo "$json" | sed -n 's/.*"mixed": {\([^}]*\)}.*/\1/p')
        echo "$shape $type t$t round $r: $line"
        ratios="$ratios $(echo "$line" | sed -n 's/.*"p99_ratio": \([0-9.]*\).*/\1/p')"
        r=$((r + 1))
      done
      echo "$shape $type t$t median p99 beside / alone: $(echo $ratios | tr ' ' '\n' | sort -n |
        awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')"
    done
    ;;
  spec)
    shared=${SHARED:-$(cd "$(dirname "$0")/../.." && pwd)/shared}
    target="$shared/models/pycode-29M-f16.gguf"
    draft="$shared/models/pycode-5M-f16.gguf"
    t=${SPEC_THREADS:-2}
    rounds=${SPEC_ROUNDS:-5}
    common="--no-prefill --no-decode --no-concurrency --no-positions --spec-prompts ${SPEC_PROMPTS:-8} --spec-rounds $rounds --spec-gen 256"
    has() { case " ${SPEC_PARTS:-code fortunes sessions side} " in *" $1 "*) return 0 ;; esac; return 1; }
    if has code; then
      DAEMON_ARGS="--draft-model $draft" run "spec-code-t$t" "$target" "$t" $common \
        --spec-text "$shared/data/python-stdlib.txt" --spec-modes off,draft,lookup
    fi
    if has fortunes; then
      DAEMON_ARGS="--draft-model $draft" run "spec-fortunes-t$t" "$target" "$t" $common \
        --spec-text "$shared/data/fortunes-en.txt" --spec-modes off,lookup
    fi
    if has sessions; then
      DAEMON_ARGS="--draft-model $draft" run "spec-sessions-t$t" "$target" "$t" $common \
        --spec-text "$shared/data/python-stdlib.txt" --spec-modes off,draft \
        --spec-prompts "${SPEC_SESSIONS:-16}" --spec-sessions "${SPEC_SESSIONS:-16}" --spec-prompt-bytes 600
    fi
    if has side && [ -n "${LLAMA_SPECULATIVE:-}${LLAMA_SERVER:-}" ]; then
      # the same prompts as sinkd-bench cuts them, one file each
      n=${SPEC_PROMPTS:-8}
      awk -v n="$n" -v bytes=1500 -v out="$out/prompt" 'BEGIN { RS = "^$" } {
        len = length($0)
        for (i = 0; i < n; i++) {
          at = int(len / n) * i; while (at > 0 && at < len && substr($0, at, 1) != "\n") at++
          end = at + bytes < len ? at + bytes : len; while (end < len && substr($0, end, 1) != "\n") end++
          printf "%s", substr($0, at + 1, end - at) > (out "-" i ".txt") } }' "$shared/data/python-stdlib.txt"
      ports=""
      if [ -n "${LLAMA_SERVER:-}" ]; then
        # one server per draft length, idle while the others run
        port=${SPEC_LLAMA_PORT:-18730}
        for k in ${SPEC_LLAMA_DRAFT:-3 8}; do
          "$LLAMA_SERVER" -m "$target" -md "$draft" -t "$t" -td "$t" -c 2048 --spec-draft-n-max "$k" \
            --host 127.0.0.1 --port "$port" >"$out/llama-server-d$k.log" 2>&1 &
          ports="$ports $k:$port:$!"
          i=0
          until curl -sf "http://127.0.0.1:$port/health" >/dev/null || [ $i -gt 300 ]; do
            sleep 0.1; i=$((i + 1)); done
          port=$((port + 1))
        done
      fi
      printf '%-5s %-16s %10s\n' round engine 'tok/s'
      r=1
      while [ $r -le "$rounds" ]; do
        for who in $( [ $((r % 2)) -eq 1 ] && echo "llama sinkd" || echo "sinkd llama"); do
          if [ "$who" = llama ]; then
            for k in ${SPEC_LLAMA_DRAFT:-3 8}; do
              [ -n "${LLAMA_SPECULATIVE:-}" ] || break
              i=0 sum_t=0 sum_n=0
              while [ $i -lt "$n" ]; do
                # "decoded N tokens in S seconds" (a run that prints none counts nothing)
                line=$("$LLAMA_SPECULATIVE" -m "$target" -md "$draft" -f "$out/prompt-$i.txt" -n 256 \
                  --temp 0 -t "$t" -td "$t" -c 2048 --spec-draft-n-max "$k" 2>&1 | grep 'decoded ' || true)
                if [ -n "$line" ]; then
                  sum_n=$(echo "$line" | awk -v s="$sum_n" '{ print s + $(NF - 7) }')
                  sum_t=$(echo "$line" | awk -v s="$sum_t" '{ print s + $(NF - 4) }')
                fi
                i=$((i + 1))
              done
              printf '%-5s %-16s %10.1f\n' $r "speculative-d$k" "$(awk -v a="$sum_n" -v b="$sum_t" 'BEGIN { print (b > 0 ? a / b : 0) }')"
            done
            for kp in $ports; do
              k=${kp%%:*} port=${kp#*:} port=${port%%:*}
              i=0 sum_t=0 sum_n=0
              while [ $i -lt "$n" ]; do
                # greedy, 256 tokens past any end of text, the prompt evaluated anew
                tm=$(jq -Rs '{prompt: ., n_predict: 256, temperature: 0, ignore_eos: true,
                              cache_prompt: false}' "$out/prompt-$i.txt" |
                  curl -sf "http://127.0.0.1:$port/completion" -H 'Content-Type: application/json' -d @- |
                  jq -r '"\(.timings.predicted_n) \(.timings.predicted_ms)"')
                sum_n=$(echo "$tm" | awk -v s="$sum_n" '{ print s + $1 }')
                sum_t=$(echo "$tm" | awk -v s="$sum_t" '{ print s + $2 / 1000 }')
                i=$((i + 1))
              done
              printf '%-5s %-16s %10.1f\n' $r "server-d$k" "$(awk -v a="$sum_n" -v b="$sum_t" 'BEGIN { print (b > 0 ? a / b : 0) }')"
            done
          else
            json=$(DAEMON_ARGS="--draft-model $draft" run "spec-side-r$r" "$target" "$t" \
              --no-prefill --no-decode --no-concurrency --no-positions --spec-prompts "$n" \
              --spec-rounds 1 --spec-gen 256 --spec-text "$shared/data/python-stdlib.txt" \
              --spec-modes draft)
            printf '%-5s %-16s %10.1f\n' $r sinkd \
              "$(echo "$json" | sed -n 's/.*"mode": "draft", "tokens_per_s": \([0-9.]*\).*/\1/p')"
          fi
        done
        r=$((r + 1))
      done
      for kp in $ports; do
        pid=${kp##*:}
        kill "$pid"
        wait "$pid" || true
      done
    fi
    ;;
  *)
    echo "unknown part $part (decode, aggregate, positions, sidebyside, single, ratio, server," \
      "mixed, spec)" >&2
    exit 2
    ;;
  esac
done
