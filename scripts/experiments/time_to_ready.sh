#!/usr/bin/env bash
# Time to ready as a new user meets it (issue 44 item 8): `tailgate serve` from its start to the
# first /health 200, cold (an empty TAILGATE_CACHE_DIR: the GGUF's tokenizer is converted, the C
# kernels built, the probe measured) and then twice warm, on a quiet host.
#   scripts/experiments/time_to_ready.sh [MODEL]      (default gemma3-270m; PORT=8020)
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/experiments/serve_ready.sh
model=${1:-gemma3-270m}; port=${PORT:-8020}
dir=$(mktemp -d); logs=$(mktemp -d)
for arm in cold warm1 warm2; do
  t0=$(date +%s.%N)
  TAILGATE_CACHE_DIR=$dir start_server "$logs/$arm.log" "$port" --model "$model" || exit 1
  t1=$(date +%s.%N)
  echo "$model $arm ready in $(echo "$t1 - $t0" | bc) s"
  stop_server
done
rm -rf "$dir"; echo "logs: $logs"
