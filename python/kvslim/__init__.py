"""kvslim from Python: a kvpress-style pipeline over the kvslim engine (GGUF models, CPU).

    import kvslim
    pipe = kvslim.pipeline("kv-press-text-generation", model="models/stories260K.gguf")  # a GGUF file
    out = pipe(context, question=" What happened next?", press=kvslim.SnapKVPress(compression_ratio=0.5))
    out["answer"], out["stats"]["memory_ratio"]

As in kvpress, the context is compressed by the press and the question is appended afterwards,
never compressed. Unlike kvpress, the answer comes with what was measured from the cache
(entries kept per layer, bytes, compression and memory ratio, timings). ``kvslim.eval`` runs the
evaluation sweeps (fidelity, needle in a haystack, RULER-style tasks).
"""
from __future__ import annotations

import os
import warnings
from typing import Dict, List, Optional, Sequence, Union

from . import _kvslim
from ._kvslim import KvslimError, Model
from .presses import *  # noqa: F401,F403  (the press classes are the package's API)
from .presses import BasePress, Press, __all__ as _press_names
from . import eval  # noqa: E402  (kvslim.eval.niah / ruler / fidelity)

__version__ = _kvslim.__version__

__all__ = ["pipeline", "KVPressTextGenerationPipeline", "Model", "Context", "KvslimError", "available_presses",
           "set_threads", "eval", "bundled_model", "ModelFileError"] + list(_press_names)


class ModelFileError(KvslimError, FileNotFoundError):
    """A model that is not a file: a KvslimError like the engine's other errors, and a FileNotFoundError."""


def bundled_model() -> str:
    """Path of the small story model shipped inside the package (stories260K, 1.2 MB GGUF), the
    pipeline's default model. Raises ModelFileError when the package was installed without it."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", "stories260K.gguf")
    if not os.path.isfile(path):
        raise ModelFileError(f"the bundled model {path} is missing: this kvslim package was installed without "
                             "its package data; pass model=<path of a .gguf file>")
    return path


def _model_file(model: str) -> str:
    # A transformers script passes a Hugging Face model id ("meta-llama/Llama-3.2-1B") where kvslim
    # needs a file: say what kvslim reads and how to get one instead of a bare "cannot open".
    if os.path.isfile(model):
        return model
    looks_like_id = not os.path.isabs(model) and not model.endswith(".gguf") and model.count("/") == 1
    what = "a model id, not a file" if looks_like_id else "not a file"
    raise ModelFileError(
        f"model '{model}' is {what}: kvslim reads GGUF model files (llama.cpp's format) from disk and downloads "
        "nothing. Pass the path of a .gguf file: download one (Hugging Face repositories named ...-GGUF hold "
        "them, e.g. `huggingface-cli download <repo> <file>.gguf`) or convert a transformers checkpoint with "
        "llama.cpp's convert_hf_to_gguf.py; model=None runs the bundled story model.")


def __getattr__(name: str):
    # A kvpress press kvslim does not have: say which it has.
    raise AttributeError(f"module 'kvslim' has no attribute {name!r} (kvpress presses kvslim has: "
                         f"{', '.join(sorted(c for i in _kvslim.presses() for c in i['kvpress_classes']))})")


def available_presses() -> List[dict]:
    """Every press, budget policy and wrapper the engine has, with parameters, defaults and paper."""
    return _kvslim.presses()


def set_threads(n: int) -> None:
    """Threads the engine uses (>= 1). Set it before loading a model: the loader lays the weights out
    for the thread count in use (one run of memory per thread for decode); with another count decode
    still runs, at the speed of the one-matrix-after-the-other layout."""
    _kvslim.set_threads(int(n))


def _press_of(press: Union[None, str, BasePress]) -> BasePress:
    if press is None:
        return Press("none")
    if isinstance(press, str):
        return Press(press)
    if not isinstance(press, BasePress):
        raise TypeError(f"press must be a kvslim press or a spec string, got {type(press).__name__}")
    return press


class Context:
    """A context compressed once and stored: questions are answered from it without prefilling it again.

        ctx = kvslim.Context.build(model, text, press=kvslim.SnapKVPress(compression_ratio=0.5))
        ctx.save("doc.kvc")
        ctx = kvslim.Context.load(model, "doc.kvc")
        pipe(ctx, questions=[" Who?", " Where?"])

    The context is compressed exactly as ``pipe(text, question=...)`` compresses it before the
    question, so answers are token for token the same. Presses that keep state for decode (H2O,
    decoding(...), ...) cannot be stored and raise KvslimError saying why.
    """

    def __init__(self, model: Model, handle):
        self.model = model
        self._handle = handle

    @classmethod
    def build(cls, model: Union[str, Model], text: str, press: Union[None, str, BasePress] = None,
              chunk_size: int = 0, n_ctx: int = 0, cache_type_k: str = "f16",
              cache_type_v: str = "f16") -> "Context":
        m = model if isinstance(model, Model) else Model(str(model))
        p = _press_of(press)
        return cls(m, _kvslim.Context.build(m, text, p.spec(), p.ratio, int(chunk_size), int(n_ctx), cache_type_k,
                                            cache_type_v))

    @classmethod
    def load(cls, model: Union[str, Model], path: str) -> "Context":
        """Reads a file written by save() or ``kvslim context build``; KvslimError names what is wrong
        (another model, another format version, a truncated or corrupted file)."""
        m = model if isinstance(model, Model) else Model(str(model))
        return cls(m, _kvslim.Context.load(m, str(path)))

    def save(self, path: str) -> None:
        """Writes the context atomically (a temporary file renamed over `path`)."""
        self._handle.save(str(path))

    @property
    def info(self) -> Dict:
        """Tokens, press, entries, bytes, memory ratio, file bytes and the model fingerprint."""
        return self._handle.info()

    @property
    def tokens(self) -> List[int]:
        return self._handle.tokens

    @property
    def text(self) -> str:
        return self._handle.text


class KVPressTextGenerationPipeline:
    """Context + question -> answer, with the context's KV cache compressed by a press.

    Mirrors kvpress's pipeline call: ``pipe(context, question=..., questions=[...], press=...,
    max_new_tokens=..., answer_prefix=...)`` returns ``{"answer": str}`` (or ``{"answers": [...]}``
    for several questions), plus ``"stats"`` (one dict per question): what the cache held after
    compression, measured. Generation is greedy unless ``temperature`` > 0.
    """

    def __init__(self, model: Union[str, Model], threads: Optional[int] = None, n_ctx: int = 0,
                 cache_type_k: str = "f16", cache_type_v: str = "f16", chunk_size: int = 0):
        # Threads first: a model loaded here lays its weights out for the thread count at load time.
        if threads is not None:
            set_threads(threads)
        self.model = model if isinstance(model, Model) else Model(_model_file(str(model)))
        self.n_ctx = n_ctx
        self.cache_type_k = cache_type_k
        self.cache_type_v = cache_type_v
        self.chunk_size = chunk_size

    def __call__(self, context: Union[str, "Context"], question: str = "", questions: Optional[Sequence[str]] = None,
                 press: Union[None, str, BasePress] = None, max_new_tokens: int = 50, answer_prefix: str = "",
                 temperature: float = 0.0, top_k: int = 40, top_p: float = 0.95, seed: int = 0,
                 **unsupported) -> Dict:
        if unsupported:
            raise TypeError(f"unsupported argument(s): {', '.join(sorted(unsupported))}")
        asked = list(questions) if questions is not None else [question]
        answers, stats = [], []
        stored = context if isinstance(context, Context) else None
        if stored is not None and press is not None:
            raise TypeError("a stored Context was compressed when it was built: give no press")
        if stored is None:
            p = _press_of(press)
            spec, ratio = p.spec(), p.ratio
            # Several questions about one context: compress it once (when the press can be stored)
            # and answer each from the stored cache, token for token as compressing it each time.
            if len(asked) > 1 and not _kvslim.storage_refusal(spec, ratio):
                stored = Context.build(self.model, context, p, self.chunk_size, self.n_ctx, self.cache_type_k,
                                       self.cache_type_v)
        if stored is not None:
            for q in asked:
                r = _kvslim.run_context(self.model, stored._handle, q + answer_prefix, int(max_new_tokens),
                                        float(temperature), int(top_k), float(top_p), int(seed), int(self.n_ctx))
                answers.append(r["answer"])
                stats.append(r["stats"])
            if questions is not None:
                return {"answers": answers, "stats": stats}
            return {"answer": answers[0], "stats": stats[0]}
        for q in asked:
            # Each question gets the same compressed context (the press sees only the context).
            r = _kvslim.run(self.model, context, q + answer_prefix, spec, ratio, int(max_new_tokens),
                            float(temperature), int(top_k), float(top_p), int(seed), int(self.chunk_size),
                            int(self.n_ctx), self.cache_type_k, self.cache_type_v)
            answers.append(r["answer"])
            stats.append(r["stats"])
        if questions is not None:
            return {"answers": answers, "stats": stats}
        return {"answer": answers[0], "stats": stats[0]}


def pipeline(task: str = "kv-press-text-generation", model: Union[None, str, Model] = None,
             **kwargs) -> KVPressTextGenerationPipeline:
    """kvpress's ``pipeline("kv-press-text-generation", model=...)`` with a GGUF file as the model
    (None: the bundled story model, ``bundled_model()``); a path that is not a file, such as a Hugging
    Face model id, raises ModelFileError (a KvslimError and FileNotFoundError) saying how to get a GGUF file.
    Keyword arguments: threads, n_ctx, cache_type_k, cache_type_v, chunk_size; ``device`` and
    ``model_kwargs`` (transformers arguments) are accepted and ignored: kvslim runs on the CPU. A
    ``device`` other than "cpu" (e.g. "cuda:0" in a kvpress script) gives a UserWarning saying so,
    so a script does not believe it ran on a GPU."""
    if task != "kv-press-text-generation":
        raise ValueError(f"task '{task}' is not supported (only 'kv-press-text-generation')")
    device = kwargs.pop("device", None)
    if device is not None and str(device) != "cpu":
        warnings.warn(f"kvslim runs on the CPU: device={device!r} is ignored", UserWarning, stacklevel=2)
    kwargs.pop("model_kwargs", None)
    kwargs.pop("torch_dtype", None)
    return KVPressTextGenerationPipeline(bundled_model() if model is None else model, **kwargs)
