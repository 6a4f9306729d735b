"""The HTML report in headless Chromium (issue 8): it loads from disk with no failed or outgoing
request, shows the right rollouts and calls, and a click opens a call.

Chromium comes from Debian's `chromium` package, installed here when missing (as root); where it
cannot be installed the test is skipped with the reason. The browser is driven over the Chrome
DevTools Protocol with aiohttp's WebSocket client, so no other test dependency is needed.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import shutil
import subprocess

import aiohttp
import pytest
from click.testing import CliRunner

from proxy import main

from tests.capture_dirs import CONVERSATIONS, make_capture_dir, make_conversation_dir

#: A real browser, installed from the distribution when missing: a cached tier of its own, outside
#: `make test-quick` (issue 75), in `make test`.
pytestmark = pytest.mark.slow

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--remote-debugging-port=0"]


def chromium_or_skip() -> str:
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0:
        pytest.skip("Chromium is not installed and installing it needs root (apt-get install chromium)")
    done = subprocess.run("apt-get install -y -qq chromium || (apt-get update -qq && apt-get install -y -qq chromium)",
                          shell=True, capture_output=True, text=True, timeout=600, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    found = shutil.which("chromium")
    if not found:
        pytest.skip(f"Chromium could not be installed: {done.stderr.strip()[-300:]}")
    return found


class DevTools:
    """A minimal Chrome DevTools Protocol session on one page."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        self.ids = itertools.count(1)
        self.events: list[dict] = []

    async def call(self, method: str, **params: object) -> dict:
        message_id = next(self.ids)
        await self.socket.send_json({"id": message_id, "method": method, "params": params})
        while True:
            message = await asyncio.wait_for(self.socket.receive_json(), 30)
            if message.get("id") == message_id:
                assert "error" not in message, message
                return message.get("result", {})
            self.events.append(message)

    async def evaluate(self, expression: str) -> object:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result["result"].get("value")

    async def wait_for_event(self, method: str) -> None:
        while not any(e.get("method") == method for e in self.events):
            self.events.append(await asyncio.wait_for(self.socket.receive_json(), 30))


class Browser:
    """Headless Chromium with one page, driven over the DevTools protocol."""

    def __init__(self, tmp_path) -> None:
        self.tmp_path = tmp_path

    async def __aenter__(self) -> DevTools:
        chromium = chromium_or_skip()
        self.process = await asyncio.create_subprocess_exec(
            chromium, *CHROMIUM_FLAGS, f"--user-data-dir={self.tmp_path / 'profile'}", "about:blank",
            stderr=asyncio.subprocess.PIPE)
        port = None
        while port is None:
            line = (await asyncio.wait_for(self.process.stderr.readline(), 60)).decode()  # type: ignore[union-attr]
            found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            port = int(found.group(1)) if found else None
            assert line, "Chromium exited before listening"
        self.http = aiohttp.ClientSession()
        targets = await (await self.http.get(f"http://127.0.0.1:{port}/json/list")).json()
        page = next(t for t in targets if t["type"] == "page")
        self.socket = await self.http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        tools = DevTools(self.socket)
        for domain in ("Network.enable", "Page.enable", "Runtime.enable"):
            await tools.call(domain)
        return tools

    async def __aexit__(self, *exc: object) -> None:
        await self.socket.close()
        await self.http.close()
        self.process.kill()
        await self.process.wait()


async def open_page(tools: DevTools, path: str, width: int = 1400, height: int = 1000, fragment: str = "") -> None:
    """Load the page afresh (a blank page first, so the same page with another fragment loads too)."""
    await tools.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                     mobile=width < 800)
    for url in ("about:blank", f"file://{path}{fragment}"):
        tools.events.clear()
        await tools.call("Page.navigate", url=url)
        await tools.wait_for_event("Page.loadEventFired")


async def click(tools: DevTools, selector: str) -> None:
    box = await tools.evaluate("(() => { const e = document.querySelector(" + repr(selector) + ");"
                               "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
                               "return [r.x + r.width / 2, r.y + r.height / 2]; })()")
    for kind in ("mousePressed", "mouseReleased"):  # A real click at the element's position.
        await tools.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)


async def detail_text(tools: DevTools, containing: str) -> str:
    """The detail pane's text once the call's payloads (loaded lazily) are in."""
    for _ in range(100):
        text = await tools.evaluate("document.querySelector('#detail').innerText")
        if containing in text:
            return text
        await asyncio.sleep(0.05)
    raise AssertionError(f"{containing!r} never appeared in the detail pane: {text!r}")


def assert_offline_and_clean(tools: DevTools) -> None:
    requests = [e["params"]["request"]["url"] for e in tools.events if e.get("method") == "Network.requestWillBeSent"]
    assert all(url.startswith(("file://", "data:")) for url in requests), f"the page asked the network: {requests}"
    assert not [e for e in tools.events if e.get("method") == "Network.loadingFailed"], "a request failed"
    errors = [e for e in tools.events if e.get("method") == "Runtime.exceptionThrown"]
    assert not errors, f"the page's script failed: {errors}"


async def test_report_loads_offline_and_a_click_opens_a_call(tmp_path):
    captures = str(tmp_path / "captures")
    make_capture_dir(captures, rollouts=3, calls=12)
    report = str(tmp_path / "report.html")
    assert CliRunner().invoke(main, ["report", captures, "-o", report]).exit_code == 0
    assert os.path.isfile(tmp_path / "report_files" / "r0.js"), "payloads go beside the page"
    async with Browser(tmp_path) as tools:
        await open_page(tools, report)
        assert await tools.evaluate("document.querySelectorAll('section.rollout').length") == 3
        assert await tools.evaluate("document.querySelectorAll('.call').length") == 36
        assert await tools.evaluate("document.querySelectorAll('.call.error').length") == 3
        summary = await tools.evaluate("document.querySelector('#summary').innerText")
        assert "36 calls" in summary and "3 rollouts, 3 errors" in summary and "upstream_error: 3" in summary
        assert await tools.evaluate("document.querySelector('section.rollout .meta').innerText") == "12 calls, 1 error, 11.5 s"
        await click(tools, 'section[data-rollout="rollout-0001"] .call[data-index="3"] .track')
        detail = await detail_text(tools, "question 3")
        assert "rollout-0001 — call 3" in detail and "answer 3" in detail
        await tools.evaluate("document.querySelector('#detail details summary').click()")
        assert '"model": "policy"' in await detail_text(tools, "raw request JSON\n{"), "the raw JSON is one click away"
        # Sorted by errors first, filtered, then a link from the summary opens the slowest call.
        await tools.evaluate("document.getElementById('filter').value = '0002';"
                             "document.getElementById('filter').dispatchEvent(new Event('input'))")
        assert await tools.evaluate("[...document.querySelectorAll('section.rollout')].map(s => s.dataset.rollout)") == ["rollout-0002"]
        await click(tools, "#slowest ol a")
        assert "call 11" in await detail_text(tools, "question 11")
        assert_offline_and_clean(tools)


async def test_incomplete_rollouts_are_counted_and_filtered_and_an_error_reads_as_one(tmp_path):
    """Issue 33, point 5: the run card counts rollouts that lost capture lines and filters to them;
    an error reply is drawn as an error with its sentence, not in the model's reply box."""
    captures = str(tmp_path / "captures")
    make_capture_dir(captures, rollouts=3, calls=10)
    open(os.path.join(captures, "rollout-0002.capture.incomplete"), "wb").close()
    report = str(tmp_path / "report.html")
    assert CliRunner().invoke(main, ["report", captures, "-o", report]).exit_code == 0
    async with Browser(tmp_path) as tools:
        await open_page(tools, report)
        run = await tools.evaluate("document.querySelector('#run').innerText")
        assert "1 incomplete rollout (capture lines lost)" in run, run
        await click(tools, "#run .incomplete a")
        assert await tools.evaluate("[...document.querySelectorAll('section.rollout')].map(s => s.dataset.rollout)") == [
            "rollout-0002"]
        await click(tools, 'section[data-rollout="rollout-0002"] .call[data-index="9"] .track')
        detail = await detail_text(tools, "boom")
        assert "ERROR REPLY" in detail.upper() and "\nREPLY\n" not in detail.upper(), detail
        assert_offline_and_clean(tools)


HOSTILE = ["Continue this page: <html><!-- TODO add <script> tag", "</script><script>document.body.innerHTML=''</script>",
           "<!-- <script>", "line\u2028separator\u2029paragraph", "emoji \U0001f600 and \u00e9 and \u2603", "]]><![CDATA[",
           "<img src=x onerror=alert(1)>"]


async def test_payloads_full_of_html_scripts_comments_and_unicode_render(tmp_path):
    """Captured text is data: every `<` escaped, U+2028/2029 too; the page still shows every rollout."""
    from records.contract import encode_capture_line
    captures = tmp_path / "captures"
    captures.mkdir()
    for number, text in enumerate(HOSTILE):
        line = encode_capture_line({"model_call_id": f"{number:032x}", "dialect": "chat", "status_code": 200,
                                    "started_at": 1767225600.0, "latency_ms": 10.0,
                                    "request": {"model": "m", "messages": [{"role": "user", "content": text}]},
                                    "response": {"object": "chat.completion", "model": "m", "choices": [
                                        {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]}})
        (captures / f"{text[:3].encode().hex()}-{number}.capture.jsonl").write_bytes(line)
    report = str(tmp_path / "report.html")
    assert CliRunner().invoke(main, ["report", str(captures), "-o", report]).exit_code == 0
    page = open(report, encoding="utf-8").read()
    data = page[page.index('<script id="data"'):]
    assert "<!--" not in data[data.index(">") + 1:data.index("</script>")], "no raw < in the embedded data"
    async with Browser(tmp_path) as tools:
        await open_page(tools, report)
        assert await tools.evaluate("document.querySelectorAll('section.rollout').length") == len(HOSTILE)
        for number, text in enumerate(HOSTILE):
            rollout = f"{text[:3].encode().hex()}-{number}"
            await click(tools, f'section[data-rollout="{rollout}"] .call .track')
            shown = await detail_text(tools, json_string(text))
            assert shown.startswith(rollout + " — call 0")
        assert await tools.evaluate("document.querySelectorAll('section.rollout').length") == len(HOSTILE), "nothing ran"
        assert_offline_and_clean(tools)


def json_string(text: str) -> str:
    """How ``text`` appears in the pretty-printed JSON of the detail pane."""
    import json
    return json.dumps(text, ensure_ascii=False)[1:-1]


async def test_screenshots_at_desktop_and_phone_width(tmp_path):
    """The summary and a conversation with tool calls at 1400x1000 and at a phone's 390x844; kept
    in benchmarks/results/report-{summary,conversation}-{desktop,phone}.png when
    MCC_REPORT_SCREENSHOTS names a directory."""
    import base64
    captures = str(tmp_path / "captures")
    make_conversation_dir(captures)
    make_capture_dir(captures, rollouts=6, calls=12)
    report = str(tmp_path / "report.html")
    assert CliRunner().invoke(main, ["report", captures, "-o", report]).exit_code == 0
    keep = os.environ.get("MCC_REPORT_SCREENSHOTS")
    async with Browser(tmp_path) as tools:
        for name, width, height in (("desktop", 1400, 1000), ("phone", 390, 844)):
            for view, fragment in (("summary", ""), ("conversation", "#call=conv-chat/0")):
                await open_page(tools, report, width, height, fragment)
                if fragment:
                    await detail_text(tools, "tool call forecast")
                overflow = await tools.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
                assert overflow <= 1, f"the page scrolls sideways at {width}px"
                shot = await tools.call("Page.captureScreenshot", format="png")
                assert len(shot["data"]) > 1000
                if keep:
                    with open(os.path.join(keep, f"report-{view}-{name}.png"), "wb") as handle:
                        handle.write(base64.b64decode(shot["data"]))
        assert_offline_and_clean(tools)


WIDTHS = (("desktop", 1400, 1000), ("phone", 390, 844))


async def detail_in_view(tools: DevTools) -> bool:
    """The detail pane is where the reader looks: in the viewport, and on top at its middle."""
    return await tools.evaluate("(() => { const d = document.querySelector('#detail'), r = d.getBoundingClientRect();"
                                "const hit = document.elementFromPoint(innerWidth > 800 ? r.x + r.width / 2 : innerWidth / 2,"
                                " Math.min(innerHeight, r.bottom) - 40);"
                                "return r.top >= -1 && r.top < innerHeight / 2 && d.contains(hit); })()")


@pytest.fixture
def conversation_report(tmp_path):
    captures = str(tmp_path / "captures")
    make_conversation_dir(captures)
    make_capture_dir(captures, rollouts=60, calls=12)
    report = str(tmp_path / "report.html")
    assert CliRunner().invoke(main, ["report", captures, "-o", report]).exit_code == 0
    return report


@pytest.mark.parametrize("name,width,height", WIDTHS)
async def test_a_call_reads_as_a_conversation_in_every_dialect(tmp_path, conversation_report, name, width, height):
    """Issue 22, point 1: roles, tool calls with arguments, the results that answer them, reasoning
    apart from the answer, the reply; the raw JSON one click away. Opened by its link."""
    async with Browser(tmp_path) as tools:
        for dialect in CONVERSATIONS:
            await open_page(tools, conversation_report, width, height, f"#call=conv-{dialect}/0")
            text = await detail_text(tools, "REPLY")
            assert text.startswith(("← back", f"conv-{dialect} — call 0")) and f"conv-{dialect} — call 0" in text
            assert "Checking the forecast." in text
            if dialect == "completions":
                assert "PROMPT" in text and "Weather in Paris? Answer:" in text and "COMPLETION" in text
            else:
                for said in ("SYSTEM\nYou are terse.", "USER\nWeather in Paris?", "tools offered: search",
                             "tool call search", '"q": "paris"', "tool result of search", "18 C and sunny",
                             "reasoning\nThe user wants tomorrow too.", "tool call forecast", '"city": "Paris"'):
                    assert said in text, (dialect, said, text)
                kinds = await tools.evaluate("[...document.querySelectorAll('#detail .msg.reply .part')].map(p => p.className)")
                assert kinds == ["part reasoning", "part text", "part tool_call"], (dialect, kinds)
            assert await detail_in_view(tools), f"{dialect}: the call is not in view at {width}px"
            await tools.evaluate("document.querySelectorAll('#detail details summary')[1].click()")
            assert '"policy"' in await detail_text(tools, "raw response JSON\n{")
        overflow = await tools.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 1, f"the page scrolls sideways at {width}px"
        assert_offline_and_clean(tools)


async def facet_options(tools: DevTools, facet: str) -> list[str]:
    return await tools.evaluate(f"[...document.getElementById('facet-{facet}').options].map(o => o.text)")


async def choose(tools: DevTools, element_id: str, value: str) -> None:
    await tools.evaluate(f"(() => {{ const e = document.getElementById({element_id!r}); e.value = {value!r};"
                         "e.dispatchEvent(new Event('input')); })()")


async def shown_rollouts(tools: DevTools) -> list[str]:
    return await tools.evaluate("[...document.querySelectorAll('section.rollout')].map(s => s.dataset.rollout)")


@pytest.mark.slow
@pytest.mark.parametrize("name,width,height", WIDTHS)
async def test_filters_combine_and_count_and_links_open_calls(tmp_path, conversation_report, name, width, height):
    """Issue 22, point 2: each filter, combined, with counts; the id filter ignores case; a link
    opens its call (and the phone shows it), a rollout link its rollout; back returns to the list."""
    async with Browser(tmp_path) as tools:
        await open_page(tools, conversation_report, width, height)
        matching = "document.querySelector('#rollouts').dataset.matching"
        assert await tools.evaluate(matching) == str(60 * 12 + 4 * 3)
        assert await facet_options(tools, "category") == ["any", "ok (664)", "upstream_error (60)",
                                                          "rate_limit (4)", "stream_truncated (4)"]
        await choose(tools, "facet-category", "upstream_error")
        assert await tools.evaluate(matching) == "60"
        assert len(await shown_rollouts(tools)) == 50, "a page of 50, the rest behind 'show more'"
        assert "60 of 60 rollouts" not in await tools.evaluate("document.querySelector('#shown').innerText")
        await click(tools, "#more")
        assert len(await shown_rollouts(tools)) == 60
        assert await tools.evaluate("document.querySelectorAll('.call:not(.dim)').length") == 60
        # Counts follow the other filters: with upstream_error chosen, every such call is chat and status 500.
        assert await facet_options(tools, "dialect") == ["any", "chat (60)"]
        assert await facet_options(tools, "status") == ["any", "500 (60)"]
        await choose(tools, "facet-category", "")
        await choose(tools, "facet-dialect", "messages")
        assert await shown_rollouts(tools) == ["conv-messages"]
        await choose(tools, "facet-status", "429")
        assert await tools.evaluate(matching) == "1"
        assert await facet_options(tools, "finish") == ["any", "none (1)"]
        await choose(tools, "facet-finish", "none")
        await choose(tools, "facet-model", "policy")
        assert await tools.evaluate(matching) == "1", "five filters combined"
        for facet in ("dialect", "status", "finish", "model"):
            await choose(tools, f"facet-{facet}", "")
        await choose(tools, "filter", "ROLLOUT-0042")
        assert await shown_rollouts(tools) == ["rollout-0042"], "the id filter ignores case"
        await choose(tools, "filter", "")
        # A link from the summary opens its call wherever it is in the list.
        await tools.evaluate("location.hash = '#call=rollout-0057/9'")
        text = await detail_text(tools, "question 9")
        assert "rollout-0057 — call 9" in text and await detail_in_view(tools)
        assert await tools.evaluate("document.querySelector('.call.selected').closest('section').dataset.rollout") == "rollout-0057"
        if width < 800:
            await click(tools, "#detail .back")
            for _ in range(50):
                if not await tools.evaluate("document.querySelector('#detail').classList.contains('open')"):
                    break
                await asyncio.sleep(0.05)
            assert not await detail_in_view(tools), "back closes the call"
            top = await tools.evaluate("document.querySelector('section[data-rollout=\"rollout-0057\"]').getBoundingClientRect().top")
            assert -2 <= top < height, "back shows the call's rollout"
        await open_page(tools, conversation_report, width, height, "#rollout=conv-responses")
        top = await tools.evaluate("document.querySelector('section.target').getBoundingClientRect().top")
        assert await tools.evaluate("document.querySelector('section.target').dataset.rollout") == "conv-responses"
        assert -2 <= top < height
        await open_page(tools, conversation_report, width, height, "#call=no-such-rollout/1")
        assert "No rollout no-such-rollout in this report." in await detail_text(tools, "No rollout")
        assert_offline_and_clean(tools)


@pytest.mark.parametrize("name,width,height", WIDTHS)
async def test_cut_streams_have_their_colour_and_every_failure_is_reachable(tmp_path, conversation_report, name, width, height):
    """Issue 22, point 3: a 200 whose stream was cut is not a client error; failed calls grouped
    by category with counts, each group's 'show all' reaching every call of it."""
    async with Browser(tmp_path) as tools:
        await open_page(tools, conversation_report, width, height)
        colour = ("(sel => getComputedStyle(document.querySelector(sel)).backgroundColor)")
        cut = await tools.evaluate(colour + "('section[data-rollout=\"conv-chat\"] .call[data-index=\"1\"] .bar')")
        limited = await tools.evaluate(colour + "('section[data-rollout=\"conv-chat\"] .call[data-index=\"2\"] .bar')")
        assert cut == "rgb(123, 31, 162)" and limited == "rgb(239, 108, 0)"
        legend = await tools.evaluate("document.querySelector('.legend').innerText")
        assert "200, stream cut or incomplete" in legend
        failed = await tools.evaluate("document.querySelector('#failed').innerText")
        assert failed.index("upstream_error: 60") < failed.index("rate_limit: 4") < failed.index("stream_truncated: 4"), \
            "categories by count"
        groups = await tools.evaluate("[...document.querySelectorAll('#failed .group')].length")
        assert groups == 3
        await click(tools, "#failed .group:nth-of-type(1) a")  # "show all" of upstream_error
        assert await tools.evaluate("document.getElementById('facet-category').value") == "upstream_error"
        assert await tools.evaluate("document.querySelector('#rollouts').dataset.matching") == "60"
        await click(tools, "#failed .group:nth-of-type(3) li a")
        assert "conv-chat — call 1" in await detail_text(tools, "FAILURE")
        assert "the upstream closed mid-stream" in await detail_text(tools, "FAILURE")
        assert await detail_in_view(tools)
        run = await tools.evaluate("document.querySelector('#run').innerText")
        assert "from 2026-01-01 00:00:00 UTC" in run and "to 2026-01-01 00:00:11 UTC" in run, run
        assert_offline_and_clean(tools)


async def test_durations_past_a_minute_read_as_hours_minutes_seconds_and_axis_labels_never_overlap(tmp_path):
    """Issue 22, points 3 and 4: 69,156 s is 19:12:36; at 390 px the time axis keeps its labels apart."""
    from records.contract import encode_capture_line
    captures = tmp_path / "captures"
    captures.mkdir()
    for number, latency_ms in enumerate((69_156_000.0, 65_000.0, 900.0)):
        (captures / f"long-{number}.capture.jsonl").write_bytes(encode_capture_line(
            {"model_call_id": str(number), "dialect": "chat", "status_code": 200, "started_at": 1767225600.0,
             "completed_at": 1767225600.0 + latency_ms / 1000, "latency_ms": latency_ms, "latency_ttft_ms": None,
             "request": {"model": "m", "messages": []}, "response": None}))
    report = str(tmp_path / "report.html")
    assert CliRunner().invoke(main, ["report", str(captures), "-o", report]).exit_code == 0
    async with Browser(tmp_path) as tools:
        for _, width, height in WIDTHS:
            await open_page(tools, report, width, height)
            metas = await tools.evaluate("[...document.querySelectorAll('section.rollout .meta')].map(m => m.innerText)")
            assert "1 call, 0 errors, 19:12:36" in metas and "1 call, 0 errors, 0:01:05" in metas and "1 call, 0 errors, 900 ms" in metas
            assert "wall clock 19:12:36" in await tools.evaluate("document.querySelector('#run').innerText")
            boxes = await tools.evaluate("[...document.querySelectorAll('.axis span')].map(s => { const r = s.getBoundingClientRect();"
                                         " return [r.left, r.right]; })")
            assert len(boxes) >= 2
            for (_, right), (left, _) in zip(boxes, boxes[1:]):
                assert right + 4 <= left, f"axis labels overlap at {width}px: {boxes}"
            await open_page(tools, report, width, height, "#call=long-0/0")
            assert "no first token" in await detail_text(tools, "latency 19:12:36")
            overflow = await tools.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 1, f"the page scrolls sideways at {width}px"
        assert_offline_and_clean(tools)
