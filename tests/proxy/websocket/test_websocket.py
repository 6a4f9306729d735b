"""The Responses WebSocket mode (docs/wire.md): relayed to an upstream that accepts it, bridged to
streamed POSTs for one that does not (the stand-in, as vLLM: no WebSocket); each response one line,
as complete as the same response over HTTP, durable before its ending event reaches the client."""

from __future__ import annotations

import asyncio
import os

import aiohttp
import orjson
import pytest

from proxy.http import websocket

from tests.scripted_upstream import json_script
from tests.websockets_wire import RawSocket, WebSocketUpstream, create, sse_data

PATH = "/ng-rollout/{}/v1/responses"
TURNS = 10


@pytest.fixture
async def ws_upstream(stand_in):
    upstream = await WebSocketUpstream(stand_in.url).start()
    yield upstream
    await upstream.close()


def lines_of(capture_dir: str, rollout_id: str) -> list[dict]:
    path = os.path.join(capture_dir, rollout_id + ".capture.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, "rb") as handle:
        return [orjson.loads(line) for line in handle]


async def session(url: str, path: str, capture_dir: str | None, rollout_id: str, deflate: bool = False,
                  turns: int = TURNS) -> tuple[RawSocket, list[list[dict]]]:
    """``turns`` responses on one socket, each chained to the last; checks, at each ending event,
    that the response's line is already on disk."""
    socket = await RawSocket.connect(url, path, deflate=deflate)
    assert socket.status == 101, socket.head
    answered, previous = [], None
    for turn in range(turns):
        socket.send_text(create(f"turn {turn}: say something", previous))
        events = await socket.until_ending()
        if capture_dir is not None:
            assert len(lines_of(capture_dir, rollout_id)) == turn + 1  # Durable before the ending frame.
        answered.append(events)
        previous = events[-1]["response"]["id"]
    return socket, answered


@pytest.mark.parametrize("deflate", [False, True], ids=["plain", "permessage-deflate"])
async def test_a_relayed_session_of_ten_responses_is_byte_identical_and_ten_lines(start, ws_upstream, capture_dir,
                                                                                  over_http, deflate):
    """To an upstream that accepts the upgrade: the client's bytes equal a direct session's, frame for
    frame (compressed too); ten lines, each as complete as the same response over HTTP SSE."""
    direct, direct_events = await session(ws_upstream.url, "/v1/responses", None, "", deflate)
    direct.close()
    sidecar = await start(ws_upstream.url, capture_dir=capture_dir)
    proxied, proxied_events = await session(sidecar.url, PATH.format("relayed"), capture_dir, "relayed", deflate)
    await asyncio.sleep(0.05)
    assert bytes(proxied.received) == bytes(direct.received) and proxied_events == direct_events
    assert proxied.head.split(b"\r\n")[0] == b"HTTP/1.1 101 Switching Protocols"
    assert (b"permessage-deflate" in proxied.head) is deflate
    proxied.close()
    lines = lines_of(capture_dir, "relayed")
    assert len(lines) == TURNS
    async with aiohttp.ClientSession() as http:
        for turn, line in enumerate(lines):
            assert line["websocket"]["mode"] == "relay" and line["websocket"]["turn"] == turn
            assert line["status_code"] == 200 and line.get("error_category") is None
            # The request as the socket stood for it: the whole context, not only the new input.
            if turn == 0:
                assert line["request"]["input"] == "turn 0: say something"
            else:
                assert len(line["request"]["input"]) == 1 + 3 * turn and "previous_response_id" not in line["request"]
                assert line["request"]["input"][-1] == {"role": "user", "content": f"turn {turn}: say something"}
            # The same response as the upstream made it, over HTTP SSE: the same reassembly.
            sent = {key: value for key, value in ws_upstream.creates[TURNS + turn].items() if key != "type"}
            http_line = await over_http(http, sent, f"http-{turn}")
            assert line["response"] == http_line["response"]


@pytest.fixture
async def over_http(start, stand_in, capture_dir):
    """The same request as a streamed POST through a sidecar in front of the stand-in: its line."""
    sidecar = await start(stand_in.url, capture_dir=capture_dir)

    async def line_of(http, request, rollout_id):
        async with http.post(sidecar.url + PATH.format(rollout_id), data=orjson.dumps({**request, "stream": True})) as reply:
            await reply.read()
        return lines_of(capture_dir, rollout_id)[0]
    return line_of


async def test_a_bridged_session_of_ten_responses_equals_the_same_over_http(start, stand_in, capture_dir, over_http):
    """To an upstream with no WebSocket (the stand-in answers the upgrade 405, as vLLM refuses it):
    one text frame per SSE event of the streamed POST, in order; ten lines; each POST carries the
    socket's whole context, so the upstream needs no stored responses."""
    sidecar = await start(stand_in.url, capture_dir=capture_dir)
    socket, answered = await session(sidecar.url, PATH.format("bridged"), capture_dir, "bridged")
    socket.close()
    lines = lines_of(capture_dir, "bridged")
    assert len(lines) == TURNS
    async with aiohttp.ClientSession() as http:
        for turn, (line, events) in enumerate(zip(lines, answered)):
            assert line["websocket"] == {"mode": "bridge", "socket": lines[0]["websocket"]["socket"], "turn": turn,
                                         **({"previous_response_id": answered[turn - 1][-1]["response"]["id"]}
                                            if turn else {})}
            assert line["request"]["stream"] is True and "previous_response_id" not in line["request"]
            direct = await sse_data(http, stand_in.url, line["request"])
            assert [orjson.dumps(event) for event in events] == [orjson.dumps(orjson.loads(d)) for d in direct]
            http_line = await over_http(http, line["request"], f"twin-{turn}")
            assert line["response"] == http_line["response"] and line["response"]["status"] == "completed"


@pytest.mark.parametrize("mode", ["bridge", "relay"])
async def test_a_prewarm_is_recorded_as_such_and_chained_to(start, stand_in, ws_upstream, capture_dir, mode):
    """``generate: false`` warms the socket: a line marked ``prewarm``; the next response chains to it
    and its line's request carries the prewarm's input."""
    sidecar = await start(ws_upstream.url if mode == "relay" else stand_in.url, capture_dir=capture_dir)
    socket = await RawSocket.connect(sidecar.url, PATH.format("warm"))
    socket.send_text(create([{"role": "system", "content": "be brief"}], generate=False))
    warm = await socket.until_ending()
    assert [event["type"] for event in warm] == ["response.created", "response.completed"]
    socket.send_text(create("now answer", warm[-1]["response"]["id"]))
    answer = await socket.until_ending()
    assert answer[-1]["type"] == "response.completed" and answer[-1]["response"]["output"]
    socket.close()
    first, second = lines_of(capture_dir, "warm")
    assert first["websocket"]["prewarm"] is True and first["request"]["generate"] is False
    assert first["response"]["output"] == []
    assert second["request"]["input"][0] == {"role": "system", "content": "be brief"}
    assert second["websocket"]["previous_response_id"] == warm[-1]["response"]["id"]
    if mode == "bridge":
        assert first["response_source"] == "local" and first["local_response_reason"] == "prewarm"


async def test_ping_fragments_and_close_on_a_bridged_socket(start, stand_in, capture_dir):
    """A ping gets its pong; a response.create in three fragments with a ping between them is one
    message; a close is answered with the same code and the socket ends."""
    sidecar = await start(stand_in.url, capture_dir=capture_dir)
    socket = await RawSocket.connect(sidecar.url, PATH.format("frames"))
    socket.send(websocket.PING, b"are you there")
    pong = await socket.next_message()
    assert (pong.opcode, pong.payload) == (websocket.PONG, b"are you there")
    frames = socket.frames_of(create("in pieces"), fragments=3)
    first_end = 2 + 4 + len(create("in pieces")) // 3 + 1  # One frame's head, mask and piece.
    socket.writer.write(frames[:first_end] + websocket.encode_frame(websocket.PING, b"mid", mask=socket.MASK)
                        + frames[first_end:])
    pong = await socket.next_message()
    assert (pong.opcode, pong.payload) == (websocket.PONG, b"mid")
    events = await socket.until_ending()
    assert events[-1]["type"] == "response.completed"
    socket.send(websocket.CLOSE, websocket.close_payload(1000))
    closing = await socket.next_message()
    assert closing.opcode == websocket.CLOSE and websocket.close_code(closing.payload) == 1000
    assert await socket.reader.read() == b""
    (line,) = lines_of(capture_dir, "frames")
    assert line["request"]["input"] == "in pieces"


async def test_an_oversized_message_closes_the_socket_with_1009(start, stand_in, capture_dir):
    sidecar = await start(stand_in.url, capture_dir=capture_dir, max_body_bytes=1024)
    socket = await RawSocket.connect(sidecar.url, PATH.format("big"))
    socket.send_text(create("x" * 4096))
    closing = await socket.next_message()
    assert closing.opcode == websocket.CLOSE and websocket.close_code(closing.payload) == websocket.MESSAGE_TOO_BIG
    assert lines_of(capture_dir, "big") == []


async def test_a_client_leaving_mid_response_leaves_a_cancelled_line(start, stand_in, capture_dir):
    sidecar = await start(stand_in.url, capture_dir=capture_dir)
    socket = await RawSocket.connect(sidecar.url, PATH.format("left"), headers=(("X-Stand-In-Pace", "0.05"),))
    socket.send_text(create("a slow one"))
    while (await socket.next_message()).payload.find(b"output_text.delta") < 0:
        pass
    socket.close()
    for _ in range(100):
        if lines_of(capture_dir, "left"):
            break
        await asyncio.sleep(0.05)
    (line,) = lines_of(capture_dir, "left")
    assert line["error_category"] == "cancelled" and line["failure"]["stage"] == "client"


async def test_an_upstream_error_is_an_error_event_and_the_socket_stays_open(start, upstream, capture_dir):
    """The upstream's HTTP 400 (an ordinary call's line) reaches the client as the socket's error
    event, with the status and the upstream's own error; the next response is served."""
    upstream.scripts["/v1/responses"] = json_script(
        b'{"error": {"message": "model \\"m\\" does not exist", "type": "NotFoundError", "code": 404}}', 404, "Not Found")
    sidecar = await start(upstream.url, capture_dir=capture_dir)
    socket = await RawSocket.connect(sidecar.url, PATH.format("errors"))
    for _ in range(2):
        socket.send_text(create("hi"))
        (event,) = await socket.until_ending()
        assert event == {"type": "error", "status": 404,
                         "error": {"message": 'model "m" does not exist', "type": "NotFoundError", "code": 404}}
    socket.close()
    lines = lines_of(capture_dir, "errors")
    assert [line["status_code"] for line in lines] == [404, 404]
    assert [request.method for request in upstream.received] == ["GET", "POST", "POST"]


async def test_the_token_mode_adds_and_cuts_on_the_bridged_post(start, stand_in, tmp_path):
    """In the token mode the bridged POST asks for the token fields and the frames the agent gets
    equal those it gets with the mode off; the token file has each response's entry."""
    from records import read_token_records

    received = {}
    for tokens in (False, True):
        directory = str(tmp_path / f"tokens-{tokens}")
        sidecar = await start(stand_in.url, capture_dir=directory, capture_tokens=tokens)
        socket, answered = await session(sidecar.url, PATH.format("tokens"), directory, "tokens", turns=3)
        socket.close()
        received[tokens] = answered
        if tokens:
            lines = lines_of(directory, "tokens")
            assert all(line.get("added_request_fields") for line in lines)
            records = read_token_records(directory, "tokens")
            assert len(records) == 3 and all(record.generation_token_ids for record in records)
    assert received[True] == received[False]


async def test_other_upgrades_and_unprefixed_sockets_get_a_501(start, stand_in, capture_dir, caplog):
    sidecar = await start(stand_in.url, capture_dir=capture_dir)
    for path in ("/v1/responses", "/ng-rollout/r1/v1/chat/completions"):
        socket = await RawSocket.connect(sidecar.url, path)
        assert socket.status == 501
        socket.close()
    assert any("/v1/chat/completions" in record.getMessage() and "501" in record.getMessage()
               for record in caplog.records)


async def test_a_client_leaving_a_relayed_response_leaves_a_cancelled_line(start, stand_in, capture_dir):
    """The relay: the client closes its socket mid-response; the upstream socket is closed too (the
    GPU stops) and the response's line says ``cancelled``."""
    upstream = await WebSocketUpstream(stand_in.url, pace=0.05).start()
    try:
        sidecar = await start(upstream.url, capture_dir=capture_dir)
        socket = await RawSocket.connect(sidecar.url, PATH.format("relay-left"))
        socket.send_text(create("a slow one"))
        while (await socket.next_message()).payload.find(b"output_text.delta") < 0:
            pass
        socket.writer.transport.abort()
        for _ in range(100):
            if lines_of(capture_dir, "relay-left"):
                break
            await asyncio.sleep(0.05)
        (line,) = lines_of(capture_dir, "relay-left")
        assert line["error_category"] == "cancelled" and line["websocket"]["mode"] == "relay"
        assert line["response"]["status"] == "in_progress"  # What had come: the reassembly so far.
    finally:
        await upstream.close()


async def test_a_relayed_socket_whose_frames_cannot_be_read_is_still_relayed(start, ws_upstream, capture_dir, caplog):
    """A client frame the capture cannot read (a reserved bit set) is relayed as it came; the
    capture of that socket stops, said in the log; the upstream answers the protocol error itself."""
    sidecar = await start(ws_upstream.url, capture_dir=capture_dir)
    socket = await RawSocket.connect(sidecar.url, PATH.format("odd"))
    socket.send_text(create("hello"))
    events = await socket.until_ending()
    assert events[-1]["type"] == "response.completed"
    frame = bytearray(websocket.encode_frame(websocket.TEXT, create("again"), mask=socket.MASK))
    frame[0] |= 0x20  # RSV2: no extension defines it.
    socket.writer.write(bytes(frame))
    closing = await socket.next_message()
    assert closing.opcode == websocket.CLOSE and websocket.close_code(closing.payload) == websocket.PROTOCOL_ERROR
    socket.close()
    await asyncio.sleep(0.1)
    assert len(lines_of(capture_dir, "odd")) == 1
    assert any("stopped capturing a relayed WebSocket" in record.getMessage() for record in caplog.records)
    async with aiohttp.ClientSession() as http, http.get(sidecar.url + "/-/metrics") as reply:
        metrics = await reply.text()
    assert "mcc_websocket_capture_stopped_total 1.0" in metrics and 'mcc_websockets_total{mode="relay"} 1.0' in metrics


@pytest.mark.slow
async def test_the_relay_holds_the_ending_frame_at_every_split(start, capture_dir):
    """An upstream that writes its frames cut at each point around the ending event's frame (its
    head split, its payload split, fragmented): the client never has the whole ending before the
    line is on disk, and gets every byte as sent."""
    events = [orjson.dumps({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}),
              orjson.dumps({"type": "response.output_text.delta", "delta": "Hi", "output_index": 0,
                            "content_index": 0, "item_id": "m1"}),
              orjson.dumps({"type": "response.completed", "response": {
                  "id": "resp_1", "object": "response", "status": "completed", "output": [
                      {"type": "message", "id": "m1", "role": "assistant",
                       "content": [{"type": "output_text", "text": "Hi"}]}]}})]
    ending = events[-1]
    body = (websocket.encode_frame(websocket.TEXT, events[0]) + websocket.encode_frame(websocket.TEXT, events[1])
            + websocket.encode_frame(websocket.TEXT, ending[:20], fin=False)
            + websocket.encode_frame(websocket.CONTINUATION, ending[20:]))
    last_frame = body.rindex(websocket.encode_frame(websocket.CONTINUATION, ending[20:]))
    cuts = sorted({*range(last_frame - 3, last_frame + 4), len(body) - 1, len(body) - 30, 1})

    async def serve(reader, writer, cut):
        head = await reader.readuntil(b"\r\n\r\n")
        key = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n") if line.lower().startswith(b"sec-websocket-key"))
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     b"Sec-WebSocket-Accept: " + websocket.accept_value(key) + b"\r\n\r\n")
        await reader.read(65536)  # The response.create.
        for piece in (body[:cut], body[cut:]):
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(0.02)
        await reader.read()
        writer.close()

    for cut in cuts:
        server = await asyncio.start_server(lambda r, w, cut=cut: serve(r, w, cut), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        sidecar = await start(f"http://127.0.0.1:{port}", capture_dir=capture_dir)
        rollout = f"split-{cut}"
        socket = await RawSocket.connect(sidecar.url, PATH.format(rollout))
        socket.send_text(create("hi"))
        got = await socket.until_ending()
        assert len(lines_of(capture_dir, rollout)) == 1, cut  # On disk before the client had the end.
        assert [orjson.dumps(event) for event in got] == events
        assert bytes(socket.received) == body
        (line,) = lines_of(capture_dir, rollout)
        assert line["response"]["output"][0]["content"][0]["text"] == "Hi"
        socket.close()
        server.close()


@pytest.mark.parametrize("mode", ["bridge", "relay"])
async def test_a_draining_sidecar_says_going_away_to_an_idle_socket(start, stand_in, ws_upstream, capture_dir, mode):
    """SIGTERM's drain: a socket between responses is closed with 1001 at once (the client reconnects
    elsewhere), not held until the drain timeout; its lines are on disk."""
    sidecar = await start(ws_upstream.url if mode == "relay" else stand_in.url, capture_dir=capture_dir,
                          drain_timeout=30)
    socket = await RawSocket.connect(sidecar.url, PATH.format(f"drain-{mode}"))
    socket.send_text(create("hi"))
    await socket.until_ending()
    closing = asyncio.ensure_future(sidecar.close())
    goodbye = await socket.next_message()
    assert goodbye.opcode == websocket.CLOSE and websocket.close_code(goodbye.payload) == websocket.GOING_AWAY
    await closing
    assert sidecar.sidecar.drained == (1, 0)  # Finished by the drain, not cut at its timeout.
    assert len(lines_of(capture_dir, f"drain-{mode}")) == 1
