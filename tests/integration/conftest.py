"""Embedded runs shared by several integration test modules: each runs once per session, into one runs folder (so
one MLflow store holds both, and `asyncrl compare` compares them: tests/integration/test_embedded_runs_compare.py).

`smoke_run`: the smoke config with one vLLM server (tests/integration/test_embedded_run.py checks it).
`algorithms_run`: the smoke config with CISPO, AsyPPO and coupled attention credit
(tests/integration/test_embedded_algorithms.py checks it).
Tests that read MLflow pick their run by name (`mlflow_run`), since the store holds both.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import mlflow
import pytest

from tests.helpers.env_vars import restored_env
from tests.helpers.subprocess_runs import run_embedded

ROOT = Path(__file__).resolve().parents[2]
SMOKE_RUN_ID = "smoke-test"
# held-out curve: every version; heartbeats and the writer's stats every 0.25 s: the roles' child runs get figures
# from within this short run (the warm start's evaluation through the generation server included), not only from its
# first moments; on a fast host the run takes under 2 s from the roles' start to its last step
SMOKE_OVERRIDES = ["generation.num_servers=1", "eval.every_steps=1", "timeouts.heartbeat_s=0.25",
                   "rollout.stats_interval_s=0.25"]
ALGORITHMS_RUN_ID = "algorithms-test"
ALGORITHMS_STEPS = 3
ALGORITHMS_OVERRIDES = [
    "generation.num_servers=1", f"training.steps={ALGORITHMS_STEPS}", "training.checkpoint_every=2",
    "training.loss=cispo", "training.loss_params.eps_high=4.0", "training.advantage=gae", "training.asyppo={}",
    "training.critic.warmup_steps=1",
    'training.attention_credit={"scaling":"coupled","window":3,"fai_h_lo":1,"fai_h_hi":6}', "eval.every_steps=0",
]


def mlflow_run(runs_dir: Path, run_name: str, experiment: str = "asyncrl") -> mlflow.entities.Run:
    """The one MLflow run named `run_name` in the embedded store of `runs_dir`."""
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{runs_dir / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id],
                              filter_string=f"attributes.run_name = '{run_name}'")
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return runs[0]


@pytest.fixture(scope="session")
def embedded_runs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("embedded-runs")


@pytest.fixture(scope="session")
def smoke_run(embedded_runs_dir: Path) -> tuple[Path, str]:
    """(run folder, stdout) of the smoke run."""
    stdout = run_embedded(ROOT / "configs/smoke.yaml", embedded_runs_dir, SMOKE_RUN_ID, SMOKE_OVERRIDES)
    return embedded_runs_dir / SMOKE_RUN_ID, stdout


@pytest.fixture(scope="session")
def algorithms_run(embedded_runs_dir: Path) -> Path:
    """The run folder of the algorithms run."""
    # A torch.distributed launcher variable pointing at a taken port must not reach the roles (the trainer would
    # try to bind it): the launcher strips them.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy, restored_env(["MASTER_PORT"]):
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        os.environ["MASTER_PORT"] = str(busy.getsockname()[1])
        run_embedded(ROOT / "configs/smoke.yaml", embedded_runs_dir, ALGORITHMS_RUN_ID, ALGORITHMS_OVERRIDES)
    return embedded_runs_dir / ALGORITHMS_RUN_ID
