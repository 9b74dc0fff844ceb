// Table-driven collective tests with closed-form expected values for every op, dtype and group
// at whatever rank count mpiexec gave (ctest runs 1, 2, 3 and 4), plus error cases and stats.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "comm/runtime.h"
#include "core/error.h"
#include "support/gpu.h"

using namespace fsdp;
using comm::Group;
using comm::ReduceOp;

namespace {

// Values that stay exact in bf16 after summing over 4 ranks: small integers.
at::Tensor pattern(int64_t n, int64_t offset, at::ScalarType dtype) {
  return (at::arange(offset, offset + n, at::kLong) % 13 + 1).to(dtype);
}

std::shared_ptr<comm::Communicator> make(Group g) {
  return comm::make_communicator(g, c10::Device(c10::kCPU));
}

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kLong, at::kInt,
                                             at::kBFloat16};
const std::vector<Group> kGroups = {Group::kWorld, Group::kNode, Group::kCrossNode};
const std::vector<int64_t> kCounts = {0, 1, 7, 1000, 70001};

// Produces a non-contiguous view holding `t`'s values (every other element of a buffer).
at::Tensor strided_copy(const at::Tensor& t) {
  at::Tensor buf = at::zeros({t.numel() * 2}, t.options());
  at::Tensor view = buf.slice(0, 0, t.numel() * 2, 2);
  view.copy_(t);
  return view;
}

// Element i of the block that rank `sender` sends to rank `block`; exact in bf16 (integers up to
// 256) for up to 4 ranks.
at::Tensor a2a_block(int sender, int block, int W, int64_t n, at::ScalarType dtype) {
  at::Tensor i = at::arange(n, at::kLong);
  at::Tensor v = dtype == at::kBFloat16 ? (sender * W + block) * 16 + i % 16
                                        : sender * 1000000 + block * 10000 + i % 10000;
  return v.to(dtype);
}

// Checks one all_to_all on `c`, n elements per block: block r of the output is what rank r
// built for this rank.
void check_all_to_all(comm::Communicator& c, at::ScalarType dt, int64_t n, const std::string& group,
                      c10::Device dev = c10::Device(c10::kCPU)) {
  const int W = c.size(), R = c.rank();
  std::vector<at::Tensor> blocks;
  for (int j = 0; j < W; ++j) blocks.push_back(a2a_block(R, j, W, n, dt));
  at::Tensor in = at::cat(blocks).to(dev);
  at::Tensor out = at::full({W * n}, -1, at::TensorOptions().dtype(dt).device(dev));
  c.all_to_all(in, out)->wait();
  at::Tensor got = out.cpu();
  for (int r = 0; r < W; ++r) {
    INFO("group " << group << " dtype " << dt << " n " << n << " block " << r);
    CHECK(at::equal(got.slice(0, r * n, (r + 1) * n), a2a_block(r, R, W, n, dt)));
  }
  CHECK(at::equal(in.cpu(), at::cat(blocks)));  // the input is left alone
}

}  // namespace

TEST_CASE("all_gather: out[r*n+i] is rank r's shard", "[mpi][comm]") {
  for (Group g : kGroups) {
    auto c = make(g);
    const int W = c->size(), R = c->rank();
    for (auto dt : kDtypes) {
      for (int64_t n : kCounts) {
        for (bool strided : {false, true}) {
          at::Tensor shard = pattern(n, R * 31, dt);
          at::Tensor out = at::full({W * n}, -1, at::TensorOptions().dtype(dt));
          if (strided) {
            shard = strided_copy(shard);
            out = strided_copy(out);
          }
          c->all_gather(shard, out)->wait();
          for (int r = 0; r < W; ++r) {
            INFO("group " << comm::group_name(g) << " dtype " << dt << " n " << n << " strided "
                          << strided << " block " << r);
            CHECK(at::equal(out.slice(0, r * n, (r + 1) * n).contiguous(), pattern(n, r * 31, dt)));
          }
        }
      }
    }
  }
}

TEST_CASE("reduce_scatter sum and avg, both MPI algorithms", "[mpi][comm]") {
  for (Group g : kGroups) {
    for (int64_t threshold : {int64_t{0}, int64_t{1} << 60}) {
      comm::BackendOptions bo;
      bo.mpi_rs_allreduce_min_bytes = threshold;
      auto c = comm::make_communicator(g, c10::Device(c10::kCPU), bo);
      const int W = c->size(), R = c->rank();
      for (auto dt : kDtypes) {
        for (int64_t n : kCounts) {
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
            if (op == ReduceOp::kAvg && c10::isIntegralType(dt, false)) continue;
            // Rank r contributes (r+1) * pattern; block R of the sum is pattern * W(W+1)/2.
            at::Tensor in = pattern(W * n, 0, dt) * (R + 1);
            at::Tensor out = at::zeros({n}, at::TensorOptions().dtype(dt));
            const bool strided = n % 2 == 1;
            if (strided) {
              in = strided_copy(in);
              out = strided_copy(out);
            }
            c->reduce_scatter(in, out, op)->wait();
            at::Tensor expect =
                pattern(W * n, 0, at::kDouble).slice(0, R * n, (R + 1) * n) * (W * (W + 1) / 2.0);
            if (op == ReduceOp::kAvg) expect = expect / W;
            INFO("group " << comm::group_name(g) << " dtype " << dt << " n " << n << " op "
                          << comm::reduce_op_name(op) << " threshold " << threshold);
            CHECK(at::allclose(out.to(at::kDouble), expect, 1e-2, 0));
            if (dt != at::kBFloat16)
              CHECK(at::equal(out.to(at::kDouble), expect.to(dt).to(at::kDouble)));
          }
        }
      }
    }
  }
}

TEST_CASE("all_reduce sum, avg and max in place", "[mpi][comm]") {
  for (Group g : kGroups) {
    auto c = make(g);
    const int W = c->size(), R = c->rank();
    for (auto dt : kDtypes) {
      for (int64_t n : kCounts) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
          if (op == ReduceOp::kAvg && c10::isIntegralType(dt, false)) continue;
          at::Tensor t = pattern(n, 5, dt) * (R + 1);
          if (n % 2 == 1) t = strided_copy(t);
          c->all_reduce(t, op)->wait();
          at::Tensor base = pattern(n, 5, at::kDouble);
          at::Tensor expect = op == ReduceOp::kMax   ? base * W
                              : op == ReduceOp::kSum ? base * (W * (W + 1) / 2.0)
                                                     : base * ((W + 1) / 2.0);
          INFO("group " << comm::group_name(g) << " dtype " << dt << " n " << n << " op "
                        << comm::reduce_op_name(op));
          CHECK(at::allclose(t.to(at::kDouble), expect, 1e-2, 0));
        }
      }
    }
  }
}

TEST_CASE("broadcast from every root", "[mpi][comm]") {
  for (Group g : kGroups) {
    auto c = make(g);
    const int W = c->size(), R = c->rank();
    for (auto dt : kDtypes) {
      for (int root = 0; root < W; ++root) {
        at::Tensor t = R == root ? pattern(1001, root, dt) : at::zeros({1001}, dt);
        c->broadcast(t, root)->wait();
        CHECK(at::equal(t, pattern(1001, root, dt)));
      }
    }
  }
}

TEST_CASE("all_to_all: block j of rank r lands in block r of rank j", "[mpi][comm]") {
  for (Group g : kGroups) {
    auto c = make(g);
    for (auto dt : kDtypes) {
      for (int64_t n : kCounts) check_all_to_all(*c, dt, n, comm::group_name(g));
    }
  }
}

TEST_CASE("all_to_all on a group of one copies the input", "[mpi][comm]") {
  const auto& t = comm::topology();
  auto c = comm::split(Group::kWorld, t.world_rank, 0, c10::Device(c10::kCPU), "self");
  REQUIRE(c != nullptr);
  REQUIRE(c->size() == 1);
  for (auto dt : {at::kFloat, at::kBFloat16, at::kLong}) {
    at::Tensor in = pattern(1001, t.world_rank, dt);
    at::Tensor out = at::zeros({1001}, dt);
    c->all_to_all(in, out)->wait();
    CHECK(at::equal(out, pattern(1001, t.world_rank, dt)));
    check_all_to_all(*c, dt, 33, "self");
  }
}

TEST_CASE("all_to_all rejects bad shapes naming the sizes, before communicating", "[mpi][comm]") {
  auto c = make(Group::kWorld);
  const int W = c->size();
  auto msg_of = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m;
  if (W > 1) {
    m = msg_of([&] { c->all_to_all(at::ones({4 * W + 1}), at::empty({4 * W + 1})); });
    CHECK(m.find(str("all_to_all input has ", 4 * W + 1, " elements and output ", 4 * W + 1,
                     ", expected the same count divisible by ", W, " ranks")) != std::string::npos);
  }
  m = msg_of([&] { c->all_to_all(at::ones({4 * W}), at::empty({4 * W + W})); });
  CHECK(m.find(str("input has ", 4 * W, " elements and output ", 5 * W)) != std::string::npos);
  m = msg_of([&] { c->all_to_all(at::ones({4 * W}), at::empty({4 * W}, at::kLong)); });
  CHECK(m.find("all_to_all dtype mismatch: input fp32, output int64") != std::string::npos);
  m = msg_of([&] { c->all_to_all(strided_copy(at::ones({4 * W})), at::empty({4 * W})); });
  CHECK(m.find("all_to_all needs contiguous") != std::string::npos);
  at::Tensor buf = at::ones({8 * W});
  m = msg_of([&] { c->all_to_all(buf.slice(0, 0, 4 * W), buf.slice(0, 2 * W, 6 * W)); });
  CHECK(m.find("all_to_all input and output overlap") != std::string::npos);
  // The communicator still works after rejected calls, and counts the input's bytes.
  c->stats().reset();
  check_all_to_all(*c, at::kFloat, 10, "world");
  CHECK(c->stats().get(comm::OpType::kAllToAll).calls == 1u);
  CHECK(c->stats().get(comm::OpType::kAllToAll).bytes == 40u * W);
}

TEST_CASE("chunked large counts match unchunked results", "[mpi][comm]") {
  // FSDP_MPI_MAX_COUNT forces the >INT_MAX code paths with small buffers.
  ::setenv("FSDP_MPI_MAX_COUNT", "1000", 1);
  auto c = make(Group::kWorld);
  ::unsetenv("FSDP_MPI_MAX_COUNT");
  const int W = c->size(), R = c->rank();
  const int64_t n = 4567;
  at::Tensor shard = pattern(n, R, at::kFloat);
  at::Tensor out = at::empty({W * n}, at::kFloat);
  c->all_gather(shard, out)->wait();
  for (int r = 0; r < W; ++r)
    CHECK(at::equal(out.slice(0, r * n, (r + 1) * n), pattern(n, r, at::kFloat)));
  at::Tensor in = pattern(W * n, 0, at::kFloat);
  at::Tensor rs = at::empty({n}, at::kFloat);
  c->reduce_scatter(in, rs, ReduceOp::kSum)->wait();
  CHECK(at::equal(rs, pattern(W * n, 0, at::kFloat).slice(0, R * n, (R + 1) * n) * W));
  at::Tensor b = R == 0 ? pattern(n, 3, at::kBFloat16) : at::zeros({n}, at::kBFloat16);
  c->broadcast(b, 0)->wait();
  CHECK(at::equal(b, pattern(n, 3, at::kBFloat16)));
  // 18268 bytes per block: 19 chunks of at most 1000 bytes, the last one shorter.
  check_all_to_all(*c, at::kFloat, n, "world (chunked)");
}

TEST_CASE("a really large all_reduce (16M fp32 elements)", "[mpi][comm]") {
  auto c = make(Group::kWorld);
  at::Tensor t = at::full({int64_t{16} << 20}, 1.0f);
  c->all_reduce(t, ReduceOp::kSum)->wait();
  CHECK(t.min().item<float>() == c->size());
  CHECK(t.max().item<float>() == c->size());
}

TEST_CASE("several outstanding collectives complete in issue order", "[mpi][comm]") {
  auto c = make(Group::kWorld);
  const int W = c->size();
  std::vector<at::Tensor> ts;
  std::vector<comm::WorkPtr> works;
  for (int i = 0; i < 8; ++i) {
    ts.push_back(at::full({1000}, static_cast<float>(i)));
    works.push_back(c->all_reduce(ts.back(), ReduceOp::kSum));
  }
  for (int i = 7; i >= 0; --i) {
    works[i]->wait();
    CHECK(works[i]->is_completed());
    CHECK(ts[i].eq(static_cast<float>(i * W)).all().item<bool>());
  }
  c->synchronize();
}

TEST_CASE("statistics count bytes per op type", "[mpi][comm]") {
  auto c = make(Group::kWorld);
  const int W = c->size();
  c->stats().reset();
  at::Tensor shard = at::ones({100});
  at::Tensor full = at::empty({100 * W});
  c->all_gather(shard, full)->wait();
  c->reduce_scatter(full, shard, ReduceOp::kAvg)->wait();
  c->all_reduce(shard, ReduceOp::kSum)->wait();
  c->all_reduce(shard, ReduceOp::kSum)->wait();
  CHECK(c->stats().get(comm::OpType::kAllGather).bytes == 400u * W);
  CHECK(c->stats().get(comm::OpType::kReduceScatter).bytes == 400u * W);
  CHECK(c->stats().get(comm::OpType::kAllReduce).calls == 2u);
  CHECK(c->stats().get(comm::OpType::kAllReduce).bytes == 800u);
  CHECK(c->stats().total_bytes() == 800u * W + 800u);
}

TEST_CASE("bad calls throw naming the backend, before communicating", "[mpi][comm]") {
  auto c = make(Group::kWorld);
  const int W = c->size();
  auto msg_of = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = msg_of([&] { c->all_gather(at::ones({4}), at::empty({4 * W}, at::kDouble)); });
  CHECK(m.find("mpi backend: all_gather dtype mismatch") != std::string::npos);
  m = msg_of([&] { c->all_gather(at::ones({4}), at::empty({4 * W + 1})); });
  CHECK(m.find("expected 4 x") != std::string::npos);
  m = msg_of([&] { c->reduce_scatter(at::ones({4 * W + 2}), at::empty({4}), ReduceOp::kSum); });
  CHECK(m.find("reduce_scatter input has") != std::string::npos);
  m = msg_of([&] { c->all_reduce(at::ones({4}, at::kLong), ReduceOp::kAvg); });
  CHECK(m.find("avg needs a floating dtype") != std::string::npos);
  m = msg_of([&] { c->all_reduce(at::ones({4}, at::kBool), ReduceOp::kSum); });
  CHECK(m.find("does not support dtype bool") != std::string::npos);
  m = msg_of([&] { c->broadcast(at::ones({4}), W); });
  CHECK(m.find("outside the group") != std::string::npos);
  // The communicator still works after rejected calls.
  at::Tensor t = at::ones({3});
  c->all_reduce(t, ReduceOp::kSum)->wait();
  CHECK(t.eq(W).all().item<bool>());
}

TEST_CASE("topology is consistent across groups", "[mpi][comm]") {
  const auto& t = comm::topology();
  auto node = make(Group::kNode);
  auto cross = make(Group::kCrossNode);
  CHECK(node->size() == t.local_size);
  CHECK(node->rank() == t.local_rank);
  CHECK(cross->size() == t.num_nodes);
  CHECK(cross->rank() == t.node_index);
  CHECK(t.local_size * t.num_nodes == t.world_size);
  // All test ranks run on this one machine: the machine rank (which picks the GPU) is the world
  // rank, also when FSDP_PRETEND_NODES splits the machine into nodes.
  CHECK(t.machine_local_rank == t.world_rank);
}

// The MPI backend carries CPU tensors only (the NCCL backend carries CUDA tensors): on a GPU
// machine, CUDA tensors handed to it are refused by name on every rank, before any message, and
// the communicator goes on working (the GPU plan runs this at two ranks sharing one GPU).
TEST_CASE("the mpi backend refuses CUDA tensors by name", "[mpi][cuda]") {
  FSDP_REQUIRE_GPU();
  auto c = make(Group::kWorld);
  const int W = c->size();
  const auto cuda = at::TensorOptions().device(c10::Device(c10::kCUDA, 0));
  for (int op = 0; op < 3; ++op) {
    std::string m = "no error";
    try {
      if (op == 0) c->all_gather(at::ones({4}, cuda), at::empty({4 * W}, cuda));
      if (op == 1) c->reduce_scatter(at::ones({4 * W}, cuda), at::empty({4}, cuda), ReduceOp::kSum);
      if (op == 2) c->all_reduce(at::ones({4}, cuda), ReduceOp::kSum);
    } catch (const Error& e) {
      m = e.what();
    }
    INFO(m);
    CHECK(m.find("mpi backend") != std::string::npos);
    CHECK(m.find("CPU tensors") != std::string::npos);
  }
  at::Tensor t = at::ones({3});
  c->all_reduce(t, ReduceOp::kSum)->wait();
  CHECK(t.eq(W).all().item<bool>());
}

TEST_CASE("nccl collectives on the GPU", "[nccl][cuda]") {
  FSDP_REQUIRE_GPU();
  const auto& topo = comm::topology();
  c10::Device dev(c10::kCUDA, topo.machine_local_rank % comm::gpu_count());
  auto c = comm::make_communicator(Group::kWorld, dev);
  const int W = c->size(), R = c->rank();
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    auto opts = at::TensorOptions().dtype(dt).device(dev);
    at::Tensor shard = pattern(1000, R, dt).to(dev);
    at::Tensor out = at::empty({1000 * W}, opts);
    c->all_gather(shard, out)->wait();
    for (int r = 0; r < W; ++r)
      CHECK(at::equal(out.slice(0, r * 1000, (r + 1) * 1000).cpu(), pattern(1000, r, dt)));
    at::Tensor in = (pattern(1000 * W, 0, dt) * (R + 1)).to(dev);
    at::Tensor rs = at::empty({1000}, opts);
    c->reduce_scatter(in, rs, ReduceOp::kAvg)->wait();
    at::Tensor expect =
        pattern(1000 * W, 0, at::kDouble).slice(0, R * 1000, (R + 1) * 1000) * ((W + 1) / 2.0);
    CHECK(at::allclose(rs.cpu().to(at::kDouble), expect, 1e-2, 0));
    at::Tensor ar = at::ones({4096}, opts);
    c->all_reduce(ar, ReduceOp::kSum)->wait();
    CHECK(ar.eq(W).all().item<bool>());
    for (int64_t n : {0, 1, 1000}) check_all_to_all(*c, dt, n, "world (nccl)", dev);
  }
  check_all_to_all(*c, at::kLong, 777, "world (nccl)", dev);
  c->barrier();
  // The watchdog thread records a collective when it retires it (it polls every 50 ms).
  for (int i = 0; i < 100 && c->stats().get(comm::OpType::kAllGather).calls < 2u; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(c->stats().get(comm::OpType::kAllGather).calls >= 2u);
}
