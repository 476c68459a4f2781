#!/usr/bin/env bash
# The README's "Install", timed on a fresh Debian 12 server (docs/install.md, "The timed
# install"): not part of CI (it takes minutes of apt and pip from the network). As root, with
# dockerd and debootstrap:
#   tests/deploy/timed_install.sh [GIT-URL-OR-PATH]     (default: a bare clone of this checkout's HEAD)
# The server: a Debian 12 root filesystem from debootstrap (minbase plus systemd, sudo, curl,
# ca-certificates: a netinst's "standard" minus the rest), cached in /var/cache/fleet-ci,
# imported into Docker and booted with systemd as PID 1 on a network of its own (NAT to the
# internet: its PostgreSQL, Redis and Caddy take their usual ports without clashing with this
# machine's). The commands run in it are the README's, in its order; the only others are
# marked ENVIRONMENT below. Prints each step's time and the total.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
NAME=fleet-install-srv
HOST=fleet-install-test
NET=fleet-install-net
SUBNET=172.30.42.0/24
CACHE=/var/cache/fleet-ci/debian-bookworm-server.tar
IMAGE=fleet-ci/debian-server:bookworm
WORK=$(mktemp -d /tmp/fleet-timed.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
if [ $# -gt 0 ]; then REPO=$1; else
  git clone -q --bare "$ROOT" "$WORK/fleet.git"
  REPO=$WORK/fleet.git
fi
if ! docker image inspect "$IMAGE" >/dev/null 2>&1; then
  if [ ! -s "$CACHE" ]; then
    rootfs=$WORK/rootfs
    debootstrap --variant=minbase \
      --include=systemd-sysv,dbus,iproute2,ca-certificates,sudo,curl,procps \
      bookworm "$rootfs" http://deb.debian.org/debian >/dev/null
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    mkdir -p "$(dirname "$CACHE")"
    tar -C "$rootfs" -cf "$CACHE.new" . && mv "$CACHE.new" "$CACHE"
  fi
  docker import -c 'CMD ["/sbin/init"]' "$CACHE" "$IMAGE" >/dev/null
fi
docker network inspect "$NET" >/dev/null 2>&1 || docker network create --subnet "$SUBNET" "$NET" >/dev/null
iptables -t nat -C POSTROUTING -s "$SUBNET" ! -d "$SUBNET" -j MASQUERADE 2>/dev/null ||
  iptables -t nat -A POSTROUTING -s "$SUBNET" ! -d "$SUBNET" -j MASQUERADE
docker rm -f "$NAME" >/dev/null 2>&1 || true
dns=$(sed -n 's/^nameserver \([0-9.]*\)$/\1/p' /etc/resolv.conf | head -n1)
docker run -d --name "$NAME" --hostname "$HOST" --cap-add SYS_ADMIN \
  --security-opt seccomp=unconfined --security-opt apparmor=unconfined --network "$NET" \
  ${dns:+--dns "$dns"} --tmpfs /run --tmpfs /run/lock -v /sys/fs/cgroup:/sys/fs/cgroup:ro \
  -v "$REPO:/srv/fleet.git:ro" -e FLEET_REPOSITORY=/srv/fleet.git "$IMAGE" /sbin/init >/dev/null
for _ in $(seq 60); do
  state=$(docker exec "$NAME" systemctl is-system-running 2>/dev/null || true)
  case $state in running | degraded) break ;; esac
  sleep 1
done
on() { docker exec "$NAME" bash -euo pipefail -c "$1"; }
# ENVIRONMENT: this machine's TLS-inspecting egress, if any (a server behind such a proxy
# trusts its CA already), and Redis's PrivateUsers=, which needs a user namespace Docker
# does not give (on a real server Debian's unit runs as is).
for ca in /usr/local/share/ca-certificates/*.crt; do
  [ -e "$ca" ] && docker cp "$ca" "$NAME:/usr/local/share/ca-certificates/"
done
on 'update-ca-certificates >/dev/null
mkdir -p /etc/systemd/system/redis-server.service.d
printf "[Service]\nPrivateUsers=false\n" >/etc/systemd/system/redis-server.service.d/container.conf'

started=$(date +%s)
mark() { echo "$(date -u +%T) +$(($(date +%s) - started)) s: $*"; }
CA=/var/lib/caddy/.local/share/caddy/pki/authorities/local/root.crt
mark "1. the server"
on 'apt-get update -qq && apt-get install -y -qq git >/dev/null'
on 'git clone -q "$FLEET_REPOSITORY" /root/fleet'
on "/root/fleet/deploy/install.sh --hostname $HOST --tls-internal" | tee "$WORK/install.log"
password=$(sed -n 's/.*admin login: user admin, password \([^ ]*\) .*/\1/p' "$WORK/install.log")
mark "   signed in?"
# Sign in as a browser does: the login form, its CSRF cookie and field, the Referer.
signin() {
  on "jar=\$(mktemp); base=https://$HOST
page=\$(curl -fsS --cacert $CA -c \$jar -b \$jar \$base/login/)
csrf=\$(sed -n 's/.*name=\"csrfmiddlewaretoken\" value=\"\\([^\"]*\\)\".*/\\1/p' <<<\"\$page\" | head -n1)
curl -fsS --cacert $CA -c \$jar -b \$jar -o /dev/null -H \"Referer: \$base/login/\" \
  --data-urlencode username=admin --data-urlencode 'password=$password' \
  --data-urlencode csrfmiddlewaretoken=\$csrf \$base/login/
grep -q sessionid \$jar && curl -fsS --cacert $CA -b \$jar \$base/hosts/"
}
signin >/dev/null && mark "   signed in: the dashboard answers with the admin's session"
mark "2. a host in Fleet"
token=$(on "TOKEN=\$(fleet-manage create_api_token admin)
curl -fsS https://$HOST/api/v1/hosts/ -H \"Authorization: Token \$TOKEN\" \
  -H 'Content-Type: application/json' -d '{\"name\": \"gpu-1\"}' --cacert $CA" |
  sed -n 's/.*"enrollment_token":"\([^"]*\)".*/\1/p')
[ -n "$token" ]
mark "3. the agent (simulated A30, on the server itself)"
on "cp $CA /usr/local/share/ca-certificates/fleet.crt && update-ca-certificates >/dev/null
fleet-manage simulated_gpus a30-24gb > /root/gpus.json
/root/fleet/hostagent/packaging/install.sh --server https://$HOST --token $token --allow-mutation --set FLEET_AGENT_SIMULATE=/root/gpus.json"
for _ in $(seq 120); do
  page=$(signin) && grep -q "NVIDIA A30" <<<"$page" && grep -q gpu-1 <<<"$page" && break
  sleep 1
done
grep -q "NVIDIA A30" <<<"$page"
mark "done: signed in, gpu-1 and its A30 on the Hosts page"
echo "total: $(($(date +%s) - started)) s"
