"""The public shape of kvslim's press classes, as data: what test_press_classes.py compares with the
reference in data/press_classes.json.

For every class of ``kvslim.presses.__all__``: its constructor signature (names, order, kinds,
defaults, annotations), docstring, bases, and for a fixed set of constructions (the defaults, each
parameter on its own at a value other than its default, all parameters given by position, and a
few bad inputs: an unknown keyword, a compression ratio out of range or of the wrong type, a
spec string where a press object belongs) the spec, ratio and repr of the object built, or the error raised.

    PYTHONPATH=build/python python3 python/tests/press_classes.py            # prints the description
    PYTHONPATH=build/python python3 python/tests/press_classes.py --write    # rewrites the reference

The reference records what the classes do; rewrite it only for a deliberate change of the classes'
public behaviour, and review its diff.
"""
import dataclasses
import inspect
import json
import os
import sys

REFERENCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "press_classes.json")

# A press value in a construction: {"press": class name, "args": [...], "kwargs": {...}}.
INNER = {"press": "SnapKVPress", "args": [], "kwargs": {"compression_ratio": 0.25, "window_size": 32}}
INNER_LIST = [{"press": "SnapKVPress", "args": [0.5], "kwargs": {}},
              {"press": "KnormPress", "args": [0.5], "kwargs": {}}]


def _default_repr(p: inspect.Parameter) -> str:
    return "<empty>" if p.default is inspect.Parameter.empty else repr(p.default)


def _annotation(p) -> str:
    a = p.annotation if isinstance(p, inspect.Parameter) else p
    if a is inspect.Parameter.empty or a is inspect.Signature.empty:
        return "<empty>"
    return a if isinstance(a, str) else inspect.formatannotation(a)


def _other_value(p: inspect.Parameter):
    """A value other than the parameter's default, of the type its annotation names."""
    ann, d = _annotation(p), p.default
    if p.name == "compression_ratio":
        return 0.25
    if "List[BasePress]" in ann or "list[BasePress]" in ann:
        return INNER_LIST
    if "BasePress" in ann:
        return INNER
    if "Sequence[float]" in ann or "List[float]" in ann:
        return [0.1, 0.5]
    if ann == "bool":
        return not d
    if "int" in ann:
        return 7 if d in (None, inspect.Parameter.empty) else 2 * d + 1
    if "float" in ann:
        return 0.5 if d in (None, inspect.Parameter.empty) else d + 0.25
    if "str" in ann:
        return f"{p.name}.bin"
    raise ValueError(f"no other value for {p.name}: {ann}")


def _build(value, P):
    if isinstance(value, dict) and "press" in value:
        return getattr(P, value["press"])(*[_build(a, P) for a in value["args"]],
                                          **{k: _build(v, P) for k, v in value["kwargs"].items()})
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [_build(v, P) for v in value]
    return value


def constructions(sig: inspect.Signature):
    """(label, args, kwargs) of the constructions recorded for a class with signature `sig`."""
    params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    out = [("defaults", [], {})]
    for p in params:
        out.append((f"{p.name}=other", [], {p.name: _other_value(p)}))
    if params:
        out.append(("all positional", [_other_value(p) for p in params], {}))
    out.append(("unknown keyword", [], {"bogus": 1}))
    for p in params:
        if _annotation(p) == "BasePress":
            out.append((f"{p.name}='snapkv'", [], {p.name: "snapkv"}))
    if "compression_ratio" in sig.parameters:
        out.append(("compression_ratio=1.5", [], {"compression_ratio": 1.5}))
        out.append(("compression_ratio='0.5'", [], {"compression_ratio": "0.5"}))
        out.append(("compression_ratio=press", [], {"compression_ratio": INNER}))
    return out


def _outcome(f):
    try:
        return {"value": f()}
    except Exception as e:  # noqa: BLE001 - the error is what is recorded
        return {"error": type(e).__name__, "message": str(e)}


def describe_class(P, name: str) -> dict:
    cls = getattr(P, name)
    sig = inspect.signature(cls)
    d = {
        "bases": [b.__name__ for b in cls.__mro__[1:] if b.__name__ in ("BasePress", "ScorerPress")],
        "is_dataclass": dataclasses.is_dataclass(cls),
        "doc": inspect.getdoc(cls),
        "signature": [{"name": p.name, "kind": p.kind.name, "default": _default_repr(p), "annotation": _annotation(p)}
                      for p in sig.parameters.values()],
        "constructions": [],
    }
    if name in ("BasePress", "ScorerPress"):
        return d
    for label, args, kwargs in constructions(sig):
        built = _outcome(lambda: cls(*[_build(a, P) for a in args], **{k: _build(v, P) for k, v in kwargs.items()}))
        rec = {"label": label, "args": args, "kwargs": kwargs}
        if "error" in built:
            rec["construct"] = built
        else:
            obj = built["value"]
            rec["spec"] = _outcome(obj.spec)
            rec["ratio"] = _outcome(lambda: obj.ratio)
            rec["repr"] = repr(obj)
        d["constructions"].append(rec)
    return d


def describe_all(names=None) -> dict:
    """The description of the classes `names` (default: all of kvslim.presses.__all__)."""
    from kvslim import presses as P
    names = list(P.__all__) if names is None else list(names)
    return {"__all__": list(P.__all__), "classes": {name: describe_class(P, name) for name in names}}


def main(argv):
    desc = describe_all()
    text = json.dumps(desc, indent=1, sort_keys=False) + "\n"
    if "--write" in argv:
        os.makedirs(os.path.dirname(REFERENCE), exist_ok=True)
        with open(REFERENCE, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {REFERENCE}")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv[1:])
