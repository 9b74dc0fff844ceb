// Rank-parallel convert and vocab counting at 1..4 ranks: the native dataset written by W ranks
// holds exactly the .ckpt tensors, and all-reduced token counts equal a one-process count.
#include <ATen/ATen.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <filesystem>

#include "comm/communicator.h"
#include "comm/runtime.h"
#include "core/fs_util.h"
#include "data/native_format.h"
#include "data/toy_data.h"
#include "data/vocab_mapping.h"

namespace fs = std::filesystem;
using namespace fsdp::data;

TEST_CASE("convert across ranks, then every rank reads identical native samples", "[mpi][data]") {
  auto comm = fsdp::comm::make_communicator(fsdp::comm::Group::kWorld, c10::Device(c10::kCPU));
  const int w = comm->size();
  // One directory per world size and job (the root's pid, broadcast), so runs never collide.
  at::Tensor pid = at::tensor(std::vector<int64_t>{static_cast<int64_t>(::getpid())});
  comm->broadcast(pid, 0)->wait();
  const fs::path dir = fs::temp_directory_path() / ("fsdp_mpi_convert_w" + std::to_string(w) + "_" +
                                                    std::to_string(pid.item<int64_t>()));
  ToyDataOptions t;
  t.out_dir = dir.string();
  t.num_samples = 18;
  t.min_len = 6;
  t.max_len = 20;
  t.hidden_size = 16;
  t.vocab_size = 48;
  t.draft_vocab_size = 16;
  t.samples_per_dir = 5;
  if (comm->rank() == 0) generate_toy_data(t);
  comm->barrier();

  ConvertOptions o;
  o.input = (dir / "hidden_states").string();
  o.output = (dir / "native").string();
  o.shard_bytes = 8 << 10;
  const auto rep = convert_to_native(o, comm.get());
  CHECK(rep.shards_total >= 4);
  // Every shard written exactly once across ranks.
  at::Tensor written = at::tensor(std::vector<int64_t>{rep.shards_written, rep.samples_written});
  comm->all_reduce(written, fsdp::comm::ReduceOp::kSum)->wait();
  CHECK(written[0].item<int64_t>() == rep.shards_total);
  CHECK(written[1].item<int64_t>() == 18);

  auto ckpt = open_feature_dataset(o.input);
  auto native = open_feature_dataset(o.output);
  REQUIRE(native->size() == 18);
  for (int64_t i = comm->rank(); i < 18; i += w) {
    const RawSample a = ckpt->read(i), b = native->read(i);
    CHECK(at::equal(a.input_ids, b.input_ids));
    CHECK(at::equal(a.hidden_state, b.hidden_state));
    CHECK(at::equal(a.aux_hidden_state, b.aux_hidden_state));
  }
  // Resume across ranks: nothing left to do.
  const auto again = convert_to_native(o, comm.get());
  CHECK(again.shards_written == 0);

  const at::Tensor local = count_loss_tokens(*native, 48, 64, nullptr);
  const at::Tensor shared = count_loss_tokens(*native, 48, 64, comm.get());
  CHECK(at::equal(local, shared));
  comm->barrier();
  if (comm->rank() == 0) fsdp::remove_tree(dir.string());
}
