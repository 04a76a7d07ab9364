"""The benchmark's CUDA-graph capture (lltm.bench.timing.capture_graph): a
capture that fails leaves nothing behind for the captures and random ops
that follow. CPU: the recovery logic against a fake of torch's graph API
(what it must undo where ending the capture fails); CUDA: the real thing."""
import contextlib

import pytest
import torch

from lltm.bench import timing
from lltm.bench.timing import CaptureFailed, capture_graph


class FakeGraph:
    def __init__(self, log, begin_fails=False, end_fails=False, ended=False):
        self.log, self.begin_fails, self.end_fails, self.ended = log, begin_fails, end_fails, ended

    def capture_begin(self, pool):
        self.log.append(("begin", pool))
        if self.begin_fails:
            raise RuntimeError("CUDA error: operation not permitted")

    def capture_end(self):
        self.log.append("end")
        if self.end_fails:
            raise RuntimeError("CUDA error: operation failed due to a previous error during "
                               "capture")
        self.ended = True

    def pool(self):
        if not self.ended:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture")
        return ("pool", 7)


class FakeApi(timing.CudaGraphApi):
    def __init__(self, **graph):
        self.log, self.graph_args, self.stream_depth = [], graph, 0

    def new_graph(self):
        self.graph = FakeGraph(self.log, **self.graph_args)
        return self.graph

    def new_pool(self):
        return ("pool", 7)

    @contextlib.contextmanager
    def stream(self, stream):
        self.stream_depth += 1
        self.log.append(("stream", stream))
        try:
            yield
        finally:
            self.stream_depth -= 1
            self.log.append("stream restored")

    def device_index(self, device):
        return 0

    def end_allocate_to_pool(self, index, pool):
        self.log.append(("end_allocate", index, pool))
        if self.graph.ended:
            raise RuntimeError("endAllocatePool: not currently recording to mempool_id")

    def release_pool(self, index, pool):
        self.log.append(("release_pool", index, pool))

    def reset_generator(self, index):
        self.log.append(("reset_generator", index))

    def synchronize(self, device):
        self.log.append("sync")

    def prepare(self, device):
        self.log.append("prepare")


def _undo_steps(log):
    return [e for e in log if isinstance(e, tuple) and e[0] in
            ("end_allocate", "release_pool", "reset_generator")]


def test_a_capture_that_succeeds_returns_its_graph_and_undoes_nothing():
    api, ran = FakeApi(), []
    graph = capture_graph(lambda: ran.append(1), "s", "cuda:0", api)
    assert graph is api.graph and ran == [1] and graph.ended
    assert _undo_steps(api.log) == [] and api.stream_depth == 0
    assert api.log.index(("begin", ("pool", 7))) < api.log.index("end") \
        < api.log.index("stream restored")


def test_an_invalidated_capture_is_undone_and_reported():
    """The body raises (a sync inside the capture) and ending the capture
    then fails: the allocator's routing into the pool ends, the pool is
    released, the generator leaves capture mode, the stream is restored."""
    api = FakeApi(end_fails=True)

    def body():
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
    with pytest.raises(CaptureFailed, match="operation not permitted"):
        capture_graph(body, "s", "cuda:0", api)
    assert _undo_steps(api.log) == [("end_allocate", 0, ("pool", 7)),
                                    ("release_pool", 0, ("pool", 7)), ("reset_generator", 0)]
    assert api.stream_depth == 0 and api.log[-1] == "sync"


def test_a_body_error_in_a_capture_that_still_ends_needs_no_undo():
    """torch.compile refusing inside the capture: the capture itself ends
    (the graph then owns its pool and releases it when dropped)."""
    api = FakeApi()

    def body():
        raise RuntimeError("donated buffers")
    with pytest.raises(CaptureFailed, match="donated buffers"):
        capture_graph(body, "s", "cuda:0", api)
    assert "end" in api.log and _undo_steps(api.log) == [] and api.stream_depth == 0


def test_a_capture_that_fails_after_it_ended_keeps_the_pool_with_the_graph():
    """Ending raised after the graph took its pool (instantiation): the pool
    is the graph's to release, not released twice."""
    api = FakeApi(end_fails=True, ended=True)
    with pytest.raises(CaptureFailed):
        capture_graph(lambda: None, "s", "cuda:0", api)
    steps = _undo_steps(api.log)
    assert ("release_pool", 0, ("pool", 7)) not in steps
    assert ("reset_generator", 0) in steps


def test_a_capture_that_cannot_begin_is_undone():
    api = FakeApi(begin_fails=True)
    ran = []
    with pytest.raises(CaptureFailed, match="not permitted"):
        capture_graph(lambda: ran.append(1), "s", "cuda:0", api)
    assert ran == [] and "end" not in api.log
    assert ("release_pool", 0, ("pool", 7)) in _undo_steps(api.log) and api.stream_depth == 0


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
def test_after_an_invalidated_capture_later_captures_and_random_ops_work():
    device = torch.device("cuda")
    x = torch.randn(64, device=device)
    stream = torch.cuda.Stream(device)

    def invalid():
        y = x * 2
        y.sum().item()  # a synchronization: not allowed while capturing
    with pytest.raises(CaptureFailed):
        capture_graph(invalid, stream, device)
    torch.nn.LSTMCell(4, 8, device=device)  # random initialisation on the GPU
    torch.rand(3, device=device)
    out = torch.empty_like(x)
    graph = capture_graph(lambda: torch.mul(x, 3, out=out), stream, device)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x * 3)


def _donated_buffers_refusal(rec: dict, metric: str) -> bool:
    """torch 2.11's compiled backward keeps its donated buffers although the
    bench compiles with them off (seen on the H100 machine, 2026-11-24): its
    backward-alone graph is then n/a with this reason, and only it."""
    return (rec["impl"] == "compile" and metric == "graph_backward"
            and isinstance(rec[metric], dict) and "donated buffers" in str(rec[metric].get("n/a"))
            and torch.__version__ < "2.12")


@needs_cuda
def test_the_graph_timers_time_every_cell_metric_including_torch_compile():
    """The backward-alone graph of torch.compile(reference) (a retained
    graph: donated buffers off), and nn.LSTMCell after it, in one process."""
    from lltm.bench import cases, runner
    from lltm.bench.report import Progress
    w = cases.Workload(torch.device("cuda"), torch.float32, "cell", 64, 256, 512)
    impls = [i for i in cases.default_impls() if i.key in ("reference", "compile", "lstm_cell")]
    opts = runner.Options(reps=4, seq_reps=2, passes=2, warmup=1, graphs=True,
                          compile_on_cpu=False)
    records = runner.run_workload(w, impls, opts, Progress(1, enabled=False))
    problems = [f"{rec['impl']}: status {rec['status']} ({rec['note']})" for rec in records
                if rec["status"] != "ok"]
    problems += [f"{rec['impl']} {metric}: {rec[metric]}" for rec in records
                 if rec["status"] == "ok" for metric in timing.GRAPH_METRICS
                 if not (isinstance(rec[metric], dict) and "median_us" in rec[metric])
                 and not _donated_buffers_refusal(rec, metric)]
    # on one line: pytest's short summary (the last lines of a run) shows it whole
    assert not problems, "graph timers failed: " + " | ".join(problems)
