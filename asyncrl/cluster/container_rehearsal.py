"""The container rehearsal: the compiled pipeline's tasks as real containers of the built images, concurrently.

    python -m asyncrl.cluster.container_rehearsal --tag TAG [--docker docker] [--workdir DIR] [--steps N]
        [--kill-role ROLE] [--out F]

Setup, the four roles and finalize run as containers of `asyncrl-{generation,training,light}:TAG` (`make
images-local` builds them), started as the KFP driver would start their pods (`asyncrl.cluster.rehearsal_runner`
with `asyncrl.cluster.rehearsal_containers`); MLflow is a `mlflow server` container of the light image over a
store in the work folder, which the run reaches by the pipeline's `mlflow_uri` as on a cluster; S3 is SeaweedFS's
`weed` in a container of the light image, reached through the pipeline's endpoint config map and secret.

With `--kill-role ROLE` (environment-env0, generation-0, reward or training) the first rehearsal kills that role's
container (SIGKILL, as a node loss would) once checkpoint 1 is committed; every other role must then stop by
itself, and a second rehearsal with `resume_run_id` resumes the run on the same S3 data and trains to the end.
Prints the figures and writes them to `--out` as JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from asyncrl.cluster.pipeline import COMPILED
from asyncrl.cluster.rehearsal_containers import Containers, open_to_all
from asyncrl.cluster.rehearsal_runner import RehearsalResult, rehearse
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store

ROLES = ("environment-env0", "generation-0", "reward", "training")
MLFLOW_START_S = 180.0
KILLED_PEER_S = 30.0  # with --kill-role: the others notice the lost trainer in 30 s, not the default 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def mlflow_container(containers: Containers, image: str, folder: Path) -> Iterator[str]:
    """`mlflow server` in a container of `image` over a sqlite store and an artifact folder in `folder`; yields
    its tracking URI once /health answers, removes the container after."""
    folder.mkdir(parents=True, exist_ok=True)
    open_to_all(folder)  # the light image's user writes the store; the tasks never need this folder
    port, name = free_port(), f"{containers.prefix}-mlflow"
    log = open(folder / "server.log", "ab")  # noqa: SIM115 - the container's output for its whole life
    proc = subprocess.Popen(
        [*containers.run_line(name), "-v", f"{folder}:{folder}", "--entrypoint", "python3", image, "-m", "mlflow",
         "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--artifacts-destination",
         str(folder / "artifacts")], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + MLFLOW_START_S
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{uri}/health", timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"mlflow server container did not answer in {MLFLOW_START_S:.0f}s: "
                                   f"{(folder / 'server.log').read_text()[-2000:]}")
            time.sleep(1.0)
        yield uri
    finally:
        subprocess.run([containers.docker, "rm", "-f", name], capture_output=True, timeout=60)
        proc.wait(timeout=60)
        log.close()


def params_for(steps: int, mlflow_uri: str, resume_run_id: str = "", peer_s: float = 0.0) -> dict[str, Any]:
    """The tiny built-in model, one replica of each role, a checkpoint every step; `peer_s`: how long the roles
    wait for a silent trainer (0: the configuration's)."""
    params: dict[str, Any] = {
        "steps": steps, "prompts_per_step": 4, "samples_per_prompt": 4, "mlflow_uri": mlflow_uri,
        "mlflow_experiment": "container-rehearsal", "s3_bucket": "rehearsal", "model_path": "",
        "generation_replica_ids": ["0"], "training_gpus": 1,
        "overrides": ["generation.max_model_len=32", "training.micro_batch_size=16", "training.checkpoint_every=1"],
    }
    if peer_s:
        params["overrides"].append(f"timeouts.peer_s={peer_s:g}")
    if resume_run_id:
        params["resume_run_id"] = resume_run_id
    return params


def summary(result: RehearsalResult) -> dict[str, Any]:
    return {"run_id": result.run_id, "wall_s": round(result.wall_s, 1), "exit_codes": result.exit_codes,
            "lost_s": None if result.lost_s is None else round(result.lost_s, 1),
            "started_s": {k: round(v, 1) for k, v in result.started_s.items()},
            "ended_s": {k: round(v, 1) for k, v in result.ended_s.items()}, "inspection": result.inspection}


def final_state(store: S3Store, paths: RunPaths) -> dict[str, Any]:
    return {"latest": store.get_json(paths.versions_latest()), "done": store.exists(paths.done()),
            "final": store.get_json(paths.file("final_status.json"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m asyncrl.cluster.container_rehearsal",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--tag", required=True, help="the images' tag (make images-local: <git sha>-cpu)")
    ap.add_argument("--docker", default="docker")
    ap.add_argument("--pipeline", type=Path, default=COMPILED)
    ap.add_argument("--workdir", type=Path, default=Path(time.strftime("rehearsals/containers-%Y%m%d-%H%M%S")))
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--kill-role", choices=ROLES, default=None)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    workdir = args.workdir.resolve()
    images = {f"{kind}_image": f"asyncrl-{kind}:{args.tag}" for kind in ("generation", "training", "light")}
    containers = Containers(docker=args.docker, s3_image=images["light_image"])
    report: dict[str, Any] = {"tag": args.tag, "images": images, "kill_role": args.kill_role}
    started = time.monotonic()
    try:
        with mlflow_container(containers, images["light_image"], workdir / "mlflow") as uri:
            report["mlflow_uri"] = uri
            peer_s = KILLED_PEER_S if args.kill_role else 0.0
            first = run_once(args, workdir, containers, {**params_for(args.steps, uri, peer_s=peer_s), **images})
            report["first"] = summary(first)
            if args.kill_role:
                resumed = run_once(args, workdir, containers,
                                   {**params_for(args.steps, uri, first.run_id, peer_s), **images})
                report["resumed"] = summary(resumed)
    finally:
        containers.remove_all()
    report["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(report, indent=2, default=str))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


def run_once(args: argparse.Namespace, workdir: Path, containers: Containers, params: dict[str, Any]
             ) -> RehearsalResult:
    kill = args.kill_role if "resume_run_id" not in params else None

    def committed_one(store: S3Store, paths: RunPaths) -> bool:
        return store.exists(paths.checkpoint_committed(1))

    return rehearse(args.pipeline, params, workdir=workdir / "run", timeout_s=args.timeout, exit_grace_s=120,
                    echo=lambda msg: print(msg, flush=True), containers=containers, inspect=final_state,
                    kill_when=committed_one if kill else None, kill_task=kill)


if __name__ == "__main__":
    sys.exit(main())
