// Registers the MPI listener for every mpi_<component> test executable (added by CMake).
#include "support/mpi_listener.h"

using fsdp::testing::MpiListener;
CATCH_REGISTER_LISTENER(MpiListener)
