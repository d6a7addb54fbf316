"""Faults on a real embedded run (SeaweedFS, vLLM, DeepSpeed, every role its own process), one after another:

1. the S3 server stops answering (SIGSTOP) for 5 s after step 1: every S3 call waits and retries within
   `timeouts.storage_s`, heartbeats ride it out (`timeouts.peer_s`), the run goes on;
2. a trajectory object the trainer has not read yet is truncated: the trainer moves it aside to `quarantine/`,
   counts it and skips it (its group's B samples are lost, and counted);
3. after checkpoint 2 is committed and step 3 published, the trainer gets SIGKILL: the launcher stops every role
   and fails naming it; `asyncrl run --resume RUN_ID` rewinds to the last committed checkpoint and goes on (the
   fresh generation servers start from that checkpoint's weights, read from S3);
4. in the resumed run, generation server 1 gets SIGKILL mid-generation: the writer re-sends its requests to server
   0, the trainer re-forms the weight group without it (a new epoch), the launcher restarts it, it starts from the
   last committed checkpoint and joins the next epoch (the writer is held meanwhile, so the run does not end first);
5. a hung collective: generation server 0 is stopped (SIGSTOP) so the next weight broadcast misses its deadline
   (`timeouts.collective_s` = 15 s); the trainer re-forms the group with server 1 alone and goes on; once server 0
   runs again it answers its health check and joins the next epoch. When the stop catches requests in flight on
   server 0, the step waits until the writer re-sends them at their deadline (`rollout.request_timeout_s`).
The trainer runs as two data-parallel ranks under torchrun with ZeRO-3 (the checkpoint it resumes from is gathered
from both ranks and loaded into both). At the end every step trained exactly B groups, every group object written is accounted for (trained, dropped as
stale, quarantined, or left unconsumed), the groups in flight at the crash are counted as lost, the servers hold
the trainer's weights, and one MLflow run holds every step. Figures are printed, and written to
$ASYNCRL_FAULT_RESULTS by `make faults`."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import mlflow
import psutil
import pytest

from asyncrl.config import load_config
from asyncrl.storage.groups import metadata_groups
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store
from tests.helpers.run_processes import kill_run_processes

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
STEPS, B, G, STALL_S = 16, 4, 4, 5.0  # steps, groups per step, samples per group (smoke.yaml)
# STALL_S: the S3 calls made meanwhile wait (the client's read timeout is 30 s), and the roles' heartbeats ride it
# out (`timeouts.peer_s`, 120 s): 5 s shows that as well as 10 s did.
COLLECTIVE_S = 15.0
# A request in flight on a stopped generation server is re-sent elsewhere only at its deadline
# (`rollout.request_timeout_s`); a step whose groups wait for it pushes no weights before then.
REQUEST_S = load_config(ROOT / "configs/smoke.yaml", []).rollout.request_timeout_s


def _procs(*needles: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if all(n in cmd for n in needles):
            out.append(p)
    return out


def _wait_for(path: Path, texts: list[str], proc: subprocess.Popen, timeout_s: float = 400) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        body = path.read_text() if path.is_file() else ""
        if all(t in body for t in texts):
            return
        time.sleep(0.2)
    out = proc.communicate(timeout=60)[0] if proc.poll() is not None else ""
    pytest.fail(f"{texts} never appeared in {path}: {out[-3000:]}")


def _kill_run(launcher: subprocess.Popen, run_id: str, run_dir: Path) -> None:
    """A failed test: the launcher and every process of the run go (stopped ones are woken first)."""
    kill_run_processes(run_dir)  # first, while the roles live: their vLLM engine processes go with them
    procs = [*_procs("asyncrl.roles", f"/{run_id}"), *_procs("torch.distributed.run", f"/{run_id}"),
             *_procs("weed", str(run_dir))]
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGKILL)
    launcher.kill()
    launcher.wait(30)


def _logs(run_dir: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted((run_dir / "logs").glob("*.log")))


def _group(store: S3Store, paths: RunPaths) -> tuple[int, list[dict]]:
    """The trainer's weight group: (epoch, servers), from versions/latest.json."""
    g = (store.get_json(paths.versions_latest()) or {}).get("weight_group", {})
    return int(g.get("epoch", 0)), list(g.get("servers", []))


def _until(what: str, cond, proc: subprocess.Popen, timeout_s: float = 300) -> float:
    """Wait for `cond()` while the run is going; the monotonic time it became true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return time.monotonic()
        if proc.poll() is not None:
            pytest.fail(f"the run ended before: {what}\n{proc.communicate()[0][-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"not within {timeout_s:.0f}s: {what}")


def _serving(doc: dict | None) -> bool:
    if not doc or "host" not in doc:
        return False
    try:
        r = httpx.get(f"http://{doc['host']}:{doc['port']}/health", timeout=2.0,
                      headers={"Authorization": f"Bearer {os.environ.get('ASYNCRL_ROLE_TOKEN', '')}"})
        return r.status_code == 200 and r.json().get("status") == "ok"
    except httpx.HTTPError:
        return False


def _generation_faults(run: subprocess.Popen, paths: RunPaths, run_id: str) -> tuple[dict[str, float], S3Store]:
    """Faults 4 and 5 on the resumed run (see the module docstring); returns their timings and the run's store."""
    t0 = time.monotonic()
    _until("the resumed trainer started", lambda: bool(_procs("asyncrl.roles.training", f"/{run_id}")), run)
    env = _procs("asyncrl.roles.training", f"/{run_id}")[0].environ()  # the resumed run's S3 server is a new one
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    store = S3Store(env["AWS_ENDPOINT_URL"], "asyncrl", timeout_s=10.0)
    os.environ["ASYNCRL_ROLE_TOKEN"] = env["ASYNCRL_ROLE_TOKEN"]  # for the health checks below (the run's token)
    _until("a step after the resume", lambda: (store.get_json(paths.versions_latest()) or {}).get("metrics"), run)
    first_step = time.monotonic() - t0
    ids = lambda: [x["id"] for x in _group(store, paths)[1]]  # noqa: E731

    # 4. kill -9 generation server 1 while it generates
    old = store.get_json(paths.rendezvous("generation", "1"))
    _until("both servers in the group", lambda: ids() == ["0", "1"], run)
    victim = [p for p in _procs("asyncrl.roles.generation", f"/{run_id}") if "--id 1" in " ".join(p.cmdline())]
    assert len(victim) == 1
    t_kill = time.monotonic()
    victim[0].send_signal(signal.SIGKILL)
    t_regroup = _until("a group without server 1", lambda: ids() == ["0"], run)
    writer = _procs("asyncrl.roles.environment", f"/{run_id}")
    for p in writer:  # hold the run while server 1 restarts (vLLM start), so it does not end first
        p.send_signal(signal.SIGSTOP)
    def restarted() -> bool:
        doc = store.get_json(paths.rendezvous("generation", "1"))
        return bool(doc) and doc.get("epoch", 0) > old["epoch"] and _serving(doc)

    t_back = _until("server 1 restarted and serving", restarted, run, timeout_s=400)
    for p in writer:
        p.send_signal(signal.SIGCONT)
    _until("server 1 back in the group", lambda: ids() == ["0", "1"], run)

    # 5. a hung collective: server 0 stops answering during the next broadcast
    stopped = [p for p in _procs("asyncrl.roles.generation", f"/{run_id}") if "--id 0" in " ".join(p.cmdline())]
    t_stop = time.monotonic()
    for p in stopped:
        p.send_signal(signal.SIGSTOP)
    t_alone = _until("a group without server 0", lambda: ids() == ["1"], run,
                     timeout_s=REQUEST_S + 4 * COLLECTIVE_S + 60)
    t_cont = time.monotonic()
    for p in stopped:
        p.send_signal(signal.SIGCONT)
    t_rejoin = _until("server 0 back in the group", lambda: ids() == ["0", "1"], run, timeout_s=4 * COLLECTIVE_S + 60)
    return {"resume_to_first_step_s": round(first_step, 1), "kill_to_regroup_s": round(t_regroup - t_kill, 1),
            "kill_to_serving_s": round(t_back - t_kill, 1), "stop_to_regroup_s": round(t_alone - t_stop, 1),
            "cont_to_rejoined_s": round(t_rejoin - t_cont, 1)}, store


def test_s3_stall_corrupt_object_and_trainer_crash_then_resume(tmp_path):
    runs, run_id = tmp_path / "runs", f"faults-{os.getpid()}"  # unique: processes are found by their run URL
    run_dir = runs / run_id
    train_log = run_dir / "logs" / "training-0.log"
    cli = [sys.executable, "-m", "asyncrl.cli", "run"]
    first = subprocess.Popen(
        [*cli, str(ROOT / "configs/smoke.yaml"), "--set", f"runs_dir={runs}", "--set", f"run_id={run_id}",
         "--set", f"cache_dir={ROOT / '.cache/asyncrl'}", "--set", "generation.num_servers=2", "--set",
         f"timeouts.collective_s={COLLECTIVE_S}", "--set",
         f"training.steps={STEPS}", "--set", "training.checkpoint_every=2", "--set", "eval.every_steps=0",
         "--set", "training.num_processes=2", "--set", "training.zero_stage=3"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ})
    figures: dict[str, dict] = {}
    try:
        _wait_for(train_log, [f"step 1/{STEPS}"], first)
        env = _procs("asyncrl.roles.training", f"/{run_id}")[0].environ()  # the run's S3 endpoint and keys
        os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
        store, paths = S3Store(env["AWS_ENDPOINT_URL"], "asyncrl", timeout_s=10.0), RunPaths("runs", run_id)

        # 1. the S3 server stops answering
        weed = _procs("weed", str(run_dir))
        assert weed, "no SeaweedFS process found"
        for p in weed:
            p.send_signal(signal.SIGSTOP)
        time.sleep(STALL_S)
        for p in weed:
            p.send_signal(signal.SIGCONT)

        # 2. a truncated trajectory object: the trainer is paused (SIGSTOP) while the writer fills its α window, so
        # the newest object is one the trainer has not read yet; its bytes are cut in half (a raw, deliberate PUT)
        trainer = _procs("asyncrl.roles.training", f"/{run_id}")
        for p in trainer:
            p.send_signal(signal.SIGSTOP)
        time.sleep(3)
        keys = [k for k in store.list_keys(paths.groups_prefix("env0")) if paths.parse_group_key(k)]
        bad_key = max(keys, key=lambda k: paths.parse_group_key(k)[1])
        got = store.get_with_metadata(bad_key)
        assert got is not None, bad_key
        data, meta = got
        bad_groups = metadata_groups(meta)  # groups that finish together share an object: one or several
        assert bad_groups is not None and bad_groups >= 1, meta
        # the body is cut and its metadata kept (a writer's bug or bit rot; S3 never stores half a PUT): the reader
        # then knows from the metadata how many groups it skips, whatever else the run is doing at that moment
        store.put_bytes(bad_key, data[: len(data) // 2], metadata=dict(meta))
        for p in trainer:
            p.send_signal(signal.SIGCONT)

        # 3. kill -9 the trainer mid-run, after a checkpoint and a published step past it
        _wait_for(train_log, ["checkpoint 2 committed", f"step 3/{STEPS}"], first)
        pids = _procs("asyncrl.roles.training", f"/{run_id}")
        t_kill = time.monotonic()
        for p in pids:
            p.send_signal(signal.SIGKILL)
        published = max(int(m) for m in re.findall(rf"step (\d+)/{STEPS}", train_log.read_text()))
        out, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            _kill_run(first, run_id, run_dir)
    assert first.returncode != 0 and "training-0 exited with code -9" in out, out[-3000:]
    t_resume = time.monotonic()
    second = subprocess.Popen([*cli, "--resume", run_id, "--set", f"runs_dir={runs}"], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ})
    try:
        gen, store = _generation_faults(second, paths, run_id)
        out2, _ = second.communicate(timeout=600)
    finally:
        if second.poll() is None:
            _kill_run(second, run_id, run_dir)
    assert second.returncode == 0, out2[-3000:] + _logs(run_dir)
    recover_s = gen["resume_to_first_step_s"]
    resumed = int(re.search(r"resuming from checkpoint (\d+)", out2).group(1))
    assert 2 <= resumed <= published < STEPS, (resumed, published)

    s = json.loads((run_dir / "run_summary.json").read_text())
    assert s["final_version"] == STEPS and s["weights_in_sync"] is True
    assert s["generation_restarts"] == 1 and s["weight_group_epoch"] >= 5, s
    assert [x["version"] for x in s["server_checksums"]] == [STEPS, STEPS], s  # both servers in the last group
    # every step trained exactly B groups in the surviving history: the steps lost in the crash were trained
    # again from checkpoint 2's cursors, not added on top
    assert s["groups_trained"] == STEPS * B, s
    assert s["objects_quarantined"] == 1 and s["groups_quarantined"] == bad_groups, (bad_groups, s)
    assert s["groups_consumed"] == s["groups_trained"] + s["groups_dropped_stale"] + s["groups_quarantined"], s
    assert s["groups_written"] == s["groups_consumed"] + s["groups_left_unconsumed"], s
    assert s["groups_left_unconsumed"] >= 0 and s["groups_lost_at_restart"] >= 0, s
    assert f"quarantined undecodable group object {bad_key}" in train_log.read_text()
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{runs / 'mlflow.db'}")
    run = client.search_runs(client.get_experiment_by_name("asyncrl").experiment_id,
                             f"tags.`asyncrl.resumed_from` = '{resumed}'")[0]
    assert run.info.status == "FINISHED"
    env_stats = run.data.metrics  # the last values the trainer logged from the writer's rollout stats
    assert env_stats["rollout/lost_servers"] >= 1 and env_stats["rollout/returned_servers"] >= 1, env_stats
    assert sorted({m.step for m in client.get_metric_history(run.info.run_id, "reward/mean")}) == list(
        range(1, STEPS + 1))
    step_s = sorted(m.value for m in client.get_metric_history(run.info.run_id, "time/step_s"))
    assert not _procs("asyncrl.roles", f"/{run_id}") and not _procs("weed", str(run_dir))

    figures = {
        "s3_stall": {"fault": f"S3 server stopped (SIGSTOP) {STALL_S:.0f} s", "samples_lost": 0,
                     "longest_step_s": round(step_s[-1], 1), "median_step_s": round(step_s[len(step_s) // 2], 1)},
        "corrupt_object": {"fault": "truncated group object (half its bytes)", "quarantined": 1,
                           "samples_lost": G},
        "trainer_crash": {"fault": f"trainer SIGKILL after step {published} (checkpoint every 2)",
                          "kill_to_resume_command_s": round(t_resume - t_kill, 1),
                          "resume_to_first_step_s": round(recover_s, 1), "steps_trained_again": published - resumed,
                          "groups_lost_in_flight": s["groups_lost_at_restart"],
                          "groups_left_unconsumed": s["groups_left_unconsumed"]},
        "generation_kill": {"fault": "generation server 1 SIGKILL mid-generation",
                            "kill_to_group_without_it_s": gen["kill_to_regroup_s"],
                            "kill_to_back_serving_s": gen["kill_to_serving_s"],
                            "requests_resent": int(env_stats["rollout/lost_requests"]),
                            "samples_failed": int(env_stats["rollout/failed_samples"]),
                            "groups_aborted_failed": int(env_stats["rollout/aborted_failed_groups"])},
        "collective_hang": {"fault": f"generation server 0 SIGSTOP during a weight broadcast "
                                     f"(collective deadline {COLLECTIVE_S:.0f} s)",
                            "stop_to_group_without_it_s": gen["stop_to_regroup_s"],
                            "cont_to_rejoined_s": gen["cont_to_rejoined_s"]},
        "totals": {"groups_written": s["groups_written"], "groups_trained": s["groups_trained"],
                   "weight_group_epochs": s["weight_group_epoch"], "generation_restarts": s["generation_restarts"]},
    }
    print(json.dumps(figures))
    if os.environ.get("ASYNCRL_FAULT_RESULTS"):
        out_dir = Path(os.environ["ASYNCRL_FAULT_RESULTS"])
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "embedded_faults.json").write_text(json.dumps(figures, indent=2) + "\n")
