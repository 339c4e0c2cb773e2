"""A scripted OpenAI-compatible LLM server on loopback: the only stand-in in the test suite.

A real HTTP/1.1 server in a thread. ``/v1/chat/completions`` answers from a script (a queue of
:class:`Reply` objects, or a responder function of the request), non-streaming or as SSE with
the content cut into awkward pieces (including 1-character pieces and pieces that split the
sidecar marker), each piece flushed as its own HTTP chunk. Every request is recorded.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from service.extraction.sidecar import BEGIN, END


@dataclass
class Reply:
    content: str = "ok"
    chunk_sizes: list[int] = field(default_factory=lambda: [7])
    status: int = 200
    delay_s: float = 0.0
    error: dict[str, Any] | None = None
    finish_with_last: bool = False  # send the last piece in the same event as finish_reason
    usage_chunk: bool = False  # a trailing usage-only chunk (stream_options.include_usage)


Responder = Callable[[dict[str, Any]], Reply]


class ScriptedLLM:
    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.responder: Responder | None = None
        self.requests: list[dict[str, Any]] = []
        # GET /v1/models answers these ids (empty: 404, like an upstream without a model list)
        self.models: list[str] = ["gpt-4o", "claude-sonnet-4-5"]
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

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002, ARG002
                return

            def do_GET(self) -> None:  # noqa: N802
                if self.path.rstrip("/").endswith("/models") and llm.models:
                    data = [{"id": m, "object": "model", "created": 0, "owned_by": "scripted"} for m in llm.models]
                    self._json(200, {"object": "list", "data": data})
                else:
                    self._json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                request["_headers"] = {k.lower(): v for k, v in self.headers.items()}
                reply = llm.next_reply(request)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.status != 200:
                    self._json(
                        reply.status,
                        reply.error or {"error": {"message": "scripted failure", "type": "server_error"}},
                    )
                elif request.get("stream"):
                    self._stream(request, reply)
                else:
                    self._json(200, _completion(request, reply.content))

            def _json(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, request: dict[str, Any], reply: Reply) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                pieces = _pieces(reply.content, reply.chunk_sizes)
                last = pieces.pop() if reply.finish_with_last and pieces else None
                for piece in pieces:
                    self._chunk(_event(_delta(request, piece)))
                self._chunk(_event(_delta(request, last, finish="stop")))
                if reply.usage_chunk:
                    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                    self._chunk(_event({**_delta(request, None), "choices": [], "usage": usage}))
                self._chunk(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


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


def _event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body).encode() + b"\n\n"


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
    args = parser.parse_args(argv)
    server = ScriptedLLM()
    if args.mode == "load":
        server.responder = load_reply
    else:
        if not args.content_file:
            parser.error("--mode fixed needs --content-file")
        with open(args.content_file, encoding="utf-8") as fh:
            content = fh.read()
        server.responder = lambda _request: Reply(content=content, chunk_sizes=[args.chunk])
    server.start(port=args.port, host=args.host)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
