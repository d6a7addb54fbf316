"""The generation API's request bodies (pydantic, strict) and the checks that need the model's limits.

What `asyncrl.generation.server` validates before anything reaches the engine: types are strict (no "3" for 3, no
true for 1), no NaN or infinity, unknown fields refused, and the limits below. The contract is docs/generation_api.md.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

MAX_BODY_BYTES = 8 << 20  # a /generate body of MAX_PROMPT_TOKENS ids is well under this
MAX_PROMPT_TOKENS = 1 << 20
MAX_STOP_TOKENS = 4096
MAX_SEED = 2**63 - 1  # torch generators take 64-bit seeds
MAX_VERSION_WAIT_S = 60.0  # the longest a GET /weights/version waits for a new version
MAX_BATCH_REQUESTS = 4096  # requests in one /generate_batch or /abort_batch body (the body limit applies too)

TokenId = Annotated[int, Field(ge=0)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class GenerateRequest(_Body):
    request_id: str = Field(min_length=1, max_length=256)
    prompt_token_ids: list[TokenId] = Field(min_length=1, max_length=MAX_PROMPT_TOKENS)
    max_tokens: int = Field(ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)
    stop_token_ids: list[TokenId] = Field(default_factory=list, max_length=MAX_STOP_TOKENS)
    min_tokens: int = Field(0, ge=0)  # EOS and stop_token_ids cannot end the request before this many tokens
    ignore_eos: bool = False  # the model's EOS does not end the request (stop_token_ids still do)
    min_version: int = Field(0, ge=0)  # held, not started, until the weights are at least this version

    @field_validator("min_tokens")
    @classmethod
    def _min_tokens_within_max_tokens(cls, v: int, info: ValidationInfo) -> int:
        max_tokens = info.data.get("max_tokens")  # absent when max_tokens itself failed validation
        if max_tokens is not None and v > max_tokens:
            raise ValueError(f"expected min_tokens <= max_tokens ({max_tokens}), got {v}")
        return v


class AbortRequest(_Body):
    request_id: str = Field(min_length=1, max_length=256)


class GenerateBatchRequest(_Body):
    requests: list[GenerateRequest] = Field(min_length=1, max_length=MAX_BATCH_REQUESTS)

    @field_validator("requests")
    @classmethod
    def _distinct_ids(cls, v: list[GenerateRequest]) -> list[GenerateRequest]:
        seen: set[str] = set()
        for i, r in enumerate(v):
            if r.request_id in seen:
                raise ValueError(f"requests[{i}].request_id: expected distinct request ids, {r.request_id!r} repeats")
            seen.add(r.request_id)
        return v


class AbortBatchRequest(_Body):
    request_ids: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        min_length=1, max_length=MAX_BATCH_REQUESTS)


class WeightsInitRequest(_Body):
    master_addr: str = Field(min_length=1)
    master_port: int = Field(ge=1, le=65535)
    rank: int = Field(ge=1)
    world_size: int = Field(ge=2)
    backend: Literal["gloo", "nccl"] = "gloo"
    timeout_s: float = Field(300.0, gt=0)
    group_name: str = Field("asyncrl-weights", pattern=r"^[A-Za-z0-9._-]{1,128}$")
    lora_scale: float = Field(0.0, ge=0, description="The trainer pushes LoRA adapters of this scale (0: full "
                              "weights); the server refuses a group whose pushes it cannot load.")


class WeightsUpdateRequest(_Body):
    version: int = Field(ge=1)
    timeout_s: float = Field(300.0, gt=0)


def _field_error(field: str | tuple[str | int, ...], msg: str) -> RequestValidationError:
    loc = (field,) if isinstance(field, str) else field
    return RequestValidationError([{"type": "value_error", "loc": ("body", *loc), "msg": msg}])


def check_against_model(req: GenerateRequest, max_model_len: int, vocab_size: int | None) -> None:
    """Pure: the checks that need the model's limits. A 422 (`RequestValidationError`) for a field that is wrong
    whatever the rest of the request (an out-of-vocabulary id, max_tokens over max_model_len); a 400
    (`HTTPException`) naming the limit for a prompt too long for the model, or prompt + max_tokens over it."""
    if vocab_size is not None:
        for name, ids in (("prompt_token_ids", req.prompt_token_ids), ("stop_token_ids", req.stop_token_ids)):
            bad = next((i for i, t in enumerate(ids) if t >= vocab_size), None)
            if bad is not None:
                raise _field_error((name, bad), f"expected a token id < the model's vocabulary size {vocab_size}, "
                                                f"got {ids[bad]}")
    if req.max_tokens > max_model_len:
        raise _field_error("max_tokens", f"expected at most max_model_len {max_model_len}, got {req.max_tokens}")
    n = len(req.prompt_token_ids)
    if n > max_model_len - 1:
        raise HTTPException(400, f"prompt_token_ids: the prompt has {n} tokens, expected at most max_model_len - 1 "
                                 f"= {max_model_len - 1} (room for one new token)")
    if n + req.max_tokens > max_model_len:
        raise HTTPException(400, f"max_tokens: prompt ({n} tokens) + max_tokens ({req.max_tokens}) exceeds "
                                 f"max_model_len {max_model_len}; expected max_tokens <= {max_model_len - n}")
