"""docker-compose.yml and the Dockerfile, checked with a parser (no Docker engine runs here)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SECRET_KEYS = re.compile(r"PASSWORD|SECRET|TOKEN|KEY", re.I)


def test_services_health_checks_and_start_order():
    services = COMPOSE["services"]
    assert {"db", "server", "trainer"} <= set(services)
    assert services["db"]["image"].startswith("postgres:16")
    assert "healthcheck" in services["db"] and "healthcheck" in services["server"]
    assert services["server"]["depends_on"]["db"]["condition"] == "service_healthy"
    assert services["trainer"]["depends_on"]["server"]["condition"] == "service_healthy"
    assert services["trainer"]["profiles"] == ["trainer"]
    assert "8000" in services["server"]["ports"][0]
    assert any(v.endswith(":/var/lib/postgresql/data") for v in services["db"]["volumes"])


def test_no_secret_in_the_compose_file():
    for name, service in COMPOSE["services"].items():
        for key, value in (service.get("environment") or {}).items():
            text = str(value)
            if SECRET_KEYS.search(key) or "://" in text:
                literal = re.sub(r"\$\{[^}]*\}", "", text)
                assert not re.search(r":[^/@:]+@", literal), f"{name}.{key} embeds a password"
                if SECRET_KEYS.search(key):
                    assert text.startswith("${"), f"{name}.{key} must come from .env"


def test_env_example_documents_every_variable():
    text = (ROOT / "docker-compose.yml").read_text()
    used = set(re.findall(r"\$\{([A-Z_]+)", text))
    documented = set(re.findall(r"^([A-Z_]+)=", (ROOT / ".env.example").read_text(), re.M))
    assert used <= documented, used - documented


def test_server_image_has_no_torch_and_runs_as_non_root():
    docker = (ROOT / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", docker, flags=re.M)
    server = next(s for s in stages if " AS server" in s.splitlines()[0])
    build = next(s for s in stages if " AS build" in s.splitlines()[0])
    assert "[server]" in build and "trainer]" not in build and "torch" not in server
    assert re.search(r"^USER (?!root)\w+", server, re.M)


def test_the_server_gets_the_settings_a_deployment_sets():
    """Under compose the webhook secret in .env never reached the server: messages went out
    unsigned (a trial). Each setting the README's table lists for a deployment is passed, empty
    when .env leaves it out (the server then takes its default)."""
    environment = COMPOSE["services"]["server"]["environment"]
    for name in ("VANTAGE_WEBHOOK_SECRET", "VANTAGE_DEFAULT_MITIGATION_MODE",
                 "VANTAGE_COMMAND_TTL_S", "VANTAGE_WEBHOOK_GIVE_UP_S",
                 "VANTAGE_WEBHOOK_TIMEOUT_S", "VANTAGE_DASHBOARD_REFRESH_S"):  # fmt: skip
        assert environment.get(name) == f"${{{name}:-}}", name


def test_an_empty_setting_is_the_default(monkeypatch):
    from vantage.server.settings import load_settings

    for name in ("WEBHOOK_SECRET", "COMMAND_TTL_S", "PUBLIC_URL", "DEFAULT_MITIGATION_MODE"):
        monkeypatch.setenv(f"VANTAGE_{name}", "")
    settings = load_settings(database_url="sqlite:///x.db")
    assert settings.webhook_secret is None and settings.command_ttl_s == 3600.0
    assert settings.public_url is None and settings.default_mitigation_mode == "auto"


def test_only_the_stack_password_is_required_when_compose_reads_the_file():
    """Compose interpolates the whole file, profiles included, before it applies profiles: the
    trainer's `${VANTAGE_TRAINER_KEY:?...}` refused every `docker compose up` (a trial)."""
    text = (ROOT / "docker-compose.yml").read_text()
    assert re.findall(r"\$\{(\w+):\?", text) == ["POSTGRES_PASSWORD"]
    assert COMPOSE["services"]["trainer"]["environment"]["VANTAGE_API_KEY"] == (
        "${VANTAGE_TRAINER_KEY:-}"
    )


def test_no_password_is_interpolated_into_a_url():
    """A base64 password (`/`, `+`, `=`) in an interpolated URL was read as a port: a restart
    loop that printed the password. The server gets the database by its parts."""
    for name, service in COMPOSE["services"].items():
        for key, value in (service.get("environment") or {}).items():
            assert not ("://" in str(value) and "PASSWORD" in str(value)), f"{name}.{key}"
    environment = COMPOSE["services"]["server"]["environment"]
    assert environment["VANTAGE_DB_PASSWORD"] == "${POSTGRES_PASSWORD}"
    assert environment["VANTAGE_DB_HOST"] == "db" and "VANTAGE_DATABASE_URL" not in environment


def test_the_trainer_data_is_a_named_volume_by_default():
    """A host folder that Docker creates is root's; the image runs as uid 10001."""
    volume = COMPOSE["services"]["trainer"]["volumes"][0]
    assert volume == "${VANTAGE_TRAINER_DATA:-trainer-runs}:/home/vantage/runs"
    assert "trainer-runs" in COMPOSE["volumes"]
    trainer = _stage("trainer")
    assert "install -d -o vantage -g vantage /home/vantage/runs" in trainer


def _stage(name: str) -> str:
    stages = re.split(r"^FROM ", (ROOT / "Dockerfile").read_text(), flags=re.M)
    return next(s for s in stages if f" AS {name}" in s.splitlines()[0])


def test_the_server_image_is_lean_and_reproducible():
    """Wheels copied into the server stage and deleted after the install stayed in a dead
    layer (59 MB); dependency versions floated; a local .venv went into the build context."""
    build, server = _stage("build"), _stage("server")
    assert "rm -rf" not in server and "COPY --from=build /opt/vantage /opt/vantage" in server
    assert re.search(r"^HEALTHCHECK ", server, re.M)
    assert "-r docker/constraints.txt" in build and '-c docker/constraints.txt ".[server]"' in build
    pins = [line for line in (ROOT / "docker/constraints.txt").read_text().splitlines()
            if line and not line.startswith("#")]  # fmt: skip
    assert pins and all(re.fullmatch(r"[\w.-]+==[\w.+!-]+", line) for line in pins), pins
    names = {line.split("==")[0].lower().replace("_", "-") for line in pins}
    assert {"fastapi", "sqlalchemy", "psycopg", "uvicorn", "dash"} <= names
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignored[ignored.index("*") :] and "!.venv" not in ignored


@pytest.mark.parametrize("key", ["", "a-key"])
def test_the_trainer_checks_its_key_when_it_starts(tmp_path, key):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "VANTAGE_API_KEY": key}
    proc = subprocess.run(["sh", str(ROOT / "docker/trainer-start.sh"), "echo", "started"],
                          capture_output=True, text=True, env=env)  # fmt: skip
    if key:
        assert proc.returncode == 0 and proc.stdout == "started\n", proc.stderr
        assert (tmp_path / "runs").is_dir()
    else:
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.startswith("error: VANTAGE_TRAINER_KEY is not set in .env")
        assert len(proc.stderr.splitlines()) == 1
