"""Fixtures for persistence tests that run a store in a child Python process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import treefed

REPO_ROOT = Path(treefed.__file__).resolve().parents[1]


@pytest.fixture
def child_env() -> dict[str, str]:
    """Environment for a `python -c` child that must import this checkout of treefed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env
