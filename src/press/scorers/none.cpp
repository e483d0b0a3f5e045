// The identity press: keeps the full cache.
#include "press/authoring.h"

namespace kvslim {
namespace {

class NonePress : public PressImpl {
 public:
  std::string describe() const override { return "none"; }
  void apply(KVCache&, const Model&, const Observation&, const Target&) override {}
};

PressRegistrar reg({"none", "keeps every entry (full cache)", "-", {},
                    [](const PressParams&) { return std::make_unique<NonePress>(); }});

}  // namespace
}  // namespace kvslim
