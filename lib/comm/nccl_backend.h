// NCCL backend for CUDA tensors (RCCL on ROCm builds keeps the same API). Rank 0 of the group
// makes the ncclUniqueId and broadcasts it over MPI (rendezvous stays separate from
// communication). Collectives run on a dedicated communication stream: an event recorded on the
// caller's stream orders the input, and Work::wait() makes the caller's current stream wait on
// the collective's completion event (no host synchronisation). A watchdog thread aborts the
// communicator and the job when a collective outlives its timeout. Compiled only with CUDA/HIP;
// only comm/backends.cpp refers to it.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/runtime.h"

namespace fsdp::comm::detail {

// Builds the NCCL communicator over the ranks of `mpi` (used only during construction: the
// caller may free it afterwards) on CUDA device `device_index`; `name` is its group_name().
std::shared_ptr<Communicator> make_nccl_communicator(const std::string& name, MPI_Comm mpi,
                                                     int device_index);
int cuda_device_count();

}  // namespace fsdp::comm::detail
