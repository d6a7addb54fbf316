"""The typed run configuration: every knob of a run, with bounds and cross-field checks.

One `RunConfig` describes a whole run. It is loaded from YAML (`asyncrl.config.load`), validated in
full before any process starts, written to S3 as `config.json`, and read back by every role. Fields
carry bounds; `RunConfig` checks the combinations (a batch the groups cannot fill, a loss option
that the chosen loss does not have, ...). Unknown keys are errors, so a typo never passes silently.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from asyncrl.config.loss_params import (
    MOVED_KEYS,
    LossParams,
    loss_params_class,
    parse_loss_params,
    registered_losses,
    resolve_loss,
)
from asyncrl.envs.injection import EnvInjectionConfig  # the environments own their injection settings
from asyncrl.rollout.overlong import Overlong
from asyncrl.rollout.scheduler import PartialRollout, Routing, SchedulerConfig

_SCHED = SchedulerConfig()  # the scheduler's knobs' defaults: the rollout section takes its defaults from it


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


JSONL_MIN_PROMPT_TOKENS = 2
"""A jsonl prompt's fewest tokens (BOS + at least one): what `TaskConfig.max_prompt_tokens` can promise unread."""
FILE_TASK_SUFFIXES = (".parquet", ".json", ".jsonl")
"""The files task.name file reads (by suffix, case-insensitive)."""
RESERVED_DATASET_PARAMS = frozenset({"seed", "size"})
"""reasoning-gym config keys asyncrl sets itself (from task.seed and the split sizes)."""


class TinyModelConfig(_Section):
    """The built-in Qwen2-architecture model, built locally and warm-started by SFT."""

    hidden_size: int = Field(128, ge=64, multiple_of=64, description="Model width; a multiple of the head size 64.")
    num_layers: int = Field(2, ge=1, le=24)
    intermediate_size: int = Field(256, ge=64)
    sft_steps: int = Field(1500, ge=0, le=100_000, description="Most SFT steps of the warm start.")
    sft_batch_size: int = Field(64, ge=1)
    sft_lr: float = Field(2e-3, gt=0, le=1.0)
    sft_target_accuracy: float = Field(
        0.35, gt=0, le=1.0, description="SFT stops once greedy accuracy on a dev set carved from the train split reaches "
        "this (the warm start should solve part of the task)."
    )
    seed: int = 0


class ModelConfig(_Section):
    path: str = Field(
        "", description="Hugging Face model folder, or s3://bucket/path of one (safetensors only; fetched into "
        "cache_dir). Empty: the built-in tiny model, built and cached under cache_dir."
    )
    tiny: TinyModelConfig = TinyModelConfig()


DEFAULT_RUBRIC = ("Problem: {prompt}\nReference answer: {answer}\nStudent's answer: {response}\n"
                  "Does the student's final answer equal the reference answer? Reply with Score: 1 if it does, "
                  "Score: 0 if it does not.")


class JudgeConfig(_Section):
    """A judge model as the reward (asyncrl/rewards/judge.py, docs/reward_api.md): the rubric filled with the problem,
    the response and the reference answer, sent to the judge, its score read by `score_pattern`."""

    url: str | None = Field(None, description="An OpenAI-compatible base URL (e.g. http://judge:8000/v1): the "
                            "rubric goes to its /chat/completions as one user message.")
    model_path: str | None = Field(None, description="A model folder served as the judge by the run itself: its own "
                                   "vLLM server (the judge role), never sent weights. Exactly one of url and "
                                   "model_path.")
    model: str = Field("judge", min_length=1, description="url: the model name sent.")
    api_key_env: str | None = Field(None, pattern=r"^[A-Z_][A-Z0-9_]*$", description="url: the name of the "
                                    "environment variable holding its API key (never the key itself).")
    rubric: str = Field(DEFAULT_RUBRIC, min_length=1, max_length=20_000, description="The judge's prompt; "
                        "{prompt}, {response} and {answer} are replaced (write {{ and }} for braces).")
    reply_prefix: str = Field("", max_length=200, description="model_path only: text the judge's reply starts with "
                              "(written after the generation prompt, and read with the reply), e.g. 'Score:' for a "
                              "small judge that would not write the score's form on its own.")
    score_pattern: str = Field(r"[Ss]core:\s*(-?\d+(?:\.\d+)?)", description="A regular expression with one "
                               "group: the judge's score (its last match in the reply).")
    min_score: float = Field(0.0, description="The lowest score: reward 0.")
    max_score: float = Field(1.0, description="The highest score: reward 1; the reward is linear between, and a "
                             "score outside [min_score, max_score] is a failed judgment.")
    max_tokens: int = Field(32, ge=1, le=4096, description="The judge's reply budget.")
    timeout_s: float = Field(120.0, gt=0, le=3600, description="Deadline of one judge call.")
    attempts: int = Field(3, ge=1, le=10, description="Calls per judgment before it fails (no answer, an error "
                          "status, a reply without a score); a failed judgment fails its sample, never a zero.")
    max_concurrency: int = Field(16, ge=1, le=1024, description="Judge calls at once per reward instance.")
    max_model_len: int = Field(1024, ge=16, le=131072, description="model_path: the judge engine's context.")
    kv_cache_gib: float = Field(0.5, gt=0, le=1024, description="model_path: the judge engine's KV cache.")

    @model_validator(mode="after")
    def _check(self) -> JudgeConfig:
        import re
        import string

        if (self.url is None) == (self.model_path is None):
            raise ValueError("task.judge: expected exactly one of url (an OpenAI-compatible server) and model_path "
                             f"(a model the run serves), got url={self.url!r}, model_path={self.model_path!r}")
        if self.url is not None and not re.match(r"^https?://[^\s/]+", self.url):
            raise ValueError(f"task.judge.url: expected an http(s) URL, got {self.url!r}")
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(self.rubric) if f is not None}
        except ValueError as e:
            raise ValueError(f"task.judge.rubric: not a valid template ({e}); write {{{{ and }}}} for braces") from e
        unknown = sorted(fields - {"prompt", "response", "answer"})
        if unknown:
            raise ValueError(f"task.judge.rubric: unknown fields {unknown}; expected only {{prompt}}, {{response}}, "
                             f"{{answer}}")
        try:
            groups = re.compile(self.score_pattern).groups
        except re.error as e:
            raise ValueError(f"task.judge.score_pattern: not a regular expression: {e}") from e
        if groups != 1:
            raise ValueError(f"task.judge.score_pattern: expected exactly one group (the score), got {groups}")
        if self.reply_prefix and self.url is not None:
            raise ValueError("task.judge.reply_prefix: only with model_path (an OpenAI chat endpoint cannot be given "
                             "the start of its reply)")
        if not self.min_score < self.max_score:
            raise ValueError(f"task.judge: expected min_score < max_score, got {self.min_score} and {self.max_score}")
        return self


class TaskConfig(_Section):
    """The verifiable single-turn task: the built-in arithmetic problems, a reasoning-gym dataset, or the user's own
    files (JSON Lines of {"prompt", "answer"}, or Parquet / JSON / JSON Lines with field mapping).

    Invariants: names "jsonl" and "file" have both train_path and eval_path, the others neither; dataset and
    dataset_params are only for "reasoning_gym" (which needs a dataset), prompt_field, answer_field and answer_format
    only for "file" (the arithmetic fields max_operand and operations are ignored by the others). The files and the
    dataset themselves are checked before a run starts (`asyncrl.tasks.dataset_check`), not here: a role re-validates
    this config on a machine without them (it reads the run's copy of the rows, `asyncrl.tasks.run_copy`).
    """

    name: Literal["arithmetic", "jsonl", "reasoning_gym", "file"] = Field(
        "arithmetic", description="arithmetic: built-in integer problems; jsonl: your own problems from train_path "
        "and eval_path; reasoning_gym: problems generated by the reasoning-gym dataset `dataset` (docs/datasets.md); "
        "file: your own Parquet, JSON or JSON Lines files with field mapping (prompt_field, answer_field).")
    train_path: str = Field("", description="jsonl: local path of the train problems, a JSON Lines file of "
                            "{\"prompt\", \"answer\"} (one object a line; bad rows are skipped and logged); "
                            "answers are checked by exact match after stripping spaces. file: a .parquet, .json (a "
                            "list of objects) or .jsonl file.")
    eval_path: str = Field("", description="jsonl, file: local path of the held-out problems, same format as "
                           "train_path.")
    dataset: str = Field("", description="reasoning_gym: the reasoning-gym dataset's name (e.g. basic_arithmetic, "
                         "chain_sum, gsm_symbolic).")
    dataset_params: dict[str, Any] = Field(default_factory=dict, description="reasoning_gym: that dataset's config "
                                           "keys (e.g. {min_terms: 2, max_terms: 3}); seed and size are asyncrl's "
                                           "(task.seed, num_train, num_eval).")
    prompt_field: str = Field("prompt", min_length=1, description="file: the column or key holding the prompt (a "
                              "GSM8K export: question).")
    answer_field: str = Field("answer", min_length=1, description="file: the column or key holding the answer.")
    answer_format: Literal["raw", "gsm8k"] = Field(
        "raw", description="file: raw (the answer as it is) or gsm8k (the text after the last '####', stripped, "
        "thousands commas removed).")
    num_train: int = Field(1600, ge=1, description="Train problems; capped (with a warning) at all problems not in the "
                           "eval split (jsonl: the first num_train valid rows).")
    num_eval: int = Field(200, ge=1, description="Held-out problems, disjoint from train (jsonl: the first num_eval "
                          "valid rows).")
    max_operand: int = Field(29, ge=1, le=10**6, description="Operands are drawn from 0..max_operand.")
    operations: list[Literal["+", "-", "*"]] = Field(default_factory=lambda: ["+", "-"], min_length=1)
    seed: int = 1234
    prompt_format: Literal["auto", "chat", "raw"] = Field(
        "auto", description="How a prompt reaches the model: chat renders it as a user message through the "
        "tokenizer's chat template (with the generation prompt); raw is [bos] + the prompt's tokens; auto is chat "
        "for a model folder (model.path) whose tokenizer has a chat template, else raw (the built-in tiny model). "
        "`asyncrl validate` prints one rendered prompt.")
    system_prompt: str = Field("", max_length=20_000, description="Chat format: a system message before each "
                               "prompt (empty: none, so the template's own default system message applies).")
    reward: str = Field("", description="Your own reward function, 'package.module:function' of (prompt, response, "
                        "answer) -> float (docs/extending.md); empty: the verifier (task.verifier).")
    verifier: Literal["auto", "exact", "math"] = Field(
        "auto", description="The built-in reward when task.reward is empty: exact (the response, up to EOS and "
        "without surrounding spaces, must equal the answer), math (the final answer found in the response, a "
        "\\boxed{}, '#### X', 'the answer is X' or else the last number, compared numerically or symbolically; "
        "docs/reward_api.md), or auto (exact for arithmetic and jsonl, math for the other task names).")
    judge: JudgeConfig | None = Field(None, description="A judge model as the reward instead of task.reward and the "
                                      "verifier (docs/reward_api.md).")
    format_reward: float = Field(0.0, ge=0, lt=1, description="Math verifier only: the reward added when the answer "
                                 "is given in an explicit form (\\boxed{}, '#### X', 'the answer is X'), right or "
                                 "wrong; below 1, so a correct answer always scores above a wrong one; 0: the reward "
                                 "is exactly 0 or 1.")

    @field_validator("reward")
    @classmethod
    def _check_reward(cls, v: str) -> str:
        if v:
            from asyncrl.rewards.custom import load_reward_fn

            load_reward_fn(v)  # importable, a function of (prompt, response, answer): ValueError names the path
        return v

    @model_validator(mode="after")
    def _check_judge(self) -> TaskConfig:
        if self.judge is not None and self.reward:
            raise ValueError(f"task.judge: a judge replaces task.reward; set one of them, got task.reward "
                             f"{self.reward!r} too")
        return self

    @model_validator(mode="after")
    def _check_format_reward(self) -> TaskConfig:
        if self.format_reward and (self.reward or self.resolved_verifier() != "math"):
            why = "task.reward is set" if self.reward else f"task.verifier resolves to {self.resolved_verifier()}"
            raise ValueError(f"task.format_reward: only with the math verifier (task.verifier: math, or auto with a "
                             f"task.name other than arithmetic and jsonl) and no task.reward; {why}, got "
                             f"{self.format_reward}")
        return self

    def resolved_verifier(self) -> Literal["exact", "math"]:
        """The built-in verifier of this task: `verifier`, or for auto exact for arithmetic and jsonl, math for any
        other task name. (`reward`, when set, overrides both.)"""
        if self.verifier != "auto":
            return self.verifier
        return "exact" if self.name in ("arithmetic", "jsonl") else "math"

    @model_validator(mode="after")
    def _check_split_sizes(self) -> TaskConfig:
        self._check_task_fields()
        if self.name == "jsonl":
            for key in ("train_path", "eval_path"):
                if not getattr(self, key).strip():
                    raise ValueError(f"task.{key}: expected the path of a JSON Lines file of {{\"prompt\", "
                                     f"\"answer\"}} rows (task.name jsonl needs train_path and eval_path)")
            return self
        if self.name == "file":
            for key in ("train_path", "eval_path"):
                path = getattr(self, key).strip()
                if not path.lower().endswith(FILE_TASK_SUFFIXES):
                    raise ValueError(f"task.{key}: expected the path of a .parquet, .json or .jsonl file "
                                     f"(task.name file needs train_path and eval_path), got {path!r}")
            return self
        for key in ("train_path", "eval_path"):
            if getattr(self, key):
                raise ValueError(f"task.{key}: only for task.name jsonl or file (the {self.name} task generates its "
                                 f"own problems); remove it or set task.name: jsonl, got {getattr(self, key)!r}")
        if self.name == "reasoning_gym":
            return self
        universe = (self.max_operand + 1) ** 2 * len(self.operations)
        if self.num_eval >= universe:
            raise ValueError(
                f"task.num_eval: expected fewer than the {universe} distinct problems of max_operand="
                f"{self.max_operand} and operations={self.operations} (some must be left for training), got {self.num_eval}"
            )
        return self

    def _check_task_fields(self) -> None:
        """The fields of one task name set only with that name (a field of another task is a mistake)."""
        if self.name == "reasoning_gym":
            if not self.dataset.strip():
                raise ValueError("task.dataset: expected a reasoning-gym dataset name such as basic_arithmetic, "
                                 "chain_sum or gsm_symbolic (task.name reasoning_gym needs one)")
            owned = sorted(RESERVED_DATASET_PARAMS & set(self.dataset_params))
            if owned:
                raise ValueError(f"task.dataset_params: {owned} are set by asyncrl (task.seed, task.num_train, "
                                 f"task.num_eval); remove them")
        else:
            for key in ("dataset", "dataset_params"):
                if getattr(self, key):
                    raise ValueError(f"task.{key}: only for task.name reasoning_gym; remove it or set task.name: "
                                     f"reasoning_gym, got {getattr(self, key)!r}")
        if self.name != "file":
            for key in ("prompt_field", "answer_field", "answer_format"):
                default = TaskConfig.model_fields[key].default
                if getattr(self, key) != default:
                    raise ValueError(f"task.{key}: only for task.name file (default {default!r}); remove it or set "
                                     f"task.name: file, got {getattr(self, key)!r}")

    def max_prompt_tokens(self) -> int:
        """Longest prompt in tokens, a bound the config can know without reading files.

        arithmetic (exact): BOS, two operands (a '-' sign is never in a prompt), operator, '='. jsonl, file and
        reasoning_gym: a lower bound, BOS and one token (a prompt is never empty); which prompts really fit is checked
        per prompt with the model's tokenizer before a run starts and when the environment role loads them
        (`asyncrl.tasks.prompt_fit`).
        """
        if self.name != "arithmetic":
            return JSONL_MIN_PROMPT_TOKENS
        return 1 + 2 * len(str(self.max_operand)) + 2


class EnvConfig(_Section):
    """An agentic task: a registered environment driven over several turns (see asyncrl.envs)."""

    name: str = Field("frozenlake", min_length=1, description="A registered environment (frozenlake, sokoban, "
                      "tool_use, remote), or your own as an import path package.module:ClassName (docs/extending.md).")
    params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the environment.")
    system_prompt: str = Field("", description="Optional system message before the first observation.")
    max_turns: int = Field(8, ge=1, le=1024, description="Turns (generate + step) before an episode is truncated.")
    executor: Literal["inline", "threads", "processes"] = Field(
        "threads", description="Where environment steps run: on the event loop (natively async environments), in "
        "worker threads, or one worker process per episode (killed at its deadline).")
    max_concurrent_steps: int = Field(32, ge=1, le=65536, description="Environment steps at once per environment type.")
    step_timeout_s: float = Field(30.0, gt=0, le=86400, description="Deadline of one reset or step.")
    hang_report_s: float = Field(60.0, gt=0, description="Report trajectories with no progress for this long.")
    num_eval: int = Field(64, ge=1, le=100_000, description="Held-out levels (seeds 0..num_eval-1; train seeds "
                          "start at 1,000,000).")
    demonstrations: int = Field(48, ge=0, le=100_000, description="Built-in tiny model: solved train levels of the "
                                "supervised warm start.")
    seed: int = 0
    injection: EnvInjectionConfig | None = Field(None, description="Injected latency and faults.")
    agent: str | None = Field(None, min_length=3, description="An agent function 'package.module:function(client, "
                              "task)' run once per episode with an OpenAI client on the episode's own endpoint; it "
                              "returns the reward (docs/agents.md). The environment `name` is then not used.")
    agent_timeout_s: float = Field(300.0, gt=0, le=86400, description="Deadline of one agent episode, from its "
                                   "start to its return: past it the episode fails (a recorded fault).")
    agent_threads: int = Field(256, ge=1, le=4096, description="Threads that run a plain (not async) agent "
                               "function: episodes at once; more wait for a thread.")


class LengthTailConfig(_Section):
    """Benchmark workload shaping: long-tailed decode lengths on a task whose answers are short.

    Each request decodes exactly L tokens (vLLM `ignore_eos`), L drawn from a lognormal with this median and sigma,
    clipped to [1, rollout.max_new_tokens]. The response is scored up to its first EOS and the tokens after it carry
    loss mask 0: generation and training pay for L tokens (like long reasoning), the policy learns from the answer.
    """

    median_tokens: int = Field(16, ge=1, description="Median decode length.")
    sigma: float = Field(1.0, ge=0, le=4, description="Lognormal sigma of the decode length (0: every request decodes the median).")


class RolloutConfig(_Section):
    """What the environment role admits and how it samples and schedules (docs/algorithms.md §1)."""

    mode: Literal["async", "sync"] = Field(
        "async", description="sync: the synchronous baseline (generate a full batch with the current weights, train, "
        "sync, repeat; sets async_ratio to 0)."
    )
    async_ratio: int = Field(_SCHED.async_ratio, ge=0, le=64, description="α: a sample started under version s "
                             "trains at step k only if s >= k - α.")
    prompts_per_step: int = Field(_SCHED.prompts_per_step, ge=1, description="B: prompts (groups) per training step.")
    samples_per_prompt: int = Field(_SCHED.group_size, ge=1, le=1024, description="n: samples of each prompt (the "
                                    "group size).")
    max_new_tokens: int = Field(_SCHED.max_new_tokens, ge=1, description="Longest response.")
    temperature: float = Field(1.0, gt=0, le=10.0, description="Sampling temperature; the trainer's log-probs use it too.")
    top_p: float = Field(1.0, gt=0, le=1.0)
    num_writers: int = Field(1, ge=1, le=64, description="Environment role instances, each writing its own group stream.")
    request_timeout_s: float = Field(120.0, gt=0)
    routing: Routing = Field(
        _SCHED.routing, description="Queue scheduling: each request goes to the server with the least outstanding "
        "tokens (or requests), or round robin."
    )
    replicate_prompts: bool = Field(_SCHED.replicate, description="Route each of a prompt's samples on its own (false: a group's "
                                    "samples all go to one server).")
    extra_samples_per_prompt: int = Field(_SCHED.extra_samples, ge=0, le=1024, description="Redundant samples per group: the first "
                                          "samples_per_prompt to finish are kept, the rest aborted.")
    extra_groups: int = Field(_SCHED.extra_groups, ge=0, le=4096, description="Redundant groups in flight beyond what the steps need; "
                              "the slowest are aborted once their steps are full.")
    dynamic_filter: bool = Field(_SCHED.dynamic_filter, description="Drop (and replace) groups whose rewards are all equal.")
    max_refill: int = Field(_SCHED.max_refill, ge=0, le=1024, description="Dynamic filtering's bound: at most "
                            "max_refill x prompts_per_step groups are dropped (and replaced) per step; past it an "
                            "all-equal group is trained anyway (A = 0) and counted (rollout/refill_exhausted_groups).")
    overlong: Overlong = Field(
        "keep", description="Samples that stop on max_new_tokens without an end token (truncated), single-turn "
        "tasks: keep them; mask them (loss mask all 0, their reward still counts in the group); or soft_penalty "
        "(DAPO: every reward gets ((L_max - L_c) - length) / L_c added when length > L_max - L_c), docs/algorithms.md.")
    overlong_cache_tokens: int | None = Field(None, ge=1, description="L_c of overlong: soft_penalty (null: "
                                              "max_new_tokens // 4); below max_new_tokens.")
    replace_failed: int = Field(_SCHED.replace_failed, ge=0, le=1024, description="Failed samples (a generation, environment or score "
                                "failure) replaced per group by a new sample of the same prompt.")
    reward_attempts: int = Field(4, ge=1, le=20, description="Calls of the reward role per sample: a transient "
                                 "failure (no answer, 429, 5xx) is retried with backoff and jitter; then the sample is "
                                 "dropped and counted, never given a default reward.")
    partial_rollout: PartialRollout = Field(
        _SCHED.partial_rollout, description="On a weight update, running requests continue under the new weights (continue), or "
        "are aborted and re-sent with their partial tokens appended (resubmit)."
    )
    length_tail: LengthTailConfig | None = Field(None, description="Benchmark workload: long-tailed decode lengths.")
    stats_interval_s: float = Field(5.0, gt=0, description="How often the environment role logs its rollout metrics.")

    @model_validator(mode="before")
    @classmethod
    def _sync_means_alpha_zero(cls, data: object) -> object:
        """mode sync trains on-policy: it sets async_ratio to 0 whatever the file says (so `--set rollout.mode=sync`
        on any config gives the baseline of that config)."""
        if isinstance(data, dict) and data.get("mode") == "sync":
            data = {**data, "async_ratio": 0}
        return data

    @model_validator(mode="after")
    def _check_overlong(self) -> RolloutConfig:
        cache = self.overlong_cache_tokens
        if cache is not None and cache >= self.max_new_tokens:
            raise ValueError(f"rollout.overlong_cache_tokens: expected < rollout.max_new_tokens "
                             f"({self.max_new_tokens}), got {cache}")
        if self.overlong == "soft_penalty" and cache is None and self.max_new_tokens // 4 < 1:
            raise ValueError(f"rollout.overlong_cache_tokens: soft_penalty needs L_c >= 1 and its default "
                             f"max_new_tokens // 4 is 0 for max_new_tokens {self.max_new_tokens}; set it or use "
                             f"max_new_tokens >= 4")
        if self.overlong != "keep" and self.length_tail is not None:
            raise ValueError(f"rollout.overlong: expected 'keep' with rollout.length_tail (the benchmark workload "
                             f"decodes every sample to its drawn budget past end tokens), got {self.overlong!r}")
        return self

    def scheduler_config(self, num_servers: int, writer: str, incarnation: int = 0) -> SchedulerConfig:
        """The rollout scheduler of environment writer `writer`: its share of the batch (prompts_per_step /
        num_writers), routing over `num_servers` servers; `incarnation` > 0 after a restart (the groups it had
        written before)."""
        return SchedulerConfig(
            async_ratio=self.async_ratio, prompts_per_step=self.prompts_per_step // self.num_writers,
            group_size=self.samples_per_prompt, num_servers=num_servers, extra_samples=self.extra_samples_per_prompt,
            extra_groups=self.extra_groups, routing=self.routing, replicate=self.replicate_prompts,
            dynamic_filter=self.dynamic_filter, max_refill=self.max_refill, partial_rollout=self.partial_rollout,
            max_new_tokens=self.max_new_tokens,
            writer=writer, replace_failed=self.replace_failed, incarnation=incarnation,
        )


class GenerationConfig(_Section):
    num_servers: int = Field(1, ge=1, le=64, description="vLLM generation servers (one engine each).")
    max_model_len: int = Field(64, ge=16, description="Prompt + response tokens per sequence.")
    kv_cache_gib: float = Field(0.25, gt=0, le=1024, description="KV cache per engine.")
    max_num_seqs: int = Field(64, ge=1)
    cpu_threads: int = Field(1, ge=0, le=1024, description="vLLM CPU build: unpinned OpenMP threads per engine worker "
                             "(0: vLLM's automatic core binding).")
    ring_poll_s: float | None = Field(0.0005, ge=0, le=0.01, description="While vLLM's engine core and workers "
                                      "wait for each other's next message they sleep this long between looks "
                                      "instead of spinning on the core (null: vLLM's own spin, for nodes with "
                                      "cores to spare); see asyncrl/generation/vllm_plugin.py.")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="The engines' weights and activations. "
                                                  "bfloat16: the trainer keeps float32 master weights and pushes "
                                                  "them cast to bfloat16 (half the bytes); fast only where the "
                                                  "hardware has bf16 (GPUs, AVX512-BF16/AMX CPUs); see "
                                                  "docs/generation_performance.md.")
    kv_after_update: Literal["recompute", "keep"] = Field(
        "recompute", description="What a weight update does to the KV cache of the requests in flight. recompute: "
        "dropped and recomputed with the new weights when generation resumes (their later tokens are exactly the new "
        "policy's; the recomputation is a prefill of every running sequence's context at every push). keep: kept, "
        "so later tokens attend to context computed by the old weights (PipelineRL's in-flight update; their "
        "log-probs are the engine's and the trainer's off-policy correction sees the difference). Cached prompts are "
        "never shared across versions either way. See docs/generation_performance.md.")
    seed: int = 0
    tensor_parallel_size: int = Field(1, ge=1, le=64, description="GPUs of one generation server, which vLLM "
                                      "splits the model across (tensor parallelism); must divide the model's "
                                      "attention heads. The pipeline sets it to generation_gpus.")
    max_restarts: int = Field(3, ge=0, le=100, description="Restarts of a generation server that died (the embedded "
                              "launcher restarts it; on a cluster the pipeline's generation task retries its pod as "
                              "often). A restarted server loads the latest committed weights from S3 and rejoins.")


class CriticConfig(_Section):
    """The value model(s) of `training.advantage: gae` (docs/algorithms.md §2, §4): a causal LM with a scalar head,
    trained with MSE to the GAE returns, with its own optimizer; checkpointed with the actor."""

    model_path: str = Field("", description="Critic model folder (a causal LM). Empty: the actor's model.")
    lr: float = Field(5e-4, gt=0, le=1.0, description="The critics' own AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    micro_batch_size: int | None = Field(None, ge=1, description="Samples per critic forward/backward "
                                         "(empty: training.micro_batch_size).")
    warmup_steps: int | None = Field(None, ge=0, description="First steps that train only the critics (the actor "
                                     "is not updated). Empty: 10 with AsyPPO, 0 otherwise.")


class AsyPPOConfig(_Section):
    """AsyPPO (docs/algorithms.md §4): M mini-critics on disjoint shares of each group; their mean value feeds GAE, their
    disagreement masks advantages and filters the entropy bonus."""

    num_critics: int = Field(2, ge=2, le=8, description="M mini-critics.")
    adv_mask_k: float = Field(0.2, ge=0, lt=1, description="Share of response tokens with the lowest critic "
                              "disagreement whose advantage is set to 0.")
    ent_filter_h: float = Field(0.2, ge=0, le=1, description="Share of response tokens with the highest critic "
                                "disagreement that get no entropy bonus.")
    ent_coef: float = Field(0.001, ge=0, le=1, description="β: the entropy bonus of the AsyPPO objective.")


LORA_DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class LoraConfig(_Section):
    """LoRA (docs/algorithms.md §8): the trainer trains adapters `W' = W + (alpha / rank)·B·A` on the named linear
    layers (peft) and every weight push sends only A and B; each generation worker merges them into its served
    weights."""

    rank: int = Field(8, ge=1, le=1024, description="r: the adapters' rank (at most each target's smaller dimension).")
    alpha: float = Field(16.0, gt=0, description="α: the adapters' scale is alpha / rank.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input while training; above 0 the "
                           "proximal log-probs need one more forward pass without it.")
    target_modules: list[str] = Field(list(LORA_DEFAULT_TARGETS), min_length=1, description="Names of the linear "
                                      "layers to adapt (the last part of their module names, e.g. q_proj); each must "
                                      "name a linear layer of the model's decoder layers.")

    @field_validator("target_modules")
    @classmethod
    def _plain_unique_names(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v)]
        if bad:
            raise ValueError(f"expected module names such as 'q_proj', got {bad}")
        if len(set(value)) != len(value):
            raise ValueError(f"expected each name once, got {value}")
        if {"lm_head", "embed_tokens"} & set(value):
            raise ValueError("the embedding and LM head are not adapted (the generation workers merge adapters into "
                             "the decoder layers' linear layers); expected linear layers such as q_proj")
        return value

    @property
    def scale(self) -> float:
        """s = alpha / rank."""
        return self.alpha / self.rank


class SeqCorrectionConfig(_Section):
    """The engine-trainer importance correction on top of the policy loss (docs/algorithms.md §7): a detached weight
    per token from the ratio of the trainer's proximal log-probs to the engine's, per token, per sample (their
    product) or per sample as a geometric mean; truncated at `cap` or masked outside `band`."""

    level: Literal["token", "sequence", "geometric"] = Field(
        "sequence", description="token: w_t = exp(prox − behav); sequence: ρ_i = exp(Σ_t (prox − behav)) over the "
        "sample; geometric: exp of the per-token mean of the same sum (stays near 1 on long answers).")
    mode: Literal["truncate", "mask"] = Field(
        "truncate", description="truncate (TIS): weight min(ρ, cap); mask (MIS): weight ρ inside band, else the "
        "token or the whole sample is masked (counted as train/corr_masked_*).")
    cap: float = Field(2.0, gt=0, description="C of truncate.")
    band: tuple[float, float] = Field((0.5, 2.0), description="[lo, hi] of mask, 0 <= lo < 1 < hi.")
    stack_on_decoupled: bool = Field(False, description="Apply it with loss decoupled_ppo too, whose w = π_prox/π_behav "
                                     "already corrects each token (both then multiply).")

    @model_validator(mode="after")
    def _band_straddles_one(self) -> SeqCorrectionConfig:
        lo, hi = self.band
        if not 0 <= lo < 1 < hi:
            raise ValueError(f"band: expected [lo, hi] with 0 <= lo < 1 < hi, got {list(self.band)}")
        return self


class AttentionCreditConfig(_Section):
    """Attention-guided credit (docs/algorithms.md §5): scale each token's advantage by γ_t from the policy's own
    attention (preplan tokens by WAAD jumps, anchor tokens by future attention influence)."""

    scaling: Literal["local", "global", "coupled"] = Field("coupled", description="Which tokens are amplified.")
    num_layers: int = Field(5, ge=1, le=64, description="Layers whose attention is kept, spread over the middle third.")
    head_fraction: float = Field(0.3, gt=0, le=0.5, description="Bottom/top share of heads by span: local/global heads.")
    window: int = Field(10, ge=1, le=4096, description="W of WAAD.")
    fai_h_lo: int = Field(10, ge=1, le=65536, description="FAI horizon start H_lo.")
    fai_h_hi: int = Field(100, ge=1, le=65536, description="FAI horizon end H_hi.")
    top_fraction: float = Field(0.4, gt=0, le=1, description="q: share of a response's tokens chosen as preplan / anchor.")
    gamma_amp: float = Field(1.5, ge=1, le=10, description="γ_amp: the amplification of chosen tokens.")
    alpha_c: float = Field(0.5, ge=0, le=1, description="α_c: share of a dominated anchor's credit moved to its "
                           "introducing token.")
    intro_k: int = Field(3, ge=1, le=1024, description="k: how far back an anchor's introducing token is looked for.")
    positive_only: bool = Field(False, description="Scale only positive advantages.")
    row_chunk: int = Field(256, ge=1, description="Attention rows computed at a time (memory bound of the capture).")

    @model_validator(mode="after")
    def _check_horizon(self) -> AttentionCreditConfig:
        if self.fai_h_hi < self.fai_h_lo:
            raise ValueError(f"training.attention_credit.fai_h_hi: expected >= fai_h_lo ({self.fai_h_lo}), "
                             f"got {self.fai_h_hi}")
        return self


class TrainingConfig(_Section):
    steps: int = Field(20, ge=1, description="Training steps (policy versions) of the run.")
    lr: float = Field(1e-4, gt=0, le=1.0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    micro_batch_size: int = Field(64, ge=1, description="Samples per forward/backward pass.")
    micro_batch_tokens: int | None = Field(None, ge=1, description="The most padded tokens (rows x longest row) in "
                                           "one forward/backward: a step's samples are sorted by length and packed "
                                           "under it (at most micro_batch_size rows each), so little padding is "
                                           "computed; a longer sample trains alone. Null: micro_batch_size samples "
                                           "per micro batch, in order.")
    mini_batches: int = Field(1, ge=1, description="Optimizer steps per pass over a step's batch: its "
                              "samples, in order, cut into this many contiguous mini-batches (sizes differ "
                              "by at most one sample), each aggregated over its own samples/tokens. Every "
                              "update's proximal log-probs are those of the step's start, so the PPO clip "
                              "binds from the second update on (docs/algorithms.md §3). Above 1, or with "
                              "epochs above 1: one more forward pass, without gradient, per step.")
    epochs: int = Field(1, ge=1, le=16, description="Passes over a step's batch, each of mini_batches "
                        "optimizer steps (the same mini-batches every pass): mini_batches x epochs updates "
                        "per step.")
    gradient_checkpointing: bool = Field(False, description="Recompute each layer's activations in the backward "
                                         "pass instead of keeping them (Hugging Face gradient checkpointing; policy "
                                         "and critics): far less activation memory for long answers, for about one "
                                         "more forward pass of compute.")
    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage.")
    num_processes: int = Field(1, ge=1, le=64, description="Data-parallel training ranks (one per GPU of the "
                               "training pod; CPU processes here), started by torchrun; rank 0 leads.")
    loss: str = Field("decoupled_ppo", description="Policy loss, docs/algorithms.md §3: a registered loss (built in: "
                      "ppo, decoupled_ppo, tis, cispo, topr, gspo), or your own as an import path package.module:name "
                      "whose module registers it (docs/extending.md).")
    loss_params: SerializeAsAny[LossParams] = Field(
        default_factory=dict, validate_default=True, description="The parameters of training.loss, checked by that "
        "loss's class (their defaults and bounds: the training.loss_params rows below); unset ones take its defaults.")
    norm_std: bool = Field(True, description="GRPO std normalisation; false gives Dr.GRPO.")
    advantage: Literal["grpo", "gae"] = Field("grpo", description="Advantage estimator: group-normalised rewards, "
                                              "or GAE on a critic's values (docs/algorithms.md §2).")
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount γ.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE λ.")
    critic: CriticConfig = CriticConfig()
    asyppo: AsyPPOConfig | None = Field(None, description="AsyPPO mini-critics (needs advantage: gae).")
    attention_credit: AttentionCreditConfig | None = Field(None, description="Attention-guided credit assignment.")
    aggregation: Literal["seq-mean-token-mean", "token-mean"] = "seq-mean-token-mean"
    seq_correction: SeqCorrectionConfig | None = Field(
        None, description="Engine-trainer importance correction, sequence-level or per token, truncated or masked, "
        "multiplying any loss's per-token term (docs/algorithms.md §7). Null: none beyond the loss's own.")
    lora: LoraConfig | None = Field(None, description="Train LoRA adapters instead of every weight; pushes send only "
                                    "the adapters (docs/algorithms.md §8). Null: full fine-tuning.")
    kl_coef: float = Field(0.0, ge=0)
    ent_coef: float = Field(0.0, ge=0)
    skip_zero_advantage: bool = Field(True, description="Leave the rows whose advantages are all 0 (GRPO groups of "
                                      "equal rewards) out of the forward/backward when that changes no gradient: a "
                                      "built-in loss, kl_coef 0, no entropy bonus (docs/training_performance.md). "
                                      "Counted as train/skipped_rows.")
    checkpoint_every: int = Field(10, ge=1, description="Write a checkpoint every this many steps (and at the end).")
    weight_bucket_mb: float = Field(16.0, gt=0, description="Weight broadcast bucket size.")
    cpu_threads: int = Field(1, ge=0, le=1024, description="torch CPU threads of the trainer (0: torch's default); "
                             "on a small machine the roles share the cores.")
    matmul_dtype: Literal["float32", "bfloat16", "auto"] = Field(
        "float32", description="dtype of the trainer's matrix products: bfloat16 runs them under torch.autocast "
        "(weights, gradients, optimizer state, attention and log-softmax stay float32); auto: bfloat16 on a GPU with "
        "bf16 or a CPU with AMX-BF16, else float32.")
    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _moved_loss_keys(cls, data: object) -> object:
        """The loss parameters moved from flat `training` keys to `training.loss_params`: name the new place."""
        if isinstance(data, dict):
            moved = [k for k in MOVED_KEYS if k in data]
            if moved:
                raise ValueError("; ".join(f"training.{k}: moved to training.loss_params.{MOVED_KEYS[k]} (the "
                                           f"parameters of training.loss)" for k in moved))
        return data

    @field_validator("loss")
    @classmethod
    def _known_loss(cls, value: str) -> str:
        if ":" in value:  # an import path: its module registers the loss
            resolve_loss(value)
        elif value not in registered_losses():
            names = [repr(n) for n in registered_losses()]
            raise PydanticCustomError("literal_error", "Input should be {expected}",
                                      {"expected": ", ".join(names[:-1]) + " or " + names[-1]})
        return value

    @field_validator("loss_params", mode="before")
    @classmethod
    def _params_of_the_loss(cls, value: object, info: ValidationInfo) -> object:
        if "loss" not in info.data:  # the loss itself is wrong (reported): nothing to check the parameters against
            return LossParams()
        return parse_loss_params(info.data["loss"], value, "training.loss_params")

    @model_validator(mode="after")
    def _check_combinations(self) -> TrainingConfig:
        expected = loss_params_class(self.loss)
        if type(self.loss_params) is not expected:  # a loss assigned after its parameters
            raise ValueError(f"training.loss_params: expected the parameters of loss {self.loss!r} "
                             f"({expected.__name__}), got {type(self.loss_params).__name__}")
        if self.loss == "gspo" and self.aggregation != "seq-mean-token-mean":
            raise ValueError(f"training.aggregation: loss gspo weighs each sample the same, expected "
                             f"'seq-mean-token-mean', got {self.aggregation!r}")
        if self.seq_correction is not None and self.loss == "decoupled_ppo" and not self.seq_correction.stack_on_decoupled:
            raise ValueError("training.seq_correction: loss decoupled_ppo already weights each token by w = "
                             "π_prox/π_behav; set training.seq_correction.stack_on_decoupled: true to apply both, or "
                             "use loss ppo (or gspo) with the correction")
        if self.asyppo is not None:
            if self.advantage != "gae":
                raise ValueError(f"training.asyppo: needs training.advantage 'gae' (the mini-critics' mean value "
                                 f"feeds GAE), got {self.advantage!r}")
            if self.ent_coef > 0:
                raise ValueError("training.ent_coef: expected 0 with AsyPPO, whose entropy bonus is "
                                 f"training.asyppo.ent_coef; got {self.ent_coef}")
        if self.critic.warmup_steps is not None and self.advantage == "gae" and self.critic.warmup_steps >= self.steps:
            raise ValueError(f"training.critic.warmup_steps: expected fewer than training.steps ({self.steps}), "
                             f"got {self.critic.warmup_steps}")
        return self

    @property
    def num_critics(self) -> int:
        """Value models to train: 0 with GRPO, M with AsyPPO, else 1."""
        if self.advantage != "gae":
            return 0
        return self.asyppo.num_critics if self.asyppo is not None else 1

    @property
    def critic_warmup_steps(self) -> int:
        """Steps that train only the critics: the configured value, else 10 with AsyPPO and 0 otherwise."""
        if self.advantage != "gae":
            return 0
        if self.critic.warmup_steps is not None:
            return self.critic.warmup_steps
        return min(10, self.steps - 1) if self.asyppo is not None else 0


class StorageConfig(_Section):
    endpoint_url: str = Field("", description="S3 endpoint (credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY). "
                              "Empty: `asyncrl run` starts SeaweedFS on loopback with its data in the run folder.")
    bucket: str = Field("asyncrl", min_length=3, max_length=63, pattern=r"^[a-z0-9][a-z0-9.-]+[a-z0-9]$")
    prefix: str = Field("runs", pattern=r"^[A-Za-z0-9._/-]*$", description="Runs live under s3://bucket/prefix/run_id/.")
    region: str = "us-east-1"


class TrackingConfig(_Section):
    tracking_uri: str = Field("", description="MLflow tracking URI. Empty: one local sqlite store for all runs, runs_dir/mlflow.db.")
    experiment: str = Field("asyncrl", min_length=1)
    registered_model: str = Field("", max_length=200, pattern=r"^[A-Za-z0-9._ /-]*$",
                                  description="Registered model the run's best-by-eval (else last) checkpoint is "
                                  "registered under. Empty: <experiment>-<name>.")
    retry_deadline_s: float = Field(60.0, gt=0, le=3600, description="How long one MLflow call is retried before "
                                    "its figures go to the run's S3 spool (tracking/spool/), or the call is given up.")


class TimeoutsConfig(_Section):
    """Every network wait and every collective has a deadline."""

    collective_s: float = Field(300.0, gt=0, description="Weight broadcast and process-group joins.")
    http_s: float = Field(60.0, gt=0)
    rendezvous_s: float = Field(600.0, gt=0, description="Waiting for another role to publish its address.")
    startup_s: float = Field(900.0, gt=0, description="A role (vLLM engine start, DeepSpeed init) becoming ready.")
    batch_wait_s: float = Field(900.0, gt=0, description="Trainer waiting for the groups of one step.")
    storage_s: float = Field(120.0, gt=0, description="Every S3 call retries transient errors (throttling, 5xx, "
                             "connection loss) with backoff and jitter until this deadline, then fails naming the key.")
    group_gap_wait_s: float = Field(60.0, ge=0, description="Trainer: how long a missing group object that a later "
                                    "one of the same writer follows is waited for before it is skipped and counted.")
    heartbeat_s: float = Field(5.0, gt=0, le=300, description="How often every role writes its heartbeat to S3.")
    peer_s: float = Field(120.0, gt=0, description="A role exits when the trainer's heartbeat has not advanced for "
                          "this long (a failed run never keeps GPUs).")

    @model_validator(mode="after")
    def _peer_after_heartbeats(self) -> TimeoutsConfig:
        if self.peer_s < 3 * self.heartbeat_s:
            raise ValueError(f"peer_s: expected at least 3 × heartbeat_s = {3 * self.heartbeat_s:g}, got "
                             f"{self.peer_s:g} (a peer would be declared gone between two heartbeats)")
        return self


class NetworkConfig(_Section):
    """Which network interface the collectives use (several NICs per node on a cluster)."""

    socket_ifname: str = Field("", max_length=256, pattern=r"^[A-Za-z0-9_.:^=,-]*$", description="NCCL_SOCKET_IFNAME "
                               "and GLOO_SOCKET_IFNAME for every role (e.g. eth0, or ^lo,docker to exclude); empty: "
                               "the libraries' own choice.")


class EvalConfig(_Section):
    """Held-out evaluation during training, through the running generation servers, logged as `eval/*` curves."""

    every_steps: int = Field(50, ge=0, description="Evaluate the servers' weights on the held-out split every this many "
                             "versions, and at the warm start (version 0) and the final version (0: off). Done by the "
                             "first environment writer, in embedded and cluster runs alike; its requests are never "
                             "training samples. The summary's eval_accuracy_before/after are the first and last "
                             "points.")
    pass_k: int = Field(4, ge=0, le=64, description="Also pass@k (`eval/pass_at_k`): this many samples per prompt at "
                        "the rollout temperature and top_p, a prompt passing when any is correct (0: greedy accuracy "
                        "only). Single-turn tasks.")
    pass_k_prompts: int = Field(64, ge=0, description="pass@k over the first this many held-out prompts (0: all of "
                                "them): pass_k x pass_k_prompts sampled requests per point.")
    attempts: int = Field(3, ge=1, le=10, description="Evaluations re-run when a request's tokens span a weight "
                          "update (mixed versions) before the point is logged with `eval/mixed_requests` > 0.")


class RunConfig(_Section):
    name: str = Field("asyncrl", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    run_id: str = Field("", pattern=r"^[A-Za-z0-9._-]*$", description="Empty: generated at launch.")
    cache_dir: str = Field(".cache/asyncrl", description="Built models, compiled ops, and in embedded runs vLLM's cache "
                           "(`vllm/`, unless VLLM_CACHE_ROOT is set). ASYNCRL_CACHE_DIR, when set, replaces it in that "
                           "process (the pipeline's pods: their cache volume).")
    runs_dir: str = Field("runs", description="Embedded mode: per-run folders (S3 data, MLflow store, logs, summary).")
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    rollout: RolloutConfig = RolloutConfig()
    generation: GenerationConfig = GenerationConfig()
    training: TrainingConfig = TrainingConfig()
    storage: StorageConfig = StorageConfig()
    tracking: TrackingConfig = TrackingConfig()
    timeouts: TimeoutsConfig = TimeoutsConfig()
    network: NetworkConfig = NetworkConfig()
    env: EnvConfig | None = Field(None, description="Agentic multi-turn task; replaces `task` when set.")
    eval: EvalConfig = EvalConfig()

    @model_validator(mode="before")
    @classmethod
    def _replaced_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and "eval_before_after" in data:
            raise ValueError("eval_before_after: no longer a field; the held-out evaluation runs during training "
                             "(eval.every_steps, default 50, with points at the warm start and the final version; "
                             "eval.every_steps: 0 turns it off)")
        return data

    @model_validator(mode="after")
    def _cross_field(self) -> RunConfig:
        ro, tr = self.rollout, self.training
        if ro.samples_per_prompt < 2:
            raise ValueError(
                "rollout.samples_per_prompt: expected >= 2, GRPO advantages of a group of one sample are all 0"
            )
        batch = ro.prompts_per_step * ro.samples_per_prompt
        if tr.micro_batch_size > batch:
            raise ValueError(
                f"training.micro_batch_size: expected <= rollout.prompts_per_step * rollout.samples_per_prompt = {batch}, "
                f"got {tr.micro_batch_size}"
            )
        if batch % tr.micro_batch_size:
            raise ValueError(
                f"training.micro_batch_size: expected a divisor of the batch of {batch} samples, got {tr.micro_batch_size}"
            )
        if tr.mini_batches > batch:
            raise ValueError(
                f"training.mini_batches: expected <= rollout.prompts_per_step * rollout.samples_per_prompt = "
                f"{batch} (every mini-batch needs a sample), got {tr.mini_batches}"
            )
        # the built-in tokenizer's count is exact; a model folder's tokenizer and chat template are checked per
        # prompt before the run starts (asyncrl.tasks.prompt_fit), so only the smallest possible prompt here
        prompt_tokens = JSONL_MIN_PROMPT_TOKENS if self.model.path else self.task.max_prompt_tokens()
        if prompt_tokens + ro.max_new_tokens > self.generation.max_model_len:
            raise ValueError(
                f"generation.max_model_len: expected >= longest prompt ({prompt_tokens} tokens) + rollout.max_new_tokens "
                f"({ro.max_new_tokens}), got {self.generation.max_model_len}"
            )
        if ro.length_tail is not None and ro.length_tail.median_tokens > ro.max_new_tokens:
            raise ValueError(
                f"rollout.length_tail.median_tokens: expected <= rollout.max_new_tokens ({ro.max_new_tokens}), "
                f"got {ro.length_tail.median_tokens}"
            )
        if tr.asyppo is not None and tr.asyppo.num_critics > ro.samples_per_prompt:
            raise ValueError(
                f"training.asyppo.num_critics: expected <= rollout.samples_per_prompt ({ro.samples_per_prompt}), each "
                f"critic trains on its own share of every group; got {tr.asyppo.num_critics}"
            )
        if self.env is not None:
            self._check_env(self.env)
        tp, heads = self.generation.tensor_parallel_size, self.model.tiny.hidden_size // 64
        if not self.model.path and heads % tp:  # the built-in model's heads are 64 wide (a model folder's: the role)
            raise ValueError(f"generation.tensor_parallel_size: expected a divisor of the built-in tiny model's "
                             f"{heads} attention heads (model.tiny.hidden_size / 64), got {tp}")
        if ro.prompts_per_step % ro.num_writers:
            raise ValueError(
                f"rollout.num_writers: expected a divisor of rollout.prompts_per_step ({ro.prompts_per_step}), got {ro.num_writers}"
            )
        return self

    @property
    def reward_call(self) -> tuple[float, int]:
        """(deadline, most items) of one call from an environment writer to the reward role: one HTTP exchange and
        the largest batch; with a judge, batches of `task.judge.max_concurrency` items (one round of judgments)
        and the exchange plus every attempt of one judgment."""
        from asyncrl.rewards.api import MAX_BATCH_ITEMS

        judge = self.task.judge
        if judge is None:
            return self.timeouts.http_s, MAX_BATCH_ITEMS
        return self.timeouts.http_s + judge.timeout_s * judge.attempts, judge.max_concurrency

    @property
    def eval_request_timeout_s(self) -> float:
        """One held-out evaluation request's deadline: it waits for its whole answer, like a rollout request, so at
        least `rollout.request_timeout_s`, and at least one HTTP exchange (`timeouts.http_s`)."""
        return max(self.timeouts.http_s, self.rollout.request_timeout_s)

    @staticmethod
    def _check_env(env: EnvConfig) -> None:
        """The environment exists and takes these parameters (it is constructed once to check; an import path is
        imported here, so it must be importable wherever the config is validated)."""
        # the registry; environments do not import the config
        from asyncrl.envs import is_import_path, make, registered, resolve

        if env.agent is not None:  # the agent function replaces the environment
            from asyncrl.agents.agent_function import resolve_agent

            try:
                resolve_agent(env.agent)
            except ValueError as e:
                raise ValueError(f"env.agent: {e}") from e
            return
        if is_import_path(env.name):  # the user's class: imported and checked first (env.name), then built once
            try:
                resolve(env.name)
            except ValueError as e:
                raise ValueError(f"env.name: {e}") from e
            try:
                make(env.name, **env.params)
            except ValueError as e:
                raise ValueError(f"env.params: {e}") from e
            return
        if env.name == "remote":
            missing = [k for k in ("url", "env") if not isinstance(env.params.get(k), str) or not env.params.get(k)]
            if missing:
                raise ValueError(f"env.params: a remote environment needs {missing} (the server URL and the "
                                 f"environment name it serves)")
            return
        if env.name not in registered():
            import difflib

            known = [*registered(), "remote"]
            close = difflib.get_close_matches(env.name, known, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"env.name: unknown environment {env.name!r}; expected one of {known}{hint}")
        try:
            make(env.name, **env.params)
        except ValueError as e:
            raise ValueError(f"env.params: {e}") from e
