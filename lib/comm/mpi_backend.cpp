// MPI backend (comm/mpi_backend.h).
#include "comm/mpi_backend.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "comm/mpi_util.h"
#include "core/dtype.h"
#include "core/env.h"
#include "core/log.h"
#include "core/timer.h"

namespace fsdp::comm::detail {

namespace {

// MPI type for arithmetic on a dtype, after bf16/fp16 were widened to fp32.
MPI_Datatype arith_type(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return MPI_FLOAT;
    case c10::kDouble:
      return MPI_DOUBLE;
    case c10::kLong:
      return MPI_INT64_T;
    case c10::kInt:
      return MPI_INT32_T;
    default:
      return MPI_DATATYPE_NULL;
  }
}

bool widened(c10::ScalarType t) {
  return t == c10::kBFloat16 || t == c10::kHalf;
}

void check_reducible(const at::Tensor& t, ReduceOp op, const char* what) {
  const auto st = t.scalar_type();
  FSDP_CHECK(widened(st) || arith_type(st) != MPI_DATATYPE_NULL,
             str("mpi backend: ", what, " does not support dtype ", dtype_name(st)),
             "reduce fp32, fp64, bf16, fp16, int32 or int64 tensors");
  FSDP_CHECK(
      !(op == ReduceOp::kAvg && c10::isIntegralType(st, /*includeBool=*/true)),
      str("mpi backend: ", what, " with op avg needs a floating dtype, got ", dtype_name(st)),
      "use op sum on integer tensors and divide yourself");
}

void check_cpu(const at::Tensor& t, const char* what) {
  FSDP_CHECK(t.defined(), str("mpi backend: ", what, " got an undefined tensor"),
             "this is a bug in fsdp-train: please report it with the command line and log");
  FSDP_CHECK(t.device().is_cpu(),
             str("mpi backend: ", what, " needs CPU tensors, got ", t.device().str()),
             "use the nccl backend for CUDA tensors (make_communicator with a CUDA device)");
}

MPI_Op mpi_op(ReduceOp op) {
  return op == ReduceOp::kMax ? MPI_MAX : MPI_SUM;
}

// Posts an in-place MPI_Iallreduce over the contiguous `buf` in chunks of at most `max_count`
// elements (MPI counts are int), one request per chunk; no request for an empty buffer.
std::vector<MPI_Request> iallreduce_in_place(const at::Tensor& buf, MPI_Datatype mt, ReduceOp op,
                                             MPI_Comm comm, int64_t max_count) {
  std::vector<MPI_Request> reqs;
  auto* p = static_cast<char*>(buf.data_ptr());
  const int64_t total = buf.numel();
  const int64_t es = static_cast<int64_t>(buf.element_size());
  for (int64_t off = 0; off < total; off += max_count) {
    const int64_t len = std::min(max_count, total - off);
    MPI_Request r;
    int rc =
        MPI_Iallreduce(MPI_IN_PLACE, p + off * es, static_cast<int>(len), mt, mpi_op(op), comm, &r);
    FSDP_CHECK(rc == MPI_SUCCESS, "mpi backend: MPI_Iallreduce failed: " + mpi_error_string(rc),
               "check the MPI errors above and that every rank is still running; then rerun");
    reqs.push_back(r);
  }
  return reqs;
}

}  // namespace

MpiTuning mpi_tuning_from_env() {
  MpiTuning t;
  // The defaults are the table's (core/env.cpp), which also bounds MPI_MAX_COUNT to MPI's int.
  t.rs_allreduce_min_bytes = *env::integer("FSDP_MPI_RS_ALLREDUCE_BYTES");
  t.max_count = *env::integer("FSDP_MPI_MAX_COUNT");
  return t;
}

// One queued collective: `start` posts the non-blocking MPI calls, `finish` runs on the worker
// after they complete (copy-back, widening, averaging).
struct MpiCommunicator::Task {
  OpType type;
  std::string name;
  uint64_t bytes = 0;
  std::chrono::milliseconds timeout{0};
  std::function<std::vector<MPI_Request>()> start;
  std::function<void()> finish;
  std::shared_ptr<MpiWork> work;
};

class MpiCommunicator::MpiWork final : public Work {
 public:
  MpiWork(std::shared_ptr<std::atomic<int>> waiters, CommStats* stats)
      : waiters_(std::move(waiters)), stats_(stats) {}
  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (!done_) {
      // The calling thread is held up from here: exposed communication of its phase.
      Stopwatch blocked;
      waiters_->fetch_add(1);
      cv_.wait(lock, [&] { return done_; });
      waiters_->fetch_sub(1);
      stats_->record_exposed(wait_phase(), blocked.seconds());
    }
    if (error_) std::rethrow_exception(error_);
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ && error_) std::rethrow_exception(error_);
    return done_;
  }
  void complete(std::exception_ptr err) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = std::move(err);
    }
    cv_.notify_all();
  }

 private:
  std::shared_ptr<std::atomic<int>> waiters_;
  CommStats* stats_;  // the communicator's (it outlives its works)
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

MpiCommunicator::MpiCommunicator(std::string name, MPI_Comm comm, bool owns_comm)
    : name_(std::move(name)), comm_(comm), owns_comm_(owns_comm), tuning_(mpi_tuning_from_env()) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  tracker_ = std::make_unique<ArrivalTracker>(comm_);
  worker_ = std::thread([this] { worker_loop(); });
}

MpiCommunicator::~MpiCommunicator() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  tracker_->finish(seq_);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_comm_ && !finalized) MPI_Comm_free(&comm_);
}

WorkPtr MpiCommunicator::enqueue(std::unique_ptr<Task> task) {
  auto work = std::make_shared<MpiWork>(waiters_, &stats_);
  task->work = work;
  if (task->timeout.count() <= 0) task->timeout = default_timeout();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    last_ = work;
  }
  cv_.notify_all();
  return work;
}

void MpiCommunicator::worker_loop() {
  while (true) {
    std::unique_ptr<Task> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::exception_ptr err;
    try {
      run_task(*task);
    } catch (...) {
      err = std::current_exception();
    }
    task->work->complete(err);
  }
}

void MpiCommunicator::run_task(Task& task) {
  Stopwatch watch;
  const int64_t seq = ++seq_;
  tracker_->arrive(seq);
  std::vector<MPI_Request> reqs = task.start();
  const auto deadline = std::chrono::steady_clock::now() + task.timeout;
  int spins = 0;
  while (!reqs.empty()) {
    int done = 0;
    int rc = MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    FSDP_CHECK(rc == MPI_SUCCESS,
               str("mpi backend: ", task.name, " failed: ", mpi_error_string(rc)),
               "an MPI transport error; check the network and that all ranks are alive");
    if (done) break;
    if (std::chrono::steady_clock::now() > deadline) {
      const double secs = std::chrono::duration<double>(task.timeout).count();
      std::string msg =
          tracker_->describe_timeout(seq, str(task.name, " on group '", group_name(), "'"), secs);
      if (rank_ != 0 && tracker_->root_arrived(seq)) {
        // Rank 0 arrived and knows who is missing: give it a moment to report first.
        std::this_thread::sleep_for(std::chrono::seconds(3));
      }
      abort_job("collective timeout: " + msg +
                    ". HINT: a rank crashed, hangs or runs different code; raise --dist-timeout "
                    "only if a step legitimately takes longer",
                4);
    }
    // Spin briefly for latency-bound calls, then back off so the compute threads get the core,
    // unless a host thread is blocked waiting for this communicator (its core is free).
    if (++spins > 200 && waiters_->load(std::memory_order_relaxed) == 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(spins > 2000 ? 200 : 20));
    }
  }
  if (task.finish) task.finish();
  stats_.record(task.type, task.bytes, watch.seconds());
}

WorkPtr MpiCommunicator::all_gather(const at::Tensor& shard, const at::Tensor& out,
                                    const CollectiveOptions& opts) {
  check_cpu(shard, "all_gather");
  check_cpu(out, "all_gather");
  FSDP_CHECK(shard.scalar_type() == out.scalar_type(),
             str("mpi backend: all_gather dtype mismatch: shard ", dtype_name(shard.scalar_type()),
                 ", output ", dtype_name(out.scalar_type())),
             "give the output the dtype of the shard");
  FSDP_CHECK(out.numel() == shard.numel() * size_,
             str("mpi backend: all_gather output has ", out.numel(), " elements, expected ",
                 shard.numel(), " x ", size_, " ranks"),
             "the output must hold one shard per rank");
  auto task = std::make_unique<Task>();
  task->type = OpType::kAllGather;
  task->name = "all_gather";
  task->bytes = out.nbytes();
  task->timeout = opts.timeout;
  at::Tensor in = shard.contiguous();
  at::Tensor buf = out.is_contiguous() ? out : at::empty({out.numel()}, out.options());
  const int64_t n = in.numel();
  const int64_t esize = static_cast<int64_t>(in.element_size());
  const int64_t max_bytes = tuning_.max_count;  // counts below are in bytes
  task->start = [this, in, buf, n, esize, max_bytes]() {
    std::vector<MPI_Request> reqs;
    auto* src = static_cast<char*>(in.data_ptr());
    auto* dst = static_cast<char*>(buf.data_ptr());
    const int64_t total = n * esize;
    if (total == 0) return reqs;
    for (int64_t off = 0; off < total; off += max_bytes) {
      const int64_t len = std::min(max_bytes, total - off);
      // Each rank's block lands at rank*total + off: a resized type spaces the blocks.
      MPI_Datatype block, spaced;
      MPI_Type_contiguous(static_cast<int>(len), MPI_BYTE, &block);
      MPI_Type_create_resized(block, 0, static_cast<MPI_Aint>(total), &spaced);
      MPI_Type_commit(&spaced);
      MPI_Request r;
      int rc = MPI_Iallgather(src + off, static_cast<int>(len), MPI_BYTE, dst + off, 1, spaced,
                              comm_, &r);
      MPI_Type_free(&spaced);
      MPI_Type_free(&block);
      FSDP_CHECK(rc == MPI_SUCCESS, "mpi backend: MPI_Iallgather failed: " + mpi_error_string(rc),
                 "check the MPI errors above and that every rank is still running; then rerun");
      reqs.push_back(r);
    }
    return reqs;
  };
  if (!buf.is_same(out)) {
    task->finish = [buf, out]() { out.copy_(buf.view(out.sizes())); };
  }
  return enqueue(std::move(task));
}

WorkPtr MpiCommunicator::reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op,
                                        const CollectiveOptions& opts) {
  check_cpu(in, "reduce_scatter");
  check_cpu(out, "reduce_scatter");
  check_reducible(in, op, "reduce_scatter");
  FSDP_CHECK(in.scalar_type() == out.scalar_type(),
             str("mpi backend: reduce_scatter dtype mismatch: input ", dtype_name(in.scalar_type()),
                 ", output ", dtype_name(out.scalar_type())),
             "give the output the dtype of the input");
  FSDP_CHECK(in.numel() == out.numel() * size_,
             str("mpi backend: reduce_scatter input has ", in.numel(), " elements, expected ",
                 out.numel(), " x ", size_, " ranks"),
             "the input must hold one output-sized block per rank");
  auto task = std::make_unique<Task>();
  task->type = OpType::kReduceScatter;
  task->name = str("reduce_scatter(", reduce_op_name(op), ")");
  task->bytes = in.nbytes();
  task->timeout = opts.timeout;
  const auto st = in.scalar_type();
  const auto work_type = widened(st) ? c10::kFloat : st;
  const int64_t n = out.numel();
  const bool via_allreduce =
      static_cast<int64_t>(in.nbytes()) >= tuning_.rs_allreduce_min_bytes || n > tuning_.max_count;
  // The allreduce path reduces in place, so it always works on a private copy of the input.
  at::Tensor src = (via_allreduce || widened(st)) ? in.reshape({-1}).to(work_type, false, true)
                                                  : in.contiguous().view({-1});
  at::Tensor res = (out.is_contiguous() && !widened(st) && !via_allreduce)
                       ? out
                       : at::empty({n}, out.options().dtype(work_type));
  const MPI_Datatype mt = arith_type(work_type);
  const int64_t maxc = tuning_.max_count;
  const int rank = rank_;
  task->start = [this, src, res, n, mt, op, via_allreduce, maxc]() {
    std::vector<MPI_Request> reqs;
    if (n == 0) return reqs;
    if (!via_allreduce) {
      MPI_Request r;
      int rc = MPI_Ireduce_scatter_block(src.data_ptr(), res.data_ptr(), static_cast<int>(n), mt,
                                         mpi_op(op), comm_, &r);
      FSDP_CHECK(rc == MPI_SUCCESS,
                 "mpi backend: MPI_Ireduce_scatter_block failed: " + mpi_error_string(rc),
                 "check the MPI errors above and that every rank is still running; then rerun");
      reqs.push_back(r);
      return reqs;
    }
    return iallreduce_in_place(src, mt, op, comm_, maxc);
  };
  const int size = size_;
  task->finish = [src, res, out, n, rank, size, op, via_allreduce]() {
    at::Tensor r = via_allreduce ? src.narrow(0, rank * n, n) : res;
    if (op == ReduceOp::kAvg) r.div_(size);
    if (!r.is_same(out)) out.copy_(r.view(out.sizes()));
  };
  return enqueue(std::move(task));
}

WorkPtr MpiCommunicator::all_reduce(const at::Tensor& t, ReduceOp op,
                                    const CollectiveOptions& opts) {
  check_cpu(t, "all_reduce");
  check_reducible(t, op, "all_reduce");
  auto task = std::make_unique<Task>();
  task->type = OpType::kAllReduce;
  task->name = str("all_reduce(", reduce_op_name(op), ")");
  task->bytes = t.nbytes();
  task->timeout = opts.timeout;
  const auto st = t.scalar_type();
  const auto work_type = widened(st) ? c10::kFloat : st;
  at::Tensor buf = (t.is_contiguous() && !widened(st)) ? t.view({-1})
                                                       : t.reshape({-1}).to(work_type, false, true);
  const MPI_Datatype mt = arith_type(work_type);
  const int64_t maxc = tuning_.max_count;
  task->start = [this, buf, mt, op, maxc]() {
    return iallreduce_in_place(buf, mt, op, comm_, maxc);
  };
  const int size = size_;
  task->finish = [buf, t, op, size]() {
    if (op == ReduceOp::kAvg) buf.div_(size);
    if (buf.data_ptr() != t.data_ptr() || buf.scalar_type() != t.scalar_type()) {
      t.copy_(buf.view(t.sizes()));
    }
  };
  return enqueue(std::move(task));
}

WorkPtr MpiCommunicator::broadcast(const at::Tensor& t, int root, const CollectiveOptions& opts) {
  check_cpu(t, "broadcast");
  FSDP_CHECK(
      root >= 0 && root < size_,
      str("mpi backend: broadcast root ", root, " is outside the group of ", size_, " ranks"),
      "this is a bug in fsdp-train: please report it with the command line and log");
  auto task = std::make_unique<Task>();
  task->type = OpType::kBroadcast;
  task->name = "broadcast";
  task->bytes = t.nbytes();
  task->timeout = opts.timeout;
  at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
  const int64_t maxc = tuning_.max_count;
  task->start = [this, buf, root, maxc]() {
    std::vector<MPI_Request> reqs;
    auto* p = static_cast<char*>(buf.data_ptr());
    const int64_t total = static_cast<int64_t>(buf.nbytes());
    for (int64_t off = 0; off < total; off += maxc) {
      const int64_t len = std::min(maxc, total - off);
      MPI_Request r;
      int rc = MPI_Ibcast(p + off, static_cast<int>(len), MPI_BYTE, root, comm_, &r);
      FSDP_CHECK(rc == MPI_SUCCESS, "mpi backend: MPI_Ibcast failed: " + mpi_error_string(rc),
                 "check the MPI errors above and that every rank is still running; then rerun");
      reqs.push_back(r);
    }
    return reqs;
  };
  if (!buf.is_same(t)) task->finish = [buf, t]() { t.copy_(buf); };
  return enqueue(std::move(task));
}

WorkPtr MpiCommunicator::all_to_all(const at::Tensor& in, const at::Tensor& out,
                                    const CollectiveOptions& opts) {
  check_cpu(in, "all_to_all");
  check_cpu(out, "all_to_all");
  FSDP_CHECK(in.scalar_type() == out.scalar_type(),
             str("mpi backend: all_to_all dtype mismatch: input ", dtype_name(in.scalar_type()),
                 ", output ", dtype_name(out.scalar_type())),
             "give the output the dtype of the input");
  FSDP_CHECK(in.numel() == out.numel() && in.numel() % size_ == 0,
             str("mpi backend: all_to_all input has ", in.numel(), " elements and output ",
                 out.numel(), ", expected the same count divisible by ", size_, " ranks"),
             "input and output must hold one equal-sized block per rank");
  FSDP_CHECK(in.is_contiguous() && out.is_contiguous(),
             "mpi backend: all_to_all needs contiguous input and output tensors",
             "call .contiguous() on the input and allocate the output with at::empty");
  const int64_t total = static_cast<int64_t>(in.nbytes());
  const auto* in_p = static_cast<const char*>(in.data_ptr());
  const auto* out_p = static_cast<const char*>(out.data_ptr());
  FSDP_CHECK(total == 0 || in_p + total <= out_p || out_p + total <= in_p,
             "mpi backend: all_to_all input and output overlap",
             "give all_to_all a separate output tensor");
  auto task = std::make_unique<Task>();
  task->type = OpType::kAllToAll;
  task->name = "all_to_all";
  task->bytes = in.nbytes();
  task->timeout = opts.timeout;
  const int64_t block = total / size_;  // bytes per rank
  const int64_t max_bytes = tuning_.max_count;
  task->start = [this, in, out, block, max_bytes]() {
    std::vector<MPI_Request> reqs;
    const auto* src = static_cast<const char*>(in.data_ptr());
    auto* dst = static_cast<char*>(out.data_ptr());
    for (int64_t off = 0; off < block; off += max_bytes) {
      const int64_t len = std::min(max_bytes, block - off);
      // Bytes [off, off+len) of every block: a resized type steps from one block to the next.
      MPI_Datatype piece, spaced;
      MPI_Type_contiguous(static_cast<int>(len), MPI_BYTE, &piece);
      MPI_Type_create_resized(piece, 0, static_cast<MPI_Aint>(block), &spaced);
      MPI_Type_commit(&spaced);
      MPI_Request r;
      int rc = MPI_Ialltoall(src + off, 1, spaced, dst + off, 1, spaced, comm_, &r);
      MPI_Type_free(&spaced);
      MPI_Type_free(&piece);
      FSDP_CHECK(rc == MPI_SUCCESS, "mpi backend: MPI_Ialltoall failed: " + mpi_error_string(rc),
                 "check the MPI errors above and that every rank is still running; then rerun");
      reqs.push_back(r);
    }
    return reqs;
  };
  return enqueue(std::move(task));
}

void MpiCommunicator::barrier(const CollectiveOptions& opts) {
  auto task = std::make_unique<Task>();
  task->type = OpType::kBarrier;
  task->name = "barrier";
  task->timeout = opts.timeout;
  task->start = [this]() {
    MPI_Request r;
    int rc = MPI_Ibarrier(comm_, &r);
    FSDP_CHECK(rc == MPI_SUCCESS, "mpi backend: MPI_Ibarrier failed: " + mpi_error_string(rc),
               "check the MPI errors above and that every rank is still running; then rerun");
    return std::vector<MPI_Request>{r};
  };
  enqueue(std::move(task))->wait();
}

void MpiCommunicator::synchronize() {
  std::shared_ptr<Work> last;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last = last_;
  }
  if (last) last->wait();
}

}  // namespace fsdp::comm::detail
