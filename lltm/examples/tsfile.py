"""A reader of the ``.ts`` time-series classification format (the UEA / UCR
archive's, as sktime writes it), and the datasets shipped inside sktime's wheel.

A ``.ts`` file is a header, then one case a line::

    # comments start with '#' (or '%', as in ARFF)
    @problemName JapaneseVowels
    @timeStamps false
    @missing false
    @univariate false
    @dimensions 12
    @equalLength false
    @classLabel true 1 2 3 4 5 6 7 8 9
    @data
    1.86,1.89,1.93:-0.20,-0.19,-0.23:...:3

A case holds its dimensions (channels) separated by ``:``, each a ``,``-separated
list of values (``?`` for a missing one, read as NaN where ``@missing true``),
and, where ``@classLabel true``, its class label last. Tags are
case-insensitive; a tag given twice takes its last value (one of sktime's own
files names its problem twice); blank lines are ignored. Read here: cases whose dimensions
all have one length (a case's length may differ from the next one's), with
class labels; files with ``@timeStamps true`` or a regression target
(``@targetLabel``) are refused with an error saying so.

sktime is never imported (it pulls in pandas, scikit-base, ...): its installed
files are located with ``importlib.util.find_spec``, which runs no code of the
package. ``pip install --no-deps sktime==1.2.0`` installs them (``make setup``
does).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from typing import Iterable

import torch

__all__ = ["TSFormatError", "TSDataset", "parse_ts", "load_ts", "sktime_data_dir",
           "sktime_datasets", "load_sktime_dataset"]

_BOOLEAN_TAGS = ("timestamps", "missing", "univariate", "equallength")
_KNOWN_TAGS = _BOOLEAN_TAGS + ("problemname", "dimensions", "serieslength", "classlabel",
                               "targetlabel", "data")


class TSFormatError(ValueError):
    """A ``.ts`` file that does not follow the format (or that this reader
    does not handle); the message starts with ``file:line:``."""


@dataclasses.dataclass
class TSDataset:
    """One ``.ts`` file: ``series[k]`` is case k as a float32 tensor
    [T_k, C] (time first, one column per dimension), ``labels[k]`` its class
    index into ``class_names`` (the order of the ``@classLabel`` header)."""
    name: str
    series: list[torch.Tensor]
    labels: list[int]
    class_names: list[str]

    @property
    def dimensions(self) -> int:
        return self.series[0].shape[1]

    @property
    def lengths(self) -> list[int]:
        return [s.shape[0] for s in self.series]


def _bool(value: str, tag: str, where: str) -> bool:
    v = value.lower()
    if v not in ("true", "false"):
        raise TSFormatError(f"{where}: @{tag} must be true or false, got {value!r}")
    return v == "true"


def _int(value: str, tag: str, where: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise TSFormatError(f"{where}: @{tag} must be a positive integer, got {value!r}")
    return n


def _parse_header(tag: str, rest: str, header: dict, where: str) -> None:
    """One ``@tag value`` line into ``header`` (tag lower case)."""
    if tag not in _KNOWN_TAGS:
        raise TSFormatError(f"{where}: unknown tag @{tag}")
    if tag == "data":
        if rest:
            raise TSFormatError(f"{where}: @data takes no value, got {rest!r}")
        header[tag] = True
    elif tag == "problemname":
        if not rest:
            raise TSFormatError(f"{where}: @problemName needs a name")
        header[tag] = rest
    elif tag in _BOOLEAN_TAGS:
        header[tag] = _bool(rest, tag, where)
    elif tag in ("dimensions", "serieslength"):
        header[tag] = _int(rest, tag, where)
    elif tag == "classlabel":
        tokens = rest.split()
        if not tokens:
            raise TSFormatError(f"{where}: @classLabel needs true or false")
        if _bool(tokens[0], tag, where):
            if len(tokens) == 1:
                raise TSFormatError(f"{where}: @classLabel true must list the class labels")
            if len(set(tokens[1:])) != len(tokens) - 1:
                raise TSFormatError(f"{where}: @classLabel lists a label twice: {rest!r}")
            header[tag] = tokens[1:]
        else:
            header[tag] = None
    elif tag == "targetlabel":
        raise TSFormatError(f"{where}: @targetLabel (a regression target) is not read here: "
                            "this reader takes classification problems (@classLabel true)")


def _check_header(header: dict, where: str) -> None:
    for tag, name in (("problemname", "@problemName"), ("timestamps", "@timeStamps"),
                      ("univariate", "@univariate"), ("classlabel", "@classLabel")):
        if tag not in header:
            raise TSFormatError(f"{where}: {name} is missing before @data")
    if header["timestamps"]:
        raise TSFormatError(f"{where}: @timeStamps true is not read here (values only)")
    if header["classlabel"] is None:
        raise TSFormatError(f"{where}: @classLabel false: this reader takes classification "
                            "problems, whose cases end with a class label")
    if header["univariate"] and header.get("dimensions", 1) != 1:
        raise TSFormatError(f"{where}: @univariate true with @dimensions "
                            f"{header['dimensions']}")


def _parse_values(text: str, missing: bool, where: str, dim: int) -> list[float]:
    values = []
    for token in text.split(","):
        token = token.strip()
        if token == "?":
            if not missing:
                raise TSFormatError(f"{where}: dimension {dim} has a missing value '?' but "
                                    "the header says @missing false")
            values.append(math.nan)
            continue
        try:
            values.append(float(token))
        except ValueError:
            raise TSFormatError(f"{where}: dimension {dim}: {token!r} is not a number") from None
    return values


def _parse_case(line: str, header: dict, where: str) -> tuple[torch.Tensor, int]:
    fields = line.split(":")
    if len(fields) < 2:
        raise TSFormatError(f"{where}: a case must be its dimensions then ':' and its class "
                            "label, got no ':'")
    label = fields[-1].strip()
    classes = header["classlabel"]
    if label not in classes:
        raise TSFormatError(f"{where}: class label {label!r} is not one of the @classLabel "
                            f"labels {classes}")
    dims = fields[:-1]
    expected = 1 if header["univariate"] else header.get("dimensions")
    if expected is not None and len(dims) != expected:
        raise TSFormatError(f"{where}: {len(dims)} dimensions, expected {expected}")
    channels = [_parse_values(d, header.get("missing", False), where, k + 1)
                for k, d in enumerate(dims)]
    lengths = {len(c) for c in channels}
    if len(lengths) != 1:
        raise TSFormatError(f"{where}: the dimensions have different lengths "
                            f"{[len(c) for c in channels]}; this reader needs one length a case")
    length = lengths.pop()
    if header.get("equallength") and "serieslength" in header \
            and length != header["serieslength"]:
        raise TSFormatError(f"{where}: length {length}, but @seriesLength is "
                            f"{header['serieslength']}")
    series = torch.tensor(channels, dtype=torch.float64).T.to(torch.float32).contiguous()
    return series, classes.index(label)


def parse_ts(lines: Iterable[str], source: str = "<ts>") -> TSDataset:
    """Parses the lines of a ``.ts`` file; ``source`` names it in errors."""
    header: dict = {}
    series, labels = [], []
    number = 0
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        where = f"{source}:{number}"
        if not line or line.startswith(("#", "%")):
            continue
        if "data" not in header:
            if not line.startswith("@"):
                raise TSFormatError(f"{where}: expected a @tag line before @data, got "
                                    f"{line[:40]!r}")
            tag, *rest = line[1:].split(None, 1) or [""]
            _parse_header(tag.lower(), rest[0].strip() if rest else "", header, where)
            if "data" in header:
                _check_header(header, where)
            continue
        if line.startswith("@"):
            raise TSFormatError(f"{where}: a @tag line after @data")
        s, label = _parse_case(line, header, where)
        if series and s.shape[1] != series[0].shape[1]:
            raise TSFormatError(f"{where}: {s.shape[1]} dimensions, the first case has "
                                f"{series[0].shape[1]}")
        if header.get("equallength") and series and s.shape[0] != series[0].shape[0]:
            raise TSFormatError(f"{where}: length {s.shape[0]} differs from the first case's "
                                f"{series[0].shape[0]} under @equalLength true")
        series.append(s)
        labels.append(label)
    if "data" not in header:
        raise TSFormatError(f"{source}:{number}: no @data line")
    if not series:
        raise TSFormatError(f"{source}:{number}: no cases after @data")
    return TSDataset(header["problemname"], series, labels, header["classlabel"])


def load_ts(path: str | os.PathLike) -> TSDataset:
    """Reads one ``.ts`` file (UTF-8; a leading byte-order mark is skipped)."""
    with open(path, encoding="utf-8-sig") as f:
        return parse_ts(f, os.fspath(path))


def sktime_data_dir() -> str | None:
    """The folder of the datasets inside an installed sktime
    (``sktime/datasets/data``), or None where sktime is not installed. The
    package is located, not imported."""
    spec = importlib.util.find_spec("sktime")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = os.path.join(location, "datasets", "data")
        if os.path.isdir(path):
            return path
    return None


def sktime_datasets() -> list[str]:
    """The names of the datasets sktime ships with a TRAIN and a TEST ``.ts``."""
    root = sktime_data_dir()
    if root is None:
        return []
    return sorted(name for name in os.listdir(root)
                  if all(os.path.isfile(os.path.join(root, name, f"{name}_{split}.ts"))
                         for split in ("TRAIN", "TEST")))


def load_sktime_dataset(name: str, split: str) -> TSDataset:
    """``split`` ("TRAIN" or "TEST") of one of sktime's shipped datasets."""
    if split not in ("TRAIN", "TEST"):
        raise ValueError(f"split must be 'TRAIN' or 'TEST', got {split!r}")
    root = sktime_data_dir()
    if root is None:
        raise FileNotFoundError(
            "the sktime package is not installed: its wheel carries the .ts datasets "
            "(pip install --no-deps sktime==1.2.0, as `make setup` does)")
    path = os.path.join(root, name, f"{name}_{split}.ts")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} does not exist; sktime ships these datasets with a "
                                f"TRAIN and a TEST file: {', '.join(sktime_datasets())}")
    return load_ts(path)
