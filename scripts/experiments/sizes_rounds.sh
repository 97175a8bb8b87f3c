#!/usr/bin/env bash
# Issue 45's side by side at a real size (docs/benchmarks/sizes.md): tailgate and llama.cpp's server
# on the same GGUF, vLLM's CPU build on the HF directory it was made from (scripts/experiments/
# real_shape.py writes both), W-std (random 256 in / 64 out, closed loop, 4 x c prompts, ignore_eos)
# with vLLM's client, each c in turn, one fresh server each, alternated round by round. llama.cpp
# serves 8 slots of 4096 tokens on 2 threads (its peer script's defaults but SLOTS). Quiet host only.
#   OUT=dir ROUNDS=1 CS="1 4 8" scripts/experiments/sizes_rounds.sh HF_DIR GGUF
set -uo pipefail
hf=$(realpath "$1"); gguf=$(realpath "$2")
cd "$(dirname "$0")/../.."
export OUT=${OUT:-$(mktemp -d)} TOKENIZER=$hf
arm=scripts/experiments/socket_tail_arm.sh
for round in $(seq 1 "${ROUNDS:-1}"); do
  for c in ${CS:-1 4 8}; do
    bash $arm "r$round-tailgate-c$c" "$c" --model "$gguf"
    SLOTS=${LLAMA_SLOTS:-8} PEER=llama PORT=8300 bash $arm "r$round-llama-c$c" "$c" -m "$gguf"
    [ -n "${NO_VLLM:-}" ] || PEER_MODEL=$hf PEER=vllm PORT=8100 bash $arm "r$round-vllm-c$c" "$c"
  done
done
