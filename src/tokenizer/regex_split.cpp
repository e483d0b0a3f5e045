// Pre-tokenizer regex splitting with PCRE2 (UTF + UCP, so \p{L}, \p{N}, \s are Unicode-aware).
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "tokenizer/internal.h"

namespace kvslim::tok {

struct RegexSplitter::Impl {
  std::vector<pcre2_code*> codes;
  ~Impl() {
    for (pcre2_code* c : codes) pcre2_code_free(c);
  }
};

RegexSplitter::RegexSplitter(const std::vector<std::string>& patterns) : impl_(std::make_unique<Impl>()) {
  for (const std::string& p : patterns) {
    int err = 0;
    PCRE2_SIZE err_off = 0;
    // DOLLAR_ENDONLY: `$` means the end of the word, as in ECMAScript (llama.cpp's std::regex).
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      throw Error(fmt::format("tokenizer: bad pre-tokenizer regex at offset {}: {} ({})", err_off,
                              reinterpret_cast<const char*>(msg), p));
    }
    // JIT is an optimisation only; interpretation is used if it is unavailable.
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    impl_->codes.push_back(code);
  }
}

RegexSplitter::~RegexSplitter() = default;

std::vector<std::pair<size_t, size_t>> RegexSplitter::split(std::string_view text) const {
  std::vector<std::pair<size_t, size_t>> words;
  if (text.empty()) return words;
  words.emplace_back(0, text.size());
  std::vector<std::pair<size_t, size_t>> next;
  for (pcre2_code* code : impl_->codes) {
    std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> holder(
        pcre2_match_data_create_from_pattern(code, nullptr), pcre2_match_data_free);
    pcre2_match_data* md = holder.get();
    if (!md) throw Error("tokenizer: out of memory for regex match data");
    next.clear();
    next.reserve(words.size() * 2);
    for (auto [wb, we] : words) {
      // The word is the whole subject, so lookaheads and `$` stop at its end.
      auto subject = reinterpret_cast<PCRE2_SPTR>(text.data() + wb);
      const size_t len = we - wb;
      size_t pos = 0;   // where the search resumes
      size_t done = 0;  // end of the last piece emitted
      while (pos < len) {
        int rc = pcre2_match(code, subject, len, pos, PCRE2_NO_UTF_CHECK, md, nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof(msg));
          throw Error(fmt::format("tokenizer: regex match failed: {}", reinterpret_cast<const char*>(msg)));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {
          // Empty match: contributes no word; step over one character.
          pos = ms + utf8_len(static_cast<unsigned char>(text[wb + ms]));
          continue;
        }
        if (ms > done) next.emplace_back(wb + done, wb + ms);  // text between matches
        next.emplace_back(wb + ms, wb + me);
        done = pos = me;
      }
      if (done < len) next.emplace_back(wb + done, we);
    }
    words.swap(next);
  }
  return words;
}

}  // namespace kvslim::tok
