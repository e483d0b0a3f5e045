// Needle-in-a-haystack and RULER-style sample generators, and piece-wise tokenization.
#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "kvslim/eval_tasks.h"

namespace kvslim {

namespace {

// SplitMix64 with our own bounded draws: std:: distributions differ between standard libraries,
// and a seed must give the same sample everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n), n > 0 (rejection keeps it unbiased).
  uint64_t below(uint64_t n) {
    const uint64_t lim = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = next(); while (x >= lim);
    return x % n;
  }
  double uniform() { return (next() >> 11) * 0x1.0p-53; }
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  uint64_t s_;
};

uint64_t mix_seed(uint64_t seed, const std::string& salt) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the salt, then mixed with the seed
  for (unsigned char c : salt) h = (h ^ c) * 1099511628211ull;
  Rng r(seed ^ h);
  return r.next();
}

std::vector<std::string> draw_distinct(const std::vector<std::string>& pool, size_t n, Rng& rng, const char* what) {
  if (pool.size() < n)
    throw Error(fmt::format("task text: {} needs {} distinct entries, the pool has {}", what, n, pool.size()));
  std::vector<size_t> idx(pool.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::vector<std::string> out;
  for (size_t i = 0; i < n; ++i) {
    std::swap(idx[i], idx[i + rng.below(idx.size() - i)]);
    out.push_back(pool[idx[i]]);
  }
  return out;
}

std::vector<std::string> draw_keys(const TaskText& t, size_t n, Rng& rng) {
  if (!t.keys.empty() || t.key_chars.empty()) return draw_distinct(t.keys, n, rng, "keys");
  std::vector<std::string> out;
  std::set<std::string> seen;
  size_t tries = 0;
  while (out.size() < n) {
    std::string k;
    for (int i = 0; i < t.key_length; ++i) k += t.key_chars[rng.below(t.key_chars.size())];
    if (seen.insert(k).second) out.push_back(k);
    if (++tries > 1000 * n) throw Error(fmt::format("task text: key_chars/key_length give too few distinct keys"));
  }
  return out;
}

std::string random_number(int digits, Rng& rng) {
  std::string s(1, static_cast<char>('1' + rng.below(9)));
  for (int i = 1; i < digits; ++i) s += static_cast<char>('0' + rng.below(10));
  return s;
}

std::vector<std::string> draw_values(const TaskText& t, size_t n, Rng& rng) {
  if (!t.value_words.empty()) return draw_distinct(t.value_words, n, rng, "value_words");
  std::vector<std::string> out;
  std::set<std::string> seen;
  while (out.size() < n) {
    std::string v = random_number(t.value_digits, rng);
    if (seen.insert(v).second) out.push_back(v);
    if (seen.size() > 1000 * n) throw Error(fmt::format("task text: value_digits={} gives too few distinct values", t.value_digits));
  }
  return out;
}

std::vector<std::string> draw_var_names(const TaskText& t, size_t n, Rng& rng) {
  if (!t.var_names.empty()) return draw_distinct(t.var_names, n, rng, "var_names");
  std::vector<std::string> out;
  std::set<std::string> seen;
  while (out.size() < n) {
    std::string v;
    for (int i = 0; i < 5; ++i) v += static_cast<char>('A' + rng.below(26));
    if (seen.insert(v).second) out.push_back(v);
  }
  return out;
}

/// The pool's words, then pronounceable pseudo-words until `n` distinct ones exist; shuffled.
std::vector<std::string> word_pool(const TaskText& t, size_t n, Rng& rng) {
  std::vector<std::string> pool = t.words;
  std::set<std::string> seen(pool.begin(), pool.end());
  static const char* kCons = "bdfgklmnprstvz";
  static const char* kVow = "aeiou";
  size_t tries = 0;
  while (seen.size() < n) {
    std::string w;
    int syl = 2 + static_cast<int>(rng.below(2));
    for (int i = 0; i < syl; ++i) {
      w += kCons[rng.below(14)];
      w += kVow[rng.below(5)];
    }
    if (seen.insert(w).second) pool.push_back(w);
    if (++tries > 100 * n + 1000) throw Error("task text: cannot build enough distinct words");
  }
  pool.assign(seen.begin(), seen.end());  // deterministic order before the seeded shuffle
  rng.shuffle(pool);
  pool.resize(n);
  return pool;
}

struct Insert {
  std::string text;
  double depth;
  int needle;
};

/// Draws filler sentences up to the token budget and places each insert at the sentence boundary
/// nearest to its depth (a fraction of the haystack's tokens).
std::vector<Piece> layout(const TaskText& t, int target_tokens, std::vector<Insert> inserts, Rng& rng,
                          const TokenCounter& count, const std::string& task) {
  if (t.filler.empty()) throw Error(fmt::format("task {}: the task text has no filler sentences", task));
  long ins_tokens = 0;
  for (const auto& in : inserts) ins_tokens += static_cast<long>(count(t.separator + in.text));
  const long budget = static_cast<long>(target_tokens) - 1 - ins_tokens;  // 1 for BOS
  if (budget < 0)
    throw Error(fmt::format("task {}: a context of {} tokens is too short for its needles ({} tokens)", task,
                            target_tokens, ins_tokens));
  std::vector<std::string> hay;
  std::vector<long> cum{0};
  size_t prev = SIZE_MAX;
  for (;;) {
    size_t i = rng.below(t.filler.size());
    if (i == prev && t.filler.size() > 1) i = (i + 1 + rng.below(t.filler.size() - 1)) % t.filler.size();
    const long c = static_cast<long>(count(t.separator + t.filler[i]));
    if (c <= 0) throw Error(fmt::format("task {}: filler sentence {} is empty", task, i));
    if (cum.back() + c > budget) break;
    hay.push_back(t.filler[i]);
    cum.push_back(cum.back() + c);
    prev = i;
  }
  std::stable_sort(inserts.begin(), inserts.end(), [](const Insert& a, const Insert& b) { return a.depth < b.depth; });
  std::vector<std::vector<const Insert*>> at(hay.size() + 1);
  for (const auto& in : inserts) {
    const double want = in.depth * cum.back();
    size_t best = 0;
    for (size_t k = 1; k < cum.size(); ++k)
      if (std::fabs(cum[k] - want) < std::fabs(cum[best] - want)) best = k;
    at[best].push_back(&in);
  }
  std::vector<Piece> out;
  for (size_t k = 0; k <= hay.size(); ++k) {
    for (const Insert* in : at[k]) out.push_back({t.separator + in->text, in->needle});
    if (k < hay.size()) out.push_back({t.separator + hay[k], -1});
  }
  if (!out.empty() && out[0].text.compare(0, t.separator.size(), t.separator) == 0)
    out[0].text.erase(0, t.separator.size());
  return out;
}

void check_depth(double d, const std::string& task) {
  if (!(d >= 0.0 && d <= 1.0)) throw Error(fmt::format("task {}: needle depth {} is outside [0, 1]", task, d));
}

std::string join(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

TaskSample needle_task(const std::string& task, const TaskText& t, int target, uint64_t seed,
                       const std::vector<std::string>& keys, const std::vector<std::string>& values,
                       const std::vector<double>& depths, Rng& rng, const TokenCounter& count) {
  TaskSample s;
  s.task = task;
  s.seed = seed;
  s.target_tokens = target;
  std::vector<Insert> ins;
  for (size_t i = 0; i < values.size(); ++i) {
    const std::string& key = keys[std::min(i, keys.size() - 1)];
    s.needles.push_back(fill_template(t.needle, {{"key", key}, {"value", values[i]}}));
    s.needle_depths.push_back(depths[i]);
    ins.push_back({s.needles.back(), depths[i], static_cast<int>(i)});
  }
  s.context = layout(t, target, ins, rng, count, task);
  return s;
}

std::vector<double> random_depths(size_t n, Rng& rng) {
  std::vector<double> d(n);
  for (auto& x : d) x = rng.uniform();
  return d;
}

std::string numbered(const TaskText& t, int i, const std::string& w) {
  return fill_template(t.cwe_item, {{"i", std::to_string(i)}, {"word", w}});
}

// RULER's common words extraction: a numbered list where `cwe_common` words appear
// `cwe_freq_common` times each and the others `cwe_freq_uncommon` times; as many others as fit.
TaskSample make_cwe(const TaskText& t, const RulerOptions& o, int target, uint64_t seed, Rng& rng,
                    const TokenCounter& count) {
  const std::string task = "cwe";
  int fc = o.cwe_freq_common, fu = o.cwe_freq_uncommon;
  if (o.cwe_common < 1 || fu < 1 || fc <= fu)
    throw Error(fmt::format("task cwe: need cwe_common >= 1 and cwe_freq_common ({}) > cwe_freq_uncommon ({}) >= 1",
                            fc, fu));
  const long budget = static_cast<long>(target) - 1;
  std::vector<std::string> probe = word_pool(t, 16, rng);
  double avg = 0;
  for (const auto& w : probe) avg += count(t.separator + numbered(t, 100, w));
  avg /= probe.size();
  const double items = budget / std::max(avg, 1.0);
  if (items < double(o.cwe_common) * fc) {
    // Short contexts: other words once each, common words as often as fits (at least twice).
    fu = 1;
    fc = std::max(2, static_cast<int>(items / o.cwe_common));
  }
  if (items < double(o.cwe_common) * fc)
    throw Error(fmt::format("task cwe: a context of {} tokens is too short for {} common words (about {} tokens "
                            "per list item); use a longer context",
                            target, o.cwe_common, avg));
  long k = std::max(0L, static_cast<long>((items - double(o.cwe_common) * fc) / fu));
  std::vector<std::string> pool = word_pool(t, o.cwe_common + k, rng);
  const uint64_t order_seed = rng.next();
  for (;;) {
    std::vector<std::string> list;
    for (int c = 0; c < o.cwe_common; ++c) list.insert(list.end(), fc, pool[c]);
    for (long u = 0; u < k; ++u) list.insert(list.end(), fu, pool[o.cwe_common + u]);
    Rng order(order_seed);
    order.shuffle(list);
    TaskSample s;
    s.task = task;
    s.seed = seed;
    s.target_tokens = target;
    long used = 0;
    for (size_t i = 0; i < list.size(); ++i) {
      std::string text = (i ? t.separator : "") + numbered(t, static_cast<int>(i + 1), list[i]);
      used += static_cast<long>(count(i ? text : t.separator + text));
      s.context.push_back({text, -1});
    }
    if (used > budget && k > 0) {
      k -= std::max(1L, static_cast<long>((used - budget) / (fu * std::max(avg, 1.0))));
      k = std::max(k, 0L);
      continue;
    }
    const std::string n = std::to_string(o.cwe_common);
    s.question = t.separator + fill_template(t.cwe_question, {{"n", n}}) + t.separator +
                 fill_template(t.cwe_answer_prefix, {{"n", n}});
    s.answers.assign(pool.begin(), pool.begin() + o.cwe_common);
    s.n_predict = 12 * o.cwe_common;
    return s;
  }
}

// RULER's frequent words extraction: coded words drawn from a Zipf distribution; the answer is
// the `fwe_top` most frequent ones (a tie at the boundary is broken by rewriting one occurrence).
TaskSample make_fwe(const TaskText& t, const RulerOptions& o, int target, uint64_t seed, Rng& rng,
                    const TokenCounter& count) {
  if (o.fwe_top < 1 || o.fwe_vocab <= o.fwe_top || !(o.fwe_alpha > 0))
    throw Error(fmt::format("task fwe: need fwe_top >= 1, fwe_vocab > fwe_top and fwe_alpha > 0 (got {}, {}, {})",
                            o.fwe_top, o.fwe_vocab, o.fwe_alpha));
  std::vector<std::string> vocab = word_pool(t, o.fwe_vocab, rng);
  std::vector<double> cdf(vocab.size());
  double z = 0;
  for (size_t r = 0; r < vocab.size(); ++r) cdf[r] = (z += std::pow(double(r + 1), -o.fwe_alpha));
  const long budget = static_cast<long>(target) - 1;
  std::vector<size_t> seq;
  long used = 0;
  for (;;) {
    const double u = rng.uniform() * z;
    size_t r = std::min<size_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin(), vocab.size() - 1);
    const long c = static_cast<long>(count(t.separator + vocab[r]));
    if (used + c > budget) break;
    used += c;
    seq.push_back(r);
  }
  std::vector<long> freq(vocab.size(), 0);
  for (size_t r : seq) ++freq[r];
  auto ranked = [&] {
    std::vector<size_t> idx(vocab.size());
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) { return freq[a] > freq[b]; });
    return idx;
  };
  std::vector<size_t> rk = ranked();
  const size_t top = static_cast<size_t>(o.fwe_top);
  if (freq[rk[top - 1]] == 0)
    throw Error(fmt::format("task fwe: a context of {} tokens is too short for {} distinct words", target, top));
  while (freq[rk[top]] == freq[rk[top - 1]]) {
    // Rewrite the last occurrence of the first word outside the top as the last word inside it.
    const size_t in = rk[top - 1], out = rk[top];
    for (size_t i = seq.size(); i-- > 0;)
      if (seq[i] == out) {
        seq[i] = in;
        break;
      }
    ++freq[in];
    --freq[out];
    rk = ranked();
  }
  TaskSample s;
  s.task = "fwe";
  s.seed = seed;
  s.target_tokens = target;
  for (size_t i = 0; i < seq.size(); ++i) s.context.push_back({(i ? t.separator : "") + vocab[seq[i]], -1});
  const std::string n = std::to_string(top);
  s.question = t.separator + fill_template(t.fwe_question, {{"n", n}}) + t.separator +
               fill_template(t.fwe_answer_prefix, {{"n", n}});
  for (size_t i = 0; i < top; ++i) s.answers.push_back(vocab[rk[i]]);
  s.n_predict = 12 * o.fwe_top + 12;
  return s;
}

}  // namespace

std::string fill_template(const std::string& tmpl, const std::vector<std::pair<std::string, std::string>>& slots) {
  std::string out;
  size_t i = 0;
  while (i < tmpl.size()) {
    size_t open = tmpl.find('{', i);
    if (open == std::string::npos) {
      out.append(tmpl, i, std::string::npos);
      break;
    }
    size_t close = tmpl.find('}', open);
    if (close == std::string::npos) {
      out.append(tmpl, i, std::string::npos);
      break;
    }
    out.append(tmpl, i, open - i);
    const std::string name = tmpl.substr(open + 1, close - open - 1);
    auto it = std::find_if(slots.begin(), slots.end(), [&](const auto& p) { return p.first == name; });
    if (it == slots.end()) {
      std::string known;
      for (const auto& p : slots) known += (known.empty() ? "" : ", ") + ("{" + p.first + "}");
      throw Error(fmt::format("task text template '{}': slot {{{}}} is not available here (available: {})", tmpl,
                              name, known.empty() ? "none" : known));
    }
    out += it->second;
    i = close + 1;
  }
  return out;
}

std::string TaskSample::context_text() const {
  std::string s;
  for (const auto& p : context) s += p.text;
  return s;
}

PieceEncoder::PieceEncoder(const Tokenizer& tok) : tok_(tok) {
  // SentencePiece vocabularies with add_space_prefix render "a" as " a"; byte-level BPE does not.
  std::string r;
  for (Token t : tok.encode("a", false, false)) r += tok.piece(t);
  space_prefix_ = !r.empty() && r[0] == ' ';
}

std::vector<Token> PieceEncoder::encode(const std::string& text, bool first) const {
  if (!first && space_prefix_ && !text.empty() && text[0] == ' ') return tok_.encode(text.substr(1), false, false);
  return tok_.encode(text, false, false);
}

size_t PieceEncoder::count(const std::string& text) const {
  auto it = cache_.find(text);
  if (it != cache_.end()) return it->second;
  size_t n = encode(text, false).size();
  cache_.emplace(text, n);
  return n;
}

TokenizedSample tokenize_sample(const TaskSample& s, const PieceEncoder& enc, const Tokenizer& tok) {
  TokenizedSample out;
  if (tok.bos() >= 0 && tok.add_bos_default()) out.context.push_back(tok.bos());
  const int n_bos = static_cast<int>(out.context.size());
  size_t n_needles = 0;
  for (const auto& p : s.context) n_needles = std::max(n_needles, static_cast<size_t>(p.needle + 1));
  out.needle_spans.assign(n_needles, {0, 0});
  for (size_t i = 0; i < s.context.size(); ++i) {
    std::vector<Token> t = enc.encode(s.context[i].text, i == 0);
    const int b = static_cast<int>(out.context.size());
    out.context.insert(out.context.end(), t.begin(), t.end());
    if (s.context[i].needle >= 0) out.needle_spans[s.context[i].needle] = {b, static_cast<int>(out.context.size())};
  }
  if (static_cast<int>(out.context.size()) == n_bos)
    throw Error(fmt::format("task {}: the sample's context is empty", s.task));
  out.question = enc.encode(s.question, false);
  const double n_text = static_cast<double>(out.context.size() - n_bos);
  for (const auto& [b, e] : out.needle_spans) {
    const double hay = n_text - (e - b);
    out.needle_depths.push_back(hay > 0 ? (b - n_bos) / hay : 0.0);
  }
  return out;
}

const std::vector<std::string>& ruler_tasks() {
  static const std::vector<std::string> k{"niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery",
                                          "vt", "cwe", "fwe"};
  return k;
}

TaskSample make_niah(const TaskText& t, int target_tokens, double depth, uint64_t seed, const TokenCounter& count) {
  check_depth(depth, "niah");
  Rng rng(mix_seed(seed, "niah"));
  auto keys = draw_keys(t, 1, rng);
  auto values = draw_values(t, 1, rng);
  TaskSample s = needle_task("niah", t, target_tokens, seed, keys, values, {depth}, rng, count);
  s.question = t.separator + fill_template(t.question, {{"key", keys[0]}}) + t.separator +
               fill_template(t.answer_prefix, {{"key", keys[0]}});
  s.answers = values;
  s.n_predict = 24;
  return s;
}

TaskSample make_ruler(const std::string& task, const TaskText& t, const RulerOptions& o, int target, double depth,
                      uint64_t seed, const TokenCounter& count) {
  if (depth >= 0) check_depth(depth, task);
  Rng rng(mix_seed(seed, task));
  auto first_depth = [&](std::vector<double> d) {
    if (depth >= 0 && !d.empty()) d[0] = depth;
    return d;
  };
  const std::string& sep = t.separator;
  if (task == "niah_single") {
    auto keys = draw_keys(t, 1, rng);
    auto values = draw_values(t, 1, rng);
    TaskSample s = needle_task(task, t, target, seed, keys, values, first_depth(random_depths(1, rng)), rng, count);
    s.question = sep + fill_template(t.question, {{"key", keys[0]}}) + sep +
                 fill_template(t.answer_prefix, {{"key", keys[0]}});
    s.answers = values;
    s.n_predict = 24;
    return s;
  }
  if (task == "niah_multikey") {
    if (o.multi_keys < 1) throw Error(fmt::format("task {}: multi_keys={} must be >= 1", task, o.multi_keys));
    auto keys = draw_keys(t, o.multi_keys, rng);
    auto values = draw_values(t, o.multi_keys, rng);
    TaskSample s = needle_task(task, t, target, seed, keys, values, first_depth(random_depths(o.multi_keys, rng)),
                               rng, count);
    s.question = sep + fill_template(t.question, {{"key", keys[0]}}) + sep +
                 fill_template(t.answer_prefix, {{"key", keys[0]}});
    s.answers = {values[0]};
    s.n_predict = 24;
    return s;
  }
  if (task == "niah_multivalue") {
    if (o.multi_values < 1) throw Error(fmt::format("task {}: multi_values={} must be >= 1", task, o.multi_values));
    auto keys = draw_keys(t, 1, rng);
    auto values = draw_values(t, o.multi_values, rng);
    TaskSample s = needle_task(task, t, target, seed, keys, values, first_depth(random_depths(o.multi_values, rng)),
                               rng, count);
    s.question = sep + fill_template(t.question_multi_value, {{"key", keys[0]}}) + sep +
                 fill_template(t.answer_prefix_multi_value, {{"key", keys[0]}});
    s.answers = values;
    s.n_predict = 16 * o.multi_values;
    return s;
  }
  if (task == "niah_multiquery") {
    if (o.multi_queries < 1) throw Error(fmt::format("task {}: multi_queries={} must be >= 1", task, o.multi_queries));
    auto keys = draw_keys(t, o.multi_queries, rng);
    auto values = draw_values(t, o.multi_queries, rng);
    TaskSample s = needle_task(task, t, target, seed, keys, values, first_depth(random_depths(o.multi_queries, rng)),
                               rng, count);
    const std::string ks = join(keys, t.key_join);
    s.question = sep + fill_template(t.question_multi_query, {{"keys", ks}}) + sep +
                 fill_template(t.answer_prefix_multi_query, {{"keys", ks}});
    s.answers = values;
    s.n_predict = 16 * o.multi_queries;
    return s;
  }
  if (task == "vt") {
    if (o.vt_chains < 1 || o.vt_hops < 1)
      throw Error(fmt::format("task vt: vt_chains={} and vt_hops={} must be >= 1", o.vt_chains, o.vt_hops));
    const int per = o.vt_hops + 1;
    auto names = draw_var_names(t, static_cast<size_t>(o.vt_chains) * per, rng);
    auto values = draw_values(t, o.vt_chains, rng);
    TaskSample s;
    s.task = task;
    s.seed = seed;
    s.target_tokens = target;
    std::vector<Insert> ins;
    for (int c = 0; c < o.vt_chains; ++c) {
      // Assignments of a chain keep their order in the text: sorted depths.
      std::vector<double> d = random_depths(per, rng);
      std::sort(d.begin(), d.end());
      for (int h = 0; h < per; ++h) {
        const std::string& var = names[c * per + h];
        std::string text = h == 0 ? fill_template(t.vt_first, {{"var", var}, {"value", values[c]}})
                                  : fill_template(t.vt_chain, {{"var", var}, {"prev", names[c * per + h - 1]}});
        const int idx = static_cast<int>(s.needles.size());
        s.needles.push_back(text);
        s.needle_depths.push_back(d[h]);
        ins.push_back({text, d[h], idx});
      }
    }
    s.context = layout(t, target, ins, rng, count, task);
    const std::string n = std::to_string(per);
    s.question = sep + fill_template(t.vt_question, {{"value", values[0]}, {"n", n}}) + sep +
                 fill_template(t.vt_answer_prefix, {{"value", values[0]}, {"n", n}});
    s.answers.assign(names.begin(), names.begin() + per);
    s.n_predict = 8 * per + 8;
    return s;
  }
  if (task == "cwe") return make_cwe(t, o, target, seed, rng, count);
  if (task == "fwe") return make_fwe(t, o, target, seed, rng, count);
  std::string known;
  for (const auto& k : ruler_tasks()) known += (known.empty() ? "" : ", ") + k;
  throw Error(fmt::format("unknown task '{}' (known: {})", task, known));
}

}  // namespace kvslim
