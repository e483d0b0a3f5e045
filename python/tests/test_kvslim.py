"""The kvslim Python package: kvpress-style pipeline and presses, measured statistics, eval, install.

Run by ctest (python_pytest) with PYTHONPATH=build/python; from a checkout:
    PYTHONPATH=build/python python3 -m pytest -q python/tests
"""
import dataclasses
import math
import os
import subprocess
import sys

import pytest

import kvslim
from kvslim import presses as P

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STORIES = os.path.join(ROOT, "models", "stories260K.gguf")
RETRIEVAL = os.path.join(ROOT, "models", "retrieval.gguf")
RETRIEVAL_TEXT = os.path.join(ROOT, "models", "retrieval.tasks.json")
STORY = open(os.path.join(ROOT, "models", "story.txt"), encoding="utf-8").read()


@pytest.fixture(scope="module")
def pipe():
    return kvslim.pipeline("kv-press-text-generation", model=STORIES, threads=2)


def test_press_classes_make_the_specs_kvpress_parameters_mean():
    # Hand-written expectations: kvpress's parameter names mapped onto kvslim's spec syntax.
    assert P.SnapKVPress(compression_ratio=0.5).spec() == "snapkv:ratio=0.5,window=64,kernel=5"
    assert P.SnapKVPress(0.25, window_size=32, kernel_size=7).spec() == "snapkv:ratio=0.25,window=32,kernel=7"
    assert P.StreamingLLMPress(0.5, n_sink=8).spec() == "streaming_llm:ratio=0.5,n_sink=8"
    assert P.KnormPress(0.3).spec() == "knorm:ratio=0.3"
    assert P.KnormPress().spec() == "knorm"  # ratio left to the run (pipeline ratio, eval ratios)
    assert (P.ExpectedAttentionPress(0.5, use_covariance=False).spec() ==
            "expected_attention:ratio=0.5,n_future=512,n_sink=4,covariance=0,vnorm=1,epsilon=0.0")
    assert P.KVzipPress(0.5).spec() == "kvzip:ratio=0.5,n_sink=4"
    assert P.KVzipPress(0.5, layerwise=True).spec() == "uniform(kvzip:ratio=0.5,n_sink=4)"
    assert (P.AdaKVPress(P.SnapKVPress(0.5), alpha_safeguard=0.3).spec() ==
            "adakv(snapkv:ratio=0.5,window=64,kernel=5,alpha=0.3)")
    assert P.AdaKVPress(P.SnapKVPress(0.5)).compression_ratio == 0.5
    assert P.PyramidKVPress(0.5).spec() == "pyramidkv(snapkv:ratio=0.5,window=64,kernel=5,beta=20)"
    assert P.ComposedPress([P.SnapKVPress(0.5), P.KnormPress(0.5)]).compression_ratio == 0.75
    assert (P.DecodingPress(P.KnormPress(), compression_steps=4, token_buffer_size=32).spec() ==
            "decoding(knorm,interval=4,size=32)")
    assert (P.DecodingPress(P.KnormPress(), compression_interval=2, target_size=16).spec() ==
            "decoding(knorm,interval=2,size=16)")
    assert (P.PerLayerCompressionPress(P.KnormPress(), [0.1, 0.5]).spec() ==
            "per_layer(knorm,ratios=0.1/0.5)")
    assert (P.DMSPress(P.KnormPress(), threshold=-2, sliding_window_size=16).spec() ==
            "threshold(knorm,tau=-2.0,window=16,decode=0)")
    assert (P.CriticalAdaKVPress(P.SnapKVPress(window_size=32), epsilon=0.01, first_stage_ratio=0.3).spec() ==
            "critical_adakv(snapkv:window=32,kernel=5,alpha=0.2,epsilon=0.01,first_stage=0.3)")
    # A wrapper's first parameter that its inner press also has goes after the parentheses, where
    # the engine gives it to the wrapper (inside, it would go to the inner press).
    assert (P.CriticalKVPress(P.ExpectedAttentionPress(epsilon=0.5), epsilon=0.01).spec() ==
            "criticalkv(expected_attention:n_future=512,n_sink=4,covariance=1,vnorm=1,epsilon=0.5)"
            ":epsilon=0.01,first_stage=0.5")
    with pytest.raises(TypeError):
        P.AdaKVPress("snapkv").spec()
    # kvpress's current DecodingPress defaults (decoding_press.py: compression_interval 512,
    # target_size 2048), the CLI's `decoding` defaults too.
    assert P.DecodingPress(P.KnormPress()).spec() == "decoding(knorm,interval=512,size=2048)"


def test_a_bad_compression_ratio_fails_when_the_press_is_built():
    # Regression: PyramidKVPress(SnapKVPress(...)) built "pyramidkv(snapkv:ratio=snapkv:ratio=...)"
    # and failed only when run, with an unrelated TypeError; a ratio of 1.5 was accepted.
    with pytest.raises(TypeError, match="PyramidKVPress: compression_ratio must be a number, got the press"):
        P.PyramidKVPress(P.SnapKVPress(compression_ratio=0.5))
    with pytest.raises(ValueError, match=r"SnapKVPress: compression_ratio must be in \[0, 1\)"):
        P.SnapKVPress(compression_ratio=1.5)
    with pytest.raises(ValueError):
        P.KnormPress(-0.1)
    with pytest.raises(TypeError):
        P.KnormPress("0.5")
    assert P.KnormPress(0).spec() == "knorm"
    assert P.PyramidKVPress(0.5).compression_ratio == 0.5


def test_nested_parameters_reach_the_press_they_belong_to():
    # The engine's own description names every parameter where it landed.
    d = kvslim._kvslim.check_press(
        P.CriticalAdaKVPress(P.SnapKVPress(window_size=32), alpha_safeguard=0.25, epsilon=0.01,
                             first_stage_ratio=0.3).spec(), 0.5)
    assert d.startswith("critical_adakv(snapkv:ratio=0.5,window=32,") and d.endswith(
        "):alpha=0.25,epsilon=0.01,first_stage=0.3")
    d = kvslim._kvslim.check_press(P.CriticalKVPress(P.ExpectedAttentionPress(epsilon=0.5), epsilon=0.01).spec(), 0.5)
    assert "epsilon=0.5," in d.split(")")[0] and d.split(")")[1].startswith(":epsilon=0.01,")
    d = kvslim._kvslim.check_press(P.DMSPress(P.SnapKVPress(window_size=8), threshold=-1, sliding_window_size=16).spec(),
                                   0.0)
    assert "window=8" in d.split(")")[0] and "window=16" in d.split(")")[1]


# Presses that need a file, and the field naming it.
FILE_FIELDS = {"KVzapPress": "surrogate", "QFilterPress": "filters", "RestoreKVPress": "file", "LUKVPress": "curve",
               "FastKVzipPress": "gates"}


def _defaults():
    out = []
    for name in P.__all__:
        cls = getattr(P, name)
        if name in ("BasePress", "ScorerPress", "DuoAttentionPress"):
            continue  # abstract; calibrates on first use
        if name in FILE_FIELDS:
            continue  # needs a file (test_press_registry_classes.py)
        if name == "FinchPress":
            out.append(cls(0.5, window_size=8))  # the prompt's length has no default
        elif name == "PerLayerCompressionPress":
            out.append(cls(P.KnormPress(), [0.5] * 5))
        elif name == "ComposedPress":
            out.append(cls([P.SnapKVPress(0.5), P.KnormPress(0.5)]))
        else:
            out.append(cls())
    return out


@pytest.mark.parametrize("press", _defaults(), ids=lambda p: type(p).__name__)
def test_every_press_class_is_a_spec_the_engine_accepts(press):
    assert kvslim._kvslim.check_press(press.spec(), press.ratio)


def test_every_kvpress_press_of_the_engine_has_its_class(pipe):
    # Regression: the CLI accepted every kvpress class name, but kvslim.ChunkKVPress, LagKVPress,
    # FinchPress... raised AttributeError. Each press the engine names after a kvpress class is now
    # a class of the package, and runs as the engine's own spec does (same kept entries, answer).
    for info in kvslim.available_presses():
        for cls in info["kvpress_classes"]:
            assert issubclass(getattr(kvslim, cls), kvslim.BasePress), cls
    # Regression: a second kvpress class of one press (ExpectedAttentionStatsPress, beside
    # ExpectedAttentionPress) raised AttributeError; the engine accepts its spec with kvpress's names.
    stats = kvslim.ExpectedAttentionStatsPress(0.5, stats_folder="stats.json")
    assert stats.spec() == ("expected_attention:ratio=0.5,n_future=512,n_sink=4,covariance=1,vnorm=1,epsilon=0.0,"
                            "stats=stats.json")
    assert "stats_folder" not in {f.name for f in dataclasses.fields(kvslim.ExpectedAttentionPress)}
    assert (kvslim.ChunkKVPress(P.SnapKVPress(0.5), chunk_length=20).spec() ==
            "chunkkv(snapkv:ratio=0.5,window=64,kernel=5,chunk=20)")
    assert kvslim.ChunkKVPress(P.SnapKVPress(0.5)).compression_ratio == 0.5
    assert kvslim.LagKVPress(0.5, lag_size=64).spec() == "lagkv:ratio=0.5,n_sink=4,lag=64,cross_scoring=0"
    # The engine reads kvpress's class and field names itself: the same press.
    for press, kvpress_spec in [(kvslim.ChunkKVPress(P.SnapKVPress(0.5), chunk_length=20),
                                 "ChunkKVPress(snapkv:ratio=0.5,window=64,kernel=5,chunk_length=20)"),
                                (kvslim.LagKVPress(0.5, lag_size=64), "LagKVPress:lag_size=64,compression_ratio=0.5")]:
        assert kvslim._kvslim.check_press(press.spec(), 0.0) == kvslim._kvslim.check_press(kvpress_spec, 0.0)
    pairs = [(kvslim.ChunkKVPress(P.SnapKVPress(0.5), chunk_length=20), "chunkkv(snapkv:ratio=0.5,chunk=20)"),
             (kvslim.LagKVPress(0.5, lag_size=64), "lagkv:ratio=0.5,lag=64")]
    for press, ours in pairs:
        a = pipe(STORY[:1500], question="", press=press, max_new_tokens=4)
        b = pipe(STORY[:1500], question="", press=kvslim.Press(ours), max_new_tokens=4)
        assert a["answer"] == b["answer"]
        assert a["stats"]["kept_per_layer"] == b["stats"]["kept_per_layer"]
        assert a["stats"]["compression_ratio"] > 0.45
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        kvslim.LagKVPress(0.5, bogus=1)
    with pytest.raises(ValueError):
        kvslim.LagKVPress(1.5)
    with pytest.raises(AttributeError, match="NoSuchPress"):
        kvslim.NoSuchPress


def test_pipeline_answers_and_reports_what_the_cache_holds(pipe):
    out = pipe(STORY, question=" What did they do next?", press=kvslim.SnapKVPress(compression_ratio=0.5),
               max_new_tokens=8)
    assert isinstance(out["answer"], str) and out["answer"]
    s = out["stats"]
    n = s["context_tokens"]
    layers = pipe.model.n_layer
    # Every (layer, KV head) keeps floor(n / 2) of the n context entries (the press rule), so the
    # measured ratio is 1 - floor(n/2)/n; f16 cache: bytes scale with entries (positions in both).
    assert s["entries_total"] == n * layers * pipe.model.n_head_kv
    assert s["kept_per_layer"] == [(n // 2) * pipe.model.n_head_kv] * layers
    assert math.isclose(s["compression_ratio"], 1 - (n // 2) / n, abs_tol=1e-12)
    assert math.isclose(s["memory_ratio"], (n // 2) / n, abs_tol=1e-12)
    assert s["question_tokens"] > 0 and s["generated_tokens"] <= 8
    assert s["press"].startswith("snapkv")


def test_ratio_zero_and_no_press_give_the_same_answer(pipe):
    a = pipe(STORY, question=" Then", press=None, max_new_tokens=12)
    b = pipe(STORY, question=" Then", press=kvslim.KnormPress(compression_ratio=0.0), max_new_tokens=12)
    assert a["answer"] == b["answer"]
    assert a["stats"]["compression_ratio"] == 0.0


def test_several_questions_and_answer_prefix(pipe):
    out = pipe(STORY, questions=[" Who was there?", " Where did they go?"], press=kvslim.StreamingLLMPress(0.5),
               max_new_tokens=4, answer_prefix=" Answer:")
    assert len(out["answers"]) == 2 and len(out["stats"]) == 2
    assert out["stats"][0]["context_tokens"] == out["stats"][1]["context_tokens"]


def test_press_spec_strings_and_errors(pipe):
    out = pipe(STORY, question="", press=kvslim.Press("adakv(snapkv)", compression_ratio=0.5), max_new_tokens=2)
    assert out["stats"]["compression_ratio"] > 0.4
    with pytest.raises(kvslim.KvslimError, match="no_such_press"):
        pipe(STORY, press="no_such_press", max_new_tokens=2)
    with pytest.raises(ValueError, match=r"compression_ratio must be in \[0, 1\)"):  # when built, as kvpress
        pipe(STORY, press=kvslim.KnormPress(compression_ratio=1.0), max_new_tokens=2)
    with pytest.raises(kvslim.KvslimError):  # the engine's own check of a ratio inside a spec
        pipe(STORY, press=kvslim.Press("knorm:ratio=1.0"), max_new_tokens=2)
    with pytest.raises(kvslim.KvslimError, match="nonexistent.gguf"):
        kvslim.pipeline(model="/nonexistent.gguf")
    with pytest.raises(TypeError, match="unsupported"):
        pipe(STORY, no_such_argument=1)
    with pytest.raises(ValueError):
        kvslim.pipeline("text-generation", model=STORIES)


def test_presses_lists_the_registry():
    names = {p["name"] for p in kvslim.available_presses()}
    assert {"snapkv", "knorm", "adakv", "decoding", "kvzip"} <= names


def test_eval_niah_on_the_retrieval_model(tmp_path):
    res = kvslim.eval.niah(RETRIEVAL, presses=[kvslim.StreamingLLMPress(), "knorm"], ratios=[0.9], lengths=[256],
                           depths=[0.5], samples=1, text_config=RETRIEVAL_TEXT, out=str(tmp_path), plots=False)
    assert res.run["model"] == RETRIEVAL and len(res.run["model_sha256"]) == 64
    assert len(res.records) == 3  # full cache + 2 presses
    base = [r for r in res.summary if r["press_spec"] == "none" and r["length"] == "all"]
    assert base and base[0]["score"] == 1.0
    assert res.warnings == []
    assert os.path.exists(tmp_path / "summary.csv")


def test_eval_warns_when_the_full_cache_scores_zero(tmp_path):
    res = kvslim.eval.niah(STORIES, presses=["knorm"], ratios=[0.5], lengths=[96], depths=[0.5], samples=1,
                           n_predict=4, out=str(tmp_path), plots=False)
    assert any("THE FULL CACHE SCORED 0" in w for w in res.warnings)


def test_eval_fidelity(tmp_path):
    res = kvslim.eval.fidelity(STORIES, presses=[kvslim.KnormPress()], ratios=[0.5], context_tokens=48,
                               continuation_tokens=8, samples=2, out=str(tmp_path), plots=False)
    rows = {r["press_spec"]: r for r in res.summary}
    assert rows["none"]["kl"] == 0.0  # the full cache against itself
    assert rows["knorm"]["kl"] > 0.0
    assert rows["knorm"]["compression_ratio"] == pytest.approx(0.5, abs=1 / 48)


def test_installs_with_one_command(tmp_path):
    build = os.environ.get("KVSLIM_BUILD_DIR")
    if not build:
        pytest.skip("KVSLIM_BUILD_DIR not set (run through ctest)")
    subprocess.run(["cmake", "--install", build, "--component", "python", "--prefix", str(tmp_path)], check=True,
                   capture_output=True)
    site = tmp_path / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "dist-packages"
    assert (site / "kvslim" / "presses.pyi").is_file() and (site / "kvslim" / "py.typed").is_file()
    env = dict(os.environ, PYTHONPATH=str(site))
    r = subprocess.run([sys.executable, "-c", "import kvslim; print(kvslim.__file__, kvslim.bundled_model())"],
                       env=env, capture_output=True, text=True, check=True)
    module_file, model = r.stdout.split()
    assert module_file.startswith(str(site))
    assert model == str(site / "kvslim" / "models" / "stories260K.gguf")


def test_pipeline_without_a_model_runs_the_bundled_one_from_any_directory(tmp_path):
    # Outside the repository (no models/ beside the working directory) the default model is the
    # copy inside the package; its answer is the one of the repository's file.
    code = ("import kvslim; p = kvslim.pipeline(threads=1); "
            "print(repr(p('Once upon a time, there was a girl.', question=' Then', max_new_tokens=6)['answer']))")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    expected = kvslim.pipeline(model=STORIES, threads=1)("Once upon a time, there was a girl.", question=" Then",
                                                         max_new_tokens=6)["answer"]
    assert r.stdout.strip() == repr(expected)
    assert os.path.samefile(os.path.dirname(kvslim.bundled_model()), os.path.join(os.path.dirname(kvslim.__file__),
                                                                                  "models"))


def test_a_model_id_is_not_a_gguf_file_and_the_error_says_how_to_get_one(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        kvslim.pipeline("kv-press-text-generation", model="meta-llama/Llama-3.2-1B")
    assert isinstance(e.value, kvslim.KvslimError)
    msg = str(e.value)
    assert "'meta-llama/Llama-3.2-1B' is a model id, not a file" in msg
    assert "GGUF" in msg and "convert_hf_to_gguf.py" in msg
    missing = str(tmp_path / "absent.gguf")
    with pytest.raises(FileNotFoundError, match=f"model '{missing}' is not a file: kvslim reads GGUF"):
        kvslim.pipeline(model=missing)


def test_pipeline_warns_that_a_gpu_device_is_ignored():
    # kvpress scripts pass device="cuda:0"; kvslim runs on the CPU and says so instead of ignoring it quietly.
    with pytest.warns(UserWarning, match="device='cuda:0' is ignored"):
        kvslim.pipeline("kv-press-text-generation", model=STORIES, device="cuda:0")
    import warnings as w
    with w.catch_warnings():
        w.simplefilter("error")
        kvslim.pipeline("kv-press-text-generation", model=STORIES, device="cpu")
        kvslim.pipeline("kv-press-text-generation", model=STORIES)


def test_several_questions_compress_once_with_the_same_answers(pipe):
    press = kvslim.Press("adakv(snapkv)", compression_ratio=0.5)
    asked = [" Who was there?", " Where did they go?", ""]
    once = pipe(STORY, questions=asked, press=press, max_new_tokens=10)
    for q, answer in zip(asked, once["answers"]):
        # One question at a time compresses the context again: the same tokens come out.
        assert pipe(STORY, question=q, press=press, max_new_tokens=10)["answer"] == answer
    # Every answer read the one compressed cache.
    assert len({(s["kv_bytes"], s["entries_kept"], s["context_tokens"]) for s in once["stats"]}) == 1
    # A press with decode state is still answered, by compressing per question.
    out = pipe(STORY, questions=[" Who?", " Where?"], press=kvslim.Press("h2o", compression_ratio=0.5),
               max_new_tokens=4)
    assert len(out["answers"]) == 2


def test_context_build_save_load(pipe, tmp_path):
    press = kvslim.SnapKVPress(compression_ratio=0.5)
    ctx = kvslim.Context.build(pipe.model, STORY, press=press)
    path = tmp_path / "story.kvc"
    ctx.save(str(path))
    loaded = kvslim.Context.load(pipe.model, str(path))
    assert loaded.tokens == ctx.tokens and loaded.text == STORY
    info = loaded.info
    assert info["file_bytes"] == path.stat().st_size
    assert info["press"].startswith("snapkv") and 0 < info["memory_ratio"] < 1
    want = pipe(STORY, question=" Then", press=press, max_new_tokens=12)["answer"]
    assert pipe(loaded, question=" Then", max_new_tokens=12)["answer"] == want
    with pytest.raises(TypeError):
        pipe(loaded, question=" Then", press=press)
    with pytest.raises(kvslim.KvslimError, match="cannot be stored"):
        kvslim.Context.build(pipe.model, STORY, press=kvslim.Press("h2o", compression_ratio=0.5))
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(kvslim.KvslimError, match="truncated"):
        kvslim.Context.load(pipe.model, str(path))
