"""The reasoning/answer split of a streamed reply, fed in every way a stream can cut it."""
from app.think_split import ThinkSplitter


def split(pieces: list[str], prompt_opened: bool = False) -> tuple[str, str]:
    return fed(ThinkSplitter(prompt_opened), pieces)


def fed(s, pieces: list[str]) -> tuple[str, str]:
    """(reasoning, answer) of pieces fed one by one to the splitter s, then the reply's end."""
    reasoning, answer = [], []
    for i, piece in enumerate(pieces + [""]):
        r, a = s.feed(piece, final=i == len(pieces))
        reasoning.append(r)
        answer.append(a)
    return "".join(reasoning), "".join(answer)


def every_cut(text: str) -> list[list[str]]:
    """text whole, one character a piece, and cut in two at every place."""
    return [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]


def test_qwen3_reply_opens_with_its_reasoning_at_any_cut():
    reply = "<think>\nThe user greets me.\n</think>\n\nHello! <b>Hi</b>"
    for pieces in every_cut(reply):
        assert split(pieces) == ("The user greets me.\n", "Hello! <b>Hi</b>"), pieces


def test_a_prompt_ending_in_think_starts_the_reply_inside_it():
    for pieces in every_cut("Let me count: 2.</think>\n\nFour."):
        assert split(pieces, prompt_opened=True) == ("Let me count: 2.", "Four."), pieces


def test_a_reply_without_reasoning_is_all_answer_and_later_tags_are_text():
    for pieces in every_cut("Use <think> tags </think> like this"):
        assert split(pieces) == ("", "Use <think> tags </think> like this"), pieces
    assert split(["<thin", "king cap"]) == ("", "<thinking cap")


def test_answer_text_is_not_held_back_longer_than_a_possible_tag():
    s = ThinkSplitter()
    assert s.feed("Hello") == ("", "Hello")  # decided at the first character that cannot open <think>
    s = ThinkSplitter()
    assert s.feed("<th") == ("", "")          # might still be <think>
    assert s.feed("ink>Hm") == ("Hm", "")
    assert s.feed(" ok</thi") == (" ok", "")  # the start of </think> waits
    assert s.feed("nk>Yes") == ("", "Yes")


def test_cut_off_reasoning_stays_reasoning_and_leading_space_is_kept_without_tags():
    assert split(["<think>still thinking when the tokens ran o"]) == ("still thinking when the tokens ran o", "")
    assert split(["  ", "Hi"]) == ("", "  Hi")
    assert split(["<"]) == ("", "<")


def test_a_whole_reply_split():
    from app.think_split import split_thinking
    assert split_thinking("<think>\nLet me see.\n</think>\n\nFour.") == ("Let me see.\n", "Four.")
    assert split_thinking("Let me see.</think>\n\nFour.") == ("Let me see.", "Four.")  # the prompt opened it (R1)
    assert split_thinking("Four.") == ("", "Four.")
    assert split_thinking("<think>cut off mid-thought") == ("cut off mid-thought", "")
