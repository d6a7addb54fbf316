"""`asyncrl sandbox-check`: what isolation a tool call gets on this host, seen from inside a real sandbox.

It starts one sandbox whose program reports its own view (uid, capabilities, no_new_privs, seccomp mode,
network devices, visible processes, environment, root folder, limits) and prints it with the host's setup;
exit status 1 when the host cannot isolate tools (with what to enable), 0 otherwise.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from asyncrl.sandbox.host import SandboxUnavailable, sandbox_host
from asyncrl.sandbox.runner import run_python

# the audit hook's path check is defeated first: this reports the kernel's view, not the hook's
_PROBE = r"""
import json, os, resource
os.path.realpath = lambda p, **k: '/work/x'
status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines() if ':' in line)
def limit(r):
    soft = resource.getrlimit(r)[0]
    return None if soft == resource.RLIM_INFINITY else soft
print(json.dumps({
    "uid_inside": os.getuid(), "gid_inside": os.getgid(), "pid_inside": os.getpid(),
    "capabilities_effective": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip() == "1",
    "seccomp_mode": int(status["Seccomp"].strip()),
    "network_devices": [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]],
    "visible_pids": sorted(int(p) for p in os.listdir('/proc') if p.isdigit()),
    "environment": sorted(os.environ), "root_folder": sorted(os.listdir('/')),
    "workdir_writable": os.access('/work', os.W_OK), "root_writable": os.access('/', os.W_OK),
    "limits": {"cpu_s": limit(resource.RLIMIT_CPU), "address_space_bytes": limit(resource.RLIMIT_AS),
               "file_bytes": limit(resource.RLIMIT_FSIZE), "open_files": limit(resource.RLIMIT_NOFILE)},
}))
"""


def report() -> dict[str, Any]:
    """The host's setup and the sandbox's own view; raises SandboxUnavailable when there is no sandbox here."""
    host = sandbox_host()
    r = asyncio.run(run_python(_PROBE, timeout_s=10.0, max_output=65536))
    if not r.ok:
        raise SandboxUnavailable(f"sandbox: the probe program failed: {r.stderr.strip()[-500:]}")
    inside = json.loads(r.stdout)
    return {
        "bwrap": host.bwrap, "python": host.python, "machine": host.machine,
        "caller_uid": os.geteuid(), "outer_uid": host.drop_to if host.drop_to is not None else os.geteuid(),
        "namespaces": ["user", "mount", "pid", "network", "ipc", "uts", "cgroup"],
        "seccomp_filter": "deny list (see asyncrl/sandbox/seccomp.py), installed before the model's code",
        "inside": inside,
    }


def main() -> int:
    try:
        info = report()
    except SandboxUnavailable as err:
        print(f"asyncrl sandbox-check: NOT ISOLATED: {err}")
        return 1
    inside = info["inside"]
    print(f"sandbox: bwrap {info['bwrap']}\n  interpreter {info['python']} ({info['machine']})")
    print(f"  runs as uid {info['outer_uid']} outside (caller uid {info['caller_uid']}), "
          f"uid {inside['uid_inside']} inside")
    print(f"  namespaces: {', '.join(info['namespaces'])}")
    print(f"  capabilities {inside['capabilities_effective']}, no_new_privs {inside['no_new_privs']}, "
          f"seccomp mode {inside['seccomp_mode']} ({info['seccomp_filter']})")
    print(f"  network devices {inside['network_devices']}; visible processes {inside['visible_pids']}")
    print(f"  environment {inside['environment']}; root folder {inside['root_folder']} "
          f"(read-only: {not inside['root_writable']}); /work writable: {inside['workdir_writable']}")
    print(f"  limits {inside['limits']}")
    return 0
