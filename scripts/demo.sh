#!/usr/bin/env bash
# The main job: installs Vantage into .venv, then runs `vantage demo` (server, dashboard and a
# CPU training run on the embedded SQLite default). Arguments are passed on (--quick, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh server,trainer
exec .venv/bin/vantage demo "$@"
