"""Fixtures of the integration tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.transports import Swarm


@pytest.fixture()
def swarm(tmp_path: Path, request: pytest.FixtureRequest):
    """The loopback transports and hostile peers of one test, all stopped at its end."""
    s = Swarm(tmp_path, request.node.name)
    try:
        yield s
    finally:
        s.close()
