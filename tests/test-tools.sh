#!/bin/sh
# The development tools' command lines: help on stdout with status 0,
# usage errors with a message naming the problem and status 2, a daemon
# that is not there with status 3 (sinkd-bench), as their --help says.
#   test-tools.sh MKMODEL BENCH KBENCH
mk=$1 bench=$2 kbench=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0

# expect STATUS STREAM TEXT CMD...: CMD exits STATUS and STREAM (out or
# err) contains TEXT.
expect() {
  want=$1 stream=$2 text=$3
  shift 3
  "$@" >"$dir/out" 2>"$dir/err"
  got=$?
  if [ "$got" != "$want" ]; then
    echo "FAIL: $*: status $got, expected $want"; cat "$dir/err"; fail=1; return
  fi
  if ! grep -qF -- "$text" "$dir/$stream"; then
    echo "FAIL: $*: std$stream lacks '$text':"; cat "$dir/$stream"; fail=1; return
  fi
  echo "ok: $* -> $got"
}

expect 0 out "Usage:" "$mk" --help
expect 2 err "shape '7B': expected 260K, 15M, 110M or 1B" "$mk" --shape 7B --type f32 -o "$dir/m.gguf"
expect 2 err "no output file: give -o FILE" "$mk" --shape 15M --type f32
expect 2 err "arch 'gemma': expected llama, llama3, qwen2 or qwen3" "$mk" --arch gemma -o "$dir/m.gguf"
expect 2 err "or give an even --head-dim" "$mk" --arch qwen3 --head-dim 33 -o "$dir/m.gguf"
[ ! -e "$dir/m.gguf" ] || { echo "FAIL: a file was written"; fail=1; }
# A dimension overrides the shape whether it comes before or after it.
expect 2 err "dim 100, heads 8, kv heads 4: dim must split" "$mk" --dim 100 --shape 260K -o "$dir/m.gguf"
expect 0 err "wrote $dir/a.gguf" "$mk" --dim 128 --kv-heads 2 --shape 260K -o "$dir/a.gguf"
expect 0 err "wrote $dir/b.gguf" "$mk" --shape 260K --dim 128 --kv-heads 2 -o "$dir/b.gguf"
expect 0 err "wrote $dir/c.gguf" "$mk" --shape 260K -o "$dir/c.gguf"
cmp -s "$dir/a.gguf" "$dir/b.gguf" || { echo "FAIL: --dim before --shape was dropped"; fail=1; }
! cmp -s "$dir/a.gguf" "$dir/c.gguf" || { echo "FAIL: --dim was not applied"; fail=1; }
rm -f "$dir/a.gguf" "$dir/b.gguf" "$dir/c.gguf"

expect 0 out "Usage:" "$bench" --help
expect 2 err "sinkd-bench: --gen: 'abc' is not a number" "$bench" --gen abc
expect 2 err "--gen: '1' is not in [2, 1048576]" "$bench" --gen 1
expect 2 err "--reps: '2.5' is not a number" "$bench" --reps 2.5
expect 2 err "--concurrency: '0' is not a list of up to 16 numbers in [1, 4096]" "$bench" --concurrency 0
expect 2 err "--positions: '1e3,,1e5' is not a list" "$bench" --positions 1e3,,1e5
expect 2 err "Try 'sinkd-bench --help' for more information." "$bench" --sinks -1
expect 2 err "--mixed: 'many' is not a number" "$bench" --mixed many
expect 3 err "cannot connect to $dir/none.sock" "$bench" --socket "$dir/none.sock" --sinks 0

expect 0 out "usage: sinkd-kbench" "$kbench" --help
expect 2 err "sinkd-kbench: unknown option --bogus" "$kbench" --bogus
expect 2 err "sinkd-kbench: --membw needs a value" "$kbench" --membw
expect 2 err "sinkd-kbench: --samples: 'x' is not a number" "$kbench" --samples x
expect 2 err "sinkd-kbench: --samples: '0' is not in [1, 100000]" "$kbench" --samples 0
expect 2 err "sinkd-kbench: --rows: '1,0' is not a list of up to 8 numbers in [1, 4096]" "$kbench" --rows 1,0
expect 2 err "sinkd-kbench: unknown kernel variant 'fast'" "$kbench" --decode fast
expect 2 err "--decode takes one --rows number" "$kbench" --decode --rows 1,16 generic
exit $fail
