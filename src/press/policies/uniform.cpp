// The uniform budget as a named policy: every (layer, KV head) keeps floor(n * (1 - ratio)).
// `uniform(X)` is the same press as X; the name exists so specs can say it explicitly.
#include "press/authoring.h"

namespace kvslim {
namespace {

PressRegistrar reg([] {
  PressInfo i;
  i.name = "uniform";
  i.summary = "budget policy: every (layer, KV head) keeps floor(n * (1 - ratio)) entries";
  i.source = "-";
  i.kind = PressKind::Policy;
  i.default_inner = "snapkv";
  i.make_policy = [](const PressParams&) -> std::unique_ptr<BudgetPolicy> { return std::make_unique<UniformBudget>(); };
  return i;
}());

}  // namespace
}  // namespace kvslim
