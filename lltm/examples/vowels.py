"""LLTM against nn.LSTM on real sequences of different lengths: speakers
recognised from their vowels, fed as a PackedSequence.

    python -m lltm.examples.vowels                    # 30 epochs, both models
    python -m lltm.examples.vowels --bidirectional    # both directions of every layer
    python -m lltm.examples.vowels --quick            # 10 epochs, for a smoke test
    python -m lltm.examples.vowels --dataset PLAID    # another dataset sktime ships
    torchrun --nproc_per_node=2 -m lltm.examples.vowels   # DistributedDataParallel

The data: JapaneseVowels (UCI; M. Kudo, J. Toyama, M. Shimbo 1999), 9 male
speakers each saying the vowels "a" and "e"; every utterance is a sequence of
12 LPC cepstrum coefficients per frame, 7 to 29 frames long. 270 training
cases (30 per speaker), 370 test cases (24 to 88 per speaker), the archive's
own split. The ``.ts`` files come inside sktime's wheel and are read by
``lltm.examples.tsfile`` (sktime itself is never imported):

    pip install --no-deps sktime==1.2.0      # make setup does this

Each coefficient is standardised with the mean and standard deviation of the
training set (over every frame of every case). A batch is padded to its
longest case and packed (``pack_padded_sequence(..., enforce_sorted=False)``),
so the recurrent layers see each case for its own length only; a linear layer
classifies the last layer's final hidden state (with ``--bidirectional`` the
forward direction's after the last frame and the reverse direction's after
the first, concatenated). Everything else is lltm.examples.train's: the same
models for both kinds (the LSTM has 4/3 the recurrent parameters), Adam with
cosine decay, gradient norm clipped at 1, batches that depend on (seed,
epoch) only, --checkpoint / --resume, DDP, the progress bar, plot and report.

Quality reached on CPU, float32, default settings (hidden 64, batch 32, Adam
at lr 1e-2 with cosine decay), final test accuracy on the 370 test cases,
measured 2026-11-24 with torch 2.13.0 and sktime 1.2.0's files:
    30 epochs (seeds 0, 1, 2):         LLTM 0.962 / 0.946 / 0.951;  nn.LSTM 0.973 / 0.970 / 0.973
    --bidirectional, 30 epochs:        LLTM 0.978 / 0.970 / 0.984;  nn.LSTM 0.976 / 0.978 / 0.981
    --quick (10 epochs, seeds 0-4):    LLTM 0.935 - 0.976;          nn.LSTM 0.962 - 0.976
    --quick --bidirectional:           LLTM 0.970 - 0.984;          nn.LSTM 0.965 - 0.978
tests/test_vowels.py requires >= 0.90 from both models after --quick, with
and without --bidirectional. Read from both ends, the LLTM (no forget gate:
its cell state only accumulates) matches the LSTM.
Time per epoch (training only, 9 batches) on a 2-core AMD EPYC shared with
other jobs (load average 5 - 6), one intra-op thread (OMP_NUM_THREADS=1):
LLTM 0.10 - 0.14 s, nn.LSTM 0.11 - 0.16 s; bidirectional 0.12 - 0.18 s and
0.16 - 0.25 s. A packed batch costs lltm.LLTM one native call per distinct
length and direction. With torch's default two threads on that machine at
load 3 an epoch took 0.6 s (LLTM) and 0.9 s (LSTM): the threads of such small
operations mostly wait on each other there (OMP_NUM_THREADS=1 avoids it).

``--dataset`` takes any classification dataset sktime ships (JapaneseVowels,
PLAID, BasicMotions, GunPoint, ...; regression ones are refused); only
JapaneseVowels is measured above. On PLAID (one channel, 100 to 1,344 steps,
lengths nearly all distinct) one epoch at --hidden 16 took LLTM 0.68 s and
nn.LSTM 9.8 s on the machine above (one thread, load average 12).
"""
from __future__ import annotations

import argparse
import dataclasses
from typing import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence

from lltm.examples import train, tsfile

DATASET = "JapaneseVowels"
# Settings that must match between a checkpoint and the run resuming it.
MODEL_SETTINGS = ("dataset", "bidirectional", "hidden", "layers", "lr", "batch_size", "seed",
                  "models", "lltm_impl")


@dataclasses.dataclass
class VariableLengthData(train.TrainTestData):
    """Cases of different lengths, zero-padded: x [N, T, C] float32
    (standardised), lengths [N] int64 (on the CPU, where packing wants them),
    labels [N] class 0..classes-1."""
    name: str
    classes: int
    x_train: torch.Tensor
    len_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    len_test: torch.Tensor
    y_test: torch.Tensor

    def to(self, device) -> "VariableLengthData":
        return dataclasses.replace(self, x_train=self.x_train.to(device),
                                   y_train=self.y_train.to(device),
                                   x_test=self.x_test.to(device), y_test=self.y_test.to(device))

    def train_batch(self, idx: torch.Tensor) -> tuple[tuple, torch.Tensor]:
        """Cases ``idx``: ((x [B, T_max, C], lengths [B]), labels), T_max the
        longest of the batch."""
        lengths = self.len_train[idx.cpu()]
        return (self.x_train[idx, :int(lengths.max())], lengths), self.y_train[idx]

    def test_set(self) -> tuple[tuple, torch.Tensor]:
        return (self.x_test, self.len_test), self.y_test


def standardise(train_series: list[torch.Tensor], *others: list[torch.Tensor]):
    """Every channel shifted and scaled by its mean and standard deviation
    over all steps of ``train_series``; missing values (NaN) are left out of
    the statistics and become 0 (the mean). Returns the lists, standardised."""
    steps = torch.cat(train_series)
    mean = steps.nanmean(0)
    std = (steps - mean).pow(2).nanmean(0).sqrt().clamp_min(1e-8)
    return [[torch.nan_to_num((s - mean) / std, nan=0.0) for s in series]
            for series in (train_series, *others)]


def _padded(series: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([s.shape[0] for s in series], dtype=torch.long)
    return pad_sequence(series, batch_first=True), lengths


def load_dataset(name: str = DATASET) -> VariableLengthData:
    """One of the classification datasets inside sktime's wheel (TRAIN and
    TEST files), standardised and padded."""
    try:
        train_set = tsfile.load_sktime_dataset(name, "TRAIN")
        test_set = tsfile.load_sktime_dataset(name, "TEST")
    except FileNotFoundError as e:
        raise SystemExit(f"this example needs the datasets of sktime's wheel: {e}") from None
    if test_set.class_names != train_set.class_names:
        raise SystemExit(f"{name}: the TRAIN and TEST files declare different classes "
                         f"({train_set.class_names} and {test_set.class_names})")
    if test_set.dimensions != train_set.dimensions:
        raise SystemExit(f"{name}: TRAIN has {train_set.dimensions} dimensions, TEST "
                         f"{test_set.dimensions}")
    train_series, test_series = standardise(train_set.series, test_set.series)
    x_train, len_train = _padded(train_series)
    x_test, len_test = _padded(test_series)
    return VariableLengthData(name, len(train_set.class_names),
                              x_train, len_train, torch.tensor(train_set.labels),
                              x_test, len_test, torch.tensor(test_set.labels))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lltm.examples.vowels",
        description="Train LLTM and nn.LSTM on the Japanese vowels (variable lengths, packed).")
    train.add_training_arguments(parser, epochs=30, quick_epochs=10, plot="out/vowels.png")
    parser.add_argument("--bidirectional", action="store_true",
                        help="both directions in every layer (the classifier reads both)")
    parser.add_argument("--dataset", default=DATASET,
                        help=f"a classification dataset shipped in sktime's wheel (default "
                             f"{DATASET}; see lltm.examples.tsfile.sktime_datasets())")
    return parser


def _load(args, ddp, device) -> tuple[VariableLengthData, str]:
    data = load_dataset(args.dataset).to(device)
    lengths = torch.cat((data.len_train, data.len_test))
    direction = ", bidirectional" if args.bidirectional else ""
    return data, (f"{data.name}: {data.n_train} train / {len(data.y_test)} test, "
                  f"{data.features} channels, {data.classes} classes, lengths "
                  f"{int(lengths.min())}-{int(lengths.max())} (packed), hidden {args.hidden}"
                  f"{direction}, {device.type}, {ddp.world} process(es), torch "
                  f"{torch.__version__}")


def main(argv: Sequence[str] | None = None) -> dict:
    """Train; returns the result (also printed), as lltm.examples.train.main."""
    args = train.parse_training_arguments(build_parser(), argv)
    return train.run(args, MODEL_SETTINGS, _load)


if __name__ == "__main__":
    main()
