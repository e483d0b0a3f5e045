"""Every press the engine registers with a class name is a class of the package, generated from the
registry: checked against what the engine itself accepts (its spec parser reads kvpress's class and
field names), and bad input is refused naming the field.
"""
import dataclasses

import pytest

import kvslim
from kvslim import presses as P

INFOS = kvslim.available_presses()
CLASSES = sorted(c for i in INFOS for c in i["kvpress_classes"] + ([i["python"]["name"]] if i["python"]["name"] else []))
# Presses that need a file, and the field naming it; presses with a setting that has no default.
FILE_FIELDS = {"KVzapPress": "surrogate", "QFilterPress": "filters", "RestoreKVPress": "file", "LUKVPress": "curve",
               "FastKVzipPress": "gates"}
REQUIRED = {"FinchPress": {"window_size": 8}, "PerLayerCompressionPress": {"compression_ratios": [0.5, 0.25]}}


def test_every_registered_class_name_is_a_generated_class_and_no_other():
    generated = [n for n in P.__all__ if n not in ("BasePress", "Press", "ScorerPress", "ComposedPress")]
    assert sorted(generated) == CLASSES
    for info in INFOS:
        for name in info["kvpress_classes"] + ([info["python"]["name"]] if info["python"]["name"] else []):
            cls = getattr(kvslim, name)
            assert cls is getattr(P, name) and issubclass(cls, kvslim.BasePress) and dataclasses.is_dataclass(cls)
            assert cls.__module__ == "kvslim.presses" and cls.__qualname__ == name
            assert " ".join(info["summary"][1:].split()).rstrip(".") in " ".join(cls.__doc__.split()), name


@pytest.mark.parametrize("name", CLASSES)
def test_defaults_make_a_spec_the_engine_builds(name):
    cls = getattr(P, name)
    if name in FILE_FIELDS:
        # Without its file the engine refuses the press, naming the parameter.
        with pytest.raises(kvslim.KvslimError, match=FILE_FIELDS[name].split("_")[0]):
            kvslim._kvslim.check_press(cls().spec(), 0.5)
        return
    press = cls(**REQUIRED.get(name, {}))
    assert kvslim._kvslim.check_press(press.spec(), press.ratio or 0.5)


def _other(f):
    """A value other than the field's default that its press accepts."""
    if f.type == "int":
        return 7 if f.default is None else f.default + 2  # keeps an odd kernel odd
    if f.type == "float":
        return 0.375 if f.param == "ratio" else 0.5 if f.default is None else f.default * 0.5 + 0.125
    if f.type == "bool":
        return not f.default
    if f.type == "float_list":
        return [0.5, 0.25]
    return f.default


def _kvpress_term(cls, press, flds):
    """`press` written with kvpress's class and field names, which the engine's parser maps onto its
    own press and parameters (kvslim's press name for a class kvpress does not have)."""
    items = ",".join(f"{f.name}={P._format(f, getattr(press, f.name))}" for f in flds
                     if f.param and getattr(press, f.name) not in (None, ""))
    info = cls._kvslim_info
    name = cls.__name__ if cls.__name__ in info["kvpress_classes"] else info["name"]
    return name + (":" + items if items else "")


@pytest.mark.parametrize("name", CLASSES)
def test_fields_are_names_the_engine_reads_for_the_class(name):
    # Every field set to a value other than its default; the spec the class writes and the class
    # written with kvpress's names give the engine the same press. (Presses that need a file are
    # left out: the engine opens it when it builds the press.)
    cls = getattr(P, name)
    if name in FILE_FIELDS:
        return
    flds = cls._kvslim_fields
    press = cls(**{f.name: _other(f) for f in flds if f.type != "press" and not f.alias and not f.policy})
    for k, v in REQUIRED.get(name, {}).items():
        setattr(press, k, v)
    ours = kvslim._kvslim.check_press(press.spec(), 0.0)
    own = [f for f in flds if not f.inner]
    kind = cls._kvslim_info["kind"]
    if kind == "scorer":
        theirs = _kvpress_term(cls, press, own)
    else:
        inner_fields = [f for f in flds if f.inner]
        if inner_fields:
            inner_cls = getattr(P, P._inner_default(cls._kvslim_info["default_inner"])[0])
            inner = _kvpress_term(inner_cls, inner_cls(**{f.name: getattr(press, f.name) for f in inner_fields}),
                                  inner_fields)
        else:
            inner = getattr(press, cls._kvslim_info["python"]["inner"]).spec()
        head, colon, items = _kvpress_term(cls, press, [f for f in own if f.type != "press"]).partition(":")
        theirs = f"{head}({inner}){colon}{items}"
    assert kvslim._kvslim.check_press(theirs, 0.0) == ours, theirs


@pytest.mark.parametrize("name", CLASSES)
def test_unknown_keywords_and_bad_values_raise_naming_the_field(name):
    cls = getattr(P, name)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        cls(bogus=1)
    bad = {"int": "7", "float": "0.5", "bool": "yes", "str": 3, "float_list": "0.5/0.5", "press": "snapkv"}
    for f in cls._kvslim_fields:
        with pytest.raises(TypeError, match=f"{name}: {f.name} must be"):
            cls(**{f.name: bad[f.type]})
    if any(f.name == "compression_ratio" for f in cls._kvslim_fields):
        with pytest.raises(ValueError, match=rf"{name}: compression_ratio must be in \[0, 1\)"):
            cls(compression_ratio=1.5)
        with pytest.raises(TypeError, match=f"{name}: compression_ratio must be a number"):
            cls(compression_ratio=P.KnormPress())
        if issubclass(cls, P.ScorerPress):  # kvpress's ScorerPress: the ratio comes first
            assert cls(0.25).compression_ratio == 0.25
    for f in cls._kvslim_fields:
        if f.type == "float" and f.param != "ratio":
            with pytest.raises(ValueError, match=f"{name}: {f.name} must be finite"):
                cls(**{f.name: float("nan")})


def test_a_value_set_after_construction_is_checked_by_spec():
    p = P.SnapKVPress(0.5)
    p.window_size = "wide"
    with pytest.raises(TypeError, match="SnapKVPress: window_size must be an int, got 'wide'"):
        p.spec()


def test_kvpress_only_fields_older_names_and_policies():
    assert P.ObservedAttentionPress(0.5, output_attentions=True).spec() == "observed_attention:ratio=0.5"
    assert P.DecodingPress(compression_interval=8, compression_steps=4).spec() == "decoding(knorm,interval=4,size=2048)"
    assert P.KVzipPress(0.5, layerwise=True).spec() == "uniform(kvzip:ratio=0.5,n_sink=4)"
    # kvpress's defaults where they differ from the engine's: ThinK prunes nothing unless asked.
    assert P.ThinKPress().spec() == "think:key_ratio=0.0,window=32"
    assert kvslim._kvslim.check_press("think", 0.0) != kvslim._kvslim.check_press(P.ThinKPress().spec(), 0.0)
    # The default inner press of LUKVPress is kvpress's: ExpectedAttentionPress(epsilon=0.02).
    assert P.LUKVPress().press == P.ExpectedAttentionPress(epsilon=0.02)
    # kvslim's own classes say so.
    assert "kvpress has no such press" in P.H2OPress.__doc__
    assert "kvpress has no such press" not in P.SnapKVPress.__doc__


def test_a_press_pickles_copies_and_compares_as_a_dataclass():
    import copy
    import pickle
    press = P.AdaKVPress(P.SnapKVPress(0.5, window_size=32), alpha_safeguard=0.3)
    assert pickle.loads(pickle.dumps(press)) == press
    assert copy.deepcopy(press).spec() == press.spec()
    assert dataclasses.replace(press, alpha_safeguard=0.1).spec() == "adakv(snapkv:ratio=0.5,window=32,kernel=5,alpha=0.1)"
