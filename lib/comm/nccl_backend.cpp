// NCCL backend (comm/nccl_backend.h).
#include "comm/nccl_backend.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>
#ifdef FSDP_RCCL
#include <rccl/rccl.h>
#else
#include <nccl.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <thread>

#include "comm/mpi_util.h"
#include "comm/watchdog.h"
#include "core/dtype.h"
#include "core/log.h"

namespace fsdp::comm::detail {

#define FSDP_NCCL_CHECK(call)                                                                     \
  do {                                                                                            \
    ncclResult_t fsdp_nccl_rc_ = (call);                                                          \
    FSDP_CHECK(fsdp_nccl_rc_ == ncclSuccess,                                                      \
               ::fsdp::str("NCCL call failed: ", #call, ": ", ncclGetErrorString(fsdp_nccl_rc_)), \
               "rerun with NCCL_DEBUG=INFO; check NCCL_SOCKET_IFNAME and GPU visibility");        \
  } while (0)

int cuda_device_count() {
  int n = 0;
  // Error 35 (insufficient driver) and "no device" both mean: no usable GPU.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

namespace {

ncclDataType_t nccl_type(c10::ScalarType t, const char* what) {
  switch (t) {
    case c10::kFloat:
      return ncclFloat32;
    case c10::kDouble:
      return ncclFloat64;
    case c10::kHalf:
      return ncclFloat16;
    case c10::kBFloat16:
      return ncclBfloat16;
    case c10::kLong:
      return ncclInt64;
    case c10::kInt:
      return ncclInt32;
    case c10::kChar:
      return ncclInt8;
    case c10::kByte:
      return ncclUint8;
    case c10::kBool:
      return ncclUint8;
    default:
      break;
  }
  FSDP_FAIL(str("nccl backend: ", what, " does not support dtype ", dtype_name(t)),
            "this is a bug in fsdp-train: please report it with the command line and log");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

// The waits of one communicator's works, each a pair of events: `waited` on the compute stream
// at the moment it was made to wait, `done` at the collective's end. Their gap (when positive)
// is the time the compute stream stood still for the collective: exposed communication,
// settled into CommStats once both events completed (never by blocking).
struct ExposedWaits {
  struct Wait {
    WaitPhase phase;
    std::shared_ptr<at::cuda::CUDAEvent> waited, done;
  };
  std::mutex mu;
  std::deque<Wait> waits;

  void settle(CommStats& stats) {
    std::lock_guard<std::mutex> lock(mu);
    while (!waits.empty()) {
      auto& w = waits.front();
      if (!w.waited->query() || !w.done->query()) break;
      stats.record_exposed(w.phase, std::max(0.0, w.waited->elapsed_time(*w.done) / 1e3));
      waits.pop_front();
    }
  }
};

class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<at::cuda::CUDAEvent> done, int device,
           std::shared_ptr<ExposedWaits> exposed)
      : done_(std::move(done)), device_(device), exposed_(std::move(exposed)) {}
  void wait() override {
    c10::cuda::CUDAGuard guard(device_);
    auto stream = at::cuda::getCurrentCUDAStream(device_);
    auto waited = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    waited->record(stream);
    {
      std::lock_guard<std::mutex> lock(exposed_->mu);
      exposed_->waits.push_back({wait_phase(), waited, done_});
    }
    done_->block(stream);
    if (finish_) {
      finish_();
      finish_ = nullptr;
    }
  }
  bool is_completed() override { return done_->query(); }
  std::function<void()> finish_;

 private:
  std::shared_ptr<at::cuda::CUDAEvent> done_;
  int device_;
  std::shared_ptr<ExposedWaits> exposed_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::string name, MPI_Comm mpi, int device)
      : name_(std::move(name)), device_(device), tracker_(mpi) {
    MPI_Comm_rank(mpi, &rank_);
    MPI_Comm_size(mpi, &size_);
    c10::cuda::CUDAGuard guard(device_);
    ncclUniqueId id;
    if (rank_ == 0) FSDP_NCCL_CHECK(ncclGetUniqueId(&id));
    FSDP_MPI_CHECK(MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, mpi));
    FSDP_NCCL_CHECK(ncclCommInitRank(&comm_, size_, id, rank_));
    stream_ = std::make_unique<at::cuda::CUDAStream>(at::cuda::getStreamFromPool(true, device_));
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (aborted_) return;
    tracker_.finish(seq_);
    // Destroy only after outstanding work finished; abort otherwise (c10d does the same).
    if (cudaStreamQuery(stream_->stream()) == cudaSuccess) {
      ncclCommDestroy(comm_);
    } else {
      ncclCommAbort(comm_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
#ifdef FSDP_RCCL
  std::string backend() const override {
    return "rccl";
  }
#else
  std::string backend() const override {
    return "nccl";
  }
#endif
  c10::DeviceType device_type() const override {
    return c10::kCUDA;
  }
  std::string group_name() const override {
    return name_;
  }

  WorkPtr all_gather(const at::Tensor& shard, const at::Tensor& out,
                     const CollectiveOptions& opts) override {
    check(shard, "all_gather");
    check(out, "all_gather");
    FSDP_CHECK(shard.scalar_type() == out.scalar_type() && out.numel() == shard.numel() * size_,
               str("nccl backend: all_gather needs an output of ", shard.numel(), " x ", size_,
                   " elements of the shard's dtype"),
               "this is a bug in fsdp-train: please report it with the command line and log");
    at::Tensor in = shard.contiguous();
    at::Tensor buf = out.is_contiguous() ? out : at::empty({out.numel()}, out.options());
    auto work = launch(OpType::kAllGather, "all_gather", out.nbytes(), opts, {in, buf}, [&] {
      FSDP_NCCL_CHECK(ncclAllGather(in.data_ptr(), buf.data_ptr(), in.numel(),
                                    nccl_type(in.scalar_type(), "all_gather"), comm_,
                                    stream_->stream()));
    });
    if (!buf.is_same(out)) work->finish_ = [buf, out] { out.copy_(buf.view(out.sizes())); };
    return work;
  }

  WorkPtr reduce_scatter(const at::Tensor& in, const at::Tensor& out, ReduceOp op,
                         const CollectiveOptions& opts) override {
    check(in, "reduce_scatter");
    check(out, "reduce_scatter");
    FSDP_CHECK(in.scalar_type() == out.scalar_type() && in.numel() == out.numel() * size_,
               str("nccl backend: reduce_scatter needs an input of ", out.numel(), " x ", size_,
                   " elements of the output's dtype"),
               "this is a bug in fsdp-train: please report it with the command line and log");
    at::Tensor src = in.contiguous();
    at::Tensor buf = out.is_contiguous() ? out : at::empty({out.numel()}, out.options());
    auto work =
        launch(OpType::kReduceScatter, "reduce_scatter", in.nbytes(), opts, {src, buf}, [&] {
          FSDP_NCCL_CHECK(ncclReduceScatter(src.data_ptr(), buf.data_ptr(), buf.numel(),
                                            nccl_type(src.scalar_type(), "reduce_scatter"),
                                            nccl_op(op), comm_, stream_->stream()));
        });
    if (!buf.is_same(out)) work->finish_ = [buf, out] { out.copy_(buf.view(out.sizes())); };
    return work;
  }

  WorkPtr all_reduce(const at::Tensor& t, ReduceOp op, const CollectiveOptions& opts) override {
    check(t, "all_reduce");
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    auto work = launch(OpType::kAllReduce, "all_reduce", t.nbytes(), opts, {buf}, [&] {
      FSDP_NCCL_CHECK(ncclAllReduce(buf.data_ptr(), buf.data_ptr(), buf.numel(),
                                    nccl_type(buf.scalar_type(), "all_reduce"), nccl_op(op), comm_,
                                    stream_->stream()));
    });
    if (!buf.is_same(t)) work->finish_ = [buf, t] { t.copy_(buf); };
    return work;
  }

  WorkPtr broadcast(const at::Tensor& t, int root, const CollectiveOptions& opts) override {
    check(t, "broadcast");
    at::Tensor buf = t.is_contiguous() ? t : t.contiguous();
    auto work = launch(OpType::kBroadcast, "broadcast", t.nbytes(), opts, {buf}, [&] {
      FSDP_NCCL_CHECK(ncclBroadcast(buf.data_ptr(), buf.data_ptr(), buf.numel(),
                                    nccl_type(buf.scalar_type(), "broadcast"), root, comm_,
                                    stream_->stream()));
    });
    if (!buf.is_same(t)) work->finish_ = [buf, t] { t.copy_(buf); };
    return work;
  }

  WorkPtr all_to_all(const at::Tensor& in, const at::Tensor& out,
                     const CollectiveOptions& opts) override {
    check(in, "all_to_all");
    check(out, "all_to_all");
    FSDP_CHECK(
        in.scalar_type() == out.scalar_type() && in.numel() == out.numel() &&
            in.numel() % size_ == 0,
        str("nccl backend: all_to_all got ", in.numel(), " ", dtype_name(in.scalar_type()),
            " input and ", out.numel(), " ", dtype_name(out.scalar_type()),
            " output elements; both need one dtype and a count divisible by ", size_, " ranks"),
        "this is a bug in fsdp-train: please report it with the command line and log");
    FSDP_CHECK(in.is_contiguous() && out.is_contiguous(),
               "nccl backend: all_to_all needs contiguous input and output tensors",
               "this is a bug in fsdp-train: please report it with the command line and log");
    const auto nbytes = static_cast<int64_t>(in.nbytes());
    const auto* src = static_cast<const char*>(in.data_ptr());
    auto* dst = static_cast<char*>(out.data_ptr());
    FSDP_CHECK(nbytes == 0 || src + nbytes <= dst || dst + nbytes <= src,
               "nccl backend: all_to_all input and output overlap",
               "this is a bug in fsdp-train: please report it with the command line and log");
    const auto type = nccl_type(in.scalar_type(), "all_to_all");
    const size_t n = static_cast<size_t>(in.numel() / size_);
    const size_t block = n * in.element_size();  // bytes per peer
    return launch(OpType::kAllToAll, "all_to_all", in.nbytes(), opts, {in, out}, [&] {
      FSDP_NCCL_CHECK(ncclGroupStart());
      for (int peer = 0; peer < size_; ++peer) {
        FSDP_NCCL_CHECK(ncclSend(src + peer * block, n, type, peer, comm_, stream_->stream()));
        FSDP_NCCL_CHECK(ncclRecv(dst + peer * block, n, type, peer, comm_, stream_->stream()));
      }
      FSDP_NCCL_CHECK(ncclGroupEnd());
    });
  }

  void barrier(const CollectiveOptions& opts) override {
    c10::cuda::CUDAGuard guard(device_);
    at::Tensor one = at::ones({1}, at::TensorOptions().device(at::kCUDA, device_));
    all_reduce(one, ReduceOp::kSum, opts)->wait();
    at::cuda::getCurrentCUDAStream(device_).synchronize();
  }

  void settle_exposed() override {
    exposed_->settle(stats_);
  }

  void synchronize() override {
    stream_->synchronize();
  }

 private:
  void check(const at::Tensor& t, const char* what) {
    FSDP_CHECK(t.defined() && t.is_cuda() && t.device().index() == device_,
               str("nccl backend: ", what, " needs tensors on cuda:", device_),
               "move the tensor to this rank's GPU, or use the mpi backend for CPU tensors");
  }

  template <typename Fn>
  std::shared_ptr<NcclWork> launch(OpType type, const char* name, uint64_t bytes,
                                   const CollectiveOptions& opts,
                                   std::initializer_list<at::Tensor> tensors, Fn&& issue) {
    c10::cuda::CUDAGuard guard(device_);
    tracker_.arrive(++seq_);
    auto caller = at::cuda::getCurrentCUDAStream(device_);
    at::cuda::CUDAEvent ready;
    ready.record(caller);
    ready.block(*stream_);
    for (const auto& t : tensors) {
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), *stream_);
    }
    auto start = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    auto done = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    start->record(*stream_);
    issue();
    done->record(*stream_);
    auto timeout = opts.timeout.count() > 0 ? opts.timeout : default_timeout();
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back({type, name, bytes, seq_, start, done,
                          std::chrono::steady_clock::now() + timeout, timeout});
    }
    cv_.notify_all();
    return std::make_shared<NcclWork>(done, device_, exposed_);
  }

  // The watchdog thread's body. A sticky CUDA error (an illegal address in any kernel) makes
  // the event queries throw; uncaught on this thread that would be std::terminate without the
  // message, so it ends the job with the message instead.
  void watch() {
    try {
      watch_loop();
    } catch (const std::exception& e) {
      aborted_ = true;
      abort_job(str("CUDA error seen by the NCCL watchdog of group '", name_, "': ", e.what()), 4);
    }
  }

  // Retires finished collectives (recording their time) and aborts on timeouts.
  void watch_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait_for(lock, std::chrono::milliseconds(50));
      exposed_->settle(stats_);
      while (!pending_.empty()) {
        auto& p = pending_.front();
        if (p.done->query()) {
          stats_.record(p.type, p.bytes, p.start->elapsed_time(*p.done) / 1e3);
          pending_.pop_front();
          continue;
        }
        if (std::chrono::steady_clock::now() > p.deadline) {
          aborted_ = true;
          ncclCommAbort(comm_);
          abort_job(
              "collective timeout: " +
                  tracker_.describe_timeout(p.seq, str(p.name, " on group '", name_, "' (nccl)"),
                                            std::chrono::duration<double>(p.timeout).count()),
              4);
        }
        break;
      }
      if (stop_ && pending_.empty()) return;
      if (stop_) {
        lock.unlock();
        stream_->synchronize();
        lock.lock();
      }
    }
  }

  struct Pending {
    OpType type;
    const char* name;
    uint64_t bytes;
    int64_t seq;
    std::shared_ptr<at::cuda::CUDAEvent> start, done;
    std::chrono::steady_clock::time_point deadline;
    std::chrono::milliseconds timeout;
  };

  std::string name_;
  int device_;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  std::unique_ptr<at::cuda::CUDAStream> stream_;
  ArrivalTracker tracker_;
  int64_t seq_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::list<Pending> pending_;
  std::shared_ptr<ExposedWaits> exposed_ = std::make_shared<ExposedWaits>();
  bool stop_ = false;
  std::atomic<bool> aborted_{false};
  std::thread watchdog_;
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_communicator(const std::string& name, MPI_Comm mpi,
                                                     int device_index) {
  FSDP_CHECK(
      cuda_device_count() > device_index,
      str("nccl backend: no CUDA device ", device_index, " (", cuda_device_count(), " visible)"),
      "run one rank per GPU; check CUDA_VISIBLE_DEVICES and the driver");
  return std::make_shared<NcclCommunicator>(name, mpi, device_index);
}

}  // namespace fsdp::comm::detail
