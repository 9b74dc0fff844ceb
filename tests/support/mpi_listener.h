// Catch2 listener that brings MPI up before the first test and down after the last, so the
// mpi_tests executable can use Catch2WithMain and run under mpiexec at any rank count.
// Include from exactly one test source of the mpi_tests executable.
#pragma once

#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>

#include "comm/runtime.h"

namespace fsdp::testing {

struct MpiListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testRunStarting(const Catch::TestRunInfo&) override { fsdp::comm::init(nullptr, nullptr); }
  void testRunEnded(const Catch::TestRunStats&) override { fsdp::comm::finalize(); }
};

}  // namespace fsdp::testing
