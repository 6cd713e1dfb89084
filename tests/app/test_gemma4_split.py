"""Gemma 4's replies split into reasoning and answer, fed in every way a stream can cut them. The replies are those of
llama.cpp's own Gemma 4 parser tests (tests/test-chat.cpp, google-gemma-4-31B-it.jinja), with what its parser makes
of them. A fault planted once (the whitespace after `thought` kept in the reasoning) failed the second reply."""
import pytest

from app.gemma4_split import Gemma4Splitter, split_gemma4
from app.reply_split import reply_splitter, split_reply
from tests.app.test_think_split import every_cut, fed

THOUGHTS, HELLO = "I'm\nthinking", "Hello, world!\nWhat's up?"
REPLIES = [  # (reply, reasoning, answer)
    ("Hello, world!", "", "Hello, world!"),
    (f"<|channel>thought\n{THOUGHTS}<channel|>{HELLO}", THOUGHTS, HELLO),
    (f"<|channel>thought<channel|>{HELLO}", "", HELLO),  # an empty thought (a reasoning budget of 0)
    # llama.cpp's edge cases: a stray close, a trailing empty thought, an empty channel before the thought
    (f"<|channel>thought\n<channel|>{HELLO}<channel|>", "", HELLO),
    (f"<|channel>thought\n<channel|>{HELLO}<|channel>thought\n<channel|>", "", HELLO),
    (f"<|channel>thought\n<channel|>{HELLO}<|channel>thought\n<channel|><channel|>", "", HELLO),
    (f"<|channel><|channel>thought\n<channel|>{HELLO}", "", HELLO),
    # cut off while thinking; gpt-oss's markup is text here
    (f"<|channel>thought\n{THOUGHTS}", THOUGHTS, ""),
    ("<|channel|>analysis", "", "<|channel|>analysis"),
]


def split(pieces: list[str]) -> tuple[str, str]:
    return fed(Gemma4Splitter(), pieces)


@pytest.mark.parametrize("reply, reasoning, answer", REPLIES)
def test_every_cut_of_a_reply_splits_as_llama_cpp_does(reply, reasoning, answer):
    assert split_gemma4(reply) == (reasoning, answer)
    for pieces in every_cut(reply):
        assert split(pieces) == (reasoning, answer), pieces


def test_text_is_not_held_back_longer_than_possible_markup():
    s = Gemma4Splitter()
    assert s.feed("<|channel>thou") == ("", "")  # the channel's name: nothing to show yet
    assert s.feed("ght\nAdd") == ("Add", "")
    assert s.feed(" them<chan") == (" them", "")  # the start of <channel|> waits
    assert s.feed("nel|>\n\nFour") == ("", "Four")  # the answer's leading blank lines dropped, as after </think>
    assert s.feed(" <b>") == ("", " <b>")


def test_the_template_picks_the_split_and_a_stored_reply_is_split_by_its_markers():
    assert isinstance(reply_splitter("gemma4"), Gemma4Splitter)
    assert split_reply(REPLIES[1][0]) == (THOUGHTS, HELLO)
    assert split_reply(f"{HELLO}<channel|>") == ("", HELLO)  # thinking off: only a stray marker shows it
