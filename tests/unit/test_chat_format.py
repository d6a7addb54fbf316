"""ChatFormat on the built-in text tokenizer (saved and loaded as a run loads it): exact ids of the first prompt,
the pieces between turns, and the whole conversation equal to the template's own rendering."""

import pytest

from asyncrl.models.chat import ChatFormat
from asyncrl.models.tokenizer import TEXT_VOCAB, build_tokenizer, chat_ids, load_tokenizer, make_tokenizer

V = TEXT_VOCAB
BOS, EOS, USER, ASSISTANT, SYSTEM = V["<bos>"], V["<eos>"], V["<|user|>"], V["<|assistant|>"], V["<|system|>"]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("text-tok")
    build_tokenizer(folder, charset="text")
    return load_tokenizer(folder)


def ids(text: str) -> list[int]:
    return [V[c] for c in text]


def test_prompt_and_between_turn_pieces_are_exact(tok):
    chat = ChatFormat(tok)
    assert chat.turn_end_ids == [EOS]
    assert chat.prompt_ids("P.\n.G") == [BOS, USER, *ids("P.\n.G"), ASSISTANT]
    assert chat.prompt_ids("P.", system="go") == [BOS, SYSTEM, *ids("go"), USER, *ids("P."), ASSISTANT]
    assert chat.observation_ids(".P") == [USER, *ids(".P"), ASSISTANT]
    # a turn that stopped on <eos> needs no close token; one cut at its budget gets the <eos> appended (masked)
    assert chat.between_turns_ids([*ids("right"), EOS], ".P") == [USER, *ids(".P"), ASSISTANT]
    assert chat.between_turns_ids(ids("rig"), ".P") == [EOS, USER, *ids(".P"), ASSISTANT]


def test_a_whole_conversation_matches_the_template(tok):
    chat = ChatFormat(tok)
    turns = [("P.\n.G", "right"), (".P\n.G", "down")]
    seq = chat.prompt_ids(turns[0][0])
    seq += [*ids("right"), EOS] + chat.observation_ids(turns[1][0]) + [*ids("down"), EOS]
    messages = [{"role": "user", "content": turns[0][0]}, {"role": "assistant", "content": "right"},
                {"role": "user", "content": turns[1][0]}, {"role": "assistant", "content": "down"}]
    assert seq == chat_ids(tok, messages, add_generation_prompt=False)


def test_a_tokenizer_without_a_template_is_refused():
    with pytest.raises(ValueError, match="chat template"):
        ChatFormat(make_tokenizer("arithmetic"))
