"""A lean asyncio Redis client for the API's per-request round trips (the rate limit, the receipt).

Every recall makes two Redis round trips on the event loop: the rate limit's pipeline (the bucket
script's ``EVALSHA`` and the tenant's two versions) and the receipt's ``EVALSHA``. redis-py's
asyncio client spends ~120 µs of CPU on the first (its connection pool, command stack, retry
wrapper, per-connection lock and ``StreamWriter``); the same commands written straight to a socket
through an ``asyncio.Protocol`` and read with hiredis (the C parser redis-py itself uses) spend
~40 µs (``benchmarks/redis_parser_ab.py``). The same idea as the OpenSearch keep-alive transport
(``service/storage/keepalive.py``).

What it does: RESP2 over one TCP connection per event loop (the ``LoopBound`` that holds the client
is the loop's), the commands of concurrent callers pipelined on it, each caller's replies the next
ones Redis sends (Redis answers one connection's commands in order); ``AUTH`` and ``SELECT`` from the
URL when the connection opens; a reply error handed back in place (a pipeline's
``execute(raise_on_error=False)``) or raised, as redis-py's exception classes (``NoScriptError``,
``AuthenticationError``, ...). Failures are redis-py's too: ``redis.ConnectionError`` when it cannot
connect or the connection breaks, ``redis.TimeoutError`` when no answer comes within
``socket_timeout`` (the connection is then closed: a late answer must never be read as the next
caller's). A connection that broke is replaced on the next call; a call whose connection broke
after it was written is sent once more on a new one (a connection can go stale while idle: a Redis
restart, a server-side timeout), as redis-py retries; a connect that fails is not retried, since
the callers have their fallbacks (a read goes on unlimited, a receipt is written directly) and must
not wait on a Redis that is down.

Only plain ``redis://host:port/db`` URLs (user and password allowed) are served by it; anything
else (``rediss://``, ``unix://``, query options) gets redis-py's client (:func:`event_loop_redis`).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, cast
from urllib.parse import unquote, urlsplit

import hiredis
import redis
import redis.asyncio
import redis.exceptions

Arg: TypeAlias = bytes | str | int | float
Command: TypeAlias = Sequence[Arg]
# What the event loop's Redis client is: this one, or redis-py's for a URL this one does not serve.
EventLoopRedis: TypeAlias = "LeanRedis | redis.asyncio.Redis[bytes]"

DEFAULT_PORT = 6379

# Redis's error prefixes that redis-py raises as their own classes (redis._parsers.base), the
# prefix cut from the message as there; anything else is a plain ResponseError.
_ERROR_CLASSES: dict[str, type[redis.exceptions.ResponseError]] = {
    "NOSCRIPT": redis.exceptions.NoScriptError,
    "READONLY": redis.exceptions.ReadOnlyError,
    "NOPERM": redis.exceptions.NoPermissionError,
    "EXECABORT": redis.exceptions.ExecAbortError,
}
# (both ConnectionError subclasses in redis-py; the type stubs here predate that)
_CONNECT_ERRORS: dict[str, type[redis.exceptions.RedisError]] = {
    "WRONGPASS": redis.exceptions.AuthenticationError,
    "NOAUTH": redis.exceptions.AuthenticationError,
    "LOADING": redis.exceptions.BusyLoadingError,
}


def reply_error(reply: hiredis.ReplyError) -> redis.exceptions.RedisError:
    """The redis-py exception for an error reply (``NOSCRIPT ...`` -> ``NoScriptError``)."""
    message = str(reply)
    code, _, rest = message.partition(" ")
    if code in _ERROR_CLASSES:
        return _ERROR_CLASSES[code](rest)
    if code in _CONNECT_ERRORS:
        return _CONNECT_ERRORS[code](rest)
    return redis.exceptions.ResponseError(message)


def _encoded(arg: Arg) -> bytes:
    """An argument as redis-py encodes it: bytes as they are, str as UTF-8, numbers by ``repr``."""
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, bool) or not isinstance(arg, int | float):
        # redis-py refuses these too: True would silently become b"True"
        raise redis.exceptions.DataError(f"invalid Redis argument of type {type(arg).__name__}: {arg!r}")
    return repr(arg).encode()


def packed(command: Command) -> bytes:
    """One command in RESP: an array of bulk strings."""
    parts = [b"*%d\r\n" % len(command)]
    for arg in command:
        data = _encoded(arg)
        parts += (b"$%d\r\n" % len(data), data, b"\r\n")
    return b"".join(parts)


@dataclass
class _Waiter:
    """A caller's place in the connection's queue: how many replies it takes, those read so far."""

    future: asyncio.Future[list[Any]]
    count: int
    replies: list[Any] = field(default_factory=list)


class _Connection(asyncio.Protocol):
    """One socket to Redis: writes callers' commands in turn and hands each its replies in order.
    A caller that stopped waiting (cancelled, timed out) keeps its place, so the replies after its
    own still go to the callers they belong to."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader = hiredis.Reader()
        self.waiting: deque[_Waiter] = deque()
        self.broken: redis.exceptions.ConnectionError | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        try:
            while (reply := self.reader.gets()) is not False:
                if not self.waiting:
                    self.break_off(redis.exceptions.ConnectionError("Redis sent a reply nobody asked for"))
                    return
                waiter = self.waiting[0]
                waiter.replies.append(reply)
                if len(waiter.replies) == waiter.count:
                    self.waiting.popleft()
                    if not waiter.future.done():
                        waiter.future.set_result(waiter.replies)
        except hiredis.ProtocolError as exc:
            self.break_off(redis.exceptions.ConnectionError(f"malformed reply from Redis: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f": {exc}" if exc else ""
        self.break_off(redis.exceptions.ConnectionError(f"the connection to Redis was closed{reason}"))

    # ------------------------------------------------------------------ callers

    @property
    def usable(self) -> bool:
        return self.broken is None and self.transport is not None and not self.transport.is_closing()

    def send(self, payload: bytes, count: int) -> asyncio.Future[list[Any]]:
        """Write ``count`` commands (``payload``); the future gets their ``count`` replies."""
        if not self.usable or self.transport is None:
            raise self.broken or redis.exceptions.ConnectionError("the connection to Redis is closed")
        waiter = _Waiter(asyncio.get_running_loop().create_future(), count)
        self.waiting.append(waiter)
        try:
            self.transport.write(payload)
        except RuntimeError as exc:  # uvloop: the handle closed under the write
            self.break_off(redis.exceptions.ConnectionError(f"could not write to Redis: {exc}"))
        return waiter.future

    def break_off(self, error: redis.exceptions.ConnectionError) -> None:
        """Close the socket and fail every caller still waiting on it with ``error`` (once)."""
        if self.broken is None:
            self.broken = error
        if self.transport is not None:
            self.transport.close()
        while self.waiting:
            future = self.waiting.popleft().future
            if not future.done():
                future.set_exception(error)


class LeanRedis:
    """The event loop's Redis client for the hot path (see the module): ``pipeline``,
    ``register_script``, ``execute_command`` and ``aclose``, with redis-py's semantics."""

    def __init__(
        self,
        host: str,
        port: int = DEFAULT_PORT,
        *,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        socket_timeout: float = 5.0,
        connect_timeout: float = 2.0,
    ) -> None:
        self.host, self.port = host, port
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self._greeting = self._handshake(db, username, password)
        self._connection: _Connection | None = None
        self._opening = asyncio.Lock()
        self.closed = False

    @classmethod
    def from_url(cls, url: str, *, socket_timeout: float = 5.0, connect_timeout: float = 2.0) -> LeanRedis | None:
        """The client for ``redis://[user:password@]host[:port][/db]``; None for any other URL
        (TLS, a unix socket, query options): redis-py serves those."""
        parts = urlsplit(url)
        if parts.scheme != "redis" or parts.query or parts.fragment or not parts.hostname:
            return None
        path = parts.path.strip("/")
        if path and not path.isdigit():
            return None
        return cls(
            parts.hostname,
            parts.port or DEFAULT_PORT,
            db=int(path or 0),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password is not None else None,
            socket_timeout=socket_timeout,
            connect_timeout=connect_timeout,
        )

    @staticmethod
    def _handshake(db: int, username: str | None, password: str | None) -> list[Command]:
        commands: list[Command] = []
        if password is not None:
            commands.append(("AUTH", username, password) if username else ("AUTH", password))
        if db:
            commands.append(("SELECT", db))
        return commands

    # ------------------------------------------------------------------ redis-py's interface

    def pipeline(self, transaction: bool = False) -> LeanPipeline:
        if transaction:
            raise ValueError("LeanRedis pipelines are not transactions (MULTI/EXEC)")
        return LeanPipeline(self)

    def register_script(self, script: str) -> LeanScript:
        return LeanScript(self, script)

    async def execute_command(self, *args: Arg) -> Any:
        """One command's reply; an error reply is raised."""
        (reply,) = await self.run([args])
        if isinstance(reply, redis.exceptions.RedisError):
            raise reply
        return reply

    async def aclose(self) -> None:
        self.closed = True
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.break_off(redis.exceptions.ConnectionError("the Redis client was closed"))

    # ------------------------------------------------------------------ the round trip

    async def run(self, commands: Sequence[Command]) -> list[Any]:
        """The replies of ``commands``, sent together; an error reply is returned in its place as
        redis-py's exception. Raises ``redis.ConnectionError`` / ``redis.TimeoutError``."""
        payload = b"".join(map(packed, commands))
        for attempt in (1, 2):
            connection = await self._open_connection()
            try:
                async with asyncio.timeout(self.socket_timeout):
                    replies = await connection.send(payload, len(commands))
            except TimeoutError:
                # a late answer would be read as the next caller's: the socket goes
                error = redis.exceptions.TimeoutError(f"no answer from Redis within {self.socket_timeout:g} s")
                connection.break_off(redis.exceptions.ConnectionError(str(error)))
                raise error from None
            except redis.exceptions.ConnectionError:
                if attempt == 1 and not self.closed:
                    continue  # broke after the write (stale, or Redis restarted): once more, on a new one
                raise
            return [reply_error(r) if isinstance(r, hiredis.ReplyError) else r for r in replies]
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _open_connection(self) -> _Connection:
        connection = self._connection
        if connection is not None and connection.usable:
            return connection
        async with self._opening:  # concurrent callers share one connect
            connection = self._connection
            if connection is None or not connection.usable:
                connection = self._connection = await self._connect()
            return connection

    async def _connect(self) -> _Connection:
        if self.closed:
            raise redis.exceptions.ConnectionError("the Redis client was closed")
        loop = asyncio.get_running_loop()
        connection: _Connection | None = None
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, connection = await loop.create_connection(_Connection, self.host, self.port)
                replies = await self._greet(connection)
        except BaseException as exc:  # timed out, refused or cancelled: a half-open socket is closed
            failure = redis.exceptions.ConnectionError(
                f"cannot connect to Redis at {self.host}:{self.port}: {exc or 'timed out'}"
            )
            if connection is not None:
                connection.break_off(failure)
            if isinstance(exc, OSError | TimeoutError):
                raise failure from exc
            raise
        for reply in replies:
            if isinstance(reply, hiredis.ReplyError):
                error = reply_error(reply)
                connection.break_off(redis.exceptions.ConnectionError(str(error)))
                raise error
        return connection

    async def _greet(self, connection: _Connection) -> list[Any]:
        """``AUTH`` and ``SELECT`` on a new connection (nothing to send without them)."""
        if not self._greeting:
            return []
        return await connection.send(b"".join(map(packed, self._greeting)), len(self._greeting))


class LeanPipeline:
    """Commands queued, then sent in one round trip (``transaction=False`` semantics)."""

    def __init__(self, client: LeanRedis) -> None:
        self._client = client
        self._commands: list[Command] = []

    def execute_command(self, *args: Arg) -> LeanPipeline:
        self._commands.append(args)
        return self

    def get(self, name: str | bytes) -> LeanPipeline:
        return self.execute_command("GET", name)

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Arg) -> LeanPipeline:
        return self.execute_command("EVALSHA", sha, numkeys, *keys_and_args)

    async def execute(self, raise_on_error: bool = True) -> list[Any]:
        commands, self._commands = self._commands, []
        if not commands:
            return []
        replies = await self._client.run(commands)
        if raise_on_error:
            for reply in replies:
                if isinstance(reply, redis.exceptions.RedisError):
                    raise reply
        return replies


class LeanScript:
    """A Lua script called by its SHA-1, loaded when Redis answers ``NOSCRIPT`` (after a restart
    or a ``SCRIPT FLUSH``) and called again, as redis-py's ``AsyncScript``."""

    def __init__(self, client: LeanRedis, script: str) -> None:
        self._client = client
        self.script = script
        # Redis names a script by its SHA-1 (EVALSHA); not a security use of SHA-1
        self.sha = hashlib.sha1(script.encode(), usedforsecurity=False).hexdigest()

    async def __call__(self, keys: Sequence[Arg] = (), args: Sequence[Arg] = ()) -> Any:
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        try:
            return await self._client.execute_command(*command)
        except redis.exceptions.NoScriptError:
            await self._client.execute_command("SCRIPT", "LOAD", self.script)
            return await self._client.execute_command(*command)


def event_loop_redis(url: str, *, socket_timeout: float = 5.0, connect_timeout: float = 2.0) -> EventLoopRedis:
    """The API's event-loop Redis client for ``url``: :class:`LeanRedis` where it serves the URL,
    redis-py's asyncio client otherwise. Call it on the loop that will use it."""
    lean = LeanRedis.from_url(url, socket_timeout=socket_timeout, connect_timeout=connect_timeout)
    if lean is not None:
        return lean
    return redis.asyncio.Redis.from_url(url, socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout)


__all__ = ["EventLoopRedis", "LeanPipeline", "LeanRedis", "LeanScript", "event_loop_redis", "packed", "reply_error"]
