#!/usr/bin/env bash
# Static checks of the deployment files, in seconds, without PID 1 systemd, without binding a
# port and without touching the machine's own configuration (everything happens in a scratch
# directory):
#   1. `systemd-analyze verify` on every unit of deploy/systemd/ and hostagent/packaging/,
#      in a scratch root (--root) holding the distribution's units, the files as they are, and
#      an empty executable at each path an Exec*= line names (/opt/fleet/venv/bin/daphne ...):
#      verify checks that those exist. Any warning fails too (an unknown key is only a
#      warning to systemd, and would silently do nothing); so does the sysusers file, and a
#      server unit whose `systemd-analyze security` exposure rises above 2.5.
#   2. `nginx -t` on a test main configuration that includes deploy/nginx/fleet.conf in its
#      http block, as Debian's nginx.conf does, with a self-signed certificate in place of the
#      one the file names.
#   3. `caddy validate` on deploy/caddy/Caddyfile, which must also be as `caddy fmt` writes it.
#   4. deploy/compose/: `caddy validate` and `caddy fmt` on its Caddyfile, and `docker compose
#      config -q` (or Debian's docker-compose) on compose.yaml with its fleet.env.example as
#      fleet.env, in a scratch copy; without either compose command, that part is skipped with
#      a line saying so (.ci/run installs docker-compose; tests/deploy/test_compose.py reads the
#      file's structure in any case).
# Needs Debian's systemd, nginx (or nginx-light) and caddy packages (.ci/run installs them).
# Run by `make check-deploy` (.ci/run, static stage) and tests/deploy/test_check.py; DEPLOY_DIR and AGENT_UNITS
# point it at other files (the test checks that a broken copy fails).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEPLOY_DIR=${DEPLOY_DIR:-$ROOT/deploy}
AGENT_UNITS=${AGENT_UNITS:-$ROOT/hostagent/packaging}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/fleet-deploy-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
failed=0
fail() { printf 'FAIL %s\n' "$*" >&2; failed=1; }
need() { command -v "$1" >/dev/null || { echo "deploy/check.sh: $1 not found (apt-get install $2)" >&2; exit 2; }; }
need systemd-analyze systemd
need nginx nginx
need caddy caddy
need openssl openssl

# ---- 1. systemd units -------------------------------------------------------------------
SD=$WORK/root
mkdir -p "$SD/usr/lib/systemd" "$SD/etc/systemd/system"
cp -a /usr/lib/systemd/system "$SD/usr/lib/systemd/system"
units=()
for unit in "$DEPLOY_DIR"/systemd/*.service "$DEPLOY_DIR"/systemd/*.target "$DEPLOY_DIR"/systemd/*.slice \
  "$AGENT_UNITS"/*.service; do
  [ -e "$unit" ] || continue
  cp "$unit" "$SD/etc/systemd/system/"
  name=$(basename "$unit")
  # A template is verified through one instance (fleet-web@8001.service).
  case $name in *@.*) name=${name/@./@8001.} ;; esac
  units+=("$name")
  # The first word of every Exec*= line, less its prefixes (-@:+!), becomes an empty
  # executable in the scratch root.
  sed -n 's/^Exec[A-Za-z]*=[-@:+!]*\([^ ]*\).*/\1/p' "$unit" | while read -r exe; do
    case $exe in /*) ;; *) continue ;; esac
    if [ ! -e "$SD$exe" ]; then
      mkdir -p "$SD$(dirname "$exe")"
      printf '#!/bin/sh\n' >"$SD$exe"
      chmod 0755 "$SD$exe"
    fi
  done
done
[ ${#units[@]} -gt 0 ] || fail "no unit found under $DEPLOY_DIR/systemd or $AGENT_UNITS"
for name in "${units[@]}"; do
  if ! out=$(cd "$WORK" && SYSTEMD_LOG_COLOR=0 systemd-analyze verify --man=no --root="$SD" "$name" 2>&1) \
    || [ -n "$out" ]; then
    fail "systemd-analyze verify $name"
    printf '%s\n' "$out" >&2
  fi
done
for users in "$DEPLOY_DIR"/systemd/*.sysusers; do
  [ -e "$users" ] || continue
  # It says what it creates; a bad line is an error (rc), an unknown option a warning.
  if ! out=$(systemd-sysusers --root="$SD" "$users" 2>&1) || grep -qiv '^Creating' <<<"$out" \
    || ! grep -q '^fleet:' "$SD/etc/passwd"; then
    fail "systemd-sysusers $(basename "$users")"
    printf '%s\n' "$out" >&2
  fi
done
echo "systemd: ${#units[@]} units checked (${units[*]})"
# The server units' hardening, as systemd scores it (0 best, 10 worst, times 10 here): today
# about 1.6-1.8 ("OK"); above 2.5 a lost line of hardening fails the check. The agent runs as
# root on purpose (NVML, MIG, MPS, user switches) and is not scored.
server=()
for name in "${units[@]}"; do
  case $name in fleet-web@*|fleet-worker.*|fleet-beat.*|fleet-migrate.*|fleet-gateway.*) server+=("$name") ;; esac
done
if [ ${#server[@]} -gt 0 ]; then
  if ! out=$(cd "$WORK" && systemd-analyze security --offline=yes --root="$SD" --threshold=25 \
    "${server[@]}" 2>&1); then
    fail "systemd-analyze security: a server unit's exposure is above 2.5"
    grep -a 'Overall exposure' <<<"$out" >&2 || printf '%s\n' "$out" >&2
  else
    scores=$(grep -a 'Overall exposure' <<<"$out" | sed 's/.*for \([^:]*\): *\([0-9.]*\).*/\1 \2/')
    echo "systemd: exposure (0 best, 10 worst): $(paste -sd, - <<<"$scores" | sed 's/,/, /g')"
  fi
fi

# ---- 2. nginx -----------------------------------------------------------------------------
NG=$WORK/nginx
mkdir -p "$NG/tmp"
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=fleet.example.com \
  -keyout "$NG/privkey.pem" -out "$NG/fullchain.pem" >/dev/null 2>&1
sed -e "s|/etc/ssl/fleet/|$NG/|g" "$DEPLOY_DIR/nginx/fleet.conf" >"$NG/fleet.conf"
cat >"$NG/nginx.conf" <<EOF
pid $NG/nginx.pid;
error_log stderr;
events {}
http {
    include /etc/nginx/mime.types;
    client_body_temp_path $NG/tmp/body;
    proxy_temp_path $NG/tmp/proxy;
    fastcgi_temp_path $NG/tmp/fastcgi;
    uwsgi_temp_path $NG/tmp/uwsgi;
    scgi_temp_path $NG/tmp/scgi;
    access_log off;
    include $NG/fleet.conf;
}
EOF
if ! out=$(nginx -t -q -p "$NG" -e stderr -c "$NG/nginx.conf" 2>&1) || [ -n "$out" ]; then
  fail "nginx -t with deploy/nginx/fleet.conf"
  printf '%s\n' "$out" >&2
else
  echo "nginx: deploy/nginx/fleet.conf passes nginx -t ($(nginx -v 2>&1 | sed 's/.*\///'))"
fi

# ---- 3. Caddy -----------------------------------------------------------------------------
CADDYFILE=$DEPLOY_DIR/caddy/Caddyfile
# Caddy keeps its state under $XDG_DATA_HOME and $XDG_CONFIG_HOME: the scratch dir.
export HOME=$WORK XDG_DATA_HOME=$WORK/data XDG_CONFIG_HOME=$WORK/config
if ! out=$(caddy validate --config "$CADDYFILE" --adapter caddyfile 2>&1); then
  fail "caddy validate deploy/caddy/Caddyfile"
  printf '%s\n' "$out" >&2
elif ! caddy fmt "$CADDYFILE" | diff -u "$CADDYFILE" - >&2; then
  fail "deploy/caddy/Caddyfile is not as \`caddy fmt\` writes it (the diff above)"
else
  echo "caddy: deploy/caddy/Caddyfile is valid and formatted ($(caddy version | cut -d' ' -f1))"
fi

# ---- 4. Docker Compose ----------------------------------------------------------------------
COMPOSE_DIR=$DEPLOY_DIR/compose
if ! out=$(FLEET_HOSTNAME=fleet.example.com caddy validate --config "$COMPOSE_DIR/Caddyfile" \
  --adapter caddyfile 2>&1); then
  fail "caddy validate deploy/compose/Caddyfile"
  printf '%s\n' "$out" >&2
elif ! caddy fmt "$COMPOSE_DIR/Caddyfile" | diff -u "$COMPOSE_DIR/Caddyfile" - >&2; then
  fail "deploy/compose/Caddyfile is not as \`caddy fmt\` writes it (the diff above)"
else
  echo "caddy: deploy/compose/Caddyfile is valid and formatted"
fi
compose=()
if docker compose version >/dev/null 2>&1; then compose=(docker compose)
elif command -v docker-compose >/dev/null; then compose=(docker-compose); fi
if [ ${#compose[@]} = 0 ]; then
  echo "compose: deploy/compose/compose.yaml not validated (no docker compose, no docker-compose)"
else
  mkdir -p "$WORK/deploy"
  cp -r "$COMPOSE_DIR" "$WORK/deploy/compose"
  cp "$COMPOSE_DIR/fleet.env.example" "$WORK/deploy/compose/fleet.env"
  if ! out=$(cd "$WORK/deploy/compose" && "${compose[@]}" -f compose.yaml config -q 2>&1) || [ -n "$out" ]; then
    fail "${compose[*]} config on deploy/compose/compose.yaml"
    printf '%s\n' "$out" >&2
  else
    echo "compose: deploy/compose/compose.yaml passes ${compose[*]} config ($("${compose[@]}" version --short 2>/dev/null || true))"
  fi
fi

[ "$failed" = 0 ] || { echo "deploy/check.sh: FAILED" >&2; exit 1; }
echo "deploy/check.sh: ok"
