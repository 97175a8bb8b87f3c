"""KV page accounting: two pools (sliding-window layers, global layers), 16-token pages.

Pure bookkeeping: the pools hand out page ids; the runner owns the tensors those ids index.
Page 0 of each pool is the padding page: never handed out, it is what padded rows read.

A page is held (a reference count above zero: running requests share a cached prefix's pages),
idle (nobody holds it but the prefix cache has it registered: its KV is still good for a later
prompt that starts the same way) or free. Idle pages count as available: `take` hands out free
pages first and only then evicts idle ones, least recently released first, telling the cache
(`on_evict`), so a cached page is lost only to an allocation that needs it (engine/prefix.py).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

PAGE_SIZE = 16


def pages_for(tokens: int) -> int:
    return -(-tokens // PAGE_SIZE)


class PagePool:
    """Page ids with reference counts, a free list and an LRU of idle cached pages."""

    def __init__(self, num_pages: int, name: str):
        if num_pages < 2:
            raise ValueError(f"{name} pool needs at least 2 pages (one is padding), got {num_pages}")
        self.name = name
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, 0, -1))
        self._refs = [0] * num_pages
        self._tagged = [False] * num_pages  # registered by the prefix cache
        self._idle: OrderedDict[int, None] = OrderedDict()  # tagged, unheld; least recently released first
        # The prefix cache's hooks: a tagged page evicted by `take` (its KV is about to be
        # overwritten), and a tagged page whose last holder let go (`give`).
        self.on_evict: Callable[[int], None] | None = None
        self.on_idle: Callable[[int], None] | None = None

    @property
    def capacity(self) -> int:
        return self.num_pages - 1

    @property
    def available(self) -> int:
        """Pages a `take` can hand out: free ones and idle cached ones (evicted on the way)."""
        return len(self._free) + len(self._idle)

    @property
    def used(self) -> int:
        """Pages some request holds."""
        return self.capacity - self.available

    @property
    def idle(self) -> int:
        """Idle cached pages: held by nobody, kept for the prefix cache until an allocation needs them."""
        return len(self._idle)

    def take(self, n: int) -> list[int] | None:
        if n > self.available:
            return None
        if n == 0:
            return []
        k = min(n, len(self._free))
        taken = self._free[len(self._free) - k :][::-1]
        del self._free[len(self._free) - k :]
        while len(taken) < n:  # lazy eviction: only as many idle pages as this allocation lacks
            p, _ = self._idle.popitem(last=False)
            self._tagged[p] = False
            self.on_evict(p)
            taken.append(p)
        for p in taken:
            self._refs[p] = 1
        return taken

    def share(self, pages) -> None:
        """One more holder for each page: a held page, or an idle cached one (which leaves the LRU)."""
        for p in pages:
            if p:
                if self._refs[p] < 1:
                    if p not in self._idle:
                        raise RuntimeError(f"{self.name} page {p} shared while free")
                    del self._idle[p]
                self._refs[p] += 1

    def give(self, pages, stale: bool = False) -> None:
        """One holder fewer for each page; a page nobody holds is idle if cached, free otherwise.
        A `stale` idle page goes to the eviction end of the LRU instead of the kept end."""
        for p in pages:
            if p:
                if self._refs[p] < 1:
                    raise RuntimeError(f"{self.name} page {p} given back twice")
                self._refs[p] -= 1
                if self._refs[p] == 0:
                    if self._tagged[p]:
                        self._idle[p] = None
                        if stale:
                            self._idle.move_to_end(p, last=False)
                        if self.on_idle is not None:
                            self.on_idle(p)
                    else:
                        self._free.append(p)

    def holders(self, p: int) -> int:
        return self._refs[p]

    def tag(self, p: int) -> None:
        """Register a held page with the prefix cache: when its holders let go it stays idle."""
        if self._refs[p] < 1:
            raise RuntimeError(f"{self.name} page {p} tagged while not held")
        self._tagged[p] = True

    def untag(self, p: int) -> None:
        """The cache forgets a page: idle, it is free at once; held, it is free when its holders let go."""
        if not self._tagged[p]:
            return
        self._tagged[p] = False
        if p in self._idle:
            del self._idle[p]
            self._free.append(p)


class SeqPages:
    """One sequence's page tables.

    `global_pages[i]` holds tokens 16i..16i+15 for global layers. `local_pages[i]` is the same for
    sliding layers, or 0 once released (older than the window: no future query can see it).
    `frontier` counts tokens whose KV has been written; `reserved` counts tokens with pages.
    `blocks[i]` is the prefix cache's id of page i's block (engine/prefix.py), for its leading
    registered pages.
    """

    __slots__ = ("global_pages", "local_pages", "frontier", "reserved", "released", "blocks")

    def __init__(self):
        self.global_pages: list[int] = []
        self.local_pages: list[int] = []
        self.frontier = 0
        self.reserved = 0
        self.released = 0  # local pages released from the front
        self.blocks: list[int] = []


class KVBook:
    """Both pools plus the rules that tie them: atomic reservation and sliding release."""

    def __init__(self, global_pages: int, local_pages: int | None, window: int | None):
        self.glob = PagePool(global_pages, "global")
        self.local = PagePool(local_pages, "sliding") if local_pages else None
        self.window = window

    def reserve(self, seq: SeqPages, total_tokens: int) -> bool:
        """Make room for KV up to `total_tokens` in both pools, or change nothing. Both pools are
        checked before either takes: a take may evict idle cached pages, which must not be lost
        to a reservation the other pool then refuses."""
        if total_tokens <= seq.reserved:
            return True
        if not self.fits(seq, total_tokens):
            return False
        need_g = pages_for(total_tokens) - len(seq.global_pages)
        need_l = pages_for(total_tokens) - len(seq.local_pages) if self.local else 0
        got_g = self.glob.take(need_g)
        got_l = self.local.take(need_l) if self.local else []
        seq.global_pages.extend(got_g)
        if self.local:
            seq.local_pages.extend(got_l)
        # What the held pages can take, not just what was asked: a decode row then finds its next
        # 15 tokens already covered and skips the pools (~1 call in 16 reaches them).
        seq.reserved = pages_for(total_tokens) * PAGE_SIZE
        return True

    def fits(self, seq: SeqPages, total_tokens: int) -> bool:
        """Whether both pools could make room for `seq` up to `total_tokens` now (idle cached
        pages count: a take evicts them)."""
        need = pages_for(total_tokens)
        return need - len(seq.global_pages) <= self.glob.available and (
            self.local is None or need - len(seq.local_pages) <= self.local.available
        )

    def advance(self, seq: SeqPages, tokens: int, release: bool = True) -> None:
        """Record `tokens` more written KV; release sliding pages no future query can see (unless
        `release` is False: the prefix cache registers the pages just written first, so a released
        sliding page it registered stays idle for a later resume instead of going free)."""
        seq.frontier += tokens
        if seq.frontier > seq.reserved:
            raise RuntimeError(f"KV frontier {seq.frontier} passed its reservation {seq.reserved}")
        if not release or not self.local or self.window is None:
            return
        # Page p's last token is 16p+15; a query at q >= frontier sees keys > q - window.
        while (seq.released + 1) * PAGE_SIZE + self.window <= seq.frontier:
            p = seq.released
            # Stale: a page the window passed serves only a resume inside this sequence (a shared
            # system prompt's); the last window, given back at `free`, serves a resume at its end,
            # so under pressure passed pages go first and more prompts keep a usable last window.
            self.local.give([seq.local_pages[p]], stale=True)
            seq.local_pages[p] = 0
            seq.released += 1

    def free(self, seq: SeqPages) -> None:
        # Global pages go back last page first, so among a request's idle cached pages its tail
        # is evicted before its head (a prefix's head is what other prompts share, as vLLM
        # frees); sliding pages go first page first: a resume needs the *last* window's.
        self.glob.give(reversed(seq.global_pages))
        if self.local:
            self.local.give(seq.local_pages)
        seq.global_pages, seq.local_pages, seq.blocks = [], [], []
        seq.reserved = seq.frontier = seq.released = 0

    def usage(self) -> float:
        pools = [self.glob] + ([self.local] if self.local else [])
        return sum(p.used for p in pools) / max(1, sum(p.capacity for p in pools))


def pool_bytes(pages: dict[str, int], token_bytes: dict[str, int]) -> int:
    """Bytes the pools take: pages x 16 tokens x K+V bytes per token, summed over the families."""
    return sum(n * PAGE_SIZE * token_bytes.get(fam, 0) for fam, n in pages.items())


def budget_pool_pages(
    budget_bytes: int,
    token_bytes: dict[str, int],
    max_context: int,
    slots: int,
    window: int | None,
    transient_prompts: int = 1,
) -> dict[str, int]:
    """Pages per pool from a memory budget: the sliding pool keeps its bounded size (a window per
    slot plus the prefill transients); the global pool gets what is left, and must hold at least
    one full-context request. `token_bytes[fam]` = K+V bytes of one token across that family's layers."""
    out = pool_pages(max_context, slots, window, transient_prompts)
    left = budget_bytes - pool_bytes({"local": out.get("local", 0)}, token_bytes)
    out["global"] = max(0, left // (PAGE_SIZE * token_bytes["global"])) + 1
    need = pages_for(max_context) + 1
    if out["global"] < need:
        # The least budget that passes: the pages one request fills (the padding page is the +1
        # above, outside the budget) after the sliding pool's share.
        mib = -(-((need - 1) * PAGE_SIZE * token_bytes["global"] + budget_bytes - left) // (1 << 20))
        raise ValueError(
            f"TAILGATE_KV_CACHE_MB={budget_bytes >> 20} cannot hold one {max_context}-token request "
            f"(needs at least {mib} MiB with this model, MAX_CONTEXT and DECODE_SLOTS)"
        )
    return out


def pool_pages(max_context: int, slots: int, window: int | None, transient_prompts: int = 1) -> dict[str, int]:
    """Pages per pool: every slot may hold a full context in the global pool; the sliding pool
    holds a window per slot plus full-prompt transients for `transient_prompts` prompts being
    prefilled whole (their pages past the window are released after the step). +1 = padding page."""
    ctx = pages_for(max_context)
    out = {"global": slots * ctx + 1}
    if window is not None:
        win = pages_for(window) + 1
        out["local"] = slots * win + transient_prompts * ctx + 1
    return out
