// Benchmark: one draft training step (forward + backward) with the efficient TTT attention and
// tiled target head against the dense references, at several sequence lengths on the CPU.
// Prints ratios measured in the same process; never records numbers anywhere by itself.
//
//   bench_model [--seq 512,1024,2048] [--reps 2] [--threads 2] [--hidden 128] [--vocab 32768]
//               [--draft-vocab 2048] [--ttt 7] [--parts step,head,chunk]
// "step": the whole training step per variant; "head": the target head alone (tiled vs dense);
// "chunk" (not in the default parts): the step with the draft head unchunked, in chunks of 1024
// rows, and automatic (LossOptions::head_chunk_rows).
#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "core/timer.h"
#include "model/draft_model.h"
#include "model/flops.h"
#include "model/ttt_loss.h"

using namespace fsdp::model;

namespace {

// Resets the kernel's peak-RSS counter (VmHWM) so each variant's peak can be read separately.
void reset_peak_rss() {
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
}

double read_status_mib(const std::string& key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream ss(line.substr(key.size() + 1));
      double kb = 0;
      ss >> kb;
      return kb / 1024.0;
    }
  }
  return 0;
}

struct Result {
  double seconds = 1e30;
  double peak_mib = 0;
  double loss = 0;
};

struct Variant {
  const char* name;
  AttentionImpl attention;
  TargetImpl target;
};

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> seqs{512, 1024, 2048};
  int reps = 2, threads = 2;
  int64_t hidden = 128, vocab = 32768, draft_vocab = 2048, ttt = 7;
  std::string parts = "step,head";
  for (int a = 1; a + 1 < argc; a += 2) {
    std::string k = argv[a], v = argv[a + 1];
    if (k == "--seq")
      seqs = parse_list(v);
    else if (k == "--reps")
      reps = std::stoi(v);
    else if (k == "--threads")
      threads = std::stoi(v);
    else if (k == "--hidden")
      hidden = std::stoll(v);
    else if (k == "--vocab")
      vocab = std::stoll(v);
    else if (k == "--draft-vocab")
      draft_vocab = std::stoll(v);
    else if (k == "--ttt")
      ttt = std::stoll(v);
    else if (k == "--parts")
      parts = v;
    else {
      std::cerr << "unknown option " << k << "\n";
      return 2;
    }
  }
  torch::set_num_threads(threads);
  DraftConfig cfg;
  cfg.hidden_size = hidden;
  cfg.num_attention_heads = 4;
  cfg.num_key_value_heads = 2;
  cfg.intermediate_size = 2 * hidden;
  cfg.vocab_size = vocab;
  cfg.draft_vocab_size = draft_vocab;
  cfg.max_position_embeddings =
      std::max<int64_t>(4096, *std::max_element(seqs.begin(), seqs.end()));
  cfg.validate();
  const int64_t T = ttt, B = 1;
  torch::manual_seed(0);
  Eagle3Draft model(cfg);
  TargetHead head(torch::randn({vocab, hidden}), model->t2d);
  const std::vector<Variant> variants{
      {"efficient+tiled", AttentionImpl::kEfficient, TargetImpl::kTiled},
      {"dense-attn+tiled", AttentionImpl::kDense, TargetImpl::kTiled},
      {"dense+dense", AttentionImpl::kDense, TargetImpl::kDense}};
  std::printf("# draft H=%ld nh=4 nkv=2 d=%ld I=%ld V=%ld Vd=%ld T=%ld B=%ld fp32, %d threads\n",
              (long)hidden, (long)cfg.head_dim_value(), (long)cfg.intermediate_size, (long)vocab,
              (long)cfg.draft_vocab(), (long)T, (long)B, threads);
  std::printf("%6s %-18s %10s %10s %12s %10s %12s\n", "S", "variant", "step_ms", "time_x",
              "peak_MiB", "mem_x", "GFLOP/s");
  if (parts.find("step") != std::string::npos) {
    for (int64_t S : seqs) {
      at::Tensor ids = torch::randint(0, vocab, {B, S}, torch::kLong);
      at::Tensor mask = torch::ones({B, S}, torch::kLong);
      at::Tensor loss_mask = torch::ones({B, S}, torch::kLong);
      at::Tensor aux = torch::randn({B, S, 3 * hidden});
      at::Tensor target_hidden = torch::randn({B, S, hidden});
      const double flops = count_step_flops(cfg, B, S, T).total();
      std::vector<Result> results(variants.size());
      // Interleave variants across repetitions so machine noise hits them alike.
      for (int r = 0; r < reps + 1; ++r) {
        for (size_t v = 0; v < variants.size(); ++v) {
          LossOptions opt;
          opt.ttt_length = T;
          opt.attention = variants[v].attention;
          opt.target = variants[v].target;
          model->zero_grad();
          reset_peak_rss();
          const double base = read_status_mib("VmRSS");
          fsdp::Stopwatch watch;
          StepOutput out = ttt_step(*model, head, ids, mask, loss_mask, aux, target_hidden, opt);
          out.loss.backward();
          const double secs = watch.seconds();
          const double peak = read_status_mib("VmHWM") - base;
          if (r == 0) continue;  // warm-up
          results[v].seconds = std::min(results[v].seconds, secs);
          results[v].peak_mib = std::max(results[v].peak_mib, peak);
          results[v].loss = out.loss.item<double>();
        }
      }
      for (size_t v = 0; v < variants.size(); ++v) {
        std::printf("%6ld %-18s %10.1f %10.2f %12.1f %10.2f %12.2f\n", (long)S, variants[v].name,
                    results[v].seconds * 1e3, results[v].seconds / results[0].seconds,
                    results[v].peak_mib, results[v].peak_mib / std::max(results[0].peak_mib, 1.0),
                    flops / results[v].seconds / 1e9);
      }
      const double rel = std::abs(results[0].loss - results[2].loss) / std::abs(results[2].loss);
      std::printf("# S=%ld loss efficient %.6f dense %.6f (relative difference %.1e)\n", (long)S,
                  results[0].loss, results[2].loss, rel);
    }
  }
  if (parts.find("chunk") != std::string::npos) {
    std::printf("%6s %-18s %10s %10s %12s %10s %14s\n", "S", "draft head", "step_ms", "time_x",
                "peak_MiB", "mem_x", "loss");
    const std::vector<std::pair<const char*, int64_t>> heads{
        {"unchunked", -1}, {"chunks of 1024", 1024}, {"automatic", 0}};
    for (int64_t S : seqs) {
      at::Tensor ids = torch::randint(0, vocab, {B, S}, torch::kLong);
      at::Tensor mask = torch::ones({B, S}, torch::kLong);
      at::Tensor aux = torch::randn({B, S, 3 * hidden});
      at::Tensor target_hidden = torch::randn({B, S, hidden});
      std::vector<Result> res(heads.size());
      for (int r = 0; r < reps + 1; ++r) {
        for (size_t v = 0; v < heads.size(); ++v) {
          LossOptions opt;
          opt.ttt_length = T;
          opt.head_chunk_rows = heads[v].second;
          model->zero_grad();
          reset_peak_rss();
          const double base = read_status_mib("VmRSS");
          fsdp::Stopwatch watch;
          StepOutput out = ttt_step(*model, head, ids, mask, mask, aux, target_hidden, opt);
          out.loss.backward();
          const double secs = watch.seconds();
          const double peak = read_status_mib("VmHWM") - base;
          if (r == 0) continue;
          res[v].seconds = std::min(res[v].seconds, secs);
          res[v].peak_mib = std::max(res[v].peak_mib, peak);
          res[v].loss = out.loss.item<double>();
        }
      }
      for (size_t v = 0; v < heads.size(); ++v) {
        std::printf("%6ld %-18s %10.1f %10.2f %12.1f %10.2f %14.8f\n", (long)S, heads[v].first,
                    res[v].seconds * 1e3, res[v].seconds / res[0].seconds, res[v].peak_mib,
                    res[v].peak_mib / std::max(res[0].peak_mib, 1.0), res[v].loss);
      }
    }
  }
  if (parts.find("head") != std::string::npos) {
    std::printf("%6s %-18s %10s %10s %12s %10s\n", "S", "target head", "ms", "time_x", "peak_MiB",
                "mem_x");
    for (int64_t S : seqs) {
      at::Tensor target_hidden = torch::randn({B, S, hidden});
      at::Tensor loss_mask = torch::ones({B, S}, torch::kLong);
      Result res[2];
      for (int r = 0; r < reps + 1; ++r) {
        for (int v = 0; v < 2; ++v) {
          reset_peak_rss();
          const double base = read_status_mib("VmRSS");
          fsdp::Stopwatch watch;
          TargetDistribution t = head.compute(target_hidden, loss_mask, T,
                                              v == 0 ? TargetImpl::kTiled : TargetImpl::kDense);
          const double secs = watch.seconds();
          const double peak = read_status_mib("VmHWM") - base;
          if (r == 0) continue;
          res[v].seconds = std::min(res[v].seconds, secs);
          res[v].peak_mib = std::max(res[v].peak_mib, peak);
        }
      }
      for (int v = 0; v < 2; ++v) {
        std::printf("%6ld %-18s %10.1f %10.2f %12.1f %10.2f\n", (long)S, v == 0 ? "tiled" : "dense",
                    res[v].seconds * 1e3, res[v].seconds / res[0].seconds, res[v].peak_mib,
                    res[v].peak_mib / std::max(res[0].peak_mib, 1.0));
      }
    }
  }
  return 0;
}
