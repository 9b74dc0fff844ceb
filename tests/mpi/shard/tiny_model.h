// Test fixtures for the sharding engine: a tiny model (frozen embedding, an MLP, a Llama-style
// block used twice per forward, a head with a frozen projection) that announces its units with
// fsdp::run_unit, deterministic global batches, and a plain LibTorch reference trainer. Shared by
// tests/unit/shard and tests/mpi/shard; header-only so each test executable compiles it once.
#pragma once

#include <ftw.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "core/unit_hooks.h"
#include "shard/engine.h"

namespace fsdp::testing {

constexpr int64_t kVocab = 50, kHidden = 16, kFfn = 37, kSeq = 6, kHeads = 2;
constexpr int64_t kGlobalBatch = 24;  // divisible by 1, 2, 3 and 4 ranks times 2 micro-batches

struct RmsNormImpl : torch::nn::Module {
  explicit RmsNormImpl(int64_t h) { weight = register_parameter("weight", torch::ones({h})); }
  torch::Tensor forward(const torch::Tensor& x) {
    return x * torch::rsqrt(x.pow(2).mean(-1, true) + 1e-6) * weight;
  }
  torch::Tensor weight;
};
TORCH_MODULE(RmsNorm);

// Pre-norm attention (causal, no RoPE: the engine does not care) and a SwiGLU MLP.
struct BlockImpl : torch::nn::Module {
  BlockImpl() {
    auto lin = [](int64_t i, int64_t o) {
      return torch::nn::Linear(torch::nn::LinearOptions(i, o).bias(false));
    };
    norm1 = register_module("input_layernorm", RmsNorm(kHidden));
    q = register_module("q_proj", lin(kHidden, kHidden));
    k = register_module("k_proj", lin(kHidden, kHidden));
    v = register_module("v_proj", lin(kHidden, kHidden));
    o = register_module("o_proj", lin(kHidden, kHidden));
    norm2 = register_module("post_attention_layernorm", RmsNorm(kHidden));
    gate = register_module("gate_proj", lin(kHidden, kFfn));
    up = register_module("up_proj", lin(kHidden, kFfn));
    down = register_module("down_proj", lin(kFfn, kHidden));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), S = x.size(1), D = kHidden / kHeads;
    auto h = norm1(x);
    auto split = [&](const torch::Tensor& t) { return t.view({B, S, kHeads, D}).transpose(1, 2); };
    auto qs = split(q(h)), ks = split(k(h)), vs = split(v(h));
    auto scores = torch::matmul(qs, ks.transpose(-1, -2)) / std::sqrt(static_cast<double>(D));
    auto mask =
        torch::ones({S, S}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    scores = scores.masked_fill(mask, -1e9);
    auto attn = torch::matmul(torch::softmax(scores.to(torch::kFloat), -1).to(x.scalar_type()), vs);
    auto y = x + o(attn.transpose(1, 2).reshape({B, S, kHidden}));
    auto m = norm2(y);
    return y + down(torch::silu(gate(m)) * up(m));
  }
  RmsNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::Linear q{nullptr}, k{nullptr}, v{nullptr}, o{nullptr}, gate{nullptr}, up{nullptr},
      down{nullptr};
};
TORCH_MODULE(Block);

// Head: a frozen projection (its weight is needed in backward for the input gradient), a norm
// and the output layer with a bias (1-D: excluded from weight decay).
struct HeadImpl : torch::nn::Module {
  HeadImpl() {
    frozen_proj = register_module(
        "frozen_proj", torch::nn::Linear(torch::nn::LinearOptions(kHidden, kHidden).bias(false)));
    frozen_proj->weight.requires_grad_(false);
    norm = register_module("norm", RmsNorm(kHidden));
    lm_head = register_module("lm_head", torch::nn::Linear(kHidden, kVocab));
  }
  torch::Tensor forward(const torch::Tensor& x) { return lm_head(norm(x + frozen_proj(x))); }
  torch::nn::Linear frozen_proj{nullptr}, lm_head{nullptr};
  RmsNorm norm{nullptr};
};
TORCH_MODULE(Head);

struct TinyModelImpl : torch::nn::Module {
  explicit TinyModelImpl(int64_t seed, int block_uses = 2) : block_uses(block_uses) {
    torch::manual_seed(seed);
    embed = register_module("embed", torch::nn::Embedding(kVocab, kHidden));
    embed->weight.requires_grad_(false);
    mlp = register_module("mlp",
                          torch::nn::Sequential(torch::nn::Linear(kHidden, kFfn), torch::nn::GELU(),
                                                torch::nn::Linear(kFfn, kHidden)));
    block = register_module("block", Block());
    head = register_module("head", Head());
  }
  void set_unit_hooks(UnitHooks* h) { hooks = h; }
  torch::Tensor forward(const torch::Tensor& ids) {
    auto e = run_unit(hooks, "embed", [&] { return embed(ids); });
    auto h = run_unit(hooks, "mlp", [&] { return e + mlp->forward(e); });
    for (int i = 0; i < block_uses; ++i) h = run_unit(hooks, "block", [&] { return block(h); });
    return run_unit(hooks, "head", [&] { return head(h); });
  }
  int block_uses;
  UnitHooks* hooks = nullptr;
  torch::nn::Embedding embed{nullptr};
  torch::nn::Sequential mlp{nullptr};
  Block block{nullptr};
  Head head{nullptr};
};
TORCH_MODULE(TinyModel);

struct Batch {
  torch::Tensor ids, targets;  // int64 [kGlobalBatch, kSeq]
};
inline Batch global_batch(int64_t step) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  return {torch::randint(0, kVocab, {kGlobalBatch, kSeq}, gen, torch::kLong),
          torch::randint(0, kVocab, {kGlobalBatch, kSeq}, gen, torch::kLong)};
}

struct TrainSetup {
  double lr = 1e-2;
  double max_grad_norm = 0.05;  // small: clipping is active
  double weight_decay = 0.1;
  int micro_batches = 2;
  bool local_accumulation = false;  // sync only on the last micro-batch
};

// Plain single-process LibTorch training on the whole global batch (the reference).
inline std::map<std::string, torch::Tensor> train_reference(int64_t seed, int64_t first_step,
                                                            int steps, const TrainSetup& c) {
  TinyModel m(seed);
  std::vector<torch::Tensor> decay, no_decay, trainable;
  for (auto& p : m->parameters()) {
    if (!p.requires_grad()) continue;
    trainable.push_back(p);
    (p.dim() >= 2 ? decay : no_decay).push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(
                                 torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay)));
  groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(c.lr).weight_decay(0.0)));
  torch::optim::AdamW opt(std::move(groups), torch::optim::AdamWOptions(c.lr));
  for (int s = 0; s < first_step + steps; ++s) {
    Batch b = global_batch(s);
    auto logits = m->forward(b.ids);
    auto loss =
        torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}), b.targets.reshape({-1}));
    loss.backward();
    if (c.max_grad_norm > 0) torch::nn::utils::clip_grad_norm_(trainable, c.max_grad_norm);
    opt.step();
    opt.zero_grad();
  }
  std::map<std::string, torch::Tensor> out;
  for (const auto& p : m->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

inline shard::EngineOptions engine_options(shard::Strategy s, const TrainSetup& c,
                                           c10::ScalarType dtype = torch::kFloat) {
  shard::EngineOptions o;
  o.strategy = s;
  o.mixed_precision.param_dtype = dtype;
  o.adamw.weight_decay = c.weight_decay;
  return o;
}

// Trains `steps` optimizer steps from global step first_step; this rank takes rows
// [rank * n, (rank + 1) * n) of each global batch, n = kGlobalBatch / world, in c.micro_batches
// micro-batches whose losses are scaled so the data-parallel average is the global mean.
inline std::vector<shard::StepResult> train_engine(TinyModel& m, shard::ShardEngine& e, int rank,
                                                   int world, int64_t first_step, int steps,
                                                   const TrainSetup& c, double loss_scale = 1.0) {
  std::vector<shard::StepResult> results;
  const int64_t per_rank = kGlobalBatch / world, mb = per_rank / c.micro_batches;
  for (int64_t s = first_step; s < first_step + steps; ++s) {
    Batch b = global_batch(s);
    for (int a = 0; a < c.micro_batches; ++a) {
      const int64_t row = rank * per_rank + a * mb;
      e.set_sync_gradients(!c.local_accumulation || a == c.micro_batches - 1);
      auto logits = m->forward(b.ids.narrow(0, row, mb)).to(torch::kFloat);
      auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, kVocab}),
                                                       b.targets.narrow(0, row, mb).reshape({-1}));
      (loss * (static_cast<double>(mb * world) / kGlobalBatch) * loss_scale).backward();
    }
    results.push_back(e.step(c.lr, c.max_grad_norm));
  }
  return results;
}

// max |a - b| / max |b| over each tensor; the largest over all tensors of `ref`.
inline double max_rel_diff(const std::map<std::string, torch::Tensor>& got,
                           const std::map<std::string, torch::Tensor>& ref) {
  double worst = 0.0;
  for (const auto& [name, r] : ref) {
    auto it = got.find(name);
    if (it == got.end()) return INFINITY;
    const double denom = r.abs().max().item<double>();
    const double d =
        (it->second.to(torch::kFloat) - r).abs().max().item<double>() / (denom + 1e-30);
    worst = std::max(worst, d);
  }
  return worst;
}

// rm -rf without std::filesystem (the PyTorch wheel's libtorch exports clashing symbols).
inline void remove_tree(const std::string& dir) {
  nftw(
      dir.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); },
      16, FTW_DEPTH | FTW_PHYS);
}
inline bool path_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0;
}

}  // namespace fsdp::testing
