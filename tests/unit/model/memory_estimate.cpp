// The training memory estimate (model/memory_estimate.h): how each run setting moves it, that
// its parameter count is the model's, and the start-up refusal with the numbers and what to
// change. Its agreement with measured peaks is recorded in docs/troubleshooting.md.
#include <catch2/catch.hpp>

#include "core/error.h"
#include "model/draft_config.h"
#include "model/memory_estimate.h"
#include "support/test_paths.h"

using namespace fsdp::model;

namespace {

DraftConfig shipped(const std::string& name) {
  return load_draft_config(std::string(FSDP_SOURCE_DIR) + "/configs/models/" + name);
}

std::string refusal(const DraftConfig& c, const MemoryPlan& p, uint64_t memory) {
  try {
    check_training_memory(c, p, memory, "the test device");
  } catch (const fsdp::UsageError& e) {
    REQUIRE_FALSE(e.hint().empty());
    return e.message() + " | " + e.hint();
  }
  return "";
}

}  // namespace

TEST_CASE("the trainable count is count_parameters' for every shipped config", "[model]") {
  for (const char* name : {"llama3-8B-eagle3.json", "tiny-eagle3.json"}) {
    INFO(name);
    const DraftConfig c = shipped(name);
    CHECK(trainable_parameter_count(c) == static_cast<long double>(count_parameters(c).trainable));
  }
}

TEST_CASE("activations scale with the micro-batch's tokens and the unroll", "[model]") {
  const DraftConfig c = shipped("llama3-8B-eagle3.json");
  MemoryPlan p;
  p.max_length = 1024;
  const MemoryEstimate base = estimate_training_memory(c, p);
  MemoryPlan twice = p;
  twice.max_length = 2048;
  CHECK(estimate_training_memory(c, twice).activations == Approx(2 * base.activations));
  twice = p;
  twice.micro_batch = 2;
  CHECK(estimate_training_memory(c, twice).activations == Approx(2 * base.activations));
  // Each extra step adds one step's saved tensors per token, nothing else.
  MemoryPlan longer = p;
  longer.ttt_length = p.ttt_length + 1;
  CHECK(estimate_training_memory(c, longer).activations - base.activations ==
        Approx(1024 * step_activation_bytes_per_token(c, p)));
  // Parameters do not depend on the batch.
  CHECK(estimate_training_memory(c, twice).state == base.state);
  CHECK(estimate_training_memory(c, twice).frozen == base.frozen);
}

TEST_CASE("checkpointing, sharding and offload lower what they should", "[model]") {
  const DraftConfig c = shipped("llama3-8B-eagle3.json");
  MemoryPlan p;
  const MemoryEstimate base = estimate_training_memory(c, p);
  MemoryPlan ckpt = p;
  ckpt.activation_checkpointing = true;
  CHECK(estimate_training_memory(c, ckpt).activations < 0.5 * base.activations);
  CHECK(step_activation_bytes_per_token(c, ckpt) < step_activation_bytes_per_token(c, p));
  MemoryPlan sharded = p;
  sharded.shard_ranks = 8;
  CHECK(estimate_training_memory(c, sharded).state == Approx(base.state / 8));
  CHECK(base.state == Approx(16 * trainable_parameter_count(c)));
  MemoryPlan offload = p;
  offload.state_on_host = true;
  CHECK(estimate_training_memory(c, offload).state == 0);
  MemoryPlan whole = p;
  whole.whole_compute_copy = true;
  CHECK(estimate_training_memory(c, whole).compute > base.compute);
  MemoryPlan fp32 = p;
  fp32.compute_bytes = 4;
  CHECK(estimate_training_memory(c, fp32).activations > base.activations);
}

TEST_CASE("the chunked head keeps one chunk of logits, not the steps'", "[model]") {
  const DraftConfig c = shipped("llama3-8B-eagle3.json");
  MemoryPlan p;
  p.max_length = 32768;
  p.head_chunk_rows = -1;
  MemoryPlan chunked = p;
  chunked.head_chunk_rows = 0;  // automatic: 32768 rows is past four chunks of 1048
  REQUIRE(head_chunk_rows(0, 32768, c.draft_vocab()) == 1048);
  const long double H = c.hidden_size, Vd = c.draft_vocab();
  // Per token and step: the fp32 log_softmax and target p (8 Vd) and the norm's fp32 copy go;
  // the bf16 input rows stay.
  CHECK(step_activation_bytes_per_token(c, p) - step_activation_bytes_per_token(c, chunked) ==
        Approx(8 * Vd + 4 * H));
  const long double saved =
      estimate_training_memory(c, p).activations - estimate_training_memory(c, chunked).activations;
  CHECK(saved == Approx(32768.0L * (7 * (8 * Vd + 4 * H) + 4 * Vd) - 4 * Vd * 1048));
  // Short samples keep the unchunked head unless asked.
  MemoryPlan short_run;
  CHECK(step_activation_bytes_per_token(c, short_run) == step_activation_bytes_per_token(c, [&] {
          MemoryPlan off = short_run;
          off.head_chunk_rows = -1;
          return off;
        }()));
  MemoryPlan forced = short_run;
  forced.head_chunk_rows = 512;
  CHECK(step_activation_bytes_per_token(c, forced) < step_activation_bytes_per_token(c, short_run));
}

TEST_CASE("a run that cannot fit is refused with both figures and what to change", "[model]") {
  const DraftConfig c = shipped("llama3-8B-eagle3.json");
  MemoryPlan p;
  const long double need = estimate_training_memory(c, p).total();
  const uint64_t gib = uint64_t{1} << 30;
  const std::string e = refusal(c, p, 16 * gib);
  REQUIRE(need > 16.0L * gib);
  CHECK_THAT(e, Catch::Contains("hidden_size 4096"));
  CHECK_THAT(e, Catch::Contains("--max-length 2048"));
  CHECK_THAT(e, Catch::Contains("16 GiB of the test device"));
  CHECK_THAT(e, Catch::Contains(format_gib(need)));
  for (const char* flag : {"--max-length", "--draft-micro-batch-size", "--activation-checkpointing",
                           "--head-chunk-rows", "--sharding-strategy"})
    CHECK_THAT(e, Catch::Contains(flag));
  // Enough memory, or unknown memory: no refusal.
  CHECK(refusal(c, p, static_cast<uint64_t>(need) + 1).empty());
  CHECK(refusal(c, p, 0).empty());
  // Ranks sharing one host multiply the need.
  p.ranks_sharing_memory = 2;
  const std::string shared = refusal(c, p, static_cast<uint64_t>(need) + 1);
  CHECK_THAT(shared, Catch::Contains("x 2 ranks sharing it"));
}

TEST_CASE("sequence parallelism counts one rank's slice of the sample", "[model]") {
  const DraftConfig c = shipped("llama3-8B-eagle3.json");
  MemoryPlan whole;
  whole.max_length = 131072;
  whole.head_chunk_rows = 1024;
  MemoryPlan sp = whole;
  sp.seq_parallel = 4;
  CHECK(sp.local_tokens() == 32768);
  MemoryPlan slice = whole;
  slice.max_length = 32768;  // what one rank of four holds, without the exchange buffers
  const long double q = static_cast<long double>(c.q_out_features()),
                    kv = static_cast<long double>(c.kv_out_features());
  CHECK(
      estimate_training_memory(c, sp).activations ==
      Approx(estimate_training_memory(c, slice).activations + 32768.0L * 2 * 2 * (2 * q + 2 * kv)));
  // Uneven: ceil(S / P) positions per rank.
  sp.max_length = 131073;
  CHECK(sp.local_tokens() == 32769);
  // The state is what the sharding says, whatever the sequence split.
  CHECK(estimate_training_memory(c, sp).state == estimate_training_memory(c, whole).state);
  // The refusal names the slice.
  sp.max_length = 131072;
  CHECK_THAT(refusal(c, sp, uint64_t{1} << 30), Catch::Contains("--sp-ulysses-size 4"));
}
