"""A gpt-oss reply through `run`: the analysis channel on stderr, the final channel as the answer, and the reasoning
effort in the prompt's system message. No file here makes a real model write harmony, so `run` runs a scripted
engine (tests/app/scripted_engine.py).
"""
import json

import pytest

import inference
from app.cli import main
from tests.app.scripted_engine import ANSWER, REASONING, ScriptedEngine


def test_run_prints_the_final_channel_on_stdout_and_the_analysis_on_stderr(tmp_path, monkeypatch, capsys):
    engine = ScriptedEngine(tmp_path / "gpt-oss-20b-mxfp4.gguf")
    monkeypatch.setattr(inference, "load", lambda *a, **k: engine)
    assert main(["run", "gpt-oss", "-p", "What is 2+2?", "--reasoning-effort", "high"]) == 0
    out = capsys.readouterr()
    assert out.out == ANSWER + "\n" and out.err == REASONING + "\n"  # stderr is no terminal here: not dimmed
    assert engine.reasoning_line() == "Reasoning: high"
    assert main(["run", "gpt-oss", "-p", "What is 2+2?", "--json", "--reasoning-effort", "low"]) == 0
    reply = json.loads(capsys.readouterr().out)
    assert (reply["thinking"], reply["text"]) == (REASONING, ANSWER) and engine.reasoning_line() == "Reasoning: low"
    assert main(["run", "gpt-oss", "-p", "What is 2+2?", "--hide-thinking"]) == 0
    assert capsys.readouterr() == (ANSWER + "\n", "") and engine.reasoning_line() == "Reasoning: medium"
