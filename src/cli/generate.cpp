// `kvslim generate`: prefill, compress with a press, append the question, decode, and report
// what the press kept and the cache's memory.
#include <cstdio>
#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/cache_options.h"
#include "cli/commands.h"
#include "cli/context_size.h"
#include "cli/flag_names.h"
#include "cli/memory_estimate.h"
#include "cli/options.h"
#include "cli/progress.h"
#include "kvslim/press.h"
#include "kvslim/context.h"
#include "kvslim/generate.h"
#include "tools/tools.h"

namespace kvslim::cli {

namespace {

struct GenerateArgs {
  std::string model;
  ModelLoadOptions load;  // --rope-* / --yarn-* over the file's RoPE settings
  std::string prompt, prompt_file, question;
  bool prompt_given = false, file_given = false;  // -p "" is an empty prompt, not a missing one
  bool ratio_given = false, chunk_given = false;
  int n_predict = 64;
  std::string press = "none";
  double ratio = 0.0;
  float temp = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  uint64_t seed = 42;
  int threads = 0;
  int ctx = 0;
  int chunk_size = 0;
  std::string cache_type_k = "f16", cache_type_v = "f16";
  KVQuantOptions kv_quant;
  bool display_prompt = true;
  std::string json;
  bool no_progress = false;
  bool progress_lines = false;  // --progress: lines on a stderr that is not a terminal
  bool no_memory_check = false;
  bool chat = false;            // the prompt is a user message, rendered with the chat template
  std::string system_prompt;    // -sys: the conversation's system message (chat only)
  ChatTemplateArgs chat_template;
  AutoBudget auto_budget;
  std::string kv_budget;        // --kv-budget SIZE, parsed in run()
  std::string context_file;     // --context FILE: a stored context instead of -p/-f
  bool press_given = false, cache_given = false;
};

std::string human_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int u = 0;
  while (b >= 1024 && u < 3) b /= 1024, ++u;
  return fmt::format("{:.2f} {}", b, units[u]);
}

/// The chat template --chat uses: the flags' choice, or the model's, or ChatML with a warning on
/// stderr when the model has none (llama-server's fallback).
ChatTemplate chat_template_for(const Model& model, const ChatTemplateArgs& args) {
  std::string warning;
  ChatTemplate t = ChatTemplate::choose(model.file(), args.name, args.file, args.jinja, &warning);
  if (!warning.empty()) fmt::print(stderr, "warning: {}\n", flags_in(warning));
  return t;
}

/// `-cnv` without a prompt (llama-cli's conversation mode): reads user turns from stdin, one a line,
/// and prints each answer on stdout after a "> " prompt; "/exit" or the end of input ends it. Every
/// turn prefills the whole conversation again (rendered by the chat template) and the press
/// compresses it, so each answer sees the conversation as the press left it.
int run_chat(const GenerateArgs& a) {
  if (!a.json.empty()) throw Error("--json: an interactive chat (-cnv without -p or -f) writes no summary; give -p TEXT");
  if (!a.question.empty()) throw Error("--question: an interactive chat takes its turns from standard input");
  if (a.chunk_given && a.press == "none")
    throw Error(fmt::format("--chunk-size {} needs a press: add --press NAME", a.chunk_size));
  if (a.auto_budget.active() || !a.kv_budget.empty())
    throw Error("--target-kl / --kv-budget are for one request: give the prompt with -p TEXT");
  check_ratio(a.ratio, "--compression-ratio");
  if (a.press == "none" && a.ratio_given)
    throw Error(fmt::format("--compression-ratio {} needs a press: add --press NAME (see `kvslim presses`)", a.ratio));
  bool ratio_used = false;
  std::unique_ptr<Press> press = make_press(a.press, a.ratio, ratio_used);
  if (a.ratio_given) check_ratio_used(a.press, a.ratio, ratio_used, "--compression-ratio");
  apply_threads(a.threads);
  auto model = Model::load(a.model, a.load);
  const ChatTemplate t = chat_template_for(*model, a.chat_template);
  RequestOptions ro;
  ro.session.n_ctx = a.ctx;
  warn_context_size(*model, a.ctx);
  ro.session.key_codec = parse_codec(a.cache_type_k);
  ro.session.value_codec = parse_codec(a.cache_type_v);
  ro.session.kv_quant = a.kv_quant;
  ro.chunk_size = a.chunk_size;
  ro.n_predict = a.n_predict;
  ro.sampling = {a.temp, a.top_k, a.top_p, a.seed};
  // Models whose vocabulary lacks the family's end-of-turn token (the ChatML fallback) write it as text.
  if (!t.end_of_turn().empty()) ro.stop = {t.end_of_turn()};
  std::vector<ChatMessage> conversation;
  if (!a.system_prompt.empty()) conversation.push_back({"system", a.system_prompt});
  fmt::print(stderr, "chat with {} ({} template); type /exit or end the input (Ctrl-D) to quit\n", a.model, t.name());
  int turns = 0;
  std::string line;
  while (true) {
    fmt::print(stdout, "\n> ");
    std::fflush(stdout);
    if (!std::getline(std::cin, line)) {
      fmt::print(stdout, "\n");
      break;
    }
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "/exit") break;
    if (line.empty()) continue;
    conversation.push_back({"user", line});
    Request req(*model, *press, ro);
    req.set_prompt_tokens(t.tokenize(model->tokenizer(), conversation));
    const std::string& answer = req.run([](const TokenEvent& e) {
      fmt::print(stdout, "{}", e.piece);
      std::fflush(stdout);
      return true;
    });
    fmt::print(stdout, "\n");
    std::fflush(stdout);
    conversation.push_back({"assistant", answer});
    ++turns;
    if (req.finish_reason() == FinishReason::ContextFull) {
      fmt::print(stderr, "the conversation fills the context (-c {}): the chat ends here\n", req.position());
      break;
    }
  }
  fmt::print(stderr, "chat ended after {} turn{}\n", turns, turns == 1 ? "" : "s");
  return 0;
}

int run(const GenerateArgs& a) {
  const bool stored = !a.context_file.empty();
  if (stored) {
    // The stored context was compressed when it was built: everything that acts before the question
    // is the file's.
    if (a.prompt_given || a.file_given)
      throw Error("--context FILE is the context: drop -p / -f (the question goes in --question)");
    if (a.press_given || a.ratio_given || a.chunk_given)
      throw Error("--context FILE was compressed when it was built: drop --press / --compression-ratio / --chunk-size "
                  "(`kvslim context info FILE` shows its press)");
    if (a.cache_given)
      throw Error("--context FILE keeps the cache types it was built with: drop the cache type and KIVI flags");
    if (a.chat || a.chat_template.given() || !a.system_prompt.empty() || a.auto_budget.active() || !a.kv_budget.empty())
      throw Error("--context FILE does not take --chat, a chat template, a system prompt, --target-kl or --kv-budget");
  }
  if (!stored && a.prompt_given && a.file_given) throw Error("give the context with either -p TEXT or -f FILE, not both");
  if (!stored && !a.prompt_given && !a.file_given && (a.chat || !a.system_prompt.empty())) return run_chat(a);
  if (!stored && !a.prompt_given && !a.file_given)
    throw Error("no prompt: give the context with -p TEXT or -f FILE (or -cnv alone for an interactive chat)");
  check_ratio(a.ratio, "--compression-ratio");
  if (a.press == "none" && (a.ratio_given || a.chunk_given))
    throw Error(fmt::format("{} needs a press: add --press NAME (see `kvslim presses`); without one nothing is removed",
                            a.ratio_given ? fmt::format("--compression-ratio {}", a.ratio)
                                          : fmt::format("--chunk-size {}", a.chunk_size)));
  AutoBudget auto_budget = a.auto_budget;
  if (!a.kv_budget.empty()) auto_budget.kv_budget_bytes = parse_byte_size(a.kv_budget, "--kv-budget");
  if (auto_budget.active()) {
    if (a.press == "none")
      throw Error("--target-kl / --kv-budget choose a press's compression ratio: add --press NAME");
    if (a.ratio_given)
      throw Error("--target-kl / --kv-budget choose the compression ratio: drop --compression-ratio");
    if (a.chunk_given) throw Error("--target-kl / --kv-budget need the context compressed once: drop --chunk-size");
  }
  bool ratio_used = false;
  std::unique_ptr<Press> press = make_press(a.press, a.ratio, ratio_used);
  if (a.ratio_given) check_ratio_used(a.press, a.ratio, ratio_used, "--compression-ratio");
  check_json_output(a.json);
  GenerateOptions opt;
  opt.auto_budget = auto_budget;
  opt.context = a.file_given ? read_text_file(a.prompt_file, "-f") : a.prompt;
  opt.question = a.question;
  apply_threads(a.threads);
  const size_t available = available_memory();  // before the model takes its share
  auto model = Model::load(a.model, a.load);
  std::unique_ptr<Context> stored_context;
  double load_seconds = 0;
  if (stored) {
    const double t0 = steady_seconds();
    stored_context = std::make_unique<Context>(Context::load(*model, a.context_file));
    load_seconds = steady_seconds() - t0;
  }
  if (a.chat || a.chat_template.given() || !a.system_prompt.empty()) {
    // The same templates as `kvslim serve`: the prompt becomes the conversation's user message.
    const ChatTemplate t = chat_template_for(*model, a.chat_template);
    std::vector<ChatMessage> conversation;
    if (!a.system_prompt.empty()) conversation.push_back({"system", a.system_prompt});
    conversation.push_back({"user", opt.context});
    opt.context_tokens = t.tokenize(model->tokenizer(), conversation);
  }
  opt.n_predict = a.n_predict;
  opt.sampling = {a.temp, a.top_k, a.top_p, a.seed};
  opt.chunk_size = a.chunk_size;
  opt.session.n_ctx = a.ctx;
  warn_context_size(*model, a.ctx);
  opt.session.key_codec = parse_codec(a.cache_type_k);
  opt.session.value_codec = parse_codec(a.cache_type_v);
  opt.session.kv_quant = a.kv_quant;
  // With a stored context the press, its report and the cache types are the file's.
  std::string press_desc = press->describe(), press_report;
  std::string cache_type = describe_cache_config(opt.session.key_codec, opt.session.value_codec, a.kv_quant);
  if (stored_context) {
    const ContextInfo ci = stored_context->info();
    press_desc = ci.press;
    press_report = ci.press_report;
    cache_type = ci.cache_type;
  }
  // What the run will hold, checked before anything is prefilled: the tokens it can reach (prompt,
  // question and -n, within -c), the press's bound under chunked prefill.
  const Tokenizer& tok = model->tokenizer();
  const size_t context_tokens =
      stored_context                  ? static_cast<size_t>(stored_context->info().next_position)
      : !opt.context_tokens.empty() ? opt.context_tokens.size()
                                    : tok.encode(opt.context, tok.add_bos_default(), false).size();
  const size_t question_tokens = opt.question.empty() ? 0 : tok.encode(opt.question, false, false).size();
  const size_t n_ctx_run = static_cast<size_t>(a.ctx > 0 ? a.ctx : model->hparams().n_ctx_train);
  const size_t later = question_tokens + (a.n_predict < 0 ? n_ctx_run : static_cast<size_t>(a.n_predict));
  if (stored_context) {
    // The stored cache as it is, plus the question and generated entries.
    const ContextInfo ci = stored_context->info();
    const size_t more = std::min(later, n_ctx_run - std::min(n_ctx_run, context_tokens));
    MemoryEstimate e = estimate_memory(*model, opt.session.key_codec, opt.session.value_codec, opt.session.kv_quant,
                                       more, opt.session.batch);
    e.kv += ci.kv_bytes;
    e.kv_tokens = context_tokens + more;
    e.kv_codecs = ci.cache_type;
    report_memory(e, available, !a.no_memory_check);
  } else {
    report_memory(estimate_memory(*model, opt.session.key_codec, opt.session.value_codec, opt.session.kv_quant,
                                  kv_entries(press.get(), context_tokens, later, a.chunk_size, n_ctx_run),
                                  opt.session.batch),
                  available, !a.no_memory_check);
  }
  // A progress line while the prompt is prefilled (on a terminal after the first second; with
  // --progress, lines in a log).
  Progress progress(!a.no_progress, a.progress_lines);
  bool prefilling = true;
  if (progress.active() && !stored_context) {
    const size_t total = context_tokens + question_tokens;
    opt.session.on_batch_bytes = [&progress, &prefilling, total](int32_t pos, size_t kv_bytes) {
      if (prefilling) progress.prefill(static_cast<size_t>(pos), total, kv_bytes);
    };
  }
  // Text (prompt echo and continuation) goes to stdout, statistics to stderr; with --json - stdout
  // carries only the JSON and the text goes to stderr too.
  std::FILE* text_out = a.json == "-" ? stderr : stdout;
  // The prompt is echoed only once generation starts, so a rejected prompt prints just the error.
  bool echoed = false;
  auto echo_prompt = [&] {
    if (echoed) return;
    echoed = true;
    if (a.display_prompt)
      fmt::print(text_out, "{}{}", stored_context ? stored_context->text() : opt.context, opt.question);
  };
  auto on_text = [&](const std::string& s) {
    if (prefilling) {
      prefilling = false;
      progress.clear();
    }
    echo_prompt();
    fmt::print(text_out, "{}", s);
    std::fflush(text_out);
  };
  GenerateResult r = stored_context ? generate(*model, *stored_context, opt, on_text) : generate(*model, *press, opt, on_text);
  prefilling = false;
  progress.clear();
  echo_prompt();
  fmt::print(text_out, "\n");
  std::fflush(text_out);
  const GenerateStats& st = r.stats;
  const HParams& hp = model->hparams();
  const std::string reason = finish_reason_name(r.finish);
  const int n_ctx = a.ctx > 0 ? a.ctx : static_cast<int>(hp.n_ctx_train);
  if (r.finish == FinishReason::ContextFull)
    fmt::print(stderr, "generation stopped at the context limit (-c {}): {} prompt tokens, {} generated{}\n",
               n_ctx, st.context_tokens + st.question_tokens, st.generated_tokens,
               a.n_predict < 0 ? "" : fmt::format(" (-n {} asked for more; raise -c)", a.n_predict));
  fmt::print(stderr, "\n--- kvslim ---\n");
  fmt::print(stderr, "model            {} ({}, {} layers, {} query heads, {} KV heads, head_dim {}, {})\n", a.model,
             hp.arch, hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim, model->weight_type());
  if (hp.rope_freq_scale != 1.0f || hp.yarn_ext_factor != 0.0f || hp.yarn_attn_factor != 1.0f) {
    const char* kind = hp.rope_scaling == RopeScaling::Yarn ? "yarn" : hp.rope_scaling == RopeScaling::None ? "none" : "linear";
    std::string yarn;
    if (hp.yarn_ext_factor != 0.0f)
      yarn = fmt::format(", original context {}, ext factor {}, beta fast {} slow {}", hp.yarn_orig_ctx, hp.yarn_ext_factor,
                         hp.yarn_beta_fast, hp.yarn_beta_slow);
    fmt::print(stderr, "rope             {} scaling x{:g} (freq scale {:g}), base {:g}{}, attn factor {:g}\n", kind,
               1.0 / hp.rope_freq_scale, hp.rope_freq_scale, hp.rope_freq_base, yarn, hp.yarn_attn_factor);
  }
  fmt::print(stderr, "press            {}{}\n", press_desc,
             stored_context ? fmt::format(" (stored context {})", a.context_file) : "");
  fmt::print(stderr, "prompt tokens    {} context + {} question\n", st.context_tokens, st.question_tokens);
  if (stored_context)
    fmt::print(stderr, "stored context   {} B read and checked in {:.4f} s (model fingerprint included); only the "
                       "question is prefilled\n",
               stored_context->info().file_bytes, load_seconds);
  fmt::print(stderr, "entries kept     {} / {} ({:.1f}% kept, compression ratio {:.3f})\n", st.entries_kept,
             st.entries_total, 100.0 * st.entries_kept / std::max<size_t>(1, st.entries_total), st.compression_ratio());
  std::string per_layer;
  for (size_t l = 0; l < st.kept_per_layer.size(); ++l)
    per_layer += fmt::format("{}{}", l ? " " : "", st.kept_per_layer[l]);
  fmt::print(stderr, "kept per layer   {} (of {} each)\n", per_layer, st.context_tokens * hp.n_head_kv);
  fmt::print(stderr, "KV bytes         {} ({} B; full f16 cache {} B; memory ratio {:.3f})\n", human_bytes(st.kv_bytes),
             st.kv_bytes, st.full_f16_bytes, st.memory_ratio());
  if (st.shared_bytes)
    fmt::print(stderr, "shared bases     {} B held once per process for every request (not in the KV bytes)\n",
               st.shared_bytes);
  fmt::print(stderr, "KV cache type    {}; peak during prefill {} B\n", cache_type, st.peak_kv_bytes);
  // What the press did over the whole request, decode-time eviction included (a press that acts
  // only while decoding shows 0 above), measured from the cache at the end.
  fmt::print(stderr, "request          {} of {} entries removed over prefill and decode (compression ratio {:.3f})",
             st.entries_seen - std::min(st.entries_seen, st.entries_now), st.entries_seen,
             st.request_compression_ratio());
  if (st.key_channel_ratio() > 0) fmt::print(stderr, "; key channel ratio {:.3f}", st.key_channel_ratio());
  fmt::print(stderr, "\n");
  // The lines above are the cache right after compression; decoding adds entries (and decode-time
  // presses evict), so the cache the request ended with is shown too.
  if (st.generated_tokens > 0 && st.context_tokens > 0) {
    // A full f16 cache is the same bytes per token (KVCache::full_f16_bytes), so scale it to the
    // tokens the cache has seen: the last generated token is sampled, never run through the model.
    const size_t seen = st.context_tokens + st.question_tokens + st.generated_tokens - 1;
    const size_t full_seen = st.full_f16_bytes / st.context_tokens * seen;
    fmt::print(stderr, "KV bytes at end  {} ({} B after {} decoded token{}; a full f16 cache of the {} tokens run {} B; "
                       "memory ratio {:.3f})\n",
               human_bytes(st.final_kv_bytes), st.final_kv_bytes, st.generated_tokens,
               st.generated_tokens == 1 ? "" : "s", seen, full_seen,
               double(st.final_kv_bytes) / std::max<size_t>(1, full_seen));
  }
  double bits_per_entry = 0;
  if (st.entries_kept) {
    // Everything the cache holds per entry (key, value, scales, zero points, position, bookkeeping),
    // and per stored key or value element without the 4-byte position.
    bits_per_entry = 8.0 * st.kv_bytes / st.entries_kept;
    const double per_value = (bits_per_entry - 32.0) / (2.0 * hp.head_dim);
    fmt::print(stderr,
               "KV bits          {:.1f} bits per entry ({:.2f} bits per key/value element; full f16 cache: {} and 16)\n",
               bits_per_entry, per_value, 2 * 16 * hp.head_dim + 32);
  }
  if (st.auto_budget.used) {
    const AutoBudgetReport& ab = st.auto_budget;
    std::string line = fmt::format("ratio {:.4f} chosen after {} trial compressions", ab.ratio, ab.trials);
    if (auto_budget.kv_budget_bytes)
      line += fmt::format("; budget {} B {}", auto_budget.kv_budget_bytes, ab.budget_met ? "met" : "NOT met");
    if (auto_budget.target_kl > 0)
      line += fmt::format("; probe KL {:.5f} nats over {} {} tokens, target {} {}", ab.probe_kl, ab.probe_tokens,
                          ab.probe_is_question ? "question" : "held-out context", auto_budget.target_kl,
                          ab.target_met ? "met" : "NOT met");
    fmt::print(stderr, "auto-budget      {}\n", line);
  }
  if (stored_context)
    fmt::print(stderr, "prefill          {:.1f} tokens/s ({} question tokens, {:.3f} s; the context was prefilled and "
                       "compressed when it was stored)\n",
               st.prefill_seconds > 0 ? st.question_tokens / st.prefill_seconds : 0.0, st.question_tokens,
               st.prefill_seconds);
  else
    fmt::print(stderr, "prefill          {:.1f} tokens/s ({} tokens, {:.3f} s, press {:.3f} s)\n", st.prefill_tps(),
               st.context_tokens + st.question_tokens, st.prefill_seconds, st.press_seconds);
  fmt::print(stderr, "decode           {:.1f} tokens/s ({} tokens)\n", st.decode_tps(), st.generated_tokens);
  const std::string report = stored_context ? press_report : press->report();
  if (!report.empty()) fmt::print(stderr, "press report     {}\n", report);

  if (!a.json.empty()) {
    nlohmann::ordered_json j = {
        {"command", "generate"},
        {"model", a.model},
        {"arch", hp.arch},
        {"weight_type", model->weight_type()},
        {"press", press_desc},
        {"cache_type", cache_type},
        {"text", r.text},
        {"tokens", r.tokens},
        {"finish_reason", reason},
        {"n_predict", a.n_predict},
        {"n_ctx", n_ctx},
        {"context_tokens", st.context_tokens},
        {"question_tokens", st.question_tokens},
        {"generated_tokens", st.generated_tokens},
        {"entries_kept", st.entries_kept},
        {"entries_total", st.entries_total},
        {"kept_per_layer", st.kept_per_layer},
        {"compression_ratio", st.compression_ratio()},
        {"entries_seen", st.entries_seen},
        {"entries_now", st.entries_now},
        {"request_compression_ratio", st.request_compression_ratio()},
        {"key_channel_ratio", st.key_channel_ratio()},
        {"kv_bytes", st.kv_bytes},
        {"shared_bytes", st.shared_bytes},
        {"full_f16_bytes", st.full_f16_bytes},
        {"memory_ratio", st.memory_ratio()},
        {"peak_kv_bytes", st.peak_kv_bytes},
        {"final_kv_bytes", st.final_kv_bytes},
        {"bits_per_entry", bits_per_entry},
        {"prefill_seconds", st.prefill_seconds},
        {"press_seconds", st.press_seconds},
        {"decode_seconds", st.decode_seconds},
        {"prefill_tokens_per_second",
         stored_context ? (st.prefill_seconds > 0 ? st.question_tokens / st.prefill_seconds : 0.0) : st.prefill_tps()},
        {"decode_tokens_per_second", st.decode_tps()},
        {"press_report", report},
    };
    if (stored_context) {
      j["context_file"] = a.context_file;
      j["context_load_seconds"] = load_seconds;
    }
    if (st.auto_budget.used) {
      const AutoBudgetReport& ab = st.auto_budget;
      j["auto_budget"] = {{"ratio", ab.ratio},
                          {"trials", ab.trials},
                          {"kv_budget_bytes", auto_budget.kv_budget_bytes},
                          {"budget_met", ab.budget_met},
                          {"target_kl", auto_budget.target_kl},
                          {"probe_kl", ab.probe_kl},
                          {"probe_tokens", ab.probe_tokens},
                          {"probe_is_question", ab.probe_is_question},
                          {"target_met", ab.target_met}};
    }
    write_json(a.json, j);
  }
  return 0;
}

}  // namespace

void add_generate(CLI::App& app, Action& action) {
  auto a = std::make_shared<GenerateArgs>();
  auto* sub = app.add_subcommand("generate", "prefill a prompt, compress its KV cache with a press, and generate");
  add_model_option(sub, a->model, a->load);
  auto* prompt_opt = sub->add_option("-p,--prompt", a->prompt, "context text (compressed by the press)");
  auto* file_opt = sub->add_option("-f,--file", a->prompt_file, "read the context from a file ('-' = standard input)");
  sub->add_option("--question", a->question, "text appended after compression, never compressed");
  sub->add_option("-n,--n-predict", a->n_predict,
                  "tokens to generate (-1 = until end of generation or the context is full)")
      ->capture_default_str()
      ->check(int_range(-1, 1 << 30));
  sub->add_option("--press", a->press, "press spec: NAME[:key=value,...] (see `kvslim presses`)")->capture_default_str();
  auto* ratio_opt = sub->add_option("--compression-ratio", a->ratio,
                                    "fraction of context entries the press removes, in [0, 1) (needs --press)")
                        ->capture_default_str();
  sub->add_option("--temp", a->temp, "temperature; 0 = greedy")->capture_default_str()
      ->check(finite_range(0.0, 100.0));
  sub->add_option("--top-k", a->top_k, "top-k sampling (0 = off)")->capture_default_str()
      ->check(int_range(0, 1 << 30));
  sub->add_option("--top-p", a->top_p, "top-p sampling (1 = off)")->capture_default_str()
      ->check(finite_range(0.0, 1.0));
  sub->add_option("-s,--seed", a->seed, "random seed")->capture_default_str();
  add_threads_option(sub, a->threads);
  sub->add_option("-c,--ctx-size", a->ctx, "context size in tokens (0 = the model's)")->capture_default_str()
      ->check(int_at_least(0));
  auto* chunk_opt = sub->add_option("--chunk-size", a->chunk_size,
                                    "compress after every chunk of this many prompt tokens (0 = once; needs --press)")
                        ->capture_default_str()
                        ->check(int_at_least(0));
  add_cache_options(sub, a->cache_type_k, a->cache_type_v, a->kv_quant);
  sub->add_flag("!--no-display-prompt", a->display_prompt, "do not echo the prompt before the generated text");
  add_json_option(sub, a->json);
  add_no_progress_flag(sub, a->no_progress);
  add_progress_flag(sub, a->progress_lines);
  add_memory_check_flag(sub, a->no_memory_check);
  sub->add_flag("--chat", a->chat,
                "the prompt is a user message: apply the model's chat template (ChatML when it has none); without "
                "-p or -f, an interactive chat on standard input, '/exit' or end of input to quit (-cnv)");
  sub->add_option("--system-prompt", a->system_prompt, "system message of the chat (-sys; implies --chat)");
  add_chat_template_options(sub, a->chat_template);  // each implies --chat
  add_auto_budget_options(sub, a->auto_budget, a->kv_budget);
  sub->add_option("--context", a->context_file,
                  "answer from a stored context (`kvslim context build`) instead of -p/-f: its compressed cache is "
                  "loaded, not prefilled; the press and cache types are the file's");
  sub->callback([a, sub, &action, prompt_opt, file_opt, ratio_opt, chunk_opt] {
    a->press_given = sub->get_option("--press")->count() > 0;
    a->cache_given = false;
    for (const char* f : {"--cache-type-k", "--cache-type-v", "--kivi-bits", "--kivi-group", "--kivi-residual",
                          "--kv-hadamard"})
      a->cache_given = a->cache_given || sub->get_option(f)->count() > 0;
    a->prompt_given = prompt_opt->count() > 0;
    a->file_given = file_opt->count() > 0;
    a->ratio_given = ratio_opt->count() > 0;
    a->chunk_given = chunk_opt->count() > 0;
    action = [a] { return run(*a); };
  });
}

}  // namespace kvslim::cli
