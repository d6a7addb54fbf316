"""The sandbox pool's pod seccomp profile (manifests/sandbox/seccomp/asyncrl-sandbox.json): the shipped file is the
one `asyncrl.sandbox.pod_profile` builds, its syscall numbers are this kernel's, and a tool call works under the
same deny list (compiled to BPF by our own builder and installed on the process that runs the sandbox), while the
calls it refuses fail with EPERM."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.sandbox.pod_profile import POD_DENIED, PROFILE_PATH, profile, profile_text

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
UNISTD = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")

UNDER_PROFILE = r'''
import asyncio, ctypes, os
from asyncrl.sandbox.pod_profile import build_pod_filter
from asyncrl.sandbox.runner import SECCOMP_INSTALL, run_python
exec(SECCOMP_INSTALL)
_seccomp(build_pod_filter().hex())
libc = ctypes.CDLL(None, use_errno=True)
for name, nr in (("keyctl", 250), ("bpf", 321), ("ptrace", 101), ("kcmp", 312)):
    ctypes.set_errno(0)
    print(name, libc.syscall(nr, 0, 0, 0, 0, 0), ctypes.get_errno())
r = asyncio.run(run_python("import os\nprint(6 * 7, os.getuid())", timeout_s=10))
print("tool", r.stdout.strip(), r.exit_code)
'''


def test_shipped_profile_is_the_built_one() -> None:
    assert (ROOT / PROFILE_PATH).read_text() == profile_text()
    doc = json.loads(profile_text())
    assert doc["defaultAction"] == "SCMP_ACT_ALLOW" and doc == profile()
    (rule,) = doc["syscalls"]
    assert rule["action"] == "SCMP_ACT_ERRNO" and set(rule["names"]) == set(POD_DENIED)
    assert not {"unshare", "mount", "pivot_root", "clone", "setns", "umount2"} & set(rule["names"])  # bwrap's own


@pytest.mark.skipif(not UNISTD.is_file(), reason="no kernel headers to compare the numbers with")
def test_syscall_numbers_are_the_kernels() -> None:
    table = {m[1]: int(m[2]) for m in re.finditer(r"#define __NR_(\w+) (\d+)", UNISTD.read_text())}
    assert {k: v for k, v in POD_DENIED.items() if table.get(k) != v} == {}


def test_a_tool_call_works_under_the_pod_profile_and_refused_calls_fail() -> None:
    r = subprocess.run([sys.executable, "-c", UNDER_PROFILE], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    for name in ("keyctl", "bpf", "ptrace", "kcmp"):
        assert lines[name] == "-1 1", f"{name}: {lines[name]} (expected -1, EPERM)"
    assert lines["tool"] == "42 65534 0", r.stdout
