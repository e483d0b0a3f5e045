// `kvslim presses`: every registered press, budget policy and wrapper with its parameters,
// defaults and source, and the spec syntax `--press` accepts.
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "kvslim/press.h"

namespace kvslim::cli {

namespace {

constexpr const char* kSyntax = R"(Spec syntax (kvslim generate --press SPEC --compression-ratio R):
  NAME[:k=v,...]                 a scorer press, e.g. snapkv:window=32,kernel=7
  POLICY(SCORER)[:k=v,...]       a budget policy over a scorer, e.g. adakv(snapkv:window=32):alpha=0.3
  WRAPPER(SPEC)[:k=v,...]        a wrapper, e.g. key_rerotation(streaming_llm:n_sink=4)
  SPEC+SPEC+...                  composition: each press compresses what the previous ones left;
                                 kept fractions multiply, reported ratio = 1 - prod(1 - r_i)
  A policy or wrapper written without parentheses wraps its default inner press (listed above).
  Inside the parentheses, key=value items after "name:k=v" stay with the inner press while they
  are its parameters; the first other key and all later ones go to the outer press:
    adakv(snapkv:window=32,alpha=0.3)   window -> snapkv, alpha -> adakv
    threshold(knorm,tau=-4)             tau -> threshold (the inner spec has no ':' list)
    per_layer(knorm,ratios=0.2/0.5/0.5/0.7/0.9)
  kvpress's class and parameter names are accepted too, e.g.
    SnapKVPress:compression_ratio=0.5,window_size=32   AdaKVPress(SnapKVPress,alpha_safeguard=0.3)
  R fills every `ratio` the spec leaves unset (each part of a composition gets R unless it sets
  its own); `ratio=` after a policy or wrapper sets the ratio of what it wraps.
  With --chunk-size C the press acts after every chunk, its ratio applying to all context so far.
  budget=N (every scorer press and policy, e.g. snapkv:budget=4096, adakv(snapkv):budget=4096):
  instead of a ratio, each KV head keeps at most N context entries after every chunk (an adaptive
  policy keeps N x heads per layer; threshold and per_layer are capped at N per head), so the
  cache stops growing with the context. A budget and a ratio together are an error.
)";

// Whether a press with its default parameters can be stored as a context (kvslim context build):
// "" when it can, else why not; `known` is false when the press cannot be built without parameters
// or files of its own (then the check happens when a context is built).
std::string storage_refusal_of(const PressInfo& p, bool& known) {
  known = true;
  try {
    return make_press(p.name, 0.5)->storage_refusal();
  } catch (const Error&) {
    known = false;
    return {};
  }
}

std::string storage_line(const PressInfo& p) {
  bool known = false;
  const std::string why = storage_refusal_of(p, known);
  if (!known) return "checked by `kvslim context build` (the press needs parameters or files to be built)";
  if (why.empty()) return "yes, with its default parameters (kvslim context build)";
  return "no: " + why;
}

void print_group(PressKind kind, const char* title) {
  fmt::print("{}\n", title);
  for (const PressInfo* p : PressRegistry::instance().all()) {
    if (p->kind != kind) continue;
    std::string params;
    for (const auto& pp : p->params) params += fmt::format("{}{}={}", params.empty() ? "" : ",", pp.name, pp.default_value);
    fmt::print("  {:<20} {}\n", p->name, p->summary);
    fmt::print("  {:<20} parameters: {}\n", "", params.empty() ? "none" : params);
    if (!p->default_inner.empty()) fmt::print("  {:<20} default inner press: {}\n", "", p->default_inner);
    fmt::print("  {:<20} source: {}\n", "", p->source);
    fmt::print("  {:<20} stored context: {}\n", "", storage_line(*p));
    if (!p->kvpress.empty()) {
      std::string names;
      if (std::any_of(p->params.begin(), p->params.end(), [](const auto& pp) { return pp.name == "ratio"; }))
        names = "compression_ratio=ratio";
      for (const auto& pp : p->params)
        if (!pp.kvpress.empty()) names += fmt::format("{}{}={}", names.empty() ? "" : ", ", pp.kvpress, pp.name);
      std::string classes;
      for (const auto& c : p->kvpress) classes += (classes.empty() ? "" : " / ") + c;
      fmt::print("  {:<20} kvpress name: {}{}\n", "", classes, names.empty() ? "" : " (" + names + ")");
    }
  }
}

// true / false, or null when the press cannot be built with its defaults alone.
nlohmann::ordered_json storable_json(const PressInfo& p) {
  bool known = false;
  const std::string why = storage_refusal_of(p, known);
  if (!known) return nullptr;
  return why.empty();
}

const char* kind_name(PressKind k) {
  switch (k) {
    case PressKind::Scorer: return "scorer";
    case PressKind::Policy: return "policy";
    case PressKind::Wrapper: return "wrapper";
  }
  return "?";
}

/// A table cell: '|' would end the cell, a newline the row.
std::string cell(std::string s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : c == '\n' ? std::string(" ") : std::string(1, c);
  return out;
}

/// The registry as the Markdown table docs/PRESSES.md carries ("Every press's parameters"), so the
/// docs table is the registry's, not a second statement of it.
void print_markdown() {
  fmt::print("| press | kind | kvpress class | parameters (default; kvpress field) | what |\n|---|---|---|---|---|\n");
  for (const PressInfo* p : PressRegistry::instance().all()) {
    if (p->name.rfind("test_", 0) == 0) continue;
    std::string params;
    for (const auto& pp : p->params)
      params += fmt::format("{}`{}={}`{}", params.empty() ? "" : ", ", pp.name, pp.default_value,
                            pp.kvpress.empty() ? "" : " (" + pp.kvpress + ")");
    std::string classes;
    for (const auto& c : p->kvpress) classes += (classes.empty() ? "" : ", ") + c;
    std::string what = p->summary;
    if (!p->default_inner.empty()) what += "; inner press by default: `" + p->default_inner + "`";
    fmt::print("| `{}` | {} | {} | {} | {} |\n", p->name, kind_name(p->kind), classes.empty() ? "-" : cell(classes),
               params.empty() ? "-" : cell(params), cell(what));
  }
}

}  // namespace

void add_presses(CLI::App& app, Action& action) {
  auto* sub = app.add_subcommand("presses", "list the presses with their parameters and source papers");
  auto json = std::make_shared<std::string>();
  add_json_option(sub, *json);
  auto markdown = std::make_shared<bool>(false);
  sub->add_flag("--markdown", *markdown, "print the registry as the Markdown table of docs/PRESSES.md instead");
  sub->callback([&action, json, markdown] {
    action = [json, markdown] {
      if (*markdown) {
        if (!json->empty()) throw Error("--markdown and --json print two different formats: give one");
        print_markdown();
        return 0;
      }
      if (!json->empty()) {
        nlohmann::ordered_json list = nlohmann::ordered_json::array();
        for (const PressInfo* p : PressRegistry::instance().all()) {
          nlohmann::ordered_json params = nlohmann::ordered_json::object(), aliases = nlohmann::ordered_json::object();
          for (const auto& pp : p->params) {
            params[pp.name] = pp.default_value;
            if (!pp.kvpress.empty()) aliases[pp.kvpress] = pp.name;
          }
          list.push_back({{"name", p->name},
                          {"kind", kind_name(p->kind)},
                          {"summary", p->summary},
                          {"parameters", params},
                          {"default_inner", p->default_inner},
                          {"source", p->source},
                          {"storable", storable_json(*p)},
                          {"kvpress", p->kvpress},
                          {"kvpress_params", aliases}});
        }
        write_json(*json, nlohmann::ordered_json{{"command", "presses"}, {"presses", list}});
        if (*json == "-") return 0;
      }
      print_group(PressKind::Scorer, "Presses (scorers; uniform budget unless a policy wraps them):");
      print_group(PressKind::Policy, "\nBudget policies (POLICY(SCORER)):");
      print_group(PressKind::Wrapper, "\nWrappers (WRAPPER(SPEC)):");
      fmt::print("\n{}", kSyntax);
      return 0;
    };
  });
}

}  // namespace kvslim::cli
