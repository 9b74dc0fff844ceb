// Arrival tracking behind collective timeouts (comm/watchdog.h).
#include "comm/watchdog.h"

#include <chrono>
#include <sstream>
#include <thread>

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
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || !clean_) return;  // see finish(): never free with messages in flight
  MPI_Comm_free(&comm_);
}

void ArrivalTracker::finish(int64_t last_seq) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!sends_.empty() && std::chrono::steady_clock::now() < deadline) {
    reap_sends();
    if (!sends_.empty()) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  auto all_in = [&]() {
    if (size_ == 1) return true;
    for (int64_t v : last_seen_) {
      if (v < last_seq) return false;
    }
    return true;
  };
  drain();
  while (!all_in() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    drain();
  }
  clean_ = sends_.empty() && all_in();
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

std::string ArrivalTracker::describe_timeout(int64_t seq, const std::string& what, double seconds) {
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
