"""python -m lltm.examples.vowels: the Japanese vowels (variable lengths,
packed) reach the example's stated bar with LLTM and nn.LSTM, one direction
and both; the data are standardised with the training set's statistics and
padded; the packed classifier gives each case the result it gets alone."""
import pytest
import torch

from conftest import require_sktime
from lltm.examples import train, vowels

# The bar the example's docstring states for --quick (CPU).
QUICK_TEST_ACCURACY = 0.90


@pytest.fixture
def one_thread():
    """Batches of 32 short sequences: a second intra-op thread only adds
    synchronisation, and on a busy 2-core machine it makes an epoch ten times
    slower (threads waiting on each other). One thread, restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["forward", "bidirectional"])
def test_quick_run_reaches_the_stated_accuracy(bidirectional, tmp_path, one_thread):
    require_sktime()
    plot = tmp_path / "vowels.png"
    argv = ["--device", "cpu", "--quick", "--plot", str(plot), "--no-progress"]
    result = vowels.main(argv + (["--bidirectional"] if bidirectional else []))
    for kind in ("lltm", "lstm"):
        r = result["models"][kind]
        assert r["test_acc"] >= QUICK_TEST_ACCURACY, (kind, r["history"]["test_acc"])
        assert len(r["history"]["epoch"]) == 10
        assert r["seconds_per_epoch"] > 0
    assert ("bidirectional" in result["title"]) == bidirectional
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_data_standardised_by_the_training_set_and_zero_padded():
    require_sktime()
    data = vowels.load_dataset()
    assert (data.n_train, len(data.y_test), data.features, data.classes) == (270, 370, 12, 9)
    for x, lengths in ((data.x_train, data.len_train), (data.x_test, data.len_test)):
        assert x.shape[:2] == (len(lengths), int(lengths.max()))
        steps = torch.arange(x.shape[1])[None, :] < lengths[:, None]
        assert (x[~steps] == 0).all()          # padding
        assert (x[steps] != 0).any(1).all()     # every real step holds data
    train_steps = data.x_train[torch.arange(data.x_train.shape[1])[None] < data.len_train[:, None]]
    torch.testing.assert_close(train_steps.mean(0), torch.zeros(12), atol=1e-5, rtol=0)
    torch.testing.assert_close(train_steps.std(0, correction=0), torch.ones(12), atol=1e-5, rtol=0)
    # The test set went through the training set's statistics, not its own.
    test_steps = data.x_test[torch.arange(data.x_test.shape[1])[None] < data.len_test[:, None]]
    assert (test_steps.mean(0).abs() > 1e-3).any()
    # A batch is cut to its longest case.
    (x, lengths), y = data.train_batch(torch.tensor([3, 100, 7]))
    assert x.shape == (3, int(lengths.max()), 12)
    assert lengths.tolist() == data.len_train[[3, 100, 7]].tolist()
    assert y.tolist() == data.y_train[[3, 100, 7]].tolist()


def test_standardise_leaves_missing_values_out():
    a = torch.tensor([[1.0, float("nan")], [3.0, 2.0], [5.0, 4.0]])
    (train_series, other), = [vowels.standardise([a], [torch.tensor([[3.0, float("nan")]])])]
    torch.testing.assert_close(train_series[0][:, 0], torch.tensor([-1.0, 0.0, 1.0]) * 1.5 ** 0.5)
    torch.testing.assert_close(train_series[0][:, 1], torch.tensor([0.0, -1.0, 1.0]))
    torch.testing.assert_close(other[0], torch.tensor([[0.0, 0.0]]))


@pytest.mark.parametrize("bidirectional", [False, True], ids=["forward", "bidirectional"])
@pytest.mark.parametrize("kind", ["lltm", "lstm"])
def test_packed_classifier_gives_each_case_its_own_result(kind, bidirectional):
    """Padding never leaks: a padded batch of lengths 5, 1, 3 (unsorted),
    packed by the classifier, gives the logits of each case run alone."""
    torch.manual_seed(0)
    model = train.SequenceClassifier(kind, 4, 6, classes=3, layers=2,
                                     bidirectional=bidirectional).double()
    lengths = torch.tensor([5, 1, 3])
    x = torch.randn(3, 5, 4, dtype=torch.float64)
    x[1, 1:] = 1e3  # garbage beyond each length
    x[2, 3:] = -1e3
    batch = model(x, lengths)
    assert batch.shape == (3, 3)
    for b, n in enumerate(lengths.tolist()):
        alone = model(x[b:b + 1, :n])
        torch.testing.assert_close(batch[b:b + 1], alone, rtol=1e-10, atol=1e-12)


def test_resume_refuses_another_direction_setting(tmp_path, one_thread):
    require_sktime()
    path = str(tmp_path / "v.pt")
    small = ["--device", "cpu", "--hidden", "8", "--plot", "", "--no-progress", "--models",
             "lltm", "--checkpoint", path]
    vowels.main(small + ["--epochs", "1"])
    with pytest.raises(SystemExit, match="bidirectional"):
        vowels.main(small + ["--epochs", "2", "--resume", "--bidirectional"])
