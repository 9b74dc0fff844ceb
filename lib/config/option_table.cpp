// The option table itself (options.h): one row per option, bound to its TrainConfig field. The
// defaults live in train_config.h's member initialisers and are read back from a default
// TrainConfig, so help, docs and the struct cannot disagree. Never add an option elsewhere.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <optional>
#include <tuple>
#include <type_traits>

#include "config/options.h"
#include "config/value_parse.h"
#include "core/error.h"
#include "data/loader_options.h"

namespace fsdp::config {

using detail::format_float;
using detail::is_null_text;
using detail::parse_bool;
using detail::parse_float;
using detail::parse_int;

namespace {

template <class E>
struct EnumNames;
template <>
struct EnumNames<ShardingStrategy> {
  static constexpr const char* names[] = {"full_shard", "shard_grad_op", "no_shard",
                                          "hybrid_shard"};
};
template <>
struct EnumNames<Precision> {
  static constexpr const char* names[] = {"bf16", "fp32"};
};
template <>
struct EnumNames<LossNormalization> {
  static constexpr const char* names[] = {"batch", "tokens"};
};
template <>
struct EnumNames<DeviceKind> {
  static constexpr const char* names[] = {"auto", "cpu", "cuda"};
};
template <>
struct EnumNames<StepScalars> {
  static constexpr const char* names[] = {"auto", "host", "device"};
};
template <>
struct EnumNames<AccuracyAggregation> {
  static constexpr const char* names[] = {"pooled", "per-batch"};
};
template <>
struct EnumNames<model::AuxIdConvention> {
  static constexpr const char* names[] = {"layer-output", "hidden-state-index"};
};
template <>
struct EnumNames<model::ExportTarget> {
  static constexpr const char* names[] = {"engines", "vllm", "sglang", "specforge"};
};
template <>
struct EnumNames<NoiseType> {
  static constexpr const char* names[] = {"uniform", "gaussian"};
};
template <>
struct EnumNames<DraftInit> {
  static constexpr const char* names[] = {"normal", "kaiming-uniform"};
};
template <>
struct EnumNames<AutoDraftConfig> {
  static constexpr const char* names[] = {"template", "target"};
};
template <>
struct EnumNames<LrScheduler> {
  static constexpr const char* names[] = {"cosine", "linear", "constant"};
};

template <>
struct EnumNames<OptimizerKind> {
  static constexpr const char* names[] = {"adamw", "muon"};
};
template <>
struct EnumNames<MuonAdjustLr> {
  static constexpr const char* names[] = {"match_rms_adamw", "original"};
};
template <>
struct EnumNames<TrainingStrategy> {
  static constexpr const char* names[] = {"eagle3", "dflash", "dspark", "peagle"};
};
template <>
struct EnumNames<BlockLossType> {
  static constexpr const char* names[] = {"dflash", "dpace", "dpace-cumulative-confidence-only",
                                          "dpace-continuation-value-only"};
};
template <>
struct EnumNames<MetricSink> {
  static constexpr const char* names[] = {"tensorboard", "wandb", "mlflow"};
};

template <class E>
std::vector<std::string> enum_choices() {
  return {std::begin(EnumNames<E>::names), std::end(EnumNames<E>::names)};
}

// The value named `text` exactly; nullopt for anything else.
template <class E>
std::optional<E> enum_value(const std::string& text) {
  for (size_t i = 0; i < std::size(EnumNames<E>::names); ++i)
    if (text == EnumNames<E>::names[i]) return static_cast<E>(i);
  return std::nullopt;
}

template <class E>
const char* enum_name(E value) {
  return EnumNames<E>::names[static_cast<size_t>(value)];
}

std::string one_of(const std::vector<std::string>& choices) {
  std::string s;
  for (size_t i = 0; i < choices.size(); ++i) s += (i ? ", " : "") + choices[i];
  return s;
}

template <class T>
using Accessor = T& (*)(TrainConfig&);

// Read-only access to the field acc binds.
template <class T>
auto const_accessor(Accessor<T> acc) {
  return [acc](const TrainConfig& c) -> const T& { return acc(const_cast<TrainConfig&>(c)); };
}

// set/get of a plain field: an enum (by its choices), text, whole or real number, or switch.
template <class T>
void bind_plain(OptionSpec& s, Accessor<T> acc) {
  auto cacc = const_accessor(acc);
  if constexpr (std::is_enum_v<T>) {
    s.choices = enum_choices<T>();
    const auto choices = s.choices;
    s.set = [acc, choices](TrainConfig& c, const OptionValue& v, const std::string& src) {
      const std::string t = detail::to_lower(v.text);
      for (size_t i = 0; i < choices.size(); ++i) {
        if (t == choices[i]) {
          acc(c) = static_cast<T>(i);
          return;
        }
      }
      FSDP_USAGE_FAIL(str(src, ": '", v.text, "' is not one of ", one_of(choices)),
                      str("pick one of ", one_of(choices)));
    };
    s.get = [cacc, choices](const TrainConfig& c) {
      return OptionValue{false, choices[static_cast<size_t>(cacc(c))], {}};
    };
  } else if constexpr (std::is_same_v<T, std::string>) {
    s.set = [acc](TrainConfig& c, const OptionValue& v, const std::string&) { acc(c) = v.text; };
    s.get = [cacc](const TrainConfig& c) { return OptionValue{false, cacc(c), {}}; };
  } else if constexpr (std::is_same_v<T, int64_t>) {
    // Bounds are looked up when a value is set: the row gets them after row() returns, and an
    // alias (a copy of the row) checks against its target's.
    s.set = [acc, name = s.name](TrainConfig& c, const OptionValue& v, const std::string& src) {
      const int64_t n = parse_int(v.text, src);
      option(name).check_int(n, src);
      acc(c) = n;
    };
    s.get = [cacc](const TrainConfig& c) {
      return OptionValue{false, std::to_string(cacc(c)), {}};
    };
  } else if constexpr (std::is_same_v<T, double>) {
    s.set = [acc, name = s.name](TrainConfig& c, const OptionValue& v, const std::string& src) {
      const double x = parse_float(v.text, src);
      option(name).check_float(x, src);
      acc(c) = x;
    };
    s.get = [cacc](const TrainConfig& c) { return OptionValue{false, format_float(cacc(c)), {}}; };
  } else if constexpr (std::is_same_v<T, bool>) {
    s.set = [acc](TrainConfig& c, const OptionValue& v, const std::string& src) {
      acc(c) = parse_bool(v.text, src);
    };
    s.get = [cacc](const TrainConfig& c) {
      return OptionValue{false, cacc(c) ? "true" : "false", {}};
    };
  } else {
    static_assert(std::is_same_v<T, void>, "no option binding for this field type");
  }
}

// set/get of an optional number: "none" (or YAML null) resets it.
template <class T>
void bind_optional(OptionSpec& s, Accessor<T> acc) {
  auto cacc = const_accessor(acc);
  if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
    s.set = [acc, name = s.name](TrainConfig& c, const OptionValue& v, const std::string& src) {
      if (v.is_null || is_null_text(v.text)) {
        acc(c).reset();
      } else {
        const int64_t n = parse_int(v.text, src);
        option(name).check_int(n, src);
        acc(c) = n;
      }
    };
    s.get = [cacc](const TrainConfig& c) {
      const auto& o = cacc(c);
      return o ? OptionValue{false, std::to_string(*o), {}} : OptionValue{true, "none", {}};
    };
  } else if constexpr (std::is_same_v<T, std::optional<double>>) {
    s.set = [acc, name = s.name](TrainConfig& c, const OptionValue& v, const std::string& src) {
      if (v.is_null || is_null_text(v.text)) {
        acc(c).reset();
      } else {
        const double x = parse_float(v.text, src);
        option(name).check_float(x, src);
        acc(c) = x;
      }
    };
    s.get = [cacc](const TrainConfig& c) {
      const auto& o = cacc(c);
      return o ? OptionValue{false, format_float(*o), {}} : OptionValue{true, "none", {}};
    };
  } else {
    static_assert(std::is_same_v<T, void>, "no option binding for this field type");
  }
}

// Builds set/get for a field of type T. `kind` distinguishes kString from kPath.
template <class T>
OptionSpec row(std::string name, OptionKind kind, std::string group, std::string help,
               Accessor<T> acc) {
  OptionSpec s;
  s.name = std::move(name);
  s.kind = kind;
  s.group = std::move(group);
  s.help = std::move(help);
  if constexpr (std::is_same_v<T, std::optional<int64_t>> ||
                std::is_same_v<T, std::optional<double>>) {
    bind_optional(s, acc);
  } else {
    bind_plain(s, acc);
  }
  return s;
}

#define FIELD(expr)               \
  +[](TrainConfig & c) -> auto& { \
    return c.expr;                \
  }

// A closed set spelled exactly (no case folding) whose refusal keeps the flag's own words
// ("--log-level 'loud' is not one of ...") from every source. `spellings` lists each accepted
// text with its value; the first spelling of a value is the one saved and printed.
template <class E>
OptionSpec exact_choice_row(std::string name, std::string group, std::string help, Accessor<E> acc,
                            std::vector<std::pair<std::string, E>> spellings, std::string listed,
                            std::string hint) {
  OptionSpec s;
  s.name = std::move(name);
  s.kind = OptionKind::kString;
  s.group = std::move(group);
  s.help = std::move(help);
  s.set = [acc, spellings, listed, hint, flag = s.flag()](TrainConfig& c, const OptionValue& v,
                                                          const std::string& src) {
    for (const auto& [text, value] : spellings) {
      if (v.text == text) {
        acc(c) = value;
        return;
      }
    }
    FSDP_USAGE_FAIL(str(flag, " '", v.text, "' is not one of ", listed,
                        src == flag ? std::string() : str(" (", src, ")")),
                    hint);
  };
  s.get = [cacc = const_accessor(acc), spellings](const TrainConfig& c) {
    for (const auto& [text, value] : spellings) {
      if (cacc(c) == value) return OptionValue{false, text, {}};
    }
    return OptionValue{};
  };
  return s;
}

// The words of a list option's value: each item (a YAML sequence, or the words on the command
// line) split at commas, lower-cased.
std::vector<std::string> list_words(const OptionValue& v) {
  std::vector<std::string> words;
  for (const auto& raw : v.list.empty() ? std::vector<std::string>{v.text} : v.list) {
    for (const auto& part : detail::split_list(raw)) words.push_back(detail::to_lower(part));
  }
  return words;
}

// A list option bound to a vector of enum values: the saved text is the values' names.
template <class E>
OptionValue enum_list_value(const std::vector<E>& values, const std::string& empty_text) {
  OptionValue v;
  for (E e : values) v.list.emplace_back(enum_name(e));
  v.text = v.list.empty() ? empty_text : one_of(v.list);
  return v;
}

// --report-to: several of tensorboard, wandb, mlflow; "jsonl" (always on) and "none" are accepted.
OptionSpec report_to_row() {
  OptionSpec s;
  s.name = "report-to";
  s.kind = OptionKind::kList;
  s.group = "Logging and metrics";
  s.help =
      "extra metric sinks, any of: tensorboard, wandb, mlflow (metrics.jsonl is always written; "
      "'jsonl' and 'none' are accepted)";
  s.choices = {"jsonl", "tensorboard", "wandb", "mlflow", "none"};
  s.set = [](TrainConfig& c, const OptionValue& v, const std::string& src) {
    std::vector<MetricSink> out;
    bool none = false;
    for (const auto& it : list_words(v)) {
      const std::optional<MetricSink> sink = enum_value<MetricSink>(it);
      FSDP_USAGE_CHECK(
          sink || it == "jsonl" || it == "none",
          str(src, ": '", it, "' is not one of jsonl, tensorboard, wandb, mlflow, none"),
          it == "swanlab" ? str(kSwanLabRefused, ": ", kSwanLabAdvice)
                          : std::string("list any of tensorboard, wandb and mlflow, or none"));
      if (it == "none") none = true;
      if (sink && std::find(out.begin(), out.end(), *sink) == out.end()) out.push_back(*sink);
    }
    FSDP_USAGE_CHECK(!(none && !out.empty()),
                     str(src, ": 'none' cannot be combined with ", enum_list_value(out, "").text),
                     "drop 'none' or the other sinks");
    c.metrics.report_to = out;
  };
  s.get = [](const TrainConfig& c) { return enum_list_value(c.metrics.report_to, "none"); };
  return s;
}

// --lora-targets: a comma list of the draft's projections (model/lora_target.h).
OptionSpec lora_targets_row() {
  OptionSpec s;
  s.name = "lora-targets";
  s.kind = OptionKind::kList;
  s.group = "Model";
  s.help =
      "projections of every decoder layer that get a LoRA adapter with --lora-rank, any of: "
      "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj";
  s.choices = model::lora_target_names(model::all_lora_targets());
  s.set = [](TrainConfig& c, const OptionValue& v, const std::string& src) {
    std::vector<model::LoraTarget> out;
    for (const auto& it : list_words(v)) {
      const std::optional<model::LoraTarget> target = model::parse_lora_target(it);
      FSDP_USAGE_CHECK(target.has_value(),
                       str(src, ": '", it, "' is not a projection of the draft"),
                       "list any of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                       "down_proj");
      if (std::find(out.begin(), out.end(), *target) == out.end()) out.push_back(*target);
    }
    FSDP_USAGE_CHECK(!out.empty(), str(src, ": no projection given"),
                     "list at least one, e.g. q_proj,v_proj");
    c.model.lora_targets = out;
  };
  s.get = [](const TrainConfig& c) {
    OptionValue v;
    v.list = model::lora_target_names(c.model.lora_targets);
    v.text = one_of(v.list);
    return v;
  };
  return s;
}

// --strategy: a draft family of EnumNames<TrainingStrategy>, or none (chosen later from the draft
// config's architectures).
OptionSpec strategy_row() {
  OptionSpec s;
  s.name = "strategy";
  s.kind = OptionKind::kEnum;
  s.group = "Model";
  s.help =
      "the draft family trained (SpecForge's training.strategy): eagle3, dflash, dspark or peagle; "
      "none: "
      "the family the draft config's architectures names";
  s.choices = enum_choices<TrainingStrategy>();
  s.choices.insert(s.choices.begin(), "none");
  s.set = [choices = s.choices](TrainConfig& c, const OptionValue& v, const std::string& src) {
    if (v.is_null || is_null_text(v.text)) {
      c.strategy.reset();
      return;
    }
    const std::optional<TrainingStrategy> e =
        enum_value<TrainingStrategy>(detail::to_lower(v.text));
    FSDP_USAGE_CHECK(e.has_value(), str(src, ": '", v.text, "' is not one of ", one_of(choices)),
                     "pick eagle3, dflash or dspark (fsdp-train trains no other SpecForge "
                     "strategy), or none to follow the draft config");
    c.strategy = *e;
  };
  s.get = [](const TrainConfig& c) {
    return c.strategy ? OptionValue{false, enum_name(*c.strategy), {}}
                      : OptionValue{true, "none", {}};
  };
  return s;
}

// --resume [auto|none|PATH]; a bare --resume (SpecForge's store_true) means auto.
OptionSpec resume_row() {
  OptionSpec s;
  s.name = "resume";
  s.kind = OptionKind::kResume;
  s.group = "Checkpoints";
  s.help =
      "auto: continue from the newest complete checkpoint in --output-dir (fresh start when none);"
      " PATH: that checkpoint directory; none: start fresh. A bare --resume means auto";
  s.set = [](TrainConfig& c, const OptionValue& v, const std::string&) {
    const std::string t = detail::to_lower(v.text);
    // A YAML key without a value (resume:) is null: no resume, not the bare flag's auto.
    if (v.is_null) {
      c.checkpoint.resume = ResumeMode::kNone;
      c.checkpoint.resume_path.clear();
    } else if (t.empty() || t == "auto" || t == "true") {
      c.checkpoint.resume = ResumeMode::kAuto;
      c.checkpoint.resume_path.clear();
    } else if (t == "none" || t == "false" || t == "null" || t == "~") {
      c.checkpoint.resume = ResumeMode::kNone;
      c.checkpoint.resume_path.clear();
    } else {
      c.checkpoint.resume = ResumeMode::kPath;
      c.checkpoint.resume_path = v.text;
    }
  };
  s.get = [](const TrainConfig& c) {
    switch (c.checkpoint.resume) {
      case ResumeMode::kAuto:
        return OptionValue{false, "auto", {}};
      case ResumeMode::kPath:
        return OptionValue{false, c.checkpoint.resume_path, {}};
      case ResumeMode::kNone:
        break;
    }
    return OptionValue{false, "none", {}};
  };
  return s;
}

const char* const kSpecForgeGroup = "SpecForge compatibility";

// Another SpecForge version's name for an option of the table: the same parser and checks, never
// saved (the saved configuration uses our name).
OptionSpec alias_row(const std::vector<OptionSpec>& table, std::string name,
                     const std::string& target, const std::string& help) {
  const auto it = std::find_if(table.begin(), table.end(),
                               [&](const OptionSpec& s) { return s.name == target; });
  FSDP_ASSERT(it != table.end(), "alias of an unknown option " + target);
  OptionSpec s = *it;
  s.name = std::move(name);
  s.group = kSpecForgeGroup;
  s.help = help;
  s.cli_only = true;
  s.alias_of = target;
  return s;
}

// A flag of other SpecForge versions that has no effect here: its value is checked by `check`
// (which refuses values whose SpecForge meaning fsdp-train cannot honour) and recorded in
// TrainConfig::specforge_flags, i.e. in the run metadata.
using CompatCheck = void (*)(const std::string& value, const std::string& source);
OptionSpec recorded_row(std::string name, OptionKind kind, std::string help, CompatCheck check) {
  OptionSpec s;
  s.name = name;
  s.kind = kind;
  s.group = kSpecForgeGroup;
  s.help = std::move(help);
  s.cli_only = true;
  s.set = [name, kind, check](TrainConfig& c, const OptionValue& v, const std::string& src) {
    std::string text = v.text;
    if (kind == OptionKind::kInt) text = std::to_string(parse_int(v.text, src));
    if (kind == OptionKind::kBool) text = parse_bool(v.text, src) ? "true" : "false";
    if (check) check(text, src);
    c.specforge_flags[name] = text;
  };
  s.get = [name](const TrainConfig& c) {
    const auto it = c.specforge_flags.find(name);
    return OptionValue{false, it == c.specforge_flags.end() ? "" : it->second, {}};
  };
  return s;
}

void must_be_one(const std::string& value, const std::string& src, const std::string& what,
                 const std::string& hint) {
  FSDP_USAGE_CHECK(value == "1", str(src, " ", value, ": ", what), hint);
}

void check_tp_size(const std::string& v, const std::string& src) {
  must_be_one(v, src,
              "SpecForge splits the target model with tensor parallelism, and offline training "
              "never runs the target model, so there is nothing to split",
              "drop it: every rank trains the draft data-parallel, and "
              "--draft-global-batch-size counts samples over all ranks");
}
void check_sequence_parallel(const std::string& v, const std::string& src) {
  must_be_one(v, src, "ring attention is not implemented",
              "use --sp-ulysses-size for sequence parallelism (docs/usage.md \"Sequence "
              "parallelism\")");
}
void check_positive_text(const std::string& v, const std::string& src) {
  FSDP_USAGE_CHECK(parse_int(v, src) > 0, str(src, " must be positive, got ", v),
                   str("give ", src, " a positive whole number, or drop it (it is only recorded)"));
}
void check_attention_backend(const std::string& v, const std::string& src) {
  const std::string t = detail::to_lower(v);
  FSDP_USAGE_CHECK(t == "sdpa" || t == "flex_attention" || t == "fa" || t == "eager" || t == "usp",
                   str(src, ": '", v, "' is not one of sdpa, flex_attention, fa, eager, usp"),
                   "drop it: fsdp-train has one exact attention implementation");
}
void check_target_backend(const std::string& v, const std::string& src) {
  const std::string t = detail::to_lower(v);
  FSDP_USAGE_CHECK(t == "sglang" || t == "hf" || t == "custom",
                   str(src, ": '", v, "' is not one of sglang, hf, custom"),
                   "drop it: offline training runs no target model");
}
void check_not_vlm(const std::string& v, const std::string& src) {
  FSDP_USAGE_CHECK(v != "true",
                   str(src,
                       ": vision-language targets (SpecForge's online VLM training) are "
                       "not supported"),
                   "train on a text-only target's hidden states");
}

// Limits of the integer options: far above any real run, and low enough that no product or
// conversion of them (steps x batches, minutes -> milliseconds) overflows.
constexpr int64_t kMaxSteps = 1000000000000;  // 1e12 optimizer steps
constexpr int64_t kMaxEpochs = 1000000;       // 1e6 epochs (also epoch intervals)

// A whole number from lo to hi; the hint says so (with `zero_means`) unless `hint` is given.
NumericBounds whole(int64_t lo, int64_t hi, std::string zero_means = "", std::string hint = "") {
  NumericBounds b;
  b.min = static_cast<double>(lo);
  b.max = static_cast<double>(hi);
  b.zero_means = std::move(zero_means);
  b.hint = std::move(hint);
  return b;
}
// A real number in an interval reported as such: "is outside [0, 1)".
NumericBounds interval(double lo, bool lo_open, double hi, bool hi_open, std::string hint) {
  NumericBounds b;
  b.min = lo;
  b.min_open = lo_open;
  b.max = hi;
  b.max_open = hi_open;
  b.as_interval = true;
  b.hint = std::move(hint);
  return b;
}
// A real number of at least (or, open, above) lo and at most hi.
NumericBounds at_least(double lo, bool lo_open, std::string hint,
                       double hi = std::numeric_limits<double>::infinity()) {
  NumericBounds b;
  b.min = lo;
  b.min_open = lo_open;
  b.max = hi;
  b.hint = std::move(hint);
  return b;
}

using K = OptionKind;

// Declares that the last row means something only with `primary` on (options.h
// OptionDependency). A switch given as false asks for nothing, so it needs no primary.
void needs(std::vector<OptionSpec>& t, std::string primary, std::vector<std::string> values = {},
           std::string inert_value = "") {
  OptionSpec& s = t.back();
  if (inert_value.empty() && s.kind == K::kBool) inert_value = "false";
  s.depends_on = OptionDependency{std::move(primary), std::move(values), std::move(inert_value)};
}

// The run file and the DeepSpeed config it may be translated from.
void add_config_file_rows(std::vector<OptionSpec>& t) {
  const std::string cf = "Configuration files";
  t.push_back(row<std::string>("config", K::kPath, cf,
                               "YAML run file; flags on the command line override its keys",
                               FIELD(config_file)));
  t.back().cli_only = true;
  t.push_back(row<std::string>(
      "deepspeed", K::kPath, cf,
      "DeepSpeed ds_config JSON to translate (docs/migration-from-deepspeed.md); it overrides the "
      "YAML file's defaults, and contradicting an explicit flag or YAML key is an error",
      FIELD(deepspeed_config)));
}

// The target model read for its embedding and head, and the draft model trained.
void add_model_rows(std::vector<OptionSpec>& t) {
  const std::string md = "Model";
  t.push_back(row<std::string>("target-model-path", K::kPath, md,
                               "target model directory (config.json + safetensors), or a "
                               "Hugging Face repository id already in the local Hugging Face "
                               "cache (SpecForge's meta-llama/Llama-3.1-8B-Instruct); only the "
                               "embedding and LM head are read",
                               FIELD(model.target_model_path)));
  t.push_back(row<std::string>("draft-model-config", K::kPath, md,
                               "draft model JSON (LlamaForCausalLMEagle3); not given: the "
                               "--init-checkpoint's config.json, else one made from the "
                               "target's config.json as SpecForge does (the llama3-8B-eagle3 "
                               "template with the target's sizes, written to "
                               "<cache-dir>/draft_configs/)",
                               FIELD(model.draft_model_config)));
  t.push_back(strategy_row());
  t.push_back(row<model::AuxIdConvention>(
      "aux-layer-convention", K::kEnum, md,
      "what the draft config's eagle_config.eagle_aux_hidden_state_layer_ids mean: "
      "layer-output (SpecForge, ModelOpt: id i = output of decoder layer i) or "
      "hidden-state-index (vLLM, speculators: id k = hidden_states[k]); exports are written "
      "so that each engine reads these layers (docs/serving.md)",
      FIELD(model.aux_layer_convention)));
  t.push_back(row<std::string>("embedding-key", K::kString, md,
                               "tensor name of the target's token embedding; when the "
                               "default is absent, the one tensor named *.embed_tokens.weight "
                               "(prefixed multimodal checkpoints)",
                               FIELD(model.embedding_key)));
  t.push_back(row<std::string>("lm-head-key", K::kString, md,
                               "tensor name of the target's LM head; when the default is "
                               "absent, the one tensor named *.lm_head.weight, else the "
                               "embedding if config.json says tie_word_embeddings: true",
                               FIELD(model.lm_head_key)));
  t.push_back(row<std::string>("vocab-mapping-path", K::kPath, md,
                               "ready vocab mapping (torch.save dict {d2t, t2d}); default: "
                               "built from the training features and cached in --cache-dir",
                               FIELD(model.vocab_mapping_path)));
  t.push_back(row<DraftInit>(
      "draft-init", K::kEnum, md,
      "initialisation of a draft trained from scratch: normal is N(0, the draft config's "
      "initializer_range, else 0.02) for every projection, fc and lm_head with norms at 1, as "
      "SpecForge's drafts (Hugging Face's post_init); kaiming-uniform is torch.nn.Linear's "
      "default",
      FIELD(model.draft_init)));
  t.push_back(row<AutoDraftConfig>(
      "auto-draft-config", K::kEnum, md,
      "without --draft-model-config, how the draft config is made from the target: template is "
      "SpecForge's offline script (its llama3-8B-eagle3 template with the target's sizes), "
      "target is specforge train's (the target's architecture fields copied, RoPE included)",
      FIELD(model.auto_draft_config)));
  t.push_back(row<std::string>("init-checkpoint", K::kPath, md,
                               "exported draft directory (config.json + model.safetensors) to "
                               "start from instead of random initialisation",
                               FIELD(model.init_checkpoint)));
  t.push_back(row<int64_t>(
      "lora-rank", K::kInt, md,
      "LoRA adaptation of the --init-checkpoint draft: adapters of this rank on --lora-targets, "
      "every other weight frozen; checkpoints export the merged draft",
      FIELD(model.lora_rank)));
  t.back().bounds = whole(0, 4096, " (0: no LoRA, full fine-tuning)");
  t.push_back(row<double>("lora-alpha", K::kFloat, md,
                          "LoRA alpha: the adapters are scaled by alpha / rank",
                          FIELD(model.lora_alpha)));
  t.back().bounds = at_least(0, true, "give a positive alpha, e.g. 16 or 2 x the rank");
  needs(t, "lora-rank");
  t.push_back(lora_targets_row());
  needs(t, "lora-rank");
  t.push_back(row<int64_t>("ttt-length", K::kInt, md, "test-time-training unroll steps T",
                           FIELD(model.ttt_length)));
  t.back().bounds = whole(1, 64, "", "EAGLE3 uses 7; give 1 to 64");
  t.push_back(row<bool>("activation-checkpointing", K::kBool, md,
                        "keep only the decoder layer's inputs and outputs in forward and recompute "
                        "its activations in backward, and keep only each step's logits for the "
                        "loss (log_softmax recomputed): less memory at long sequences, about one "
                        "more layer forward per TTT step, bit-identical results",
                        FIELD(model.activation_checkpointing)));
  t.push_back(row<bool>("fused-cuda-kernels", K::kBool, md,
                        "run the soft cross-entropy over the draft vocabulary and the TTT "
                        "attention's diagonal merge, forward and backward, in fsdp-train's own "
                        "CUDA kernels instead of composite LibTorch ops, and sum the TTT steps' "
                        "weight gradients inside their GEMMs (equal within fp32 rounding; 1.15x "
                        "tokens/s on an H200). Default: on where they can run (a GPU run of a "
                        "build with them), off on the CPU; true on the CPU is an error",
                        FIELD(model.fused_cuda_kernels)));
  t.push_back(row<int64_t>(
      "head-chunk-rows", K::kInt, md,
      "run each TTT step's draft norm, lm_head and loss over chunks of this many loss rows and "
      "recompute each chunk's logits in backward instead of keeping them (less memory at long "
      "sequences, one more lm_head forward per step, results within fp32 rounding); 0: "
      "automatic, chunks of 2^25 / Vd rows (1048 at Vd 32000) once a step has more than four "
      "chunks of loss rows; -1: never",
      FIELD(model.head_chunk_rows)));
  t.back().bounds = whole(-1, int64_t{1} << 30, " (0: automatic, -1: off)");
}

// Streaming from a spool producers fill while the run trains (docs/data.md "Streaming").
void add_stream_rows(std::vector<OptionSpec>& t) {
  const std::string da = "Data";
  t.push_back(row<bool>(
      "stream", K::kBool, da,
      "--train-hidden-states-path is a spool directory that producers fill while the run "
      "trains: samples (*.ckpt, *.ckpt.gz renamed into place) are trained in arrival order and "
      "deleted once a checkpoint covers their last use; END_OF_STREAM in the directory ends the "
      "run after the spool is drained; needs --total-steps (the schedule's length and the "
      "longest the run goes) (docs/data.md \"Streaming\")",
      FIELD(data.stream)));
  t.push_back(row<double>("stream-max-gb", K::kFloat, da,
                          "disk budget of the spool in GiB (samples and producers' files being "
                          "written): producers wait while it is full, and the trainer saves a "
                          "checkpoint early when the samples it consumed but has not "
                          "acknowledged hold half of it; 0: no budget",
                          FIELD(data.stream_max_gb)));
  t.back().bounds = at_least(0, false, "give the budget in GiB, e.g. 50 (0: no budget)");
  needs(t, "stream", {}, "0");
  t.push_back(row<int64_t>("stream-uses", K::kInt, da,
                           "times each streamed sample is trained before it is acknowledged: "
                           "the first pass in arrival order, the others in shuffled orders of its "
                           "replay window (the stream's counterpart of epochs)",
                           FIELD(data.stream_uses)));
  t.back().bounds = whole(1, 1024);
  needs(t, "stream");
  t.push_back(row<int64_t>("stream-replay-window", K::kInt, da,
                           "samples per replay window with --stream-uses above 1: a window's "
                           "samples are all trained --stream-uses times before the next "
                           "window starts, so it bounds how long a sample stays in the spool",
                           FIELD(data.stream_replay_window)));
  t.back().bounds = whole(1, int64_t{1} << 24);
  needs(t, "stream");
  t.push_back(row<double>("stream-settle-s", K::kFloat, da,
                          "for producers that write samples in place (SpecForge's "
                          "prepare_hidden_states): a file counts as arrived once its size and "
                          "time stamp have not changed for this many seconds; 0: files appear "
                          "complete (renamed into place)",
                          FIELD(data.stream_settle_s)));
  t.back().bounds = at_least(0, false, "give seconds >= 0, e.g. 5", 3600);
  needs(t, "stream", {}, "0");
  t.push_back(row<int64_t>("stream-start-samples", K::kInt, da,
                           "samples that must arrive before training starts: the start-up "
                           "checks and a vocabulary mapping built from the features read them "
                           "(fewer when the stream ends first)",
                           FIELD(data.stream_start_samples)));
  t.back().bounds = whole(1, int64_t{1} << 24);
  needs(t, "stream");
}

// Hidden-state inputs, the raw SpecForge data paths recorded for compatibility, the loader.
void add_data_rows(std::vector<OptionSpec>& t) {
  const std::string da = "Data";
  const std::string unused =
      " (accepted for SpecForge compatibility and recorded in the run metadata; unused: the "
      "vocab mapping comes from the feature files)";
  t.push_back(row<std::string>("train-hidden-states-path", K::kPath, da,
                               "directory of precomputed hidden states (SpecForge .ckpt tree or "
                               "native shards)",
                               FIELD(data.train_hidden_states_path)));
  t.push_back(row<std::string>("eval-hidden-states-path", K::kPath, da,
                               "hidden states for evaluation (optional)",
                               FIELD(data.eval_hidden_states_path)));
  t.push_back(row<std::string>("train-data-path", K::kPath, da,
                               "SpecForge's raw training jsonl" + unused,
                               FIELD(data.train_data_path)));
  t.push_back(row<std::string>("eval-data-path", K::kPath, da,
                               "SpecForge's raw evaluation jsonl" + unused,
                               FIELD(data.eval_data_path)));
  t.push_back(row<std::string>("chat-template", K::kString, da,
                               "SpecForge chat template name" + unused, FIELD(data.chat_template)));
  t.push_back(row<int64_t>("max-length", K::kInt, da, "truncate samples to this many tokens",
                           FIELD(data.max_length)));
  using data::LoaderOptions;
  t.back().bounds =
      whole(LoaderOptions::kMinMaxLength, LoaderOptions::kMaxMaxLength, "",
            str("give --max-length a whole number from ", LoaderOptions::kMinMaxLength,
                " (a token and its successor) to ", LoaderOptions::kMaxMaxLength));
  t.push_back(row<std::string>("cache-dir", K::kPath, da,
                               "where the vocab mapping and other derived data are cached",
                               FIELD(data.cache_dir)));
  t.push_back(row<bool>("skip-bad-samples", K::kBool, da,
                        "skip (and count) unreadable or malformed samples instead of stopping",
                        FIELD(data.skip_bad_samples)));
  t.push_back(row<int64_t>("loader-threads", K::kInt, da,
                           "threads per rank that read and collate micro-batches ahead of the "
                           "trainer (0: 1 on the CPU, 4 on a GPU)",
                           FIELD(data.loader_threads)));
  t.back().bounds = whole(0, LoaderOptions::kMaxThreads, " (0: 1 on the CPU, 4 on a GPU)");
  t.push_back(row<double>(
      "noise-std", K::kFloat, da,
      "noise added to the aux hidden states (the fc input) of training samples, never to "
      "evaluation or the target hidden state, as speculators' --noise-std (0.05 there); 0: off. "
      "The noise of a sample depends only on --seed, the epoch and the sample (docs/usage.md)",
      FIELD(data.noise_std)));
  t.back().bounds = at_least(0, false,
                             str("give --noise-std 0 (off) or a small positive value, e.g. 0.05 "
                                 "(speculators' default); at most ",
                                 data::NoiseOptions::kMaxStd),
                             data::NoiseOptions::kMaxStd);
  t.push_back(
      row<NoiseType>("noise-type", K::kEnum, da,
                     "distribution of --noise-std's noise: uniform, U(-std, std) as speculators' "
                     "AddUniformNoise (standard deviation std/sqrt(3)), or gaussian, N(0, std^2)",
                     FIELD(data.noise_type)));
  needs(t, "noise-std");
  add_stream_rows(t);
}

// Epochs, batch sizes, step counts, seed and loss normalisation.
void add_training_rows(std::vector<OptionSpec>& t) {
  const std::string tr = "Training";
  t.push_back(row<int64_t>("num-epochs", K::kInt, tr, "passes over the training data",
                           FIELD(loop.num_epochs)));
  t.back().bounds = whole(1, kMaxEpochs);
  t.push_back(row<int64_t>("draft-global-batch-size", K::kInt, tr,
                           "samples per optimizer step over all ranks",
                           FIELD(loop.draft_global_batch_size)));
  t.back().bounds = whole(1, 1 << 24);
  t.push_back(row<int64_t>("draft-micro-batch-size", K::kInt, tr,
                           "samples per forward/backward on one rank",
                           FIELD(loop.draft_micro_batch_size)));
  t.back().bounds =
      whole(1, 1 << 16, "",
            "give --draft-micro-batch-size a whole number from 1 to 65536; for larger batches "
            "raise the accumulation (--draft-global-batch-size) instead");
  t.push_back(row<bool>(
      "packing", K::kBool, tr,
      "exact sequence packing: the samples of each optimizer step (unchanged) are bin-packed, "
      "longest first, into micro-batches of at most --packing-budget tokens, one row of whole "
      "documents each; attention, positions, TTT shifts and the loss stay inside each sample, "
      "which is normalised as a micro-batch of its own, so a step equals the unpacked "
      "micro-batch-1 step (docs/usage.md \"Packing\")",
      FIELD(loop.packing)));
  t.push_back(row<int64_t>(
      "sp-ulysses-size", K::kInt, tr,
      "sequence parallelism (DeepSpeed-Ulysses): ranks per group that share each sample, each "
      "holding a contiguous slice of its positions; all-to-alls swap heads for positions "
      "around the attention. Data-parallel size = ranks / this; needs micro-batch 1, no "
      "--packing, and attention and key/value heads divisible by it (docs/usage.md \"Sequence "
      "parallelism\")",
      FIELD(loop.sp_ulysses_size)));
  t.back().bounds = whole(1, 4096);
  t.push_back(row<int64_t>("packing-budget", K::kInt, tr,
                           "tokens per packed micro-batch (with --packing); 0: --max-length x "
                           "--draft-micro-batch-size",
                           FIELD(loop.packing_budget)));
  t.back().bounds = whole(0, int64_t{1} << 24, " (0: max length x micro-batch size)");
  needs(t, "packing");
  t.push_back(row<std::optional<int64_t>>(
      "gradient-accumulation-steps", K::kOptInt, tr,
      "micro-batches per optimizer step; default: global / (ranks * micro); when given it must "
      "agree",
      FIELD(loop.gradient_accumulation_steps)));
  t.back().bounds = whole(1, 1 << 24);
  t.push_back(row<std::optional<int64_t>>(
      "total-steps", K::kOptInt, tr,
      "optimizer steps of the LR schedule; default: num-epochs * ceil(batches per epoch / "
      "accumulation)",
      FIELD(loop.total_steps)));
  t.back().bounds = whole(1, kMaxSteps);
  t.push_back(row<std::optional<int64_t>>(
      "max-steps", K::kOptInt, tr,
      "stop after this optimizer step (saving a checkpoint) without changing the LR schedule",
      FIELD(loop.max_steps)));
  t.back().bounds = whole(1, kMaxSteps);
  t.push_back(
      row<int64_t>("seed", K::kInt, tr, "seed of initialisation and data order", FIELD(loop.seed)));
  t.push_back(row<LossNormalization>(
      "loss-normalization", K::kEnum, tr,
      "batch: divide by B*S, padding included (SpecForge); tokens: by the valid tokens",
      FIELD(loop.loss_normalization)));
  t.push_back(row<std::string>(
      "loss-fn", K::kString, tr,
      "the objective per loss token: soft_ce (SpecForge's soft cross-entropy), kl_div, rkl, jsd, "
      "tv, nla, ce (hard labels), lk_hybrid, or a JSON object of weights such as "
      "'{\"kl_div\": 0.5, \"tv\": 0.5}' (speculators' names)",
      FIELD(loop.loss_fn)));
  t.push_back(row<double>("ttt-step-loss-decay", K::kFloat, tr,
                          "weight of TTT step i is this to the power i (SpecForge 0.8; "
                          "speculators 1.0)",
                          FIELD(loop.ttt_step_loss_decay)));
  t.back().bounds = at_least(0, true, "give a decay in (0, 1], e.g. 0.8", 1.0);
  t.push_back(exact_choice_row<LkLossType>(
      "lk-loss-type", tr,
      "SpecForge's LK objective instead of the step's loss: lambda (kl_scale * exp(-kl_decay * "
      "acceptance) weighs the loss against 1 - acceptance) or alpha (-log acceptance); empty: none",
      FIELD(loop.lk_loss_type),
      {{"", LkLossType::kNone},
       {"none", LkLossType::kNone},
       {"lambda", LkLossType::kLambda},
       {"alpha", LkLossType::kAlpha}},
      "lambda, alpha", "use --lk-loss-type lambda or alpha, or leave it empty for none"));
  t.push_back(row<double>("kl-scale", K::kFloat, tr, "LK lambda: scale of the loss's weight",
                          FIELD(loop.kl_scale)));
  t.back().bounds = at_least(0, false, "give a scale >= 0, e.g. 1.0");
  needs(t, "lk-loss-type", {"lambda"});
  t.push_back(row<double>("kl-decay", K::kFloat, tr,
                          "LK lambda: decay of the loss's weight with the acceptance rate",
                          FIELD(loop.kl_decay)));
  t.back().bounds = at_least(0, false, "give a decay >= 0, e.g. 1.0");
  needs(t, "lk-loss-type", {"lambda"});
  t.push_back(row<bool>("eval-only", K::kBool, tr,
                        "evaluate the initial or resumed weights, print the metrics and exit",
                        FIELD(loop.eval_only)));
}

// The training knobs of DFlash-family drafts (DFlash, DSpark): SpecForge 0.2.0's training and
// model keys. They are accepted whatever the draft; the algorithm that reads them checks what it
// needs.
void add_dflash_rows(std::vector<OptionSpec>& t) {
  const std::string df = "DFlash and DSpark";
  using data::LoaderOptions;  // a sample has at most LoaderOptions::kMaxMaxLength positions
  t.push_back(row<std::optional<int64_t>>(
      "draft-block-size", K::kOptInt, df,
      "DFlash drafts: tokens per block (an anchor and the positions predicted from it), "
      "replacing the draft config's block_size (SpecForge's model.draft_block_size); none: the "
      "draft config's",
      FIELD(dflash.block_size)));
  t.back().bounds = whole(1, LoaderOptions::kMaxMaxLength);
  t.push_back(row<std::optional<int64_t>>(
      "mask-token-id", K::kOptInt, df,
      "DFlash and DSpark drafts: the token id fed at the masked positions of a block; P-EAGLE "
      "drafts: the token id of depths >= 1 (SpecForge's model.mask_token_id); none: the draft "
      "config's",
      FIELD(dflash.mask_token_id)));
  t.back().bounds = whole(0, (int64_t{1} << 31) - 1);
  t.push_back(row<int64_t>("num-anchors", K::kInt, df,
                           "DFlash and DSpark drafts: anchor positions sampled per sample, each "
                           "starting a block (SpecForge's training.num_anchors)",
                           FIELD(dflash.num_anchors)));
  t.back().bounds = whole(1, LoaderOptions::kMaxMaxLength);
  t.push_back(row<std::optional<double>>(
      "loss-decay-gamma", K::kOptFloat, df,
      "DFlash and DSpark drafts: the loss weight decays exponentially over a block's positions "
      "with this length (SpecForge's training.loss_decay_gamma); none or 0: equal weights",
      FIELD(dflash.loss_decay_gamma)));
  t.back().bounds = at_least(0, false,
                             "give --loss-decay-gamma a decay length > 0, e.g. 7, or 0 or none "
                             "for equal weights");
  t.push_back(row<int64_t>(
      "objective-chunk-blocks", K::kInt, df,
      "DFlash and DSpark drafts: anchor blocks per slice of the objective, whose vocabulary "
      "logits are never held for more than one slice (SpecForge's "
      "training.objective_chunk_blocks); 0: all blocks at once",
      FIELD(dflash.objective_chunk_blocks)));
  t.back().bounds = whole(0, LoaderOptions::kMaxMaxLength, " (0: all blocks at once)");
  t.push_back(row<BlockLossType>(
      "block-loss-type", K::kEnum, df,
      "DFlash drafts: the objective over a block (SpecForge's training.loss_type): dflash "
      "(cross-entropy), dpace (D-PACE's weights from --dpace-alpha), or one of D-PACE's factors "
      "alone",
      FIELD(dflash.loss_type)));
  t.push_back(row<double>("dpace-alpha", K::kFloat, df,
                          "DFlash drafts with a dpace --block-loss-type: D-PACE's smoothing of "
                          "the draft's probabilities (SpecForge's training.dpace_alpha)",
                          FIELD(dflash.dpace_alpha)));
  t.back().bounds = interval(0, false, 1, false, "give --dpace-alpha a number in [0, 1], e.g. 0.5");
  for (const auto& [name, term, acc] :
       std::vector<std::tuple<const char*, const char*, Accessor<double>>>{
           {"dspark-ce-loss-alpha", "cross-entropy", FIELD(dflash.dspark_ce_loss_alpha)},
           {"dspark-l1-loss-alpha", "L1", FIELD(dflash.dspark_l1_loss_alpha)},
           {"dspark-confidence-head-alpha", "confidence-head",
            FIELD(dflash.dspark_confidence_head_alpha)}}) {
    std::string key = name;  // SpecForge's spelling: the YAML key
    std::replace(key.begin(), key.end(), '-', '_');
    t.push_back(row<double>(
        name, K::kFloat, df,
        str("DSpark drafts: weight of its ", term, " term (SpecForge's training.", key, ")"), acc));
    t.back().bounds = at_least(0, false, str("give --", name, " a weight >= 0"));
  }
}

// The depth sampling of P-EAGLE drafts: SpecForge 0.2.0's training keys.
void add_peagle_rows(std::vector<OptionSpec>& t) {
  const std::string pe = "P-EAGLE";
  t.push_back(row<int64_t>("num-depths", K::kInt, pe,
                           "P-EAGLE drafts: depths trained per step, 0 .. K-1, the tokens drafted "
                           "in one pass (SpecForge's training.num_depths)",
                           FIELD(peagle.num_depths)));
  t.back().bounds = whole(1, 64);
  t.push_back(row<double>("down-sample-ratio", K::kFloat, pe,
                          "P-EAGLE drafts: depth d >= 1 trains a fraction max(r^d, r_min) of the "
                          "loss positions (SpecForge's training.down_sample_ratio)",
                          FIELD(peagle.down_sample_ratio)));
  t.back().bounds =
      interval(0, true, 1, false, "give --down-sample-ratio a number in (0, 1], e.g. 0.8");
  t.push_back(row<double>("down-sample-ratio-min", K::kFloat, pe,
                          "P-EAGLE drafts: r_min, the floor of the kept fraction (SpecForge's "
                          "training.down_sample_ratio_min); at most --down-sample-ratio",
                          FIELD(peagle.down_sample_ratio_min)));
  t.back().bounds =
      interval(0, true, 1, false, "give --down-sample-ratio-min a number in (0, 1], e.g. 0.2");
}

// AdamW and the learning-rate schedule.
void add_optimizer_rows(std::vector<OptionSpec>& t) {
  const std::string op = "Optimizer";
  t.push_back(row<double>("learning-rate", K::kFloat, op, "peak learning rate",
                          FIELD(optim.learning_rate)));
  t.back().bounds =
      interval(0, true, 1, true, "typical values are 1e-5 .. 1e-3 (SpecForge default 1e-4)");
  t.push_back(row<double>("warmup-ratio", K::kFloat, op,
                          "warmup steps as a fraction of total steps", FIELD(optim.warmup_ratio)));
  t.back().bounds = interval(
      0, false, 1, false, "give a fraction of the total steps, e.g. 0.015 (SpecForge's default)");
  t.push_back(row<std::optional<int64_t>>("warmup-steps", K::kOptInt, op,
                                          "warmup steps; when set it replaces --warmup-ratio",
                                          FIELD(optim.warmup_steps)));
  t.back().bounds = whole(0, kMaxSteps);
  t.push_back(row<LrScheduler>("lr-scheduler", K::kEnum, op,
                               "decay after warmup: cosine to 0, linear to 0, or constant",
                               FIELD(optim.lr_scheduler)));
  t.push_back(row<double>("max-grad-norm", K::kFloat, op,
                          "clip the global gradient L2 norm to this (0 disables clipping)",
                          FIELD(optim.max_grad_norm)));
  t.back().bounds = at_least(0, false, "use 0 to disable clipping");
  t.push_back(row<double>("adam-beta1", K::kFloat, op, "AdamW beta1", FIELD(optim.adam_beta1)));
  t.back().bounds = interval(0, false, 1, true, "give a value in [0, 1), e.g. 0.9 (the default)");
  t.push_back(row<double>("adam-beta2", K::kFloat, op, "AdamW beta2", FIELD(optim.adam_beta2)));
  t.back().bounds = interval(0, false, 1, true, "give a value in [0, 1), e.g. 0.999 (the default)");
  t.push_back(row<double>("adam-eps", K::kFloat, op, "AdamW epsilon", FIELD(optim.adam_eps)));
  t.back().bounds =
      interval(0, true, 1, false, "give a small positive value, e.g. 1e-8 (the default)");
  t.push_back(row<double>("weight-decay", K::kFloat, op, "AdamW decoupled weight decay",
                          FIELD(optim.weight_decay)));
  t.back().bounds =
      interval(0, false, 1, false, "give a value in [0, 1], e.g. 0 (the default) or 0.01");
  t.push_back(row<OptimizerKind>(
      "optimizer", K::kEnum, op,
      "adamw: AdamW for every parameter; muon: torch.optim.Muon for the 2-D matrices speculators "
      "gives it (not embed_tokens, lm_head or [1, N] weights), AdamW for the rest",
      FIELD(optim.optimizer)));
  t.push_back(row<double>("muon-lr-ratio", K::kFloat, op,
                          "Muon's learning rate over --learning-rate (speculators: 10); AdamW on "
                          "the matrices Muon leaves out (embedding, LM head) uses it too",
                          FIELD(optim.muon_lr_ratio)));
  t.back().bounds = at_least(0, true, "give a positive ratio, e.g. 10");
  needs(t, "optimizer", {"muon"});
  t.push_back(row<std::optional<double>>(
      "muon-lr", K::kOptFloat, op,
      "Muon's learning rate itself (speculators' --muon-lr); when set it replaces --muon-lr-ratio "
      "(the ratio becomes muon-lr / --learning-rate, and the schedule scales both)",
      FIELD(optim.muon_lr)));
  t.back().bounds = interval(0, true, 1, true, "give a positive learning rate, e.g. 1e-3");
  needs(t, "optimizer", {"muon"});
  t.push_back(
      row<double>("muon-momentum", K::kFloat, op, "Muon's momentum", FIELD(optim.muon_momentum)));
  t.back().bounds = interval(0, false, 1, true, "give a value in [0, 1), e.g. 0.95 (the default)");
  needs(t, "optimizer", {"muon"});
  t.push_back(row<bool>("muon-nesterov", K::kBool, op, "Muon's Nesterov momentum",
                        FIELD(optim.muon_nesterov)));
  needs(t, "optimizer", {"muon"});
  t.push_back(row<double>("muon-weight-decay", K::kFloat, op,
                          "Muon's decoupled weight decay (also AdamW's on the matrices Muon "
                          "leaves out)",
                          FIELD(optim.muon_weight_decay)));
  t.back().bounds = interval(0, false, 1, false, "give a value in [0, 1], e.g. 0.1 (the default)");
  needs(t, "optimizer", {"muon"});
  t.push_back(row<int64_t>("muon-ns-steps", K::kInt, op, "Muon's Newton-Schulz steps",
                           FIELD(optim.muon_ns_steps)));
  t.back().bounds = whole(1, 99);
  needs(t, "optimizer", {"muon"});
  t.push_back(row<MuonAdjustLr>(
      "muon-adjust-lr", K::kEnum, op,
      "Muon's per-matrix learning rate: match_rms_adamw (0.2 sqrt(max(rows, cols)), the update's "
      "RMS matches AdamW's) or original (sqrt(max(1, rows/cols)))",
      FIELD(optim.muon_adjust_lr)));
  needs(t, "optimizer", {"muon"});
  t.push_back(alias_row(t, "muon-adjust-lr-fn", "muon-adjust-lr",
                        "speculators' name for --muon-adjust-lr"));
  t.back().group = op;
}

// How parameters, gradients and optimizer state are split over ranks and in which dtypes.
void add_sharding_rows(std::vector<OptionSpec>& t) {
  const std::string sh = "Sharding";
  t.push_back(row<ShardingStrategy>(
      "sharding-strategy", K::kEnum, sh,
      "full_shard (ZeRO-3), shard_grad_op (ZeRO-2), no_shard (DDP), hybrid_shard (ZeRO-3 inside "
      "a node, replicated across nodes)",
      FIELD(shard.strategy)));
  t.push_back(row<Precision>("mixed-precision", K::kEnum, sh,
                             "compute/parameter dtype; master weights are always fp32",
                             FIELD(shard.mixed_precision)));
  t.push_back(row<Precision>("reduce-dtype", K::kEnum, sh, "dtype of the gradient reduction",
                             FIELD(shard.reduce_dtype)));
  t.push_back(row<bool>("cpu-offload", K::kBool, sh,
                        "keep master weights, gradient shards and moments on the host and run "
                        "the optimizer step there",
                        FIELD(shard.cpu_offload)));
  t.push_back(row<bool>("accumulate-locally", K::kBool, sh,
                        "accumulate gradients without communication until the last micro-batch "
                        "(more memory, less traffic)",
                        FIELD(shard.accumulate_locally)));
  t.push_back(row<bool>("reshard-between-uses", K::kBool, sh,
                        "full_shard/hybrid_shard: free and re-gather a unit around each of its "
                        "ttt_length uses per forward (least memory, ttt_length times the forward "
                        "all-gathers); default keeps it gathered from its first to its last use",
                        FIELD(shard.reshard_between_uses)));
  needs(t, "sharding-strategy", {"full_shard", "hybrid_shard"});
}

// Where and when checkpoints are written, kept and resumed from.
void add_checkpoint_rows(std::vector<OptionSpec>& t) {
  const std::string ck = "Checkpoints";
  t.push_back(row<std::string>("output-dir", K::kPath, ck,
                               "checkpoints, metrics.jsonl and logs go here (required for "
                               "training)",
                               FIELD(checkpoint.output_dir)));
  t.push_back(row<int64_t>("save-interval", K::kInt, ck,
                           "save a checkpoint every N epochs (0: off)",
                           FIELD(checkpoint.save_interval)));
  t.back().bounds = whole(0, kMaxEpochs, " (0: off)");
  t.push_back(row<int64_t>("save-steps", K::kInt, ck, "also save every N optimizer steps (0: off)",
                           FIELD(checkpoint.save_steps)));
  t.back().bounds = whole(0, kMaxSteps, " (0: off)");
  t.push_back(row<bool>("save-final", K::kBool, ck,
                        "save a checkpoint when training ends, unless one was saved at that step; "
                        "false only for benchmarks and throwaway runs (the final weights are then "
                        "not written; a stop by signal still saves)",
                        FIELD(checkpoint.save_final)));
  t.push_back(row<Precision>("export-dtype", K::kEnum, ck,
                             "dtype of model.safetensors in checkpoints (bf16 as serving engines "
                             "expect; fp32 for full-precision exports and parity checks)",
                             FIELD(checkpoint.export_dtype)));
  t.push_back(row<model::ExportTarget>(
      "export-for", K::kEnum, ck,
      "serving engines the exported config.json is written for: engines (one config vLLM and "
      "SGLang both read right), vllm, sglang, or specforge (SpecForge's own layout)",
      FIELD(checkpoint.export_for)));
  t.push_back(row<bool>("export-lora-adapters", K::kBool, ck,
                        "with --lora-rank: also write the adapters alone in PEFT's layout "
                        "(<checkpoint>/adapter: adapter_config.json, adapter_model.safetensors)",
                        FIELD(checkpoint.export_lora_adapters)));
  needs(t, "lora-rank");
  t.push_back(row<std::string>(
      "export-rope-scaling", K::kString, ck,
      "RoPE scaling written into exports (both rope_scaling and rope_parameters), e.g. "
      "yarn:32 (YaRN, factor 32 over --max-length) or a JSON object; empty: the draft "
      "config's own",
      FIELD(checkpoint.export_rope_scaling)));
  t.push_back(row<int64_t>("keep-last", K::kInt, ck,
                           "keep only the newest N complete checkpoints, and the best "
                           "(--save-best-by) besides (0: keep all)",
                           FIELD(checkpoint.keep_last)));
  t.back().bounds = whole(0, kMaxEpochs, " (0: keep all)");
  t.push_back(row<std::string>(
      "save-best-by", K::kString, ck,
      "evaluation metric whose best value's checkpoint <output-dir>/best names (best.json "
      "records it; names with \"loss\" are minimised, others maximised), e.g. eval/acc_0, "
      "eval/loss; none: off",
      FIELD(checkpoint.save_best_by)));
  needs(t, "eval-hidden-states-path", {}, "none");
  t.push_back(resume_row());
  t.push_back(row<bool>(
      "reset-optimizer-state", K::kBool, ck,
      "resume the weights, step, schedule and data position but start the optimizer's state "
      "(moments, momentum) fresh, AdamW's bias correction counting from the resumed step; the "
      "way to switch --optimizer between adamw and muon on resume",
      FIELD(checkpoint.reset_optimizer_state)));
  needs(t, "resume", {}, "false");
}

// When the evaluation set is run.
void add_evaluation_rows(std::vector<OptionSpec>& t) {
  const std::string ev = "Evaluation";
  t.push_back(row<int64_t>("eval-interval", K::kInt, ev, "evaluate every N epochs (0: off)",
                           FIELD(eval.eval_interval)));
  t.back().bounds = whole(0, kMaxEpochs, " (0: off)");
  needs(t, "eval-hidden-states-path", {}, "0");
  t.push_back(row<int64_t>("eval-steps", K::kInt, ev,
                           "also evaluate every N optimizer steps (0: off)",
                           FIELD(eval.eval_steps)));
  t.back().bounds = whole(0, kMaxSteps, " (0: off)");
  needs(t, "eval-hidden-states-path", {}, "0");
}

// Metric cadence, sinks (TensorBoard, W&B), MFU peak and log level.
void add_logging_rows(std::vector<OptionSpec>& t) {
  const std::string lg = "Logging and metrics";
  t.push_back(row<int64_t>("log-steps", K::kInt, lg,
                           "print and record metrics every N optimizer steps",
                           FIELD(metrics.log_steps)));
  t.back().bounds = whole(1, kMaxSteps);
  t.push_back(report_to_row());
  t.push_back(row<std::string>("tensorboard-dir", K::kPath, lg,
                               "TensorBoard event directory (default: <output-dir>/tensorboard)",
                               FIELD(metrics.tensorboard_dir)));
  needs(t, "report-to", {"tensorboard"});
  t.push_back(row<std::string>("wandb-project", K::kString, lg, "W&B project (default: fsdp-train)",
                               FIELD(metrics.wandb_project)));
  needs(t, "report-to", {"wandb"});
  t.push_back(
      row<std::string>("wandb-name", K::kString, lg, "W&B run name", FIELD(metrics.wandb_name)));
  needs(t, "report-to", {"wandb"});
  t.push_back(row<bool>("wandb-offline", K::kBool, lg,
                        "run W&B offline (WANDB_MODE=offline for the W&B side process; sync "
                        "later with wandb sync)",
                        FIELD(metrics.wandb_offline)));
  needs(t, "report-to", {"wandb"});
  t.push_back(row<std::string>("wandb-dir", K::kPath, lg,
                               "directory W&B writes its run files under (default: --output-dir)",
                               FIELD(metrics.wandb_dir)));
  needs(t, "report-to", {"wandb"});
  t.push_back(row<std::string>("wandb-key", K::kString, lg,
                               "W&B API key (prefer the WANDB_API_KEY environment variable); "
                               "never printed, logged or saved",
                               FIELD(metrics.wandb_key)));
  t.back().cli_only = true;
  t.back().secret = true;
  needs(t, "report-to", {"wandb"});
  t.push_back(row<std::string>(
      "mlflow-tracking-uri", K::kString, lg,
      "MLflow tracking server or store (default: MLFLOW_TRACKING_URI, else a file store in "
      "<output-dir>/mlruns); credentials go in MLFLOW_TRACKING_TOKEN or _USERNAME/_PASSWORD",
      FIELD(metrics.mlflow_tracking_uri)));
  needs(t, "report-to", {"mlflow"});
  t.push_back(
      row<std::string>("mlflow-experiment-name", K::kString, lg,
                       "MLflow experiment (default: MLFLOW_EXPERIMENT_NAME, else fsdp-train)",
                       FIELD(metrics.mlflow_experiment_name)));
  needs(t, "report-to", {"mlflow"});
  t.push_back(row<std::string>("mlflow-run-name", K::kString, lg,
                               "MLflow run name (default: MLFLOW_RUN_NAME, else MLflow picks one)",
                               FIELD(metrics.mlflow_run_name)));
  needs(t, "report-to", {"mlflow"});
  t.push_back(row<std::optional<double>>(
      "mfu-peak-tflops", K::kOptFloat, lg,
      "peak TFLOP/s per device for MFU; default: known GPUs (H100/H200 989, A100 312), n/a on CPU",
      FIELD(metrics.mfu_peak_tflops)));
  t.back().bounds = at_least(
      0, true, "give the device's dense bf16 peak in TFLOP/s, e.g. 989 for an H100 SXM", 1.0e6);
  t.push_back(row<AccuracyAggregation>(
      "accuracy-aggregation", K::kEnum, lg,
      "acc_i over micro-batches and ranks: pooled (sum correct / sum tokens) or per-batch (mean "
      "of each micro-batch's acc_i, SpecForge's old offline script)",
      FIELD(metrics.accuracy_aggregation)));
  t.push_back(exact_choice_row<log::Level>(
      "log-level", lg, "trace, debug, info, warn, error or off (env FSDP_LOG_LEVEL)",
      FIELD(runtime.log_level),
      {{"trace", log::Level::kTrace},
       {"debug", log::Level::kDebug},
       {"info", log::Level::kInfo},
       {"warn", log::Level::kWarn},
       {"error", log::Level::kError},
       {"off", log::Level::kOff}},
      "trace, debug, info, warn, error, off", "pick one of trace, debug, info, warn, error, off"));
}

// The LibTorch profiler window and its trace directory.
void add_profiling_rows(std::vector<OptionSpec>& t) {
  const std::string pf = "Profiling";
  t.push_back(row<bool>("profile", K::kBool, pf,
                        "record a LibTorch profiler trace (operators; GPU kernels on a GPU) of "
                        "optimizer steps --profile-start-step+1 .. +--profile-num-steps: one "
                        "Chrome/Perfetto trace and a summary table per rank",
                        FIELD(profile.enabled)));
  t.push_back(row<int64_t>("profile-start-step", K::kInt, pf,
                           "the optimizer step after which profiling starts",
                           FIELD(profile.start_step)));
  t.back().bounds = whole(0, kMaxSteps);
  needs(t, "profile");
  t.push_back(row<int64_t>("profile-num-steps", K::kInt, pf, "optimizer steps to profile",
                           FIELD(profile.num_steps)));
  t.back().bounds = whole(1, 10000);
  needs(t, "profile");
  t.push_back(row<bool>("profile-record-shapes", K::kBool, pf,
                        "record operator input shapes in the trace", FIELD(profile.record_shapes)));
  needs(t, "profile");
  t.push_back(row<std::string>("profile-dir", K::kPath, pf,
                               "trace directory (default: $SGLANG_TORCH_PROFILER_DIR when set, "
                               "else <output-dir>/profile)",
                               FIELD(profile.dir)));
  needs(t, "profile");
}

// Device, threads, where step scalars live and the collective timeout.
void add_runtime_rows(std::vector<OptionSpec>& t) {
  const std::string rt = "Runtime";
  t.push_back(row<DeviceKind>("device", K::kEnum, rt,
                              "auto: the GPU of the local rank when there is one, else cpu",
                              FIELD(runtime.device)));
  t.push_back(row<int64_t>(
      "threads", K::kInt, rt,
      "CPU threads per rank (0: OMP_NUM_THREADS when set, else cores divided by ranks on "
      "the node)",
      FIELD(runtime.threads)));
  t.back().bounds = whole(0, 1024, " (0: chosen from the cores)");
  t.push_back(row<StepScalars>(
      "step-scalars", K::kEnum, rt,
      "where the optimizer step's gradient norm, clip coefficient, skip flag and step count "
      "live: auto = on the GPU when the optimizer state is there (no host synchronisation per "
      "step; skipped steps are reported at logging steps), host = read every step, device = on "
      "the state's device even on the CPU; the same training either way (on the CPU, device "
      "steps use torch's fused AdamW kernel and differ from host steps by rounding, ~1e-7)",
      FIELD(runtime.step_scalars)));
  t.push_back(row<int64_t>("dist-timeout", K::kInt, rt,
                           "minutes a collective may wait before the job is aborted",
                           FIELD(runtime.dist_timeout_minutes)));
  t.back().bounds =
      whole(1, 7 * 24 * 60, "", "give the minutes a collective may wait, 1 to 10080 (a week)");
}

// Names other SpecForge versions use for our options (their --help differs between releases);
// each goes through our option's parser.
void add_specforge_alias_rows(std::vector<OptionSpec>& t) {
  t.push_back(alias_row(t, "batch-size", "draft-micro-batch-size",
                        "samples per forward/backward on one rank (SpecForge before "
                        "--draft-micro-batch-size); without --draft-global-batch-size the "
                        "global batch becomes batch-size x ranks x accumulation steps"));
  t.push_back(alias_row(t, "draft-accumulation-steps", "gradient-accumulation-steps",
                        "micro-batches per optimizer step (SpecForge's name for "
                        "--gradient-accumulation-steps); without --draft-global-batch-size the "
                        "global batch follows from it"));
  t.push_back(alias_row(t, "max-num-steps", "max-steps", "SpecForge's name for --max-steps"));
  t.push_back(alias_row(t, "log-interval", "log-steps", "SpecForge's name for --log-steps"));
  t.push_back(alias_row(t, "ckpt-dir", "init-checkpoint",
                        "SpecForge's name for --init-checkpoint (a draft directory to fine-tune "
                        "from)"));
  t.push_back(alias_row(t, "dataloader-num-workers", "loader-threads",
                        "SpecForge's DataLoader workers: sets --loader-threads (0, SpecForge's "
                        "'load in the main process', means one reader thread)"));
  t.back().bounds =
      whole(0, data::LoaderOptions::kMaxThreads, "",
            str("give 0 to ", data::LoaderOptions::kMaxThreads, " reader threads (0: one)"));
  t.back().set = [](TrainConfig& c, const OptionValue& v, const std::string& src) {
    const int64_t n = parse_int(v.text, src);
    option("dataloader-num-workers").check_int(n, src);
    c.data.loader_threads = std::max<int64_t>(n, 1);
  };
  t.push_back(alias_row(t, "wandb", "report-to",
                        "older SpecForge's W&B switch: adds wandb to --report-to"));
  t.back().kind = K::kBool;
  t.back().choices.clear();
  t.back().set = [](TrainConfig& c, const OptionValue& v, const std::string& src) {
    auto& sinks = c.metrics.report_to;
    const bool on = parse_bool(v.text, src);
    const auto it = std::find(sinks.begin(), sinks.end(), MetricSink::kWandb);
    if (on && it == sinks.end()) sinks.push_back(MetricSink::kWandb);
    if (!on && it != sinks.end()) sinks.erase(it);
  };
  t.push_back(alias_row(t, "verbose", "log-level", "SpecForge's switch for --log-level debug"));
  t.back().kind = K::kBool;
  t.back().set = [](TrainConfig& c, const OptionValue& v, const std::string& src) {
    if (parse_bool(v.text, src)) c.runtime.log_level = log::Level::kDebug;
  };
}

// Options only SpecForge has: each value is checked, recorded in the run metadata and unused.
void add_recorded_rows(std::vector<OptionSpec>& t) {
  t.push_back(recorded_row("tp-size", K::kInt,
                           "target-model tensor parallelism in SpecForge; only 1 is accepted "
                           "(offline training runs no target model)",
                           check_tp_size));
  t.push_back(recorded_row("dp-size", K::kInt,
                           "data-parallel size in SpecForge; when given it must equal the number "
                           "of ranks over --sp-ulysses-size",
                           check_positive_text));
  t.push_back(recorded_row("sp-ring-size", K::kInt,
                           "ring attention (SpecForge's other sequence-parallel axis); only 1 is "
                           "accepted: fsdp-train's sequence parallelism is --sp-ulysses-size",
                           check_sequence_parallel));
  t.push_back(recorded_row("attention-backend", K::kString,
                           "SpecForge's draft attention kernel (sdpa, flex_attention, fa, eager, "
                           "usp); fsdp-train has one exact implementation (sequence-parallel "
                           "with --sp-ulysses-size), so the value is recorded here",
                           check_attention_backend));
  t.push_back(recorded_row("draft-attention-backend", K::kString,
                           "another SpecForge spelling of --attention-backend (recorded)",
                           check_attention_backend));
  t.push_back(recorded_row("target-model-backend", K::kString,
                           "SpecForge's online target engine (sglang, hf, custom); recorded, "
                           "offline training runs no target model",
                           check_target_backend));
  t.push_back(recorded_row("cache-key", K::kString,
                           "SpecForge's name for its tokenised-dataset cache (recorded; the vocab "
                           "mapping cache here is keyed by the data path and sizes)",
                           nullptr));
  t.push_back(recorded_row("build-dataset-num-proc", K::kInt,
                           "processes SpecForge tokenises the raw jsonl with (recorded; nothing "
                           "is tokenised here)",
                           check_positive_text));
  t.push_back(recorded_row("is-preformatted", K::kBool,
                           "SpecForge: the raw jsonl already has the chat template applied "
                           "(recorded; the raw jsonl is not read here)",
                           nullptr));
  t.push_back(recorded_row("model-download-dir", K::kPath,
                           "SpecForge's Hugging Face download directory: searched first "
                           "when --target-model-path is a repository id (then the "
                           "HF_HUB_CACHE / HF_HOME caches); nothing is downloaded",
                           nullptr));
  t.push_back(recorded_row("is-vlm", K::kBool,
                           "SpecForge's vision-language target switch; refused (not supported)",
                           check_not_vlm));
  t.push_back(recorded_row("min-pixels", K::kInt, "SpecForge VLM image setting (recorded)",
                           check_positive_text));
  t.push_back(recorded_row("max-pixels", K::kInt, "SpecForge VLM image setting (recorded)",
                           check_positive_text));
}

// The whole table in its one order: --help, the generated option docs and their sync tests
// list the options in the order the rows are appended here.
std::vector<OptionSpec> build_table() {
  std::vector<OptionSpec> t;
  add_config_file_rows(t);
  add_model_rows(t);
  add_data_rows(t);
  add_training_rows(t);
  add_dflash_rows(t);
  add_peagle_rows(t);
  add_optimizer_rows(t);
  add_sharding_rows(t);
  add_checkpoint_rows(t);
  add_evaluation_rows(t);
  add_logging_rows(t);
  add_profiling_rows(t);
  add_runtime_rows(t);
  add_specforge_alias_rows(t);
  add_recorded_rows(t);
  return t;
}

#undef FIELD

}  // namespace

const char* to_string(TrainingStrategy v) {
  return enum_name(v);
}

const char* to_string(OptimizerKind v) {
  return enum_name(v);
}

const char* to_string(MuonAdjustLr v) {
  return enum_name(v);
}

std::string OptionSpec::yaml_key() const {
  std::string k = name;
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

std::string OptionSpec::default_text() const {
  static const TrainConfig defaults;
  const OptionValue v = get(defaults);
  if (kind == OptionKind::kList) return v.list.empty() ? "none" : v.text;
  if (v.is_null) return "none";
  if (v.text.empty()) return "\"\"";
  return v.text;
}

std::string NumericBounds::text(bool integer) const {
  const auto num = [&](double v) {
    return integer ? std::to_string(static_cast<int64_t>(v)) : format_float(v);
  };
  if (integer) return num(min) + ".." + num(max);
  if (std::isinf(max)) return (min_open ? "> " : ">= ") + num(min);
  return (min_open ? "(" : "[") + num(min) + ", " + num(max) + (max_open ? ")" : "]");
}

void OptionSpec::check_int(int64_t v, const std::string& source) const {
  if (!bounds) return;
  const NumericBounds& b = *bounds;
  const std::string src = source.empty() ? flag() : source;
  const auto lo = static_cast<int64_t>(b.min), hi = static_cast<int64_t>(b.max);
  const std::string hint =
      b.hint.empty() ? str("give ", flag(), " a whole number from ", lo, " to ", hi, b.zero_means)
                     : b.hint;
  if (v < lo) {
    FSDP_USAGE_FAIL(lo == 1   ? str(src, " must be positive, got ", v)
                    : lo == 0 ? str(src, " must be 0 or more, got ", v)
                              : str(src, " ", v, " is below its minimum ", lo),
                    hint);
  }
  FSDP_USAGE_CHECK(v <= hi, str(src, " ", v, " is above its maximum ", hi), hint);
}

void OptionSpec::check_float(double v, const std::string& source) const {
  if (!bounds) return;
  const NumericBounds& b = *bounds;
  const std::string src = source.empty() ? flag() : source;
  const std::string hint =
      b.hint.empty() ? str("give ", flag(), " a number ", b.text(false), b.zero_means) : b.hint;
  const bool below = b.min_open ? !(v > b.min) : !(v >= b.min);
  const bool above = b.max_open ? !(v < b.max) : !(v <= b.max);
  const std::string shown = format_float(v);
  if (b.as_interval) {
    FSDP_USAGE_CHECK(!below && !above, str(src, " ", shown, " is outside ", b.text(false)), hint);
    return;
  }
  if (below) {
    FSDP_USAGE_FAIL(b.min != 0 ? str(src, " ", shown, " is below its minimum ", format_float(b.min))
                    : b.min_open ? str(src, " ", shown, " must be positive")
                                 : str(src, " ", shown, " is negative"),
                    hint);
  }
  FSDP_USAGE_CHECK(!above, str(src, " ", shown, " is above its maximum ", format_float(b.max)),
                   hint);
}

void OptionSpec::check_value(const TrainConfig& cfg) const {
  if (!bounds) return;
  const OptionValue v = get(cfg);
  if (v.is_null) return;
  if (kind == OptionKind::kInt || kind == OptionKind::kOptInt) {
    check_int(parse_int(v.text, flag()));
  } else {
    check_float(parse_float(v.text, flag()));
  }
}

const std::vector<OptionSpec>& option_table() {
  static const std::vector<OptionSpec> table = build_table();
  return table;
}

const OptionSpec* find_option(const std::string& name) {
  std::string n = name;
  while (!n.empty() && n.front() == '-') n.erase(n.begin());
  std::replace(n.begin(), n.end(), '_', '-');
  n = detail::to_lower(n);
  for (const auto& spec : option_table()) {
    if (spec.name == n) return &spec;
  }
  return nullptr;
}

const OptionSpec& option(const std::string& name) {
  const OptionSpec* spec = find_option(name);
  FSDP_ASSERT(spec != nullptr, "no option named " + name + " in the option table");
  return *spec;
}

std::string closest_option(const std::string& name) {
  std::string n = detail::to_lower(name);
  std::replace(n.begin(), n.end(), '_', '-');
  const OptionSpec* best = nullptr;
  size_t best_d = 0;
  for (const auto& spec : option_table()) {
    const size_t d = detail::edit_distance(n, spec.name);
    if (!best || d < best_d) {
      best = &spec;
      best_d = d;
    }
  }
  return best ? best->name : "";
}

UnknownFlagAdvice advise_unknown_flag(const std::string& arg) {
  if (arg.rfind("--", 0) != 0) {
    return {str("unexpected argument '", arg, "'"),
            "every value belongs to a flag (--name VALUE); fsdp-train --help lists them"};
  }
  std::string name =
      arg.substr(2, arg.find('=') == std::string::npos ? std::string::npos : arg.find('=') - 2);
  const auto starts = [&](const char* p) { return name.rfind(p, 0) == 0; };
  if (starts("swanlab")) {
    return {str("--", name, ": ", kSwanLabRefused), str("--report-to: ", kSwanLabAdvice)};
  }
  if (starts("sglang-") || starts("target-batch-size") || starts("target-micro-batch-size")) {
    return {str("--", name,
                " configures SpecForge's online target model, and fsdp-train trains "
                "offline on precomputed hidden states"),
            "drop it; make the hidden states with SpecForge's prepare_hidden_states.py"};
  }
  return {str("unknown flag --", name),
          str("did you mean --", closest_option(name), "? (fsdp-train --help lists every flag)")};
}

}  // namespace fsdp::config
