#!/usr/bin/env bash
# Issue 42's alternated rounds (docs/benchmarks/socket-tail.md): for each round and each c, the
# default (the walk, widened under a backlog by its TTFT horizon), the fixed 64-row walk (--ttft-target-ms off) and vLLM's CPU build, one fresh server each, in turn, so
# drift in the host lands on every arm alike. Run on a quiet host: nothing else may load it.
#   OUT=dir ROUNDS=2 scripts/experiments/socket_tail_rounds.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-$(mktemp -d)}
arm=scripts/experiments/socket_tail_arm.sh
for round in $(seq 1 "${ROUNDS:-2}"); do
  for c in 4 8 16; do
    bash $arm "r$round-default-c$c" "$c"
    bash $arm "r$round-walk-c$c" "$c" --ttft-target-ms off
    PEER=vllm PORT=8100 bash $arm "r$round-vllm-c$c" "$c"
  done
done
