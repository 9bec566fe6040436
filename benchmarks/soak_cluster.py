"""A PostgreSQL cluster of the soak's own (benchmarks/soak.py): ``initdb`` in a temporary folder,
its own port and socket folder, started and restarted with ``pg_ctl``, stopped and removed at the
end. Restarting it disturbs nothing else: the machine's shared PostgreSQL (port 5432), which other
tests use at the same time, is never touched.

The binaries are found on PATH, else under ``/usr/lib/postgresql/*/bin`` (Debian), the newest
version first. PostgreSQL refuses to run as root: as root, its commands run as the ``postgres``
user (which owns the folder).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg


def pg_bin_dir() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``, or None when this machine has none."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(found).parent

    def version(path: str) -> float:
        try:
            return float(Path(path).parent.name)
        except ValueError:
            return 0.0

    for folder in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True):
        if (Path(folder) / "initdb").is_file() and (Path(folder) / "pg_ctl").is_file():
            return Path(folder)
    return None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """One throwaway PostgreSQL server: ``start`` (initdb on first use), ``restart(mode)``
    (``fast``: clients disconnected, a clean shutdown; ``immediate``: a crash, WAL recovery on
    start), ``stop`` and ``remove``. ``url(db)`` is a libpq URL of database ``db`` on it (trust
    authentication, loopback only)."""

    def __init__(self, bin_dir: Path, port: int | None = None) -> None:
        self.bin = bin_dir
        self.port = port or _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="vantage-soak-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self._user = None
        if os.geteuid() == 0:  # initdb and postgres refuse root
            self._user = pwd.getpwnam("postgres")
            os.chown(self.root, self._user.pw_uid, self._user.pw_gid)

    def _run(self, *args: str, timeout: float = 120.0) -> None:
        def demote() -> None:
            if self._user is not None:
                os.setgid(self._user.pw_gid)
                os.setuid(self._user.pw_uid)

        # Output to a file, not a pipe: the postmaster that pg_ctl starts inherits it, and a
        # pipe would stay open (and this call wait) for as long as the server runs.
        with tempfile.TemporaryFile("w+") as out:
            done = subprocess.run(
                [str(self.bin / args[0]), *args[1:]],
                preexec_fn=demote,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                cwd=self.root,
            )
            out.seek(0)
            said = out.read()
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(args[:2])} failed ({done.returncode}): {said}{self.log_tail()}"
            )

    def log_tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.is_file() else ""

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> Cluster:
        """initdb (first time only), then start and wait until it takes connections."""
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8")
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=200"
        )
        self._run("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log), "-w", "-o", options)
        self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Seconds until a connection succeeds (RuntimeError after ``timeout``)."""
        t0 = time.monotonic()
        while True:
            try:
                with psycopg.connect(self.url(), connect_timeout=2):
                    return time.monotonic() - t0
            except psycopg.Error:
                if time.monotonic() - t0 > timeout:
                    raise RuntimeError(f"PostgreSQL not ready: {self.log_tail()}") from None
                time.sleep(0.1)

    def restart(self, mode: str = "fast") -> float:
        """Restart with ``pg_ctl restart -m mode``; the seconds until it takes connections."""
        t0 = time.monotonic()
        self._run("pg_ctl", "restart", "-D", str(self.data), "-l", str(self.log), "-m", mode, "-w")
        self.wait_ready()
        return time.monotonic() - t0

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "stop", "-D", str(self.data), "-m", "fast", "-w")

    def remove(self) -> None:
        """Stop (if running) and delete the folder."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
