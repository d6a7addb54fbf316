"""Where the kernel cannot isolate tools, tool execution refuses to start and says what to enable; it never runs
model code without namespaces. The fault is injected: a bwrap that cannot create its namespaces."""

from __future__ import annotations

import subprocess
import sys

import pytest

from asyncrl.envs.tool_use import ToolUse
from asyncrl.sandbox import host


@pytest.fixture
def broken_bwrap(monkeypatch: pytest.MonkeyPatch, tmp_path):
    fake = tmp_path / "bwrap"  # a root caller runs a copy of it that uid 65534 may execute (host.runnable_bwrap)
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(host, "_bwrap_path", lambda: str(fake))
    host.sandbox_host.cache_clear()
    yield
    host.sandbox_host.cache_clear()


def test_tool_use_refuses_to_start_and_says_how_to_enable(broken_bwrap) -> None:
    with pytest.raises(host.SandboxUnavailable, match="No permissions to create new namespace") as e:
        ToolUse(allow_python=True)
    assert "user.max_user_namespaces" in str(e.value) and "seccomp profile" in str(e.value)
    ToolUse(allow_python=False)  # the calculator alone needs no sandbox


def test_sandbox_check_reports_isolation() -> None:
    r = subprocess.run([sys.executable, "-m", "asyncrl.cli", "sandbox-check"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "network devices ['lo']" in r.stdout and "seccomp mode 2" in r.stdout and "no_new_privs True" in r.stdout
