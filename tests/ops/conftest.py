"""tests/ops: a live reload changes the process-wide structlog level; put it back."""

from __future__ import annotations

import pytest
import structlog


@pytest.fixture(autouse=True)
def _restore_structlog():
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
