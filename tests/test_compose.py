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
