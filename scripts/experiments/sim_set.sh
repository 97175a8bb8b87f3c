#!/usr/bin/env bash
# The fixed-seed simulator set issue 43 measures the scheduler by, before and after a change:
# default, walk off, side lane, door, tight KV; each one JSON (same seed, same bytes) in DIR.
#   scripts/experiments/sim_set.sh DIR        then: diff -r BEFORE AFTER
set -euo pipefail
out=${1:?usage: sim_set.sh DIR}; mkdir -p "$out"
cd "$(dirname "$0")/../.."
common=(--cost zen5-measured --num-prompts 200 --random-input-len 512 --random-output-len 64
  --random-range-ratio 0.5 --request-rate 2 --burstiness 0.5 --seed 7 --metric-percentiles 50,99)
run() { name=$1; shift; .venv/bin/tailgate sim "${common[@]}" "$@" --save-result "$out/$name.json" > "$out/$name.txt"; }
run default
run walk-off --itl-target-ms off --mix-chunk-tokens off
run walk-64 --itl-target-ms off --mix-chunk-tokens 64
run lane --itl-target-ms off --mix-chunk-tokens off --async-prefill cpu:1
run door --admit-coalesce-ms auto
run door-walk-off --admit-coalesce-ms auto --itl-target-ms off --mix-chunk-tokens off
run tight-kv --max-context 1024 --kv-cache-mb 200
run tight-kv-walk-off --max-context 1024 --kv-cache-mb 200 --itl-target-ms off --mix-chunk-tokens off
ls "$out"
