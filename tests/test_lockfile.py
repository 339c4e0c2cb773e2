"""deploy/requirements.lock is the image's dependency set: it pins (with hashes) every dependency of
pyproject.toml and of the SDK, each pin satisfies the declared range, and the Dockerfile installs
from it with --require-hashes (so a dependency added without re-locking fails here, not in a build)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "deploy/requirements.lock"


def _pins() -> dict[str, str]:
    text = LOCK.read_text()
    pins = {canonicalize_name(m[1]): m[2] for m in re.finditer(r"^([A-Za-z0-9._-]+)==([^\s\\]+)", text, re.M)}
    entries = re.split(r"^(?=[A-Za-z0-9])", text, flags=re.M)
    unhashed = [e.split("==")[0] for e in entries if "==" in e and "--hash=sha256:" not in e]
    assert not unhashed, f"pins without hashes: {unhashed}"
    return pins


def _declared() -> list[Requirement]:
    requirements = []
    for path in (ROOT / "pyproject.toml", ROOT / "clients/python/pyproject.toml"):
        requirements += [Requirement(r) for r in tomllib.loads(path.read_text())["project"]["dependencies"]]
    return requirements


def test_every_dependency_is_pinned_within_its_range() -> None:
    pins = _pins()
    for requirement in _declared():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in deploy/requirements.lock: re-lock (see its header)"
        assert requirement.specifier.contains(pins[name], prereleases=True), (requirement, pins[name])


def test_the_image_installs_the_lock_with_hashes() -> None:
    dockerfile = (ROOT / "deploy/Dockerfile").read_text()
    assert "pip install --require-hashes -r deploy/requirements.lock" in dockerfile
    installs = re.findall(r"^RUN pip install (.+)$", dockerfile, re.M)
    assert all("--require-hashes" in line or "--no-deps" in line for line in installs), installs
