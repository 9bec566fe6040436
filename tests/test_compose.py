"""docker-compose.yml and the Dockerfile, checked with a parser (no Docker engine runs here)."""

from __future__ import annotations

import re
from pathlib import Path

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
