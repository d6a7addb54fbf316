"""The agent sample kind: on a task with `env.agent` set, one sample is one call of the user's agent function, whose
model calls reach the run's generation servers through the episode endpoint.

`AgentKind` is what one sample is for the `RolloutDriver` (admission under α, routing, redundancy, staleness,
group writing): the scheduler's first `Start` of a sample begins its episode task, which opens an endpoint URL for
it (`asyncrl.agents.endpoint`) and calls the agent (`asyncrl.agents.agent_function`) with an OpenAI client on that
URL. Each chat or completion request of the agent is one turn: the request is rendered and recorded
(`asyncrl.agents.transcript`, exact tokens, a new segment where the history does not extend the record); a turn
after the first reports the context growth to the scheduler (`env_stepped`), whose next `Start` says where to
generate; the turn is generated under the same per-token versions and partial rollout as every sample (a request
aborted for a weight update is re-sent with its tokens so far, and stays one turn). When the agent returns, its
reward scores the sample (`sample_scored`).

Faults: the agent raising, returning something that is not a reward, returning without a model call, or running past
`env.agent_timeout_s`, and a failed generation, end the episode as failed (`env_failed`: counted by kind, listed,
replaced within its group by the scheduler); its URL then answers 404, so an agent still running stops at its next
model call. A malformed request is answered with a 4xx OpenAI error and does not end the episode by itself.

Invariants: at most one request of an episode is generated at a time (the endpoint answers a second with 409);
an episode's sample is in its level's record before `sample_scored` is reported; its URL is closed when its task
ends, however it ends.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asyncrl.agents.agent_function import AgentFault, agent_task, call_agent, make_client, resolve_agent
from asyncrl.agents.chat_request import Limits, RequestError, template_renders_tools
from asyncrl.agents.endpoint import EpisodeEndpoint
from asyncrl.agents.session import TurnSession
from asyncrl.agents.transcript import AgentTranscript
from asyncrl.models.prompts import stop_token_ids
from asyncrl.models.tokenizer import load_tokenizer
from asyncrl.roles.agentic import MAX_FAILED_LISTED, EpisodeLevel, LevelEpisodes
from asyncrl.roles.context import instance_index
from asyncrl.roles.generation_servers import log_lost
from asyncrl.roles.rollout_driver import RolloutDriver, sample_seed
from asyncrl.rollout.scheduler import Start
from asyncrl.rpc.http import RemoteError

log = logging.getLogger(__name__)


class _Episode(TurnSession):
    """One live episode: its transcript, the scheduler's Starts for it, and the endpoint session it serves."""

    def __init__(self, kind: AgentKind, first: Start, level: EpisodeLevel) -> None:
        super().__init__(kind.tokenizer, kind.limits, kind.renders_tools, f"{first.group_id}-{first.sample_index}")
        self.kind, self.level, self.gid, self.idx = kind, level, first.group_id, first.sample_index
        self.transcript = AgentTranscript.for_tokenizer(kind.tokenizer)
        self.starts: asyncio.Queue[Start] = asyncio.Queue()
        self.starts.put_nowait(first)
        self.ended = asyncio.Event()
        self.last_finish = "stop"
        self.generate_error: Exception | None = None
        self.task: asyncio.Task | None = None

    async def turn(self, rendered: str, max_tokens: int) -> tuple[str, str, int, int]:
        """Record, schedule and generate one turn; (reply text, finish reason, prompt tokens, reply tokens)."""
        k = self.kind
        if self.ended.is_set() or self.gid not in k.levels:
            raise RequestError("episode: ended (its group was closed)", status=404, kind="not_found_error")
        if self.generate_error is not None:
            raise RequestError(f"episode: a generation of this episode failed ({self.generate_error}); it ends",
                               status=502, kind="server_error")
        if self.turns >= k.env_cfg.max_turns:
            raise RequestError(f"episode: all env.max_turns = {k.env_cfg.max_turns} model calls are used",
                               kind="max_turns_exceeded")
        segments_before = self.transcript.segment_count
        context = self.transcript.begin_turn(rendered)
        if self.transcript.segment_count > segments_before and segments_before:
            k.new_segments += 1
        if len(context) >= k.cfg.generation.max_model_len:
            raise RequestError(f"messages: {len(context)} tokens do not fit the model's context "
                               f"(generation.max_model_len = {k.cfg.generation.max_model_len})",
                               kind="context_length_exceeded")
        if self.turns:
            await k.driver.apply(k.sched.env_stepped(self.gid, self.idx, self.transcript.pending_between, False))
        done_before = 0
        while True:
            start = await self._next_start()
            try:
                aborted = await k.generate(start, self.level, self.transcript, max_tokens - done_before)
            except RemoteError as err:
                self.generate_error = err
                raise RequestError(f"generation failed: {err}", status=502, kind="server_error") from err
            done_before = len(self.transcript.current_turn_ids())
            if not aborted:
                break
        self.turns += 1
        ids = self.transcript.current_turn_ids()
        self.last_finish = "stop" if ids and ids[-1] in k.stop_ids else "length"
        text = k.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        return text, self.last_finish, len(context), len(ids)

    async def _next_start(self) -> Start:
        """The scheduler's next Start for this episode; RequestError 404 if the episode ends first."""
        getting = asyncio.ensure_future(self.starts.get())
        ending = asyncio.ensure_future(self.ended.wait())
        try:
            await asyncio.wait({getting, ending}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ending.cancel()
        if not getting.done():
            getting.cancel()
            raise RequestError("episode: ended while its turn waited to be scheduled", status=404,
                               kind="not_found_error")
        return getting.result()


class AgentKind(LevelEpisodes):
    """The `SampleKind` of an agent task (see the module docstring)."""

    local_decisions_first = True
    skipped_long_prompts = 0

    def __init__(self, driver: RolloutDriver) -> None:
        cfg = driver.cfg
        env = cfg.env
        assert env is not None and env.agent is not None
        super().__init__()
        self.driver, self.cfg, self.sched, self.gens, self.env_cfg = driver, cfg, driver.sched, driver.gens, env
        self.agent = resolve_agent(env.agent)
        self.tokenizer = load_tokenizer(driver.ctx.model_folder())
        self.stop_ids = stop_token_ids(self.tokenizer, driver.ctx.model_folder(), chat=True)
        ro = cfg.rollout
        self.limits = Limits(ro.temperature, ro.top_p, ro.max_new_tokens)
        self.renders_tools = template_renders_tools(self.tokenizer)
        self.endpoint = EpisodeEndpoint(request_timeout_s=ro.request_timeout_s + cfg.timeouts.http_s)
        self.threads = ThreadPoolExecutor(max_workers=env.agent_threads, thread_name_prefix="agent")
        self._endpoint_started: asyncio.Task | None = None
        self.writer_index = instance_index(driver.ctx.role_id)
        self.prompt_estimate = 64  # an agent's prompt is unknown until it calls the model
        self.task_name = f"agent:{env.agent}"
        self.faults: dict[str, int] = {}
        self.failed_episodes: list[str] = []
        self.episodes_finished = self.successes = self.turns_total = self.new_segments = 0

    # ---- admission and decisions ---------------------------------------------------------------------
    def start(self, d: Start) -> asyncio.Task | None:
        key = (d.group_id, d.sample_index)
        ep = self.episodes.get(key)
        if ep is not None:  # the next turn, or a re-sent continuation, of a live episode
            ep.starts.put_nowait(d)
            return None
        level = self.levels.get(d.group_id)
        if level is None:
            return None
        ep = self.episodes[key] = _Episode(self, d, level)
        ep.task = asyncio.create_task(self.run_episode(ep))
        return ep.task

    # ---- one episode ---------------------------------------------------------------------------------
    async def _ensure_endpoint(self) -> None:
        if self._endpoint_started is None:
            self._endpoint_started = asyncio.ensure_future(self.endpoint.start())
        await asyncio.shield(self._endpoint_started)

    async def run_episode(self, ep: _Episode) -> None:
        gid, idx, env = ep.gid, ep.idx, self.env_cfg
        url = None
        try:
            await self._ensure_endpoint()
            url = self.endpoint.open_episode(ep)
            task = agent_task(env, ep.level.seed, "train")
            client = make_client(self.agent, url, self.endpoint.request_timeout_s)
            result = await call_agent(self.agent, client, task, env.agent_timeout_s, self.threads)
            if ep.generate_error is not None:
                raise AgentFault("generate", f"generation failed during the episode: {ep.generate_error}")
            if ep.turns == 0:
                raise AgentFault("no_model_call", "agent returned without calling the model")
            level = self.levels.get(gid)
            if level is None:
                return
            sample = ep.transcript.to_sample(gid, idx, result.reward, ep.last_finish)
            level.samples[idx] = sample
            self.episodes_finished += 1
            self.successes += int(bool(result.success if result.success is not None else result.reward > 0))
            self.turns_total += ep.transcript.num_turns
            self.driver.sample_finished(sample.reward)
            await self.driver.apply(self.sched.env_stepped(gid, idx, 0, done=True))
            await self.driver.apply(self.sched.sample_scored(gid, idx, sample.reward))
        except AgentFault as fault:
            self._fail(ep, fault.kind, str(fault))
            await self.driver.apply(self.sched.env_failed(gid, idx))
        except Exception as err:  # noqa: BLE001 - a bug or a bad setting must fail the episode, not hang its group
            log.exception("agent episode %s/%d failed: %s", gid, idx, err)
            self._fail(ep, "internal", f"internal: {err}")
            await self.driver.apply(self.sched.sample_failed(gid, idx))
        finally:
            ep.ended.set()
            self.episodes.pop((gid, idx), None)
            if url is not None:
                self.endpoint.close_episode(url)

    def _fail(self, ep: _Episode, kind: str, reason: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1
        log.warning("agent episode %s/%d failed (%s): %s", ep.gid, ep.idx, kind, reason)
        if len(self.failed_episodes) < MAX_FAILED_LISTED:
            self.failed_episodes.append(f"{ep.gid}/{ep.idx}: {kind}: {reason}")

    async def generate(self, d: Start, level: EpisodeLevel, transcript: AgentTranscript, max_tokens: int) -> bool:
        """One request of the open turn; True when it was aborted (the scheduler's next Start continues it)."""
        ro = self.cfg.rollout
        context = transcript.context_ids()
        budget = min(max_tokens, self.cfg.generation.max_model_len - len(context))
        if budget <= 0:
            raise RemoteError(f"episode {d.group_id}/{d.sample_index}: no token budget left in the context")
        try:
            out = await self.gens[d.server].generate(
                d.request_id, context, max_tokens=budget, temperature=ro.temperature, top_p=ro.top_p,
                seed=sample_seed(self.cfg.generation.seed + 1009 * d.turn, level.seq, d.sample_index,
                                 ro.samples_per_prompt),
                stop_token_ids=self.stop_ids, timeout_s=ro.request_timeout_s, min_version=d.start_version)
        except RemoteError as err:
            if not err.server_unavailable:
                raise
            log_lost(d, err)
            await self.driver.apply(self.sched.request_lost(d.group_id, d.sample_index))
            return True
        transcript.add_generated(out.token_ids, out.logprobs, out.token_versions, out.start_version)
        aborted = out.finish_reason == "abort"
        if not aborted and not out.token_ids:
            raise RemoteError(f"episode {d.group_id}/{d.sample_index}: the server returned no token")
        await self.driver.apply(self.sched.request_finished(d.group_id, d.sample_index, len(out.token_ids), aborted))
        return aborted

    # ---- metrics and shutdown ------------------------------------------------------------------------
    def extra_stats(self) -> dict[str, Any]:
        return {"failed_episodes": list(self.failed_episodes)}

    def extra_metrics(self) -> dict[str, float]:
        n = max(1, self.episodes_finished)
        metrics = {"env/episodes": float(self.episodes_finished), "env/success_rate": self.successes / n,
                   "env/mean_turns": self.turns_total / n, "env/faults": float(sum(self.faults.values())),
                   "agent/new_segments": float(self.new_segments),
                   "agent/endpoint_requests": float(self.endpoint.requests),
                   "agent/endpoint_errors": float(self.endpoint.errors)}
        metrics.update({f"env/faults_{k}": float(v) for k, v in sorted(self.faults.items())})
        return metrics

    async def close(self) -> None:
        await self.endpoint.stop()  # an agent thread still running gets errors from its next model call
        self.threads.shutdown(wait=False, cancel_futures=True)
        log.info("agent episodes finished %d, success %d, faults %s", self.episodes_finished, self.successes,
                 self.faults or "none")
