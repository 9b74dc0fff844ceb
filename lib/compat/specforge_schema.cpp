// SpecForge's typed run configuration (specforge_schema.h): the key table, the reader of a typed
// file and its dotted overrides, SpecForge's cross-key checks, and the mapping onto the option
// table. Keys and defaults follow SpecForge's specforge/config/schema.py (its pydantic models
// forbid extra keys, so an unknown key is an error here too).
#include "compat/specforge_schema.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "config/options.h"
#include "config/value_parse.h"
#include "core/error.h"

namespace fsdp::config {

namespace {

using detail::parse_bool;
using detail::parse_float;
using detail::parse_int;

// Value types of the schema (pydantic's, as SpecForge declares them).
enum class T {
  kStr,
  kOptStr,
  kInt,
  kOptInt,
  kFloat,
  kOptFloat,
  kBool,
  kOptBool,
  kEnum,
  kOptEnum,
  kIntList,
  kOptIntList,
  kStrList,
  kMap
};

bool optional_type(T t) {
  return t == T::kOptStr || t == T::kOptInt || t == T::kOptFloat || t == T::kOptBool ||
         t == T::kOptEnum || t == T::kOptIntList;
}

// pydantic's gt/ge/le.
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;
};
Range gt(double v) {
  return {v, std::numeric_limits<double>::infinity(), true, false};
}
Range ge(double v) {
  return {v, std::numeric_limits<double>::infinity(), false, false};
}
Range gt_le(double lo, double hi) {
  return {lo, hi, true, false};
}
Range ge_le(double lo, double hi) {
  return {lo, hi, false, false};
}

// A key's value: given in the file or an override (`where` says which), else the default.
struct Value {
  bool given = false;
  bool is_null = false;
  std::string text;
  std::vector<std::string> list;
  std::string where;  // "run.yaml:12" or "override training.seed=1"
};

struct Key;
using Apply = std::function<void(const Key&, const Value&, TrainConfig&, const std::string& src)>;
// Returns the reason a value is refused ("" when accepted).
using Refusal = std::function<std::string(const Value&)>;

struct Key {
  std::string path;
  T type;
  std::string def;  // SpecForge's default in text form ("null" for None)
  bool required = false;
  std::vector<std::string> choices;
  std::optional<Range> range;
  SchemaUse use;
  std::string option;  // kSets: the option of the table it writes (empty: `apply` does it)
  std::string effect;  // docs: what fsdp-train does with it
  Apply apply;         // kSets: custom mapping
  Refusal refusal;     // kRefused: custom condition (default: differs from the default)
  std::string hint;    // what to do instead, for a refusal
};

std::string type_text(const Key& k) {
  std::string base;
  switch (k.type) {
    case T::kStr:
    case T::kOptStr:
      base = "string";
      break;
    case T::kInt:
    case T::kOptInt:
      base = "int";
      break;
    case T::kFloat:
    case T::kOptFloat:
      base = "float";
      break;
    case T::kBool:
    case T::kOptBool:
      base = "bool";
      break;
    case T::kEnum:
    case T::kOptEnum: {
      base = "one of ";
      for (size_t i = 0; i < k.choices.size(); ++i) base += (i ? ", " : "") + k.choices[i];
      break;
    }
    case T::kIntList:
    case T::kOptIntList:
      base = "list of int";
      break;
    case T::kStrList:
      base = "list of string";
      break;
    case T::kMap:
      base = "mapping";
      break;
  }
  if (k.range) {
    const Range& r = *k.range;
    auto num = [](double v) {
      std::ostringstream os;
      os << v;
      return os.str();
    };
    if (std::isfinite(r.lo)) base += (r.lo_open ? " > " : " >= ") + num(r.lo);
    if (std::isfinite(r.hi))
      base +=
          (std::isfinite(r.lo) ? ", " : " ") + std::string(r.hi_open ? "< " : "<= ") + num(r.hi);
  }
  if (optional_type(k.type)) base += " or null";
  return base;
}

// ---- the key table ----------------------------------------------------------------------------

const char* const kNoTarget =
    "no target model runs in offline training (fsdp-train reads the dumped hidden states)";
const char* const kOnline = "online capture (fsdp-train trains from precomputed hidden states)";
const char* const kDomino = "a Domino objective knob (fsdp-train does not train Domino drafts)";
const char* const kStream =
    "a streaming bound of SpecForge's disaggregated producer (fsdp-train reads the features "
    "itself)";
const char* const kDisagg =
    "SpecForge's producer/consumer feature store; fsdp-train reads data.hidden_states_path "
    "itself, so the split is not used";

Key sets(std::string path, T type, std::string def, std::string option, std::string effect) {
  Key k;
  k.path = std::move(path);
  k.type = type;
  k.def = std::move(def);
  k.use = SchemaUse::kSets;
  k.option = std::move(option);
  k.effect = std::move(effect);
  return k;
}

Key recorded(std::string path, T type, std::string def, std::string why) {
  Key k;
  k.path = std::move(path);
  k.type = type;
  k.def = std::move(def);
  k.use = SchemaUse::kRecorded;
  k.effect = "recorded, no effect: " + why;
  return k;
}

Key refused(std::string path, T type, std::string def, std::string why, std::string hint) {
  Key k;
  k.path = std::move(path);
  k.type = type;
  k.def = std::move(def);
  k.use = SchemaUse::kRefused;
  k.effect = "refused unless " +
             (k.def == "\"\"" || k.def == "null" ? std::string("empty") : k.def) + ": " + why;
  k.hint = std::move(hint);
  return k;
}

Key with_range(Key k, Range r) {
  k.range = r;
  return k;
}
Key with_choices(Key k, std::vector<std::string> c) {
  k.choices = std::move(c);
  return k;
}

std::vector<Key> build_keys();

const std::vector<Key>& keys() {
  static const std::vector<Key> table = build_keys();
  return table;
}

const Key* find_key(const std::string& path) {
  for (const auto& k : keys())
    if (k.path == path) return &k;
  return nullptr;
}

// Sections that are mappings of keys (the rest of the paths are leaves of the table).
const std::set<std::string>& sections() {
  static const std::set<std::string> s = {"model",
                                          "data",
                                          "training",
                                          "tracking",
                                          "profiling",
                                          "runtime",
                                          "deployment",
                                          "deployment.trainer",
                                          "deployment.disaggregated"};
  return s;
}

// The value as an option value of the table.
OptionValue option_value(const Value& v) {
  OptionValue o;
  o.is_null = v.is_null;
  o.text = v.is_null ? "none" : v.text;
  o.list = v.list;
  return o;
}

void set_option(const std::string& name, const OptionValue& v, TrainConfig& cfg,
                const std::string& src) {
  option(name).set(cfg, v, src);
}

// The model section: the target and the draft, their tensors and dtype.
void add_model_keys(std::vector<Key>& t) {
  const auto add = [&](Key k) { t.push_back(std::move(k)); };
  {
    Key k = sets("model.target_model_path", T::kStr, "required", "target-model-path",
                 "`--target-model-path` (a directory or a Hugging Face cache id, as the flag)");
    k.required = true;
    add(k);
  }
  add(sets("model.draft_model_config", T::kOptStr, "null", "draft-model-config",
           "`--draft-model-config`; null: made from the target's config.json as SpecForge does"));
  add(sets("model.draft_checkpoint_path", T::kOptStr, "null", "init-checkpoint",
           "`--init-checkpoint` (weights only: no optimizer state, counters or data position)"));
  {
    Key k = with_range(refused("model.draft_num_hidden_layers", T::kOptInt, "null",
                               "SpecForge's EAGLE3 takes only 1 (null or 1); fsdp-train reads "
                               "the layer count from the draft config (1 to 64)",
                               "drop the key and write num_hidden_layers into the draft config "
                               "JSON (docs/model.md \"Draft variants\")"),
                       gt(0));
    k.effect =
        "null or 1 accepted (SpecForge's EAGLE3 takes only 1); other values refused: "
        "fsdp-train reads the layer count from the draft config (1 to 64)";
    k.refusal = [](const Value& v) {
      return v.is_null || v.text == "1"
                 ? std::string()
                 : std::string(
                       "SpecForge's EAGLE3 takes only 1, and fsdp-train reads the layer "
                       "count from the draft config");
    };
    add(k);
  }
  add(with_range(sets("model.draft_block_size", T::kOptInt, "null", "draft-block-size",
                      "`--draft-block-size` (DFlash drafts)"),
                 gt(0)));
  add(with_choices(recorded("model.target_backend", T::kEnum, "sglang", kNoTarget), {"sglang"}));
  add(recorded("model.shard_target_output", T::kBool, "false", kNoTarget));
  {
    Key k = refused("model.input_modality", T::kStr, "text",
                    "the draft is trained on text hidden states only",
                    "dump text hidden states; vision-language targets are not supported");
    add(k);
  }
  add(recorded("model.trust_remote_code", T::kBool, "false",
               "fsdp-train runs no model code of the target (it reads config.json and the "
               "safetensors)"));
  add(recorded("model.use_liger_kernel", T::kBool, "false",
               "Liger's fused RMSNorm and SwiGLU kernels for DFlash drafts in SpecForge, a speed "
               "choice of its own"));
  add(sets("model.embedding_key", T::kStr, "model.embed_tokens.weight", "embedding-key",
           "`--embedding-key`"));
  add(sets("model.lm_head_key", T::kStr, "lm_head.weight", "lm-head-key", "`--lm-head-key`"));
  add(sets("model.vocab_mapping_path", T::kStr, "\"\"", "vocab-mapping-path",
           "`--vocab-mapping-path`; empty: the mapping is counted from the features' tokens"));
  add(refused("model.load_target_embedding", T::kBool, "true",
              "the draft's embedding is always the target's, frozen",
              "drop the key (fsdp-train copies and freezes the target's embedding)"));
  add(recorded("model.aux_hidden_state_layer_ids", T::kOptIntList, "null",
               "selects the layers to capture, which offline features already are (SpecForge "
               "ignores it offline too); the draft config's eagle_aux_hidden_state_layer_ids "
               "name them"));
  {
    // SpecForge computes in bf16 under FSDP whatever torch_dtype says (its FSDP param_dtype is
    // bf16); only its DDP path (NO_SHARD) computes in torch_dtype.
    Key k = with_choices(
        sets("model.torch_dtype", T::kEnum, "bfloat16", "",
             "storage dtype of the draft in SpecForge, which computes in bf16 under FSDP "
             "whatever it says, as fsdp-train does (fp32 masters); with fsdp_sharding "
             "NO_SHARD SpecForge computes in it: float32 then sets `--mixed-precision fp32`, "
             "float16 is refused (no fp16 compute)"),
        {"bfloat16", "float16", "float32"});
    k.apply = [](const Key&, const Value& v, TrainConfig& cfg, const std::string& src) {
      if (cfg.shard.strategy != ShardingStrategy::kNoShard) {
        if (v.text != "bfloat16") cfg.specforge_flags["model.torch_dtype"] = v.text;
        return;
      }
      FSDP_USAGE_CHECK(v.text != "float16",
                       str(src, ": float16 compute (fsdp_sharding NO_SHARD) is not supported"),
                       "write bfloat16 (SpecForge's default) or float32");
      set_option("mixed-precision", OptionValue{false, v.text == "float32" ? "fp32" : "bf16", {}},
                 cfg, src);
    };
    add(k);
  }
  add(sets("model.cache_dir", T::kOptStr, "null", "model-download-dir",
           "`--model-download-dir` (where a Hugging Face cache id is looked up)"));
  add(sets("model.mask_token_id", T::kOptInt, "null", "mask-token-id",
           "`--mask-token-id` (DFlash, DSpark and P-EAGLE drafts)"));
  add(with_range(recorded("model.tokenizer_pad_token_id", T::kOptInt, "null",
                          "a tokenizer setting of online capture"),
                 ge(0)));
}

// The model section's settings of SGLang's capture server (online capture: recorded).
void add_model_capture_server_keys(std::vector<Key>& t) {
  const auto add = [&](Key k) { t.push_back(std::move(k)); };
  const std::string sg = "an SGLang capture-server setting: ";
  add(recorded("model.sglang_attention_backend", T::kStr, "flashinfer", sg + kNoTarget));
  add(with_range(recorded("model.sglang_mem_fraction_static", T::kFloat, "0.4", sg + kNoTarget),
                 gt_le(0, 1)));
  add(recorded("model.sglang_disable_radix_cache", T::kBool, "true", sg + kNoTarget));
  add(with_range(recorded("model.sglang_context_length", T::kOptInt, "null", sg + kNoTarget),
                 gt(0)));
  for (const char* name :
       {"sglang_enable_nccl_nvls", "sglang_enable_symm_mem", "sglang_enable_torch_compile",
        "sglang_enable_dp_attention", "sglang_enable_dp_lm_head"})
    add(recorded(str("model.", name), T::kBool, "false", sg + kNoTarget));
  add(with_range(recorded("model.sglang_ep_size", T::kInt, "1", sg + kNoTarget), gt(0)));
  for (const char* name :
       {"sglang_max_running_requests", "sglang_max_total_tokens", "sglang_dp_size"})
    add(with_range(recorded(str("model.", name), T::kOptInt, "null", sg + kNoTarget), gt(0)));
  for (const char* name : {"sglang_moe_a2a_backend", "sglang_moe_runner_backend"})
    add(recorded(str("model.", name), T::kOptStr, "null", sg + kNoTarget));
  add(with_range(recorded("model.sglang_page_size", T::kOptInt, "null", sg + kNoTarget), gt(0)));
  for (const char* name : {"sglang_quantization", "sglang_fp4_gemm_runner_backend",
                           "sglang_mamba_radix_cache_strategy"})
    add(recorded(str("model.", name), T::kOptStr, "null", sg + kNoTarget));
  add(with_range(recorded("model.sglang_max_mamba_cache_size", T::kOptInt, "null", sg + kNoTarget),
                 gt(0)));
  for (const char* name : {"sglang_swa_full_tokens_ratio", "sglang_mamba_full_memory_ratio"})
    add(with_range(recorded(str("model.", name), T::kOptFloat, "null", sg + kNoTarget),
                   gt_le(0, 1)));
}

// The data section: offline features only (online sources are refused).
void add_data_keys(std::vector<Key>& t) {
  const auto add = [&](Key k) { t.push_back(std::move(k)); };
  add(refused("data.train_data_path", T::kStr, "\"\"", kOnline,
              "dump the hidden states first (SpecForge's offline capture) and set "
              "data.hidden_states_path"));
  add(refused("data.prompts_path", T::kStr, "\"\"", kOnline,
              "dump the hidden states first and set data.hidden_states_path"));
  add(sets("data.hidden_states_path", T::kStr, "\"\"", "train-hidden-states-path",
           "`--train-hidden-states-path` (any feature format of docs/data.md)"));
  add(refused("data.eval_data_path", T::kStr, "\"\"",
              "SpecForge refuses it too (no online evaluation)",
              "set data.eval_hidden_states_path to dumped evaluation features"));
  add(sets("data.eval_hidden_states_path", T::kStr, "\"\"", "eval-hidden-states-path",
           "`--eval-hidden-states-path`"));
  add(with_range(sets("data.max_length", T::kInt, "2048", "max-length", "`--max-length`"), gt(0)));
  add(sets("data.chat_template", T::kStr, "llama3", "chat-template",
           "`--chat-template` (recorded: the features already carry the loss mask)"));
  add(sets("data.is_preformatted", T::kBool, "false", "is-preformatted",
           "`--is-preformatted` (recorded, no effect: prompt formatting of online capture)"));
  add(recorded("data.train_only_last_turn", T::kBool, "false",
               "prompt building of online capture (the features' loss mask decides)"));
  add(with_range(sets("data.build_dataset_num_proc", T::kInt, "8", "build-dataset-num-proc",
                      "`--build-dataset-num-proc` (recorded, no effect)"),
                 gt(0)));
  add(with_range(sets("data.dataloader_num_workers", T::kOptInt, "null", "dataloader-num-workers",
                      "`--loader-threads` (reader threads per rank; 0: one); null: fsdp-train's "
                      "default"),
                 ge(0)));
  add(sets("data.cache_dir", T::kStr, "./cache", "cache-dir",
           "`--cache-dir` (where a draft config made from the target is written)"));
  add(recorded("data.cache_key", T::kOptStr, "null", "names SpecForge's dataset cache"));
  add(with_range(recorded("data.max_prompts", T::kOptInt, "null",
                          "caps the prompts of online "
                          "capture"),
                 ge(0)));
}

// The tracking section: W&B and MLflow (SwanLab is refused).
void add_tracking_keys(std::vector<Key>& t) {
  const auto add = [&](Key k) { t.push_back(std::move(k)); };
  add(with_choices(sets("tracking.report_to", T::kEnum, "none", "report-to",
                        str("`--report-to` (swanlab is refused: ", kSwanLabAdvice, ")")),
                   {"none", "wandb", "tensorboard", "swanlab", "mlflow"}));
  add(sets("tracking.wandb_project", T::kOptStr, "null", "wandb-project", "`--wandb-project`"));
  add(sets("tracking.wandb_name", T::kOptStr, "null", "wandb-name", "`--wandb-name`"));
  add(sets("tracking.wandb_key", T::kOptStr, "null", "wandb-key",
           "`--wandb-key` (never printed or saved; WANDB_API_KEY is the better place)"));
  add(sets("tracking.wandb_offline", T::kBool, "false", "wandb-offline", "`--wandb-offline`"));
  add(sets("tracking.wandb_dir", T::kOptStr, "null", "wandb-dir",
           "`--wandb-dir`; null: the output directory"));
  for (const char* name : {"swanlab_project", "swanlab_name", "swanlab_key"})
    add(refused(str("tracking.", name), T::kOptStr, "null", kSwanLabRefused,
                str("tracking.report_to: ", kSwanLabAdvice)));
  add(sets("tracking.mlflow_tracking_uri", T::kOptStr, "null", "mlflow-tracking-uri",
           "`--mlflow-tracking-uri` (null: MLFLOW_TRACKING_URI, else <output_dir>/mlruns)"));
  add(sets("tracking.mlflow_experiment_name", T::kOptStr, "null", "mlflow-experiment-name",
           "`--mlflow-experiment-name`"));
  add(sets("tracking.mlflow_run_name", T::kOptStr, "null", "mlflow-run-name",
           "`--mlflow-run-name`"));
}

// The profiling section.
void add_profiling_keys(std::vector<Key>& t) {
  const auto add = [&](Key k) { t.push_back(std::move(k)); };
  add(sets("profiling.enabled", T::kBool, "false", "profile", "`--profile`"));
  add(with_range(sets("profiling.start_step", T::kInt, "30", "profile-start-step",
                      "`--profile-start-step` (completed optimizer steps)"),
                 ge(0)));
  add(with_range(
      sets("profiling.num_steps", T::kInt, "4", "profile-num-steps", "`--profile-num-steps`"),
      gt(0)));
  add(sets("profiling.record_shapes", T::kBool, "false", "profile-record-shapes",
           "`--profile-record-shapes`"));
}

// The runtime section: the disaggregated producer's streaming bounds (recorded).
void add_runtime_keys(std::vector<Key>& t) {
  const auto add = [&](Key k) { t.push_back(std::move(k)); };
  add(with_range(recorded("runtime.producer_lease", T::kInt, "8", kStream), gt(0)));
  add(with_range(recorded("runtime.producer_concurrency", T::kInt, "1", kStream), gt(0)));
  add(with_range(recorded("runtime.in_flight_high_watermark", T::kInt, "256", kStream), gt(0)));
  add(with_range(recorded("runtime.in_flight_low_watermark", T::kInt, "192", kStream), ge(0)));
  add(with_range(recorded("runtime.resident_high_watermark_bytes", T::kOptInt, "null", kStream),
                 gt(0)));
  add(with_range(recorded("runtime.resident_low_watermark_bytes", T::kOptInt, "null", kStream),
                 ge(0)));
  add(with_range(recorded("runtime.feature_store_max_resident_bytes", T::kOptInt, "null", kStream),
                 gt(0)));
}

// The deployment section: topology and the disaggregated feature store (recorded).
void add_deployment_keys(std::vector<Key>& t) {
  const auto add = [&](Key k) { t.push_back(std::move(k)); };
  add(with_choices(recorded("deployment.mode", T::kEnum, "local_colocated",
                            "local_colocated is what fsdp-train does; disaggregated (offline) "
                            "trains the same way: " +
                                std::string(kDisagg)),
                   {"local_colocated", "disaggregated"}));
  const std::string ranks =
      "the ranks come from the launcher (mpirun -np, fsdp-train --nproc-per-node); a run whose "
      "rank count differs from nnodes x nproc_per_node gets a warning";
  add(with_range(recorded("deployment.trainer.nnodes", T::kInt, "1", ranks), gt(0)));
  add(with_range(recorded("deployment.trainer.nproc_per_node", T::kInt, "1", ranks), gt(0)));
  const std::string placement = "rank placement is MPI's (mpirun, srun, --hostfile)";
  add(with_range(recorded("deployment.trainer.node_rank", T::kOptInt, "null", placement), ge(0)));
  add(recorded("deployment.trainer.master_addr", T::kOptStr, "null", placement));
  add(with_range(recorded("deployment.trainer.master_port", T::kInt, "29500", placement),
                 gt_le(0, 65535)));
  {
    Key k = recorded("deployment.disaggregated.control_dir", T::kStr, "required", kDisagg);
    k.required = true;
    add(k);
  }
  for (const char* name : {"consumer_state_dir", "inbox_server_url", "store_root", "store_id",
                           "mooncake_metadata_server", "mooncake_master_server_addr",
                           "mooncake_local_hostname", "mooncake_protocol", "mooncake_rdma_devices"})
    add(recorded(str("deployment.disaggregated.", name), T::kOptStr, "null", kDisagg));
  {
    Key k =
        with_choices(recorded("deployment.disaggregated.backend", T::kEnum, "required", kDisagg),
                     {"shared_dir", "mooncake"});
    k.required = true;
    add(k);
  }
  add(recorded("deployment.disaggregated.server_urls", T::kStrList, "[]", kDisagg));
  add(with_range(
      recorded("deployment.disaggregated.producer_segment_size", T::kOptInt, "null", kDisagg),
      gt(0)));
  add(with_range(
      recorded("deployment.disaggregated.client_buffer_size", T::kInt, "268435456", kDisagg),
      gt(0)));
  for (const char* name : {"idle_timeout_s", "peer_wait_timeout_s", "producer_hold_s"})
    add(with_range(recorded(str("deployment.disaggregated.", name), T::kOptFloat, "null", kDisagg),
                   gt(0)));
  add(with_range(recorded("deployment.disaggregated.shutdown_grace_s", T::kFloat, "30", kDisagg),
                 gt(0)));
  add(refused("deployment.disaggregated.managed_local", T::kMap, "null",
              "a managed online capture stack (SpecForge allows it for online capture only)",
              "drop deployment.disaggregated.managed_local"));
}

// The training section, part 1: the draft family, the loop, the optimizer and parallelism.
void add_training_loop_keys(std::vector<Key>& t) {
  const auto add = [&](Key k) { t.push_back(std::move(k)); };
  {
    Key k = with_choices(
        sets("training.strategy", T::kEnum, "eagle3", "strategy",
             "`--strategy` (SpecForge's default eagle3 when not given: a DFlash, DSpark or "
             "P-EAGLE draft config needs its strategy, as in SpecForge); domino is refused: "
             "fsdp-train does not train that family"),
        {"eagle3", "dflash", "dspark", "peagle", "domino"});
    k.apply = [](const Key&, const Value& v, TrainConfig& cfg, const std::string& src) {
      FSDP_USAGE_CHECK(v.text != "domino",
                       str(src, ": ", v.text,
                           " is not supported: fsdp-train trains EAGLE3, DFlash, DSpark and "
                           "P-EAGLE drafts (Domino is another draft family)"),
                       "write strategy: eagle3, dflash, dspark or peagle, or train that family "
                       "with SpecForge");
      set_option("strategy", option_value(v), cfg, src);
    };
    add(k);
  }
  add(with_range(sets("training.num_epochs", T::kInt, "1", "num-epochs", "`--num-epochs`"), gt(0)));
  add(with_range(sets("training.max_steps", T::kOptInt, "null", "max-steps",
                      "`--max-steps` (optimizer updates)"),
                 gt(0)));
  {
    Key k = with_range(sets("training.total_steps", T::kOptInt, "null", "total-steps",
                            "`--total-steps` (optimizer updates of the LR schedule); null: "
                            "max_steps when set (specforge train's horizon), else the epochs' "
                            "updates"),
                       gt(0));
    k.apply = [](const Key&, const Value& v, TrainConfig& cfg, const std::string& src) {
      if (!v.is_null) {
        set_option("total-steps", option_value(v), cfg, src);
      } else if (const OptionValue max = option("max-steps").get(cfg); !max.is_null) {
        set_option("total-steps", max, cfg, src);
      }
    };
    add(k);
  }
  add(with_range(sets("training.batch_size", T::kInt, "1", "batch-size",
                      "`--draft-micro-batch-size` (per rank); global batch = batch_size x ranks "
                      "x accumulation_steps"),
                 gt(0)));
  add(with_range(sets("training.accumulation_steps", T::kInt, "1", "draft-accumulation-steps",
                      "`--gradient-accumulation-steps`"),
                 gt(0)));
  {
    Key k = with_choices(
        sets("training.fsdp_sharding", T::kEnum, "SHARD_GRAD_OP", "",
             "`--sharding-strategy`: SHARD_GRAD_OP -> shard_grad_op (ZeRO-2), FULL_SHARD -> "
             "full_shard (ZeRO-3), NO_SHARD -> no_shard"),
        {"SHARD_GRAD_OP", "FULL_SHARD", "NO_SHARD"});
    k.apply = [](const Key&, const Value& v, TrainConfig& cfg, const std::string& src) {
      set_option("sharding-strategy", OptionValue{false, detail::to_lower(v.text), {}}, cfg, src);
    };
    add(k);
  }
  add(with_range(
      sets("training.learning_rate", T::kFloat, "1e-4", "learning-rate", "`--learning-rate`"),
      gt(0)));
  add(with_choices(sets("training.lr_scheduler", T::kEnum, "cosine", "lr-scheduler",
                        "`--lr-scheduler` (linear warmup, then cosine to 0 or constant)"),
                   {"cosine", "constant"}));
  add(with_range(
      sets("training.warmup_ratio", T::kFloat, "0.015", "warmup-ratio", "`--warmup-ratio`"),
      ge_le(0, 1)));
  add(with_range(sets("training.max_grad_norm", T::kFloat, "0.5", "max-grad-norm",
                      "`--max-grad-norm` (the global norm over all ranks' shards)"),
                 gt(0)));
  add(sets("training.optimizer_cpu_offload", T::kBool, "false", "cpu-offload",
           "`--cpu-offload` (fp32 masters and moments on the host, and the optimizer step)"));
  add(with_range(sets("training.ttt_length", T::kInt, "7", "ttt-length", "`--ttt-length`"), gt(0)));
  {
    Key k = with_choices(
        sets("training.attention_backend", T::kEnum, "flex_attention", "attention-backend",
             "`--attention-backend`: recorded (one exact attention; usp with "
             "sp_ulysses_size > 1 is fsdp-train's Ulysses sequence parallelism); eager is "
             "refused as SpecForge's EAGLE3 refuses it"),
        {"eager", "sdpa", "flex_attention", "fa", "usp"});
    k.apply = [](const Key&, const Value& v, TrainConfig& cfg, const std::string& src) {
      FSDP_USAGE_CHECK(v.text != "eager",
                       str(src, ": eager is refused for EAGLE3 (as specforge train refuses it)"),
                       "write sdpa, flex_attention (the default) or fa");
      if (v.given) set_option("attention-backend", option_value(v), cfg, src);
    };
    add(k);
  }
  add(with_range(sets("training.tp_size", T::kInt, "1", "tp-size",
                      "`--tp-size`: 1 (SpecForge refuses other values offline too)"),
                 gt(0)));
  add(with_range(sets("training.sp_ulysses_size", T::kInt, "1", "sp-ulysses-size",
                      "`--sp-ulysses-size` (Ulysses sequence parallelism; with "
                      "attention_backend usp and batch_size 1, as SpecForge)"),
                 gt(0)));
  add(with_range(sets("training.sp_ring_size", T::kInt, "1", "sp-ring-size",
                      "`--sp-ring-size`: 1 (ring attention is not implemented; use "
                      "sp_ulysses_size)"),
                 gt(0)));
  add(with_range(
      sets("training.dist_timeout", T::kInt, "10", "dist-timeout", "`--dist-timeout` (minutes)"),
      gt(0)));
}

// The training section, part 2: the objectives (EAGLE3's, the DFlash family's; P-EAGLE's and
// Domino's recorded).
void add_training_objective_keys(std::vector<Key>& t) {
  const auto add = [&](Key k) { t.push_back(std::move(k)); };
  add(with_choices(sets("training.lk_loss_type", T::kOptEnum, "null", "lk-loss-type",
                        "`--lk-loss-type` (null: the soft cross-entropy)"),
                   {"lambda", "alpha"}));
  add(sets("training.kl_scale", T::kFloat, "1.0", "kl-scale", "`--kl-scale`"));
  add(sets("training.kl_decay", T::kFloat, "1.0", "kl-decay", "`--kl-decay`"));
  add(with_range(sets("training.num_anchors", T::kInt, "512", "num-anchors",
                      "`--num-anchors` (DFlash and DSpark drafts)"),
                 gt(0)));
  {
    Key k = sets("training.loss_decay_gamma", T::kOptFloat, "null", "loss-decay-gamma",
                 "`--loss-decay-gamma` (DFlash and DSpark drafts); a value <= 0, no decay in "
                 "SpecForge, sets none");
    k.apply = [](const Key&, const Value& v, TrainConfig& cfg, const std::string& src) {
      const bool off = v.is_null || parse_float(v.text, src) <= 0;
      set_option("loss-decay-gamma", off ? OptionValue{true, "none", {}} : option_value(v), cfg,
                 src);
    };
    add(k);
  }
  add(with_range(sets("training.objective_chunk_blocks", T::kInt, "128", "objective-chunk-blocks",
                      "`--objective-chunk-blocks` (DFlash and DSpark drafts)"),
                 ge(0)));
  add(with_choices(
      sets("training.loss_type", T::kEnum, "dflash", "block-loss-type",
           "`--block-loss-type` (DFlash drafts)"),
      {"dflash", "dpace", "dpace-cumulative-confidence-only", "dpace-continuation-value-only"}));
  add(with_range(sets("training.dpace_alpha", T::kFloat, "0.5", "dpace-alpha",
                      "`--dpace-alpha` (DFlash drafts)"),
                 ge_le(0, 1)));
  add(recorded("training.lambda_base_start", T::kFloat, "1.0", kDomino));
  add(recorded("training.lambda_base_decay_ratio", T::kFloat, "0.5", kDomino));
  for (const auto& [name, def] :
       std::vector<std::pair<const char*, const char*>>{{"dspark_ce_loss_alpha", "0.1"},
                                                        {"dspark_l1_loss_alpha", "0.9"},
                                                        {"dspark_confidence_head_alpha", "1.0"}}) {
    std::string flag = name;
    std::replace(flag.begin(), flag.end(), '_', '-');
    add(sets(str("training.", name), T::kFloat, def, flag, str("`--", flag, "` (DSpark drafts)")));
  }
  add(with_range(
      sets("training.num_depths", T::kInt, "8", "num-depths", "`--num-depths` (P-EAGLE drafts)"),
      gt(0)));
  add(with_range(sets("training.down_sample_ratio", T::kFloat, "0.8", "down-sample-ratio",
                      "`--down-sample-ratio` (P-EAGLE drafts)"),
                 gt_le(0, 1)));
  add(sets("training.down_sample_ratio_min", T::kFloat, "0.2", "down-sample-ratio-min",
           "`--down-sample-ratio-min` (P-EAGLE drafts)"));
  add(recorded("training.norm_before_residual", T::kOptBool, "null",
               "SpecForge's P-EAGLE override of the draft config's norm_before_residual; "
               "fsdp-train reads the draft config's (with strategy peagle a value here is "
               "refused)"));
}

// The training section, part 3: checkpoints, evaluation, logging, resume, role and seeds.
void add_training_run_keys(std::vector<Key>& t) {
  const auto add = [&](Key k) { t.push_back(std::move(k)); };
  add(with_range(sets("training.save_interval", T::kInt, "0", "save-steps",
                      "`--save-steps` (optimizer updates; 0: only the final checkpoint)"),
                 ge(0)));
  add(with_range(sets("training.eval_interval", T::kInt, "0", "eval-steps",
                      "`--eval-steps` (optimizer updates; 0: off)"),
                 ge(0)));
  add(with_range(sets("training.log_interval", T::kInt, "50", "log-steps",
                      "`--log-steps` (optimizer updates)"),
                 gt(0)));
  add(with_range(
      sets("training.max_checkpoints", T::kInt, "0", "keep-last", "`--keep-last` (0: keep all)"),
      ge(0)));
  add(recorded("training.compact_teacher", T::kBool, "false",
               "fsdp-train's target head is always the exact tiled one (no full-vocabulary "
               "logits are held)"));
  add(with_range(recorded("training.compact_teacher_chunk_size", T::kOptInt, "null",
                          "fsdp-train's target head picks its tile itself"),
                 gt(0)));
  {
    Key k = sets("training.resume_from", T::kOptStr, "null", "resume",
                 "`--resume PATH` (a checkpoint directory, or the output directory: its newest "
                 "checkpoint); null: a fresh start");
    k.apply = [](const Key&, const Value& v, TrainConfig& cfg, const std::string& src) {
      if (v.is_null) return;
      std::string p = v.text;
      if (p.rfind("file://", 0) == 0) p = p.substr(7);
      set_option("resume", OptionValue{false, p, {}}, cfg, src);
    };
    add(k);
  }
  {
    Key k = with_choices(
        refused("training.role", T::kEnum, "all (auto when deployment.mode is disaggregated)",
                "a producer only moves features into SpecForge's store; fsdp-train is the "
                "trainer",
                "run fsdp-train as the trainer (role all, auto or consumer)"),
        {"auto", "all", "producer", "consumer"});
    k.refusal = [](const Value& v) {
      return v.text == "producer" ? std::string("a producer-only process has nothing to train")
                                  : std::string();
    };
    add(k);
  }
  add(sets("training.seed", T::kInt, "42", "seed", "`--seed`"));
  add(recorded("training.prompt_seed", T::kOptInt, "null", "orders the prompts of online capture"));
}

// The top-level keys.
void add_top_level_keys(std::vector<Key>& t) {
  const auto add = [&](Key k) { t.push_back(std::move(k)); };
  add(sets("run_id", T::kStr, "specforge-run", "",
           "the run's name: `--wandb-name` and `--mlflow-run-name` when those are not given"));
  t.back().apply = [](const Key&, const Value& v, TrainConfig& cfg, const std::string& src) {
    for (const char* name : {"wandb-name", "mlflow-run-name"}) {
      if (option(name).get(cfg).text.empty()) set_option(name, option_value(v), cfg, src);
    }
  };
  add(sets("output_dir", T::kStr, "./output", "output-dir", "`--output-dir`"));
}

std::vector<Key> build_keys() {
  std::vector<Key> t;
  add_model_keys(t);
  add_model_capture_server_keys(t);
  add_data_keys(t);
  add_tracking_keys(t);
  add_profiling_keys(t);
  add_runtime_keys(t);
  add_deployment_keys(t);
  add_training_loop_keys(t);
  add_training_objective_keys(t);
  add_training_run_keys(t);
  add_top_level_keys(t);
  return t;
}

// ---- reading ----------------------------------------------------------------------------------

std::string where(const std::string& source, const YAML::Mark& mark) {
  if (mark.line < 0) return source;
  return str(source, ":", mark.line + 1);
}

std::string closest_key(const std::string& path) {
  const std::string section =
      path.substr(0, path.rfind('.') == std::string::npos ? 0 : path.rfind('.'));
  std::string best;
  size_t best_d = 0;
  for (const auto& k : keys()) {
    const std::string ks =
        k.path.substr(0, k.path.rfind('.') == std::string::npos ? 0 : k.path.rfind('.'));
    if (ks != section) continue;
    const size_t d = detail::edit_distance(path, k.path);
    if (best.empty() || d < best_d) {
      best = k.path;
      best_d = d;
    }
  }
  return best;
}

[[noreturn]] void unknown_key(const std::string& path, const std::string& at) {
  const std::string guess = closest_key(path);
  FSDP_USAGE_CHECK(
      false,
      str(at, ": unknown key '", path, "' (SpecForge's schema forbids keys it does not define)"),
      guess.empty()
          ? std::string("docs/migration-from-specforge.md lists every key")
          : str("did you mean '", guess, "'? docs/migration-from-specforge.md lists every key"));
  std::abort();
}

// Reads one leaf of the file into `out` (type checks come later, for file and overrides alike).
Value leaf_value(const Key& k, const YAML::Node& node, const std::string& at) {
  Value v;
  v.given = true;
  v.where = at;
  if (node.IsNull()) {
    v.is_null = true;
    return v;
  }
  if (k.type == T::kMap) {
    v.text = "{...}";
    return v;
  }
  if (node.IsSequence()) {
    FSDP_USAGE_CHECK(k.type == T::kIntList || k.type == T::kOptIntList || k.type == T::kStrList,
                     str(at, ": ", k.path, " takes a single value, not a list"),
                     str("write ", k.path.substr(k.path.rfind('.') + 1), ": <", type_text(k), ">"));
    std::string text = "[";
    for (const auto& item : node) {
      FSDP_USAGE_CHECK(item.IsScalar(), str(at, ": ", k.path, " must be a list of plain values"),
                       "write e.g. [1, 2, 3]");
      v.list.push_back(item.Scalar());
      text += (v.list.size() > 1 ? ", " : "") + item.Scalar();
    }
    v.text = text + "]";
    return v;
  }
  FSDP_USAGE_CHECK(node.IsScalar(), str(at, ": ", k.path, " takes a single value, not a mapping"),
                   str("write ", k.path.substr(k.path.rfind('.') + 1), ": <", type_text(k), ">"));
  v.text = node.Scalar();
  if (k.type == T::kIntList || k.type == T::kOptIntList || k.type == T::kStrList) {
    FSDP_USAGE_FAIL(str(at, ": ", k.path, " takes a list"), "write e.g. [1, 2, 3]");
  }
  return v;
}

void walk(const YAML::Node& map, const std::string& prefix, const std::string& source,
          std::map<std::string, Value>* out) {
  std::set<std::string> seen;
  for (const auto& kv : map) {
    const std::string at = where(source, kv.first.Mark());
    FSDP_USAGE_CHECK(kv.first.IsScalar(), str(at, ": keys must be plain words"),
                     "write key: value pairs inside each section");
    const std::string path = prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar();
    // YAML parsers differ on repeated keys (PyYAML keeps the last silently): refused.
    FSDP_USAGE_CHECK(seen.insert(path).second && out->count(path) == 0,
                     str(at, ": '", path, "' is given twice"), "keep one of them");
    if (sections().count(path)) {
      if (kv.second.IsNull()) continue;  // an empty section: its defaults
      FSDP_USAGE_CHECK(kv.second.IsMap(), str(at, ": '", path, "' is a section and must hold keys"),
                       str("write ", path, ":\\n  key: value"));
      walk(kv.second, path, source, out);
      continue;
    }
    const Key* k = find_key(path);
    if (k == nullptr) unknown_key(path, at);
    (*out)[path] = leaf_value(*k, kv.second, at);
  }
}

// SpecForge's migrate_legacy_config: training.deployment_mode / server_urls / metadata_db_path
// of older files move to the deployment section.
void migrate_legacy(std::map<std::string, Value>* values) {
  auto take = [&](const std::string& path) -> std::optional<Value> {
    auto it = values->find(path);
    if (it == values->end()) return std::nullopt;
    Value v = it->second;
    values->erase(it);
    return v;
  };
  const auto mode = take("training.deployment_mode");
  const auto urls = take("training.server_urls");
  const auto db = take("training.metadata_db_path");
  if (mode) {
    auto it = values->find("deployment.mode");
    FSDP_USAGE_CHECK(it == values->end() || it->second.text == mode->text,
                     str(mode->where,
                         ": deployment.mode conflicts with the legacy "
                         "training.deployment_mode"),
                     "keep deployment.mode only");
    (*values)["deployment.mode"] = *mode;
  } else if ((urls || db) && !values->count("deployment.mode")) {
    Value v;
    v.given = true;
    v.text = "disaggregated";
    v.where = (urls ? urls : db)->where;
    (*values)["deployment.mode"] = v;
  }
  if (urls) (*values)["deployment.disaggregated.server_urls"] = *urls;
  if (db) {
    const std::string p = db->text;
    const size_t slash = p.rfind('/');
    const std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
    FSDP_USAGE_CHECK(base == "consumer.sqlite",
                     str(db->where,
                         ": legacy training.metadata_db_path must end in "
                         "consumer.sqlite"),
                     "use deployment.disaggregated.consumer_state_dir instead");
    Value v = *db;
    v.text = slash == std::string::npos ? "." : p.substr(0, slash);
    (*values)["deployment.disaggregated.consumer_state_dir"] = v;
  }
}

// One dotted override "path=value", as SpecForge's apply_overrides takes it: the path must be
// a key of the schema; the value is text, coerced to the key's type (a list may be written
// "[1, 2]").
void apply_override(const std::string& item, std::map<std::string, Value>* values) {
  const size_t eq = item.find('=');
  FSDP_USAGE_CHECK(eq != std::string::npos && eq > 0,
                   str("override '", item, "' is not of the form section.key=value"),
                   "write e.g. training.learning_rate=5e-5 after --config FILE");
  const std::string path = item.substr(0, eq);
  const std::string text = item.substr(eq + 1);
  const std::string at = str("override ", item);
  if (sections().count(path)) {
    FSDP_USAGE_FAIL(str(at, ": '", path, "' is a section, not a key"),
                    str("override one key of it, e.g. ", path, ".<key>=value"));
  }
  const Key* k = find_key(path);
  if (k == nullptr) {
    const std::string guess = closest_key(path);
    FSDP_USAGE_FAIL(str(at, ": override path '", path, "' does not exist"),
                    guess.empty() ? std::string("docs/migration-from-specforge.md lists every key")
                                  : str("did you mean '", guess, "'?"));
  }
  FSDP_USAGE_CHECK(k->type != T::kMap, str(at, ": ", path, " is a mapping"), "set it in the file");
  Value v;
  v.given = true;
  v.where = at;
  const bool list = k->type == T::kIntList || k->type == T::kOptIntList || k->type == T::kStrList;
  if (list && !text.empty() && text.find_first_not_of(" \t") != std::string::npos &&
      text[text.find_first_not_of(" \t")] == '[') {
    YAML::Node n;
    try {
      n = YAML::Load(text);
    } catch (const YAML::Exception&) {
      FSDP_USAGE_FAIL(str(at, ": '", text, "' is not a valid list"), "write e.g. [1, 2, 3]");
    }
    FSDP_USAGE_CHECK(n.IsSequence(), str(at, ": '", text, "' is not a list"),
                     "write e.g. [1, 2, 3]");
    v = leaf_value(*k, n, at);
  } else if (optional_type(k->type) && k->type != T::kOptStr &&
             (text == "null" || text == "~" || text == "None" || text == "none")) {
    v.is_null = true;
  } else if (list) {
    FSDP_USAGE_FAIL(str(at, ": ", path, " takes a list"), "write e.g. [1, 2, 3]");
  } else {
    v.text = text;
  }
  (*values)[path] = v;
}

// SpecForge's default of a key as a value (the table's text form).
Value default_value(const Key& k) {
  Value v;
  if (k.def == "null") {
    v.is_null = true;
  } else if (k.def == "\"\"") {
    v.text = "";
  } else if (k.def == "[]") {
    v.text = "[]";
  } else {
    v.text = k.def;
  }
  v.where = "default";
  return v;
}

// pydantic's lax bool: true/false, yes/no, on/off, 1/0, t/f, y/n (any case).
bool schema_bool(const std::string& text, const std::string& src) {
  const std::string t = detail::to_lower(text);
  if (t == "true" || t == "yes" || t == "on" || t == "1" || t == "t" || t == "y") return true;
  if (t == "false" || t == "no" || t == "off" || t == "0" || t == "f" || t == "n") return false;
  return parse_bool(text, src);  // throws with the common message
}

// Type, choice and range checks of one value; canonicalises booleans and numbers in `v.text`.
void check_value(const Key& k, Value& v) {
  const std::string src = str(v.where, " ", k.path);
  if (v.is_null) {
    FSDP_USAGE_CHECK(optional_type(k.type) || k.type == T::kMap, str(src, ": may not be null"),
                     str("give a ", type_text(k)));
    return;
  }
  auto in_range = [&](double x) {
    if (!k.range) return;
    const Range& r = *k.range;
    const bool ok = (r.lo_open ? x > r.lo : x >= r.lo) && (r.hi_open ? x < r.hi : x <= r.hi);
    FSDP_USAGE_CHECK(ok, str(src, ": ", v.text, " is out of range (", type_text(k), ")"),
                     str("give a ", type_text(k)));
  };
  switch (k.type) {
    case T::kInt:
    case T::kOptInt: {
      // pydantic accepts 3 and "3" and 3.0, not 3.5.
      int64_t n = 0;
      try {
        n = parse_int(v.text, src);
      } catch (const UsageError&) {
        const double x = parse_float(v.text, src);
        FSDP_USAGE_CHECK(std::floor(x) == x && std::fabs(x) < 9.0e15,
                         str(src, ": '", v.text, "' is not a whole number"),
                         str("give a ", type_text(k)));
        n = static_cast<int64_t>(x);
      }
      in_range(static_cast<double>(n));
      v.text = std::to_string(n);
      break;
    }
    case T::kFloat:
    case T::kOptFloat: {
      const double x = parse_float(v.text, src);
      in_range(x);
      break;
    }
    case T::kBool:
    case T::kOptBool:
      v.text = schema_bool(v.text, src) ? "true" : "false";
      break;
    case T::kEnum:
    case T::kOptEnum:
      FSDP_USAGE_CHECK(std::find(k.choices.begin(), k.choices.end(), v.text) != k.choices.end(),
                       str(src, ": '", v.text, "' is not ", type_text(k)),
                       str("give ", type_text(k)));
      break;
    case T::kIntList:
    case T::kOptIntList:
      for (auto& item : v.list) item = std::to_string(parse_int(item, src));
      break;
    default:
      break;
  }
}

bool same_as_default(const Key& k, const Value& v) {
  const Value d = default_value(k);
  if (v.is_null || d.is_null) return v.is_null == d.is_null;
  switch (k.type) {
    case T::kFloat:
    case T::kOptFloat:
      return parse_float(v.text, k.path) == parse_float(d.text, k.path);
    case T::kBool:
    case T::kOptBool:
      return schema_bool(v.text, k.path) == schema_bool(d.text, k.path);
    case T::kStrList:
    case T::kIntList:
    case T::kOptIntList:
      return v.list.empty() && d.text == "[]";
    default:
      return v.text == d.text;
  }
}

// Reads the file and the overrides into one value per key (given or default).
std::map<std::string, Value> read_values(const std::string& text, const std::string& source,
                                         const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    FSDP_USAGE_FAIL(str(where(source, e.mark), ": YAML syntax error: ", e.msg), "fix the file");
  }
  FSDP_USAGE_CHECK(root.IsMap(), str(source, ": the top level must be a mapping of sections"),
                   "write model:, data:, training: ... sections");
  std::map<std::string, Value> given;
  // The legacy keys of training (SpecForge migrates them before validation).
  for (const char* legacy : {"deployment_mode", "server_urls", "metadata_db_path"}) {
    YAML::Node tr = root["training"];
    if (!tr || !tr.IsMap() || !tr[legacy]) continue;
    Value v;
    v.given = true;
    v.where = where(source, tr[legacy].Mark());
    if (tr[legacy].IsSequence()) {
      for (const auto& item : tr[legacy]) v.list.push_back(item.Scalar());
    } else if (tr[legacy].IsScalar()) {
      v.text = tr[legacy].Scalar();
    }
    given[str("training.", legacy)] = v;
    tr.remove(legacy);
  }
  walk(root, "", source, &given);
  migrate_legacy(&given);
  for (const auto& o : overrides) apply_override(o, &given);
  return given;
}

std::string value_text(const Value& v) {
  return v.is_null ? "null" : (v.text.empty() ? "\"\"" : v.text);
}

// ---- applying a typed file ---------------------------------------------------------------------

// Every key's value after the file and the overrides: given, else SpecForge's default, type- and
// range-checked. deployment.disaggregated's keys are there only when the file has that section.
struct Resolved {
  std::map<std::string, Value> all;
  std::string source;       // the file's name, for messages about no single key
  bool has_disagg = false;  // the file has a deployment.disaggregated section

  const Value& val(const std::string& p) const { return all.at(p); }
  const std::string& text(const std::string& p) const { return val(p).text; }
  double num(const std::string& p) const { return parse_float(val(p).text, p); }
  bool is_set(const std::string& p) const { return !val(p).is_null && !val(p).text.empty(); }
  // Where a key's value came from, for messages: "run.yaml:12 training.seed".
  std::string at(const std::string& p) const {
    const Value& v = val(p);
    return v.given ? str(v.where, " ", p) : str(source, " ", p);
  }
};

Resolved resolve_values(const std::string& text, const std::string& source,
                        const std::vector<std::string>& overrides) {
  const std::map<std::string, Value> given = read_values(text, source, overrides);
  Resolved r;
  r.source = source;
  r.has_disagg = std::any_of(given.begin(), given.end(), [](const auto& kv) {
    return kv.first.rfind("deployment.disaggregated.", 0) == 0;
  });
  for (const auto& k : keys()) {
    auto it = given.find(k.path);
    if (it == given.end()) {
      if (k.path.rfind("deployment.disaggregated.", 0) == 0 && !r.has_disagg) continue;
      FSDP_USAGE_CHECK(!k.required, str(source, ": ", k.path, " is required"),
                       str("add ", k.path.substr(k.path.rfind('.') + 1), ": <", type_text(k), ">"));
      r.all[k.path] = default_value(k);
      continue;
    }
    Value v = it->second;
    check_value(k, v);
    r.all[k.path] = v;
  }
  return r;
}

// SpecForge's cross-key checks (schema.py's validators), the offline subset plus topology, one
// function per section. deployment (and training.role, whose default it decides):
void check_deployment(Resolved& r) {
  const std::string mode = r.text("deployment.mode");
  FSDP_USAGE_CHECK(
      mode != "disaggregated" || r.has_disagg,
      str(r.at("deployment.mode"), ": disaggregated needs a deployment.disaggregated section"),
      "add deployment.disaggregated (control_dir, backend) or use local_colocated");
  FSDP_USAGE_CHECK(
      mode == "disaggregated" || !r.has_disagg,
      str(r.source, ": deployment.disaggregated requires deployment.mode=disaggregated"),
      "set deployment.mode: disaggregated or drop the section");
  Value& role = r.all["training.role"];
  if (!role.given) role.text = mode == "disaggregated" ? "auto" : "all";
  FSDP_USAGE_CHECK(
      role.text == "all" || mode == "disaggregated",
      str(r.at("training.role"), ": role ", role.text, " requires deployment.mode=disaggregated"),
      "drop training.role (all is the colocated default)");
  FSDP_USAGE_CHECK(role.text != "all" || mode != "disaggregated",
                   str(r.at("training.role"),
                       ": deployment.mode=disaggregated requires role auto, producer or consumer"),
                   "set training.role: auto");
  if (!r.val("deployment.trainer.node_rank").is_null) {
    FSDP_USAGE_CHECK(r.num("deployment.trainer.node_rank") < r.num("deployment.trainer.nnodes"),
                     str(r.at("deployment.trainer.node_rank"), ": must be smaller than nnodes"),
                     "fix node_rank");
  }
  FSDP_USAGE_CHECK(
      r.num("deployment.trainer.nnodes") <= 1 || r.is_set("deployment.trainer.master_addr"),
      str(r.at("deployment.trainer.nnodes"), ": master_addr is required when nnodes > 1"),
      "set deployment.trainer.master_addr");
  if (r.has_disagg) {
    FSDP_USAGE_CHECK(r.text("deployment.disaggregated.backend") != "shared_dir" ||
                         r.is_set("deployment.disaggregated.store_root"),
                     str(r.source,
                         ": deployment.disaggregated.store_root is required for "
                         "shared_dir"),
                     "set store_root");
  }
}

// data: one source (offline: the hidden states), evaluation features with an interval. (An
// online evaluation path, data.eval_data_path, is a refused key of the table.)
void check_data(const Resolved& r) {
  const int sources = (r.is_set("data.train_data_path") ? 1 : 0) +
                      (r.is_set("data.prompts_path") ? 1 : 0) +
                      (r.is_set("data.hidden_states_path") ? 1 : 0);
  FSDP_USAGE_CHECK(sources == 1,
                   str(r.source,
                       ": set exactly one of data.train_data_path, data.prompts_path or "
                       "data.hidden_states_path"),
                   "fsdp-train trains offline: set data.hidden_states_path to the dumped "
                   "hidden states");
  FSDP_USAGE_CHECK(
      r.is_set("data.eval_hidden_states_path") == (r.num("training.eval_interval") > 0),
      str(r.source,
          ": data.eval_hidden_states_path and training.eval_interval must be configured "
          "together (SpecForge's rule)"),
      "give both, or neither");
}

// training's sequence-parallel layout: USP needs batch 1 and more than one rank per sample, and
// sequence-parallel sizes need USP.
void check_sequence_parallel(const Resolved& r) {
  const double sp = r.num("training.sp_ulysses_size") * r.num("training.sp_ring_size");
  if (r.text("training.attention_backend") == "usp") {
    FSDP_USAGE_CHECK(
        r.num("training.batch_size") == 1,
        str(r.at("training.attention_backend"), ": USP attention requires training.batch_size=1"),
        "set batch_size: 1");
    FSDP_USAGE_CHECK(sp > 1,
                     str(r.at("training.attention_backend"),
                         ": USP attention requires sp_ulysses_size * sp_ring_size > 1"),
                     "set the sequence-parallel sizes, or another attention_backend");
  } else {
    FSDP_USAGE_CHECK(sp == 1,
                     str(r.source,
                         ": training.sp_ulysses_size/sp_ring_size require "
                         "training.attention_backend=usp"),
                     "set attention_backend: usp, or the sizes to 1");
  }
}

// training. (tp_size other than 1 is refused by --tp-size's row, which the key sets.)
void check_training(const Resolved& r) {
  FSDP_USAGE_CHECK(
      r.val("training.compact_teacher_chunk_size").is_null ||
          r.text("training.compact_teacher") == "true",
      str(r.at("training.compact_teacher_chunk_size"), ": requires training.compact_teacher=true"),
      "drop compact_teacher_chunk_size");
  check_sequence_parallel(r);
  FSDP_USAGE_CHECK(
      r.val("model.draft_checkpoint_path").is_null || r.val("training.resume_from").is_null,
      str(r.source,
          ": model.draft_checkpoint_path (weights-only warm start) and "
          "training.resume_from (full resume) are mutually exclusive"),
      "keep one of them");
  FSDP_USAGE_CHECK(
      r.val("training.norm_before_residual").is_null || r.val("training.strategy").text != "peagle",
      str(r.at("training.norm_before_residual"),
          ": would override the P-EAGLE draft config's norm_before_residual, which fsdp-train "
          "reads from the draft config only"),
      "write \"norm_before_residual\" in the draft config JSON and drop "
      "training.norm_before_residual");
  FSDP_USAGE_CHECK(
      r.num("training.down_sample_ratio_min") > 0 &&
          r.num("training.down_sample_ratio_min") <= r.num("training.down_sample_ratio"),
      str(r.at("training.down_sample_ratio_min"), ": must be in (0, training.down_sample_ratio]"),
      "fix the ratio");
}

void check_runtime(const Resolved& r) {
  FSDP_USAGE_CHECK(
      r.num("runtime.in_flight_low_watermark") <= r.num("runtime.in_flight_high_watermark"),
      str(r.source,
          ": runtime.in_flight_low_watermark must be <= runtime.in_flight_high_watermark"),
      "fix the watermarks");
}

void check_model(const Resolved& r) {
  const std::string& mod = r.text("model.input_modality");
  FSDP_USAGE_CHECK(
      !mod.empty() && mod.find_first_of(" \t\n") == std::string::npos,
      str(r.at("model.input_modality"), ": must be a non-empty identifier without whitespace"),
      "write input_modality: text");
}

// Refused keys that differ from SpecForge's default fail with the reason; refused keys at their
// default and recorded keys given are recorded (specforge_flags, and a report line).
void apply_refusals_and_records(const Resolved& r, TrainConfig* cfg, SchemaLoad* out) {
  for (const auto& k : keys()) {
    auto it = r.all.find(k.path);
    if (it == r.all.end()) continue;
    const Value& v = it->second;
    if (k.use == SchemaUse::kRefused) {
      const std::string reason =
          k.refusal ? k.refusal(v) : (same_as_default(k, v) ? std::string() : k.effect);
      FSDP_USAGE_CHECK(reason.empty(),
                       str(r.at(k.path), ": ", value_text(v), " is not supported: ",
                           k.refusal ? reason : k.effect.substr(k.effect.find(": ") + 2)),
                       k.hint);
      if (v.given && !same_as_default(k, v)) cfg->specforge_flags[k.path] = value_text(v);
    } else if (k.use == SchemaUse::kRecorded && v.given && !same_as_default(k, v)) {
      cfg->specforge_flags[k.path] = value_text(v);
      out->report.push_back(str(k.path, " = ", value_text(v), ": ", k.effect));
    }
  }
}

// The keys that set options, in table order but for those that read others' results:
// torch_dtype after fsdp_sharding, run_id after the tracking names it fills.
std::vector<const Key*> settings_order() {
  const std::set<std::string> late = {"model.torch_dtype", "run_id"};
  std::vector<const Key*> order;
  for (const auto& k : keys())
    if (k.use == SchemaUse::kSets && !late.count(k.path)) order.push_back(&k);
  for (const auto& p : late) order.push_back(find_key(p));
  return order;
}

// Every key that sets an option writes it through the option table (its value, or SpecForge's
// default); the options the file gave are listed in out->set_options.
void apply_settings(const Resolved& r, TrainConfig* cfg, SchemaLoad* out) {
  for (const Key* kp : settings_order()) {
    const Key& k = *kp;
    auto it = r.all.find(k.path);
    if (it == r.all.end()) continue;
    const Value& v = it->second;
    const std::string src = r.at(k.path);
    // SpecForge's flags without effect here (tp_size, chat_template, ...): recorded when given.
    if (!v.given && !k.option.empty() && option(k.option).cli_only) continue;
    if (k.apply) {
      k.apply(k, v, *cfg, src);
    } else if (!v.is_null) {
      set_option(k.option, option_value(v), *cfg, src);
    }
    if (v.given && !k.option.empty()) {
      const OptionSpec& spec = option(k.option);
      out->set_options.push_back(spec.alias_of.empty() ? spec.name : spec.alias_of);
    }
  }
}

// specforge train's semantics where they differ from the offline script's defaults
// (docs/migration-from-specforge.md): no per-epoch checkpoints or evaluations (its counters
// are optimizer updates: save_interval and eval_interval above), a draft config made from the
// target's own fields. Flags after the file may still change them.
void apply_typed_semantics(const std::string& source, TrainConfig* cfg) {
  const std::string semantics = str(source, " (SpecForge's typed schema)");
  set_option("save-interval", OptionValue{false, "0", {}}, *cfg, semantics);
  set_option("eval-interval", OptionValue{false, "0", {}}, *cfg, semantics);
  set_option("auto-draft-config", OptionValue{false, "target", {}}, *cfg, semantics);
}

// deployment.trainer's rank count against the run's (a report line when they differ: the global
// batch then differs from SpecForge's).
void note_world_size(const Resolved& r, int world_size, SchemaLoad* out) {
  const int64_t ranks = static_cast<int64_t>(r.num("deployment.trainer.nnodes") *
                                             r.num("deployment.trainer.nproc_per_node"));
  if (world_size <= 0 || ranks == world_size) return;
  out->report.push_back(str("warning: deployment.trainer asks for ", ranks, " rank(s) (nnodes ",
                            r.text("deployment.trainer.nnodes"), " x nproc_per_node ",
                            r.text("deployment.trainer.nproc_per_node"), "); this run has ",
                            world_size, ": the global batch is batch_size x ", world_size,
                            " x accumulation_steps (launch with fsdp-train --nproc-per-node ",
                            ranks, " or mpirun -np ", ranks, " for SpecForge's)"));
}

}  // namespace

const std::vector<SchemaKeyDoc>& specforge_schema_keys() {
  static const std::vector<SchemaKeyDoc> docs = [] {
    std::vector<SchemaKeyDoc> out;
    for (const auto& k : keys()) out.push_back({k.path, type_text(k), k.def, k.use, k.effect});
    return out;
  }();
  return docs;
}

std::string specforge_schema_markdown() {
  std::string s = "| key | type | SpecForge default | in fsdp-train |\n|---|---|---|---|\n";
  for (const auto& d : specforge_schema_keys()) {
    std::string effect = d.effect;
    // A '|' inside a cell would split it.
    for (size_t p = effect.find('|'); p != std::string::npos; p = effect.find('|', p + 2))
      effect.replace(p, 1, "\\|");
    std::string def = d.default_text == "\"\"" ? "`\"\"`" : "`" + d.default_text + "`";
    if (d.default_text == "required" || d.default_text.find(' ') != std::string::npos)
      def = d.default_text;
    s += str("| `", d.path, "` | ", d.type, " | ", def, " | ", effect, " |\n");
  }
  return s;
}

namespace detail {

bool is_specforge_schema_text(const std::string& text) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception&) {
    return false;  // the flat reader reports the syntax error
  }
  if (!root.IsMap()) return false;
  for (const char* s :
       {"model", "data", "training", "tracking", "profiling", "runtime", "deployment"}) {
    const YAML::Node n = root[s];
    if (n && n.IsMap()) return true;
  }
  return false;
}

SchemaLoad apply_specforge_schema(const std::string& text, const std::string& source_name,
                                  const std::vector<std::string>& overrides, int world_size,
                                  TrainConfig* cfg) {
  Resolved r = resolve_values(text, source_name, overrides);
  check_deployment(r);
  check_data(r);
  check_training(r);
  check_runtime(r);
  check_model(r);
  SchemaLoad out;
  apply_refusals_and_records(r, cfg, &out);
  apply_settings(r, cfg, &out);
  apply_typed_semantics(source_name, cfg);
  note_world_size(r, world_size, &out);
  return out;
}

}  // namespace detail

}  // namespace fsdp::config
