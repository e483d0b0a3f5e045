// The server's request parsing, stop-string scanning and metrics text, without HTTP (the HTTP
// tests are tests/server/*.py).
#include <gtest/gtest.h>

#include "server/api.h"
#include "server/metrics.h"

using namespace kvslim;
using namespace kvslim::server;

TEST(ServerApi, StopStringsAndUtf8) {
  // No stop strings: everything is safe.
  EXPECT_EQ(find_stop("hello", {}).safe, 5u);
  // A match cuts before the earliest occurrence of any stop string.
  StopMatch m = find_stop("one two three", {"three", "two"});
  EXPECT_TRUE(m.stopped);
  EXPECT_EQ(m.cut, 4u);
  // "thr" may be the start of "three": held back.
  m = find_stop("one thr", {"three"});
  EXPECT_FALSE(m.stopped);
  EXPECT_EQ(m.safe, 4u);
  // The longest held tail over all stop strings.
  EXPECT_EQ(find_stop("abcab", {"abx", "cabz"}).safe, 2u);
  // An incomplete UTF-8 character is held back: "é" is C3 A9, "€" is E2 82 AC.
  EXPECT_EQ(find_stop("caf\xC3", {}).safe, 3u);
  EXPECT_EQ(find_stop("caf\xC3\xA9", {}).safe, 5u);
  EXPECT_EQ(find_stop("x\xE2\x82", {}).safe, 1u);
  EXPECT_EQ(find_stop("x\xE2\x82\xAC", {}).safe, 4u);
}

TEST(ServerApi, ParsesAndNamesFields) {
  CompletionRequest r = parse_completion_request(
      R"({"prompt":"hi","max_tokens":3,"temperature":0,"stop":"x","press":"snapkv","compression_ratio":0.5,
          "question":"q?","seed":7,"stream":true,"stream_options":{"include_usage":true}})",
      false);
  EXPECT_EQ(r.prompt, "hi");
  EXPECT_EQ(r.max_tokens, 3);
  EXPECT_EQ(*r.temperature, 0.0f);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_EQ(*r.press, "snapkv");
  EXPECT_DOUBLE_EQ(*r.compression_ratio, 0.5);
  EXPECT_EQ(r.question, "q?");
  EXPECT_EQ(*r.seed, 7u);
  EXPECT_TRUE(r.stream && r.include_usage);
  r = parse_completion_request(R"({"messages":[{"role":"developer","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})", true);
  ASSERT_EQ(r.messages.size(), 1u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].content, "ab");
  try {
    parse_completion_request(R"({"messages":[{"role":"user","content":"a"},{"role":"user","content":null}]})", true);
    FAIL();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "messages[1].content");
    nlohmann::json j = error_json(e);
    EXPECT_EQ(j["error"]["param"], "messages[1].content");
    EXPECT_EQ(j["error"]["type"], "invalid_request_error");
    EXPECT_TRUE(j["error"]["code"].is_null());
  }
  EXPECT_THROW(parse_completion_request(R"({"prompt":"a","seed":1.5})", false), ApiError);
  EXPECT_THROW(parse_completion_request(R"({"prompt":"a","max_tokens":1e3})", false), ApiError);
}

// Regression: token ids were read as int32, so 2^32 + 5 came through as token 5 and 2^63 as 0.
TEST(ServerApi, TokenIdsAreRangeCheckedAs64Bit) {
  auto refusal = [](const std::string& body, int32_t n_vocab) -> std::string {
    try {
      parse_completion_request(body, false, n_vocab);
    } catch (const ApiError& e) {
      EXPECT_EQ(e.status, 400);
      EXPECT_EQ(e.param, "prompt");
      return e.what();
    }
    return "accepted";
  };
  EXPECT_EQ(refusal(R"({"prompt":[1,4294967301]})", 512), "prompt[1]: token id 4294967301 is outside the vocabulary 0..511");
  EXPECT_EQ(refusal(R"({"prompt":[9223372036854775808]})", 512),
            "prompt[0]: token id 9223372036854775808 is outside the vocabulary 0..511");
  EXPECT_EQ(refusal(R"({"prompt":[1,2,18446744073709551615]})", 512),
            "prompt[2]: token id 18446744073709551615 is outside the vocabulary 0..511");
  EXPECT_EQ(refusal(R"({"prompt":[-1]})", 512), "prompt[0]: token id -1 is outside the vocabulary 0..511");
  EXPECT_EQ(refusal(R"({"prompt":[0,512]})", 512), "prompt[1]: token id 512 is outside the vocabulary 0..511");
  // Without a vocabulary, the int32 range.
  EXPECT_EQ(refusal(R"({"prompt":[2147483648]})", 0), "prompt[0]: token id 2147483648 is outside the token id range 0..2147483647");
  // The ends of the range are accepted as they are.
  CompletionRequest r = parse_completion_request(R"({"prompt":[0,511]})", false, 512);
  EXPECT_EQ(r.prompt_tokens, (std::vector<int32_t>{0, 511}));
  r = parse_completion_request(R"({"prompt":[2147483647]})", false, 0);
  EXPECT_EQ(r.prompt_tokens, (std::vector<int32_t>{2147483647}));
}

TEST(ServerApi, RefusalsByStatusAndReason) {
  std::string t = prometheus_text(EngineMetrics{}, {{400, "prompt", 2}, {400, "messages[].content", 1}, {503, "queue_full", 3}});
  EXPECT_NE(t.find("# TYPE kvslim_requests_rejected_total counter\n"), std::string::npos);
  EXPECT_NE(t.find("kvslim_requests_rejected_total{status=\"400\",reason=\"prompt\"} 2\n"), std::string::npos);
  EXPECT_NE(t.find("kvslim_requests_rejected_total{status=\"400\",reason=\"messages[].content\"} 1\n"), std::string::npos);
  EXPECT_NE(t.find("kvslim_requests_rejected_total{status=\"503\",reason=\"queue_full\"} 3\n"), std::string::npos);
  // A label value is escaped as the exposition format asks.
  t = prometheus_text(EngineMetrics{}, {{400, "a\"b\\c", 1}});
  EXPECT_NE(t.find("reason=\"a\\\"b\\\\c\"} 1\n"), std::string::npos);
}

TEST(ServerApi, InvalidUtf8IsReplacedNotThrown) {
  EXPECT_EQ(dump(nlohmann::json("a\xC3")), "\"a\xEF\xBF\xBD\"");
}

TEST(ServerApi, PrometheusText) {
  EngineMetrics m;
  m.requests_finished = 3;
  m.kv_bytes_in_use = 100;
  m.kv_bytes_full_f16 = 400;
  m.decode_rows = 50;
  m.decode_seconds = 2.0;
  std::string t = prometheus_text(m);
  EXPECT_NE(t.find("# TYPE kvslim_requests_finished_total counter\nkvslim_requests_finished_total 3\n"), std::string::npos);
  EXPECT_NE(t.find("kvslim_kv_bytes_saved 300\n"), std::string::npos);
  EXPECT_NE(t.find("kvslim_decode_tokens_per_second 25\n"), std::string::npos);
}

TEST(ServerApi, StoredContextFields) {
  CompletionRequest r = parse_completion_request(R"({"prompt":"hi"})", false);
  EXPECT_TRUE(r.cache_prompt);  // llama-server's default
  EXPECT_FALSE(r.context_id);
  r = parse_completion_request(R"({"prompt":"hi","cache_prompt":false})", false);
  EXPECT_FALSE(r.cache_prompt);
  // With a context id the prompt may be left out: the question alone continues the context.
  r = parse_completion_request(R"({"context_id":"abc","question":" q"})", false);
  EXPECT_EQ(*r.context_id, "abc");
  EXPECT_TRUE(r.prompt.empty() && r.prompt_tokens.empty());
  // Without one it is still required, and a chat still needs its messages.
  for (const auto& [body, chat, param] : {std::tuple{R"({"question":" q"})", false, "prompt"},
                                          std::tuple{R"({"context_id":"abc"})", true, "messages"},
                                          std::tuple{R"({"prompt":"a","context_id":""})", false, "context_id"},
                                          std::tuple{R"({"prompt":"a","cache_prompt":1})", false, "cache_prompt"}}) {
    try {
      parse_completion_request(body, chat);
      ADD_FAILURE() << body;
    } catch (const ApiError& e) {
      EXPECT_EQ(e.param, param) << body;
    }
  }
  Usage u;
  u.prompt_tokens = 40;
  u.cached_tokens = 37;
  EXPECT_EQ(usage_json(u)["prompt_tokens_details"]["cached_tokens"], 37);
}

TEST(ServerApi, PrometheusTextOfStoredContexts) {
  ContextCacheMetrics c;
  c.tiers = {{"memory", 2, 1, 0, 0, 1000}, {"redis", 1, 3, 4, 5, 2000}};
  c.prefill_tokens_saved = 74;
  std::string t = prometheus_text(EngineMetrics{}, {}, &c);
  EXPECT_NE(t.find("kvslim_context_hits_total{tier=\"memory\"} 2\nkvslim_context_hits_total{tier=\"redis\"} 1\n"),
            std::string::npos);
  EXPECT_NE(t.find("kvslim_context_errors_total{tier=\"redis\"} 4\n"), std::string::npos);
  EXPECT_NE(t.find("kvslim_context_bytes{tier=\"redis\"} 2000\n"), std::string::npos);
  EXPECT_NE(t.find("kvslim_context_prefill_tokens_saved_total 74\n"), std::string::npos);
  EXPECT_EQ(prometheus_text(EngineMetrics{}).find("kvslim_context"), std::string::npos);
}
