"""The wavefront's choice of time chunks and sharing (lltm/_wavefront.py)
against the times of every schedule measured on an H200
(tests/data/wavefront-schedules-h200.json: three layers at 56 shapes, each
at chunk counts 1 - 6 and 8, planned for the whole device and for two
layers at once). The library's answers the chooser asked for then (the
plan's family, its time a step, its layers resident at once) are replayed
here, so the test follows the chooser's own arithmetic: what it predicts
from them, which sharings it weighs, and the tenth it asks of a gain.
`dev/timing/wavefront_timing.py --shared --record PATH` records such a file."""
import json
import math
from pathlib import Path

import pytest
import torch

from lltm import _schedule, _sharing, _wavefront, overrides

DATA = Path(__file__).resolve().parent / "data" / "wavefront-schedules-h200.json"
# the chosen schedule's time over the fastest measured: at most this at any
# shape (bfloat16 B64/H256: one call a layer 1,874 us, four chunks planned
# for two layers 1,664), and its geometric mean over the shapes
WORST, MEAN = 1.15, 1.035
HALF_TYPES = (torch.float16, torch.bfloat16)


def _load():
    data = json.loads(DATA.read_text())
    return data["machine"], data["times"]


def _replayed(monkeypatch, machine, row):
    """The library's answers of ``row``'s run, for the sharing asked in."""
    def answer():
        return row["model"].get(str(_sharing.concurrent_layers()))

    def cost(dtype, T, B, I, H, device=None):  # noqa: E741
        got = answer()
        if got is None:
            return None
        plan = {"family": got["family"], "forward": {"tf32": got.get("tf32", False)}}
        return plan, 50.0 + got["step_us"] * T  # the time a step: the slope

    def residency(dtype, T, B, I, H, device=None):  # noqa: E741
        got = answer()
        return ((got["resident"], 1),) * 2 if got and got["resident"] else None

    props = type("Props", (), dict(L2_cache_size=machine["L2_cache_size"],
                                   multi_processor_count=machine["multi_processor_count"]))
    monkeypatch.setattr(overrides, "sequence_cost_in_force", cost)
    monkeypatch.setattr(overrides, "sequence_residency_in_force", residency)
    monkeypatch.setattr(overrides, "grid_tensor_cores", lambda dtype, device=None: (
        dtype in HALF_TYPES or (dtype == torch.float32 and row.get("tf32", False))))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props())


def _choices(monkeypatch):
    machine, rows = _load()
    out = []
    for row in rows:
        _replayed(monkeypatch, machine, row)
        dtype = getattr(torch, row["dtype"])
        chunks, sharing = _schedule._choose(row["T"], row["B"], row["H"], row["layers"], dtype,
                                             0, True, row.get("tf32", False))
        out.append((row, f"{chunks}s{sharing}"))
    return out


def test_the_choice_against_every_schedule_measured(monkeypatch):
    """Under CUDA-graph capture the chooser's schedule is a measured one, its
    time within WORST of the fastest at every shape and within MEAN on
    average (geometric), and chunked wherever the layers one after the other
    were slower than the fastest by a fifth."""
    logs, worst = [], []
    for row, key in _choices(monkeypatch):
        us = row["us"]
        assert key in us, (row["dtype"], row["B"], row["H"], key)
        fastest = min(us.values())
        ratio = us[key] / fastest
        logs.append(math.log(ratio))
        worst.append((ratio, row["dtype"], row["B"], row["H"], key))
        if us["1s1"] > 1.2 * fastest:
            assert key != "1s1", (row["dtype"], row["B"], row["H"])
    worst.sort(reverse=True)
    assert len(logs) == 56
    assert worst[0][0] <= WORST, worst[:3]
    assert math.exp(sum(logs) / len(logs)) <= MEAN, math.exp(sum(logs) / len(logs))


def test_float32_per_step_family_chunked(monkeypatch):
    """float32's per-step family on FFMA: the rows where a call a layer was
    the choice then and chunks measured at least a tenth faster are chunked
    now, each faster than before; two layers' shared plans on FFMA are never
    chosen."""
    moved = 0
    for row, key in _choices(monkeypatch):
        if row["dtype"] != "float32":
            continue
        assert not key.endswith("s2"), (row["B"], row["H"], key)
        us = row["us"]
        if row["model"]["1"]["family"] == "steps" and min(us.values()) < 0.9 * us["1s1"]:
            assert row["chosen_then"] == "1s1" and key != "1s1", (row["B"], row["H"], key)
            assert us[key] < 0.95 * us["1s1"], (row["B"], row["H"], key)
            moved += 1
    assert moved >= 6


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_recorded_inputs_replayed(monkeypatch, dtype):
    """The replay answers as the library did: a time a step that the
    chooser recovers, and the persistent plans' layers at once."""
    machine, rows = _load()
    row = next(r for r in rows if r["dtype"] == dtype and r["B"] == 64 and r["H"] == 256)
    _replayed(monkeypatch, machine, row)
    weighed = _schedule.model_inputs(100, 64, 256, 3, getattr(torch, dtype), 0, True)
    family, args = weighed[1]
    assert family == row["model"]["1"]["family"]
    assert args["step_us"] == pytest.approx(row["model"]["1"]["step_us"])
    assert args["concurrent"] == max(1, min(3, row["model"]["1"]["resident"]))


def test_replay_chooses_as_the_gpu_did(monkeypatch):
    """The replay is faithful: at every row the chooser picks what it picked
    on the H200 then (ac44b66), but where float32's per-step family on FFMA
    counts more than one layer at once since (one call a layer then, two
    chunks now). A change of the chooser that moves other rows updates this
    list, with the measured times above to judge it by."""
    moved = {(row["dtype"], row["B"], row["H"]): key
             for row, key in _choices(monkeypatch) if key != row["chosen_then"]}
    assert moved == {("float32", B, H): "2s1" for B, H in [
        (1, 2048), (16, 2048), (64, 1024), (256, 256), (256, 512), (1024, 128), (1024, 256)]}
