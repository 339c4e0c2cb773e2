"""Process-level tuning shared by every long-running process (API workers, Celery workers).

:func:`freeze_startup_heap` runs once start-up is done: everything allocated so far (imported
modules, pydantic schemas, the OpenAPI model, compiled regexes, clients) lives as long as the
process, yet CPython's cyclic collector would walk all of it on every generation-2 collection.
Measured on the recall path (docs/benchmarks.md, issue 16) those collections stalled an API worker
65-100 ms about every 9 s, which alone set the p99. ``gc.freeze()`` moves the start-up heap to the
permanent generation, so later collections only walk what requests allocate.

What requests allocate and keep is the next such heap: the recall caches (decoded beliefs,
tiers, vocabularies: ~136,000 tracked objects after 3,000 recalls at 1M) made every later
generation-2 collection walk all of them again (34 collections over 6,000 recalls: 3.2 s in total,
up to 176 ms each). :class:`SurvivorFreezer` therefore freezes what survives each generation-2
collection, so the next one walks only what was kept since (42 collections: 0.4 s, at most
56 ms). A frozen object is still freed by reference counting when a cache drops it; only a
reference *cycle* that becomes garbage while frozen would wait, so every ``thaw_interval_s`` one
generation-2 collection runs over everything first (one longer pause then, none in between).

CPython starts a collection when its generation-0 *count* passes the threshold, and that count is
allocations minus deallocations of tracked objects, whichever generation they die in. The recall
caches churn: every recall adds decoded beliefs, tier entries and vocabularies and evicts old,
frozen ones, so the count hovers under the threshold while the new entries pile up in generation
0: 200,000 objects and more, until one "young" collection walks them all (measured at 1M, paced
200 recalls/s: 120-230 ms of CPU each, about every 10-20 s per API worker, each a burst of
hundreds of ms of latency). A paced full collection bounds that: one every ``interval_s``, whose
survivors the freezer then freezes, so no collection walks more than one interval's worth of new
objects (12-25 ms at most over the same runs). In an API worker it runs on the event loop
(:func:`collect_every`), so the finalizers of what it frees (asyncio transports, streams, async
generators) run on the loop's thread as they would in CPython's own collections; a Celery worker
has no loop and runs it on a thread (:class:`PacedCollector`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

# How often a generation-2 collection walks the frozen objects too (reference cycles among them).
THAW_INTERVAL_S = 1800.0


class SurvivorFreezer:
    """A ``gc.callbacks`` hook: after each generation-2 collection, freeze the survivors; before
    the first such collection past ``thaw_interval_s``, unfreeze everything so that one collection
    walks all of it. ``gc.freeze`` and ``gc.unfreeze`` only move the collector's lists, which is
    safe from a callback (no allocation, no collection)."""

    def __init__(self, thaw_interval_s: float = THAW_INTERVAL_S):
        self.thaw_interval_s = thaw_interval_s
        self.last_thaw = time.monotonic()
        self.freezes = 0
        self.thaws = 0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            if time.monotonic() - self.last_thaw >= self.thaw_interval_s:
                gc.unfreeze()  # this collection walks everything, frozen cycles included
                self.last_thaw = time.monotonic()
                self.thaws += 1
        elif phase == "stop":
            gc.freeze()
            self.freezes += 1

    def install(self) -> SurvivorFreezer:
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self

    def uninstall(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)


async def collect_every(interval_s: float) -> None:
    """One full collection every ``interval_s`` on the running event loop, until cancelled (the
    API's lifespan runs it as a task). With :class:`SurvivorFreezer` installed, what survives is
    frozen at once, so the unfrozen heap never holds more than one interval's new objects, whatever
    CPython's allocation count says."""
    while True:
        await asyncio.sleep(interval_s)
        gc.collect()


class PacedCollector:
    """:func:`collect_every` for a process without an event loop (a Celery worker): a daemon
    thread. The collection takes the GIL like any other; from this thread it pauses the process no
    longer than it would from the thread that allocated."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.collections = 0
        self.pid = os.getpid()  # a forked child has no thread: it starts its own
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="paced-gc", daemon=True)

    def start(self) -> PacedCollector:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            gc.collect()
            self.collections += 1


_freezer: SurvivorFreezer | None = None
_collector: PacedCollector | None = None


def paced_interval(collect_interval_s: float, thaw_interval_s: float) -> float:
    """The paced collection's interval: 0 (none) unless survivors are frozen. Without the freezer
    (``thaw_interval_s`` 0) every full collection would walk everything kept since start-up, the
    caches included: a long pause every interval instead of a short one."""
    return collect_interval_s if thaw_interval_s > 0 else 0.0


def start_paced_collector(interval_s: float) -> PacedCollector | None:
    """Once per process (again in a forked child, whose copy of the parent's has no thread); not
    with ``interval_s`` 0."""
    global _collector
    if interval_s <= 0:
        return None
    if _collector is None or _collector.pid != os.getpid():
        _collector = PacedCollector(interval_s).start()
    return _collector


def freeze_startup_heap(
    thaw_interval_s: float = THAW_INTERVAL_S, young_threshold: int = 0, collect_interval_s: float = 0.0
) -> int:
    """Collect once, then freeze every surviving object, and from then on the survivors of each
    generation-2 collection (:class:`SurvivorFreezer`, installed once per process; not with
    ``thaw_interval_s`` 0, ``TENURE_GC_THAW_INTERVAL_S``); returns how many objects are frozen.

    ``young_threshold`` (``TENURE_GC_YOUNG_THRESHOLD``; 0 keeps CPython's 700) is how many
    container allocations start a generation-0 collection. A recall decodes OpenSearch answers of
    thousands of small dicts and lists (a long message's analysis: ~16 KB, ~3,000 containers) that
    all die young: at 700 the collector runs several times per recall for nothing. Measured at 1M
    (docs/benchmarks.md): 20,000 takes 4-10 % off the API's CPU per recall; every collection is
    rarer, generation 2 included.

    ``collect_interval_s`` (``TENURE_GC_COLLECT_INTERVAL_S``; 0: none) starts the
    :class:`PacedCollector` thread, which keeps the young generations from piling up between two of
    CPython's own collections (only with the freezer: :func:`paced_interval`): for a process without
    an event loop; the API runs :func:`collect_every` on its loop instead."""
    global _freezer
    if young_threshold > 0:
        gc.set_threshold(young_threshold, *gc.get_threshold()[1:])
    gc.collect()
    gc.freeze()
    if _freezer is None and thaw_interval_s > 0:
        _freezer = SurvivorFreezer(thaw_interval_s).install()
    start_paced_collector(paced_interval(collect_interval_s, thaw_interval_s))
    frozen = gc.get_freeze_count()
    log.info("start-up heap frozen: %d objects out of the cyclic collector's reach", frozen)
    return frozen
