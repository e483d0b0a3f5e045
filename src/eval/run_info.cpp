// Provenance of an evaluation run: model hash, version, command line.
#include "kvslim/eval_run_info.h"

#include <nlohmann/json.hpp>

#include "eval/report.h"

#include <openssl/evp.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "kvslim/version.h"

namespace kvslim {

std::string sha256_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(fmt::format("{}: cannot open the file to hash it", path));
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) throw Error("SHA-256: OpenSSL init failed");
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), buf.size());
    if (f.gcount() > 0) EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(f.gcount()));
  }
  if (f.bad()) throw Error(fmt::format("{}: read error while hashing", path));
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx.get(), md, &n);
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) hex += fmt::format("{:02x}", md[i]);
  return hex;
}

std::string shell_quote(const std::string& a) {
  if (!a.empty() && a.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./:=,+@%-") ==
                        std::string::npos)
    return a;
  std::string q = "'";
  for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string command_line() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  if (!f) return "";
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string out, arg;
  bool any = false;
  for (char c : all) {
    if (c != '\0') {
      arg += c;
      continue;
    }
    out += (any ? " " : "") + shell_quote(arg);
    any = true;
    arg.clear();
  }
  if (!arg.empty()) out += (any ? " " : "") + shell_quote(arg);
  return out;
}

RunInfo make_run_info(const std::string& kind, const std::string& model_path) {
  RunInfo r;
  r.kind = kind;
  r.kvslim_version = kVersion;
  r.command = command_line();
  r.model = model_path;
  std::error_code ec;
  r.model_bytes = std::filesystem::file_size(model_path, ec);
  if (ec) throw Error(fmt::format("{}: cannot read the model file ({})", model_path, ec.message()));
  r.model_sha256 = sha256_file(model_path);
  return r;
}

nlohmann::json to_json(const RunInfo& r) {
  nlohmann::json j = {{"kind", "run"},
                      {"eval", r.kind},
                      {"kvslim_version", r.kvslim_version},
                      {"command", r.command},
                      {"model", r.model},
                      {"model_sha256", r.model_sha256},
                      {"model_bytes", r.model_bytes},
                      {"shard", fmt::format("{}/{}", r.shard_index, r.shard_count)},
                      {"units", r.units},
                      {"config", nlohmann::json::parse(r.config)}};
  if (!r.merged_from.empty()) j["merged_from"] = r.merged_from;
  return j;
}

RunInfo run_info_from_json(const nlohmann::json& j, const std::string& what) {
  RunInfo r;
  try {
    r.kind = j.at("eval").get<std::string>();
    r.kvslim_version = j.at("kvslim_version").get<std::string>();
    r.command = j.at("command").get<std::string>();
    r.model = j.at("model").get<std::string>();
    r.model_sha256 = j.at("model_sha256").get<std::string>();
    r.model_bytes = j.at("model_bytes").get<uint64_t>();
    const std::string shard = j.at("shard").get<std::string>();
    if (std::sscanf(shard.c_str(), "%d/%d", &r.shard_index, &r.shard_count) != 2)
      throw Error(fmt::format("{}: run record field 'shard' is '{}', expected I/N", what, printable(shard)));
    r.units = j.at("units").get<size_t>();
    const nlohmann::json& config = j.at("config");
    if (!config.is_object()) throw Error(fmt::format("{}: run record field 'config' is not an object", what));
    r.config = config.dump();
    if (j.contains("merged_from")) r.merged_from = j.at("merged_from").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: bad run record ({})", what, e.what()));
  }
  return r;
}

}  // namespace kvslim
