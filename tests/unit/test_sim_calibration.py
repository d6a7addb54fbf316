"""From microbenchmark figures to cost constants (`asyncrl.sim.calibration`), on synthetic figures with known answers."""

import pytest

from asyncrl.sim.calibration import constants_from, fit_decode, fit_line, fit_plane, ratio


def test_fit_line_and_ratio():
    assert fit_line([1, 2, 3], [5, 7, 9]) == pytest.approx((3.0, 2.0))
    assert fit_line([4], [0.5]) == (0.5, 0.0)
    assert ratio([3.0, 4.0, 5.0], [2.0, 2.0]) == 2.0
    assert ratio([1.0], [2.0]) == 1.0  # never below 1


def test_fit_decode_recovers_the_per_request_term():
    a, b, c, r, p = 0.006, 1e-4, 2e-7, 9e-4, 6
    rows = [{"batch": bb, "length": ll, "step_s": a + b * bb + c * bb * (p + ll / 2) + r * bb / ll}
            for bb in (1, 16, 64, 256) for ll in (1, 16, 48)]
    assert fit_decode(rows, p) == pytest.approx((a, b, c, r), rel=1e-6)


def _raw():
    decode = [{"batch": bb, "length": ll, "step_s": 0.005 + 1e-4 * bb + 1e-3 * bb / ll, "wall_s": 0.0}
              for bb in (1, 16, 64, 256) for ll in (1, 16, 48)]
    return {
        "engine": {"decode": decode,
                   "default_lengths": {"prompt_tokens_mean": 6.27, "response_tokens": [2, 3, 3, 4]}},
        "train": {"train": [{"samples": 64, "response_tokens": 16, "tokens": 1000, "step_s": 0.1},
                            {"samples": 256, "response_tokens": 16, "tokens": 3000, "step_s": 0.3}]},
        "server": {"health_rt_s": [0.04, 0.044, 0.05],
                   "corun": {"shape": [256, 16], "train_alone_s": [0.3, 0.3, 0.4], "train_together_s": [0.5, 0.6, 0.7],
                             "decode_together_s": [1.2, 1.3], "decode_alone_s": [1.0, 1.0, 1.1]},
                   "generate_batch": [{"batch": 1, "client_cpu_s": 0.001, "frontend_cpu_s": 0.002},
                                      {"batch": 101, "client_cpu_s": 0.051, "frontend_cpu_s": 0.102}],
                   "weight_push_s": [0.1, 0.3, 0.25], "model_bytes": 1e6},
        "s3": {"group_put": [{"tokens": 100, "wall_s": 0.011}, {"tokens": 1100, "wall_s": 0.021}],
               "group_get": [{"tokens": 100, "wall_s": 0.0102}, {"tokens": 1100, "wall_s": 0.0122}],
               "miss_get": {"wall_s": 0.003}, "json_put": {"wall_s": 0.008},
               "bookkeeping": {"metrics_reads": {"wall_s": 0.04}, "mlflow_log": {"wall_s": 0.07},
                               "checkpoint": {"wall_s": 0.3}}},
        "reward": {"score_batch": [{"items": 1, "wall_s": 0.0501, "client_cpu_s": 0.001},
                                   {"items": 101, "wall_s": 0.0601, "client_cpu_s": 0.011}]},
        "env": {"cpu_s_per_sample": 4e-5},
    }


def test_constants_from_every_part():
    c, notes, workload = constants_from(_raw(), 6, sync_bandwidth=1e8)
    assert c == pytest.approx({
        "decode_a": 0.005, "decode_b": 1e-4, "decode_c": 0.0, "request_s": 1e-3, "prefill_per_token": 0.0,
        "train_per_token": 1e-4, "train_fixed_s": 0.0, "corun_train_factor": 0.6 / 0.3, "corun_decode_factor": 1.25,
        "http_call_s": 0.044, "frontend_s": 1e-3, "shared_cpu": 1.0, "model_bytes": 1e6, "sync_bandwidth": 1e8,
        "sync_latency": 0.25 - 0.01, "group_put_s": 0.01, "group_put_token_s": 1e-5, "group_get_s": 0.01,
        "group_get_token_s": 2e-6, "s3_get_s": 0.003, "publish_s": 0.048, "log_s": 0.07, "checkpoint_s": 0.3,
        "score_call_s": 0.05, "score_s": 1e-4, "env_s": 4e-5 + 5e-4 + 1e-4}, abs=1e-9)
    assert set(notes) == set(c) and all(v.startswith(("measured", "assumed", "0:")) for v in notes.values())
    assert workload["prompt_tokens"] == 6 and workload["response_tokens"] == [2, 3, 3, 4]


def test_constants_from_clips_a_negative_fit_and_says_so():
    raw = {"train": {"train": [{"tokens": 1000, "step_s": 0.3}, {"tokens": 3000, "step_s": 0.1}]}}
    c, notes, _ = constants_from(raw, 6)
    assert c["train_per_token"] == 0.0 and "clipped to 0" in notes["train_per_token"]
    assert constants_from({}, 6) == ({}, {}, {})


def test_fit_plane_recovers_exact_coefficients():
    xs = [(1, 1), (16, 16), (256, 256), (64, 1024), (256, 4096)]
    c0, c1, c2 = fit_plane(xs, [0.002 + 1e-4 * b + 2e-5 * t for b, t in xs])
    assert (c0, c1, c2) == pytest.approx((0.002, 1e-4, 2e-5), abs=1e-12)


def test_constants_from_token_rows_and_reward_cpu():
    """Front end and client CPU per /generate_batch call = 0.002 + 1e-4·B + 2e-5·T (front end) and
    0.001 + 5e-5·B + 1e-6·T (client); reward CPU per call: client 0.003 + 1e-5·N, server 0.002 + 0·N."""
    calls = [(1, 1), (16, 16), (256, 256), (64, 1024), (256, 4096)]
    raw = {"server": {"generate_batch": [
        {"batch": b, "tokens": t, "frontend_cpu_s": 0.002 + 1e-4 * b + 2e-5 * t,
         "client_cpu_s": 0.001 + 5e-5 * b + 1e-6 * t} for b, t in calls]},
        "reward": {"score_batch": [{"items": n, "wall_s": 0.05 + 1e-4 * n, "client_cpu_s": 0.003 + 1e-5 * n,
                                    "server_cpu_s": 0.002} for n in (1, 32, 256)]},
        "env": {"cpu_s_per_sample": 4e-5}}
    c, notes, _ = constants_from(raw, 6)
    assert c["frontend_s"] == pytest.approx(1e-4) and c["frontend_token_s"] == pytest.approx(2e-5)
    assert c["env_token_s"] == pytest.approx(1e-6)
    assert c["env_s"] == pytest.approx(4e-5 + 5e-5 + 1e-5)  # own work + client per request + per reward item
    assert c["score_call_cpu_s"] == pytest.approx(0.005)
    assert "per decoded token" in notes["frontend_token_s"] and "per /score_batch call" in notes["score_call_cpu_s"]
