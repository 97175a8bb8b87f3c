"""The prefix cache's reach on Gemma 3's pool shapes, with a fake executor (plain Python, seconds),
on the scheduler of the tree on PYTHONPATH (run it on two checkouts to compare):
    .venv/bin/python scripts/experiments/prefix_capacity.py

1. Capacity: Gemma 3's pools at MAX_CONTEXT=1024 (sliding window 512; the pools `pool_pages` sizes
   for 4 slots), PREFIX_CACHE=64. N distinct 900-token prompts are served one after another, then
   each is sent again with one more token: how many still resume at the whole cached prefix.
2. Under load: the same, with a 700-token system prompt shared by every prompt and 4 requests
   decoding meanwhile (their windows keep the sliding pool busy).
3. Recompute: issue 25's thrash case (three live streams, four walking newcomers, 40 / 48 / 56
   global pages) with PREFIX_CACHE=4: prompt rows computed per useful row.
"""

from tailgate.config import ServingConfig
from tailgate.engine.pages import KVBook, pool_pages
from tailgate.engine.request import Request, Sampled, Scheduled
from tailgate.engine.scheduler import Scheduler


class Ex:
    def __init__(self):
        self.prompt_rows = 0

    def run(self, segments, rows):
        self.prompt_rows += sum(len(s.tokens) for s in segments if len(s.tokens) > 1 or s.sample and s.start == 0)
        return [Sampled(7) for s in segments if s.sample]

    def release(self, rid):
        pass


def text(n, salt):
    return [(j * 7 + salt * 131) % 900 + 1 for j in range(n)]


def drive(s, reqs):
    for r in reqs:
        s.submit(r)
    ev = []
    while s.has_work():
        ev += s.step(0.0)
    return ev


def cached_of(ev, r):
    return next(e.cached_tokens for e in ev if isinstance(e, Scheduled) and e.request_id == r.id)


def capacity(n_prompts, system=0, busy=0):
    pages = pool_pages(1024, 4, 512, 4)
    cfg = ServingConfig(
        max_context=1024, decode_slots=4 + busy, mix_chunk_tokens=64, mix_max_prompts=4, prefix_cache=64
    )
    s = Scheduler(Ex(), KVBook(pages["global"] + 64 * 10, pages["local"], 512), cfg, 1000, clock=lambda: 0.0)
    head = text(system, 999)
    prompts = [head + text(900 - system, i) for i in range(n_prompts)]
    for p in prompts:
        drive(s, [Request(p, 4)] + [Request(text(100, 500 + k), 120) for k in range(busy)])
    whole = 0
    for p in prompts:
        r = Request(p + [5], 1)
        whole += cached_of(drive(s, [r]), r) >= 896
    return whole


def thrash(pages, prefix):
    cfg = ServingConfig(
        max_context=256,
        decode_slots=8,
        mix_gather_rows=512,
        mix_max_prompts=4,
        mix_chunk_tokens=64,
        prefix_cache=prefix,
    )
    s = Scheduler(Ex(), KVBook(pages + 1, None, None), cfg, 1000, clock=lambda: 0.0)
    old = [Request(list(range(1, 17)), 200, arrival=1.0 + i) for i in range(3)]
    new = [Request([(j * 7 + i) % 900 + 1 for j in range(150)], 60, arrival=10.0 + i) for i in range(4)]
    for r in old:
        s.submit(r)
    i = 0
    while s.has_work() or new:
        if i == 40:
            for r in new:
                s.submit(r)
            new = []
        s.step(0.0)
        i += 1
    useful = 3 * 16 + 4 * 150
    return s.executor.prompt_rows, useful, s.metrics.preemptions


for n in (4, 8, 12, 16):
    print(f"capacity: {n} prompts of 900 tokens, {capacity(n)} resume whole")
for n in (4, 8):
    print(f"under load: {n} prompts (700 shared), 4 decoding beside, {capacity(n, 700, 4)} resume whole")
for pages in (40, 48, 56):
    rows, useful, pre = thrash(pages, 4)
    print(
        f"thrash, {pages} pages, PREFIX_CACHE=4: {rows} prompt rows for {useful} useful ({rows / useful:.2f}x), "
        f"{pre} preemptions"
    )
