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
        with self.case.scope():
            for _ in range(n):
                self._grad(self.case.forward())
            synchronize(self.device)

    def run_pass(self, n: int) -> None:
        with self.case.scope():
            self._run_pass(n)

    def _run_pass(self, n: int) -> None:
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

    def capture(self, metrics=GRAPH_METRICS) -> None:
        """Capture the graphs of ``metrics``; a failure leaves a reason."""
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
                if metric in metrics:
                    self._capture(metric, body, stream)
            if "graph_backward" not in metrics:
                return
            # The backward alone: its forward runs (on the capture stream, where
            # autograd will run the backward) before the capture and is kept.
            try:
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream), case.scope():
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
            with self.case.scope():
                stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(stream):  # warm-up on the side stream, as the docs ask
                    body()
                torch.cuda.current_stream(self.device).wait_stream(stream)
                graph = capture_graph(body, stream, self.device)
            graph.replay()
            torch.cuda.synchronize(self.device)
            self.graphs[metric] = graph
        except Exception as error:  # noqa: BLE001
            self.reasons[metric] = reason(error)
            try:
                torch.cuda.synchronize(self.device)
            except Exception:  # noqa: BLE001
                pass

    def replay_us(self, metric: str, replays: int) -> float:
        """Microseconds per iteration of ``replays`` back-to-back replays."""
        graph = self.graphs[metric]
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / (replays * self.unroll)

    def run_pass(self, replays: int) -> None:
        for metric in self.graphs:
            self.samples[metric].append(self.replay_us(metric, replays))

    def release(self) -> None:
        self.graphs.clear()
        self._keep.clear()


class CaptureFailed(RuntimeError):
    """A CUDA-graph capture failed; the process is left as it was before it."""


class CudaGraphApi:
    """What :func:`capture_graph` asks of torch (tests replace it with a fake)."""

    def new_graph(self):
        return torch.cuda.CUDAGraph()

    def new_pool(self):
        return torch.cuda.graph_pool_handle()

    def stream(self, stream):
        return torch.cuda.stream(stream)

    def device_index(self, device) -> int:
        return torch.device(device).index if torch.device(device).index is not None \
            else torch.cuda.current_device()

    def graph_ended(self, graph) -> bool:
        """Whether the capture got far enough for the graph to own its pool
        (torch's CUDAGraph.pool() answers only then)."""
        try:
            graph.pool()
            return True
        except RuntimeError:
            return False

    def end_allocate_to_pool(self, index: int, pool) -> None:
        torch._C._cuda_endAllocateToPool(index, pool)

    def release_pool(self, index: int, pool) -> None:
        torch._C._cuda_releasePool(index, pool)

    def reset_generator(self, index: int) -> None:
        # A capture that never ended leaves the default generator's state in
        # capture mode (the next random op then fails: "Offset increment
        # outside graph capture"); a copy of its state (same seed and offset)
        # is not.
        generator = torch.cuda.default_generators[index]
        generator.graphsafe_set_state(generator.clone_state())

    def synchronize(self, device) -> None:
        torch.cuda.synchronize(device)

    def prepare(self, device) -> None:
        """What torch.cuda.graph does first: finish the queued work, and
        free the cached blocks for the graph's pool."""
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def capture_graph(body: Callable[[], None], stream, device, api: CudaGraphApi | None = None):
    """``body()`` captured into a new CUDA graph on ``stream`` (its own memory
    pool); returns the graph. Where the capture fails (``body`` raises, or an
    operation inside it invalidates the capture), raises :class:`CaptureFailed`
    after undoing what the capture set up, which torch.cuda.graph leaves in
    place when ending the capture fails: the caching allocator still routes
    into the graph's pool, the default generator stays in capture mode, the
    capture stream stays current. Later captures and random ops in the same
    process then work as if the failed capture had not been tried."""
    api = api or CudaGraphApi()
    api.prepare(device)
    graph, pool = api.new_graph(), api.new_pool()
    failure = None
    with api.stream(stream):   # restored however the capture ends
        try:
            graph.capture_begin(pool=pool)
        except Exception as error:  # noqa: BLE001
            _undo_capture(api, graph, pool, device)
            raise CaptureFailed(reason(error)) from error
        try:
            body()
        except Exception as error:  # noqa: BLE001 - ended below, then raised
            failure = error
        try:
            graph.capture_end()
        except Exception as error:  # noqa: BLE001
            failure = failure or error
            _undo_capture(api, graph, pool, device)
    if failure is not None:
        del graph  # a graph that ended keeps its pool until it is destroyed
        try:
            api.synchronize(device)
        except Exception:  # noqa: BLE001 - the capture's own error is the one to report
            pass
        raise CaptureFailed(reason(failure)) from failure
    return graph


def _undo_capture(api: CudaGraphApi, graph, pool, device) -> None:
    """After capture_end raised: what it did not get to do."""
    index = api.device_index(device)
    ended = api.graph_ended(graph)
    try:
        api.end_allocate_to_pool(index, pool)
    except Exception:  # noqa: BLE001 - capture_end got that far already
        pass
    if not ended:  # else the graph releases its pool when destroyed
        try:
            api.release_pool(index, pool)
        except Exception:  # noqa: BLE001
            pass
    api.reset_generator(index)


class StepTimer:
    """Eager forward + backward, pipelined: a sample is n steps back to back
    with no synchronization inside, synchronized at the end, divided by n.
    ``calibrate`` / ``sample`` as :class:`GraphStepTimer`'s, so that a caller
    can size n from a time budget. ``grad=False``: inference, the forward
    alone under torch.no_grad()."""

    def __init__(self, case: Case, device: torch.device, grad: bool = True):
        self.case, self.device, self.grad = case, device, grad
        self.samples: list[float] = []

    def _steps_us(self, n: int) -> float:
        case = self.case
        with case.scope(), torch.set_grad_enabled(self.grad):
            synchronize(self.device)
            start = time.perf_counter_ns()
            for _ in range(n):
                if self.grad:
                    torch.autograd.grad(case.forward(), case.leaves, case.grad_outputs)
                else:
                    case.forward()
            synchronize(self.device)
        return (time.perf_counter_ns() - start) / 1e3 / n

    def calibrate(self) -> float:
        """One step as warm-up, then one timed: its microseconds, the unit of
        ``sample`` (not a sample itself)."""
        self._steps_us(1)
        return self._steps_us(1)

    def sample(self, n: int) -> None:
        self.samples.append(self._steps_us(n))


class GraphStepTimer:
    """GPU time of forward + backward: ``unroll`` steps captured into one CUDA
    graph, n replays timed between CUDA events (:class:`GraphTimer`'s step)."""

    def __init__(self, case: Case, device: torch.device, unroll: int):
        self.graph = GraphTimer(case, device, unroll)
        self.samples: list[float] = self.graph.samples["graph_step"]

    def capture(self) -> str | None:
        """Capture; None, or why the graph could not be captured."""
        self.graph.capture(("graph_step",))
        return self.graph.reasons.get("graph_step")

    def calibrate(self) -> float:
        """Microseconds of one replay (``unroll`` steps): the unit of ``sample``."""
        return self.graph.replay_us("graph_step", 1) * self.graph.unroll

    def sample(self, n: int) -> None:
        self.samples.append(self.graph.replay_us("graph_step", n))

    def release(self) -> None:
        self.graph.release()


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


def attempt(failed: dict[str, str], key: str, run: Callable[[], object]) -> None:
    """run() unless key already failed; an exception it raises marks key failed
    (with the reason) instead of ending the benchmark."""
    if key in failed:
        return
    try:
        run()
    except Exception as error:  # noqa: BLE001
        failed[key] = reason(error)
