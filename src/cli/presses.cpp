// `kvslim presses`: every registered press with its parameters, defaults and source.
#include <fmt/format.h>

#include "cli/commands.h"
#include "kvslim/press.h"

namespace kvslim::cli {

void add_presses(CLI::App& app, Action& action) {
  auto* sub = app.add_subcommand("presses", "list the presses with their parameters and source papers");
  sub->callback([&action] {
    action = [] {
      for (const PressInfo* p : PressRegistry::instance().all()) {
        std::string params;
        for (auto& [k, v] : p->params) params += fmt::format("{}{}={}", params.empty() ? "" : ",", k, v);
        fmt::print("{:<20} {}\n{:<20} parameters: {}\n{:<20} source: {}\n", p->name, p->summary, "",
                   params.empty() ? "none" : params, "", p->source);
      }
      return 0;
    };
  });
}

}  // namespace kvslim::cli
