# bash completion for sinkd(8): options, files, and the values of the
# options that take a word (policy, log level, KV type, chat template, auto).

_sinkd() {
  local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}
  case $prev in
    -c|--config|-m|--model|-s|--socket|--http-socket|--http-key-file|--sparsity-file|--calibrate|\
    --draft-model)
      compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")); return ;;
    --state-dir)
      compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -d -- "$cur")); return ;;
    --policy) COMPREPLY=($(compgen -W "streaming window h2o sink_h2o dense" -- "$cur")); return ;;
    --kv-type) COMPREPLY=($(compgen -W "f32 f16" -- "$cur")); return ;;
    --chat-template) COMPREPLY=($(compgen -W "auto none chatml llama2 llama2-sys llama2-sys-bos
      llama2-sys-strip mistral-v1 mistral-v3 mistral-v3-tekken mistral-v7 mistral-v7-tekken phi3
      phi4 falcon3 zephyr monarch gemma orion openchat vicuna vicuna-orca deepseek deepseek2
      deepseek3 command-r llama3 chatglm3 chatglm4 glmedge minicpm exaone3 exaone4 rwkv-world
      granite granite-4.0 granite-4.1 gigachat megrez yandex bailing bailing-think bailing2 llama4
      smolvlm seed_oss" -- "$cur")); return ;;
    --log-level) COMPREPLY=($(compgen -W "err warning notice info debug" -- "$cur")); return ;;
    --speculation) COMPREPLY=($(compgen -W "auto off draft lookup" -- "$cur")); return ;;
    -t|--threads|--window|--capacity|--max-capacity|--max-memory|--max-user-memory|\
    --max-input-memory|--max-user-input-memory)
      COMPREPLY=($(compgen -W "auto" -- "$cur")); return ;;
    --http-uid) COMPREPLY=($(compgen -W "auto" -- "$cur")); return ;;
    --http-listen-public) COMPREPLY=($(compgen -W "yes no" -- "$cur")); return ;;
    --sinks|--max-sessions|--max-clients|--max-frame|--batch|--step-tokens|--idle-ttl|\
    --max-user-sessions|--max-user-clients|--frame-timeout|--http-listen|--draft-tokens|\
    --lookup-history)
      COMPREPLY=(); return ;;
  esac
  COMPREPLY=($(compgen -W "--config --check-config --model --socket --state-dir --threads
    --policy --sinks --window --capacity --max-capacity --max-sessions --max-clients
    --max-memory --max-user-sessions --max-user-memory --max-user-clients --max-frame
    --max-input-memory --max-user-input-memory
    --frame-timeout --idle-ttl --batch --step-tokens
    --kv-type --chat-template --http-socket --http-listen --http-key-file --http-uid
    --http-listen-public --sparsity-file --calibrate --draft-model --speculation
    --draft-tokens --lookup-history --log-level --verbose --help --version" -- "$cur"))
}

complete -F _sinkd sinkd
