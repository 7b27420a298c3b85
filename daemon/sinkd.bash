# bash completion for sinkd(8): options, files, and the values of the
# options that take a word (policy, log level, KV type, auto).

_sinkd() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
  case $prev in
    -c|--config|-m|--model|-s|--socket)
      compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --state-dir)
      compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -d -- "$cur")); return ;;
    --policy) COMPREPLY=($(compgen -W "streaming window h2o sink_h2o dense" -- "$cur")); return ;;
    --kv-type) COMPREPLY=($(compgen -W "f32 f16" -- "$cur")); return ;;
    --log-level) COMPREPLY=($(compgen -W "err warning notice info debug" -- "$cur")); return ;;
    -t|--threads|--window|--capacity|--max-capacity|--max-memory|--max-user-memory|\
    --max-input-memory|--max-user-input-memory)
      COMPREPLY=($(compgen -W "auto" -- "$cur")); return ;;
    --sinks|--max-sessions|--max-clients|--max-frame|--batch|--idle-ttl|--max-user-sessions|\
    --max-user-clients|--frame-timeout)
      COMPREPLY=(); return ;;
  esac
  COMPREPLY=($(compgen -W "--config --check-config --model --socket --state-dir --threads
    --policy --sinks --window --capacity --max-capacity --max-sessions --max-clients
    --max-memory --max-user-sessions --max-user-memory --max-user-clients --max-frame
    --max-input-memory --max-user-input-memory
    --frame-timeout --idle-ttl --batch
    --kv-type --log-level --verbose --help --version" -- "$cur"))
}

complete -F _sinkd sinkd
