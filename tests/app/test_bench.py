"""`gguf-chat bench` as a script uses it: JSON rows llama-bench would print, depth, one-line errors."""
import json

from tests.app.test_run import assert_one_line_error, gguf_chat


def test_bench_json_at_depth(smollm2):
    r = gguf_chat("bench", smollm2, "-p", "16", "-n", "4", "-r", "2", "-d", "24", "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["model"] == smollm2.name
    assert [(row["engine"], row["test"]) for row in out["results"]] == [("gguf-chat cpu", "pp16 @ d24"),
                                                                       ("gguf-chat cpu", "tg4 @ d24")]
    assert all(len(row["runs"]) == 2 and row["tok_s"] > 0 for row in out["results"])


def test_bench_bad_arguments(smollm2):
    assert_one_line_error(gguf_chat("bench", smollm2, "-p", "0"), "-p, -n and -r")
    assert_one_line_error(gguf_chat("bench", smollm2, "-d", "8", "--compare-llamacpp"), "--depth")
