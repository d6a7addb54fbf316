"""Checks built images against the compiled pipeline: every task's command exists in the image that runs it.

    python -m asyncrl.cluster.image_check --tag TAG [--registry R] [--docker docker] [--pipeline F] [--out F]

For each task of the compiled pipeline (resolved as the KFP driver would, `asyncrl.cluster.rehearsal`), in the image
the pipeline gives it: the modules its command starts are importable there (`asyncrl-task --check MODULE ...`, the
images' own entrypoint; a `torch.distributed.run ... -m MODULE` task checks both; the KFP Python component
`finalize` checks `python3 -m kfp.dsl.executor_main` and its module). For each image: `asyncrl --help` runs, the
image's user is not root (uid 10001, as docker/ and the manifests say), and its size is reported. Containers run
with `--network none`; nothing is pulled. Exit 1 with every failure listed; `--out` writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from asyncrl.cluster.pipeline import COMPILED
from asyncrl.cluster.pipeline.components import TASK_ENTRYPOINT
from asyncrl.cluster.pipeline.definition import (
    ENDPOINTS_CONFIG_MAP,
    ROLE_TOKEN_SECRET,
    S3_SECRET,
    S3_SECRET_KEYS,
)
from asyncrl.cluster.rehearsal import load_compiled, resolve_parameters, task_commands

IMAGE_PARAMS = {"generation_image": "generation", "training_image": "training", "light_image": "light"}
NON_ROOT_UID = "10001"
KFP_EXECUTOR = "kfp.dsl.executor_main"
CHECK_TIMEOUT_S = 120


@dataclass
class ImageReport:
    ref: str
    size_mb: float = 0.0
    user: str = ""
    tasks: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def image_refs(registry: str, tag: str) -> dict[str, str]:
    prefix = f"{registry.rstrip('/')}/" if registry else ""
    return {param: f"{prefix}asyncrl-{kind}:{tag}" for param, kind in IMAGE_PARAMS.items()}


def modules_of(argv: list[str]) -> list[str]:
    """The Python modules a task's container command starts: `asyncrl-task MODULE` and any `-m MODULE` after it
    (torchrun's script), or the KFP executor for a Python component run by `sh -ec`."""
    if argv and argv[0] == TASK_ENTRYPOINT:
        mods = [argv[1]]
        mods += [argv[i + 1] for i in range(2, len(argv) - 1) if argv[i] == "-m"]
        return mods
    if any(KFP_EXECUTOR in a for a in argv):
        return [KFP_EXECUTOR]
    raise ValueError(f"unrecognised task command {argv[:3]!r}: expected '{TASK_ENTRYPOINT} MODULE' or a KFP component")


def tasks_by_image(pipeline: Path, refs: dict[str, str]) -> dict[str, list[tuple[str, list[str]]]]:
    """image ref -> [(task name, modules)] for every leaf task of the compiled pipeline."""
    spec, platform = load_compiled(pipeline)
    params = resolve_parameters(spec, refs)
    out: dict[str, list[tuple[str, list[str]]]] = {}
    # Only the commands matter here: the secrets' values are never passed to a container.
    secrets = {S3_SECRET: dict.fromkeys(S3_SECRET_KEYS, "unused"), ROLE_TOKEN_SECRET: {"ASYNCRL_ROLE_TOKEN": "unused"}}
    config_maps = {ENDPOINTS_CONFIG_MAP: {"AWS_ENDPOINT_URL": "http://unused"}}
    for task in task_commands(spec, platform, params, "image-check", secrets=secrets, config_maps=config_maps,
                              defer_outputs=True):
        out.setdefault(task.image, []).append((task.name, modules_of(task.argv)))
    unknown = set(out) - set(refs.values())
    if unknown:
        raise ValueError(f"{pipeline}: tasks run images the check was not given: {sorted(unknown)}")
    return out


def _run(docker: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([docker, *args], capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)


def check_image(docker: str, ref: str, tasks: list[tuple[str, list[str]]]) -> ImageReport:
    report = ImageReport(ref=ref, tasks=[name for name, _ in tasks])
    inspect = _run(docker, ["image", "inspect", "--format", "{{.Size}} {{.Config.User}}", ref])
    if inspect.returncode != 0:
        report.failures.append(f"{ref}: not built ({inspect.stderr.strip()})")
        return report
    size, _, user = inspect.stdout.strip().partition(" ")
    report.size_mb, report.user = round(int(size) / 1e6, 1), user
    if user.split(":")[0] != NON_ROOT_UID:
        report.failures.append(f"{ref}: runs as user {user or 'root'!r}, expected {NON_ROOT_UID}")
    run = ["run", "--rm", "--network", "none"]
    modules = sorted({m for _, mods in tasks for m in mods if m != KFP_EXECUTOR})
    report.modules = modules
    checks = [(["--entrypoint", TASK_ENTRYPOINT, ref, "--check", *modules], f"{TASK_ENTRYPOINT} --check {modules}"),
              (["--entrypoint", "asyncrl", ref, "--help"], "asyncrl --help"),
              (["--entrypoint", "id", ref, "-u"], "id -u")]
    if any(KFP_EXECUTOR in mods for _, mods in tasks):  # `sh -ec ... python3 -m kfp.dsl.executor_main`
        checks.append((["--entrypoint", "sh", ref, "-ec", f"python3 -m asyncrl.task_entrypoint --check {KFP_EXECUTOR} "
                        "asyncrl.cluster.finalize"], "sh + python3 with kfp"))
    for args, what in checks:
        proc = _run(docker, [*run, *args])
        if proc.returncode != 0:
            report.failures.append(f"{ref}: {what} failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-400:]}")
        elif what == "id -u" and proc.stdout.strip() != NON_ROOT_UID:
            report.failures.append(f"{ref}: id -u is {proc.stdout.strip()}, expected {NON_ROOT_UID}")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asyncrl.cluster.image_check", description=__doc__.split("\n")[0])
    ap.add_argument("--tag", required=True, help="the images' tag (make images-local: <git sha>-cpu)")
    ap.add_argument("--registry", default="", help="the images' registry prefix, as make images REGISTRY=")
    ap.add_argument("--docker", default="docker", help="the container client")
    ap.add_argument("--pipeline", type=Path, default=COMPILED, help="the compiled pipeline (KFP IR YAML)")
    ap.add_argument("--out", type=Path, help="write the report as JSON here")
    args = ap.parse_args(argv)
    started = time.monotonic()
    reports = [check_image(args.docker, ref, tasks)
               for ref, tasks in tasks_by_image(args.pipeline, image_refs(args.registry, args.tag)).items()]
    for r in reports:
        status = "ok" if not r.failures else "FAILED"
        print(f"{r.ref}: {status}, {r.size_mb:,.0f} MB, user {r.user}, tasks {', '.join(r.tasks)}")
    failures = [f for r in reports for f in r.failures]
    for f in failures:
        print(f"  {f}", file=sys.stderr)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"pipeline": str(args.pipeline), "images": [asdict(r) for r in reports],
                                        "check_s": round(time.monotonic() - started, 1),
                                        "ok": not failures}, indent=2) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
