"""Fixtures of the trainer tests: recording Monitors, a warm-started policy and a real server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from vantage.trainer.run import setup

from tests.helpers.server import start_server
from tests.helpers.trainer import RecordingMonitor, small_config


@pytest.fixture
def monitor_log() -> list[RecordingMonitor]:
    return []


@pytest.fixture
def monitor_factory(monitor_log: list[RecordingMonitor]) -> Callable[..., RecordingMonitor]:
    def factory(**kwargs: Any) -> RecordingMonitor:
        mon = RecordingMonitor(**kwargs)
        monitor_log.append(mon)
        return mon

    return factory


@pytest.fixture(scope="session")
def warm_policy(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A small policy after a short SFT warm start, saved once for the test process."""
    out = tmp_path_factory.mktemp("warm")
    trainer = setup(small_config(out / "run", sft_steps=60))
    trainer.policy.save_pretrained(out / "policy")
    trainer.tokenizer.save_pretrained(out / "policy")
    return str(out / "policy")


@pytest.fixture
def server_url(tmp_path: Path) -> Iterator[str]:
    """A real `vantage serve --insecure-no-auth` on a free port with its own SQLite file."""
    pytest.importorskip("fastapi", reason="the server extra is not installed")
    srv = start_server(f"sqlite:///{tmp_path / 'vantage.db'}", tmp_path, "--insecure-no-auth")
    yield srv.url
    srv.stop()
