"""`mcc report`: one self-contained HTML file (no network, no CDN) showing every rollout's calls.

Per rollout a timeline (a bar from start to completion with the TTFT marked, coloured by status),
token bars, errors highlighted; clicking a call shows its request and response. The data is
embedded as JSON; a small script draws it.
"""

from __future__ import annotations

import html
from typing import Any

import orjson

from records import CaptureStore

from .tables import call_row

#: Payloads above this many characters are cut in the report (the capture file keeps them whole).
PAYLOAD_LIMIT = 100_000


def build_report(store: CaptureStore, rollout_ids: list[str]) -> str:
    rollouts = [{"id": rid, "incomplete": store.is_incomplete(rid), "calls": _calls(store, rid)} for rid in rollout_ids]
    data = orjson.dumps({"directory": store.capture_dir, "rollouts": rollouts}).decode().replace("</", "<\\/")
    return _PAGE.replace("__TITLE__", html.escape(f"model-call-capture report: {store.capture_dir}")).replace("__DATA__", data)


def _calls(store: CaptureStore, rollout_id: str) -> list[dict[str, Any]]:
    result = store.read_available(rollout_id)
    calls = []
    for index, line in zip(result.call_indexes, result.lines):
        row = call_row(rollout_id, index, line).as_dict()
        row["request"] = _payload(line.get("request") if line.get("request") is not None else line.get("request_raw"))
        row["response"] = _payload(line.get("response") if line.get("response") is not None else line.get("response_raw"))
        calls.append(row)
    return calls


def _payload(value: Any) -> str:
    text = value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    return text if len(text) <= PAYLOAD_LIMIT else text[:PAYLOAD_LIMIT] + f"\n... ({len(text) - PAYLOAD_LIMIT} more characters in the capture file)"


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>__TITLE__</title>
<style>
body{font:13px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{padding:12px 20px;background:#1d2330;color:#fff}header h1{font-size:16px;margin:0}
main{display:flex;gap:16px;padding:16px}#rollouts{flex:3;min-width:0}#detail{flex:2;position:sticky;top:0;max-height:100vh;overflow:auto}
section.rollout{background:#fff;border:1px solid #dde1e7;border-radius:6px;margin-bottom:14px;padding:10px 12px}
section.rollout h2{font-size:14px;margin:0 0 6px}.meta{color:#5b6475;font-weight:normal}
.call{display:grid;grid-template-columns:40px 1fr 160px;align-items:center;gap:8px;padding:2px 0;cursor:pointer}
.call:hover{background:#eef2f8}.call.selected{background:#dfe9fb}.call.error .label{color:#b3261e;font-weight:600}
.track{position:relative;height:14px;background:#f0f2f5;border-radius:3px}
.bar{position:absolute;top:2px;height:10px;border-radius:2px;min-width:2px}
.bar.ok{background:#2e7d32}.bar.client{background:#ef6c00}.bar.server{background:#c62828}.bar.cancelled{background:#8d8f94}
.ttft{position:absolute;top:0;width:2px;height:14px;background:#111}
.tokens{display:flex;height:10px;gap:1px}.tokens span{display:block;height:10px}
.tin{background:#5c6bc0}.tcached{background:#9fa8da}.tout{background:#26a69a}
#detail pre{white-space:pre-wrap;word-break:break-word;background:#fff;border:1px solid #dde1e7;padding:8px;border-radius:4px;max-height:40vh;overflow:auto}
.legend span{display:inline-block;width:10px;height:10px;margin:0 4px 0 10px;vertical-align:middle}
</style></head>
<body><header><h1 id="title"></h1><div class="legend">
<span style="background:#2e7d32"></span>ok<span style="background:#ef6c00"></span>4xx / client<span style="background:#c62828"></span>5xx / upstream<span style="background:#8d8f94"></span>cancelled
<span style="background:#111;width:2px"></span>TTFT &nbsp; tokens: <span class="tin"></span>in <span class="tcached"></span>cached <span class="tout"></span>out</div></header>
<main><div id="rollouts"></div><aside id="detail"><p>Click a call to see its request and response.</p></aside></main>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const data = JSON.parse(document.getElementById("data").textContent);
document.getElementById("title").textContent = `${data.rollouts.length} rollouts, ${data.rollouts.reduce((n, r) => n + r.calls.length, 0)} calls — ${data.directory}`;
const kind = c => c.error_category === "cancelled" ? "cancelled" : (c.status_code >= 500 || (c.error_category && !(c.status_code >= 400 && c.status_code < 500))) ? "server" : (c.status_code >= 400 || c.error_category) ? "client" : "ok";
const el = (tag, cls, text) => { const e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = text; return e; };
const root = document.getElementById("rollouts");
const maxTokens = Math.max(1, ...data.rollouts.flatMap(r => r.calls.map(c => (c.tokens_in || 0) + (c.tokens_out || 0))));
for (const rollout of data.rollouts) {
  const section = el("section", "rollout"); section.dataset.rollout = rollout.id;
  const errors = rollout.calls.filter(c => c.error_category).length;
  const h = el("h2", null, rollout.id + " "); h.appendChild(el("span", "meta", `${rollout.calls.length} calls, ${errors} errors${rollout.incomplete ? ", capture incomplete" : ""}`));
  section.appendChild(h);
  const starts = rollout.calls.map(c => c.started_at).filter(v => v != null), ends = rollout.calls.map(c => c.completed_at).filter(v => v != null);
  const t0 = Math.min(...starts), span = Math.max(1e-6, Math.max(...ends) - t0);
  for (const call of rollout.calls) {
    const row = el("div", "call" + (call.error_category ? " error" : "")); row.dataset.index = call.call_index;
    row.appendChild(el("span", "label", "#" + call.call_index));
    const track = el("div", "track"), bar = el("div", "bar " + kind(call));
    const left = call.started_at != null ? (call.started_at - t0) / span * 100 : 0;
    const width = call.started_at != null && call.completed_at != null ? (call.completed_at - call.started_at) / span * 100 : 100;
    bar.style.left = left + "%"; bar.style.width = width + "%"; track.appendChild(bar);
    if (call.ttft_ms != null && call.started_at != null) { const m = el("div", "ttft"); m.style.left = (left + (call.ttft_ms / 1000) / span * 100) + "%"; track.appendChild(m); }
    track.title = `${call.dialect} ${call.status_code} ${call.error_category || "ok"} — ${call.latency_ms} ms, ttft ${call.ttft_ms} ms`;
    row.appendChild(track);
    const tokens = el("div", "tokens"); tokens.title = `in ${call.tokens_in}, cached ${call.cached_tokens}, out ${call.tokens_out}`;
    const scale = v => (v || 0) / maxTokens * 160 + "px";
    const tin = el("span", "tin"); tin.style.width = scale((call.tokens_in || 0) - (call.cached_tokens || 0));
    const tc = el("span", "tcached"); tc.style.width = scale(call.cached_tokens);
    const tout = el("span", "tout"); tout.style.width = scale(call.tokens_out);
    tokens.append(tin, tc, tout); row.appendChild(tokens);
    row.addEventListener("click", () => show(rollout, call, row));
    section.appendChild(row);
  }
  root.appendChild(section);
}
function show(rollout, call, row) {
  document.querySelectorAll(".call.selected").forEach(e => e.classList.remove("selected")); row.classList.add("selected");
  const d = document.getElementById("detail"); d.replaceChildren();
  d.appendChild(el("h2", null, `${rollout.id} — call ${call.call_index}`));
  const facts = [["dialect", call.dialect], ["model", call.model], ["status", call.status_code], ["error", call.error_category || "none"],
    ["latency ms", call.latency_ms], ["ttft ms", call.ttft_ms], ["tokens in / cached / out", `${call.tokens_in} / ${call.cached_tokens} / ${call.tokens_out}`],
    ["finish", call.finish_reason], ["tool calls", (call.tool_calls || []).join(", ") || "none"]];
  const dl = el("dl"); for (const [k, v] of facts) { dl.appendChild(el("dt", null, k)); dl.appendChild(el("dd", null, String(v))); } d.appendChild(dl);
  d.appendChild(el("h3", null, "request")); const req = el("pre", "request", call.request); d.appendChild(req);
  d.appendChild(el("h3", null, "response")); const res = el("pre", "response", call.response); d.appendChild(res);
}
</script></body></html>
"""
