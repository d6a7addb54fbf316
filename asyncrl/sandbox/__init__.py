"""The tool sandbox: model-written code isolated by the kernel (namespaces, seccomp, rlimits, a tmpfs folder).

`runner.run_python` runs one program; `host.sandbox_host` says what this host offers (or why it cannot isolate);
`check.report` is what `asyncrl sandbox-check` prints. See docs/sandbox.md for what a tool call can see.
"""
