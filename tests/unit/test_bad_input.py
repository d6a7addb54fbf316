"""Bad input gets an error that names the file / field / row and what was expected (issue 7 item 5): configuration
files and values, model folders, /generate requests checked against the model, validation answers of the role
servers, and stalled request bodies."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError

from asyncrl.config import ConfigError, load_config
from asyncrl.config.load import parse_yaml
from asyncrl.generation.bodies import GenerateRequest, check_against_model
from asyncrl.models.folder import ModelFolderError, check_model_folder, model_folder_problems
from asyncrl.rpc.auth import BodyLimitMiddleware, validation_details


def _load(tmp_path: Path, text: str, *overrides: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    return str(info.value).replace(str(path), "bad.yaml")


# ---- configuration ------------------------------------------------------------------------------------------------

def test_yaml_syntax_error_names_file_line_and_column(tmp_path: Path) -> None:
    msg = _load(tmp_path, "training:\n  lr: 0.1\n  steps: [1\nrollout:\n  x: 1\n")
    assert msg == ("bad.yaml:4:8: not valid YAML: expected ',' or ']', but got ':' (while parsing a flow sequence "
                   "started at line 3, column 10)")
    assert _load(tmp_path, "training:\n  lr: 0.1\n\tsteps: 3\n").startswith(
        "bad.yaml:3:1: not valid YAML: found character '\\t' that cannot start any token")


def test_duplicate_key_is_an_error_with_its_line(tmp_path: Path) -> None:
    assert _load(tmp_path, "training:\n  lr: 0.1\n  steps: 3\n  lr: 0.2\n") == (
        "bad.yaml:4:3: not valid YAML: duplicate key 'lr'")
    assert parse_yaml("a: {b: 1}\nc: 2\n", "x.yaml") == {"a": {"b": 1}, "c": 2}


def test_file_problems(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope.yaml: no such configuration file$"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r": is a folder, expected a YAML configuration file$"):
        load_config(tmp_path)
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"training:\n  lr: \xff\n")
    with pytest.raises(ConfigError, match=r"b.yaml: expected a UTF-8 YAML text file, byte 16 is not UTF-8$"):
        load_config(binary)
    assert _load(tmp_path, "- a\n- b\n") == "bad.yaml: expected a mapping of sections at the top level, got list"


def test_wrong_type_names_the_field_and_the_value(tmp_path: Path) -> None:
    assert _load(tmp_path, "training:\n  lr: abc\n").splitlines() == [
        "invalid configuration (bad.yaml):",
        "  training.lr: Input should be a valid number, unable to parse string as a number (got 'abc')"]
    assert _load(tmp_path, "training: 5\n").splitlines()[1] == (
        "  training: expected a section: a mapping of its fields (key: value lines under it) (got 5)")
    long = _load(tmp_path, "training:\n  steps: [" + ", ".join(["1"] * 500) + "]\n").splitlines()[1]
    assert long.startswith("  training.steps: Input should be a valid integer (got [1, 1,") and long.endswith("...)")
    assert len(long) < 300


def test_unknown_keys_suggest_the_closest_field(tmp_path: Path) -> None:
    assert _load(tmp_path, "training:\n  lrr: 0.1\nrolout:\n  x: 1\n").splitlines()[1:] == [
        "  training.lrr: unknown field; did you mean 'training.lr'?",
        "  rolout: unknown field; did you mean 'rollout'?"]
    line = _load(tmp_path, "storage:\n  zzzz: 1\n").splitlines()[1]
    assert line == ("  storage.zzzz: unknown field (known fields of storage: bucket, endpoint_url, prefix, region; see "
                    "the configuration reference in README.md)")
    assert _load(tmp_path, "", "training.asyppo.num_critic=3", "training.advantage=gae").splitlines()[1] == (
        "  training.asyppo.num_critic: unknown field; did you mean 'training.asyppo.num_critics'?")


def test_cross_field_errors_name_the_blamed_field_once(tmp_path: Path) -> None:
    assert _load(tmp_path, "training:\n  micro_batch_size: 7\n").splitlines()[1] == (
        "  training.micro_batch_size: expected a divisor of the batch of 64 samples, got 7")
    assert _load(tmp_path, "timeouts:\n  heartbeat_s: 10\n  peer_s: 20\n").splitlines()[1] == (
        "  timeouts.peer_s: expected at least 3 × heartbeat_s = 30, got 20 (a peer would be declared gone between "
        "two heartbeats)")
    assert _load(tmp_path, "task:\n  max_operand: 1\n  operations: ['+']\n  num_eval: 9\n").splitlines()[1] == (
        "  task.num_eval: expected fewer than the 4 distinct problems of max_operand=1 and operations=['+'] (some "
        "must be left for training), got 9")


def test_unknown_names_list_the_known_ones(tmp_path: Path) -> None:
    lines = _load(tmp_path, "training:\n  loss: ppoo\ntask:\n  name: gsm8k\n").splitlines()[1:]
    assert lines == ["  task.name: Input should be 'arithmetic', 'jsonl', 'reasoning_gym' or 'file' (got 'gsm8k')",
                     "  training.loss: Input should be 'ppo', 'decoupled_ppo', 'tis', 'cispo', 'topr' or 'gspo' (got 'ppoo'); "
                     "did you mean 'ppo'?"]
    line = _load(tmp_path, "env:\n  name: frozenlak\n").splitlines()[1]  # other tests may register more names
    assert line.startswith("  env.name: unknown environment 'frozenlak'; expected one of ['frozenlake', 'sokoban', ")
    assert line.endswith("; did you mean 'frozenlake'?") and "'tool_use'" in line and "'remote'" in line
    assert _load(tmp_path, "env:\n  name: frozenlake\n  params: {sizze: 3}\n").splitlines()[1].startswith(
        "  env.params: environment 'frozenlake': bad parameters ['sizze']: ")


# ---- model folders ------------------------------------------------------------------------------------------------

def _model(folder: Path, *files: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in files:
        (folder / name).write_text("{}" if name.endswith(".json") else "x")
    return folder


def test_model_folder_checks_name_folder_and_missing_files(tmp_path: Path) -> None:
    good = _model(tmp_path / "good", "config.json", "tokenizer.json", "model.safetensors")
    assert check_model_folder(good) == good
    with pytest.raises(ModelFolderError) as info:
        check_model_folder(_model(tmp_path / "empty"))
    assert str(info.value) == (
        f"model.path: {tmp_path / 'empty'} is not a complete Hugging Face model folder: config.json is missing; "
        "tokenizer.json is missing (the tokenizer is loaded from it); no *.safetensors weights")
    assert model_folder_problems(_model(tmp_path / "pickled", "config.json", "tokenizer.json", "pytorch_model.bin")) == [
        "no *.safetensors weights (found ['pytorch_model.bin']: pickled checkpoints are never loaded; convert them to "
        "safetensors)"]
    sharded = _model(tmp_path / "sharded", "config.json", "tokenizer.json", "a.safetensors")
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "a.safetensors",
                                                                                     "y": "b.safetensors"}}))
    assert model_folder_problems(sharded) == [
        "weight shard(s) named in model.safetensors.index.json are missing: ['b.safetensors']"]
    broken = _model(tmp_path / "broken", "tokenizer.json", "model.safetensors")
    (broken / "config.json").write_text("[1, 2]")
    assert model_folder_problems(broken) == ["config.json is not a JSON object (got list)"]
    (broken / "config.json").write_text("{oops")
    assert model_folder_problems(broken)[0].startswith("config.json is not readable JSON (Expecting property name")


def test_model_path_missing_or_a_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=rf"^model.path: {tmp_path / 'nope'} does not exist; expected a "
                                                 "Hugging Face model folder$"):
        check_model_folder(tmp_path / "nope")
    (tmp_path / "weights.safetensors").write_text("x")
    with pytest.raises(ModelFolderError, match=r"weights.safetensors is a file; expected a Hugging Face model folder"):
        check_model_folder(tmp_path / "weights.safetensors", "training.critic.model_path")


# ---- /generate checked against the model ------------------------------------------------------------------------

def _req(**kw: Any) -> GenerateRequest:
    return GenerateRequest.model_validate({"request_id": "r", "prompt_token_ids": [1, 2], "max_tokens": 4, **kw})


def _errors(req: GenerateRequest, max_model_len: int = 64, vocab: int | None = 32) -> list[dict[str, Any]]:
    with pytest.raises(RequestValidationError) as info:
        check_against_model(req, max_model_len, vocab)
    return validation_details(info.value.errors())


def test_generate_checks_against_the_model() -> None:
    check_against_model(_req(), 64, 32)  # fits
    check_against_model(_req(prompt_token_ids=[1] * 63, max_tokens=1), 64, 32)  # exactly max_model_len
    assert _errors(_req(prompt_token_ids=[1, 32, 3])) == [{"loc": ["body", "prompt_token_ids", 1], "type": "value_error",
                                                          "msg": "expected a token id < the model's vocabulary size 32, "
                                                                 "got 32"}]
    assert _errors(_req(stop_token_ids=[40]))[0]["loc"] == ["body", "stop_token_ids", 0]
    assert _errors(_req(max_tokens=65)) == [{"loc": ["body", "max_tokens"], "type": "value_error",
                                             "msg": "expected at most max_model_len 64, got 65"}]
    check_against_model(_req(prompt_token_ids=[1000]), 64, None)  # no vocabulary known: not checked here
    with pytest.raises(HTTPException) as too_long:
        check_against_model(_req(prompt_token_ids=[1] * 64, max_tokens=1), 64, 32)
    assert too_long.value.status_code == 400 and too_long.value.detail == (
        "prompt_token_ids: the prompt has 64 tokens, expected at most max_model_len - 1 = 63 (room for one new token)")
    with pytest.raises(HTTPException) as over:
        check_against_model(_req(prompt_token_ids=[1] * 10, max_tokens=60), 64, 32)
    assert over.value.status_code == 400 and over.value.detail == (
        "max_tokens: prompt (10 tokens) + max_tokens (60) exceeds max_model_len 64; expected max_tokens <= 54")


@pytest.mark.parametrize(("change", "field"), [
    ({"temperature": -0.1}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": "4"}, "max_tokens"), ({"seed": -1}, "seed"),
    ({"seed": 2**63}, "seed"), ({"prompt_token_ids": [1, -2]}, "prompt_token_ids"),
    ({"prompt_token_ids": [True]}, "prompt_token_ids"), ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"ignore_eos": "yes"}, "ignore_eos"), ({"knob": 1}, "knob"), ({"min_version": -1}, "min_version"),
    ({"min_version": 1.5}, "min_version"),
])
def test_invalid_sampling_parameters_name_the_field(change: dict[str, Any], field: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        _req(**change)
    assert field in [str(p) for e in info.value.errors() for p in e["loc"]]
    assert _req(temperature=1, seed=0).temperature == 1.0  # an integer is a valid float


# ---- role-server answers --------------------------------------------------------------------------------------------

def test_validation_details_never_echo_the_input() -> None:
    errors = [{"type": "float_parsing", "loc": ("body", "temperature"), "msg": "Input should be a finite number",
               "input": float("nan")},
              {"type": "json_invalid", "loc": ("body", 7), "msg": "JSON decode error", "input": {},
               "ctx": {"error": "Expecting value"}},
              {"type": "value_error", "loc": ("body",), "msg": "Value error, " + "x" * 2000}]
    out = validation_details(errors)
    assert out[:2] == [{"loc": ["body", "temperature"], "msg": "Input should be a finite number", "type": "float_parsing"},
                       {"loc": ["body", 7], "msg": "invalid JSON: Expecting value", "type": "json_invalid"}]
    assert out[2]["msg"] == "x" * 500
    json.dumps(out, allow_nan=False)  # always renders
    assert len(validation_details([errors[0]] * 100)) == 20


def test_a_stalled_body_gets_408_and_a_complete_one_passes() -> None:
    seen: list[bytes] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append((await receive())["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def call(messages: list[dict[str, Any]], stall: bool) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            if stall:
                await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        mw = BodyLimitMiddleware(app, max_body_bytes=100, body_timeout_s=0.2)
        await asyncio.wait_for(mw({"type": "http", "method": "POST", "path": "/x", "headers": []}, receive, send), 5)
        return sent

    sent = asyncio.run(call([{"type": "http.request", "body": b"{\"a\"", "more_body": True}], stall=True))
    assert sent[0]["status"] == 408
    assert json.loads(sent[1]["body"]) == {"detail": "request body not received in full within 0.2 s (4 bytes arrived)"}
    assert seen == []
    sent = asyncio.run(call([{"type": "http.request", "body": b"{\"a\"", "more_body": True},
                             {"type": "http.request", "body": b": 1}", "more_body": False}], stall=True))
    assert sent[0]["status"] == 200 and seen == [b'{"a": 1}']
    with pytest.raises(ValueError, match="body_timeout_s: expected a finite number > 0, got 0"):
        BodyLimitMiddleware(app, body_timeout_s=0)
