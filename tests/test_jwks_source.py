"""The JWKS of an identity provider, fetched from its URL (``TENURE_AUTH_JWKS_URL``): a real HTTP
server plays the provider."""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey

from service.auth import tokens
from service.auth.tokens import TokenVerifier
from service.config import AuthSettings
from service.errors import Unauthenticated

MiB = 1024 * 1024


class _Provider(BaseHTTPRequestHandler):
    """Serves ``body`` with ``status`` after ``delay`` seconds (a slow provider); counts the
    requests (as they arrive). A misbehaving provider: ``endless`` sent after the body again and
    again (up to ``endless_max_bytes``), or the body trickled one byte each ``trickle_s``, either
    gzip-compressed if ``gzip`` (asked or not); ``hung_up``: how much of it had gone out (decoded)
    when the client closed the connection."""

    status: ClassVar[int] = 200
    body: ClassVar[bytes] = b"{}"
    hits: ClassVar[int] = 0
    delay: ClassVar[float] = 0.0
    endless: ClassVar[bytes] = b""
    endless_max_bytes: ClassVar[int] = 256 * MiB
    trickle_s: ClassVar[float] = 0.0
    gzip: ClassVar[bool] = False
    hung_up: ClassVar[int | None] = None
    accept_encoding: ClassVar[str | None] = None  # the last request's

    def do_GET(self) -> None:  # noqa: N802 - the http.server hook
        cls = type(self)
        cls.hits += 1
        cls.accept_encoding = self.headers.get("Accept-Encoding")
        time.sleep(self.delay)
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        if not (self.endless or self.trickle_s or self.gzip):
            self.send_header("Content-Length", str(len(self.body)))
            self.end_headers()
            self.wfile.write(self.body)
            return
        coder = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS) if self.gzip else None
        if coder is not None:
            self.send_header("Content-Encoding", "gzip")
        self.end_headers()  # HTTP/1.0: the body ends where the connection does
        sent = 0
        try:
            for piece in self._pieces():
                self.wfile.write(coder.compress(piece) + coder.flush(zlib.Z_SYNC_FLUSH) if coder else piece)
                self.wfile.flush()
                sent += len(piece)
            if coder is not None:
                self.wfile.write(coder.flush())
        except (BrokenPipeError, ConnectionResetError):
            cls.hung_up = sent

    def _pieces(self) -> Iterator[bytes]:
        if self.trickle_s:
            for i in range(len(self.body)):
                yield self.body[i : i + 1]
                time.sleep(self.trickle_s)
            return
        yield self.body
        sent = 0
        while self.endless and sent < self.endless_max_bytes:
            yield self.endless
            sent += len(self.endless)
            time.sleep(0.001)  # a pace, which keeps the pieces out of the sockets' buffers

    def log_message(self, *_args: object) -> None:
        return None


@pytest.fixture
def provider() -> Iterator[tuple[type[_Provider], str]]:
    handler = type("Provider", (_Provider,), {"hits": 0, "status": 200, "body": b"{}", "delay": 0.0, "hung_up": None})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler, f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    finally:
        server.shutdown()
        server.server_close()


def _eventually(condition: Callable[[], bool], within_s: float = 3.0) -> None:
    """Wait for ``condition`` (a fetch runs on its own thread; a verification need not wait for it)."""
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.01)


def _token(key: RSAKey) -> str:
    now = int(time.time())
    claims = {"iss": "tenure", "aud": "tenure-api", "sub": "alice", "tenant_id": "acme", "exp": now + 600}
    return jwt.encode({"alg": "RS256", "kid": key.kid}, claims, key, algorithms=["RS256"])


def test_a_provider_that_stops_answering_is_asked_again_only_after_a_pause(
    provider: tuple[type[_Provider], str],
) -> None:
    """Once the cache has aged, a failed re-fetch serves the keys known before, and the next
    requests are not each sent to the provider again: with the provider down (or slow, 5 s per
    attempt under one lock), every JWT request of the process waited for its own attempt."""
    handler, url = provider
    key = RSAKey.generate_key(2048, {"kid": "rsa-1"})
    handler.body = json.dumps({"keys": [key.as_dict(private=False)]}).encode()
    verifier = TokenVerifier(AuthSettings(jwks_url=url, jwks_cache_s=1))
    token = _token(key)
    assert verifier.verify(token)["sub"] == "alice"
    assert handler.hits == 1
    handler.status = 503
    time.sleep(1.1)
    for _ in range(5):
        assert verifier.verify(token)["sub"] == "alice"  # the keys known before
    _eventually(lambda: handler.hits == 2)
    time.sleep(0.2)  # the failed fetch has ended: its pause holds
    for _ in range(5):
        assert verifier.verify(token)["sub"] == "alice"
    assert handler.hits == 2


def test_a_token_signed_with_a_key_the_provider_just_published_is_accepted(
    provider: tuple[type[_Provider], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider rotating its signing key publishes the new key and signs with it: a token whose
    ``kid`` the cached key set does not hold makes the set be fetched again (at most once per
    ``KID_REFETCH_S``), instead of being refused until the cache ages (up to 5 minutes)."""
    monkeypatch.setattr(tokens, "KID_REFETCH_S", 0.5)
    handler, url = provider
    old, new = RSAKey.generate_key(2048, {"kid": "rsa-1"}), RSAKey.generate_key(2048, {"kid": "rsa-2"})
    handler.body = json.dumps({"keys": [old.as_dict(private=False)]}).encode()
    verifier = TokenVerifier(AuthSettings(jwks_url=url, jwks_cache_s=300))
    assert verifier.verify(_token(old))["sub"] == "alice"
    handler.body = json.dumps({"keys": [old.as_dict(private=False), new.as_dict(private=False)]}).encode()
    time.sleep(0.6)
    assert verifier.verify(_token(new))["sub"] == "alice"
    assert handler.hits == 2
    # a kid nobody published does not send every request to the provider
    stranger = RSAKey.generate_key(2048, {"kid": "rsa-x"})
    time.sleep(0.6)
    for _ in range(5):
        with pytest.raises(Unauthenticated):
            verifier.verify(_token(stranger))
    assert handler.hits == 3


def test_a_token_without_kid_is_checked_against_every_key_of_its_type(provider: tuple[type[_Provider], str]) -> None:
    """A provider that publishes two keys (the old one and the new one while it rotates) and
    names none in its tokens: only the first key of the token's type was tried, so every token
    signed with the other failed as "bad signature" (and was kept in the negative cache)."""
    handler, url = provider
    first, second = RSAKey.generate_key(2048, {"kid": "rsa-1"}), RSAKey.generate_key(2048, {"kid": "rsa-2"})
    handler.body = json.dumps({"keys": [first.as_dict(private=False), second.as_dict(private=False)]}).encode()
    verifier = TokenVerifier(AuthSettings(jwks_url=url))
    for key in (first, second):
        now = int(time.time())
        claims = {"iss": "tenure", "aud": "tenure-api", "sub": "alice", "tenant_id": "acme", "exp": now + 600}
        token = jwt.encode({"alg": "RS256"}, claims, key, algorithms=["RS256"])
        assert verifier.verify(token)["sub"] == "alice", key.kid
    stranger = RSAKey.generate_key(2048)
    claims = {"iss": "tenure", "aud": "tenure-api", "sub": "alice", "tenant_id": "acme", "exp": int(time.time()) + 60}
    with pytest.raises(Unauthenticated):
        verifier.verify(jwt.encode({"alg": "RS256"}, claims, stranger, algorithms=["RS256"]))


def test_made_up_kids_do_not_send_requests_to_a_provider_that_is_down(
    provider: tuple[type[_Provider], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every fetch of a provider that is down can hold the key set up to 5 s, and every JWT request
    waits for it: tokens with made-up kids (anyone can send one) must not start one each
    ``KID_REFETCH_S`` while the failed fetch's retry pause runs."""
    monkeypatch.setattr(tokens, "KID_REFETCH_S", 0.1)
    handler, url = provider
    key = RSAKey.generate_key(2048, {"kid": "rsa-1"})
    handler.body = json.dumps({"keys": [key.as_dict(private=False)]}).encode()
    verifier = TokenVerifier(AuthSettings(jwks_url=url, jwks_cache_s=1))
    assert verifier.verify(_token(key))["sub"] == "alice"
    handler.status = 503
    time.sleep(1.1)
    assert verifier.verify(_token(key))["sub"] == "alice"  # the failed re-fetch; known keys serve
    _eventually(lambda: handler.hits == 2)
    for i in range(3):
        time.sleep(0.15)
        with pytest.raises(Unauthenticated):
            verifier.verify(_token(RSAKey.generate_key(2048, {"kid": f"made-up-{i}"})))
    assert handler.hits == 2


def test_a_slow_provider_does_not_hold_up_tokens_whose_key_is_known(
    provider: tuple[type[_Provider], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fetch for a token naming an unknown kid ran under the key set's lock: while a slow
    provider answered (up to 5 s), every JWT verification of the process, a known kid's too,
    waited for the lock. A known kid is now verified at once, as with an aged set (its successor
    is fetched meanwhile), and the unknown kid's caller still gets the fetched key."""
    monkeypatch.setattr(tokens, "KID_REFETCH_S", 0.1)
    monkeypatch.setattr(tokens, "JWKS_FETCH_TIMEOUT_S", 3.0)
    handler, url = provider
    old, new = RSAKey.generate_key(2048, {"kid": "rsa-1"}), RSAKey.generate_key(2048, {"kid": "rsa-2"})
    handler.body = json.dumps({"keys": [old.as_dict(private=False)]}).encode()
    verifier = TokenVerifier(AuthSettings(jwks_url=url, jwks_cache_s=1))
    known = _token(old)
    assert verifier.verify(known)["sub"] == "alice"
    handler.body = json.dumps({"keys": [old.as_dict(private=False), new.as_dict(private=False)]}).encode()
    handler.delay = 1.0
    time.sleep(0.15)
    rotated: list[str] = []
    thread = threading.Thread(target=lambda: rotated.append(verifier.verify(_token(new))["sub"]))
    thread.start()
    _eventually(lambda: handler.hits == 2)  # the slow fetch is in flight
    started = time.monotonic()
    assert verifier.verify(known)["sub"] == "alice"
    assert time.monotonic() - started < 0.5
    thread.join(5)
    assert rotated == ["alice"]
    assert handler.hits == 2
    # an aged set: the known kid is served while the slow re-fetch runs
    time.sleep(1.2)
    started = time.monotonic()
    assert verifier.verify(known)["sub"] == "alice"
    assert time.monotonic() - started < 0.5
    _eventually(lambda: handler.hits == 3)


def test_concurrent_tokens_with_an_unknown_kid_share_one_fetch(
    provider: tuple[type[_Provider], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tokens naming a kid the set lacks, arriving together while the provider is slow, wait for
    the one fetch in flight and are all verified with its answer, rather than each starting its
    own once the previous one ended (the refetch interval having passed during a slow fetch)."""
    monkeypatch.setattr(tokens, "KID_REFETCH_S", 0.1)
    handler, url = provider
    old, new = RSAKey.generate_key(2048, {"kid": "rsa-1"}), RSAKey.generate_key(2048, {"kid": "rsa-2"})
    handler.body = json.dumps({"keys": [old.as_dict(private=False)]}).encode()
    verifier = TokenVerifier(AuthSettings(jwks_url=url, jwks_cache_s=300))
    assert verifier.verify(_token(old))["sub"] == "alice"
    handler.body = json.dumps({"keys": [old.as_dict(private=False), new.as_dict(private=False)]}).encode()
    handler.delay = 0.3
    time.sleep(0.15)
    tokens_ = [_token(new) for _ in range(6)]
    barrier = threading.Barrier(len(tokens_))
    subjects: list[str] = []

    def verify(token: str) -> None:
        barrier.wait()
        subjects.append(verifier.verify(token)["sub"])

    threads = [threading.Thread(target=verify, args=(t,)) for t in tokens_]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert subjects == ["alice"] * len(tokens_)
    assert handler.hits == 2


@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_a_jwks_without_end_is_not_read_past_its_bound(
    provider: tuple[type[_Provider], str], monkeypatch: pytest.MonkeyPatch, compressed: bool
) -> None:
    """The JWKS was read whole whatever its size: a URL answering without end (a misconfigured
    one, a misbehaving provider; compressed, a few kB on the wire for each GB) kept the fetch
    thread reading and holding it. Past ``JWKS_MAX_BYTES`` the fetch fails (the connection
    closed), and its pause applies."""
    monkeypatch.setattr(tokens, "KID_REFETCH_S", 0.1)
    handler, url = provider
    handler.body = b'{"keys": ['
    handler.endless = b" " * 65_536
    handler.gzip = compressed
    verifier = TokenVerifier(AuthSettings(jwks_url=url, jwks_cache_s=300))
    key = RSAKey.generate_key(2048, {"kid": "rsa-1"})
    started = time.monotonic()
    with pytest.raises(Unauthenticated, match="could not be fetched"):
        verifier.verify(_token(key))
    assert time.monotonic() - started < 3.0
    _eventually(lambda: handler.hung_up is not None)
    assert handler.hung_up is not None
    assert handler.hung_up < 4 * tokens.JWKS_MAX_BYTES
    assert handler.accept_encoding == "identity"
    time.sleep(0.2)  # the failed fetch's pause: no other attempt
    with pytest.raises(Unauthenticated):
        verifier.verify(_token(key))
    assert handler.hits == 1


def test_a_compressed_jwks_within_the_bound_is_read(provider: tuple[type[_Provider], str]) -> None:
    """A provider that compresses its JWKS though asked not to: it is decoded (in bounded pieces)."""
    handler, url = provider
    key = RSAKey.generate_key(2048, {"kid": "rsa-1"})
    handler.body = json.dumps({"keys": [key.as_dict(private=False)]}).encode()
    handler.gzip = True
    verifier = TokenVerifier(AuthSettings(jwks_url=url))
    assert verifier.verify(_token(key))["sub"] == "alice"
    assert handler.accept_encoding == "identity"


def test_a_provider_trickling_the_jwks_is_cut_off_at_the_fetch_deadline(
    provider: tuple[type[_Provider], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """httpx's timeout applies to each read: a provider sending its JWKS a byte every 100 ms
    kept the fetch running for minutes, and while it ran no other fetch could start, so a rotated
    key was never picked up (the waiting callers gave up, the fetch went on). The whole fetch now
    ends at ``JWKS_FETCH_TIMEOUT_S``, as a failed one: after its pause the next fetch starts."""
    monkeypatch.setattr(tokens, "JWKS_FETCH_TIMEOUT_S", 1.0)
    handler, url = provider
    key = RSAKey.generate_key(2048, {"kid": "rsa-1"})
    handler.body = json.dumps({"keys": [key.as_dict(private=False)]}).encode()  # ~45 s trickled
    handler.trickle_s = 0.1
    verifier = TokenVerifier(AuthSettings(jwks_url=url, jwks_cache_s=1))  # a failed fetch's pause: 1 s
    started = time.monotonic()
    with pytest.raises(Unauthenticated, match="could not be fetched"):
        verifier.verify(_token(key))
    _eventually(lambda: handler.hung_up is not None)  # the fetch gave up and closed the connection
    assert time.monotonic() - started < 2.5
    assert handler.hung_up is not None
    assert 5 <= handler.hung_up <= 20  # about the first second of it
    handler.trickle_s = 0.0  # the provider recovers
    time.sleep(1.1)
    assert verifier.verify(_token(key))["sub"] == "alice"
    assert handler.hits == 2
