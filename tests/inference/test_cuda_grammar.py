"""A constrained reply on the GPU: the host path (eager step, logits copied to the host, masked and sampled there)
gives the schema's JSON at temperature 1, and the unconstrained decode graph is the same after it."""
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

    def greedy() -> str:
        return "".join(p for p in gpu.generate(ASK, max_tokens=24, temperature=0) if isinstance(p, str))
    before = greedy()
    graphs = dict(gpu._decode.graphs)
    constraint = Constraint(json_schema_grammar(SCHEMA))
    for seed in range(20):
        *pieces, stats = gpu.generate(ASK, max_tokens=48, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed,
                                      constraint=constraint)
        assert stats.finish_reason == "stop"
        jsonschema.validate(json.loads("".join(pieces)), SCHEMA)
    assert greedy() == before and gpu._decode.graphs == graphs  # the same captured graphs, the same reply
