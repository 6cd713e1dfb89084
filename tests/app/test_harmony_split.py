"""gpt-oss's harmony replies split into reasoning and answer, fed in every way a stream can cut them. The replies are
those of llama.cpp's own gpt-oss parser tests (tests/test-chat.cpp at 0c1e570), with what its parser makes of them."""
import pytest

from app.harmony_split import HarmonySplitter, split_harmony
from app.reply_split import reply_splitter, split_reply
from app.think_split import ThinkSplitter
from tests.app.test_think_split import every_cut, fed

THOUGHTS, HELLO = "I'm\nthinking", "Hello, world!\nWhat's up?"
REPLIES = [  # (reply, reasoning, answer)
    (f"<|channel|>final<|message|>{HELLO}", "", HELLO),  # straight to the answer
    (f"<|channel|>commentary<|message|>{HELLO}", "", HELLO),  # a preamble to no one is shown
    (f"<|channel|>analysis<|message|>{THOUGHTS}<|end|><|start|>assistant<|channel|>final<|message|>{HELLO}",
     THOUGHTS, HELLO),
    (f"<|channel|>analysis<|message|>{THOUGHTS}", THOUGHTS, ""),  # cut off while thinking
    # gpt-oss-20b's stray commentary header before the real channel
    (f"<|channel|>commentary to=assistant<|channel|>analysis<|message|>{THOUGHTS}<|end|><|start|>assistant"
     f"<|channel|>final<|message|>{HELLO}", THOUGHTS, HELLO),
    (f"<|channel|>analysis<|message|>{THOUGHTS}<|end|><|start|>assistant<|channel|>commentary to=assistant"
     f"<|channel|>final<|message|>{HELLO}", THOUGHTS, HELLO),
    # calls to a tool: text of neither (llama.cpp's "unsolicited" calls; tool calls proper are issue 35's)
    ("<|channel|>analysis<|message|>I will execute python to say hello<|end|><|start|>assistant to=container.exec"
     "<|channel|>commentary<|message|>python3 -c 'print(\"hello\")'", "I will execute python to say hello", ""),
    ("<|channel|>analysis<|message|>I will execute python to say hello<|end|><|start|>assistant<|channel|>commentary"
     " to=python <|constrain|>code<|message|>print(\"hello\")<|call|>", "I will execute python to say hello", ""),
    (" to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{\"arg1\": 1}", "", ""),
    # a preamble, more thought, then the answer; the text of each kind joined as llama.cpp joins it
    ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary<|message|>"
     "Checking.<|end|><|start|>assistant<|channel|>analysis<|message|> Done.<|end|><|start|>assistant<|channel|>final"
     "<|message|>Sunny.", "Need the weather. Done.", "Checking.Sunny."),
    # structured output: the final channel's header names its format
    ("<|channel|>analysis<|message|>JSON it is<|end|><|start|>assistant<|channel|>final <|constrain|>json<|message|>"
     "{\"amount\": 1}", "JSON it is", "{\"amount\": 1}"),
    # where <|end|> is not rendered (llama.cpp's CLI shows only <|start|>, <|channel|>, <|message|>), <|start|> ends
    (f"<|channel|>analysis<|message|>{THOUGHTS}<|start|>assistant<|channel|>final<|message|>{HELLO}", THOUGHTS, HELLO),
    # a model that does not speak harmony: all answer, markup and all; text where a header should be, answer from there
    ("Plain text, <|channel|> and all", "", "Plain text, <|channel|> and all"),
    ("<|chan", "", "<|chan"),
    (f"<|channel|>analysis<|message|>{THOUGHTS}<|end|>Four.<|end|>", THOUGHTS, "Four.<|end|>"),
]


def split(pieces: list[str]) -> tuple[str, str]:
    return fed(HarmonySplitter(), pieces)


@pytest.mark.parametrize("reply, reasoning, answer", REPLIES)
def test_every_cut_of_a_reply_splits_as_llama_cpp_does(reply, reasoning, answer):
    assert split_harmony(reply) == (reasoning, answer)
    for pieces in every_cut(reply):
        assert split(pieces) == (reasoning, answer), pieces


def test_text_is_not_held_back_longer_than_possible_markup():
    s = HarmonySplitter()
    assert s.feed("<|channel|>analysis<|mess") == ("", "")  # a header: nothing to show yet
    assert s.feed("age|>Think") == ("Think", "")
    assert s.feed("ing<|en") == ("ing", "")                 # the start of <|end|> waits
    assert s.feed("d|><|start|>assistant<|channel|>final<|message|>Four") == ("", "Four")
    assert s.feed(" <b>") == ("", " <b>")
    assert HarmonySplitter().feed("Hi") == ("", "Hi")         # decided at once: no harmony header can open so


def test_the_split_is_chosen_by_the_template_and_a_stored_reply_by_its_opening():
    assert isinstance(reply_splitter("harmony"), HarmonySplitter)
    assert isinstance(reply_splitter("think", prompt_opened=True), ThinkSplitter)
    assert split_reply(REPLIES[2][0]) == (THOUGHTS, HELLO)
    assert split_reply("<think>\nHm.\n</think>\n\nFour.") == ("Hm.\n", "Four.")
    assert split_reply(" to=the shop") == ("", " to=the shop")  # only a harmony template's reply can open a call
