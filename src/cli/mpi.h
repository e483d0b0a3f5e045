#pragma once
// MPI for eval sweeps: each rank runs one shard and rank 0 gathers the records. Compiled against
// Open MPI when CMake finds it (KVSLIM_WITH_MPI); otherwise a single rank, and a clear error
// when the process was started by mpirun anyway.
#include <string>
#include <vector>

namespace kvslim::cli {

class MpiWorld {
 public:
  /// Initializes MPI when this process was started by an MPI launcher (mpirun / srun set their
  /// environment variables); otherwise a world of one rank. Throws kvslim::Error when started by
  /// a launcher with more than one rank and built without MPI.
  MpiWorld();
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  /// Rank 0 receives every rank's `text` (in rank order); the others receive an empty vector.
  std::vector<std::string> gather(const std::string& text) const;
  /// Ends every rank with `code` (after an error on one rank, so the others do not wait forever).
  [[noreturn]] void abort(int code) const;

 private:
  int rank_ = 0, size_ = 1;
  bool initialized_ = false;
};

}  // namespace kvslim::cli
