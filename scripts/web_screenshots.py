"""Screenshots of the playground and the dashboard for docs/web.md, taken by headless Chromium
against a running server, at desktop width and at a 390-px-wide phone, with a few streams live so
the dashboard has steps to draw. Saved as small palette PNGs.

    .venv/bin/tailgate serve &                      # any server; the docs' ones: the defaults
    .venv/bin/python scripts/web_screenshots.py http://127.0.0.1:8000 docs/web
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import httpx
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from browser import chromium, missing  # noqa: E402

SIZES = {"desktop": (1280, 860), "phone": (390, 844)}


def until(cond, timeout=300.0):
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError("the page never got there")
        time.sleep(0.1)


def streams(base: str, n: int, tokens: int, stop: threading.Event):
    """n streamed completions, staggered so the engine runs mixed steps as well as decode ones."""

    def one(i):
        body = {"prompt": f"Story {i}: once upon a time", "max_tokens": tokens, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=600) as r:
            for _ in r.iter_lines():
                if stop.is_set():
                    return

    threads = []
    for i in range(n):
        threads.append(threading.Thread(target=one, args=(i,), daemon=True))
        threads[-1].start()
        time.sleep(0.7)  # staggered arrivals (a demo's pacing, not a wait for a condition)
    return threads


def shoot(d, path: Path, width: int, height: int, phone: bool):
    full = max(height, d.execute_script("return document.documentElement.scrollHeight"))
    d.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": width, "height": full, "deviceScaleFactor": 1, "mobile": phone}
    )
    png = path.with_suffix(".raw.png")
    d.save_screenshot(str(png))
    # 256 colours: fewer merge the legend's small swatches into their neighbours.
    Image.open(png).convert("RGB").quantize(colors=256, method=Image.Quantize.MAXCOVERAGE).save(path, optimize=True)
    png.unlink()
    print(f"{path}: {path.stat().st_size // 1024} KiB")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", help="the server's URL, e.g. http://127.0.0.1:8000")
    ap.add_argument("out", type=Path, help="folder for the PNGs (docs/web)")
    a = ap.parse_args()
    if (why := missing()) is not None:
        sys.exit(why)
    a.out.mkdir(parents=True, exist_ok=True)
    d = chromium()
    try:
        for name, (w, h) in SIZES.items():
            d.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": w, "height": h, "deviceScaleFactor": 1, "mobile": name == "phone"},
            )
            d.get(a.base + "/")
            d.find_element("css selector", '[data-testid="mode"] option[value="completion"]').click()
            d.find_element("css selector", '[data-testid="temperature"]').clear()
            d.find_element("css selector", '[data-testid="temperature"]').send_keys("0")
            d.find_element("css selector", '[data-testid="max-tokens"]').clear()
            d.find_element("css selector", '[data-testid="max-tokens"]').send_keys("48")
            d.find_element("css selector", '[data-testid="prompt-input"]').send_keys(
                "The three laws of thermodynamics are"
            )
            d.find_element("css selector", '[data-testid="send"]').click()
            stats = lambda: d.find_element("css selector", '[data-testid="reply-stats"]').text  # noqa: E731
            until(lambda: "finish" in stats())
            shoot(d, a.out / f"playground-{name}.png", w, h, name == "phone")

            d.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": w, "height": h, "deviceScaleFactor": 1, "mobile": name == "phone"},
            )
            stop = threading.Event()
            streams(a.base, 4, 96, stop)
            d.get(a.base + "/dashboard")
            bars = "return document.querySelectorAll('[data-testid=step-timeline] rect').length"
            p99 = lambda: d.find_element("css selector", '[data-testid="metric-itl-p99"]').text  # noqa: E731
            until(lambda: d.execute_script(bars) >= 12 and p99().endswith("ms"))
            shoot(d, a.out / f"dashboard-{name}.png", w, h, name == "phone")
            stop.set()
    finally:
        d.quit()


if __name__ == "__main__":
    main()
