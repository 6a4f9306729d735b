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

from .capture_dirs import make_capture_dir

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


async def open_page(tools: DevTools, path: str, width: int = 1400, height: int = 1000) -> None:
    await tools.call("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                     mobile=width < 800)
    tools.events.clear()
    await tools.call("Page.navigate", url=f"file://{path}")
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
        assert "rollout-0001 — call 3" in detail and "chatcmpl-3" in detail
        # Sorted by errors first, filtered, then a link from the summary opens the slowest call.
        await tools.evaluate("document.getElementById('filter').value = '0002';"
                             "document.getElementById('filter').dispatchEvent(new Event('input'))")
        assert await tools.evaluate("[...document.querySelectorAll('section.rollout')].map(s => s.dataset.rollout)") == ["rollout-0002"]
        await click(tools, "#summary ol a")
        assert "call 11" in await detail_text(tools, "question 11")
        assert_offline_and_clean(tools)


HOSTILE = ["Continue this page: <html><!-- TODO add <script> tag", "</script><script>document.body.innerHTML=''</script>",
           "<!-- <script>", "line\u2028separator\u2029paragraph", "emoji \U0001f600 and \u00e9 and \u2603", "]]><![CDATA[",
           "<img src=x onerror=alert(1)>"]


async def test_payloads_full_of_html_scripts_comments_and_unicode_render(tmp_path):
    """Captured text is data: every `<` escaped, U+2028/2029 too; the page still shows every rollout."""
    from records import encode_capture_line
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
    """The page at 1400x1000 and at a phone's 390x844; kept in benchmarks/results/ when MCC_REPORT_SCREENSHOTS names a dir."""
    import base64
    captures = str(tmp_path / "captures")
    make_capture_dir(captures, rollouts=6, calls=12)
    report = str(tmp_path / "report.html")
    assert CliRunner().invoke(main, ["report", captures, "-o", report]).exit_code == 0
    keep = os.environ.get("MCC_REPORT_SCREENSHOTS")
    async with Browser(tmp_path) as tools:
        for name, width, height in (("desktop", 1400, 1000), ("phone", 390, 844)):
            await open_page(tools, report, width, height)
            await click(tools, 'section[data-rollout="rollout-0000"] .call[data-index="9"] .track')
            await detail_text(tools, "boom")
            overflow = await tools.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 1, f"the page scrolls sideways at {width}px"
            await tools.evaluate("window.scrollTo(0, 0)")
            shot = await tools.call("Page.captureScreenshot", format="png")
            assert len(shot["data"]) > 1000
            if keep:
                with open(os.path.join(keep, f"report-{name}.png"), "wb") as handle:
                    handle.write(base64.b64decode(shot["data"]))
        assert_offline_and_clean(tools)
