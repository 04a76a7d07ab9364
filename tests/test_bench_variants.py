"""python -m lltm.bench --sweep --sweep-variants: every route of the library
per shape, checked then timed, with its bookkeeping (what fits, what is not
timed, the fastest per shape). On the CPU the library has one plan and the
overrides nothing to act on: the variants then run the CPU's plan, which is
enough to exercise the bookkeeping; the GPU run is the measurement."""
import json

import pytest
import torch

from lltm import bench, reference
from lltm.bench import variants
from lltm.bench.sweep import Shape, SweepOptions
from lltm.bench.report import Progress

TINY = ["--sweep", "--sweep-variants", "--device", "cpu", "--no-progress",
        "--sweep-budget-ms", "1", "--sweep-batches", "3", "--sweep-hidden", "5",
        "--seq-len", "4"]


def _by_impl(result, kind):
    return {r["impl"]: r for r in result["results"] if r["kind"] == kind}


def test_every_variant_is_checked_timed_and_summarized(tmp_path):
    out = tmp_path / "route"
    result = bench.main(TINY + ["--sweep-out", str(out)])
    seq, cell = _by_impl(result, "sequence"), _by_impl(result, "cell")
    assert set(seq) == {"reference_loop", "lltm", "lstm", *(v.key for v in
                                                            variants.SEQUENCE_VARIANTS)}
    assert set(cell) == {"reference", "native", "lstm_cell", "native[fused]", "native[cublas]"}
    for rec in list(seq.values()) + list(cell.values()):
        if rec["impl"].endswith("x64]"):  # the half types' only; the run is float32
            assert rec["status"] == "unfit" and "half types" in rec["note"], rec
            continue
        assert rec["status"] == "ok", (rec["impl"], rec["note"])
        assert rec["error"] <= rec["tolerance"]
        assert rec["figure"] == "step"  # the CPU: no CUDA graphs
        stat = rec["step"]
        assert stat["n"] >= 3 and 0 < stat["p10_us"] <= stat["median_us"] <= stat["p90_us"]
    assert seq["lltm[grid 16x8]"]["variant"]["plan"] == {"family": "grid", "grid_shape": "16x8",
                                                         "grid_chunk": 16}
    assert cell["native[cublas]"]["variant"]["matmul"] == "cublas"
    assert seq["lltm"]["variant"] is None and seq["lltm"]["plan"] is None  # no CUDA here

    entries = {e["kind"]: e for e in result["summary"]}
    for kind, auto in variants.AUTO.items():
        e = entries[kind]
        assert e["fastest"].startswith(auto)
        ours = {k: t for k, t in e["times_us"].items() if k.startswith(auto)}
        assert e["times_us"][e["fastest"]] == min(ours.values())
        assert e["auto_over_fastest"] == pytest.approx(e["times_us"][auto] / min(ours.values()))
    assert not (out / "variants.json.partial").exists()  # the whole run replaced it
    saved = json.loads((out / "variants.json").read_text())
    assert saved["config"]["variants"] is True and len(saved["summary"]) == 2
    assert {r["impl"] for r in saved["results"]} == set(seq) | set(cell)


def test_forced_plans_that_cannot_hold_the_shape_are_not_run(tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(variants, "_save", lambda args, result: None)  # a run cut short
    monkeypatch.setattr(variants, "_save_partial",
                        lambda args, argv, records: saved.append(len(records)))
    result = bench.main(TINY[:-6] + ["--sweep-batches", "65", "--sweep-hidden", "200",
                                     "--sweep-kind", "sequence", "--seq-len", "2"])
    assert saved == [len(result["results"])]  # the partial JSON after every shape
    seq = _by_impl(result, "sequence")
    for key in ("lltm[cluster 16]", "lltm[grid 16x8]"):
        assert seq[key]["status"] == "unfit" and seq[key]["step"] is None, key
    assert "B <= 64" in seq["lltm[cluster 16]"]["note"]
    assert "lltm[cluster 8]" not in seq  # no 8-block clusters
    assert "lltm[cluster 16, one group]" not in seq
    for key in ("lltm", "lltm[grid 16x32]", "lltm[grid 32x32]", "lltm[steps]"):
        assert seq[key]["status"] == "ok" and seq[key]["step"]["median_us"] > 0, key
    v = variants.Variant("x", "lltm", {"family": "cluster", "cluster_blocks": 16})
    assert v.fits(56, 256, torch.float32) is None and "H <= 256" in v.fits(1, 257, torch.float32)
    v = variants.Variant("x", "lltm", {"family": "cluster", "cluster_chunk": 16})
    assert "H <= 128" in v.fits(1, 200, torch.float32)
    v = variants.Variant("x", "lltm", {"family": "grid", "grid_shape": "32x32"})
    assert v.fits(1, 1024, torch.float32) is None
    assert v.fits(1, 1025, torch.float32) and v.fits(1, 64, torch.float64)
    v = variants.Variant("x", "lltm", {"family": "grid"})  # float64: 16x8 and 32x16
    assert v.fits(1, 512, torch.float64) is None and "H <= 512" in v.fits(1, 513, torch.float64)
    v = variants.Variant("x", "lltm", {"family": "grid", "grid_shape": "8x64"})
    assert v.fits(1, 512, torch.bfloat16) is None and v.fits(1, 513, torch.bfloat16)
    assert "half types" in v.fits(1, 64, torch.float32)


def test_a_wrong_variant_is_reported_and_not_timed():
    def wrong(x, W, b, h, c):
        return tuple(t * 1.001 for t in reference.lltm_cell(x, W, b, h, c))
    planted = bench.lltm_cell_impl("native[cublas]", "wrong", wrong)
    result = bench.main(TINY + ["--sweep-kind", "cell"], extra_impls=[planted])
    cell = _by_impl(result, "cell")
    assert cell["native[cublas]"]["status"] == "WRONG"
    assert cell["native[cublas]"].get("step") is None
    assert cell["native[fused]"]["status"] == "ok"
    assert "native[cublas]" not in result["summary"][0]["times_us"]


def test_variants_foreseen_far_slower_than_the_choice_are_checked_not_timed():
    shape = Shape("cell", 3, 5, 1, 1)
    w = shape.workload(torch.device("cpu"), torch.float32)
    history = variants.History()
    slow = variants.SLOW_FLOOR_US * 10
    history.record(Shape("cell", 1, 5, 1, 1), torch.float32, "native[fused]", slow)
    sopts = SweepOptions(budget_us=1e3, min_passes=3, max_passes=3, time_limit_s=60,
                         max_bytes=1e12, graphs=False)
    records = variants.run_shape(shape, w, variants.implementations("cell"), sopts, history,
                                 Progress(1, enabled=False))
    by = {r["impl"]: r for r in records}
    fused = by["native[fused]"]
    assert fused["status"] == "ok"  # checked
    assert "not timed" in fused["step"]["n/a"] and fused["foreseen_us"] >= 3 * slow
    assert by["native"]["step"]["median_us"] > 0 and by["native[cublas]"]["step"]["n"] >= 3
    # what was timed is remembered for the next shape
    assert history.foresee(Shape("cell", 6, 5, 1, 1), torch.float32, "native") > 0


def test_shapes_cover_the_map_and_the_extra_lengths():
    args = bench.build_parser().parse_args(["--sweep", "--sweep-variants"])
    plan = variants.shapes(args, quick=False)
    seq = [s for s in plan if s.kind == "sequence"]
    assert {s.B for s in seq} == set(variants.BATCHES)
    assert {s.H for s in seq} == set(variants.SEQUENCE_HIDDEN)
    assert {s.T for s in seq} == {variants.SEQ_LEN, *variants.EXTRA_SEQ_LENS}
    assert all(s.layers == 1 for s in plan)
    assert [s.cost() for s in plan] == sorted(s.cost() for s in plan)
    assert {s.H for s in plan if s.kind == "cell"} == set(variants.CELL_HIDDEN)


@pytest.mark.parametrize("argv", [["--sweep-variants"], ["--sweep", "--sweep-variants",
                                                         "--layers", "3"],
                                  ["--sweep", "--sweep-variants", "--only", "lltm"]])
def test_bad_variant_arguments_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        bench.main(argv + ["--device", "cpu"])
    assert "--sweep-variants" in capsys.readouterr().err
