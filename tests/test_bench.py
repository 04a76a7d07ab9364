"""python -m lltm.bench: the CLI runs, saves JSON and PNG, and never times a
wrong implementation."""
import json
import math
import os
import subprocess
import sys
import types

import pytest
import torch

from lltm import bench, reference

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICK_CPU = ["--quick", "--device", "cpu", "--sizes", "3,5,7", "--no-progress"]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_cli_quick_cpu_writes_table_json_and_png(tmp_path):
    out_json, out_png = tmp_path / "out.json", tmp_path / "out.png"
    proc = subprocess.run(
        [sys.executable, "-m", "lltm.bench", *QUICK_CPU, "--json", str(out_json),
         "--plot", str(out_png)],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== cpu | float32 | cell B=3 I=5 H=7" in proc.stdout
    assert "== cpu | float32 | sequence B=3 I=5 H=7 T=10" in proc.stdout

    report = json.loads(out_json.read_text())
    machine = report["machine"]
    for key in ("date", "cpu", "cpu_count", "torch_threads", "torch", "python", "gpus"):
        assert key in machine, key
    assert machine["torch"] == torch.__version__
    assert machine["torch_threads"] >= 1
    assert report["config"]["sizes"] == [[3, 5, 7]]
    results = {(r["kind"], r["impl"]): r for r in report["results"]}
    must_run = [("cell", "reference"), ("cell", "reference_function"), ("cell", "native"),
                ("cell", "lstm_cell"), ("sequence", "reference_loop"),
                ("sequence", "native_loop"), ("sequence", "lstm")]
    if hasattr(__import__("lltm"), "LLTM"):
        must_run.append(("sequence", "lltm"))
    for key in must_run:
        r = results[key]
        assert r["status"] == "ok", (key, r["note"])
        assert r["error"] <= r["tolerance"]
        for metric in ("forward", "backward", "step"):
            stat = r[metric]
            assert 0 < stat["p10_us"] <= stat["median_us"] <= stat["p90_us"], (key, metric)
        assert r["graph_step"] is None  # CPU: no CUDA graphs
    assert results[("cell", "compile")]["status"] == "skipped"  # --quick on CPU
    assert results[("cell", "native")]["speedup"]["reference"]["step"] > 0
    assert "lstm" in results[("sequence", "reference_loop")]["speedup"]

    png = out_png.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


class _Counted:
    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


class _WrongBackward(torch.autograd.Function):
    """The reference forward with a gradient of the weights off by 1%."""

    @staticmethod
    def forward(ctx, input, weights, bias, old_h, old_cell):
        with torch.enable_grad():
            args = [t.detach().requires_grad_() for t in (input, weights, bias, old_h, old_cell)]
            outputs = reference.lltm_cell(*args)
        ctx.save_for_backward(*args, *outputs)
        return tuple(o.detach() for o in outputs)

    @staticmethod
    def backward(ctx, grad_h, grad_cell):
        *args, new_h, new_cell = ctx.saved_tensors
        grads = list(torch.autograd.grad((new_h, new_cell), args, (grad_h, grad_cell)))
        grads[1] = grads[1] * 1.01
        return tuple(grads)


def test_wrong_implementations_are_reported_and_not_timed(capsys):
    wrong_forward = _Counted(lambda x, W, b, h, c: tuple(
        t * 1.001 for t in reference.lltm_cell(x, W, b, h, c)))
    wrong_backward = _Counted(_WrongBackward.apply)

    def raising(*args):
        raise RuntimeError("no kernel for this")

    def fails_after_check(*args):
        if fails_after_check.calls:
            raise RuntimeError("broke while timed")
        fails_after_check.calls += 1
        return reference.lltm_cell(*args)
    fails_after_check.calls = 0

    extra = [bench.lltm_cell_impl("wrong_forward", "wrong forward", wrong_forward),
             bench.lltm_cell_impl("wrong_backward", "wrong backward", wrong_backward),
             bench.lltm_cell_impl("raises", "raises", raising),
             bench.lltm_cell_impl("flaky", "fails after its check", fails_after_check)]
    records = bench.main(QUICK_CPU + ["--seq-len", "0", "--only",
                                      "reference,native,wrong_forward,wrong_backward,raises,flaky"],
                         extra_impls=extra)
    table = capsys.readouterr().out
    by_impl = {r["impl"]: r for r in records}
    for key, fn in (("wrong_forward", wrong_forward), ("wrong_backward", wrong_backward)):
        r = by_impl[key]
        assert r["status"] == "WRONG", r
        assert r["error"] > r["tolerance"]
        assert all(r[m] is None for m in bench.METRICS + bench.GRAPH_METRICS)
        assert r["speedup"] == {}
        assert fn.calls == 1  # the check only: never timed
    assert by_impl["wrong_backward"]["where"] == "gradient 1"  # the weights
    assert by_impl["raises"]["status"] == "ERROR"
    assert "no kernel for this" in by_impl["raises"]["note"]
    assert by_impl["flaky"]["status"] == "ERROR" and by_impl["flaky"]["step"] is None
    assert "broke while timed" in by_impl["flaky"]["note"]
    assert by_impl["native"]["status"] == "ok" and by_impl["native"]["step"]["n"] >= 1
    assert table.count("WRONG") >= 2 and "not timed" in table
    assert "ERROR" in table


def test_compile_is_checked_and_timed_on_cpu():
    records = bench.main(["--device", "cpu", "--sizes", "2,3,4", "--seq-len", "0", "--reps", "2",
                          "--passes", "1", "--only", "reference,compile", "--no-progress"])
    compiled = next(r for r in records if r["impl"] == "compile")
    if compiled["status"] == "ERROR":
        pytest.skip(f"torch.compile unavailable here: {compiled['note']}")
    assert compiled["status"] == "ok", compiled
    assert compiled["setup_s"] > 0 and compiled["step"]["median_us"] > 0


def test_float64_and_several_dtypes():
    records = bench.main(QUICK_CPU + ["--seq-len", "3", "--dtype", "float64,bfloat16",
                                      "--only", "reference,native,reference_loop,lltm"])
    f64 = {r["impl"]: r for r in records if r["dtype"] == "float64"}
    assert f64["native"]["status"] == "ok" and f64["native"]["error"] < 1e-12
    assert f64["reference_loop"]["status"] == "ok"
    bf16 = [r for r in records if r["dtype"] == "bfloat16"]
    assert bf16 and all(r["status"] in ("ok", "ERROR") for r in bf16)
    assert next(r for r in bf16 if r["impl"] == "reference")["status"] == "ok"


@pytest.mark.parametrize("argv", [["--sizes", "3,5"], ["--sizes", "3,0,7"], ["--dtype", "int8"],
                                  ["--only", "nonesuch"]])
def test_bad_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--device", "cpu", *argv])
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_untimed_reference_still_sets_the_bar_below_float64():
    # `--only lltm`: the loop of reference cells is not timed, yet below
    # float64 its own error must set the bar as when it runs (T=1000 on the
    # GPU: the float32 reference loop itself is ~1e-3 off float64). Here the
    # "reference" is planted 1e-3 off, so the bar is 2e-3.
    from lltm.bench.report import Progress
    from lltm.bench.runner import Options, run_workload
    w = bench.Workload(torch.device("cpu"), torch.float32, "sequence", 3, 4, 5, 6)
    impls = {i.key: i for i in bench.default_impls()}

    def off_by(key, base, rel):
        def build(w):
            case = impls[base].build(w)
            forward = case.forward

            def shifted():
                out, h, c = forward()
                return out + rel * out.abs().max(), h, c
            case.forward = shifted
            return case
        return bench.Impl(key, key, "sequence", build)

    reference_loop = off_by("reference_loop", "reference_loop", 1e-3)
    opts = Options(reps=2, seq_reps=2, passes=1, warmup=1, graphs=False, compile_on_cpu=False)
    records = run_workload(w, [off_by("near", "lltm", 1.5e-3), off_by("far", "lltm", 4e-3)], opts,
                           Progress(0, enabled=False), references=[reference_loop])
    near, far = records
    assert near["status"] == "ok", near
    assert abs(near["tolerance"] - 2e-3) < 2e-4
    assert "bar from the reference's own error" in near["note"]
    assert far["status"] == "WRONG" and far["step"] is None
    # without the reference the fixed float32 tolerance applies
    fixed = run_workload(w, [off_by("near", "lltm", 1.5e-3)], opts, Progress(0, enabled=False))
    assert fixed[0]["tolerance"] == bench.TOLERANCE[torch.float32]
    assert fixed[0]["status"] == "WRONG"


class _Stream(list):
    """A stream that records what is written; a terminal or not."""

    def __init__(self, tty):
        super().__init__()
        self.tty = tty

    def isatty(self):
        return self.tty

    def write(self, text):
        self.append(text)

    def flush(self):
        pass


def test_progress_draws_nothing_where_output_is_not_a_terminal():
    from lltm.bench.report import Progress
    stream = _Stream(tty=False)
    bar = Progress(3, enabled=True, stream=stream)
    bar.update(1, "cpu | float32 | cell B=3 I=5 H=7: lltm")
    bar.close()
    assert stream == []


def test_progress_shows_whole_names_on_a_terminal(monkeypatch):
    import shutil
    from lltm.bench.report import Progress
    name = "cpu | float32 | sequence B=16 I=32 H=128 T=1000: reference_loop (check)"
    for columns in (40, 400):  # narrower and wider than bar + name
        monkeypatch.setattr(shutil, "get_terminal_size",
                            lambda fallback=None, c=columns: os.terminal_size((c, 24)))
        stream = _Stream(tty=True)
        bar = Progress(4, enabled=True, stream=stream)
        bar.update(2, name)
        bar.update(2, "short")
        bar.close()
        text = "".join(stream)
        assert name in text and "short" in text
        assert "100%" in text and text.endswith("\n")
    assert Progress(4, enabled=False, stream=_Stream(tty=True)).enabled is False


def test_cli_writes_no_progress_lines_into_a_pipe(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "lltm.bench", "--quick", "--device", "cpu", "--sizes", "3,5,7",
         "--seq-len", "0", "--only", "lltm", "--passes", "1"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\r" not in proc.stderr and "%" not in proc.stderr


# ----------------------------------------------------------------------------
# The performance map: python -m lltm.bench --sweep

TINY_SWEEP = ["--sweep", "--device", "cpu", "--dtype", "float32", "--sweep-batches", "1,3",
              "--sweep-hidden", "8,16", "--seq-len", "4", "--sweep-budget-ms", "2",
              "--no-progress"]
PNG = b"\x89PNG\r\n\x1a\n"


def test_sweep_tiny_cpu_writes_json_table_and_heatmaps(tmp_path):
    out = tmp_path / "map"
    proc = subprocess.run(
        [sys.executable, "-m", "lltm.bench", *TINY_SWEEP, "--layers", "1,3", "--threads", "1",
         "--sweep-out", str(out)],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for header in ("== cpu | cell | float32 | I=H/2",
                   "== cpu | sequence | float32 | T=4, 1 layer, I=H/2",
                   "== cpu | sequence | float32 | T=4, 3 layers, I=H/2"):
        assert header in proc.stdout, proc.stdout[-3000:]
    assert "nn.LSTM time / lltm.LLTM time" in proc.stdout

    report = json.loads((out / "sweep.json").read_text())
    assert set(report) == {"machine", "config", "results", "map"}
    for key in ("date", "cpu", "cpu_count", "torch_threads", "torch", "python", "gpus"):
        assert key in report["machine"], key
    assert report["config"]["dtypes"] == ["float32"] and report["config"]["devices"] == ["cpu"]
    entries = {(e["kind"], e["layers"], e["B"], e["H"]): e for e in report["map"]}
    want = {("cell", 1, B, H) for B in (1, 3) for H in (8, 16)}
    want |= {("sequence", L, B, H) for L in (1, 3) for B in (1, 3) for H in (8, 16)}
    assert set(entries) == want
    for (kind, L, B, H), e in entries.items():
        assert e["status"] == "ok", e
        assert e["I"] == H // 2 and e["T"] == (4 if kind == "sequence" else 1)
        peers = ("lstm",) if kind == "sequence" else ("reference", "lstm_cell", "best")
        assert set(e["ratios"]) == set(peers), e
        for peer in peers:
            ratios = e["ratios"][peer]
            assert set(ratios) == {"step", "infer"}, ratios  # CPU: eager only, no graphs
            assert all(math.isfinite(r) and r > 0 for r in ratios.values())
        if kind == "cell":  # the faster peer is the headline
            assert e["ratios"]["best"]["step"] == min(e["ratios"][p]["step"]
                                                      for p in ("reference", "lstm_cell"))
    for rec in report["results"]:
        assert rec["status"] == "ok", rec
        assert rec["error"] <= rec["tolerance"]
        for stat in (rec["step"], rec["infer"]):
            assert stat["n"] >= 2 and 0 < stat["p10_us"] <= stat["median_us"] <= stat["p90_us"]
        assert rec["graph_step"] is None and rec["forward"] is None
    assert {(r["kind"], r["impl"]) for r in report["results"]} == {
        ("sequence", "lltm"), ("sequence", "lstm"), ("cell", "native"), ("cell", "reference"),
        ("cell", "lstm_cell")}

    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["sweep-cpu-cell-float32.png", "sweep-cpu-sequence-float32-L1.png",
                    "sweep-cpu-sequence-float32-L3.png"]
    for name in pngs:
        data = (out / name).read_bytes()
        assert data[:8] == PNG and len(data) > 10_000


def _shifted_sequence(key, counter):
    """lltm.LLTM with its output 1e-3 off (relative): wrong in float32."""
    base = next(i for i in bench.default_impls() if i.key == key)

    def build(w):
        case = base.build(w)
        forward = case.forward

        def shifted():
            counter.calls += 1
            out, h, c = forward()
            return out + 1e-3 * out.abs().max(), h, c
        case.forward = shifted
        return case
    return bench.Impl(key, base.label, "sequence", build, graph_unroll=1)


def test_sweep_reports_wrong_implementations_and_does_not_time_them(capsys):
    wrong_cell = _Counted(lambda x, W, b, h, c: tuple(
        t * 1.001 for t in reference.lltm_cell(x, W, b, h, c)))
    wrong_sequence = types.SimpleNamespace(calls=0)
    extra = [bench.lltm_cell_impl("native", "native (wrong)", wrong_cell),
             _shifted_sequence("lltm", wrong_sequence)]
    result = bench.main(TINY_SWEEP + ["--sweep-batches", "2", "--sweep-hidden", "8",
                                      "--layers", "1"], extra_impls=extra)
    table = capsys.readouterr().out
    assert wrong_cell.calls == 1 and wrong_sequence.calls == 1  # the checks only
    by_impl = {r["impl"]: r for r in result["results"]}
    for key in ("native", "lltm"):
        r = by_impl[key]
        assert r["status"] == "WRONG" and r["error"] > r["tolerance"], r
        assert r["step"] is None and r["infer"] is None and r["graph_step"] is None
    for key in ("lstm", "reference", "lstm_cell"):  # the peers are still timed
        assert by_impl[key]["status"] == "ok" and by_impl[key]["step"]["median_us"] > 0
    for e in result["map"]:
        assert e["status"] == "WRONG" and e["ratios"] == {}
    assert table.count("WRONG") >= 4 and "not timed" in table


@pytest.mark.parametrize("argv, note", [(["--sweep-max-gib", "1e-9"], "GiB"),
                                        (["--sweep-time-limit", "-1"], "time-limit")])
def test_sweep_skips_shapes_over_its_limits(argv, note, capsys):
    result = bench.main(TINY_SWEEP + ["--layers", "3", "--sweep-kind", "sequence", *argv])
    table = capsys.readouterr().out
    assert result["results"] and all(r["status"] == "skipped" and note in r["note"]
                                     and r["step"] is None for r in result["results"])
    assert {e["status"] for e in result["map"]} == {"skipped"}
    assert "skip" in table and note in table


def test_sweep_grid():
    from lltm.bench import sweep
    args = bench.build_parser().parse_args(["--sweep"])
    shapes = sweep.plan(args, quick=False)
    sequences = [s for s in shapes if s.kind == "sequence"]
    assert len(sequences) == 5 * 6 * 2 and len(shapes) == 5 * 6 * 2 + 5 * 3
    assert {(s.B, s.H, s.T, s.layers) for s in sequences} == {
        (B, H, 100, L) for B in (1, 16, 64, 256, 1024) for H in (64, 128, 256, 512, 1024, 2048)
        for L in (1, 3)}
    assert all(s.I == s.H // 2 for s in shapes)
    costs = [s.cost() for s in shapes]
    assert costs == sorted(costs)  # cheapest first: a time limit cuts the dearest
    quick = sweep.plan(bench.build_parser().parse_args(["--sweep-quick"]), quick=True)
    assert len(quick) < len(shapes) and max(s.T for s in quick) == sweep.QUICK_SEQ_LEN
    big = max(sequences, key=lambda s: s.cost())
    assert sweep.estimate_bytes(big, torch.float32) > sweep.estimate_bytes(big, torch.bfloat16) \
        > sweep.estimate_bytes(sequences[0], torch.float32)


@pytest.mark.parametrize("argv", [["--sweep", "--sweep-batches", "0"],
                                  ["--sweep", "--sweep-hidden", "x"],
                                  ["--sweep-batches", "4"],
                                  ["--sweep", "--only", "lltm"]])
def test_bad_sweep_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--device", "cpu", *argv])
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_multi_layer_sequences_are_checked_against_the_stacked_oracle():
    records = bench.main(["--quick", "--device", "cpu", "--sizes", "2,3,5", "--seq-len", "3",
                          "--layers", "2", "--no-progress", "--only",
                          "lltm,lstm,reference_loop,native_loop"])
    assert {r["impl"] for r in records} == {"lltm", "lstm", "reference_loop", "native_loop"}
    for r in records:
        assert r["layers"] == 2 and r["status"] == "ok", r
        assert r["error"] < 1e-5


def test_no_input_grad_checks_and_times_the_parameters_gradients(capsys):
    """--no-input-grad: the input and the initial state need no gradient; each
    implementation is checked on the parameters' gradients alone."""
    records = bench.main(["--quick", "--device", "cpu", "--sizes", "3,4,5", "--seq-len", "3",
                          "--no-progress", "--no-input-grad", "--only",
                          "reference,native,lltm,lstm,reference_loop"])
    assert {r["impl"] for r in records} == {"reference", "native", "lltm", "lstm",
                                            "reference_loop"}
    for r in records:
        assert r["input_grad"] is False and r["status"] == "ok", r
        assert r["error"] < 1e-5 and r["step"] is not None
    assert "input and state need no grad" in capsys.readouterr().out


class _FakeTimer:
    """A timer whose step costs ``us``; records the sample sizes asked for."""

    def __init__(self, us, fail=False):
        self.us, self.fail, self.sizes = us, fail, []

    def calibrate(self):
        return self.us

    def sample(self, n):
        if self.fail:
            raise RuntimeError("lost the device")
        self.sizes.append(n)


def test_sweep_sampling_fills_the_budget_in_passes_that_take_turns():
    from lltm.bench import sweep
    sopts = sweep.SweepOptions(budget_us=1000.0, min_passes=3, max_passes=5, time_limit_s=1.0,
                               max_bytes=1.0, graphs=False, max_chunk=50)
    fast, slow, tiny, broken = (_FakeTimer(10.0), _FakeTimer(400.0), _FakeTimer(0.1),
                                _FakeTimer(5.0, fail=True))
    failed = {}
    chunks = sweep._timed_passes({"fast": fast, "slow": slow, "tiny": tiny, "broken": broken},
                                 sopts, failed)
    # the slowest takes 400 us a step: 1000 // 400 = 2 passes, raised to the minimum 3
    assert slow.sizes == [1, 1, 1]                    # never less than one step
    assert fast.sizes == [33, 33, 33]                 # 1000 us / 3 passes / 10 us
    assert tiny.sizes == [50, 50, 50]                 # capped
    assert chunks == {"fast": 33, "slow": 1, "tiny": 50, "broken": 50}
    assert broken.sizes == [] and "lost the device" in failed["broken"]
    few = sweep._timed_passes({"fast": _FakeTimer(10.0)}, sopts, {})
    assert few == {"fast": 20}                         # 1000 // 10: 5 passes at most


@pytest.mark.parametrize("row", ["bidirectional", "packed"])
def test_rows_check_then_time_small(row):
    """--rows at small sizes: every implementation passes its float64 check
    and gets an eager step time; lltm's packed and padded runs give
    different outputs (rows stop), both checked."""
    from lltm.bench import rows
    records = rows.run_row(row, torch.device("cpu"), torch.float32, 0, passes=1, graphs=False,
                           sizes=dict(B=5, I=3, H=6, T=8))
    assert len(records) == 3
    for r in records:
        assert r["status"] == "ok" and r["error"] <= r["bar"] and r["step_us"] > 0, r
    table = rows.format_rows(records, {"cpu": "test"})
    assert table.count(f"\n| {row} ") == 3


@pytest.mark.parametrize("row", ["bidirectional", "packed"])
def test_rows_cases_differentiate_their_own_leaves(row):
    """Every timed and oracle case takes gradients of leaves of its own: an
    input copied by ``to`` from data that another case made a leaf would be
    an autograd node made on the stream current at build time (a CUDA-graph
    capture of the backward then waits on that stream and fails)."""
    from lltm.bench import rows
    built = rows.cases(row, torch.device("cpu"), torch.float32, 0,
                       sizes=dict(B=3, I=2, H=4, T=5))
    for label, case, bar_case in built.values():
        for c in (case, bar_case):
            assert all(leaf.is_leaf and leaf.grad_fn is None for leaf in c.leaves), label
            assert not any(g.requires_grad for g in c.grad_outputs), label


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("row", ["bidirectional", "packed"])
def test_rows_time_every_graph_on_cuda(row):
    """On CUDA every implementation of every row gets its CUDA-graph time
    (the capture of forward and backward succeeds, both directions too)."""
    from lltm.bench import rows
    records = rows.run_row(row, torch.device("cuda"), torch.float32, 0, passes=1, graphs=True,
                           sizes=dict(B=5, I=3, H=32, T=8))
    for r in records:
        assert r["status"] == "ok", r
        assert r["graph_step_us"] is not None and r["graph_step_us"] > 0, r


@pytest.mark.parametrize("setting,want", [("off", (False, False)), ("on", (True, True))])
def test_tf32_setting_holds_for_the_run_and_is_restored(setting, want, monkeypatch):
    """--tf32 off / on set both of torch's TF32 flags (aten::mm's, cuDNN's) for
    the run, then put back what was there."""
    from lltm.bench import runner
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32)
    seen = []

    def run(args, parser, argv, extra_impls):
        seen.append((matmul.allow_tf32, cudnn.allow_tf32))
        raise RuntimeError("stop")
    monkeypatch.setattr(runner, "_run", run)
    with pytest.raises(RuntimeError, match="stop"):  # restored on the way out of a failure too
        bench.main(["--device", "cpu", "--tf32", setting])
    assert seen == [want]
    assert (matmul.allow_tf32, cudnn.allow_tf32) == before
    with runner.tf32_setting("default"):
        assert (matmul.allow_tf32, cudnn.allow_tf32) == before
    with pytest.raises(ValueError):
        with runner.tf32_setting("tf32"):
            pass
    with pytest.raises(SystemExit):
        bench.main(["--device", "cpu", "--tf32", "sometimes"])
    from lltm.bench.report import tf32_text
    assert tf32_text({"tf32": None}) == ""
    assert tf32_text({"tf32": {"matmul": False, "cudnn": True}}) == \
        "; float32 on TF32: aten::mm off, cuDNN on"


def test_rows_flag_is_parsed():
    from lltm.bench.runner import build_parser
    args = build_parser().parse_args(["--rows", "all"])
    assert args.rows == ["bidirectional", "packed"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--rows", "sideways"])


def test_the_bar_under_tf32_follows_the_reference(monkeypatch):
    """Under torch's matmul TF32 setting lltm's float32 products and the
    reference's run on TF32 alike: the bar is twice the reference's error,
    1e-2 at least; cuDNN under its own TF32 flag keeps 1e-2; without TF32
    float32 keeps its usual bar."""
    from lltm import _settings
    from lltm.bench import cases
    w = types.SimpleNamespace(dtype=torch.float32, device=torch.device("cuda"))
    ours = cases.Case(forward=None, leaves=[], grad_outputs=(), expected=())
    cudnn = cases.Case(forward=None, leaves=[], grad_outputs=(), expected=(), family="lstm",
                       uses_cudnn=True)
    monkeypatch.setattr(_settings, "float32_tf32", lambda: True)
    assert cases.tolerance(w, ours, 0.024) == pytest.approx(0.048)
    assert cases.tolerance(w, ours, 1e-3) == cases.TF32_TOLERANCE
    assert cases.tolerance(w, cudnn, 4e-4) == cases.TF32_TOLERANCE
    monkeypatch.setattr(_settings, "float32_tf32", lambda: False)
    assert cases.tolerance(w, ours, 1e-5) == cases.TOLERANCE[torch.float32]
    assert cases.tolerance(w, ours, 1e-3) == pytest.approx(2e-3)
    cpu = types.SimpleNamespace(dtype=torch.float32, device=torch.device("cpu"))
    monkeypatch.setattr(_settings, "float32_tf32", lambda: True)
    assert cases.tolerance(cpu, ours, 1e-5) == cases.TOLERANCE[torch.float32]


def test_round_to_tf32_keeps_ten_mantissa_bits_rounding_to_nearest():
    from lltm.bench.cases import round_to_tf32
    ulp = 2.0 ** -10  # TF32's spacing at 1.0
    x = torch.tensor([1.0, 1 + ulp / 4, 1 + ulp / 2, 1 + 3 * ulp / 4, -(1 + ulp / 2), 3.0, 0.0,
                      -0.0, 1e-30, 6e4], dtype=torch.float32)
    got = round_to_tf32(x)
    want = torch.tensor([1.0, 1.0, 1 + ulp, 1 + ulp, -(1 + ulp), 3.0, 0.0, -0.0,
                         round_to_tf32(torch.tensor([1e-30])).item(), 6e4], dtype=torch.float32)
    assert torch.equal(got, want)
    assert (got.view(torch.int32) & 0x1FFF).eq(0).all()
    r = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    rel = ((round_to_tf32(r) - r).abs() / r.abs()).max().item()
    assert 2.0 ** -13 < rel <= 2.0 ** -11  # at most half a TF32 ulp, and not exact


def test_tf32_products_round_every_float32_product_operand():
    """Under TF32Products the float32 products (forward and backward, mm and
    addmm) take TF32-rounded operands; other dtypes and element-wise ops are
    untouched."""
    import torch.nn.functional as F
    from lltm.bench.cases import TF32Products, round_to_tf32
    g = torch.Generator().manual_seed(1)
    a = torch.randn(5, 7, generator=g, requires_grad=True)
    w = torch.randn(3, 7, generator=g)
    b = torch.randn(3, generator=g)
    with TF32Products():
        y = F.linear(a, w, b)
        (grad_a,) = torch.autograd.grad(y, a, torch.ones_like(y))
        plus = a + w[0]
        d = F.linear(a.double(), w.double())
    assert torch.equal(y, F.linear(round_to_tf32(a.detach()), round_to_tf32(w), b))
    assert not torch.equal(y, F.linear(a, w, b))
    assert torch.equal(grad_a, round_to_tf32(torch.ones(5, 3)) @ round_to_tf32(w))
    assert torch.equal(plus, a + w[0])
    assert torch.equal(d, F.linear(a.double(), w.double()))


def test_the_reference_under_tf32_products_is_as_far_off_as_tf32_makes_it():
    """The reference loop's check with its products on (emulated) TF32: an
    error of TF32's order, far above its float32 error."""
    w = bench.Workload(torch.device("cpu"), torch.float32, "sequence", 4, 8, 16, 20)
    impls = {i.key: i for i in bench.default_impls()}
    case = impls["reference_loop"].build(w)
    plain = bench.check(case)[0]
    tf32 = bench.check(case, tf32_products=True)[0]
    assert plain < 1e-5
    assert 1e-4 < tf32 < 5e-2


@pytest.mark.parametrize("untimed", [False, True], ids=["timed", "untimed"])
def test_under_tf32_the_reference_sets_the_bar_with_tf32_products(untimed, monkeypatch):
    """Where the workload's float32 products may run on TF32, the reference
    loop that sets the bar is checked with its products as TF32 computes them
    (timed or only checked: ``--only lltm``), so the bar is TF32's whatever
    kernels cuBLAS would pick; otherwise it is checked as it runs. (TF32 is
    a GPU setting: here the question "may they run on TF32?" is answered yes.)"""
    from lltm.bench import runner
    from lltm.bench.report import Progress
    w = bench.Workload(torch.device("cpu"), torch.float32, "sequence", 4, 8, 16, 20)
    impls = {i.key: i for i in bench.default_impls()}
    opts = runner.Options(reps=1, seq_reps=1, passes=1, warmup=0, graphs=False,
                          compile_on_cpu=False)

    def bars():
        if untimed:
            records, _ = runner.check_workload(w, [impls["lltm"]], opts, Progress(0, enabled=False),
                                               references=[impls["reference_loop"]])
            return records[0]["tolerance"]
        records, _ = runner.check_workload(w, [impls["reference_loop"], impls["lltm"]], opts,
                                           Progress(0, enabled=False))
        assert records[1]["status"] == "ok", records[1]
        return records[1]["tolerance"]

    plain = bars()
    monkeypatch.setattr(runner, "uses_tf32", lambda dtype, device, case: True)
    tf32 = bars()
    assert plain == bench.TOLERANCE[torch.float32]  # the reference's float32 error is far below
    assert tf32 > 3 * plain  # twice the reference's error on TF32 products (~4e-4 here)


def test_heatmap_caption_names_machine_date_commit_and_tf32():
    from lltm.bench.sweep_report import heatmap_caption
    machine = {"gpus": ["NVIDIA H200"], "cpu": "Some CPU", "date": "2026-12-01T21:09:18+00:00",
               "lltm_git": "5d345f5", "tf32": {"matmul": False, "cudnn": True}}
    assert heatmap_caption(machine, ("cuda", "sequence", "float32", 3)) == \
        "NVIDIA H200, 2026-12-01, lltm 5d345f5, float32 on TF32: aten::mm off, cuDNN on"
    assert heatmap_caption(machine, ("cuda", "sequence", "bfloat16", 1)) == \
        "NVIDIA H200, 2026-12-01, lltm 5d345f5"
    cpu_run = dict(machine, gpus=[], tf32=None)
    assert heatmap_caption(cpu_run, ("cpu", "cell", "float32", 1)) == \
        "Some CPU, 2026-12-01, lltm 5d345f5"
