"""Process-level tuning shared by every long-running process (API workers, Celery workers).

:func:`freeze_startup_heap` runs once start-up is done: everything allocated so far (imported
modules, pydantic schemas, the OpenAPI model, compiled regexes, clients) lives as long as the
process, yet CPython's cyclic collector would walk all of it on every generation-2 collection.
Measured on the recall path (docs/benchmarks.md, issue 16) those collections stalled an API worker
65-100 ms about every 9 s, which alone set the p99. ``gc.freeze()`` moves the start-up heap to the
permanent generation, so later collections only walk what requests allocate.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)


def freeze_startup_heap() -> int:
    """Collect once, then freeze every surviving object; returns how many are frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("start-up heap frozen: %d objects out of the cyclic collector's reach", frozen)
    return frozen
