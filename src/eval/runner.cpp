// Running samples through a press: task answers, fidelity against the full cache, attention
// statistics, and the sweeps over presses x ratios x samples.
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "eval/attention_stats.h"
#include "context/file.h"
#include "kvslim/press.h"
#include "kvslim/context.h"
#include "kvslim/error.h"
#include "kvslim/eval.h"
#include "kvslim/request.h"
#include "press/recording_press.h"
#include "kvslim/sampling.h"
#include "util/clock.h"

namespace kvslim {

namespace {

uint64_t sample_seed(uint64_t seed, const std::string& what) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : what) h = (h ^ c) * 1099511628211ull;
  uint64_t z = seed + h + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void check_fits(const Session& s, size_t n, const std::string& what) {
  if (n > static_cast<size_t>(s.n_ctx()))
    throw Error(fmt::format("{} of {} tokens exceeds the context size n_ctx {}", what, n, s.n_ctx()));
}

/// Answer text up to the stop string, when the stop string follows some non-space text.
bool cut_at_stop(std::string& answer, const std::string& stop) {
  if (stop.empty()) return false;
  size_t start = answer.find_first_not_of(" \t\r\n");
  if (start == std::string::npos) return false;
  size_t at = answer.find(stop, start);
  if (at == std::string::npos) return false;
  answer.resize(at);
  return true;
}

std::vector<Token> with_bos(const Tokenizer& tok, std::vector<Token> t) {
  if (tok.bos() >= 0 && tok.add_bos_default()) t.insert(t.begin(), tok.bos());
  return t;
}

/// Feeds `tokens` after the prompt one decode step at a time (teacher forcing), so a decoding
/// press acts after each token as it would while generating. Returns the logits of every token fed.
std::vector<float> feed_stepwise(Request& req, const std::vector<Token>& tokens) {
  std::vector<float> all;
  for (Token t : tokens) {
    const std::vector<float>& l = req.advance(t);
    all.insert(all.end(), l.begin(), l.end());
  }
  return all;
}

RequestOptions request_options(const RunOptions& opt, const SessionOptions& session) {
  RequestOptions ro = opt;
  ro.session = session;
  ro.sampling = SamplingParams{};
  ro.sampling.temp = 0.0f;  // greedy: answers are scored by string match
  return ro;
}

}  // namespace

double CacheCheck::min_needle_kept() const {
  double m = 1.0;
  for (double v : needle_kept) m = std::min(m, v);
  return m;
}

CacheCheck inspect_cache(const KVCache& cache, int context_tokens, double requested_ratio,
                         const std::vector<std::pair<int, int>>& spans) {
  CacheCheck c;
  c.context_tokens = context_tokens;
  c.requested_ratio = requested_ratio;
  const int L = cache.n_layer(), H = cache.n_head_kv();
  c.entries_total = static_cast<size_t>(context_tokens) * L * H;
  c.entries_kept = cache.entries();
  for (int l = 0; l < L; ++l) c.kept_per_layer.push_back(cache.entries(l));
  c.kv_bytes = cache.bytes();
  c.full_f16_bytes = cache.full_f16_bytes(context_tokens);
  c.shared_bytes = cache.shared_bytes();
  for (const auto& [b, e] : spans) {
    if (e <= b) {
      c.needle_kept.push_back(1.0);
      c.needle_kept_per_layer.emplace_back(L, 1.0);
      continue;
    }
    size_t kept = 0;
    std::vector<double> per_layer;
    for (int l = 0; l < L; ++l) {
      size_t kl = 0;
      for (int h = 0; h < H; ++h)
        for (int32_t p : cache.seg(l, h).positions()) kl += p >= b && p < e;
      per_layer.push_back(double(kl) / (double(e - b) * H));
      kept += kl;
    }
    c.needle_kept.push_back(double(kept) / (double(e - b) * L * H));
    c.needle_kept_per_layer.push_back(std::move(per_layer));
  }
  // Ratio 0 asks for no ratio: a budget or threshold press removes what its own parameters say.
  c.as_configured = c.entries_kept <= c.entries_total &&
                    (requested_ratio <= 0.0 || std::fabs(c.compression_ratio() - requested_ratio) <= c.tolerance());
  return c;
}

EndCheck inspect_end(const KVCache& cache, int context_tokens, int tokens) {
  EndCheck e;
  e.context_tokens = context_tokens;
  e.tokens = tokens;
  const size_t LH = static_cast<size_t>(cache.n_layer()) * cache.n_head_kv();
  e.entries = cache.entries();
  e.entries_total = static_cast<size_t>(tokens) * LH;
  e.context_entries_total = static_cast<size_t>(context_tokens) * LH;
  for (int l = 0; l < cache.n_layer(); ++l)
    for (int h = 0; h < cache.n_head_kv(); ++h)
      for (int32_t p : cache.seg(l, h).positions()) e.context_entries += p < context_tokens;
  e.kv_bytes = cache.bytes();
  e.full_f16_bytes = cache.full_f16_bytes(tokens);
  return e;
}

Shard parse_shard(const std::string& text) {
  const size_t slash = text.find('/');
  Shard s;
  bool ok = slash != std::string::npos && slash > 0 && slash + 1 < text.size();
  if (ok) {
    try {
      size_t a = 0, b = 0;
      s.index = std::stoi(text.substr(0, slash), &a);
      s.count = std::stoi(text.substr(slash + 1), &b);
      ok = a == slash && b == text.size() - slash - 1;
    } catch (const std::exception&) {
      ok = false;
    }
  }
  if (!ok || s.count < 1 || s.index < 0 || s.index >= s.count)
    throw Error(fmt::format("shard '{}': expected I/N with 0 <= I < N (e.g. 0/4)", printable(text)));
  return s;
}

TaskOutcome run_task(const Model& model, Press& press, const TaskSample& sample, const TokenizedSample& toks,
                     const std::string& stop, const RunOptions& opt) {
  TaskOutcome out;
  RequestOptions ro = request_options(opt, opt.session);
  ro.n_predict = opt.n_predict > 0 ? opt.n_predict : sample.n_predict;
  std::unique_ptr<Request> owned = std::make_unique<Request>(model, press, ro);
  check_fits(owned->session(), toks.context.size() + toks.question.size(),
             fmt::format("task {} sample (context + question)", sample.task));
  if (opt.stored_context) {
    // Compress once, answer from the loaded bytes: the context alone, as a stored context is built.
    const std::string why = press.storage_refusal();
    if (!why.empty()) throw Error(fmt::format("press {} cannot be stored as a context: {}", press.describe(), why));
    owned->set_prompt_tokens(toks.context);
    owned->prefill();
    out.cache = inspect_cache(owned->cache(), static_cast<int>(toks.context.size()), press.ratio(), toks.needle_spans);
    const std::string image =
        context::from_request(model, *owned, press.describe(), press.report(), opt.chunk_size, true).image();
    const Context loaded = Context::from_image(model, image.data(), image.size(), "stored context");
    RequestOptions rq = ro;
    rq.chunk_size = 0;
    owned = loaded.request(model, toks.question, rq);
  } else {
    owned->set_prompt_tokens(toks.context, toks.question);
    while (!owned->context_prefilled()) owned->prefill_step();
    out.cache = inspect_cache(owned->cache(), static_cast<int>(toks.context.size()), press.ratio(), toks.needle_spans);
  }
  Request& req = *owned;
  req.prefill();
  out.question_tokens = static_cast<int>(toks.question.size());
  req.run([&](const TokenEvent& e) {
    out.answer += e.piece;
    return !cut_at_stop(out.answer, stop);
  });
  const RequestStats& st = req.stats();
  // Every sampled token, an end-of-generation token included (the callback does not see that one),
  // as generate and serve count them.
  out.generated_tokens = st.generated_tokens;
  out.press_seconds = st.press_seconds;
  out.prefill_seconds = st.prefill_seconds;
  out.decode_seconds = st.decode_seconds;
  // Tokens run through the model, not req.position(): key re-rotation moves positions down and
  // RestoreKV's restore entries take positions of their own; the last answer token is never run.
  const size_t run_tokens = toks.context.size() + toks.question.size() + std::max(0, out.generated_tokens - 1);
  out.end = inspect_end(req.cache(), static_cast<int>(toks.context.size()), static_cast<int>(run_tokens));
  out.score = sample.match_all ? string_match_all(out.answer, sample.answers)
                               : string_match_part(out.answer, sample.answers);
  return out;
}

SessionOptions full_precision(SessionOptions opt) {
  for (KVCodec* c : {&opt.key_codec, &opt.value_codec})
    if (codec_is_quantized(*c)) *c = KVCodec::F16;
  opt.kv_quant = KVQuantOptions{};
  return opt;
}

FidelityReference fidelity_reference(const Model& model, std::vector<Token> prefix, std::vector<Token> continuation,
                                     const RunOptions& opt) {
  if (prefix.empty()) throw Error("fidelity: the context prefix is empty");
  if (continuation.size() < 2)
    throw Error(fmt::format("fidelity: the continuation has {} tokens, at least 2 are needed", continuation.size()));
  FidelityReference ref;
  ref.n_vocab = model.hparams().n_vocab;
  // The same runner as the compressed run, so the "none" press on the same (unquantized) cache
  // compares bit-identical logits.
  Request req(model, make_press_impl("none", 0.0), request_options(opt, full_precision(opt.session)));
  check_fits(req.session(), prefix.size() + continuation.size(), "fidelity sample (context + continuation)");
  req.set_prompt_tokens(prefix);
  req.prefill();
  ref.logits = feed_stepwise(req, std::vector<Token>(continuation.begin(), continuation.end() - 1));
  ref.prefix = std::move(prefix);
  ref.continuation = std::move(continuation);
  return ref;
}

FidelityOutcome run_fidelity(const Model& model, Press& press, const FidelityReference& ref, const RunOptions& opt) {
  FidelityOutcome out;
  const double t0 = steady_seconds();
  Request req(model, press, request_options(opt, opt.session));
  check_fits(req.session(), ref.prefix.size() + ref.continuation.size(), "fidelity sample (context + continuation)");
  req.set_prompt_tokens(ref.prefix);
  req.prefill();
  out.cache = inspect_cache(req.cache(), static_cast<int>(ref.prefix.size()), press.ratio());
  std::vector<float> logits =
      feed_stepwise(req, std::vector<Token>(ref.continuation.begin(), ref.continuation.end() - 1));
  // Tokens run through the model (as run_task: positions may differ from the count).
  out.end = inspect_end(req.cache(), static_cast<int>(ref.prefix.size()),
                        static_cast<int>(ref.prefix.size() + ref.continuation.size() - 1));
  const size_t V = static_cast<size_t>(ref.n_vocab);
  for (size_t i = 0; i + 1 < ref.continuation.size(); ++i)
    out.metrics.add(ref.logits.data() + i * V, logits.data() + i * V, V, ref.continuation[i + 1]);
  out.seconds = steady_seconds() - t0;
  return out;
}

AttentionStats attention_stats(const Model& model, const std::vector<Token>& tokens, int window, double tau,
                               const SessionOptions& session) {
  if (window < 1) throw Error(fmt::format("attention statistics: window {} must be >= 1", window));
  if (!(tau > 0.0 && tau <= 1.0)) throw Error(fmt::format("attention statistics: tau {} is outside (0, 1]", tau));
  if (static_cast<size_t>(window) > tokens.size())
    throw Error(fmt::format("attention statistics: window {} is longer than the {} tokens", window, tokens.size()));
  ObservationNeeds rec;
  rec.window = window;
  auto recorder = std::make_unique<RecordingPress>(rec);
  const RecordingPress& recorded = *recorder;
  RequestOptions ro;
  ro.session = session;
  Request r(model, std::move(recorder), ro);
  check_fits(r.session(), tokens.size(), "attention statistics text");
  r.set_prompt_tokens(tokens);
  r.prefill();
  const Observation& obs = recorded.observation();
  const HParams& hp = model.hparams();
  AttentionStats st;
  st.context_tokens = static_cast<int>(tokens.size());
  st.window = window;
  st.tau = tau;
  for (int l = 0; l < hp.n_layer; ++l) {
    LayerView view(model, r.cache(), obs, l);
    std::vector<int> mba = query_head_mba(view, view.n_window(), tau);
    double mean = 0;
    for (int v : mba) mean += v;
    st.lmba.push_back(mean / hp.n_head);
    st.mba.push_back(std::move(mba));
  }
  return st;
}

std::vector<PressRun> expand_runs(const std::vector<std::string>& presses, const std::vector<double>& ratios,
                                  bool baseline) {
  std::vector<PressRun> runs;
  bool have_none = false;
  if (baseline) {
    runs.push_back({"none", 0.0});
    have_none = true;
  }
  for (const auto& spec : presses) {
    const std::string name = spec.substr(0, spec.find(':'));
    if (name == "none") {
      if (!have_none) runs.push_back({spec, 0.0});
      have_none = true;
      continue;
    }
    for (double r : ratios) {
      check_ratio(r, spec);
      bool ratio_used = false;
      make_press_impl(spec, r, ratio_used);  // unknown presses and bad parameters fail before any work
      if (!ratio_used) {
        // A budget or threshold press keeps what its own parameters say: one run, not one per ratio
        // with the same result.
        runs.push_back({spec, 0.0});
        break;
      }
      runs.push_back({spec, r});
    }
  }
  if (runs.empty()) throw Error("sweep: no press to run (the press specs or the ratios are empty, and no baseline)");
  return runs;
}

size_t run_task_sweep(const Model& model, const std::vector<PressRun>& runs, const TaskSweep& sw,
                    const std::function<void(const TaskRecord&)>& on_record, const ProgressFn& progress) {
  if (sw.samples < 1) throw Error(fmt::format("sweep: samples={} must be >= 1", sw.samples));
  if (sw.tasks.empty() || sw.lengths.empty()) throw Error("sweep: give at least one task and one length");
  for (const auto& t : sw.tasks)
    if (t != "niah" && std::find(ruler_tasks().begin(), ruler_tasks().end(), t) == ruler_tasks().end()) {
      std::string known = "niah";
      for (const auto& k : ruler_tasks()) known += ", " + k;
      throw Error(fmt::format("unknown task '{}' (known: {})", printable(t), known));
    }
  const Tokenizer& tok = model.tokenizer();
  PieceEncoder enc(tok);
  TokenCounter count = [&](const std::string& s) { return enc.count(s); };
  for (double d : sw.depths)
    if (!(d >= 0.0 && d <= 1.0)) throw Error(fmt::format("sweep: needle depth {} (TaskSweep::depths) is outside [0, 1]", d));
  for (int n : sw.lengths)
    if (n < 1) throw Error(fmt::format("sweep: context length {} (TaskSweep::lengths) must be >= 1", n));
  std::vector<double> depths = sw.depths;
  if (depths.empty()) depths.push_back(-1.0);  // a random depth per sample
  const size_t units = sw.tasks.size() * sw.lengths.size() * depths.size() * sw.samples * runs.size();
  const size_t first = sw.shard.begin(units), last = sw.shard.end(units);
  const size_t total = last - first;
  size_t done = 0, unit = 0;
  for (const auto& task : sw.tasks)
    for (int length : sw.lengths)
      for (double depth : depths)
        for (int i = 0; i < sw.samples; ++i, unit += runs.size()) {
          if (unit + runs.size() <= first || unit >= last) continue;
          // The depth is not part of the seed: at one length, every depth moves the same needle
          // through the same haystack.
          const uint64_t seed = sample_seed(sw.seed, fmt::format("{}/{}/{}", task, length, i));
          TaskSample sample;
          if (task == "niah") {
            double d = depth;
            if (d < 0) d = double(sample_seed(seed, "depth") >> 11) * 0x1.0p-53;
            sample = make_niah(sw.text, length, d, seed, count);
          } else {
            sample = make_ruler(task, sw.text, sw.ruler, length, depth, seed, count);
          }
          const TokenizedSample toks = tokenize_sample(sample, enc, tok);
          for (size_t k = 0; k < runs.size(); ++k) {
            if (unit + k < first || unit + k >= last) continue;
            const PressRun& run = runs[k];
            auto press = make_press_impl(run.spec, run.ratio);
            if (progress)
              progress(done, total, fmt::format("{} L={} d={} #{} {} r={:.2f}", task, length, depth, i, run.spec, run.ratio));
            TaskRecord rec;
            rec.index = unit + k;
            rec.task = task;
            rec.press = press->describe();
            rec.press_spec = run.spec;
            rec.ratio = run.ratio;
            rec.length = length;
            rec.depth = task == "niah" ? sample.needle_depths.at(0) : depth;
            rec.measured_depth = toks.needle_depths.empty() ? -1 : toks.needle_depths[0];
            rec.sample = i;
            rec.seed = seed;
            rec.answers = sample.answers;
            rec.needle_spans = toks.needle_spans;
            rec.outcome = run_task(model, *press, sample, toks, sw.text.stop, sw.run);
            on_record(rec);
            ++done;
          }
        }
  if (progress) progress(done, total, "done");
  return units;
}

std::vector<Token> sample_text(const Model& model, int n, uint64_t seed, const SessionOptions& session) {
  const Tokenizer& tok = model.tokenizer();
  std::vector<Token> start = with_bos(tok, {});
  if (start.empty()) throw Error("sampled text: the vocabulary has no BOS to start from; give a text file");
  RequestOptions ro;
  ro.session = session;
  Request req(model, make_press_impl("none", 0.0), ro);
  check_fits(req.session(), static_cast<size_t>(n) + 1, "sampled text");
  std::vector<Token> masked;
  for (Token t = 0; t < model.hparams().n_vocab; ++t)
    if (tok.is_eog(t) || tok.is_control(t)) masked.push_back(t);
  // The request's decode step with a sampler of its own: end-of-generation and control tokens
  // are never drawn, so the text always has n tokens.
  Sampler sampler({1.0f, 0, 1.0f, seed});
  req.set_prompt_tokens(start);
  req.prefill();
  std::vector<float> logits = req.logits();
  std::vector<Token> out;
  while (static_cast<int>(out.size()) < n) {
    for (Token t : masked) logits[t] = -std::numeric_limits<float>::infinity();
    const Token t = sampler.sample(logits);
    out.push_back(t);
    if (static_cast<int>(out.size()) < n) logits = req.advance(t);
  }
  return out;
}

size_t run_fidelity_sweep(const Model& model, const std::vector<PressRun>& runs, const FidelitySweep& sw,
                        const std::function<void(const FidelityRecord&)>& on_record,
                        const std::function<void(int, const AttentionStats&)>& on_stats, const ProgressFn& progress) {
  if (sw.samples < 1) throw Error(fmt::format("fidelity: samples={} must be >= 1", sw.samples));
  if (sw.context_tokens < 2 || sw.continuation_tokens < 2)
    throw Error(fmt::format("fidelity: context ({}) and continuation ({}) need at least 2 tokens each",
                            sw.context_tokens, sw.continuation_tokens));
  const Tokenizer& tok = model.tokenizer();
  const int n_bos = with_bos(tok, {}).size();
  const size_t per = static_cast<size_t>(sw.context_tokens - n_bos + sw.continuation_tokens);
  int samples = sw.samples;
  if (!sw.text.empty()) {
    samples = std::min<int>(samples, static_cast<int>(sw.text.size() / per));
    if (samples == 0)
      throw Error(fmt::format("fidelity: the text has {} tokens, one sample needs {} ({} context + {} continuation)",
                              sw.text.size(), per, sw.context_tokens, sw.continuation_tokens));
  }
  const size_t units = static_cast<size_t>(samples) * runs.size();
  const size_t first = sw.shard.begin(units), last = sw.shard.end(units);
  const size_t total = last - first;
  size_t done = 0;
  for (int i = 0; i < samples; ++i) {
    const size_t unit = static_cast<size_t>(i) * runs.size();
    if (unit + runs.size() <= first || unit >= last) continue;
    if (progress) progress(done, total, fmt::format("sample #{}: full-cache reference", i));
    std::vector<Token> text;
    if (sw.text.empty())
      text = sample_text(model, static_cast<int>(per), sample_seed(sw.seed, fmt::format("fidelity/{}", i)),
                         full_precision(sw.run.session));
    else
      text.assign(sw.text.begin() + i * per, sw.text.begin() + (i + 1) * per);
    std::vector<Token> prefix = with_bos(tok, std::vector<Token>(text.begin(), text.end() - sw.continuation_tokens));
    std::vector<Token> cont(text.end() - sw.continuation_tokens, text.end());
    if (on_stats && sw.lmba_window > 0 && unit >= first)
      on_stats(i, attention_stats(model, prefix, std::min<int>(sw.lmba_window, prefix.size()), sw.lmba_tau,
                                  full_precision(sw.run.session)));
    const FidelityReference ref = fidelity_reference(model, std::move(prefix), std::move(cont), sw.run);
    for (size_t k = 0; k < runs.size(); ++k) {
      if (unit + k < first || unit + k >= last) continue;
      const PressRun& run = runs[k];
      auto press = make_press_impl(run.spec, run.ratio);
      if (progress) progress(done, total, fmt::format("sample #{} {} r={:.2f}", i, run.spec, run.ratio));
      FidelityRecord rec;
      rec.index = unit + k;
      rec.press = press->describe();
      rec.press_spec = run.spec;
      rec.ratio = run.ratio;
      rec.sample = i;
      rec.outcome = run_fidelity(model, *press, ref, sw.run);
      on_record(rec);
      ++done;
    }
  }
  if (progress) progress(done, total, "done");
  return units;
}

}  // namespace kvslim
