// The training options of DFlash-family drafts (--strategy, --num-anchors, --block-loss-type, ...):
// SpecForge 0.2.0's defaults (specforge/config/schema.py), each bound refused with a UsageError
// naming the flag, and SpecForge's typed YAML keys landing in the same fields.
#include <algorithm>
#include <cmath>

#include "compat/config_file.h"
#include "config_test_util.h"

using namespace fsdp::config;
using fsdp::config::test::require_usage_error;
using fsdp::config::test::resolve_args;

namespace {

// The refusal of `flag value` names the flag, from the command line and from fsdp-train's YAML.
void refused(const std::string& flag, const std::string& value) {
  INFO(flag << " " << value);
  require_usage_error([&] { resolve_args({flag, value}); }, flag);
  TrainConfig c;
  const std::string key = option(flag).yaml_key();
  require_usage_error([&] { apply_yaml_text(key + ": " + value + "\n", "run.yaml", &c); }, key);
}

}  // namespace

TEST_CASE("DFlash-family options default to SpecForge's values", "[config]") {
  const TrainConfig c;
  CHECK_FALSE(c.strategy.has_value());  // chosen from the draft config's architectures
  CHECK(c.dflash.num_anchors == 512);
  CHECK_FALSE(c.dflash.loss_decay_gamma.has_value());
  CHECK(c.dflash.objective_chunk_blocks == 128);
  CHECK(c.dflash.loss_type == BlockLossType::kDFlash);
  CHECK(c.dflash.dpace_alpha == 0.5);
  CHECK(c.dflash.dspark_ce_loss_alpha == 0.1);
  CHECK(c.dflash.dspark_l1_loss_alpha == 0.9);
  CHECK(c.dflash.dspark_confidence_head_alpha == 1.0);
  CHECK_FALSE(c.dflash.block_size.has_value());
  CHECK_FALSE(c.dflash.mask_token_id.has_value());
  // The same defaults as the table shows them (--help, docs/configuration.md).
  CHECK(option("strategy").default_text() == "none");
  CHECK(option("num-anchors").default_text() == "512");
  CHECK(option("loss-decay-gamma").default_text() == "none");
  CHECK(option("objective-chunk-blocks").default_text() == "128");
  CHECK(option("block-loss-type").default_text() == "dflash");
  CHECK(option("dpace-alpha").default_text() == "0.5");
  CHECK(option("dspark-ce-loss-alpha").default_text() == "0.1");
  CHECK(option("dspark-l1-loss-alpha").default_text() == "0.9");
  CHECK(option("dspark-confidence-head-alpha").default_text() == "1");
  CHECK(option("draft-block-size").default_text() == "none");
  CHECK(option("mask-token-id").default_text() == "none");
}

TEST_CASE("DFlash-family options take values from flags", "[config]") {
  const TrainConfig c = resolve_args({"--strategy",
                                      "dspark",
                                      "--num-anchors",
                                      "64",
                                      "--loss-decay-gamma",
                                      "7",
                                      "--objective-chunk-blocks",
                                      "0",
                                      "--block-loss-type",
                                      "dpace-continuation-value-only",
                                      "--dpace-alpha",
                                      "1",
                                      "--dspark-ce-loss-alpha",
                                      "0",
                                      "--dspark-l1-loss-alpha",
                                      "2.5",
                                      "--dspark-confidence-head-alpha",
                                      "0.25",
                                      "--draft-block-size",
                                      "8",
                                      "--mask-token-id",
                                      "0"});
  CHECK(c.strategy == TrainingStrategy::kDSpark);
  CHECK(c.dflash.num_anchors == 64);
  CHECK(c.dflash.loss_decay_gamma == 7.0);
  CHECK(c.dflash.objective_chunk_blocks == 0);
  CHECK(c.dflash.loss_type == BlockLossType::kDPaceContinuationValueOnly);
  CHECK(c.dflash.dpace_alpha == 1.0);
  CHECK(c.dflash.dspark_ce_loss_alpha == 0.0);
  CHECK(c.dflash.dspark_l1_loss_alpha == 2.5);
  CHECK(c.dflash.dspark_confidence_head_alpha == 0.25);
  CHECK(c.dflash.block_size == 8);
  CHECK(c.dflash.mask_token_id == 0);
  // Every strategy and loss type by its SpecForge spelling; none and null unset the strategy.
  CHECK(resolve_args({"--strategy", "eagle3"}).strategy == TrainingStrategy::kEagle3);
  CHECK(resolve_args({"--strategy", "dflash"}).strategy == TrainingStrategy::kDFlash);
  CHECK_FALSE(resolve_args({"--strategy", "none"}).strategy.has_value());
  CHECK(to_string(TrainingStrategy::kDFlash) == std::string("dflash"));
  CHECK(resolve_args({"--block-loss-type", "dpace"}).dflash.loss_type == BlockLossType::kDPace);
  CHECK(resolve_args({"--block-loss-type", "dpace-cumulative-confidence-only"}).dflash.loss_type ==
        BlockLossType::kDPaceCumulativeConfidenceOnly);
  // 0 and none both mean equal weights, as SpecForge's gamma <= 0 and None.
  CHECK(resolve_args({"--loss-decay-gamma", "0"}).dflash.loss_decay_gamma == 0.0);
  CHECK_FALSE(resolve_args({"--loss-decay-gamma", "none"}).dflash.loss_decay_gamma.has_value());
}

TEST_CASE("DFlash-family options refuse values out of their bounds, naming the flag", "[config]") {
  refused("--strategy", "domino");
  refused("--num-anchors", "0");
  refused("--num-anchors", "-3");
  refused("--objective-chunk-blocks", "-1");
  refused("--block-loss-type", "dpace-both");
  refused("--dpace-alpha", "-0.01");
  refused("--dpace-alpha", "1.5");
  refused("--dspark-ce-loss-alpha", "-0.1");
  refused("--dspark-l1-loss-alpha", "-1");
  refused("--dspark-confidence-head-alpha", "-1e-9");
  refused("--draft-block-size", "0");
  refused("--mask-token-id", "-1");
  refused("--loss-decay-gamma", "nan");
  refused("--loss-decay-gamma", "-1");
  // validate() checks the bounds of values set by code too, naming the flag.
  TrainConfig c;
  c.dflash.dpace_alpha = 2;
  require_usage_error([&] { option("dpace-alpha").check_value(c); }, "--dpace-alpha");
  c.dflash.num_anchors = 0;
  require_usage_error([&] { option("num-anchors").check_value(c); }, "--num-anchors");
}

TEST_CASE("a SpecForge typed YAML with strategy dflash lands in the DFlash options", "[config]") {
  const std::string yaml = R"(model:
  target_model_path: /t
  draft_model_config: /d.json
  draft_block_size: 8
  mask_token_id: 151669
data:
  hidden_states_path: /h
training:
  strategy: dflash
  num_anchors: 256
  loss_decay_gamma: 7.0
  objective_chunk_blocks: 16
  loss_type: dpace
  dpace_alpha: 0.25
  dspark_ce_loss_alpha: 0.2
  dspark_l1_loss_alpha: 0.8
  dspark_confidence_head_alpha: 0.5
)";
  TrainConfig c;
  const ConfigFileLoad r = load_config_text(yaml, "run.yaml", {}, &c);
  CHECK(r.specforge_schema);
  CHECK(c.strategy == TrainingStrategy::kDFlash);
  CHECK(c.dflash.block_size == 8);
  CHECK(c.dflash.mask_token_id == 151669);
  CHECK(c.dflash.num_anchors == 256);
  CHECK(c.dflash.loss_decay_gamma == 7.0);
  CHECK(c.dflash.objective_chunk_blocks == 16);
  CHECK(c.dflash.loss_type == BlockLossType::kDPace);
  CHECK(c.dflash.dpace_alpha == 0.25);
  CHECK(c.dflash.dspark_ce_loss_alpha == 0.2);
  CHECK(c.dflash.dspark_l1_loss_alpha == 0.8);
  CHECK(c.dflash.dspark_confidence_head_alpha == 0.5);
  // The keys took effect: none of them is only recorded.
  for (const char* key : {"training.strategy", "training.num_anchors", "model.draft_block_size",
                          "model.mask_token_id", "training.loss_type"})
    CHECK(c.specforge_flags.count(key) == 0);
  for (const char* name :
       {"strategy", "num-anchors", "draft-block-size", "mask-token-id", "loss-decay-gamma",
        "objective-chunk-blocks", "block-loss-type", "dpace-alpha", "dspark-ce-loss-alpha",
        "dspark-l1-loss-alpha", "dspark-confidence-head-alpha"})
    CHECK(std::find(r.set_options.begin(), r.set_options.end(), name) != r.set_options.end());
  // An override takes the same path; SpecForge's default strategy is eagle3.
  TrainConfig d;
  load_config_text(yaml, "run.yaml", {"training.strategy=dspark", "training.num_anchors=32"}, &d);
  CHECK(d.strategy == TrainingStrategy::kDSpark);
  CHECK(d.dflash.num_anchors == 32);
  // SpecForge's gamma <= 0 (no decay) is none here.
  TrainConfig g;
  load_config_text(yaml, "run.yaml", {"training.loss_decay_gamma=-2"}, &g);
  CHECK_FALSE(g.dflash.loss_decay_gamma.has_value());
  TrainConfig e;
  load_config_text("model:\n  target_model_path: /t\ndata:\n  hidden_states_path: /h\n", "run.yaml",
                   {}, &e);
  CHECK(e.strategy == TrainingStrategy::kEagle3);
  CHECK(e.dflash.num_anchors == 512);
  // Bounds: the schema's own (gt 0) and then the option's; other families are refused.
  TrainConfig f;
  require_usage_error([&] { load_config_text(yaml, "run.yaml", {"training.num_anchors=0"}, &f); },
                      "training.num_anchors");
  require_usage_error(
      [&] { load_config_text(yaml, "run.yaml", {"training.dspark_l1_loss_alpha=-1"}, &f); },
      "--dspark-l1-loss-alpha");
  require_usage_error([&] { load_config_text(yaml, "run.yaml", {"training.dpace_alpha=2"}, &f); },
                      "training.dpace_alpha");
  require_usage_error([&] { load_config_text(yaml, "run.yaml", {"training.strategy=domino"}, &f); },
                      "Domino");
  // P-EAGLE's keys set its options (docs/model.md "P-EAGLE").
  TrainConfig pe;
  load_config_text(yaml, "run.yaml",
                   {"training.strategy=peagle", "training.num_depths=5",
                    "training.down_sample_ratio=0.7", "training.down_sample_ratio_min=0.1"},
                   &pe);
  CHECK(pe.strategy == TrainingStrategy::kPEagle);
  CHECK(pe.peagle.num_depths == 5);
  CHECK(pe.peagle.down_sample_ratio == 0.7);
  CHECK(pe.peagle.down_sample_ratio_min == 0.1);
  require_usage_error([&] { load_config_text(yaml, "run.yaml", {"training.num_depths=0"}, &f); },
                      "training.num_depths");
}
