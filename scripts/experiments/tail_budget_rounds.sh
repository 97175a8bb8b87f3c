#!/usr/bin/env bash
# Issue 45 item 3's closed-loop tail with a tail budget, side by side (docs/benchmarks/sizes.md,
# "a tail budget"): per round and concurrency, four arms, each a fresh server under vLLM's own
# `bench serve` (socket_tail_arm.sh, W-std: random 256 in / 64 out, 4 x c prompts):
#   tail     tailgate with --itl-target-ms T (the TTFT horizon is off under an absolute target)
#   default  tailgate as shipped
#   vllm     vLLM's CPU build on the HF directory (../shared/peers/vllm-cpu)
#   llama    llama.cpp's server on the GGUF (8 slots, 2 threads; ../shared/peers/llama-cpp)
# Round 2 runs the arms in reverse order. Table: socket_tail_table.py OUT/all.log.
#   OUT=dir ROUNDS=2 CS="4 8" scripts/experiments/tail_budget_rounds.sh HF_DIR GGUF T
set -u
hf=$1; gguf=$2; target=$3
cd "$(dirname "$0")/../.."
out=${OUT:-$(mktemp -d)}; mkdir -p "$out"; log=$out/all.log
arm=scripts/experiments/socket_tail_arm.sh
for round in $(seq 1 "${ROUNDS:-2}"); do
  arms="tail default vllm llama"; [ $((round % 2)) = 0 ] && arms="llama vllm default tail"
  for c in ${CS:-4 8}; do
    for a in $arms; do
      n=r$round-$a-c$c
      echo "== $(date +%T) $n" >> "$log"
      case $a in
        tail) OUT=$out TOKENIZER=$hf bash $arm "$n" "$c" --model "$gguf" --itl-target-ms "$target" >> "$log" 2>&1 ;;
        default) OUT=$out TOKENIZER=$hf bash $arm "$n" "$c" --model "$gguf" >> "$log" 2>&1 ;;
        vllm) OUT=$out TOKENIZER=$hf PEER=vllm PORT=8100 PEER_MODEL=$hf bash $arm "$n" "$c" >> "$log" 2>&1 ;;
        llama) OUT=$out TOKENIZER=$hf PEER=llama PORT=8300 SLOTS=8 bash $arm "$n" "$c" -m "$gguf" >> "$log" 2>&1 ;;
      esac
    done
  done
done
echo "table: .venv/bin/python scripts/experiments/socket_tail_table.py $log"
