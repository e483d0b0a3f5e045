#include "server/api.h"

#include <fmt/format.h>

namespace kvslim::server {

using nlohmann::json;

namespace {

ApiError bad(const std::string& param, const std::string& msg) { return ApiError(400, msg, param); }

std::string type_name(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

// Each getter returns nullopt for a missing or null field and throws naming the field otherwise.
std::optional<std::string> get_string(const json& o, const std::string& key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) throw bad(key, fmt::format("'{}' must be a string, not {}", key, type_name(*it)));
  return it->get<std::string>();
}

std::optional<double> get_number(const json& o, const std::string& key, double lo, double hi, bool lo_open = false) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) throw bad(key, fmt::format("'{}' must be a number, not {}", key, type_name(*it)));
  double v = it->get<double>();
  if (!(lo_open ? v > lo : v >= lo) || !(v <= hi) || !std::isfinite(v))
    throw bad(key, fmt::format("'{}' is {} but must be in {}{}, {}]", key, it->dump(), lo_open ? "(" : "[", lo, hi));
  return v;
}

std::optional<int64_t> get_int(const json& o, const std::string& key, int64_t lo, int64_t hi) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_integer())
    throw bad(key, fmt::format("'{}' must be an integer, not {}", key, type_name(*it)));
  if (it->is_number_unsigned() ? it->get<uint64_t>() > static_cast<uint64_t>(hi) : false)
    throw bad(key, fmt::format("'{}' is {} but must be in [{}, {}]", key, it->dump(), lo, hi));
  int64_t v = it->is_number_unsigned() ? static_cast<int64_t>(it->get<uint64_t>()) : it->get<int64_t>();
  if (v < lo || v > hi) throw bad(key, fmt::format("'{}' is {} but must be in [{}, {}]", key, v, lo, hi));
  return v;
}

std::optional<bool> get_bool(const json& o, const std::string& key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) throw bad(key, fmt::format("'{}' must be true or false, not {}", key, type_name(*it)));
  return it->get<bool>();
}

// A chat message's content: a string, or OpenAI's array of parts where only text parts are served.
std::string message_content(const json& c, const std::string& field) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    std::string out;
    for (size_t i = 0; i < c.size(); ++i) {
      const json& part = c[i];
      std::string pf = fmt::format("{}[{}]", field, i);
      if (!part.is_object()) throw bad(pf, fmt::format("'{}' must be an object with \"type\": \"text\"", pf));
      auto t = get_string(part, "type");
      if (!t || *t != "text")
        throw bad(pf + ".type", fmt::format("'{}.type' must be \"text\" (this server serves text only)", pf));
      auto text = part.find("text");
      if (text == part.end() || !text->is_string()) throw bad(pf + ".text", fmt::format("'{}.text' must be a string", pf));
      out += text->get<std::string>();
    }
    return out;
  }
  throw bad(field, fmt::format("'{}' must be a string or an array of text parts, not {}", field, type_name(c)));
}

}  // namespace

json error_json(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return {{"error", err}};
}

CompletionRequest parse_completion_request(const std::string& body, bool chat, int32_t n_vocab) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) throw bad("", "the request body is not valid JSON");
  if (!j.is_object()) throw bad("", fmt::format("the request body must be a JSON object, not {}", type_name(j)));
  CompletionRequest r;
  r.chat = chat;
  r.model = get_string(j, "model").value_or("");
  r.context_id = get_string(j, "context_id");
  if (r.context_id && r.context_id->empty()) throw bad("context_id", "'context_id' is empty");
  if (auto v = get_bool(j, "cache_prompt")) r.cache_prompt = *v;
  // With a stored context, a completion's prompt may be absent: the question alone continues it.
  const bool prompt_optional = r.context_id && !chat && (!j.contains("prompt") || j["prompt"].is_null());
  if (prompt_optional) {
  } else if (chat) {
    auto it = j.find("messages");
    if (it == j.end() || it->is_null()) throw bad("messages", "'messages' is required");
    if (!it->is_array()) throw bad("messages", fmt::format("'messages' must be an array, not {}", type_name(*it)));
    if (it->empty()) throw bad("messages", "'messages' must hold at least one message");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& m = (*it)[i];
      std::string f = fmt::format("messages[{}]", i);
      if (!m.is_object()) throw bad(f, fmt::format("'{}' must be an object, not {}", f, type_name(m)));
      auto role = m.find("role");
      if (role == m.end() || !role->is_string()) throw bad(f + ".role", fmt::format("'{}.role' must be a string", f));
      std::string rs = role->get<std::string>();
      if (rs == "developer") rs = "system";  // OpenAI's newer name for the system role
      if (rs != "system" && rs != "user" && rs != "assistant")
        throw bad(f + ".role", fmt::format("'{}.role' is \"{}\"; this server takes system, user and assistant", f, rs));
      auto content = m.find("content");
      if (content == m.end() || content->is_null())
        throw bad(f + ".content", fmt::format("'{}.content' is required", f));
      r.messages.push_back({rs, message_content(*content, f + ".content")});
    }
    if (j.contains("tools") && !j["tools"].is_null()) throw bad("tools", "'tools' (function calling) is not supported");
    if (auto v = get_bool(j, "logprobs"); v && *v) throw bad("logprobs", "'logprobs' is not supported");
  } else {
    auto it = j.find("prompt");
    if (it == j.end() || it->is_null()) throw bad("prompt", "'prompt' is required");
    if (it->is_string()) {
      r.prompt = it->get<std::string>();
    } else if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
      r.prompt = (*it)[0].get<std::string>();
    } else if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
      // Read as 64-bit and range-checked before narrowing: a cast would wrap 2^32 + 5 to 5.
      const int64_t limit = n_vocab > 0 ? n_vocab : int64_t{INT32_MAX} + 1;
      for (size_t i = 0; i < it->size(); ++i) {
        const json& t = (*it)[i];
        if (!t.is_number_integer())
          throw bad("prompt", fmt::format("'prompt[{}]' must be a token id (integer), not {}", i, type_name(t)));
        const bool inside = t.is_number_unsigned() ? t.get<uint64_t>() < static_cast<uint64_t>(limit)
                                                   : t.get<int64_t>() >= 0 && t.get<int64_t>() < limit;
        if (!inside)
          throw bad("prompt", fmt::format("prompt[{}]: token id {} is outside the {} 0..{}", i, t.dump(),
                                          n_vocab > 0 ? "vocabulary" : "token id range", limit - 1));
        r.prompt_tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
    } else if (it->is_array() && it->size() > 1) {
      throw bad("prompt", "'prompt' holds several prompts; send one per request");
    } else {
      throw bad("prompt", fmt::format("'prompt' must be a string or an array of token ids, not {}", type_name(*it)));
    }
    if (r.prompt.empty() && r.prompt_tokens.empty()) throw bad("prompt", "'prompt' is empty");
    if (auto v = get_int(j, "logprobs", 0, 0); v) (void)v;  // 0 / null: none asked for
    if (auto v = get_bool(j, "echo"); v && *v) throw bad("echo", "'echo' is not supported");
    if (auto v = get_int(j, "best_of", 1, 1)) (void)v;
    if (auto s = get_string(j, "suffix"); s && !s->empty()) throw bad("suffix", "'suffix' is not supported");
  }
  if (auto v = get_int(j, "max_tokens", 0, 1 << 30)) r.max_tokens = static_cast<int>(*v);
  // OpenAI's newer name for chat requests; it wins over the deprecated max_tokens when both are sent.
  if (chat)
    if (auto v = get_int(j, "max_completion_tokens", 0, 1 << 30)) r.max_tokens = static_cast<int>(*v);
  if (auto v = get_int(j, "n", 1, 1)) (void)v;
  if (auto v = get_number(j, "temperature", 0.0, 2.0)) r.temperature = static_cast<float>(*v);
  if (auto v = get_number(j, "top_p", 0.0, 1.0, true)) r.top_p = static_cast<float>(*v);
  if (auto v = get_int(j, "top_k", 0, 1 << 30)) r.top_k = static_cast<int>(*v);
  if (auto v = get_int(j, "seed", INT64_MIN, INT64_MAX)) r.seed = static_cast<uint64_t>(*v);
  for (const char* pen : {"presence_penalty", "frequency_penalty"})
    if (auto v = get_number(j, pen, -2.0, 2.0); v && *v != 0.0)
      throw bad(pen, fmt::format("'{}' is not supported (only 0)", pen));
  if (auto v = get_bool(j, "stream")) r.stream = *v;
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) throw bad("stream_options", "'stream_options' must be an object");
    if (auto v = get_bool(*it, "include_usage")) r.include_usage = *v;
  }
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      r.stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      if (it->size() > 4) throw bad("stop", fmt::format("'stop' holds {} strings; at most 4", it->size()));
      for (size_t i = 0; i < it->size(); ++i) {
        if (!(*it)[i].is_string()) throw bad("stop", fmt::format("'stop[{}]' must be a string", i));
        r.stop.push_back((*it)[i].get<std::string>());
      }
    } else {
      throw bad("stop", fmt::format("'stop' must be a string or an array of strings, not {}", type_name(*it)));
    }
    for (const auto& s : r.stop)
      if (s.empty()) throw bad("stop", "'stop' holds an empty string");
  }
  // kvslim's extensions.
  r.press = get_string(j, "press");
  if (r.press && r.press->empty()) throw bad("press", "'press' is empty");
  if (auto v = j.find("compression_ratio"); v != j.end() && !v->is_null()) {
    if (!v->is_number()) throw bad("compression_ratio", fmt::format("'compression_ratio' must be a number, not {}", type_name(*v)));
    double x = v->get<double>();
    if (!(x >= 0.0 && x < 1.0))
      throw bad("compression_ratio", fmt::format("'compression_ratio' is {} but must be in [0, 1)", v->dump()));
    r.compression_ratio = x;
  }
  r.question = get_string(j, "question").value_or("");
  if (chat && !r.question.empty())
    throw bad("question", "'question' is for /v1/completions; in a chat the conversation is the prompt");
  r.cache_type_k = get_string(j, "cache_type_k");
  r.cache_type_v = get_string(j, "cache_type_v");
  return r;
}

json usage_json(const Usage& u) {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  // Measured from the request's cache after compressing its context.
  j["kv_bytes"] = u.kv_bytes;
  j["kv_bytes_final"] = u.kv_bytes_final;
  j["kv_bytes_shared"] = u.kv_bytes_shared;
  j["kv_full_f16_bytes"] = u.full_f16_bytes;
  j["entries_kept"] = u.entries_kept;
  j["entries_total"] = u.entries_total;
  j["compression_ratio"] = u.entries_total ? 1.0 - double(u.entries_kept) / double(u.entries_total) : 0.0;
  j["memory_ratio"] = u.full_f16_bytes ? double(u.kv_bytes) / double(u.full_f16_bytes) : 0.0;
  // Over the whole request (prefill and decode), measured when it ended.
  j["request_compression_ratio"] = u.entries_seen ? 1.0 - double(u.entries_now) / double(u.entries_seen) : 0.0;
  j["entries_now"] = u.entries_now;
  j["entries_seen"] = u.entries_seen;
  j["press"] = u.press;
  return j;
}

StopMatch find_stop(const std::string& text, const std::vector<std::string>& stops) {
  StopMatch m;
  size_t first = std::string::npos;
  for (const auto& s : stops) {
    size_t at = text.find(s);
    if (at != std::string::npos && at < first) first = at;
  }
  if (first != std::string::npos) {
    m.stopped = true;
    m.cut = first;
    m.safe = first;
    return m;
  }
  size_t hold = 0;
  for (const auto& s : stops)
    for (size_t k = std::min(s.size() - 1, text.size()); k > hold; --k)
      if (text.compare(text.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  size_t safe = text.size() - hold;
  // Do not split a UTF-8 character: back off over continuation bytes to a lead byte whose
  // sequence is incomplete.
  size_t i = safe, cont = 0;
  while (i > 0 && cont < 3 && (static_cast<unsigned char>(text[i - 1]) & 0xC0) == 0x80) --i, ++cont;
  if (i > 0) {
    unsigned char lead = static_cast<unsigned char>(text[i - 1]);
    size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
    if (need > 1 && cont + 1 < need) safe = i - 1;
  }
  m.safe = safe;
  return m;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace kvslim::server
