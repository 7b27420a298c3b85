#!/usr/bin/env bash
# The bash completions of sinkctl and sinkd: commands, per-command options,
# values, and session ids from `sinkctl list` (a stub stands in for sinkctl,
# so no daemon is needed).
#   test-completion.sh SOURCE_DIR
set -u
src=$1
fails=0
source "$src/client/sinkctl.bash"
source "$src/daemon/sinkd.bash"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/sinkctl" <<'STUB'
#!/bin/sh
# A sinkctl that only lists, and says which socket it was asked about.
case "$*" in
  "--socket /tmp/other.sock list") printf 'SESSION    POLICY\n99         dense\n' ;;
  list) printf 'SESSION    POLICY         CAPACITY\n7          streaming      1024\n12         dense          64\n' ;;
  *) exit 3 ;;
esac
STUB
chmod +x "$tmp/sinkctl"

# expect FUNCTION "WORDS..." "EXPECTED REPLIES": completes the last word.
expect() {
  local fn=$1 line=$2 want=$3
  read -ra COMP_WORDS <<< "$line"
  [[ $line == *" " ]] && COMP_WORDS+=("")
  COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
  COMPREPLY=()
  "$fn"
  local got="${COMPREPLY[*]}"
  if [[ $got != "$want" ]]; then
    echo "FAIL: '$line' -> '$got', expected '$want'" >&2
    fails=$((fails + 1))
  else
    echo "ok: '$line' -> '$got'"
  fi
}

S="$tmp/sinkctl"
expect _sinkctl "$S " "generate chat tokenize detokenize open close list stats ping hello resume fork save load eval"
expect _sinkctl "$S c" "chat close"
expect _sinkctl "$S resume " "7 12"
expect _sinkctl "$S fork 1" "12"
expect _sinkctl "$S save " "7 12"
expect _sinkctl "$S stats 7 --to" "--tokens"
expect _sinkctl "$S --json st" "stats"
expect _sinkctl "$S generate --po" "--policy"
expect _sinkctl "$S generate --policy " "streaming window h2o sink_h2o dense"
expect _sinkctl "$S open --policy s" "streaming sink_h2o"
expect _sinkctl "$S open --re" "--recent"
expect _sinkctl "$S eval --re" "--recompute-stride"
expect _sinkctl "$S generate --policy d" "dense"
expect _sinkctl "$S chat --ke" "--keep"
expect _sinkctl "$S generate --ke" ""
expect _sinkctl "$S tokenize --no" "--no-bos"
expect _sinkctl "$S open --c" "--capacity"
expect _sinkctl "$S close " "7 12"
expect _sinkctl "$S stats 1" "12"
expect _sinkctl "$S generate -n 5 --session " "7 12"
expect _sinkctl "$S --socket /tmp/other.sock close " "99"
expect _sinkctl "$S generate --max-tokens " ""
expect _sinkctl "$S -s /tmp/x.sock li" "list"
expect _sinkd "sinkd --check" "--check-config"
expect _sinkd "sinkd --log-level " "err warning notice info debug"
expect _sinkd "sinkd --threads " "auto"
expect _sinkd "sinkd --policy s" "streaming sink_h2o"
expect _sinkd "sinkd --kv-type " "f32 f16"
expect _sinkd "sinkd --chat-template chatm" "chatml"
expect _sinkd "sinkd --max-s" "--max-sessions"
expect _sinkd "sinkd --idle" "--idle-ttl"

# Nothing sinkctl or sinkd offers is missing from the completions.
if [[ -n ${SK_SINKCTL:-} ]]; then
  help=$("$SK_SINKCTL" --help)
  cmds=$(sed -n '/^Commands:/,/^$/p' <<< "$help" | awk '$1 ~ /^[a-z]+$/ { print $1 }')
  for c in $cmds; do
    grep -qw -- "$c" "$src/client/sinkctl.bash" || { echo "FAIL: command $c not completed" >&2; fails=$((fails + 1)); }
  done
  for o in $(grep -oE -- '--[a-z][a-z-]+' <<< "$help" | sort -u); do
    grep -q -- "$o\b" "$src/client/sinkctl.bash" || { echo "FAIL: sinkctl option $o not completed" >&2; fails=$((fails + 1)); }
  done
fi
# The commands named after protocol ops (OP(NAME) rows of sinkctl's table)
# are completed under the op's wire name from sinkd/protocol.h's SK_OP_LIST.
completed=$(sed -n 's/^ *local commands="\(.*\)"$/\1/p' "$src/client/sinkctl.bash")
n_ops=0
for op in $(sed -n 's/^ *{OP(\([A-Z_]*\)),.*/\1/p' "$src/client/sinkctl.c"); do
  wire=$(sed -n "s/^ *X($op, \"\([a-z_]*\)\").*/\1/p" "$src/include/sinkd/protocol.h")
  n_ops=$((n_ops + 1))
  if [[ -z $wire ]]; then
    echo "FAIL: sinkctl's OP($op) is not in SK_OP_LIST" >&2; fails=$((fails + 1))
  elif [[ " $completed " != *" $wire "* ]]; then
    echo "FAIL: op $wire (sinkctl's OP($op)) not completed" >&2; fails=$((fails + 1))
  fi
done
[[ $n_ops -eq 12 ]] || { echo "FAIL: $n_ops ops in sinkctl's command table, expected 12" >&2; fails=$((fails + 1)); }
if [[ -n ${SK_SINKD:-} ]]; then
  for o in $("$SK_SINKD" --help | grep -oE -- '--[a-z][a-z-]+' | sort -u); do
    grep -q -- "$o\b" "$src/daemon/sinkd.bash" || { echo "FAIL: sinkd option $o not completed" >&2; fails=$((fails + 1)); }
  done
fi

# Installed under the names bash-completion looks up.
[[ $(complete -p sinkctl) == "complete -F _sinkctl sinkctl" ]] || { echo "FAIL: complete -p sinkctl" >&2; fails=$((fails + 1)); }
[[ $(complete -p sinkd) == "complete -F _sinkd sinkd" ]] || { echo "FAIL: complete -p sinkd" >&2; fails=$((fails + 1)); }
echo "$fails failures"
[[ $fails -eq 0 ]]
