"""`mcc report`: an HTML page over a capture directory (opens from disk, no network, no CDN).

The page stays small however large the run: it embeds one summary per call (timings, tokens,
status, tool names), and the payloads -- every request and response -- go beside it, one script
per rollout in ``<page>_files/``, loaded only when a call of that rollout is opened. (A page with
every payload embedded was 145 MB for 5,000 rollouts and took Chromium 44 s to render.) Rollouts
are drawn a page of 50 at a time, sorted and filtered by the reader: by rollout id, and by the
calls' error category, dialect, model, finish reason and status, combined, each option with its
count (issue 22). An opened call reads as a conversation (`conversation.py`), its raw JSON one
click away; the URL fragment (``#call=<rollout>/<index>``, ``#rollout=<rollout>``) names it, so
a link opens it. Below 800 px the call opens over the list, with a way back.

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

from records import CaptureStore
from records.training import DriftTracker, TokenFileArrays
from records.contract import token_records_of_line
from records.contract.reading import has_token_arrays, names_token_entries

from .conversation import conversation_of
from .lineage_words import lineage_words
from .tables import call_row, percentiles

#: Strings above this many characters are cut in the report's raw JSON (the capture file keeps them whole).
PAYLOAD_LIMIT = 100_000
#: Lists above this many items (token ids, logprobs) are cut in the report's raw JSON.
LIST_LIMIT = 200
#: Calls linked under each error category of the summary (the category's filter reaches every one).
FAILED_EXAMPLES = 3


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
        calls, bodies, unreadable = _rollout(store, rollout_id)
        summaries.append({"id": rollout_id, "incomplete": store.is_incomplete(rollout_id), "calls": calls, "n": number,
                          "unreadable": unreadable, "chains": _chains(store, rollout_id),
                          "agents": _agents(store, rollout_id), "privacy": _privacy(store, rollout_id)})
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


def _agents(store: CaptureStore, rollout_id: str) -> str:
    """The rollout's calls by the harness's agent, in one phrase; empty when no call names one."""
    from .cli import agent_lines

    lines = agent_lines([call_row(rollout_id, index, line) for index, line in store.iter_available(rollout_id)
                         if line is not None])
    return "; ".join(line.strip().rstrip(":") for line in lines)


def _privacy(store: CaptureStore, rollout_id: str) -> str:
    """What redaction did to the rollout, in one phrase (docs/privacy.md); empty when nothing."""
    from .cli import privacy_lines

    return "; ".join(privacy_lines(store, rollout_id))


def _chains(store: CaptureStore, rollout_id: str) -> str:
    """The rollout's trajectory in one phrase (issue 31): trainable or masked and why, and its chains
    by call; empty without a training-token file."""
    from .cli import chain_lines

    lines = chain_lines(store.capture_dir, rollout_id, [call_row(rollout_id, index, line) for index, line in
                                                        store.iter_available(rollout_id) if line is not None])
    return "; ".join(line.strip() for line in lines if line.strip())


def _rollout(store: CaptureStore, rollout_id: str) -> tuple[list[list[Any]], list[list[Any]], int]:
    """Per call: its summary (a compact row, see `F` in the page's script) and its payloads
    (conversation, raw request, raw response, failure, training arrays); and the unreadable lines."""
    result = store.read_available(rollout_id)
    calls, bodies = [], []
    drift = DriftTracker()
    token_file = TokenFileArrays(store.capture_dir, rollout_id) if any(map(names_token_entries, result.lines)) else None
    for index, line in zip(result.call_indexes, result.lines):
        row = call_row(rollout_id, index, line)
        arrays = training_arrays(line, index, drift, token_file)
        calls.append([row.call_index, row.dialect, row.model, row.status_code, row.error_category, row.started_at,
                      row.latency_ms, row.ttft_ms, row.tokens_in, row.cached_tokens, row.tokens_out,
                      row.finish_reason or row.response_status, row.tool_calls, arrays[0] if arrays else ""])
        request = line.get("request") if line.get("request") is not None else line.get("request_raw")
        if request is None and row.request_body_refused:
            request = "(the request body was over --max-body-bytes: refused unread, not kept)"
        response = line.get("response") if line.get("response") is not None else line.get("response_raw")
        bodies.append([conversation_of(line), _trimmed(request), _trimmed(response), _trimmed(line.get("failure")),
                       arrays, error_sentence(line)])
    return calls, bodies, result.malformed


def error_sentence(line: dict[str, Any]) -> Optional[str]:
    """What an error reply says (OpenAI's and vLLM's ``error.message``, Anthropic's, vLLM's older
    top-level ``message``), for a call that failed: drawn as an error, not as the model's reply."""
    response = line.get("response")
    if not isinstance(response, dict) or not (line.get("error_category") or (line.get("status_code") or 0) >= 400):
        return None
    error = response.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error["message"]
    if isinstance(error, str):
        return error
    if response.get("object") == "error" and isinstance(response.get("message"), str):
        return response["message"]
    return None


def training_arrays(line: dict[str, Any], call_index: int, drift: DriftTracker,
                    token_file: Optional[TokenFileArrays] = None) -> list[str]:
    """Each generation's training arrays in a few words (issue 20): sizes, usable or why not, and
    multi-turn drift; empty for a call without token ids. ``token_file``: the rollout's, for the
    lines that leave their arrays there."""
    named = names_token_entries(line)
    if not has_token_arrays(line.get("response")) and not named:
        return []
    said = []
    records = token_records_of_line(line, "", call_index)
    if named and token_file is not None:
        records = token_file.fill_line(records, line)
    claimed = drift.claims(line, call_index)
    for record in records:
        record = drift.place(record, claimed)
        words = "usable" if record.usable else f"not usable ({record.unusable_reason})"
        if record.extends is not None:
            words += f", extends call #{record.extends}"
        elif record.drift_at is not None:
            words += f", prompt drifts at token {record.drift_at:,} from call #{record.drift_from}"
        lineage = lineage_words(record)
        if lineage:
            words += "; " + "; ".join(lineage)
        sizes = [f"{name} {len(values):,}" for name, values in (
            ("prompt ids", record.prompt_token_ids), ("generation ids", record.generation_token_ids),
            ("logprobs", record.generation_log_probs)) if values is not None]
        said.append(f"choice {record.choice_index}: {words}" + (f" · {', '.join(sizes)}" if sizes else ""))
    return said


def _trimmed(value: Any) -> Any:
    """``value`` with every string over `PAYLOAD_LIMIT` characters and every list over
    `LIST_LIMIT` items cut, saying how much was left out (a 32k-token array is not for reading)."""
    if isinstance(value, str):
        return value if len(value) <= PAYLOAD_LIMIT else (
            value[:PAYLOAD_LIMIT] + f"... ({len(value) - PAYLOAD_LIMIT:,} more characters in the capture file)")
    if isinstance(value, dict):
        return {key: _trimmed(item) for key, item in value.items()}
    if isinstance(value, list):
        kept = [_trimmed(item) for item in value[:LIST_LIMIT]]
        if len(value) > LIST_LIMIT:
            kept.append(f"... ({len(value) - LIST_LIMIT:,} more items in the capture file)")
        return kept
    return value


def run_summary(rollouts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The numbers on top of the page, computed here so the page does no heavy lifting."""
    latencies: list[float] = []
    ttfts: list[float] = []
    errors: dict[str, int] = {}
    totals: dict[str, Any] = {"calls": 0, "rollouts": 0, "tokens_in": None, "cached_tokens": None, "tokens_out": None,
              "unreadable": 0, "incomplete": 0}
    slowest: list[tuple[float, str, int]] = []
    failed: dict[str, list[tuple[str, int]]] = {}
    started, ended = math.inf, -math.inf
    for rollout in rollouts:
        totals["rollouts"] += 1
        totals["unreadable"] += rollout.get("unreadable", 0)
        totals["incomplete"] += bool(rollout.get("incomplete"))
        for call in rollout["calls"]:
            index, category, start, latency, ttft = call[0], call[4], call[5], call[6], call[7]
            totals["calls"] += 1
            for key, value in (("tokens_in", call[8]), ("cached_tokens", call[9]), ("tokens_out", call[10])):
                if value is not None:
                    totals[key] = (totals[key] or 0) + value
            if start is not None:
                started, ended = min(started, start), max(ended, start + (latency or 0) / 1000)
            if latency is not None:
                latencies.append(latency)
                slowest.append((latency, rollout["id"], index))
            if ttft is not None:
                ttfts.append(ttft)
            if category:
                errors[category] = errors.get(category, 0) + 1
                examples = failed.setdefault(category, [])
                if len(examples) < FAILED_EXAMPLES:
                    examples.append((rollout["id"], index))
    slowest.sort(reverse=True)
    by_count = sorted(errors.items(), key=lambda kv: (-kv[1], kv[0]))
    return {**totals, "errors": dict(by_count),
            "started_at": started if started != math.inf else None, "ended_at": ended if ended != -math.inf else None,
            "latency": {**percentiles(latencies), "histogram": _histogram(latencies)},
            "ttft": {**percentiles(ttfts), "histogram": _histogram(ttfts)},
            "slowest": [[r, i, ms] for ms, r, i in slowest[:10]],
            "failed": [[category, count, failed[category]] for category, count in by_count]}


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


_PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>
:root{--ok:#2e7d32;--client:#ef6c00;--server:#c62828;--cut:#7b1fa2;--unparsed:#6d4c41;--cancelled:#8d8f94;--ttft:#ffd54f;--in:#5c6bc0;--cached:#9fa8da;--out:#26a69a}
*{box-sizing:border-box}
body{font:13px/1.4 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{padding:10px 16px;background:#1d2330;color:#fff}header h1{font-size:15px;margin:0 0 4px;overflow-wrap:anywhere}
.legend{display:flex;flex-wrap:wrap;gap:4px 12px;font-size:12px;color:#d7dbe3}.legend i{display:inline-block;width:12px;height:10px;border-radius:2px;margin-right:4px;vertical-align:-1px}
.legend i.sw-ttft{width:3px;background:var(--ttft);box-shadow:0 0 0 1px #fff}
#summary{display:grid;grid-template-columns:repeat(auto-fit,minmax(220px,1fr));gap:10px;padding:12px 16px}
.card{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:8px 10px;min-width:0;overflow-wrap:anywhere}.card h3{margin:0 0 4px;font-size:12px;color:#5b6475;font-weight:600}
.big{font-size:20px;font-weight:600}.hist{display:flex;align-items:flex-end;gap:1px;height:48px}.hist span{flex:1;background:#5c6bc0;min-height:1px}
.hist-axis{display:flex;justify-content:space-between;font-size:11px;color:#5b6475}
a{color:#1f5fbf;cursor:pointer}.card ol{margin:0 0 4px;padding-left:18px}.group{margin:2px 0}.group b{font-weight:600}
#controls{display:flex;flex-wrap:wrap;gap:6px 10px;align-items:center;padding:0 16px 8px}
#controls select{max-width:100%}#controls label{white-space:nowrap;max-width:100%;overflow:hidden}
#controls input[type=search]{min-width:140px;flex:1;max-width:320px;padding:3px 6px}
main{display:flex;gap:16px;padding:0 16px 16px}#rollouts{flex:3;min-width:0}#detail{flex:2;min-width:0;position:sticky;top:0;max-height:100vh;overflow:auto}
.back{display:none}
@media (max-width:800px){main{flex-direction:column}#detail{position:static;max-height:none}
 #detail.open{display:block;position:fixed;inset:0;z-index:10;background:#f6f7f9;overflow:auto;padding:10px 12px}
 #detail.open .back{display:inline-block;margin-bottom:6px}}
.axis{position:relative;height:16px;margin-left:48px;margin-right:150px;font-size:11px;color:#5b6475}.axis span{position:absolute;white-space:nowrap}
section.rollout{background:#fff;border:1px solid #dde1e7;border-radius:6px;margin-bottom:12px;padding:8px 10px}
section.rollout.target{outline:2px solid #1f5fbf}
section.rollout h2{font-size:14px;margin:0 0 6px;overflow-wrap:anywhere}section.rollout h2 a{text-decoration:none;color:inherit}.meta{color:#5b6475;font-weight:normal;font-size:12px}
.call{display:grid;grid-template-columns:40px 1fr 142px;align-items:center;gap:8px;padding:2px 0;cursor:pointer}
@media (max-width:800px){.call{grid-template-columns:32px 1fr 90px}.axis{margin-right:90px;margin-left:40px}}
.drift{color:#a15c00;font-weight:700;margin-left:2px}.call:hover{background:#eef2f8}.call.selected{background:#dfe9fb}.call.error .label{color:#b3261e;font-weight:600}
.call.dim{opacity:.3}
.track{position:relative;height:14px;background:#f0f2f5;border-radius:3px}
.bar{position:absolute;top:2px;height:10px;border-radius:2px;min-width:2px}
.bar.ok{background:var(--ok)}.bar.client{background:var(--client)}.bar.server{background:var(--server)}.bar.cancelled{background:var(--cancelled)}
.bar.cut{background:var(--cut)}.bar.unparsed{background:var(--unparsed)}
.ttft{position:absolute;top:0;width:2px;height:14px;background:var(--ttft);box-shadow:0 0 0 1px #1d2330}
.tokens{display:flex;height:10px;gap:1px;overflow:hidden}.tokens span{display:block;height:10px}
.tin{background:var(--in)}.tcached{background:var(--cached)}.tout{background:var(--out)}
#detail pre{white-space:pre-wrap;overflow-wrap:anywhere;margin:0;font:12px/1.4 ui-monospace,monospace}
#detail details pre,.failure pre{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:8px;max-height:45vh;overflow:auto}
#detail h3{margin:10px 0 4px;font-size:13px;overflow-wrap:anywhere}#detail h4{margin:10px 0 4px;font-size:12px;color:#5b6475;text-transform:uppercase;letter-spacing:.04em}
.hint{color:#5b6475}button{cursor:pointer}
.msg{background:#fff;border:1px solid #dde1e7;border-left:4px solid #9aa3b2;border-radius:6px;padding:6px 8px;margin:6px 0}
.msg.role-system,.msg.role-developer{border-left-color:#5b6475}.msg.role-user,.msg.role-prompt{border-left-color:#1f5fbf}
.msg.error-reply{border-left-color:#c62828;background:#fdecea;white-space:pre-wrap}.msg.role-assistant,.msg.role-completion{border-left-color:#2e7d32}.msg.role-tool{border-left-color:#00897b}.msg.reply{background:#f3faf3}
.role{font-size:11px;font-weight:700;text-transform:uppercase;color:#5b6475;margin-bottom:2px}
.part{margin:4px 0}.part .label{font-size:11px;font-weight:600;color:#5b6475}
.part.reasoning{background:#fff8e1;border-radius:4px;padding:4px 6px;color:#5d4a00}
.part.tool_call{background:#e8eaf6;border-radius:4px;padding:4px 6px}.part.tool_result{background:#e0f2f1;border-radius:4px;padding:4px 6px}
.part.other,.part.media{color:#5b6475}.failure{border-left:4px solid var(--server);padding-left:6px}
</style></head><body>
<header><h1>__TITLE__</h1>
<div class="legend"><span><i style="background:var(--ok)"></i>success</span><span><i style="background:var(--client)"></i>4xx / client</span>
<span><i style="background:var(--server)"></i>5xx / upstream</span><span><i style="background:var(--cut)"></i>200, stream cut or incomplete</span>
<span><i style="background:var(--unparsed)"></i>200, reply not parsed</span><span><i style="background:var(--cancelled)"></i>cancelled</span>
<span><i class="sw-ttft"></i>first token</span><span><i style="background:var(--in)"></i>tokens in</span>
<span><i style="background:var(--cached)"></i>cached</span><span><i style="background:var(--out)"></i>tokens out</span></div></header>
<div id="summary"></div>
<div id="controls"><label>sort <select id="sort"><option value="errors">errors first</option><option value="tokens">tokens</option>
<option value="latency">slowest call</option><option value="calls">calls</option><option value="id">rollout id</option></select></label>
<label><input type="checkbox" id="only-errors"> only rollouts with errors</label>
<label><input type="checkbox" id="only-incomplete"> only incomplete rollouts (lines lost)</label>
<input type="search" id="filter" placeholder="filter rollout ids"><span id="facets"></span><span id="shown" class="hint"></span></div>
<main><div id="rollouts"></div><div id="detail"><p class="hint">Click a call to read it as a conversation.</p></div></main>
<script id="data" type="application/json">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const F = {index: 0, dialect: 1, model: 2, status: 3, category: 4, start: 5, latency: 6, ttft: 7, tin: 8, tcached: 9, tout: 10, finish: 11, tools: 12, train: 13};
const PAGE = 50;
const plural = (n, word) => `${n.toLocaleString()} ${word}${n === 1 ? "" : "s"}`;
const num = v => v === null || v === undefined ? "-" : (typeof v === "number" ? v.toLocaleString(undefined, {maximumFractionDigits: 1}) : String(v));
// A duration: ms below a second, seconds below a minute, h:mm:ss past it.
function ms(v) {
  if (v === null || v === undefined) return "-";
  if (v < 1000) return v.toFixed(v >= 10 ? 0 : 2) + " ms";
  if (v < 60000) return (v / 1000).toFixed(1) + " s";
  const s = Math.round(v / 1000), h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60;
  return `${h}:${String(m).padStart(2, "0")}:${String(s % 60).padStart(2, "0")}`;
}
const utc = t => t === null || t === undefined ? "-" : new Date(t * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
function el(tag, cls, text) { const e = document.createElement(tag); if (cls) e.className = cls; if (text !== undefined) e.textContent = text; return e; }
function link(text, href) { const a = el("a", null, text); a.href = href; return a; }
const callHref = (id, index) => `#call=${encodeURIComponent(id)}/${index}`;
const rolloutHref = id => `#rollout=${encodeURIComponent(id)}`;
// A bar's colour: a 200 whose stream was cut or ended incomplete is neither a client nor an upstream error.
function klass(call) {
  const c = call[F.category], s = call[F.status] || 0;
  if (c === "cancelled") return "cancelled";
  if ((c === "stream_truncated" || c === "incomplete") && s < 300) return "cut";
  if (c === "capture_parse_error" && s < 300) return "unparsed";
  if (s >= 500 || c === "upstream_error" || c === "connection" || c === "timeout") return "server";
  if (s >= 400 || c) return "client";
  return "ok";
}
const byId = new Map();
for (const r of DATA.rollouts) {
  let start = Infinity, end = -Infinity, tokens = 0, errors = 0, slowest = 0;
  for (const c of r.calls) {
    if (c[F.start] !== null) { start = Math.min(start, c[F.start]); end = Math.max(end, c[F.start] + (c[F.latency] || 0) / 1000); }
    tokens += (c[F.tin] || 0) + (c[F.tout] || 0); if (c[F.category]) errors++; slowest = Math.max(slowest, c[F.latency] || 0);
  }
  Object.assign(r, {start: start === Infinity ? 0 : start, span: end === -Infinity ? 0 : end - start, tokens, errors, slowest, lower: r.id.toLowerCase()});
  byId.set(r.id, r);
}
const SPAN = Math.max(0.001, ...DATA.rollouts.map(r => r.span));  // One time axis for every rollout, in seconds.
const MAXTOK = Math.max(1, ...DATA.rollouts.flatMap(r => r.calls.map(c => (c[F.tin] || 0) + (c[F.tout] || 0))));
// Filters over calls, combinable; each option counts the calls that match every other filter.
const FACETS = [["category", F.category, "error"], ["dialect", F.dialect, "dialect"], ["model", F.model, "model"],
                ["finish", F.finish, "finish"], ["status", F.status, "status"]];
const facetValue = (c, i) => { const v = c[i]; return v === null || v === undefined || v === "" ? (i === F.category ? "ok" : "none") : String(v); };
const chosen = {};
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
  const card = (title, body, id) => { const c = el("div", "card"); if (id) c.id = id; c.append(el("h3", null, title)); body.forEach(b => c.append(b)); box.append(c); };
  const failures = Object.values(s.errors).reduce((a, b) => a + b, 0);
  const lost = el("div", "incomplete");
  if (s.incomplete) {
    const only = el("a", null, "show them"); only.onclick = () => { document.getElementById("only-incomplete").checked = true; selectRollouts(); document.getElementById("controls").scrollIntoView({block: "start"}); };
    lost.append(`${plural(s.incomplete, "incomplete rollout")} (capture lines lost) · `, only);
  }
  card("run", [el("div", "big", plural(s.calls, "call")),
               el("div", null, `${plural(s.rollouts, "rollout")}, ${plural(failures, "error")}${s.unreadable ? `, ${plural(s.unreadable, "unreadable line")}` : ""}`), lost,
               el("div", "hint", `from ${utc(s.started_at)}`), el("div", "hint", `to ${utc(s.ended_at)}`),
               el("div", null, s.started_at === null ? "" : `wall clock ${ms((s.ended_at - s.started_at) * 1000)}`)], "run");
  card("tokens", [el("div", null, `in ${num(s.tokens_in)} (cached ${num(s.cached_tokens)})`), el("div", null, `out ${num(s.tokens_out)}`)]);
  const groups = s.failed.map(([category, count, examples]) => {
    const g = el("div", "group"), all = el("a", null, "show all"); all.onclick = () => filterTo("category", category);
    g.append(el("b", null, `${category}: ${count.toLocaleString()}`), " · ", all);
    const ol = el("ol"); examples.forEach(([id, i]) => { const li = el("li"); li.append(link(`${id} #${i}`, callHref(id, i))); ol.append(li); });
    g.append(ol); return g;
  });
  card("failed calls by category", groups.length ? groups : [el("div", "hint", "none")], "failed");
  for (const [title, d] of [["latency", s.latency], ["time to first token", s.ttft]]) {
    const hist = el("div", "hist"), most = Math.max(1, ...d.histogram.map(b => b[1]));
    for (const [upper, count] of d.histogram) { const bar = el("span"); bar.style.height = (count / most * 100) + "%"; bar.title = `≤ ${ms(upper)}: ${count}`; hist.append(bar); }
    const axis = el("div", "hist-axis"); axis.append(el("span", null, d.histogram.length ? ms(d.histogram[0][0]) : "-"), el("span", null, d.histogram.length ? ms(d.histogram[d.histogram.length - 1][0]) : ""));
    card(title, [el("div", null, `p50 ${ms(d.p50)} · p90 ${ms(d.p90)} · p99 ${ms(d.p99)}`), hist, axis]);
  }
  const ol = el("ol"); s.slowest.forEach(([id, i, t]) => { const li = el("li"); li.append(link(`${id} #${i}: ${ms(t)}`, callHref(id, i))); ol.append(li); });
  card("slowest calls", s.slowest.length ? [ol] : [el("div", "hint", "none")], "slowest");
}
function filterTo(facet, value) {
  document.getElementById("facet-" + facet).value = value; chosen[facet] = value; selectRollouts();
  document.getElementById("controls").scrollIntoView({block: "start"});
}
function facetControls() {
  const box = document.getElementById("facets");
  for (const [name, , label] of FACETS) {
    const l = el("label", null, label + " "), s = el("select"); s.id = "facet-" + name;
    s.addEventListener("input", () => { chosen[name] = s.value; selectRollouts(); });
    l.append(s); box.append(l, " ");
  }
}
let order = [], shown = 0;
function selectRollouts() {
  const key = document.getElementById("sort").value, text = document.getElementById("filter").value.trim().toLowerCase();
  const onlyErrors = document.getElementById("only-errors").checked;
  const onlyIncomplete = document.getElementById("only-incomplete").checked;
  const active = FACETS.filter(([name]) => chosen[name]);
  const counts = Object.fromEntries(FACETS.map(([name]) => [name, new Map()]));
  let matching = 0;
  const list = [];
  for (const r of DATA.rollouts) {
    if ((onlyErrors && !r.errors) || (onlyIncomplete && !r.incomplete) || (text && !r.lower.includes(text))) continue;
    let any = false;
    for (const c of r.calls) {
      let misses = 0, missed = null;
      for (const f of active) if (facetValue(c, f[1]) !== chosen[f[0]]) { misses++; missed = f[0]; }
      for (const [name, i] of FACETS) {  // Counted when every other filter matches.
        if (misses === 0 || (misses === 1 && missed === name)) { const v = facetValue(c, i), m = counts[name]; m.set(v, (m.get(v) || 0) + 1); }
      }
      if (misses === 0) { any = true; matching++; }
    }
    if (any || (!active.length && !r.calls.length)) list.push(r);
  }
  for (const [name] of FACETS) {
    const s = document.getElementById("facet-" + name), entries = [...counts[name].entries()].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
    if (chosen[name] && !counts[name].has(chosen[name])) entries.push([chosen[name], 0]);
    s.textContent = ""; s.append(new Option("any", ""));
    for (const [v, n] of entries) s.append(new Option(`${v} (${n.toLocaleString()})`, v));
    s.value = chosen[name] || "";
  }
  const by = {errors: r => -r.errors, tokens: r => -r.tokens, latency: r => -r.slowest, calls: r => -r.calls.length};
  list.sort(key === "id" ? (a, b) => a.id < b.id ? -1 : 1 : (a, b) => by[key](a) - by[key](b) || (a.id < b.id ? -1 : 1));
  order = list; shown = 0;
  const box = document.getElementById("rollouts"); box.textContent = "";
  box.dataset.matching = matching;
  box.append(el("p", "hint", `${plural(matching, "call")} in ${plural(list.length, "rollout")} match`));
  box.append(timeAxis()); more();
}
function timeAxis() {
  const axis = el("div", "axis"); axis.title = "one time axis for every rollout: a bar's length is its call's duration";
  const width = Math.max(0, document.getElementById("rollouts").clientWidth - (innerWidth <= 800 ? 130 : 198));
  const steps = Math.max(1, Math.min(4, Math.floor(width / 90)));  // Labels never closer than 90 px.
  for (let i = 0; i <= steps; i++) {
    const t = el("span", null, i ? ms(SPAN * 1000 * i / steps) : "0"); t.style.left = (i * 100 / steps) + "%";
    t.style.transform = i === 0 ? "none" : i === steps ? "translateX(-100%)" : "translateX(-50%)"; axis.append(t);
  }
  return axis;
}
function more() {
  const box = document.getElementById("rollouts"); document.getElementById("more")?.remove();
  for (const r of order.slice(shown, shown + PAGE)) box.append(rollout(r));
  shown = Math.min(order.length, shown + PAGE);
  document.getElementById("shown").textContent = `${shown.toLocaleString()} of ${plural(order.length, "rollout")} shown`;
  if (shown < order.length) { const b = el("button", null, `show ${Math.min(PAGE, order.length - shown)} more`); b.id = "more"; b.onclick = more; box.append(b); }
}
function matches(c) { return FACETS.every(([name, i]) => !chosen[name] || facetValue(c, i) === chosen[name]); }
function rollout(r) {
  const sec = el("section", "rollout"); sec.dataset.rollout = r.id; sec.id = "rollout-" + r.n;
  const h = el("h2"); h.append(link(r.id, rolloutHref(r.id)), " ");
  h.append(el("span", "meta", `${plural(r.calls.length, "call")}, ${plural(r.errors, "error")}, ${ms(r.span * 1000)}${r.unreadable ? `, ${plural(r.unreadable, "unreadable line")}` : ""}${r.incomplete ? ", capture incomplete" : ""}`));
  sec.append(h);
  if (r.chains) sec.append(el("div", "meta chains", r.chains));
  if (r.agents) sec.append(el("div", "meta agents", r.agents));
  if (r.privacy) sec.append(el("div", "meta privacy", r.privacy));
  r.calls.forEach(c => {
    const row = el("div", "call" + (c[F.category] ? " error" : "") + (matches(c) ? "" : " dim")); row.dataset.index = c[F.index];
    row.dataset.kind = klass(c);
    const label = el("span", "label", "#" + c[F.index]);
    if (c[F.train] && c[F.train].includes("drifts")) { label.append(el("span", "drift", "~")); label.title = "prompt drifts: " + c[F.train]; }
    row.append(label);
    const track = el("div", "track"), bar = el("div", "bar " + klass(c));
    const left = c[F.start] === null ? 0 : (c[F.start] - r.start) / SPAN * 100, width = (c[F.latency] || 0) / 1000 / SPAN * 100;
    bar.style.left = left + "%"; bar.style.width = width + "%"; track.append(bar);
    if (c[F.ttft] !== null) { const t = el("div", "ttft"); t.style.left = (left + c[F.ttft] / 1000 / SPAN * 100) + "%"; track.append(t); }
    track.title = `${c[F.dialect] || ""} ${c[F.status] ?? ""} ${c[F.category] || "ok"}: ${ms(c[F.latency])}, ${c[F.ttft] === null ? "no first token" : "first token " + ms(c[F.ttft])}`;
    const tok = el("div", "tokens"); tok.title = `in ${num(c[F.tin])} (cached ${num(c[F.tcached])}), out ${num(c[F.tout])}`;
    for (const [cls, v] of [["tcached", c[F.tcached] || 0], ["tin", Math.max(0, (c[F.tin] || 0) - (c[F.tcached] || 0))], ["tout", c[F.tout] || 0]]) {
      const s = el("span", cls); s.style.width = Math.max(v ? 1 : 0, v / MAXTOK * 140) + "px"; tok.append(s);
    }
    row.append(track, tok); row.onclick = () => { const to = callHref(r.id, c[F.index]); clicked = true; if (location.hash === to) route(); else location.hash = to; }; sec.append(row);
  });
  return sec;
}
function sectionOf(r) {
  let sec = document.querySelector(`section[data-rollout="${CSS.escape(r.id)}"]`);
  if (!sec) { sec = rollout(r); document.getElementById("rollouts").querySelector(".axis").after(sec); }
  return sec;
}
let clicked = false;
// The URL fragment names what is open: #call=<rollout id>/<index> or #rollout=<rollout id>.
function route() {
  const found = /^#(call|rollout)=([^\/]*)(?:\/(\d+))?$/.exec(location.hash);
  const detail = document.getElementById("detail");
  if (!found) { detail.classList.remove("open"); return; }
  const r = byId.get(decodeURIComponent(found[2]));
  if (!r) { detail.classList.remove("open"); detail.textContent = ""; detail.append(el("p", "hint", `No rollout ${decodeURIComponent(found[2])} in this report.`)); return; }
  const sec = sectionOf(r);
  document.querySelectorAll("section.rollout.target").forEach(e => e.classList.remove("target")); sec.classList.add("target");
  if (found[1] === "rollout") { detail.classList.remove("open"); sec.scrollIntoView({block: "start"}); return; }
  const index = Number(found[3]), c = r.calls.find(x => x[F.index] === index), row = sec.querySelector(`.call[data-index="${index}"]`);
  if (!c || !row) { detail.textContent = ""; detail.append(el("p", "hint", `${r.id} has no call ${index}.`)); return; }
  // A call opened by a link is brought to the top, its detail beside it; a clicked one stays put.
  if (innerWidth > 800) row.scrollIntoView({block: clicked ? "nearest" : "center"});
  clicked = false;
  show(r, c, row);
}
function show(r, c, row) {
  document.querySelectorAll(".call.selected").forEach(e => e.classList.remove("selected")); row.classList.add("selected");
  const d = document.getElementById("detail"); d.textContent = ""; d.classList.add("open"); d.scrollTop = 0;
  const back = el("button", "back", "← back to the rollouts"); back.onclick = () => { location.hash = rolloutHref(r.id); };
  const h = el("h3"); h.append(`${r.id} — call ${c[F.index]} `, link("link", callHref(r.id, c[F.index])));
  d.append(back, h);
  d.append(el("p", null, `${c[F.dialect] || ""} ${c[F.model] || ""} · status ${c[F.status] ?? "-"} · ${c[F.category] || "ok"} · latency ${ms(c[F.latency])} · ${c[F.ttft] === null ? "no first token" : "first token " + ms(c[F.ttft])} · tokens in ${num(c[F.tin])}, cached ${num(c[F.tcached])}, out ${num(c[F.tout])} · finish ${c[F.finish] || "-"}`));
  const at = r.calls.indexOf(c);
  withPayloads(r, bodies => {
    if (!row.classList.contains("selected")) return;
    const [conv, request, response, failure, arrays, error] = bodies[at];
    if (failure) { const f = el("div", "failure"); f.append(el("h4", null, "failure"), el("pre", null, raw(failure))); d.append(f); }
    d.append(el("h4", null, `request · ${plural(conv.request.length, "message")}`));
    if (conv.tools.length) d.append(el("p", "hint", "tools offered: " + conv.tools.join(", ")));
    conv.request.forEach(m => d.append(message(m, false)));
    if (error) { d.append(el("h4", null, "error reply")); d.append(el("div", "msg error-reply", error)); }
    else {
      d.append(el("h4", null, "reply"));
      if (conv.reply.length) conv.reply.forEach(m => d.append(message(m, true))); else d.append(el("p", "hint", "no reply was captured"));
    }
    if (arrays.length) { d.append(el("h4", null, "training arrays")); arrays.forEach(a => d.append(el("p", null, a))); }
    for (const [title, value] of [["raw request JSON", request], ["raw response JSON", response]]) {
      if (value === null || value === undefined) continue;
      const box = el("details"); box.append(el("summary", null, title)); d.append(box);
      box.addEventListener("toggle", () => { if (box.open && box.children.length === 1) box.append(el("pre", null, raw(value))); });
    }
  });
}
const raw = v => typeof v === "string" ? v : JSON.stringify(v, null, 2);
function message(m, reply) {
  const box = el("div", `msg role-${String(m.role).replace(/[^a-z]/g, "")}${reply ? " reply" : ""}`);
  box.append(el("div", "role", m.role + (reply && m.choice !== undefined && m.choice !== 0 ? ` · choice ${m.choice}` : "")));
  for (const p of m.parts) {
    const part = el("div", "part " + p.kind);
    const id = p.call_id ? ` · ${p.call_id}` : "";
    if (p.kind === "tool_call") part.append(el("div", "label", `tool call ${p.name || "?"}${id}`));
    else if (p.kind === "tool_result") part.append(el("div", "label", `tool result${p.name ? " of " + p.name : ""}${id}`));
    else if (p.kind === "reasoning") part.append(el("div", "label", "reasoning"));
    part.append(el("pre", null, p.text)); box.append(part);
  }
  if (!m.parts.length) box.append(el("div", "hint", "(empty)"));
  return box;
}
summary();
facetControls();
for (const id of ["sort", "filter", "only-errors", "only-incomplete"]) document.getElementById(id).addEventListener("input", selectRollouts);
selectRollouts();
addEventListener("hashchange", route);
route();
</script></body></html>
"""
