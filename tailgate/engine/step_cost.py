"""The inter-token target (TAILGATE_ITL_TARGET_MS): each walk round's prompt rows priced in
seconds by a step-cost model the engine fits online from its own steps.

A fixed walk width (MIX_CHUNK_TOKENS) bounds a stall in *rows*, while a live stream feels *time*:
a 64-row round costs several decode steps on one CPU (AMD EPYC Zen 5, issue 26) and less than one
on another (AMX Xeon). With a target, each round takes the largest number of prompt rows whose
predicted step time stays within the target, given the live rows already in the step (their
decode rows, their contexts, the sampled rows):
- at least one prompt row always moves (no starvation; a target below the live batch's own step
  time degenerates to one row a round, the tightest the walk can be);
- with no live rows the target is ignored (nobody to protect): the walk takes every walker's
  rest at once, or MIX_CHUNK_TOKENS rows when that is set (a cap on every round);
- with a TTFT target (TTFT_TARGET_MS, on by default under `auto`; off under N ms, a tail budget
  the user chose, unless given), a round widens past the
  inter-token price to the fewest rows that clear every waiting prompt row (the walkers' rest and
  the queue's prompts) within that many seconds at the round's predicted step time. At saturation
  a closed loop's arrivals need a fixed number of prompt rows per step whatever the policy; rounds
  narrower than that only move the wait from the stream to the queue (AMD EPYC Zen 3, 256/64 c16:
  `auto` alone held ITL p99 at 164 ms against the 64-row walk's 363 but TTFT p50 went 1.3 -> 13.3 s,
  above vLLM's 11.0, docs/benchmarks/itl-target-amd.md). The term bounds that wait near N ms and
  costs nothing below saturation (a short backlog clears within N at the inter-token width);
- without a target (the default walk) the same horizon widens the walk's own rounds, priced: to at
  most the rows whose predicted step stays within WIDEN_S (150 ms), so the widening follows the
  CPU (where prompt rows are dear beside the floor a round with live rows is near that already and
  keeps the walk's width); with no backlog past the horizon a round is the walk's, row for row;
- and a round that live streams ride takes the walk's width only while that costs at most
  WALK_FACTOR x their own decode step as a round carries them (MIXED_FLOOR included), else the
  rows within that price (`auto`'s rule at 2.5),
  but never fewer than keep up with the requests in the system (`keeping_up`: each of them
  decoding needs its prompt's rows per output token, so narrower rounds grow a queue), and
  widened for a walker that has waited LATE horizons only up to those rows (LATE_DEMAND);
- until the model has seen a few steps with prompt rows, at two widths or beside decode-only
  steps (`ready`), rounds with live rows take the fixed width (MIX_CHUNK_TOKENS, else the default 64): the engine's
  behaviour without a target, whose rounds are also what teaches the model a prompt row's price.

The model is the cost form the simulator prices steps with (`engine/cost_form.py`):

    seconds = floor + prompt_row * prompt rows + decode_row * decode rows
              + sampled_row * sampled rows + attn_per_1k * (query-key pairs / 1000)
              (+ mixed_floor for a step that carries prompt rows: MIXED_FLOOR, this model's own)

times the host's current *pace* (below), fitted by least squares with exponential forgetting over two accumulators of the normal
equations, one for decode-only steps and one for steps that carry prompt rows, each forgetting
only when a step of its own kind arrives: a long stretch of decode steps does not wash out what
the walk rounds taught about prompt rows (a single forgetting window would, and then price
prompt rows at ~0 and let the next round run long). A term the data price negative is dropped
and the rest refitted (as `cost_form.fit`); a tiny ridge keeps collinear terms (every decode row
is also a sampled row) solvable.

The pace: on a 2-core host a step's time swings with whatever else holds a core (the server's own
event loop writing the last step's tokens, tokenizing an arrival, a neighbour's process), and the
swings last several steps: over a W-std run (AMD EPYC Zen 3, c4/c8/c16, 1040 priced steps) the log
residual of the plain fit had a lag-1 autocorrelation of 0.69, and even an in-sample fit with
extra terms (segments, a walk indicator, squares) left only 63 % of steps within 15 %. So each
prediction is the fit times an average of the last steps' measured / fitted ratios (PACE_ALPHA):
replayed over that run's steps, within 15 % went 66 % -> 86 % and the p90 error 0.26 -> 0.17
(alpha 0.1: 81 % / 0.20; 0.3: 86 % / 0.18; 0.7: 85 % / 0.18). Under `auto` the pace cancels (the
round is priced against the same batch's predicted decode step); an absolute target or the TTFT
horizon reads it as the host's speed now. Plain Python (no numpy, no torch) and no clock: the scheduler's
clock measures each step (`MeteredExecutor`) and passes the seconds in.
"""

from __future__ import annotations

import math

from ..config import DEFAULT_CHUNK
from .cost_form import TERMS, step_features
from .walk import spread

# ITL_TARGET_MS=auto: a round may take this many times the live batch's own decode step,
# predicted at the batch's current depth and contexts, so one setting follows c4 and c16 and a CPU
# where a prompt row costs more. 2.0 is the simulator's knee on the `local` preset (AMD EPYC Zen 3):
# the tail cut by 41 % / 11 % at c8 / c16 for a TTFT of 1.35x / 2.2x; the sweep (1.5 / 2.0 / 3.0)
# is in docs/benchmarks/auto-factor-sim.md.
AUTO_FACTOR = 2.0
# Under `auto` a round with live rows never takes more prompt rows than the fixed walk's width
# (MIX_CHUNK_TOKENS when set, else 64): the rule only ever narrows the walk, so no stream waits
# longer behind a round than it would without a target. Judged in the simulator on the three CPU
# classes with measured costs (scripts/experiments/target_sweep.py, W-std c4/c8/c16, 64 requests,
# jitter 0.1, median of 3 seeds; docs/knobs.md has the table): uncapped, the rule's rounds grew
# past 64 rows where prompt rows are cheap beside the floor (AMX c16: ITL p99 1.00x the walk's,
# Zen 5 c16 tok/s 0.93x); capped, ITL p99 0.45-1.00x the walk's and tok/s 0.96-1.00x on all nine.
# Where the live fit's error says it does not know this host (TRUST_ERROR), rounds are the walk's.
# And it narrows only as far as that stays cheap (`RoundBudget.narrowest`): each extra round costs a
# step floor, and the closed loop pays it in TTFT and so in throughput. On AMD EPYC Zen 5 (a host
# whose fitted floor was 12-17 ms beside 0.33-0.47 ms a prompt row), rounds priced at 2x the decode
# step alone (~35 rows at c4) cut ITL p99 to 0.66-0.75x the walk's but cost 10-15 % of its tok/s
# in two real A/Bs (docs/benchmarks/raw-ab-target-factor-zen5.log); the bound keeps the extra
# step time of absorbing a prompt within AUTO_OVERHEAD of the walk's. 0.05, not the 0.1 it was:
# at Llama 3.2 3B's shape on AMD EPYC Zen 3 (W-std c4, vLLM's client) the default's 17-20-row rounds
# took 350-369 steps to the walk's 283 at a served floor of ~0.12 s plus ~25 ms a round
# (scripts/experiments/feed_preset.py), tok/s 0.944 / 0.949x the walk's. With that floor, 0.05
# holds ~36-row rounds. It did not in the real engine, whose fit had lost the floor there (see
# WALK_RATE, which did the work); it stays for where the floor is known: over the measured
# simulator presets (jitter 0.1, seeds 0-2, W-std c4 / c8 / c16 and the open-loop shapes) 0.05 moved
# the worst TTFT p50 1.26 -> 1.22x at tok/s >= 0.98x, and beside WALK_RATE 0.95 it holds AMX c8's
# TTFT p50 that the rate alone put at 1.26-1.28x (docs/benchmarks/raw-sim-overhead-sweep.txt).
AUTO_OVERHEAD = 0.05
# The default walk prices the rounds live streams ride: where its 64 rows cost more than WALK_FACTOR
# x the batch's own decode step, a round takes `auto`'s rows within that price instead (never
# narrower than `narrowest`, evened). A live stream feels a round in decode steps: Gemma 3 270M's
# 64-row round is ~2-3 of them on AMD EPYC Zen 5 (family 26: 30.8 / 10.3 ms beside 4 streams, 42.4
# / 21.9 beside 16, its `bench step` fit), Llama 3.2 3B's 4.6-7.7 (435 / 95 ms beside 8), which is
# where the walk's closed-loop tail stood above vLLM's (docs/benchmarks/sizes.md). 2.5, not
# `auto`'s 2.0: in a closed loop at saturation a narrower round only moves the wait to the queue
# (TTFT p50 pays ~63 x the ITL saved at 64 tokens out), and at 2.0 the 270M's W-std c16 rounds
# narrowed (the simulator, zen5-f26-measured, jitter 0.1, seeds 0-2: TTFT p50 2.6x the fixed
# walk's); at 2.5 c16 is the walk's on the 270M's four measured presets, and c4 / c8 take ITL p99
# 0.66-0.99x the fixed walk's for TTFT p50 1.02-1.20x and tok/s 0.99-1.00x (3.0 gave back most of
# c8's gain). The sizes' W-std c4 / c8 there: ITL p99 0.61-0.80x (3B) and 0.42-0.64x (1B, Zen 5),
# TTFT p99 1.0-1.1x; at c16 the same trade moves their TTFT p50 4.6-7.6x (TTFT p99 1.0x).
# (`tailgate sim --cost PRESET --random-input-len 256 --random-output-len 64 --num-prompts 8c
# --max-concurrency c --jitter 0.1 --seed 0|1|2`, this tree against the one before.) Real, Zen 5,
# two alternated rounds against the walk (vLLM's client): 270M ITL p99 0.91 / 0.96 / 0.96x at c4 /
# c8 / c16 for tok/s 1.04 / 1.02 / 0.98x and TTFT p50 0.97 / 0.93 / 0.97x; 3B c4 / c8 ITL p99 0.58 /
# 0.63x, tok/s 1.03 / 1.04x; 3B c16 (one round) TTFT p50 7.0x, which KEEP_ALPHA's rule below undid.
WALK_FACTOR = 2.5
# ...but a priced round never takes fewer rows than keep every request in the system decoding:
# a stream needs its prompt's rows for its output's tokens, so with N requests in (live, walking,
# queued) a step must walk N x mean prompt rows / mean output tokens rows for the walk to keep up
# with the streams it feeds (W-std: 4 rows a request). Below that the queue grows: the narrower
# round thins the live batch, whose cheaper decode step prices the next round narrower still, and
# a closed loop settles with a standing queue. That was the priced walk's saturation trade (Llama
# 3.2 3B, W-std c16, AMD EPYC Zen 5: TTFT p50 7.0x the walk's, docs/benchmarks/sizes.md). The means
# are running (KEEP_ALPHA) over finished requests' prompt rows computed (a recompute's too) and
# tokens from decode steps (the first is the prefill's); none until one finishes. The simulator (jitter 0.1, seeds 0-2, against the priced walk alone): W-std c16
# TTFT p50 7.58 -> 1.01x the fixed walk's (3B, Zen 5), 4.96 -> 1.01x (1B), 2.51 -> 1.01x (3B, AMX);
# c4 / c8 keep the priced tail (3B Zen 5 ITL p99 0.61 / 0.65x the walk's) and 1B c8's TTFT p50 went
# 2.59 -> 1.14x; long prompts (768 in / 64 out, c12: 12 rows a request, 144 in all, past the
# walk's 64) keep the walk's width: TTFT p50 1.30-1.40 -> 1.00x, ITL p99 0.45-0.63 -> 0.94-0.98x (Zen 3, 1B,
# 3B); the 270M's presets and gamma / Poisson arrivals unchanged but 1B's gamma (ITL p99 0.60 ->
# 0.77x, TTFT p99 1.18 -> 1.09x). No margin: at 0.9x the rows c8 lost some of its gain, 1.0x none.
# Real (3B, Zen 5, two alternated rounds, vLLM's client): W-std c16 TTFT p50 1.16x the fixed walk's
# at 1.00x its tok/s and 1.02x its ITL p99 (the priced walk alone: 7.3x); c8 unchanged (0.95x ITL p99).
KEEP_ALPHA = 0.1
# ...nor (before evening) fewer than absorb prompt rows at WALK_RATE x the walk's own rate: the
# fewest rows r whose round takes rows at r / step(r) >= WALK_RATE x W / step(W), W the walk's
# round (64, MIX_CHUNK_TOKENS, or the walkers' shorter rest) and step the round's whole predicted
# price (the live rows' decode and the mixed floor included). A walker's prompt is walked in
# rounds, so its TTFT is its rows over that rate; `narrowest` bounds the same trade with the fitted
# floor alone, which at 1-4B beside a few streams is a small part of a round's fixed price (the
# streams' decode is most of it), and there the priced rounds narrowed until W-std c4's TTFT p50
# stood at 1.29 / 1.31x the fixed walk's, past issue 42's 1.25x (the simulator, 15 presets, jitter
# 0.1, seeds 0-5: Llama 3.2 1B / 3B on Zen 4; seeds 0-2 had Qwen3 4B and 3B on Zen 5 at 1.26 /
# 1.28x too). At 0.85: worst TTFT p50 1.23x, tok/s >= 0.98x, and the tail kept most of its gain (1B
# Zen 4 c4 ITL p99 0.43 -> 0.50x the walk's, 3B 0.49 -> 0.52x). Not free at the 270M: its `local`
# / `zen3-measured` c4 TTFT p50 went 1.17 -> 1.23x and zen5-measured's 1.21 -> 1.23x (the closed
# loop's phasing; within the bound). 0.9 put 3B Zen 5 c8's TTFT p50 at 1.25x and gave back more
# tail (docs/benchmarks/raw-sim-walk-rate-sweep.txt). Real, 1B's shape on Zen 4, W-std c4, three
# alternated pairs against 0: tok/s 1.02x, TTFT p50 1.00x, ITL p99 0.88x (the simulator had the
# tail a little longer; the real TTFT did not move: docs/benchmarks/sizes.md).
# 0.95 since Llama 3.2 3B's shape on AMD EPYC Zen 3 (W-std c4, real): there the live fit cannot tell
# the step's floor from the live rows' price (c4 keeps 3-4 rows in every step, so the two columns
# move together) and put the floor at 0-70 ms where the served steps' own fit has ~117 ms plus a
# round's 25 (scripts/experiments/feed_preset.py), so `narrowest` bound nothing and the rounds
# stood at the keep-up rows (17) and this rate's (~18): 357-369 steps against the walk's 283, and
# at one set of prices fitted over the served steps the default's schedules cost 1.030-1.040x the
# walk's (tok/s 0.944 / 0.949x in two pairs, 0.908x in a third on a drifting host). This rate reads
# whole predicted steps, which the fit gets right near the shapes it sees whatever the split, so it
# holds where the floor is lost: at 0.95 rounds of 32-38 rows there, schedules 1.013-1.015x the
# walk's, tok/s 0.982x / 1.07x in two real pairs (1B: 1.011x / 1.011x; docs/benchmarks/sizes.md).
# The simulator (jitter 0.1, seeds 0-2, every measured preset and the served ones, W-std c4 / c8 /
# c16, docs/benchmarks/raw-sim-overhead-sweep.txt):
# tok/s >= 0.99x the walk's (0.98x at 0.85), worst TTFT p50 1.22x (1.23x), c4 / c8 ITL p99
# 0.54-0.90x (0.38-0.99x); open-loop shapes unchanged.
WALK_RATE = 0.95
# The fixed walk (no ITL_TARGET_MS) as a budget: its width, widened only by the TTFT horizon.
WALK = "walk"
# How far the TTFT horizon may widen a round with live rows: to the most rows whose predicted step
# stays within WIDEN_S, and never past WIDEN x the walk's width (a bound on a mispredicting fit).
# The price, not a row count, is what makes it follow the CPU: where a prompt row is cheap beside
# the step's floor (the AMX Xeon: ~0.29 ms a row on a ~16 ms floor) a 150 ms round holds ~400
# rows, where it is dear (AMD EPYC Zen 3: ~1.3 ms a row beside ~6 ms a decode row) a round with
# live rows is near 150 ms at the walk's 64 and does not widen. 150 ms: the AMX Xeon, one round
# each (docs/benchmarks/socket-tail.md, walk width): long prompts (768 in, c12) TTFT p99 6.7 s at
# the fixed walk, 4.7 s widened within 100 ms, 4.2 s within 150 ms (vLLM 3.2-3.4 s), for ITL p99
# 69 / 115 / 161 ms (vLLM 738); below vLLM's W-std ITL p99 there (124-365 ms), and the simulator's
# measured presets keep W-std c4 / c8 at <= 1.01x the walk's ITL p99 on all three classes.
WIDEN_S = 0.15
WIDEN = 8
# A walker that has waited LATE x the horizon is finished at the widest round the bound allows,
# whether or not its rest would clear within the horizon at the walk's width: read from now alone,
# the last of a wave of 12 long prompts (768 in, c12, AMX Xeon) had waited 3.7 s when its last 440
# rows fit the 500 ms horizon at 64 a round, and took 0.75 s more; that prompt was the run's TTFT
# p99. Two alternated rounds against the rule without it (docs/benchmarks/socket-tail.md): TTFT
# p99 4100 / 4257 -> 3783 / 3872 ms, tok/s +5 %, ITL p99 unchanged (170 / 168 -> 181 / 165 ms), W-std
# c16 unchanged (TTFT p99 1.9 s, under the 2 s mark). 4: past every W-std and open-loop TTFT p99
# measured here at the 500 ms horizon, so only such waves reach it; in the simulator's measured
# presets (jitter 0.1, seeds 0-2) only W-std c16 moved: amx-measured (costs ~2x this host's, TTFT
# p99 3.6 s) TTFT p50 +4 % and ITL p99 +3 %, zen5-measured -1 % and -2 %.
# 6 since rounds that live streams ride widen for a late walker alone (below): on AMD EPYC Zen 5
# (family 26) the fixed walk's first W-std c16 wave reaches 2.4-3.0 s, so at 4 its late walkers
# widened enough rounds to put W-std c16's ITL p99 at 1.56x the walk's. Two alternated rounds, 6
# against 4: c16 ITL p99 55.8 / 60.4 vs 88.0 / 68.1 ms (0.74x), tok/s 1.06x, TTFT p50 0.91x; long
# prompts TTFT p99 1.03x (5.7 / 5.6 vs 5.5 / 5.5 s, vLLM's 6.3 / 6.1 s an hour before), p50 1.28x.
# Simulator at 6: c16 ITL p99 1.50x -> 1.02x the walk's (zen5-measured), 1.30x -> 1.23x (amx),
# long TTFT p99 0.88x / 0.87x -> 0.89x / 0.88x.
LATE = 6
# Under the walk, a round that live streams ride keeps the walk's width (priced: WALK_FACTOR)
# unless a walker is LATE;
# the horizon's clearing width is for rounds nobody rides (a wave's first round). Widening every
# round a backlog would miss the horizon lumped a closed loop's first wave into a few 150 ms rounds
# that slowed the early finishers' decode while the late ones caught up: the wave finished
# bunched, and every later wave arrived bunched, queueing behind its neighbours at the walk's
# width (the simulator, zen5-measured, W-std c16: sends 50 ms apart where the walk's are 220 ms).
# Measured on AMD EPYC Zen 5 (family 26, two alternated rounds, vLLM's client): that widening had
# 2.4x the fixed walk's W-std c16 ITL p99 and 2.2x its TTFT p50 (c8 1.16x / 1.24x), the AMX
# Xeon's rounds 2.0x / 1.9x; the simulator's measured presets put this rule at c16 TTFT p50
# 1.04x (zen5) / 1.06x (amx) the walk's, with long prompts' TTFT p99 at 0.88x / 0.87x the walk's
# (the widening's 0.84x / 0.87x; docs/benchmarks/socket-tail.md, the Zen 5 section).
# LATE_DEMAND: a late walker widens a ridden round only as far as keeps every request in the system
# decoding (`RoundBudget.demand`: `keeping_up`, or before any request finished the walkers' prompt
# rows over the tokens their max_tokens lets them decode), not to the widest WIDEN_S allows. LATE is
# seconds, so a slower host's ordinary first wave reaches it: on AMD EPYC family 25 (Zen 4, 2 cores,
# a 64-row round beside 14 streams ~65-75 ms) W-std c16's first wave waited 3.3-3.8 s under the
# walk, and 4 rounds of 199-231 rows at 139-160 ms (a step trace) put the default's client ITL p99 at
# 142-154 ms against the walk's 75-109 (1.61x, two rounds). That wave needs 66 rows a step (16 x
# 256 / 63), the walk's width, so widening only reorders it: TTFT p99 0.99x. Long prompts (768 in,
# c12) need 147, so their late rounds still widen. Two alternated rounds there, vLLM's client:
# c16 ITL p99 1.36x -> 1.20x the walk's (the rest is 64-row rounds, the walk's own shape, whose ITL
# p50 matched: 1.00x), 1.05x over five alternated pairs at tok/s 1.00x; c4 / c8 unchanged (no
# walker is late); the simulator's presets
# (no jitter): amx-measured c16 ITL p99 1.42x -> 1.00x the walk's, long prompts' TTFT p99 0.90x kept
# on amx, 0.91x -> 0.93x (zen5-measured), 0.91x -> 0.95x (zen5-f26) for ITL p99 -13 % / -53 %.
# The fit's error on a W-std c8 run: p90 0.11 on the AMX Xeon (its step trace in
# ../shared/design/measured/), 0.13-0.17 on AMD EPYC Zen 3 (issue 26).
TRUST_ERROR = 0.35
# A step the fit (before pace) already prices within SURPRISE is not counted toward the next solve:
# a point on the fitted plane leaves the least-squares answer where it is (its weight shrinks with
# the rest). Real steps miss by more than this almost always (a W-std run's p50 error ~5 %, issue
# 26); an exact cost (the simulator without jitter) stops re-solving once the fit has it, which was
# ~10 % of the 10,000-request simulation.
SURPRISE = 0.01
ERROR_ALPHA = 0.1  # the error's running mean: the newest priced step's weight
# A measured step is taught to the fit clipped to [1/CLIP, CLIP] x its prediction: one 60 s stall
# (a page-in, a paused host) fitted as it came priced prompt rows at ~0 and let the next round
# take every walker's rest (issue 36: 1872 rows, 78x the target). The pace still sees it whole.
CLIP = 3.0
# The fit's units: a typical step's features are ~1 in them (1 step, 64 prompt rows, 16 decode
# and sampled rows, 10 000 query-key pairs), so one ridge weight means the same for every term.
# A step that carries prompt rows may pay a floor of its own beside the decode-only step's: where a
# step of decode rows alone runs its layers in one native call (runtime/native_layers.py) and one
# with prompt rows runs them through the Python loop, ~2-3 ms more at Gemma 3 270M and Llama 3.2
# 1B's shapes (AMD EPYC Zen 4). Walk rounds take the one call too since (off AMX, whose prompt rows
# attend in SDPA; Qwen2 and Gemma 4 keep the loop either way), and there the fit puts this term
# near 0. Fitted as a sixth term (1 for a step with prompt rows, else 0) that only this
# model holds (the simulator's cost form keeps TERMS). A round's price in decode steps (`auto`,
# WALK_FACTOR) reads the live rows' step *as a round carries them*, this floor included: priced
# against the cheaper decode-only step, the default's rounds at W-std c8 narrowed to 0.92x the
# fixed walk's tok/s (three alternated pairs), below issue 42's 0.97x.
MIXED_FLOOR = "mixed_floor"
# ONE_WIDTH: while every step with prompt rows has carried the same number (the fixed walk's 64,
# W-std's 256-token prompts in four rounds of 64), that floor and the rows' price are one column
# scaled twice: the ridge split a 64-row round's extra over the decode-only step evenly between
# them, so a round's floor stood at half that extra (by the trace's step times ~0.45 s, on a
# ~0.09 s decode step of 3 rows), the live rows' step "as a round carries it" at ~6x the
# decode-only one, WALK_FACTOR's price above the walk's own round, and the default stayed the fixed
# walk for a whole run (AMD EPYC Zen 3, Llama 3.2 1B's shape, W-std c4: the start-up probe's fit
# was untrusted, 43 %, so nothing seeded a second width; 128 of 128 rounds at 64 rows, client ITL
# p99 1173 ms where the priced default's was 636-663 ms in the same session's pairs). So the term
# waits until the remembered steps' widths differ (`widths_apart`; the floor rests on the prompt
# rows until then, where a narrower round will find it, and the first priced round is one). The
# spread is the accumulator's, so it forgets as the fit does: a few hundred steps of one width and
# the floor rests on the rows again, before the ridge would split them (~450 steps at `forget` 0.98).
# SPREAD_MIN is four steps' weight at an 8-row contrast, (8 / 64)^2 each: one 63-row step beside
# 64-row ones is not a second width; one priced round of ~20 rows beside them is ~7 times the bar.
SPREAD_MIN = 4 * (8 / 64) ** 2
FIT_TERMS = (*TERMS, MIXED_FLOOR)  # this model's coefficients, in order
_SCALE = (1.0, 64.0, 16.0, 16.0, 10.0, 1.0)  # TERMS, then MIXED_FLOOR
_N = len(_SCALE)
# The pace's step (module doc): the weight of the newest step's measured / fitted ratio.
PACE_ALPHA = 0.5
# The pace never leaves [1/4, 4]: one wild measurement (a step that waited out a swap-in) must not
# price the next rounds at nothing or at everything.
PACE_BOUNDS = (0.25, 4.0)


def _solve(M: list[list[float]], v: list[float]) -> list[float]:
    """M x = v for a small dense system (Gaussian elimination, partial pivoting; M is symmetric
    positive definite here, the ridge sees to that). Plain Python: at 5 unknowns it is several
    times faster than a numpy call's overhead. Loops written out (no key lambda, no generator):
    a solve was ~10 % of the 10,000-request simulation, and this one is ~1.5x faster to the bit."""
    n = len(v)
    a = [row + [v[i]] for i, row in enumerate(M)]
    for c in range(n):
        p, best = c, abs(a[c][c])
        for r in range(c + 1, n):  # the first row of the largest pivot
            x = abs(a[r][c])
            if x > best:
                p, best = r, x
        if p != c:
            a[c], a[p] = a[p], a[c]
        ac = a[c]
        piv = ac[c]
        for r in range(c + 1, n):
            ar = a[r]
            f = ar[c] / piv
            if f:
                for j in range(c, n + 1):
                    ar[j] -= f * ac[j]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        ar = a[r]
        t = 0
        for j in range(r + 1, n):
            t += ar[j] * x[j]
        x[r] = (ar[n] - t) / ar[r]
    return x


class StepCostModel:
    """Predicted step seconds from a step's features, refitted from every measured step.

    `forget` is each accumulator's per-step forgetting factor (0.98: the last ~50 steps of each
    kind carry most of the weight); `min_steps` of each kind make it `ready`; the coefficients are
    re-solved at most every `refit_every` observations the fit missed by more than SURPRISE (or on
    `refit()`): a handful of steps barely moves a fit that remembers ~100, one it already priced
    moves it not at all, and the solve is most of the model's cost."""

    def __init__(self, forget: float = 0.98, ridge: float = 1e-4, min_steps: int = 3, refit_every: int = 4):
        if not 0 < forget <= 1:
            raise ValueError(f"forget must be in (0, 1], got {forget}")
        self.forget, self.ridge, self.min_steps, self.refit_every = forget, ridge, min_steps, refit_every
        # The normal equations of each kind of step: [decode-only, with prompt rows].
        self._A = [[[0.0] * _N for _ in range(_N)] for _ in range(2)]
        self._b = [[0.0] * _N for _ in range(2)]
        self.seen = [0, 0]
        self._width: int | None = None  # the first prompt-row count seen...
        self._varied = False  # ...and whether another has been seen since
        self._coef: tuple[float, ...] | None = None  # per TERMS, in seconds
        self._stale = 0  # observations since the last solve
        self.pace = 1.0  # the host's speed now, as measured / fitted seconds (module doc)
        self.error: float | None = None  # running mean of |predicted - measured| / measured (ERROR_ALPHA)
        self.priced = 0  # steps whose prediction was scored

    @property
    def trusted(self) -> bool:
        """Ready, and its recent predictions within TRUST_ERROR of what the steps took (a handful
        of scored steps first: the first rounds after `ready` are what teach it)."""
        return self.ready and (self.priced < 8 or (self.error is not None and self.error <= TRUST_ERROR))

    def observe(self, features, seconds: float) -> None:
        """One measured step: its features (`step_features`) and how long it took."""
        if not (seconds > 0 and math.isfinite(seconds)):
            return
        surprise = True  # whether the fit misses this step (else a solve would not move it: `refit`)
        if self.ready:  # the fit before this step taught it: how far off the host runs now
            base = self._fitted(features)
            if base > 0:
                predicted = base * self.pace
                e = abs(predicted - seconds) / seconds
                self.error = e if self.error is None else (1 - ERROR_ALPHA) * self.error + ERROR_ALPHA * e
                self.priced += 1
                lo, hi = PACE_BOUNDS
                self.pace = min(hi, max(lo, (1 - PACE_ALPHA) * self.pace + PACE_ALPHA * seconds / base))
                seconds = min(CLIP * predicted, max(predicted / CLIP, seconds))  # what the fit learns
                surprise = abs(seconds - base) > SURPRISE * seconds
        p, d, s, k = features
        kind = 1 if p else 0
        x = (1.0, p / _SCALE[1], d / _SCALE[2], s / _SCALE[3], k / _SCALE[4], float(kind))
        A, b, r = self._A[kind], self._b[kind], self.forget
        for i in range(_N):
            xi, row = x[i], A[i]
            b[i] = r * b[i] + seconds * xi
            for j in range(_N):
                row[j] = r * row[j] + xi * x[j]
        self.seen[kind] += 1
        self._stale += surprise
        if p:
            if self._width is None:
                self._width = p
            self._varied = self._varied or p != self._width

    @property
    def ready(self) -> bool:
        """Seen `min_steps` steps with prompt rows, and prompt rows at two widths (a decode-only
        step is width 0): a prompt row's price is the contrast between them, which the floor
        would otherwise absorb (MIXED_FLOOR is held at 0 until the widths differ: ONE_WIDTH). Decode-only
        steps are not required: under a steady walk (arrivals join the running walk) they can be rare
        for minutes."""
        return self.seen[1] >= self.min_steps and (self.seen[0] > 0 or self._varied)

    @property
    def widths_apart(self) -> bool:
        """Whether the remembered steps with prompt rows differ enough in their count for a round's
        own floor to be told from its rows' price (ONE_WIDTH): their weighted spread of prompt rows
        (in the fit's units: a 64-row step is 1) at least SPREAD_MIN."""
        a = self._A[1]
        return a[0][0] > 0 and a[1][1] - a[0][1] ** 2 / a[0][0] >= SPREAD_MIN

    def refit(self) -> tuple[float, ...]:
        """Solve the normal equations now; a term the data price negative is dropped and the
        rest refitted (as `cost_form.fit`)."""
        A0, A1 = self._A
        M = [[x + y for x, y in zip(r0, r1)] for r0, r1 in zip(A0, A1)]
        for i in range(_N):
            M[i][i] += self.ridge
        v = [x + y for x, y in zip(*self._b)]
        keep = list(range(_N if self.widths_apart else _N - 1))  # MIXED_FLOOR: ONE_WIDTH
        theta = [0.0] * _N
        while keep:
            sub = _solve([[M[i][j] for j in keep] for i in keep], [v[i] for i in keep])
            if min(sub) >= 0:
                for i, c in zip(keep, sub):
                    theta[i] = c
                break
            keep.pop(min(range(len(sub)), key=sub.__getitem__))
        self._coef = tuple(t / sc for t, sc in zip(theta, _SCALE))
        self._stale = 0
        return self._coef

    def _current(self) -> tuple[float, ...]:
        if self._coef is None or self._stale >= self.refit_every:
            return self.refit()
        return self._coef

    @property
    def coefficients(self) -> dict[str, float]:
        """Seconds per unit of each term (TERMS, then MIXED_FLOOR), as the next prediction uses them."""
        return dict(zip(FIT_TERMS, self._current()))

    def _fitted(self, features, in_round: bool = False) -> float:
        f, p, d, s, k, m = self._current()
        prompt, decode, sampled, kpairs = features
        return f + (m if prompt or in_round else 0.0) + p * prompt + d * decode + s * sampled + k * kpairs

    def predict(self, features, in_round: bool = False) -> float:
        """The step's seconds: the fitted cost at the host's current pace. `in_round`: a step
        without prompt rows priced as a round's step (MIXED_FLOOR included), the decode rows' cost
        inside a round."""
        return self._fitted(features, in_round) * self.pace


def most_within(cost, seconds: float, lo: int, hi: int) -> int:
    """The most rows r in [lo, hi] with cost(r) <= seconds, bisecting (cost grows with rows); `lo`
    when none above it is (the caller knows lo's answer or takes it as the floor)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if cost(mid) <= seconds:
            lo = mid
        else:
            hi = mid - 1
    return lo


def even_rounds(take: int, total: int) -> int:
    """`auto`'s round, evened: the rows that spread `total` (every walker's rest) over as many rounds
    as rounds of `take` would need, so no round is wider than the rest need and the last is not a
    sliver that costs a whole step floor (256 rows at 51 a round: five of 51 and one of 1; evened,
    six of 43). Never more rounds, never a wider one."""
    if take <= 0 or take >= total:
        return take
    return -(-total // -(-total // take))


def rows_needed(requests: int, per: float | None) -> int:
    """`requests` x `per` prompt rows a step, rounded up: 0 without a ratio or requests, 10**9 for
    an unbounded need (`RoundBudget.keeping_up` and `RoundBudget.demand`)."""
    if per is None or requests <= 0:
        return 0
    need = requests * per
    return math.ceil(need - 1e-9) if need < 1e9 else 10**9


class RoundBudget:
    """The prompt rows of each walk round under a target of `target_s` seconds a step (module
    doc); `target_s` None is `auto`: AUTO_FACTOR x the predicted decode-only step of the round's
    live rows; WALK is the fixed walk of `fallback` rows, which only the horizon widens (within
    WIDEN_S and WIDEN). `cap` is MIX_CHUNK_TOKENS when set explicitly (None: uncapped)."""

    def __init__(
        self,
        target_s: float,
        cap: int | None,
        metrics=None,
        model: StepCostModel | None = None,
        fallback: int = DEFAULT_CHUNK,
        horizon_s: float | None = None,
    ):
        self.target, self.cap, self.horizon = target_s, cap, horizon_s
        self.model = model or StepCostModel()
        self.fallback = cap or fallback
        self.wide = WIDEN * self.fallback  # under the walk, the horizon's ceiling in rows (WIDEN)
        self.metrics = metrics
        self.predicted: float | None = None  # the last round's predicted step seconds (None: not priced)
        self._hint = 0  # the last price bound `_largest_priced` found: where the next one starts
        self._means: tuple[float, float] | None = None  # running prompt rows, decode tokens (KEEP_ALPHA)
        if metrics is not None and target_s is not None and target_s != WALK:
            metrics.step_cost["target_s"] = target_s

    def rows(self, walkers, live, queued_rows: int = 0, waited: float = 0.0, requests: int = 0) -> int:
        """The budget `walk.walk_round` spreads over `walkers` (admission order; each with
        `done`, `rest`, `tokens`) this round, with `live` rows riding it (each with
        `pages.frontier`, the position its next token is fed at); `queued_rows` are the prompt
        rows of requests not yet admitted (the TTFT target's backlog beside the walkers' rest);
        `waited` is how long the first walker has waited since it arrived (LATE); `requests` how
        many are in the system (live, walking, queued: `keeping_up`)."""
        total = sum(w.rest for w in walkers)
        widest = total if self.cap is None else min(self.cap, total)
        self.predicted = None
        late = self.horizon is not None and waited > LATE * self.horizon
        if not live and self.target != WALK:  # nobody to protect: full width
            take = widest
        elif not self.model.trusted:  # not fitted yet, or its error says it does not know this host
            take = min(self.fallback, widest)
        elif self.target == WALK and self.horizon is None:
            take = min(self.fallback, widest)
        else:
            cost, decode_step = self._pricer(walkers, live)
            widen = True
            if self.target == WALK:  # the walk: its width, widened below within WIDEN_S
                take = min(self.fallback, widest)
                ceiling = min(widest, self.wide)
                if live:  # streams ride it: priced at WALK_FACTOR decode steps, widened for a late walker only
                    price = WALK_FACTOR * decode_step()
                    walk_s = cost(take)
                    if walk_s > price:
                        floor = self._at_rate(cost, take, walk_s)
                        priced = self._largest_within(cost, price, take, total, even=True, floor=floor)
                        keep = min(take, self.keeping_up(requests))
                        if keep > priced:  # the price would grow a queue
                            priced, self.predicted = keep, cost(keep)
                            if self.metrics is not None:
                                self.metrics.rounds_kept_up += 1
                        take = priced
                    widen = late
                    if late:  # ...and only as far as keeps every request in decoding (LATE_DEMAND)
                        ceiling = min(ceiling, self.demand(requests, walkers))
            else:
                auto = self.target is None  # a multiple of this batch's own decode step
                target = AUTO_FACTOR * decode_step() if auto else self.target
                if auto and self.metrics is not None:
                    self.metrics.step_cost["target_s"] = target
                take = self._largest_within(cost, target, widest, total, even=auto)
                # Widened at most to the fixed walk's width (MIX_CHUNK_TOKENS, else 64): a stream
                # waits no longer than it would behind the plain walk. Uncapped, a backlog no width
                # clears in time took every walker's rest at once (the simulator, `local` costs, c8
                # with a 1 s horizon: ITL p99 2.1 s, one 1000-row round).
                ceiling = min(widest, self.fallback)
            if widen and self.horizon is not None and take < ceiling:
                # late: no round clears it in time, so the widest the bound allows
                backlog = math.inf if late else total + queued_rows
                if self.target == WALK:
                    wide = self._widened(cost, take, ceiling, backlog)
                else:
                    wide = self._clearing(cost, ceiling, backlog)
                if wide > take:
                    take = wide
                    self.predicted = cost(take)
                    if self.metrics is not None:
                        self.metrics.rounds_widened += 1
        if self.metrics is not None and take > 0:
            self.metrics.step_prompt_rows.observe(take)
        return take

    def finished(self, prompt_rows: int, decode_tokens: int) -> None:
        """A request finished having computed `prompt_rows` prompt rows (a recompute's included)
        and emitted `decode_tokens` from decode steps (its first token is its prefill's): the
        running means `keeping_up` reads move toward them (KEEP_ALPHA). A one-token request adds
        rows and no decode steps: demand that no stream's tokens pay back."""
        if prompt_rows <= 0 and decode_tokens <= 0:
            return
        if self._means is None:
            self._means = (float(prompt_rows), float(decode_tokens))
        else:
            rows, tokens = self._means
            self._means = (rows + KEEP_ALPHA * (prompt_rows - rows), tokens + KEEP_ALPHA * (decode_tokens - tokens))

    @property
    def rows_per_token(self) -> float | None:
        """The running means' prompt rows per decode token (None before any request finished;
        inf while no decode token was seen)."""
        if self._means is None:
            return None
        rows, tokens = self._means
        return rows / tokens if tokens > 0 else math.inf

    def keeping_up(self, requests: int) -> int:
        """The prompt rows a round needs for `requests` in the system to all be decoding (0 before
        any request finished): requests x the ratio of the running means of prompt rows and
        decode tokens, rounded up (no decode tokens yet: every row the round can take)."""
        return rows_needed(requests, self.rows_per_token)

    def demand(self, requests: int, walkers) -> int:
        """The prompt rows a round needs for `requests` in the system to all be decoding: `keeping_up`
        once a request finished, before that the walkers' own prompt rows over the tokens their
        max_tokens lets them decode (0 where a walker has none: no evidence of a shortfall)."""
        per = self.rows_per_token
        if per is None:
            limits = [w.max_tokens for w in walkers]
            if None in limits:
                return 0
            per = sum(len(w.tokens) for w in walkers) / max(1, sum(max(1, m - 1) for m in limits))
        return rows_needed(requests, per)

    def round_features(self, walkers, live_n: int, live_kpairs: float, budget: int):
        """The features of a round that spreads `budget` rows as `walk.walk_round` does (nobody waiting for pages)."""
        prompt = decode = 0
        sampled, pairs = live_n, 0
        for w, n in spread(walkers, budget):
            st = w.computed
            if n > 1 or st == 0:
                prompt += n
            else:
                decode += 1
            if st + n == len(w.tokens):
                sampled += 1
            pairs += n * st + n * (n + 1) // 2
        return prompt, decode + live_n, sampled, live_kpairs + pairs / 1000

    def _pricer(self, walkers, live):
        """The predicted step seconds of this round at b prompt rows, as a function of b, and of
        the live rows' decode step alone (the live rows' query-key pairs summed once a round)."""
        n = len(live)
        kpairs = (sum([a.pages.frontier for a in live]) + n) / 1000  # (each row's frontier + 1)
        cost = lambda b: self.model.predict(self.round_features(walkers, n, kpairs, b))  # noqa: E731
        return cost, lambda: self.model.predict(self.round_features([], n, kpairs, 0), in_round=True)

    @staticmethod
    def _fewest_clearing(cost, need: float, lo: int, hi: int) -> int:
        """The fewest rows r in [lo, hi] with r >= need * cost(r) (a rate of r / step(r) rows a
        second); the caller knows hi clears. r / step(r) rises with r (a step costs a floor plus a
        price per row) until a fresh prompt's attention pairs, growing as r^2, bend it down past
        its peak; the rows that clear are one range around that peak holding hi, so a bisection
        of [lo, hi] finds its low end (where several walkers bend it, some clearing r, r - 1 not)."""
        while lo < hi:
            mid = (lo + hi) // 2
            if mid >= need * cost(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _clearing(self, cost, widest: int, backlog: int) -> int:
        """The fewest rows r (<= widest) whose rate r / step(r) clears `backlog` rows within the
        horizon; `widest` when none does."""
        need = backlog / self.horizon  # rows per second
        if widest < need * cost(widest):
            return widest
        return self._fewest_clearing(cost, need, 1, widest)

    def _widened(self, cost, take: int, ceiling: int, backlog: int) -> int:
        """The walk's round under the horizon: `take` when it clears `backlog` in time, else the
        fewest rows that do, at most the most rows priced within WIDEN_S (and `ceiling`). The same
        answer as `_clearing` bounded by `_largest_priced`, in fewer predictions: a round with no
        backlog past the horizon (most rounds) prices one step, and the price bound starts from
        the last round's (`_hint`), a few rows off in a steady walk. (10,000 simulated requests,
        1024 in / 128 out, c16: each prediction is ~2.5 us of the scheduler's time.)"""
        need = backlog / self.horizon  # rows per second
        step = cost(take)
        if take >= need * step:
            return take
        if step > WIDEN_S:  # the walk's own round is past the bound, so is every wider one (a step's
            return take  # features, hence its price, grow with its rows): no search (AMD EPYC Zen 3's case)
        top = self._largest_priced(cost, ceiling, WIDEN_S)
        if top <= take or top < need * cost(top):
            return max(take, top)
        return self._fewest_clearing(cost, need, take + 1, top)  # cleared at top, not at take

    def _largest_priced(self, cost, widest: int, seconds: float) -> int:
        """The most rows (<= widest) whose `cost` is within `seconds` (0 when none is): galloping
        from the last answer (`_hint`), then a bisection of the bracket it found."""
        h = min(max(self._hint, 0), widest)
        if h == 0 or cost(h) <= seconds:  # the answer is h or above
            lo, step = h, 1
            while lo < widest:
                nxt = min(widest, lo + step)
                if cost(nxt) > seconds:
                    hi = nxt - 1
                    break
                lo, step = nxt, 2 * step
            else:
                hi = lo
        else:  # below h
            hi, step = h - 1, 1
            while hi > 0:
                nxt = max(0, hi - step)
                if nxt == 0 or cost(nxt) <= seconds:
                    lo = nxt
                    break
                hi, step = nxt - 1, 2 * step
            else:
                lo = 0
        self._hint = lo = most_within(cost, seconds, lo, hi)
        return lo

    def _largest_within(self, cost, target: float, widest: int, total: int, even: bool, floor: int = 0) -> int:
        """The most rows (<= widest, at least one) priced within `target` seconds; `even` (a
        target in decode steps: `auto`, the walk's WALK_FACTOR): never narrower than `narrowest`
        (nor than `floor`, the walk's WALK_RATE rows), evened over the rounds `total` needs."""
        if widest <= 0:
            return 0
        # the largest budget priced within the target; at least one row moves, whatever it costs
        lo = widest if cost(widest) <= target else most_within(cost, target, 1, widest - 1)
        if even:
            lo = even_rounds(max(lo, min(widest, max(floor, self.narrowest()))), total)
        self.predicted = cost(lo)
        return lo

    def _at_rate(self, cost, width: int, seconds: float) -> int:
        """The fewest rows whose round absorbs prompt rows at WALK_RATE x the rate of a round of
        `width` rows priced at `seconds` (rows over predicted seconds); 0 where the model prices
        that round at nothing."""
        if not (WALK_RATE > 0 and seconds > 0):
            return 0
        return self._fewest_clearing(cost, WALK_RATE * width / seconds, 1, width)

    def narrowest(self) -> int:
        """`auto`'s floor on a round's prompt rows (AUTO_OVERHEAD): the fewest rows r at which
        absorbing prompts in rounds of r instead of the walk's W costs at most AUTO_OVERHEAD more
        step time, the extra being one round's fitted floor per extra round (the step's floor and
        MIXED_FLOOR, which every round pays): floor * (1/r - 1/W) <= AUTO_OVERHEAD * (floor / W +
        prompt_row)."""
        c = self.model.coefficients
        floor, row, w = c["floor"] + c[MIXED_FLOOR], c["prompt_row"], self.fallback
        if floor <= 0:
            return 1
        return max(1, math.ceil(1 / (1 / w + AUTO_OVERHEAD * (1 / w + row / floor))))


class MeteredExecutor:
    """The scheduler's executor, wrapped: every step is timed with the scheduler's clock around
    `run` and fed to the model. A step that raises teaches nothing. The price comes before: the
    scheduler puts it on the step's plan (`StepPlan.predicted_s`) and scores it when it records
    the step (`Scheduler.record`). Everything else (`release`, `launch`, `join`, `close`, the
    sim's `steps`) is the wrapped one's."""

    def __init__(self, inner, model: StepCostModel, clock, metrics=None):
        self.inner, self.model, self.clock, self.metrics = inner, model, clock, metrics
        self._last: tuple | None = None  # (segments, their features): priced at planning, run next
        self._shown: tuple | None = None  # the fit's coefficients last put in the metrics

    def features(self, segments):
        """`step_features(segments)`, counted once for the plan's price and the step's lesson."""
        if self._last is None or self._last[0] is not segments:
            self._last = (segments, step_features(segments))
        return self._last[1]

    def run(self, segments, rows):
        x = self.features(segments)
        t0 = self.clock()
        try:
            out = self.inner.run(segments, rows)  # (a simulated one counts its cost from `features` too)
        finally:
            self._last = None
        took = self.clock() - t0
        self.model.observe(x, took)
        m = self.metrics
        if m is not None:
            m.step_cost["actual_s"] = took
            if self.model.ready:
                coef = self.model._current()
                if coef is not self._shown:  # (a new fit: the coefficients change only when it is solved)
                    m.step_cost.update(zip(FIT_TERMS, coef))
                    self._shown = coef
                m.step_cost["pace"] = self.model.pace
        return out

    def __getattr__(self, name):
        if name == "inner":  # not set yet (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)
