#pragma once
// Tokenizers built from a GGUF vocabulary: SentencePiece-style (`llama`) and byte-level BPE (`gpt2`).
// Both follow llama.cpp's algorithms, so token ids match what llama.cpp produces for the same file.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvslim/gguf.h"

namespace kvslim {

/// Token id type (index into the vocabulary).
using Token = int32_t;

/// Tokenizer loaded from `tokenizer.ggml.*` metadata. Thread-safe for concurrent const use.
class Tokenizer {
 public:
  /// Builds from the file's vocabulary. `tokenizer.ggml.model` "llama" gives the SPM tokenizer,
  /// "gpt2" byte-level BPE with the pre-tokenizer named by `tokenizer.ggml.pre` (missing ->
  /// "default"). Throws kvslim::Error for a missing/unknown model or pre-tokenizer (naming the
  /// value), or inconsistent arrays.
  static std::unique_ptr<Tokenizer> from_gguf(const GGUFFile& f);
  virtual ~Tokenizer() = default;

  /// Encodes `text`. `add_bos`: prepend BOS when the vocabulary has one (callers decide; see
  /// add_bos_default()). EOS is never appended here. `parse_special`: recognise control and
  /// unknown token texts (e.g. "<|eot_id|>", "<s>") inside `text` and emit them as single ids,
  /// longest first. User-defined tokens are matched whatever `parse_special` says (as llama.cpp
  /// and HF tokenizers do). SPM adds the space prefix (when the vocabulary asks for it) at the
  /// start of the text and after every special token.
  virtual std::vector<Token> encode(const std::string& text, bool add_bos, bool parse_special) const = 0;
  /// Text of one token as it appears in output: byte tokens give their byte, SPM's U+2581 and
  /// BPE's byte-to-unicode mapping are undone; control and unknown tokens give "".
  virtual std::string piece(Token t) const = 0;
  /// Concatenated pieces. For SPM vocabularies with a space prefix, the one space the encoder
  /// prefixed at the start (and after each special token) is dropped, so
  /// decode(encode(s, ...)) == s for ordinary text. No other clean-up is applied.
  virtual std::string decode(const std::vector<Token>& tokens) const = 0;

  virtual int n_vocab() const = 0;
  virtual Token bos() const = 0;  ///< -1 when none
  virtual Token eos() const = 0;  ///< -1 when none
  virtual Token eot() const = 0;  ///< end-of-turn token (e.g. "<|eot_id|>"), -1 when none
  virtual Token unk() const = 0;  ///< -1 when none
  /// Whether metadata asks for BOS to be added (default true for SPM and llama3-style BPE,
  /// false for other BPE).
  virtual bool add_bos_default() const = 0;
  /// Whether metadata (`tokenizer.ggml.add_eos_token`) asks for EOS to be appended.
  virtual bool add_eos_default() const = 0;
  virtual bool is_eog(Token t) const = 0;  ///< end-of-generation (EOS, EOT, EOM, "<|im_end|>", ...)
  /// Control or unknown token (rendered as "" by piece()).
  virtual bool is_control(Token t) const = 0;
  /// The token's string as stored in the vocabulary ("" for an out-of-range id).
  virtual std::string token_text(Token t) const = 0;
  /// Id of the vocabulary entry whose stored string is exactly `text`, -1 when none.
  virtual Token find_token(const std::string& text) const = 0;
  /// `tokenizer.ggml.model` ("llama" or "gpt2").
  virtual std::string model() const = 0;
  /// `tokenizer.ggml.pre` as stored ("" when absent).
  virtual std::string pre() const = 0;
};

}  // namespace kvslim
