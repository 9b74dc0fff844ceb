// Arrival tracking behind collective timeouts (comm/watchdog.h).
#include "comm/watchdog.h"

#include <sstream>

#include "comm/mpi_util.h"

namespace fsdp::comm::detail {

namespace {
constexpr int kArrivalTag = 7301;
}

ArrivalTracker::ArrivalTracker(MPI_Comm comm) {
  FSDP_MPI_CHECK(MPI_Comm_dup(comm, &comm_));
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  last_seen_.assign(rank_ == 0 ? size_ : 1, 0);
}

ArrivalTracker::~ArrivalTracker() {
  std::lock_guard<std::mutex> lock(mu_);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (auto& [req, buf] : sends_) {
    MPI_Cancel(&req);
    MPI_Request_free(&req);
    // The cancelled request may still reference buf; leaking a few bytes at shutdown is safer.
    (void)buf;
  }
  sends_.clear();
  MPI_Comm_free(&comm_);
}

void ArrivalTracker::reap_sends() {
  while (!sends_.empty()) {
    int done = 0;
    MPI_Test(&sends_.front().first, &done, MPI_STATUS_IGNORE);
    if (!done) break;
    delete sends_.front().second;
    sends_.pop_front();
  }
}

void ArrivalTracker::arrive(int64_t seq) {
  if (size_ == 1) return;
  std::lock_guard<std::mutex> lock(mu_);
  reap_sends();
  auto send_to = [&](int dest) {
    auto* buf = new int64_t(seq);
    MPI_Request req;
    MPI_Isend(buf, 1, MPI_INT64_T, dest, kArrivalTag, comm_, &req);
    sends_.emplace_back(req, buf);
  };
  if (rank_ == 0) {
    last_seen_[0] = seq;
    for (int r = 1; r < size_; ++r) send_to(r);
  } else {
    send_to(0);
  }
  drain();
}

void ArrivalTracker::drain() {
  while (true) {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, kArrivalTag, comm_, &flag, &st);
    if (!flag) return;
    int64_t seq = 0;
    MPI_Recv(&seq, 1, MPI_INT64_T, st.MPI_SOURCE, kArrivalTag, comm_, MPI_STATUS_IGNORE);
    const size_t idx = rank_ == 0 ? static_cast<size_t>(st.MPI_SOURCE) : 0;
    if (seq > last_seen_[idx]) last_seen_[idx] = seq;
  }
}

bool ArrivalTracker::root_arrived(int64_t seq) {
  if (rank_ == 0 || size_ == 1) return true;
  std::lock_guard<std::mutex> lock(mu_);
  drain();
  return last_seen_[0] >= seq;
}

std::string ArrivalTracker::describe_timeout(int64_t seq, const std::string& what,
                                             double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  drain();
  std::ostringstream os;
  os << what << " (collective #" << seq << ") did not complete within " << seconds << " s";
  if (rank_ == 0) {
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r) {
      if (last_seen_[r] < seq) missing.push_back(world_rank_of(comm_, r));
    }
    if (missing.empty()) {
      os << "; every rank arrived, so the transport stalled";
    } else {
      os << "; ranks that did not arrive: [";
      for (size_t i = 0; i < missing.size(); ++i) os << (i ? ", " : "") << missing[i];
      os << "]";
    }
  } else if (last_seen_[0] < seq) {
    os << "; rank " << world_rank_of(comm_, 0) << " (the group's first rank) did not arrive";
  } else {
    os << "; the group's first rank arrived and reports the missing ranks";
  }
  return os.str();
}

}  // namespace fsdp::comm::detail
