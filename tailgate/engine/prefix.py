"""The prefix cache (TAILGATE_PREFIX_CACHE=K) as hashed blocks: every full 16-token KV page a
prompt writes is registered under a key chained from its parent's, so the next prompt that starts
the same way walks its own tokens block by block through one dict and resumes after the last hit.

Plain bookkeeping over `KVBook` pages, no tensors (docs/prefix-cache.md has the whole story):

- A *block* is one full, written page of a sequence: its global page, its sliding page while one
  is kept, and its key `(parent block id, its 16 tokens, owner)`. The key is compared exactly (the
  dict hashes it), so no hash collision can hand one prompt another's KV; the parent's id chains
  it to everything before it. `owner` is None for prompt tokens and the request id for a block
  that holds any of its output: a preempted request's output is its own (decode-written KV, which
  a cold prefill of the same text would compute in another order), re-hit only by its recompute.
- Pages are refcounted by `PagePool`; the cache holds no references. A registered page whose last
  holder lets go is *idle*: still available to any allocation, which evicts idle pages only when
  the free list is empty, least recently released first (lazy LRU, evict only what helps).
- K bounds the *entries*, the chains the cache promises to remember: a prompt's full pages when
  its prefill is done, and a preempted request's written pages (prompt and output) so its
  recompute re-hits them. A block in no entry stays registered only while some request holds its
  page. Past K entries the least recently made or hit goes.
- Sliding-window layers: a running request releases its sliding pages as the window passes them,
  as without the cache; a registered one goes idle instead of free (pinned by nobody). A hit of n
  blocks is usable only if the sliding pages of the last window before block n are all still
  there (the first resumed query reads them), so `lookup` shortens the hit to the longest such n.
  The layers above a sliding layer read its output, so the window's local KV cannot be recomputed
  without the global layers' for the same positions: a shorter hit is the only exact fallback.
"""

from __future__ import annotations

from collections import OrderedDict

from .pages import PAGE_SIZE, KVBook, SeqPages


class Block:
    __slots__ = ("id", "key", "glob", "local", "uses")

    def __init__(self, id: int, key: tuple, glob: int):
        self.id, self.key, self.glob = id, key, glob
        self.local = 0  # its sliding page, 0 when none is kept
        self.uses = 0  # entries whose chain holds it


class PrefixCache:
    def __init__(self, capacity: int, book: KVBook):
        self.capacity = capacity
        self.book = book
        self._by_key: dict[tuple, Block] = {}
        self._by_id: dict[int, Block] = {}
        self._by_glob: dict[int, Block] = {}
        self._by_local: dict[int, Block] = {}
        self.entries: OrderedDict[int, tuple[int, ...]] = OrderedDict()  # leaf id -> chain; oldest first
        self._own: dict[str, int] = {}  # a preempted request's entry (its leaf), until its recompute is done
        self._next = 1  # block ids; 0 is the root every chain hangs from
        self.recompute_hits = 0  # tokens a recompute after preemption found cached
        self._recompute_hit: dict[str, int] = {}  # the latest attach's, until its prefill is done
        book.glob.on_evict, book.glob.on_idle = self._glob_evicted, self._glob_idle
        if book.local is not None:
            book.local.on_evict = self._local_evicted

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def blocks(self) -> int:
        return len(self._by_id)

    @property
    def pages(self) -> int:
        """Pages registered (both pools), held or idle."""
        return len(self._by_glob) + len(self._by_local)

    # ---- lookup ---------------------------------------------------------------------------
    @staticmethod
    def _key(parent: int, tokens: list[int], i: int, prompt_len: int, owner: str | None) -> tuple:
        lo = i * PAGE_SIZE
        return parent, tuple(tokens[lo : lo + PAGE_SIZE]), owner if lo + PAGE_SIZE > prompt_len else None

    def _first_seen(self, n: int) -> int:
        """The oldest page a query at position 16n reads on the sliding layers."""
        return max(0, (n * PAGE_SIZE - self.book.window + 1) // PAGE_SIZE)

    def lookup(self, tokens: list[int], prompt_len: int | None = None, owner: str | None = None) -> list[Block]:
        """The blocks of the longest usable cached prefix of `tokens` (the first `prompt_len` are
        prompt, the rest `owner`'s output), leaving at least one token to compute (its logit)."""
        prompt_len = len(tokens) if prompt_len is None else prompt_len
        chain: list[Block] = []
        parent = 0
        for i in range((len(tokens) - 1) // PAGE_SIZE):
            b = self._by_key.get(self._key(parent, tokens, i, prompt_len, owner))
            if b is None:
                break
            chain.append(b)
            parent = b.id
        n = len(chain)
        if self.book.local is not None:
            while n:  # the last window before n must be whole; else try just before the page it lacks
                lo = self._first_seen(n)
                miss = next((i for i in range(n - 1, lo - 1, -1) if not chain[i].local), None)
                if miss is None:
                    break
                n = miss
        return chain[:n]

    def attach(self, tokens: list[int], prompt_len: int, owner: str | None, seq: SeqPages) -> int:
        """Start `seq` (empty) with shared references to the longest usable cached prefix's pages;
        returns the tokens it covers (0 on a miss)."""
        chain = self.lookup(tokens, prompt_len, owner)
        n = len(chain)
        if not n:
            return 0
        seq.global_pages = [b.glob for b in chain]
        self.book.glob.share(seq.global_pages)
        if self.book.local is not None:
            lo = self._first_seen(n)
            seq.local_pages = [0] * lo + [b.local for b in chain[lo:]]
            self.book.local.share(seq.local_pages)
            seq.released = lo
        seq.blocks = [b.id for b in chain]
        seq.frontier = seq.reserved = n * PAGE_SIZE
        if len(tokens) > prompt_len:  # counted once its prefill is done (a requeued walker attaches again)
            self._recompute_hit[owner] = n * PAGE_SIZE
        elif chain[-1].id in self.entries:
            self.entries.move_to_end(chain[-1].id)
        return n * PAGE_SIZE

    # ---- registration -----------------------------------------------------------------------
    def written(self, tokens: list[int], prompt_len: int, owner: str, seq: SeqPages, prefilled: bool) -> None:
        """A walk chunk or a whole prompt is written: register its full pages (before the sliding
        window releases any, so those go idle, not free). With `prefilled`, the prompt's full
        pages become an entry, and a recompute's own entry is done with (its pages are its again)."""
        self._register(tokens, prompt_len, owner, seq)
        if prefilled:
            self._remember(seq.blocks[: min(prompt_len, seq.frontier) // PAGE_SIZE])
            self.recompute_hits += self._recompute_hit.pop(owner, 0)
            leaf = self._own.pop(owner, None)
            if leaf is not None:
                self._forget(leaf)

    def keep(self, tokens: list[int], prompt_len: int, owner: str, seq: SeqPages) -> None:
        """A request is preempted: its written full pages, prompt and output, become its own entry
        for the recompute to re-hit (they go idle when its references go back)."""
        self._register(tokens, prompt_len, owner, seq)
        if not seq.blocks:
            return
        leaf = self._remember(seq.blocks)
        old = self._own.pop(owner, None)
        if old is not None and old != leaf:
            self._forget(old)
        if leaf is not None and len(seq.blocks) * PAGE_SIZE > prompt_len:
            self._own[owner] = leaf
            if len(self._own) > 2 * self.capacity:  # requests cancelled before their recompute
                self._own = {o: x for o, x in self._own.items() if x in self.entries}
                self._recompute_hit = {o: x for o, x in self._recompute_hit.items() if o in self._own}

    def _register(self, tokens: list[int], prompt_len: int, owner: str, seq: SeqPages) -> None:
        ids = seq.blocks
        local = self.book.local
        for i in range(len(ids), min(len(tokens), seq.frontier) // PAGE_SIZE):
            key = self._key(ids[-1] if ids else 0, tokens, i, prompt_len, owner)
            b = self._by_key.get(key)
            if b is None:  # a new block: this sequence's own page
                b = Block(self._next, key, seq.global_pages[i])
                self._next += 1
                self._by_key[key] = self._by_id[b.id] = self._by_glob[b.glob] = b
                self.book.glob.tag(b.glob)
            # else the same tokens were cached by another request meanwhile: this sequence's copy
            # stays its own, except a sliding page the block lacks (a fresher window for resumes)
            if local is not None and not b.local and seq.local_pages[i] and seq.local_pages[i] not in self._by_local:
                b.local = seq.local_pages[i]
                self._by_local[b.local] = b
                local.tag(b.local)
            ids.append(b.id)

    def _remember(self, chain: list[int]) -> int | None:
        """Make a chain (its live leading blocks) the newest entry; its leaf id, None if empty."""
        live = []
        for i in chain:
            if i not in self._by_id:  # evicted since: what hangs below it is unreachable
                break
            live.append(i)
        if not live:
            return None
        leaf = live[-1]
        if leaf in self.entries:
            self.entries.move_to_end(leaf)
            return leaf
        self.entries[leaf] = tuple(live)
        for i in live:
            self._by_id[i].uses += 1
        while len(self.entries) > self.capacity:
            self._forget(next(iter(self.entries)))
        return leaf

    def _forget(self, leaf: int) -> None:
        for i in self.entries.pop(leaf, ()):
            b = self._by_id.get(i)
            if b is not None:
                b.uses -= 1
                if not b.uses and not self.book.glob.holders(b.glob):
                    self._drop(b)

    def _drop(self, b: Block) -> None:
        self._unlink(b)
        self.book.glob.untag(b.glob)

    def _unlink(self, b: Block) -> None:
        del self._by_key[b.key], self._by_id[b.id], self._by_glob[b.glob]
        if b.local:
            del self._by_local[b.local]
            self.book.local.untag(b.local)
            b.local = 0

    # ---- the pools' hooks ---------------------------------------------------------------------
    def _glob_evicted(self, page: int) -> None:
        """An allocation took an idle registered page: the block is gone (its children, still
        registered, are unreachable and go idle-first in their turn)."""
        self._unlink(self._by_glob[page])

    def _glob_idle(self, page: int) -> None:
        b = self._by_glob.get(page)
        if b is not None and not b.uses:  # in no entry: it was kept only for its holders
            self._drop(b)

    def _local_evicted(self, page: int) -> None:
        self._by_local.pop(page).local = 0

    def clear(self) -> None:
        """Forget every entry; blocks whose pages requests still hold go when those let go."""
        self._own.clear()
        while self.entries:
            self._forget(next(iter(self.entries)))

    def audit(self) -> list[str]:
        """What disagrees with the cache's invariants (for tests; O(pages)): every registered page
        tagged in its pool, each entry's live blocks counted once in their `uses`, and a block in
        no entry held by some request."""
        out = []
        uses: dict[int, int] = {}
        for chain in self.entries.values():
            for i in chain:
                uses[i] = uses.get(i, 0) + 1
        glob, local = self.book.glob, self.book.local
        for b in self._by_id.values():
            if self._by_key.get(b.key) is not b or self._by_glob.get(b.glob) is not b:
                out.append(f"block {b.id} is not indexed by its key and page")
            if not glob._tagged[b.glob]:
                out.append(f"block {b.id}'s global page {b.glob} is not tagged")
            if b.local and (self._by_local.get(b.local) is not b or not local._tagged[b.local]):
                out.append(f"block {b.id}'s sliding page {b.local} is not indexed or tagged")
            if b.uses != uses.get(b.id, 0):
                out.append(f"block {b.id} counts {b.uses} entries, {uses.get(b.id, 0)} hold it")
            if not b.uses and not glob.holders(b.glob):
                out.append(f"block {b.id} is in no entry and nobody holds its page {b.glob}")
        tagged = sum(glob._tagged) + (sum(local._tagged) if local else 0)
        if tagged != self.pages:
            out.append(f"{tagged} pages tagged, {self.pages} registered")
        return out
