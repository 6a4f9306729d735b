"""`mcc report`: an HTML page over a capture directory (opens from disk, no network, no CDN).

The page stays small however large the run: it embeds one summary per call (timings, tokens,
status, tool names), and the payloads -- every request and response -- go beside it, one script
per rollout in ``<page>_files/``, loaded only when a call of that rollout is opened. (A page with
every payload embedded was 145 MB for 5,000 rollouts and took Chromium 44 s to render.) Rollouts
are drawn a page of 50 at a time, sorted and filtered by the reader.

On top, a run summary: calls, rollouts, errors by category, tokens, latency and TTFT histograms,
links to the slowest and the failed calls. Each rollout's timeline shares one time axis with every
other, so a bar's length is its call's duration.

Every piece of captured data is embedded as JSON with each ``<`` written ``\\u003c`` (and U+2028 /
U+2029 escaped): captured text may hold ``<!--`` and ``<script``, which would otherwise put the
HTML parser in a state where the page shows nothing.
"""

from __future__ import annotations

import html
import math
import os
from typing import Any, Callable, Iterable, Optional

import orjson

from records import CaptureStore, DriftTracker, has_token_arrays, token_records_of_line

from .tables import call_row, percentiles

#: Payloads above this many characters are cut in the report (the capture file keeps them whole).
PAYLOAD_LIMIT = 100_000


def embed_json(value: Any) -> str:
    """``value`` as JSON safe inside a ``<script>`` element and a JS source file."""
    text = orjson.dumps(value).decode()
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def payload_dir(output: str) -> str:
    """Where the page's per-rollout payload scripts go: ``report.html`` -> ``report_files/``."""
    root, _ = os.path.splitext(output)
    return root + "_files"


def write_report(store: CaptureStore, rollout_ids: list[str], output: str,
                 progress: Optional[Callable[[int], None]] = None) -> dict[str, int]:
    """Write the page and its payload scripts; returns sizes (page bytes, payload bytes)."""
    payloads = payload_dir(output)
    os.makedirs(payloads, exist_ok=True)
    summaries, payload_bytes = [], 0
    for number, rollout_id in enumerate(rollout_ids):
        calls, bodies = _rollout(store, rollout_id)
        summaries.append({"id": rollout_id, "incomplete": store.is_incomplete(rollout_id), "calls": calls, "n": number})
        script = f"window.mccPayloads({embed_json(rollout_id)}, {embed_json(bodies)});\n"
        with open(os.path.join(payloads, f"r{number}.js"), "w", encoding="utf-8") as handle:
            handle.write(script)
        payload_bytes += len(script)
        if progress is not None:
            progress(1)
    page = build_page(store.capture_dir, summaries, os.path.basename(payloads))
    with open(output, "w", encoding="utf-8") as handle:
        handle.write(page)
    return {"page_bytes": len(page.encode()), "payload_bytes": payload_bytes}


def _rollout(store: CaptureStore, rollout_id: str) -> tuple[list[list[Any]], list[list[str]]]:
    """Per call: its summary (a compact row, see `_FIELDS` in the page's script) and its payloads."""
    result = store.read_available(rollout_id)
    calls, bodies = [], []
    drift = DriftTracker()
    for index, line in zip(result.call_indexes, result.lines):
        row = call_row(rollout_id, index, line)
        calls.append([row.call_index, row.dialect, row.model, row.status_code, row.error_category, row.started_at,
                      row.latency_ms, row.ttft_ms, row.tokens_in, row.cached_tokens, row.tokens_out,
                      row.finish_reason or row.response_status, row.tool_calls, training_summary(line, index, drift)])
        request = line.get("request") if line.get("request") is not None else line.get("request_raw")
        if request is None and row.request_body_refused:
            request = "(the request body was over --max-body-bytes: refused unread, not kept)"
        response = line.get("response") if line.get("response") is not None else line.get("response_raw")
        bodies.append([_payload(request), _payload(response), _payload(line.get("failure"))])
    return calls, bodies


def training_summary(line: dict[str, Any], call_index: int, drift: DriftTracker) -> str:
    """The first generation's training arrays in a few words: usable or why not, and multi-turn
    drift (issue 20); empty for a call without token ids."""
    if not has_token_arrays(line.get("response")):
        return ""
    records = [drift.place(record) for record in token_records_of_line(line, "", call_index)]
    first = records[0]
    said = "usable" if first.usable else f"not usable ({first.unusable_reason})"
    if first.extends is not None:
        said += f", extends call #{first.extends}"
    elif first.drift_at is not None:
        said += f", prompt drifts at token {first.drift_at} from an earlier call"
    return said


def _payload(value: Any) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    return text if len(text) <= PAYLOAD_LIMIT else text[:PAYLOAD_LIMIT] + f"\n... ({len(text) - PAYLOAD_LIMIT} more characters in the capture file)"


def run_summary(rollouts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The numbers on top of the page, computed here so the page does no heavy lifting."""
    latencies, ttfts, errors = [], [], {}
    totals = {"calls": 0, "rollouts": 0, "tokens_in": None, "cached_tokens": None, "tokens_out": None}
    slowest: list[tuple[float, str, int]] = []
    failed: list[tuple[str, int, str]] = []
    for rollout in rollouts:
        totals["rollouts"] += 1
        for call in rollout["calls"]:
            index, category, latency, ttft = call[0], call[4], call[6], call[7]
            totals["calls"] += 1
            for key, value in (("tokens_in", call[8]), ("cached_tokens", call[9]), ("tokens_out", call[10])):
                if value is not None:
                    totals[key] = (totals[key] or 0) + value
            if latency is not None:
                latencies.append(latency)
                slowest.append((latency, rollout["id"], index))
            if ttft is not None:
                ttfts.append(ttft)
            if category:
                errors[category] = errors.get(category, 0) + 1
                if len(failed) < 20:
                    failed.append((rollout["id"], index, category))
    slowest.sort(reverse=True)
    return {**totals, "errors": dict(sorted(errors.items(), key=lambda kv: -kv[1])),
            "latency": {**percentiles(latencies), "histogram": _histogram(latencies)},
            "ttft": {**percentiles(ttfts), "histogram": _histogram(ttfts)},
            "slowest": [[r, i, ms] for ms, r, i in slowest[:10]], "failed": failed}


def _histogram(values: list[float], bins: int = 24) -> list[list[float]]:
    """Counts over logarithmic bins (model calls span 1 ms to many minutes): [[upper bound, count], ...]."""
    positive = [v for v in values if v > 0]
    if not positive:
        return []
    low, high = math.log10(min(positive)), math.log10(max(positive))
    width = (high - low) / bins or 1.0
    counts = [0] * bins
    for value in positive:
        counts[min(bins - 1, int((math.log10(value) - low) / width))] += 1
    return [[round(10 ** (low + width * (n + 1)), 3), count] for n, count in enumerate(counts)]


def build_page(directory: str, rollouts: list[dict[str, Any]], payloads: str) -> str:
    data = {"directory": directory, "payloads": payloads, "summary": run_summary(rollouts), "rollouts": rollouts}
    title = html.escape(f"model-call-capture report: {directory}")
    return _PAGE.replace("__TITLE__", title).replace("__DATA__", embed_json(data))


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
:root{--ok:#2e7d32;--client:#ef6c00;--server:#c62828;--cancelled:#8d8f94;--ttft:#ffd54f;--in:#5c6bc0;--cached:#9fa8da;--out:#26a69a}
body{font:13px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{padding:10px 16px;background:#1d2330;color:#fff}header h1{font-size:15px;margin:0 0 4px;word-break:break-all}
.legend{display:flex;flex-wrap:wrap;gap:12px;font-size:12px;color:#d7dbe3}.legend i{display:inline-block;width:12px;height:10px;border-radius:2px;margin-right:4px;vertical-align:-1px}
.legend i.sw-ttft{width:3px;background:var(--ttft);box-shadow:0 0 0 1px #fff}
#summary{display:grid;grid-template-columns:repeat(auto-fit,minmax(220px,1fr));gap:10px;padding:12px 16px}
.card{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:8px 10px}.card h3{margin:0 0 4px;font-size:12px;color:#5b6475;font-weight:600}
.big{font-size:20px;font-weight:600}.hist{display:flex;align-items:flex-end;gap:1px;height:48px}.hist span{flex:1;background:#5c6bc0;min-height:1px}
.hist-axis{display:flex;justify-content:space-between;font-size:11px;color:#5b6475}
.card a{color:#1f5fbf;cursor:pointer}.card ol{margin:0;padding-left:18px}
#controls{display:flex;flex-wrap:wrap;gap:8px;align-items:center;padding:0 16px 8px}
#controls input[type=search]{min-width:160px;flex:1;max-width:320px;padding:3px 6px}
main{display:flex;gap:16px;padding:0 16px 16px}#rollouts{flex:3;min-width:0}#detail{flex:2;min-width:0;position:sticky;top:0;max-height:100vh;overflow:auto}
@media (max-width:800px){main{flex-direction:column}#detail{position:static;max-height:none}}
.axis{position:relative;height:16px;margin-left:48px;margin-right:150px;font-size:11px;color:#5b6475}.axis span{position:absolute;white-space:nowrap}
section.rollout{background:#fff;border:1px solid #dde1e7;border-radius:6px;margin-bottom:12px;padding:8px 10px}
section.rollout h2{font-size:14px;margin:0 0 6px;word-break:break-all}.meta{color:#5b6475;font-weight:normal;font-size:12px}
.call{display:grid;grid-template-columns:40px 1fr 142px;align-items:center;gap:8px;padding:2px 0;cursor:pointer}
@media (max-width:800px){.call{grid-template-columns:32px 1fr 90px}.axis{margin-right:90px;margin-left:40px}}
.drift{color:#a15c00;font-weight:700;margin-left:2px}.call:hover{background:#eef2f8}.call.selected{background:#dfe9fb}.call.error .label{color:#b3261e;font-weight:600}
.track{position:relative;height:14px;background:#f0f2f5;border-radius:3px}
.bar{position:absolute;top:2px;height:10px;border-radius:2px;min-width:2px}
.bar.ok{background:var(--ok)}.bar.client{background:var(--client)}.bar.server{background:var(--server)}.bar.cancelled{background:var(--cancelled)}
.ttft{position:absolute;top:0;width:2px;height:14px;background:var(--ttft);box-shadow:0 0 0 1px #1d2330}
.tokens{display:flex;height:10px;gap:1px}.tokens span{display:block;height:10px}
.tin{background:var(--in)}.tcached{background:var(--cached)}.tout{background:var(--out)}
#detail pre{white-space:pre-wrap;word-break:break-all;background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:8px;max-height:45vh;overflow:auto}
#detail h3{margin:10px 0 4px;font-size:13px}.hint{color:#5b6475}button{cursor:pointer}
</style></head><body>
<header><h1>__TITLE__</h1>
<div class="legend"><span><i style="background:var(--ok)"></i>success</span><span><i style="background:var(--client)"></i>4xx / client</span>
<span><i style="background:var(--server)"></i>5xx / upstream</span><span><i style="background:var(--cancelled)"></i>cancelled</span>
<span><i class="sw-ttft"></i>first token</span><span><i style="background:var(--in)"></i>tokens in</span>
<span><i style="background:var(--cached)"></i>cached</span><span><i style="background:var(--out)"></i>tokens out</span></div></header>
<div id="summary"></div>
<div id="controls"><label>sort <select id="sort"><option value="errors">errors first</option><option value="tokens">tokens</option>
<option value="latency">slowest call</option><option value="calls">calls</option><option value="id">rollout id</option></select></label>
<label><input type="checkbox" id="only-errors"> only rollouts with errors</label>
<input type="search" id="filter" placeholder="filter rollout ids"><span id="shown" class="hint"></span></div>
<main><div id="rollouts"></div><div id="detail"><p class="hint">Click a call to see its request and response.</p></div></main>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const F = {index: 0, dialect: 1, model: 2, status: 3, category: 4, start: 5, latency: 6, ttft: 7, tin: 8, tcached: 9, tout: 10, finish: 11, tools: 12, train: 13};
const PAGE = 50;
const plural = (n, word) => `${n.toLocaleString()} ${word}${n === 1 ? "" : "s"}`;
const num = v => v === null || v === undefined ? "-" : (typeof v === "number" ? v.toLocaleString(undefined, {maximumFractionDigits: 1}) : String(v));
const ms = v => v === null || v === undefined ? "-" : (v >= 1000 ? (v / 1000).toFixed(v >= 100000 ? 0 : 1) + " s" : v.toFixed(v >= 10 ? 0 : 2) + " ms");
function el(tag, cls, text) { const e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = text; return e; }
function klass(call) {
  const c = call[F.category], s = call[F.status] || 0;
  if (c === "cancelled") return "cancelled";
  if (s >= 500 || c === "upstream_error" || c === "connection" || c === "timeout") return "server";
  if (s >= 400 || c) return "client";
  return "ok";
}
for (const r of DATA.rollouts) {
  let start = Infinity, end = -Infinity, tokens = 0, errors = 0, slowest = 0;
  for (const c of r.calls) {
    if (c[F.start] !== null) { start = Math.min(start, c[F.start]); end = Math.max(end, c[F.start] + (c[F.latency] || 0) / 1000); }
    tokens += (c[F.tin] || 0) + (c[F.tout] || 0); if (c[F.category]) errors++; slowest = Math.max(slowest, c[F.latency] || 0);
  }
  Object.assign(r, {start: start === Infinity ? 0 : start, span: end === -Infinity ? 0 : end - start, tokens, errors, slowest});
}
const SPAN = Math.max(0.001, ...DATA.rollouts.map(r => r.span));  // One time axis for every rollout, in seconds.
const MAXTOK = Math.max(1, ...DATA.rollouts.flatMap(r => r.calls.map(c => (c[F.tin] || 0) + (c[F.tout] || 0))));
const payloads = {}, waiting = {};
window.mccPayloads = (id, bodies) => { payloads[id] = bodies; (waiting[id] || []).forEach(f => f()); delete waiting[id]; };
function withPayloads(rollout, then) {
  if (payloads[rollout.id]) return then(payloads[rollout.id]);
  (waiting[rollout.id] = waiting[rollout.id] || []).push(() => then(payloads[rollout.id]));
  if (waiting[rollout.id].length === 1) {
    const s = document.createElement("script"); s.src = `${DATA.payloads}/r${rollout.n}.js`;
    s.onerror = () => { document.getElementById("detail").append(el("p", "hint", `The payloads of ${rollout.id} are missing: ${DATA.payloads}/ must stay beside the page.`)); };
    document.head.append(s);
  }
}
function summary() {
  const s = DATA.summary, box = document.getElementById("summary");
  const card = (title, body) => { const c = el("div", "card"); c.append(el("h3", null, title)); body.forEach(b => c.append(b)); box.append(c); };
  card("run", [el("div", "big", plural(s.calls, "call")), el("div", null, `${plural(s.rollouts, "rollout")}, ${plural(Object.values(s.errors).reduce((a, b) => a + b, 0), "error")}`)]);
  card("tokens", [el("div", null, `in ${num(s.tokens_in)} (cached ${num(s.cached_tokens)})`), el("div", null, `out ${num(s.tokens_out)}`)]);
  card("errors by category", Object.keys(s.errors).length ? Object.entries(s.errors).map(([k, v]) => el("div", null, `${k}: ${v}`)) : [el("div", "hint", "none")]);
  for (const [title, d] of [["latency", s.latency], ["time to first token", s.ttft]]) {
    const hist = el("div", "hist"), most = Math.max(1, ...d.histogram.map(b => b[1]));
    for (const [upper, count] of d.histogram) { const bar = el("span"); bar.style.height = (count / most * 100) + "%"; bar.title = `≤ ${ms(upper)}: ${count}`; hist.append(bar); }
    const axis = el("div", "hist-axis"); axis.append(el("span", null, d.histogram.length ? ms(d.histogram[0][0]) : "-"), el("span", null, d.histogram.length ? ms(d.histogram[d.histogram.length - 1][0]) : ""));
    card(title, [el("div", null, `p50 ${ms(d.p50)} · p90 ${ms(d.p90)} · p99 ${ms(d.p99)}`), hist, axis]);
  }
  const links = (rows, label) => { const ol = el("ol"); rows.forEach(r => { const li = el("li"); const a = el("a", null, label(r)); a.onclick = () => openCall(r[0], r[1]); li.append(a); ol.append(li); }); return ol; };
  card("slowest calls", s.slowest.length ? [links(s.slowest, r => `${r[0]} #${r[1]}: ${ms(r[2])}`)] : [el("div", "hint", "none")]);
  card("failed calls", s.failed.length ? [links(s.failed, r => `${r[0]} #${r[1]}: ${r[2]}`)] : [el("div", "hint", "none")]);
}
let order = [], shown = 0;
function selectRollouts() {
  const key = document.getElementById("sort").value, text = document.getElementById("filter").value.trim(), onlyErrors = document.getElementById("only-errors").checked;
  let list = DATA.rollouts.filter(r => (!onlyErrors || r.errors) && (!text || r.id.includes(text)));
  const by = {errors: r => -r.errors, tokens: r => -r.tokens, latency: r => -r.slowest, calls: r => -r.calls.length};
  list.sort(key === "id" ? (a, b) => a.id < b.id ? -1 : 1 : (a, b) => by[key](a) - by[key](b) || (a.id < b.id ? -1 : 1));
  order = list; shown = 0;
  const box = document.getElementById("rollouts"); box.textContent = "";
  const axis = el("div", "axis"); axis.title = "one time axis for every rollout: a bar's length is its call's duration";
  for (let i = 0; i <= 4; i++) {
    const t = el("span", null, i ? ms(SPAN * 1000 * i / 4) : "0"); t.style.left = (i * 25) + "%";
    t.style.transform = i === 0 ? "none" : i === 4 ? "translateX(-100%)" : "translateX(-50%)"; axis.append(t);
  }
  box.append(axis); more();
}
function more() {
  const box = document.getElementById("rollouts"); document.getElementById("more")?.remove();
  for (const r of order.slice(shown, shown + PAGE)) box.append(rollout(r));
  shown = Math.min(order.length, shown + PAGE);
  document.getElementById("shown").textContent = `${shown} of ${plural(order.length, "rollout")} shown`;
  if (shown < order.length) { const b = el("button", null, `show ${Math.min(PAGE, order.length - shown)} more`); b.id = "more"; b.onclick = more; box.append(b); }
}
function rollout(r) {
  const sec = el("section", "rollout"); sec.dataset.rollout = r.id; sec.id = "rollout-" + r.n;
  const h = el("h2", null, r.id + " ");
  h.append(el("span", "meta", `${plural(r.calls.length, "call")}, ${plural(r.errors, "error")}, ${ms(r.span * 1000)}${r.incomplete ? ", capture incomplete" : ""}`));
  sec.append(h);
  r.calls.forEach(c => {
    const row = el("div", "call" + (c[F.category] ? " error" : "")); row.dataset.index = c[F.index];
    const label = el("span", "label", "#" + c[F.index]);
    if (c[F.train] && c[F.train].includes("drifts")) { label.append(el("span", "drift", "~")); label.title = "prompt drifts: " + c[F.train]; }
    row.append(label);
    const track = el("div", "track"), bar = el("div", "bar " + klass(c));
    const left = c[F.start] === null ? 0 : (c[F.start] - r.start) / SPAN * 100, width = (c[F.latency] || 0) / 1000 / SPAN * 100;
    bar.style.left = left + "%"; bar.style.width = width + "%"; track.append(bar);
    if (c[F.ttft] !== null) { const t = el("div", "ttft"); t.style.left = (left + c[F.ttft] / 1000 / SPAN * 100) + "%"; track.append(t); }
    track.title = `${c[F.dialect] || ""} ${c[F.status] ?? ""} ${c[F.category] || "ok"}: ${ms(c[F.latency])}, first token ${ms(c[F.ttft])}`;
    const tok = el("div", "tokens"); tok.title = `in ${num(c[F.tin])} (cached ${num(c[F.tcached])}), out ${num(c[F.tout])}`;
    for (const [cls, v] of [["tcached", c[F.tcached] || 0], ["tin", Math.max(0, (c[F.tin] || 0) - (c[F.tcached] || 0))], ["tout", c[F.tout] || 0]]) {
      const s = el("span", cls); s.style.width = Math.max(v ? 1 : 0, v / MAXTOK * 140) + "px"; tok.append(s);
    }
    row.append(track, tok); row.onclick = () => show(r, c, row); sec.append(row);
  });
  return sec;
}
function openCall(id, index) {
  const r = DATA.rollouts.find(x => x.id === id); if (!r) return;
  let sec = document.querySelector(`section[data-rollout="${CSS.escape(id)}"]`);
  if (!sec) { sec = rollout(r); document.getElementById("rollouts").prepend(sec); }
  sec.scrollIntoView({block: "center"});
  const row = sec.querySelector(`.call[data-index="${index}"]`); const c = r.calls.find(x => x[F.index] === index);
  if (row && c) show(r, c, row);
}
function show(r, c, row) {
  document.querySelectorAll(".call.selected").forEach(e => e.classList.remove("selected")); row.classList.add("selected");
  const d = document.getElementById("detail"); d.textContent = "";
  d.append(el("h3", null, `${r.id} — call ${c[F.index]}`));
  d.append(el("p", null, `${c[F.dialect] || ""} ${c[F.model] || ""} · status ${c[F.status] ?? "-"} · ${c[F.category] || "ok"} · latency ${ms(c[F.latency])} · first token ${ms(c[F.ttft])} · tokens in ${num(c[F.tin])}, cached ${num(c[F.tcached])}, out ${num(c[F.tout])} · finish ${c[F.finish] || "-"}${c[F.tools].length ? " · tools " + c[F.tools].join(", ") : ""}${c[F.train] ? " · training arrays: " + c[F.train] : ""}`));
  const at = r.calls.indexOf(c);
  withPayloads(r, bodies => {
    if (!row.classList.contains("selected")) return;
    for (const [title, text] of [["request", bodies[at][0]], ["response", bodies[at][1]], ["failure", bodies[at][2]]]) {
      if (!text) continue; d.append(el("h3", null, title)); d.append(el("pre", null, text));
    }
  });
}
summary();
for (const id of ["sort", "filter", "only-errors"]) document.getElementById(id).addEventListener("input", selectRollouts);
selectRollouts();
</script></body></html>
"""
