"""Press classes with kvpress's names and parameters, turned into kvslim press specs.

Every press the engine registers with a kvpress class name (NVIDIA/kvpress, kvpress/presses/) is a
class here (and a few of kvslim's own, such as H2OPress), generated at import from the engine's
registry (``kvslim.available_presses()``): the same constructor fields, order and defaults as
kvpress's class, so code written for kvpress runs with ``import kvslim`` instead. ``spec()`` gives the kvslim press spec the engine runs (``kvslim
presses`` lists them); ``compression_ratio`` is the fraction of context entries removed, as in
kvpress. The classes are dataclasses; a bad value raises TypeError or ValueError naming the field
when the press is built.

Presses kvslim does not implement are not defined here (an ImportError is clearer than a press
that silently does something else). ``Press(spec)`` runs any kvslim spec directly, and
``ComposedPress([...])`` composes presses.
"""
from __future__ import annotations

import ast
import dataclasses
import math
import os
import textwrap
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple

from . import _kvslim


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return repr(v)
    return str(v)


class BasePress:
    """A press: what kvslim should do to the KV cache. Subclasses define ``spec()``.

    Raises TypeError / ValueError when built (as kvpress asserts) if ``compression_ratio`` is not
    a number in [0, 1), e.g. a press object given to a scorer press that is not a wrapper."""

    def __post_init__(self):
        names = {f.name for f in fields(self)} if is_dataclass(self) else set()
        if "compression_ratio" in names:
            _check_ratio(type(self).__name__, self.compression_ratio)

    def spec(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def ratio(self) -> float:
        """The compression ratio passed to the engine for ratios the spec leaves unset."""
        return float(getattr(self, "compression_ratio", 0.0) or 0.0)

    def __str__(self) -> str:
        return self.spec()


def _check_ratio(cls: str, r, name: str = "compression_ratio") -> None:
    """Raises TypeError (not a number) or ValueError (outside [0, 1)) naming the class ``cls``."""
    if isinstance(r, BasePress):
        raise TypeError(f"{cls}: {name} must be a number, got the press {type(r).__name__}; "
                        f"{cls} is a scorer press, not a wrapper: write {cls}({name}=0.5)")
    if isinstance(r, bool) or not isinstance(r, (int, float)):
        raise TypeError(f"{cls}: {name} must be a number in [0, 1), got {r!r}")
    if not 0.0 <= float(r) < 1.0:
        raise ValueError(f"{cls}: {name} must be in [0, 1) (the fraction of entries removed), got {r!r}")


@dataclass
class Press(BasePress):
    """Any kvslim press spec, e.g. ``Press("adakv(snapkv:window=32)", compression_ratio=0.5)``."""

    press_spec: str = "none"
    compression_ratio: float = 0.0

    def spec(self) -> str:
        return self.press_spec


class ScorerPress(BasePress):
    """Base of presses that score entries and keep the best (kvpress's ScorerPress)."""


def _press_spec(press, what: str) -> str:
    if not isinstance(press, BasePress):
        raise TypeError(f"{what} expects a press object, got {type(press).__name__}")
    return press.spec()


@dataclass
class ComposedPress(BasePress):
    """Presses applied in order, each to what the previous left (kept fractions multiply)."""

    presses: List[BasePress] = field(default_factory=list)

    def spec(self) -> str:
        if not self.presses:
            raise ValueError("ComposedPress needs at least one press")
        return "+".join(_press_spec(p, "ComposedPress") for p in self.presses)

    @property
    def compression_ratio(self) -> float:
        kept = 1.0
        for p in self.presses:
            kept *= 1.0 - p.ratio
        return 1.0 - kept


# ---------------------------------------------------------------------------------------------
# The classes generated from the engine's registry (include/kvslim/press.h: PressParam::python,
# PressInfo::python). Each press is declared once, in its C++ registration.

_RATIO_HELP = ("the fraction of the context's entries removed, in [0, 1); 0 leaves it to the run (the "
               "pipeline's press ratio, an eval's ratios)")


class _Field(NamedTuple):
    """One field of a generated class and what it is in the spec."""
    name: str            # the Python field ("window_size")
    type: str            # int, float, bool, str, float_list or press
    default: Any         # the Python default; a callable for a press (its default factory)
    help: str
    param: str = ""      # the kvslim parameter it gives ("window"); "" for a kvpress-only field
    alias: str = ""      # the kvslim parameter it sets when not None (an older kvpress name)
    policy: str = ""     # the budget policy a true value puts the press under
    inner: bool = False  # a field of the press's default inner press (PyramidKVPress's window_size)

    @property
    def annotation(self) -> str:
        base = {"float_list": "Sequence[float]", "press": "BasePress"}.get(self.type, self.type)
        return f"Optional[{base}]" if self.default is None else base


def _resolve_type(t: str, name: str, default: str) -> str:
    if t != "auto":
        return t
    if name == "ratio":
        return "float"
    try:
        int(default)
        return "int"
    except ValueError:
        pass
    try:
        float(default)
        return "float"
    except ValueError:
        return "str"


def _parse_default(text: str, t: str):
    """The Python value of an engine default (the text a spec would give)."""
    if t == "bool":
        if text not in ("0", "1"):
            raise ValueError(f"a bool parameter's default is 0 or 1, not {text!r}")
        return text == "1"
    if t == "float_list":
        return tuple(float(x) for x in text.split("/")) if text else ()
    if t == "str":
        return text
    if not text:
        return None
    return int(text) if t == "int" else float(text)


def _literal(text: str, what: str):
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError) as e:
        raise RuntimeError(f"{what}: the Python default {text!r} is not a Python literal") from e
    return tuple(v) if isinstance(v, list) else v


class _Registry:
    """The engine's presses by kvslim name and by class name."""

    def __init__(self, infos: List[dict]):
        self.infos = {i["name"]: i for i in infos}
        self.by_class: Dict[str, dict] = {}
        for i in infos:
            for c in _class_names(i):
                if c in self.by_class or c in _MACHINERY:
                    raise RuntimeError(f"press {i['name']}: the class name {c} is taken")
                self.by_class[c] = i

    def find(self, name: str) -> Optional[dict]:
        return self.infos.get(name) or self.by_class.get(name)


_MACHINERY = ("BasePress", "Press", "ScorerPress", "ComposedPress")


def _class_names(info: dict) -> List[str]:
    return list(info["kvpress_classes"]) + ([info["python"]["name"]] if info["python"]["name"] else [])


def _inner_default(spec: str) -> Tuple[str, Dict[str, Any]]:
    """The class and keyword arguments of the default inner press `spec` ("expected_attention:
    epsilon=0.02" -> ExpectedAttentionPress, {"epsilon": 0.02}); ("Press", {"press_spec": spec})
    for a spec no class states."""
    name, _, params = spec.partition(":")
    info = _REGISTRY.find(name)
    if info is None or not _class_names(info) or "(" in spec or "+" in spec:
        return "Press", {"press_spec": spec}
    cls = _class_names(info)[0]
    by_param = {f.param: f for f in _class_fields(info, cls) if f.param}
    kwargs = {}
    for item in filter(None, params.split(",")):
        k, _, v = item.partition("=")
        if k not in by_param:
            return "Press", {"press_spec": spec}
        kwargs[by_param[k].name] = _parse_default(v, by_param[k].type)
    return cls, kwargs


def _default_press(spec: str) -> Callable[[], BasePress]:
    """The default factory of an inner press given as a spec."""
    def make():
        cls, kwargs = _inner_default(spec)
        return globals()[cls](**kwargs)
    make.__qualname__ = make.__name__ = "default_" + "".join(c if c.isalnum() else "_" for c in spec)
    return make


def _class_fields(info: dict, cls_name: str) -> List[_Field]:
    """The fields of the class `cls_name` of the press `info`, in order."""
    press = info["name"]
    py = info["python"]
    out: List[_Field] = []
    if info["kind"] in ("policy", "wrapper"):
        inner = _REGISTRY.find(info["default_inner"]) if py["inner_fields"] else None
        if py["inner_fields"]:
            if inner is None or not _class_names(inner):
                raise RuntimeError(f"press {press}: inner_fields needs a default inner press with a class, not "
                                   f"{info['default_inner']!r}")
            out += [f._replace(inner=True) for f in _class_fields(inner, _class_names(inner)[0])]
        else:
            what = "the scorer press this policy budgets" if info["kind"] == "policy" else "the press it wraps"
            out.append(_Field(py["inner"], "press", _default_press(info["default_inner"]), what))
    params = [p for p in info["param_fields"]
              if not p["kvslim_only"] and p["only_in"] in ("", cls_name)]
    if info["kind"] == "scorer":  # compression_ratio first, as kvpress's ScorerPress
        params.sort(key=lambda p: p["name"] != "ratio")
    extra = {}
    for x in py["fields"]:
        extra.setdefault(x["after"], []).append(x)
    known = {p["name"] for p in info["param_fields"]}
    for anchor in extra:
        if anchor and anchor not in known:
            raise RuntimeError(f"press {press}: field {extra[anchor][0]['name']} follows {anchor!r}, no parameter")

    def add_extra(anchor):
        for x in extra.get(anchor, []):
            what = f"press {press}, field {x['name']}"
            if x["alias"] and x["alias"] not in known:
                raise RuntimeError(f"{what}: alias of {x['alias']!r}, no parameter")
            out.append(_Field(x["name"], x["type"], _literal(x["default"], what), x["help"],
                              alias=x["alias"], policy=x["policy"]))

    for p in params:
        t = _resolve_type(p["type"], p["name"], p["default"])
        what = f"press {press}, parameter {p['name']}"
        try:
            default = _literal(p["python_default"], what) if p["python_default"] else _parse_default(p["default"], t)
        except ValueError as e:
            raise RuntimeError(f"{what}: {e}") from e
        name = p["kvpress"] or ("compression_ratio" if p["name"] == "ratio" else p["name"])
        out.append(_Field(name, t, default, p["help"] or (_RATIO_HELP if p["name"] == "ratio" else ""),
                          param=p["name"]))
        add_extra(p["name"])
    add_extra("")
    seen = set()
    for f in out:
        if f.name in seen:
            raise RuntimeError(f"press {press}: class {cls_name} has two fields named {f.name}")
        seen.add(f.name)
    return out


def _check_value(cls: str, f: _Field, v) -> None:
    """Raises TypeError / ValueError naming the class and field when `v` is not a value of `f`."""
    if f.type == "press":
        if not isinstance(v, BasePress):
            raise TypeError(f"{cls}: {f.name} must be a press object (e.g. kvslim.SnapKVPress() or "
                            f"kvslim.Press('snapkv')), got {type(v).__name__} {v!r}")
        return
    if v is None and f.default is None:
        return
    if f.param == "ratio":
        _check_ratio(cls, v, f.name)
        return
    if f.type == "bool":
        if not (isinstance(v, bool) or (isinstance(v, int) and v in (0, 1))):
            raise TypeError(f"{cls}: {f.name} must be a bool, got {v!r}")
    elif f.type == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{cls}: {f.name} must be an int, got {v!r}")
    elif f.type == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{cls}: {f.name} must be a number, got {v!r}")
        if not math.isfinite(v):
            raise ValueError(f"{cls}: {f.name} must be finite, got {v!r}")
    elif f.type == "str":
        if not isinstance(v, (str, os.PathLike)):
            raise TypeError(f"{cls}: {f.name} must be a str, got {v!r}")
    elif f.type == "float_list":
        if isinstance(v, (str, bytes)) or not hasattr(v, "__iter__"):
            raise TypeError(f"{cls}: {f.name} must be a sequence of numbers, got {v!r}")
        for r in v:
            if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r):
                raise TypeError(f"{cls}: {f.name} must be a sequence of finite numbers, got {r!r} in it")


def _format(f: _Field, v) -> str:
    if f.type == "float":
        return repr(float(v))
    if f.type == "float_list":
        return "/".join(repr(float(r)) for r in v)
    if f.type == "str":
        return os.fspath(v)
    return _fmt(bool(v) if f.type == "bool" else v)


def _listed_params(spec: str) -> set:
    """The parameter names of the press whose ':' list ends `spec` (as the engine's parser reads a
    key after an inner spec: it goes to that press when the press has it); empty when none."""
    depth, start, colon = 0, 0, -1
    for i, c in enumerate(spec):
        depth += c == "("
        depth -= c == ")"
        if depth == 0 and c == "+" and i + 1 < len(spec) and (spec[i + 1].isalpha() or spec[i + 1] == "_"):
            start, colon = i + 1, -1
        elif depth == 0 and c == ":" and colon < 0:
            colon = i
    if colon < 0:
        return set()
    term = spec[start:]
    cut = min((k for k in (term.find("("), term.find(":")) if k >= 0), default=len(term))
    info = _REGISTRY.find(term[:cut].strip())
    if info is None:
        return set()
    names = set(info["params"]) | set(info["kvpress_params"])
    return names | ({"compression_ratio"} if "ratio" in info["params"] else set())


def _spec(self) -> str:
    cls = type(self)
    self.__post_init__()
    info = cls._kvslim_info
    values: Dict[str, Tuple[_Field, Any]] = {}
    by_param = {f.param: f for f in cls._kvslim_fields if f.param}
    policies = []
    for f in cls._kvslim_fields:
        v = getattr(self, f.name)
        if f.param and not f.inner:
            values.setdefault(f.param, (f, v))
        elif f.alias and v is not None:
            values[f.alias] = (by_param[f.alias], v)
        elif f.policy and v:
            policies.append(f.policy)
    items = []
    for f, v in values.values():
        if v is None or (f.type == "str" and v == "") or (f.param == "ratio" and not v):
            continue  # the engine's default (an unset ratio: the run's)
        if f.type == "float_list" and len(v) == 0:
            raise ValueError(f"{cls.__name__} needs {f.name} ({f.help})")
        items.append(f"{f.param}={_format(f, v)}")
    name = info["name"]
    if info["kind"] == "scorer":
        spec = name + (":" + ",".join(items) if items else "")
    else:
        inner_fields = [f for f in cls._kvslim_fields if f.inner]
        if inner_fields:
            inner_cls = globals()[_class_names(_REGISTRY.find(info["default_inner"]))[0]]
            inner = inner_cls(**{f.name: getattr(self, f.name) for f in inner_fields}).spec()
        else:
            inner = getattr(self, info["python"]["inner"]).spec()
        if not items:
            spec = f"{name}({inner})"
        elif items[0].partition("=")[0] in _listed_params(inner):
            spec = f"{name}({inner}):{','.join(items)}"  # inside, the key would go to the inner press
        else:
            spec = f"{name}({inner},{','.join(items)})"
    for p in policies:
        spec = f"{p}({spec})"
    return spec


def _post_init(self) -> None:
    cls = type(self)
    for f in cls._kvslim_fields:
        _check_value(cls.__name__, f, getattr(self, f.name))


def _fill(text: str, first: str = "", rest: str = "") -> str:
    return textwrap.fill(text, 100, initial_indent=first, subsequent_indent=rest, break_long_words=False,
                         break_on_hyphens=False)


def _doc(info: dict, cls_name: str, flds: List[_Field]) -> str:
    summary = info["summary"].strip().rstrip(".")
    paras = [summary[:1].upper() + summary[1:] + "."]
    if cls_name not in info["kvpress_classes"]:
        paras.append("kvslim's own class: kvpress has no such press.")
    source = info["source"].strip().rstrip(".")
    paras.append(f"kvslim press ``{info['name']}``" + ("" if source in ("", "-") else f"; {source}") + ".")
    doc = "\n\n".join(_fill(p) for p in paras)
    if flds:
        lines = ["Args:"]
        for f in flds:
            if f.type == "press":
                cls, kwargs = _inner_default(info["default_inner"])
                default = f"{cls}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
            else:
                default = repr(f.default)
            spec_key = f"; spec ``{f.param}``" if f.param and f.param != f.name else ""
            text = f"{f.name} ({f.annotation}, default {default}{spec_key})" + (": " + f.help if f.help else "")
            lines.append(_fill(text, "    ", "        "))
        doc += "\n\n" + "\n".join(lines)
    return doc


def _make_class(info: dict, cls_name: str) -> type:
    flds = _class_fields(info, cls_name)
    py = info["python"]
    inner_cls = _REGISTRY.find(info["default_inner"]) if py["inner_fields"] else None
    scorer = not py["base_press"] and (
        (info["kind"] == "scorer" and "ratio" in info["params"])
        or (inner_cls is not None and any(f.param == "ratio" for f in flds)))
    ns = {
        "__doc__": _doc(info, cls_name, flds),
        "__module__": __name__,
        "__post_init__": _post_init,
        "spec": _spec,
        "_kvslim_info": info,
        "_kvslim_fields": tuple(flds),
    }
    if info["kind"] != "scorer" and not py["inner_fields"]:
        inner = py["inner"]

        def compression_ratio(self) -> float:
            """The inner press's compression ratio."""
            press = getattr(self, inner)
            return press.ratio if isinstance(press, BasePress) else 0.0
        ns["compression_ratio"] = property(compression_ratio)
    spec = []
    for f in flds:
        default = field(default_factory=f.default) if f.type == "press" else field(default=f.default)
        spec.append((f.name, f.annotation, default))
    cls = dataclasses.make_dataclass(cls_name, spec, bases=(ScorerPress if scorer else BasePress,), namespace=ns)
    cls.__qualname__ = cls_name
    return cls


_REGISTRY = _Registry(_kvslim.presses())
_GENERATED: List[str] = []
for _info in _REGISTRY.infos.values():
    for _name in _class_names(_info):
        globals()[_name] = _make_class(_info, _name)
        _GENERATED.append(_name)
del _info, _name

__all__ = list(_MACHINERY) + sorted(_GENERATED)
