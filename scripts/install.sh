#!/usr/bin/env bash
# Creates .venv (if missing) and installs Vantage with the extras named ("dev", "trainer", ...).
# torch is pinned to the CPU build first: an unpinned torch would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-trainer}"
if [[ ! "$extras" =~ ^[a-z]+(,[a-z]+)*$ ]]; then
  echo "usage: bash scripts/install.sh [EXTRAS]   (comma-separated: server, trainer, bench, dev, vllm;" >&2
  echo "       default trainer). Creates .venv and installs Vantage with those extras." >&2
  [[ "$extras" == "-h" || "$extras" == "--help" ]] && exit 0 || exit 2
fi
# Up to date when pyproject.toml is unchanged since an install that covered these extras (an
# editable install: code changes need none). Skipping pip saves about 30 s a run.
stamp=.venv/.vantage-installed
digest=$(sha256sum pyproject.toml | cut -c1-64)
installed=""  # the extras installed since pyproject.toml last changed, one a line
if [ -x .venv/bin/vantage ] && [ -f "$stamp" ] && [ "$(head -n1 "$stamp")" = "$digest" ]; then
  installed=$(tail -n +2 "$stamp")
  tr ',' '\n' <<<"$extras" | grep -qvxF -e "" -f <(echo "$installed") || exit 0
fi
python3 -m venv .venv 2>/dev/null || true
[ -x .venv/bin/pip ] || python3 -m venv --clear .venv
.venv/bin/python -m pip install -q --upgrade pip setuptools wheel
# only extras that pull torch get it (trainer; dev through trl; vllm): a server-only install has none
needs_torch=$(tr ',' '\n' <<<"$extras" | grep -xE 'trainer|dev|vllm' || true)
if [ -n "$needs_torch" ] && ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install -q "torch==${VANTAGE_TORCH_VERSION:-2.13.0}"
fi
.venv/bin/python -m pip install -q -e ".[${extras}]"
# The stamp: the digest, then every extra installed with it (those of earlier installs too);
# dev includes server and bench (pyproject.toml), so a demo after the tests runs no pip.
{ echo "$digest"; { echo "$installed"; tr ',' '\n' <<<"$extras" | sed 's/^dev$/dev\nserver\nbench/'; } \
  | grep . | sort -u; } > "$stamp.new"
mv "$stamp.new" "$stamp"
