"""The seccomp filter on its own, without namespaces or the audit hook: a plain interpreter installs it exactly as
the sandbox's bootstrap does, then makes raw system calls through libc. Each refused call must fail with EPERM
(clone3 with ENOSYS), and what a tool needs (threads, files, memory, time) must keep working."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from asyncrl.sandbox.runner import SECCOMP_INSTALL
from asyncrl.sandbox.seccomp import X86_64_DENIED, build_filter

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="seccomp is Linux only")

PROGRAM = SECCOMP_INSTALL + r'''
import ctypes, json, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
_seccomp(sys.argv[1])
calls = json.loads(sys.argv[2])
result = {}
for name, nr in calls.items():
    args = {"kill": [os.getppid(), 0], "clone": [0x11, 0, 0, 0, 0], "clone3": [0, 0]}.get(name, [0, 0, 0])
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if rc == 0 and name in ("fork", "vfork", "clone"):
        os._exit(0)  # a child made it: leave the parent to report
    result[name] = [rc, ctypes.get_errno()]
box = []
t = threading.Thread(target=box.append, args=(1,)); t.start(); t.join()
open("/dev/null", "w").write("x")
result["thread"], result["pid"] = box, os.getpid()
print(json.dumps(result))
'''


def test_refused_calls_fail_and_a_tool_still_works() -> None:
    calls = {**X86_64_DENIED, "clone": 56, "clone3": 435}
    r = subprocess.run([sys.executable, "-I", "-S", "-c", PROGRAM, build_filter().hex(), json.dumps(calls)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result.pop("thread") == [1]
    result.pop("pid")
    wrong = {n: v for n, v in result.items() if v != [-1, 38 if n == "clone3" else 1]}
    assert not wrong, wrong  # [rc, errno]: EPERM (1) everywhere, ENOSYS (38) for clone3


def test_other_architectures_are_refused_not_filtered_wrongly() -> None:
    with pytest.raises(ValueError, match="aarch64"):
        build_filter("aarch64")
    assert len(build_filter("x86_64")) % 8 == 0
