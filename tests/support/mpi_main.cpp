// Registers the MPI listener for every mpi_<component> test executable (added by CMake).
#include "support/mpi_listener.h"

CATCH_REGISTER_LISTENER(fsdp::testing::MpiListener)
