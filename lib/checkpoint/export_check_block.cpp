// check-export for the block drafts, DFlash and DSpark (export_check.h): config keys, target
// layers, mask token, attention layout, DSpark's heads, and every tensor against the layout the
// config implies, as vLLM 0.32 and SGLang read them (the rules: checkpoint/block_draft_contract.h).
// Reports, never throws.
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>

#include "checkpoint/block_draft_contract.h"
#include "checkpoint/export_check_internal.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"

namespace fsdp::checkpoint::export_check {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

const json& section(const json& cfg, const char* key) {
  static const json empty = json::object();
  return cfg.contains(key) && cfg.at(key).is_object() ? cfg.at(key) : empty;
}

bool has(const json& obj, const char* key) {
  return obj.is_object() && obj.contains(key) && !obj.at(key).is_null();
}

std::string key_of(const char* key) {
  return std::string("config.json:") + key;
}

// obj[key] when it is a string, else "".
std::string text_at(const json& obj, const char* key) {
  return has(obj, key) && obj.at(key).is_string() ? obj.at(key).get<std::string>() : "";
}

std::string lower_string(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// The facts the later checks share; zero where the config does not give them.
struct Facts {
  BlockDraftKind kind = BlockDraftKind::kDFlash;
  Engines e;
  int64_t H = 0, V = 0, L = 0, block = 0, target_layers = 0;
  std::vector<int64_t> ids;
};

void check_architecture(const json& cfg, Facts& f, Report& r) {
  const std::string arch = cfg.at("architectures").dump();
  const bool qwen3 = cfg.value("model_type", json()) == "qwen3";
  if (!has(cfg, "model_type")) {
    r.error(key_of("model_type"),
            "absent: transformers' AutoConfig, which both engines use, "
            "cannot read the file",
            "write \"model_type\": \"qwen3\"");
  } else if (f.kind == BlockDraftKind::kDSpark && !qwen3 && f.e.vllm &&
             arch.find("Qwen3DSparkModel") == std::string::npos) {
    r.error(key_of("model_type"),
            cfg.at("model_type").dump() +
                ": vLLM 0.32 serves DSparkDraftModel as its Qwen3 DSpark "
                "model only with model_type qwen3; otherwise it takes the DeepSeek-V4 DSpark path "
                "(weights inside the target) and fails",
            "write \"model_type\": \"qwen3\"");
  }
  r.ok(key_of("architectures"), arch + ": " + block_draft_kind_name(f.kind) + " draft");
  if (f.kind == BlockDraftKind::kDSpark && f.e.sglang &&
      arch.find("Qwen3DSparkModel") == std::string::npos)
    r.warn(key_of("architectures"),
           arch +
               ": SGLang's models/dspark.py registers Qwen3DSparkModel; only some of its "
               "versions also register DSparkDraftModel",
           "for SGLang write [\"Qwen3DSparkModel\"] (vLLM reads that name too)");
  if (cfg.value("speculators_model_type", json()) == "dspark" && f.e.sglang)
    r.error(key_of("speculators_model_type"),
            "\"dspark\": SGLang refuses speculators' block-slot convention",
            "drop the key: fsdp-train's drafts use SpecForge's (slot k predicts anchor + k + 1)");
}

// Sizes against the target's, and the keys that would make an engine build other sizes.
void check_sizes(const json& cfg, const ExportCheckOptions& o, Facts& f, Report& r) {
  for (const char* key : {"hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "vocab_size"})
    if (!has(cfg, key)) r.error(key_of(key), "missing", "write the draft's value (Qwen3Config)");
  f.H = positive_int(cfg, "hidden_size", r).value_or(0);
  f.V = positive_int(cfg, "vocab_size", r).value_or(0);
  f.L = positive_int(cfg, "num_hidden_layers", r).value_or(0);
  const std::string why = ": the draft embeds and predicts with the target's embedding and LM head";
  if (o.target_vocab_size > 0 && f.V > 0 && f.V != o.target_vocab_size)
    r.error(key_of("vocab_size"), str(f.V, " but the target's is ", o.target_vocab_size, why),
            "export the draft with the target's vocab_size");
  if (o.target_hidden_size > 0 && f.H > 0 && f.H != o.target_hidden_size)
    r.error(key_of("hidden_size"),
            str(f.H, " but the target's is ", o.target_hidden_size, why,
                " (vLLM keeps a random embedding of another width)"),
            "a block draft has the target's hidden_size");
  const auto vd = positive_int(cfg, "draft_vocab_size", r);
  if (vd && *vd != f.V)
    r.error(key_of("draft_vocab_size"),
            str(*vd, " but vocab_size ", f.V,
                ": vLLM then builds a reduced LM head and a d2t "
                "map the draft does not carry"),
            "drop draft_vocab_size (a block draft predicts the target's whole vocabulary)");
  const auto ht = positive_int(cfg, "target_hidden_size", r);
  if (ht && *ht != f.H)
    r.error(key_of("target_hidden_size"),
            str(*ht, " but hidden_size ", f.H,
                ": vLLM builds fc for target_hidden_size-wide "
                "features, SGLang and SpecForge for hidden_size-wide ones"),
            "drop target_hidden_size");
}

void check_block(const json& cfg, Facts& f, Report& r) {
  const auto b = positive_int(cfg, "block_size", r);  // an ERROR when malformed
  if (!b || *b < 2) {
    if (b || !has(cfg, "block_size"))
      r.error(key_of("block_size"), b ? str(*b, ", not a block") : std::string("missing"),
              "write the block size the draft was trained with (an integer >= 2)");
    return;
  }
  f.block = *b;
  r.ok(key_of("block_size"),
       str(*b, ": vLLM num_speculative_tokens ", engine_draft_tokens(f.kind, *b),
           f.kind == BlockDraftKind::kDSpark ? " (its default for DSpark)" : "",
           "; SGLang reads block_size itself"));
}

void check_layer_ids(const json& cfg, const ExportCheckOptions& o, Facts& f, Report& r) {
  const json& dc = section(cfg, "dflash_config");
  const std::string subject = key_of("dflash_config.target_layer_ids");
  if (!has(dc, "target_layer_ids") || !dc.at("target_layer_ids").is_array() ||
      dc.at("target_layer_ids").empty()) {
    r.error(subject, "missing: the engines cannot tell which target layers the features hold",
            "write dflash_config.target_layer_ids (SpecForge's ids: layer outputs)");
    return;
  }
  for (const json& v : dc.at("target_layer_ids")) {
    if (!v.is_number_integer()) {
      r.error(subject, "holds " + v.dump(), "list whole layer numbers");
      return;
    }
    f.ids.push_back(v.get<int64_t>());
  }
  const auto n = positive_int(cfg, "num_target_layers", r);
  f.target_layers = o.target_num_layers > 0 ? o.target_num_layers : n.value_or(0);
  if (!n) {
    const std::string m =
        "absent: SGLang then checks target_layer_ids against the draft's own "
        "num_hidden_layers";
    if (f.e.sglang)
      r.error(key_of("num_target_layers"), m, "write the target's num_hidden_layers");
    else
      r.warn(key_of("num_target_layers"), m, "write the target's num_hidden_layers");
  } else if (o.target_num_layers > 0 && *n != o.target_num_layers) {
    r.error(key_of("num_target_layers"),
            str(*n, " but the target has ", o.target_num_layers, " layers"),
            "export the draft for this target, or check --target-model-path");
  }
  std::vector<int64_t> hs;
  for (int64_t id : f.ids) hs.push_back(id + 1);
  for (int64_t id : f.ids) {
    if (id < 0 || (f.target_layers > 0 && id >= f.target_layers)) {
      r.error(subject,
              id < 0 ? str("id ", id, " is negative (SpecForge's ids count layer outputs from 0)")
                     : str("id ", id, " is not a layer of a ", f.target_layers,
                           "-layer target (SpecForge's ids count layer outputs from 0)"),
              "list layers of the target the features were dumped from");
      return;
    }
  }
  if (f.target_layers > 0 && f.ids.back() == f.target_layers - 1)
    r.warn(subject,
           "names the last layer: the engines capture its output before the target's final norm, "
           "Hugging Face's output_hidden_states after it",
           "make sure the features were dumped as the engines capture them");
  const json* aux = has(cfg, "eagle_aux_hidden_state_layer_ids")
                        ? &cfg.at("eagle_aux_hidden_state_layer_ids")
                        : nullptr;
  if (aux && f.e.vllm && *aux != json(hs))
    r.error(
        key_of("eagle_aux_hidden_state_layer_ids"),
        aux->dump() + ": vLLM captures these instead of target_layer_ids + 1 = " + json(hs).dump(),
        "drop the key, or write target_layer_ids + 1");
  r.ok(subject, json(f.ids).dump() + ": vLLM captures hidden_states " + json(hs).dump() +
                    (f.target_layers > 0 ? str(" of a ", f.target_layers, "-layer target")
                                         : std::string(" (range not checked: give "
                                                       "--target-model-path)")));
}

void check_mask_token(const json& cfg, const ExportCheckOptions& o, const Facts& f, Report& r) {
  const json& dc = section(cfg, "dflash_config");
  const std::string subject = key_of("dflash_config.mask_token_id");
  const json v =
      has(dc, "mask_token_id") ? dc.at("mask_token_id") : cfg.value("mask_token_id", json());
  if (!v.is_number_integer()) {
    r.error(subject, v.is_null() ? std::string("missing") : "is " + v.dump(),
            "write the mask token the draft was trained with (an id of the target's vocabulary)");
    return;
  }
  const int64_t id = v.get<int64_t>();
  const int64_t vocab = o.target_vocab_size > 0 ? o.target_vocab_size : f.V;
  if (id < 0 || (vocab > 0 && id >= vocab))
    r.error(subject, str(id, " is outside the vocabulary [0, ", vocab, ")"),
            "write the mask token the draft was trained with");
  else
    r.ok(subject, str(id));
}

// Trained causality per layer: full attention sees the whole block, sliding attention is causal
// inside it (SpecForge's masks); vLLM reads the same from layer_types unless told otherwise.
void check_attention(const json& cfg, const Facts& f, Report& r) {
  const std::string subject = key_of("layer_types");
  if (!has(cfg, "layer_types")) {
    r.ok(subject, "absent: every layer full attention, non-causal inside the block");
    return;
  }
  const json& t = cfg.at("layer_types");
  if (!t.is_array() || (f.L > 0 && static_cast<int64_t>(t.size()) != f.L) ||
      std::any_of(t.begin(), t.end(), [](const json& x) {
        return x != "full_attention" && x != "sliding_attention";
      })) {
    r.error(subject, t.dump() + ": not one full_attention or sliding_attention per layer",
            "write one entry per draft layer");
    return;
  }
  const auto sliding = std::count(t.begin(), t.end(), "sliding_attention");
  const json& dc = section(cfg, "dflash_config");
  if (sliding > 0 && positive_int(cfg, "sliding_window", r).value_or(0) == 0)
    r.error(key_of("sliding_window"), "missing with sliding_attention layers",
            "write the window (the current token included)");
  if (has(dc, "swa_window_size") && dc.at("swa_window_size") != cfg.value("sliding_window", json()))
    r.error(key_of("dflash_config.swa_window_size"),
            "vLLM reads it before sliding_window, which differs",
            "drop dflash_config.swa_window_size");
  if (has(dc, "use_swa") && dc.at("use_swa") == true && sliding < static_cast<int64_t>(t.size()))
    r.error(key_of("dflash_config.use_swa"), "vLLM then makes every layer sliding",
            "drop dflash_config.use_swa");
  for (const auto& [obj, key] : {std::pair{&cfg, "is_causal"}, std::pair{&dc, "causal"}}) {
    if (!has(*obj, key)) continue;
    const bool causal = obj->at(key) == true;
    if (std::any_of(t.begin(), t.end(),
                    [&](const json& x) { return (x == "sliding_attention") != causal; }))
      r.error(key_of(obj == &cfg ? "is_causal" : "dflash_config.causal"),
              "vLLM applies it to every layer, unlike training (full attention non-causal, "
              "sliding attention causal inside the block)",
              "drop the key");
  }
  if (sliding > 0 && sliding < static_cast<int64_t>(t.size()) && f.e.vllm)
    r.warn(subject,
           "mixed sliding and full layers: vLLM's V1 model runner (its CPU build) "
           "refuses them, the V2 runner (VLLM_USE_V2_MODEL_RUNNER=1, GPU) serves them",
           "serve on a GPU with the V2 model runner");
  r.ok(subject, str(t.size() - sliding, " full, ", sliding, " sliding layer(s)"));
}

// DSpark's heads, where each engine reads them (block_draft_contract.h).
void check_heads_config(const json& cfg, const std::set<std::string>& names, const Facts& f,
                        Report& r) {
  const json& dc = section(cfg, "dflash_config");
  for (const char* key :
       {"markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov"})
    if (has(dc, key) && has(cfg, key) && dc.at(key) != cfg.at(key))
      r.error(key_of(key),
              cfg.at(key).dump() + " but dflash_config." + key + " " + dc.at(key).dump() +
                  ": the engines read the first, SpecForge the second",
              "write the same value in both places");
  const json rank = cfg.value("markov_rank", dc.value("markov_rank", json()));
  const bool markov = rank.is_number_integer() && rank.get<int64_t>() > 0;
  if (!has(cfg, "markov_rank"))
    r.error(key_of("markov_rank"),
            "missing at the top level: vLLM's Qwen3DSparkModel and SGLang read it there (not in "
            "dflash_config); vLLM fails with an AttributeError, SGLang refuses a draft without it",
            "write markov_rank at the top level too (fsdp-train's export does)");
  else if (!rank.is_number_integer() || rank.get<int64_t>() < 0)
    r.error(key_of("markov_rank"), "is " + rank.dump(), "write the Markov head's rank (0: none)");
  else if (!markov && f.e.sglang)
    r.error(key_of("markov_rank"), "0: SGLang refuses a DSpark draft without its Markov head",
            "serve it with vLLM (check with --for vllm)");
  const std::string type = lower_string(text_at(cfg, "markov_head_type"));
  if (type.empty() && markov && f.e.sglang)
    r.error(key_of("markov_head_type"), "missing at the top level: SGLang requires it",
            "write markov_head_type (vanilla, gated or rnn) at the top level");
  else if (markov && !type.empty() && type != "vanilla" && f.e.vllm)
    r.error(key_of("markov_head_type"),
            "\"" + type + "\": vLLM 0.32's Qwen3DSparkModel builds only the vanilla head",
            "serve it with SGLang (check with --for sglang)");
  const bool weights = names.count("confidence_head.proj.weight") > 0;
  if (!has(cfg, "enable_confidence_head"))
    r.warn(key_of("enable_confidence_head"),
           "absent: vLLM then leaves the confidence head out, SGLang builds it",
           "write enable_confidence_head explicitly");
  else if (cfg.at("enable_confidence_head") == true && !weights)
    r.error(key_of("enable_confidence_head"), "true but the weights have no confidence head",
            "write false, or export the trained head");
  if (weights && !has(cfg, "confidence_head_with_markov"))
    r.error(key_of("confidence_head_with_markov"),
            "absent: vLLM builds the head without the Markov embedding, SGLang with it (one of "
            "them cannot load it)",
            "write confidence_head_with_markov explicitly");
  if (!weights && f.e.sglang)
    r.warn("confidence_head.proj.weight",
           "absent: SGLang builds the confidence head unless SGLANG_RAGGED_VERIFY_MODE=static, "
           "and then refuses a checkpoint without its weights",
           "serve with SGLANG_RAGGED_VERIFY_MODE=static, or train the head");
}

void check_rope_base(const json& cfg, Report& r) {
  if (!has(cfg, "rope_theta") && !has(section(cfg, "rope_parameters"), "rope_theta")) {
    r.error(key_of("rope_theta"),
            "missing: vLLM defaults a block draft's RoPE base to 1e6, transformers' Qwen3Config "
            "(SpecForge) to 10000",
            "write rope_theta and rope_parameters with the base the draft trained with");
    return;
  }
  check_rope(cfg, r);
}

const char* dtype_name(const std::string& st) {
  return st == "BF16" ? "bfloat16" : st == "F16" ? "float16" : st == "F32" ? "float32" : "";
}

// Why an engine cannot take a tensor the layout does not have.
std::string extra_reason(const std::string& name) {
  if (name == "lm_head.weight" || name == "embed_tokens.weight")
    return "vLLM loads it as the draft's own while SGLang takes the target's: the engines "
           "would serve different drafts";
  if (name == "d2t" || name == "t2d")
    return "a block draft predicts the target's whole vocabulary; vLLM has no parameter for it";
  if (name.rfind("model.", 0) == 0)
    return "vLLM adds 'model.' to every name itself and finds no parameter for this one";
  return "not a tensor of the draft config.json describes: vLLM refuses unknown names, SGLang "
         "skips them";
}

void check_tensors(const json& cfg, const std::map<std::string, StoredTensor>& tensors, Report& r) {
  std::vector<BlockDraftTensor> layout;
  try {
    layout = block_draft_layout(cfg);
  } catch (const std::exception& e) {
    r.error(key_of("architectures"), "the tensors cannot be checked: " + what_of(e),
            "fix config.json first");
    return;
  }
  const std::string want =
      has(cfg, "torch_dtype") ? text_at(cfg, "torch_dtype") : text_at(cfg, "dtype");
  std::set<std::string> known;
  for (const auto& x : layout) {
    known.insert(x.name);
    auto it = tensors.find(x.name);
    if (it == tensors.end()) {
      r.error(x.name, "missing", "export every tensor of the draft (SpecForge's state dict names)");
      continue;
    }
    const TensorInfo& info = *it->second.info;
    const char* dt = dtype_name(info.dtype_str);
    if (!*dt)
      r.error(x.name, "dtype " + info.dtype_str + ": the engines load bf16, fp16 or fp32 weights",
              "store the weights as BF16, F16 or F32");
    else if (info.shape != x.shape)
      r.error(x.name,
              "shape " + list_text(info.shape) + ", expected " + list_text(x.shape) +
                  " from config.json",
              "config.json must describe these weights (sizes, "
              "target_layer_ids, markov_rank, confidence_head_with_markov)");
    else if (!want.empty() && want != dt)
      r.warn(x.name,
             str(dt, " but config.json says ", want,
                 " (the engines cast to the "
                 "target's dtype)"),
             "write the weights' dtype in torch_dtype");
    else
      r.ok(x.name, list_text(info.shape) + " " + info.dtype_str);
  }
  for (const auto& [name, t] : tensors)
    if (!known.count(name)) r.error(name, extra_reason(name), "export only the draft's tensors");
}

}  // namespace

void check_block_draft(const fs::path& dir, const json& cfg,
                       const std::map<std::string, StoredTensor>& tensors,
                       const ExportCheckOptions& o, Report& r) {
  Facts f;
  f.kind = *block_draft_kind(cfg);
  f.e = o.engines_from_config ? block_draft_engines(cfg) : engines_named(o.engines);
  check_architecture(cfg, f, r);
  check_sizes(cfg, o, f, r);
  check_block(cfg, f, r);
  check_layer_ids(cfg, o, f, r);
  check_mask_token(cfg, o, f, r);
  check_attention(cfg, f, r);
  if (f.kind == BlockDraftKind::kDSpark) {
    std::set<std::string> names;
    for (const auto& [name, t] : tensors) names.insert(name);
    check_heads_config(cfg, names, f, r);
  }
  check_rope_base(cfg, r);
  std::error_code ec;
  if (fs::exists(dir / "mask_embedding.pt", ec))
    r.error("mask_embedding.pt",
            "vLLM replaces the mask token's embedding with it; the draft was trained with the "
            "target embedding's row",
            "remove the file");
  if (!tensors.empty()) check_tensors(cfg, tensors, r);
}

}  // namespace fsdp::checkpoint::export_check
