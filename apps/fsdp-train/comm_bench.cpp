// `fsdp-train comm-bench`: nccl-tests style bandwidth table per collective and message size on
// the backend that fits the device, so users can check a cluster before training.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <vector>

#include "comm/runtime.h"
#include "commands.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/timer.h"
#include "train/signals.h"

namespace fsdp::app {

namespace {

struct BenchOptions {
  bool quick = false;
  std::string min_bytes = "1K";
  std::string max_bytes = "256M";
  int iters = 0;
  int warmup = 2;
  std::string dtype = "fp32";
  std::string device = "auto";
};

int64_t parse_bytes(const std::string& s, const char* flag) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  int64_t mult = 1;
  std::string suffix = end ? end : "";
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    mult = 1 << 10;
  else if (suffix == "M" || suffix == "MiB")
    mult = 1 << 20;
  else if (suffix == "G" || suffix == "GiB")
    mult = int64_t{1} << 30;
  else
    FSDP_USAGE_CHECK(suffix.empty(), str(flag, ": cannot read size '", s, "'"),
                     "write a byte count like 4096, 64K, 16M or 1G");
  FSDP_USAGE_CHECK(v > 0, str(flag, ": size must be positive, got '", s, "'"),
                   "write a byte count like 4096, 64K, 16M or 1G");
  // At most 64G: larger than any device's memory, and the conversion cannot overflow.
  FSDP_USAGE_CHECK(v * static_cast<double>(mult) <= static_cast<double>(int64_t{1} << 36),
                   str(flag, ": size '", s, "' is above the maximum 64G"),
                   "write a byte count up to 64G, like 256M or 1G");
  return static_cast<int64_t>(v * static_cast<double>(mult));
}

std::string human(int64_t bytes) {
  char buf[32];
  if (bytes >= (1 << 20))
    std::snprintf(buf, sizeof(buf), "%lldM", (long long)(bytes >> 20));
  else if (bytes >= (1 << 10))
    std::snprintf(buf, sizeof(buf), "%lldK", (long long)(bytes >> 10));
  else
    std::snprintf(buf, sizeof(buf), "%lld", (long long)bytes);
  return buf;
}

// Bus-bandwidth factors of nccl-tests: the bytes each rank must move per payload byte.
double bus_factor(const std::string& op, int n) {
  if (n == 1) return 1.0;
  if (op == "all_reduce") return 2.0 * (n - 1) / n;
  if (op == "broadcast") return 1.0;
  return static_cast<double>(n - 1) / n;
}

// The device of this rank: a GPU with --device cuda, or auto when one is visible; else the CPU.
c10::Device pick_device(const BenchOptions& o) {
  const auto& topo = comm::topology();
  c10::Device device(c10::kCPU);
  if (o.device == "cuda" || (o.device == "auto" && comm::gpu_count() > 0)) {
    FSDP_USAGE_CHECK(comm::gpu_count() > 0, "--device cuda: no GPU visible on this host",
                     "use --device cpu, or check the driver and CUDA_VISIBLE_DEVICES");
    device = c10::Device(c10::kCUDA, topo.machine_local_rank % comm::gpu_count());
  } else {
    FSDP_USAGE_CHECK(o.device == "cpu" || o.device == "auto",
                     "--device: '" + o.device + "' is not one of auto, cpu, cuda",
                     "pick one of auto, cpu, cuda");
  }
  return device;
}

// One table section: the collective it runs, its label and the communicator it runs on.
struct Variant {
  std::string op;
  std::string label;
  std::shared_ptr<comm::Communicator> comm;
};

// The sections in table order; the first one's communicator is the device's default.
std::vector<Variant> make_variants(const c10::Device& device) {
  auto comm_default = comm::make_communicator(comm::Group::kWorld, device);
  std::vector<Variant> variants = {{"all_gather", "all_gather", comm_default},
                                   {"reduce_scatter", "reduce_scatter", comm_default},
                                   {"all_reduce", "all_reduce", comm_default},
                                   {"broadcast", "broadcast", comm_default}};
  if (comm_default->device_type() == c10::kCPU) {
    // Both reduce-scatter algorithms of the CPU (MPI) backend, so the default threshold can be
    // checked per machine.
    comm::BackendOptions block, viaar;
    block.mpi_rs_allreduce_min_bytes = int64_t{1} << 62;
    viaar.mpi_rs_allreduce_min_bytes = 0;
    variants[1] = {"reduce_scatter", "reduce_scatter[block]",
                   comm::make_communicator(comm::Group::kWorld, device, block)};
    variants.insert(variants.begin() + 2,
                    {"reduce_scatter", "reduce_scatter[allreduce]",
                     comm::make_communicator(comm::Group::kWorld, device, viaar)});
  }
  return variants;
}

// Seconds per call of v's collective on `count` elements: the slowest rank's mean over iters
// timed calls after `warmup` untimed ones.
double time_collective(const Variant& v, int64_t count, int iters, int warmup,
                       const at::TensorOptions& opts, const c10::Device& device) {
  const int n = comm::topology().world_size;
  at::Tensor full = at::ones({count}, opts);
  at::Tensor shard = at::ones({count / n}, opts);
  auto once = [&]() {
    if (v.op == "all_gather")
      v.comm->all_gather(shard, full)->wait();
    else if (v.op == "reduce_scatter")
      v.comm->reduce_scatter(full, shard, comm::ReduceOp::kSum)->wait();
    else if (v.op == "all_reduce")
      v.comm->all_reduce(full, comm::ReduceOp::kSum)->wait();
    else
      v.comm->broadcast(full, 0)->wait();
  };
  for (int i = 0; i < warmup; ++i) once();
  v.comm->synchronize();
  v.comm->barrier();
  Stopwatch w;
  for (int i = 0; i < iters; ++i) once();
  v.comm->synchronize();
  at::Tensor t = at::full({1}, w.seconds() / iters, at::TensorOptions().dtype(at::kDouble));
  if (!device.is_cpu()) t = t.to(device);
  v.comm->all_reduce(t, comm::ReduceOp::kMax)->wait();
  return t.cpu().item<double>();
}

int run_bench(const BenchOptions& o) {
  const auto& topo = comm::topology();
  const c10::Device device = pick_device(o);
  const auto dtype = parse_dtype(o.dtype);
  int64_t lo = parse_bytes(o.quick ? "1K" : o.min_bytes, "--min-bytes");
  int64_t hi = parse_bytes(o.quick ? "1M" : o.max_bytes, "--max-bytes");
  FSDP_USAGE_CHECK(lo <= hi, "--min-bytes is larger than --max-bytes",
                   "swap them, or lower --min-bytes");
  const int64_t esize = static_cast<int64_t>(dtype_size(dtype));
  const std::vector<Variant> variants = make_variants(device);
  const int n = topo.world_size;
  if (topo.world_rank == 0) {
    std::printf("# fsdp-train comm-bench: %d ranks, %d node(s), backend %s, device %s, dtype %s\n",
                n, topo.num_nodes, variants[0].comm->backend().c_str(), device.str().c_str(),
                dtype_name(dtype).c_str());
    std::printf("%-26s %10s %12s %10s %12s %12s %12s\n", "collective", "size", "count", "iters",
                "time(us)", "algbw(GB/s)", "busbw(GB/s)");
  }
  auto opts = at::TensorOptions().dtype(dtype).device(device);
  // A stop request (SIGUSR1: the launcher's Ctrl-C, Slurm's --signal) ends the run after the
  // current size; the ranks agree on it on the CPU, since a signal may reach only some of them.
  auto control = comm::make_communicator(comm::Group::kWorld, c10::Device(c10::kCPU));
  for (const auto& v : variants) {
    for (int64_t bytes = lo; bytes <= hi; bytes *= (o.quick ? 4 : 2)) {
      if (comm::any_rank(*control, train::stop_requested())) {
        if (topo.world_rank == 0) std::printf("# stopped by a stop request\n");
        return 0;
      }
      // Sizes are the payload as nccl-tests counts it; round the count to a multiple of ranks.
      int64_t count = std::max<int64_t>(bytes / esize / n, 1) * n;
      const int64_t payload = count * esize;
      const int iters = o.iters > 0 ? o.iters
                                    : static_cast<int>(std::clamp<int64_t>(
                                          (int64_t{256} << 20) / payload, 3, o.quick ? 10 : 50));
      const double secs = time_collective(v, count, iters, o.warmup, opts, device);
      if (topo.world_rank == 0) {
        const double algbw = static_cast<double>(payload) / secs / 1e9;
        std::printf("%-26s %10s %12lld %10d %12.1f %12.3f %12.3f\n", v.label.c_str(),
                    human(payload).c_str(), (long long)count, iters, secs * 1e6, algbw,
                    algbw * bus_factor(v.op, n));
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

void add_comm_bench(CLI::App& root, Action* action) {
  auto opts = std::make_shared<BenchOptions>();
  CLI::App* sub = root.add_subcommand(
      "comm-bench", "measure collective bandwidth per size (like nccl-tests) on this job's ranks");
  sub->add_flag("--quick", opts->quick, "short run: 1K..1M in steps of 4");
  sub->add_option("--min-bytes", opts->min_bytes, "smallest message (default 1K)");
  sub->add_option("--max-bytes", opts->max_bytes, "largest message (default 256M)");
  sub->add_option("--iters", opts->iters, "timed iterations per size (default: auto)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--warmup", opts->warmup, "untimed iterations per size (default 2)")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--dtype", opts->dtype, "element type: fp32 or bf16 (default fp32)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp64"}));
  sub->add_option("--device", opts->device, "auto (GPU when present), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  sub->callback([action, opts]() {
    action->run = [opts]() { return run_bench(*opts); };
    action->needs_mpi = true;
  });
}

}  // namespace fsdp::app
