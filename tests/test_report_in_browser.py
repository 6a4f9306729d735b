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


async def test_report_loads_offline_and_a_click_opens_a_call(tmp_path):
    chromium = chromium_or_skip()
    captures = str(tmp_path / "captures")
    make_capture_dir(captures, rollouts=3, calls=12)
    report = str(tmp_path / "report.html")
    assert CliRunner().invoke(main, ["report", captures, "-o", report]).exit_code == 0
    browser = await asyncio.create_subprocess_exec(chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                                                   "about:blank", stderr=asyncio.subprocess.PIPE)
    try:
        port = None
        while port is None:
            line = (await asyncio.wait_for(browser.stderr.readline(), 60)).decode()  # type: ignore[union-attr]
            found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            port = int(found.group(1)) if found else None
            assert line, "Chromium exited before listening"
        async with aiohttp.ClientSession() as http:
            targets = await (await http.get(f"http://127.0.0.1:{port}/json/list")).json()
            page = next(t for t in targets if t["type"] == "page")
            async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as socket:
                tools = DevTools(socket)
                for domain in ("Network.enable", "Page.enable", "Runtime.enable"):
                    await tools.call(domain)
                await tools.call("Page.navigate", url=f"file://{report}")
                await tools.wait_for_event("Page.loadEventFired")
                assert await tools.evaluate("document.querySelectorAll('section.rollout').length") == 3
                assert await tools.evaluate("document.querySelectorAll('.call').length") == 36
                assert await tools.evaluate("document.querySelectorAll('.call.error').length") == 3
                box = await tools.evaluate("(() => { const e = document.querySelector("
                                           "'section[data-rollout=\"rollout-0001\"] .call[data-index=\"3\"] .track');"
                                           "e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
                                           "return [r.x + r.width / 2, r.y + r.height / 2]; })()")
                for kind in ("mousePressed", "mouseReleased"):  # A real click at the bar's position.
                    await tools.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=1)
                detail = await tools.evaluate("document.querySelector('#detail').innerText")
                assert "rollout-0001 — call 3" in detail and "question 3" in detail and "chatcmpl-3" in detail
                shot = await tools.call("Page.captureScreenshot", format="png")
                assert len(shot["data"]) > 1000
                screenshot = os.environ.get("MCC_REPORT_SCREENSHOT")  # Where to keep it, for a human to look.
                if screenshot:
                    import base64
                    with open(screenshot, "wb") as handle:
                        handle.write(base64.b64decode(shot["data"]))
        requests = [e["params"]["request"]["url"] for e in tools.events if e.get("method") == "Network.requestWillBeSent"]
        assert all(url.startswith(("file://", "data:")) for url in requests), f"the page asked the network: {requests}"
        assert not [e for e in tools.events if e.get("method") == "Network.loadingFailed"], "a request failed"
    finally:
        browser.kill()
        await browser.wait()
