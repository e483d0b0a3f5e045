#pragma once
// Presses: methods that decide which KV cache entries to keep (kvpress's term). A score-based
// press = a scorer (one score per entry; higher is kept) + a budget policy (how many entries each
// (layer, KV head) keeps) + selection; the cache then retains exactly the chosen entries, so the
// bytes really go down (head- and layer-adaptive budgets included: nothing is masked).
//
// Spec syntax (make_press, `kvslim generate --press`, `kvslim presses`):
//   spec  := term ('+' term)*                 composition: each term compresses what the previous left
//   term  := NAME [':' params]                a registered press (scorer), e.g. snapkv:window=32
//          | NAME '(' spec [',' params] ')' [':' params]
//                                             a budget policy over a scorer, e.g. adakv(snapkv),
//                                             or a wrapper, e.g. key_rerotation(streaming_llm)
//   params:= key=value (',' key=value)*
// Inside the parentheses, key=value items that follow the inner spec belong to the inner spec's
// last press while that press has a ':' list and the key is one of its parameters; the first other
// key and every later one belong to the outer press. `adakv(snapkv:window=32,alpha=0.3)` gives
// window to snapkv and alpha to adakv; `threshold(snapkv,window=128)` gives window to threshold;
// `leankv(criticalkv(snapkv):epsilon=0.1,low=0.5)` gives epsilon to criticalkv and low to leankv;
// the form `outer(inner:...):k=v` is always unambiguous. A parameter given twice is an error.
// Press::describe() writes specs in this syntax that make_press() reads back to the same press.
// Limits: kMaxPressSpecLength characters and kMaxPressSpecDepth nested parentheses.
//
// This header is what a library user needs: build a press from a spec, list the registry, read
// what a press describes and reports. Writing a press (PressImpl, observations, layer views,
// scorers, budget policies, parameter readers, registration) uses src/press/authoring.h.
// The --compression-ratio value fills every `ratio` the spec leaves unset; `ratio` after a policy
// or wrapper sets the ratio of what it wraps.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kvslim/model.h"

namespace kvslim {

// Declared in src/press/authoring.h, for press authors: the interface the runner drives
// (PressImpl) and the budget policies a registry entry builds.
class PressImpl;
class BudgetPolicy;

/// A press built from a spec (make_press): what a library user describes, reads and hands to a
/// Request, which owns or borrows it for one request at a time. How a press observes forward
/// passes and evicts entries is internal (PressImpl, src/press/authoring.h): every press is one,
/// and only PressImpl derives from Press.
class Press {
 public:
  virtual ~Press() = default;
  /// Spec with parameters, e.g. "snapkv:ratio=0.5,window=64,kernel=5,pooling=avg", which
  /// make_press() reads back to the same press.
  virtual std::string describe() const = 0;
  /// One line on what the press measured in the current request (e.g. ClusterKV's attention work
  /// saved), printed by `kvslim generate`; "" when it has nothing to add.
  virtual std::string report() const { return {}; }
  /// The compression ratio asked for (fraction of context entries to remove). A composition
  /// reports 1 - prod(1 - r_i). 0 for a press whose evictions follow from its scores or act
  /// while decoding (threshold, DMS) or that removes no entries (think): what a request removed
  /// is measured from the cache, RequestStats::request_compression_ratio().
  virtual double ratio() const { return 0.0; }
  /// The fraction of key channels asked to be pruned from every entry (ThinK's key_ratio); 0 for
  /// a press that keeps whole keys. Measured: RequestStats::key_channel_ratio().
  virtual double key_channel_ratio() const { return 0.0; }
  /// Whether the press may evict entries while decoding (a decoding policy, the decoding wrapper,
  /// DuoAttention's streaming heads). A decode-time selector cannot be combined with such a press.
  virtual bool evicts_in_decode() const { return false; }
  /// Whether the press chooses the entries attention reads at each decode step (ClusterKV).
  virtual bool selects_in_decode() const { return false; }
  /// Why a cache this press compressed cannot be stored as a context (kvslim/context.h) and
  /// continued in another request, or "" when it can: a press that evicts or selects entries
  /// during decode, or observes decode steps, keeps per-request state (accumulated scores,
  /// clusters, windows) that the stored cache does not carry.
  virtual std::string storage_refusal() const = 0;
  /// Entries of one (layer, KV head) the press keeps of `n` context entries after one compression
  /// when nothing is protected (the memory estimate before a run; a composition's stages chain).
  virtual size_t kept_of(size_t n) const = 0;

 private:
  Press() = default;
  friend class PressImpl;
};

/// Parameters of a press as given on the command line: name -> value text.
using PressParams = std::map<std::string, std::string>;

/// What a registry entry builds.
enum class PressKind {
  Scorer,   ///< a press on its own (make)
  Policy,   ///< a budget policy over a scorer press (make_policy)
  Wrapper,  ///< a press around another press (make_wrapper)
};

/// A parameter's type in the Python press classes (kvslim.SnapKVPress): their annotation, the check
/// of a value given, and how the value is written into the spec.
enum class ParamType {
  Auto,       ///< from the name and default: `ratio` and decimals ("0.5", "1e-4") Float, integers Int, else Str
  Int,        ///< Python int
  Float,      ///< Python float (an int is accepted)
  Bool,       ///< Python bool, written 1 / 0
  Str,        ///< Python str (a path-like object is accepted)
  FloatList,  ///< a sequence of floats, written r0/r1/... (per_layer's ratios); an empty one cannot be run
};

/// How a parameter appears in the Python class of its press (python/kvslim/presses.py generates the
/// classes from the registry). Designated initializers: `{.type = ParamType::Bool, .help = "..."}`.
struct PythonParam {
  ParamType type = ParamType::Auto;
  std::string help = {};  ///< one line for the class docstring
  /// The class's default where it differs from the engine's, as a Python literal ("None": left out
  /// of the spec, so the engine's default applies; "0.0"; "16"); "" = the engine's default.
  std::string default_value = {};
  /// Not a field of the class: a kvslim setting kvpress's class does not have (Press(spec) reaches it).
  bool kvslim_only = false;
  /// A field of this class of the press only ("ExpectedAttentionStatsPress"); "" = of every class.
  std::string only_in = {};
};

/// One parameter of a registered press, declared once with the press: the spec parser, `kvslim
/// presses`, kvpress's names and the Python classes all read it.
struct PressParam {
  PressParam(std::string name_, std::string default_value_, std::string kvpress_ = {}, PythonParam python_ = {})
      : name(std::move(name_)),
        default_value(std::move(default_value_)),
        kvpress(std::move(kvpress_)),
        python(std::move(python_)) {}
  std::string name;           ///< kvslim's key in a spec ("window")
  std::string default_value;  ///< the value when a spec leaves it out ("" = none)
  std::string kvpress;        ///< kvpress's field name where it differs ("window_size"), else ""
  PythonParam python;         ///< its field in the Python class
};

/// A PressParam::python for a kvslim setting that is no field of the press's Python class.
inline const PythonParam kKvslimOnly{.kvslim_only = true};

/// A field of a kvpress class that is no parameter of the kvslim press; the Python class takes it.
/// Without `alias` or `policy` it is accepted and unused (ObservedAttentionPress's output_attentions).
struct PythonField {
  std::string name;           ///< the field's name ("layerwise")
  std::string after = {};     ///< the parameter (kvslim's name) it follows in the class; "" = last
  ParamType type = ParamType::Bool;
  std::string default_value = "False";  ///< a Python literal
  std::string help = {};      ///< one line for the class docstring
  /// A parameter (kvslim's name) the field sets when it is not None, over the parameter's own field
  /// (DecodingPress's older name compression_steps for interval).
  std::string alias = {};
  /// A budget policy a true value puts the press under (KVzipPress's layerwise: uniform).
  std::string policy = {};
};

/// The Python class(es) of a press, generated from its registration (python/kvslim/presses.py):
/// one per kvpress class name, with kvpress's field names and defaults (PressParam::python), the
/// kvslim spec as spec(). The fields: a policy's or wrapper's inner press first, `ratio` first
/// (as compression_ratio) for a scorer, then the parameters in their declared order.
struct PythonClass {
  std::string name = {};   ///< the class of a press kvpress does not have ("H2OPress"); "" = none
  bool base_press = false;  ///< a BasePress, not a ScorerPress, though a scorer with a ratio (kvpress's KVzipPress)
  std::string inner = "press";  ///< a policy's or wrapper's field holding its inner press
  /// A policy whose class has its default inner press's fields instead of an inner press (kvpress's
  /// PyramidKVPress is a SnapKVPress).
  bool inner_fields = false;
  std::vector<PythonField> fields = {};  ///< kvpress fields that are no parameters
};

/// A registered press: its parameters with defaults, its source, and a factory.
struct PressInfo {
  std::string name;
  std::string summary;
  std::string source;  ///< paper and arXiv id
  std::vector<PressParam> params;
  std::function<std::unique_ptr<PressImpl>(const PressParams&)> make;
  PressKind kind = PressKind::Scorer;
  std::function<std::unique_ptr<BudgetPolicy>(const PressParams&)> make_policy = {};
  std::function<std::unique_ptr<PressImpl>(const PressParams&, std::unique_ptr<PressImpl> inner)> make_wrapper = {};
  std::string default_inner = {};  ///< Policy / Wrapper written without parentheses wrap this spec
  /// kvpress's class names for this press ("SnapKVPress"), the first the one `kvslim presses`
  /// shows; empty when kvpress has none.
  std::vector<std::string> kvpress = {};
  PythonClass python = {};  ///< how the Python classes differ from the defaults
};

/// All presses, by name.
class PressRegistry {
 public:
  static PressRegistry& instance();
  void add(PressInfo info);
  const PressInfo* find(const std::string& name) const;
  std::vector<const PressInfo*> all() const;

 private:
  std::map<std::string, PressInfo> presses_;
};

/// Longest press spec make_press() accepts, in characters (a spec written by hand or by
/// Press::describe() is a few hundred at most).
constexpr size_t kMaxPressSpecLength = 4096;
/// Deepest parenthesis nesting make_press() accepts (wrappers over policies over scorers need 3).
constexpr int kMaxPressSpecDepth = 16;

/// Builds a press from a spec (see the syntax at the top of this header). `ratio` (the
/// --compression-ratio value) fills every `ratio` parameter the spec leaves unset. Throws
/// kvslim::Error for an unknown press or parameter, a malformed spec, a value out of range, or a
/// policy over something that is not a scorer press, naming it.
std::unique_ptr<Press> make_press(const std::string& spec, double ratio);

/// make_press(spec, ratio), and `ratio_used` = whether the press keeps its entries by `ratio`:
/// false for presses without a ratio (think, simlayerkv, duo_attention, latent, ...), for
/// threshold and per_layer policies (their own parameters decide), for a budget (budget=N), and
/// for terms whose spec writes its own ratio. A composition uses it when any of its terms does.
/// Throws kvslim::Error as make_press.
std::unique_ptr<Press> make_press(const std::string& spec, double ratio, bool& ratio_used);

/// Throws kvslim::Error naming `what` (the flag or field, e.g. "--compression-ratio") when
/// `ratio` > 0 and the press of `spec` would ignore it, instead of running it silently unused.
/// Builds the press to find out; a caller that has built it passes the flag instead (below).
void check_ratio_used(const std::string& spec, double ratio, const std::string& what);

/// The same check with `ratio_used` as make_press(spec, ratio, ratio_used) set it (no second build).
void check_ratio_used(const std::string& spec, double ratio, bool ratio_used, const std::string& what);

/// Checks 0 <= ratio < 1, else kvslim::Error.
void check_ratio(double ratio, const std::string& press);

}  // namespace kvslim
