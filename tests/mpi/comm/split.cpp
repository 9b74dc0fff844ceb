// comm::split builds sub-groups through the runtime (no test reaches into comm::detail), and a
// communicator says which device type it accepts. Expected values are closed forms of the rank
// numbers, at whatever rank count mpiexec gave.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include "comm/runtime.h"
#include "core/error.h"
#include "support/gpu.h"

using namespace fsdp;

TEST_CASE("a CPU communicator accepts CPU tensors", "[mpi][comm]") {
  auto c = comm::make_communicator(comm::Group::kWorld, c10::Device(c10::kCPU));
  CHECK(c->device_type() == c10::kCPU);
  CHECK(c->group_name() == "world");
}

TEST_CASE("split: ranks of one color form a group ordered by key", "[mpi][comm]") {
  const auto& t = comm::topology();
  const int W = t.world_size, R = t.world_rank;
  // Even and odd ranks, each group in reverse world order.
  auto c = comm::split(comm::Group::kWorld, R % 2, W - R, c10::Device(c10::kCPU), "parity");
  REQUIRE(c != nullptr);
  CHECK(c->group_name() == "parity");
  CHECK(c->device_type() == c10::kCPU);
  const int members = R % 2 == 0 ? (W + 1) / 2 : W / 2;
  CHECK(c->size() == members);
  // Members of my color with a larger world rank come first (smaller key).
  int before = 0;
  for (int r = R + 2; r < W; r += 2) ++before;
  CHECK(c->rank() == before);
  // A collective stays inside the group: the sum of the members' world ranks.
  at::Tensor x = at::full({3}, static_cast<double>(R), at::kDouble);
  c->all_reduce(x, comm::ReduceOp::kSum)->wait();
  double expect = 0;
  for (int r = R % 2; r < W; r += 2) expect += r;
  CHECK(at::equal(x, at::full({3}, expect, at::kDouble)));
  // The group's order is the key's: gathering world ranks gives them in descending order.
  at::Tensor mine = at::full({1}, static_cast<int64_t>(R), at::kLong);
  at::Tensor all = at::empty({members}, at::kLong);
  c->all_gather(mine, all)->wait();
  for (int i = 0; i + 1 < members; ++i) CHECK(all[i].item<int64_t>() > all[i + 1].item<int64_t>());
}

TEST_CASE("split: a negative color joins no group", "[mpi][comm]") {
  const auto& t = comm::topology();
  // Only the first rank: a group of one; everyone else gets null. Repeated, so that freeing the
  // split communicators is exercised too.
  for (int round = 0; round < 3; ++round) {
    auto c = comm::split(comm::Group::kWorld, t.world_rank == 0 ? 0 : -1, 0, c10::Device(c10::kCPU),
                         "first");
    if (t.world_rank == 0) {
      REQUIRE(c != nullptr);
      CHECK(c->size() == 1);
      at::Tensor x = at::full({2}, 5.0, at::kFloat);
      c->all_reduce(x, comm::ReduceOp::kSum)->wait();
      CHECK(at::equal(x, at::full({2}, 5.0, at::kFloat)));
    } else {
      CHECK(c == nullptr);
    }
  }
  comm::make_communicator(comm::Group::kWorld, c10::Device(c10::kCPU))->barrier();
}

TEST_CASE("split: sub-groups of the node group", "[mpi][comm]") {
  const auto& t = comm::topology();
  auto c = comm::split(comm::Group::kNode, 0, t.local_rank, c10::Device(c10::kCPU), "node copy");
  REQUIRE(c != nullptr);
  CHECK(c->size() == t.local_size);
  CHECK(c->rank() == t.local_rank);
}

TEST_CASE("split on the GPU gives a communicator that accepts CUDA tensors", "[nccl][cuda]") {
  FSDP_REQUIRE_GPU();
  const auto& t = comm::topology();
  c10::Device dev(c10::kCUDA, t.machine_local_rank % comm::gpu_count());
  auto c = comm::split(comm::Group::kWorld, 0, t.world_rank, dev, "gpu world");
  REQUIRE(c != nullptr);
  CHECK(c->device_type() == c10::kCUDA);
  at::Tensor x = at::ones({16}, at::TensorOptions().dtype(at::kFloat).device(dev));
  c->all_reduce(x, comm::ReduceOp::kSum)->wait();
  CHECK(x.cpu().eq(t.world_size).all().item<bool>());
}
