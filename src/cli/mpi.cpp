// MpiWorld over Open MPI, or a one-rank stand-in when built without it.
#include "cli/mpi.h"

#include <cstdlib>

#include <fmt/format.h>

#include "kvslim/error.h"

#ifdef KVSLIM_WITH_MPI
#include <mpi.h>
#endif

namespace kvslim::cli {

namespace {

/// Ranks announced by the launcher's environment (Open MPI, MPICH/PMI, Slurm's srun); 0 when not
/// started by one.
int launcher_ranks() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* s = std::getenv(v)) return std::atoi(s);
  return 0;
}

}  // namespace

MpiWorld::MpiWorld() {
  const int n = launcher_ranks();
  if (n == 0) return;
#ifdef KVSLIM_WITH_MPI
  MPI_Init(nullptr, nullptr);
  initialized_ = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
#else
  if (n > 1)
    throw Error(fmt::format("started by an MPI launcher with {} ranks, but this kvslim was built without MPI "
                            "(install libopenmpi-dev and rebuild), so every rank would run the whole sweep; "
                            "use --shard I/N and `kvslim eval merge` instead",
                            n));
#endif
}

MpiWorld::~MpiWorld() {
#ifdef KVSLIM_WITH_MPI
  if (initialized_) MPI_Finalize();
#endif
}

std::vector<std::string> MpiWorld::gather(const std::string& text) const {
  if (size_ == 1) return {text};
#ifdef KVSLIM_WITH_MPI
  // Sizes first, then the bytes; one shard's records are far below 2 GiB.
  if (text.size() > static_cast<size_t>(1) << 31)
    throw Error(fmt::format("MPI gather: rank {} has {} bytes of records (limit 2 GiB)", rank_, text.size()));
  int len = static_cast<int>(text.size());
  std::vector<int> lens(rank_ == 0 ? size_ : 0), offs(rank_ == 0 ? size_ : 0);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::string all;
  if (rank_ == 0) {
    long total = 0;
    for (int i = 0; i < size_; ++i) {
      offs[i] = static_cast<int>(total);
      total += lens[i];
    }
    if (total > (1L << 31) - 1) throw Error(fmt::format("MPI gather: {} bytes of records in all (limit 2 GiB)", total));
    all.resize(total);
  }
  MPI_Gatherv(text.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, 0, MPI_COMM_WORLD);
  std::vector<std::string> out;
  if (rank_ == 0)
    for (int i = 0; i < size_; ++i) out.push_back(all.substr(offs[i], lens[i]));
  return out;
#else
  return {text};
#endif
}

void MpiWorld::abort(int code) const {
#ifdef KVSLIM_WITH_MPI
  if (initialized_ && size_ > 1) MPI_Abort(MPI_COMM_WORLD, code);
#endif
  std::exit(code);
}

}  // namespace kvslim::cli
