// Arrival tracking for collective timeouts. Each rank announces "I entered collective #k" with
// a tiny message on a private duplicate of the group's communicator: every rank tells rank 0,
// rank 0 tells every rank. When a collective times out, rank 0 names the ranks whose last
// announcement is older than k, and every rank knows whether rank 0 itself arrived. The
// tracker only observes; aborting is the caller's decision. Private to lib/comm.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace fsdp::comm::detail {

class ArrivalTracker {
 public:
  // Duplicates `comm`; collective over `comm` (all ranks must construct it together).
  explicit ArrivalTracker(MPI_Comm comm);
  ~ArrivalTracker();
  ArrivalTracker(const ArrivalTracker&) = delete;
  ArrivalTracker& operator=(const ArrivalTracker&) = delete;

  // Announces arrival at collective number `seq` (1-based, increasing).
  void arrive(int64_t seq);
  // Builds the timeout message for collective `seq` named `what` after `seconds`: names the
  // world ranks that did not arrive when they are known here (rank 0 knows all of them).
  std::string describe_timeout(int64_t seq, const std::string& what, double seconds);
  // True once rank 0's announcement for `seq` was received (always true on rank 0).
  bool root_arrived(int64_t seq);
  // Called when the owning communicator is destroyed after collective `last_seq` completed on
  // this rank: completes this rank's sends and receives every announcement addressed to it (all
  // were sent before that collective could complete), so no message is left in flight when the
  // duplicate communicator is freed. Gives up after a few seconds (error paths) and then leaves
  // the communicator allocated rather than free it with traffic pending.
  void finish(int64_t last_seq);

 private:
  void drain();
  void reap_sends();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int64_t> last_seen_;  // rank 0: per rank; others: index 0 holds rank 0's
  std::deque<std::pair<MPI_Request, int64_t*>> sends_;
  bool clean_ = false;
  std::mutex mu_;
};

}  // namespace fsdp::comm::detail
