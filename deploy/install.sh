#!/usr/bin/env bash
# Install Fleet on one Debian 12 or Ubuntu 24.04 server, as root, from this checkout (or an
# unpacked release): PostgreSQL, Redis and the proxy (Caddy or nginx) from apt; the database,
# its role and the keys; the release in PREFIX/src and its virtual environment in PREFIX/venv;
# /etc/fleet/fleet.env (0600); the units of deploy/systemd; the proxy's configuration; the
# migrations, the static files and an admin user, whose login it prints. Idempotent: run it again
# after an upgrade of the tree, it keeps the keys, the passwords and the users it finds.
#
#   sudo deploy/install.sh --hostname fleet.example.com [--proxy caddy|nginx]
#
# Without systemd as PID 1 (a container, CI) nothing is enabled or started: the units are
# written and the processes are yours to start (tests/deploy/unit_runner.py does it from the
# units' ExecStart lines). docs/install.md says what each step does and how to undo it.
set -euo pipefail
SOURCE=$(cd "$(dirname "$0")/.." && pwd)

usage() {
  cat <<EOF
usage: $0 [options]
  --hostname NAME      the name browsers and agents use (default: hostname -f)
  --proxy caddy|nginx  the TLS proxy in front of the servers (default: caddy)
  --tls-internal       Caddy: a certificate from Caddy's own CA (no public name, no ACME)
  --web-ports LIST     the fleet-web@ instances' ports (default: one per core, from 8001)
  --prefix DIR         the release and its venv (default: /opt/fleet)
  --etc DIR            where fleet.env goes (default: /etc/fleet)
  --state-root DIR     the units' /var/lib (default: /var/lib)
  --unit-dir DIR       where the units go (default: /etc/systemd/system)
  --bin-dir DIR        where the fleet-manage command goes (default: /usr/local/sbin)
  --proxy-config PATH  the proxy's file (default: /etc/caddy/Caddyfile or
                       /etc/nginx/sites-available/fleet.conf)
  --http-port N, --https-port N   the proxy's ports (default: 80, 443)
  --database NAME      PostgreSQL database and role (default: fleet)
  --db-host HOST       PostgreSQL address in FLEET_DATABASE_URL (default: 127.0.0.1)
  --pg-admin-url URL   how to reach PostgreSQL as a superuser (default: the postgres OS
                       user over the local socket)
  --redis-url URL      an existing Redis (default: the local one, given a password)
  --admin NAME         the first admin's user name (default: admin)
  --no-apt             install no package (they are there)
  --no-systemd         write the units but run no systemctl (automatic without systemd)
EOF
}

HOSTNAME_=$(hostname -f 2>/dev/null || hostname)
PROXY=caddy
TLS_INTERNAL=0
WEB_PORTS=
PREFIX=/opt/fleet
ETC=/etc/fleet
STATE_ROOT=/var/lib
UNIT_DIR=/etc/systemd/system
BIN_DIR=/usr/local/sbin
PROXY_CONFIG=
HTTP_PORT=80
HTTPS_PORT=443
DATABASE=fleet
DB_HOST=127.0.0.1
PG_ADMIN_URL=
REDIS_URL=
ADMIN=admin
APT=1
SYSTEMD=1
[ -d /run/systemd/system ] || SYSTEMD=0
while [ $# -gt 0 ]; do
  case $1 in
    --hostname) HOSTNAME_=$2; shift ;;
    --proxy) PROXY=$2; shift ;;
    --tls-internal) TLS_INTERNAL=1 ;;
    --web-ports) WEB_PORTS=$2; shift ;;
    --prefix) PREFIX=$2; shift ;;
    --etc) ETC=$2; shift ;;
    --state-root) STATE_ROOT=$2; shift ;;
    --unit-dir) UNIT_DIR=$2; shift ;;
    --bin-dir) BIN_DIR=$2; shift ;;
    --proxy-config) PROXY_CONFIG=$2; shift ;;
    --http-port) HTTP_PORT=$2; shift ;;
    --https-port) HTTPS_PORT=$2; shift ;;
    --database) DATABASE=$2; shift ;;
    --db-host) DB_HOST=$2; shift ;;
    --pg-admin-url) PG_ADMIN_URL=$2; shift ;;
    --redis-url) REDIS_URL=$2; shift ;;
    --admin) ADMIN=$2; shift ;;
    --no-apt) APT=0 ;;
    --no-systemd) SYSTEMD=0 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "install.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case $PROXY in caddy | nginx) ;; *) echo "install.sh: --proxy caddy or nginx" >&2; exit 2 ;; esac
[[ $DATABASE =~ ^[a-z_][a-z0-9_]*$ ]] || { echo "install.sh: --database: [a-z0-9_]" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "install.sh: run it as root" >&2; exit 2; }
if [ -z "$WEB_PORTS" ]; then
  WEB_PORTS=$(seq -s, 8001 $((8000 + $(nproc))))
fi
IFS=, read -r -a PORTS <<<"$WEB_PORTS"
if [ -z "$PROXY_CONFIG" ]; then
  [ "$PROXY" = caddy ] && PROXY_CONFIG=/etc/caddy/Caddyfile
  [ "$PROXY" = nginx ] && PROXY_CONFIG=/etc/nginx/sites-available/fleet.conf
fi
DATA_DIR=$STATE_ROOT/fleet
# Debian's Python (python3-venv), not one on root's PATH that the fleet user may not read.
PYTHON=${FLEET_PYTHON:-/usr/bin/python3}
ENV_FILE=$ETC/fleet.env
step() { printf '==> %s\n' "$*"; }

# ---- 1. packages ---------------------------------------------------------------------------
packages=(python3-venv postgresql redis-server "$PROXY" openssl)
if [ "$APT" = 1 ]; then
  missing=()
  for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    step "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    step "packages: all there"
  fi
fi
if [ "$SYSTEMD" = 1 ]; then
  systemctl enable --now postgresql redis-server >/dev/null
fi

# ---- 2. the fleet user ---------------------------------------------------------------------
if ! id fleet >/dev/null 2>&1; then
  step "system user fleet"
  if [ "$SYSTEMD" = 1 ] && command -v systemd-sysusers >/dev/null; then
    install -m 0644 "$SOURCE/deploy/systemd/fleet.sysusers" /usr/lib/sysusers.d/fleet.conf
    systemd-sysusers /usr/lib/sysusers.d/fleet.conf
  else
    useradd --system --home-dir "$DATA_DIR" --no-create-home --shell /usr/sbin/nologin fleet
  fi
fi

# ---- 3. settings: kept when they are there ---------------------------------------------------
# A value of the environment file (NAME=value lines, as systemd reads them).
setting() { [ -f "$ENV_FILE" ] && sed -n "s/^$1=//p" "$ENV_FILE" | tail -n1 || true; }
random() { "$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(int(__import__("sys").argv[1])))' "$1"; }
DB_URL=$(setting FLEET_DATABASE_URL)
if [ -z "$DB_URL" ]; then
  DB_URL="postgres://$DATABASE:$(random 24)@$DB_HOST:5432/$DATABASE"
fi
DB_PASSWORD=$(sed -n 's|^postgres://[^:]*:\([^@]*\)@.*|\1|p' <<<"$DB_URL")

# ---- 4. PostgreSQL: the role and the database ------------------------------------------------
pg() {
  if [ -n "$PG_ADMIN_URL" ]; then
    psql "$PG_ADMIN_URL" -v ON_ERROR_STOP=1 -qtA "$@"
  else
    (cd / && setpriv --reuid=postgres --regid=postgres --init-groups psql -v ON_ERROR_STOP=1 -qtA "$@")
  fi
}
if [ "$SYSTEMD" = 1 ] || [ -n "$PG_ADMIN_URL" ]; then
  for _ in $(seq 30); do pg -c 'SELECT 1' >/dev/null 2>&1 && break; sleep 1; done
fi
step "PostgreSQL: role and database $DATABASE"
if [ "$(pg -c "SELECT 1 FROM pg_roles WHERE rolname='$DATABASE'")" != 1 ]; then
  pg -c "CREATE ROLE $DATABASE LOGIN"
fi
# The password is the environment file's: set again on every run (a no-op when unchanged).
pg -c "ALTER ROLE $DATABASE LOGIN PASSWORD '$DB_PASSWORD'" >/dev/null
if [ "$(pg -c "SELECT 1 FROM pg_database WHERE datname='$DATABASE'")" != 1 ]; then
  pg -c "CREATE DATABASE $DATABASE OWNER $DATABASE"
fi

# ---- 5. Redis --------------------------------------------------------------------------------
if [ -z "$REDIS_URL" ]; then
  REDIS_URL=$(setting FLEET_REDIS_URL)
fi
if [ -z "$REDIS_URL" ]; then
  # Redis is trusted (docs/install.md, "Redis"): the local one gets a password.
  conf=/etc/redis/redis.conf
  password=$(sed -n 's/^requirepass \(.*\)/\1/p' "$conf" | tail -n1)
  if [ -z "$password" ]; then
    step "Redis: requirepass in $conf"
    password=$(random 24 | tr -d -- '-_')
    printf '\n# Set by Fleet'"'"'s deploy/install.sh\nrequirepass %s\n' "$password" >>"$conf"
    [ "$SYSTEMD" = 1 ] && systemctl restart redis-server
  fi
  REDIS_URL="redis://:$password@127.0.0.1:6379/0"
fi

# ---- 6. the environment file ----------------------------------------------------------------
install -d -m 0755 "$ETC"
if [ ! -f "$ENV_FILE" ]; then
  step "settings: $ENV_FILE (new keys)"
  origin=https://$HOSTNAME_
  [ "$HTTPS_PORT" = 443 ] || origin=$origin:$HTTPS_PORT
  secret=$(random 50)
  fernet=$("$PYTHON" -c 'import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())')
  umask 077
  sed -e "s|^FLEET_SECRET_KEY=.*|FLEET_SECRET_KEY=$secret|" \
    -e "s|^FLEET_SECRETS_KEY=.*|FLEET_SECRETS_KEY=$fernet|" \
    -e "s|^FLEET_DATABASE_URL=.*|FLEET_DATABASE_URL=$DB_URL|" \
    -e "s|^FLEET_REDIS_URL=.*|FLEET_REDIS_URL=$REDIS_URL|" \
    -e "s|^FLEET_ALLOWED_HOSTS=.*|FLEET_ALLOWED_HOSTS=$HOSTNAME_|" \
    -e "s|^FLEET_CSRF_TRUSTED_ORIGINS=.*|FLEET_CSRF_TRUSTED_ORIGINS=$origin|" \
    -e "s|^FLEET_DATA_DIR=.*|FLEET_DATA_DIR=$DATA_DIR|" \
    "$SOURCE/deploy/systemd/fleet.env.example" >"$ENV_FILE.new"
  umask 022
  chmod 0600 "$ENV_FILE.new"
  mv "$ENV_FILE.new" "$ENV_FILE"
else
  step "settings: $ENV_FILE kept"
fi
chmod 0600 "$ENV_FILE"
chown root:root "$ENV_FILE"

# ---- 7. the release and its virtual environment ---------------------------------------------
step "release: $PREFIX/src, $PREFIX/venv"
install -d -m 0755 "$PREFIX"
if [ "$SOURCE" != "$PREFIX/src" ]; then
  rm -rf "$PREFIX/src.new"
  mkdir -p "$PREFIX/src.new"
  tar -C "$SOURCE" --exclude=./.git --exclude=./.venv --exclude=./node_modules --exclude=./var \
    --exclude=./site --exclude=./build --exclude='*.egg-info' --exclude=__pycache__ -cf - . |
    tar -C "$PREFIX/src.new" -xf -
  chmod -R u=rwX,go=rX "$PREFIX/src.new"
  rm -rf "$PREFIX/src.old"
  [ -d "$PREFIX/src" ] && mv "$PREFIX/src" "$PREFIX/src.old"
  mv "$PREFIX/src.new" "$PREFIX/src"
  rm -rf "$PREFIX/src.old"
fi
[ -x "$PREFIX/venv/bin/python" ] || "$PYTHON" -m venv "$PREFIX/venv"
# A wheel of this tree (templates and static files inside: setup.py) and its dependencies. On a
# rerun, Fleet alone first: when `pip check` then finds every requirement met, the dependency
# resolution (the slow part) is skipped.
pip=("$PREFIX/venv/bin/pip" --quiet --disable-pip-version-check)
if ! { "${pip[@]}" show fleet >/dev/null 2>&1 && "${pip[@]}" install --no-deps "$PREFIX/src" &&
  "${pip[@]}" check >/dev/null 2>&1; }; then
  "${pip[@]}" install "$PREFIX/src"
fi
chmod -R go+rX "$PREFIX/venv"

# ---- 8. the units ------------------------------------------------------------------------------
step "units: $UNIT_DIR"
install -d -m 0755 "$UNIT_DIR"
for unit in "$SOURCE"/deploy/systemd/*.service "$SOURCE"/deploy/systemd/fleet.target; do
  sed -e "s|/opt/fleet/|$PREFIX/|g" -e "s|/etc/fleet/fleet.env|$ENV_FILE|g" \
    -e "s|/var/lib/fleet|$STATE_ROOT/fleet|g" "$unit" >"$UNIT_DIR/$(basename "$unit").new"
  chmod 0644 "$UNIT_DIR/$(basename "$unit").new"
  mv "$UNIT_DIR/$(basename "$unit").new" "$UNIT_DIR/$(basename "$unit")"
done

# ---- 9. the proxy ----------------------------------------------------------------------------
step "proxy: $PROXY, $PROXY_CONFIG"
install -d -m 0755 "$(dirname "$PROXY_CONFIG")"
upstreams=$(printf '127.0.0.1:%s ' "${PORTS[@]}")
if [ "$PROXY" = caddy ]; then
  site=$HOSTNAME_
  [ "$HTTPS_PORT" = 443 ] || site=https://$HOSTNAME_:$HTTPS_PORT
  {
    if [ "$HTTP_PORT" != 80 ] || [ "$HTTPS_PORT" != 443 ] || [ "$TLS_INTERNAL" = 1 ]; then
      printf '# Written by deploy/install.sh\n{\n'
      [ "$HTTP_PORT" = 80 ] || printf '\thttp_port %s\n' "$HTTP_PORT"
      [ "$HTTPS_PORT" = 443 ] || printf '\thttps_port %s\n' "$HTTPS_PORT"
      # Caddy's own CA stays Caddy's: not added to this machine's trust store.
      [ "$TLS_INTERNAL" = 0 ] || printf '\tskip_install_trust\n'
      printf '}\n\n'
    fi
    sed -e "s|^fleet.example.com {|$site {|" \
      -e "s|reverse_proxy 127.0.0.1:8001 127.0.0.1:8002 {|reverse_proxy ${upstreams% } {|" \
      -e "s|/var/lib/fleet/static|$DATA_DIR/static|" "$SOURCE/deploy/caddy/Caddyfile" |
      if [ "$TLS_INTERNAL" = 1 ]; then
        sed "s|^\tencode zstd gzip|\ttls internal\n\tencode zstd gzip|"
      else cat; fi
  } >"$PROXY_CONFIG.new"
else
  servers=$(printf '    server 127.0.0.1:%s max_fails=3 fail_timeout=10s;\\n' "${PORTS[@]}")
  sed -e "s|fleet.example.com|$HOSTNAME_|" -e "/^    server 127.0.0.1:8002 /d" \
    -e "s|^    server 127.0.0.1:8001 .*|${servers%\\n}|" \
    -e "s|listen 80;|listen $HTTP_PORT;|; s|listen \[::\]:80;|listen [::]:$HTTP_PORT;|" \
    -e "s|listen 443 ssl|listen $HTTPS_PORT ssl|; s|listen \[::\]:443 ssl|listen [::]:$HTTPS_PORT ssl|" \
    -e "s|/var/lib/fleet/static/|$DATA_DIR/static/|" "$SOURCE/deploy/nginx/fleet.conf" >"$PROXY_CONFIG.new"
  if [ ! -f /etc/ssl/fleet/fullchain.pem ]; then
    # A self-signed certificate until the real one is put there (docs/install.md).
    install -d -m 0755 /etc/ssl/fleet
    openssl req -x509 -newkey rsa:2048 -nodes -days 365 -subj "/CN=$HOSTNAME_" \
      -keyout /etc/ssl/fleet/privkey.pem -out /etc/ssl/fleet/fullchain.pem >/dev/null 2>&1
    chmod 0600 /etc/ssl/fleet/privkey.pem
  fi
fi
mv "$PROXY_CONFIG.new" "$PROXY_CONFIG"
chmod 0644 "$PROXY_CONFIG"
if [ "$PROXY" = nginx ] && [ -d /etc/nginx/sites-enabled ] &&
  [ "$PROXY_CONFIG" = /etc/nginx/sites-available/fleet.conf ]; then
  ln -sf "$PROXY_CONFIG" /etc/nginx/sites-enabled/fleet.conf
  rm -f /etc/nginx/sites-enabled/default
fi

# ---- 10. migrations, static files, the admin ---------------------------------------------------
install -d -m 0755 -o fleet -g fleet "$DATA_DIR"
# fleet-manage: manage.py as the fleet user with the units' environment (root runs it: it
# reads the 0600 settings file), for the operator too: `fleet-manage create_api_token admin`.
install -d -m 0755 "$BIN_DIR"
cat >"$BIN_DIR/fleet-manage.new" <<EOF
#!/usr/bin/env bash
# Written by Fleet's deploy/install.sh: manage.py as the fleet user, with the settings of
# $ENV_FILE (NAME=value lines, as systemd reads them), run as root.
set -euo pipefail
[ "\$(id -u)" = 0 ] || { echo "fleet-manage: run it as root (sudo fleet-manage ...)" >&2; exit 2; }
vars=()
while IFS= read -r line; do
  case \$line in '' | '#'*) ;; *) vars+=("\$line") ;; esac
done <"$ENV_FILE"
cd "$PREFIX/src"
exec env -i PATH=/usr/bin:/bin HOME="$DATA_DIR" PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$PREFIX/src" \\
  "\${vars[@]}" setpriv --reuid=fleet --regid=fleet --init-groups \\
  "$PREFIX/venv/bin/python" "$PREFIX/src/manage.py" "\$@"
EOF
chmod 0755 "$BIN_DIR/fleet-manage.new"
mv "$BIN_DIR/fleet-manage.new" "$BIN_DIR/fleet-manage"
manage() { "$BIN_DIR/fleet-manage" "$@"; }
step "migrations and static files"
manage migrate --noinput -v0
manage collectstatic --noinput -v0
exists=$(manage shell --no-imports -v 0 -c "from django.contrib.auth import get_user_model as m; \
print(m().objects.filter(username='$ADMIN').exists())")
if [ "$exists" = False ]; then
  password=$(random 18)
  manage shell --no-imports -v 0 -c "from fleet.core.roles import Role; from fleet.core.services import user_create; \
user_create(username='$ADMIN', password='$password', role=Role.ADMIN)"
  login="user $ADMIN, password $password (shown once: change it on the Account page)"
else
  login="user $ADMIN exists, password unchanged (reset: fleet-manage changepassword $ADMIN)"
fi

# ---- 11. enable and start ----------------------------------------------------------------------
if [ "$SYSTEMD" = 1 ]; then
  step "systemctl: fleet.target, fleet-web@{${WEB_PORTS}}, $PROXY"
  systemctl daemon-reload
  webs=()
  for port in "${PORTS[@]}"; do webs+=("fleet-web@$port.service"); done
  systemctl enable --quiet fleet.target fleet-worker.service fleet-beat.service "${webs[@]}"
  systemctl restart fleet.target "${webs[@]}"
  if [ "$PROXY" = nginx ]; then nginx -t -q && systemctl reload-or-restart nginx; fi
  [ "$PROXY" = caddy ] && systemctl reload-or-restart caddy
  # The login works once the web instances listen (Django loads first: seconds, more on a busy
  # machine); until then the proxy answers 502.
  for port in "${PORTS[@]}"; do
    for _ in $(seq 120); do
      (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
      sleep 1
    done
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null ||
      echo "install.sh: fleet-web@$port does not listen yet: journalctl -u fleet-web@$port" >&2
  done
else
  step "no systemd here: units written, nothing started"
fi

url=https://$HOSTNAME_
[ "$HTTPS_PORT" = 443 ] || url=$url:$HTTPS_PORT
cat <<EOF

Fleet is installed.
  dashboard: $url/
  admin login: $login
  settings: $ENV_FILE; units: $UNIT_DIR; release: $PREFIX
  manage.py: $BIN_DIR/fleet-manage (as root), e.g. fleet-manage create_api_token $ADMIN
  next: enrol a GPU host (README, "Install").
EOF
