"""A TCP forwarder that freezes one in-flight request, so a test can crash a process mid-task.

It sits between a real client process (a Celery worker) and a real server (OpenSearch, Redis) like a
load balancer would. Everything is forwarded byte for byte until the client sends a chunk that
matches ``hold``: that chunk is *never* forwarded and that connection stops moving, so the server
never sees the write and the client blocks inside it. The test waits for :attr:`held`, knows
exactly how far the task got (every earlier request was forwarded and answered), and kills the
client. Later connections (the restarted or replacement process) pass through untouched: the gate
fires once. Nothing here imitates the server; it only decides *when* the crash happens, without
sleeps or hooks in production code.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading


class HoldingGate:
    def __init__(self, upstream_port: int, hold: re.Pattern[bytes]) -> None:
        self.upstream_port = upstream_port
        self.hold = hold
        self.held = threading.Event()
        self._fired = False
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._sockets: list[socket.socket] = []
        self._closed = False

    @property
    def port(self) -> int:
        return int(self._listener.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> HoldingGate:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def close(self) -> None:
        self._closed = True
        for s in [self._listener, *self._sockets]:
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _should_hold(self, window: bytes) -> bool:
        with self._lock:
            if self._fired or not self.hold.search(window):
                return False
            self._fired = True
        return True

    def _pump(self, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        tail = b""  # a match may straddle two reads
        frozen = False
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if frozen:
                    continue  # swallow whatever else the frozen client sends
                if from_client and self._should_hold(tail + data):
                    frozen = True
                    self.held.set()
                    continue
                tail = data[-256:]
                dst.sendall(data)
        except OSError:
            pass
        finally:
            # the client died (or the server closed): the server sees a truncated request and
            # drops it, exactly as after a real crash
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
