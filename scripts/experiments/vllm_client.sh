# Sourced by the experiment scripts that drive a running server (tailgate or a peer) with vLLM's own
# benchmark client (socket_tail_arm.sh, c1_paired.sh; real_shape_serve.sh asks the model's name), so
# that every arm runs the same command line:
#   wait_health BASE                         until BASE/health answers 200 (at most 15 min)
#   served_model BASE                        the id of the first model BASE/v1/models lists
#   vllm_client BASE TOKENIZER LOG FLAGS...  vLLM's `bench serve` against BASE/v1/completions: random
#                                            prompts, ignore_eos, temperature 0, TTFT / ITL / TPOT at
#                                            p50 and p99; FLAGS give the shape (lengths, prompts,
#                                            concurrency or arrivals, seed); output to LOG
wait_health() {
  for _ in $(seq 1 1800); do curl -sf "$1/health" >/dev/null && return; sleep 0.5; done
}

served_model() {
  curl -s "$1/v1/models" | .venv/bin/python -c "import json,sys;print(json.load(sys.stdin)['data'][0]['id'])"
}

vllm_client() {
  local base=$1 tokenizer=$2 log=$3
  shift 3
  ../shared/peers/vllm-cpu bench --backend openai --base-url "$base" --endpoint /v1/completions \
    --model "$(served_model "$base")" --tokenizer "$tokenizer" --dataset-name random "$@" \
    --ignore-eos --temperature 0 --percentile-metrics ttft,itl,tpot --metric-percentiles 50,99 > "$log" 2>&1
}
