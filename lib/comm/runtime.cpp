// MPI start-up, topology and group communicators (comm/runtime.h).
#include "comm/runtime.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "comm/mpi_util.h"
#include "core/env.h"
#include "core/log.h"

namespace fsdp::comm {

namespace {
struct State {
  bool we_initialized = false;
  bool ready = false;
  Topology topo;
  MPI_Comm world = MPI_COMM_NULL;
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm cross = MPI_COMM_NULL;
  std::chrono::milliseconds timeout{20 * 60 * 1000};
};
State& state() {
  static State s;
  return s;
}

}  // namespace

const char* group_name(Group g) {
  switch (g) {
    case Group::kWorld:
      return "world";
    case Group::kNode:
      return "node";
    case Group::kCrossNode:
      return "cross-node";
  }
  return "?";
}

std::string detail::mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, len);
}

void init(int* argc, char*** argv) {
  State& s = state();
  if (s.ready) return;
  int already = 0;
  MPI_Initialized(&already);
  if (!already) {
    int provided = 0;
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    FSDP_CHECK(rc == MPI_SUCCESS, "MPI_Init_thread failed: " + detail::mpi_error_string(rc),
               "check the Open MPI installation (launch/setup.sh installs it)");
    FSDP_CHECK(
        provided >= MPI_THREAD_MULTIPLE,
        str("MPI provides thread level ", provided, ", fsdp-train needs MPI_THREAD_MULTIPLE"),
        "use an MPI built with thread support (Debian's Open MPI has it)");
    s.we_initialized = true;
  }
  FSDP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &s.world));
  MPI_Comm_set_errhandler(s.world, MPI_ERRORS_RETURN);
  Topology& t = s.topo;
  MPI_Comm_rank(s.world, &t.world_rank);
  MPI_Comm_size(s.world, &t.world_size);

  {
    MPI_Comm machine = MPI_COMM_NULL;
    FSDP_MPI_CHECK(
        MPI_Comm_split_type(s.world, MPI_COMM_TYPE_SHARED, t.world_rank, MPI_INFO_NULL, &machine));
    MPI_Comm_rank(machine, &t.machine_local_rank);
    MPI_Comm_free(&machine);
  }
  const int pretend = static_cast<int>(env::integer("FSDP_PRETEND_NODES").value_or(0));
  if (pretend > 0) {
    FSDP_USAGE_CHECK(
        t.world_size % pretend == 0,
        str("FSDP_PRETEND_NODES=", pretend, " does not divide the world size ", t.world_size),
        "choose a number of pretend nodes that divides the number of ranks");
    const int per_node = t.world_size / pretend;
    FSDP_MPI_CHECK(MPI_Comm_split(s.world, t.world_rank / per_node, t.world_rank, &s.node));
    t.pretend_nodes = true;
  } else {
    FSDP_MPI_CHECK(
        MPI_Comm_split_type(s.world, MPI_COMM_TYPE_SHARED, t.world_rank, MPI_INFO_NULL, &s.node));
  }
  MPI_Comm_set_errhandler(s.node, MPI_ERRORS_RETURN);
  MPI_Comm_rank(s.node, &t.local_rank);
  MPI_Comm_size(s.node, &t.local_size);
  FSDP_MPI_CHECK(MPI_Comm_split(s.world, t.local_rank, t.world_rank, &s.cross));
  MPI_Comm_set_errhandler(s.cross, MPI_ERRORS_RETURN);
  MPI_Comm_rank(s.cross, &t.node_index);
  MPI_Comm_size(s.cross, &t.num_nodes);
  s.ready = true;
  log::set_rank(t.world_rank, t.world_size);
}

bool initialized() {
  return state().ready;
}

std::pair<int, int> mpi_rank_and_size() {
  if (state().ready) return {state().topo.world_rank, state().topo.world_size};
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin) return {0, 1};
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return {rank, size};
}

void finalize() {
  State& s = state();
  if (!s.ready) return;
  for (MPI_Comm* c : {&s.cross, &s.node, &s.world}) {
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
  }
  s.ready = false;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (s.we_initialized && !finalized) MPI_Finalize();
  s.we_initialized = false;
}

const Topology& topology() {
  FSDP_ASSERT(state().ready, "comm::init() must run before topology()");
  return state().topo;
}

void set_default_timeout(std::chrono::milliseconds timeout) {
  state().timeout = timeout;
}
std::chrono::milliseconds default_timeout() {
  return state().timeout;
}

MPI_Comm detail::raw_comm(Group group) {
  State& s = state();
  FSDP_ASSERT(s.ready, "comm::init() must run before communicators are created");
  switch (group) {
    case Group::kWorld:
      return s.world;
    case Group::kNode:
      return s.node;
    case Group::kCrossNode:
      return s.cross;
  }
  return MPI_COMM_NULL;
}

int detail::world_rank_of(MPI_Comm comm, int group_rank) {
  MPI_Group g = MPI_GROUP_NULL, w = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &g);
  MPI_Comm_group(MPI_COMM_WORLD, &w);
  int out = MPI_UNDEFINED;
  MPI_Group_translate_ranks(g, 1, &group_rank, w, &out);
  MPI_Group_free(&g);
  MPI_Group_free(&w);
  return out;
}

void abort_job(const std::string& message, int exit_code) {
  std::string line = "fsdp-train: FATAL";
  if (state().ready) line += " [rank " + std::to_string(state().topo.world_rank) + "]";
  line += ": " + message + "\n";
  ssize_t rc = ::write(STDERR_FILENO, line.data(), line.size());
  (void)rc;
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace fsdp::comm
