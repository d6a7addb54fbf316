"""The exact token record of an agent episode (asyncrl.agents.transcript): exact ids, masks and segments.

The tokenizer here is one id per character (ids = code points), so every expected id list is the text itself."""

from __future__ import annotations

import pytest

from asyncrl.agents.transcript import AgentTranscript

EOS = ord("$")


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def transcript() -> AgentTranscript:
    return AgentTranscript(tokenize=ids, decode=lambda xs: "".join(chr(x) for x in xs))


def test_a_history_that_extends_the_record_appends_only_the_new_part_masked() -> None:
    t = transcript()
    assert t.begin_turn("<u>hi<a>") == ids("<u>hi<a>") and t.pending_between == 8
    t.add_generated(ids("yo$"), [-0.1, -0.2, -0.3], [0, 0, 1], 0)
    # the agent sends the history back: its reply, then the template's close and a new user message
    context = t.begin_turn("<u>hi<a>yo$\n<u>ok<a>")
    assert context == ids("<u>hi<a>yo$\n<u>ok<a>") and t.pending_between == len("\n<u>ok<a>")
    t.add_generated(ids("z$"), [-0.5, -0.6], [1, 1], 1)
    s = t.to_sample("g", 3, reward=1.0, finish_reason="stop")
    assert s.prompt_token_ids == ids("<u>hi<a>")
    assert s.token_ids == ids("yo$\n<u>ok<a>z$")
    assert s.loss_mask == [1, 1, 1] + [0] * 9 + [1, 1]
    assert s.logprobs == [-0.1, -0.2, -0.3] + [0.0] * 9 + [-0.5, -0.6]
    assert s.token_versions == [0, 0, 1] + [1] * 9 + [1, 1]
    assert (s.turn_offsets, s.turn_rewards, s.reward, s.segment_offsets) == ([0, 12], [0.0, 1.0], 1.0, None)
    assert t.segment_count == 1 and t.num_turns == 2


def test_a_turn_cut_at_its_budget_is_closed_by_the_new_part() -> None:
    t = transcript()
    t.begin_turn("<u>q<a>")
    t.add_generated(ids("abc"), [-1.0] * 3, [2] * 3, 2)  # no end of turn: cut at max_tokens
    t.begin_turn("<u>q<a>abc$\n<u>r<a>")
    assert t.context_ids() == ids("<u>q<a>abc$\n<u>r<a>")
    t.add_generated(ids("d$"), [-1.0] * 2, [2, 3], 2)
    s = t.to_sample("g", 0, reward=0.5, finish_reason="stop")
    assert s.token_ids == ids("abc$\n<u>r<a>d$") and s.loss_mask == [1, 1, 1] + [0] * 9 + [1, 1]


def test_an_edited_history_opens_a_new_segment_never_retokenising_the_old_one() -> None:
    t = transcript()
    t.begin_turn("<u>hi<a>")
    t.add_generated(ids("yo$"), [-0.1, -0.2, -0.3], [0, 0, 0], 0)
    # the template drops the earlier reply when it renders the history (as Qwen3 drops earlier <think>)
    context = t.begin_turn("<u>hi<a>$\n<u>ok<a>")
    assert context == ids("<u>hi<a>$\n<u>ok<a>") and t.pending_between == 18 and t.segment_count == 2
    t.add_generated(ids("z$"), [-0.5, -0.6], [1, 1], 1)
    s = t.to_sample("g", 1, reward=2.0, finish_reason="stop")
    assert s.prompt_token_ids == ids("<u>hi<a>")
    assert s.token_ids == ids("yo$") + ids("<u>hi<a>$\n<u>ok<a>") + ids("z$")
    assert s.segment_offsets == [3]
    assert s.loss_mask == [1, 1, 1] + [0] * 18 + [1, 1]
    assert s.token_versions == [0, 0, 0] + [0] * 18 + [1, 1]
    assert (s.turn_offsets, s.turn_rewards) == ([0, 21], [0.0, 2.0])


def test_a_retried_request_is_a_branch_and_opens_a_new_segment() -> None:
    t = transcript()
    t.begin_turn("<u>hi<a>")
    t.add_generated(ids("yo$"), [-0.1] * 3, [0] * 3, 0)
    assert t.begin_turn("<u>hi<a>") == ids("<u>hi<a>") and t.segment_count == 2


def test_an_episode_without_a_model_call_has_no_sample() -> None:
    t = transcript()
    with pytest.raises(ValueError, match="never called the model"):
        t.to_sample("g", 0, reward=1.0, finish_reason="stop")
    with pytest.raises(ValueError, match="rendered prompt is empty"):
        t.begin_turn("")
