// The one file that knows which communication backends were compiled in: no #ifdef elsewhere.
#include "comm/mpi_backend.h"
#include "comm/mpi_util.h"
#include "comm/runtime.h"

#include <ATen/ATen.h>
#if defined(FSDP_HAVE_NCCL)
#include "comm/nccl_backend.h"
#endif

namespace fsdp::comm {

std::shared_ptr<Communicator> make_communicator(Group group, const c10::Device& device,
                                                const BackendOptions& options) {
  if (device.is_cpu()) {
    auto comm = std::make_shared<detail::MpiCommunicator>(group, detail::raw_comm(group));
    if (options.mpi_rs_allreduce_min_bytes >= 0) {
      auto t = comm->tuning();
      t.rs_allreduce_min_bytes = options.mpi_rs_allreduce_min_bytes;
      comm->set_tuning(t);
    }
    return comm;
  }
#if defined(FSDP_HAVE_NCCL)
  if (device.is_cuda()) {
    const int index = device.has_index() ? device.index() : topology().local_rank;
    return detail::make_nccl_communicator(group, index);
  }
#endif
  FSDP_CHECK(false, "no communication backend for device " + device.str() + " in this build",
             "this build has: mpi (CPU)" +
                 std::string(compiled_backends().size() > 1 ? ", nccl (CUDA)" : "") +
                 "; rebuild with the CUDA LibTorch and NCCL for GPU training");
}

bool any_rank(Communicator& comm, bool mine) {
  at::Tensor flag = at::full({1}, mine ? 1 : 0, at::kInt);
  comm.all_reduce(flag, ReduceOp::kMax)->wait();
  return flag.item<int>() != 0;
}

std::vector<std::string> compiled_backends() {
#if defined(FSDP_HAVE_NCCL)
#if defined(FSDP_RCCL)
  return {"mpi", "rccl"};
#else
  return {"mpi", "nccl"};
#endif
#else
  return {"mpi"};
#endif
}

int gpu_count() {
#if defined(FSDP_HAVE_NCCL)
  return detail::cuda_device_count();
#else
  return 0;
#endif
}

}  // namespace fsdp::comm
