// Synthetic target checkpoint and SpecForge-format features with learnable structure
// (toy_data.h; construction documented in docs/data.md). Deterministic from the seed.
#include "data/toy_data.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/fs_util.h"
#include "data/torch_save.h"

namespace fsdp::data {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

void ToyDataOptions::validate() const {
  FSDP_USAGE_CHECK(!out_dir.empty(), "gen-toy-data: --out is required",
                   "pass --out <directory to write the toy data into>");
  FSDP_USAGE_CHECK(num_samples >= 1, "--num-samples must be >= 1",
                   "set --num-samples to 1 or more");
  FSDP_USAGE_CHECK(min_len >= 2 && max_len >= min_len,
                   str("--min-len/--max-len: need 2 <= min <= max, got ", min_len, "/", max_len),
                   "set --min-len to 2 or more and --max-len to at least --min-len");
  for (const int64_t L : lengths) {
    FSDP_USAGE_CHECK(L >= 2 && L <= (int64_t{1} << 20),
                     str("--lengths: every length must be in [2, 1048576], got ", L),
                     "give sample lengths in tokens, e.g. --lengths 512,1024,2048");
  }
  FSDP_USAGE_CHECK(hidden_size >= 8 && hidden_size % 8 == 0,
                   str("--hidden-size must be a multiple of 8 and >= 8, got ", hidden_size),
                   "set --hidden-size to a multiple of 8, e.g. 64");
  FSDP_USAGE_CHECK(vocab_size >= 16, str("--vocab-size must be >= 16, got ", vocab_size),
                   "set --vocab-size to 16 or more");
  FSDP_USAGE_CHECK(draft_vocab_size >= 1 && draft_vocab_size <= vocab_size,
                   str("--draft-vocab-size must be in [1, vocab size], got ", draft_vocab_size),
                   "set --draft-vocab-size between 1 and --vocab-size");
  FSDP_USAGE_CHECK(successors >= 1 && successors <= 64, "--successors must be in [1, 64]",
                   "set --successors to a value from 1 to 64");
  FSDP_USAGE_CHECK(samples_per_dir >= 1, "--samples-per-dir must be >= 1",
                   "set --samples-per-dir to 1 or more");
}

namespace {

void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::trunc);
  FSDP_CHECK(out.good(), p.string() + ": cannot create", "check that --out is writable");
  out << text;
  FSDP_CHECK(out.good(), p.string() + ": write failed", "check free disk space");
}

// Each row scaled to RMS 1, like the output of an RMSNorm with unit weight.
at::Tensor rms_normalize(const at::Tensor& x) {
  return x * at::rsqrt(x.pow(2).mean(-1, true) + 1e-6);
}

struct Chain {
  at::Tensor succ;            // int64 [V,K] successor ids
  std::vector<double> probs;  // [K] probability of each successor slot
  std::vector<double> start;  // [V] start-token weights (Zipf over a random popularity order)
};

Chain make_chain(const ToyDataOptions& o, at::Generator& gen) {
  const int64_t v = o.vocab_size, k = o.successors;
  // Zipf-like popularity over a random order of ids, so frequent ids are scattered over the
  // vocabulary (the vocab mapping then has real work to do).
  at::Tensor rank_of = at::randperm(v, gen, at::TensorOptions().dtype(at::kLong));
  at::Tensor weight = 1.0 / (rank_of.to(at::kDouble) + 10.0);
  Chain c;
  c.succ = at::multinomial(weight, v * k, /*replacement=*/true, gen).view({v, k});
  double z = 0;
  for (int64_t i = 0; i < k; ++i) z += std::pow(0.5, static_cast<double>(i));
  for (int64_t i = 0; i < k; ++i) c.probs.push_back(std::pow(0.5, static_cast<double>(i)) / z);
  const double* w = weight.data_ptr<double>();
  c.start.assign(w, w + v);
  return c;
}

// The hidden tensors behind the toy target: its head and embedding, and the random maps that
// turn token directions into hidden states and auxiliary layers.
struct ToyWeights {
  at::Tensor lm_head, embed;
  at::Tensor q;  // [V,H] per token: the direction whose logits peak at its likely successors
  at::Tensor r_ctx, a_low, a_mid, a_mix, a_high;  // [H,H] context and aux-layer maps
};

// Draws from gen in a fixed order: the toy data (and the golden loss test) depend on it.
ToyWeights make_weights(const ToyDataOptions& o, const Chain& chain, at::Generator& gen) {
  const int64_t v = o.vocab_size, h = o.hidden_size, k = o.successors;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  ToyWeights w;
  // Target head: unit-norm random rows; embedding: random rows of RMS 1.
  w.lm_head = at::randn({v, h}, gen, f32);
  w.lm_head = w.lm_head / w.lm_head.norm(2, 1, true);
  w.embed = at::randn({v, h}, gen, f32);
  // q[v] = sum_k p_k lm_head[succ[v,k]]: the direction whose logits peak at v's likely successors.
  // One successor at a time: a [v, k, h] gather is 9 GB for a gpt-oss-sized vocabulary.
  w.q = at::zeros({v, h}, f32);
  for (int64_t j = 0; j < k; ++j) {
    w.q.add_(w.lm_head.index_select(0, chain.succ.select(1, j).contiguous()),
             chain.probs[static_cast<size_t>(j)]);
  }
  const double s = 1.0 / std::sqrt(static_cast<double>(h));
  w.r_ctx = at::randn({h, h}, gen, f32) * s;
  w.a_low = at::randn({h, h}, gen, f32) * s;
  w.a_mid = at::randn({h, h}, gen, f32) * s;
  w.a_mix = at::randn({h, h}, gen, f32) * s;
  w.a_high = at::randn({h, h}, gen, f32) * s;
  return w;
}

at::Tensor to_bf16(const at::Tensor& t) {
  return t.to(at::kBFloat16);
}

// Target checkpoint: two shards plus index; only embedding and lm_head matter, the layer
// tensors exist so readers must pick the right ones out of a multi-file checkpoint.
void write_target_checkpoint(const fs::path& dir, const ToyWeights& w, int64_t h,
                             at::Generator& gen) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const double s = 1.0 / std::sqrt(static_cast<double>(h));
  const auto& bf = to_bf16;
  checkpoint::NamedTensors shard1 = {
      {"model.embed_tokens.weight", bf(w.embed)},
      {"model.layers.0.input_layernorm.weight", bf(at::ones({h}, f32))},
      {"model.layers.0.self_attn.q_proj.weight", bf(at::randn({h, h}, gen, f32) * s)}};
  checkpoint::NamedTensors shard2 = {
      {"model.layers.1.input_layernorm.weight", bf(at::ones({h}, f32))},
      {"model.layers.1.self_attn.q_proj.weight", bf(at::randn({h, h}, gen, f32) * s)},
      {"model.norm.weight", bf(at::ones({h}, f32))},
      {"lm_head.weight", bf(w.lm_head)}};
  const char* names[2] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
  json weight_map = json::object();
  uint64_t total = 0;
  for (int i = 0; i < 2; ++i) {
    const auto& tensors = i == 0 ? shard1 : shard2;
    checkpoint::write_safetensors((dir / names[i]).string(), tensors, {{"format", "pt"}});
    for (const auto& [name, t] : tensors) {
      weight_map[name] = names[i];
      total += t.numel() * t.element_size();
    }
  }
  write_text(
      dir / "model.safetensors.index.json",
      json{{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}}.dump(2) + "\n");
}

// The target's config.json (a two-layer Llama) and the matching one-layer EAGLE3 draft config.
void write_model_configs(const ToyDataOptions& o, const ToyDataPaths& paths) {
  const int64_t v = o.vocab_size, h = o.hidden_size;
  const int64_t heads = std::max<int64_t>(1, h / 32);
  const int64_t longest =
      o.lengths.empty() ? o.max_len : *std::max_element(o.lengths.begin(), o.lengths.end());
  const int64_t max_pos = std::max<int64_t>(2048, longest + 64);
  write_text(fs::path(paths.target_model_dir) / "config.json",
             json{{"architectures", {"LlamaForCausalLM"}},
                  {"model_type", "llama"},
                  {"hidden_size", h},
                  {"intermediate_size", 2 * h},
                  {"num_attention_heads", heads},
                  {"num_key_value_heads", heads},
                  {"num_hidden_layers", 2},
                  {"vocab_size", v},
                  {"rms_norm_eps", 1e-5},
                  {"max_position_embeddings", max_pos},
                  {"tie_word_embeddings", false},
                  {"torch_dtype", "bfloat16"},
                  {"fsdp_train_toy", true}}
                     .dump(2) +
                 "\n");
  write_text(paths.draft_config, json{{"architectures", {"LlamaForCausalLMEagle3"}},
                                      {"model_type", "llama"},
                                      {"hidden_size", h},
                                      {"intermediate_size", 2 * h},
                                      {"num_attention_heads", heads},
                                      {"num_key_value_heads", std::max<int64_t>(1, heads / 2)},
                                      {"head_dim", h / heads},
                                      {"num_hidden_layers", 1},
                                      {"vocab_size", v},
                                      {"draft_vocab_size", o.draft_vocab_size},
                                      {"rms_norm_eps", 1e-5},
                                      {"max_position_embeddings", max_pos},
                                      {"rope_theta", 10000.0},
                                      {"rope_scaling", nullptr},
                                      {"hidden_act", "silu"},
                                      {"pad_token_id", 0},
                                      {"tie_word_embeddings", false},
                                      {"torch_dtype", "bfloat16"}}
                                         .dump(2) +
                                     "\n");
}

// One sample's features from its tokens. hidden_state[t] is a normalised mix of q[tok_t] (which
// makes the target head predict tok_{t+1}), a random projection of q[tok_{t-1}] (context) and
// noise; aux layers are small random networks of the embedding and of hidden_state.
c10::Dict<std::string, at::Tensor> make_features(const at::Tensor& ids, const at::Tensor& mask,
                                                 const ToyWeights& w, at::Generator& gen) {
  const int64_t n = ids.size(0), h = w.q.size(1);
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  at::Tensor qt = w.q.index_select(0, ids);
  at::Tensor prev = at::cat({at::zeros({1, h}, f32), qt.narrow(0, 0, n - 1)});
  at::Tensor hidden =
      rms_normalize(qt * std::sqrt(static_cast<double>(h)) +
                    0.3 * at::tanh(at::matmul(prev, w.r_ctx)) * std::sqrt(static_cast<double>(h)) +
                    0.2 * at::randn({n, h}, gen, f32));
  at::Tensor low = rms_normalize(at::tanh(at::matmul(w.embed.index_select(0, ids), w.a_low)));
  at::Tensor mid = rms_normalize(at::tanh(at::matmul(low, w.a_mid) + at::matmul(hidden, w.a_mix)));
  at::Tensor high = rms_normalize(hidden + 0.5 * at::tanh(at::matmul(mid, w.a_high)));

  c10::Dict<std::string, at::Tensor> d;
  d.insert("input_ids", ids);
  d.insert("loss_mask", mask);
  d.insert("hidden_state", to_bf16(hidden).unsqueeze(0));
  d.insert("aux_hidden_state", to_bf16(at::cat({low, mid, high}, 1)).unsqueeze(0));
  return d;
}

// Writes one SpecForge .ckpt into its rows_<a>-<b> folder; returns its size in bytes.
uint64_t write_sample_file(const fs::path& hidden_states_dir, int64_t i, int64_t per_dir,
                           const c10::Dict<std::string, at::Tensor>& d) {
  const int64_t a = (i / per_dir) * per_dir;
  const fs::path dir = hidden_states_dir / str("rows_", a, "-", a + per_dir);
  make_dirs(dir.string(), "check --out");
  const std::vector<char> bytes = torch_save_bytes(d);
  std::ofstream out(dir / str("data_", i, ".ckpt"), std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  FSDP_CHECK(out.good(), (dir / str("data_", i, ".ckpt")).string() + ": write failed",
             "check free disk space");
  return bytes.size();
}

// The samples: tokens follow the chain, the first third at most is prompt (loss_mask 0).
// Draws lengths, tokens and prompt lengths from rng and noise from gen, sample by sample.
uint64_t write_features(const ToyDataOptions& o, const Chain& chain, const ToyWeights& w,
                        at::Generator& gen, std::mt19937_64& rng, const fs::path& dir) {
  const int64_t k = o.successors;
  std::discrete_distribution<int64_t> start(chain.start.begin(), chain.start.end());
  std::discrete_distribution<int64_t> pick(chain.probs.begin(), chain.probs.end());
  std::uniform_int_distribution<int64_t> len_dist(o.min_len, o.max_len);
  const int64_t* succ = chain.succ.data_ptr<int64_t>();
  uint64_t bytes = 0;
  for (int64_t i = 0; i < o.num_samples; ++i) {
    const int64_t n =
        o.lengths.empty() ? len_dist(rng) : o.lengths[static_cast<size_t>(i) % o.lengths.size()];
    at::Tensor ids = at::empty({n}, at::kLong);
    int64_t* p = ids.data_ptr<int64_t>();
    p[0] = start(rng);
    for (int64_t t = 1; t < n; ++t) p[t] = succ[p[t - 1] * k + pick(rng)];
    std::uniform_int_distribution<int64_t> prompt_dist(1, std::max<int64_t>(1, n / 3));
    at::Tensor mask = at::ones({n}, at::kLong);
    mask.narrow(0, 0, prompt_dist(rng)).zero_();
    bytes += write_sample_file(dir, i, o.samples_per_dir, make_features(ids, mask, w, gen));
  }
  return bytes;
}

// The best possible next-token accuracy of a model that knows the chain: the top successor's
// probability (duplicate successors add up), averaged over tokens weighted by popularity.
double chain_top1_accuracy(const Chain& chain, int64_t v, int64_t k) {
  const int64_t* succ = chain.succ.data_ptr<int64_t>();
  double best = 0;
  for (int64_t t = 0; t < v; ++t) {
    std::map<int64_t, double> m;
    for (int64_t j = 0; j < k; ++j) m[succ[t * k + j]] += chain.probs[j];
    double top = 0;
    for (const auto& [id, pr] : m) top = std::max(top, pr);
    best += top / static_cast<double>(v);
  }
  return best;
}

}  // namespace

ToyDataPaths generate_toy_data(const ToyDataOptions& o) {
  o.validate();
  const int64_t v = o.vocab_size, h = o.hidden_size, k = o.successors;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  std::mt19937_64 rng(o.seed ^ 0x9e3779b97f4a7c15ull);
  const Chain chain = make_chain(o, gen);
  const ToyWeights weights = make_weights(o, chain, gen);

  ToyDataPaths paths;
  const fs::path root(o.out_dir);
  paths.target_model_dir = (root / "target").string();
  paths.draft_config = (root / "draft_config.json").string();
  paths.hidden_states_dir = (root / "hidden_states").string();
  make_dirs(paths.target_model_dir, "check --out (a directory that can be created and written)");
  make_dirs(paths.hidden_states_dir, "check --out");

  write_target_checkpoint(paths.target_model_dir, weights, h, gen);
  write_model_configs(o, paths);
  paths.feature_bytes += write_features(o, chain, weights, gen, rng, paths.hidden_states_dir);

  const double best = chain_top1_accuracy(chain, v, k);
  write_text(root / "toy_data.json", json{{"num_samples", o.num_samples},
                                          {"min_len", o.min_len},
                                          {"max_len", o.max_len},
                                          {"lengths", o.lengths},
                                          {"hidden_size", h},
                                          {"vocab_size", v},
                                          {"draft_vocab_size", o.draft_vocab_size},
                                          {"successors", k},
                                          {"seed", o.seed},
                                          {"chain_top1_accuracy", best},
                                          {"target_model_dir", paths.target_model_dir},
                                          {"draft_config", paths.draft_config},
                                          {"hidden_states_dir", paths.hidden_states_dir}}
                                             .dump(2) +
                                         "\n");
  return paths;
}

}  // namespace fsdp::data
