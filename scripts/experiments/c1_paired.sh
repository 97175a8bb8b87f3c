#!/usr/bin/env bash
# Single-stream decode, tailgate against llama.cpp's server on the same GGUF, in tight alternation
# (issue 45 item 3's c1 TPOT; docs/benchmarks/sizes.md). Both servers are loaded side by side and
# idle but for the one measured; vLLM's client runs c1 (random 256 in / 64 out, PROMPTS prompts,
# ignore_eos, temperature 0) against each in turn, PAIRS times, the first arm swapped every pair and
# both arms of a pair given the same prompts (--seed = the pair's number).
# Why pairs: a decode step reads every weight once, so c1 TPOT follows the host's memory bandwidth,
# and on the 2-core AMD EPYC Zen 5 (family 26) VMs that moved 2x within minutes (34.5 to 68.3 GiB/s
# between the pairs of one five-minute run, raw-sizes-qwen3-4b-c1-pairs-zen5.log). Arms run minutes apart
# compare the host's moods; the two runs of a pair are seconds apart (and each pair's line names the
# host's read bandwidth just before it: scripts/experiments/host_bandwidth.py).
# Both servers fit in RAM together: tailgate's KV cache is KV_MB (default 2048 MiB) and llama.cpp
# serves SLOTS (default 2) slots of 4096 tokens; neither changes how one stream decodes.
#   OUT=dir PAIRS=5 PROMPTS=2 scripts/experiments/c1_paired.sh HF_DIR GGUF    (quiet host only)
set -uo pipefail
hf=$(realpath "$1"); gguf=$(realpath "$2")
cd "$(dirname "$0")/../.."
. scripts/experiments/vllm_client.sh
out=${OUT:-$(mktemp -d)}
setsid .venv/bin/tailgate serve --port 8000 --model "$gguf" --kv-cache-mb "${KV_MB:-2048}" \
  > "$out/tailgate.serve.log" 2>&1 &
tg=$!
trap 'kill -TERM -- -$tg 2>/dev/null; wait' EXIT
base() { [ "$1" = tailgate ] && echo http://127.0.0.1:8000 || echo http://127.0.0.1:8300; }
# llama.cpp starts once tailgate is ready: tailgate times its step costs at start (the probe, cached
# per machine and model), and one shape timed while llama.cpp loaded beside it had been cached
# 1.25x slow (AMD EPYC family 25, Llama 3.2 3B: the fit every later start read was untrusted).
wait_health "$(base tailgate)"
SLOTS=${SLOTS:-2} setsid ../shared/peers/llama-cpp serve 8300 -m "$gguf" > "$out/llama.serve.log" 2>&1 &
ll=$!
trap 'kill -TERM -- -$tg -$ll 2>/dev/null; wait' EXIT
wait_health "$(base llama)"
bench() {  # arm seed prompts log
  vllm_client "$(base "$1")" "$hf" "$4" --random-input-len 256 --random-output-len 64 --num-prompts "$3" \
    --max-concurrency 1 --seed "$2"
}
for a in tailgate llama; do bench $a 0 1 "$out/warm-$a.bench.log"; done  # first touches of each
for i in $(seq 1 "${PAIRS:-5}"); do
  order="tailgate llama"; [ $((i % 2)) = 0 ] && order="llama tailgate"
  echo "p$i $(.venv/bin/python scripts/experiments/host_bandwidth.py 3)"
  for a in $order; do
    bench $a "$i" "${PROMPTS:-2}" "$out/p$i-$a.bench.log"
    printf 'p%d %s %s\n' "$i" "$a" "$(awk '/Median TPOT/ {t=$4} /Median ITL/ {i=$4} /P99 ITL/ {p=$4}
      END {printf "tpot_p50 %s itl_p50 %s itl_p99 %s", t, i, p}' "$out/p$i-$a.bench.log")"
  done
done | tee "$out/pairs.txt"
.venv/bin/python - "$out/pairs.txt" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    pair, arm, *kv = line.split()
    if arm not in ("tailgate", "llama"):  # the pair's host bandwidth line
        continue
    runs.setdefault(arm, {})[pair] = dict(zip(kv[::2], map(float, kv[1::2])))
t, l = runs["tailgate"], runs["llama"]
for key in ("tpot_p50", "itl_p50"):
    ratios = [t[p][key] / l[p][key] for p in t if p in l]
    print(f"{key}: tailgate median {statistics.median(r[key] for r in t.values()):.1f} ms, llama.cpp "
          f"{statistics.median(r[key] for r in l.values()):.1f} ms; per pair tailgate/llama.cpp "
          f"{' '.join(f'{r:.2f}' for r in ratios)} (median {statistics.median(ratios):.2f}x)")
EOF
