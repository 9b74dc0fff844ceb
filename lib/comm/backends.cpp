// The one file that knows which communication backends were compiled in: no #ifdef elsewhere.
#include "comm/mpi_backend.h"
#include "comm/mpi_util.h"
#include "comm/runtime.h"

#include <ATen/ATen.h>
#if defined(FSDP_HAVE_NCCL)
#include "comm/nccl_backend.h"
#endif

namespace fsdp::comm {

namespace {

// The backend for `device` over the MPI communicator `mpi`. With `owns_mpi` the result takes
// `mpi` over: the MPI backend frees it when destroyed; the NCCL backend needs it only to
// exchange its id and duplicates what it keeps, so it is freed here.
std::shared_ptr<Communicator> make_on(const std::string& name, MPI_Comm mpi, bool owns_mpi,
                                      const c10::Device& device, const BackendOptions& options) {
  if (device.is_cpu()) {
    auto comm = std::make_shared<detail::MpiCommunicator>(name, mpi, owns_mpi);
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
    auto comm = detail::make_nccl_communicator(name, mpi, index);
    if (owns_mpi) MPI_Comm_free(&mpi);
    return comm;
  }
#endif
  if (owns_mpi) MPI_Comm_free(&mpi);
  FSDP_FAIL("no communication backend for device " + device.str() + " in this build",
            "this build has: mpi (CPU)" +
                std::string(compiled_backends().size() > 1 ? ", nccl (CUDA)" : "") +
                "; rebuild with the CUDA LibTorch and NCCL for GPU training");
}

}  // namespace

std::shared_ptr<Communicator> make_communicator(Group group, const c10::Device& device,
                                                const BackendOptions& options) {
  return make_on(group_name(group), detail::raw_comm(group), false, device, options);
}

std::shared_ptr<Communicator> split(Group parent, int color, int key, const c10::Device& device,
                                    const std::string& name, const BackendOptions& options) {
  MPI_Comm sub = MPI_COMM_NULL;
  FSDP_MPI_CHECK(
      MPI_Comm_split(detail::raw_comm(parent), color < 0 ? MPI_UNDEFINED : color, key, &sub));
  if (sub == MPI_COMM_NULL) return nullptr;
  MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  return make_on(name, sub, true, device, options);
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
