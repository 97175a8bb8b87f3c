"""A real headless Chromium for the web page tests (tests/test_web.py) and the docs' screenshots
(scripts/web_screenshots.py), driven through selenium and the system's own chromedriver, so
nothing is downloaded at run time (selenium's driver manager would fetch one)."""

from __future__ import annotations

import os
import shutil

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
HOW = "install one with `bash scripts/setup --browser` (Debian/Ubuntu: apt-get install chromium chromium-driver)"


def missing() -> str | None:
    """Why no browser can run here, or None when one can."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (the test extra: pip install -e '.[test]')"
    if not _binary():
        return f"no Chromium on PATH ({', '.join(BROWSERS)}; or TAILGATE_CHROMIUM=path); {HOW}"
    if not shutil.which("chromedriver"):
        return f"no chromedriver on PATH; {HOW}"
    return None


def _binary() -> str | None:
    return os.environ.get("TAILGATE_CHROMIUM") or next(filter(None, map(shutil.which, BROWSERS)), None)


def chromium(width: int = 1280, height: int = 900):
    """A headless Chromium window of `width` x `height` CSS pixels; the caller quits it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = _binary()
    # --no-sandbox: CI containers run as root, where Chromium's sandbox refuses to start;
    # the pages it opens are our own, on loopback.
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--disable-extensions",
        "--no-first-run",
        f"--window-size={width},{height}",
    ):
        opts.add_argument(arg)
    driver = webdriver.Chrome(options=opts, service=Service(shutil.which("chromedriver")))
    driver.set_window_size(width, height)
    return driver
