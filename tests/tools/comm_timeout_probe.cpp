// Test helper: the last rank never arrives at an all_reduce; the others wait with a short
// timeout. Used by tests/e2e/comm_timeout.sh to prove the job aborts with a message that names
// the missing rank instead of hanging. Never used outside tests.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "comm/runtime.h"

int main(int argc, char** argv) {
  fsdp::comm::init(&argc, &argv);
  const auto& t = fsdp::comm::topology();
  auto c = fsdp::comm::make_communicator(fsdp::comm::Group::kWorld, c10::Device(c10::kCPU));
  fsdp::comm::CollectiveOptions opts;
  opts.timeout = std::chrono::milliseconds(2000);
  at::Tensor x = at::ones({16});
  c->all_reduce(x, fsdp::comm::ReduceOp::kSum, opts)->wait();  // everyone arrives
  if (t.world_rank == t.world_size - 1) {
    std::this_thread::sleep_for(std::chrono::seconds(60));
  }
  c->all_reduce(x, fsdp::comm::ReduceOp::kSum, opts)->wait();
  std::printf("rank %d: collective completed (unexpected)\n", t.world_rank);
  fsdp::comm::finalize();
  return 0;
}
