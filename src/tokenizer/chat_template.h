#pragma once
// Chat templates: turn a conversation (role + content messages) into the prompt text a chat model
// was trained on. The GGUF's `tokenizer.chat_template` (a Jinja template from the model's
// tokenizer_config.json) is recognised as one of the common families and rendered by code written
// from that family's template:
//   llama2   Llama 2 chat      <s>[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST] A </s><s>[INST] U2 [/INST]
//   llama3   Llama 3 instruct  <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>...
//   chatml   ChatML / Qwen2    <|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n
//   mistral  Mistral instruct  <s>[INST] U [/INST]A</s>[INST] U2 [/INST]
// Any other template (and any template with `--jinja`) is rendered by Python's jinja2 in a child
// process (src/tokenizer/jinja.h): Debian 12 packages no C++ Jinja engine. `--chat-template NAME`
// picks a family by hand, `--chat-template-file FILE` reads a template from a file.
#include <memory>
#include <string>
#include <vector>

#include "kvslim/gguf.h"
#include "kvslim/tokenizer.h"

namespace kvslim {

/// One message of a conversation. `role` is "system", "user" or "assistant".
struct ChatMessage {
  std::string role;
  std::string content;
};

/// The template families kvslim renders.
/// Jinja: rendered from the template's source by the Jinja engine.
enum class ChatFamily { Llama2, Llama3, ChatML, Mistral, Jinja };

/// A recognised chat template. Cheap to copy; immutable, so safe to share between threads.
class ChatTemplate {
 public:
  /// By family name: "llama2", "llama3", "chatml" (also "qwen2"), "mistral". Throws kvslim::Error
  /// naming the value and listing the names for anything else.
  static ChatTemplate from_name(const std::string& name);
  /// Recognises a Jinja template source by the markers its family writes ("<|im_start|>",
  /// "<|start_header_id|>", "[INST]" with or without "<<SYS>>"). ChatML templates that insert a
  /// default system message when the conversation has none (Qwen2's "You are a helpful
  /// assistant.") keep that behaviour. A template of no known family, or any template when
  /// `jinja` is true, is kept as source for the Jinja engine and rendered once here on a
  /// one-message conversation, so that a template that cannot be rendered fails now: kvslim::Error
  /// naming `where` (e.g. the file's name) and quoting the template's start and the cause.
  static ChatTemplate from_source(const std::string& source, const std::string& where = "chat template",
                                  bool jinja = false);
  /// The template of a model file: `tokenizer.chat_template`, through from_source. Throws
  /// kvslim::Error naming the file when the key is missing.
  static ChatTemplate from_gguf(const GGUFFile& file, bool jinja = false);
  /// The model's template as llama-server picks it: from_gguf, or ChatML when the file has no
  /// `tokenizer.chat_template` (llama-server's fallback), with a one-line explanation (naming the
  /// file and the parameters that choose another template) in `warning`, which is cleared otherwise.
  /// Throws kvslim::Error as from_gguf for a template that is present but cannot be rendered.
  static ChatTemplate from_gguf_or_chatml(const GGUFFile& file, bool jinja, std::string& warning);
  /// What the CLI's flags choose: a family `name` if given, else the template in `template_file`
  /// if given, else the model's; `jinja` renders a source template with the Jinja engine even when
  /// its family is recognised. Throws kvslim::Error naming the flag's value or the file. With
  /// `warning`, a model without a template gets ChatML as in from_gguf_or_chatml; without it, that
  /// is an error.
  static ChatTemplate choose(const GGUFFile& model, const std::string& name, const std::string& template_file,
                             bool jinja, std::string* warning = nullptr);

  /// Text that ends an assistant turn in this family ("<|im_end|>", "<|eot_id|>", "</s>"; empty for
  /// Jinja): a stop string for models whose vocabulary does not hold it as an end-of-generation token
  /// (a model given the ChatML fallback).
  std::string end_of_turn() const;

  ChatFamily family() const { return family_; }
  /// The family's name as accepted by from_name.
  std::string name() const;

  /// Renders the conversation as the family's Jinja template would, with `bos` / `eos` standing for
  /// the template's bos_token / eos_token and the generation prompt added (the text the assistant's
  /// reply follows). Throws kvslim::Error, naming the template and the message index, for an empty
  /// conversation, an unknown role, roles that the template refuses (llama2 and mistral require
  /// user/assistant alternation starting with user, after an optional first system message).
  /// Mistral's v0.1 template has no system role; a system message is prepended to the first user
  /// message followed by a blank line (what Mistral's later templates do with it).
  std::string render(const std::vector<ChatMessage>& messages, const std::string& bos, const std::string& eos) const;

  /// For the Jinja family: any role is passed to the template, which decides what it accepts.
  /// render() with the tokenizer's BOS/EOS texts, then encoded with special tokens parsed. A
  /// leading BOS text becomes the BOS id (never doubled).
  std::vector<Token> tokenize(const Tokenizer& tok, const std::vector<ChatMessage>& messages) const;

 private:
  explicit ChatTemplate(ChatFamily f) : family_(f) {}
  ChatFamily family_;
  std::shared_ptr<const std::string> source_;  // Jinja: the template's text
  std::string where_;                          // Jinja: where the template came from, for errors
  std::string default_system_;  // chatml: inserted when the first message is not a system message
};

}  // namespace kvslim
