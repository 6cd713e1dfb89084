"""A captured decode step as pieces: CUDA graphs with host work between them.

Host work cannot be captured into a graph. Where a step needs the host in its middle (host experts: the cores run
a layer's chosen experts; constrained decoding: the grammar's mask of the next token), host_point ends the graph
captured so far, keeps the work as the next piece and begins capturing the next graph. A replay launches each
graph and calls each piece of work in order (cuda_graph.DecodeStep), so the host works while the GPU runs the
graphs launched before it. Outside a capture the work runs at once.
"""
import cupy as cp


class StepPieces:
    def __init__(self, stream: cp.cuda.Stream):
        self.stream = stream
        self._pieces = None  # while a step is captured: its graphs so far and the host work between them

    def host_point(self, work) -> None:
        """work() now, or while a step is captured, between the graph so far and the next."""
        if self._pieces is None:
            work()
            return
        self._pieces.append(self.stream.end_capture())
        self._pieces.append(work)
        self.stream.begin_capture()

    def begin(self) -> None:
        """A decode step is about to be captured: host_point splits it into pieces."""
        self._pieces = []

    def end(self, last) -> list:
        """The captured step's pieces in order: graphs (launch them) and host work (call it); last: the graph
        captured after the last host point."""
        pieces, self._pieces = self._pieces + [last], None
        return pieces
