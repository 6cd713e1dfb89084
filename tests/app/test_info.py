"""`gguf-chat info` as a user runs it: a subprocess, checked against gguf-py's reading of the same file."""
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from gguf import GGUFWriter

from tests.inference.parity import oracle as llama_oracle
from tests.models.malformed.build import corpus

ROOT = Path(__file__).resolve().parents[2]


def info(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", "info", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("model, arch, template", [("smollm2", "llama", True), ("gemma3", "gemma3", False)])
def test_json_matches_gguf_py(model, arch, template, request, gguf_py):
    path = request.getfixturevalue(model)
    done = info(path, "--json")
    assert done.returncode == 0 and done.stderr == ""
    got = json.loads(done.stdout)
    oracle = gguf_py(path)

    def field(key):
        return oracle.fields[key].contents()

    assert got["architecture"] == arch == field("general.architecture")
    for ours, key in [("context_length", "context_length"), ("block_count", "block_count"),
                      ("embedding_length", "embedding_length"), ("feed_forward_length", "feed_forward_length"),
                      ("head_count", "attention.head_count"), ("head_count_kv", "attention.head_count_kv")]:
        assert got[ours] == field(f"{arch}.{key}"), ours
    assert got["parameters"] == sum(t.n_elements for t in oracle.tensors)
    llm = llama_oracle(path, n_ctx=64)
    assert got["parameters"] == llama_cpp.llama_model_n_params(llm.model)  # its "model params" line
    assert got["vocab_size"] == len(oracle.fields["tokenizer.ggml.tokens"].data)
    assert got["tokenizer_model"] == field("tokenizer.ggml.model")
    assert got["chat_template"] is template
    assert got["tensor_count"] == len(oracle.tensors)
    assert got["file_size"] == path.stat().st_size
    counts = Counter(t.tensor_type.name for t in oracle.tensors)
    sizes = Counter()
    for t in oracle.tensors:
        sizes[t.tensor_type.name] += t.n_bytes
    assert {q["type"]: (q["tensors"], q["bytes"]) for q in got["quant_mix"]} == \
        {name: (counts[name], sizes[name]) for name in counts}
    assert [q["bytes"] for q in got["quant_mix"]] == sorted(sizes.values(), reverse=True)


def test_human_summary(gemma3):
    done = info(gemma3)
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    values = {line[:15].strip(): line[15:] for line in lines}
    assert values["architecture"] == "gemma3 (Gemma 3 270m)"
    assert values["parameters"].startswith("268.10 M")  # llama.cpp's load log: model params = 268.10 M
    assert values["context"] == "32768" and values["layers"] == "18"
    assert values["heads"] == "4 (kv 1), head dim 256"
    assert values["tokenizer"] == "SentencePiece (llama, pre default)"
    assert values["vocabulary"] == "262144" and values["chat template"] == "none"
    assert "241.39 MiB" in values["file"]
    quant = lines[lines.index(next(l for l in lines if l.startswith("quant mix"))):]
    assert [q[15:].split()[0] for q in quant] == ["Q8_0", "Q5_0", "Q4_K", "Q6_K", "F32"]
    assert quant[0].endswith(" 8.50 bpw") and quant[-1].endswith("32.00 bpw")


def bad_files(tmp_path) -> list[Path]:
    cases = corpus()
    paths = []
    for name in ["bad magic", "big-endian", "huge n_kv", "dims overflow", "data truncated", "version 1"]:
        path = tmp_path / f"{name.replace(' ', '_')}.gguf"
        path.write_bytes(cases[name][0])
        paths.append(path)
    return paths + [tmp_path / "missing.gguf", tmp_path, tmp_path / "x-00001-of-00002.gguf"]


def test_bad_files_fail_in_one_line(tmp_path):
    (tmp_path / "x-00001-of-00002.gguf").write_bytes(b"")  # its part 2 is missing
    for path in bad_files(tmp_path):
        done = info(path)
        assert done.returncode == 1, path
        assert done.stdout == ""
        assert "Traceback" not in done.stderr
        assert done.stderr.startswith("gguf-chat: error: ") and done.stderr.count("\n") == 1, done.stderr


def test_split_model_is_one_model(tmp_path):
    w = GGUFWriter(tmp_path / "tiny.gguf", "llama", split_max_tensors=1)
    w.add_context_length(64)
    w.add_tensor("a", np.ones((2, 32), dtype=np.float32))
    w.add_tensor("b", np.ones(32, dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    done = info(tmp_path / "tiny-00002-of-00002.gguf", "--json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert (got["parts"], got["parameters"], got["context_length"]) == (2, 96, 64)
    assert got["quant_mix"] == [{"type": "F32", "tensors": 1, "bytes": 256, "bits_per_weight": 32.0},
                                {"type": "F16", "tensors": 1, "bytes": 64, "bits_per_weight": 16.0}]
    human = info(tmp_path / "tiny-00001-of-00002.gguf").stdout
    assert "GGUF v3, 2 parts)" in human.splitlines()[0]


def test_plan_shows_the_split_and_refuses_a_budget_too_small(smollm2):
    done = info(smollm2, "--plan", "--vram-budget", "1", "--ctx", "8192")
    assert done.returncode == 0, done.stderr
    assert "placement: 22/30 layers on GPU, layers 0-7 on CPU: VRAM budget exhausted" in done.stdout
    # without --ctx the model's 8192 halves until every layer fits, as load() does
    plan = json.loads(info(smollm2, "--plan", "--vram-budget", "1", "--json").stdout)["plan"]
    assert plan.splitlines()[0] == "placement: 30/30 layers on GPU" and "(ctx 4096, f16)" in plan
    assert info(smollm2, "--plan", "--vram-budget", "1", "--ctx", "512").stdout.count("30/30 layers on GPU") == 1
    small = info(smollm2, "--plan", "--vram-budget", "0.8")
    assert small.returncode == 1 and small.stderr.count("\n") == 1 and "too small" in small.stderr
    assert "the output head" in small.stderr and "KV cache" in small.stderr
