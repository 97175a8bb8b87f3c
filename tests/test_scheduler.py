"""Scheduling decisions as plain data: a fake executor records every step plan."""

from __future__ import annotations

from tailgate.config import ServingConfig
from tailgate.engine.pages import KVBook
from tailgate.engine.request import Finished, Rejected, Request, Sampled, Scheduled, Token
from tailgate.engine.admission import door_view
from tailgate.engine.scheduler import Scheduler

VOCAB = 1000


class FakeExecutor:
    """Every row samples token 7; records the (prompt lengths, decode rows) of each step."""

    def __init__(self):
        self.plans = []
        self.segments = []  # per step: (rows, start, sampled) of every segment

    def run(self, segments, rows):
        self.plans.append(
            (
                [len(s.tokens) for s in segments if len(s.tokens) > 1 or s.start == 0],
                sum(1 for s in segments if len(s.tokens) == 1 and s.start > 0),
            )
        )
        self.segments.append([(len(s.tokens), s.start, s.sample) for s in segments])
        return [Sampled(7) for s in segments if s.sample]

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
    ex = FakeExecutor()
    return Scheduler(ex, book, cfg, VOCAB, clock=lambda: 0.0), ex


def req(n=10, max_tokens=50, **kw):
    return Request(prompt=list(range(1, n + 1)), max_tokens=max_tokens, arrival=1.0, **kw)


def scheduled(events):
    return [e.request_id for e in events if isinstance(e, Scheduled)]


def test_an_idle_roster_admits_the_head_alone_then_mixes_the_rest_one_forward_pass_an_iteration():
    s, ex = make()
    a, b, c = req(), req(), req()
    for r in (a, b, c):
        s.submit(r)
    assert scheduled(s.step(0.0)) == [a.id] and ex.plans == [([10], 0)]  # solo prefill
    assert scheduled(s.step(0.0)) == [b.id, c.id]  # the door let all three through: no second wait
    assert ex.plans[1] == ([10, 10], 1)  # b and c gathered into one mixed step with a's row
    s.step(0.0)
    assert ex.plans[2] == ([], 3)  # then the decode round


def test_gather_respects_max_prompts_and_the_row_budget():
    s, ex = make(slots=8, max_prompts=2, gather_rows=25)
    s.submit(req())
    s.step(0.0)
    for n in (20, 3, 4, 30):
        s.submit(req(n))
    for _ in range(3):
        s.step(0.0)
    # leader 20 + follower 3 (rows 23 <= 25, max_prompts 2); then leader 4 (rows 4 + 30 > 25): alone; then 30
    assert ex.plans[1:4] == [([20, 3], 1), ([4], 3), ([30], 4)]


def test_a_long_leader_is_never_bounded_by_the_gather_budget():
    s, ex = make(gather_rows=8)
    s.submit(req())
    s.step(0.0)
    s.submit(req(100))
    s.step(0.0)
    assert ex.plans[1] == ([100], 1)


def test_the_roster_edge_holds_arrivals_without_scheduling_them():
    s, ex = make(slots=2)
    a, b, c = req(max_tokens=6), req(max_tokens=50), req()
    for r in (a, b):
        s.submit(r)
    s.step(0.0), s.step(0.0)  # a: 2 tokens (solo, then mixed with b)
    s.submit(c)
    for _ in range(4):  # a reaches 6 tokens in the fourth decode round and frees its slot
        ev = s.step(0.0)
        assert c.id not in scheduled(ev) and list(s.queue) == [c] and len(s.roster) <= 2
    assert len(s.roster) == 1
    assert c.id in scheduled(s.step(0.0))  # the freed slot admits c on the next turn


def test_an_intake_turn_spends_at_most_slots_attempts():
    s, ex = make(slots=2)
    dead = [req() for _ in range(3)]
    for r in dead:
        r.cancelled = True
        s.submit(r)
    ok = req()
    s.submit(ok)
    ev = s.step(0.0)
    assert [e.request_id for e in ev if isinstance(e, Finished)] == [dead[0].id, dead[1].id]
    assert ok.id not in scheduled(ev)
    ev = s.step(0.0)
    assert ok.id in scheduled(ev)


def test_pages_short_with_a_live_roster_wait_at_the_head_and_never_fit_alone_is_rejected():
    s, ex = make(slots=4, global_pages=6)  # 5 usable pages = 80 tokens
    a = req(40, max_tokens=4)
    s.submit(a)
    s.step(0.0)
    b = req(60)
    s.submit(b)
    s.step(0.0)
    assert s.queue and s.queue[0] is b  # waits at the head while a is live
    ev = []
    for _ in range(3):
        ev += s.step(0.0)
    assert b.id in scheduled(ev)
    huge = req(100, max_tokens=5)
    s2, _ = make(slots=4, global_pages=6)
    s2.submit(huge)
    ev = s2.step(0.0)
    assert [e.reason for e in ev if isinstance(e, Rejected)][0].startswith("the prompt needs 7 KV pages")


def test_invalid_requests_are_rejected_with_a_reason():
    s, _ = make()
    bad = [
        Request(prompt=[], max_tokens=5),
        Request(prompt=[1], max_tokens=0),
        Request(prompt=[1] * 250, max_tokens=10),
        Request(prompt=[5, VOCAB], max_tokens=5),
    ]
    for r in bad:
        s.submit(r)
    ev = s.step(0.0)
    reasons = [e.reason for e in ev if isinstance(e, Rejected)]
    assert len(reasons) == 4
    assert "empty" in reasons[0] and "max_tokens" in reasons[1]
    assert "maximum context length is 256 tokens" in reasons[2] and "outside the vocabulary" in reasons[3]
    assert s.book.glob.used == 0


def test_the_door_holds_a_deep_batch_and_releases_a_full_cohort_together():
    s, ex = make(slots=4, door_ms=2000)
    inc = req(max_tokens=200)
    s.submit(inc)
    s.step(0.0)
    x, y = req(), req()
    s.submit(x)
    s.submit(y)
    for t in (0.1, 0.2, 0.3):
        ev = s.step(t)
        assert not scheduled(ev) and any(isinstance(e, Token) and e.request_id == inc.id for e in ev)
    assert s.held == 2
    z = req()
    s.submit(z)
    ev = s.step(0.4)
    assert scheduled(ev) == [x.id, y.id, z.id]
    assert s.metrics.door_releases["cohort"] == 1 and s.metrics.door_hold.n == 2 and s.held == 0  # z was never held


def test_the_door_releases_an_incomplete_cohort_after_its_window():
    s, ex = make(slots=4, door_ms=20)
    s.submit(req(max_tokens=200))
    s.step(0.0)
    x, y = req(), req()
    s.submit(x)
    s.submit(y)
    assert not scheduled(s.step(1.0))
    assert not scheduled(s.step(1.019))
    assert scheduled(s.step(1.020)) == [x.id, y.id]
    assert s.metrics.door_releases["window"] == 1


def test_a_cancelled_live_request_returns_its_pages_at_once():
    s, _ = make()
    a = req(max_tokens=100)
    s.submit(a)
    s.step(0.0)
    assert s.book.glob.used > 0
    a.cancelled = True
    ev = s.step(0.0)
    assert [e.reason for e in ev if isinstance(e, Finished)] == ["abort"]
    assert s.book.glob.used == 0 and not s.roster


# ---- the chunked walk ---------------------------------------------------------------------
def test_each_walk_round_carries_every_live_row_and_at_most_n_prompt_rows():
    s, ex = make(slots=4, chunk=64)
    a = req(10, max_tokens=100)
    s.submit(a)
    s.step(0.0)  # a alone, walked in one 10-row round
    b, c = req(150, max_tokens=3), req(100, max_tokens=3)
    s.submit(b), s.submit(c)
    rounds = []
    while b.id not in {x.id for x in s.roster} or s.walk:
        ev = s.step(0.0)
        rounds.append(ex.segments[-1])
        # the live stream gets a token in every round: one round per iteration
        assert sum(1 for e in ev if isinstance(e, Token) and e.request_id == a.id) == 1
    prompt_rows = [[(n, st, smp) for n, st, smp in r if not (n == 1 and st >= 10)] for r in rounds]
    assert prompt_rows == [[(64, 0, False)], [(64, 64, False)], [(22, 128, True), (42, 0, False)], [(58, 42, True)]]
    assert all(sum(n for n, st, smp in r if (n, st, smp) not in p) >= 1 for r, p in zip(rounds, prompt_rows))


def test_a_walker_joins_the_roster_with_the_token_of_its_final_segment():
    s, ex = make(slots=4, chunk=64)
    b = req(130, max_tokens=2)
    s.submit(b)
    evs = [s.step(0.0) for _ in range(3)]
    assert [seg for seg in ex.segments] == [[(64, 0, False)], [(64, 64, False)], [(2, 128, True)]]
    toks = [e for ev in evs for e in ev if isinstance(e, Token)]
    assert len(toks) == 1 and [x.id for x in s.roster] == [b.id]
    assert s.book.glob.used > 0 and not s.walk


def test_a_cancelled_walker_returns_its_pages_without_a_token():
    s, ex = make(slots=4, chunk=64)
    b = req(200, max_tokens=5)
    s.submit(b)
    s.step(0.0)
    assert s.book.glob.used == 4  # 64 rows: this round's pages only
    b.cancelled = True
    ev = s.step(0.0)
    assert [e.reason for e in ev if isinstance(e, Finished)] == ["abort"]
    assert not any(isinstance(e, Token) for e in ev) and s.book.glob.used == 0 and not s.has_work()


def test_a_walk_whose_roster_drains_midway_finishes():
    s, ex = make(slots=4, chunk=64)
    a = req(10, max_tokens=2)
    s.submit(a)
    s.step(0.0)
    b = req(200, max_tokens=2)
    s.submit(b)
    while s.has_work():
        s.step(0.0)
    assert ex.segments[-1] == [(1, 200, True)] and s.book.glob.used == 0


def test_the_door_counts_walkers_as_active():
    # A 1 s fixed window, 4 slots. With one prompt mid-walk (the roster empty) and one arrival, the
    # door sees 1 active + 1 pending: not idle, not shallow ((1 + 1) * 2 < 4 is false), under its
    # cohort of 3: it holds. Were walkers not counted, the roster alone (0) would read as idle and open.
    s, ex = make(slots=4, chunk=64, door_ms=1000)
    s.submit(req(200, max_tokens=5))
    s.step(0.0)
    assert len(s.walk) == 1 and len(s.roster) == 0
    late = req(10)
    s.submit(late)
    view = door_view(s)
    assert view.active == 1 and view.pending == 1
    plan = s.schedule(0.0)
    assert plan.held == 1 and plan.why == "the door holds" and late.held_at == 0.0 and list(s.queue) == [late]
    # the same arrival with no walker: the door opens for the idle engine and admits it
    idle, _ = make(slots=4, chunk=64, door_ms=1000)
    idle.submit(late2 := req(10))
    assert door_view(idle).active == 0
    assert idle.schedule(0.0).admitted == [late2] and late2 not in idle.queue


# ---- stall attribution --------------------------------------------------------------------
class TimedExecutor(FakeExecutor):
    """A scripted cost model: every step advances a virtual clock 10 ms + 1 ms per prompt row."""

    def __init__(self):
        super().__init__()
        self.now = 0.0

    def run(self, segments, rows):
        self.now += 0.010 + 0.001 * sum(len(s.tokens) for s in segments if not (len(s.tokens) == 1 and s.start > 0))
        return super().run(segments, rows)


def test_every_gap_is_attributed_to_the_step_that_ended_it():
    ex = TimedExecutor()
    cfg = ServingConfig(max_context=256, decode_slots=4, mix_gather_rows=512, mix_max_prompts=4)
    s = Scheduler(ex, KVBook(65, None, None), cfg, VOCAB, clock=lambda: ex.now)
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
    s, ex = make(slots=3, global_pages=11)  # 10 usable pages: two 60-token requests fit, three do not
    rs = [req(10, max_tokens=50) for _ in range(3)]
    for i, r in enumerate(rs):
        r.arrival = 1.0 + i
        s.submit(r)
    events = []
    while s.has_work():
        events += s.step(0.0)
    assert s.metrics.preemptions >= 1 and s.book.glob.used == 0
    for r in rs:  # every token emitted exactly once, the run finishes by length
        assert sum(1 for e in events if isinstance(e, Token) and e.request_id == r.id) == 50
        assert [e.reason for e in events if isinstance(e, Finished) and e.request_id == r.id] == ["length"]
        assert sum(1 for e in events if isinstance(e, Scheduled) and e.request_id == r.id) == 1
    # the last arrival was the one preempted: it came back as one recompute segment (prompt + output)
    recomputes = [seg for step in ex.segments for seg in step if seg[1] == 0 and seg[0] > 10]
    assert recomputes and all(n > 10 for n, _, _ in recomputes)
    causes = {e.cause for e in events if isinstance(e, Token) and e.request_id == rs[2].id}
    assert "recompute" in causes


def drain(s, submits=()):
    """Step to the end, submitting each (step index, request) when its step comes."""
    events, i, todo = [], 0, sorted(submits, key=lambda x: x[0])
    while s.has_work() or todo:
        while todo and todo[0][0] <= i:
            s.submit(todo.pop(0)[1])
        events += s.step(0.0)
        i += 1
    return events


def test_a_stream_that_fits_alone_is_never_killed_by_a_walker_holding_pages():
    # The pools hold one 256-token request (16 pages + the null page); a 16 + 200-token stream is
    # live when a 200-token prompt arrives. It used to walk in at once, take pages the stream needed
    # later, and the stream was killed ("KV pools exhausted") at its token 113. Now the walker waits
    # for room (its prompt does not fit beside the stream) and both finish whole.
    s, ex = make(slots=2, global_pages=17, chunk=64)
    old, new = req(16, max_tokens=200), req(200, max_tokens=8)
    old.arrival, new.arrival = 1.0, 2.0
    events = drain(s, [(0, old), (90, new)])
    assert finished(events, old.id).reason == "length" and finished(events, new.id).reason == "length"
    assert sum(isinstance(e, Token) and e.request_id == old.id for e in events) == 200
    assert sum(isinstance(e, Token) and e.request_id == new.id for e in events) == 8
    assert sum(isinstance(e, Scheduled) and e.request_id == new.id for e in events) == 1
    assert s.book.glob.used == 0


def test_when_the_pools_run_dry_a_younger_walker_gives_its_pages_to_an_older_stream():
    s, ex = make(slots=2, global_pages=17, chunk=64)
    old, new = req(16, max_tokens=100), req(120, max_tokens=8)
    old.arrival, new.arrival = 1.0, 2.0
    s.submit(old)
    for _ in range(14):  # old at 30 tokens: 2 pages, its second nearly full
        s.step(0.0)
    s.submit(new)
    s.step(0.0)  # new's first 64 rows: it holds 4 pages
    assert s.walk and s.walk[0] is new and len(s.walk[0].pages.global_pages) == 4
    other = s.book.glob.take(s.book.glob.available)  # something else holds every free page
    events = []
    while not new.preemptions:  # old needs its third page: only the walker holds any to give
        events += s.step(0.0)
    assert finished(events, old.id) is None and not s.walk and new in s.queue
    s.book.glob.give(other)
    events += drain(s)
    assert finished(events, old.id).reason == "length" and finished(events, new.id).reason == "length"
    assert sum(isinstance(e, Token) and e.request_id == new.id for e in events) == 8
    assert s.book.glob.used == 0


def test_a_step_that_preempted_admits_nobody_and_the_preempted_come_back_in_arrival_order():
    s, ex = make(slots=4, global_pages=11)  # 10 usable pages
    a, b, c = (req(10, max_tokens=60) for _ in range(3))
    for i, r in enumerate((a, b, c)):
        r.arrival = 1.0 + i
        s.submit(r)
    events = []
    while not s.metrics.preemptions:
        events += s.step(0.0)
    assert c.preemptions == 1 and a.preemptions == b.preemptions == 0  # the youngest gave its pages back
    late = req(5, max_tokens=2)
    late.arrival = 9.0
    s.submit(late)
    assert list(s.queue) == [c, late]  # ahead of the later arrival, not behind it
    events += drain(s)
    first = {e.request_id: i for i, e in reversed(list(enumerate(events))) if isinstance(e, Token)}
    assert first[c.id] < first[late.id]  # readmitted before the newcomer that arrived after it
    assert all(finished(events, r.id).reason == "length" for r in (a, b, c, late))


def test_a_stream_preempted_twice_is_taken_last():
    s, _ = make(slots=3, global_pages=10)  # 9 usable pages: the oldest is the first that cannot grow
    a, b, c = (req(10, max_tokens=50) for _ in range(3))
    for i, r in enumerate((a, b, c)):
        r.arrival = 1.0 + i
        s.submit(r)
    c.preemptions = 2  # at the bound: b, though older, gives its pages back first
    while not s.metrics.preemptions:
        s.step(0.0)
    assert b.preemptions == 1 and c.preemptions == 2
    drain(s)
    assert s.book.glob.used == 0


# ---- the door under the walk ---------------------------------------------------------------
def test_a_released_cohort_walks_together_and_its_leftovers_go_without_a_new_window():
    s, _ = make(slots=8, door_ms=100, max_prompts=2, chunk=64)
    live = req(10, max_tokens=200)
    s.submit(live)
    s.step(0.0)
    cohort = [req(100, max_tokens=50) for _ in range(3)]
    for r in cohort:
        s.submit(r)
    events = []
    for _ in range(12):  # the clock never moves: a request asked to wait a window would wait forever
        events += s.step(0.0)
    # the door opened once for all three (a full cohort); MAX_PROMPTS = 2 walk first and the third
    # joins the walk as soon as there is room, without a second wait at the door
    assert set(scheduled(events)) == {r.id for r in cohort}


def test_an_arrival_joins_a_running_walk_instead_of_waiting_it_out():
    s, ex = make(slots=4, chunk=64)
    s.submit(req(10, max_tokens=100))
    s.step(0.0)
    long = req(200, max_tokens=4)
    s.submit(long)
    s.step(0.0)  # the walk's first round
    short = req(10, max_tokens=4)
    s.submit(short)
    ev = s.step(0.0)
    assert scheduled(ev) == [short.id] and s.walk[-1] is short  # admitted while the long prompt still walks
    rows = [sum(n for n, start, _ in step if n > 1 or start == 0) for step in ex.segments]
    assert max(rows) <= 64  # the live stream's stall stays one chunk


def test_a_preempted_stream_does_not_wait_at_the_door():
    s, _ = make(slots=4, global_pages=11, door_ms=2000)  # 10 usable pages; a 2 s door
    a, b, c = (req(10, max_tokens=60) for _ in range(3))
    for i, r in enumerate((a, b, c)):
        r.arrival = 1.0 + i
        s.submit(r)
    events = []
    while s.has_work():  # the clock never moves: the door would hold c until the roster is empty
        events += s.step(0.0)
    assert c.preemptions == 1
    back = next(
        i for i, e in enumerate(events) if isinstance(e, Token) and e.request_id == c.id and e.cause == "recompute"
    )
    done_b = next(i for i, e in enumerate(events) if isinstance(e, Finished) and e.request_id == b.id)
    assert back < done_b  # readmitted beside b as soon as a's pages came back


class PoisonExecutor(FakeExecutor):
    """A forward pass that contains token 666 raises; a row of request `bad_row` fails to sample."""

    def __init__(self, bad_row=None):
        super().__init__()
        self.bad_row = bad_row

    def run(self, segments, rows):
        out = super().run(segments, rows)
        if any(666 in s.tokens for s in segments):
            raise ValueError("poisoned forward")
        return [ValueError("bad row") if r.request_id == self.bad_row else o for r, o in zip(rows, out)]


def finished(events, rid):
    return next((e for e in events if isinstance(e, Finished) and e.request_id == rid), None)


def test_a_failing_forward_fails_only_the_segment_that_makes_it_fail():
    s, _ = make()
    ex = PoisonExecutor()
    s.executor = ex
    good = req(max_tokens=6)
    s.submit(good)
    events = s.step(0.0)  # good's prefill: now it decodes
    bad = Request(prompt=[1, 2, 666, 4], max_tokens=5, arrival=1.0)
    s.submit(bad)
    for _ in range(10):
        events += s.step(0.0)
    assert finished(events, bad.id).reason == "error" and "poisoned" in finished(events, bad.id).message
    assert finished(events, good.id).reason == "length"
    assert sum(isinstance(e, Token) and e.request_id == good.id for e in events) == 6
    assert s.book.glob.used == 0  # the failed prompt's pages came back too


def test_a_row_that_fails_to_sample_fails_alone():
    s, _ = make()
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
    s, _ = make(slots=2, chunk=64)
    s.submit(req(10, max_tokens=50))
    s.step(0.0)
    walker, queued = req(200, max_tokens=4), req(10, max_tokens=4)
    s.submit(walker)
    s.step(0.0)  # walker mid-walk; the roster is now full with it, so `queued` waits
    s.submit(queued)
    walker.cancelled, walker.cancel_as = True, "stop"  # a stop string matched on its stream
    queued.cancelled = True
    events = drain(s)
    assert finished(events, walker.id).reason == "stop" and finished(events, queued.id).reason == "abort"
    assert s.metrics.finished["abort"] == 1 and s.metrics.finished["stop"] == 1
    assert s.book.glob.used == 0


def test_every_model_step_leaves_one_record_of_its_kind_and_rows_in_the_step_log():
    s, ex = make()
    for r in (req(), req(), req()):
        s.submit(r)
    for _ in range(3):
        s.step(0.0)
    log = list(s.step_log)
    assert [r.seq for r in log] == list(range(len(ex.plans))) == [0, 1, 2]
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
    s, ex = make()
    a, b = req(max_tokens=3), req(max_tokens=9, stop_token_ids=frozenset({7}))  # FakeExecutor samples 7
    s.submit(a)
    s.submit(b)
    events = []
    while s.has_work():
        events += s.step(0.0)
    toks = [e for e in events if isinstance(e, Token) and e.request_id == a.id]
    assert [t.finish for t in toks] == [None, None, "length"]
    assert not [e for e in events if isinstance(e, Token) and e.request_id == b.id]
    assert {e.request_id: e.reason for e in events if isinstance(e, Finished)} == {a.id: "length", b.id: "stop"}


def test_a_walk_round_records_its_row_budget_and_every_prompt_row_it_took():
    s, ex = make(chunk=16)
    s.submit(req(40))
    while s.has_work():
        s.step(0.0)
    walk = [r for r in s.step_log if r.prompt_rows]
    assert [(r.kind, r.prompt_rows, r.budget) for r in walk] == [
        ("prefill", 16, 16),
        ("prefill", 16, 16),
        ("prefill", 8, 16),
    ]
    assert walk[0].predicted_s is None  # no ITL target: no cost model


def test_a_request_cancelled_in_the_queue_leaves_it_at_the_next_step_not_at_the_head():
    """Issue 36: a queued request's abort waited behind the stream holding the slot (~200 steps),
    and the waiting gauge counted it meanwhile. Engine.abort flags the queue; the next step retires
    it, counted like any abort, and the stream ahead of it is untouched."""
    from tailgate.engine.loop import Engine

    s, _ = make(slots=1)
    long = req(10, max_tokens=200)
    s.submit(long)
    s.step(0.0)  # holds the only slot for 200 steps
    q, behind = req(10, max_tokens=4), req(12, max_tokens=4)
    s.submit(q), s.submit(behind)
    s.step(0.0)
    engine = Engine(s)
    assert list(s.queue) == [q, behind] and engine.waiting == 2
    engine.abort(q)
    ev = s.step(0.0)
    assert list(s.queue) == [behind] and engine.waiting == 1
    assert finished(ev, q.id).reason == "abort" and s.metrics.finished["abort"] == 1
    assert [x.id for x in s.roster] == [long.id] and any(isinstance(e, Token) and e.request_id == long.id for e in ev)


def test_a_pinned_request_beside_an_older_walker_takes_its_pages_and_both_finish():
    """Review of issue 36: a pinned request reserving its whole length beside an older walker took
    the pages that walker's next rounds needed, and neither could move: the engine spun. Issue 43:
    a pinned request holds only what it has written and takes what it lacks from any unpinned
    holder, the older walker too, which comes back later; both finish, the pinned one unpreempted."""
    s, ex = make(slots=4, global_pages=11, chunk=64)  # 10 usable pages = 160 tokens
    old, pinned = req(150, max_tokens=5), req(20, max_tokens=60)  # 10 pages; 5 pages whole
    old.arrival, pinned.arrival, pinned.preemptions = 1.0, 2.0, 2
    for r in (old, pinned):
        s.submit(r)
    events = []
    for _ in range(200):
        if not s.has_work():
            break
        events += s.step(0.0)
    assert not s.has_work(), "the engine stopped moving"
    assert {finished(events, r.id).reason for r in (old, pinned)} == {"length"}
    assert pinned.preemptions == 2 and s.book.glob.used == 0


def test_a_pinned_request_takes_its_next_page_from_an_older_live_row_instead_of_waiting_for_it():
    """Issue 43: a pinned request reserved its whole length before it came in, so it waited at the
    head (and every arrival behind it) until the older stream ended. Now it comes in beside it on
    its prompt's pages and, short of one, takes it from that unpinned row, which is recomputed."""
    s, ex = make(slots=4, global_pages=11, chunk=64)  # 10 usable pages
    old = req(100, max_tokens=50)  # 7 pages as it decodes to its end (149 tokens: 10 pages)
    s.submit(old)
    s.step(0.0)
    pin = req(40, max_tokens=60)  # 3 pages of prompt, 7 whole
    pin.arrival, pin.preemptions = 2.0, 2
    s.submit(pin)
    s.step(0.0)  # old walks its prompt's last 36 rows; pin comes in beside them with 28
    assert pin in s.walk and len(pin.pages.global_pages) == 2  # at once, on the pages of what it wrote
    ev = drain(s)
    assert {finished(ev, r.id).reason for r in (old, pin)} == {"length"}
    assert old.preemptions >= 1 and pin.preemptions == 2 and s.book.glob.used == 0
    first_end = min((r for r in (old, pin)), key=lambda r: ev.index(finished(ev, r.id)))
    assert first_end is pin  # it ran through the older stream's pages, not after them


def test_a_second_pinned_request_waits_while_the_pinned_whole_lengths_would_not_fit_together():
    """The pinned may take from everyone else only while their whole lengths fit the pools together:
    then the pages each one needs always exist among theirs and what the unpinned can give back."""
    s, ex = make(slots=4, global_pages=11, chunk=64)  # 10 usable pages
    p1, p2 = req(30, max_tokens=60), req(30, max_tokens=60)  # 89 tokens: 6 pages whole each
    p1.preemptions = p2.preemptions = 2
    p2.arrival = 2.0
    s.submit(p1)
    s.submit(p2)
    s.schedule(0.0)
    assert s.walk == [p1] and list(s.queue) == [p2]
    ev = drain(s)
    assert {finished(ev, r.id).reason for r in (p1, p2)} == {"length"} and s.book.glob.used == 0


def test_a_pinned_head_that_cannot_fit_even_alone_is_refused_not_parked_forever():
    s, ex = make(slots=4, global_pages=6, chunk=64)  # 5 usable pages = 80 tokens
    r = req(40, max_tokens=60)  # its whole length needs 7 pages: never, even alone
    r.preemptions = 2
    s.submit(r)
    ev = s.step(0.0)
    assert [e.reason for e in ev if isinstance(e, Rejected)] == [
        "the request (pinned after its preemptions: its whole length) needs 7 KV pages per pool, "
        "more than the pools hold with nothing running"
    ]
    assert not s.has_work() and s.book.glob.used == 0


def test_with_the_walk_off_a_whole_prompt_is_a_walker_the_plan_names():
    """Issue 43's one way in: a whole prompt riding the live rows is a walker in `s.walk`, one
    chunk of the plan, like a walk round's, not a request in no container."""
    s, ex = make()
    live = req()
    s.submit(live)
    s.step(0.0)
    a, b = req(30), req(20)
    s.submit(a)
    s.submit(b)
    plan = s.schedule(0.0)
    assert plan.chunks == [(a, 30), (b, 20)] and plan.rows == [live] and plan.budget is None
    assert s.walk == [a, b] and plan.kind == "mixed" and plan.why == "whole prompts ride the live rows"


def test_a_pinned_walker_holds_only_its_written_pages_so_a_follower_that_fits_beside_them_comes_in():
    """A pinned walker used to reserve its whole length (8 pages here for its 2 of prompt), which
    kept out a follower the pool holds beside what it has written."""
    s, ex = make(slots=4, global_pages=21, chunk=32)  # 20 usable pages
    live = req(20, max_tokens=50)
    s.submit(live)
    s.step(0.0)  # live: 2 pages
    pin, big = req(32, max_tokens=97), req(190, max_tokens=10)  # pin: 2 pages of prompt, 8 whole; big: 12
    pin.preemptions = 2
    for r in (pin, big):
        s.submit(r)
    s.schedule(0.0)
    # free 20 - 2 - 2 = 16 pages; big needs 12 + one for the live row: it walks beside pin
    assert s.walk == [pin, big] and not s.queue and len(pin.pages.global_pages) == 2


def test_a_pinned_request_of_exactly_the_pools_length_fits_and_finishes():
    """Its last token is never fed back, so prompt + max_tokens - 1 tokens of KV is all it needs."""
    s, ex = make(slots=1, global_pages=5, chunk=64)  # 4 usable pages = 64 tokens
    r = req(40, max_tokens=25)  # 40 + 25 - 1 = 64
    r.preemptions = 2
    ev = drain(s, [(0, r)])
    assert finished(ev, r.id).reason == "length" and len(r.output) == 25 and s.book.glob.used == 0


def test_a_sink_that_fails_for_a_queued_request_flags_the_queue_for_the_next_turn():
    s, ex = make()
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

    s, _ = make(slots=4, global_pages=11, chunk=64)  # 10 usable pages
    flying, waiting = req(30, max_tokens=60), req(30, max_tokens=60)  # 6 pages whole each
    flying.preemptions = waiting.preemptions = 2
    assert pinned_fit(s, waiting)
    s.flight = (flying, object())
    assert not pinned_fit(s, waiting)  # 6 + 6 pages > 10
    s.flight = None


def test_the_fatal_path_ends_queued_and_live_requests_the_one_way():
    """Every ending goes through `Scheduler.end` (issue 43): on the fatal path a preempted request
    waiting in the queue is counted like a live one and reports the tokens it emitted."""
    s, ex = make(slots=3, global_pages=11)  # 10 usable pages: two 60-token requests fit, three do not
    rs, got = [req(10, max_tokens=50) for _ in range(3)], []
    for i, r in enumerate(rs):
        r.arrival, r.sink = 1.0 + i, got.append
        s.submit(r)
    while s.has_work() and not any(r.preemptions and r in s.queue for r in rs):
        s.step(0.0)
    parked = next(r for r in rs if r in s.queue)
    assert parked.output  # it emitted tokens before it gave its pages back
    s.fail_all("boom")
    ends = {e.request_id: e for e in got if isinstance(e, Finished)}
    assert set(ends) == {r.id for r in rs} and {e.reason for e in ends.values()} == {"error"}
    for r in rs:
        assert ends[r.id].completion_tokens == sum(1 for e in got if isinstance(e, Token) and e.request_id == r.id)
    assert s.metrics.finished["error"] == 3 and s.book.glob.used == 0 and not s.has_work()
