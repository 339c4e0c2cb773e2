"""deploy/caddy/Caddyfile as the real Caddy parses it, for the tests of the TLS proxy."""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from typing import Any

from deploy.compose_check import pinned_caddy

CADDYFILE = Path(__file__).resolve().parents[1] / "deploy/caddy/Caddyfile"


@functools.cache
def caddy_binary() -> str:
    """The Caddy the compose file's image pins, as scripts/build-caddy.sh built it."""
    return str(pinned_caddy())


def adapted_caddyfile(home: Path, **env: str) -> dict[str, Any]:
    """The Caddyfile as Caddy itself parses it (``caddy adapt``), with ``env`` as the compose
    environment and ``home`` as Caddy's home."""
    run = subprocess.run(
        [caddy_binary(), "adapt", "--config", str(CADDYFILE), "--adapter", "caddyfile"],
        capture_output=True,
        text=True,
        check=True,
        cwd=home,
        env={"PATH": "/usr/bin:/bin", "HOME": str(home), **env},
    )
    adapted: dict[str, Any] = json.loads(run.stdout)
    return adapted
