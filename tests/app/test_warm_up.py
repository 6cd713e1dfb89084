"""A model's kernels compiled before its first reply, and the user told when that takes a while."""
import importlib
import pkgutil
import time

from app import warm_up as warm


class SlowEngine:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.calls = []

    def generate(self, prompt, max_tokens, **sampling):
        self.calls.append(("generate", prompt, max_tokens))
        yield from ()

    def warm_up(self):
        self.calls.append(("warm_up",))
        time.sleep(self.seconds)


def test_a_slow_warm_up_is_said_once_and_a_quick_one_not(monkeypatch):
    monkeypatch.setattr(warm, "SLOW_SECONDS", 0.2)
    said = []
    assert warm.warm_up(SlowEngine(0.6), said.append) >= 0.6
    assert said == [warm.NOTICE]
    said.clear()
    warm.warm_up(SlowEngine(0.0), said.append)
    time.sleep(0.3)  # past SLOW_SECONDS: the cancelled timer says nothing
    assert said == []


def compiled_kernels() -> dict:
    """Every numba kernel of the CPU engine with the signatures compiled (or loaded from the cache) so far."""
    import kernels.cpu
    from numba.core.registry import CPUDispatcher
    found = {}
    for info in pkgutil.iter_modules(kernels.cpu.__path__):
        module = importlib.import_module(f"kernels.cpu.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, CPUDispatcher):
                found[f"{info.name}.{name}"] = set(value.signatures)
    return found


def test_after_the_warm_up_a_short_chat_reply_compiles_no_kernel(smollm2):
    """Engine.warm_up alone left the single-threaded attention loop of a short context to the first reply, which
    numba compiled mid-reply (that reply at ~80% of the next one's speed); a chat's first reply is that short."""
    from inference import load

    engine = load(str(smollm2), device="cpu")
    warm.warm_up(engine, lambda text: None)
    before = compiled_kernels()
    for temperature in (0.0, 0.8):
        for _ in engine.generate([{"role": "user", "content": "Hi"}], max_tokens=40, temperature=temperature, seed=1):
            pass
    assert compiled_kernels() == before
