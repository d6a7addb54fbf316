#!/usr/bin/env bash
# Pin the Dockerfiles' base images by digest: ask the registry for the digest of every tag in
# docker/base-images.lock, write it there and into the FROM lines of docker/*.Dockerfile.
#
#   scripts/refresh-base-digests.sh            # refresh: rewrites the lock and the FROM lines
#   scripts/refresh-base-digests.sh --check    # compare only: exit 1 when the registry differs from the lock
#
# Needs `crane` (github.com/google/go-containerregistry) or Docker with buildx, and access to the registries
# (Docker Hub). CRANE / DOCKER name other binaries (e.g. DOCKER=podman is not enough: buildx imagetools is needed).
# The digest is the tag's multi-architecture index digest (what `docker pull tag` resolves first), so a pinned
# FROM line still builds on every platform the tag supports. Every registry call has a deadline (TIMEOUT_S, 120 s).
# Nothing is written unless every tag resolved to a well-formed digest.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LOCK="$ROOT/docker/base-images.lock"
CRANE="${CRANE:-crane}"
DOCKER="${DOCKER:-docker}"
TIMEOUT_S="${TIMEOUT_S:-120}"
MODE=refresh

usage() { sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

case "${1:-}" in
  "") ;;
  --check) MODE=check ;;
  -h | --help) usage; exit 0 ;;
  *) echo "refresh-base-digests: unknown argument '$1' (expected --check or nothing)" >&2; exit 2 ;;
esac

if command -v "$CRANE" >/dev/null 2>&1; then
  digest_of() { timeout "$TIMEOUT_S" "$CRANE" digest "$1"; }
elif command -v "$DOCKER" >/dev/null 2>&1 && "$DOCKER" buildx version >/dev/null 2>&1; then
  digest_of() { timeout "$TIMEOUT_S" "$DOCKER" buildx imagetools inspect --format '{{.Manifest.Digest}}' "$1"; }
else
  echo "refresh-base-digests: neither '$CRANE' nor '$DOCKER buildx' is available: install crane" \
       "(go install github.com/google/go-containerregistry/cmd/crane@latest) or Docker with buildx" >&2
  exit 2
fi

[[ -f "$LOCK" ]] || { echo "refresh-base-digests: $LOCK: no such file" >&2; exit 2; }

declare -A NEW=()
declare -a IMAGES=()
changed=0
while read -r image pinned _; do
  [[ -z "$image" || "$image" == \#* ]] && continue
  if ! digest="$(digest_of "$image")"; then
    echo "refresh-base-digests: $image: the registry gave no digest (network, credentials or an unknown tag)" >&2
    exit 1
  fi
  digest="$(printf '%s' "$digest" | tr -d '[:space:]')"
  if [[ ! "$digest" =~ ^sha256:[0-9a-f]{64}$ ]]; then
    echo "refresh-base-digests: $image: expected a digest sha256:<64 hex>, got '$digest'" >&2
    exit 1
  fi
  IMAGES+=("$image")
  NEW[$image]="$digest"
  if [[ "$pinned" != "$digest" ]]; then
    echo "$image: $pinned -> $digest"
    changed=1
  else
    echo "$image: $digest (unchanged)"
  fi
done <"$LOCK"

if [[ "$MODE" == check ]]; then
  exit "$changed"
fi

# The lock: comments kept, each entry's second field replaced.
tmp="$(mktemp "$LOCK.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
while IFS= read -r line; do
  read -r image _ <<<"$line" || true
  if [[ -n "${image:-}" && "$image" != \#* && -n "${NEW[$image]:-}" ]]; then
    printf '%s %s\n' "$image" "${NEW[$image]}"
  else
    printf '%s\n' "$line"
  fi
done <"$LOCK" >"$tmp"
mv "$tmp" "$LOCK"
trap - EXIT

# The FROM lines: `FROM <image>[@sha256:...]` -> `FROM <image>@<digest>`, the rest of the line kept.
for image in "${IMAGES[@]}"; do
  pattern="$(printf '%s' "$image" | sed 's/[][\.*^$/]/\\&/g')"
  for dockerfile in "$ROOT"/docker/*.Dockerfile; do
    sed -i -E "s#^(FROM[[:space:]]+(--[^[:space:]]+[[:space:]]+)*)${pattern}(@sha256:[0-9a-f]{64})?([[:space:]]|\$)#\\1${image}@${NEW[$image]}\\4#" \
      "$dockerfile"
  done
done
echo "wrote $LOCK and the FROM lines of docker/*.Dockerfile; run: .venv/bin/python -m pytest -q tests/unit/test_base_images.py"
