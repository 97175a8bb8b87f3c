"""Scheduling decisions as plain data: each test reads the `StepPlan`s `Scheduler.schedule(now)`
returns (a stepped iteration's plan is `Scheduler.last_plan`), not a fake's reading of the pass."""

from __future__ import annotations

from tailgate.config import ServingConfig
from tailgate.engine.admission import door_view
from tailgate.engine.pages import KVBook
from tailgate.engine.plan import StepPlan
from tailgate.engine.request import Event, Finished, Rejected, Request, Sampled, Scheduled, Token
from tailgate.engine.scheduler import Scheduler

VOCAB = 1000


class FakeExecutor:
    """Every sampled row samples token 7; nothing else (what a step ran is its plan)."""

    def run(self, segments, rows):
        return [Sampled(7) for _ in rows]

    def release(self, request_id):
        pass


def make(slots=4, door_ms=None, max_prompts=4, gather_rows=512, global_pages=None, local_pages=None, chunk=None):
    cfg = ServingConfig(
        max_context=256,
        decode_slots=slots,
        mix_gather_rows=gather_rows,
        mix_max_prompts=max_prompts,
        admit_coalesce_ms=door_ms,
        mix_chunk_tokens=chunk,
    )
    book = KVBook(global_pages or slots * 16 + 1, local_pages, None)
    return Scheduler(FakeExecutor(), book, cfg, VOCAB, clock=lambda: 0.0)


def req(n=10, max_tokens=50, **kw):
    return Request(prompt=list(range(1, n + 1)), max_tokens=max_tokens, arrival=1.0, **kw)


def step(s: Scheduler, now: float = 0.0) -> tuple[StepPlan, list[Event]]:
    """One iteration: the plan `schedule(now)` made for it, and what it emitted."""
    events = s.step(now)
    return s.last_plan, events


def arrive(s: Scheduler, n: int = 3, max_tokens: int = 60) -> list[Request]:
    """`n` 10-token requests submitted in order, arriving 1 s apart (arrival order is rank order)."""
    rs = [req(10, max_tokens=max_tokens) for _ in range(n)]
    for i, r in enumerate(rs):
        r.arrival = 1.0 + i
        s.submit(r)
    return rs


def chunks(plan: StepPlan) -> list[tuple]:
    """Each prompt chunk of the plan with its segment: (request, rows, start position, sampled)."""
    return [(r, take, seg.start, seg.sample) for (r, take), seg in zip(plan.chunks, plan.segments)]


def scheduled(events):
    return [e.request_id for e in events if isinstance(e, Scheduled)]


def finished(events, rid):
    return next((e for e in events if isinstance(e, Finished) and e.request_id == rid), None)


def drain(s: Scheduler, submits=()) -> tuple[list[StepPlan], list[Event]]:
    """Step to the end, submitting each (step index, request) when its step comes: every plan, every event."""
    plans, events, i, todo = [], [], 0, sorted(submits, key=lambda x: x[0])
    while s.has_work() or todo:
        while todo and todo[0][0] <= i:
            s.submit(todo.pop(0)[1])
        plan, ev = step(s)
        plans.append(plan)
        events += ev
        i += 1
    return plans, events


def test_an_idle_roster_admits_the_head_alone_then_mixes_the_rest_one_forward_pass_an_iteration():
    s = make()
    a, b, c = req(), req(), req()
    for r in (a, b, c):
        s.submit(r)
    p, ev = step(s)
    assert scheduled(ev) == [a.id] and p.admitted == [a]  # solo prefill
    assert (p.chunks, p.rows, p.kind, p.why) == ([(a, 10)], [], "prefill", "a prompt alone")
    p, ev = step(s)
    assert scheduled(ev) == [b.id, c.id] and p.admitted == [b, c]  # the door let all three through: no second wait
    assert (p.chunks, p.rows, p.kind) == ([(b, 10), (c, 10)], [a], "mixed")  # gathered beside a's row
    assert [len(seg.tokens) for seg in p.segments] == [10, 10, 1]  # one forward pass: both prompts and the row
    p, _ = step(s)
    assert (p.chunks, p.rows, p.kind) == ([], [a, b, c], "decode")  # then the decode round


def test_gather_respects_max_prompts_and_the_row_budget():
    s = make(slots=8, max_prompts=2, gather_rows=25)
    live = req()
    s.submit(live)
    step(s)
    rs = [req(n) for n in (20, 3, 4, 30)]
    for r in rs:
        s.submit(r)
    plans = [step(s)[0] for _ in range(3)]
    # leader 20 + follower 3 (rows 23 <= 25, max_prompts 2); then leader 4 (rows 4 + 30 > 25): alone; then 30
    r20, r3, r4, r30 = rs
    assert [(p.chunks, len(p.rows)) for p in plans] == [([(r20, 20), (r3, 3)], 1), ([(r4, 4)], 3), ([(r30, 30)], 4)]
    assert [p.admitted for p in plans] == [[r20, r3], [r4], [r30]] and all(p.budget is None for p in plans)


def test_a_long_leader_is_never_bounded_by_the_gather_budget():
    s = make(gather_rows=8)
    live = req()
    s.submit(live)
    step(s)
    long = req(100)
    s.submit(long)
    p, _ = step(s)
    assert p.chunks == [(long, 100)] and p.rows == [live]


def test_the_roster_edge_holds_arrivals_without_scheduling_them():
    s = make(slots=2)
    a, b, c = req(max_tokens=6), req(max_tokens=50), req()
    for r in (a, b):
        s.submit(r)
    step(s), step(s)  # a: 2 tokens (solo, then mixed with b)
    s.submit(c)
    for _ in range(4):  # a reaches 6 tokens in the fourth decode round and frees its slot
        p, ev = step(s)
        assert not p.admitted and not p.chunks and c.id not in scheduled(ev)
        assert list(s.queue) == [c] and len(p.rows) <= 2
    assert len(s.roster) == 1
    p, ev = step(s)
    assert p.admitted == [c] and p.chunks == [(c, 10)] and c.id in scheduled(ev)  # the freed slot admits c


def test_an_intake_turn_spends_at_most_slots_attempts():
    s = make(slots=2)
    dead = [req() for _ in range(3)]
    for r in dead:
        r.cancelled = True
        s.submit(r)
    ok = req()
    s.submit(ok)
    p, ev = step(s)
    assert p.finished == [(dead[0], "abort"), (dead[1], "abort")] and not p.admitted
    assert [e.request_id for e in ev if isinstance(e, Finished)] == [dead[0].id, dead[1].id]
    p, ev = step(s)
    assert p.finished == [(dead[2], "abort")] and p.admitted == [ok] and ok.id in scheduled(ev)


def test_pages_short_with_a_live_roster_wait_at_the_head_and_never_fit_alone_is_rejected():
    s = make(slots=4, global_pages=6)  # 5 usable pages = 80 tokens
    a = req(40, max_tokens=4)
    s.submit(a)
    step(s)
    b = req(60)
    s.submit(b)
    p, _ = step(s)
    assert not p.admitted and p.why == "the head waits for pages" and p.rows == [a]
    assert s.queue and s.queue[0] is b  # waits at the head while a is live
    plans = [step(s)[0] for _ in range(3)]
    assert [r for p in plans for r in p.admitted] == [b]
    huge = req(100, max_tokens=5)
    s2 = make(slots=4, global_pages=6)
    s2.submit(huge)
    p, ev = step(s2)
    assert p.finished == [(huge, "rejected")] and not p.admitted and not p.segments
    assert [e.reason for e in ev if isinstance(e, Rejected)][0].startswith("the prompt needs 7 KV pages")


def test_invalid_requests_are_rejected_with_a_reason():
    s = make()
    bad = [
        Request(prompt=[], max_tokens=5),
        Request(prompt=[1], max_tokens=0),
        Request(prompt=[1] * 250, max_tokens=10),
        Request(prompt=[5, VOCAB], max_tokens=5),
    ]
    for r in bad:
        s.submit(r)
    p, ev = step(s)
    assert p.finished == [(r, "rejected") for r in bad] and not p.admitted
    reasons = [e.reason for e in ev if isinstance(e, Rejected)]
    assert len(reasons) == 4
    assert "empty" in reasons[0] and "max_tokens" in reasons[1]
    assert "maximum context length is 256 tokens" in reasons[2] and "outside the vocabulary" in reasons[3]
    assert s.book.glob.used == 0


def test_the_door_holds_a_deep_batch_and_releases_a_full_cohort_together():
    s = make(slots=4, door_ms=2000)
    inc = req(max_tokens=200)
    s.submit(inc)
    step(s)
    x, y = req(), req()
    s.submit(x)
    s.submit(y)
    for t in (0.1, 0.2, 0.3):
        p, ev = step(s, t)
        assert (p.why, p.admitted, p.chunks, p.rows) == ("the door holds", [], [], [inc]) and s.held == 2
        assert not scheduled(ev) and any(isinstance(e, Token) and e.request_id == inc.id for e in ev)
    z = req()
    s.submit(z)
    p, ev = step(s, 0.4)
    assert p.admitted == [x, y, z] and p.chunks == [(x, 10), (y, 10), (z, 10)] and p.held == 0
    assert scheduled(ev) == [x.id, y.id, z.id]
    assert s.metrics.door_releases["cohort"] == 1 and s.metrics.door_hold.n == 2 and s.held == 0  # z was never held


def test_the_door_releases_an_incomplete_cohort_after_its_window():
    s = make(slots=4, door_ms=20)
    s.submit(req(max_tokens=200))
    step(s)
    x, y = req(), req()
    s.submit(x)
    s.submit(y)
    assert [step(s, t)[0].admitted for t in (1.0, 1.019)] == [[], []]
    assert s.held == 2
    p, ev = step(s, 1.020)
    assert p.admitted == [x, y] and scheduled(ev) == [x.id, y.id]
    assert s.metrics.door_releases["window"] == 1


def test_a_cancelled_live_request_returns_its_pages_at_once():
    s = make()
    a = req(max_tokens=100)
    s.submit(a)
    step(s)
    assert s.book.glob.used > 0
    a.cancelled = True
    p, ev = step(s)
    assert p.finished == [(a, "abort")] and not p.rows and not p.segments
    assert [e.reason for e in ev if isinstance(e, Finished)] == ["abort"]
    assert s.book.glob.used == 0 and not s.roster


# ---- the chunked walk ---------------------------------------------------------------------
def test_each_walk_round_carries_every_live_row_and_at_most_n_prompt_rows():
    s = make(slots=4, chunk=64)
    a = req(10, max_tokens=100)
    s.submit(a)
    p, _ = step(s)  # a alone, walked in one 10-row round
    assert p.chunks == [(a, 10)] and p.budget == 64
    b, c = req(150, max_tokens=3), req(100, max_tokens=3)
    s.submit(b), s.submit(c)
    rounds = []
    while b not in s.roster or s.walk:
        p, ev = step(s)
        rounds.append(p)
        # the live stream gets a token in every round: one round per iteration
        assert a in p.rows and sum(1 for e in ev if isinstance(e, Token) and e.request_id == a.id) == 1
    assert [chunks(p) for p in rounds] == [
        [(b, 64, 0, False)],
        [(b, 64, 64, False)],
        [(b, 22, 128, True), (c, 42, 0, False)],
        [(c, 58, 42, True)],
    ]
    assert all(p.budget == 64 and p.prompt_rows <= 64 and p.kind == "walk" for p in rounds)
    assert rounds[-1].rows == [a, b]  # b's final chunk graduated it: it decodes in the next round


def test_a_walker_joins_the_roster_with_the_token_of_its_final_segment():
    s = make(slots=4, chunk=64)
    b = req(130, max_tokens=2)
    s.submit(b)
    plans, evs = zip(*(step(s) for _ in range(3)))
    assert [chunks(p) for p in plans] == [[(b, 64, 0, False)], [(b, 64, 64, False)], [(b, 2, 128, True)]]
    assert all(not p.rows for p in plans)
    toks = [e for ev in evs for e in ev if isinstance(e, Token)]
    assert len(toks) == 1 and s.roster == [b]
    assert s.book.glob.used > 0 and not s.walk


def test_a_cancelled_walker_returns_its_pages_without_a_token():
    s = make(slots=4, chunk=64)
    b = req(200, max_tokens=5)
    s.submit(b)
    p, _ = step(s)
    assert p.chunks == [(b, 64)] and s.book.glob.used == 4  # 64 rows: this round's pages only
    b.cancelled = True
    p, ev = step(s)
    assert p.finished == [(b, "abort")] and not p.chunks and not p.segments
    assert [e.reason for e in ev if isinstance(e, Finished)] == ["abort"]
    assert not any(isinstance(e, Token) for e in ev) and s.book.glob.used == 0 and not s.has_work()


def test_a_walk_whose_roster_drains_midway_finishes():
    s = make(slots=4, chunk=64)
    a = req(10, max_tokens=2)
    s.submit(a)
    step(s)
    b = req(200, max_tokens=2)
    s.submit(b)
    plans, _ = drain(s)
    assert [take for p in plans for r, take in p.chunks if r is b] == [64, 64, 64, 8]
    assert any(p.chunks and not p.rows for p in plans)  # rounds walked on with no live row beside them
    last = plans[-1]
    assert (last.chunks, last.rows, last.segments[0].start) == ([], [b], 200) and s.book.glob.used == 0


def test_the_door_counts_walkers_as_active():
    # A 1 s fixed window, 4 slots. With one prompt mid-walk (the roster empty) and one arrival, the
    # door sees 1 active + 1 pending: not idle, not shallow ((1 + 1) * 2 < 4 is false), under its
    # cohort of 3: it holds. Were walkers not counted, the roster alone (0) would read as idle and open.
    s = make(slots=4, chunk=64, door_ms=1000)
    s.submit(req(200, max_tokens=5))
    step(s)
    assert len(s.walk) == 1 and len(s.roster) == 0
    late = req(10)
    s.submit(late)
    view = door_view(s)
    assert view.active == 1 and view.pending == 1
    plan = s.schedule(0.0)
    assert plan.held == 1 and plan.why == "the door holds" and late.held_at == 0.0 and list(s.queue) == [late]
    # the same arrival with no walker: the door opens for the idle engine and admits it
    idle = make(slots=4, chunk=64, door_ms=1000)
    idle.submit(late2 := req(10))
    assert door_view(idle).active == 0
    assert idle.schedule(0.0).admitted == [late2] and late2 not in idle.queue


# ---- stall attribution --------------------------------------------------------------------
class TimedExecutor(FakeExecutor):
    """A scripted cost model: every step advances a virtual clock 10 ms + 1 ms per prompt row of
    the plan it runs."""

    def __init__(self):
        self.now, self.sched = 0.0, None

    def run(self, segments, rows):
        self.now += 0.010 + 0.001 * self.sched.last_plan.prompt_rows
        return super().run(segments, rows)


def test_every_gap_is_attributed_to_the_step_that_ended_it():
    ex = TimedExecutor()
    cfg = ServingConfig(max_context=256, decode_slots=4, mix_gather_rows=512, mix_max_prompts=4)
    s = ex.sched = Scheduler(ex, KVBook(65, None, None), cfg, VOCAB, clock=lambda: ex.now)
    a = req(10, max_tokens=20)
    s.submit(a)
    first = [e for e in s.step() if isinstance(e, Token)]  # prefill (10 rows)
    b = req(30, max_tokens=20)
    s.submit(b)
    second = [e for e in s.step() if isinstance(e, Token)]  # b rides a's row
    third = [e for e in s.step() if isinstance(e, Token)]  # a decode round
    got = [
        (e.request_id == a.id, e.cause, e.prompt_rows, e.prompts, None if e.gap is None else round(e.gap, 6))
        for e in first + second + third
    ]
    assert got == [
        (True, "prefill", 10, 1, None),
        (False, "mixed", 30, 1, None),
        (True, "mixed", 30, 1, 0.040),
        (True, "decode", 0, 0, 0.010),
        (False, "decode", 0, 0, 0.010),
    ]
    h = s.metrics.itl_by_cause
    assert (h["decode"].n, h["mixed"].n) == (2, 1) and abs(h["mixed"].total - 0.040) < 1e-9


# ---- KV budget: preemption ----------------------------------------------------------------
def test_a_row_that_cannot_grow_preempts_the_latest_arrival_which_resumes_by_recompute():
    s = make(slots=3, global_pages=11)  # 10 usable pages: two 60-token requests fit, three do not
    rs = arrive(s, max_tokens=50)
    plans, events = drain(s)
    preempted = [r for p in plans for r in p.preempted]
    assert preempted and set(preempted) == {rs[2]} and len(preempted) == s.metrics.preemptions
    assert s.book.glob.used == 0
    for r in rs:  # every token emitted exactly once, the run finishes by length
        assert sum(1 for e in events if isinstance(e, Token) and e.request_id == r.id) == 50
        assert [e.reason for e in events if isinstance(e, Finished) and e.request_id == r.id] == ["length"]
        assert sum(1 for e in events if isinstance(e, Scheduled) and e.request_id == r.id) == 1
    # the last arrival was the one preempted: it came back as one recompute chunk (prompt + output)
    recomputes = [(r, take, start) for p in plans if p.kind == "recompute" for r, take, start, _ in chunks(p)]
    assert recomputes and all(r is rs[2] and take > 10 and start == 0 for r, take, start in recomputes)
    # what its prefills computed, the recompute's rows included (what the walk keeps up with)
    assert rs[2].walked == sum(take for p in plans for r, take, _, _ in chunks(p) if r is rs[2]) > len(rs[2].prompt)
    causes = {e.cause for e in events if isinstance(e, Token) and e.request_id == rs[2].id}
    assert "recompute" in causes


def test_a_stream_that_fits_alone_is_never_killed_by_a_walker_holding_pages():
    # The pools hold one 256-token request (16 pages + the null page); a 16 + 200-token stream is
    # live when a 200-token prompt arrives. It used to walk in at once, take pages the stream needed
    # later, and the stream was killed ("KV pools exhausted") at its token 113. Now the walker waits
    # for room (its prompt does not fit beside the stream) and both finish whole.
    s = make(slots=2, global_pages=17, chunk=64)
    old, new = req(16, max_tokens=200), req(200, max_tokens=8)
    old.arrival, new.arrival = 1.0, 2.0
    plans, events = drain(s, [(0, old), (90, new)])
    assert not any(p.preempted or p.finished for p in plans)
    assert [r for p in plans for r in p.admitted] == [old, new]
    assert not any(r is new for p in plans if old in p.rows for r, _ in p.chunks)  # it walked after old ended
    assert finished(events, old.id).reason == "length" and finished(events, new.id).reason == "length"
    assert sum(isinstance(e, Token) and e.request_id == old.id for e in events) == 200
    assert sum(isinstance(e, Token) and e.request_id == new.id for e in events) == 8
    assert sum(isinstance(e, Scheduled) and e.request_id == new.id for e in events) == 1
    assert s.book.glob.used == 0


def test_when_the_pools_run_dry_a_younger_walker_gives_its_pages_to_an_older_stream():
    s = make(slots=2, global_pages=17, chunk=64)
    old, new = req(16, max_tokens=100), req(120, max_tokens=8)
    old.arrival, new.arrival = 1.0, 2.0
    s.submit(old)
    for _ in range(14):  # old at 30 tokens: 2 pages, its second nearly full
        step(s)
    s.submit(new)
    p, _ = step(s)  # new's first 64 rows: it holds 4 pages
    assert p.chunks == [(new, 64)] and p.rows == [old] and len(new.pages.global_pages) == 4
    other = s.book.glob.take(s.book.glob.available)  # something else holds every free page
    events = []
    while not new.preemptions:  # old needs its third page: only the walker holds any to give
        p, ev = step(s)
        events += ev
    assert p.preempted == [new] and p.rows == [old] and not p.chunks  # old's row got new's pages
    assert finished(events, old.id) is None and not s.walk and new in s.queue
    s.book.glob.give(other)
    plans, ev = drain(s)
    events += ev
    assert [r for p in plans for r in p.admitted] == [new]
    assert finished(events, old.id).reason == "length" and finished(events, new.id).reason == "length"
    assert sum(isinstance(e, Token) and e.request_id == new.id for e in events) == 8
    assert s.book.glob.used == 0


def test_a_step_that_preempted_admits_nobody_and_the_preempted_come_back_in_arrival_order():
    s = make(slots=4, global_pages=11)  # 10 usable pages
    a, b, c = arrive(s)
    late = req(5, max_tokens=2)
    late.arrival = 9.0
    events = []
    while not s.metrics.preemptions:
        p, ev = step(s)
        events += ev
    assert p.preempted == [c] and not p.admitted  # the youngest gave its pages back
    assert c.preemptions == 1 and a.preemptions == b.preemptions == 0
    s.submit(late)
    assert list(s.queue) == [c, late]  # ahead of the later arrival, not behind it
    plans, ev = drain(s)
    events += ev
    for p in plans:  # a step that had to preempt for its live rows admits nobody
        assert not (p.preempted and p.admitted)
    assert [r for p in plans for r in p.admitted] == [c, late]  # readmitted before the newcomer after it
    assert all(finished(events, r.id).reason == "length" for r in (a, b, c, late))


def test_a_stream_preempted_twice_is_taken_last():
    s = make(slots=3, global_pages=10)  # 9 usable pages: the oldest is the first that cannot grow
    a, b, c = arrive(s, max_tokens=50)
    c.preemptions = 2  # at the bound: b, though older, gives its pages back first
    while not s.metrics.preemptions:
        p, _ = step(s)
    assert p.preempted == [b] and b.preemptions == 1 and c.preemptions == 2
    drain(s)
    assert s.book.glob.used == 0


# ---- the door under the walk ---------------------------------------------------------------
def test_a_released_cohort_walks_together_and_its_leftovers_go_without_a_new_window():
    s = make(slots=8, door_ms=100, max_prompts=2, chunk=64)
    live = req(10, max_tokens=200)
    s.submit(live)
    step(s)
    cohort = [req(100, max_tokens=50) for _ in range(3)]
    for r in cohort:
        s.submit(r)
    # the clock never moves: a request asked to wait a window would wait forever
    plans = [step(s)[0] for _ in range(12)]
    # the door opened once for all three (a full cohort); MAX_PROMPTS = 2 walk first and the third
    # joins the walk as soon as there is room, without a second wait at the door
    admitted = [p.admitted for p in plans if p.admitted]
    assert admitted == [cohort[:2], cohort[2:]] and not any(p.held for p in plans)


def test_an_arrival_joins_a_running_walk_instead_of_waiting_it_out():
    s = make(slots=4, chunk=64)
    s.submit(req(10, max_tokens=100))
    step(s)
    long = req(200, max_tokens=4)
    s.submit(long)
    first, _ = step(s)  # the walk's first round
    short = req(10, max_tokens=4)
    s.submit(short)
    p, ev = step(s)
    assert p.admitted == [short] and p.why == "arrivals join the walk" and s.walk[-1] is short
    assert scheduled(ev) == [short.id] and long in s.walk  # admitted while the long prompt still walks
    plans, _ = drain(s)
    assert max(x.prompt_rows for x in [first, p, *plans]) <= 64  # the live stream's stall stays one chunk


def test_a_preempted_stream_does_not_wait_at_the_door():
    s = make(slots=4, global_pages=11, door_ms=2000)  # 10 usable pages; a 2 s door
    a, b, c = arrive(s)
    plans, events = drain(s)  # the clock never moves: the door would hold c until the roster is empty
    assert c.preemptions == 1
    back = [p for p in plans if c in p.admitted][1:]
    assert len(back) == 1 and b in back[0].rows and back[0].held == 0  # readmitted beside b, not held
    assert back[0].kind == "recompute"
    done_b = next(i for i, e in enumerate(events) if isinstance(e, Finished) and e.request_id == b.id)
    resumed = next(
        i for i, e in enumerate(events) if isinstance(e, Token) and e.request_id == c.id and e.cause == "recompute"
    )
    assert resumed < done_b  # as soon as a's pages came back


class PoisonExecutor(FakeExecutor):
    """A forward pass that contains token 666 raises; a row of request `bad_row` fails to sample."""

    def __init__(self, bad_row=None):
        self.bad_row = bad_row

    def run(self, segments, rows):
        if any(666 in s.tokens for s in segments):
            raise ValueError("poisoned forward")
        return [ValueError("bad row") if r.request_id == self.bad_row else Sampled(7) for r in rows]


def test_a_failing_forward_fails_only_the_segment_that_makes_it_fail():
    s = make()
    s.executor = PoisonExecutor()
    good = req(max_tokens=6)
    s.submit(good)
    plans, events = [], s.step(0.0)  # good's prefill: now it decodes
    bad = Request(prompt=[1, 2, 666, 4], max_tokens=5, arrival=1.0)
    s.submit(bad)
    for _ in range(10):
        p, ev = step(s)
        plans.append(p)
        events += ev
    assert plans[0].chunks == [(bad, 4)] and plans[0].rows == [good]  # one pass: the poison beside good's row
    assert finished(events, bad.id).reason == "error" and "poisoned" in finished(events, bad.id).message
    assert finished(events, good.id).reason == "length"
    assert sum(isinstance(e, Token) and e.request_id == good.id for e in events) == 6
    assert s.book.glob.used == 0  # the failed prompt's pages came back too


def test_a_row_that_fails_to_sample_fails_alone():
    s = make()
    good, bad = req(max_tokens=4), req(max_tokens=4)
    s.executor = PoisonExecutor(bad_row=bad.id)
    s.submit(good)
    s.submit(bad)
    events = []
    for _ in range(8):
        events += s.step(0.0)
    assert finished(events, bad.id).reason == "error" and "bad row" in finished(events, bad.id).message
    assert finished(events, good.id).reason == "length"
    assert s.book.glob.used == 0


def test_cancels_count_and_keep_their_reason_in_the_queue_and_mid_walk():
    s = make(slots=2, chunk=64)
    s.submit(req(10, max_tokens=50))
    step(s)
    walker, queued = req(200, max_tokens=4), req(10, max_tokens=4)
    s.submit(walker)
    step(s)  # walker mid-walk; the roster is now full with it, so `queued` waits
    s.submit(queued)
    walker.cancelled, walker.cancel_as = True, "stop"  # a stop string matched on its stream
    queued.cancelled = True
    plans, events = drain(s)
    assert [(r, why) for p in plans for r, why in p.finished] == [(walker, "stop"), (queued, "abort")]
    assert finished(events, walker.id).reason == "stop" and finished(events, queued.id).reason == "abort"
    assert s.metrics.finished["abort"] == 1 and s.metrics.finished["stop"] == 1
    assert s.book.glob.used == 0


def test_every_model_step_leaves_one_record_of_its_kind_and_rows_in_the_step_log():
    s = make()
    for r in (req(), req(), req()):
        s.submit(r)
    plans = [step(s)[0] for _ in range(3)]
    log = list(s.step_log)
    assert [r.seq for r in log] == [0, 1, 2]
    assert [(r.kind, r.prompt_rows, r.prompts, r.decode_rows) for r in log] == [
        (p.kind, p.prompt_rows, len(p.chunks), len(p.rows)) for p in plans
    ]
    assert [(r.kind, r.prompt_rows, r.prompts, r.decode_rows) for r in log] == [
        ("prefill", 10, 1, 0),
        ("mixed", 20, 2, 1),
        ("decode", 0, 0, 3),
    ]
    assert log[0].as_dict()["kind"] == "prefill"


def test_an_unset_max_tokens_is_the_default_within_the_context_the_prompt_leaves():
    cfg = ServingConfig(max_context=256, decode_slots=2, default_max_tokens=100)
    s = Scheduler(FakeExecutor(), KVBook(40, None, None), cfg, VOCAB, clock=lambda: 0.0)
    short, long_, asked = req(10, max_tokens=None), req(200, max_tokens=None, min_tokens=80), req(10, max_tokens=7)
    for r in (short, long_, asked):
        s.submit(r)
    assert (short.max_tokens, long_.max_tokens, asked.max_tokens) == (100, 56, 7)
    assert long_.min_tokens == 56  # clamped to what it may emit


def test_the_last_token_carries_its_finish_reason_and_a_stop_token_is_never_emitted():
    s = make()
    a, b = req(max_tokens=3), req(max_tokens=9, stop_token_ids=frozenset({7}))  # FakeExecutor samples 7
    s.submit(a)
    s.submit(b)
    _, events = drain(s)
    toks = [e for e in events if isinstance(e, Token) and e.request_id == a.id]
    assert [t.finish for t in toks] == [None, None, "length"]
    assert not [e for e in events if isinstance(e, Token) and e.request_id == b.id]
    assert {e.request_id: e.reason for e in events if isinstance(e, Finished)} == {a.id: "length", b.id: "stop"}


def test_a_walk_round_records_its_row_budget_and_every_prompt_row_it_took():
    s = make(chunk=16)
    w = req(40)
    s.submit(w)
    plans, _ = drain(s)
    walk = [p for p in plans if p.chunks]
    assert [(p.kind, p.chunks, p.budget) for p in walk] == [("prefill", [(w, 16)], 16)] * 2 + [
        ("prefill", [(w, 8)], 16)
    ]
    recs = [r for r in s.step_log if r.prompt_rows]
    assert [(r.kind, r.prompt_rows, r.budget) for r in recs] == [(p.kind, p.prompt_rows, p.budget) for p in walk]
    assert recs[0].predicted_s is None  # no ITL target: no cost model


def test_a_request_cancelled_in_the_queue_leaves_it_at_the_next_step_not_at_the_head():
    """Issue 36: a queued request's abort waited behind the stream holding the slot (~200 steps),
    and the waiting gauge counted it meanwhile. Engine.abort flags the queue; the next step retires
    it, counted like any abort, and the stream ahead of it is untouched."""
    from tailgate.engine.loop import Engine

    s = make(slots=1)
    long = req(10, max_tokens=200)
    s.submit(long)
    step(s)  # holds the only slot for 200 steps
    q, behind = req(10, max_tokens=4), req(12, max_tokens=4)
    s.submit(q), s.submit(behind)
    step(s)
    engine = Engine(s)
    assert list(s.queue) == [q, behind] and engine.waiting == 2
    engine.abort(q)
    p, ev = step(s)
    assert p.finished == [(q, "abort")] and p.rows == [long] and not p.admitted
    assert list(s.queue) == [behind] and engine.waiting == 1
    assert finished(ev, q.id).reason == "abort" and s.metrics.finished["abort"] == 1
    assert s.roster == [long] and any(isinstance(e, Token) and e.request_id == long.id for e in ev)


def test_a_pinned_request_beside_an_older_walker_takes_its_pages_and_both_finish():
    """Review of issue 36: a pinned request reserving its whole length beside an older walker took
    the pages that walker's next rounds needed, and neither could move: the engine spun. Issue 43:
    a pinned request holds only what it has written and takes what it lacks from any unpinned
    holder, the older walker too, which comes back later; both finish, the pinned one unpreempted."""
    s = make(slots=4, global_pages=11, chunk=64)  # 10 usable pages = 160 tokens
    old, pinned = req(150, max_tokens=5), req(20, max_tokens=60)  # 10 pages; 5 pages whole
    old.arrival, pinned.arrival, pinned.preemptions = 1.0, 2.0, 2
    for r in (old, pinned):
        s.submit(r)
    plans, events = [], []
    for _ in range(200):
        if not s.has_work():
            break
        p, ev = step(s)
        plans.append(p)
        events += ev
    assert not s.has_work(), "the engine stopped moving"
    preempted = [r for p in plans for r in p.preempted]
    assert preempted and set(preempted) == {old}  # the older walker gave its pages, never the pinned one
    assert {finished(events, r.id).reason for r in (old, pinned)} == {"length"}
    assert pinned.preemptions == 2 and s.book.glob.used == 0


def test_a_pinned_request_takes_its_next_page_from_an_older_live_row_instead_of_waiting_for_it():
    """Issue 43: a pinned request reserved its whole length before it came in, so it waited at the
    head (and every arrival behind it) until the older stream ended. Now it comes in beside it on
    its prompt's pages and, short of one, takes it from that unpinned row, which is recomputed."""
    s = make(slots=4, global_pages=11, chunk=64)  # 10 usable pages
    old = req(100, max_tokens=50)  # 7 pages as it decodes to its end (149 tokens: 10 pages)
    s.submit(old)
    step(s)
    pin = req(40, max_tokens=60)  # 3 pages of prompt, 7 whole
    pin.arrival, pin.preemptions = 2.0, 2
    s.submit(pin)
    p, _ = step(s)  # old walks its prompt's last 36 rows; pin comes in beside them with 28
    assert p.admitted == [pin] and p.chunks == [(old, 36), (pin, 28)]
    assert pin in s.walk and len(pin.pages.global_pages) == 2  # at once, on the pages of what it wrote
    plans, ev = drain(s)
    assert old in [r for p in plans for r in p.preempted] and not any(pin in p.preempted for p in plans)
    assert {finished(ev, r.id).reason for r in (old, pin)} == {"length"}
    assert old.preemptions >= 1 and pin.preemptions == 2 and s.book.glob.used == 0
    first_end = min((r for r in (old, pin)), key=lambda r: ev.index(finished(ev, r.id)))
    assert first_end is pin  # it ran through the older stream's pages, not after them


def test_a_second_pinned_request_waits_while_the_pinned_whole_lengths_would_not_fit_together():
    """The pinned may take from everyone else only while their whole lengths fit the pools together:
    then the pages each one needs always exist among theirs and what the unpinned can give back."""
    s = make(slots=4, global_pages=11, chunk=64)  # 10 usable pages
    p1, p2 = req(30, max_tokens=60), req(30, max_tokens=60)  # 89 tokens: 6 pages whole each
    p1.preemptions = p2.preemptions = 2
    p2.arrival = 2.0
    s.submit(p1)
    s.submit(p2)
    plan = s.schedule(0.0)
    assert plan.admitted == [p1] and plan.chunks == [(p1, 30)]
    assert s.walk == [p1] and list(s.queue) == [p2]
    _, ev = drain(s)
    assert {finished(ev, r.id).reason for r in (p1, p2)} == {"length"} and s.book.glob.used == 0


def test_a_pinned_head_that_cannot_fit_even_alone_is_refused_not_parked_forever():
    s = make(slots=4, global_pages=6, chunk=64)  # 5 usable pages = 80 tokens
    r = req(40, max_tokens=60)  # its whole length needs 7 pages: never, even alone
    r.preemptions = 2
    s.submit(r)
    p, ev = step(s)
    assert p.finished == [(r, "rejected")] and not p.admitted
    assert [e.reason for e in ev if isinstance(e, Rejected)] == [
        "the request (pinned after its preemptions: its whole length) needs 7 KV pages per pool, "
        "more than the pools hold with nothing running"
    ]
    assert not s.has_work() and s.book.glob.used == 0


def test_with_the_walk_off_a_whole_prompt_is_a_walker_the_plan_names():
    """Issue 43's one way in: a whole prompt riding the live rows is a walker in `s.walk`, one
    chunk of the plan, like a walk round's, not a request in no container."""
    s = make()
    live = req()
    s.submit(live)
    step(s)
    a, b = req(30), req(20)
    s.submit(a)
    s.submit(b)
    plan = s.schedule(0.0)
    assert plan.chunks == [(a, 30), (b, 20)] and plan.rows == [live] and plan.budget is None
    assert s.walk == [a, b] and plan.kind == "mixed" and plan.why == "whole prompts ride the live rows"


def test_a_pinned_walker_holds_only_its_written_pages_so_a_follower_that_fits_beside_them_comes_in():
    """A pinned walker used to reserve its whole length (8 pages here for its 2 of prompt), which
    kept out a follower the pool holds beside what it has written."""
    s = make(slots=4, global_pages=21, chunk=32)  # 20 usable pages
    live = req(20, max_tokens=50)
    s.submit(live)
    step(s)  # live: 2 pages
    pin, big = req(32, max_tokens=97), req(190, max_tokens=10)  # pin: 2 pages of prompt, 8 whole; big: 12
    pin.preemptions = 2
    for r in (pin, big):
        s.submit(r)
    plan = s.schedule(0.0)
    # free 20 - 2 - 2 = 16 pages; big needs 12 + one for the live row: it walks beside pin
    assert plan.admitted == [pin, big] and plan.chunks == [(pin, 32)] and plan.rows == [live]
    assert s.walk == [pin, big] and not s.queue and len(pin.pages.global_pages) == 2


def test_a_pinned_request_of_exactly_the_pools_length_fits_and_finishes():
    """Its last token is never fed back, so prompt + max_tokens - 1 tokens of KV is all it needs."""
    s = make(slots=1, global_pages=5, chunk=64)  # 4 usable pages = 64 tokens
    r = req(40, max_tokens=25)  # 40 + 25 - 1 = 64
    r.preemptions = 2
    plans, ev = drain(s, [(0, r)])
    assert plans[0].admitted == [r] and not any(p.finished for p in plans)
    assert finished(ev, r.id).reason == "length" and len(r.output) == 25 and s.book.glob.used == 0


def test_a_sink_that_fails_for_a_queued_request_flags_the_queue_for_the_next_turn():
    s = make()
    r = req()
    s.submit(r)

    def broken(ev):
        raise OSError("client gone")

    r.sink = broken
    s.emit(r, Scheduled(r.id, 0.0, queued_at=0.0, prompt_tokens=10, cached_tokens=0))
    s.deliver()
    assert r.cancelled and s.cancels_queued


def test_a_pinned_lane_flight_counts_toward_the_pinned_whole_lengths():
    """The lane's flight is held as (request, flight): its pinned request's whole length counts
    like a live row's (read as the tuple, the check raised instead of answering)."""
    from tailgate.engine.preemption import pinned_fit

    s = make(slots=4, global_pages=11, chunk=64)  # 10 usable pages
    flying, waiting = req(30, max_tokens=60), req(30, max_tokens=60)  # 6 pages whole each
    flying.preemptions = waiting.preemptions = 2
    assert pinned_fit(s, waiting)
    s.flight = (flying, object())
    assert not pinned_fit(s, waiting)  # 6 + 6 pages > 10
    s.flight = None


def test_the_fatal_path_ends_queued_and_live_requests_the_one_way():
    """Every ending goes through `Scheduler.end` (issue 43): on the fatal path a preempted request
    waiting in the queue is counted like a live one and reports the tokens it emitted."""
    s = make(slots=3, global_pages=11)  # 10 usable pages: two 60-token requests fit, three do not
    rs, got = [req(10, max_tokens=50) for _ in range(3)], []
    for i, r in enumerate(rs):
        r.arrival, r.sink = 1.0 + i, got.append
        s.submit(r)
    while s.has_work():
        p, _ = step(s)
        if p.preempted:
            break
    parked = p.preempted[0]
    assert list(s.queue) == [parked] and parked.output  # it emitted tokens before it gave its pages back
    s.fail_all("boom")
    ends = {e.request_id: e for e in got if isinstance(e, Finished)}
    assert set(ends) == {r.id for r in rs} and {e.reason for e in ends.values()} == {"error"}
    for r in rs:
        assert ends[r.id].completion_tokens == sum(1 for e in got if isinstance(e, Token) and e.request_id == r.id)
    assert s.metrics.finished["error"] == 3 and s.book.glob.used == 0 and not s.has_work()


# ---- rules no other scenario reached (branch coverage of tailgate/engine under the scheduler tests) ----
def test_a_leader_already_past_the_gather_budget_rides_the_live_rows_without_followers():
    s = make(slots=8, gather_rows=25)  # the walk off: whole prompts, gathered under a 25-row budget
    live = req()
    s.submit(live)
    step(s)
    leader, follower = req(30), req(3)
    s.submit(leader)
    s.submit(follower)
    p, _ = step(s)
    assert (p.admitted, p.chunks, p.rows) == ([leader], [(leader, 30)], [live])  # 30 rows: nobody gathered
    p, _ = step(s)
    assert (p.admitted, p.chunks) == ([follower], [(follower, 3)])


def test_an_arrival_the_door_holds_is_released_with_a_preempted_head_that_passes_the_door():
    s = make(slots=8, global_pages=11, door_ms=2000)  # 10 usable pages; a 2 s door; cohorts of 4
    a, b, c = arrive(s)
    while len(s.roster) < 3:
        step(s)
    x = req(1, max_tokens=1)
    x.arrival = 9.0
    s.submit(x)
    p, _ = step(s)
    assert x.held_at is not None and s.held == 1 and not p.admitted  # an incomplete cohort: the door holds x
    while c not in p.admitted:  # the clock never moves: the door alone would hold x for good
        p, _ = step(s)
    # c was preempted and parked ahead of x; its readmission passes the door, and x, popped behind
    # it, is released with it: its hold counted once, no new wait (pages decide when it goes)
    assert c.preemptions == 1 and p.admitted == [c]
    assert x.held_at is None and x.passed and s.metrics.door_hold.n == 1 and s.held == 0
    p, events = step(s)
    assert p.admitted == [x] and p.held == 0
    events += drain(s)[1]
    assert finished(events, x.id).reason == "length" and s.book.glob.used == 0


def test_a_parked_request_goes_back_between_the_older_and_the_younger_queued_ones():
    """preemption.park keeps the queue in arrival order (request.rank) whoever is already there:
    no scenario above parks a request behind an older queued one (the youngest holder is the
    victim, so the queue it returns to holds only later arrivals), so the rule is read directly."""
    from tailgate.engine.preemption import park

    s = make()
    older, younger, mid = req(), req(), req()
    older.arrival, mid.arrival, younger.arrival = 1.0, 2.0, 3.0
    s.submit(older)
    s.submit(younger)
    mid.preemptions = 1
    park(s, mid)
    assert list(s.queue) == [older, mid, younger] and mid.passed and mid.status.name == "PREEMPTED"
