"""Which split a reply needs, by how its chat template marks reasoning (ChatTemplate.reply_format): gpt-oss's
channels (harmony), Gemma 4's thought channel, or <think> tags."""
from app.gemma4_split import Gemma4Splitter, split_gemma4
from app.harmony_split import HarmonySplitter, split_harmony
from app.think_split import ThinkSplitter, split_thinking
from models.chat_template import GEMMA4_CHANNEL


def reply_splitter(reply_format: str, prompt_opened: bool = False) -> HarmonySplitter | Gemma4Splitter | ThinkSplitter:
    """reply_format: "harmony", "gemma4" or "think"; prompt_opened: the prompt ends inside <think>."""
    if reply_format == "harmony":
        return HarmonySplitter()
    return Gemma4Splitter() if reply_format == "gemma4" else ThinkSplitter(prompt_opened)


def split_reply(text: str) -> tuple[str, str]:
    """(reasoning, answer) of a stored reply, whose template may be gone: a harmony reply opens with its channel, a
    Gemma 4 reply shows its channel markers."""
    if text.startswith("<|channel|>"):
        return split_harmony(text)
    return split_gemma4(text) if any(tag in text for tag in GEMMA4_CHANNEL) else split_thinking(text)
