// Fidelity of every KV cache codec, alone and under SnapKV, on the bundled model: for each
// reference text, the context is prefilled (and compressed by the press), the continuation is
// teacher-forced, and each next-token distribution is compared with the full f32 cache's:
// KL(full f32 || tested), top-1 agreement. Memory ratio = cache bytes after compression / a full
// f16 cache of the context (measured from the cache).
//
// Texts: the five prompts of ../shared/models/reference/prompts.txt (with BOS); those shorter than
// context + continuation are extended by sampling the model (f32 cache, temperature 0.8, seeded).
// Build and run: tools/build_kv_tools.sh && build-kvquant/kv_fidelity [context] [continuation]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kvslim/eval.h"
#include "kvslim/press.h"
#include "kvslim/sampling.h"
#include "model/session.h"
#include "kvslim/threads.h"

using namespace kvslim;

namespace {

struct Cfg {
  std::string name;
  KVCodec k, v;
  KVQuantOptions q;
  std::string wrap;  // press wrapper around snapkv ("leankv" tiers), empty = none
};

std::vector<std::string> read_prompts(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path + ": cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string all = ss.str(), sep = "__prompt__\n";
  std::vector<std::string> out;
  size_t b = 0;
  for (;;) {
    size_t e = all.find(sep, b);
    std::string p = all.substr(b, e == std::string::npos ? std::string::npos : e - b);
    // The separator line follows a newline that belongs to the file layout, not the prompt.
    if (e != std::string::npos && !p.empty() && p.back() == '\n') p.pop_back();
    out.push_back(p);
    if (e == std::string::npos) break;
    b = e + sep.size();
  }
  return out;
}

std::vector<Token> extend(const Model& model, std::vector<Token> toks, size_t n, uint64_t seed) {
  if (toks.size() >= n) return std::vector<Token>(toks.begin(), toks.begin() + n);
  SessionOptions o;
  o.key_codec = o.value_codec = KVCodec::F32;
  Session s(model, o);
  Sampler sampler({0.8f, 40, 0.95f, seed});
  std::vector<float> logits = s.forward(toks);
  while (toks.size() < n) {
    Token t = sampler.sample(logits);
    if (model.tokenizer().is_eog(t)) t = model.tokenizer().encode(" ", false, false).back();
    toks.push_back(t);
    logits = s.forward({t});
  }
  return toks;
}

}  // namespace

int main(int argc, char** argv) try {
  const int n_ctx_tok = argc > 1 ? std::atoi(argv[1]) : 320, n_cont = argc > 2 ? std::atoi(argv[2]) : 128;
  set_num_threads(2);
  auto model = Model::load("models/stories260K.gguf");
  const auto prompts = read_prompts(std::string(getenv("KVSLIM_SHARED") ? getenv("KVSLIM_SHARED") : "../shared") +
                                    "/models/reference/prompts.txt");
  std::vector<std::vector<Token>> texts;
  for (size_t i = 0; i < prompts.size(); ++i)
    texts.push_back(extend(*model, model->tokenizer().encode(prompts[i], true, false), n_ctx_tok + n_cont, 100 + i));

  std::vector<Cfg> cfgs = {{"f32", KVCodec::F32, KVCodec::F32, {}, ""},
                           {"f16", KVCodec::F16, KVCodec::F16, {}, ""},
                           {"bf16", KVCodec::BF16, KVCodec::BF16, {}, ""},
                           {"q8_0", KVCodec::Q8_0, KVCodec::Q8_0, {}, ""},
                           {"q8_0 K / q4_0 V", KVCodec::Q8_0, KVCodec::Q4_0, {}, ""},
                           {"q4_0", KVCodec::Q4_0, KVCodec::Q4_0, {}, ""}};
  KVQuantOptions h;
  h.hadamard = true;
  cfgs.push_back({"q4_0 + Hadamard", KVCodec::Q4_0, KVCodec::Q4_0, h, ""});
  for (int bits : {4, 2})
    for (int R : {128, 32})
      for (bool had : {false, true}) {
        if (had && R != 32) continue;
        KVQuantOptions q;
        q.kivi_bits = bits;
        q.kivi_group = 32;
        q.kivi_residual = R;
        q.hadamard = had;
        cfgs.push_back({fmt::format("KIVI-{} G=32 R={}{}", bits, R, had ? " + Hadamard" : ""), KVCodec::F16,
                        KVCodec::F16, q, ""});
      }
  cfgs.push_back({"LeanKV tiers: f16, lower-scored half of kept at q8_0 K + q4_0 V", KVCodec::F16, KVCodec::F16, {}, "leankv"});

  RunOptions ref_opt;
  ref_opt.session.key_codec = ref_opt.session.value_codec = KVCodec::F32;
  std::vector<FidelityReference> refs;
  for (const auto& t : texts)
    refs.push_back(fidelity_reference(*model, std::vector<Token>(t.begin(), t.begin() + n_ctx_tok),
                                      std::vector<Token>(t.begin() + n_ctx_tok, t.end()), ref_opt));

  fmt::print("{} texts x ({} context + {} continuation tokens), KL(full f32 cache || tested) in nats per token\n\n",
             texts.size(), n_ctx_tok, n_cont);
  fmt::print("| cache | press | mean KL | max KL | top-1 agreement | memory ratio | bits/element |\n");
  fmt::print("|---|---|---:|---:|---:|---:|---:|\n");
  for (const Cfg& c : cfgs) {
    for (double ratio : {0.0, 0.5, 0.75}) {
      if (!c.wrap.empty() && ratio == 0.0) continue;
      const std::string spec = c.wrap.empty() ? (ratio == 0 ? "none" : "snapkv") : c.wrap + "(snapkv)";
      auto press = make_press(spec, ratio);
      RunOptions opt;
      opt.session.key_codec = c.k;
      opt.session.value_codec = c.v;
      opt.session.kv_quant = c.q;
      FidelityAccumulator acc;
      double mem = 0, bits = 0;
      for (const auto& ref : refs) {
        FidelityOutcome o = run_fidelity(*model, *press, ref, opt);
        acc.merge(o.metrics);
        mem += o.cache.memory_ratio() / refs.size();
        bits += (8.0 * o.cache.kv_bytes / o.cache.entries_kept - 32.0) / (2.0 * model->hparams().head_dim) / refs.size();
      }
      fmt::print("| {} | {} | {:.5f} | {:.4f} | {:.3f} | {:.3f} | {:.2f} |\n", c.name,
                 ratio == 0 ? "none" : fmt::format("{} {}", spec, ratio), acc.mean_kl(), acc.max_kl(),
                 acc.top1_agreement(), mem, bits);
      std::fflush(stdout);
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
