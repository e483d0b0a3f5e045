#include "util/text_file.h"
#include "tokenizer/chat_template.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kvslim/error.h"
#include "tokenizer/jinja.h"

namespace kvslim {

namespace {

// Python's str.strip() / Jinja's trim: ASCII whitespace at both ends.
std::string strip(const std::string& s) {
  const char* ws = " \t\n\r\f\v";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return {};
  size_t e = s.find_last_not_of(ws);
  return s.substr(b, e - b + 1);
}

bool has(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }

// The first line of a template, shortened, to name it in an error.
std::string quote_start(const std::string& src) {
  return "'" + printable(src.substr(0, src.find('\n')), 60) + "'";
}

// ChatML templates that add a default system message write it as a literal
// '<|im_start|>system\n...<|im_end|>' (Jinja escapes, so "\n" is two characters in the source).
std::string default_system_message(const std::string& src) {
  const std::string open = "<|im_start|>system\\n", close = "<|im_end|>";
  for (size_t at = src.find(open); at != std::string::npos; at = src.find(open, at + 1)) {
    size_t b = at + open.size();
    size_t e = src.find(close, b);
    if (e == std::string::npos) break;
    std::string text = src.substr(b, e - b);
    if (text.empty() || text.find_first_of("'\"<{}") != std::string::npos) continue;
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\\' && i + 1 < text.size()) {
        char c = text[++i];
        out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
      } else {
        out += text[i];
      }
    }
    return out;
  }
  return {};
}

}  // namespace

ChatTemplate ChatTemplate::from_name(const std::string& name) {
  if (name == "llama2") return ChatTemplate(ChatFamily::Llama2);
  if (name == "llama3") return ChatTemplate(ChatFamily::Llama3);
  if (name == "chatml") return ChatTemplate(ChatFamily::ChatML);
  if (name == "qwen2") {
    ChatTemplate t(ChatFamily::ChatML);
    t.default_system_ = "You are a helpful assistant.";
    return t;
  }
  if (name == "mistral") return ChatTemplate(ChatFamily::Mistral);
  throw Error(fmt::format("unknown chat template '{}' (known: llama2, llama3, chatml, qwen2, mistral)", printable(name)));
}

ChatTemplate ChatTemplate::from_source(const std::string& src, const std::string& where, bool jinja) {
  if (jinja || !(has(src, "<|im_start|>") || has(src, "<|start_header_id|>") || has(src, "[INST]"))) {
    ChatTemplate t(ChatFamily::Jinja);
    t.source_ = std::make_shared<const std::string>(src);
    t.where_ = fmt::format("{} {}", where, quote_start(src));
    t.render({{"user", "Hello"}}, "<s>", "</s>");
    return t;
  }
  if (has(src, "<|im_start|>")) {
    ChatTemplate t(ChatFamily::ChatML);
    t.default_system_ = default_system_message(src);
    return t;
  }
  if (has(src, "<|start_header_id|>")) return ChatTemplate(ChatFamily::Llama3);
  if (has(src, "[INST]") && has(src, "<<SYS>>")) return ChatTemplate(ChatFamily::Llama2);
  return ChatTemplate(ChatFamily::Mistral);
}

ChatTemplate ChatTemplate::from_gguf(const GGUFFile& file, bool jinja) {
  if (!file.has("tokenizer.chat_template"))
    throw Error(fmt::format("{}: the model has no tokenizer.chat_template; choose one by name with "
                            "chat_template: llama2, llama3, chatml, qwen2 or mistral",
                            file.path()));
  return from_source(file.get_string("tokenizer.chat_template"),
                     fmt::format("{}: tokenizer.chat_template", file.path()), jinja);
}

ChatTemplate ChatTemplate::from_gguf_or_chatml(const GGUFFile& file, bool jinja, std::string& warning) {
  warning.clear();
  if (file.has("tokenizer.chat_template")) return from_gguf(file, jinja);
  warning = fmt::format("{}: the model has no tokenizer.chat_template; using ChatML (as llama-server does); "
                        "choose another with chat_template (a family name) or chat_template_file",
                        file.path());
  return ChatTemplate(ChatFamily::ChatML);
}

ChatTemplate ChatTemplate::choose(const GGUFFile& model, const std::string& name, const std::string& template_file,
                                  bool jinja, std::string* warning) {
  if (warning) warning->clear();
  if (!name.empty()) return from_name(name);
  if (template_file.empty()) return warning ? from_gguf_or_chatml(model, jinja, *warning) : from_gguf(model, jinja);
  return from_source(read_text_file(template_file, "chat_template_file"), template_file, jinja);
}

std::string ChatTemplate::end_of_turn() const {
  switch (family_) {
    case ChatFamily::ChatML: return "<|im_end|>";
    case ChatFamily::Llama3: return "<|eot_id|>";
    case ChatFamily::Llama2:
    case ChatFamily::Mistral: return "</s>";
    case ChatFamily::Jinja: return "";
  }
  return "";
}

std::string ChatTemplate::name() const {
  switch (family_) {
    case ChatFamily::Llama2: return "llama2";
    case ChatFamily::Llama3: return "llama3";
    case ChatFamily::ChatML: return default_system_.empty() ? "chatml" : "qwen2";
    case ChatFamily::Mistral: return "mistral";
    case ChatFamily::Jinja: return "jinja";
  }
  return "?";
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& msgs, const std::string& bos,
                                 const std::string& eos) const {
  if (msgs.empty()) throw Error(fmt::format("chat template {}: the conversation has no messages", name()));
  if (family_ == ChatFamily::Jinja) {
    nlohmann::json messages = nlohmann::json::array();
    for (const auto& m : msgs) messages.push_back({{"role", m.role}, {"content", m.content}});
    return render_jinja(*source_,
                        {{"messages", messages}, {"bos_token", bos}, {"eos_token", eos}, {"add_generation_prompt", true}},
                        where_);
  }
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string& r = msgs[i].role;
    if (r != "system" && r != "user" && r != "assistant")
      throw Error(fmt::format("chat template {}: messages[{}].role '{}' is not system, user or assistant", name(),
                              i, printable(r)));
  }
  std::string out;
  switch (family_) {
    case ChatFamily::ChatML: {
      if (msgs[0].role != "system" && !default_system_.empty())
        out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
      for (const auto& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      out += "<|im_start|>assistant\n";
      return out;
    }
    case ChatFamily::Llama3: {
      out += bos;
      for (const auto& m : msgs)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + strip(m.content) + "<|eot_id|>";
      out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    }
    case ChatFamily::Llama2:
    case ChatFamily::Mistral: {
      // Both templates take an optional leading system message out of the loop, then require
      // user/assistant alternation starting with user (raise_exception otherwise).
      const bool llama2 = family_ == ChatFamily::Llama2;
      size_t first = 0;
      std::string system;
      bool has_system = false;
      if (msgs[0].role == "system") {
        system = msgs[0].content;
        has_system = true;
        first = 1;
      }
      if (!llama2) out += bos;
      for (size_t i = first; i < msgs.size(); ++i) {
        const bool expect_user = (i - first) % 2 == 0;
        if ((msgs[i].role == "user") != expect_user || msgs[i].role == "system")
          throw Error(fmt::format("chat template {}: conversation roles must alternate user/assistant/user/... "
                                  "after an optional first system message (messages[{}] is '{}')",
                                  name(), i, msgs[i].role));
        std::string content = msgs[i].content;
        if (i == first && has_system)
          content = llama2 ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content : system + "\n\n" + content;
        if (llama2) {
          if (msgs[i].role == "user")
            out += bos + "[INST] " + strip(content) + " [/INST]";
          else
            out += " " + strip(content) + " " + eos;
        } else {
          if (msgs[i].role == "user")
            out += "[INST] " + content + " [/INST]";
          else
            out += content + eos;
        }
      }
      return out;
    }
    case ChatFamily::Jinja: break;  // rendered above
  }
  return out;
}

std::vector<Token> ChatTemplate::tokenize(const Tokenizer& tok, const std::vector<ChatMessage>& msgs) const {
  const std::string bos = tok.bos() >= 0 ? tok.token_text(tok.bos()) : "";
  const std::string eos = tok.eos() >= 0 ? tok.token_text(tok.eos()) : "";
  std::string text = render(msgs, bos, eos);
  if (!bos.empty() && text.compare(0, bos.size(), bos) == 0)
    return tok.encode(text.substr(bos.size()), true, true);
  return tok.encode(text, tok.add_bos_default(), true);
}

}  // namespace kvslim
