# bash completion for sinkctl(1): commands, the options of each command,
# policy names, and session ids (from `sinkctl list` on the same socket).

_sinkctl_sessions() {
  # $sock is the --socket of the command line being completed, if any.
  "${COMP_WORDS[0]}" ${sock:+--socket "$sock"} list 2>/dev/null |
    awk 'NR > 1 && $1 ~ /^[0-9]+$/ { print $1 }'
}

_sinkctl() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
  local commands="generate chat tokenize detokenize open close list stats ping hello resume fork save load eval"
  local global="--socket --timeout --wait --json --verbose --raw --help --version"
  local with_value="-s|--socket|-n|--max-tokens|-t|--temperature|--top-k|--top-p|--seed|--stop|--session|--policy|--sinks|--window|--capacity|--heavy|--recent|--rope-scale|--sparsity|--pin|--pin-file|--idle|--system|--timeout|--speculation|--draft-tokens"
  local cmd="" sock="" i word
  for ((i = 1; i < COMP_CWORD; i++)); do
    word=${COMP_WORDS[i]}
    case $word in
      -s|--socket) sock=${COMP_WORDS[i+1]}; ((i++)) ;;
      --socket=*) sock=${word#--socket=} ;;
      -*=*) ;;
      -*) [[ $word == @($with_value) ]] && ((i++)) ;;
      *) [[ -z $cmd ]] && cmd=$word ;;
    esac
  done

  case $prev in
    -s|--socket) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --policy) COMPREPLY=($(compgen -W "streaming window h2o sink_h2o dense" -- "$cur")); return ;;
    --speculation) COMPREPLY=($(compgen -W "off draft lookup" -- "$cur")); return ;;
    --pin-file) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --session) COMPREPLY=($(compgen -W "$(_sinkctl_sessions)" -- "$cur")); return ;;
    -n|--max-tokens|-t|--temperature|--top-k|--top-p|--seed|--stop|--sinks|--window|--capacity|--heavy|--recent|--rope-scale|--sparsity|--pin|--timeout|--draft-tokens)
      COMPREPLY=(); return ;;
  esac

  local sampling="--max-tokens --temperature --top-k --top-p --seed --stop --ignore-eos --session"
  local spec="--speculation --draft-tokens --draft-fixed"
  local open="--policy --sinks --window --capacity --heavy --recent --rope-scale --sparsity --pin --pin-file $spec"
  local opts=""
  case $cmd in
    generate) opts="$sampling $open --no-echo --progress --no-progress --special" ;;
    chat) opts="$sampling $open --keep --system --progress --no-progress" ;;
    tokenize) opts="--no-bos --special" ;;
    eval)
      opts="--run --budget --tokens --span --chunk --recompute-stride --csv --plot --progress --no-progress"
      if [[ $cur != -* ]]; then
        compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur"))
        return
      fi ;;
    open) opts="$open" ;;
    stats)
      opts="--tokens"
      if [[ $cur != -* ]]; then
        COMPREPLY=($(compgen -W "$(_sinkctl_sessions)" -- "$cur"))
        return
      fi ;;
    close)
      opts="--idle --all"
      if [[ $cur != -* && $prev != --idle ]]; then
        COMPREPLY=($(compgen -W "$(_sinkctl_sessions)" -- "$cur"))
        return
      fi ;;
    resume|fork)
      if [[ $cur != -* ]]; then
        COMPREPLY=($(compgen -W "$(_sinkctl_sessions)" -- "$cur"))
        return
      fi ;;
    save)
      if [[ $cur != -* ]]; then
        if [[ $prev == save ]]; then
          COMPREPLY=($(compgen -W "$(_sinkctl_sessions)" -- "$cur"))
        else
          compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur"))
        fi
        return
      fi ;;
    load)
      if [[ $cur != -* ]]; then
        compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur"))
        return
      fi ;;
    "")
      if [[ $cur != -* ]]; then
        COMPREPLY=($(compgen -W "$commands" -- "$cur"))
        return
      fi ;;
  esac
  COMPREPLY=($(compgen -W "$global $opts" -- "$cur"))
}

complete -F _sinkctl sinkctl
