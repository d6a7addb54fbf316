"""The pipeline's image references and the git revision that names them, shared by `make push-images` and
`asyncrl pipeline compile|upload|run`.

`make images` / `make push-images` tag the three images `<REGISTRY>asyncrl-<name>:<TAG>`, TAG defaulting to
`git rev-parse --short HEAD`; `asyncrl pipeline compile --registry R --tag T` writes the same references as the
image parameters' defaults (T defaulting to the same command), so a pipeline compiled or uploaded from a checkout
runs the images pushed from it. The committed YAML is compiled with the documented committed flags (no registry,
tag `dev`: `make images TAG=dev` builds exactly those), so the test that it is current does not depend on the
revision. Nothing here imports kfp.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

IMAGE_NAMES = ("generation", "training", "light")
COMMITTED_REGISTRY = ""
COMMITTED_TAG = "dev"
REPO_ROOT = Path(__file__).resolve().parents[3]
GIT_TIMEOUT_S = 30.0


class RevisionError(RuntimeError):
    """No git revision could be read (not a checkout, or git missing); the message says what to pass instead."""


def registry_prefix(registry: str) -> str:
    """`registry.example.com/team` or `.../team/` -> `registry.example.com/team/`; empty stays empty."""
    registry = registry.strip()
    return f"{registry.rstrip('/')}/" if registry else ""


def image_refs(registry: str, tag: str) -> dict[str, str]:
    """The pipeline's image parameters -> `<registry>/asyncrl-<name>:<tag>` (what `make push-images` pushes)."""
    tag = tag.strip()
    if not tag or any(c in tag for c in " /:@") or len(tag) > 128:
        raise ValueError(f"--tag: expected a Docker image tag (letters, digits, '_', '.', '-'), got {tag!r}")
    prefix = registry_prefix(registry)
    return {f"{name}_image": f"{prefix}asyncrl-{name}:{tag}" for name in IMAGE_NAMES}


def _git(*args: str, cwd: Path = REPO_ROOT) -> str:
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise RevisionError(f"cannot run git in {cwd}: {err}") from None
    if proc.returncode != 0:
        raise RevisionError(f"`git {' '.join(args)}` failed in {cwd}: {proc.stderr.strip()[:300]}")
    return proc.stdout.strip()


def git_short_revision(cwd: Path = REPO_ROOT) -> str:
    """`git rev-parse --short HEAD`: the default image tag, exactly the Makefile's TAG."""
    return _git("rev-parse", "--short", "HEAD", cwd=cwd)


def git_is_dirty(cwd: Path = REPO_ROOT) -> bool:
    """True when tracked files differ from HEAD (what is compiled is then not exactly the revision)."""
    return bool(_git("status", "--porcelain", "--untracked-files=no", cwd=cwd))


def version_name(cwd: Path = REPO_ROOT) -> str:
    """The pipeline version a checkout uploads: `git-<short sha>`, with `-dirty` when tracked files changed."""
    return f"git-{git_short_revision(cwd)}{'-dirty' if git_is_dirty(cwd) else ''}"
