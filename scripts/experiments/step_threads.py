"""Which thread issues a decode step, and what libgomp's pools make of it (docs/runtime.md, "One
thread runs OpenMP work"). One decode row at 256 keys, median of 20 steps, three rounds:
  main        load and step on the main thread
  second      load on the main thread (its pool lives on), step from a second thread
  server      load on a thread that exits (as `tailgate serve` does), step from another
Run each mode as its own process, alternated, on a quiet host:
  .venv/bin/python scripts/experiments/step_threads.py MODEL {main,second,server}"""

import sys
import threading
import time

box: dict = {}


def load(model: str) -> None:
    from tailgate.engine.pages import KVBook, SeqPages, pool_pages
    from tailgate.engine.plan import Segment
    from tailgate.model.formats.weights import load_model
    from tailgate.model.kernels.choice import choose
    from tailgate.model.runtime.runner import ModelRunner

    m = load_model(model)
    pages = pool_pages(600, 20, m.spec.sliding_window, transient_prompts=2)
    runner = ModelRunner(m.spec, m.weights, pages, plan=choose("auto", "auto", "cpu"))
    book = KVBook(pages["global"], pages.get("local"), m.spec.sliding_window)
    seq = SeqPages()
    book.reserve(seq, 300)
    seq.frontier = 256
    segs = [Segment([100], 256, seq)]
    for _ in range(3):  # OpenMP work on the loading thread, as the start probe's
        runner.step(segs)
    box.update(runner=runner, segs=segs)


def median_step_ms() -> float:
    runner, segs = box["runner"], box["segs"]
    for _ in range(3):
        runner.step(segs)
    times = []
    for _ in range(20):
        t = time.perf_counter()
        runner.step(segs)
        times.append(time.perf_counter() - t)
    return sorted(times)[10] * 1e3


def on_thread(fn) -> None:
    th = threading.Thread(target=fn)
    th.start()
    th.join()


def main() -> None:
    model, mode = sys.argv[1], sys.argv[2]
    if mode == "server":
        on_thread(lambda: load(model))
    else:
        load(model)
    out: list[float] = []
    rounds = lambda: out.extend(round(median_step_ms(), 1) for _ in range(3))  # noqa: E731
    rounds() if mode == "main" else on_thread(rounds)
    print(mode, out)


if __name__ == "__main__":
    main()
