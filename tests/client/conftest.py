"""Fixtures for the client tests: real `vantage serve --insecure-no-auth` processes (the ``Server``
of client_helpers.py, which the test modules import from there, not from this conftest)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from client_helpers import Server


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server shared by the tests that never stop it (each test uses its own run)."""
    srv = Server(tmp_path_factory.mktemp("server")).start()
    yield srv
    srv.cleanup()


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[Server]:
    """A server of the test's own, for tests that stop and restart it."""
    folder = tmp_path / "own-server"
    folder.mkdir()
    srv = Server(folder).start()
    yield srv
    srv.cleanup()
