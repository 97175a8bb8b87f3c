"""Which replica takes a request: the routing policy both the Ray Serve fleet (`fleet/router.py`)
and the simulator's fleet (`sim/fleet.py`) run, so a plan sized on the simulator is the policy
that serves. Plain Python over opaque replica ids; no Ray, no torch.

`prefix` sends a prompt to the replica that holds the longest cached prefix of it, unless that
replica's load (requests running + waiting there) exceeds the least loaded one's by more than
`imbalance` (then to the least loaded). A prompt no replica holds at least MATCH_SHARE of goes to
the least loaded too, and among the least loaded to the one holding the least cached text (ties
at random), as SGLang's cache-aware router and Ray Serve's prefix-aware one do: routed by a short
shared start alone (a chat template's header), every new prefix went to one replica, the other
idled, and the fleet cached half what it could (issue 44). `least-loaded` is
that fallback alone; `random` picks uniformly (a seeded RNG), the baseline a cache-blind proxy is.

What a replica "holds" is the router's own record of the prompts it sent there (as SGLang's
cache-aware router keeps an approximate tree instead of asking the engines): every prompt is cut
into blocks of `block` items, each block keyed by a hash chained from the one before, and each
replica remembers its last `capacity` blocks, least recently routed forgotten first, as the
engine's prefix cache (PREFIX_CACHE=K entries, LRU) forgets. The keys may be token ids (the
simulator, `/v1/completions` with ids) or characters of the prompt text (the fleet's front does
not tokenize); a prefix is a prefix either way.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence

POLICIES = ("prefix", "least-loaded", "random")

# 16 items a block: the engine's KV page (engine/pages.PAGE_SIZE), so a routed block is a page a
# hit can reuse; text keys are ~4 characters a token, so a character block is ~4 tokens (finer).
BLOCK = 16
# Blocks remembered per replica: 64 prompts of 1024 tokens, the size of PREFIX_CACHE=64's typical
# working set on the CPU model; past it the engine has likely evicted what the router remembers.
CAPACITY = 4096
# How many more requests (running + waiting) the cached replica may hold than the least loaded
# before its cache stops being worth the wait. Swept on the simulator (2 replicas of this CPU's
# calibrated model at half speed each, 12 system prompts of 1024 tokens, 1152 in / 64 out,
# PREFIX_CACHE 8 and 64, closed loop c4/c8/c16; scripts/experiments/fleet_imbalance.py): 0-2 give
# the most throughput at c4 (12 % over 4) but up to 16 % less at c16; no limit gives the worst ITL
# p99 at c16 (1.40 / 1.42 s vs 1.27 s at 4); 4 is within 5 % of the best throughput at c8 and c16.
IMBALANCE = 4
# The share of a prompt's blocks a replica must hold for its cache to pick it (SGLang's
# cache_threshold default): below it the prompt is new text, placed where least is cached.
MATCH_SHARE = 0.5


def chain(key: Sequence[Hashable], block: int = BLOCK) -> list[int]:
    """The chained hashes of `key`'s full blocks: hash i covers items [0, (i + 1) * block)."""
    out, h = [], 0
    for i in range(block, len(key) + 1, block):
        h = hash((h, tuple(key[i - block : i])))
        out.append(h)
    return out


class Holdings:
    """The blocks one replica was sent, least recently routed first (an LRU of `capacity`)."""

    def __init__(self, capacity: int):
        self.capacity, self.blocks = capacity, OrderedDict()

    def matched(self, hashes: list[int]) -> int:
        """How many of `hashes` (a chain) this replica holds, from the first on."""
        n = 0
        for h in hashes:
            if h not in self.blocks:
                break
            n += 1
        return n

    def add(self, hashes: list[int]) -> None:
        for h in hashes:
            self.blocks[h] = None
            self.blocks.move_to_end(h)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


class RouterPolicy:
    """`choose(key, loads)` -> (replica id, reason); reasons: `prefix` (the longest cached prefix
    won), `imbalance` (it lost to the least loaded by more than `imbalance`), `least-loaded` (no
    replica holds MATCH_SHARE of it, and one replica is the least loaded), `least-cached` (that,
    among equally loaded replicas: the one caching least), `random`. Ties in load go to the replica chosen least
    recently, so equal replicas take turns."""

    def __init__(
        self,
        kind: str = "prefix",
        block: int = BLOCK,
        capacity: int = CAPACITY,
        imbalance: int = IMBALANCE,
        seed: int = 0,
    ):
        if kind not in POLICIES:
            raise ValueError(f"router {kind!r} not recognized (accepted: {' | '.join(POLICIES)})")
        self.kind, self.block, self.capacity, self.imbalance = kind, block, capacity, imbalance
        self.rng = random.Random(seed)
        self.held: dict[Hashable, Holdings] = {}
        self.last: dict[Hashable, int] = {}  # replica -> the decision count when it was last chosen
        self.decisions = 0
        self.reasons: dict[str, int] = {}

    def choose(self, key: Sequence[Hashable], loads: Mapping[Hashable, int]) -> tuple[Hashable, str]:
        if not loads:
            raise ValueError("no replica to route to")
        ids = list(loads)
        hashes = chain(key, self.block) if self.kind == "prefix" else []
        if self.kind == "random":
            rid, reason = self.rng.choice(ids), "random"
        else:
            least = min(ids, key=lambda r: (loads[r], self.last.get(r, -1)))
            rid, reason = least, "least-loaded"
            if hashes:
                best = max(ids, key=lambda r: (self._holdings(r).matched(hashes), -loads[r], -self.last.get(r, -1)))
                if self._holdings(best).matched(hashes) >= MATCH_SHARE * len(hashes):
                    over = loads[best] - loads[least] > self.imbalance
                    rid, reason = (least, "imbalance") if over else (best, "prefix")
                else:  # new text: the least loaded, and among them the one that caches least
                    idle = [r for r in ids if loads[r] == loads[least]]
                    fewest = min(len(self._holdings(r).blocks) for r in idle)
                    rid = self.rng.choice([r for r in idle if len(self._holdings(r).blocks) == fewest])
                    reason = "least-cached" if len(idle) > 1 else "least-loaded"
        self.record(key, rid, hashes)
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        return rid, reason

    def record(self, key: Sequence[Hashable], rid: Hashable, hashes: list[int] | None = None) -> None:
        """`rid` now holds `key`'s blocks (it was sent the prompt)."""
        self.decisions += 1
        self.last[rid] = self.decisions
        if self.kind == "prefix":
            self._holdings(rid).add(chain(key, self.block) if hashes is None else hashes)

    def matched(self, key: Sequence[Hashable], rid: Hashable) -> int:
        """Items of `key` the router believes `rid` holds (whole blocks)."""
        return self._holdings(rid).matched(chain(key, self.block)) * self.block

    def forget(self, rid: Hashable) -> None:
        """A replica is gone (died, replaced): what it held went with it."""
        self.held.pop(rid, None)
        self.last.pop(rid, None)

    def _holdings(self, rid: Hashable) -> Holdings:
        h = self.held.get(rid)
        if h is None:
            h = self.held[rid] = Holdings(self.capacity)
        return h
