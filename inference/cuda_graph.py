"""The GPU decode step: token[0] at pos[0] through the model, then the sampler writes the next token into
token[0] and bumps pos[0], so each step feeds the next with no host traffic but reading the new token id.

The first step of a sampling mode (greedy or not) runs eagerly as the warm-up (kernels compiled, buffers
allocated, inverse frequencies uploaded) and is a real step; the same call sequence is then captured into a
CUDA graph on the backend's stream, and every later step is one graph launch. use_graph=False runs every
step eagerly (the same ops), so the graph's effect can be measured.
"""
from collections.abc import Iterator

from inference.backend_cuda import CUDABackend
from inference.forward import forward
from inference.sampling import SamplingParams
from inference.weights import ModelWeights
from models.config import ModelConfig


class DecodeStep:
    def __init__(self, be: CUDABackend, cfg: ModelConfig, weights: ModelWeights, use_graph: bool = True):
        self.be = be
        self.cfg = cfg
        self.weights = weights
        self.use_graph = use_graph
        self.graphs = {}  # greedy (bool) -> cupy.cuda.Graph
        self.logits = None  # [1, n_vocab] in the arena: the latest step's logits (the same buffer every step)

    def _eager(self, greedy: bool):
        self.be.begin_step()
        logits = forward(self.be, self.cfg, self.weights)
        self.be.sample(logits[0], greedy)
        return logits

    def __call__(self, greedy: bool) -> None:
        """Run one step (the host does not wait for it)."""
        graph = self.graphs.get(greedy)
        if graph is not None:
            graph.launch(self.be.stream)
            return
        self.logits = self._eager(greedy)
        if self.use_graph:
            stream = self.be.stream
            stream.begin_capture()
            try:
                logits = self._eager(greedy)
            finally:
                graph = stream.end_capture()
            assert logits.data.ptr == self.logits.data.ptr, "the captured step must reuse the warm-up's buffers"
            self.graphs[greedy] = graph

    def wait(self) -> None:
        """Until the device has done everything asked of it."""
        self.be.stream.synchronize()

    def tokens(self, logits, params: SamplingParams, seed: int | None, history: list[int],
               max_tokens: int | None = None) -> Iterator[int]:
        """The tokens after history (at most max_tokens), sampled on the device from logits [1, n_vocab] (the
        last forward's, of history's last token). The step on each token but the last is launched before the
        token is handed out, so the GPU runs it while the caller handles the token (detokenizing, stop strings)
        and the next next() only waits for it. A caller that stops early (end of generation, a stop string)
        leaves one step done for nothing: its cache row lies past the engine's cached tokens, so a later
        prompt overwrites it before anything reads it."""
        greedy = params.temperature <= 0 and params.repeat_penalty == 1.0  # argmax; else the sampler kernel
        self.be.start_sampling(params, seed, history)
        self.be.sample(logits[0], greedy)
        pos = len(history)  # of the token read next
        end = self.be.n_ctx if max_tokens is None else min(self.be.n_ctx, pos + max_tokens - 1)
        while True:
            token = self.be.read_token()
            if pos < end:  # a step writes the token's k, v at pos: only inside the cache, only if more come
                self(greedy)
            pos += 1
            yield token
