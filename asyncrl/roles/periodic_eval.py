"""Held-out evaluation during training (`eval.every_steps`), run by the first environment writer in every mode.

Before its first rollout the writer records the warm start (`point(0)`: the trainer cannot step before it has
groups, so the servers still hold version 0; a resumed run records the version they serve). Then, while the run
trains, `PeriodicEval.run` evaluates the generation servers' current weights on the held-out split
(the task's verifier, greedy; an agentic task's held-out levels) each time the trainer has published a version at
or past the next due point (every, 2·every, ..., and always the run's final version, `training.steps`: the end of
the curve, which the run summary reports as `eval_accuracy_after`); it returns once that point is recorded. The
trainer waits (bounded) for the final point before it writes the run's `done` marker, so the point is logged while
the servers still serve. Its requests go straight to
the servers (`asyncrl.evaluation`), never through the rollout scheduler, so they are never training samples.

Attribution: a point belongs to the weight version that generated its tokens. An evaluation whose requests span a
weight update (a request's tokens from two versions, or requests from different versions) is re-run, up to
`eval.attempts` times; the last attempt is then recorded at its newest version with `eval/mixed_requests` > 0. A
version already recorded is not recorded again. Each point is written to S3 as `eval/<version>.json` (written once,
by conditional PUT); the trainer logs it as `eval/*` metrics at that step
(`asyncrl.storage.eval_points.unseen_points`, read by the training report's thread). A failed evaluation (a server restarting) is logged and tried again at the next poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Any

from asyncrl.evaluation.agent_eval import evaluate_agent
from asyncrl.evaluation.agentic import evaluate_agentic
from asyncrl.evaluation.single_turn import evaluate
from asyncrl.models.prompts import prompt_format, stop_token_ids
from asyncrl.rewards.custom import scorer_for
from asyncrl.roles.context import RoleContext
from asyncrl.storage.eval_points import eval_key
from asyncrl.storage.s3 import ObjectExists
from asyncrl.tasks.datasets import load_split

log = logging.getLogger(__name__)
POLL_S = 1.0


def next_due(version: int, every: int, last: int) -> int:
    """The first due point after `version`: the next multiple of `every`, or `last` (the run's final version, always
    a point: the end of the curve) if that comes first."""
    return min((version // every + 1) * every, last)


def point_metrics(result: dict[str, Any], wall_s: float, attempts: int) -> dict[str, float]:
    """The `eval/*` metrics of one evaluation result."""
    out = {"eval/accuracy": float(result["accuracy"]), "eval/correct": float(result["correct"]),
           "eval/n": float(result["n"]), "eval/mixed_requests": float(result.get("mixed", 0)),
           "eval/wall_s": wall_s, "eval/attempts": float(attempts)}
    if "pass_at_k" in result:
        out.update({"eval/pass_at_k": float(result["pass_at_k"]), "eval/k": float(result["k"]),
                    "eval/pass_k_n": float(result["pass_k_n"])})
    for key in ("mean_reward", "mean_turns"):
        if key in result:
            out[f"eval/{key}"] = float(result[key])
    if "faults" in result:  # agentic and agent tasks: held-out episodes whose environment or agent failed
        out["eval/faults"] = float(len(result["faults"]))
    return out


class PeriodicEval:
    def __init__(self, ctx: RoleContext, server_urls: list[str], tokenizer: Any,
                 model_folder: Path | None = None) -> None:
        self.ctx, self.cfg = ctx, ctx.cfg
        self.every, self.attempts = self.cfg.eval.every_steps, self.cfg.eval.attempts
        self.server_urls, self.tokenizer = server_urls, tokenizer
        self.model_folder = model_folder
        self.problems = load_split(self.cfg.task, "eval") if self.cfg.env is None else []
        self.recorded: set[int] = set()
        self.points = 0

    async def evaluate_once(self) -> dict[str, Any]:
        cfg, tag = self.cfg, f"periodic-eval-{self.points}"
        deadline = cfg.eval_request_timeout_s  # long answers on a busy engine take longer than one HTTP exchange
        if cfg.env is not None and cfg.env.agent is not None:
            return await evaluate_agent(self.server_urls, cfg, self.tokenizer, timeout_s=deadline, tag=tag,
                                        model_folder=self.model_folder)
        if cfg.env is not None:
            return await evaluate_agentic(self.server_urls, cfg, self.tokenizer, timeout_s=deadline, tag=tag)
        prompt = prompt_format(cfg, self.tokenizer)  # the prompts as the rollout sends them, ended by every end id
        stop_ids = stop_token_ids(self.tokenizer, self.model_folder, chat=prompt.format == "chat")
        return await evaluate(self.server_urls, self.problems, self.tokenizer, task=cfg.task.name,
                              max_new_tokens=cfg.rollout.max_new_tokens, timeout_s=deadline, tag=tag,
                              scorer=scorer_for(cfg.task), pass_k=cfg.eval.pass_k,
                              pass_k_problems=cfg.eval.pass_k_prompts, temperature=cfg.rollout.temperature,
                              top_p=cfg.rollout.top_p, prompt=prompt, stop_ids=stop_ids)

    async def trainer_version(self) -> int:
        doc = await asyncio.to_thread(self.ctx.store.get_json, self.ctx.paths.versions_latest())
        return int(doc.get("version", 0)) if isinstance(doc, dict) else 0

    async def run(self) -> None:
        """Evaluate at every due point, the run's final version included, then return; or until cancelled (the
        environment role cancels it when it stops)."""
        last = self.cfg.training.steps
        due = next_due(max(self.recorded), self.every, last) if self.recorded else 0
        while not self.recorded or max(self.recorded) < last:
            if await self.trainer_version() >= due:
                version = await self.point(due)
                if version is not None:
                    due = next_due(version, self.every, last)
            await asyncio.sleep(POLL_S)

    async def point(self, due: int) -> int | None:
        """One evaluation (re-run while mixed); the version recorded, or None (failed, the servers still behind
        `due`, or that version already recorded)."""
        result: dict[str, Any] = {}
        t0 = time.monotonic()
        for attempt in range(1, self.attempts + 1):
            try:
                result = await self.evaluate_once()
            except Exception as err:  # noqa: BLE001 - a server restarting: try again at the next poll
                log.warning("periodic eval: evaluation failed (%s); retrying", err)
                return None
            if result["versions"] and len(result["versions"]) == 1 and not result.get("mixed"):
                break
            log.info("periodic eval: attempt %d spans versions %s (%d mixed requests)", attempt, result["versions"],
                     result.get("mixed", 0))
        if not result.get("versions"):
            return None
        version = int(result["versions"][-1])
        if version < due or version in self.recorded:
            return None
        metrics = point_metrics(result, time.monotonic() - t0, attempt)
        doc = {"version": version, "metrics": metrics, "time": time.time()}
        with contextlib.suppress(ObjectExists):  # recorded before a restart of this role: keep the first
            await asyncio.to_thread(self.ctx.store.put_json, eval_key(self.ctx.paths, version), doc, if_absent=True)
        self.recorded.add(version)
        self.points += 1
        log.info("periodic eval: version %d accuracy %.3f (%d/%d)", version, metrics["eval/accuracy"],
                 int(metrics["eval/correct"]), int(metrics["eval/n"]))
        return version
