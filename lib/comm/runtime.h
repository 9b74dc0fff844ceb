// Process-level communication runtime: MPI initialisation (threads: MULTIPLE), the rank
// topology (node-local and cross-node groups, local rank -> GPU), the job-wide default timeout
// and the factory that builds communicators for a device. Started once per process; works the
// same under mpirun, srun or alone (world size 1).
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace fsdp::comm {

enum class Group { kWorld, kNode, kCrossNode };
const char* group_name(Group g);

struct Topology {
  int world_rank = 0;
  int world_size = 1;
  int local_rank = 0;  // rank inside the node
  int local_size = 1;  // ranks on this node
  int node_index = 0;  // which node, 0..num_nodes-1
  int num_nodes = 1;
  bool pretend_nodes = false;  // split by FSDP_PRETEND_NODES rather than by shared memory
  // Rank among the processes of this machine (shared memory), whatever the node split: picks
  // the GPU. Equals local_rank unless FSDP_PRETEND_NODES splits one machine into nodes.
  int machine_local_rank = 0;
};

// Initialises MPI (idempotent; a no-op when already initialised by someone else, e.g. a test
// listener) and reads the topology. Environment:
//   FSDP_PRETEND_NODES=K  split this job into K pretend nodes of contiguous ranks (tests of
//                         hybrid sharding on one machine); world size must divide by K.
void init(int* argc, char*** argv);
bool initialized();
// This process's rank and the world size as MPI knows them, also when init() failed half way
// (e.g. a bad FSDP_PRETEND_NODES): {0, 1} without MPI. For error reporting.
std::pair<int, int> mpi_rank_and_size();
// Finalises MPI if this process initialised it. Safe to call twice.
void finalize();

const Topology& topology();

// Default timeout for every collective (--dist-timeout); 20 minutes unless set.
void set_default_timeout(std::chrono::milliseconds timeout);
std::chrono::milliseconds default_timeout();

// Backend tunables; unset fields keep the backend's default (or its environment override).
struct BackendOptions {
  // MPI: reduce-scatter inputs of at least this many bytes use Allreduce + slice.
  int64_t mpi_rs_allreduce_min_bytes = -1;
};

// Communicator for a group on a device: MPI for CPU, NCCL for CUDA (if compiled in).
// Communicators are created eagerly so that a broken setup fails before any compute.
std::shared_ptr<Communicator> make_communicator(Group group, const c10::Device& device,
                                                const BackendOptions& options = {});

// Sub-groups of the runtime group `parent`, collective over its ranks (every rank of `parent`
// calls it): the ranks that pass the same `color` (>= 0) share one new communicator on `device`,
// ranked by `key` (ties keep the order in `parent`); a rank passing a negative color joins none
// and gets nullptr. `name` is what the communicator's group_name() reports. Used for groups the
// runtime does not build itself (tests: pretend nodes, sub-worlds for resharding).
std::shared_ptr<Communicator> split(Group parent, int color, int key, const c10::Device& device,
                                    const std::string& name, const BackendOptions& options = {});

// Which backends this build has (reported by `fsdp-train --version` and comm-bench).
std::vector<std::string> compiled_backends();
// Number of GPUs visible (0 when no driver or no device; never throws).
int gpu_count();

// Ends the whole job with a message (every rank's process is killed by MPI_Abort).
[[noreturn]] void abort_job(const std::string& message, int exit_code = 3);

}  // namespace fsdp::comm
