#!/usr/bin/env bash
# Issue 42 goal 4's other shapes, the default against the fixed 64-row walk and vLLM's CPU build, alternated round by round
# (docs/benchmarks/socket-tail.md): open loop, 60 requests of mixed lengths (input 128-384, output
# 32-96: random 256/64 with range ratio 0.5) arriving Poisson (burstiness 1) and gamma (0.5) at
# 1.5 req/s (~70 % of the default's closed-loop c8 rate here); long prompts, 768 in / 64 out, c12
# closed loop, 48 prompts. Run on a quiet host: nothing else may load it.
#   OUT=dir ROUNDS=2 scripts/experiments/socket_tail_open.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-$(mktemp -d)}
arm=scripts/experiments/socket_tail_arm.sh
mixed="--random-input-len 256 --random-output-len 64 --random-range-ratio 0.5 --num-prompts 60"
declare -A shapes=(
  [poisson]="$mixed --request-rate 1.5 --burstiness 1"
  [gamma]="$mixed --request-rate 1.5 --burstiness 0.5"
  [long]="--random-input-len 768 --random-output-len 64 --num-prompts 48 --max-concurrency 12"
)
for round in $(seq 1 "${ROUNDS:-2}"); do
  for shape in poisson gamma long; do
    WORKLOAD=${shapes[$shape]} bash $arm "r$round-default-$shape" 0
    WORKLOAD=${shapes[$shape]} bash $arm "r$round-walk-$shape" 0 --ttft-target-ms off
    WORKLOAD=${shapes[$shape]} PEER=vllm PORT=8100 bash $arm "r$round-vllm-$shape" 0
  done
done
