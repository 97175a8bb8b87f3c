"""The prefix cache as plain data: page sharing, LRU, eviction under pressure, the sliding window.
(Token-exactness on the real model: tests/test_engine_gates.py.)"""
from __future__ import annotations

import pytest

from tailgate.config import ServingConfig
from tailgate.engine.pages import KVBook, SeqPages
from tailgate.engine.prefix import PrefixCache
from tailgate.engine.request import Finished, Rejected, Request, Scheduled
from test_scheduler import FakeExecutor
from tailgate.engine.scheduler import Scheduler


def make(k=4, slots=4, global_pages=None, chunk=None):
    cfg = ServingConfig(max_context=256, decode_slots=slots, mix_chunk_tokens=chunk, prefix_cache=k)
    book = KVBook(global_pages or slots * 16 + 1, None, None)
    ex = FakeExecutor()
    return Scheduler(ex, book, cfg, 1000, clock=lambda: 0.0), ex


def prompt(n, salt=0):
    return [1 + (i * 7 + salt) % 900 for i in range(n)]


def run(s, *reqs):
    for r in reqs:
        s.submit(r)
    events = []
    while s.has_work():
        events += s.step(0.0)
    return events


def cached(events, r):
    return next(e.cached_tokens for e in events if isinstance(e, Scheduled) and e.request_id == r.id)


def test_a_resumed_prompt_shares_whole_pages_and_walks_only_its_suffix():
    s, ex = make()
    base = prompt(40)
    run(s, Request(base, 3))  # its 2 full prompt pages (32 tokens) stay cached after it finishes
    assert len(s.prefix) == 1 and s.book.glob.used == 2
    r = Request(base + prompt(10, salt=3), 3)
    ev = run(s, r)
    assert cached(ev, r) == 32 and s.metrics.prefix_hits == 32 and s.metrics.prefix_queries == 40 + 50
    assert ex.segments[-3][0] == (18, 32, True)  # one segment: the 18 suffix rows from position 32


def test_at_least_one_prompt_token_is_always_computed():
    s, _ = make()
    base = prompt(32)
    run(s, Request(base, 2))
    r = Request(list(base), 2)  # the same 32 tokens: the whole prompt is cached, but its logit is not
    assert cached(run(s, r), r) == 16


def test_a_token_changed_in_the_middle_stops_the_match_at_its_page():
    s, _ = make()
    base = prompt(64)
    run(s, Request(base, 2))
    changed = list(base)
    changed[40] += 1  # page 2 (tokens 32..47) differs
    r = Request(changed + [5], 2)
    assert cached(run(s, r), r) == 32


def test_a_shared_prefix_past_the_window_resumes_inside_an_entry_with_its_sliding_pages():
    # Window 64 on the sliding layers: a plain request would have released pages 0..3 of its
    # 136-token prompt during prefill; with the cache on they stay until the entry has them.
    cfg = ServingConfig(max_context=256, decode_slots=4, mix_chunk_tokens=64, prefix_cache=4)
    book = KVBook(4 * 16 + 1, 4 * 16 + 1, 64)
    s = Scheduler(FakeExecutor(), book, cfg, 1000, clock=lambda: 0.0)
    shared = prompt(96)
    run(s, Request(shared + prompt(40, 1), 2))
    r = Request(shared + prompt(40, 2), 2)
    assert cached(run(s, r), r) == 96
    s.prefix.clear()
    assert book.glob.used == 0 and book.local.used == 0


def test_the_cache_forgets_its_least_recently_used_prompt_first():
    s, _ = make(k=2)
    a, b, c = prompt(32, 1), prompt(32, 2), prompt(32, 3)
    run(s, Request(a, 2), Request(b, 2))
    r = Request(a + [9], 2)
    assert cached(run(s, r), r) == 32  # a is now the most recent
    run(s, Request(c, 2))  # a third entry: b, the least recently used, goes
    ra, rb = Request(a + [9], 2), Request(b + [9], 2)
    assert cached(run(s, ra), ra) == 32
    assert cached(run(s, rb), rb) == 0


def test_cached_prefixes_are_evicted_before_a_prompt_is_requeued_or_rejected():
    s, _ = make(k=8, slots=2, global_pages=9)  # 8 usable pages
    for salt in range(3):
        run(s, Request(prompt(32, salt), 2))  # 3 entries x 2 pages = 6 pages held
    assert s.book.glob.used == 6
    r = Request(prompt(90, 9), 2)  # needs 6 pages with 2 free: the two oldest entries must go
    ev = run(s, r)
    assert not any(isinstance(e, Rejected) for e in ev) and any(isinstance(e, Finished) for e in ev)
    assert len(s.prefix) == 2 and s.metrics.preemptions == 0  # the newest old entry + r's own
    survivor = Request(prompt(32, 2) + [9], 2)
    assert cached(run(s, survivor), survivor) == 32


def test_no_page_leaks_after_a_mixed_workload():
    s, _ = make(k=3, slots=3, chunk=64)
    base = prompt(80)
    reqs = [Request(base + prompt(n, n), m) for n, m in ((5, 3), (30, 7), (0, 2), (70, 4))]
    reqs += [Request(prompt(50, 4), 5), Request(base[:40], 3), Request(prompt(17, 8), 1)]
    for r in reqs:
        run(s, r)
    mixed = [Request(base + prompt(9, i), 4) for i in range(5)]
    run(s, *mixed)
    s.prefix.clear()
    assert s.book.glob.used == 0


def test_a_page_is_free_only_when_its_last_holder_gives_it_back():
    book = KVBook(8, None, None)
    seq = SeqPages()
    assert book.reserve(seq, 32)
    pages = list(seq.global_pages)
    book.glob.share(pages)
    book.free(seq)
    assert book.glob.used == 2  # still held by the second holder
    book.glob.give(pages)
    assert book.glob.used == 0
    with pytest.raises(RuntimeError, match="given back twice"):
        book.glob.give(pages[:1])


@pytest.mark.parametrize("frontier,resume_pages,held", [
    (60, 3, True),    # nothing released yet (a page goes once (p + 1) * 16 + 64 <= frontier)
    (200, 8, False),  # pages 0..7 released; a resume at 128 needs pages from (128 - 63) // 16 = 4 on
    (200, 12, True),  # a resume at 192 needs pages from (192 - 63) // 16 = 8 on: held
])
def test_a_prefix_resumes_only_if_the_sliding_pages_its_queries_see_are_held(frontier, resume_pages, held):
    book = KVBook(40, 40, 64)
    cache = PrefixCache(4, book)
    seq = SeqPages()
    assert book.reserve(seq, frontier)
    book.advance(seq, frontier)
    toks = prompt(frontier)
    cache.add(toks, seq)
    book.free(seq)  # the request ends; the entry keeps its references
    e = next(iter(cache.entries.values()))
    assert cache._window_held(e, resume_pages) is held
    got, n = cache.lookup(toks[:resume_pages * 16] + [1])
    assert (n == resume_pages * 16) is held


def test_a_prompt_rejected_as_too_big_gives_back_the_cached_pages_it_attached():
    s, _ = make(k=4, slots=2, global_pages=9)  # 8 usable pages, the walk off
    a = prompt(32, 1)
    run(s, Request(a, 2))  # cached: 2 pages held by the entry
    big = Request(a + prompt(120, 5), 2)  # starts at a's pages, needs 10 in all: never fits
    ev = run(s, big)
    assert any(isinstance(e, Rejected) for e in ev)
    s.prefix.clear()
    assert s.book.glob.used == 0  # the two attached references went back with the rejection
