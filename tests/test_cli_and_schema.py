"""The `vantage` CLI (keys, db upgrade, prune, serve guards), a schemathesis run for 5xx, and the
wire schema's group forms."""

from __future__ import annotations

import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from pydantic import ValidationError
from vantage.client.schema import RawGroup, StatsGroup, StepRecord
from vantage.server.settings import SECRET_SETTINGS

from tests.helpers.api import new_run, post_steps
from tests.helpers.cli import VANTAGE, create_key, run_cli
from tests.helpers.server import start_server


def test_keys_create_prints_key_alone_on_last_line(tmp_path):
    url = f"sqlite:///{tmp_path}/k.db"
    out = run_cli(
        "keys", "create", "--name", "ci", "--scopes", "read,ingest", "--database-url", url
    )
    last = out.stdout.rstrip("\n").splitlines()[-1]
    assert re.fullmatch(r"vtg_[A-Za-z0-9_-]{32,}", last)
    assert last not in out.stderr
    listed = run_cli("keys", "list", "--database-url", url).stdout
    assert "ci" in listed and last not in listed  # only a prefix is ever shown again
    assert listed.rstrip().endswith("+00:00")  # created_at in UTC, on SQLite too
    bad = run_cli(
        "keys", "create", "--name", "x", "--scopes", "read,root", "--database-url", url, check=False
    )
    assert bad.returncode == 2 and "root" in bad.stderr
    assert run_cli("keys", "revoke", "ci", "--database-url", url).returncode == 0


def test_revoke_by_a_shared_name_asks_for_an_id_or_all(tmp_path):
    url = f"sqlite:///{tmp_path}/k.db"
    for _ in range(2):
        run_cli("keys", "create", "--name", "dup", "--scopes", "read", "--database-url", url)
    run_cli("keys", "create", "--name", "other", "--scopes", "read", "--database-url", url)

    def states() -> list[str]:
        out = run_cli("keys", "list", "--database-url", url).stdout
        return [line.split("\t")[5] for line in out.splitlines()]

    shared = run_cli("keys", "revoke", "dup", "--database-url", url, check=False)
    assert shared.returncode == 1 and "matches 2 active keys" in shared.stderr
    assert shared.stderr.count("\tdup\t") == 2 and "--all" in shared.stderr
    assert states() == ["active", "active", "active"]  # nothing revoked
    one = run_cli("keys", "revoke", "2", "--database-url", url)
    assert "revoked 2\tdup" in one.stderr
    assert states() == ["active", "revoked", "active"]
    run_cli("keys", "revoke", "dup", "--database-url", url)  # one active match left
    assert states() == ["revoked", "revoked", "active"]
    run_cli("keys", "create", "--name", "dup", "--scopes", "read", "--database-url", url)
    run_cli("keys", "create", "--name", "dup", "--scopes", "read", "--database-url", url)
    both = run_cli("keys", "revoke", "dup", "--all", "--database-url", url)
    assert both.stderr.count("revoked ") == 2
    assert states() == ["revoked", "revoked", "active", "revoked", "revoked"]
    # a name that is another key's id is ambiguous: it revoked key 3 ("other"), not "3"
    run_cli("keys", "create", "--name", "3", "--scopes", "read", "--database-url", url)
    clash = run_cli("keys", "revoke", "3", "--database-url", url, check=False)
    assert clash.returncode == 1 and "matches 2 active keys" in clash.stderr
    assert states()[2] == "active" and states()[5] == "active"
    helps = run_cli("keys", "--help").stdout
    assert "list keys" in helps and "revoke a key" in helps


def test_keys_on_a_database_that_is_not_vantages_say_so_in_one_line(tmp_path):
    typo = tmp_path / "typo.db"
    for args in (("list",), ("revoke", "1")):
        out = run_cli("keys", *args, "--database-url", f"sqlite:///{typo}", check=False)
        assert out.returncode == 1 and "no Vantage database at" in out.stderr, out.stderr
        assert not typo.exists()  # nothing made on the way
    pruned = run_cli("runs", "prune", "--older-than", "1", "--database-url", f"sqlite:///{typo}",
                     check=False)  # fmt: skip
    assert pruned.returncode == 1 and not typo.exists()
    out = run_cli("keys", "create", "--name", "a", "--scopes", "read", "--database-url",
                  f"sqlite:///{tmp_path}/no/such/folder/k.db", check=False)  # fmt: skip
    assert out.returncode == 1 and "error: cannot use the database" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 1
    # A URL that is not one, or names another database, is a setting's error: exit 2, named.
    for command in (("db", "upgrade"), ("keys", "list"), ("serve", "--port", "0"),
                    ("demo", "--quick", "--no-browser")):  # fmt: skip
        for url, says in (("mysql://u:pw@db/v", "in SQLite or PostgreSQL, not mysql"),
                          ("bogus", "is not a database URL"),
                          # the server said it was ready, then answered every request with a 500
                          ("sqlite://", "an in-memory SQLite database"),
                          # a driver the server extra does not install (No module named: exit 1)
                          ("postgresql+asyncpg://u:pw@db/v", "driver asyncpg"),
                          # libpq took the user's database: the schema went into `postgres`
                          ("postgresql://u:pw@127.0.0.1:5432", "names no database"),
                          # a password in the query was echoed in clear (a trial)
                          ("postgresql://u@h:5432?password=pw", "names no database"),
                          # "invalid literal for int() with base 10: 'x'" (helper 67)
                          ("postgresql://u:pw@h:x/v", "a port that is not a number"),
                          ("postgresql://u:pw@h:99999/v", "a port that is not")):  # fmt: skip
            out = run_cli(*command, "--database-url", url, check=False)
            assert out.returncode == 2 and says in out.stderr, out
            assert out.stderr.startswith("error: --database-url "), out.stderr
            assert "pw" not in out.stderr and len(out.stderr.splitlines()) == 1
    out = run_cli("keys", "list", env={"VANTAGE_DATABASE_URL": "sqlite:///:memory:"}, check=False)
    assert out.returncode == 2 and out.stderr.startswith("error: VANTAGE_DATABASE_URL="), out
    # A key's name and project fit the database and keep `keys list` one line a key (a 201-
    # character name was a DataError traceback; a tab split its line).
    db = f"sqlite:///{typo}"
    for flag, value, says in (("--name", "q" * 201, "--name has 201 characters"),
                              ("--name", "tab\there", "--name cannot hold control"),
                              ("--project", "p" * 201, "--project has 201"),
                              ("--name", "a\u202eb", "--name cannot hold bidirectional"),
                              # a key of project "P\u200b" was listed as P and saw none of P's
                              ("--project", "P\u200b", "--project cannot hold invisible"),
                              ("--project", "\u3164", "--project cannot hold invisible"),
                              # undecodable command-line bytes (a UnicodeEncodeError traceback)
                              ("--name", "a\udcffb", "--name is not valid UTF-8")):  # fmt: skip
        args = ["--name", "k", "--scopes", "read", flag, value, "--database-url", db]
        out = run_cli("keys", "create", *args, check=False)
        assert out.returncode == 2 and says in out.stderr, out
        assert len(out.stderr.splitlines()) == 1, out.stderr
    # serve: a host that does not resolve names --host; an unknown log level is argparse's 2
    out = run_cli("serve", "--host", "not.a.host.invalid", "--port", "0", "--database-url",
                  f"sqlite:///{tmp_path}/serve.db", check=False)  # fmt: skip
    assert out.returncode == 1 and out.stderr.strip().endswith("choose another --host"), out
    # an empty --host bound every interface; an empty --database-url used the default database
    # (an unset shell variable: a trial)
    for args, says in ((("--host", ""), "--host is empty"),
                       (("--database-url", ""), "--database-url is empty")):  # fmt: skip
        out = run_cli("serve", *args, "--port", "0", check=False)
        assert out.returncode == 2 and out.stderr.startswith(f"error: {says}"), out
        assert len(out.stderr.splitlines()) == 1, out.stderr
    out = run_cli("keys", "list", "--database-url", "", check=False)
    assert out.returncode == 2 and "--database-url is empty" in out.stderr, out
    out = run_cli("serve", "--log-level", "bogus", check=False)
    assert out.returncode == 2 and "invalid choice: 'bogus'" in out.stderr, out
    # A first key may be made before the server's first start; that is said.
    made = run_cli("keys", "create", "--name", "a", "--scopes", "read", "--database-url",
                   f"sqlite:///{typo}")  # fmt: skip
    assert "created a new Vantage database" in made.stderr
    again = run_cli("keys", "create", "--name", "b", "--scopes", "read", "--database-url",
                    f"sqlite:///{typo}")  # fmt: skip
    assert "created a new" not in again.stderr
    nameless = run_cli("keys", "create", "--name", " ", "--scopes", "read", "--database-url",
                       f"sqlite:///{typo}", check=False)  # fmt: skip
    assert nameless.returncode == 2 and "name" in nameless.stderr
    key = again.stdout.strip()
    revoked = run_cli("keys", "revoke", key, "--database-url", f"sqlite:///{typo}")
    assert "revoked 2\tb" in revoked.stderr
    shown = run_cli("keys", "list", "--database-url", f"sqlite:///{typo}").stdout
    prefix = shown.splitlines()[0].split("\t")[2]  # key 1's prefix, as the list shows it
    assert prefix.endswith("…")
    pasted = run_cli("keys", "revoke", prefix, "--database-url", f"sqlite:///{typo}")
    assert "revoked 1\ta" in pasted.stderr


def test_revoked_key_is_refused(auth_server):
    key = create_key(auth_server.database_url, "read", "to-revoke")
    with httpx.Client(base_url=auth_server.url, headers={"Authorization": f"Bearer {key}"}) as c:
        assert c.get("/api/v1/runs").status_code == 200
        run_cli("keys", "revoke", "to-revoke", "--database-url", auth_server.database_url)
        assert c.get("/api/v1/runs").status_code == 401


def test_db_upgrade_is_idempotent_and_says_what_it_did(tmp_path):
    """On a database it had just made it said "database is at the newest schema" (a trial)."""
    url = f"sqlite:///{tmp_path}/u.db"
    first = run_cli("db", "upgrade", "--database-url", url)
    assert first.stderr.startswith("created Vantage's schema (revision "), first.stderr
    again = run_cli("db", "upgrade", "--database-url", url)
    assert "is at the newest schema already" in again.stderr, again.stderr
    from alembic import command
    from alembic.script import ScriptDirectory
    from vantage.server.migrate import alembic_config

    cfg = alembic_config(url)
    head = ScriptDirectory.from_config(cfg).get_current_head()
    command.downgrade(cfg, "-1")
    upgraded = run_cli("db", "upgrade", "--database-url", url)
    assert f" to {head}" in upgraded.stderr and "from revision " in upgraded.stderr, upgraded.stderr


def test_insecure_no_auth_refuses_public_host():
    proc = run_cli("serve", "--insecure-no-auth", "--host", "0.0.0.0", check=False)
    assert proc.returncode == 2 and "loopback" in proc.stderr


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("VANTAGE_DEFAULT_MITIGATION_MODE", "bogus", "Input should be 'off', 'suggest' or 'auto'"),
        ("VANTAGE_WEBHOOK_GIVE_UP_S", "-5", "Input should be greater than 0"),
        ("VANTAGE_COMMAND_TTL_S", "1e308", "Input should be less than or equal to 316224000"),
        ("VANTAGE_WEBHOOK_GIVE_UP_S", "1e12", "Input should be less than or equal to 316224000"),
        ("VANTAGE_WEBHOOK_SECRET", "short", "must be at least 16 characters"),
        ("VANTAGE_WEBHOOK_SECRET", " " * 20, "must be at least 16 characters, not counting"),
        ("VANTAGE_WEBHOOK_SECRET", "aaaaaaaa       b", "must be at least 16 characters, not"),
        ("VANTAGE_DASHBOARD_REFRESH_S", "0.001", "Input should be greater than or equal to 0.5"),
        # a browser's timer holds at most 2**31 - 1 ms: a longer one fires at once, every time
        ("VANTAGE_DASHBOARD_REFRESH_S", "3e6", "Input should be less than or equal to 2147483"),
        ("VANTAGE_WEBHOOK_ALLOW", ",,,", "names no target"),
        ("VANTAGE_PUBLIC_URL", "notaurl", "must be an http:// or https:// URL"),
        ("VANTAGE_WEBHOOK_ALLOW", "10.0.0.0/33", "'10.0.0.0/33' is not a URL"),
        # no request could carry it, so every scrape was a 401
        ("VANTAGE_METRICS_TOKEN", " ", "a bearer token cannot be blank"),
        ("VANTAGE_METRICS_TOKEN", "token ", "a bearer token cannot be blank or start or end"),
    ],
)
def test_a_bad_setting_is_one_line_naming_the_variable(tmp_path, variable, value, says):
    """Found by a fresh-user trial: a bad VANTAGE_* value printed pydantic's traceback, and
    durations of 0 or less were taken."""
    url = f"sqlite:///{tmp_path}/b.db"
    for command in (["serve", "--port", "0"], ["db", "upgrade"]):
        proc = run_cli(*command, "--database-url", url, env={variable: value}, check=False)
        assert proc.returncode == 2, proc.stderr
        secret = variable.removeprefix("VANTAGE_").lower() in SECRET_SETTINGS
        shown = "***" if secret else value  # a secret is not echoed
        assert proc.stderr.strip().startswith(f"error: {variable}='{shown}': {says}")
        assert len(proc.stderr.strip().splitlines()) == 1


def test_serve_no_upgrade_on_an_empty_database_says_so(tmp_path):
    """It reported ready, answered every key with 401 and logged a traceback a second."""
    proc = run_cli("serve", "--no-upgrade", "--port", "0", "--database-url",
                   f"sqlite:///{tmp_path}/empty.db", check=False)  # fmt: skip
    assert proc.returncode == 1 and "no Vantage schema" in proc.stderr, proc.stderr
    assert not (tmp_path / "empty.db").exists()


def test_serve_no_upgrade_on_an_older_schema_says_so(tmp_path):
    """An older schema lacks what this code reads and writes (0012's `step_series`, say)."""
    from alembic import command
    from vantage.server.migrate import alembic_config, revisions

    url = f"sqlite:///{tmp_path}/old.db"
    command.upgrade(alembic_config(url), "0011")
    proc = run_cli("serve", "--no-upgrade", "--port", "0", "--database-url", url, check=False)
    assert proc.returncode == 1, proc.stderr
    head = revisions(url)[1]
    assert f"is at revision 0011, this server needs {head}; run `vantage db upgrade`" in proc.stderr


def test_serve_stops_on_sigterm_within_10s(tmp_path):
    srv = start_server(f"sqlite:///{tmp_path}/s.db", tmp_path, "--insecure-no-auth")
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    srv.proc.wait(15)
    assert time.monotonic() - t0 < 10


def test_serve_on_a_busy_port_says_so_and_never_claims_to_serve(tmp_path):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        url = f"sqlite:///{tmp_path}/busy.db"
        out = run_cli("serve", "--port", str(port), "--database-url", url, check=False)
    assert out.returncode == 1, out.stderr
    assert f"error: cannot serve on 127.0.0.1:{port}: Address already in use" in out.stderr
    assert "Vantage API on" not in out.stderr and not Path(f"{tmp_path}/busy.db").exists()
    # --port 0: the OS picks a port, and the first line names it (uvicorn would not)
    url = f"sqlite:///{tmp_path}/any.db"
    cmd = [VANTAGE, "serve", "--port", "0", "--insecure-no-auth", "--database-url", url]
    first = _serve_said_and_answers(cmd)
    port = int(re.search(r"Vantage API on http://127\.0\.0\.1:(\d+) ", first).group(1))
    assert port > 0


def _serve_said_and_answers(cmd: list[str]) -> str:
    """Start `vantage serve` (``cmd``), read the first line it says, check that the URL it
    names answers /healthz within 30 s, stop it; returns that line."""
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stderr.readline()
        said = re.search(r"Vantage API on (\S+) ", first)
        assert said, first
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{said.group(1)}/healthz").status_code == 200:
                    return first
            except httpx.HTTPError:
                time.sleep(0.2)
        raise AssertionError(f"{said.group(1)}/healthz did not answer: {first}")
    finally:
        proc.terminate()
        proc.wait(15)


@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_serve_on_ipv6_loopback_names_a_url_that_works(tmp_path, host):
    """`--host ::1` printed http://::1:PORT, which no client parses, and `--host [::1]` (as a
    URL writes it) was 'not known' (a trial): both serve, and the URL is bracketed."""
    url = f"sqlite:///{tmp_path}/v6.db"
    cmd = [VANTAGE, "serve", "--host", host, "--port", "0", "--insecure-no-auth",
           "--database-url", url]  # fmt: skip
    first = _serve_said_and_answers(cmd)
    assert re.search(r"Vantage API on http://\[::1\]:\d+ ", first), first


def test_runs_prune_keeps_step_metrics(tmp_path):
    url = f"sqlite:///{tmp_path}/p.db"
    srv = start_server(url, tmp_path, "--insecure-no-auth")
    try:
        with srv.client(None) as c:
            run = new_run(c)
            post_steps(c, run, [{"step": 1, "groups": [{"prompt_id": "q", "rewards": [1, 1]}]}])
            assert run_cli("runs", "prune", "--older-than", "0", check=False).returncode == 2
            time.sleep(1.0)  # older than 1e-5 days (0.86 s)
            out = run_cli("runs", "prune", "--older-than", "1e6", "--database-url", url)
            assert "deleted 0 stored groups" in out.stderr  # reaching back before year 1
            for span in ("1e400", "inf", "nan"):  # "deleted 0 ... idle for more than inf days"
                out = run_cli("runs", "prune", "--older-than", span, check=False)
                assert out.returncode == 2 and "DAYS must be a finite number" in out.stderr
            out = run_cli("runs", "prune", "--older-than", "0.00001", "--database-url", url)
            assert "deleted 1 stored groups" in out.stderr
            assert c.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"][0]["acr"] == 1.0
            assert c.get(f"/api/v1/runs/{run['run_id']}/prompts").json()["prompts"] == []
    finally:
        srv.stop()


def test_missing_extra_exits_2_naming_it():
    code = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'torch' else real(n, *a)\n"
        "from vantage.server.cli import main\n"
        "sys.exit(main(['train', 'x.yaml']))\n"
    )
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 2 and "'trainer' extra" in proc.stderr


def test_importing_the_server_leaves_other_prometheus_counters_alone():
    """An application that embeds the server and counts with prometheus_client itself keeps
    its counters' standard `_created` samples (turning them off is process-wide)."""
    code = (
        "import vantage.server.main\n"
        "from prometheus_client import CollectorRegistry, Counter, generate_latest\n"
        "registry = CollectorRegistry()\n"
        "Counter('app_jobs', 'Jobs.', registry=registry).inc()\n"
        "print(generate_latest(registry).decode())\n"
    )
    import sys

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "app_jobs_total 1.0" in proc.stdout and "app_jobs_created" in proc.stdout


def test_schemathesis_finds_no_server_error(auth_server, tmp_path):
    port = auth_server.url.rsplit(":", 1)[1]
    # beside `vantage` in the venv's bin (a replace on the path also hit a clone named vantage)
    st = str(Path(VANTAGE).with_name("st"))
    proc = subprocess.run(
        [
            st,
            "run",
            f"http://127.0.0.1:{port}/openapi.json",
            "--checks",
            "not_a_server_error",
            "-H",
            f"Authorization: Bearer {auth_server.keys['all']}",
            "--max-examples",
            "25",
            "--generation-deterministic",
            "--request-timeout",
            "30",
            "--exclude-checks",
            "use_after_free,ensure_resource_availability",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:]


def test_serve_with_workers_on_postgres(postgres_url, tmp_path):
    """`--workers 2` (here from VANTAGE_WORKERS): two processes share the port and one run;
    concurrent batches of several steps all land once, with their metrics; `/metrics` counts
    them all whichever worker answers; SIGTERM stops them all within 10 s."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.helpers.postgres import new_postgres_database

    url, drop = new_postgres_database()
    # VANTAGE_WORKERS is `--workers` from the environment
    srv = start_server(url, tmp_path, "--insecure-no-auth", env={"VANTAGE_WORKERS": "2"})
    try:
        assert len(_spawned_workers(srv.proc.pid)) == 2
        with srv.client(None) as c:
            run = new_run(c)

            def send(step: int) -> dict:
                groups = [[1, 1, 1, 1], [0, 1, 0, 1]] * 50  # 100 groups, half collapsed
                with srv.client(None) as own:
                    return post_steps(own, run, [{"step": step, "groups": groups}])

            with ThreadPoolExecutor(4) as pool:
                answers = list(pool.map(send, range(40)))
            assert sum(a["accepted"] for a in answers) == 4000
            points = c.get(f"/api/v1/runs/{run['run_id']}/metrics").json()["points"]
            assert [p["step"] for p in points] == list(range(40))
            assert {p["acr"] for p in points} == {0.5} and {p["n_groups"] for p in points} == {100}
            assert c.get(f"/api/v1/runs/{run['run_id']}").json()["last_step"] == 39
        for _ in range(8):  # new connections reach either worker: each answers the sums
            with srv.client(None) as scraper:
                text = scraper.get("/metrics").text
            assert "\nvantage_ingested_groups_total 4000.0\n" in text, text
            assert "\nvantage_ingest_requests_total 40.0\n" in text, text
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(15)
        assert time.monotonic() - t0 < 10
    finally:
        srv.stop()
        drop()


def _spawned_workers(pid: int) -> list[int]:
    """The worker processes that uvicorn spawned under ``pid`` (Linux /proc)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"multiprocessing.spawn" in cmdline:
                out.append(int(child))
    return out


def test_groups_from_python_keep_every_collection_form():
    """In Python (the client), a group may be any collection of rewards, as before the forms
    were told apart by shape; a scalar is no group, with one clear error."""
    stats = {"n": 2, "mean": 0.5, "std": 0.70710678, "min": 0.0, "max": 1.0}
    groups = [(1.0, 0.0), np.array([0.0, 1.0]), iter([1.0, 1.0]), {"rewards": (1, 0)}]
    groups += [RawGroup(rewards=[0.0, 0.0]), {"stats": stats}, StatsGroup(stats=stats)]
    record = StepRecord.model_validate({"step": 1, "groups": groups})
    assert [type(g).__name__ for g in record.groups] == ["list"] * 3 + ["RawGroup"] * 2 + [
        "StatsGroup"
    ] * 2
    assert record.groups[1] == [0.0, 1.0]
    with pytest.raises(ValidationError, match="a group is a list of rewards, or an object"):
        StepRecord.model_validate({"step": 1, "groups": [0.5]})


def test_a_records_time_is_unix_seconds():
    import math

    for ok in (0.0, 1.7e9, 9.9e10):
        assert StepRecord.model_validate({"step": 1, "time": ok}).time == ok
    for bad, says in ((-1.0, "from 0"), (-1e300, "from 0"), (math.nan, "got nan"),
                      (math.inf, "got inf"), (1.7e12, "milliseconds? send seconds")):  # fmt: skip
        with pytest.raises(ValidationError, match=re.escape(says)):
            StepRecord.model_validate({"step": 1, "time": bad})


def test_sync_without_a_key_to_a_server_that_wants_one_says_how_to_give_it(auth_server, tmp_path):
    from vantage.client import Monitor

    offline = Monitor(None, None, run_name="keyless", spool_dir=tmp_path / "spool")
    offline.log_groups(0, [[1.0, 0.0]])
    offline.close(timeout=5)
    env = {"VANTAGE_API_KEY": ""}
    out = run_cli(
        "sync", str(tmp_path / "spool"), "--server", auth_server.url, env=env, check=False
    )
    assert out.returncode == 1 and "HTTP 401" in out.stdout, out
    assert "hint: the server asks for an API key: pass --api-key KEY" in out.stderr, out.stderr
    out = run_cli("sync", str(tmp_path / "spool"), "--server", auth_server.url, "--api-key",
                  auth_server.keys["all"], check=False)  # fmt: skip
    assert out.returncode == 0 and "hint" not in out.stderr, out


@pytest.mark.parametrize(
    "argv", [["keys", "list"], ["keys", "revoke", "x"], ["db", "upgrade"], ["runs", "prune",
             "--older-than", "3"], ["keys", "create", "--name", "k", "--scopes", "read"]]
)  # fmt: skip
def test_server_commands_name_the_missing_extra_on_a_client_only_install(argv):
    """On a client-only install `vantage keys|db|runs` ended in a ModuleNotFoundError traceback,
    where `serve` named the extra to install (a trial)."""
    script = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'sqlalchemy' else real(n, *a)\n"
        "sys.modules['sqlalchemy'] = None  # as if not installed\n"
        "from vantage.server.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        "error: this command needs the 'server' extra (missing: sqlalchemy); install it with: "
        "pip install 'vantage-rl[server]'"
    ), proc.stderr


def test_a_record_time_of_minus_zero_is_zero():
    """-0.0 is 0 seconds, and reads back as 0.0 (it read back as -0.0)."""
    record = StepRecord(step=1, time=-0.0)
    assert record.time == 0 and math.copysign(1.0, record.time) == 1.0
