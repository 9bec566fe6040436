"""What each test process keeps to itself, so that pytest-xdist workers never share a file.

Every server, database and spool a test makes lives in its own temporary folder or database,
and ports are the operating system's choice. What is left are the defaults that a command falls
back on: the user's data folder (the default SQLite database) and cache folder (the default
spool). Each process of a test run gets its own, under a temporary folder, so that a test that
exercises a default neither collides with another worker nor touches the user's own files.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def worker_name() -> str:
    """This process's pytest-xdist worker ("gw0", "gw1", ...), or "main" without xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


_SET = ("XDG_DATA_HOME", "XDG_CACHE_HOME", "HF_HOME", "TORCH_HOME")


def isolate_user_folders() -> Callable[[], None]:
    """Point XDG_DATA_HOME and XDG_CACHE_HOME (platformdirs' user data and cache folders on
    Linux) at a new temporary folder, inherited by every subprocess. Hugging Face's and torch's
    caches stay where they were, so cached models are still found. Returns a function that
    restores the environment and removes the folder."""
    saved = {name: os.environ.get(name) for name in _SET}
    home = Path(tempfile.mkdtemp(prefix=f"vantage-tests-{worker_name()}-"))
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    os.environ.setdefault("HF_HOME", str(cache / "huggingface"))
    os.environ.setdefault("TORCH_HOME", str(cache / "torch"))
    os.environ["XDG_DATA_HOME"] = str(home / "data")
    os.environ["XDG_CACHE_HOME"] = str(home / "cache")

    def restore() -> None:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        shutil.rmtree(home, ignore_errors=True)

    return restore
