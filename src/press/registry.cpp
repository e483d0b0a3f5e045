// Press registry and the "name:key=value,..." spec parser.
#include <cstdlib>

#include <fmt/format.h>

#include "kvslim/press.h"

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
  if (s.empty() || *end != '\0')
    throw Error(fmt::format("press {}: parameter {}='{}' is not a number", press, key, s));
  return v;
}

int param_int(const PressParams& p, const std::string& press, const std::string& key) {
  const std::string& s = p.at(key);
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < -(1L << 30) || v > (1L << 30))
    throw Error(fmt::format("press {}: parameter {}='{}' is not an integer", press, key, s));
  return static_cast<int>(v);
}

std::string param_str(const PressParams& p, const std::string& press, const std::string& key) { return p.at(key); }

std::unique_ptr<Press> make_press(const std::string& spec, double ratio) {
  std::string name = spec, rest;
  if (auto c = spec.find(':'); c != std::string::npos) {
    name = spec.substr(0, c);
    rest = spec.substr(c + 1);
  }
  const PressInfo* info = PressRegistry::instance().find(name);
  if (!info) {
    std::string known;
    for (const PressInfo* p : PressRegistry::instance().all()) known += (known.empty() ? "" : ", ") + p->name;
    throw Error(fmt::format("unknown press '{}' (known: {})", name, known));
  }
  PressParams params;
  for (auto& [k, v] : info->params) params[k] = v;
  bool has_ratio = params.count("ratio") > 0;
  if (has_ratio) params["ratio"] = fmt::format("{}", ratio);
  size_t i = 0;
  while (i < rest.size()) {
    size_t j = rest.find(',', i);
    if (j == std::string::npos) j = rest.size();
    std::string kv = rest.substr(i, j - i);
    size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error(fmt::format("press {}: parameter '{}' should be key=value", name, kv));
    std::string k = kv.substr(0, eq);
    if (!params.count(k)) {
      std::string known;
      for (auto& [pk, pv] : info->params) known += (known.empty() ? "" : ", ") + pk;
      throw Error(fmt::format("press {}: unknown parameter '{}' (parameters: {})", name, k, known.empty() ? "none" : known));
    }
    params[k] = kv.substr(eq + 1);
    i = j + 1;
  }
  if (has_ratio) check_ratio(param_double(params, name, "ratio"), name);
  return info->make(params);
}

}  // namespace kvslim
