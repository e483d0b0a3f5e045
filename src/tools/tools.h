#pragma once
// The tools API: what the command-line tool (src/cli) and the HTTP server (src/server) use beyond
// the public API (include/kvslim). They include this header and no other header of src/ outside
// their own folder; tests/check_layering.py fails the build's tests when one does. A library user
// never needs it. Each group below says why a front-end needs it.

// The storage a server accounts for: a request's cache bytes, its shared parts (stored contexts
// read in place by several requests), the size a segment of n entries will take (the KV budget's
// reservations), and the session under a request.
#include "kv/cache.h"
#include "model/session.h"

// Press internals the memory estimate printed before a long run reads: how many entries a press
// keeps of n toward its target.
#include "press/authoring.h"

// Calibration and training (`kvslim calibrate ...`, `kvslim train ...`), and the press file
// formats they write (Q-Filters' directions, latent bases, query statistics, DuoAttention's
// labels, LU-KV's budget curve).
#include "press/scorers/duo_attention.h"
#include "press/ea_stats.h"
#include "press/scorers/latent.h"
#include "press/policies/lukv.h"
#include "press/scorers/qfilter.h"
#include "train/duo_calibrate.h"
#include "train/fastkvzip_train.h"
#include "train/kvzap_train.h"
#include "train/latent_calibrate.h"
#include "train/lukv_profile.h"
#include "train/qfilter_calibrate.h"
#include "train/query_stats.h"
#include "train/restorekv_train.h"

// Press parameters that name files, checked against the server's allowed folders.
#include "press/param_file.h"

// Evaluation output: the records' JSON and CSV, summaries, plots, and ZigZagKV's attention
// statistics (`kvslim eval`, `kvslim attention-stats`).
#include "eval/attention_stats.h"
#include "eval/report.h"

// Benchmarks (`kvslim bench`): the SIMD level switch, the thread pool's size, software prefetch of
// weights, and the decode floor.
#include "kernels/quant_dot.h"
#include "kernels/threads.h"
#include "kernels/weight_prefetch.h"
#include "run/decode_floor.h"

// A stored context made from a finished request (the server keeps a request's compressed context).
#include "context/file.h"

// Chat templates (`kvslim generate --chat`, the server's /v1/chat/completions).
#include "tokenizer/chat_template.h"

// Small utilities: reading a text file with the checks before it, the one clock for durations,
// and XXH64 for keys of stored contexts.
#include "util/clock.h"
#include "util/hash64.h"
#include "util/text_file.h"
