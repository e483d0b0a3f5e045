#include "kvslim/model.h"

#include <cmath>
#include <map>

#include <fmt/format.h>

#include <sys/mman.h>
#include <unistd.h>

#include "kernels/matmul.h"
#include "kernels/packed_weights.h"
#include "kernels/threads.h"
#include "util/hash64.h"

namespace kvslim {

Model::~Model() = default;

uint64_t Model::tensor_digest() const {
  std::call_once(digest_once_, [this] {
    const std::vector<TensorInfo>& ts = file_->tensors();
    std::vector<uint64_t> per(ts.size());
    parallel_for(static_cast<int64_t>(ts.size()), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const TensorInfo& t = ts[static_cast<size_t>(i)];
        Hash64 h;
        h.update(t.name.data(), t.name.size());
        const uint32_t type = static_cast<uint32_t>(t.type);
        h.update(&type, sizeof(type));
        h.update(t.ne.data(), t.ne.size() * sizeof(int64_t));
        h.update(t.data, t.nbytes);
        per[static_cast<size_t>(i)] = h.digest();
      }
    });
    tensor_digest_ = hash64(per.data(), per.size() * sizeof(uint64_t));
  });
  return tensor_digest_;
}

uint64_t Model::vocab_digest() const {
  const Tokenizer& tok = *tok_;
  Hash64 h;
  const int32_t n = tok.n_vocab(), bos = tok.bos(), eos = tok.eos();
  h.update(&n, sizeof(n));
  h.update(&bos, sizeof(bos));
  h.update(&eos, sizeof(eos));
  for (int32_t i = 0; i < n; ++i) {
    const std::string s = tok.token_text(i);
    const uint64_t len = s.size();
    h.update(&len, sizeof(len));
    h.update(s.data(), s.size());
  }
  return h.digest();
}

namespace {

std::unique_ptr<WeightView> matrix(const GGUFFile& f, const std::string& name, int64_t cols, int64_t rows,
                                   size_t& total) {
  const TensorInfo& t = f.tensor(name);
  if (t.ne.size() != 2 || t.ne[0] != cols || t.ne[1] != rows)
    throw Error(fmt::format("{}: tensor '{}' has shape [{}], expected [{}, {}]", f.path(), name,
                            fmt::join(t.ne, ", "), cols, rows));
  const TypeTraits* tr = type_traits(t.type);
  if (!tr || !tr->supported)
    throw Error(fmt::format("{}: tensor '{}' has unsupported tensor type {}", f.path(), name, type_name(t.type)));
  auto w = std::make_unique<WeightView>();
  w->type = t.type;
  w->data = t.data;
  w->cols = cols;
  w->rows = rows;
  w->row_stride = row_bytes(t.type, cols);
  total += t.nbytes;
  return w;
}

// Lets the kernel drop the file pages of a packed matrix (the packed copy replaces them in memory;
// the scalar level and the exact path read them again from the file if used).
void drop_file_pages(const WeightView& w) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(w.data), e = b + w.row_stride * static_cast<size_t>(w.rows);
  const uintptr_t b1 = (b + page - 1) / page * page, e1 = e / page * page;
  if (e1 > b1) madvise(reinterpret_cast<void*>(b1), e1 - b1, MADV_DONTNEED);
}

// Repacks a matrix on its own (one run of bytes; KVSLIM_THREAD_MAJOR=0).
void pack(WeightView& w) {
  if (!qdot::packable(w)) return;
  w.packed = qdot::pack_rows(w);
  drop_file_pages(w);
}

std::vector<float> vec(const GGUFFile& f, const std::string& name, int64_t n) {
  const TensorInfo& t = f.tensor(name);
  if (t.nelements() != n)
    throw Error(fmt::format("{}: tensor '{}' has {} elements, expected {}", f.path(), name, t.nelements(), n));
  return f.tensor_f32(t);
}

// Overrides over the file's RoPE settings, then llama.cpp's resolution: scaling None never scales,
// and an unset (negative) extrapolation factor is 1 for YaRN, else 0.
void apply_rope_overrides(HParams& hp, const RopeOverrides& o) {
  auto check = [](const char* name, double v, bool ok, const char* what) {
    if (!(std::isfinite(v) && ok)) throw Error(fmt::format("RoPE override {} = {} is out of range ({})", name, v, what));
  };
  if (o.scaling) hp.rope_scaling = *o.scaling;
  if (o.freq_base) {
    check("freq_base", *o.freq_base, *o.freq_base > 1.0f, "expected a finite base > 1");
    hp.rope_freq_base = *o.freq_base;
  }
  if (o.freq_scale) {
    check("freq_scale", *o.freq_scale, *o.freq_scale > 0.0f && *o.freq_scale <= 1e6f, "expected 0 < scale <= 1e6");
    hp.rope_freq_scale = *o.freq_scale;
  }
  if (o.yarn_orig_ctx) {
    check("yarn_orig_ctx", *o.yarn_orig_ctx, *o.yarn_orig_ctx > 0 && *o.yarn_orig_ctx <= (1 << 24),
          "expected 0 < tokens <= 2^24");
    hp.yarn_orig_ctx = *o.yarn_orig_ctx;
  }
  if (o.yarn_ext_factor) {
    check("yarn_ext_factor", *o.yarn_ext_factor, *o.yarn_ext_factor <= 1e3f, "expected a finite factor");
    hp.yarn_ext_factor = *o.yarn_ext_factor;
  }
  if (o.yarn_attn_factor) {
    check("yarn_attn_factor", *o.yarn_attn_factor, *o.yarn_attn_factor > 0.0f && *o.yarn_attn_factor <= 1e3f,
          "expected 0 < factor <= 1e3");
    hp.yarn_attn_factor = *o.yarn_attn_factor;
  }
  if (o.yarn_beta_fast) {
    check("yarn_beta_fast", *o.yarn_beta_fast, *o.yarn_beta_fast > 0.0f, "expected a beta > 0");
    hp.yarn_beta_fast = *o.yarn_beta_fast;
  }
  if (o.yarn_beta_slow) {
    check("yarn_beta_slow", *o.yarn_beta_slow, *o.yarn_beta_slow > 0.0f, "expected a beta > 0");
    hp.yarn_beta_slow = *o.yarn_beta_slow;
  }
  if (hp.rope_scaling == RopeScaling::None) hp.rope_freq_scale = 1.0f;
  if (hp.yarn_ext_factor < 0.0f) hp.yarn_ext_factor = hp.rope_scaling == RopeScaling::Yarn ? 1.0f : 0.0f;
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path, const ModelLoadOptions& opt) {
  std::unique_ptr<Model> m(new Model());
  m->file_ = GGUFFile::open(path);
  const GGUFFile& f = *m->file_;
  HParams& hp = m->hp_;
  hp.arch = f.get_string("general.architecture");
  if (hp.arch != "llama" && hp.arch != "qwen2" && hp.arch != "mistral")
    throw Error(fmt::format("{}: unknown architecture general.architecture = '{}' (supported: llama, mistral, qwen2)",
                            path, printable(hp.arch)));
  const std::string a = hp.arch + ".";
  auto positive = [&](const std::string& key, int64_t v) {
    if (v <= 0 || v > (1 << 24)) throw Error(fmt::format("{}: metadata {} = {} is out of range", path, key, v));
    return static_cast<int>(v);
  };
  hp.n_embd = positive(a + "embedding_length", f.get_int(a + "embedding_length"));
  hp.n_ff = positive(a + "feed_forward_length", f.get_int(a + "feed_forward_length"));
  hp.n_layer = positive(a + "block_count", f.get_int(a + "block_count"));
  hp.n_head = positive(a + "attention.head_count", f.get_int(a + "attention.head_count"));
  hp.n_head_kv = positive(a + "attention.head_count_kv", f.get_int(a + "attention.head_count_kv", hp.n_head));
  hp.n_ctx_train = positive(a + "context_length", f.get_int(a + "context_length", 2048));
  if (hp.n_head % hp.n_head_kv != 0)
    throw Error(fmt::format("{}: {}attention.head_count = {} is not a multiple of head_count_kv = {}", path, a,
                            hp.n_head, hp.n_head_kv));
  hp.head_dim = static_cast<int>(f.get_int(a + "attention.key_length", hp.n_embd / hp.n_head));
  if (hp.head_dim <= 0 || hp.head_dim % 2 != 0 || hp.head_dim > 1024)
    throw Error(fmt::format("{}: head dimension {} is invalid", path, hp.head_dim));
  // Out-of-range floats do not fail loudly later: they turn every activation into NaN.
  auto in_range = [&](const std::string& key, double v, double lo, double hi, const char* what) {
    if (!(std::isfinite(v) && v > lo && v <= hi))
      throw Error(fmt::format("{}: metadata {} = {} is out of range ({})", path, key, v, what));
    return v;
  };
  const std::string eps_key = a + "attention.layer_norm_rms_epsilon", base_key = a + "rope.freq_base";
  hp.rms_eps = static_cast<float>(in_range(eps_key, f.get_float(eps_key, 1e-5), 0.0, 1.0, "expected 0 < eps <= 1"));
  hp.rope_freq_base =
      static_cast<float>(in_range(base_key, f.get_float(base_key, 10000.0), 1.0, 3.4e38, "expected a finite base > 1"));
  // RoPE scaling as llama.cpp reads it: the factor (rope.scaling.factor, or the older
  // rope.scale_linear) gives freq_scale = 1 / factor; the type says what the factor stretches.
  hp.rope_scaling = RopeScaling::Linear;
  if (f.has(a + "rope.scaling.type")) {
    std::string st = f.get_string(a + "rope.scaling.type");
    const std::string fk = a + "rope.scaling.factor";
    double factor = in_range(fk, f.get_float(fk, 1.0), 0.0, 1e6, "expected 0 < factor <= 1e6");
    if (st == "linear" || st == "yarn") hp.rope_freq_scale = static_cast<float>(1.0 / factor);
    if (st == "none") hp.rope_scaling = RopeScaling::None;
    else if (st == "yarn") hp.rope_scaling = RopeScaling::Yarn;
    else if (st != "linear" && st != "llama3")  // llama3 scaling comes as the rope_freqs tensor
      throw Error(fmt::format("{}: unsupported {}rope.scaling.type = '{}' (supported: none, linear, yarn, llama3)",
                              path, printable(a), printable(st)));
  } else if (f.has(a + "rope.scale_linear")) {
    const std::string fk = a + "rope.scale_linear";
    hp.rope_freq_scale =
        static_cast<float>(1.0 / in_range(fk, f.get_float(fk), 0.0, 1e6, "expected 0 < factor <= 1e6"));
  }
  // YaRN's parameters (llama.cpp's keys; defaults as llama.cpp's). A negative extrapolation factor
  // means "by the scaling type", resolved below once the overrides are in.
  const std::string yk = a + "rope.scaling.";
  const int64_t orig = f.get_int(yk + "original_context_length", 0);
  if (orig < 0 || orig > (1 << 24))
    throw Error(fmt::format("{}: metadata {}original_context_length = {} is out of range", path, yk, orig));
  hp.yarn_orig_ctx = orig > 0 ? static_cast<int>(orig) : hp.n_ctx_train;
  hp.yarn_ext_factor = static_cast<float>(
      in_range(yk + "yarn_ext_factor", f.get_float(yk + "yarn_ext_factor", -1.0), -2.0, 1e3, "expected a finite factor"));
  hp.yarn_attn_factor = static_cast<float>(
      in_range(yk + "yarn_attn_factor", f.get_float(yk + "yarn_attn_factor", 1.0), 0.0, 1e3, "expected 0 < factor <= 1e3") *
      in_range(yk + "attn_factor", f.get_float(yk + "attn_factor", 1.0), 0.0, 1e3, "expected 0 < factor <= 1e3"));
  hp.yarn_beta_fast = static_cast<float>(
      in_range(yk + "yarn_beta_fast", f.get_float(yk + "yarn_beta_fast", 32.0), 0.0, 1e6, "expected 0 < beta <= 1e6"));
  hp.yarn_beta_slow = static_cast<float>(
      in_range(yk + "yarn_beta_slow", f.get_float(yk + "yarn_beta_slow", 1.0), 0.0, 1e6, "expected 0 < beta <= 1e6"));
  apply_rope_overrides(hp, opt.rope);
  hp.rope_neox = hp.arch == "qwen2";

  m->tok_ = Tokenizer::from_gguf(f);
  hp.n_vocab = m->tok_->n_vocab();

  size_t& wb = m->weight_bytes_;
  const int64_t d = hp.n_embd, dq = int64_t(hp.n_head) * hp.head_dim, dkv = int64_t(hp.n_head_kv) * hp.head_dim;
  m->tok_embd_ = matrix(f, "token_embd.weight", d, hp.n_vocab, wb);
  m->output_norm_ = vec(f, "output_norm.weight", d);
  if (f.find_tensor("output.weight")) m->output_ = matrix(f, "output.weight", d, hp.n_vocab, wb);
  else m->output_ = std::make_unique<WeightView>(*m->tok_embd_);  // tied embeddings
  if (const TensorInfo* rf = f.find_tensor("rope_freqs.weight")) {
    if (rf->nelements() != hp.head_dim / 2)
      throw Error(fmt::format("{}: tensor 'rope_freqs.weight' has {} elements, expected {}", path, rf->nelements(),
                              hp.head_dim / 2));
    m->rope_freqs_ = f.tensor_f32(*rf);
    for (float v : m->rope_freqs_)
      if (!(std::isfinite(v) && v > 0))
        throw Error(fmt::format("{}: tensor 'rope_freqs.weight' holds {} (expected finite factors > 0)", path, v));
  }
  // A header may declare any block_count; check it against the tensor list before allocating
  // per-layer state (2^24 layers would take gigabytes before a missing tensor was noticed).
  const size_t per_layer = 9;  // norms, q, k, v, output, gate, up, down
  if (f.tensors().size() < per_layer * static_cast<size_t>(hp.n_layer))
    throw Error(fmt::format("{}: metadata {}block_count = {} needs at least {} tensors, the file has {}", path, a,
                            hp.n_layer, per_layer * static_cast<size_t>(hp.n_layer), f.tensors().size()));
  if (!f.find_tensor(fmt::format("blk.{}.attn_q.weight", hp.n_layer - 1)))
    throw Error(fmt::format("{}: metadata {}block_count = {} but tensor 'blk.{}.attn_q.weight' is missing", path, a,
                            hp.n_layer, hp.n_layer - 1));
  m->layers_.resize(hp.n_layer);
  for (int l = 0; l < hp.n_layer; ++l) {
    LayerWeights& L = m->layers_[l];
    std::string p = fmt::format("blk.{}.", l);
    L.attn_norm = vec(f, p + "attn_norm.weight", d);
    L.ffn_norm = vec(f, p + "ffn_norm.weight", d);
    L.wq = matrix(f, p + "attn_q.weight", d, dq, wb);
    L.wk = matrix(f, p + "attn_k.weight", d, dkv, wb);
    L.wv = matrix(f, p + "attn_v.weight", d, dkv, wb);
    L.wo = matrix(f, p + "attn_output.weight", dq, d, wb);
    L.w_gate = matrix(f, p + "ffn_gate.weight", d, hp.n_ff, wb);
    L.w_up = matrix(f, p + "ffn_up.weight", d, hp.n_ff, wb);
    L.w_down = matrix(f, p + "ffn_down.weight", hp.n_ff, d, wb);
    if (f.find_tensor(p + "attn_q.bias")) {
      L.bq = vec(f, p + "attn_q.bias", dq);
      L.bk = vec(f, p + "attn_k.bias", dkv);
      L.bv = vec(f, p + "attn_v.bias", dkv);
    }
  }
  if (qdot::packing_enabled()) {
    // In the order a decode step reads them (Session::forward_batch).
    std::vector<WeightView*> order;
    for (LayerWeights& L : m->layers_)
      for (WeightView* w : {L.wq.get(), L.wk.get(), L.wv.get(), L.wo.get(), L.w_gate.get(), L.w_up.get(),
                            L.w_down.get()})
        order.push_back(w);
    order.push_back(m->output_.get());
    if (qdot::thread_major_enabled()) {
      std::vector<WeightView*> packable;
      for (WeightView* w : order)
        if (qdot::packable(*w)) packable.push_back(w);
      qdot::pack_thread_major(packable, num_threads());
      for (WeightView* w : packable) drop_file_pages(*w);
    } else {
      for (WeightView* w : order) pack(*w);
    }
  }
  return m;
}

std::string Model::weight_type() const {
  std::map<std::string, size_t> bytes;
  for (const LayerWeights& L : layers_)
    for (const WeightView* w : {L.wq.get(), L.wk.get(), L.wv.get(), L.wo.get(), L.w_gate.get(), L.w_up.get(),
                                L.w_down.get()})
      bytes[type_name(w->type)] += w->row_stride * w->rows;
  std::string best;
  size_t most = 0;
  for (auto& [k, v] : bytes)
    if (v > most) most = v, best = k;
  return best;
}

}  // namespace kvslim
