"""A model's kernels compiled before its first reply, and the user told when that takes a while."""
import time

from app import warm_up as warm


class SlowEngine:
    def __init__(self, seconds: float):
        self.seconds = seconds

    def warm_up(self):
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
