// `kvslim latent-calibrate`: fits latent (low-rank) bases of every (layer, KV head)'s keys and
// values on calibration text and writes them to a GGUF file that `--press latent:file=...` loads.
#include <fstream>
#include <sstream>
#include <utility>

#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "tools/tools.h"

namespace kvslim::cli {

namespace {

struct CalibArgs {
  std::string model;
  ModelLoadOptions load;  // --rope-* / --yarn-* over the file's RoPE settings
  std::vector<std::string> text;
  std::string out, json;
  int doc_tokens = 512;
  int max_docs = 16;
  LatentCalibration opt;
  double target_kl = 0;            ///< > 0: bits chosen by measured KL (choose_latent_bits_by_kl)
  std::vector<std::string> kl_text;  ///< held-out text for the KL (default: the last document)
  std::string kl_scales = "channel";
  bool kl_per_segment = false;
  int threads = 0;
};

int run(const CalibArgs& a) {
  if (a.text.empty()) throw Error("give at least one calibration text file: -f FILE (also --text)");
  if (a.out.empty()) throw Error("give --out BASES.gguf");
  if (!(a.opt.energy > 0.0 && a.opt.energy <= 1.0))
    throw Error(fmt::format("--energy {} must be in (0, 1]", a.opt.energy));
  if (!(a.opt.memory_ratio >= 0.0 && a.opt.memory_ratio <= 1.0))
    throw Error(fmt::format("--memory-ratio {} must be in (0, 1] (0 = off)", a.opt.memory_ratio));
  if (a.opt.share > 1.0) throw Error(fmt::format("--share {} must be a tolerance in [0, 1] (or < 0 = off)", a.opt.share));
  if (a.opt.auto_bits && !(a.opt.memory_ratio > 0.0)) throw Error("--auto-bits needs --memory-ratio");
  // The held-out KL options only shape --target-kl's search: without it they would be ignored.
  if (!(a.target_kl > 0.0)) {
    if (a.kl_per_segment) throw Error("--kl-per-segment needs --target-kl");
    if (!a.kl_text.empty()) throw Error("--kl-text needs --target-kl");
    if (a.kl_scales != "channel") throw Error(fmt::format("--kl-scales {} needs --target-kl", a.kl_scales));
  }
  check_json_output(a.json);
  apply_threads(a.threads);
  auto model = Model::load(a.model, a.load);
  // A rank above head_dim was cut to head_dim silently.
  for (auto [flag, r] : {std::pair<const char*, int>{"--k-rank", a.opt.k_rank}, {"--v-rank", a.opt.v_rank}})
    if (r > model->hparams().head_dim)
      throw Error(fmt::format("{} {} must be at most the model's head_dim {}", flag, r, model->hparams().head_dim));
  const Tokenizer& tok = model->tokenizer();
  std::vector<std::vector<Token>> docs;
  for (const std::string& path : a.text) {
    std::vector<Token> all = tok.encode(read_text_file(path, "-f"), false, false);
    for (size_t b = 0; b < all.size() && static_cast<int>(docs.size()) < a.max_docs; b += a.doc_tokens) {
      std::vector<Token> doc;
      if (tok.add_bos_default() && tok.bos() >= 0) doc.push_back(tok.bos());
      doc.insert(doc.end(), all.begin() + b, all.begin() + std::min(all.size(), b + a.doc_tokens));
      docs.push_back(std::move(doc));
    }
  }
  if (!(a.target_kl >= 0.0)) throw Error(fmt::format("--target-kl {} must be >= 0 (0 = off)", a.target_kl));
  if (a.kl_scales != "channel" && a.kl_scales != "token")
    throw Error(fmt::format("--kl-scales {} must be channel or token", a.kl_scales));
  // The KL is measured on text the bases were not fitted on: --kl-text, else the last document.
  std::vector<std::vector<Token>> probe;
  if (a.target_kl > 0.0) {
    if (!a.kl_text.empty()) {
      for (const std::string& path : a.kl_text) {
        std::vector<Token> all = tok.encode(read_text_file(path, "--kl-text"), false, false);
        for (size_t b = 0; b < all.size(); b += a.doc_tokens) {
          std::vector<Token> doc;
          if (tok.add_bos_default() && tok.bos() >= 0) doc.push_back(tok.bos());
          doc.insert(doc.end(), all.begin() + b, all.begin() + std::min(all.size(), b + a.doc_tokens));
          probe.push_back(std::move(doc));
        }
      }
    } else {
      if (docs.size() < 2)
        throw Error(fmt::format("--target-kl holds the last calibration document out for the KL, but there is only {} "
                                "(give --kl-text, more text, or a smaller --doc-tokens)",
                                docs.size()));
      probe.push_back(docs.back());
      docs.pop_back();
    }
  }
  std::vector<std::string> report;
  LatentBases bases = calibrate_latent(*model, docs, a.opt, &report);
  if (a.target_kl > 0.0) {
    const LatentScales sc = a.kl_scales == "token" ? LatentScales::Token : LatentScales::Channel;
    const LatentBitsChoice c = choose_latent_bits_by_kl(*model, bases, probe, a.target_kl, sc, 0.25, a.kl_per_segment);
    const double full = static_cast<double>(bases.n_layer) * bases.n_head_kv * (4.0 * bases.head_dim + 4.0);
    for (const LatentBitsTrial& t : c.trials)
      report.push_back(fmt::format("bits by KL ({} scales): keys {:2d}, values {:2d}: {:.1f} bytes per entry (memory ratio "
                                   "{:.4f}), KL {:.6f} nats",
                                   a.kl_scales, t.k_bits, t.v_bits, t.bytes_per_entry, t.bytes_per_entry / full, t.kl));
    const LatentBitsTrial& ch = c.trials[c.chosen];
    report.push_back(fmt::format("chose keys {}-bit, values {}-bit (0 = f16): KL {:.6f} {} the target {} (use scales={})",
                                 ch.k_bits, ch.v_bits, ch.kl, c.target_met ? "within" : "NOT within", a.target_kl,
                                 a.kl_scales));
    if (a.kl_per_segment) {
      int nk[33] = {}, nv[33] = {};
      for (int b : bases.key_bits) ++nk[b];
      for (int b : bases.value_bits) ++nv[b];
      report.push_back(fmt::format("per segment: {} sides lowered one step; {:.1f} bytes per entry (memory ratio {:.4f}), "
                                   "KL {:.6f}; keys 2/4/8/f16-bit: {}/{}/{}/{}, values: {}/{}/{}/{}",
                                   c.steps, c.bytes_per_entry, c.bytes_per_entry / full, c.kl, nk[2], nk[4], nk[8],
                                   nk[0], nv[2], nv[4], nv[8], nv[0]));
    }
  }
  // The report is the result (stdout); with --json - stdout holds only the JSON.
  std::FILE* o = a.json == "-" ? stderr : stdout;
  for (const auto& line : report) fmt::print(o, "{}\n", line);
  bases.save(a.out, a.model);
  fmt::print(o, "wrote {} (use --press latent:file={})\n", a.out, a.out);
  if (!a.json.empty())
    write_json(a.json, nlohmann::ordered_json{{"command", "latent-calibrate"},
                                              {"model", a.model},
                                              {"bases", a.out},
                                              {"documents", docs.size()},
                                              {"report", report}});
  return 0;
}

}  // namespace

void add_latent_calibrate(CLI::App& app, Action& action) {
  auto a = std::make_shared<CalibArgs>();
  auto* sub = app.add_subcommand("latent-calibrate",
                                 "fit low-rank (latent) bases of keys and values on calibration text for the latent press");
  add_model_option(sub, a->model, a->load);
  sub->add_option("-f,--file,--text", a->text, "calibration text files (-f as the other trainers)")->expected(1, -1);
  sub->add_option("-o,--out", a->out, "bases file to write (GGUF)");
  sub->add_option("--doc-tokens", a->doc_tokens, "tokens per calibration document (each run from position 0)")
      ->capture_default_str()->check(int_range(2, 1 << 20));
  sub->add_option("--max-docs", a->max_docs, "documents at most")->capture_default_str()->check(int_range(1, 1 << 20));
  sub->add_option("--k-rank", a->opt.k_rank, "key rank for every segment (0 = chosen)")->capture_default_str()
      ->check(int_at_least(0));
  sub->add_option("--v-rank", a->opt.v_rank, "value rank for every segment (0 = chosen)")->capture_default_str()
      ->check(int_at_least(0));
  sub->add_option("--energy", a->opt.energy, "without ranks: keep this fraction of each segment's variance")
      ->capture_default_str();
  sub->add_option("--memory-ratio", a->opt.memory_ratio,
                  "choose ranks so an entry takes at most this fraction of its f16 bytes (bases excluded; 0 = off)")
      ->capture_default_str();
  sub->add_flag("--auto-bits", a->opt.auto_bits,
               "with --memory-ratio: choose every segment side's bits (2, 4, 8) together with its rank, for the least "
               "predicted error (variance beyond the rank + quantization error) under the byte budget");
  sub->add_option("--share", a->opt.share,
                  "share one basis across adjacent layers (per KV head and side) when the pooled basis keeps, for every "
                  "member, at least its own kept fraction minus this tolerance of its variance (-1 = off)")
      ->capture_default_str();
  sub->add_option("--share-max", a->opt.share_max, "layers per shared group at most (0 = any)")
      ->capture_default_str()->check(int_at_least(0));
  sub->add_option("--k-bits", a->opt.k_bits, "key code bits: 0 (f16), 2, 4, 8, 32 (f32)")->capture_default_str();
  sub->add_option("--v-bits", a->opt.v_bits, "value code bits: 0 (f16), 2, 4, 8, 32 (f32)")->capture_default_str();
  sub->add_option("--target-kl", a->target_kl,
                  "choose the key and value code bits (the same for every segment; 2, 4, 8 or f16) as the fewest bytes "
                  "whose measured KL over held-out text (the last quarter of each --kl-text document) is at most this "
                  "many nats (0 = off; --k-bits / --v-bits then only shape the ranks of a --memory-ratio)")
      ->capture_default_str();
  sub->add_option("--kl-text", a->kl_text, "held-out text for --target-kl (default: the last calibration document, "
                                           "left out of the fit)")
      ->expected(1, -1);
  sub->add_option("--kl-scales", a->kl_scales, "code scales --target-kl measures with: channel or token (pass the "
                                               "same to the press: latent:file=...,scales=)")
      ->capture_default_str();
  sub->add_flag("--kl-per-segment", a->kl_per_segment,
               "with --target-kl: after the uniform choice, lower single segment sides' bits one step at a time "
               "(least KL increase per byte saved) while the measured KL stays within the target");
  add_threads_option(sub, a->threads);
  add_json_option(sub, a->json);
  sub->callback([a, &action] { action = [a] { return run(*a); }; });
}

}  // namespace kvslim::cli
