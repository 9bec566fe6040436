#!/bin/sh
# The compose `trainer` profile's entrypoint: check what the trainer needs, each failure one
# line, then run the command. The key is checked here, when the trainer starts, and not by
# compose, which refused every `docker compose up` for a key only the trainer uses.
if [ -z "${VANTAGE_API_KEY:-}" ]; then
  echo "error: VANTAGE_TRAINER_KEY is not set in .env: create a key with \`docker compose exec server vantage keys create --name trainer --scopes ingest,read\` and put it there" >&2
  exit 2
fi
runs="${HOME:-/home/vantage}/runs"
if ! mkdir -p "$runs" 2>/dev/null || [ ! -w "$runs" ]; then
  echo "error: $runs is not writable by uid $(id -u): leave VANTAGE_TRAINER_DATA unset (a named volume), or give the host folder to that uid (sudo chown $(id -u) FOLDER)" >&2
  exit 2
fi
exec "$@"
