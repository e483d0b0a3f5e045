#pragma once
// Synthetic long-context tasks: needle-in-a-haystack and RULER-style generators (Hsieh et al.,
// "RULER: What's the Real Context Size of Your Long-Context Language Models?", arXiv 2404.06654).
//
// A sample is a list of text pieces (filler sentences and needles) plus a question. Pieces are
// tokenized one by one and concatenated after one BOS, so every needle's token span is known
// exactly and can be looked up in the compressed cache. Every text the generators emit comes from
// a TaskText, so the same tasks fit a real model (English templates, the defaults) or a small
// model with its own vocabulary (a JSON file overriding the pieces).
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvslim/tokenizer.h"

namespace kvslim {

/// The text pieces the generators use. Templates name their slots in braces: {key}, {value},
/// {keys}, {var}, {prev}, {n}, {i}, {word}; an unknown slot raises kvslim::Error naming it.
struct TaskText {
  std::vector<std::string> filler;  ///< haystack sentences, drawn at random (seeded)
  std::string separator = " ";      ///< put between consecutive pieces and before the question

  std::vector<std::string> keys;        ///< needle keys (distinct keys per sample are drawn from here)
  /// When `keys` is empty: keys are random strings of `key_length` characters of `key_chars`.
  std::string key_chars;
  int key_length = 3;
  std::vector<std::string> value_words; ///< needle values; empty -> random numbers of value_digits digits
  int value_digits = 7;

  std::string needle = "One of the special magic numbers for {key} is: {value}.";
  std::string question = "What is the special magic number for {key} mentioned in the provided text?";
  std::string answer_prefix = "The special magic number for {key} mentioned in the provided text is";
  std::string question_multi_value = "What are all the special magic numbers for {key} mentioned in the provided text?";
  std::string answer_prefix_multi_value = "The special magic numbers for {key} mentioned in the provided text are";
  std::string question_multi_query = "What are all the special magic numbers for {keys} mentioned in the provided text?";
  std::string answer_prefix_multi_query = "The special magic numbers for {keys} mentioned in the provided text are";
  std::string key_join = ", ";  ///< joins the keys of {keys}

  std::vector<std::string> var_names;  ///< variable tracking names; empty -> 5 random capitals
  std::string vt_first = "VAR {var} = {value}.";
  std::string vt_chain = "VAR {var} = VAR {prev}.";
  std::string vt_question = "Find all variables that are assigned the value {value} in the text above.";
  std::string vt_answer_prefix =
      "Answer: According to the chain(s) of variable assignment in the text above, {n} variables are assigned the "
      "value {value}, they are:";

  std::vector<std::string> words;  ///< word pool of the word-extraction tasks (extended with pseudo-words when short)
  std::string cwe_item = "{i}. {word}";
  std::string cwe_question = "What are the {n} most common words in the above list?";
  std::string cwe_answer_prefix = "Answer: The top {n} words that appear most often in the list are:";
  std::string fwe_question = "What are the {n} most frequently appeared words in the above coded text?";
  std::string fwe_answer_prefix = "Answer: According to the coded text above, the {n} most frequently appeared words are:";

  /// Decoding stops when the answer contains this after some non-space text ("" = never).
  std::string stop = "\n";

  /// English defaults: our own filler sentences, adjective-noun keys, 7-digit values.
  static TaskText defaults();
  /// defaults() with the fields present in the JSON object file `path` replaced (same names as
  /// above). Throws kvslim::Error for an unreadable file, bad JSON, an unknown field or a value
  /// of the wrong type, naming the file and the field.
  static TaskText from_json_file(const std::string& path);
  /// Same as from_json_file for JSON text; `label` names it in errors.
  static TaskText from_json_text(const std::string& json, const std::string& label);
};

/// Replaces every {name} in `tmpl` by its value. Throws kvslim::Error naming the template and
/// the slot when a slot has no value.
std::string fill_template(const std::string& tmpl, const std::vector<std::pair<std::string, std::string>>& slots);

/// One piece of a context. `text` includes its leading separator (none for the first piece), so
/// the context text is the concatenation of the pieces.
struct Piece {
  std::string text;
  int needle = -1;  ///< index into TaskSample::needles, -1 for filler
};

/// One generated sample.
struct TaskSample {
  std::string task;
  uint64_t seed = 0;
  int target_tokens = 0;             ///< requested context length, BOS included
  std::vector<Piece> context;
  std::vector<double> needle_depths; ///< requested depth (0 = start, 1 = end) per needle
  std::vector<std::string> needles;  ///< needle texts, as inserted
  std::string question;              ///< appended after compression; starts with the separator
  std::vector<std::string> answers;  ///< reference strings
  bool match_all = true;             ///< string_match_all (else string_match_part)
  int n_predict = 32;                ///< suggested number of tokens to decode
  std::string context_text() const;
};

/// Encodes text pieces so that their concatenation reads as one text: the first piece as the
/// tokenizer encodes a text start, later pieces as a continuation (for SentencePiece vocabularies
/// that prefix a space, the piece's own leading space replaces that prefix). Special tokens are
/// never parsed. count() caches results; not thread-safe.
class PieceEncoder {
 public:
  explicit PieceEncoder(const Tokenizer& tok);
  std::vector<Token> encode(const std::string& text, bool first) const;
  /// Tokens of `text` as a continuation piece.
  size_t count(const std::string& text) const;
  /// Whether the vocabulary prefixes a space to every encoded text.
  bool adds_space_prefix() const { return space_prefix_; }

 private:
  const Tokenizer& tok_;
  bool space_prefix_ = false;
  mutable std::unordered_map<std::string, size_t> cache_;
};

/// A sample as tokens: BOS (when the vocabulary adds one) + the pieces, and the question.
struct TokenizedSample {
  std::vector<Token> context;
  std::vector<Token> question;
  /// [begin, end) token indices in `context` (hence cache positions) of each needle.
  std::vector<std::pair<int, int>> needle_spans;
  /// Measured depth of each needle: tokens before it (BOS excluded) / haystack tokens (context
  /// without BOS and without the needle).
  std::vector<double> needle_depths;
};

/// Tokenizes `s` piece by piece. Throws kvslim::Error when the context is empty.
TokenizedSample tokenize_sample(const TaskSample& s, const PieceEncoder& enc, const Tokenizer& tok);

/// Token count of one continuation piece (generators size the haystack with it).
using TokenCounter = std::function<size_t(const std::string&)>;

/// Knobs of the RULER-style tasks; defaults follow the RULER paper's standard configuration.
struct RulerOptions {
  int multi_keys = 4;         ///< niah_multikey: needles in all (1 asked, the rest distractors)
  int multi_values = 4;       ///< niah_multivalue: values of the one key
  int multi_queries = 4;      ///< niah_multiquery: keys asked together
  int vt_chains = 1;          ///< variable tracking: chains (1 asked, the rest distractors)
  int vt_hops = 4;            ///< assignments after the first in each chain
  int cwe_common = 10;        ///< common words to find
  int cwe_freq_common = 30;   ///< occurrences of each common word (lowered for short contexts)
  int cwe_freq_uncommon = 3;  ///< occurrences of each other word
  int fwe_top = 3;            ///< most frequent words to find
  double fwe_alpha = 2.0;     ///< Zipf exponent of the coded text
  int fwe_vocab = 800;        ///< distinct coded words
};

/// Task names: niah_single, niah_multikey, niah_multivalue, niah_multiquery, vt, cwe, fwe.
const std::vector<std::string>& ruler_tasks();

/// A single needle at `depth` in [0, 1] of a haystack of about `target_tokens` context tokens
/// (BOS included, never more unless a single filler sentence is needed). Deterministic for
/// (text, target_tokens, depth, seed). Throws kvslim::Error for a depth outside [0, 1], no
/// filler, no keys, or a target too short for the needle.
TaskSample make_niah(const TaskText& text, int target_tokens, double depth, uint64_t seed, const TokenCounter& count);

/// A RULER-style sample of task `task` (see ruler_tasks()). `depth` in [0, 1] places the asked
/// needle of the needle tasks; a negative depth draws it at random. Deterministic for the
/// arguments. Throws kvslim::Error for an unknown task (listing the known ones) or a context too
/// short for the task.
TaskSample make_ruler(const std::string& task, const TaskText& text, const RulerOptions& opt, int target_tokens,
                      double depth, uint64_t seed, const TokenCounter& count);

}  // namespace kvslim
