#!/usr/bin/env bash
# One arm of issue 42's socket-tail round (docs/benchmarks/socket-tail.md): start `tailgate serve`
# with the given flags, attach its dashboard feed, run vLLM's own bench client (W-std: random 256 in
# / 64 out, closed loop, 4 x C prompts, ignore_eos, temperature 0), print the client's figures and
# the server's own view (engine ITL, socket ITL, delivery delay), stop the server by its group.
#   scripts/experiments/socket_tail_arm.sh NAME C [serve flags...]     (OUT=dir for the logs)
# PEER=vllm serves vLLM's CPU build instead (../shared/peers/vllm-cpu serve; no server view),
# PEER=llama llama.cpp's server (../shared/peers/llama-cpp serve; the flags go to llama-server).
# TOKENIZER=dir is the HF directory the client counts tokens with (default: vLLM peer's model).
# WORKLOAD="bench flags" replaces the W-std shape (lengths, prompt count, concurrency, arrivals);
# socket_tail_open.sh uses it for the open-loop and long-prompt shapes.
# Beside the figures: seconds from launch to the first /health 200 (ready), and the server's peak
# RSS: VmHWM summed over its process group (vLLM runs an API server and an engine core; their peaks
# need not coincide, so the sum is an upper bound there, exact for one process); and the host's
# memory read bandwidth just before the server started (scripts/experiments/host_bandwidth.py: a
# decode step reads every weight, and on these VMs that figure moved 2x within minutes).
# TRACE=1 keeps the server's step trace (its /dashboard/feed from start, as SSE) in NAME.feed.
set -uo pipefail
name=$1; c=$2; shift 2
cd "$(dirname "$0")/../.."
. scripts/experiments/vllm_client.sh
out=${OUT:-$(mktemp -d)}; port=${PORT:-8000}; base=http://127.0.0.1:$port
bw=$(.venv/bin/python scripts/experiments/host_bandwidth.py 3)
if [ "${PEER:-}" = vllm ]; then
  setsid ../shared/peers/vllm-cpu serve "$port" "$@" > "$out/$name.serve.log" 2>&1 &
elif [ "${PEER:-}" = llama ]; then
  setsid ../shared/peers/llama-cpp serve "$port" "$@" > "$out/$name.serve.log" 2>&1 &
else
  setsid .venv/bin/tailgate serve --port "$port" "$@" > "$out/$name.serve.log" 2>&1 &
fi
pid=$!; t0=$(date +%s.%N)
wait_health "$base"
ready=$(echo "$(date +%s.%N) - $t0" | bc)
view() {  # attach, or tick SECONDS: the server's figures over the last SECONDS (the client's run)
  [ -n "${PEER:-}" ] && return
  .venv/bin/python -c "
import asyncio, sys
from tailgate.bench.serve import engine_view
tick = sys.argv[1] != 'attach'
v = asyncio.run(engine_view('$base', hello_only=not tick, window_s=float(sys.argv[2]) if tick else None))
if tick and v:
    print(' '.join(f\"{k}: p50 {1000*v[k]['p50_s']:.1f} p99 {1000*v[k]['p99_s']:.1f} n={v[k]['n']}\" for k in ('itl', 'socket_itl', 'delivery')), f\"(last {v['itl']['window_s']:.0f} s)\")
" "$@"
}
view attach
attached=$(date +%s.%N)
if [ -n "${TRACE:-}" ] && [ -z "${PEER:-}" ]; then
  setsid curl -sN "$base/dashboard/feed?since=-1" > "$out/$name.feed" 2>/dev/null &
  feed=$!
fi
vllm_client "$base" "${TOKENIZER:-$(../shared/peers/vllm-cpu model-dir)}" "$out/$name.bench.log" \
  ${WORKLOAD:---random-input-len 256 --random-output-len 64 --num-prompts $((4 * c)) --max-concurrency "$c"} \
  --seed "${SEED:-0}"
view tick "$(echo "$(date +%s.%N) - $attached + 1" | bc)" | sed "s/^/$name server-view /"
hwm=0
for p in $(pgrep -g "$pid"); do
  k=$(awk '/^VmHWM/ {print $2}' "/proc/$p/status" 2>/dev/null); hwm=$((hwm + ${k:-0}))
done
printf '%s ready %.1f s, peak RSS %d MiB (VmHWM over the process group)\n' "$name" "$ready" $((hwm / 1024))
echo "$name $bw"
[ -n "${feed:-}" ] && kill -TERM -- "-$feed" 2>/dev/null
kill -TERM -- "-$pid"; wait "$pid" 2>/dev/null
grep -E "Output token throughput|Median TTFT|P99 TTFT|Median ITL|P99 ITL" "$out/$name.bench.log" | sed "s/^/$name /"
