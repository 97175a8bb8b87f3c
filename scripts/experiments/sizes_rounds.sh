#!/usr/bin/env bash
# Issue 45's side by side at a real size (docs/benchmarks/sizes.md): tailgate and llama.cpp's server
# on the same GGUF, vLLM's CPU build on the HF directory it was made from (scripts/experiments/
# real_shape.py writes both), W-std (random 256 in / 64 out, closed loop, 4 x c prompts, ignore_eos)
# with vLLM's client, each c in turn, one fresh server each, round by round, even rounds in the
# reverse arm order. llama.cpp serves 8 slots of 4096 tokens on 2 threads (its peer script's
# defaults but SLOTS). TAIL_MS=T adds a tailgate arm `tail` with a tail budget (--itl-target-ms T;
# the TTFT horizon is off under it) beside the default (`tailgate`). Quiet host only.
# FIRST_ROUND=N starts at round N (its name and arm order): a later round run on its own.
#   OUT=dir ROUNDS=1 CS="1 4 8" [TAIL_MS=T] scripts/experiments/sizes_rounds.sh HF_DIR GGUF
set -uo pipefail
hf=$(realpath "$1"); gguf=$(realpath "$2")
cd "$(dirname "$0")/../.."
export OUT=${OUT:-$(mktemp -d)} TOKENIZER=$hf
arm=scripts/experiments/socket_tail_arm.sh
arms="${TAIL_MS:+tail }tailgate llama"; [ -n "${NO_VLLM:-}" ] || arms="$arms vllm"
if [ "${FIRST_ROUND:-1}" -gt "${ROUNDS:-1}" ]; then
  echo "FIRST_ROUND=${FIRST_ROUND} is past ROUNDS=${ROUNDS:-1} (the last round's number): nothing to run" >&2
  exit 2
fi
for round in $(seq "${FIRST_ROUND:-1}" "${ROUNDS:-1}"); do
  order=$arms; [ $((round % 2)) = 0 ] && order=$(printf '%s\n' $arms | tac)
  for c in ${CS:-1 4 8}; do
    for a in $order; do
      n=r$round-$a-c$c
      case $a in
        tail) bash $arm "$n" "$c" --model "$gguf" --itl-target-ms "$TAIL_MS" ;;
        tailgate) bash $arm "$n" "$c" --model "$gguf" ;;
        llama) SLOTS=${LLAMA_SLOTS:-8} PEER=llama PORT=8300 bash $arm "$n" "$c" -m "$gguf" ;;
        vllm) PEER_MODEL=$hf PEER=vllm PORT=8100 bash $arm "$n" "$c" ;;
      esac
    done
  done
done
