// Chat templates: each family's rendering against text derived by hand from the family's Jinja
// template (the template sources below are the ones the models ship in tokenizer_config.json).
#include <gtest/gtest.h>

#include <cstdlib>

#include "kvslim/gguf.h"
#include "kvslim/model.h"
#include "tokenizer/chat_template.h"

using namespace kvslim;

namespace {

// meta-llama/Llama-2-7b-chat-hf
const char* kLlama2 =
    R"({% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %})";
// meta-llama/Meta-Llama-3-8B-Instruct
const char* kLlama3 =
    R"({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %})";
// Qwen/Qwen2-7B-Instruct
const char* kQwen2 =
    R"({% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})";
// Plain ChatML (e.g. teknium/OpenHermes-2.5-Mistral-7B)
const char* kChatML =
    R"({% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %})";
// mistralai/Mistral-7B-Instruct-v0.1
const char* kMistral =
    R"({{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %})";

const std::vector<ChatMessage> kWithSystem = {
    {"system", "You are terse."}, {"user", " Hi there "}, {"assistant", "Hello!"}, {"user", "Name a color."}};
const std::vector<ChatMessage> kNoSystem = {{"user", " Hi there "}, {"assistant", "Hello!"}, {"user", "Name a color."}};

}  // namespace

TEST(ChatTemplate, RecognisesEachFamily) {
  EXPECT_EQ(ChatTemplate::from_source(kLlama2).name(), "llama2");
  EXPECT_EQ(ChatTemplate::from_source(kLlama3).name(), "llama3");
  EXPECT_EQ(ChatTemplate::from_source(kQwen2).name(), "qwen2");
  EXPECT_EQ(ChatTemplate::from_source(kChatML).name(), "chatml");
  EXPECT_EQ(ChatTemplate::from_source(kMistral).name(), "mistral");
}

TEST(ChatTemplate, Llama2) {
  // content.strip() applies to the whole user content, <<SYS>> block included: the user text's
  // trailing space goes, its leading space (after the blank line) stays.
  EXPECT_EQ(ChatTemplate::from_source(kLlama2).render(kWithSystem, "<s>", "</s>"),
            "<s>[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\n Hi there [/INST] Hello! </s><s>[INST] Name a color. [/INST]");
  EXPECT_EQ(ChatTemplate::from_source(kLlama2).render(kNoSystem, "<s>", "</s>"),
            "<s>[INST] Hi there [/INST] Hello! </s><s>[INST] Name a color. [/INST]");
}

TEST(ChatTemplate, Llama3) {
  EXPECT_EQ(ChatTemplate::from_source(kLlama3).render(kWithSystem, "<|begin_of_text|>", "<|end_of_text|>"),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nName a color.<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, ChatMLAndQwen2DefaultSystem) {
  EXPECT_EQ(ChatTemplate::from_source(kQwen2).render({{"user", " Hi there "}}, "", ""),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Hi there <|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(ChatTemplate::from_source(kQwen2).render(kWithSystem, "", ""),
            "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n Hi there <|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nName a color.<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(ChatTemplate::from_source(kChatML).render({{"user", "Hi"}}, "<s>", "</s>"),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(ChatTemplate::from_name("qwen2").render({{"user", "Hi"}}, "", ""),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, Mistral) {
  // No strip: the user text keeps both its spaces next to the template's own.
  EXPECT_EQ(ChatTemplate::from_source(kMistral).render(kNoSystem, "<s>", "</s>"),
            "<s>[INST]  Hi there  [/INST]Hello!</s>[INST] Name a color. [/INST]");
  // The v0.1 template has no system role; kvslim puts it before the first user text.
  EXPECT_EQ(ChatTemplate::from_source(kMistral).render({{"system", "Be brief."}, {"user", "Hi"}}, "<s>", "</s>"),
            "<s>[INST] Be brief.\n\nHi [/INST]");
}

TEST(ChatTemplate, RefusesWhatTheTemplateRefuses) {
  for (const char* src : {kLlama2, kMistral}) {
    ChatTemplate t = ChatTemplate::from_source(src);
    try {
      t.render({{"assistant", "Hi"}}, "<s>", "</s>");
      FAIL() << "assistant first accepted by " << t.name();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("alternate"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(t.name()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("messages[0]"), std::string::npos) << e.what();
    }
    EXPECT_THROW(t.render({{"user", "a"}, {"user", "b"}}, "<s>", "</s>"), Error);
  }
  EXPECT_THROW(ChatTemplate::from_name("chatml").render({}, "", ""), Error);
  try {
    ChatTemplate::from_name("chatml").render({{"tool", "x"}}, "", "");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("messages[0].role 'tool'"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, UnknownTemplateGoesToJinja) {
  // A template of no known family is rendered by the Jinja engine.
  ChatTemplate t = ChatTemplate::from_source("{% for m in messages %}### {{ m.role }}: {{ m.content }}\n{% endfor %}",
                                             "x.gguf: tokenizer.chat_template");
  EXPECT_EQ(t.family(), ChatFamily::Jinja);
  EXPECT_EQ(t.name(), "jinja");
  EXPECT_EQ(t.render(kNoSystem, "<s>", "</s>"), "### user:  Hi there \n### assistant: Hello!\n### user: Name a color.\n");
  // One that does not parse fails when it is read, naming where it came from and the cause.
  try {
    ChatTemplate::from_source("{% for m in messages %}{{ m.content }", "x.gguf: tokenizer.chat_template");
    FAIL();
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("x.gguf: tokenizer.chat_template '{% for m in messages %}"), std::string::npos) << w;
    EXPECT_NE(w.find("TemplateSyntaxError"), std::string::npos) << w;
  }
  try {
    ChatTemplate::from_name("vicuna");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'vicuna'"), std::string::npos) << e.what();
  }
}

// The reference engine (Python's jinja2) on each family's own template source gives the text that
// kvslim's native rendering gives: an independent check of both.
TEST(ChatTemplate, JinjaEqualsNativeForEachFamily) {
  const std::vector<ChatMessage> alternating = {{"user", " Hi there "}, {"assistant", " Hello! "}, {"user", "Name a color."}};
  const std::vector<ChatMessage> one = {{"user", "Hello"}};
  struct Case {
    const char* src;
    std::vector<std::vector<ChatMessage>> convs;
  };
  const Case cases[] = {{kLlama2, {kWithSystem, kNoSystem, alternating, one}},
                        {kLlama3, {kWithSystem, kNoSystem, alternating, one}},
                        {kQwen2, {kWithSystem, kNoSystem, alternating, one}},
                        {kChatML, {kWithSystem, kNoSystem, alternating, one}},
                        {kMistral, {kNoSystem, alternating, one}}};
  for (const Case& c : cases) {
    ChatTemplate native = ChatTemplate::from_source(c.src);
    ChatTemplate jinja = ChatTemplate::from_source(c.src, "chat template", /*jinja=*/true);
    ASSERT_EQ(jinja.family(), ChatFamily::Jinja);
    for (const auto& conv : c.convs)
      EXPECT_EQ(jinja.render(conv, "<s>", "</s>"), native.render(conv, "<s>", "</s>")) << native.name();
  }
}

TEST(ChatTemplate, JinjaErrorsAreNamed) {
  // raise_exception inside the template: its message, and where the template came from.
  ChatTemplate t = ChatTemplate::from_source(kMistral, "m.gguf: tokenizer.chat_template", /*jinja=*/true);
  try {
    t.render(kWithSystem, "<s>", "</s>");
    FAIL();
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("m.gguf: tokenizer.chat_template"), std::string::npos) << w;
    EXPECT_NE(w.find("Conversation roles must alternate"), std::string::npos) << w;
  }
  // No Python (or no jinja2): the error says what to install.
  const char* old = std::getenv("KVSLIM_PYTHON");
  const std::string saved = old ? old : "";
  setenv("KVSLIM_PYTHON", "/nonexistent/python3", 1);
  try {
    t.render(kNoSystem, "<s>", "</s>");
    ADD_FAILURE() << "rendered without a Python";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("python3-jinja2"), std::string::npos) << e.what();
  }
  if (old)
    setenv("KVSLIM_PYTHON", saved.c_str(), 1);
  else
    unsetenv("KVSLIM_PYTHON");
}

// Phi-3's template (no family kvslim renders itself), read from a real GGUF vocabulary file; the
// expected text is derived by hand from the template: the system message is dropped, every user
// turn is followed by the assistant header.
TEST(ChatTemplate, Phi3FromGGUFThroughJinja) {
  auto f = GGUFFile::open(KVSLIM_SOURCE_DIR "/tests/data/vocab/ggml-vocab-phi-3.gguf");
  ChatTemplate t = ChatTemplate::from_gguf(*f);
  EXPECT_EQ(t.name(), "jinja");
  EXPECT_EQ(t.render(kWithSystem, "<s>", "<|endoftext|>"),
            "<s><|user|>\n Hi there <|end|>\n<|assistant|>\nHello!<|end|>\n<|user|>\nName a color.<|end|>\n"
            "<|assistant|>\n");
}

TEST(ChatTemplate, TokenizeOnBundledModel) {
  auto model = Model::load(KVSLIM_SOURCE_DIR "/models/stories260K.gguf");
  const Tokenizer& tok = model->tokenizer();
  // The bundled model has no chat template: the error names the file.
  try {
    ChatTemplate::from_gguf(model->file());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("stories260K.gguf"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tokenizer.chat_template"), std::string::npos) << e.what();
  }
  // llama2 writes bos_token before every user turn: the first becomes the one BOS the encoder
  // adds, later ones are parsed as the special token.
  ChatTemplate t = ChatTemplate::from_name("llama2");
  std::vector<Token> ids = t.tokenize(tok, kNoSystem);
  ASSERT_GE(tok.bos(), 0);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], tok.bos());
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.bos()), 2);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), tok.eos()), 1);
  // Same ids as encoding the hand-written text with special tokens parsed.
  EXPECT_EQ(ids, tok.encode("[INST] Hi there [/INST] Hello! </s><s>[INST] Name a color. [/INST]", true, true));
}

// llama-server's fallback: a model without tokenizer.chat_template gets ChatML and a warning that
// names the file; a model with one gets its own and no warning. The ChatML text is written by hand.
TEST(ChatTemplate, FallbackToChatMLWhenTheModelHasNone) {
  auto model = Model::load(KVSLIM_SOURCE_DIR "/models/stories260K.gguf");
  std::string warning = "stale";
  ChatTemplate t = ChatTemplate::from_gguf_or_chatml(model->file(), false, warning);
  EXPECT_EQ(t.name(), "chatml");
  EXPECT_NE(warning.find("stories260K.gguf"), std::string::npos) << warning;
  EXPECT_NE(warning.find("ChatML"), std::string::npos) << warning;
  EXPECT_EQ(warning.find('\n'), std::string::npos) << "one line: " << warning;
  EXPECT_EQ(t.render({{"user", "Hi"}}, "<s>", "</s>"), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(t.end_of_turn(), "<|im_end|>");
  // choose() falls back only when asked to (with somewhere to put the warning).
  EXPECT_EQ(ChatTemplate::choose(model->file(), "", "", false, &warning).name(), "chatml");
  EXPECT_THROW(ChatTemplate::choose(model->file(), "", "", false), Error);
  // A name given by hand wins and clears the warning.
  EXPECT_EQ(ChatTemplate::choose(model->file(), "llama3", "", false, &warning).name(), "llama3");
  EXPECT_TRUE(warning.empty());
  auto phi = GGUFFile::open(KVSLIM_SOURCE_DIR "/tests/data/vocab/ggml-vocab-phi-3.gguf");
  warning = "stale";
  EXPECT_EQ(ChatTemplate::from_gguf_or_chatml(*phi, false, warning).name(), "jinja");
  EXPECT_TRUE(warning.empty()) << warning;
}
