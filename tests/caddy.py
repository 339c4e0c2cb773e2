"""deploy/caddy/Caddyfile as the real Caddy parses it, for the tests of the TLS proxy."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

CADDYFILE = Path(__file__).resolve().parents[1] / "deploy/caddy/Caddyfile"


def caddy_binary() -> str:
    caddy = shutil.which("caddy")
    assert caddy, "caddy is not installed: scripts/setup.sh installs it (apt)"
    return caddy


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
