#!/usr/bin/env bash
# Issue 42's alternated rounds (docs/benchmarks/socket-tail.md): for each round and each c, the
# default (the walk, widened under a backlog by its TTFT horizon), the fixed 64-row walk (--ttft-target-ms off) and vLLM's CPU build, one fresh server each, in turn, so
# drift in the host lands on every arm alike. Run on a quiet host: nothing else may load it.
#   OUT=dir ROUNDS=2 scripts/experiments/socket_tail_rounds.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-$(mktemp -d)}
arm=scripts/experiments/socket_tail_arm.sh
# The arms' order turns each round (default, walk, vLLM; walk, vLLM, default; vLLM, default, walk):
# in a fixed order the default's arm always followed a vLLM arm, whose two processes and ~9 GB had
# just been stopped, and its steps ran ~10 % slower than the walk's on the same rounds (AMD EPYC
# Zen 4, docs/benchmarks/socket-tail.md).
arms=(default walk vllm)
run_arm() {  # which round c
  case $1 in
    default) bash $arm "r$2-default-c$3" "$3" ;;
    walk) bash $arm "r$2-walk-c$3" "$3" --ttft-target-ms off ;;
    vllm) PEER=vllm PORT=8100 bash $arm "r$2-vllm-c$3" "$3" ;;
  esac
}
for round in $(seq 1 "${ROUNDS:-2}"); do
  for c in 4 8 16; do
    for j in 0 1 2; do
      run_arm "${arms[$(((round - 1 + j) % 3))]}" "$round" "$c"
    done
  done
done
