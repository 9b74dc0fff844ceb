// ds_config -> fsdp-train options (deepspeed.h), key by key as
// docs/migration-from-deepspeed.md says. Every key the user wrote ends up in the report: mapped,
// derived from "auto", accepted and ignored (with a warning), or rejected with a UsageError. Never
// drops a key silently.
#include "compat/deepspeed.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "config/value_parse.h"
#include "core/error.h"

namespace fsdp::config {

namespace {

using json = nlohmann::json;

class Translator {
 public:
  Translator(const json& root, std::string source, const DeepSpeedContext& ctx)
      : root_(root), src_(std::move(source)), ctx_(ctx) {
    FSDP_ASSERT(ctx.base != nullptr, "DeepSpeedContext.base is required");
  }

  DeepSpeedTranslation run() {
    FSDP_USAGE_CHECK(root_.is_object(), str(src_, ": the top level must be a JSON object"),
                     "pass the ds_config JSON file you gave deepspeed");
    precision();
    batch();
    optimizer();
    scheduler();
    zero();
    misc();
    for (const auto& [key, value] : root_.items()) {
      if (!handled_.count(key)) warn(key, "unknown to fsdp-train; ignored");
    }
    if (!always_on_.empty()) {
      std::string keys;
      for (const auto& k : always_on_) keys += (keys.empty() ? "" : ", ") + k;
      warn("zero_optimization",
           "accepted and not needed (fsdp-train always overlaps "
           "communication per unit and keeps gradients contiguous): " +
               keys);
    }
    return std::move(out_);
  }

 private:
  static bool is_auto(const json& j) { return j.is_string() && j.get<std::string>() == "auto"; }

  std::string fmt(const json& j) const { return j.is_string() ? j.get<std::string>() : j.dump(); }

  int64_t as_int(const json& j, const std::string& key) const {
    FSDP_USAGE_CHECK(j.is_number() && std::floor(j.get<double>()) == j.get<double>(),
                     str(src_, " ", key, ": expected an integer or \"auto\", got ", j.dump()),
                     "fix the ds_config value");
    if (j.is_number_unsigned()) {
      FSDP_USAGE_CHECK(j.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
                       str(src_, " ", key, ": ", j.dump(), " is out of range"),
                       "fix the ds_config value: write a whole number of sensible size");
      return static_cast<int64_t>(j.get<uint64_t>());
    }
    if (j.is_number_integer()) return j.get<int64_t>();
    FSDP_USAGE_CHECK(std::fabs(j.get<double>()) < 9.0e18,
                     str(src_, " ", key, ": ", j.dump(), " is out of range"),
                     "fix the ds_config value: write a whole number of sensible size");
    return static_cast<int64_t>(j.get<double>());
  }
  double as_double(const json& j, const std::string& key) const {
    FSDP_USAGE_CHECK(j.is_number(),
                     str(src_, " ", key, ": expected a number or \"auto\", got ", j.dump()),
                     "fix the ds_config value");
    return j.get<double>();
  }
  bool as_bool(const json& j, const std::string& key) const {
    if (j.is_boolean()) return j.get<bool>();
    if (j.is_number_integer()) return j.get<int64_t>() != 0;
    FSDP_USAGE_FAIL(str(src_, " ", key, ": expected true or false, got ", j.dump()),
                    "fix the ds_config value: write true or false");
  }

  // `ds_text`: the value as written in the ds_config when it differs from the option's text.
  void set(const std::string& option, const std::string& text, const std::string& key,
           const std::string& ds_text = "") {
    OptionValue v;
    v.text = text;
    out_.settings.emplace_back(option, v);
    out_.setting_source[option] = key;
    out_.report.push_back(
        str(key, " = ", ds_text.empty() ? text : ds_text, "  ->  --", option, " ", text));
  }
  void note(const std::string& key, const std::string& what) {
    out_.report.push_back(str(key, ": ", what));
  }
  void warn(const std::string& key, const std::string& what) {
    out_.warnings.push_back(str(key, ": ", what));
    out_.report.push_back(str("warning: ", key, ": ", what));
  }
  // "auto" values keep fsdp-train's current value for `option`.
  void auto_note(const std::string& key, const std::string& option) {
    const OptionSpec* spec = find_option(option);
    note(key, str("auto -> --", option, " ", spec->get(*ctx_.base).text));
  }

  const json* find(const json& obj, const std::string& key) {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }
  const json* top(const std::string& key) {
    handled_.insert(key);
    return find(root_, key);
  }

  void precision() {
    const json* fp16 = top("fp16");
    const json* amp = top("amp");
    const json* bf16 = top("bf16");
    using Section = std::pair<const char*, const json*>;
    for (const auto& [name, sec] :
         std::initializer_list<Section>{{"fp16", fp16}, {"amp", amp}, {"bf16", bf16}}) {
      FSDP_USAGE_CHECK(
          !sec || sec->is_object(),
          str(src_, " \"", name, "\" is ", sec ? sec->type_name() : "", ", not a section"),
          str("DeepSpeed writes it as \"", name, "\": {\"enabled\": true}"));
    }
    for (const auto& [name, sec] : std::initializer_list<Section>{{"fp16", fp16}, {"amp", amp}}) {
      if (!sec) continue;
      const json* en = sec->is_object() ? find(*sec, "enabled") : nullptr;
      const bool on = en && !is_auto(*en) && as_bool(*en, str(name, ".enabled"));
      FSDP_USAGE_CHECK(!on,
                       str(src_, " ", name,
                           ".enabled is true: fp16/AMP training with loss "
                           "scaling is not supported by fsdp-train"),
                       "use bf16 instead: set \"bf16\": {\"enabled\": true} and remove the " +
                           std::string(name) +
                           " section (bf16 needs no loss scaling and has fp32's range)");
      note(str(name, ".enabled"),
           en && is_auto(*en) ? "auto -> off (fsdp-train trains in bf16)" : "false: nothing to do");
    }
    if (bf16) {
      const json* en = bf16->is_object() ? find(*bf16, "enabled") : nullptr;
      if (!en || is_auto(*en)) {
        auto_note("bf16.enabled", "mixed-precision");
      } else {
        set("mixed-precision", as_bool(*en, "bf16.enabled") ? "bf16" : "fp32", "bf16.enabled",
            fmt(*en));
      }
      for (const auto& [k, v] : bf16->items()) {
        if (k != "enabled") warn("bf16." + k, "ignored (bf16 keeps fp32 master weights always)");
      }
    } else if (!(fp16 || amp)) {
      const auto& ex = ctx_.explicit_options;
      if (std::find(ex.begin(), ex.end(), "mixed-precision") != ex.end()) {
        note("bf16", "absent; keeping the explicit --mixed-precision");
      } else {
        note("bf16", "absent: DeepSpeed would train in fp32");
        set("mixed-precision", "fp32", "bf16 (absent)");
      }
    }
  }

  void batch() {
    const json* tbs = top("train_batch_size");
    const json* mbs = top("train_micro_batch_size_per_gpu");
    const json* gas = top("gradient_accumulation_steps");
    const int ws = ctx_.world_size;
    std::optional<int64_t> t, m, g;
    if (tbs && !is_auto(*tbs)) t = as_int(*tbs, "train_batch_size");
    if (mbs && !is_auto(*mbs)) m = as_int(*mbs, "train_micro_batch_size_per_gpu");
    if (gas && !is_auto(*gas)) g = as_int(*gas, "gradient_accumulation_steps");
    // Batch sizes above the global batch's bound (the option table's; the micro-batch flag's is
    // lower) are refused here, so the products below cannot overflow.
    const auto max_batch = static_cast<int64_t>(option("draft-global-batch-size").bounds->max);
    const auto bounded = [&](const std::optional<int64_t>& v, const char* key) {
      FSDP_USAGE_CHECK(!v || (*v >= 1 && *v <= max_batch),
                       str(src_, " ", key, ": ", v ? *v : 0, " is outside [1, ", max_batch, "]"),
                       str("fix ", key, " in the ds_config, or set it to \"auto\""));
    };
    bounded(t, "train_batch_size");
    bounded(m, "train_micro_batch_size_per_gpu");
    bounded(g, "gradient_accumulation_steps");
    const auto product = [&](int64_t a, int64_t b) {
      int64_t r = 0;
      FSDP_USAGE_CHECK(
          !__builtin_mul_overflow(a, b, &r) && !__builtin_mul_overflow(r, int64_t{ws}, &r),
          str(src_, ": train_micro_batch_size_per_gpu ", a, " x gradient_accumulation_steps ", b,
              " x ", ws, " ranks overflows"),
          "fix the ds_config batch sizes");
      return r;
    };
    if (t && m && g && ws > 0) {
      FSDP_USAGE_CHECK(
          *t == product(*m, *g),
          str(src_, ": train_batch_size ", *t, " != train_micro_batch_size_per_gpu ", *m,
              " x gradient_accumulation_steps ", *g, " x ", ws, " ranks = ", product(*m, *g)),
          "make the three agree, or set one of them to \"auto\"");
    }
    // Derive the auto member of the triple when the other two and the world size are known.
    if (!t && m && g && ws > 0) t = product(*m, *g);
    if (t && !m && g && ws > 0 && *t % (*g * ws) == 0) m = *t / (*g * ws);
    if (m)
      set("draft-micro-batch-size", std::to_string(*m), "train_micro_batch_size_per_gpu");
    else if (mbs)
      auto_note("train_micro_batch_size_per_gpu", "draft-micro-batch-size");
    if (t) {
      set("draft-global-batch-size", std::to_string(*t),
          tbs && !is_auto(*tbs) ? "train_batch_size"
                                : "train_batch_size (auto: micro x accum x ranks)");
    } else if (tbs) {
      auto_note("train_batch_size", "draft-global-batch-size");
    }
    if (g)
      set("gradient-accumulation-steps", std::to_string(*g), "gradient_accumulation_steps");
    else if (gas)
      note("gradient_accumulation_steps", "auto -> global / (ranks x micro), derived at start-up");
    if (!t && m && g && ws <= 0) {
      note("train_batch_size", "derived at start-up as micro x accumulation x ranks");
    }
    if (const json* clip = top("gradient_clipping")) {
      if (is_auto(*clip))
        auto_note("gradient_clipping", "max-grad-norm");
      else
        set("max-grad-norm", detail::format_float(as_double(*clip, "gradient_clipping")),
            "gradient_clipping");
    }
  }

  void optimizer() {
    const json* opt = top("optimizer");
    if (!opt) return;
    const json* type = find(*opt, "type");
    const std::string t =
        type && type->is_string() ? detail::to_lower(type->get<std::string>()) : "";
    const json* params = find(*opt, "params");
    bool adamw = t == "adamw" || t == "fusedadam" || t == "cpuadam";
    if (t == "adam") {
      const json* mode = params ? find(*params, "adam_w_mode") : nullptr;
      adamw = !mode || as_bool(*mode, "optimizer.params.adam_w_mode");
      if (!adamw) {
        const json* wd = params ? find(*params, "weight_decay") : nullptr;
        const double w = wd && !is_auto(*wd) ? as_double(*wd, "optimizer.params.weight_decay") : 0;
        FSDP_USAGE_CHECK(w == 0,
                         str(src_, " optimizer: Adam with adam_w_mode false and weight_decay ", w,
                             " (L2 regularisation) is not supported"),
                         "fsdp-train implements AdamW (decoupled weight decay): set adam_w_mode "
                         "true, or weight_decay 0 (then both are identical)");
        adamw = true;
      }
    }
    FSDP_USAGE_CHECK(adamw,
                     str(src_, " optimizer.type '", type ? fmt(*type) : "", "' is not supported"),
                     "fsdp-train trains with AdamW: use \"type\": \"AdamW\"");
    note("optimizer.type", str(fmt(*type), " -> AdamW over fp32 master shards"));
    if (!params) return;
    for (const auto& [k, v] : params->items()) {
      const std::string key = "optimizer.params." + k;
      if (k == "lr") {
        if (is_auto(v))
          auto_note(key, "learning-rate");
        else
          set("learning-rate", detail::format_float(as_double(v, key)), key);
      } else if (k == "betas") {
        if (is_auto(v)) {
          auto_note(key, "adam-beta1");
          auto_note(key, "adam-beta2");
        } else {
          FSDP_USAGE_CHECK(v.is_array() && v.size() == 2,
                           str(src_, " ", key, ": expected [beta1, beta2], got ", v.dump()),
                           "fix the ds_config value, e.g. [0.9, 0.999]");
          set("adam-beta1", detail::format_float(as_double(v[0], key)), key);
          set("adam-beta2", detail::format_float(as_double(v[1], key)), key);
        }
      } else if (k == "eps") {
        if (is_auto(v))
          auto_note(key, "adam-eps");
        else
          set("adam-eps", detail::format_float(as_double(v, key)), key);
      } else if (k == "weight_decay") {
        if (is_auto(v))
          auto_note(key, "weight-decay");
        else
          set("weight-decay", detail::format_float(as_double(v, key)), key);
      } else if (k == "adam_w_mode" || k == "torch_adam" || k == "fused") {
        note(key, "accepted (fsdp-train's AdamW is fused and native)");
      } else {
        warn(key, "ignored");
      }
    }
  }

  void scheduler() {
    const json* sch = top("scheduler");
    if (!sch) return;
    const json* type = find(*sch, "type");
    const std::string t = type && type->is_string() ? type->get<std::string>() : "";
    const json* params = find(*sch, "params");
    std::string kind;
    if (t == "WarmupLR")
      kind = "constant";
    else if (t == "WarmupDecayLR")
      kind = "linear";
    else if (t == "WarmupCosineLR")
      kind = "cosine";
    if (kind.empty()) {
      warn("scheduler.type", str("'", t, "' has no equivalent; keeping --lr-scheduler ",
                                 to_string(ctx_.base->optim.lr_scheduler)));
      return;
    }
    set("lr-scheduler", kind, "scheduler.type");
    if (!params) return;
    for (const auto& [k, v] : params->items()) {
      const std::string key = "scheduler.params." + k;
      if (k == "warmup_num_steps") {
        if (is_auto(v))
          note(key, "auto -> --warmup-ratio x total steps");
        else
          set("warmup-steps", std::to_string(as_int(v, key)), key);
      } else if (k == "total_num_steps") {
        if (is_auto(v))
          auto_note(key, "total-steps");
        else
          set("total-steps", std::to_string(as_int(v, key)), key);
      } else if (k == "warmup_max_lr") {
        if (is_auto(v))
          auto_note(key, "learning-rate");
        else
          set("learning-rate", detail::format_float(as_double(v, key)), key);
      } else if (k == "warmup_min_lr" || k == "warmup_min_ratio" || k == "cos_min_ratio") {
        if (!is_auto(v) && as_double(v, key) != 0)
          warn(key, "ignored: fsdp-train warms up from 0 and decays to 0");
        else
          note(key, "0 (fsdp-train's behaviour)");
      } else if (k == "warmup_type") {
        if (fmt(v) != "linear")
          warn(key, str("'", fmt(v), "' approximated by linear warmup"));
        else
          note(key, "linear");
      } else if (k == "last_batch_iteration") {
        note(key, "ignored: resume restores the scheduler state from the checkpoint");
      } else {
        warn(key, "ignored");
      }
    }
  }

  std::string bucket(const json& v, double h_factor, const std::string& key) {
    if (is_auto(v)) {
      if (!ctx_.hidden_size) return "auto (hidden size unknown)";
      const double h = static_cast<double>(*ctx_.hidden_size);
      return str("auto = ", static_cast<int64_t>(h_factor == 10 ? 10 * h : h_factor * h * h),
                 " (from hidden size ", *ctx_.hidden_size, ")");
    }
    return std::to_string(as_int(v, key));
  }

  void offload(const json& sec, const std::string& key, bool params) {
    const json* dev = find(sec, "device");
    const std::string d = dev ? detail::to_lower(fmt(*dev)) : "none";
    FSDP_USAGE_CHECK(d != "nvme",
                     str(src_, " ", key, ".device is nvme: NVMe offload is not supported"),
                     "use \"device\": \"cpu\" (host memory) or remove the section");
    if (d == "cpu") {
      set("cpu-offload", "true", key + ".device", "cpu");
      if (params) {
        note(key,
             "parameters: their fp32 master shard lives on the host; the bf16 compute shard "
             "is gathered to the device per unit");
      }
    } else {
      note(key + ".device", str(d, ": no offload"));
    }
    for (const auto& [k, v] : sec.items()) {
      if (k == "device") continue;
      if (k == "pin_memory")
        note(key + ".pin_memory", "host buffers are pinned on GPU hosts");
      else
        warn(key + "." + k, "ignored");
    }
  }

  void zero() {
    const json* z = top("zero_optimization");
    if (!z) return;
    FSDP_USAGE_CHECK(z->is_object(), str(src_, " zero_optimization must be an object"),
                     "fix the ds_config: e.g. \"zero_optimization\": {\"stage\": 3}");
    for (const auto& [k, v] : z->items()) {
      const std::string key = "zero_optimization." + k;
      if (k == "stage") {
        const int64_t s = is_auto(v) ? 3 : as_int(v, key);
        static const char* kMap[] = {"no_shard", "shard_grad_op", "shard_grad_op", "full_shard"};
        FSDP_USAGE_CHECK(s >= 0 && s <= 3, str(src_, " ", key, " ", s, " is not 0..3"),
                         "fix the ds_config: ZeRO stages are 0, 1, 2 and 3");
        set("sharding-strategy", kMap[s], key, fmt(v));
        if (s == 1) {
          note(key,
               "ZeRO-1 maps to shard_grad_op (ZeRO-2): gradients are sharded too, which "
               "needs no more memory and no more traffic than ZeRO-1");
        }
      } else if (k == "offload_optimizer") {
        offload(v, key, false);
      } else if (k == "offload_param") {
        offload(v, key, true);
      } else if (k == "reduce_bucket_size" || k == "allgather_bucket_size") {
        warn(key, str(bucket(v, 1.0, key),
                      ": accepted; fsdp-train gathers and reduces one unit (layer) per "
                      "collective, so bucket sizes do not apply"));
      } else if (k == "stage3_prefetch_bucket_size") {
        warn(key, str(bucket(v, 0.9, key),
                      ": accepted; fsdp-train prefetches the next unit's all-gather instead"));
      } else if (k == "stage3_param_persistence_threshold") {
        warn(key, str(bucket(v, 10, key),
                      ": accepted; small parameters (norms) travel inside their layer's unit"));
      } else if (k == "stage3_gather_16bit_weights_on_model_save" ||
                 k == "stage3_gather_fp16_weights_on_model_save" ||
                 k == "gather_16bit_weights_on_model_save") {
        note(key, "always on: every checkpoint holds the consolidated bf16 model.safetensors");
      } else if (k == "zero_hpz_partition_size") {
        const int64_t n = is_auto(v) ? 1 : as_int(v, key);
        if (n > 1) {
          set("sharding-strategy", "hybrid_shard", key, std::to_string(n));
          note(key,
               "ZeRO++ hpZ -> shard inside each node, replicate across nodes (the shard "
               "group is the node's ranks)");
        } else {
          note(key, "1: no secondary partition");
        }
      } else if (k == "zero_quantized_weights" || k == "zero_quantized_gradients" ||
                 k == "mics_shard_size" || k == "mics_hierarchical_params_gather") {
        warn(key, "ignored: weights travel in the compute dtype, gradients in --reduce-dtype");
      } else if (k == "overlap_comm" || k == "contiguous_gradients" ||
                 k == "round_robin_gradients" || k == "sub_group_size" ||
                 k == "stage3_max_live_parameters" || k == "stage3_max_reuse_distance" ||
                 k == "allgather_partitions" || k == "reduce_scatter" ||
                 k == "load_from_fp32_weights" || k == "elastic_checkpoint" ||
                 k == "ignore_unused_parameters" || k == "memory_efficient_linear" ||
                 k == "cpu_offload" || k == "use_multi_rank_bucket_allreduce") {
        always_on_.push_back(k);
        out_.report.push_back(str(key, ": accepted (always on or irrelevant)"));
      } else {
        warn(key, "ignored");
      }
    }
  }

  void sink(const std::string& name, const std::string& sink_name) {
    const json* sec = top(name);
    if (!sec || !sec->is_object()) return;
    const json* en = find(*sec, "enabled");
    const bool on = en && !is_auto(*en) && as_bool(*en, name + ".enabled");
    if (on) {
      if (sink_name.empty()) {
        warn(name,
             "CSV output is not produced; metrics.jsonl (always written) has the same "
             "values");
      } else {
        sinks_.push_back(sink_name);
        note(name + ".enabled", "true -> --report-to " + sink_name);
      }
    }
    for (const auto& [k, v] : sec->items()) {
      const std::string key = name + "." + k;
      if (k == "enabled") continue;
      if (name == "tensorboard" && k == "output_path") {
        std::string dir = fmt(v);
        if (const json* job = find(*sec, "job_name")) dir += "/" + fmt(*job);
        set("tensorboard-dir", dir, key);
      } else if (name == "tensorboard" && k == "job_name") {
        if (!find(*sec, "output_path")) warn(key, "ignored without output_path");
      } else if (name == "wandb" && k == "project") {
        set("wandb-project", fmt(v), key);
      } else {
        warn(key, "ignored");
      }
    }
  }

  void misc() {
    sink("tensorboard", "tensorboard");
    sink("wandb", "wandb");
    sink("csv_monitor", "");
    if (!sinks_.empty()) {
      std::vector<std::string> all = option("report-to").get(*ctx_.base).list;
      for (const auto& s : sinks_)
        if (std::find(all.begin(), all.end(), s) == all.end()) all.push_back(s);
      OptionValue v;
      v.list = all;
      out_.settings.emplace_back("report-to", v);
      out_.setting_source["report-to"] = "tensorboard/wandb.enabled";
    }
    if (const json* sp = top("steps_per_print")) {
      if (is_auto(*sp))
        auto_note("steps_per_print", "log-steps");
      else
        set("log-steps", std::to_string(as_int(*sp, "steps_per_print")), "steps_per_print");
    }
    if (top("wall_clock_breakdown")) {
      note("wall_clock_breakdown", "always on: data/communication/compute time shares are logged");
    }
    if (const json* ac = top("activation_checkpointing")) {
      // DeepSpeed's section configures the checkpointing the model code asks for; a config that
      // has it wants activations recomputed: the draft's decoder layer is.
      set("activation-checkpointing", "true", "activation_checkpointing", "(section present)");
      if (ac->is_object()) {
        for (const auto& [k, v] : ac->items()) {
          if (k == "partition_activations" || k == "cpu_checkpointing" ||
              k == "contiguous_memory_optimization" || k == "number_checkpoints" ||
              k == "synchronize_checkpoint_boundary" || k == "profile")
            warn("activation_checkpointing." + k,
                 "ignored (the decoder layer's inputs are kept on the device and its activations "
                 "recomputed in backward)");
          else
            warn("activation_checkpointing." + k, "ignored");
        }
      }
    }
    if (const json* cdt = top("communication_data_type")) {
      const std::string d = detail::to_lower(fmt(*cdt));
      if (d == "fp32" || d == "float32" || d == "float")
        set("reduce-dtype", "fp32", "communication_data_type");
      else if (d == "bf16" || d == "bfloat16")
        set("reduce-dtype", "bf16", "communication_data_type");
      else if (d == "auto")
        auto_note("communication_data_type", "reduce-dtype");
      else
        FSDP_USAGE_FAIL(str(src_, " communication_data_type '", d, "' is not supported"),
                        "use \"fp32\" (default, exact) or \"bf16\"");
    }
    for (const char* k : {"gradient_predivide_factor", "prescale_gradients"}) {
      if (const json* v = top(k)) {
        const bool neutral =
            (std::string(k) == "prescale_gradients" && v->is_boolean() && !v->get<bool>()) ||
            (v->is_number() && v->get<double>() == 1.0);
        if (neutral)
          note(k, "default: nothing to do");
        else
          warn(k,
               "ignored: gradients are averaged in --reduce-dtype (fp32 by default), so "
               "no pre-division is needed against overflow");
      }
    }
    for (const char* k : {"zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer"}) {
      if (top(k)) note(k, "accepted (not needed)");
    }
    if (const json* ck = top("checkpoint")) {
      (void)ck;
      note("checkpoint", "accepted: fsdp-train checkpoints always load at any rank count");
    }
    if (top("flops_profiler")) note("flops_profiler", "MFU from counted FLOPs is always logged");
    for (const char* k : {"data_types", "gradient_accumulation_dtype"}) {
      if (const json* v = top(k)) {
        warn(k, str(v->dump(), ": fsdp-train always accumulates gradients in fp32"));
      }
    }
    if (top("aio")) warn("aio", "ignored (only used for NVMe offload, which is not supported)");
  }

  const json& root_;
  std::string src_;
  const DeepSpeedContext& ctx_;
  DeepSpeedTranslation out_;
  std::set<std::string> handled_;
  std::vector<std::string> always_on_;
  std::vector<std::string> sinks_;
};

}  // namespace

DeepSpeedTranslation translate_deepspeed_text(const std::string& json_text,
                                              const std::string& source_name,
                                              const DeepSpeedContext& ctx) {
  json root;
  try {
    root = json::parse(json_text, nullptr, true, /*ignore_comments=*/true);
  } catch (const json::parse_error& e) {
    FSDP_USAGE_FAIL(str("--deepspeed ", source_name, ": not valid JSON (", e.what(), ")"),
                    "check the file with python -m json.tool");
  }
  try {
    return Translator(root, source_name, ctx).run();
  } catch (const json::exception& e) {
    FSDP_USAGE_FAIL(str("--deepspeed ", source_name, ": unexpected value type (", e.what(), ")"),
                    "compare the file with the examples in docs/migration-from-deepspeed.md");
  }
  return {};
}

DeepSpeedTranslation translate_deepspeed_file(const std::string& path,
                                              const DeepSpeedContext& ctx) {
  std::error_code ec;
  FSDP_USAGE_CHECK(!std::filesystem::is_directory(path, ec),
                   str("--deepspeed '", path, "' is a directory"),
                   "give the ds_config JSON file itself");
  std::ifstream in(path);
  FSDP_USAGE_CHECK(in.good(), str("--deepspeed '", path, "' cannot be read"),
                   "check the path of the ds_config JSON");
  std::stringstream ss;
  ss << in.rdbuf();
  return translate_deepspeed_text(ss.str(), path, ctx);
}

}  // namespace fsdp::config
