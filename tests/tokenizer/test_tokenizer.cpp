// Tokenizer tests: llama.cpp's vocabulary test vectors, round trips, the stories260K reference
// prompts, special tokens and error reporting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "kvslim/error.h"
#include "kvslim/gguf.h"
#include "kvslim/tokenizer.h"
#include "tokenizer/internal.h"

using namespace kvslim;

namespace {

const std::string kSource = KVSLIM_SOURCE_DIR;
const std::string kData = kSource + "/tests/data";

// llama.cpp's test vocabularies, trimmed by tools/trim_vocab.cpp to the tokens the test strings
// can reach (tests/data/README.md); the .inp/.out test vectors are llama.cpp's, unchanged.
std::string vocab_path(const std::string& name) { return kData + "/vocab/ggml-vocab-" + name + ".gguf"; }

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Case {
  std::string text;
  std::vector<Token> ids;
};

// NAME.gguf.inp: each string followed by "\n__ggml_vocab_test__\n"; NAME.gguf.out: one line of
// space-separated ids per string (llama.cpp's test-tokenizer-0 convention).
std::vector<Case> read_cases(const std::string& name) {
  const std::string inp = read_all(vocab_path(name) + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < inp.size();) {
    size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      texts.push_back(inp.substr(pos));
      break;
    }
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::ifstream out(vocab_path(name) + ".out");
  std::vector<Case> cases;
  std::string line;
  for (size_t i = 0; std::getline(out, line); ++i) {
    Case c;
    c.text = i < texts.size() ? texts[i] : std::string();
    std::istringstream ls(line);
    for (long id; ls >> id;) c.ids.push_back(static_cast<Token>(id));
    cases.push_back(std::move(c));
  }
  EXPECT_EQ(cases.size(), texts.size()) << name << ": .inp and .out disagree on the number of tests";
  return cases;
}

std::string show(const std::vector<Token>& ids) {
  std::string s;
  for (Token t : ids) s += std::to_string(t) + " ";
  return s;
}

// A trimmed vocabulary renumbers the tokens it keeps; `kvslim.trim.original_ids` maps each new id
// back to llama.cpp's id, so expected ids stay exactly as llama.cpp wrote them.
struct TrimmedVocab {
  std::unique_ptr<GGUFFile> file;
  std::unique_ptr<Tokenizer> tok;
  std::vector<int32_t> original;
  std::map<Token, Token> to_new;

  explicit TrimmedVocab(const std::string& name) : file(GGUFFile::open(vocab_path(name))) {
    tok = Tokenizer::from_gguf(*file);
    original = file->get_int_array("kvslim.trim.original_ids");
    EXPECT_EQ(original.size(), static_cast<size_t>(tok->n_vocab())) << name;
    for (size_t i = 0; i < original.size(); ++i) to_new[original[i]] = static_cast<Token>(i);
  }
  /// New ids -> llama.cpp's ids (-1 for an id outside the vocabulary).
  std::vector<Token> orig(const std::vector<Token>& ids) const {
    std::vector<Token> out;
    for (Token t : ids) out.push_back(t >= 0 && static_cast<size_t>(t) < original.size() ? original[t] : -1);
    return out;
  }
  Token orig(Token t) const { return orig(std::vector<Token>{t})[0]; }
  /// llama.cpp's ids -> new ids (-1 for a token the trimmed file does not keep).
  std::vector<Token> renumber(const std::vector<Token>& ids) const {
    std::vector<Token> out;
    for (Token t : ids) {
      auto it = to_new.find(t);
      out.push_back(it == to_new.end() ? -1 : it->second);
    }
    return out;
  }
};

std::vector<Token> i32_tensor(const GGUFFile& f, const std::string& name) {
  const TensorInfo& t = f.tensor(name);
  EXPECT_EQ(t.type, GGMLType::I32) << name;
  std::vector<Token> v(static_cast<size_t>(t.nelements()));
  std::memcpy(v.data(), t.data, v.size() * sizeof(Token));
  return v;
}

const std::vector<std::string> kVocabs = {"llama-spm", "phi-3", "gpt-2", "falcon", "mpt", "refact", "deepseek-coder",
                               "deepseek-llm"};

class VocabTest : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(VocabTest, EncodesLlamaCppTestVectors) {
  TrimmedVocab v(GetParam());
  auto cases = read_cases(GetParam());
  ASSERT_EQ(cases.size(), 46u);
  int failed = 0;
  for (const Case& c : cases) {
    std::vector<Token> got = v.orig(v.tok->encode(c.text, /*add_bos=*/false, /*parse_special=*/false));
    if (got != c.ids) ++failed;
    EXPECT_EQ(show(got), show(c.ids)) << "text: '" << c.text << "'";
  }
  EXPECT_EQ(failed, 0);
}

TEST_P(VocabTest, DecodeRoundTrips) {
  TrimmedVocab v(GetParam());
  const Tokenizer* tok = v.tok.get();
  for (const Case& c : read_cases(GetParam())) {
    EXPECT_EQ(tok->decode(tok->encode(c.text, false, false)), c.text);
    EXPECT_EQ(tok->decode(v.renumber(c.ids)), c.text);
  }
  // With BOS too (BOS renders as nothing and the SPM space prefix is still dropped).
  if (tok->bos() >= 0) {
    EXPECT_EQ(tok->decode(tok->encode("Hello world", true, false)), "Hello world");
  }
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, VocabTest, ::testing::ValuesIn(kVocabs),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string s = i.param;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

TEST(Tokenizer, Stories260KMatchesLlamaCppPrompts) {
  auto model = GGUFFile::open(kSource + "/models/stories260K.gguf");
  auto ref = GGUFFile::open(kData + "/reference/stories260K.ref.gguf");
  auto tok = Tokenizer::from_gguf(*model);
  EXPECT_EQ(tok->model(), "llama");
  EXPECT_EQ(tok->n_vocab(), 512);
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  EXPECT_TRUE(tok->add_bos_default());
  EXPECT_TRUE(tok->is_eog(2));
  EXPECT_FALSE(tok->is_eog(1));

  const std::vector<Token> once = tok->encode("Once upon a time", true, false);
  EXPECT_EQ(once, i32_tensor(*ref, "ref.prompt.0.tokens"));

  const int64_t n = ref->get_int("ref.prompt_count");
  ASSERT_EQ(n, 5);
  for (int64_t i = 0; i < n; ++i) {
    const std::string text = ref->get_string("ref.prompt." + std::to_string(i) + ".text");
    const std::vector<Token> want = i32_tensor(*ref, "ref.prompt." + std::to_string(i) + ".tokens");
    const std::vector<Token> got = tok->encode(text, true, false);
    EXPECT_EQ(show(got), show(want)) << "prompt " << i;
    EXPECT_EQ(tok->decode(got), text) << "prompt " << i;
  }
}

TEST(Tokenizer, PiecesUndoEscapes) {
  auto spm = Tokenizer::from_gguf(*GGUFFile::open(vocab_path("llama-spm")));
  Token hello = spm->find_token("\xE2\x96\x81Hello");
  ASSERT_GE(hello, 0);
  EXPECT_EQ(spm->piece(hello), " Hello");
  EXPECT_EQ(spm->piece(spm->find_token("<0x0A>")), "\n");
  EXPECT_EQ(spm->piece(spm->bos()), "");
  EXPECT_EQ(spm->token_text(spm->bos()), "<s>");
  EXPECT_TRUE(spm->is_control(spm->bos()));
  EXPECT_EQ(spm->piece(-1), "");
  EXPECT_EQ(spm->piece(spm->n_vocab()), "");

  auto bpe = Tokenizer::from_gguf(*GGUFFile::open(vocab_path("gpt-2")));
  EXPECT_EQ(bpe->model(), "gpt2");
  EXPECT_EQ(bpe->pre(), "gpt-2");
  EXPECT_FALSE(bpe->add_bos_default());
  Token sp_hello = bpe->find_token("\xC4\xA0Hello");  // "ĠHello"
  ASSERT_GE(sp_hello, 0);
  EXPECT_EQ(bpe->piece(sp_hello), " Hello");
  EXPECT_EQ(bpe->piece(bpe->find_token("\xC4\x8A")), "\n");  // "Ċ"
}

TEST(Tokenizer, ParsesSpecialTokensOnlyWhenAsked) {
  TrimmedVocab gpt2_vocab("gpt-2");
  const Tokenizer* gpt2 = gpt2_vocab.tok.get();
  const Token eot = gpt2->find_token("<|endoftext|>");
  ASSERT_EQ(gpt2_vocab.orig(eot), 50256);
  EXPECT_TRUE(gpt2->is_eog(eot));
  std::vector<Token> with = gpt2->encode("Hi<|endoftext|> there", false, true);
  std::vector<Token> hi = gpt2->encode("Hi", false, false);
  std::vector<Token> there = gpt2->encode(" there", false, false);
  std::vector<Token> want = hi;
  want.push_back(eot);
  want.insert(want.end(), there.begin(), there.end());
  EXPECT_EQ(with, want);
  std::vector<Token> without = gpt2->encode("Hi<|endoftext|> there", false, false);
  EXPECT_EQ(std::count(without.begin(), without.end(), eot), 0);
  EXPECT_GT(without.size(), want.size());

  // SPM: the space prefix is added again after a special token; phi-3 strips whitespace right
  // of its special tokens.
  auto phi = Tokenizer::from_gguf(*GGUFFile::open(vocab_path("phi-3")));
  const Token user = phi->find_token("<|user|>"), end = phi->find_token("<|end|>");
  ASSERT_GE(user, 0);
  ASSERT_GE(end, 0);
  EXPECT_TRUE(phi->is_eog(end));
  std::vector<Token> chat = phi->encode("<|user|>\nHello<|end|>", true, true);
  std::vector<Token> body = phi->encode("Hello", false, false);
  std::vector<Token> expect = {phi->bos(), user};
  expect.insert(expect.end(), body.begin(), body.end());
  expect.push_back(end);
  EXPECT_EQ(show(chat), show(expect));

  // Longest special text wins: "<s>" inside "</s>" is not split out.
  TrimmedVocab spm_vocab("llama-spm");
  const Tokenizer* spm = spm_vocab.tok.get();
  EXPECT_EQ(spm_vocab.orig(spm->encode("</s><s>", false, true)), (std::vector<Token>{2, 1}));
  EXPECT_EQ(spm->decode({1, spm->find_token("\xE2\x96\x81Hi"), 2}), "Hi");
}

TEST(Tokenizer, InvalidUtf8DoesNotThrow) {
  for (const char* name : {"gpt-2", "llama-spm", "deepseek-llm"}) {
    auto tok = Tokenizer::from_gguf(*GGUFFile::open(vocab_path(name)));
    std::vector<Token> ids = tok->encode(std::string("ab\xff\xc3(cd\xe2\x82"), false, false);
    EXPECT_FALSE(ids.empty()) << name;
  }
}

namespace {

std::string minimal_vocab(const std::string& model, const std::string& pre) {
  GGUFWriter w;
  w.set("general.architecture", GGUFValue::str("llama"));
  w.set("tokenizer.ggml.model", GGUFValue::str(model));
  if (!pre.empty()) w.set("tokenizer.ggml.pre", GGUFValue::str(pre));
  w.set("tokenizer.ggml.tokens", GGUFValue::str_array({"a", "b", "ab"}));
  w.set("tokenizer.ggml.scores", GGUFValue::f32_array({0, 0, 1}));
  w.set("tokenizer.ggml.token_type", GGUFValue::i32_array({1, 1, 1}));
  w.set("tokenizer.ggml.merges", GGUFValue::str_array({"a b"}));
  return w.bytes();
}

void expect_error_naming(const std::string& bytes, const std::string& what) {
  auto f = GGUFFile::from_bytes(bytes, "mem.gguf");
  try {
    Tokenizer::from_gguf(*f);
    ADD_FAILURE() << "no error for " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Tokenizer, UnknownModelOrPreIsAnError) {
  expect_error_naming(minimal_vocab("wordpiece-xyz", ""), "wordpiece-xyz");
  expect_error_naming(minimal_vocab("gpt2", "no-such-pre"), "no-such-pre");

  // The same in-memory vocabulary with known names works.
  // No "\u2581" and no byte tokens in this vocabulary: the space prefix becomes one <unk> (id 0).
  auto spm = Tokenizer::from_gguf(*GGUFFile::from_bytes(minimal_vocab("llama", ""), "mem.gguf"));
  EXPECT_EQ(spm->encode("ab", false, false), (std::vector<Token>{0, 2}));
  auto bpe = Tokenizer::from_gguf(*GGUFFile::from_bytes(minimal_vocab("gpt2", "gpt-2"), "mem.gguf"));
  EXPECT_EQ(bpe->encode("ab", false, false), (std::vector<Token>{2}));
  EXPECT_EQ(bpe->bos(), -1);
}

TEST(Tokenizer, MismatchedArraysAreAnError) {
  GGUFWriter w;
  w.set("tokenizer.ggml.model", GGUFValue::str("llama"));
  w.set("tokenizer.ggml.tokens", GGUFValue::str_array({"a", "b"}));
  w.set("tokenizer.ggml.scores", GGUFValue::f32_array({0}));
  auto f = GGUFFile::from_bytes(w.bytes(), "mem.gguf");
  EXPECT_THROW(Tokenizer::from_gguf(*f), Error);
  GGUFWriter none;
  none.set("general.architecture", GGUFValue::str("llama"));
  EXPECT_THROW(Tokenizer::from_gguf(*GGUFFile::from_bytes(none.bytes(), "mem.gguf")), Error);
}

TEST(Tokenizer, LongPromptRoundTrips) {
  for (const char* name : {"llama-spm", "gpt-2", "deepseek-llm"}) {
    auto tok = Tokenizer::from_gguf(*GGUFFile::open(vocab_path(name)));
    std::string text;
    for (const Case& c : read_cases(name)) text += c.text + "\n";
    std::string big;
    while (big.size() < 80000) big += text;
    std::vector<Token> ids = tok->encode(big, true, false);
    EXPECT_GT(ids.size(), 16000u) << name;
    EXPECT_EQ(tok->decode(ids), big) << name;
  }
}

// ---- pre-tokenizer regexes without a test vocabulary here (llama3, qwen2, ...) ----

namespace {

std::vector<std::string> words(const std::string& pre, const std::string& text) {
  tok::RegexSplitter split(tok::pre_tokenizer_for(pre).regexes);
  std::vector<std::string> out;
  for (auto [b, e] : split.split(text)) out.push_back(text.substr(b, e - b));
  return out;
}

using W = std::vector<std::string>;

}  // namespace

TEST(PreTokenizer, Llama3Splits) {
  // Splits implied by llama.cpp's llama3 test ids (e.g. "    Hello\n    Hello" -> 262 22691 198 262 22691).
  EXPECT_EQ(words("llama-bpe", "    Hello\n    Hello"), (W{"   ", " Hello", "\n", "   ", " Hello"}));
  EXPECT_EQ(words("llama-bpe", "Hello, y'all! I'M"), (W{"Hello", ",", " y", "'all", "!", " I", "'M"}));
  EXPECT_EQ(words("llama-bpe", "1314151"), (W{"131", "415", "1"}));
  EXPECT_EQ(words("llama-bpe", "\n\n\n"), (W{"\n\n\n"}));
  EXPECT_EQ(words("llama-bpe", "\n ="), (W{"\n", " ="}));
  EXPECT_EQ(words("llama-bpe", "!!\n\nok  "), (W{"!!\n\n", "ok", "  "}));
  EXPECT_EQ(words("llama-bpe", "нещо на"), (W{"нещо", " на"}));
  EXPECT_TRUE(tok::pre_tokenizer_for("llama-bpe").ignore_merges);
  EXPECT_TRUE(tok::pre_tokenizer_for("llama-bpe").add_bos);
}

TEST(PreTokenizer, Qwen2SplitsDigitsSingly) {
  EXPECT_EQ(words("qwen2", "333 apples"), (W{"3", "3", "3", " apples"}));
  EXPECT_EQ(words("qwen2", "don't"), (W{"don", "'t"}));
  EXPECT_FALSE(tok::pre_tokenizer_for("qwen2").add_bos);
}

TEST(PreTokenizer, EveryKnownNameCompiles) {
  for (const char* pre : {"", "default", "llama3", "llama-bpe", "dbrx", "deepseek-llm", "deepseek-coder",
                          "deepseek-v3", "falcon", "starcoder", "refact", "gpt-2", "mpt", "qwen2", "stablelm2",
                          "poro-chat", "viking", "tekken", "gpt-4o", "command-r", "smollm"}) {
    std::vector<std::string> w = words(pre, "Hello, world! 12345 \xE4\xBD\xA0\xE5\xA5\xBD (x)\n\n  ");
    std::string joined;
    for (const auto& s : w) joined += s;
    EXPECT_EQ(joined, "Hello, world! 12345 \xE4\xBD\xA0\xE5\xA5\xBD (x)\n\n  ") << pre;
  }
  EXPECT_THROW(tok::pre_tokenizer_for("no-such-pre"), Error);
}
