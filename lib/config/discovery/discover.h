// Discovery of the files the options name (the input step between reading the options and
// validating them): a repository id as --target-model-path is looked up in the Hugging Face cache
// (hf_cache.h), a missing --draft-model-config is made from the target (draft_auto.h), and the
// draft and target configs are checked against each other (model_check.cpp). Reads files; never
// parses flags or foreign configurations.
#pragma once

#include <string>
#include <vector>

#include "config/train_config.h"

namespace fsdp::config {

// Resolves a Hugging Face repository id given as --target-model-path to its cached snapshot,
// then makes a draft config from the target when none is given, as SpecForge does. Returns the
// start-up lines saying what was found or made (none when nothing was done).
std::vector<std::string> discover_inputs(TrainConfig* cfg);

// Reads --draft-model-config and <--target-model-path>/config.json (JSON only, no tensors) and
// checks that they agree: same vocab_size, the draft's target_hidden_size (else hidden_size)
// equals the target's hidden_size, draft_vocab_size within vocab_size. validate() calls it when
// check_paths is set; throws UsageError naming the flag.
void check_model_files(const TrainConfig& cfg);

}  // namespace fsdp::config
