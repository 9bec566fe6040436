"""Fixtures of the client tests: real `vantage serve --insecure-no-auth` processes that a test
can stop and start again (``tests.helpers.server.RestartableServer``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.server import RestartableServer


@pytest.fixture(scope="session")
def noauth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestartableServer]:
    """One no-auth server shared by the tests that never stop it (each test uses its own run)."""
    srv = RestartableServer(tmp_path_factory.mktemp("server")).start()
    yield srv
    srv.cleanup()


@pytest.fixture
def own_noauth_server(tmp_path: Path) -> Iterator[RestartableServer]:
    """A no-auth server of the test's own, for tests that stop and restart it."""
    folder = tmp_path / "own-server"
    folder.mkdir()
    srv = RestartableServer(folder).start()
    yield srv
    srv.cleanup()
