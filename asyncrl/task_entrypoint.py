"""`asyncrl-task`: the one entrypoint of every container image and every pipeline component.

    asyncrl-task MODULE [ARG ...]        # exactly `python -m MODULE ARG ...`, with asyncrl's own interpreter
    asyncrl-task --check MODULE [...]    # exit 0 when each module can be found by that interpreter (image builds)

Installed as a console script by the asyncrl wheel (`[project.scripts]` in pyproject.toml), so its shebang names the
interpreter asyncrl was installed into: the vLLM image calls it `python3`, the slim images' venv `python`, and no
component or Dockerfile needs to know which. The process replaces itself (`os.execv`) with
`<interpreter> -m MODULE ARG ...`: the role keeps this process's PID (PID 1 in a container, which the health probe
and the kubelet's signals target) and gets the arguments unchanged. The torchrun launcher is the module
`torch.distributed.run` (what the `torchrun` script runs).

Invariants: a module that cannot be found is a clear error (exit 2) naming it and the interpreter, before anything
starts; nothing else is read or changed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence

USAGE = "usage: asyncrl-task MODULE [ARG ...] | asyncrl-task --check MODULE [MODULE ...]"


def find_module(name: str) -> str | None:
    """None when `name` can be run with `-m` by this interpreter, else why not."""
    if not name or name.startswith("-") or any(not part.isidentifier() for part in name.split(".")):
        return f"{name!r} is not a module name (expected dotted identifiers, e.g. asyncrl.roles.reward)"
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as err:  # a parent package is missing or broken
        return f"module {name!r} cannot be found by {sys.executable}: {err}"
    if spec is None:
        return f"module {name!r} is not installed for {sys.executable}"
    return None


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not args else sys.stdout)
        sys.exit(2 if not args else 0)
    if args[0] == "--check":
        if len(args) == 1:
            print(f"asyncrl-task --check: expected at least one module name\n{USAGE}", file=sys.stderr)
            sys.exit(2)
        problems = [p for p in (find_module(m) for m in args[1:]) if p]
        if problems:
            print("asyncrl-task --check: " + "; ".join(problems), file=sys.stderr)
            sys.exit(2)
        print(f"asyncrl-task: {sys.executable}: {' '.join(args[1:])} found")
        return
    problem = find_module(args[0])
    if problem:
        print(f"asyncrl-task: {problem}", file=sys.stderr)
        sys.exit(2)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", *args])


if __name__ == "__main__":
    main()
