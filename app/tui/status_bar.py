"""One line under the chat: model, where its layers run, speed of the last reply and what its prompt cost (the
tokens processed: a regenerated reply or an edited last message that resumes from the cache processes few),
context used."""
from textual.reactive import reactive
from textual.widgets import Static


class StatusBar(Static):
    model = reactive("no model")
    state = reactive("")           # 'loading…', 'preparing the kernels…', 'generating…', an error, or ''
    placement = reactive("")       # e.g. 'CPU 30/30 layers' or 'GPU 24 · CPU 6 layers'
    tok_s = reactive(0.0)          # generation speed of the last reply
    prompt = reactive("")          # e.g. 'prompt 12 tok in 0.08 s': the last reply's prompt, tokens processed
    ctx_used = reactive(0)
    n_ctx = reactive(0)

    def render(self) -> str:
        parts = [self.model]
        if self.state:
            parts.append(self.state)
        if self.placement:
            parts.append(self.placement)
        if self.tok_s:
            parts.append(f"{self.tok_s:.1f} tok/s")
        if self.prompt:
            parts.append(self.prompt)
        if self.n_ctx:
            parts.append(f"ctx {self.ctx_used}/{self.n_ctx}")
        return " │ ".join(parts)


def placement_text(engine) -> str:
    """Where the layers run: 'GPU 32/32 layers', 'GPU 24 · CPU 8 layers' or 'CPU 30/30 layers', and where
    experts stay on the CPU: 'GPU 48/48 layers · experts of 24 on CPU'."""
    p = engine.placement
    n, k = len(p.layers), p.n_gpu_layers
    text = f"GPU {k} · CPU {n - k} layers" if 0 < k < n else f"{'GPU' if k else 'CPU'} {n}/{n} layers"
    if k and p.cpu_expert_layers > p.first_gpu_layer:
        text += f" · experts of {p.cpu_expert_layers - p.first_gpu_layer} on CPU"
    return text


def prompt_text(stats: dict | None) -> str:
    """'prompt 12 tok in 0.08 s': the tokens a reply's prompt processed (those reused from the cache not counted)."""
    if not stats or "prompt_seconds" not in stats:  # none yet, or stored by an older version
        return ""
    return f"prompt {stats['prompt_tokens']} tok in {stats['prompt_seconds']:.2f} s"
