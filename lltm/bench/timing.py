"""Timing: eager (synchronized, many repetitions) and CUDA-graph replay;
samples in microseconds, summarized as median and p10-p90."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from .cases import Case, synchronize

METRICS = ("forward", "backward", "step")
GRAPH_METRICS = ("graph_forward", "graph_backward", "graph_step")
# A pipelined chunk runs at least this long (its step count estimated from
# the pass's synchronized forward + backward), so that the synchronization
# that ends it, and the GPU work still queued then, are a small part of each
# step: with the sequences' 2 steps a pass, the wait for the last step's
# GPU work was half a step's time.
MIN_CHUNK_US = 20_000.0
MAX_CHUNK_STEPS = 1000


class Timer:
    """Eager timings of one case; samples in microseconds."""

    def __init__(self, case: Case, device: torch.device):
        self.case = case
        self.device = device
        self.samples: dict[str, list[float]] = {m: [] for m in METRICS}

    def _grad(self, outputs, retain_graph=False):
        return torch.autograd.grad(outputs, self.case.leaves, self.case.grad_outputs,
                                   retain_graph=retain_graph)

    def warm_up(self, n: int) -> None:
        for _ in range(n):
            self._grad(self.case.forward())
        synchronize(self.device)

    def run_pass(self, n: int) -> None:
        """n synced forwards, n synced backwards, one pipelined chunk of at least
        n steps and MIN_CHUNK_US (estimated)."""
        forward, clock = self.case.forward, time.perf_counter_ns

        def sync():
            synchronize(self.device)
        for _ in range(n):
            sync()
            start = clock()
            outputs = forward()
            sync()
            self.samples["forward"].append((clock() - start) / 1e3)
            del outputs
        for _ in range(n):
            outputs = forward()
            sync()
            start = clock()
            self._grad(outputs)
            sync()
            self.samples["backward"].append((clock() - start) / 1e3)
            del outputs
        estimate = self.samples["forward"][-1] + self.samples["backward"][-1]
        chunk = max(n, min(MAX_CHUNK_STEPS, int(MIN_CHUNK_US // max(estimate, 1.0))))
        sync()
        start = clock()
        for _ in range(chunk):
            self._grad(forward())
        sync()
        self.samples["step"].append((clock() - start) / 1e3 / chunk)


class GraphTimer:
    """GPU time of one case from CUDA-graph replay: ``unroll`` iterations of the
    forward, the backward (of one retained forward) and the step, each captured
    into one graph; a replay is timed between CUDA events."""

    def __init__(self, case: Case, device: torch.device, unroll: int):
        self.case, self.device, self.unroll = case, device, unroll
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.reasons: dict[str, str] = {}
        self.samples: dict[str, list[float]] = {m: [] for m in GRAPH_METRICS}
        self._keep = []  # tensors the graphs read (the retained forward)

    def capture(self) -> None:
        case, unroll = self.case, self.unroll

        def grad(outputs, retain_graph=False):
            return torch.autograd.grad(outputs, case.leaves, case.grad_outputs,
                                       retain_graph=retain_graph)

        def forwards():
            for _ in range(unroll):
                case.forward()

        def steps():
            for _ in range(unroll):
                grad(case.forward())

        stream = torch.cuda.Stream(self.device)
        with torch.cuda.device(self.device):
            for metric, body in (("graph_forward", forwards), ("graph_step", steps)):
                self._capture(metric, body, stream)
            # The backward alone: its forward runs (on the capture stream, where
            # autograd will run the backward) before the capture and is kept.
            try:
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):
                    outputs = case.forward()
                self._keep.append(outputs)
            except Exception as error:  # noqa: BLE001
                self.reasons["graph_backward"] = reason(error)
                return

            def backwards():
                for _ in range(unroll):
                    grad(outputs, retain_graph=True)
            self._capture("graph_backward", backwards, stream)

    def _capture(self, metric: str, body: Callable[[], None], stream) -> None:
        try:
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):  # warm-up on the side stream, as the docs ask
                body()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                body()
            graph.replay()
            torch.cuda.synchronize(self.device)
            self.graphs[metric] = graph
        except Exception as error:  # noqa: BLE001
            self.reasons[metric] = reason(error)
            try:
                torch.cuda.synchronize(self.device)
            except Exception:  # noqa: BLE001
                pass

    def run_pass(self, replays: int) -> None:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        for metric, graph in self.graphs.items():
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            end.synchronize()
            self.samples[metric].append(start.elapsed_time(end) * 1e3 / (replays * self.unroll))

    def release(self) -> None:
        self.graphs.clear()
        self._keep.clear()


def reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:200]


def summarize(samples: list[float]) -> dict | None:
    if not samples:
        return None
    q = statistics.quantiles(samples, n=10, method="inclusive") if len(samples) > 1 else \
        [samples[0]] * 9
    return {"median_us": statistics.median(samples), "p10_us": q[0], "p90_us": q[-1],
            "n": len(samples)}
