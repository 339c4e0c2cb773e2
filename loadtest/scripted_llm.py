"""A scripted OpenAI- and Anthropic-compatible LLM server on loopback: the only stand-in in the
test suite.

A real HTTP/1.1 server in a thread. ``/v1/chat/completions`` (OpenAI) and ``/v1/messages``
(Anthropic Messages, with its event types and optional ``tool_use`` blocks) answer from one script
(a queue of :class:`Reply` objects, or a responder function of the request), non-streaming or as
SSE with the content cut into awkward pieces (including 1-character pieces and pieces that split
the sidecar marker), each piece flushed as its own HTTP chunk. Every request is recorded (with
its ``_path`` and ``_headers``).
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from service.extraction.sidecar import BEGIN, END


class _Server(ThreadingHTTPServer):
    # socketserver's backlog is 5: a proxy opening 50 connections at once (a load test, compose)
    # would see refused or delayed connects that a real model provider never causes
    request_queue_size = 128


@dataclass
class Reply:
    content: str = "ok"
    chunk_sizes: list[int] = field(default_factory=lambda: [7])
    status: int = 200
    delay_s: float = 0.0
    error: dict[str, Any] | None = None
    finish_with_last: bool = False  # send the last piece in the same event as finish_reason
    usage_chunk: bool = False  # a trailing usage-only chunk (stream_options.include_usage)
    # Anthropic only: a tool call after the text ({"id", "name", "input"}), stop_reason "tool_use"
    tool_use: dict[str, Any] | None = None
    # the whole SSE body cut into HTTP chunks at these byte offsets instead of one chunk per event
    # (cuts anywhere: inside an event, a JSON string, a marker, a UTF-8 sequence); the offsets
    # count from the first occurrence of ``cuts_from`` in the body when it is given
    byte_cuts: list[int] | None = None
    cuts_from: bytes | None = None
    # a stream of exactly these events instead of the generated ones (OpenAI: then ``[DONE]``
    # unless ``done`` is false; Anthropic: each with its ``event:`` line)
    events: list[dict[str, Any]] | None = None
    done: bool = True
    # extra response headers of an error (Retry-After), or of an OpenAI whole answer
    headers: dict[str, str] = field(default_factory=dict)
    completion: dict[str, Any] | None = None  # OpenAI, not streaming: exactly this answer
    # a stream that never ends: after its events these bytes again and again (an unterminated line,
    # or whole events), until the client hangs up (the request records it as ``_hung_up``)
    # or ``endless_max_bytes`` went out (then the body simply ends)
    endless: bytes | None = None
    endless_max_bytes: int = 64 * 1024 * 1024
    # between the endless pieces: a model's pace, which also keeps them out of the sockets' buffers
    # (sent faster than the client reads, they all fit there and a hang-up is never seen)
    endless_pause_s: float = 0.0
    # "gzip" or "deflate": the whole body compressed with it (an upstream may compress whatever
    # the request's Accept-Encoding said), each HTTP chunk a flushed piece of one compressed
    # stream, so an endless part is a decompression bomb (1 MiB of one letter: ~1 kB on the wire)
    content_encoding: str | None = None
    # a whole (not streamed) answer sent one byte at a time, this long apart: a server trickling
    # it, which a per-read timeout never stops (the request records a hang-up as ``_hung_up``)
    trickle_s: float = 0.0


Responder = Callable[[dict[str, Any]], Reply]


class ScriptedLLM:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.responder: Responder | None = None
        self.requests: list[dict[str, Any]] = []
        # GET /v1/models answers these ids (empty: 404, like an upstream without a model list)
        self.models: list[str] = ["gpt-4o", "claude-sonnet-4-5"]
        # that list sent a byte this often apart (a provider trickling it); a hang-up is counted
        self.models_trickle_s = 0.0
        self.models_hung_up = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self.replies.extend(replies)

    def reset(self) -> None:
        with self._lock:
            self.replies.clear()
            self.requests.clear()
            self.responder = None
            self.models_trickle_s = 0.0
            self.models_hung_up = 0

    def next_reply(self, request: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(request)
            del self.requests[:-1000]  # bounded, for long benchmark runs
            if self.replies:
                return self.replies.popleft()
            responder = self.responder
        return responder(request) if responder else Reply(content="(no script)")

    def start(self, port: int = 0, host: str = "127.0.0.1") -> ScriptedLLM:
        llm = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # as real servers do; avoids 40 ms delayed-ACK stalls
            _encoding: str | None = None  # the answer's Content-Encoding (Reply.content_encoding)
            _compressor: Any = None  # its compressor, one per answer
            _trickle_s = 0.0  # Reply.trickle_s of the answer

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002, ARG002
                return

            def do_GET(self) -> None:  # noqa: N802
                self._encoding = self._compressor = None
                self._trickle_s = llm.models_trickle_s
                if self.path.rstrip("/").endswith("/models") and llm.models:
                    data = [{"id": m, "object": "model", "created": 0, "owned_by": "scripted"} for m in llm.models]
                    try:
                        self._json(200, {"object": "list", "data": data})
                    except (BrokenPipeError, ConnectionResetError):
                        llm.models_hung_up += 1
                        self.close_connection = True
                else:
                    self._json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                request["_headers"] = {k.lower(): v for k, v in self.headers.items()}
                request["_path"] = self.path
                reply = llm.next_reply(request)
                self._encoding, self._compressor = reply.content_encoding, _compressor(reply.content_encoding)
                self._trickle_s = reply.trickle_s
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                try:
                    self._answer(request, reply)
                except (BrokenPipeError, ConnectionResetError):  # the request records the hang-up
                    request.setdefault("_hung_up", 0)
                    self.close_connection = True

            def send_response(self, code: int, message: str | None = None) -> None:
                super().send_response(code, message)
                if self._compressor is not None:
                    self.send_header("Content-Encoding", str(self._encoding))

            def _answer(self, request: dict[str, Any], reply: Reply) -> None:
                if self.path.rstrip("/").endswith("/messages"):
                    self._anthropic(request, reply)
                elif reply.status != 200:
                    self._json(
                        reply.status,
                        reply.error or {"error": {"message": "scripted failure", "type": "server_error"}},
                        reply.headers,
                    )
                elif request.get("stream"):
                    self._stream(request, reply)
                elif reply.endless is not None:
                    self._endless_json(request, reply)
                else:
                    self._json(200, reply.completion or _completion(request, reply.content), reply.headers)

            def _json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                if self._compressor is not None:
                    data = self._compressor.compress(data) + self._compressor.flush()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not self._trickle_s:
                    self.wfile.write(data)
                    return
                for at in range(len(data)):
                    self.wfile.write(data[at : at + 1])
                    self.wfile.flush()
                    time.sleep(self._trickle_s)

            def _start(self, content_type: str) -> None:
                """A 200 answer sent chunked (no length), compressed if the reply says so."""
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

            def _end(self) -> None:
                """The compressed stream's end (if any), then the last chunk."""
                if self._compressor is not None:
                    self.wfile.write(_chunked(self._compressor.flush()))
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _endless_json(self, request: dict[str, Any], reply: Reply) -> None:
                """A whole (not streamed) answer whose text never ends, sent chunked (no length)."""
                assert reply.endless is not None
                self._start("application/json")
                self._chunk(b'{"type": "message", "content": [{"type": "text", "text": "')
                if self._endless(request, reply):
                    self._chunk(b'"}], "choices": []}')
                    self._end()

            def _stream(self, request: dict[str, Any], reply: Reply) -> None:
                self._start("text/event-stream")
                if reply.events is not None:
                    events = [_event(event) for event in reply.events]
                else:
                    pieces = _pieces(reply.content, reply.chunk_sizes)
                    last = pieces.pop() if reply.finish_with_last and pieces else None
                    events = [_event(_delta(request, piece)) for piece in pieces]
                    events.append(_event(_delta(request, last, finish="stop")))
                if reply.usage_chunk:
                    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                    events.append(_event({**_delta(request, None), "choices": [], "usage": usage}))
                if reply.done:
                    events.append(b"data: [DONE]\n\n")
                self._send_body(request, events, reply)

            def _anthropic(self, request: dict[str, Any], reply: Reply) -> None:
                if reply.status != 200:
                    error = {"type": "api_error", "message": "scripted failure"}
                    self._json(reply.status, reply.error or {"type": "error", "error": error}, reply.headers)
                elif reply.endless is not None and not request.get("stream"):
                    self._endless_json(request, reply)
                elif request.get("stream"):
                    self._start("text/event-stream")
                    events = [
                        f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()
                        for event in (reply.events if reply.events is not None else _anthropic_events(request, reply))
                    ]
                    self._send_body(request, events, reply)
                else:
                    self._json(200, _anthropic_message(request, reply))

            def _send_body(self, request: dict[str, Any], events: list[bytes], reply: Reply) -> None:
                """One HTTP chunk per event, or the whole body cut at ``reply.byte_cuts``; then the end."""
                if reply.byte_cuts is not None:
                    body = b"".join(events)
                    origin = body.index(reply.cuts_from) if reply.cuts_from else 0
                    cuts = sorted(origin + c for c in reply.byte_cuts if 0 < origin + c < len(body))
                    bounds = [0, *cuts, len(body)]
                    events = [body[a:b] for a, b in itertools.pairwise(bounds)]
                for data in events:
                    self._chunk(data)
                if reply.endless and not self._endless(request, reply):
                    return
                self._end()

            def _endless(self, request: dict[str, Any], reply: Reply) -> bool:
                """``reply.endless`` again and again; False once the client hung up
                (``request["_hung_up"]``: how much of it went out)."""
                assert reply.endless is not None
                sent = 0
                while sent < reply.endless_max_bytes:
                    try:
                        self._chunk(reply.endless)
                    except (BrokenPipeError, ConnectionResetError):
                        request["_hung_up"] = sent
                        self.close_connection = True
                        return False
                    sent += len(reply.endless)
                    time.sleep(reply.endless_pause_s)
                return True

            def _chunk(self, data: bytes) -> None:
                if self._compressor is not None:  # what the data compressed to so far, sent now
                    data = self._compressor.compress(data) + self._compressor.flush(zlib.Z_SYNC_FLUSH)
                self.wfile.write(_chunked(data))
                self.wfile.flush()

        self._server = _Server((host, port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _compressor(encoding: str | None) -> Any:
    """A compressor of ``encoding`` (gzip, or deflate: zlib's format), None for no encoding."""
    if encoding is None:
        return None
    return zlib.compressobj(9, zlib.DEFLATED, {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}[encoding])


def _pieces(content: str, sizes: list[int]) -> list[str]:
    out: list[str] = []
    at = 0
    for size in itertools.cycle(sizes or [len(content) or 1]):
        if at >= len(content):
            break
        out.append(content[at : at + max(1, size)])
        at += max(1, size)
    return out


def _completion(request: dict[str, Any], content: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.get("model", "scripted"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _delta(request: dict[str, Any], piece: str | None, finish: str | None = None) -> dict[str, Any]:
    delta = {"content": piece} if piece is not None else {}
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": request.get("model", "scripted"),
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _anthropic_message(request: dict[str, Any], reply: Reply) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": reply.content}]
    if reply.tool_use:
        content.append({"type": "tool_use", **reply.tool_use})
    return {
        "id": "msg_scripted",
        "type": "message",
        "role": "assistant",
        "model": request.get("model", "scripted"),
        "content": content,
        "stop_reason": "tool_use" if reply.tool_use else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


def _anthropic_events(request: dict[str, Any], reply: Reply) -> list[dict[str, Any]]:
    """The Messages stream: message_start, a text block in pieces, a tool_use block with its
    input in pieces, message_delta, message_stop."""
    message = {**_anthropic_message(request, reply), "content": [], "stop_reason": None}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": message}, {"type": "ping"}]
    events.append({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
    for piece in _pieces(reply.content, reply.chunk_sizes):
        events.append({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}})
    events.append({"type": "content_block_stop", "index": 0})
    if reply.tool_use:
        block = {"type": "tool_use", "id": reply.tool_use["id"], "name": reply.tool_use["name"], "input": {}}
        events.append({"type": "content_block_start", "index": 1, "content_block": block})
        for piece in _pieces(json.dumps(reply.tool_use["input"]), reply.chunk_sizes):
            delta = {"type": "input_json_delta", "partial_json": piece}
            events.append({"type": "content_block_delta", "index": 1, "delta": delta})
        events.append({"type": "content_block_stop", "index": 1})
    stop = "tool_use" if reply.tool_use else "end_turn"
    delta_event = {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}}
    events.append({**delta_event, "usage": {"output_tokens": 1}})
    events.append({"type": "message_stop"})
    return events


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False).encode() + b"\n\n"


# A load-test turn carries ``[[turn:<letters> scope:<label>]]`` in its last user message; the
# answer's sidecar then records exactly one new belief named after it, so the load generator can
# check afterwards that each acknowledged turn was extracted once (not lost, not applied twice).
TURN_MARKER = re.compile(r"\[\[turn:([a-z]{6,40}) scope:([a-z]+:[a-z0-9_.:-]+)\]\]")
LOAD_ANSWER = "Noted. For a pure cache use allkeys-lru; keep volatile-lru when some keys must persist."


def load_turn_belief_name(token: str) -> str:
    return f"load_turn_{token}"


def load_reply(request: dict[str, Any]) -> Reply:
    """The ``--mode load`` answer: visible text plus a sidecar with one belief per marked turn."""
    users = [m for m in request.get("messages", []) if isinstance(m, dict) and m.get("role") == "user"]
    text = users[-1].get("content") if users else None
    found = TURN_MARKER.search(text) if isinstance(text, str) else None
    beliefs = []
    if found:
        token, scope = found.groups()
        beliefs.append(
            {
                "type": "decision",
                "subtype": None,
                "canonical_name": load_turn_belief_name(token),
                "content": f"Load-test turn {token} settled a decision.",
                "why_it_matters": "Answer with this decision in mind.",
                "scope": [scope],
                "confidence": 0.8,
                "epistemic_status": "active",
                "aliases": [f"loadturn {token}"],
                "resolves_open_question": None,
            }
        )
    sidecar = {
        "turn_signal": "substantive" if beliefs else "chitchat",
        "topic_shift": False,
        "topic_label": "load test",
        "new_beliefs": beliefs,
        "belief_updates": [],
        "entity_updates": [],
        "possible_alias_candidates": [],
        "resolved_open_questions": [],
        "new_open_questions": [],
        "style_signals": [],
    }
    return Reply(content=f"{LOAD_ANSWER}{BEGIN}{json.dumps(sidecar)}{END}", chunk_sizes=[16])


def main(argv: list[str] | None = None) -> int:
    """Serve scripted replies on a fixed port, in its own process (benchmarks, the load test, compose)."""
    import argparse

    parser = argparse.ArgumentParser(description="scripted OpenAI-compatible upstream")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=["fixed", "load"], default="fixed")
    parser.add_argument("--content-file", help="the fixed reply (--mode fixed)")
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument(
        "--delay-ms", type=float, default=0.0, help="answer each request after this long (a model's time)"
    )
    args = parser.parse_args(argv)
    server = ScriptedLLM()
    if args.mode == "load":
        server.responder = load_reply
    else:
        if not args.content_file:
            parser.error("--mode fixed needs --content-file")
        with open(args.content_file, encoding="utf-8") as fh:
            content = fh.read()
        delay_s = args.delay_ms / 1000
        server.responder = lambda _request: Reply(content=content, chunk_sizes=[args.chunk], delay_s=delay_s)
    server.start(port=args.port, host=args.host)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
