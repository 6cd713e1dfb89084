"""A constrained reply on the GPU: its own captured step (the model's graph, the grammar's mask written by the host
while that graph runs, then a graph that applies it and samples) gives the schema's JSON at temperature 1, the
same reply as the same step run eagerly, and leaves the unconstrained decode graph as it was."""
import json

import jsonschema
import pytest

from inference.grammar import Constraint, json_schema_grammar

pytestmark = pytest.mark.gpu

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
          "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "maximum": 120}}}
ASK = [{"role": "user", "content": "Describe a person as JSON: name and age."}]


def test_json_at_temperature_1_on_the_gpu_and_the_graph_unchanged(smollm2):
    from inference import load
    gpu = load(smollm2, device="cuda", ctx=512)
    eager = load(smollm2, device="cuda", ctx=512, cuda_graph=False)

    def greedy() -> str:
        return "".join(p for p in gpu.generate(ASK, max_tokens=24, temperature=0) if isinstance(p, str))
    before = greedy()
    free = gpu._decode.graphs[(True, False)]
    constraint = Constraint(json_schema_grammar(SCHEMA))
    for seed in range(20):
        replies = []
        for engine in (gpu, eager):
            *pieces, stats = engine.generate(ASK, max_tokens=48, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0,
                                             seed=seed, constraint=constraint)
            assert stats.finish_reason == "stop"
            jsonschema.validate(json.loads("".join(pieces)), SCHEMA)
            replies.append("".join(pieces))
        assert replies[0] == replies[1]  # the captured constrained step is the eager one
    graph, write_mask, sample = gpu._decode.graphs[(False, True)]
    assert callable(write_mask) and not callable(graph) and not callable(sample)
    assert greedy() == before and gpu._decode.graphs[(True, False)] is free  # the same captured graph, the same reply
