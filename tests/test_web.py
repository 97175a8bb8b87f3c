"""The playground (`/`) and the dashboard (`/dashboard`) in a real headless Chromium against the
session's live server, and the dashboard's feed and the pages' routes over plain HTTP."""

from __future__ import annotations

import json
import re
import threading
from collections import deque

import httpx
import pytest
from fastapi.testclient import TestClient

from browser import missing
from live import feed_ticks, metric, until, wait_idle
from tailgate.bench.ab import free_port
from tailgate.server.app import ServerState, create_app

KINDS = {"decode", "mixed", "walk", "prefill", "recompute", "lane"}
NO_BROWSER = missing()
needs_browser = pytest.mark.skipif(NO_BROWSER is not None, reason=f"no headless browser: {NO_BROWSER}")

# Records the reply's length at every DOM change the page makes to the conversation, so a test
# sees each frame the stream drew instead of sampling it from outside at its own pace.
RECORD_FRAMES = """
window.__frames = [];
new MutationObserver(() => {
  const r = document.querySelector('[data-testid="reply"]');
  if (r) window.__frames.push(r.textContent.length);
}).observe(document.getElementById("log"), {subtree: true, childList: true, characterData: true});
"""


@pytest.fixture(scope="module")
def browser():
    from browser import chromium

    d = chromium()
    yield d
    d.quit()


def el(d, testid):
    from selenium.webdriver.common.by import By

    return d.find_element(By.CSS_SELECTOR, f'[data-testid="{testid}"]')


def fill(d, testid, value):
    e = el(d, testid)
    e.clear()
    e.send_keys(value)


def open_playground(d, base, max_tokens, mode="completion"):
    """The playground once it has read the model card, in `mode` (it opens in completion mode for
    the served Gemma, a base model), greedy, EOS ignored."""
    from selenium.webdriver.support.ui import Select

    d.get(base + "/")
    assert until(lambda: el(d, "model-note").text, 60)
    Select(el(d, "mode")).select_by_value(mode)
    fill(d, "temperature", "0")
    fill(d, "max-tokens", str(max_tokens))
    el(d, "ignore-eos").click()
    d.execute_script(RECORD_FRAMES)


def tokens_shown(d) -> int:
    m = re.search(r"(\d+) tokens", el(d, "reply-stats").text)
    return int(m.group(1)) if m else 0


@needs_browser
def test_a_typed_message_streams_its_reply_in_over_several_frames_with_its_timings(server, browser):
    base = server[0]
    prompt = "The capital of France is"
    open_playground(browser, base, 10)
    el(browser, "prompt-input").send_keys(prompt)
    el(browser, "send").click()
    assert until(lambda: "finish: length" in el(browser, "reply-stats").text, 120), el(browser, "reply-stats").text
    frames = browser.execute_script("return window.__frames")
    assert len({n for n in frames if n > 0}) >= 3, f"the reply did not grow over several frames: {frames}"
    stats = el(browser, "reply-stats").text
    assert re.search(r"TTFT \d+(\.\d)? ms · 10 tokens · \d+\.\d tok/s", stats), stats
    # One bar per gap (every token after the first), each coloured by its step's kind.
    bars = browser.find_elements("css selector", '[data-testid="gap-strip"] rect')
    assert len(bars) == 9
    # The page joined the chunks into exactly the text the server gives the same request whole.
    whole = httpx.post(
        base + "/v1/completions",
        json={"prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": True},
        timeout=120,
    ).json()
    assert el(browser, "reply").get_attribute("textContent") == whole["choices"][0]["text"]


@needs_browser
def test_a_base_model_opens_the_playground_in_completion_mode_saying_why(server, browser):
    browser.get(server[0] + "/")
    assert until(lambda: "is a base model" in el(browser, "model-note").text, 60)
    assert el(browser, "mode").get_attribute("value") == "completion"
    assert not el(browser, "system").is_displayed()
    assert httpx.get(server[0] + "/version").json()["model"]["base"] is True


@needs_browser
def test_a_chat_sends_the_system_message_and_the_conversation_so_far(server, browser):
    open_playground(browser, server[0], 4, mode="chat")
    el(browser, "ignore-eos").click()  # back off: the chat ends where the model does
    fill(browser, "max-tokens", "4")
    fill(browser, "system", "You answer in French.")
    prompts = []
    for i, text in enumerate(("Hello!", "And again?")):
        fill(browser, "prompt-input", text)
        el(browser, "send").click()
        assert until(lambda: "finish:" in el(browser, "reply-stats").text, 120), el(browser, "reply-stats").text
        prompts.append(int(re.search(r"prompt (\d+) tokens", el(browser, "reply-stats").text).group(1)))
    first = httpx.post(
        server[0] + "/tokenize",
        json={
            "messages": [{"role": "system", "content": "You answer in French."}, {"role": "user", "content": "Hello!"}]
        },
    ).json()
    assert prompts[0] == first["count"]
    # The second turn carried the first question and answer: a longer prompt than both of them.
    assert prompts[1] > prompts[0] + 2


@needs_browser
def test_the_json_schema_box_makes_the_answer_match_the_schema(server, browser):
    schema = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Lyon"]}},
        "required": ["city"],
        "additionalProperties": False,
    }
    open_playground(browser, server[0], 24)
    el(browser, "ignore-eos").click()  # back off: the grammar ends the answer
    fill(browser, "json-schema", "{not json")
    el(browser, "prompt-input").send_keys("The capital of France, as JSON:")
    el(browser, "send").click()
    assert "does not hold JSON" in el(browser, "error").text  # refused in the page, nothing sent
    fill(browser, "json-schema", json.dumps(schema))
    el(browser, "send").click()
    assert until(lambda: "finish:" in el(browser, "reply-stats").text, 120), el(browser, "reply-stats").text
    assert json.loads(el(browser, "reply").get_attribute("textContent"))["city"] in ("Paris", "Lyon")


@needs_browser
def test_stop_mid_stream_cancels_the_request_on_the_server(server, browser):
    base = server[0]
    open_playground(browser, base, 400)
    generated = metric(base, "vllm:generation_tokens_total")
    succeeded = sum(metric(base, "vllm:request_success_total", finished_reason=r) for r in ("stop", "length"))
    el(browser, "prompt-input").send_keys("Once upon a time")
    el(browser, "send").click()
    assert until(lambda: tokens_shown(browser) >= 3 and metric(base, "vllm:num_requests_running") >= 1, 120)
    el(browser, "stop").click()
    # The aborted fetch closed the connection; the server cancelled the request and freed its pages.
    assert until(lambda: metric(base, "vllm:num_requests_running") == 0, 60)
    assert wait_idle(base) == 0
    assert until(lambda: "stopped" in el(browser, "reply-stats").text, 30)
    assert metric(base, "vllm:generation_tokens_total") - generated < 400
    assert sum(metric(base, "vllm:request_success_total", finished_reason=r) for r in ("stop", "length")) == succeeded
    assert el(browser, "send").is_enabled() and not el(browser, "stop").is_enabled()


@needs_browser
def test_the_dashboard_shows_a_live_stream_running_and_draws_its_steps(server, browser):
    base = server[0]
    body = {"prompt": "Once upon a time", "max_tokens": 300, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as r:
        lines = r.iter_lines()
        assert any('"tailgate"' in line for line in lines)  # the stream has its first token
        browser.get(base + "/dashboard")
        running = lambda: el(browser, "metric-running").text  # noqa: E731
        assert until(lambda: running().isdigit() and int(running()) >= 1, 60), running()
        # The bars' kinds in one script call: each tick redraws the timeline, so elements go stale.
        bars = lambda: browser.execute_script(  # noqa: E731
            "return [...document.querySelectorAll('[data-testid=step-timeline] rect')].map(r => r.dataset.kind)"
        )
        assert until(lambda: len(bars()) >= 3, 60)
        assert until(lambda: el(browser, "metric-itl-p99").text.endswith(" ms"), 60)
        kinds = set(bars())
        assert "decode" in kinds and kinds <= KINDS, kinds
        assert el(browser, "feed-status").get_attribute("textContent") == "live"
        assert "decode_slots" in el(browser, "knobs").text and "quant" in el(browser, "kernels").text
    # Leaving the stream cancelled it; the dashboard sees the engine go idle.
    assert until(lambda: el(browser, "metric-running").text == "0", 60)
    assert wait_idle(base) == 0


def test_the_feed_sends_each_engine_step_once_in_order_and_the_gaps_of_the_last_minute(server):
    base = server[0]
    ticks = feed_ticks(base)
    event, hello = next(ticks)
    assert event == "hello" and hello["knobs"]["decode_slots"] == 2 and "dense" in hello["kernels"]
    event, t = next(ticks)  # the feed is attached: the gaps below are in its window
    assert event == "tick"
    generated = t["generation_tokens"]
    r = httpx.post(base + "/v1/completions", json={"prompt": "Hello", "max_tokens": 8, "ignore_eos": True}, timeout=120)
    assert r.status_code == 200
    seqs = []
    # The ticks sent meanwhile, up to the one whose snapshot holds all 8 tokens (its steps and its
    # counters are of the same step boundary, so its steps include the last one).
    while t["generation_tokens"] < generated + 8:
        event, t = next(ticks)
        assert event == "tick"
        seqs += [s["seq"] for s in t["steps"]]
        assert all(s["kind"] in KINDS and s["duration_s"] > 0 for s in t["steps"])
    assert seqs == sorted(set(seqs)) and len(seqs) >= 8  # each step once, oldest first
    assert t["itl"]["n"] >= 7 and 0 < t["itl"]["p50_s"] <= t["itl"]["p99_s"]  # 8 tokens: 7 gaps
    ticks.close()
    # A page that reconnects names the last step it has and gets only the ones after it.
    again = feed_ticks(base, since=seqs[-3])
    next(again)
    assert [s["seq"] for s in next(again)[1]["steps"]] == seqs[-2:]
    again.close()


def test_the_itl_window_holds_the_gaps_of_the_last_minute_and_only_tokens_gaps():
    from tailgate.engine.request import Scheduled, Token
    from tailgate.server.feed import ItlWindow

    w = ItlWindow()
    # Two engine steps' event lists, as the observer hands them over: a first token has no gap.
    w.pending.append([Scheduled("a", at=10.0), Token("a", at=10.0), Token("b", at=10.5, gap=0.5)])
    w.pending.append([Token("a", at=70.2, gap=0.1), Token("b", at=70.2, gap=0.3)])
    assert w.stats(70.4) == {"n": 3, "p50_s": 0.3, "p99_s": 0.5, "window_s": 60.0}  # 10.5 is within 60 s
    assert w.stats(71.0) == {"n": 2, "p50_s": 0.3, "p99_s": 0.3, "window_s": 60.0}  # and now it is not
    assert w.stats(200.0)["n"] == 0 and w.stats(200.0)["p99_s"] is None


def test_a_longer_window_covers_a_whole_run_and_gaps_stay_no_longer_than_the_feed_keeps_them():
    """What `tailgate bench` asks after a run past the minute (`?window=S`): the same gaps over
    its S seconds, the socket's too; nothing older than KEEP_S is kept for anyone."""
    from tailgate.engine.request import Token
    from tailgate.server.feed import KEEP_S, ItlWindow, recent

    w = ItlWindow()
    w.pending.append([Token("a", at=10.0, gap=0.5)])
    w.pending.append([Token("a", at=80.0, gap=0.1)])
    assert w.stats(80.0)["n"] == 1  # the minute's
    assert w.stats(80.0, 75.0) == {"n": 2, "p50_s": 0.5, "p99_s": 0.5, "window_s": 75.0}
    assert w.stats(80.0, 60.0)["n"] == 1  # a long window asked once trims nothing a short one sees
    assert w.stats(10.0 + KEEP_S + 1.0, KEEP_S)["n"] == 1 and len(w.gaps) == 1  # past KEEP_S: dropped
    socket = deque([(10.0, 0.3), (80.0, 0.2)])
    assert recent(socket, 80.0)["n"] == 1 and recent(socket, 80.0, 75.0)["n"] == 2 and len(socket) == 2


def test_a_feed_window_that_is_not_seconds_from_1_to_what_the_feed_keeps_is_a_400_naming_it():
    c = TestClient(create_app(ServerState(served_name="m")))
    for raw in ("0.5", "901", "nan", "inf", "-5", "1e3", "soon", ""):
        r = c.get(f"/dashboard/feed?window={raw}")
        assert r.status_code == 400 and r.json()["error"]["param"] == "window", raw
    r = c.get("/dashboard/feed?window=600")  # a good window: on to the next check (no model yet)
    assert r.status_code == 503


def test_the_pages_and_their_files_are_served_and_nothing_else_is():
    c = TestClient(create_app(ServerState(served_name="m")))
    for path, ctype in (
        ("/", "text/html"),
        ("/dashboard", "text/html"),
        ("/static/dashboard.js", "text/javascript"),
        ("/static/web.css", "text/css"),
    ):
        r = c.get(path)
        assert r.status_code == 200 and r.headers["content-type"].startswith(ctype), path
    for path in ("/static/..%2Fweb.py", "/static/web.py", "/static/nope.js", "/static/.hidden.js"):
        r = c.get(path)
        assert r.status_code == 404 and r.json()["error"]["code"] == 404, path
    assert "/dashboard/feed" not in c.get("/openapi.json").json()["paths"]


def test_docs_is_swagger_ui_whose_every_file_comes_from_this_server(server):
    """/docs works offline: the page names no other host, and each file it loads is ours."""
    base = server[0]
    r = httpx.get(base + "/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text
    assert "SwaggerUIBundle" in r.text
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//", r.text), r.text  # no CDN, no other host
    assets = re.findall(r"(?:src|href)\s*=\s*[\"']([^\"']+\.(?:js|css))[\"']", r.text)
    assert {a.rsplit(".", 1)[1] for a in assets} == {"js", "css"}, assets
    for url in assets:
        got = httpx.get(base + url)
        kind = "javascript" if url.endswith(".js") else "css"
        assert got.status_code == 200 and kind in got.headers["content-type"] and len(got.content) > 10_000, url
    assert re.search(r"url:\s*'/openapi\.json'", r.text)  # the schema, from here too
    paths = httpx.get(base + "/openapi.json").json()["paths"]
    assert not [p for p in paths if p.startswith("/docs")]  # a page, not API: nothing for the fuzzer


def test_docs_serves_only_the_swagger_ui_files_it_names():
    c = TestClient(create_app(ServerState(served_name="m")))
    for path in ("/docs/static/index.html", "/docs/static/..%2F__init__.py", "/docs/static/swagger-ui.js.map"):
        r = c.get(path)
        assert r.status_code == 404 and r.json()["error"]["code"] == 404, path
    assert c.get("/docs/static/favicon-32x32.png").headers["content-type"] == "image/png"


@needs_browser
def test_docs_draws_every_operation_of_the_schema_in_a_browser(server, browser):
    """Swagger UI 5 (the only line that reads OpenAPI 3.1, what FastAPI writes) renders the
    schema: one block per operation, and no "Unable to render this definition"."""
    from selenium.webdriver.common.by import By

    base = server[0]
    ops = {(m.upper(), p) for p, item in httpx.get(base + "/openapi.json").json()["paths"].items() for m in item}
    browser.get(base + "/docs")

    def drawn():  # each operation's block as (METHOD, path), read in one call
        texts = browser.execute_script(
            "return [...document.querySelectorAll('.opblock-summary')].map(e => e.innerText)"
        )
        return {tuple(t.split()[:2]) for t in texts if len(t.split()) >= 2}

    assert until(lambda: drawn() >= ops, 60), (sorted(ops - drawn()), browser.page_source[-2000:])
    assert not browser.find_elements(By.CSS_SELECTOR, ".errors-wrapper")


def test_the_feed_asks_for_the_api_key_before_anything_and_waits_for_the_model():
    c = TestClient(create_app(ServerState(served_name="m", api_key="sesame")))
    r = c.get("/dashboard/feed")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = c.get("/dashboard/feed", headers={"Authorization": "Bearer sesame"})
    assert r.status_code == 503 and "loading" in r.json()["error"]["message"]
    r = c.get("/dashboard/feed?since=1e3", headers={"Authorization": "Bearer sesame"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "since"
    assert c.get("/").status_code == 200  # the page itself asks for the key, so it loads without one


@pytest.fixture(scope="module")
def keyed_server():
    """The app with an API key and no model, in this process (no weights: the pages and the key
    checks need none): its feed answers 503 once the key is right."""
    import uvicorn

    srv = uvicorn.Server(
        uvicorn.Config(
            create_app(ServerState(served_name="keyed-model", api_key="sesame")),
            host="127.0.0.1",
            port=free_port(),
            log_level="warning",
        )
    )
    t = threading.Thread(target=srv.run, name="keyed-server", daemon=True)
    t.start()
    assert until(lambda: srv.started, 60)
    yield f"http://127.0.0.1:{srv.config.port}"
    srv.should_exit = True
    t.join(30)


@needs_browser
def test_the_pages_send_the_api_key_typed_into_them(keyed_server, browser):
    from selenium.webdriver.common.keys import Keys

    status = lambda: el(browser, "feed-status").get_attribute("textContent")  # noqa: E731
    browser.get(keyed_server + "/dashboard")
    assert until(lambda: status().startswith("401"), 30), status()
    el(browser, "api-key").send_keys("sesame", Keys.TAB)  # a change reconnects the feed with the key
    assert until(lambda: status().startswith("503") and "loading" in status(), 30), status()
    browser.get(keyed_server + "/")  # the other page remembers the key and sends it on /v1
    assert until(lambda: el(browser, "model-name").text == "keyed-model", 30)
    browser.execute_script("localStorage.clear()")
