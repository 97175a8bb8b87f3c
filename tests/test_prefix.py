"""The prefix cache as hashed blocks, as plain data: chained block keys, page sharing, lazy LRU
eviction, entries (K), the sliding window, recompute after preemption. (Token-exactness on the
real model: tests/test_engine_gates.py; under random schedules: tests/test_scheduler_random.py.)"""

from __future__ import annotations

import pytest

from tailgate.config import ServingConfig
from tailgate.engine.pages import KVBook, SeqPages
from tailgate.engine.prefix import PrefixCache
from tailgate.engine.request import Finished, Rejected, Request, Scheduled
from test_scheduler import FakeExecutor
from tailgate.engine.scheduler import Scheduler


def make(k=4, slots=4, global_pages=None, chunk=None, local_pages=None, window=None):
    cfg = ServingConfig(max_context=256, decode_slots=slots, mix_chunk_tokens=chunk, prefix_cache=k)
    book = KVBook(global_pages or slots * 16 + 1, local_pages, window)
    return Scheduler(FakeExecutor(), book, cfg, 1000, clock=lambda: 0.0)


def prompt(n, salt=0):
    return [1 + (i * 7 + salt) % 900 for i in range(n)]


def run(s, *reqs, plans=None):
    """Submit `reqs` and step to the end; its events (and each step's plan onto `plans`)."""
    for r in reqs:
        s.submit(r)
    events = []
    while s.has_work():
        events += s.step(0.0)
        if plans is not None:
            plans.append(s.last_plan)
    return events


def cached(events, r):
    return next(e.cached_tokens for e in events if isinstance(e, Scheduled) and e.request_id == r.id)


def prefill(book, cache, toks, owner="a", prompt_len=None):
    """A sequence writes `toks` whole, the cache registers it, the sequence ends."""
    seq = SeqPages()
    assert book.reserve(seq, len(toks))
    book.advance(seq, len(toks), release=False)
    cache.written(toks, len(toks) if prompt_len is None else prompt_len, owner, seq, True)
    book.advance(seq, 0)
    book.free(seq)


def hit(cache, toks, **kw):
    return 16 * len(cache.lookup(toks, **kw))


def test_a_resumed_prompt_shares_whole_pages_and_walks_only_its_suffix():
    s = make()
    base = prompt(40)
    run(s, Request(base, 3))  # its 2 full prompt pages (32 tokens) stay cached, idle, after it finishes
    assert len(s.prefix) == 1 and s.book.glob.used == 0 and s.book.glob.idle == 2
    r = Request(base + prompt(10, salt=3), 3)
    plans = []
    ev = run(s, r, plans=plans)
    assert cached(ev, r) == 32 and s.metrics.prefix_hits == 32 and s.metrics.prefix_queries == 40 + 50
    # one chunk: the 18 suffix rows from position 32, sampled
    assert [(c, seg.start, seg.sample) for p in plans for c, seg in zip(p.chunks, p.segments)] == [((r, 18), 32, True)]


def test_at_least_one_prompt_token_is_always_computed():
    s = make()
    base = prompt(32)
    run(s, Request(base, 2))
    r = Request(list(base), 2)  # the same 32 tokens: the whole prompt is cached, but its logit is not
    assert cached(run(s, r), r) == 16


def test_a_token_changed_in_the_middle_stops_the_match_at_its_page():
    s = make()
    base = prompt(64)
    run(s, Request(base, 2))
    changed = list(base)
    changed[40] += 1  # page 2 (tokens 32..47) differs
    r = Request(changed + [5], 2)
    assert cached(run(s, r), r) == 32


def test_a_block_matches_only_under_the_same_whole_prefix_not_by_its_own_tokens():
    book = KVBook(20, None, None)
    cache = PrefixCache(4, book)
    a = prompt(32, 1)
    prefill(book, cache, a)
    b = prompt(16, 2) + a[16:]  # page 1 holds a's page-1 tokens, after another page 0
    assert hit(cache, b + [1]) == 0 and hit(cache, a + [1]) == 32


def test_a_cached_page_is_evicted_only_when_an_allocation_needs_it_least_recently_released_first():
    book = KVBook(9, None, None)  # 8 usable pages
    cache = PrefixCache(8, book)
    a, b = prompt(32, 1), prompt(32, 2)
    prefill(book, cache, a)
    prefill(book, cache, b)
    assert book.glob.idle == 4 and book.glob.available == 8
    seq = SeqPages()
    assert book.reserve(seq, 4 * 16)  # the 4 free pages do: nothing cached is touched
    assert hit(cache, a + [1]) == 32 and hit(cache, b + [1]) == 32
    assert book.reserve(seq, 5 * 16)  # one page more: a's last page, the least recently released, goes
    assert hit(cache, a + [1]) == 16 and hit(cache, b + [1]) == 32
    assert cache.blocks == 3
    book.free(seq)


def test_a_reservation_the_pools_refuse_evicts_no_cached_page():
    book = KVBook(9, 5, 64)  # 8 global pages, 4 sliding
    cache = PrefixCache(8, book)
    a = prompt(48, 1)
    prefill(book, cache, a)  # 3 idle pages in each pool
    seq = SeqPages()
    assert not book.reserve(seq, 5 * 16)  # the global pool could, by evicting; the sliding pool cannot
    assert (book.glob.idle, book.local.idle) == (3, 3) and hit(cache, a + [1]) == 48
    assert not book.reserve(seq, 9 * 16)  # more than the global pool holds at all
    assert (book.glob.idle, book.local.idle) == (3, 3) and hit(cache, a + [1]) == 48


def test_the_cache_forgets_its_least_recently_used_prompt_first():
    s = make(k=2)
    a, b, c = prompt(32, 1), prompt(32, 2), prompt(32, 3)
    run(s, Request(a, 2), Request(b, 2))
    r = Request(a + [9], 2)
    assert cached(run(s, r), r) == 32  # a is now the most recent
    run(s, Request(c, 2))  # a third entry: b, the least recently used, goes
    ra, rb = Request(a + [9], 2), Request(b + [9], 2)
    assert cached(run(s, ra), ra) == 32
    assert cached(run(s, rb), rb) == 0
    assert s.book.glob.idle == 2 * 2  # a and c: b's pages went free with its entry


def test_cached_pages_are_taken_before_a_prompt_is_requeued_or_rejected_and_only_as_many_as_it_needs():
    s = make(k=8, slots=2, global_pages=9)  # 8 usable pages
    for salt in range(3):
        run(s, Request(prompt(32, salt), 2))  # 3 entries x 2 pages = 6 idle pages
    assert s.book.glob.idle == 6 and s.book.glob.used == 0
    r = Request(prompt(90, 9), 2)  # needs 6 pages with 2 free: the 4 least recently released go
    ev = run(s, r)
    assert not any(isinstance(e, Rejected) for e in ev) and any(isinstance(e, Finished) for e in ev)
    assert s.metrics.preemptions == 0
    for salt, want in ((2, 32), (0, 0), (1, 0)):
        again = Request(prompt(32, salt) + [9], 2)
        assert cached(run(s, again), again) == want


def test_a_sliding_page_the_window_passed_is_not_pinned_but_stays_idle_for_a_resume():
    # Window 64: the first 136-token prompt releases its sliding pages 0..3 as the walk passes
    # them; registered first, they go idle, not free, and the second prompt resumes at 96.
    s = make(chunk=64, local_pages=4 * 16 + 1, window=64)
    shared = prompt(96)
    run(s, Request(shared + prompt(40, 1), 2))
    assert s.book.local.used == 0 and s.book.local.available == s.book.local.capacity
    r = Request(shared + prompt(40, 2), 2)
    assert cached(run(s, r), r) == 96
    s.prefix.clear()
    assert s.book.glob.idle == 0 and s.book.local.idle == 0


@pytest.mark.parametrize(
    "resume_pages,held",
    [
        (12, True),  # a resume at 192 reads sliding pages (192 - 63) // 16 = 8 on: 8..11 are kept
        (10, False),  # at 160 it reads pages 6..9; 6 and 7 were evicted, and every shorter hit lacks some
        (8, False),  # at 128 it reads pages 4..7: gone
    ],
)
def test_a_prefix_resumes_only_as_far_as_the_sliding_pages_of_its_last_window_are_kept(resume_pages, held):
    book = KVBook(40, 40, 64)
    cache = PrefixCache(4, book)
    toks = prompt(200)  # 12 full pages; the window passes pages 0..7, which go idle first
    prefill(book, cache, toks)
    assert hit(cache, toks[: resume_pages * 16] + [1]) == resume_pages * 16  # every sliding page still idle
    assert book.local.take(book.local.available - 4) is not None  # evicts the 8 passed pages
    assert hit(cache, toks[: resume_pages * 16] + [1]) == (resume_pages * 16 if held else 0)


def test_more_long_prompts_keep_a_usable_last_window_than_their_sliding_pages_would_fill():
    # Window 32, 20 sliding pages; four 128-token prompts write 8 sliding pages each. Pages the
    # window passed are evicted first, so each prompt keeps pages 6-7, all a resume at 128 reads.
    s = make(k=8, local_pages=21, window=32)
    prompts = [prompt(128, salt) for salt in range(4)]
    for p in prompts:
        run(s, Request(p, 1))
    for p in prompts:
        r = Request(p + [9], 1)
        assert cached(run(s, r), r) == 128


def test_a_recompute_after_preemption_rehits_its_own_prompt_and_output_pages():
    s = make(k=4, slots=3, global_pages=11)  # 10 usable pages: two 60-token requests fit, three do not
    rs = [Request(prompt(10, i), max_tokens=50, arrival=1.0 + i) for i in range(3)]
    plans = []
    events = run(s, *rs, plans=plans)
    assert s.metrics.preemptions >= 1 and s.book.glob.used == 0
    for r in rs:
        assert [e.reason for e in events if isinstance(e, Finished) and e.request_id == r.id] == ["length"]
    # the recompute (prompt + output so far, > 10 rows) resumed past its own cached pages
    recomputes = [seg.start for p in plans if p.kind == "recompute" for _, seg in zip(p.chunks, p.segments)]
    assert recomputes and s.prefix.recompute_hits == sum(recomputes) > 0
    # both are on /metrics: the recompute's hits, and the pages the cache keeps idle
    from types import SimpleNamespace

    from tailgate.engine.metrics import snapshot
    from tailgate.server.metrics import registry_for, render
    from tailgate.server.state import ServerState

    snap = snapshot(s)
    assert snap.recompute_hits == s.prefix.recompute_hits > 0 and snap.kv_pages_idle == s.book.glob.idle
    state = ServerState(
        "m", engine=SimpleNamespace(snapshot=snap, fence_timeouts=0)
    )  # the real state; a snapshot for its engine
    text = render(registry_for(state)).decode()
    assert f'tailgate:recompute_prefix_hits_total{{model_name="m"}} {float(snap.recompute_hits)}' in text
    assert f'tailgate:kv_pages_idle{{model_name="m"}} {float(snap.kv_pages_idle)}' in text


def test_a_preempted_requests_output_pages_are_not_served_to_another_prompt_with_the_same_text():
    book = KVBook(20, None, None)
    cache = PrefixCache(4, book)
    p, out = prompt(10, 1), prompt(40, 2)
    seq = SeqPages()
    assert book.reserve(seq, 50)
    book.advance(seq, 49)  # the last output token is not fed yet
    cache.keep(p + out, len(p), "r1", seq)  # preempted: 3 full pages, every one holding output
    book.free(seq)
    assert hit(cache, p + out + [1]) == 0  # another request's prompt with that very text
    assert hit(cache, p + out, prompt_len=len(p), owner="r2") == 0
    assert hit(cache, p + out, prompt_len=len(p), owner="r1") == 48  # its own recompute


def test_no_page_leaks_after_a_mixed_workload():
    s = make(k=3, slots=3, chunk=64)
    base = prompt(80)
    reqs = [Request(base + prompt(n, n), m) for n, m in ((5, 3), (30, 7), (0, 2), (70, 4))]
    reqs += [Request(prompt(50, 4), 5), Request(base[:40], 3), Request(prompt(17, 8), 1)]
    for r in reqs:
        run(s, r)
    mixed = [Request(base + prompt(9, i), 4) for i in range(5)]
    run(s, *mixed)
    assert s.book.glob.used == 0 and len(s.prefix) == 3
    s.prefix.clear()
    assert s.book.glob.idle == 0 and s.prefix.blocks == 0


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


def test_a_prompt_rejected_as_too_big_gives_back_the_cached_pages_it_attached():
    s = make(k=4, slots=2, global_pages=9)  # 8 usable pages, the walk off
    a = prompt(32, 1)
    run(s, Request(a, 2))  # cached: 2 idle pages
    big = Request(a + prompt(120, 5), 2)  # starts at a's pages, needs 10 in all: never fits
    ev = run(s, big)
    assert any(isinstance(e, Rejected) for e in ev)
    assert s.book.glob.used == 0 and s.book.glob.idle == 2  # the attached references went back


def test_on_the_real_model_a_recompute_that_rehits_its_own_pages_is_token_exact_vs_serial(loaded, rig):
    # tests/test_engine_gates.py's preemption case, with the cache on and kept cheap: SmolLM2
    # (small vocabulary, ~1.4 fp32 pages a MiB, so a budget of exactly 7 pages), three greedy 8 +
    # 40-token streams of 3 pages each: two fit, the third is preempted and resumes on its own
    # cached prompt+output pages, walking only what was evicted, and gives the tokens it gives alone.
    import torch

    from harness import Harness, ids
    from tailgate.model.runtime import serial
    from tailgate.model.runtime.kv_cache import token_bytes

    m = loaded("smollm2-135m")
    page = 16 * token_bytes(m.spec, torch.float32)["global"]
    mb = next(x for x in range(1, 4096) if (x << 20) // page >= 7)
    assert (mb << 20) // page < 9
    r = rig("smollm2-135m", "fp32")
    prompts = [ids(8, s) for s in (5, 6, 7)]
    want = [serial.generate(r.runner, r.book, p, 40) for p in prompts]
    with Harness(m, dtype="fp32", DECODE_SLOTS="3", MAX_CONTEXT="64", KV_CACHE_MB=str(mb), PREFIX_CACHE="4") as h:
        with h.engine._cv:
            rs = [h.submit(p, max_tokens=40) for p in prompts]
        assert h.wait(lambda: all(h.done(x) for x in rs), 600)
        assert h.sched.metrics.preemptions >= 1 and h.sched.prefix.recompute_hits > 0
        assert [h.tokens(x) for x in rs] == want


def test_a_walker_holding_only_prefix_pages_another_request_shares_is_no_victim():
    """Preempting it would free no page and still count toward its bound (issue 43)."""
    from tailgate.engine.preemption import holders

    s = make(chunk=16)
    base = prompt(40)
    run(s, Request(base, 3))  # 2 prompt pages stay cached
    live = Request(base + prompt(8, salt=5), 50)
    s.submit(live)
    while live not in s.roster:
        s.step(0.0)
    first, shared = Request(prompt(100, salt=9), 5), Request(base[:32] + [999], 5)
    s.submit(first)
    s.submit(shared)
    plan = s.schedule(0.0)
    assert plan.chunks == [(first, 16)] and shared in s.walk  # the round's 16 rows went to `first`
    assert shared.pages.global_pages == live.pages.global_pages[:2]
    assert shared not in holders(s, first) and live in holders(s, first)
