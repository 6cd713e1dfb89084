"""An engine that speaks gpt-oss's harmony (or Gemma 4's thought channel) without a model, for what no test file's
weights can do: reply in it. It has the model's real template (llama.cpp's, tests/models/templates) and a token a
character, keeps every prompt it is given, and replies REPLY in 3-character pieces; what `run`, the chat and the
server's worker ask of an engine."""
from pathlib import Path
from types import SimpleNamespace

from inference.engine import GenerationStats
from models.chat_template import ChatTemplate

TEMPLATE = (Path(__file__).parents[1] / "models" / "templates" / "openai-gpt-oss-120b.jinja").read_text()
REASONING, ANSWER = "The user asks 2+2. Simple: 4.", "2 + 2 = **4**."
REPLY = f"<|channel|>analysis<|message|>{REASONING}<|end|><|start|>assistant<|channel|>final<|message|>{ANSWER}"


class ScriptedEngine:
    def __init__(self, path: Path, template: ChatTemplate | None = None, reply: str = REPLY):
        self.path, self.n_ctx, self.config = path, 4096, SimpleNamespace(n_ctx_train=4096)
        self.placement, self.gpu_share = SimpleNamespace(layers=range(2), n_gpu_layers=0), None
        self.chat_template = template or ChatTemplate(TEMPLATE, "<|startoftext|>", "<|return|>")
        self.reply = reply
        self.tokenizer = SimpleNamespace(encode_prompt=lambda text: [ord(c) for c in text], vocab={})  # no tag a token
        self.prompts = []
        self.constraint = None  # the last reply's
        self.shown = ()  # the control tokens the last reply showed as text
        self.special = False  # the last reply showed every control token as text (for a tool-call parser)

    def summary(self) -> str:
        return "scripted: no layers"

    def warm_up(self) -> None:
        pass

    def template(self, chat_template=None):
        return self.chat_template

    def prompt_text(self, messages, chat_template=None, template_vars=None) -> str:
        return self.chat_template.render(messages, **(template_vars or {}))

    def prompt_ids(self, prompt, chat_template=None, template_vars=None) -> list[int]:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            return prompt
        return [ord(c) for c in (prompt if isinstance(prompt, str) else self.prompt_text(prompt, None, template_vars))]

    def check_prompt(self, prompt, chat_template=None, template_vars=None) -> None:
        self.prompt_ids(prompt, chat_template, template_vars)

    def generate(self, prompt, max_tokens=512, chat_template=None, template_vars=None, **sampling):
        ids = self.prompt_ids(prompt, chat_template, template_vars)
        self.prompts.append("".join(map(chr, ids)))
        self.constraint, self.shown = sampling.get("constraint"), sampling.get("shown", ())
        self.special = sampling.get("special", False)
        reply = self.reply
        yield from (reply[i:i + 3] for i in range(0, len(reply), 3))
        yield GenerationStats(len(ids), 0.01, len(reply), 0.01, "stop", len(ids) + len(reply))

    def reasoning_line(self) -> str:
        """The line of the last prompt's system message that gives the reasoning effort."""
        return next(line for line in self.prompts[-1].splitlines() if line.startswith("Reasoning: "))
