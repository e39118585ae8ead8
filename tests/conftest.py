"""Every test starts from the same process-wide logging set-up.

structlog's configuration is process state: a live engine quiets it to ``warning`` when
nothing configured it (scenario/engines/live.py), a reload changes the level
(node.set_logging), the CLI configures it.  A test that does any of these must not change
what later tests see (a log-capturing test after a scenario run captured nothing at
``info``), so each test's changes are undone when it ends.
"""

from __future__ import annotations

import pytest
import structlog


@pytest.fixture(autouse=True)
def _restore_structlog():
    configured = structlog.is_configured()
    saved = structlog.get_config()
    yield
    if configured:
        structlog.configure(**saved)
    else:
        structlog.reset_defaults()
