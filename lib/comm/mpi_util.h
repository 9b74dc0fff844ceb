// MPI helpers private to lib/comm: error checks with MPI's own message, dtype mapping, and
// access to the raw MPI communicators of each group. Nothing outside lib/comm includes this.
#pragma once

#include <mpi.h>

#include <c10/core/ScalarType.h>

#include <string>

#include "comm/runtime.h"
#include "core/error.h"

namespace fsdp::comm::detail {

std::string mpi_error_string(int code);

#define FSDP_MPI_CHECK(call)                                                           \
  do {                                                                                 \
    int fsdp_mpi_rc_ = (call);                                                         \
    FSDP_CHECK(fsdp_mpi_rc_ == MPI_SUCCESS,                                            \
               ::fsdp::str("MPI call failed: ", #call, ": ",                           \
                           ::fsdp::comm::detail::mpi_error_string(fsdp_mpi_rc_)),      \
               "check that every rank runs the same program with the same arguments; " \
               "rerun with FSDP_LOG_LEVEL=debug for details");                         \
  } while (0)

// The MPI communicator of a group (owned by the runtime; valid until finalize()).
MPI_Comm raw_comm(Group group);
// World rank of a rank inside a group communicator.
int world_rank_of(MPI_Comm comm, int group_rank);

}  // namespace fsdp::comm::detail
