"""Agents through the OpenAI-compatible episode endpoint, end to end: `asyncrl run` with `env.agent` naming a
FrozenLake agent written with the official `openai` client (tests/helpers/agent_functions.py), on vLLM, DeepSpeed,
SeaweedFS and MLflow.

The model is the agentic tiny model with a chat template built here that re-renders history differently when the
conversation opens with a system message (earlier replies are dropped, as Qwen3's template drops earlier thinking).
The agent opens even seeds with a system message, so one run has both kinds of episode. Checked:
- every trained turn is exactly what the agent was answered (its text, its token count), turn by turn;
- an episode whose history extends the record is one segment; a re-rendered one has one segment per turn;
- the trained context is exactly what the engine decoded from: the engine's log-probs of version-0 tokens equal
  the trainer's (the initial weights, recomputed with transformers on each segment's own context);
- an agent that raises or returns without calling the model ends its training episode with a recorded fault, is
  replaced, and is never trained on; a held-out agent that outlives its deadline is a recorded fault at every
  evaluation point, and the run goes on; it finishes with held-out success before and after.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import mlflow
import psutil
import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from asyncrl.config import load_config
from asyncrl.models.tokenizer import CHAT_TEMPLATE, load_tokenizer
from asyncrl.tiny_model.build import build_tiny_model
from asyncrl.training.segments import split_segments
from tests.helpers.env_vars import restored_env
from tests.helpers.run_groups import stats_and_groups
from tests.helpers.subprocess_runs import run_embedded

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "agent-endpoint-test"
AGENT = "tests.helpers.agent_functions:frozenlake_via_openai"
# the built-in template, except that with a system message first, earlier assistant replies render empty
RERENDERING_TEMPLATE = (
    "{{ bos_token }}{% set rerender = messages[0]['role'] == 'system' %}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }}"
    "{% if message['role'] == 'assistant' and rerender %}{{ '' }}{% else %}{{ message['content'] }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def model_with_rerendering_template(dest: Path) -> Path:
    """The agentic job's tiny model (built or found in the shared cache), copied with the test's chat template."""
    cfg = load_config(ROOT / "configs/agentic.yaml", [f"cache_dir={ROOT / '.cache/asyncrl'}"])
    shutil.copytree(build_tiny_model(cfg), dest)
    tok_cfg = json.loads((dest / "tokenizer_config.json").read_text())
    assert tok_cfg["chat_template"] == CHAT_TEMPLATE
    tok_cfg["chat_template"] = RERENDERING_TEMPLATE
    (dest / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    (dest / "chat_template.jinja").unlink(missing_ok=True)
    return dest


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    model = model_with_rerendering_template(runs / "model")
    doc = yaml.safe_load((ROOT / "configs/agentic.yaml").read_text())
    doc["model"] = {"path": str(model)}
    # a deadline a multi-turn training episode keeps on a loaded two-core host, and a held-out overrun well past it
    doc["env"].update(agent=AGENT, num_eval=8, agent_timeout_s=10.0, params={**doc["env"]["params"], "overrun_s": 15})
    doc["rollout"].update(prompts_per_step=4, samples_per_prompt=4, replace_failed=3, stats_interval_s=0.5)
    doc["training"].update(steps=3, micro_batch_size=16)
    config = runs / "agent_endpoint.yaml"
    config.write_text(yaml.safe_dump(doc))
    record = runs / "conversations.jsonl"
    with restored_env(("ASYNCRL_TEST_AGENT_RECORD", "ASYNCRL_TEST_AGENT_FAULTS")):
        os.environ["ASYNCRL_TEST_AGENT_RECORD"] = str(record)
        os.environ["ASYNCRL_TEST_AGENT_FAULTS"] = "1"
        stdout = run_embedded(config, runs, RUN_ID)
    conversations = [json.loads(line) for line in record.read_text().splitlines()]
    return runs / RUN_ID, config, model, conversations, stdout


def _turns(sample) -> list[list[int]]:
    """The generated token ids of each turn (the loss-mask-1 run that starts at each turn offset)."""
    out, mask = [], sample.mask()
    for start in sample.turn_offsets:
        end = start
        while end < len(mask) and mask[end]:
            end += 1
        out.append(sample.token_ids[start:end])
    return out


def test_the_run_finishes_with_held_out_success(finished_run):
    run_dir, config, _, conversations, stdout = finished_run
    cfg = load_config(config)
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert summary["final_version"] == cfg.training.steps and summary["weights_in_sync"] is True
    assert summary["samples_trained"] == cfg.training.steps * cfg.rollout.prompts_per_step * \
        cfg.rollout.samples_per_prompt
    assert "held-out success rate" in stdout
    held_out = [c["seed"] for c in conversations if c["split"] == "eval"]
    assert len(held_out) >= 2 * (cfg.env.num_eval - 1) and 3 not in held_out  # before and after; level 3 overruns


def test_every_trained_turn_is_exactly_what_the_agent_was_answered(finished_run, monkeypatch):
    run_dir, config, model, conversations, _ = finished_run
    tok = load_tokenizer(model)
    _, groups = stats_and_groups(run_dir, config, monkeypatch)
    by_seed: dict[int, list[dict]] = {}
    for c in conversations:
        if c["split"] == "train":
            by_seed.setdefault(c["seed"], []).append(c)
    kinds = {"extended": 0, "segmented": 0}
    for g in groups:
        assert g.task == f"agent:{AGENT}" and g.prompt_index >= 1_000_000
        for s in g.samples:
            s.validate()
            turns = _turns(s)
            replies = [tok.decode(t, skip_special_tokens=True) for t in turns]
            match = [c for c in by_seed[g.prompt_index] if c["replies"] == replies]
            assert match, (g.prompt_index, replies)
            assert [len(t) for t in turns] == match[0]["tokens"]
            system = match[0]["system"]
            assert system == (g.prompt_index % 2 == 0)
            if system:
                assert len(s.segment_offsets or []) == len(turns) - 1
            else:
                assert s.segment_offsets is None
            if len(turns) > 1:
                kinds["segmented" if system else "extended"] += 1
    assert kinds["extended"] > 0 and kinds["segmented"] > 0, kinds


def test_the_trained_context_is_what_the_engine_decoded_from(finished_run, monkeypatch):
    run_dir, config, model, _, _ = finished_run
    _, groups = stats_and_groups(run_dir, config, monkeypatch)
    policy = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    compared, worst = 0, 0.0
    for g in groups:
        for s in g.samples:
            for row in split_segments(s):
                ids = row.prompt_token_ids + row.token_ids
                with torch.no_grad():
                    logits = policy(input_ids=torch.tensor([ids])).logits[0].double()
                logp = torch.log_softmax(logits, dim=-1)
                p = len(row.prompt_token_ids)
                for k, (tid, lp, v, m) in enumerate(zip(row.token_ids, row.logprobs, row.token_versions,
                                                        row.mask(), strict=True)):
                    if m and v == 0:
                        worst = max(worst, abs(float(logp[p + k - 1, tid]) - lp))
                        compared += 1
    assert compared > 50 and worst < 2e-3, (compared, worst)


def test_agent_faults_are_counted_replaced_and_never_trained(finished_run, monkeypatch):
    run_dir, config, _, _, _ = finished_run
    stats, groups = stats_and_groups(run_dir, config, monkeypatch)
    m = stats["metrics"]
    for kind in ("raised", "no_model_call"):
        assert m.get(f"env/faults_{kind}", 0) == 1, (kind, m)
    assert m["rollout/replaced_samples"] >= 1 and m["agent/new_segments"] >= 1
    assert m["agent/endpoint_requests"] > m["env/episodes"]
    failed = {line.split(":")[0] for line in stats["failed_episodes"]}
    written = {f"{g.group_id}/{s.sample_index}" for g in groups for s in g.samples}
    assert len(failed) == 2 and not failed & written


def test_mlflow_has_the_agent_metrics(finished_run):
    run_dir, config, _, _, _ = finished_run
    cfg = load_config(config)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run_dir.parent / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name(cfg.tracking.experiment).experiment_id],
                                "tags.`asyncrl.child` IS NULL")
    for name in ("env/success_rate", "env/faults", "agent/new_segments", "agent/endpoint_requests"):
        assert client.get_metric_history(run.info.run_id, name), name
    # held-out level 3's agent outlives env.agent_timeout_s at every point: a recorded fault, and the run went on
    faults = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "eval/faults")}
    assert faults == {0: 1.0, cfg.training.steps: 1.0}


def test_no_process_left(finished_run):
    run_dir = finished_run[0]
    leftovers = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if str(run_dir) in cmd or RUN_ID in cmd:
            leftovers.append((p.info["pid"], cmd))
    assert leftovers == []
