"""Evaluation sweeps from Python: the same runs, records and results directory as ``kvslim eval``.

    res = kvslim.eval.niah("models/retrieval.gguf", presses=[kvslim.SnapKVPress(), "streaming_llm"],
                           ratios=[0.5, 0.9], lengths=[512], text_config="models/retrieval.tasks.json",
                           out="eval-out/niah")
    res.summary      # rows of summary.json: score and 95% interval, measured ratios, per press and ratio
    res.records      # one dict per run (samples.jsonl), res.warnings, res.files

Presses are kvslim press objects (their spec; the ratio comes from ``ratios``) or spec strings.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Union

from . import _kvslim
from .presses import BasePress

__all__ = ["EvalResult", "fidelity", "niah", "ruler"]


@dataclass
class EvalResult:
    """What a sweep produced; ``out`` is its results directory (samples.jsonl, summary.csv/json, plots)."""

    out: str
    run: dict = field(default_factory=dict)
    records: List[dict] = field(default_factory=list)
    summary: List[dict] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    files: List[str] = field(default_factory=list)
    plot_problem: str = ""


def _model(model) -> "_kvslim.Model":
    return model if isinstance(model, _kvslim.Model) else _kvslim.Model(str(model))


def _specs(presses: Sequence[Union[str, BasePress]]) -> List[str]:
    out = []
    for p in presses:
        if isinstance(p, BasePress):
            out.append(p.spec())
        elif isinstance(p, str):
            out.append(p)
        else:
            raise TypeError(f"a press must be a kvslim press or a spec string, got {type(p).__name__}")
    return out


def _sweep(kind: str, model, presses, ratios, baseline, samples, seed, out, plots, plot_format, tasks=(),
           lengths=(), depths=(), text_config="", n_predict=0, context_tokens=256, continuation_tokens=128,
           chunk_size=0, n_ctx=0, cache_type_k="f16", cache_type_v="f16") -> EvalResult:
    jsonl = _kvslim.sweep(_model(model), kind, _specs(presses), [float(r) for r in ratios], bool(baseline),
                          int(samples), int(seed), list(tasks), [int(x) for x in lengths],
                          [float(d) for d in depths], str(text_config or ""), int(n_predict), int(context_tokens),
                          int(continuation_tokens), int(chunk_size), int(n_ctx), cache_type_k, cache_type_v)
    rep = _kvslim.write_results(jsonl, out, plot_format, bool(plots))
    lines = [json.loads(line) for line in jsonl.splitlines() if line]
    with open(os.path.join(out, "summary.json"), encoding="utf-8") as f:
        summary = json.load(f)
    return EvalResult(out=out, run=lines[0], records=lines[1:], summary=summary["summary"],
                      warnings=list(rep["warnings"]), files=list(rep["files"]), plot_problem=rep["plot_problem"])


def niah(model, presses=("streaming_llm", "knorm", "snapkv"), ratios=(0.5, 0.75, 0.9), lengths=(256, 512, 1024),
         depths=(0.0, 0.25, 0.5, 0.75, 1.0), samples: int = 2, seed: int = 1234, text_config: str = "",
         n_predict: int = 0, baseline: bool = True, out: str = "eval-out/niah", plots: bool = True,
         plot_format: str = "svg", **cache) -> EvalResult:
    """Needle in a haystack over lengths x depths x samples, every press at every ratio (``kvslim eval niah``)."""
    return _sweep("niah", model, presses, ratios, baseline, samples, seed, out, plots, plot_format, lengths=lengths,
                  depths=depths, text_config=text_config, n_predict=n_predict, **cache)


def ruler(model, tasks=("niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe"),
          presses=("streaming_llm", "knorm", "snapkv"), ratios=(0.5, 0.75, 0.9), lengths=(512, 1024),
          depths: Sequence[float] = (), samples: int = 4, seed: int = 1234, text_config: str = "",
          n_predict: int = 0, baseline: bool = True, out: str = "eval-out/ruler", plots: bool = True,
          plot_format: str = "svg", **cache) -> EvalResult:
    """RULER-style synthetic tasks (``kvslim eval ruler``)."""
    return _sweep("ruler", model, presses, ratios, baseline, samples, seed, out, plots, plot_format, tasks=tasks,
                  lengths=lengths, depths=depths, text_config=text_config, n_predict=n_predict, **cache)


def fidelity(model, presses=("streaming_llm", "knorm", "snapkv"), ratios=(0.5, 0.75, 0.9), context_tokens: int = 256,
             continuation_tokens: int = 128, samples: int = 4, seed: int = 1234, baseline: bool = True,
             out: str = "eval-out/fidelity", plots: bool = True, plot_format: str = "svg", **cache) -> EvalResult:
    """Full against compressed cache over text sampled from the model: KL, top-1 agreement, perplexity
    (``kvslim eval fidelity``)."""
    return _sweep("fidelity", model, presses, ratios, baseline, samples, seed, out, plots, plot_format,
                  context_tokens=context_tokens, continuation_tokens=continuation_tokens, **cache)
