// Press registry and the spec parser (syntax: include/kvslim/press.h).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <set>

#include <fmt/format.h>

#include "kvslim/press.h"
#include "press/authoring.h"
#include "press/wrappers.h"

namespace kvslim {

PressRegistry& PressRegistry::instance() {
  static PressRegistry r;
  return r;
}

void PressRegistry::add(PressInfo info) { presses_[info.name] = std::move(info); }

const PressInfo* PressRegistry::find(const std::string& name) const {
  auto it = presses_.find(name);
  return it == presses_.end() ? nullptr : &it->second;
}

std::vector<const PressInfo*> PressRegistry::all() const {
  std::vector<const PressInfo*> out;
  for (auto& [k, v] : presses_) out.push_back(&v);
  return out;
}

void check_ratio(double ratio, const std::string& press) {
  if (!(ratio >= 0.0 && ratio < 1.0))
    throw Error(fmt::format("press {}: compression ratio {} is outside [0, 1)", press, ratio));
}

double param_double(const PressParams& p, const std::string& press, const std::string& key) {
  const std::string& s = p.at(key);
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v))
    throw Error(fmt::format("press {}: parameter {}='{}' is not a finite number", press, key, printable(s)));
  return v;
}

int param_int(const PressParams& p, const std::string& press, const std::string& key) {
  const std::string& s = p.at(key);
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < -(1L << 30) || v > (1L << 30))
    throw Error(fmt::format("press {}: parameter {}='{}' is not an integer", press, key, printable(s)));
  return static_cast<int>(v);
}

std::string param_str(const PressParams& p, const std::string& press, const std::string& key) { return p.at(key); }

bool param_bool(const PressParams& p, const std::string& press, const std::string& key) {
  const std::string& s = p.at(key);
  if (s != "0" && s != "1")
    throw Error(fmt::format("press {}: parameter {}='{}' must be 0 or 1", press, key, printable(s)));
  return s == "1";
}

std::vector<double> param_double_list(const PressParams& p, const std::string& press, const std::string& key) {
  const std::string& s = p.at(key);
  std::vector<double> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find('/', i);
    if (j == std::string::npos) j = s.size();
    std::string item = s.substr(i, j - i);
    char* end = nullptr;
    double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !std::isfinite(v))
      throw Error(fmt::format("press {}: parameter {}='{}': '{}' is not a finite number", press, key, printable(s),
                              printable(item)));
    out.push_back(v);
    i = j + 1;
  }
  return out;
}

namespace {

std::string trim(const std::string& s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

/// Splits at `sep` outside parentheses. For '+', only where a press name follows (a letter), so
/// numbers such as 1e+5 stay whole.
std::vector<std::string> split_top(const std::string& s, char sep, const std::string& whole) {
  std::vector<std::string> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '(') ++depth;
    if (c == ')' && --depth < 0) throw Error(fmt::format("press spec '{}': unbalanced ')'", whole));
    bool split = depth == 0 && c == sep;
    if (split && sep == '+') {
      size_t k = i + 1;
      while (k < s.size() && s[k] == ' ') ++k;
      if (k == s.size()) throw Error(fmt::format("press spec '{}': no press after the final '+'", whole));
      split = std::isalpha(static_cast<unsigned char>(s[k])) || s[k] == '_';
      if (split && trim(s.substr(start, i - start)).empty())
        throw Error(fmt::format("press spec '{}': no press before '+'", whole));
    }
    if (split) {
      out.push_back(trim(s.substr(start, i - start)));
      start = i + 1;
    }
  }
  if (depth != 0) throw Error(fmt::format("press spec '{}': unbalanced '('", whole));
  out.push_back(trim(s.substr(start)));
  return out;
}

std::string known_presses() {
  std::string known;
  for (const PressInfo* p : PressRegistry::instance().all()) known += (known.empty() ? "" : ", ") + p->name;
  return known;
}

/// Our parameter name for a kvpress field of `info` ("window_size" -> "window"; compression_ratio
/// -> ratio); the key itself when it has no alias.
std::string kvpress_param_to_ours(const PressInfo& info, const std::string& key) {
  if (key == "compression_ratio") return "ratio";
  for (const PressParam& pp : info.params)
    if (pp.kvpress == key) return pp.name;
  return key;
}

/// Reads key=value items into `params` (which holds the defaults); `extra` are accepted keys not
/// in the defaults. Unknown, malformed and repeated keys raise errors naming the press.
void read_params(const std::string& press, const std::vector<std::string>& items, const PressInfo& info,
                 PressParams& params, std::set<std::string>& given, const std::set<std::string>& extra = {}) {
  for (const std::string& raw : items) {
    std::string kv = trim(raw);
    if (kv.empty()) continue;
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error(fmt::format("press {}: parameter '{}' should be key=value", press, printable(kv)));
    std::string k = kvpress_param_to_ours(info, trim(kv.substr(0, eq))), v = trim(kv.substr(eq + 1));
    // kvpress users write Python booleans.
    if (v == "True" || v == "true") v = "1";
    if (v == "False" || v == "false") v = "0";
    bool known = extra.count(k) > 0;
    for (const PressParam& pp : info.params) known = known || pp.name == k;
    if (!known) {
      std::string names;
      for (const PressParam& pp : info.params) names += (names.empty() ? "" : ", ") + pp.name;
      for (const auto& e : extra) names += (names.empty() ? "" : ", ") + e;
      throw Error(fmt::format("press {}: unknown parameter '{}' (parameters: {})", press, printable(k),
                              names.empty() ? "none" : names));
    }
    if (!given.insert(k).second)
      throw Error(fmt::format("press {}: parameter '{}' given twice", press, printable(k)));
    params[k] = v;
  }
}

bool has_param(const PressInfo& info, const std::string& key_in) {
  const std::string key = kvpress_param_to_ours(info, key_in);
  for (const PressParam& pp : info.params)
    if (pp.name == key) return true;
  return false;
}

/// A press by its kvslim name or its kvpress class name (SnapKVPress -> snapkv); nullptr if none.
const PressInfo* find_press(const std::string& name) {
  if (const PressInfo* p = PressRegistry::instance().find(name)) return p;
  for (const PressInfo* p : PressRegistry::instance().all())
    if (std::find(p->kvpress.begin(), p->kvpress.end(), name) != p->kvpress.end()) return p;
  return nullptr;
}

/// The press whose ':' parameter list ends `spec` (the last term of a composition, with its
/// parentheses skipped: "a+criticalkv(snapkv):epsilon=0.1" -> criticalkv); nullptr when the last
/// term has no top-level ':' list or names no press.
const PressInfo* listed_press(const std::string& spec, const std::string& whole) {
  const std::string term = split_top(spec, '+', whole).back();
  int depth = 0;
  for (size_t i = 0; i < term.size(); ++i) {
    if (term[i] == '(') ++depth;
    if (term[i] == ')') --depth;
    if (depth == 0 && term[i] == ':') return find_press(trim(term.substr(0, term.find_first_of("(:"))));
  }
  return nullptr;
}

std::unique_ptr<PressImpl> build(const std::string& spec_in, double ratio, const std::string& whole, bool& ratio_used);

/// `ratio_used` is set when the built press keeps its entries by `ratio` (the caller's ratio, not
/// one written in the spec).
std::unique_ptr<PressImpl> build_term(const std::string& spec, double ratio, const std::string& whole, bool& ratio_used) {
  if (spec.empty()) throw Error(fmt::format("press spec '{}': empty press name", whole));
  size_t p = spec.find_first_of("(:");
  std::string name = trim(spec.substr(0, p));
  std::string inner_text, outer_text;
  bool has_inner = false;
  if (p != std::string::npos && spec[p] == '(') {
    int depth = 0;
    size_t close = std::string::npos;
    for (size_t i = p; i < spec.size(); ++i) {
      if (spec[i] == '(') ++depth;
      if (spec[i] == ')' && --depth == 0) {
        close = i;
        break;
      }
    }
    if (close == std::string::npos) throw Error(fmt::format("press spec '{}': unbalanced '('", whole));
    has_inner = true;
    inner_text = trim(spec.substr(p + 1, close - p - 1));
    std::string after = trim(spec.substr(close + 1));
    if (!after.empty()) {
      if (after[0] != ':')
        throw Error(fmt::format("press spec '{}': unexpected '{}' after '{}(...)'", whole, printable(after),
                                printable(name)));
      outer_text = after.substr(1);
    }
  } else if (p != std::string::npos) {
    outer_text = spec.substr(p + 1);
  }
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_'))
      throw Error(fmt::format("press spec '{}': '{}' is not a press name", whole, printable(name)));
  const PressInfo* info = find_press(name);
  if (!info) throw Error(fmt::format("unknown press '{}' (known: {})", printable(name), known_presses()));
  name = info->name;

  PressParams params;
  for (const PressParam& pp : info->params) params[pp.name] = pp.default_value;
  std::set<std::string> given;

  // budget=N, the per-head entry budget, belongs to the budget policy (BudgetPolicy::budget): every
  // scorer press and policy takes it without declaring it, unless it has a budget of its own.
  const bool generic_budget = info->kind != PressKind::Wrapper && !has_param(*info, "budget");
  const std::set<std::string> budget_key = generic_budget ? std::set<std::string>{"budget"} : std::set<std::string>{};
  size_t budget = 0;
  auto take_budget = [&] {
    if (!generic_budget || !given.count("budget")) return;
    const int b = param_int(params, name, "budget");
    if (b < 1) throw Error(fmt::format("press {}: budget={} must be at least 1 entry per KV head", name, b));
    budget = static_cast<size_t>(b);
    params.erase("budget");
  };
  auto refuse_ratio_with_budget = [&](double r) {
    if (budget > 0 && r > 0.0)
      throw Error(fmt::format("press {}: budget={} and ratio={} given together: a budget fixes the entries each KV "
                              "head keeps, a compression ratio the share it removes; give one of them",
                              name, budget, r));
  };

  if (info->kind == PressKind::Scorer) {
    if (has_inner) throw Error(fmt::format("press {} takes no inner press: '{}'", name, printable(spec)));
    read_params(name, split_top(outer_text, ',', whole), *info, params, given, budget_key);
    take_budget();
    if (has_param(*info, "ratio")) {
      if (!given.count("ratio") && budget == 0) {
        params["ratio"] = fmt::format("{}", ratio);
        ratio_used = true;
      }
      check_ratio(param_double(params, name, "ratio"), name);
      refuse_ratio_with_budget(param_double(params, name, "ratio"));
    }
    std::unique_ptr<PressImpl> press = info->make(params);
    if (budget > 0) {
      auto* sp = press->scorer();
      if (!sp) throw Error(fmt::format("press {} does not keep entries by score, so it takes no budget", name));
      sp->set_budget(budget);
    }
    return press;
  }

  // Policy or wrapper: split the inner spec from the outer parameters.
  std::string inner_spec = info->default_inner;
  std::vector<std::string> outer_items;
  if (has_inner) {
    std::vector<std::string> items = split_top(inner_text, ',', whole);
    inner_spec = items[0];
    if (inner_spec.empty()) throw Error(fmt::format("press {}: empty inner press in '{}'", name, printable(spec)));
    // Keys after the inner spec stay with its last press while that press has a ':' list and the
    // key is one of its parameters ("leankv(criticalkv(snapkv):epsilon=0.1,low=0.5)" gives epsilon
    // to criticalkv); the first other key and every later one belong to the outer press.
    bool to_inner = true;
    for (size_t i = 1; i < items.size(); ++i) {
      const std::string key = trim(items[i].substr(0, items[i].find('=')));
      const PressInfo* in_info = to_inner ? listed_press(inner_spec, whole) : nullptr;
      if (in_info && has_param(*in_info, key))
        inner_spec += "," + items[i];
      else {
        to_inner = false;
        outer_items.push_back(items[i]);
      }
    }
  }
  for (auto& item : split_top(outer_text, ',', whole)) outer_items.push_back(item);
  std::set<std::string> outer_extra = budget_key;
  outer_extra.insert("ratio");
  read_params(name, outer_items, *info, params, given, outer_extra);
  take_budget();
  bool inner_used = false;
  // Under the policy's budget the caller's ratio does not fill the inner press's.
  std::unique_ptr<PressImpl> inner = build(inner_spec, budget > 0 ? 0.0 : ratio, whole, inner_used);
  if (given.count("ratio")) {
    inner_used = false;  // the spec's own ratio replaces the caller's
    double r = param_double(params, name, "ratio");
    check_ratio(r, name);
    refuse_ratio_with_budget(r);
    inner->set_ratio(r);
  }
  params.erase("ratio");
  if (info->kind == PressKind::Policy) {
    auto* sp = inner->scorer();
    if (!sp)
      throw Error(fmt::format("press {}: a budget policy needs a scorer press inside, got '{}'", name,
                              inner->describe()));
    if (sp->policy().describe() != "uniform")
      throw Error(fmt::format("press {}: '{}' already has a budget policy", name, inner->describe()));
    sp->set_policy(info->make_policy(params));
    if (budget > 0) {
      refuse_ratio_with_budget(sp->ratio());
      sp->set_budget(budget);
    }
    // threshold and per_layer keep by their own parameters whatever the scorer's ratio
    if (inner_used && sp->policy().uses_ratio()) ratio_used = true;
    return inner;
  }
  if (inner_used) ratio_used = true;
  // Wrappers that score through the inner press and choose entries themselves would ignore its
  // budget; the ones that run its apply() honour it.
  if (auto* sp = inner->scorer();
      sp && sp->policy().budget() > 0 && name != "key_rerotation" && name != "decoding")
    throw Error(fmt::format("press {}: the inner press's budget={} would be ignored ({} chooses the entries itself); "
                            "give the budget to a press or policy outside it",
                            name, sp->policy().budget(), name));
  return info->make_wrapper(params, std::move(inner));
}

std::unique_ptr<PressImpl> build(const std::string& spec_in, double ratio, const std::string& whole, bool& ratio_used) {
  std::vector<std::string> parts = split_top(trim(spec_in), '+', whole);
  if (parts.size() == 1) return build_term(parts[0], ratio, whole, ratio_used);
  std::vector<std::unique_ptr<PressImpl>> presses;
  for (const auto& part : parts) presses.push_back(build_term(part, ratio, whole, ratio_used));
  // A decode-time selector indexes the entries present when decoding starts; a press that evicts
  // during decode would leave it pointing at entries that no longer exist.
  for (size_t i = 0; i < presses.size(); ++i)
    for (size_t j = 0; j < presses.size(); ++j)
      if (i != j && presses[i]->selects_in_decode() && presses[j]->evicts_in_decode())
        throw Error(fmt::format("press spec '{}': {} selects entries for attention at decode time and {} evicts "
                                "entries during decode; they cannot be combined (run them separately)",
                                whole, printable(trim(parts[i])), printable(trim(parts[j]))));
  // think and latent both turn a segment into latent codes, and a segment that is latent already is
  // left alone by either (so chunked prefill keeps the first chunk's bases): the later of two such
  // stages would do nothing.
  std::string first_latent;
  for (const auto& part : parts) {
    const std::string t = trim(part);
    const PressInfo* info = find_press(trim(t.substr(0, t.find_first_of("(:"))));
    if (!info || (info->name != "think" && info->name != "latent")) continue;
    if (!first_latent.empty())
      throw Error(fmt::format("press spec '{}': {} and {} both store segments as latent codes, and a segment is "
                              "converted once, so the second would do nothing; use one of them",
                              whole, printable(first_latent), printable(t)));
    first_latent = t;
  }
  return std::make_unique<ComposedPress>(std::move(presses));
}

}  // namespace

std::unique_ptr<PressImpl> make_press_impl(const std::string& spec, double ratio) {
  bool ratio_used = false;
  return make_press_impl(spec, ratio, ratio_used);
}

std::unique_ptr<Press> make_press(const std::string& spec, double ratio) { return make_press_impl(spec, ratio); }

std::unique_ptr<Press> make_press(const std::string& spec, double ratio, bool& ratio_used) {
  return make_press_impl(spec, ratio, ratio_used);
}

std::unique_ptr<PressImpl> make_press_impl(const std::string& spec, double ratio, bool& ratio_used) {
  ratio_used = false;
  if (!(ratio >= 0.0 && ratio < 1.0))
    throw Error(fmt::format("press spec '{}': compression ratio {} is outside [0, 1)", printable(spec, 200), ratio));
  // Bounds before parsing: the parser recurses once per nesting level and copies the remaining
  // text at each, so an unbounded spec costs stack and quadratic memory.
  if (spec.size() > kMaxPressSpecLength)
    throw Error(fmt::format("press spec of {} characters is longer than the limit of {}", spec.size(),
                            kMaxPressSpecLength));
  int depth = 0, deepest = 0;
  for (char c : spec) {
    if (c == '(') deepest = std::max(deepest, ++depth);
    if (c == ')') --depth;
  }
  if (deepest > kMaxPressSpecDepth)
    throw Error(fmt::format("press spec '{}': {} nested parentheses, more than the limit of {}",
                            printable(spec, 40), deepest, kMaxPressSpecDepth));
  return build(spec, ratio, printable(spec, 300), ratio_used);  // the spec as error messages quote it
}

void check_ratio_used(const std::string& spec, double ratio, const std::string& what) {
  if (ratio <= 0.0) return;
  bool used = false;
  make_press_impl(spec, ratio, used);
  check_ratio_used(spec, ratio, used, what);
}

void check_ratio_used(const std::string& spec, double ratio, bool ratio_used, const std::string& what) {
  if (ratio > 0.0 && !ratio_used)
    throw Error(fmt::format("{} {}: press '{}' does not keep its entries by a compression ratio, so it would be "
                            "ignored; drop it, or set the press's own parameters (`kvslim presses` lists them)",
                            what, ratio, printable(spec, 200)));
}

}  // namespace kvslim
