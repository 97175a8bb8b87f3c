"""Prompt rows computed vs useful in issue 25's thrash case (three live streams, four walking
newcomers, a tight KV budget; fake executor), on the scheduler of the tree on PYTHONPATH:
    .venv/bin/python scripts/experiments/thrash_rows.py"""

from tailgate.config import ServingConfig
from tailgate.engine.pages import KVBook
from tailgate.engine.request import Finished, Request, Sampled
from tailgate.engine.scheduler import Scheduler


class Ex:
    def __init__(self):
        self.prompt_rows = 0

    def run(self, segments, rows):
        self.prompt_rows += sum(len(s.tokens) for s in segments if len(s.tokens) > 1 or s.start == 0)
        return [Sampled(7) for s in segments if s.sample]

    def release(self, rid):
        pass


def case(pages, old_n=3, new_n=4, old=(16, 200), new=(150, 60), at=40):
    cfg = ServingConfig(
        max_context=256,
        decode_slots=8,
        mix_gather_rows=512,
        mix_max_prompts=4,
        admit_coalesce_ms=None,
        mix_chunk_tokens=64,
    )
    s = Scheduler(Ex(), KVBook(pages + 1, None, None), cfg, 1000, clock=lambda: 0.0)
    reqs = [Request(prompt=list(range(1, old[0] + 1)), max_tokens=old[1], arrival=1.0 + i) for i in range(old_n)]
    news = [
        Request(prompt=[(j * 7 + i) % 900 + 1 for j in range(new[0])], max_tokens=new[1], arrival=10.0 + i)
        for i in range(new_n)
    ]
    for r in reqs:
        s.submit(r)
    ev, i = [], 0
    while s.has_work() or news:
        if i == at:
            for r in news:
                s.submit(r)
            news = []
        ev += s.step(0.0)
        i += 1
    useful = old_n * old[0] + new_n * new[0]
    fin = [e.reason for e in ev if isinstance(e, Finished)]
    print(
        f"pages {pages}: prompt rows computed {s.executor.prompt_rows} for {useful} useful "
        f"({s.executor.prompt_rows / useful:.2f}x), preemptions {s.metrics.preemptions}, finishes {sorted(fin)}, steps {i}"
    )


for pages in (40, 48, 56):
    case(pages)
