"""LLTM against nn.LSTM on real data: scikit-learn's handwritten digits read as sequences.

    python -m lltm.examples.train                     # 20 epochs, both models
    python -m lltm.examples.train --quick             # 10 epochs, for a smoke test
    python -m lltm.examples.train --pixels            # harder: 64 steps of one pixel
    python -m lltm.examples.train --checkpoint ck.pt  # save after every epoch ...
    python -m lltm.examples.train --checkpoint ck.pt --resume   # ... and go on after a stop
    torchrun --nproc_per_node=2 -m lltm.examples.train   # DistributedDataParallel
                                                         # (gloo on CPU, NCCL on CUDA)

The data: the 1,797 8x8 images of ``sklearn.datasets.load_digits`` (shipped
inside scikit-learn, no download), scaled to [0, 1], split 75 / 25 stratified
(1,347 train, 450 test). Each image is a sequence: 8 steps of one 8-pixel row
(default) or, with ``--pixels``, 64 steps of one pixel. A recurrent layer runs
over the sequence, and a linear layer classifies its last hidden state.
Both models get the same hidden size, optimizer, schedule and batches; the
LSTM has 4/3 the recurrent parameters (4 gates to 3).
The LLTM is ``lltm.LLTM`` (the whole sequence in one native call; a loop of
the reference cell with ``--lltm-impl reference``).

Quality reached on CPU, float32, default settings (hidden 64, batch 32, Adam at
lr 1e-2 with cosine decay, gradient norm clipped at 1), final test accuracy,
measured 2026-11-22 with torch 2.13.0 (seeds in brackets):
    rows, 20 epochs:       LLTM 0.953 / 0.978 / 0.956 (0, 1, 2);  nn.LSTM 0.976 / 0.982 / 0.987
    rows, --quick (10):    LLTM 0.90 - 0.95 (seeds 0-4);         nn.LSTM 0.97 - 0.98
    --pixels, 30 epochs:   LLTM 0.79 / 0.82 (0, 1);              nn.LSTM 0.91 / 0.93
tests/test_train.py requires >= 0.85 from both models after --quick. The LLTM
has no forget gate (its cell state only accumulates), which costs it most on
the 64-step --pixels task. An epoch takes about 0.07 s (LLTM) and 0.09 s (nn.LSTM) on a
2-core AMD EPYC with AVX2 (rows, default settings; 2026-11-24).
A checkpoint holds both models, both optimizers, the history and the
settings; the order of the batches depends only on (seed, epoch), so a resumed
run continues exactly as an uninterrupted one would (tests/test_train.py
checks it).

Under ``torchrun`` (or ``--ddp``) every process trains on its own shard of
each epoch's batches (``--batch-size`` is the global batch, split evenly),
DistributedDataParallel averages the gradients, and process 0 alone prints,
plots and writes the checkpoint.

The training machinery here (flags, run, checkpoints, progress, report)
serves lltm.examples.vowels too: a dataset is an object with ``features``,
``classes``, ``n_train``, ``train_batch(idx)`` and ``test_set()``, each batch
the model's inputs and the labels.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import time
from typing import Sequence

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.nn.utils.rnn import pack_padded_sequence

import lltm

MODELS = ("lltm", "lstm")
CHECKPOINT_FORMAT = 1
# Settings that must match between a checkpoint and the run resuming it.
MODEL_SETTINGS = ("pixels", "hidden", "layers", "lr", "batch_size", "seed", "models",
                  "lltm_impl")


# ----------------------------------------------------------------------------
# Data and models.

class TrainTestData:
    """What the training loop reads of a dataset: x_train [N, T, F] and
    y_train [N] (and the test split), plus the batches it feeds the model."""

    @property
    def features(self) -> int:
        return self.x_train.shape[2]

    @property
    def n_train(self) -> int:
        return len(self.y_train)


@dataclasses.dataclass
class Digits(TrainTestData):
    x_train: torch.Tensor   # [N, T, F] float32 in [0, 1]
    y_train: torch.Tensor   # [N] class 0..9
    x_test: torch.Tensor
    y_test: torch.Tensor

    classes = 10

    def to(self, device) -> "Digits":
        return Digits(*(t.to(device) for t in dataclasses.astuple(self)))

    @property
    def steps(self) -> int:
        return self.x_train.shape[1]

    def train_batch(self, idx: torch.Tensor) -> tuple[tuple, torch.Tensor]:
        """The training cases ``idx``: (the model's inputs, labels)."""
        return (self.x_train[idx],), self.y_train[idx]

    def test_set(self) -> tuple[tuple, torch.Tensor]:
        return (self.x_test,), self.y_test


def load_digits(pixels: bool = False, seed: int = 0) -> Digits:
    """scikit-learn's digits as sequences: 8 rows of 8 pixels, or 64 pixels."""
    try:
        from sklearn.datasets import load_digits as sklearn_digits
        from sklearn.model_selection import train_test_split
    except ImportError:
        raise SystemExit("this example needs scikit-learn: pip install scikit-learn") from None
    digits = sklearn_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    x = x.view(-1, 64, 1) if pixels else x.view(-1, 8, 8)
    train, test = train_test_split(list(range(len(y))), test_size=0.25, random_state=seed,
                                   stratify=digits.target)
    return Digits(x[train], y[train], x[test], y[test])


class _LLTMCellLoop(torch.nn.Module):
    """One LLTM layer as a loop of lltm.LLTMCell, shaped like lltm.LLTM with
    batch_first=True (for versions of lltm without lltm.LLTM)."""

    def __init__(self, input_size: int, hidden_size: int):
        super().__init__()
        self.cell = lltm.LLTMCell(input_size, hidden_size)

    def forward(self, x):
        state = None
        outputs = []
        for x_t in x.unbind(1):
            state = self.cell(x_t, state)
            outputs.append(state[0])
        h, c = state
        return torch.stack(outputs, 1), (h[None], c[None])


class SequenceClassifier(torch.nn.Module):
    """Recurrent layers (LLTM or LSTM) over [B, T, F], then a linear layer on
    the last layer's final hidden state (bidirectional: the forward and the
    reverse direction's, concatenated): logits [B, classes].

    ``forward(x, lengths=None)``: with ``lengths`` (B ints, each <= T) the
    rows are packed (``pack_padded_sequence(..., enforce_sorted=False)``) and
    the recurrent layers run over the PackedSequence: each row's final state
    is the one after its own last step, whatever the padding."""

    def __init__(self, kind: str, input_size: int, hidden_size: int, classes: int = 10,
                 layers: int = 1, lltm_impl: str = "native", bidirectional: bool = False):
        super().__init__()
        if kind == "lltm" and hasattr(lltm, "LLTM"):
            self.rnn = lltm.LLTM(input_size, hidden_size, layers, batch_first=True,
                                 bidirectional=bidirectional, impl=lltm_impl)
        elif kind == "lltm":
            if layers != 1 or bidirectional:
                raise ValueError("this version of lltm has no lltm.LLTM: one layer, one "
                                 "direction only")
            self.rnn = _LLTMCellLoop(input_size, hidden_size)
        elif kind == "lstm":
            self.rnn = torch.nn.LSTM(input_size, hidden_size, layers, batch_first=True,
                                     bidirectional=bidirectional)
        else:
            raise ValueError(f"kind must be one of {MODELS}, got {kind!r}")
        self.directions = 2 if bidirectional else 1
        self.head = torch.nn.Linear(self.directions * hidden_size, classes)

    def forward(self, x, lengths=None):
        if lengths is not None:
            x = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        _output, (h_n, _c_n) = self.rnn(x)
        # h_n [layers * directions, B, H]: the last layer's directions are last.
        last = h_n[-1] if self.directions == 1 else torch.cat((h_n[-2], h_n[-1]), 1)
        return self.head(last)


def build_model(kind: str, data, args, device) -> SequenceClassifier:
    """The model of one kind for ``data`` (its ``features`` and ``classes``),
    initialised from the seed alone (same on every process)."""
    torch.manual_seed(args.seed + MODELS.index(kind))
    return SequenceClassifier(kind, data.features, args.hidden, classes=data.classes,
                              layers=args.layers, lltm_impl=args.lltm_impl,
                              bidirectional=getattr(args, "bidirectional", False)).to(device)


def learning_rate(peak: float, epoch: int, epochs: int) -> float:
    """Cosine decay from ``peak`` in epoch 1 to peak/20 in the last epoch: a
    function of the epoch alone, so a resumed run needs no scheduler state."""
    progress = (epoch - 1) / max(epochs - 1, 1)
    return peak * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


def epoch_shard(n: int, epoch: int, seed: int, rank: int, world: int) -> torch.Tensor:
    """This process's sample indices for one epoch: a permutation that depends
    on (seed, epoch) only, padded to a multiple of the world size and dealt
    in turn, so every process gets the same number of batches."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100003 + epoch))
    order = torch.cat([order, order[:(-n) % world]])
    return order[rank::world]


# ----------------------------------------------------------------------------
# Training.

@dataclasses.dataclass
class Dist:
    rank: int = 0
    world: int = 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def mean(self, value: float, device) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=device)
        dist.all_reduce(t)
        return t.item() / self.world


def train_epoch(model, optimizer, data, epoch: int, args, ddp: Dist, device):
    """One epoch over this process's shard of ``data`` (``n_train`` cases,
    ``train_batch(idx)`` -> (model inputs, labels)); (mean loss, accuracy)
    over all processes."""
    model.train()
    shard = epoch_shard(data.n_train, epoch, args.seed, ddp.rank, ddp.world).to(device)
    local_batch = math.ceil(args.batch_size / ddp.world)
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    for start in range(0, len(shard), local_batch):
        idx = shard[start:start + local_batch]
        inputs, y = data.train_batch(idx)
        logits = model(*inputs)
        loss = F.cross_entropy(logits, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        loss_sum += loss.detach() * len(idx)
        correct += (logits.argmax(1) == y).sum()
    return (ddp.mean(loss_sum.item() / len(shard), device),
            ddp.mean(correct.item() / len(shard), device))


@torch.no_grad()
def evaluate(model, inputs: tuple, y) -> tuple[float, float]:
    """(loss, accuracy) of ``model(*inputs)`` against labels ``y``."""
    model.eval()
    logits = model(*inputs)
    return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()


def _synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------
# Checkpoints.

def save_checkpoint(path: str, epoch: int, models: dict, optimizers: dict, history: dict,
                    settings: dict) -> None:
    """Everything needed to continue: written to a temporary file, then renamed
    (a crash while saving leaves the previous checkpoint intact)."""
    state = {"format": CHECKPOINT_FORMAT, "epoch": epoch, "settings": settings,
             "models": {k: _unwrap(m).state_dict() for k, m in models.items()},
             "optimizers": {k: o.state_dict() for k, o in optimizers.items()},
             "history": history}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str, settings: dict, models: dict, optimizers: dict, device) -> tuple:
    """Restores models and optimizers in place; returns (epochs done, history).
    Every entry of ``settings`` (the flags a model depends on) must match the
    checkpoint's."""
    state = torch.load(path, map_location=device, weights_only=True)
    if state.get("format") != CHECKPOINT_FORMAT:
        raise SystemExit(f"{path}: not a checkpoint of this example (format "
                         f"{state.get('format')!r}, expected {CHECKPOINT_FORMAT})")
    differ = {k: (state["settings"].get(k), settings[k]) for k in settings
              if state["settings"].get(k) != settings[k]}
    if differ:
        raise SystemExit(f"{path} was saved with other settings; " + ", ".join(
            f"{k}: checkpoint {a!r}, now {b!r}" for k, (a, b) in differ.items()))
    for key, model in models.items():
        _unwrap(model).load_state_dict(state["models"][key])
        optimizers[key].load_state_dict(state["optimizers"][key])
    return state["epoch"], state["history"]


def _unwrap(model):
    return model.module if isinstance(model, DistributedDataParallel) else model


# ----------------------------------------------------------------------------
# Reporting.

class _Progress:
    """One tick per epoch (all models of the epoch). A tqdm bar on a terminal
    where tqdm is installed, else one line per epoch; silent on processes > 0."""

    def __init__(self, total: int, initial: int, enabled: bool, stream=None):
        self.stream = sys.stderr if stream is None else stream
        self.enabled, self._bar = enabled, None
        if enabled and _is_terminal(self.stream):
            try:
                from tqdm import tqdm
                self._bar = tqdm(total=total, initial=initial, unit="epoch", file=self.stream,
                                 dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, text: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)
            self._bar.update(1)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def save_plot(history: dict, path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for (kind, h), color in zip(history.items(), ("#c44e52", "#4c72b0", "#55a868")):
        epochs = h["epoch"]
        ax_loss.plot(epochs, h["train_loss"], color=color, linestyle="--", label=f"{kind} train")
        ax_loss.plot(epochs, h["test_loss"], color=color, label=f"{kind} test")
        ax_acc.plot(epochs, h["train_acc"], color=color, linestyle="--", label=f"{kind} train")
        ax_acc.plot(epochs, h["test_acc"], color=color, label=f"{kind} test")
    ax_loss.set(xlabel="epoch", ylabel="cross-entropy", yscale="log", title="loss")
    ax_acc.set(xlabel="epoch", ylabel="accuracy", title="accuracy", ylim=(0, 1.01))
    for ax in (ax_loss, ax_acc):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_report(result: dict) -> str:
    lines = [result["title"],
             f"{'model':<6} {'parameters':>10} {'test acc':>9} {'best test':>10} "
             f"{'train loss':>11} {'s / epoch':>10}"]
    for kind, r in result["models"].items():
        lines.append(f"{kind:<6} {r['parameters']:>10,} {r['test_acc']:>9.4f} "
                     f"{r['best_test_acc']:>10.4f} {r['train_loss']:>11.4f} "
                     f"{r['seconds_per_epoch']:>10.3f}")
    lines.append("s / epoch: median training time of one epoch (evaluation not included).")
    return "\n".join(lines)


# ----------------------------------------------------------------------------
# Command line (the flags every example shares), and the run.

def add_training_arguments(parser: argparse.ArgumentParser, *, epochs: int, quick_epochs: int,
                           plot: str) -> None:
    """The flags of a training run; ``epochs`` / ``quick_epochs``: the
    defaults without and with --quick; ``plot``: the default plot path."""
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="cpu or cuda (default: cuda when available); under DDP each "
                             "process takes cuda:LOCAL_RANK")
    parser.add_argument("--epochs", type=int, default=None, help=f"total epochs (default "
                        f"{epochs}, {quick_epochs} with --quick); with --resume, the total "
                        "to reach")
    parser.add_argument("--quick", action="store_true", help=f"{quick_epochs} epochs")
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma list of lltm, lstm (default: both)")
    parser.add_argument("--lltm-impl", default="native", choices=("native", "reference"),
                        help="lltm.LLTM's impl (default native: one call per sequence)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size (default %(default)s)")
    parser.add_argument("--layers", type=int, default=1,
                        help="recurrent layers (default %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32,
                        help="global batch (default %(default)s)")
    parser.add_argument("--lr", type=float, default=1e-2,
                        help="Adam's learning rate (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", metavar="PATH", help="save a checkpoint after every epoch")
    parser.add_argument("--resume", action="store_true",
                        help="continue from --checkpoint (from scratch if it does not exist)")
    parser.add_argument("--plot", metavar="PATH", default=plot,
                        help=f"loss / accuracy plot (default {plot}; '' for none)")
    parser.add_argument("--ddp", action="store_true",
                        help="DistributedDataParallel (automatic when WORLD_SIZE > 1, "
                             "as under torchrun)")
    parser.add_argument("--no-progress", action="store_true")
    parser.set_defaults(full_epochs=epochs, quick_epochs=quick_epochs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lltm.examples.train",
        description="Train LLTM and nn.LSTM on scikit-learn's digits read as sequences.")
    add_training_arguments(parser, epochs=20, quick_epochs=10, plot="out/train_digits.png")
    parser.add_argument("--pixels", action="store_true",
                        help="64 steps of one pixel instead of 8 rows of 8 pixels")
    return parser


def parse_training_arguments(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """Parses and checks the flags of add_training_arguments."""
    args = parser.parse_args(argv)
    if args.epochs is None:
        args.epochs = args.quick_epochs if args.quick else args.full_epochs
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not args.models or any(m not in MODELS for m in args.models):
        parser.error(f"--models: a comma list of {', '.join(MODELS)}")
    if args.resume and not args.checkpoint:
        parser.error("--resume needs --checkpoint PATH")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here")
    return args


def _init_distributed(args, device: torch.device) -> tuple[Dist, torch.device]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if not args.ddp and world <= 1:
        return Dist(), device
    if "RANK" not in os.environ:
        raise SystemExit("--ddp: run under torchrun (it sets RANK, WORLD_SIZE, MASTER_ADDR, ...)")
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size()), device


def main(argv: Sequence[str] | None = None) -> dict:
    """Train; returns the result (also printed): per model the final and best
    test accuracy, the last train loss, seconds per epoch, and the history."""
    args = parse_training_arguments(build_parser(), argv)
    return run(args, MODEL_SETTINGS, _digits)


def _digits(args, ddp: Dist, device) -> tuple[Digits, str]:
    data = load_digits(args.pixels, args.seed).to(device)
    layout = "64 steps x 1 pixel" if args.pixels else "8 steps x 8 pixels"
    return data, (f"digits ({layout}), {len(data.y_train)} train / {len(data.y_test)} test, "
                  f"hidden {args.hidden}, {device.type}, {ddp.world} process(es), torch "
                  f"{torch.__version__}")


def run(args, model_settings: Sequence[str], load) -> dict:
    """Trains every model of ``args.models`` on ``load(args, ddp, device)``
    -> (data, title), under DDP where asked; ``model_settings``: the flags a
    checkpoint must match. Returns the result (also printed)."""
    ddp, device = _init_distributed(args, torch.device(args.device))
    try:
        data, title = load(args, ddp, device)
        return _train(args, model_settings, data, title, ddp, device)
    finally:
        if ddp.world > 1:
            dist.destroy_process_group()


def _train(args, model_settings, data, title: str, ddp: Dist, device) -> dict:
    settings = {k: getattr(args, k) for k in model_settings}
    models, optimizers = {}, {}
    for kind in args.models:
        model = build_model(kind, data, args, device)
        optimizers[kind] = torch.optim.Adam(model.parameters(), lr=args.lr)
        models[kind] = model if ddp.world == 1 else DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)

    done, history = 0, {k: {"epoch": [], "train_loss": [], "train_acc": [], "test_loss": [],
                            "test_acc": [], "seconds": []} for k in args.models}
    if args.resume and os.path.exists(args.checkpoint):
        done, history = load_checkpoint(args.checkpoint, settings, models, optimizers, device)
        if ddp.main:
            print(f"resumed from {args.checkpoint} after epoch {done}", file=sys.stderr)
    elif args.resume and ddp.main:
        print(f"{args.checkpoint} does not exist yet: starting from scratch", file=sys.stderr)

    test_inputs, test_labels = data.test_set()
    progress = _Progress(args.epochs, done, enabled=ddp.main and not args.no_progress)
    try:
        for epoch in range(done + 1, args.epochs + 1):
            summary = []
            for kind, model in models.items():
                for group in optimizers[kind].param_groups:
                    group["lr"] = learning_rate(args.lr, epoch, args.epochs)
                _synchronize(device)
                start = time.perf_counter()
                train_loss, train_acc = train_epoch(model, optimizers[kind], data, epoch, args,
                                                    ddp, device)
                _synchronize(device)
                seconds = time.perf_counter() - start
                test_loss, test_acc = evaluate(_unwrap(model), test_inputs, test_labels)
                h = history[kind]
                for key, value in (("epoch", epoch), ("train_loss", train_loss),
                                   ("train_acc", train_acc), ("test_loss", test_loss),
                                   ("test_acc", test_acc), ("seconds", seconds)):
                    h[key].append(value)
                summary.append(f"{kind} loss {train_loss:.3f} test acc {test_acc:.3f}")
            progress.update(f"epoch {epoch}/{args.epochs}: " + ", ".join(summary))
            if args.checkpoint and ddp.main:
                save_checkpoint(args.checkpoint, epoch, models, optimizers, history, settings)
            if ddp.world > 1:
                dist.barrier()
    finally:
        progress.close()

    result = {"title": title, "epochs": args.epochs, "world_size": ddp.world, "models": {}}
    for kind, h in history.items():
        result["models"][kind] = {
            "parameters": sum(p.numel() for p in _unwrap(models[kind]).parameters()),
            "test_acc": h["test_acc"][-1] if h["test_acc"] else float("nan"),
            "best_test_acc": max(h["test_acc"], default=float("nan")),
            "train_loss": h["train_loss"][-1] if h["train_loss"] else float("nan"),
            "seconds_per_epoch": statistics.median(h["seconds"]) if h["seconds"] else float("nan"),
            "history": h,
        }
    result["state"] = {k: _unwrap(m).state_dict() for k, m in models.items()}
    if ddp.main:
        print(format_report(result))
        if args.plot:
            try:
                save_plot(history, args.plot, title)
                print(f"saved {args.plot}")
            except ImportError:
                print("matplotlib is not installed: no plot (pip install matplotlib)",
                      file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
