// Sharding-engine benchmark: a ~50M-parameter Llama-style model (frozen embedding, decoder
// blocks, head) trained with each strategy and with plain LibTorch in the same process; rank 0
// prints one markdown row per configuration with ratios against plain LibTorch. CPU (MPI) only.
// It must never print numbers it did not measure in this run.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "comm/runtime.h"
#include "core/timer.h"
#include "shard/engine.h"

using namespace fsdp;

namespace {

struct Dims {
  int64_t vocab = 8192, hidden = 1024, ffn = 2048, layers = 4, heads = 8, seq = 64, batch = 1;
};

struct LayerImpl : torch::nn::Module {
  explicit LayerImpl(const Dims& d) : d(d) {
    auto lin = [](int64_t i, int64_t o) {
      return torch::nn::Linear(torch::nn::LinearOptions(i, o).bias(false));
    };
    qkv = register_module("qkv", lin(d.hidden, 3 * d.hidden));
    o = register_module("o", lin(d.hidden, d.hidden));
    gate_up = register_module("gate_up", lin(d.hidden, 2 * d.ffn));
    down = register_module("down", lin(d.ffn, d.hidden));
    n1 = register_parameter("norm1", torch::ones({d.hidden}));
    n2 = register_parameter("norm2", torch::ones({d.hidden}));
  }
  static torch::Tensor rms(const torch::Tensor& x, const torch::Tensor& w) {
    return x * torch::rsqrt(x.pow(2).mean(-1, true) + 1e-6) * w;
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), S = x.size(1), D = d.hidden / d.heads;
    auto parts = qkv(rms(x, n1)).view({B, S, 3, d.heads, D}).permute({2, 0, 3, 1, 4});
    auto a = at::scaled_dot_product_attention(parts[0], parts[1], parts[2], {}, 0.0, true);
    auto y = x + o(a.transpose(1, 2).reshape({B, S, d.hidden}));
    auto gu = gate_up(rms(y, n2)).chunk(2, -1);
    return y + down(torch::silu(gu[0]) * gu[1]);
  }
  Dims d;
  torch::nn::Linear qkv{nullptr}, o{nullptr}, gate_up{nullptr}, down{nullptr};
  torch::Tensor n1, n2;
};
TORCH_MODULE(Layer);

struct ModelImpl : torch::nn::Module {
  explicit ModelImpl(const Dims& d) {
    torch::manual_seed(0);
    embed = register_module("embed", torch::nn::Embedding(d.vocab, d.hidden));
    embed->weight.requires_grad_(false);
    for (int64_t i = 0; i < d.layers; ++i)
      layers.push_back(register_module("layer" + std::to_string(i), Layer(d)));
    head = register_module(
        "head", torch::nn::Linear(torch::nn::LinearOptions(d.hidden, d.vocab).bias(false)));
  }
  void set_unit_hooks(UnitHooks* h) { hooks = h; }
  torch::Tensor forward(const torch::Tensor& ids) {
    auto h = run_unit(hooks, "embed", [&] { return embed(ids); });
    for (size_t i = 0; i < layers.size(); ++i)
      h = run_unit(hooks, "layer" + std::to_string(i), [&] { return layers[i](h); });
    return run_unit(hooks, "head", [&] { return head(h); });
  }
  UnitHooks* hooks = nullptr;
  torch::nn::Embedding embed{nullptr};
  std::vector<Layer> layers;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Model);

struct Result {
  double step_s = 0;       // median step time
  double comm_s = 0;       // mean communicator busy seconds per step
  int64_t peak_bytes = 0;  // persistent + peak gathered + peak gradient buffers
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

torch::Tensor loss_of(Model& m, const Dims& d, int64_t step, int rank) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(step * 1000 + rank);
  auto ids = torch::randint(0, d.vocab, {d.batch, d.seq}, gen, torch::kLong);
  auto tgt = torch::randint(0, d.vocab, {d.batch, d.seq}, gen, torch::kLong);
  return torch::nn::functional::cross_entropy(
      m->forward(ids).reshape({-1, d.vocab}).to(torch::kFloat), tgt.reshape({-1}));
}

Result run_plain(const Dims& d, int steps, int warmup) {
  Model m(d);
  std::vector<torch::Tensor> params;
  for (auto& p : m->parameters())
    if (p.requires_grad()) params.push_back(p);
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-4));
  std::vector<double> times;
  int64_t trainable = 0, frozen = 0;
  for (auto& p : m->parameters()) (p.requires_grad() ? trainable : frozen) += p.numel();
  for (int s = 0; s < warmup + steps; ++s) {
    Stopwatch sw;
    loss_of(m, d, s, comm::topology().world_rank).backward();
    torch::nn::utils::clip_grad_norm_(params, 0.5);
    opt.step();
    opt.zero_grad();
    if (s >= warmup) times.push_back(sw.seconds());
  }
  return {median(times), 0.0, trainable * 16 + frozen * 4};
}

Result run_engine(const Dims& d, shard::Strategy s, int steps, int warmup, c10::ScalarType dtype) {
  Model m(d);
  shard::EngineOptions o;
  o.strategy = s;
  o.mixed_precision.param_dtype = dtype;
  shard::CommGroups g = shard::make_comm_groups(s, c10::Device(c10::kCPU));
  shard::ShardEngine e(*m, g, o);
  m->set_unit_hooks(&e);
  std::vector<double> times;
  double comm_s = 0;
  for (int st = 0; st < warmup + steps; ++st) {
    for (auto* c : {g.shard.get(), g.replicate.get()})
      if (c) c->stats().reset();
    Stopwatch sw;
    loss_of(m, d, st, comm::topology().world_rank).backward();
    e.step(1e-4, 0.5);
    if (st < warmup) continue;
    times.push_back(sw.seconds());
    for (auto* c : {g.shard.get(), g.replicate.get()})
      if (c) comm_s += c->stats().total_seconds();
  }
  const auto mem = e.memory();
  return {median(times), comm_s / steps,
          mem.persistent_bytes() + mem.peak_gathered_param_bytes + mem.peak_grad_buffer_bytes};
}

}  // namespace

int main(int argc, char** argv) {
  comm::init(&argc, &argv);
  const auto& t = comm::topology();
  int steps = 3, warmup = 1;
  std::string dtype_name = "fp32";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--steps")
      steps = std::stoi(argv[i + 1]);
    else if (k == "--warmup")
      warmup = std::stoi(argv[i + 1]);
    else if (k == "--dtype")
      dtype_name = argv[i + 1];
  }
  const c10::ScalarType dtype = dtype_name == "bf16" ? torch::kBFloat16 : torch::kFloat;
  torch::set_num_threads(1);
  Dims d;
  int64_t trainable = 0, total = 0;
  {
    Model probe(d);
    for (auto& p : probe->parameters()) {
      total += p.numel();
      if (p.requires_grad()) trainable += p.numel();
    }
  }
  const Result plain = run_plain(d, steps, warmup);
  auto plain_all = torch::tensor({plain.step_s}, torch::kDouble);
  auto comm_world = comm::make_communicator(comm::Group::kWorld, c10::Device(c10::kCPU));
  comm_world->all_reduce(plain_all, comm::ReduceOp::kMax)->wait();
  if (t.world_rank == 0) {
    std::printf(
        "model: %.1fM parameters (%.1fM trainable), %lld tokens per rank per step, "
        "compute %s, %d ranks, %d steps after %d warmup\n",
        total / 1e6, trainable / 1e6, static_cast<long long>(d.batch * d.seq), dtype_name.c_str(),
        t.world_size, steps, warmup);
    std::printf(
        "| ranks | strategy | step s | vs plain | peak MiB/rank | vs plain | comm share |\n");
    std::printf("|---|---|---|---|---|---|---|\n");
    std::printf("| %d | plain LibTorch | %.3f | 1.00 | %.0f | 1.00 | - |\n", t.world_size,
                plain_all.item<double>(), plain.peak_bytes / 1048576.0);
  }
  for (shard::Strategy s : {shard::Strategy::kFullShard, shard::Strategy::kShardGradOp,
                            shard::Strategy::kNoShard, shard::Strategy::kHybridShard}) {
    if (s == shard::Strategy::kHybridShard && t.num_nodes == 1 && t.world_size > 1) continue;
    const Result r = run_engine(d, s, steps, warmup, dtype);
    // The slowest rank sets the step time; memory is the largest rank's.
    auto v = torch::tensor({r.step_s, r.comm_s, static_cast<double>(r.peak_bytes)}, torch::kDouble);
    comm_world->all_reduce(v, comm::ReduceOp::kMax)->wait();
    if (t.world_rank == 0) {
      const double step_s = v[0].item<double>(), comm_s = v[1].item<double>();
      const double peak = v[2].item<double>();
      std::printf("| %d | %s | %.3f | %.2f | %.0f | %.2f | %.0f%% |\n", t.world_size,
                  shard::strategy_name(s), step_s, step_s / plain_all.item<double>(),
                  peak / 1048576.0, peak / plain.peak_bytes, 100.0 * comm_s / step_s);
    }
  }
  comm::finalize();
  return 0;
}
