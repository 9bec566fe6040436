"""The database given by its parts (VANTAGE_DB_*), and passwords kept out of every message."""

from __future__ import annotations

import string

import pytest
from sqlalchemy.engine import make_url
from vantage.server.settings import SettingsError, load_settings

from tests.helpers.cli import run_cli

# what `openssl rand -base64 18` made in a trial, and every printable character
BASE64_PASSWORD = "Kq7/Zr+Wm2xVt9Lp4Hs="
PRINTABLE = string.printable[:95]


@pytest.mark.parametrize("password", [BASE64_PASSWORD, PRINTABLE])
def test_the_parts_make_a_url_that_keeps_the_password(monkeypatch, password):
    for name, value in [("HOST", "db"), ("USER", "va@n:t/ge"), ("NAME", "vantage")]:
        monkeypatch.setenv(f"VANTAGE_DB_{name}", value)
    monkeypatch.setenv("VANTAGE_DB_PASSWORD", password)
    url = make_url(load_settings().database_url)
    assert (url.drivername, url.host, url.port, url.database) == (
        "postgresql+psycopg", "db", 5432, "vantage"
    )  # fmt: skip
    assert url.password == password and url.username == "va@n:t/ge"


def test_a_database_url_wins_over_the_parts(monkeypatch, tmp_path):
    """`vantage serve --workers N` hands its workers VANTAGE_DATABASE_URL beside the parts."""
    monkeypatch.setenv("VANTAGE_DB_HOST", "db")
    monkeypatch.setenv("VANTAGE_DB_NAME", "vantage")
    url = f"sqlite:///{tmp_path}/x.db"
    assert load_settings(database_url=url).database_url == url
    monkeypatch.setenv("VANTAGE_DATABASE_URL", url)
    assert load_settings().database_url == url


def test_incomplete_parts_are_named(monkeypatch):
    monkeypatch.setenv("VANTAGE_DB_PASSWORD", BASE64_PASSWORD)
    with pytest.raises(SettingsError, match="^VANTAGE_DB_PASSWORD set without VANTAGE_DB_HOST"):
        load_settings()
    monkeypatch.setenv("VANTAGE_DB_HOST", "db")
    with pytest.raises(SettingsError, match="without VANTAGE_DB_NAME") as caught:
        load_settings()
    assert BASE64_PASSWORD not in str(caught.value)


@pytest.mark.parametrize("password", [BASE64_PASSWORD, "p@ss word/x", "a:b@c#d?e%f", "x@y/z w@q"])
def test_a_password_in_a_url_that_does_not_parse_is_never_shown(password):
    """The trial's compose file put the password into the URL unescaped: the server stopped
    with "port that is not a number", echoing the URL and the password in clear."""
    url = f"postgresql://vantage:{password}@db:5432/vantage"
    proc = run_cli("db", "upgrade", env={"VANTAGE_DATABASE_URL": url}, check=False)
    assert proc.returncode == 2
    assert password not in proc.stderr and "vantage:***@db:5432/vantage" in proc.stderr
    assert "percent-encoded" in proc.stderr and "VANTAGE_DB_PASSWORD" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.postgres
def test_a_refused_connection_hides_a_password_given_by_parts(postgres_url):
    """A role that does not exist fails at once (no 60 s wait): the line names the database,
    the password hidden."""
    host = make_url(postgres_url)
    env = {"VANTAGE_DB_HOST": host.host or "127.0.0.1", "VANTAGE_DB_PORT": str(host.port or 5432),
           "VANTAGE_DB_USER": "no_such_role", "VANTAGE_DB_PASSWORD": PRINTABLE,
           "VANTAGE_DB_NAME": host.database}  # fmt: skip
    proc = run_cli("db", "upgrade", env=env, check=False)
    assert proc.returncode == 1 and "no_such_role:***@" in proc.stderr, proc.stderr
    assert BASE64_PASSWORD not in proc.stderr and "%2F" not in proc.stderr
