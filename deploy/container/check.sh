#!/usr/bin/env bash
# Build Fleet's image and run its smoke test (`make check-image`; .ci/run starts it in the
# background while the test stages run). This machine pulls no image: the base is Debian's own
# packages (debootstrap --variant=minbase, Python 3 and venv), imported into Docker with
# `docker import`; its root filesystem is cached as a tarball under /var/cache/fleet-ci, keyed
# by the Debian release, and the imported image is reused while it exists. Then `docker build`
# with the host's network (pip reaches PyPI; dockerd here has no bridge) and
# tests/deploy/test_image.py: migrate, web and worker against this machine's PostgreSQL and
# Redis, with the host's network. Needs root, dockerd, debootstrap (installed when missing).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
RELEASE=${FLEET_DEBIAN_RELEASE:-bookworm}
MIRROR=${FLEET_DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=/var/cache/fleet-ci/debian-$RELEASE-python.tar
BASE=fleet-ci/debian-python:$RELEASE
IMAGE=${FLEET_IMAGE:-fleet:ci}
started=$(date +%s)
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  if [ ! -s "$CACHE" ]; then
    command -v debootstrap >/dev/null ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
    rootfs=$(mktemp -d /tmp/fleet-rootfs.XXXXXX)
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      "$RELEASE" "$rootfs" "$MIRROR" >/dev/null
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    # The base trusts what this machine trusts (pip in the build reaches PyPI through the same
    # network, TLS-inspecting proxy included, if any).
    cp /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
    mkdir -p "$(dirname "$CACHE")"
    tar -C "$rootfs" -cf "$CACHE.new" . && mv "$CACHE.new" "$CACHE"
  fi
  docker import "$CACHE" "$BASE" >/dev/null
fi
echo "check-image: base $BASE ready after $(($(date +%s) - started)) s"
docker build --quiet --force-rm --network host --build-arg "BASE=$BASE" \
  --build-arg PIP_CERT=/etc/ssl/certs/ca-certificates.crt -f Dockerfile \
  -t "$IMAGE" . >/dev/null
echo "check-image: $IMAGE built after $(($(date +%s) - started)) s"
FLEET_IMAGE=$IMAGE "${PYTHON:-.venv/bin/python}" -m pytest -p no:cacheprovider -n 0 -q \
  tests/deploy/test_image.py
echo "check-image: ok after $(($(date +%s) - started)) s"
