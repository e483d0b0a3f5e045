#include "kvslim/generate.h"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

namespace kvslim {

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

double GenerateStats::prefill_tps() const {
  return prefill_seconds > 0 ? (context_tokens + question_tokens) / prefill_seconds : 0.0;
}
double GenerateStats::decode_tps() const {
  return decode_seconds > 0 && generated_tokens > 1 ? (generated_tokens - 1) / decode_seconds : 0.0;
}

std::vector<float> prefill_and_compress(Session& session, Press& press, const std::vector<Token>& tokens,
                                        int chunk_size, size_t* peak_bytes, double* press_seconds) {
  // A press object may serve several requests: nothing of the previous one may leak into this one.
  press.reset();
  const ObservationRequest req = press.request();
  const size_t step = chunk_size > 0 ? static_cast<size_t>(chunk_size) : tokens.size();
  std::vector<float> logits;
  size_t peak = 0;
  for (size_t b = 0; b < tokens.size(); b += step) {
    size_t e = std::min(tokens.size(), b + step);
    std::vector<Token> chunk(tokens.begin() + b, tokens.begin() + e);
    Observation obs;
    int32_t first = session.next_position();
    int32_t record_from = first + static_cast<int32_t>(chunk.size()) - std::max(req.window, 0);
    if (req.hidden_states || req.attention_mass || req.tokens) record_from = first;
    logits = session.forward(chunk, false, &req, &obs, std::max(record_from, first));
    peak = std::max(peak, session.cache().bytes());
    auto t0 = Clock::now();
    press.compress(session.cache(), session.model(), obs);
    if (press_seconds) *press_seconds += since(t0);
  }
  if (peak_bytes) *peak_bytes = std::max(*peak_bytes, peak);
  return logits;
}

GenerateResult generate(const Model& model, Press& press, const GenerateOptions& opt,
                        const std::function<void(const std::string&)>& on_text) {
  const Tokenizer& tok = model.tokenizer();
  GenerateResult res;
  GenerateStats& st = res.stats;
  std::vector<Token> ctx = tok.encode(opt.context, tok.add_bos_default(), false);
  size_t n_text = ctx.size() - ((!ctx.empty() && ctx[0] == tok.bos() && tok.add_bos_default()) ? 1 : 0);
  if (opt.context.empty() || n_text == 0) throw Error("empty prompt: give some text with -p or -f");
  std::vector<Token> q;
  if (!opt.question.empty()) q = tok.encode(opt.question, false, false);
  Session session(model, opt.session);
  const size_t need = ctx.size() + q.size() + std::max(opt.n_predict, 0);
  if (ctx.size() + q.size() > static_cast<size_t>(session.n_ctx()))
    throw Error(fmt::format("prompt of {} tokens ({} context + {} question) exceeds the context size -c {}",
                            ctx.size() + q.size(), ctx.size(), q.size(), session.n_ctx()));
  st.context_tokens = static_cast<int>(ctx.size());
  st.question_tokens = static_cast<int>(q.size());

  auto t0 = Clock::now();
  std::vector<float> logits = prefill_and_compress(session, press, ctx, opt.chunk_size, &st.peak_kv_bytes,
                                                   &st.press_seconds);
  const KVCache& cache = session.cache();
  st.entries_kept = cache.entries();
  st.entries_total = ctx.size() * cache.n_layer() * cache.n_head_kv();
  for (int l = 0; l < cache.n_layer(); ++l) st.kept_per_layer.push_back(cache.entries(l));
  st.kv_bytes = cache.bytes();
  st.full_f16_bytes = cache.full_f16_bytes(ctx.size());
  if (!q.empty()) logits = session.forward(q);
  st.prefill_seconds = since(t0);

  Sampler sampler(opt.sampling);
  const ObservationRequest dreq = press.decode_request();
  auto t1 = Clock::now();
  int max_new = static_cast<int>(std::min<size_t>(opt.n_predict, session.n_ctx() - session.next_position() + 1));
  (void)need;
  for (int i = 0; i < max_new; ++i) {
    Token t = sampler.sample(logits);
    if (i == 0) t1 = Clock::now();  // decode speed excludes the first token (it comes from prefill)
    res.tokens.push_back(t);
    if (tok.is_eog(t)) break;
    std::string piece = tok.piece(t);
    res.text += piece;
    if (on_text) on_text(piece);
    if (i + 1 == max_new || session.next_position() >= session.n_ctx()) break;
    // A decoding press (H2O, threshold:decode, the decoding wrapper) sees what it asked for.
    Observation dobs;
    const bool want = dreq.window > 0 || dreq.attention_mass || dreq.hidden_states || dreq.tokens ||
                      dreq.on_attention_input || dreq.selector;
    logits = session.forward({t}, false, want ? &dreq : nullptr, want ? &dobs : nullptr, session.next_position());
    press.after_decode(session.cache(), model, dobs);
  }
  st.generated_tokens = static_cast<int>(res.tokens.size());
  st.decode_seconds = since(t1);
  st.final_kv_bytes = session.cache().bytes();
  return res;
}

}  // namespace kvslim
