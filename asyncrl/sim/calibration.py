"""From the calibration microbenchmarks' raw figures to `cpu-tiny` cost constants, each with its note. Pure.

`benchmarks/calibrate_cost_model.py` measures every part alone (never a run of the job the simulator predicts) and
calls `constants_from(raw, prompt_tokens)`; this module owns how each constant is derived from what was measured:

- decode (`raw["engine"]["decode"]`, rows batch B, length L, step_s = wall / L): least squares of
  `step_s = decode_a + decode_b·B + decode_c·B·(prompt + L/2) + request_s·B/L`;
- training (`raw["train"]["train"]`, rows tokens, step_s): least squares `step_s = train_fixed_s +
  train_per_token·tokens`;
- CPU sharing (`raw["server"]["corun"]`): `corun_train_factor` = median training step while a generation server
  decodes / the same step alone; `corun_decode_factor` = median decode batch while the trainer trains / alone
  (both ≥ 1);
- front end (`raw["server"]`): `http_call_s` = median of a kept-alive `GET /health`; `frontend_s` and
  `frontend_token_s` = the per-request and per-token coefficients of a least-squares plane of the server front
  end's CPU per `/generate_batch` call over [1, B, T] (B requests decoding T tokens in all: B = 1..256 of one token,
  and 64 and 256 of 16), and likewise of the `GenerationClient`'s CPU for the environment (`env_token_s`; its
  per-request part goes into `env_s`); without the 16-token rows (an older file), `frontend_s` is the slope over B
  (`shared_cpu` = 1: on this machine the control plane's CPU shares the engine's core); weight sync:
  `sync_latency` = median push − model_bytes / sync_bandwidth (the fastest push after the first: the least
  disturbed);
- S3 (`raw["s3"]`): group object PUT and GET+decode walls over the tokens per object: intercepts `group_put_s`,
  `group_get_s`, slopes `group_put_token_s`, `group_get_token_s`; a missing key's GET `s3_get_s`; the trainer's
  `publish_s` (metrics reads + latest.json PUT), `log_s` (MLflow), `checkpoint_s`;
- reward (`raw["reward"]["score_batch"]`, rows items N, wall): intercept `score_call_s`, slope `score_s`; the
  intercept of the client's plus the reward server's CPU per call over N: `score_call_cpu_s`;
- environment (`raw["env"]`): `env_s` = its own CPU seconds per sample plus its clients' CPU per request
  (`GenerationClient`'s per-request coefficient, above) and per reward item (`RewardClient`'s slope over N).
A negative fitted coefficient is clipped to 0 and its note says so.
"""

from __future__ import annotations

import statistics
from typing import Any

__all__ = ["constants_from", "fit_decode", "fit_line", "fit_plane", "ratio"]


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (xs, ys); a single point: (y, 0)."""
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"fit_line: expected as many xs as ys, at least one; got {len(xs)}, {len(ys)}")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a small square system)."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-300:
            raise ValueError("fit: the design matrix is singular (vary B and L)")
        m[col], m[piv] = m[piv], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def _least_squares(x: list[list[float]], y: list[float]) -> list[float]:
    """The coefficients minimising the squared error of `x · coefficients` against y (the normal equations)."""
    k = len(x[0])
    xtx = [[sum(xi[i] * xi[j] for xi in x) for j in range(k)] for i in range(k)]
    xty = [sum(xi[i] * yi for xi, yi in zip(x, y, strict=True)) for i in range(k)]
    return _solve(xtx, xty)


def fit_decode(rows: list[dict[str, float]], prompt_tokens: float) -> tuple[float, float, float, float]:
    """(decode_a, decode_b, decode_c, request_s): least squares of step_s over [1, B, B·(P + L/2), B/L]."""
    x = [[1.0, r["batch"], r["batch"] * (prompt_tokens + r["length"] / 2), r["batch"] / r["length"]] for r in rows]
    a, b, c, r = _least_squares(x, [r["step_s"] for r in rows])
    return a, b, c, r


def fit_plane(xs: list[tuple[float, float]], ys: list[float]) -> tuple[float, float, float]:
    """(c0, c1, c2) of the least-squares plane y = c0 + c1·x1 + c2·x2 through the points ((x1, x2), y)."""
    c0, c1, c2 = _least_squares([[1.0, a, b] for a, b in xs], ys)
    return c0, c1, c2


def ratio(together: list[float], alone: list[float]) -> float:
    """median(together) / median(alone), at least 1 (sharing never speeds a part up)."""
    return max(1.0, statistics.median(together) / statistics.median(alone))


def _clip(constants: dict[str, float], notes: dict[str, str], name: str, value: float, note: str) -> None:
    constants[name] = max(0.0, value)
    notes[name] = note if value >= 0 else f"{note}; fitted {value:.3g} < 0, clipped to 0"


def constants_from(raw: dict[str, Any], prompt_tokens: int, sync_bandwidth: float = 1e9
                   ) -> tuple[dict[str, float], dict[str, str], dict[str, Any]]:
    """(constants, notes, default-job workload) from the raw figures of the parts present in `raw`."""
    c: dict[str, float] = {}
    n: dict[str, str] = {}
    engine = raw.get("engine", {})
    if engine.get("decode"):
        a, b, cc, r = fit_decode(engine["decode"], prompt_tokens)
        src = "measured: least squares over vLLM decode walls of B requests of L tokens (B 1-256, L 1/16/48)"
        _clip(c, n, "decode_a", a, f"{src}, per step")
        _clip(c, n, "decode_b", b, f"{src}, per sequence per step")
        _clip(c, n, "decode_c", cc, f"{src}, per context token per step")
        _clip(c, n, "request_s", r, f"{src}, per request (add, {prompt_tokens}-token prefill, output)")
        c["prefill_per_token"], n["prefill_per_token"] = 0.0, "0: the short prefill is inside request_s"
    train = raw.get("train", {}).get("train")
    if train:
        fixed, per_token = fit_line([t["tokens"] for t in train], [t["step_s"] for t in train])
        src = "measured: DeepSpeed step time over tokens, one torch thread, alone"
        _clip(c, n, "train_per_token", per_token, f"{src} (slope)")
        _clip(c, n, "train_fixed_s", fixed, f"{src} (intercept)")
    corun = raw.get("server", {}).get("corun")
    if corun:
        shape = tuple(corun["shape"])
        c["corun_train_factor"] = ratio(corun["train_together_s"], corun["train_alone_s"])
        c["corun_decode_factor"] = ratio(corun["decode_together_s"], corun["decode_alone_s"])
        n["corun_train_factor"] = (f"measured: training step {shape} while a generation server decodes batches of "
                                   "256 requests / alone (each in its own session), medians")
        n["corun_decode_factor"] = ("measured: a generation server's batch of 256 requests of 16 tokens while the "
                                    "trainer trains / alone, medians")
    server = raw.get("server", {})
    if server.get("health_rt_s"):
        c["http_call_s"] = statistics.median(server["health_rt_s"])
        n["http_call_s"] = "measured: GET /health of a generation server on a kept-alive connection, median"
    client_s = 0.0  # the environment's HTTP clients, per sample: generation request + reward item
    if server.get("generate_batch"):
        rows = server["generate_batch"]
        if len({r.get("tokens", r["batch"]) / r["batch"] for r in rows}) > 1:  # one-token and 16-token calls
            xs = [(r["batch"], r["tokens"]) for r in rows]
            _, per_req, per_tok = fit_plane(xs, [r["frontend_cpu_s"] for r in rows])
            src = ("measured: CPU of the generation server's front end process per /generate_batch call, least "
                   "squares over [1, requests, tokens] (B = 1..256 one-token requests, 64 and 256 of 16 tokens)")
            _clip(c, n, "frontend_s", per_req, f"{src}, per request")
            _clip(c, n, "frontend_token_s", per_tok, f"{src}, per decoded token")
            _, client_req, client_tok = fit_plane(xs, [r["client_cpu_s"] for r in rows])
            client_s += max(0.0, client_req)
            _clip(c, n, "env_token_s", client_tok, "measured: GenerationClient's CPU per decoded token (the same "
                  "calls' least squares, the environment's side)")
        else:
            _, per_req = fit_line([r["batch"] for r in rows], [r["frontend_cpu_s"] for r in rows])
            _clip(c, n, "frontend_s", per_req, "measured: CPU of the generation server's front end process per "
                  "request (slope over /generate_batch calls of B = 1..256 one-token requests)")
            client_s += max(0.0, fit_line([r["batch"] for r in rows], [r["client_cpu_s"] for r in rows])[1])
        c["shared_cpu"] = 1.0
        n["shared_cpu"] = ("assumed: on the 2-core machine the trainer holds one core; the engine and the control "
                           "plane share the other")
    if server.get("weight_push_s"):
        push = min(server["weight_push_s"][1:] or server["weight_push_s"])  # the least disturbed, after the first
        c["model_bytes"] = float(server["model_bytes"])
        n["model_bytes"] = "measured: the built-in model's parameters, float32"
        c["sync_bandwidth"], n["sync_bandwidth"] = sync_bandwidth, "assumed (gloo on loopback; the model is 1.3 MB)"
        _clip(c, n, "sync_latency", push - c["model_bytes"] / sync_bandwidth,
              "measured: WeightSender.push to a generation server (pause, gloo broadcast, load, resume) + checksum, "
              "the fastest push after the first, less model_bytes / sync_bandwidth")
    s3 = raw.get("s3", {})
    if s3.get("group_put"):
        for kind in ("put", "get"):
            rows = s3[f"group_{kind}"]
            fixed, per = fit_line([r["tokens"] for r in rows], [r["wall_s"] for r in rows])
            what = "encode + conditional PUT" if kind == "put" else "GET + decode"
            src = (f"measured: {what} of group objects (1/8/32 groups of 8 samples, 3 or 48 response tokens) on "
                   "SeaweedFS (EmbeddedS3), median walls")
            _clip(c, n, f"group_{kind}_s", fixed, f"{src} (intercept: per object)")
            _clip(c, n, f"group_{kind}_token_s", per, f"{src} (slope: per token of the samples)")
        c["s3_get_s"], n["s3_get_s"] = s3["miss_get"]["wall_s"], "measured: GET of a missing key (an idle poll)"
        book = s3["bookkeeping"]
        c["publish_s"] = book["metrics_reads"]["wall_s"] + s3["json_put"]["wall_s"]
        n["publish_s"] = "measured: the trainer's stats + heartbeat reads (LIST, GETs) and the latest.json PUT"
        c["log_s"], n["log_s"] = book["mlflow_log"]["wall_s"], "measured: MLflow log_steps of two steps (~100 values), sqlite; per step"
        c["checkpoint_s"] = book["checkpoint"]["wall_s"]
        n["checkpoint_s"] = "measured: save_checkpoint (model + Adam state, 4 MB) to SeaweedFS"
    reward = raw.get("reward", {}).get("score_batch")
    if reward:
        call, per_item = fit_line([r["items"] for r in reward], [r["wall_s"] for r in reward])
        src = "measured: one /score_batch of N items (N 1/32/256) through RewardClient, median walls"
        _clip(c, n, "score_call_s", call, f"{src} (intercept)")
        _clip(c, n, "score_s", per_item, f"{src} (slope: per item)")
        if "client_cpu_s" in reward[0]:
            client_s += max(0.0, fit_line([r["items"] for r in reward], [r["client_cpu_s"] for r in reward])[1])
        if "server_cpu_s" in reward[0]:
            cpu = [r["client_cpu_s"] + r["server_cpu_s"] for r in reward]
            per_call, _ = fit_line([r["items"] for r in reward], cpu)
            _clip(c, n, "score_call_cpu_s", per_call, "measured: RewardClient's plus the reward server's CPU per "
                  "/score_batch call (intercept over N = 1/32/256 items)")
    if raw.get("env"):
        c["env_s"] = raw["env"]["cpu_s_per_sample"] + client_s
        n["env_s"] = (f"measured: CPU per sample of the environment's own work (scheduler, request task, decode, "
                      f"Sample; {raw['env']['cpu_s_per_sample'] * 1e3:.3f} ms, no I/O) + its GenerationClient and "
                      f"RewardClient CPU per request and item ({client_s * 1e3:.3f} ms, slopes of their calls)")
    workload = {}
    if engine.get("default_lengths"):
        d = engine["default_lengths"]
        workload = {"prompt_tokens": round(d["prompt_tokens_mean"]), "response_tokens": d["response_tokens"],
                    "note": "measured: the built-in model on 256 default-job prompts, max_tokens 6, EOS ends"}
    return c, n, workload
