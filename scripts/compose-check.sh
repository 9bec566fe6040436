#!/usr/bin/env bash
# The README's Docker path, end to end, on a real Docker engine, as a new user would take it:
# a fresh copy of this checkout (the files a clone would hold once committed) in a folder named
# vantage, `cp .env.example .env`, a password with characters URLs and .env files mangle,
# `docker compose up`, a key, a client streaming a run from another container, the run still
# there after `restart server` and after `down` + `up`, no password in any log or health
# answer, and the trainer profile's start checks. Prints one summary line; exit 0 when all pass.
#
#   bash scripts/compose-check.sh [-f EXTRA_COMPOSE_FILE]...
#
# An extra compose file is merged into every compose command (a machine whose containers have
# no network for the image build adds its own override). Needs Docker with compose v2 or v1,
# python3 and git. KEEP=1 leaves the stack and the folder. CI has no engine and does not run it.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    -f) extra+=(-f "$(realpath "$2")"); shift 2 ;;
    *) echo "usage: $0 [-f EXTRA_COMPOSE_FILE]..." >&2; exit 2 ;;
  esac
done
if ! docker info >/dev/null 2>&1; then
  echo "compose-check: SKIP: no Docker engine answers (docker info failed)"; exit 0
fi
if docker compose version >/dev/null 2>&1; then compose_bin=(docker compose)
elif command -v docker-compose >/dev/null; then compose_bin=(docker-compose)
else echo "compose-check: FAIL: neither \`docker compose\` nor docker-compose is installed"; exit 1
fi
compose_version=$("${compose_bin[@]}" version --short 2>/dev/null || echo "?")
project="vantage-check-$$"
work=$(mktemp -d /tmp/vantage-compose-check.XXXXXX)
clone="$work/vantage"
compose() { (cd "$clone" && "${compose_bin[@]}" -p "$project" -f docker-compose.yml "${extra[@]}" "$@"); }
step="copying the checkout"
fail() {
  echo "--- server log (end) ---" >&2
  compose logs --no-color --tail 40 server >&2 2>/dev/null
  echo "compose-check: FAIL at $step: $*"
  exit 1
}
cleanup() {
  if [ "${KEEP:-0}" = 1 ]; then echo "kept: $clone (compose project $project)" >&2; return; fi
  compose --profile trainer down -v --remove-orphans >/dev/null 2>&1
  docker volume rm -f "$project-trainer-check" >/dev/null 2>&1
  docker image rm -f "$project-trainer-like" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

mkdir -p "$clone"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard \
  | tar --null --ignore-failed-read -T - -cf - 2>/dev/null) | tar -C "$clone" -xf - || fail "tar"

step="writing .env"
# `openssl rand -base64 18` gives / + =; the rest are what a URL or a .env file reads otherwise.
# Single quotes: compose v2 expands $ in an unquoted .env value.
password='Kq7/Zr+W@m2:x%Vt?9&L p#4H"s=$x!~'
free_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
cp "$clone/.env.example" "$clone/.env"
sed -i "s|^POSTGRES_PASSWORD=.*|POSTGRES_PASSWORD='$password'|; s|^VANTAGE_PORT=.*|VANTAGE_PORT=$free_port|" "$clone/.env"
url="http://127.0.0.1:$free_port"

wait_healthy() {
  local id status=""
  for _ in $(seq 180); do
    id=$(compose ps -q server 2>/dev/null)
    status=$(docker inspect -f '{{.State.Health.Status}}' "$id" 2>/dev/null)
    [ "$status" = healthy ] && return 0
    sleep 1
  done
  fail "the server is not healthy after 180 s (status: ${status:-none})"
}

# GET a path of the API from this machine, through the published port; the body on stdout.
get() {
  python3 - "$url$1" "${2:-}" <<'PY'
import sys, urllib.request
req = urllib.request.Request(sys.argv[1])
if sys.argv[2]:
    req.add_header("Authorization", f"Bearer {sys.argv[2]}")
try:
    print(urllib.request.urlopen(req, timeout=10).read().decode())
except Exception as exc:
    print(f"{sys.argv[1]}: {exc}", file=sys.stderr)
    sys.exit(1)
PY
}

step="docker compose up"
t0=$SECONDS
compose up -d >"$work/up.log" 2>&1 || { tail -30 "$work/up.log" >&2; fail "up exited non-zero"; }
wait_healthy
up_s=$((SECONDS - t0))

step="keys create"
key=$(compose exec -T server vantage keys create --name trainer --scopes ingest,read | tail -n1 | tr -d '\r')
[ -n "$key" ] || fail "no key printed"

step="streaming a run"
stream='
from vantage.client import Monitor
monitor = Monitor(run_name="compose-check", project="compose-check", group_size=4)
for step in range(20):
    monitor.log_groups(step, [[1, 0, 1, 0], [1, 1, 1, 1]] * 8)
monitor.close(timeout=60)
print(monitor.run_id)
'
run_id=$(compose run --rm --no-deps -T -e VANTAGE_SERVER=http://server:8000 \
  -e VANTAGE_API_KEY="$key" server python -c "$stream" 2>"$work/stream.log" | tail -n1)
[ -n "$run_id" ] || { cat "$work/stream.log" >&2; fail "the client printed no run id"; }

expect_run() {  # the streamed run is on the server, all 20 steps
  local body
  body=$(get "/api/v1/runs/$run_id" "$key") || fail "GET the run"
  python3 -c 'import json, sys; assert json.loads(sys.argv[1])["last_step"] == 19, sys.argv[1]' \
    "$body" || fail "the run lacks steps: $body"
}
expect_run

step="restart server"
compose restart server >/dev/null 2>&1 || fail "restart exited non-zero"
sleep 2
wait_healthy
expect_run

step="down and up"
compose down >/dev/null 2>&1 || fail "down exited non-zero"
compose up -d >>"$work/up.log" 2>&1 || fail "up exited non-zero"
wait_healthy
expect_run

step="looking for the password"
encoded=$(python3 -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1], safe=""))' "$password")
{ compose logs --no-color; get /healthz; get /readyz; } >"$work/said.txt" 2>&1
for form in "$password" "$encoded" "Kq7/Zr"; do
  if grep -qF -- "$form" "$work/said.txt"; then fail "the password is in a log or a health answer"; fi
done
restarts=$(docker inspect -f '{{.RestartCount}}' "$(compose ps -q server)")
[ "$restarts" = 0 ] || fail "the server restarted $restarts times"

step="the trainer profile"
compose --profile trainer config -q || fail "compose refuses the file with the profile on and no key"
image=$(docker inspect -f '{{.Image}}' "$(compose ps -q server)")
start="$clone/docker/trainer-start.sh"
said=$(docker run --rm --network none --entrypoint sh -v "$start:/start.sh:ro" "$image" /start.sh true 2>&1)
[ $? = 2 ] && [ "$(echo "$said" | wc -l)" = 1 ] && [[ "$said" == *VANTAGE_TRAINER_KEY* ]] \
  || fail "no key: the trainer start said: $said"
# runs/ made as the trainer stage makes it (the CUDA image cannot be built here), under a fresh
# named volume, as the profile mounts one
printf 'FROM %s\nUSER root\nRUN install -d -o vantage -g vantage /home/vantage/runs\nUSER vantage\n' \
  "$image" | docker build -q -t "$project-trainer-like" - >/dev/null || fail "trainer-like image"
said=$(docker run --rm --network none --entrypoint sh -e VANTAGE_API_KEY="$key" -v "$start:/start.sh:ro" \
  -v "$project-trainer-check:/home/vantage/runs" "$project-trainer-like" \
  /start.sh sh -c 'mkdir runs/gsm8k-gpu && echo written' 2>&1)
[ "$said" = written ] || fail "the named volume: $said"
mkdir -p "$work/root-owned"
said=$(docker run --rm --network none --entrypoint sh -e VANTAGE_API_KEY="$key" -v "$start:/start.sh:ro" \
  -v "$work/root-owned:/home/vantage/runs" "$project-trainer-like" /start.sh true 2>&1)
[ $? = 2 ] && [[ "$said" == *"not writable by uid 10001"* ]] \
  || fail "a root-owned host folder: $said"

size=$(docker image inspect -f '{{.Size}}' "$image")
echo "compose-check: PASS (compose $compose_version, engine $(docker version -f '{{.Server.Version}}')):" \
  "up from a fresh copy in ${up_s} s, healthy, key created, 20 steps streamed and kept across" \
  "restart and down/up, no password in logs or health answers, 0 restarts, trainer key and" \
  "data-folder checks ok, server image $((size / 1000000)) MB"
