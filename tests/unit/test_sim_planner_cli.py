"""The planner picks a choice from its grid; `asyncrl simulate` and `asyncrl plan` run end to end."""

import json

import pytest

from asyncrl.cli import main
from asyncrl.sim.planner import PlanRequest, make_plan
from asyncrl.sim.theory import async_step_bound, best_train_share, max_speedup


def test_theory_formulas_by_hand():
    # N=100, K=10, mu_gen=2, L=50, mu_train=1, alpha=1, E=1: (100/10)(2+1) + 50/2 = 55
    assert async_step_bound(100, 10, 2.0, 50.0, 1.0, 1) == 55.0
    # beta* = 100·1 / (100·2 + 10·50/2 + 100·1) = 100/550
    assert best_train_share(100, 10, 2.0, 50.0, 1.0, 1) == pytest.approx(100 / 550)
    # 1 + 10·50 / (100·3) = 1 + 5/3
    assert max_speedup(100, 10, 2.0, 50.0, 1.0) == pytest.approx(1 + 5 / 3)


def test_planner_returns_a_choice_from_its_grid():
    plan = make_plan(PlanRequest(gpus=8, median_tokens=1000, max_tokens=8192, samples_per_gpu=8, alphas=(0, 2),
                                 shares=(0.25, 0.5), steps=4, warmup_steps=1))
    assert len(plan.rows) == 3 and plan.best in plan.rows
    assert plan.best["samples_per_s"] == max(r["samples_per_s"] for r in plan.rows)
    assert set(plan.beta_star) == {2} and 0 < plan.beta_star[2] < 1


def test_cli_simulate_writes_json(tmp_path, capsys):
    out = tmp_path / "sim.json"
    main(["simulate", "--set", "gpus=4", "--set", "async_ratio=2", "--set", "steps=4",
          "--set", "workload.median=500", "--set", "cost.max_seqs=64", "--json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["result"]["alpha"] == 2 and doc["cost"]["max_seqs"] == 64 and doc["result"]["steps"] == 4
    assert "samples_per_s" in capsys.readouterr().out


def test_cli_simulate_rejects_an_unknown_key(capsys):
    with pytest.raises(SystemExit) as err:
        main(["simulate", "--set", "nonsense=1"])
    assert err.value.code == 2 and "nonsense" in capsys.readouterr().err


def test_cli_plan(capsys):
    main(["plan", "--gpus", "4", "--model-size", "7e9", "--median-tokens", "500", "--max-tokens", "4096",
          "--samples-per-gpu", "8", "--steps", "3"])
    out = capsys.readouterr().out
    assert "recommended: mode=" in out and "β*" in out
