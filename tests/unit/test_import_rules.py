"""The import rules of docs/architecture.md, checked on the import graph of `asyncrl/` (every import statement of
every module, read with `ast`: top-level, lazy ones inside functions and `TYPE_CHECKING` ones alike)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "asyncrl"

# Package cycles that remain, each with why (none today: keep it that way).
KNOWN_PACKAGE_CYCLES: dict[frozenset[str], str] = {}
# Files over MAX_LINES, each with why it stays one file.
MAX_LINES = 400
LONG_FILES: dict[str, str] = {
    "asyncrl/rollout/scheduler.py": "the rollout scheduler's whole state machine: one class a reader follows in one "
                                    "sitting, tested with exact numbers",
    "asyncrl/storage/groups.py": "the group object format, its writer and its reader (cursors, gaps, quarantine) "
                                   "share one contract",
    "asyncrl/config/schema.py": "every config section in one place, as the configuration reference reads it",
    "asyncrl/generation/engine.py": "the vLLM wrapper: a request's life and the weight-update sequence",
}
# What a package may import besides itself: the pure ones (rollout, sim: no I/O package at all), and envs (never
# the run's config).
ONLY: dict[str, set[str]] = {
    "asyncrl.rollout": {"asyncrl.types"},
    "asyncrl.sim": {"asyncrl.rollout", "asyncrl.types"},
    # `asyncrl compare` reads MLflow only: it never needs a run's processes, storage or roles
    "asyncrl.compare": {"asyncrl.tracking", "asyncrl.secret_names"},
    "asyncrl.envs": {"asyncrl.plugins", "asyncrl.rpc", "asyncrl.sandbox", "asyncrl.secret_names", "asyncrl.storage"},
}
# The training package computes; only roles wire it to transport (S3, weight sync).
NEVER: dict[str, set[str]] = {
    "asyncrl.training": {"asyncrl.storage", "asyncrl.weights", "asyncrl.rpc", "asyncrl.roles", "asyncrl.local",
                         "asyncrl.cluster", "asyncrl.tiny_model"},
    # the three transports: storage (S3) and rpc (HTTP calls) are leaves; weights (the broadcast) calls the servers
    # over rpc to start one
    "asyncrl.storage": {"asyncrl.training", "asyncrl.roles", "asyncrl.local", "asyncrl.cluster", "asyncrl.weights",
                        "asyncrl.rpc"},
    "asyncrl.weights": {"asyncrl.training", "asyncrl.roles", "asyncrl.local", "asyncrl.cluster", "asyncrl.storage"},
    "asyncrl.rpc": {"asyncrl.training", "asyncrl.roles", "asyncrl.local", "asyncrl.cluster", "asyncrl.storage",
                    "asyncrl.weights"},
    "asyncrl.rewards": {"asyncrl.roles", "asyncrl.local", "asyncrl.cluster", "asyncrl.tiny_model"},
    "asyncrl.generation": {"asyncrl.roles", "asyncrl.local", "asyncrl.cluster", "asyncrl.training",
                           "asyncrl.tiny_model"},
    # a role process only ever receives a finished model folder (asyncrl.models.folder); the builder is called by
    # whoever prepares a run (the launcher, the cluster's setup step, the CLI, benchmarks)
    "asyncrl.roles": {"asyncrl.tiny_model"},
    "asyncrl.models": {"asyncrl.tiny_model"},
    "asyncrl.tasks": {"asyncrl.tiny_model"},
    "asyncrl.evaluation": {"asyncrl.tiny_model"},
    # the run's lifecycle (create, resume, finalize, summary) is written once, for both ways of running: it never
    # depends on either of them, nor on a role
    "asyncrl.run": {"asyncrl.local", "asyncrl.cluster", "asyncrl.roles"},
    # the pipeline's steps call asyncrl.run, never the embedded launcher
    "asyncrl.cluster": {"asyncrl.local"},
}
# Single module-to-module edges a NEVER rule allows, each with why.
ALLOWED_EDGES: dict[tuple[str, str], str] = {
    ("asyncrl.cluster.rehearsal_runner", "asyncrl.local.processes"):
        "the rehearsal runs the compiled pipeline's tasks as local processes: the launcher's process group "
        "(sessions, logs, stop) is exactly that; it is a local tool, never a pipeline step",
    ("asyncrl.cluster.rehearsal_runner", "asyncrl.local.seaweed"):
        "the rehearsal's S3 is the embedded SeaweedFS server, as in `asyncrl run`",
}


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _targets(module: str, node: ast.Import | ast.ImportFrom, is_package: bool) -> set[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            pkg = module.split(".") if is_package else module.split(".")[:-1]
            pkg = pkg[:len(pkg) - (node.level - 1)]
            base = ".".join([*pkg, base] if base else pkg)
        names = [base, *(f"{base}.{a.name}" for a in node.names)]
    found = set()
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name.startswith("asyncrl"):
            found.add(name)
    return found


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for module, path in MODULES.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                deps |= _targets(module, node, path.name == "__init__.py")
        deps.discard(module)
        graph[module] = deps
    return graph


def package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


GRAPH = import_graph()


def test_the_graph_sees_lazy_and_type_checking_imports() -> None:
    assert "asyncrl.envs" in GRAPH["asyncrl.config.schema"]  # a lazy import inside a validator
    assert "asyncrl.rollout.scheduler" in GRAPH["asyncrl.sim.trainer"]


def test_cycle_finder_finds_cycles() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(GRAPH) == []


def test_package_cycles_are_only_the_known_ones() -> None:
    packages: dict[str, set[str]] = {}
    for module, deps in GRAPH.items():
        packages.setdefault(package(module), set()).update(package(d) for d in deps if package(d) != package(module))
    assert set(cycles(packages)) == set(KNOWN_PACKAGE_CYCLES)


def test_packages_import_only_what_they_may() -> None:
    for pkg, allowed in ONLY.items():
        for module, deps in GRAPH.items():
            if package(module) == pkg:
                bad = {package(d) for d in deps} - allowed - {pkg}
                assert not bad, f"{module} imports {sorted(bad)}; {pkg} may import only {sorted(allowed)}"


def test_forbidden_package_imports() -> None:
    for pkg, forbidden in NEVER.items():
        for module, deps in GRAPH.items():
            if package(module) == pkg:
                bad = {d for d in deps if package(d) in forbidden and (module, d) not in ALLOWED_EDGES}
                assert not bad, f"{module} imports {sorted(bad)}"


def test_allowed_edges_are_still_needed() -> None:
    for module, dep in ALLOWED_EDGES:
        assert dep in GRAPH[module], f"{module} no longer imports {dep}: drop it from ALLOWED_EDGES"


def test_files_stay_small() -> None:
    long = {str(p.relative_to(ROOT.parent)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert set(long) <= set(LONG_FILES), {k: v for k, v in long.items() if k not in LONG_FILES}
    assert set(LONG_FILES) <= set(long), f"no longer over {MAX_LINES} lines: drop from LONG_FILES"
