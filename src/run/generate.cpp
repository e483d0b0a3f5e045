#include "kvslim/generate.h"

#include <algorithm>

#include "run/prefill.h"
#include "run/steps.h"

namespace kvslim {

std::vector<float> prefill_and_compress(Session& session, PressImpl& press, const std::vector<Token>& tokens,
                                        int chunk_size, size_t* peak_bytes, double* press_seconds) {
  press.reset();
  const size_t step = chunk_size > 0 ? static_cast<size_t>(chunk_size) : tokens.size();
  std::vector<float> logits;
  size_t peak = 0;
  const auto end = static_cast<int32_t>(session.next_position() + tokens.size());
  for (size_t b = 0; b < tokens.size(); b += step)
    logits = run::prefill_chunk(session, press, tokens.data() + b, std::min(step, tokens.size() - b), &peak,
                                press_seconds, end);
  if (peak_bytes) *peak_bytes = std::max(*peak_bytes, peak);
  return logits;
}

namespace run {

GenerateResult run_to_end(Request& req, const std::function<void(const std::string&)>& on_text) {
  TokenCallback cb;
  if (on_text) cb = [&](const TokenEvent& e) {
      on_text(e.piece);
      return true;
    };
  req.run(cb);
  GenerateResult res;
  res.text = req.text();
  res.tokens = req.generated();
  res.stats = req.stats();
  res.finish = req.finish_reason();
  return res;
}

}  // namespace run

GenerateResult generate(const Model& model, Press& press, const GenerateOptions& opt,
                        const std::function<void(const std::string&)>& on_text) {
  Request req(model, press, opt);
  if (opt.context_tokens.empty())
    req.set_prompt(opt.context, opt.question);
  else
    req.set_prompt_tokens(opt.context_tokens,
                          opt.question.empty() ? std::vector<Token>{} : model.tokenizer().encode(opt.question, false, false));
  return run::run_to_end(req, on_text);
}

}  // namespace kvslim
