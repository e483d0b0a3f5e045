"""The press classes keep their public shape: data/press_classes.json records, for every class of
kvslim.presses.__all__, the constructor signature, docstring, bases and what a fixed set of
constructions gives (spec, ratio, repr, or the error raised); press_classes.py describes the
classes of the package under test the same way and each part is compared with the record.
"""
import json

import pytest

import press_classes

with open(press_classes.REFERENCE, encoding="utf-8") as f:
    REFERENCE = json.load(f)
CURRENT = press_classes.describe_all()


def test_the_package_exports_the_recorded_classes_in_order():
    assert CURRENT["__all__"] == REFERENCE["__all__"]


@pytest.mark.parametrize("name", REFERENCE["__all__"])
def test_signature_bases_and_docstring_are_the_recorded_ones(name):
    want, got = REFERENCE["classes"][name], CURRENT["classes"][name]
    assert got["signature"] == want["signature"]
    assert got["bases"] == want["bases"]
    assert got["is_dataclass"] == want["is_dataclass"]
    assert got["doc"] == want["doc"]


@pytest.mark.parametrize("name", REFERENCE["__all__"])
def test_constructions_give_the_recorded_specs_ratios_and_errors(name):
    want = {c["label"]: c for c in REFERENCE["classes"][name]["constructions"]}
    got = {c["label"]: c for c in CURRENT["classes"][name]["constructions"]}
    assert sorted(got) == sorted(want)
    for label, w in want.items():
        assert got[label] == w, label
