"""lltm.examples.tsfile: the .ts reader on hand-written files (every header
tag, missing values, string labels, each malformed case with its message and
line), and on the files sktime's wheel ships (needs sktime: make setup
installs it; skipped with the reason elsewhere, required under CI)."""
import importlib.util
import math

import pytest
import torch

from conftest import require_sktime
from lltm.examples import tsfile

MULTI = """\
# A comment, then a blank line, then another kind of comment

% as in ARFF

@problemName Toy
@TimeStamps	false
@missing true
@univariate false
@dimensions 2
@equalLength false
@classLabel true walk run jump
@DATA
1,2,3:4,5,6:run
 0.5,?:-1e3,2.5e-1:walk

7:8:jump
"""


def test_multivariate_unequal_lengths_missing_values_and_string_labels():
    data = tsfile.parse_ts(MULTI.splitlines(True), "toy.ts")
    assert data.name == "Toy"
    assert data.class_names == ["walk", "run", "jump"]
    assert data.labels == [1, 0, 2]
    assert data.lengths == [3, 2, 1]
    assert data.dimensions == 2
    assert all(s.dtype == torch.float32 for s in data.series)
    torch.testing.assert_close(data.series[0], torch.tensor([[1., 4.], [2., 5.], [3., 6.]]))
    assert math.isnan(data.series[1][1, 0])
    torch.testing.assert_close(data.series[1][:, 1], torch.tensor([-1000.0, 0.25]))
    torch.testing.assert_close(data.series[2], torch.tensor([[7.0, 8.0]]))


def test_univariate_equal_length():
    text = ["@problemName U", "@timeStamps false", "@univariate true", "@equalLength true",
            "@seriesLength 4", "@classLabel true 1 2", "@data", "1,2,3,4:2", "4,3,2,1:1"]
    data = tsfile.parse_ts(text)
    assert data.lengths == [4, 4] and data.dimensions == 1 and data.labels == [1, 0]
    torch.testing.assert_close(data.series[1][:, 0], torch.tensor([4.0, 3.0, 2.0, 1.0]))


def test_a_tag_given_twice_takes_its_last_value():
    text = ["@problemName First", "@problemName Second", "@timeStamps false",
            "@univariate true", "@classLabel true a", "@data", "1:a"]
    assert tsfile.parse_ts(text).name == "Second"


def test_load_ts_reads_a_file_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "toy.ts"
    path.write_bytes(b"\xef\xbb\xbf" + MULTI.encode())
    data = tsfile.load_ts(path)
    assert data.labels == [1, 0, 2]


HEADER = ["@problemName P", "@timeStamps false", "@univariate false", "@dimensions 2",
          "@classLabel true a b"]
BAD = {
    # name: (lines, line number in the message, words of the message)
    "no data tag": (HEADER, 5, "no @data line"),
    "no cases": (HEADER + ["@data"], 6, "no cases"),
    "unknown label": (HEADER + ["@data", "1:2:c"], 7, "class label 'c' is not one"),
    "dimension count": (HEADER + ["@data", "1,2:3,4:5,6:a"], 7, "3 dimensions, expected 2"),
    "unequal dimensions": (HEADER + ["@data", "1,2:3:a"], 7, "different lengths [2, 1]"),
    "missing not allowed": (HEADER + ["@data", "1,?:3,4:a"], 7, "@missing false"),
    "not a number": (HEADER + ["@data", "1,x:3,4:a"], 7, "'x' is not a number"),
    "no label field": (HEADER + ["@data", "1,2,3"], 7, "no ':'"),
    "timestamps": (["@problemName P", "@timeStamps true", "@univariate true",
                    "@classLabel true a", "@data"], 5, "@timeStamps true is not read"),
    "regression": (["@problemName P", "@targetLabel true"], 2, "regression"),
    "class label false": (["@problemName P", "@timeStamps false", "@univariate true",
                           "@classLabel false", "@data"], 5, "classification"),
    "labels absent": (["@problemName P", "@classLabel true"], 2, "must list the class labels"),
    "unknown tag": (["@problemName P", "@colour red"], 2, "unknown tag @colour"),
    "bare at sign": (["@problemName P", "@"], 2, "unknown tag @"),
    "tag after data": (HEADER + ["@data", "1:2:a", "@missing true"], 8, "after @data"),
    "header incomplete": (["@problemName P", "@data"], 2, "@timeStamps is missing"),
    "bad boolean": (["@problemName P", "@univariate maybe"], 2, "true or false"),
    "bad count": (["@problemName P", "@dimensions zero"], 2, "positive integer"),
    "series length": (["@problemName P", "@timeStamps false", "@univariate true",
                       "@equalLength true", "@seriesLength 3", "@classLabel true a", "@data",
                       "1,2:a"], 8, "@seriesLength is 3"),
    "equal length": (["@problemName P", "@timeStamps false", "@univariate true",
                      "@equalLength true", "@classLabel true a", "@data", "1,2:a", "1:a"],
                     8, "differs from the first case's 2"),
    "case dimensions": (["@problemName P", "@timeStamps false", "@univariate false",
                         "@classLabel true a", "@data", "1:2:a", "1:a"], 7,
                        "1 dimensions, the first case has 2"),
    "text before header": (["1,2:a"], 1, "expected a @tag line"),
    "value before data": (["@problemName P", "1,2:a"], 2, "expected a @tag line"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_malformed_files_are_refused_with_file_and_line(name):
    lines, number, words = BAD[name]
    with pytest.raises(tsfile.TSFormatError) as info:
        tsfile.parse_ts(lines, "bad.ts")
    message = str(info.value)
    assert message.startswith(f"bad.ts:{number}: "), message
    assert words in message, message
    assert isinstance(info.value, ValueError)


def test_without_sktime_the_loader_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(tsfile.importlib.util, "find_spec",
                        lambda name, *a: None if name == "sktime" else real(name, *a))
    assert tsfile.sktime_data_dir() is None
    assert tsfile.sktime_datasets() == []
    with pytest.raises(FileNotFoundError, match="pip install --no-deps sktime"):
        tsfile.load_sktime_dataset("JapaneseVowels", "TRAIN")


def test_split_name_is_checked():
    with pytest.raises(ValueError, match="'TRAIN' or 'TEST'"):
        tsfile.load_sktime_dataset("JapaneseVowels", "train")


def test_japanese_vowels_as_shipped():
    require_sktime()
    assert "JapaneseVowels" in tsfile.sktime_datasets()
    train = tsfile.load_sktime_dataset("JapaneseVowels", "TRAIN")
    test = tsfile.load_sktime_dataset("JapaneseVowels", "TEST")
    assert train.name == test.name == "JapaneseVowels"
    assert train.class_names == test.class_names == [str(k) for k in range(1, 10)]
    assert (len(train.series), len(test.series)) == (270, 370)
    assert train.dimensions == test.dimensions == 12
    assert (min(train.lengths), max(train.lengths)) == (7, 26)
    assert (min(test.lengths), max(test.lengths)) == (7, 29)
    assert [train.labels.count(k) for k in range(9)] == [30] * 9
    assert [test.labels.count(k) for k in range(9)] == [31, 35, 88, 44, 29, 24, 40, 50, 29]
    # The first value of the first case, as written in the file.
    assert train.series[0][0, 0].item() == pytest.approx(1.860936)
    assert not any(torch.isnan(s).any() for s in train.series + test.series)


def test_missing_dataset_names_the_shipped_ones():
    require_sktime()
    with pytest.raises(FileNotFoundError, match="JapaneseVowels"):
        tsfile.load_sktime_dataset("NoSuchSet", "TRAIN")


def test_every_dataset_shipped_reads_or_is_refused_as_regression():
    """Every TRAIN / TEST pair in sktime's wheel: the classification ones read
    (one class list for both files), the regression ones (@targetLabel)
    refused with that reason."""
    require_sktime()
    names = tsfile.sktime_datasets()
    assert {"JapaneseVowels", "PLAID", "BasicMotions"} <= set(names)
    classification = 0
    for name in names:
        try:
            train = tsfile.load_sktime_dataset(name, "TRAIN")
        except tsfile.TSFormatError as e:
            assert "regression" in str(e), (name, str(e))
            continue
        test = tsfile.load_sktime_dataset(name, "TEST")
        assert train.class_names == test.class_names, name
        assert train.dimensions == test.dimensions, name
        assert set(train.labels) == set(range(len(train.class_names))), name
        classification += 1
    assert classification >= 8
    motions = tsfile.load_sktime_dataset("BasicMotions", "TRAIN")
    assert motions.class_names == ["Standing", "Running", "Walking", "Badminton"]
    assert (len(motions.series), motions.dimensions, set(motions.lengths)) == (40, 6, {100})
