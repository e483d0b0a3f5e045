"""Press classes with kvpress's names and parameters, turned into kvslim press specs.

Each class mirrors the kvpress class of the same name (NVIDIA/kvpress, kvpress/presses/): the
same constructor parameters and defaults, so code written for kvpress runs with `import kvslim`
instead. ``spec()`` gives the kvslim press spec the engine runs (``kvslim presses`` lists them);
``compression_ratio`` is the fraction of context entries removed, as in kvpress.

Presses kvslim does not implement are not defined here (an ImportError is clearer than a press
that silently does something else). ``Press(spec)`` runs any kvslim spec directly.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import List, Optional, Sequence

__all__ = [
    "BasePress", "Press", "ScorerPress", "KnormPress", "RandomPress", "StreamingLLMPress", "SnapKVPress",
    "TOVAPress", "ObservedAttentionPress", "ExpectedAttentionPress", "KeyDiffPress", "KVzipPress", "PyramidKVPress",
    "AdaKVPress", "CriticalKVPress", "CriticalAdaKVPress", "ComposedPress", "KeyRerotationPress", "DecodingPress",
    "PerLayerCompressionPress", "DuoAttentionPress", "DMSPress", "KVzapPress", "H2OPress", "ClusterKVPress",
]


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _spec(name: str, **params) -> str:
    # An unset ratio (0) stays out of the spec, so the ratio given with the run (the pipeline's
    # press ratio, an eval's ratios) fills it, as `--compression-ratio` does on the command line.
    if not params.get("ratio"):
        params.pop("ratio", None)
    items = [f"{k}={_fmt(v)}" for k, v in params.items() if v is not None]
    return name + (":" + ",".join(items) if items else "")


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


def _check_ratio(cls: str, r) -> None:
    """Raises TypeError (not a number) or ValueError (outside [0, 1)) naming the class ``cls``."""
    if isinstance(r, BasePress):
        raise TypeError(f"{cls}: compression_ratio must be a number, got the press {type(r).__name__}; "
                        f"{cls} is a scorer press, not a wrapper: write {cls}(compression_ratio=0.5)")
    if isinstance(r, bool) or not isinstance(r, (int, float)):
        raise TypeError(f"{cls}: compression_ratio must be a number in [0, 1), got {r!r}")
    if not 0.0 <= float(r) < 1.0:
        raise ValueError(f"{cls}: compression_ratio must be in [0, 1) (the fraction of entries removed), got {r!r}")


def kvpress_class(name: str, info: dict) -> type:
    """A press class named as kvpress's ``name`` for an engine press without a hand-written class
    here (``info``: its entry in ``kvslim.available_presses()``). Parameters are keywords, with
    kvpress's names (or kvslim's); a policy or wrapper takes its inner press first (or as
    ``press=``), a scorer may take ``compression_ratio`` first. Unknown parameters raise TypeError."""
    takes_inner = info["kind"] in ("policy", "wrapper")
    allowed = set(info["params"]) | set(info.get("kvpress_params", {}))
    if "ratio" in info["params"]:
        allowed.add("compression_ratio")

    def __init__(self, *args, **kwargs):
        args = list(args)
        inner = kwargs.pop("press", None) if takes_inner else None
        if takes_inner and inner is None and args and isinstance(args[0], BasePress):
            inner = args.pop(0)
        if inner is not None and not isinstance(inner, BasePress):
            raise TypeError(f"{name} expects a press object, got {type(inner).__name__}")
        if args:
            if len(args) > 1 or "compression_ratio" in kwargs or "compression_ratio" not in allowed:
                raise TypeError(f"{name} takes keyword arguments ({', '.join(sorted(allowed)) or 'none'})")
            kwargs["compression_ratio"] = args[0]
        for k in kwargs:
            if k not in allowed:
                raise TypeError(f"{name}: unknown parameter {k!r} (parameters: {', '.join(sorted(allowed)) or 'none'})")
        if "compression_ratio" in kwargs:
            _check_ratio(name, kwargs["compression_ratio"])
        self.press, self.params = inner, kwargs

    def spec(self) -> str:
        items = ",".join(f"{k}={_fmt(v)}" for k, v in self.params.items()
                         if not (k == "compression_ratio" and not v))
        if takes_inner:
            inner = self.press.spec() if self.press is not None else info["default_inner"]
            return f"{name}({inner}{',' if inner and items else ''}{items})"
        return name + (":" + items if items else "")

    def compression_ratio(self) -> float:
        if "compression_ratio" in self.params:
            return float(self.params["compression_ratio"])
        return self.press.ratio if self.press is not None else 0.0

    def __repr__(self) -> str:
        inner = [repr(self.press)] if self.press is not None else []
        return f"{name}({', '.join(inner + [f'{k}={v!r}' for k, v in self.params.items()])})"

    doc = f"{info['summary']}\n\nSource: {info['source']}"
    return type(name, (BasePress,), {"__init__": __init__, "spec": spec, "__repr__": __repr__, "__doc__": doc,
                                     "compression_ratio": property(compression_ratio)})


@dataclass
class Press(BasePress):
    """Any kvslim press spec, e.g. ``Press("adakv(snapkv:window=32)", compression_ratio=0.5)``."""

    press_spec: str = "none"
    compression_ratio: float = 0.0

    def spec(self) -> str:
        return self.press_spec


class ScorerPress(BasePress):
    """Base of presses that score entries and keep the best (kvpress's ScorerPress)."""


@dataclass
class KnormPress(ScorerPress):
    """Evicts the keys with the largest L2 norm (Devoto et al. 2024, arXiv 2406.11430)."""

    compression_ratio: float = 0.0

    def spec(self) -> str:
        return _spec("knorm", ratio=self.compression_ratio)


@dataclass
class RandomPress(ScorerPress):
    """Random scores (baseline); ``seed=None`` uses kvslim's fixed default seed (kvslim is deterministic)."""

    compression_ratio: float = 0.0
    seed: Optional[int] = None

    def spec(self) -> str:
        return _spec("random", ratio=self.compression_ratio, seed=self.seed)


@dataclass
class StreamingLLMPress(ScorerPress):
    """Attention sinks + most recent entries (Xiao et al. 2023, arXiv 2309.17453)."""

    compression_ratio: float = 0.0
    n_sink: int = 4

    def spec(self) -> str:
        return _spec("streaming_llm", ratio=self.compression_ratio, n_sink=self.n_sink)


@dataclass
class SnapKVPress(ScorerPress):
    """Observation-window attention, pooled (Li et al. 2024, arXiv 2404.14469)."""

    compression_ratio: float = 0.0
    window_size: int = 64
    kernel_size: int = 5

    def spec(self) -> str:
        return _spec("snapkv", ratio=self.compression_ratio, window=self.window_size, kernel=self.kernel_size)


@dataclass
class TOVAPress(ScorerPress):
    """Attention of the newest token (Oren et al. 2024, arXiv 2401.06104)."""

    compression_ratio: float = 0.0

    def spec(self) -> str:
        return _spec("tova", ratio=self.compression_ratio)


@dataclass
class ObservedAttentionPress(ScorerPress):
    """Mean attention received; ``output_attentions`` is accepted for kvpress compatibility and unused."""

    compression_ratio: float = 0.0
    output_attentions: bool = False

    def spec(self) -> str:
        return _spec("observed_attention", ratio=self.compression_ratio)


@dataclass
class H2OPress(ScorerPress):
    """Heavy hitters + a recent window (Zhang et al. 2023, arXiv 2306.14048); not in kvpress."""

    compression_ratio: float = 0.0
    recent: int = 16

    def spec(self) -> str:
        return _spec("h2o", ratio=self.compression_ratio, recent=self.recent)


@dataclass
class ExpectedAttentionPress(ScorerPress):
    """Expected attention of future queries x value norm (Devoto, Jeblick, Jegou 2025, arXiv 2510.00636)."""

    compression_ratio: float = 0.0
    n_future_positions: int = 512
    n_sink: int = 4
    use_covariance: bool = True
    use_vnorm: bool = True
    epsilon: float = 0.0

    def spec(self) -> str:
        return _spec("expected_attention", ratio=self.compression_ratio, n_future=self.n_future_positions,
                     n_sink=self.n_sink, covariance=self.use_covariance, vnorm=self.use_vnorm, epsilon=self.epsilon)


@dataclass
class KeyDiffPress(ScorerPress):
    """Evicts keys most similar to the mean key direction (Park et al. 2025, arXiv 2504.15364)."""

    compression_ratio: float = 0.0

    def spec(self) -> str:
        return _spec("keydiff", ratio=self.compression_ratio)


@dataclass
class KVzipPress(BasePress):
    """Context-reconstruction scores (Kim et al. 2025, arXiv 2505.23416). ``layerwise=True``: the same
    ratio in every layer (kvslim's uniform policy) instead of one top-k over all layers."""

    compression_ratio: float = 0.0
    layerwise: bool = False
    n_sink: int = 4

    def spec(self) -> str:
        inner = _spec("kvzip", ratio=self.compression_ratio, n_sink=self.n_sink)
        return f"uniform({inner})" if self.layerwise else inner


@dataclass
class PyramidKVPress(ScorerPress):
    """SnapKV scores with per-layer budgets linear in depth (Cai et al. 2024, arXiv 2406.02069)."""

    compression_ratio: float = 0.0
    window_size: int = 64
    kernel_size: int = 5
    beta: int = 20

    def spec(self) -> str:
        inner = _spec("snapkv", ratio=self.compression_ratio, window=self.window_size, kernel=self.kernel_size)
        return f"pyramidkv({inner},beta={self.beta})"


# Policies and wrappers put their own parameters inside the parentheses, after the inner spec
# ("adakv(snapkv:window=32,alpha=0.3)"): the first key the inner press does not have and all later
# ones go to the outer press, which nests to any depth.
def _inner(press: BasePress, what: str) -> str:
    if not isinstance(press, BasePress):
        raise TypeError(f"{what} expects a press object, got {type(press).__name__}")
    return press.spec()


@dataclass
class AdaKVPress(BasePress):
    """Head-adaptive budgets over a scorer press (Feng et al. 2024, arXiv 2407.11550)."""

    press: BasePress = field(default_factory=SnapKVPress)
    alpha_safeguard: float = 0.20

    def spec(self) -> str:
        return f"adakv({_inner(self.press, 'AdaKVPress')},alpha={_fmt(self.alpha_safeguard)})"

    @property
    def compression_ratio(self) -> float:
        return self.press.ratio


@dataclass
class CriticalKVPress(BasePress):
    """Two-stage selection reweighted by ||W_o v|| (Feng et al. 2025, arXiv 2502.03805)."""

    press: BasePress = field(default_factory=SnapKVPress)
    epsilon: float = 1e-4
    first_stage_ratio: float = 0.5

    def spec(self) -> str:
        return (f"criticalkv({_inner(self.press, 'CriticalKVPress')},epsilon={_fmt(self.epsilon)},"
                f"first_stage={_fmt(self.first_stage_ratio)})")

    @property
    def compression_ratio(self) -> float:
        return self.press.ratio


@dataclass
class CriticalAdaKVPress(BasePress):
    """CriticalKV's selection with AdaKV's head-adaptive budgets."""

    press: BasePress = field(default_factory=SnapKVPress)
    alpha_safeguard: float = 0.20
    epsilon: float = 1e-4
    first_stage_ratio: float = 0.5

    def spec(self) -> str:
        crit = CriticalKVPress(self.press, self.epsilon, self.first_stage_ratio).spec()
        return f"adakv({crit},alpha={_fmt(self.alpha_safeguard)})"

    @property
    def compression_ratio(self) -> float:
        return self.press.ratio


@dataclass
class ComposedPress(BasePress):
    """Presses applied in order, each to what the previous left (kept fractions multiply)."""

    presses: List[BasePress] = field(default_factory=list)

    def spec(self) -> str:
        if not self.presses:
            raise ValueError("ComposedPress needs at least one press")
        return "+".join(_inner(p, "ComposedPress") for p in self.presses)

    @property
    def compression_ratio(self) -> float:
        kept = 1.0
        for p in self.presses:
            kept *= 1.0 - p.ratio
        return 1.0 - kept


@dataclass
class KeyRerotationPress(BasePress):
    """Re-rotates kept keys to contiguous positions after eviction."""

    press: BasePress = field(default_factory=StreamingLLMPress)

    def spec(self) -> str:
        return f"key_rerotation({_inner(self.press, 'KeyRerotationPress')})"

    @property
    def compression_ratio(self) -> float:
        return self.press.ratio


@dataclass
class DecodingPress(BasePress):
    """Compresses during decoding: every ``compression_interval`` tokens down to ``target_size``
    entries per KV head, with kvpress's current names and defaults (kvpress/presses/decoding_press.py:
    512 and 2048, as the CLI's ``decoding``); older kvpress named these ``compression_steps`` and
    ``token_buffer_size``, accepted too (they win when given)."""

    base_press: BasePress = field(default_factory=KnormPress)
    compression_interval: int = 512
    target_size: int = 2048
    compression_steps: Optional[int] = None
    token_buffer_size: Optional[int] = None

    def spec(self) -> str:
        steps = self.compression_steps if self.compression_steps is not None else self.compression_interval
        size = self.token_buffer_size if self.token_buffer_size is not None else self.target_size
        return f"decoding({_inner(self.base_press, 'DecodingPress')},interval={steps},size={size})"

    @property
    def compression_ratio(self) -> float:
        return self.base_press.ratio


@dataclass
class PerLayerCompressionPress(BasePress):
    """One compression ratio per layer over a scorer press."""

    press: BasePress = field(default_factory=KnormPress)
    compression_ratios: Sequence[float] = ()

    def spec(self) -> str:
        if not self.compression_ratios:
            raise ValueError("PerLayerCompressionPress needs compression_ratios, one per layer")
        ratios = "/".join(_fmt(float(r)) for r in self.compression_ratios)
        return f"per_layer({_inner(self.press, 'PerLayerCompressionPress')},ratios={ratios})"


@dataclass
class DuoAttentionPress(BasePress):
    """Retrieval heads keep everything, streaming heads keep sinks + recent (Xiao et al. 2024,
    arXiv 2410.10819). ``head_compression_ratio``: the fraction of heads made streaming."""

    head_compression_ratio: float = 0.0
    labels: str = ""

    def spec(self) -> str:
        return _spec("duo_attention", head_ratio=self.head_compression_ratio, labels=self.labels or None)


@dataclass
class DMSPress(BasePress):
    """Threshold eviction outside a sliding window (Lancucki et al. 2025, arXiv 2506.05345):
    entries the inner press scores below ``threshold`` leave; ``decoding=True`` also acts while
    generating."""

    press: BasePress = field(default_factory=KnormPress)
    threshold: float = 0.0
    sliding_window_size: int = 128
    decoding: bool = False

    def spec(self) -> str:
        return (f"threshold({_inner(self.press, 'DMSPress')},tau={_fmt(float(self.threshold))},"
                f"window={self.sliding_window_size},decode={1 if self.decoding else 0})")


@dataclass
class KVzapPress(BasePress):
    """Surrogate-predicted KVzip+ scores with threshold eviction (Jegou et al. 2026, arXiv 2601.07891).
    ``surrogate``: a file from ``kvslim kvzap-train``."""

    surrogate: str = ""
    threshold: float = -4.0
    sliding_window_size: int = 128
    decoding: bool = True

    def spec(self) -> str:
        return _spec("kvzap", surrogate=self.surrogate or None, threshold=float(self.threshold),
                     window=self.sliding_window_size, decoding=self.decoding)


@dataclass
class ClusterKVPress(BasePress):
    """Decode-time attention over whole key clusters, nothing evicted (Liu et al. 2024, arXiv 2412.03213)."""

    compression_ratio: float = 0.0
    budget: int = 0

    def spec(self) -> str:
        return _spec("clusterkv", ratio=self.compression_ratio, budget=self.budget)
