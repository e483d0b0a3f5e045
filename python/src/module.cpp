// kvslim._kvslim: the C++ engine seen from Python. The kvpress-style classes (pipeline, presses)
// are plain Python in python/kvslim/ and call these few functions: load a model, run one
// request (context, question, press spec) and read back its cache statistics, list the
// registered presses, run an eval sweep and write its results directory.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kvslim/context.h"
#include "kvslim/error.h"
#include "kvslim/eval.h"
#include "kvslim/eval_results.h"
#include "kvslim/eval_run_info.h"
#include "kvslim/request.h"
#include "kvslim/model.h"
#include "kvslim/press.h"
#include "kvslim/threads.h"
#include "kvslim/version.h"

namespace py = pybind11;
using namespace kvslim;

namespace {

/// A loaded model and the path it came from (eval records name and hash the file).
struct PyModel {
  std::string path;
  std::unique_ptr<Model> model;
};

SessionOptions session_options(int n_ctx, const std::string& cache_type_k, const std::string& cache_type_v) {
  SessionOptions s;
  s.n_ctx = n_ctx;
  s.key_codec = parse_codec(cache_type_k);
  s.value_codec = parse_codec(cache_type_v);
  return s;
}

/// One request through the engine's request runner (the same path as `kvslim generate`): the
/// context is prefilled and compressed by `press_spec` at `ratio`, the question appended
/// uncompressed, then up to `max_new_tokens` generated. Returns the answer and what was measured
/// from the cache, after compression and at the end.
/// The answer and statistics of a request that has run; `desc` names the press.
py::dict request_result(Request& req, const std::string& desc);

py::dict run(const PyModel& m, const std::string& context, const std::string& question,
             const std::string& press_spec, double ratio, int max_new_tokens, double temperature, int top_k,
             double top_p, uint64_t seed, int chunk_size, int n_ctx, const std::string& cache_type_k,
             const std::string& cache_type_v) {
  check_ratio(ratio, press_spec);
  std::unique_ptr<Press> press = make_press(press_spec, ratio);
  RequestOptions opt;
  opt.n_predict = max_new_tokens;
  opt.sampling = {static_cast<float>(temperature), top_k, static_cast<float>(top_p), seed};
  opt.chunk_size = chunk_size;
  opt.session = session_options(n_ctx, cache_type_k, cache_type_v);
  const std::string desc = press->describe();
  Request req(*m.model, std::move(press), opt);
  {
    py::gil_scoped_release release;
    req.set_prompt(context, question);
    req.run();
  }
  return request_result(req, desc);
}

/// A stored compressed context (kvslim/context.h) and the model it was built or loaded with.
struct PyStoredContext {
  Context context;
};

PyStoredContext build_context(const PyModel& m, const std::string& text, const std::string& press_spec, double ratio,
                        int chunk_size, int n_ctx, const std::string& cache_type_k, const std::string& cache_type_v) {
  check_ratio(ratio, press_spec);
  ContextOptions opt;
  opt.press = press_spec;
  opt.ratio = ratio;
  opt.chunk_size = chunk_size;
  opt.session = session_options(n_ctx, cache_type_k, cache_type_v);
  py::gil_scoped_release release;
  return PyStoredContext{Context::build(*m.model, text, opt)};
}

/// A question answered from a stored context: only the question is prefilled.
py::dict run_context(const PyModel& m, const PyStoredContext& c, const std::string& question, int max_new_tokens,
                     double temperature, int top_k, double top_p, uint64_t seed, int n_ctx) {
  RequestOptions opt;
  opt.n_predict = max_new_tokens;
  opt.sampling = {static_cast<float>(temperature), top_k, static_cast<float>(top_p), seed};
  opt.session.n_ctx = n_ctx;
  std::unique_ptr<Request> req;
  {
    py::gil_scoped_release release;
    std::vector<Token> q;
    if (!question.empty()) q = m.model->tokenizer().encode(question, false, false);
    req = c.context.request(*m.model, std::move(q), opt);
    req->run();
  }
  return request_result(*req, c.context.info().press);
}

py::dict context_info(const PyStoredContext& c) {
  const ContextInfo i = c.context.info();
  py::dict d;
  d["format_version"] = i.format_version;
  d["arch"] = i.arch;
  d["fingerprint"] = fmt::format("{:016x}", i.fingerprint);
  d["press"] = i.press;
  d["cache_type"] = i.cache_type;
  d["chunk_size"] = i.chunk_size;
  d["context_tokens"] = i.context_tokens;
  d["entries_kept"] = i.entries_kept;
  d["entries_total"] = i.entries_total;
  d["compression_ratio"] = i.compression_ratio();
  d["kv_bytes"] = i.kv_bytes;
  d["full_f16_bytes"] = i.full_f16_bytes;
  d["memory_ratio"] = i.memory_ratio();
  d["file_bytes"] = i.file_bytes;
  d["prefill_seconds"] = i.prefill_seconds;
  d["press_seconds"] = i.press_seconds;
  return d;
}

py::dict request_result(Request& req, const std::string& desc) {
  const EndCheck end = inspect_end(req.cache(), req.stats().context_tokens, req.position());
  const RequestStats& s = req.stats();
  py::dict stats;
  stats["press"] = desc;
  stats["context_tokens"] = s.context_tokens;
  stats["question_tokens"] = s.question_tokens;
  stats["generated_tokens"] = s.generated_tokens;
  stats["entries_kept"] = s.entries_kept;
  stats["entries_total"] = s.entries_total;
  stats["kept_per_layer"] = s.kept_per_layer;
  stats["compression_ratio"] = s.compression_ratio();
  stats["request_compression_ratio"] = s.request_compression_ratio();
  stats["key_channel_ratio"] = s.key_channel_ratio();
  stats["kv_bytes"] = s.kv_bytes;
  stats["full_f16_bytes"] = s.full_f16_bytes;
  stats["memory_ratio"] = s.memory_ratio();
  stats["peak_kv_bytes"] = s.peak_kv_bytes;
  stats["end_tokens"] = end.tokens;
  stats["end_entries"] = end.entries;
  stats["end_kv_bytes"] = end.kv_bytes;
  stats["end_compression_ratio"] = end.compression_ratio();
  stats["end_memory_ratio"] = end.memory_ratio();
  stats["prefill_seconds"] = s.prefill_seconds;
  stats["press_seconds"] = s.press_seconds;
  stats["decode_seconds"] = s.decode_seconds;
  stats["finish_reason"] = finish_reason_name(req.finish_reason());
  py::dict out;
  out["answer"] = req.text();
  out["tokens"] = req.generated();
  out["stats"] = stats;
  return out;
}

const char* type_name(ParamType t) {
  switch (t) {
    case ParamType::Auto: return "auto";
    case ParamType::Int: return "int";
    case ParamType::Float: return "float";
    case ParamType::Bool: return "bool";
    case ParamType::Str: return "str";
    case ParamType::FloatList: return "float_list";
  }
  return "auto";
}

py::list presses() {
  py::list out;
  for (const PressInfo* p : PressRegistry::instance().all()) {
    py::dict d;
    d["name"] = p->name;
    d["kind"] = p->kind == PressKind::Scorer ? "scorer" : p->kind == PressKind::Policy ? "policy" : "wrapper";
    d["summary"] = p->summary;
    d["source"] = p->source;
    py::dict params;
    for (const PressParam& pp : p->params) params[py::str(pp.name)] = pp.default_value;
    d["params"] = params;
    d["default_inner"] = p->default_inner;
    d["kvpress"] = p->kvpress.empty() ? std::string() : p->kvpress.front();  // "" when kvpress has no such press
    py::list classes;
    for (const std::string& c : p->kvpress) classes.append(c);
    d["kvpress_classes"] = classes;
    py::dict aliases;
    for (const PressParam& pp : p->params)
      if (!pp.kvpress.empty()) aliases[py::str(pp.kvpress)] = pp.name;
    d["kvpress_params"] = aliases;
    // What python/kvslim/presses.py generates the press's classes from.
    py::list fields;
    for (const PressParam& pp : p->params) {
      py::dict f;
      f["name"] = pp.name;
      f["default"] = pp.default_value;
      f["kvpress"] = pp.kvpress;
      f["type"] = type_name(pp.python.type);
      f["help"] = pp.python.help;
      f["python_default"] = pp.python.default_value;
      f["kvslim_only"] = pp.python.kvslim_only;
      f["only_in"] = pp.python.only_in;
      fields.append(f);
    }
    d["param_fields"] = fields;
    py::dict cls;
    cls["name"] = p->python.name;
    cls["base_press"] = p->python.base_press;
    cls["inner"] = p->python.inner;
    cls["inner_fields"] = p->python.inner_fields;
    py::list extra;
    for (const PythonField& pf : p->python.fields) {
      py::dict f;
      f["name"] = pf.name;
      f["after"] = pf.after;
      f["type"] = type_name(pf.type);
      f["default"] = pf.default_value;
      f["help"] = pf.help;
      f["alias"] = pf.alias;
      f["policy"] = pf.policy;
      extra.append(f);
    }
    cls["fields"] = extra;
    d["python"] = cls;
    out.append(d);
  }
  return out;
}

/// Runs a sweep and returns samples.jsonl's text (the same records the CLI writes).
std::string sweep(const PyModel& m, const std::string& kind, const std::vector<std::string>& press_specs,
                  const std::vector<double>& ratios, bool baseline, int samples, uint64_t seed,
                  const std::vector<std::string>& tasks, const std::vector<int>& lengths,
                  const std::vector<double>& depths, const std::string& text_config, int n_predict,
                  int context_tokens, int continuation_tokens, int chunk_size, int n_ctx,
                  const std::string& cache_type_k, const std::string& cache_type_v) {
  const auto runs = expand_runs(press_specs, ratios, baseline);
  SweepResults res;
  res.info = make_run_info(kind, m.path);
  RunOptions ro;
  ro.session = session_options(n_ctx, cache_type_k, cache_type_v);
  ro.chunk_size = chunk_size;
  py::gil_scoped_release release;
  if (kind == "fidelity") {
    FidelitySweep sw;
    sw.context_tokens = context_tokens;
    sw.continuation_tokens = continuation_tokens;
    sw.samples = samples;
    sw.seed = seed;
    sw.run = ro;
    res.info.config = sweep_config(runs, sw, "");
    res.info.units = run_fidelity_sweep(*m.model, runs, sw, [&](const FidelityRecord& f) { res.fidelity.push_back(f); });
  } else if (kind == "niah" || kind == "ruler") {
    TaskSweep sw;
    sw.tasks = kind == "niah" ? std::vector<std::string>{"niah"} : tasks;
    sw.lengths = lengths;
    sw.depths = depths;
    sw.samples = samples;
    sw.seed = seed;
    if (!text_config.empty()) sw.text = TaskText::from_json_file(text_config);
    sw.run = ro;
    sw.run.n_predict = n_predict;
    res.info.config = sweep_config(runs, sw, text_config);
    res.info.units = run_task_sweep(*m.model, runs, sw, [&](const TaskRecord& t) { res.tasks.push_back(t); });
  } else {
    throw Error(fmt::format("eval kind '{}' is not one of fidelity, niah, ruler", kind));
  }
  return results_jsonl(res);
}

py::dict write_dir(const std::string& jsonl, const std::string& dir, const std::string& plot_format, bool plots) {
  const SweepResults res = parse_results(jsonl, "records");
  ResultsOptions o;
  o.dir = dir;
  o.plot_format = plot_format;
  o.plots = plots;
  ResultsReport rep;
  {
    py::gil_scoped_release release;
    rep = write_results(res, o);
  }
  py::dict d;
  d["warnings"] = rep.warnings;
  d["plot_problem"] = rep.plot_problem;
  d["files"] = rep.files;
  return d;
}

}  // namespace

PYBIND11_MODULE(_kvslim, m) {
  m.doc() = "kvslim engine binding (see the kvslim package for the kvpress-style API)";
  m.attr("__version__") = kVersion;
  py::register_exception<Error>(m, "KvslimError", PyExc_ValueError);

  py::class_<PyModel>(m, "Model")
      .def(py::init([](const std::string& path) {
             auto pm = std::make_unique<PyModel>();
             pm->path = path;
             py::gil_scoped_release release;
             pm->model = Model::load(path);
             return pm;
           }),
           py::arg("path"))
      .def_property_readonly("path", [](const PyModel& p) { return p.path; })
      .def_property_readonly("arch", [](const PyModel& p) { return p.model->hparams().arch; })
      .def_property_readonly("n_layer", [](const PyModel& p) { return p.model->hparams().n_layer; })
      .def_property_readonly("n_head", [](const PyModel& p) { return p.model->hparams().n_head; })
      .def_property_readonly("n_head_kv", [](const PyModel& p) { return p.model->hparams().n_head_kv; })
      .def_property_readonly("head_dim", [](const PyModel& p) { return p.model->hparams().head_dim; })
      .def_property_readonly("n_vocab", [](const PyModel& p) { return p.model->hparams().n_vocab; })
      .def_property_readonly("n_ctx_train", [](const PyModel& p) { return p.model->hparams().n_ctx_train; })
      .def(
          "tokenize",
          [](const PyModel& p, const std::string& text, bool add_bos) {
            return p.model->tokenizer().encode(text, add_bos, false);
          },
          py::arg("text"), py::arg("add_bos") = true)
      .def(
          "detokenize", [](const PyModel& p, const std::vector<Token>& t) { return p.model->tokenizer().decode(t); },
          py::arg("tokens"));

  py::class_<PyStoredContext>(m, "Context")
      .def_static("build", &build_context, py::arg("model"), py::arg("text"), py::arg("press_spec"), py::arg("ratio"),
                  py::arg("chunk_size"), py::arg("n_ctx"), py::arg("cache_type_k"), py::arg("cache_type_v"))
      .def_static(
          "load",
          [](const PyModel& m, const std::string& path) {
            py::gil_scoped_release release;
            return PyStoredContext{Context::load(*m.model, path)};
          },
          py::arg("model"), py::arg("path"))
      .def(
          "save",
          [](const PyStoredContext& c, const std::string& path) {
            py::gil_scoped_release release;
            c.context.save(path);
          },
          py::arg("path"))
      .def("info", &context_info)
      .def_property_readonly("tokens", [](const PyStoredContext& c) { return c.context.tokens(); })
      .def_property_readonly("text", [](const PyStoredContext& c) { return c.context.text(); });
  m.def("storage_refusal", [](const std::string& spec, double ratio) { return make_press(spec, ratio)->storage_refusal(); },
        py::arg("spec"), py::arg("ratio"), "Why a press cannot be stored as a context, or \"\" when it can.");
  m.def("run_context", &run_context, py::arg("model"), py::arg("context"), py::arg("question"),
        py::arg("max_new_tokens"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"), py::arg("seed"),
        py::arg("n_ctx"));
  m.def("run", &run, py::arg("model"), py::arg("context"), py::arg("question"), py::arg("press_spec"),
        py::arg("ratio"), py::arg("max_new_tokens"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
        py::arg("seed"), py::arg("chunk_size"), py::arg("n_ctx"), py::arg("cache_type_k"), py::arg("cache_type_v"));
  m.def(
      "check_press",
      [](const std::string& spec, double ratio) {
        check_ratio(ratio, spec);
        return make_press(spec, ratio)->describe();
      },
      py::arg("spec"), py::arg("ratio"), "Parses a press spec; returns its full description or raises KvslimError.");
  m.def("presses", &presses, "Every registered press, policy and wrapper with its parameters and defaults.");
  m.def("set_threads", &set_num_threads, py::arg("n"));
  m.def("threads", &num_threads);
  m.def("sweep", &sweep, py::arg("model"), py::arg("kind"), py::arg("press_specs"), py::arg("ratios"),
        py::arg("baseline"), py::arg("samples"), py::arg("seed"), py::arg("tasks"), py::arg("lengths"),
        py::arg("depths"), py::arg("text_config"), py::arg("n_predict"), py::arg("context_tokens"),
        py::arg("continuation_tokens"), py::arg("chunk_size"), py::arg("n_ctx"), py::arg("cache_type_k"),
        py::arg("cache_type_v"));
  m.def("write_results", &write_dir, py::arg("jsonl"), py::arg("dir"), py::arg("plot_format") = "svg",
        py::arg("plots") = true);
}
