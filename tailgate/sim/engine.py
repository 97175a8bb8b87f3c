"""The simulated engine: the real scheduler (`engine.scheduler.Scheduler`) over a virtual clock and
an executor that moves it by a cost model's price of each step (`SimExecutor`), with the lane's
share of the machine and the page book `assemble.build_engine` would give. Shared by one engine's
run (`sim/run.py`) and a fleet's (`sim/fleet.py`), which import it and not each other.
"""

from __future__ import annotations

import random

from ..config import ServingConfig, usable_cores
from ..engine.cost_form import SHAPES, shape_features, step_features
from ..engine.pages import KVBook, budget_pool_pages, pool_pages
from ..engine.request import Sampled
from ..engine.scheduler import Scheduler
from .cost import CostModel

TOKEN = 7  # every row samples this (never an EOS: requests end at max_tokens, as with ignore_eos)
SAMPLED = Sampled(TOKEN)  # shared by every row: the scheduler only reads it
EOS = 8  # `chat` runs: a request past its min_tokens samples this and stops
EOS_SAMPLED = Sampled(EOS)
VOCAB = 1 << 16


class VirtualClock:
    def __init__(self, t: float = 0.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class SimFlight:
    """A lane prefill in virtual time: done once the clock reaches `until`."""

    def __init__(self, clock: VirtualClock, until: float, rows: int):
        self.clock, self.until, self.rows = clock, until, rows

    def done(self) -> bool:
        return self.clock.t >= self.until


class SimExecutor:
    """The scheduler's executor: each step costs `cost.step_seconds(segments)` of virtual time,
    times (1 + jitter * a seeded standard normal) when `jitter` is set (real steps vary; without
    it a closed loop of equal requests is one deterministic trajectory whatever the seed).

    The lane model (`lane_share` s, the fraction of the machine the lane owns: N/cores for
    `cpu:N`, NN/100 for `green:NN`): a lane prefill takes its step cost / s, and while it flies a
    step of the engine's runs at (1 - s) of the machine's speed, back to full speed the moment the
    lane is done. Linear in the share: an assumption (a decode step bound by memory bandwidth loses
    less than its share of the cores or SMs), not a fit."""

    def __init__(
        self,
        cost: CostModel,
        clock: VirtualClock,
        jitter: float = 0.0,
        seed: int = 0,
        lane_share: float = 0.0,
        chat: bool = False,
    ):
        self.cost, self.clock, self.jitter, self.chat = cost, clock, jitter, chat
        self.rng = random.Random(seed)
        self.steps = 0
        self.lane_share = lane_share
        self._lane_until: float | None = None
        # How a step's features are counted: the engine's meter (`MeteredExecutor.features`) when
        # it has one, which has counted this step's already for its price (`build` wires it).
        self.features = step_features

    def _cost(self, segments) -> float:
        dt = self.cost.price(self.features(segments))
        if self.jitter:
            dt *= max(0.5, 1 + self.jitter * self.rng.gauss(0, 1))
        return dt

    def run(self, segments, rows):
        work, t = self._cost(segments), self.clock.t
        if self._lane_until is not None and t < self._lane_until:  # sharing the machine with the lane
            slow = 1 - self.lane_share
            if work > (self._lane_until - t) * slow:
                work -= (self._lane_until - t) * slow
                t = self._lane_until  # the rest at full speed
            else:
                work /= slow
        self.clock.t = t + work
        self.steps += 1
        if self.chat:  # a row whose EOS is no longer masked (past min_tokens) ends its request
            return [SAMPLED if r.suppress else EOS_SAMPLED for r in rows]
        return [SAMPLED] * len(rows)

    def launch(self, segments, rows):
        self._lane_until = self.clock.t + self._cost(segments) / self.lane_share
        self.steps += 1
        return SimFlight(self.clock, self._lane_until, len(rows))

    def join(self, flight: SimFlight):
        self.clock.t = max(self.clock.t, flight.until)  # the engine waits for an unfinished lane
        self._lane_until = None
        return [SAMPLED] * flight.rows

    def release(self, request_id: str) -> None:
        pass


def lane_share(lane: str | None, cores: int | None = None) -> float:
    """The fraction of the machine a lane owns: N/cores for `cpu:N`, NN/100 for `green:NN`."""
    if lane is None:
        return 0.0
    kind, _, n = lane.partition(":")
    return int(n) / (usable_cores() if cores is None else cores) if kind == "cpu" else int(n) / 100


def build(
    cfg: ServingConfig,
    cost: CostModel,
    clock: VirtualClock,
    jitter: float = 0.0,
    seed: int = 0,
    cores: int | None = None,
    chat: bool = False,
    probe: bool = True,
) -> Scheduler:
    """The real scheduler with the page book `assemble.build_engine` would give it: every slot's
    full context, or with `KV_CACHE_MB=N` the pools that N MiB hold at the cost model's K+V bytes
    per token (live rows are then preempted as on the real engine). `auto` settles a budget
    against this machine's free RAM on the real engine; a simulated GPU has none to read, so here
    it means every slot's full context."""
    pages = pool_pages(cfg.max_context, cfg.decode_slots, cost.window, transient_prompts=cfg.mix_max_prompts)
    if isinstance(cfg.kv_cache_mb, int):
        if not cost.kv_token_bytes:
            raise ValueError(
                f"KV_CACHE_MB={cfg.kv_cache_mb} needs the cost model's kv_token_bytes "
                "(K+V bytes per token per pool); this one has none"
            )
        pages = budget_pool_pages(
            cfg.kv_cache_mb << 20,
            cost.kv_token_bytes,
            cfg.max_context,
            cfg.decode_slots,
            cost.window,
            transient_prompts=cfg.mix_max_prompts,
        )
    book = KVBook(pages["global"], pages.get("local"), cost.window)
    ex = SimExecutor(cost, clock, jitter, seed, lane_share(cfg.async_prefill, cores), chat)
    sched = Scheduler(ex, book, cfg, VOCAB, clock=clock)
    if sched.executor is not ex:  # metered: a step's features are counted once, for its price and its cost
        ex.features = sched.executor.features
    if probe and sched.costs is not None:  # as the real engine's start-up probe seeds it (model/kernels/probe.seed)
        seed_costs(sched.costs, cost)
    return sched


def seed_costs(model, cost: CostModel) -> None:
    """Teach a step-cost model the start-up probe's shapes (`cost_form.SHAPES`, what a real
    engine's model has seen before its first request) priced by `cost`, as the real probe does."""
    for decode, prompt in SHAPES:
        f = shape_features(decode, prompt)
        model.observe(f, cost.price(f))
