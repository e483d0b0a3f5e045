#include "cli/context_size.h"

#include <fmt/format.h>

namespace kvslim::cli {

void warn_context_size(const Model& model, int64_t n_ctx) {
  const int64_t train = model.hparams().n_ctx_train;
  if (train > 0 && n_ctx > train)
    fmt::print(stderr,
               "warning: the context of {} tokens exceeds the model's training context of {} tokens "
               "({}.context_length); outputs past it may degrade\n",
               n_ctx, train, model.hparams().arch);
}

}  // namespace kvslim::cli
