"""Which split a reply needs, by what the chat template speaks: gpt-oss's channels (harmony) or <think> tags."""
from app.harmony_split import HarmonySplitter, split_harmony
from app.think_split import ThinkSplitter, split_thinking


def reply_splitter(harmony: bool, prompt_opened: bool = False) -> HarmonySplitter | ThinkSplitter:
    """harmony: the template speaks it (ChatTemplate.speaks_harmony); prompt_opened: the prompt ends inside <think>."""
    return HarmonySplitter() if harmony else ThinkSplitter(prompt_opened)


def split_reply(text: str) -> tuple[str, str]:
    """(reasoning, answer) of a stored reply, whose template may be gone: a harmony reply opens with its channel."""
    return split_harmony(text) if text.startswith("<|channel|>") else split_thinking(text)
