#!/usr/bin/env bash
# Install the Fleet host agent on a GPU host, as root, from this checkout (or an unpacked
# release): a virtual environment holding `pip install ./hostagent` (no Django), the units
# fleet-agent.service and fleet-workloads.service, and /etc/fleet-agent/agent.env (0600) with
# the server and the one-time enrolment token. Idempotent: run it again to upgrade; the host
# token the agent earned (/var/lib/fleet-agent/state.json) and the settings file are kept
# (--token replaces the enrolment token in it).
#
#   sudo hostagent/packaging/install.sh --server https://fleet.example.com \
#     --token fle_... [--allow-mutation]
#
# Without --allow-mutation the agent only reports (GPUs, telemetry): it changes no MIG layout
# and no MPS setting and starts no workload. That is the operator's choice, made here once.
# Without systemd as PID 1 (a container, CI) nothing is enabled or started.
set -euo pipefail
SOURCE=$(cd "$(dirname "$0")/../.." && pwd)

usage() {
  cat <<EOF
usage: $0 --server URL [options]
  --server URL         the control plane, e.g. https://fleet.example.com
  --token TOKEN        the host's one-time enrolment token (or --token-file PATH)
  --allow-mutation     let the agent apply MIG layouts, MPS settings and workloads
  --set NAME=VALUE     another FLEET_AGENT_* setting for agent.env (repeatable)
  --prefix DIR         its virtual environment goes to DIR/venv (default: /opt/fleet-agent)
  --etc DIR            where agent.env goes (default: /etc/fleet-agent)
  --state-root DIR     the units' /var/lib (default: /var/lib)
  --unit-dir DIR       where the units go (default: /etc/systemd/system)
  --no-apt             install no package (python3-venv is there)
  --no-systemd         write the units but run no systemctl (automatic without systemd)
EOF
}

SERVER=
TOKEN=
MUTATION=0
EXTRA=()
PREFIX=/opt/fleet-agent
ETC=/etc/fleet-agent
STATE_ROOT=/var/lib
UNIT_DIR=/etc/systemd/system
APT=1
SYSTEMD=1
[ -d /run/systemd/system ] || SYSTEMD=0
PYTHON=${FLEET_PYTHON:-/usr/bin/python3}
while [ $# -gt 0 ]; do
  case $1 in
    --server) SERVER=$2; shift ;;
    --token) TOKEN=$2; shift ;;
    --token-file) TOKEN=$(tr -d '[:space:]' <"$2"); shift ;;
    --allow-mutation) MUTATION=1 ;;
    --set) [[ $2 =~ ^FLEET_AGENT_[A-Z_]+=[^[:space:]]*$ ]] ||
      { echo "install.sh: --set FLEET_AGENT_NAME=VALUE" >&2; exit 2; }
      EXTRA+=("$2"); shift ;;
    --prefix) PREFIX=$2; shift ;;
    --etc) ETC=$2; shift ;;
    --state-root) STATE_ROOT=$2; shift ;;
    --unit-dir) UNIT_DIR=$2; shift ;;
    --no-systemd) SYSTEMD=0 ;;
    --no-apt) APT=0 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "install.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "install.sh: run it as root" >&2; exit 2; }
ENV_FILE=$ETC/agent.env
[ -n "$SERVER" ] || [ -f "$ENV_FILE" ] || { echo "install.sh: --server URL" >&2; exit 2; }
step() { printf '==> %s\n' "$*"; }

# A fresh Debian or Ubuntu host has python3 but not its venv module.
if [ "$APT" = 1 ] && [ "$PYTHON" = /usr/bin/python3 ] && ! "$PYTHON" -c 'import ensurepip' 2>/dev/null; then
  step "apt-get install python3-venv"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
fi

step "agent: $PREFIX/venv"
install -d -m 0755 "$PREFIX"
[ -x "$PREFIX/venv/bin/python" ] || "$PYTHON" -m venv "$PREFIX/venv"
# A copy of the package: pip builds in a scratch directory, never in the checkout.
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
cp -r "$SOURCE/hostagent" "$build/hostagent"
"$PREFIX/venv/bin/pip" install --quiet --disable-pip-version-check "$build/hostagent"

step "settings: $ENV_FILE"
install -d -m 0700 "$ETC"
[ -f "$ENV_FILE" ] || install -m 0600 /dev/null "$ENV_FILE"
# NAME=VALUE replaces the line of NAME, or is appended.
put() {
  local name=${1%%=*}
  grep -v "^$name=" "$ENV_FILE" >"$ENV_FILE.new" || true
  printf '%s\n' "$1" >>"$ENV_FILE.new"
  chmod 0600 "$ENV_FILE.new"
  mv "$ENV_FILE.new" "$ENV_FILE"
}
[ -z "$SERVER" ] || put "FLEET_AGENT_SERVER=$SERVER"
[ -z "$TOKEN" ] || put "FLEET_AGENT_ENROLLMENT_TOKEN=$TOKEN"
put "FLEET_AGENT_ALLOW_MUTATION=$([ "$MUTATION" = 1 ] && echo true || echo false)"
for setting in "${EXTRA[@]}"; do put "$setting"; done
chown root:root "$ENV_FILE"

step "units: $UNIT_DIR"
install -d -m 0755 "$UNIT_DIR"
for unit in fleet-agent.service fleet-workloads.service; do
  # The unit's --allow-mutation is this script's choice, kept in agent.env.
  sed -e "s|/usr/local/bin/fleet-agent --allow-mutation|$PREFIX/venv/bin/fleet-agent|" \
    -e "s|/etc/fleet-agent/agent.env|$ENV_FILE|g" -e "s|/var/lib/fleet-agent|$STATE_ROOT/fleet-agent|g" \
    "$SOURCE/hostagent/packaging/$unit" >"$UNIT_DIR/$unit.new"
  chmod 0644 "$UNIT_DIR/$unit.new"
  mv "$UNIT_DIR/$unit.new" "$UNIT_DIR/$unit"
done

if [ "$SYSTEMD" = 1 ]; then
  step "systemctl enable --now fleet-agent"
  systemctl daemon-reload
  systemctl enable --quiet fleet-workloads.service fleet-agent.service
  systemctl start fleet-workloads.service
  systemctl restart fleet-agent.service
else
  step "no systemd here: units written, nothing started"
fi
echo
echo "The agent is installed: $PREFIX/venv/bin/fleet-agent, $ENV_FILE, $UNIT_DIR/fleet-agent.service."
[ "$MUTATION" = 1 ] || echo "It only reports: run this again with --allow-mutation to let it apply changes."
