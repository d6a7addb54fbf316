#!/usr/bin/env bash
# Fills docker/wheelhouse/ with every package the images install, pinned, for builds whose RUN steps reach no index
# (`make images WHEELHOUSE=1`): the host's pip downloads them with its own index and certificates.
#   scripts/wheelhouse.sh [PYTHON]    # PYTHON: the interpreter whose pip downloads (default .venv/bin/python)
# The wheels match the images' Python (3.11, x86-64 Linux). Files already there are kept.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
OUT=docker/wheelhouse
# The CUDA torch of PyPI is not fetched here: the wheelhouse serves the CPU variant (make images VARIANT=cpu).
# (pip's notes about index locations of this machine's own configuration are dropped from the output)
quiet() { grep -v "is ignored: it is neither a file nor a directory" >&2 || true; }
"$PY" -m pip download -q --no-deps -d "$OUT" setuptools==84.2.1 wheel==0.48.0 torch==2.13.0+cpu 2> >(quiet)
"$PY" -m pip download -q --no-deps -d "$OUT" -r requirements.lock 2> >(quiet)
echo "$OUT: $(find "$OUT" -maxdepth 1 -type f ! -name README.md ! -name .gitignore | wc -l) files, $(du -sh "$OUT" | cut -f1)"
