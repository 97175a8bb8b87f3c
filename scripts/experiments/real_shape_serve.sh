#!/usr/bin/env bash
# Does a checkpoint from real_shape.py serve (issue 45)? `tailgate serve --model MODEL` from its
# start to the first /health 200, then one /v1/completions request of 8 tokens (greedy,
# ignore_eos), the server's RSS, then SIGTERM to its process group.
#   scripts/experiments/real_shape_serve.sh MODEL [PORT]     (MODEL: OUT_DIR/hf or a .gguf; PORT 8765)
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/experiments/serve_ready.sh
. scripts/experiments/vllm_client.sh
model=$1; port=${2:-8765}
log=$(mktemp --suffix=.serve.log)
t0=$(date +%s.%N)
start_server "$log" "$port" --model "$model" || exit 1
pid=$SERVER_PID
t1=$(date +%s.%N)
name=$(served_model "http://localhost:$port")
body="{\"model\": \"$name\", \"prompt\": \"The capital of France is\", \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true}"
t2=$(date +%s.%N)
reply=$(curl -s "localhost:$port/v1/completions" -H 'content-type: application/json' -d "$body")
t3=$(date +%s.%N)
rss=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$pid/status")
hwm=$(awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$pid/status")
stop_server
echo "$model: ready in $(echo "$t1 - $t0" | bc) s; 8 tokens in $(echo "$t3 - $t2" | bc) s; RSS $rss MiB (peak $hwm MiB)"
echo "$reply" | .venv/bin/python -c '
import json, sys
r = json.load(sys.stdin)
print("  completion_tokens", r["usage"]["completion_tokens"], "text", repr(r["choices"][0]["text"]))
sys.exit(r["usage"]["completion_tokens"] != 8)'
rc=$?
grep -m3 -E "kernel|weights resident|KV" "$log" | sed 's/^/  log: /'
echo "  server log: $log"
exit $rc
