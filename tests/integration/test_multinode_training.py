"""The multi-node training command lines, rehearsed on one machine: two "nodes" as two torchrun groups on loopback.

An embedded run (`asyncrl run`'s launcher, smoke config, one vLLM server, SeaweedFS, MLflow) whose training role
is started the way a 2-node x 1-GPU `PyTorchJob` starts it (`asyncrl.cluster.training_job`): for each of its pods
(the Master, then the Worker) the container's command line, with the `$(RANK)`, `$(MASTER_ADDR)`,
`$(MASTER_PORT)` references expanded the way the kubelet expands them from the env the training operator sets
(node rank 0 and 1, 127.0.0.1, a free port), run as its own torchrun group (`--nnodes 2 --node-rank 0|1`, one
process each, gloo on the CPU). The TrainJob's command line expands to the same with the Trainer's `PET_*`
variables. The run must train every step with world size 2 (`training.num_processes=2`, which the trainer checks
against torchrun's WORLD_SIZE), push the trained weights (the launcher compares the servers' checksums and fails
otherwise), and the second node's rank 1 must follow rank 0 to "stop".

Heavy (vLLM, DeepSpeed, two torchrun groups): `pytest tests/integration/test_multinode_training.py`.
The run itself happens in a child interpreter: `python this_file.py <runs dir> <run id> <port> <argv json>`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
RUN_ID = "multinode-test"
NODES, GPUS = 2, 1
OVERRIDES = ["generation.num_servers=1", "training.steps=2", "training.num_processes=2", "eval.every_steps=0"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_argvs(run_url: str, port: int) -> dict[str, list[list[str]]]:
    """Per engine, each node's command line as its pod runs it: the job object's, expanded with the engine's env."""
    from asyncrl.cluster.training_job import RENDEZVOUS_ENV, TrainingJobSpec, build, expand_env_refs

    spec = TrainingJobSpec(name="asyncrl-training-rehearsal", namespace="local", image="local", nodes=NODES,
                           gpus_per_node=GPUS, run_url=run_url)
    out: dict[str, list[list[str]]] = {}
    for engine, (rank_var, addr_var, port_var) in RENDEZVOUS_ENV.items():
        obj = build(spec, engine)
        if engine == "pytorchjob":
            replicas = obj["spec"]["pytorchReplicaSpecs"]
            containers = [replicas["Master"]["template"]["spec"]["containers"][0]]
            containers += [replicas["Worker"]["template"]["spec"]["containers"][0]] * replicas["Worker"]["replicas"]
        else:
            containers = [obj["spec"]["trainer"]] * obj["spec"]["trainer"]["numNodes"]
        out[engine] = [[*c["command"], *(expand_env_refs(a, {rank_var: str(rank), addr_var: "127.0.0.1",
                                                             port_var: str(port)}) for a in c["args"])]
                       for rank, c in enumerate(containers)]
    return out


def _child(runs: Path, run_id: str, port: int, argv_file: Path) -> None:
    """Run the embedded run, its trainer started as the PyTorchJob's pods would start it."""
    from asyncrl.config import load_config
    from asyncrl.local.launcher import EmbeddedRun
    from asyncrl.local.processes import ProcessGroup

    class TwoNodeRun(EmbeddedRun):
        def start_training(self, procs: ProcessGroup, args: list[str]) -> None:
            argvs = node_argvs(self.url, port)["pytorchjob"]
            argv_file.write_text(json.dumps({"run_url": self.url, "argvs": argvs}))
            for rank, argv in enumerate(argvs):
                # the images' entrypoint runs torch.distributed.run with the interpreter asyncrl is installed in
                assert argv[:2] == ["asyncrl-task", "torch.distributed.run"], argv
                procs.start("training-0" if rank == 0 else f"training-0-node{rank}", "torch.distributed.run",
                            argv[2:])

    overrides = [*OVERRIDES, f"runs_dir={runs}", f"run_id={run_id}", f"cache_dir={REPO / '.cache/asyncrl'}"]
    cfg = load_config(REPO / "configs/smoke.yaml", overrides)
    os.environ["POD_IP"] = "127.0.0.1"  # what the job's pods advertise (their pod IP); here loopback
    summary = TwoNodeRun(cfg).run()
    print(json.dumps({"summary_steps": summary["steps"], "final_version": summary["final_version"]}))


@pytest.mark.integration
@pytest.mark.timeout(1200)
def test_two_torchrun_groups_train_as_one_world(tmp_path: Path) -> None:
    runs, port, argv_file = tmp_path / "runs", _free_port(), tmp_path / "argv.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "ASYNCRL_LOG_LEVEL": "INFO", "OMP_NUM_THREADS": "1"}
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "POD_IP"):
        env.pop(key, None)
    proc = subprocess.run([sys.executable, str(HERE), str(runs), RUN_ID, str(port), str(argv_file)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=1100)
    logs = {p.name: p.read_text() for p in sorted((runs / RUN_ID / "logs").glob("*.log"))}
    shown = "\n".join(f"--- {n}\n{t[-3000:]}" for n, t in logs.items())
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{shown}"

    # the processes started were the job's command lines, one torchrun group per node, rendezvous on loopback
    recorded = json.loads(argv_file.read_text())
    run_url, started = recorded["run_url"], recorded["argvs"]
    assert run_url.endswith(f"/{RUN_ID}")
    argvs = node_argvs(run_url, port)
    assert started == argvs["pytorchjob"] == argvs["trainjob"]
    for rank, argv in enumerate(started):
        pairs = dict(zip(argv[:-1], argv[1:], strict=True))
        assert (pairs["--nnodes"], pairs["--nproc-per-node"], pairs["--node-rank"]) == ("2", "1", str(rank))
        assert (pairs["--master-addr"], pairs["--master-port"], pairs["--run-url"]) == ("127.0.0.1", str(port),
                                                                                        run_url)

    # training advanced with world size 2: every step, and node 1's rank 1 followed rank 0 to the end
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result == {"summary_steps": 2, "final_version": 2}
    summary = json.loads((runs / RUN_ID / "run_summary.json").read_text())
    assert summary["weights_in_sync"] is True and summary["samples_trained"] > 0
    node1 = logs["training-0-node1.log"]
    assert "training[0.rank1]" in node1 and "rank 1: rank 0 said stop" in node1, node1[-3000:]
    assert "training[0.rank1]" not in logs["training-0.log"]  # rank 1 ran in the second group only


if __name__ == "__main__":
    _child(Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]))
