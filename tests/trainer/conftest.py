"""Shared pieces of the trainer tests: a small, fast configuration and a recording Monitor.

The recording Monitor implements the documented ``vantage.client.Monitor`` interface (DESIGN §5)
and keeps every call, so the tests can check what the trainer sent and feed it commands.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from trainer_helpers import RecordingMonitor, small_config  # noqa: E402
from vantage.trainer.run import setup  # noqa: E402

from tests.serving import start_server  # noqa: E402


def pytest_collection_modifyitems(config, items):
    """Tests marked slow (over a minute: SmolLM2, the collapse run) run only when asked for, with
    ``-m slow`` or VANTAGE_RUN_SLOW=1, so the default suite stays within a few minutes."""
    if config.getoption("-m") or os.environ.get("VANTAGE_RUN_SLOW"):
        return
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="slow: run with -m slow or VANTAGE_RUN_SLOW=1")
    for item in items:
        if "slow" in item.keywords and here in Path(str(item.fspath)).parents:
            item.add_marker(skip)


@pytest.fixture
def monitor_log() -> list[RecordingMonitor]:
    return []


@pytest.fixture
def monitor_factory(monitor_log):
    def factory(**kwargs: Any) -> RecordingMonitor:
        mon = RecordingMonitor(**kwargs)
        monitor_log.append(mon)
        return mon

    return factory


@pytest.fixture(scope="session")
def warm_policy(tmp_path_factory) -> str:
    """A small policy after a short SFT warm start, saved once for the whole session."""
    out = tmp_path_factory.mktemp("warm")
    trainer = setup(small_config(out / "run", sft_steps=60))
    trainer.policy.save_pretrained(out / "policy")
    trainer.tokenizer.save_pretrained(out / "policy")
    return str(out / "policy")


@pytest.fixture
def server_url(tmp_path):
    """A real `vantage serve --insecure-no-auth` on a free port with its own SQLite file."""
    pytest.importorskip("fastapi", reason="the server extra is not installed")
    srv = start_server(f"sqlite:///{tmp_path / 'vantage.db'}", tmp_path, "--insecure-no-auth")
    yield srv.url
    srv.stop()
