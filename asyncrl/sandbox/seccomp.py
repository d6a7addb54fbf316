"""The seccomp filter a sandboxed tool call runs under: a classic-BPF program, built here without libseccomp.

The filter is a deny list over an allow-by-default policy: a tool (a short Python program that computes and
prints) needs files, memory, time and threads, and never needs what is refused here:
- new processes or programs: `execve`/`execveat`, `fork`/`vfork`, `clone` without `CLONE_THREAD` (threads stay
  allowed); `clone3` answers ENOSYS, whose flags a filter cannot read, so libc falls back to `clone`;
- the network: every socket call (there is only a loopback device in its namespace anyway);
- other processes: `kill`, `pidfd_*`, `ptrace`, `process_vm_readv/writev` (`tgkill`/`tkill` stay, for
  `signal.raise_signal` on itself; its PID namespace holds no process but its own and the sandbox's init);
- the file system's special files and the kernel's administration: `mknod*`, hard links, mounts (old and new
  API), `chroot`, `pivot_root`, `unshare`, `setns`, keyrings, `bpf`, `perf_event_open`, `userfaultfd`,
  io_uring, modules, kexec, swap, reboot, host names, `iopl`/`ioperm`, `personality`, NUMA memory policy,
  `syslog`, `acct`, `quotactl`, file handles.
Refused calls fail with EPERM (the program sees a PermissionError); a call from another ABI (x32, i386) kills
the process. Only x86_64 is built: `build_filter` raises for any other architecture, and the sandbox then refuses
to start rather than run without a filter.

`struct sock_filter` is {u16 code; u8 jt; u8 jf; u32 k}; `struct seccomp_data` holds nr at offset 0, arch at 4
and the six u64 arguments from offset 16 (little endian: the low 32 bits of args[0] at 16).
"""

from __future__ import annotations

import errno
import platform
import struct

# BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06

RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
CLONE_THREAD = 0x00010000

# x86_64 numbers (asm/unistd_64.h)
X86_64_DENIED: dict[str, int] = {
    "socket": 41, "connect": 42, "accept": 43, "bind": 49, "listen": 50, "socketpair": 53, "accept4": 288,
    "fork": 57, "vfork": 58, "execve": 59, "execveat": 322,
    "kill": 62, "pidfd_send_signal": 424, "pidfd_open": 434, "pidfd_getfd": 438,
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "mknod": 133, "mknodat": 259, "link": 86, "linkat": 265,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442,
    "add_key": 248, "request_key": 249, "keyctl": 250, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320,
    "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171,
    "iopl": 172, "ioperm": 173, "personality": 135, "syslog": 103, "acct": 163, "quotactl": 179,
    "mbind": 237, "set_mempolicy": 238, "migrate_pages": 256, "move_pages": 279,
    "name_to_handle_at": 303, "open_by_handle_at": 304,
}
X86_64_CLONE = 56
X86_64_CLONE3 = 435


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def _check_machine(machine: str | None) -> None:
    machine = machine or platform.machine()
    if machine not in ("x86_64", "amd64", "AMD64"):
        raise ValueError(f"seccomp: no filter for architecture {machine!r} (only x86_64 is built)")


def _arch_prologue() -> list[bytes]:
    """Kill a call from another ABI (i386, x32), then load the syscall number."""
    return [
        _insn(_LD_W_ABS, 0, 0, 4),  # arch
        _insn(_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        _insn(_RET_K, 0, 0, RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0, 0, 0),  # nr
        _insn(_JGE_K, 0, 1, X32_SYSCALL_BIT),  # the x32 ABI shares this arch value
        _insn(_RET_K, 0, 0, RET_KILL_PROCESS),
    ]


def _deny(numbers: set[int]) -> list[bytes]:
    """EPERM for each syscall number of `numbers` (the number is loaded); falls through otherwise."""
    prog: list[bytes] = []
    for nr in sorted(numbers):
        prog += [_insn(_JEQ_K, 0, 1, nr), _insn(_RET_K, 0, 0, RET_ERRNO | errno.EPERM)]
    return prog


def build_deny_filter(numbers: set[int], machine: str | None = None) -> bytes:
    """A plain deny list: the x86_64 calls `numbers` fail with EPERM, every other call is allowed (other ABIs are
    killed). `asyncrl.sandbox.pod_profile` compiles the sandbox pods' profile with it, to test it here."""
    _check_machine(machine)
    return b"".join([*_arch_prologue(), *_deny(numbers), _insn(_RET_K, 0, 0, RET_ALLOW)])


def build_filter(machine: str | None = None) -> bytes:
    """The filter program (a whole number of 8-byte instructions) for `machine` (default: this host's)."""
    _check_machine(machine)
    eperm = RET_ERRNO | errno.EPERM
    prog = [
        *_arch_prologue(),
        _insn(_JEQ_K, 0, 1, X86_64_CLONE3),
        _insn(_RET_K, 0, 0, RET_ERRNO | errno.ENOSYS),
    ]
    prog += _deny(set(X86_64_DENIED.values()))
    prog += [
        _insn(_JEQ_K, 0, 4, X86_64_CLONE),
        _insn(_LD_W_ABS, 0, 0, 16),  # low half of args[0]: the clone flags
        _insn(_JSET_K, 0, 1, CLONE_THREAD),
        _insn(_RET_K, 0, 0, RET_ALLOW),
        _insn(_RET_K, 0, 0, eperm),
        _insn(_RET_K, 0, 0, RET_ALLOW),
    ]
    return b"".join(prog)
