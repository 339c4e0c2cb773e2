"""The event loop's lean Redis client (``service/lean_redis.py``) against the real Redis: the same
answers as redis-py, concurrent callers pipelined on one connection each getting their own replies,
AUTH and SELECT from the URL, scripts loaded on ``NOSCRIPT``, and redis-py's failures (a connection
the server killed is replaced, a silent server times out and its socket is never reused, a dead
server fails fast); on the stdlib loop and on uvloop (the API's)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

import pytest
import redis
import redis.asyncio
import uvloop

from deploy.devstack import free_port
from service.auth.ratelimit import BUCKET_SCRIPT
from service.lean_redis import LeanRedis, event_loop_redis, packed

T = TypeVar("T")
Runner = Callable[[Awaitable[T]], T]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner[Any]:
    def runner(coro: Awaitable[T]) -> T:
        if request.param == "uvloop":
            return uvloop.run(coro)  # type: ignore[arg-type]
        return asyncio.run(coro)  # type: ignore[arg-type]

    return runner


@pytest.fixture
def sync_redis(redis_url: str) -> Iterator[redis.Redis[bytes]]:
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def prefix(sync_redis: redis.Redis[bytes]) -> Iterator[str]:
    name = f"lean-test:{uuid.uuid4().hex[:8]}:"
    yield name
    for key in sync_redis.scan_iter(f"{name}*"):
        sync_redis.delete(key)


def lean(redis_url: str, **kwargs: Any) -> LeanRedis:
    client = LeanRedis.from_url(redis_url, **kwargs)
    assert client is not None
    return client


def _host_port(redis_url: str) -> tuple[str, int]:
    parts = urlsplit(redis_url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def test_the_rate_limit_pipeline_answers_as_redis_py_does(
    run: Runner[Any], redis_url: str, sync_redis: redis.Redis[bytes], prefix: str
) -> None:
    sync_redis.set(f"{prefix}version:write", 7)
    sha = sync_redis.script_load(BUCKET_SCRIPT)  # type: ignore[no-untyped-call]

    async def both() -> tuple[list[Any], list[Any]]:
        ours, theirs = lean(redis_url), redis.asyncio.Redis.from_url(redis_url)
        try:
            answers = []
            for client in (ours, theirs):
                pipe = client.pipeline(transaction=False)
                pipe.evalsha(sha, 1, f"{prefix}bucket", 2.5, 3)
                pipe.get(f"{prefix}version:write")
                pipe.get(f"{prefix}version:none")
                answers.append(await pipe.execute(raise_on_error=False))
            return answers[0], answers[1]
        finally:
            await ours.aclose()
            await theirs.aclose()  # type: ignore[attr-defined]  # redis>=5 (the stubs are 4.x)

    ours, theirs = run(both())
    assert ours[1:] == theirs[1:] == [b"7", None]
    assert ours[0][0] == theirs[0][0] == 1  # allowed: the second token of a burst of 3
    assert ours[0] == [1, 0, 0] and len(theirs[0]) == 3


def test_error_replies_come_back_in_place_or_raised(
    run: Runner[Any], redis_url: str, sync_redis: redis.Redis[bytes], prefix: str
) -> None:
    sync_redis.set(f"{prefix}text", "not a number")

    async def go() -> None:
        client = lean(redis_url)
        try:
            pipe = client.pipeline().execute_command("INCR", f"{prefix}text").get(f"{prefix}text")
            replies = await pipe.execute(raise_on_error=False)
            assert isinstance(replies[0], redis.ResponseError) and "not an integer" in str(replies[0])
            assert replies[1] == b"not a number"
            with pytest.raises(redis.ResponseError, match="not an integer"):
                await client.pipeline().execute_command("INCR", f"{prefix}text").execute()
            with pytest.raises(redis.exceptions.NoScriptError):
                await client.execute_command("EVALSHA", "0" * 40, 0)
            assert await client.execute_command("ECHO", "still in step") == b"still in step"
            assert await client.pipeline().execute() == []
        finally:
            await client.aclose()

    run(go())


def test_a_script_redis_does_not_know_is_loaded_and_called_again(run: Runner[Any], redis_url: str) -> None:
    script = f"-- {uuid.uuid4().hex}\nreturn {{KEYS[1], ARGV[1], tonumber(ARGV[2]) * 2}}"

    async def go() -> list[Any]:
        client = lean(redis_url)
        try:
            call = client.register_script(script)
            first = await call(keys=["k"], args=["a", 21])  # NOSCRIPT, SCRIPT LOAD, EVALSHA
            again = await call(keys=["k2"], args=[b"b", 1.5])
            return [first, again]
        finally:
            await client.aclose()

    assert run(go()) == [[b"k", b"a", 42], [b"k2", b"b", 3]]


def test_concurrent_callers_share_one_connection_and_each_gets_its_own_replies(
    run: Runner[Any], redis_url: str, prefix: str
) -> None:
    big = b"x" * 300_000  # answers far larger than one read: split over many data_received calls

    async def one(client: LeanRedis, i: int) -> tuple[bytes, list[Any]]:
        value = big + str(i).encode() if i % 25 == 0 else f"value-{i}".encode()
        pipe = client.pipeline()
        pipe.execute_command("SET", f"{prefix}{i}", value).get(f"{prefix}{i}").execute_command("ECHO", i)
        pipe.execute_command("CLIENT", "ID")
        return value, await pipe.execute()

    async def go() -> list[tuple[bytes, list[Any]]]:
        client = lean(redis_url)
        try:
            return list(await asyncio.gather(*(one(client, i) for i in range(300))))
        finally:
            await client.aclose()

    answers = run(go())
    for i, (value, replies) in enumerate(answers):
        assert replies[:3] == [b"OK", value, str(i).encode()]
    assert len({replies[3] for _, replies in answers}) == 1  # one connection for all of them


def test_user_password_and_database_come_from_the_url(
    run: Runner[Any], redis_url: str, sync_redis: redis.Redis[bytes], prefix: str
) -> None:
    user, password = f"lean-{uuid.uuid4().hex[:6]}", "p@ss:w/rd %?"
    sync_redis.execute_command("ACL", "SETUSER", user, "on", f">{password}", "~*", "&*", "+@all")
    host, port = _host_port(redis_url)
    url = f"redis://{user}:{quote(password, safe='')}@{host}:{port}/7"
    try:

        async def go() -> Any:
            client = lean(url)
            try:
                await client.execute_command("SET", f"{prefix}db", "seven")
                return await client.execute_command("ACL", "WHOAMI")
            finally:
                await client.aclose()

        assert run(go()) == user.encode()
        in_seven: redis.Redis[bytes] = redis.Redis(host=host, port=port, db=7)
        try:
            assert in_seven.get(f"{prefix}db") == b"seven"
            assert sync_redis.get(f"{prefix}db") is None  # db 0 untouched
        finally:
            in_seven.delete(f"{prefix}db")
            in_seven.close()

        async def wrong() -> None:
            client = lean(f"redis://{user}:nope@{host}:{port}/0")
            try:
                await client.execute_command("PING")
            finally:
                await client.aclose()

        started = time.monotonic()
        with pytest.raises(redis.AuthenticationError):
            run(wrong())
        assert time.monotonic() - started < 2
    finally:
        sync_redis.execute_command("ACL", "DELUSER", user)


def test_a_connection_the_server_killed_is_replaced_without_an_error(
    run: Runner[Any], redis_url: str, sync_redis: redis.Redis[bytes]
) -> None:
    async def go() -> tuple[int, int, bytes]:
        client = lean(redis_url)
        try:
            first = int(await client.execute_command("CLIENT", "ID"))
            sync_redis.execute_command("CLIENT", "KILL", "ID", first)
            await asyncio.sleep(0.05)  # the close reaches the socket: found broken before the write
            second = int(await client.execute_command("CLIENT", "ID"))
            sync_redis.execute_command("CLIENT", "KILL", "ID", second)
            # no pause: written to the socket the server closed, then sent again on a new one
            echoed = await client.execute_command("ECHO", "after")
            return first, second, echoed
        finally:
            await client.aclose()

    first, second, echoed = run(go())
    assert first != second and echoed == b"after"


def test_a_silent_server_times_out_and_its_socket_is_never_reused(
    run: Runner[Any], redis_url: str, prefix: str
) -> None:
    async def go() -> tuple[float, Any, int, int]:
        client = lean(redis_url, socket_timeout=0.3)
        try:
            before = int(await client.execute_command("CLIENT", "ID"))
            started = time.monotonic()
            with pytest.raises(redis.TimeoutError):
                await client.execute_command("BLPOP", f"{prefix}never", 3)
            waited = time.monotonic() - started
            # the BLPOP's late nil must not be read as this call's answer
            echoed = await client.execute_command("ECHO", "mine")
            after = int(await client.execute_command("CLIENT", "ID"))
            return waited, echoed, before, after
        finally:
            await client.aclose()

    waited, echoed, before, after = run(go())
    assert 0.25 <= waited < 2 and echoed == b"mine" and after != before


def test_a_caller_that_stops_waiting_keeps_the_others_in_step(run: Runner[Any], redis_url: str, prefix: str) -> None:
    async def go() -> list[Any]:
        client = lean(redis_url)
        try:
            blocked = asyncio.create_task(client.execute_command("BLPOP", f"{prefix}empty", 0.5))
            await asyncio.sleep(0.05)
            blocked.cancel()
            # queued behind the BLPOP on the same connection: its nil goes to the cancelled caller
            return list(await asyncio.gather(client.execute_command("ECHO", "a"), client.execute_command("ECHO", "b")))
        finally:
            await client.aclose()

    assert run(go()) == [b"a", b"b"]


def test_a_server_that_is_down_fails_fast_with_a_connection_error(run: Runner[Any]) -> None:
    async def go() -> None:
        client = lean(f"redis://127.0.0.1:{free_port()}/0", connect_timeout=0.5)
        try:
            await client.pipeline().get("k").execute(raise_on_error=False)
        finally:
            await client.aclose()

    started = time.monotonic()
    with pytest.raises(redis.ConnectionError, match="cannot connect to Redis"):
        run(go())
    assert time.monotonic() - started < 1.5


def test_a_value_that_looks_like_a_command_is_stored_as_data(
    run: Runner[Any], redis_url: str, sync_redis: redis.Redis[bytes], prefix: str
) -> None:
    """Arguments are length-prefixed (binary safe): text from a request (a tenant id, a receipt's
    JSON) can never end one command and start another."""
    hostile = f"x\r\n*2\r\n$3\r\nDEL\r\n${len(prefix) + 6}\r\n{prefix}canary\r\n"
    sync_redis.set(f"{prefix}canary", "alive")

    async def go() -> Any:
        client = lean(redis_url)
        try:
            await client.pipeline().execute_command("SET", f"{prefix}hostile", hostile).execute()
            return await client.execute_command("GET", f"{prefix}hostile")
        finally:
            await client.aclose()

    assert run(go()) == hostile.encode()
    assert sync_redis.get(f"{prefix}canary") == b"alive"


def test_arguments_are_encoded_as_redis_py_encodes_them() -> None:
    assert packed(("SET", "k", 1.5)) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\n1.5\r\n"
    assert packed(("EVALSHA", b"\xff", 2)) == b"*3\r\n$7\r\nEVALSHA\r\n$1\r\n\xff\r\n$1\r\n2\r\n"
    assert packed(("ECHO", "é")) == b"*2\r\n$4\r\nECHO\r\n$2\r\n\xc3\xa9\r\n"
    for bad in (None, True, [1]):
        with pytest.raises(redis.DataError):
            packed(("SET", "k", bad))  # type: ignore[arg-type]


def test_only_plain_redis_urls_get_the_lean_client() -> None:
    client = LeanRedis.from_url("redis://h.example:6390/3", socket_timeout=1.5)
    assert client is not None and (client.host, client.port, client.socket_timeout) == ("h.example", 6390, 1.5)
    plain = LeanRedis.from_url("redis://localhost")
    assert plain is not None and plain.port == 6379
    for url in (
        "rediss://h.example:6390/0",
        "unix:///run/redis.sock?db=1",
        "redis://h.example:6390/0?socket_keepalive=true",
        "redis://h.example:6390/db",
        "http://h.example/",
    ):
        assert LeanRedis.from_url(url) is None, url

    async def pick() -> tuple[type, type]:
        chosen = event_loop_redis("redis://localhost:1/0"), event_loop_redis("rediss://localhost:1/0")
        for c in chosen:
            await c.aclose()  # type: ignore[union-attr]
        return type(chosen[0]), type(chosen[1])

    assert asyncio.run(pick()) == (LeanRedis, redis.asyncio.Redis)


def test_a_server_that_accepts_but_never_greets_back_times_out_and_its_socket_is_closed(run: Runner[Any]) -> None:
    async def go() -> tuple[float, bool]:
        closed = asyncio.Event()

        class Silent(asyncio.Protocol):
            def connection_lost(self, exc: Exception | None) -> None:  # noqa: ARG002 - asyncio.Protocol
                closed.set()

        server = await asyncio.get_running_loop().create_server(Silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = lean(f"redis://:secret@127.0.0.1:{port}/0", connect_timeout=0.3)  # AUTH gets no answer
        started = time.monotonic()
        try:
            with pytest.raises(redis.ConnectionError, match="cannot connect to Redis"):
                await client.execute_command("PING")
            waited = time.monotonic() - started
            await asyncio.wait_for(closed.wait(), 2)  # the half-open socket was closed, not leaked
            return waited, closed.is_set()
        finally:
            await client.aclose()
            server.close()

    waited, closed = run(go())
    assert 0.25 <= waited < 1.5 and closed
