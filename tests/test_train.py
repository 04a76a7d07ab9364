"""python -m lltm.examples.train: a short CPU run reaches its stated bar, and a
resumed run continues exactly as an uninterrupted one."""
import pytest
import torch

pytest.importorskip("sklearn")
from lltm.examples import train  # noqa: E402

# The bar the example's docstring states for --quick (10 epochs, CPU).
QUICK_TEST_ACCURACY = 0.85


def test_quick_run_reaches_the_stated_accuracy(tmp_path):
    plot = tmp_path / "train.png"
    result = train.main(["--device", "cpu", "--quick", "--plot", str(plot), "--no-progress"])
    for kind in ("lltm", "lstm"):
        r = result["models"][kind]
        assert r["test_acc"] >= QUICK_TEST_ACCURACY, (kind, r["history"]["test_acc"])
        assert len(r["history"]["epoch"]) == 10
        assert r["seconds_per_epoch"] > 0
    assert plot.read_bytes()[:4] == b"\x89PNG"


def _small(*extra):
    return ["--device", "cpu", "--hidden", "16", "--plot", "", "--no-progress", *extra]


class _Interrupted(Exception):
    pass


def test_resume_continues_exactly(tmp_path, monkeypatch):
    straight = train.main(_small("--epochs", "3", "--checkpoint", str(tmp_path / "a.pt")))

    # The same run, killed right after the checkpoint of epoch 2 ...
    save = train.save_checkpoint

    def save_then_die(path, epoch, *args):
        save(path, epoch, *args)
        if epoch == 2:
            raise _Interrupted
    monkeypatch.setattr(train, "save_checkpoint", save_then_die)
    with pytest.raises(_Interrupted):
        train.main(_small("--epochs", "3", "--checkpoint", str(tmp_path / "b.pt")))
    monkeypatch.undo()
    assert torch.load(tmp_path / "b.pt", weights_only=True)["epoch"] == 2

    # ... and resumed: the same history and the same weights, bit for bit.
    resumed = train.main(_small("--epochs", "3", "--checkpoint", str(tmp_path / "b.pt"),
                                "--resume"))
    for kind in ("lltm", "lstm"):
        assert resumed["models"][kind]["history"]["epoch"] == [1, 2, 3]
        for key in ("train_loss", "test_loss", "test_acc"):
            assert (resumed["models"][kind]["history"][key]
                    == straight["models"][kind]["history"][key]), key
        for name, value in straight["state"][kind].items():
            torch.testing.assert_close(resumed["state"][kind][name], value, rtol=0, atol=0,
                                       msg=lambda m: f"{kind}.{name}: {m}")
    assert torch.load(tmp_path / "b.pt", weights_only=True)["epoch"] == 3


def test_resume_refuses_other_settings(tmp_path):
    path = str(tmp_path / "c.pt")
    train.main(_small("--epochs", "1", "--models", "lltm", "--checkpoint", path))
    with pytest.raises(SystemExit, match="hidden"):
        train.main(["--device", "cpu", "--hidden", "8", "--plot", "", "--no-progress",
                    "--models", "lltm", "--epochs", "2", "--checkpoint", path, "--resume"])


def test_resume_without_checkpoint_file_starts_fresh(tmp_path):
    result = train.main(_small("--epochs", "1", "--models", "lstm", "--checkpoint",
                               str(tmp_path / "new.pt"), "--resume"))
    assert result["models"]["lstm"]["history"]["epoch"] == [1]
    assert (tmp_path / "new.pt").exists()


def test_lltm_cell_loop_matches_lltm_sequence():
    """The example's fallback for versions without lltm.LLTM computes the same."""
    if not hasattr(train.lltm, "LLTM"):
        pytest.skip("no lltm.LLTM to compare with")
    torch.manual_seed(0)
    loop = train._LLTMCellLoop(5, 7).double()
    seq = train.lltm.LLTM(5, 7, batch_first=True).double()
    with torch.no_grad():
        seq.weights_l0.copy_(loop.cell.weights)
        seq.bias_l0.copy_(loop.cell.bias)
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    out_a, (h_a, c_a) = loop(x)
    out_b, (h_b, c_b) = seq(x)
    torch.testing.assert_close(out_a, out_b)
    torch.testing.assert_close(h_a, h_b)
    torch.testing.assert_close(c_a, c_b)


def test_progress_counts_epochs(monkeypatch, tmp_path):
    bars = []

    class Recorder:
        def __init__(self, total, initial, enabled):
            self.total, self.initial, self.texts = total, initial, []
            bars.append(self)

        def update(self, text):
            self.texts.append(text)

        def close(self):
            pass
    monkeypatch.setattr(train, "_Progress", Recorder)
    path = str(tmp_path / "p.pt")
    train.main(_small("--epochs", "2", "--checkpoint", path))  # two models
    train.main(_small("--epochs", "3", "--checkpoint", path, "--resume"))
    (first, resumed) = bars
    assert (first.total, first.initial, len(first.texts)) == (2, 0, 2)
    assert (resumed.total, resumed.initial, len(resumed.texts)) == (3, 2, 1)
    assert first.texts[0].startswith("epoch 1/2") and "lltm" in first.texts[0] \
        and "lstm" in first.texts[0]
