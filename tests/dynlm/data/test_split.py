"""The split rules: named (file/folder names), config (DataConfig.splits), hash; mixed is an error."""

from __future__ import annotations

import pytest

from dynlm.config import ConfigError
from dynlm.data.config import DataConfig
from dynlm.data.split import (
    SplitRuleError,
    check_split_rule,
    component_splits,
    components_below_input,
    config_split,
    file_split,
    named_splits,
    path_parts,
    project_of,
    relative_to_input,
)
from dynlm.tasks.cloze_data import ClozeDataConfig


@pytest.mark.parametrize("component, expected", [
    ("train", {"train"}), ("wiki.train.tokens", {"train"}), ("train.txt.gz", {"train"}),
    ("TRAIN", {"train"}), ("valid.txt", {"valid"}), ("validation", {"valid"}), ("dev.conll", {"valid"}),
    ("development", {"valid"}), ("wiki.test.tokens", {"test"}), ("test", {"test"}),
    # whole pieces only: pytest's folders, words that contain a split name, other separators
    ("test_named0", set()), ("pytest-12", set()), ("contest.txt", set()), ("train_2", set()),
    ("retrain.yaml", set()), ("devices", set()), ("en-train.conllu", set()), ("synth_000.conll", set()),
    ("train.test.txt", {"train", "test"}),
])
def test_component_splits_match_whole_dot_separated_pieces(component, expected):
    assert component_splits(component) == expected


def test_path_parts_drop_the_scheme_like_ray_data_rows():
    assert path_parts("s3://bucket/wt2/wiki.train.tokens") == ["bucket", "wt2", "wiki.train.tokens"]
    assert path_parts("bucket/wt2/") == path_parts("s3://bucket/wt2") == ["bucket", "wt2"]
    assert path_parts("/a/./b//c") == ["a", "b", "c"]


def test_relative_to_input():
    inputs = ["/usr/lib/python3.11", "/usr/lib/python3.11/json", "/data/one.py", "s3://bucket/code"]
    assert relative_to_input("/usr/lib/python3.11/email/mime/text.py", inputs) == "email/mime/text.py"
    assert relative_to_input("/usr/lib/python3.11/json/decoder.py", inputs) == "decoder.py"  # the longest input
    assert relative_to_input("/data/one.py", inputs) == "one.py"  # a file input: its name
    assert relative_to_input("bucket/code/pkg/a.py", inputs) == "pkg/a.py"  # Ray's URI rows lose the scheme
    assert relative_to_input("/elsewhere/b.py", inputs) == "b.py"


def test_project_of_is_the_first_component_below_the_input():
    assert project_of("email/mime/text.py") == "email"
    assert project_of("json/__init__.py") == project_of("json/decoder.py") == "json"
    assert project_of("os.py") == "os"  # a top-level module is its own project
    assert project_of("./requests/api.py") == "requests" and project_of("") == ""


def test_only_the_input_and_below_can_name_a_split():
    inputs = ["/tmp/pytest-of-me/test_x0/train/corpus", "/tmp/pytest-of-me/test_x0/train/corpus/sub"]
    # the longest input containing the file is its input; "train" above it does not count
    assert components_below_input("/tmp/pytest-of-me/test_x0/train/corpus/sub/a.txt", inputs) == ["sub", "a.txt"]
    assert named_splits("/tmp/pytest-of-me/test_x0/train/corpus/a.txt", inputs) == set()
    # the input's own name counts (a folder passed as --input .../development)
    assert named_splits("/data/v4/data/development/data/english/x_conll", ["/data/v4/data/development"]) == {"valid"}
    assert named_splits("/data/conll-2012/v4/data/test/data/x_conll", ["/data/conll-2012"]) == {"test"}
    assert named_splits("/w/wiki.valid.tokens", ["/w/wiki.valid.tokens"]) == {"valid"}
    # a path under no input: its file name only
    assert components_below_input("/elsewhere/test/b.txt", inputs) == ["b.txt"]
    assert named_splits("bucket/wt2/wiki.test.tokens", ["s3://bucket/wt2"]) == {"test"}


def test_config_split_is_the_listed_path_or_a_folder_above():
    splits = {"train": ["/c/a", "/c/more.txt"], "valid": ["/c/b.txt"], "test": ["/c/t"]}
    assert config_split("/c/a/x/1.txt", splits) == "train"
    assert config_split("/c/more.txt", splits) == "train"
    assert config_split("/c/b.txt", splits) == "valid"
    assert config_split("/c/t/2.txt", splits) == "test"
    assert config_split("/c/ab/1.txt", splits) is None  # "/c/a" is a folder, not a string prefix
    assert config_split("/c/b.txt.gz", splits) is None


def test_file_split_rules():
    inputs = ["/wt2"]
    assert file_split("/wt2/wiki.train.tokens", inputs, {}) == ("named", "train")
    assert file_split("/wt2/README", inputs, {}) == ("hash", None)
    assert file_split("/wt2/train/wiki.test.tokens", inputs, {}) == ("named", None)  # two names: an error later
    # data.splits wins over the names
    assert file_split("/wt2/wiki.train.tokens", inputs, {"test": ["/wt2/wiki.train.tokens"]}) == ("config", "test")
    assert file_split("/wt2/README", inputs, {"train": ["/wt2/wiki.train.tokens"]}) == ("config", None)


def test_check_split_rule_gives_one_rule():
    wt2 = ["/wt2/wiki.train.tokens", "/wt2/wiki.valid.tokens", "/wt2/wiki.test.tokens"]
    assert check_split_rule(wt2, ["/wt2"], {}, ["train", "valid", "test"]) == "named"
    assert check_split_rule(["/c/a.txt", "/c/b.txt"], ["/c"], {}, ["train", "test"]) == "hash"
    assert check_split_rule(["/c/a.txt"], ["/c"], {}, ["valid"]) == "hash"  # hash: no train is not this rule's error
    splits = {"train": ["/c/a.txt"], "valid": ["/c/b.txt"]}
    assert check_split_rule(["/c/a.txt", "/c/b.txt"], ["/c"], splits, ["train", "valid"]) == "config"


def test_the_recorded_rule_is_the_one_the_data_config_applied():
    """The rule comes from the data config's ``file_split``, the one its parse stage splits by:
    CMRC-2017's ``cloze.valid.*`` files are hashed by the cloze task unless ``named_splits``,
    and CBT's ``_``-separated ``cbtest_NE_train.txt`` names are read when it is set."""
    cmrc = ["/c/cloze.valid.doc_query", "/c/user.valid.doc_query.gz"]
    cloze = ClozeDataConfig(inputs=["/c"])
    assert [cloze.file_split(p) for p in cmrc] == [("hash", None), ("hash", None)]
    assert check_split_rule(cmrc, ["/c"], {}, ["train", "valid", "test"]) == "named"  # what the names alone say
    assert check_split_rule(cmrc, ["/c"], {}, ["train", "valid", "test"], file_rule=cloze.file_split) == "hash"

    named = cloze.replace(named_splits=True)
    cbt = ["/c/cbtest_NE_train.txt", "/c/cbtest_CN_valid_2000ex.txt", "/c/cbtest_NE_test_2500ex.txt"]
    assert [named.file_split(p) for p in cbt] == [("named", "train"), ("named", "valid"), ("named", "test")]
    assert check_split_rule(cbt, ["/c"], {}, ["train", "valid", "test"]) == "hash"  # no "."-separated name
    assert check_split_rule(cbt, ["/c"], {}, ["train", "valid", "test"], file_rule=named.file_split) == "named"
    assert named.file_split("/c/cloze.train.doc_query") == ("named", "train")  # other files: the "." rule
    assert named.file_split("/c/cbtest_NE_extra.txt") == ("hash", None)
    with pytest.raises(SplitRuleError, match=r"mix files whose path names their split \(e.g. /c/cbtest_NE_train.txt\) "
                                             r"with files that name none \(/c/toy.doc_query\)"):
        check_split_rule([cbt[0], "/c/toy.doc_query"], ["/c"], {}, ["train"], file_rule=named.file_split)
    # data.splits wins either way
    listed = cloze.replace(splits={"train": ["/c/cloze.valid.doc_query"]})
    assert listed.file_split("/c/cloze.valid.doc_query") == ("config", "train")
    assert DataConfig(inputs=["/wt2"]).file_split("/wt2/wiki.valid.tokens") == ("named", "valid")  # the LM's default


def test_mixed_named_and_unnamed_inputs_are_an_error_that_says_what_to_do():
    files = ["/wt2/wiki.train.tokens", "/wt2/wiki.valid.tokens", "/wt2/README", "/wt2/SOURCE.md"]
    with pytest.raises(SplitRuleError, match=r"mix files whose path names their split \(e.g. "
                                             r"/wt2/wiki.train.tokens\) with files that name none "
                                             r"\(/wt2/README, /wt2/SOURCE.md\).*Pass only the named files "
                                             r"\(--input /wt2/wiki.train.tokens --input /wt2/wiki.valid.tokens\)"):
        check_split_rule(files, ["/wt2"], {}, ["train", "valid"])
    many = [f"/c/train/{i}.conll" for i in range(4)] + ["/c/extra.conll"]
    with pytest.raises(SplitRuleError, match=r"Pass only the named files \(e.g. their train/valid/test folders\)"):
        check_split_rule(many, ["/c"], {}, ["train"])


@pytest.mark.parametrize("files, splits, doc_splits, message", [
    (["/c/a.txt", "/c/x.txt"], {"train": ["/c/a.txt"]}, ["train"],
     r"1 input file\(s\) are in no listed split: /c/x.txt"),
    (["/c/a.txt"], {"train": ["/c/a.txt"], "test": ["/c/typo.txt"]}, ["train"],
     r"/c/typo.txt match\(es\) no input file"),
    (["/c/train/b.test.txt"], {}, ["train"], r"name more than one split: /c/train/b.test.txt \(\['test', 'train'\]\)"),
    (["/scratch/test/a.txt"], {}, ["test"], r"split rule 'named': no train document \(the inputs give only \['test'\]\)"),
])
def test_check_split_rule_errors(files, splits, doc_splits, message):
    with pytest.raises(SplitRuleError, match=message):
        check_split_rule(files, ["/c", "/scratch/test"], splits, doc_splits)


def test_data_config_splits_field(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a").write_text("a")
    (corpus / "b").write_text("b")
    cfg = DataConfig(inputs=[str(corpus)], splits={"train": [str(corpus / "a")], "valid": [str(corpus / "b")]})
    assert cfg.to_dict()["splits"] == {"train": [str(corpus / "a")], "valid": [str(corpus / "b")]}
    assert DataConfig.from_dict(cfg.to_dict()) == cfg
    assert DataConfig(inputs=[str(corpus)]).splits == {}
    assert cfg.data_hash() != DataConfig(inputs=[str(corpus)]).data_hash()  # the split is part of the data
    assert cfg.data_hash() != cfg.replace(splits={"train": [str(corpus / "b")], "valid": [str(corpus / "a")]}).data_hash()


@pytest.mark.parametrize("splits, message", [
    ({"dev": ["c/a"]}, r"splits: unknown split 'dev'; known splits: \['train', 'valid', 'test'\]"),
    ({"valid": ["c/a"]}, r"splits.train: at least one path is required"),
    ({"train": ["c/a"], "test": []}, r"splits.test: give at least one path"),
    ({"train": ["elsewhere/a"]}, r"splits.train: 'elsewhere/a' is not inside any of inputs \['c'\]"),
    ({"train": ["c"], "valid": ["c/v.txt"]}, r"'c/v.txt' \(valid\) and 'c' \(train\) overlap"),
    ({"train": "c/a"}, r"splits.train: expected a list"),
])
def test_data_config_rejects_bad_splits(splits, message):
    with pytest.raises(ConfigError, match=message):
        DataConfig.from_dict({"inputs": ["c"], "splits": splits})
