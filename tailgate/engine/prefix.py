"""The prefix cache (TAILGATE_PREFIX_CACHE=K): prefilled prompts' KV pages, kept for the next
prompt that starts the same way.

Plain bookkeeping over `KVBook` pages, no tensors: when a prompt's prefill completes, the cache
takes shared references to its *full* pages (not the partial last page, which the request goes on
writing; an entry holds prompt KV only, computed by prefill, so a warm resume sees the numbers a
cold prefill would). Requests running at the same time can reuse it at once. A new prompt resumes at its longest cached prefix in whole pages, leaving at least one
token to compute (its first sampled token needs a logit): its page tables start with shared
references to the entry's pages (`PagePool` counts references; a page returns to the free list
when its last holder lets go) and it walks only its suffix. The pages a prompt writes are always
its own, so shared pages are never written.

Sliding-window layers: with the cache on, a prompt's sliding pages are not released until its
prefill is done (the pools size for whole prompts in flight), so an entry holds them all and a
resume anywhere inside it finds what its window needs; the request then releases its own
references as usual. `lookup` still checks that every sliding page a resume's first query can see
(keys > q - window) is held, for entries made otherwise.

LRU: an entry used or added becomes the newest; past K entries the oldest goes; under page
pressure (`KVBook.reserve` failing) entries are evicted oldest first before the scheduler
requeues a prompt or preempts a live row.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .pages import PAGE_SIZE, KVBook, SeqPages


@dataclass(eq=False)
class Entry:
    key: int  # its place in the LRU order
    tokens: list[int]  # the prompt tokens its pages hold: a whole number of pages
    global_pages: list[int]
    local_pages: list[int]  # 0 where the sliding pool had released the page; empty without sliding layers


class PrefixCache:
    def __init__(self, capacity: int, book: KVBook):
        self.capacity = capacity
        self.book = book
        self.entries: OrderedDict[int, Entry] = OrderedDict()  # oldest first
        self._next = 0

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, prompt: list[int], pages: SeqPages) -> None:
        """Share a prompt's full pages the moment its prefill is done (the request keeps its own
        references and goes on decoding; its later tokens land on pages the entry does not hold)."""
        n = min(len(prompt), pages.frontier) // PAGE_SIZE
        if n == 0:
            return
        held = list(pages.global_pages[:n])
        local = list(pages.local_pages[:n]) if self.book.local else []
        self.book.glob.share(held)
        if self.book.local:
            self.book.local.share(local)
        dup = next((k for k, e in self.entries.items() if e.tokens == prompt[:n * PAGE_SIZE]), None)
        if dup is not None:  # the same prompt again: keep one entry (the newer pages), fresh in LRU
            self._drop(dup)
        self.entries[self._next] = Entry(self._next, prompt[:n * PAGE_SIZE], held, local)
        self._next += 1
        while len(self.entries) > self.capacity:
            self.evict_one()

    def lookup(self, tokens: list[int]) -> tuple[Entry | None, int]:
        """(entry, cached tokens) for the longest usable cached prefix of `tokens`; (None, 0)."""
        limit = (len(tokens) - 1) // PAGE_SIZE  # at least one token left to compute
        best: tuple[Entry | None, int] = (None, 0)
        for e in self.entries.values():
            p, top = 0, min(limit, len(e.global_pages))
            while p < top and e.tokens[p * PAGE_SIZE:(p + 1) * PAGE_SIZE] == tokens[p * PAGE_SIZE:(p + 1) * PAGE_SIZE]:
                p += 1
            if p * PAGE_SIZE > best[1] and self._window_held(e, p):
                best = (e, p * PAGE_SIZE)
        return best

    def _window_held(self, e: Entry, p: int) -> bool:
        """Whether a resume after p pages finds every sliding page its queries can see."""
        window = self.book.window
        if not e.local_pages or window is None:
            return True
        first = max(0, (p * PAGE_SIZE - window + 1) // PAGE_SIZE)  # the oldest page the first query sees
        return all(e.local_pages[i] for i in range(first, p))

    def attach(self, e: Entry, cached: int, seq: SeqPages) -> None:
        """Start `seq` (empty) with shared references to the entry's first `cached` tokens' pages."""
        n = cached // PAGE_SIZE
        seq.global_pages = list(e.global_pages[:n])
        self.book.glob.share(seq.global_pages)
        if self.book.local and e.local_pages:
            seq.local_pages = list(e.local_pages[:n])
            self.book.local.share(seq.local_pages)
            seq.released = next((i for i, pg in enumerate(seq.local_pages) if pg), n)
        seq.frontier = seq.reserved = cached
        self.entries.move_to_end(e.key)

    def evict_one(self) -> bool:
        """Drop the least recently used entry; False when there is none."""
        if not self.entries:
            return False
        self._drop(next(iter(self.entries)))
        return True

    def _drop(self, key: int) -> None:
        e = self.entries.pop(key)
        self.book.glob.give(e.global_pages)
        if self.book.local:
            self.book.local.give(e.local_pages)

    def clear(self) -> None:
        while self.evict_one():
            pass

    @property
    def pages(self) -> int:
        """Pages the entries hold (shared ones counted once per entry)."""
        return sum(len(e.global_pages) + sum(1 for p in e.local_pages if p) for e in self.entries.values())
