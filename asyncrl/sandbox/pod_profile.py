"""The seccomp profile of the sandbox pool's pods on Kubernetes (a `Localhost` profile, libseccomp's JSON format).

Why a profile of our own: the container runtimes' default profile (`RuntimeDefault`) refuses `unshare` and `clone`
with namespace flags, `mount`, `pivot_root` and `setns` to a process without CAP_SYS_ADMIN, so bubblewrap cannot
build a tool call's namespaces there. This profile allows by default and refuses what neither the sandbox server,
bubblewrap nor a tool ever needs: the kernel's administration (modules, kexec, reboot, swap, clocks, accounting,
quotas, syslog, keyrings, bpf, perf), reaching into other processes (ptrace, process_vm_*, kcmp), file handles,
userfaultfd and io_uring. Each tool call then installs the much narrower per-call filter (`seccomp.py`: no new
programs, no sockets, no signals to others, no mounts or namespaces) before it reads a byte of model code.

`python -m asyncrl.sandbox.pod_profile` writes `manifests/sandbox/seccomp/asyncrl-sandbox.json`; a test checks the
file equals `profile()` and runs a tool call under the same deny list compiled by `seccomp.build_deny_filter`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from asyncrl.sandbox.seccomp import X86_64_DENIED, build_deny_filter

# x86_64 numbers (asm/unistd_64.h); the names are what libseccomp resolves for every architecture of the profile
POD_DENIED: dict[str, int] = {
    **{k: X86_64_DENIED[k] for k in (
        "ptrace", "process_vm_readv", "process_vm_writev", "add_key", "request_key", "keyctl", "bpf",
        "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register", "init_module",
        "finit_module", "delete_module", "kexec_load", "kexec_file_load", "swapon", "swapoff", "reboot", "iopl",
        "ioperm", "syslog", "acct", "quotactl", "name_to_handle_at", "open_by_handle_at", "setdomainname")},
    "uselib": 134, "ustat": 136, "sysfs": 139, "vhangup": 153, "_sysctl": 156, "adjtimex": 159,
    "settimeofday": 164, "create_module": 174, "get_kernel_syms": 177, "query_module": 178, "nfsservctl": 180,
    "lookup_dcookie": 212, "clock_settime": 227, "clock_adjtime": 305, "kcmp": 312,
}
PROFILE_PATH = Path("manifests/sandbox/seccomp/asyncrl-sandbox.json")
EPERM = 1


def profile() -> dict[str, Any]:
    """The profile document: allow by default, `POD_DENIED` fail with EPERM, on x86_64 and its 32-bit ABIs."""
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [{"names": sorted(POD_DENIED), "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM}],
    }


def profile_text() -> str:
    return json.dumps(profile(), indent=2) + "\n"


def build_pod_filter() -> bytes:
    """The same deny list as a BPF program for this host (tests install it to show the sandbox works under it)."""
    return build_deny_filter(set(POD_DENIED.values()))


def main(argv: list[str] | None = None) -> None:
    out = Path((argv if argv is not None else sys.argv[1:] or [str(PROFILE_PATH)])[0])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(profile_text())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
