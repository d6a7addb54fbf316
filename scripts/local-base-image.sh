#!/usr/bin/env bash
# Builds the images' Python base without a registry: Debian bookworm (whose python3 is 3.11) by debootstrap,
# imported as one layer. For machines that reach Debian's mirror but not Docker Hub.
#   scripts/local-base-image.sh [TAG]     # default local/python:3.11-bookworm; prints the tag
# Needs root, debootstrap and a Docker daemon (DOCKER_HOST as scripts/container-runtime.sh prints it).
# Reuses an image already there; set ASYNCRL_REBUILD_BASE=1 to make it again.
set -euo pipefail
TAG=${1:-local/python:3.11-bookworm}
DOCKER=${DOCKER:-docker}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if [[ -z "${ASYNCRL_REBUILD_BASE:-}" ]] && $DOCKER image inspect "$TAG" >/dev/null 2>&1; then
  echo "$TAG"; exit 0
fi
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
echo "local-base-image: debootstrap bookworm into $root (about a minute)" >&2
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,procps bookworm "$root" "$MIRROR" >/dev/null
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
# The images call `python` as well as `python3` (the official python images have both).
ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
tar -C "$root" -c . | $DOCKER import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' - "$TAG" >/dev/null
echo "$TAG"
