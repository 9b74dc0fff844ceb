// The config.json half of the export check (export_check.h): aux-layer ids as vLLM 0.32 and
// SGLang read them (lib/model/aux_layers.h is the one place that knows how), architectures, vocab
// sizes, tie flag, RoPE in the transformers v4 and v5 schemas, dtype. Reports, never throws.
#include <cmath>
#include <fstream>
#include <iterator>
#include <set>

#include "checkpoint/export_check_internal.h"
#include "checkpoint/serving_contract.h"
#include "core/error.h"
#include "model/aux_layers.h"

namespace fsdp::checkpoint::export_check {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Ids = std::optional<std::vector<int64_t>>;

namespace {

constexpr const char* kAuxKey = kAuxLayerIdsKey;
constexpr uint64_t kMaxJsonBytes = 64ull << 20;

// 1: the two engines read the same tensors, 0: different ones, -1: unknown (an engine's default
// capture against explicit ids, with the target's layer count unknown).
int same_reading(const Ids& a_raw, const Ids& b_raw, const Ids& a, const Ids& b) {
  if (a_raw == b_raw) return 1;
  if (a && b) return *a == *b ? 1 : 0;
  return -1;
}

void check_range(const std::string& subject, const std::string& who, const std::vector<int64_t>& hs,
                 bool is_default, int64_t L, Report& r) {
  const std::string reads = who.find(" and ") != std::string::npos ? " read " : " reads ";
  for (int64_t k : hs) {
    if (k < 0 || (L > 0 && k > L)) {
      const std::string msg =
          who + reads + "hidden_states[" + std::to_string(k) + "]" +
          (L > 0 ? ", but the target has " + std::to_string(L) +
                       " decoder layers (hidden_states 0.." + std::to_string(L) + ")"
                 : ", which does not exist");
      if (is_default)
        r.warn(subject, msg + " (the engines' default capture for so small a target)",
               "write eagle_aux_hidden_state_layer_ids naming the layers of the features");
      else
        r.error(subject, msg,
                "the ids must name target layers (check the convention: SpecForge's id i is "
                "hidden_states[i + 1], vLLM's id k is hidden_states[k]; docs/serving.md)");
      return;
    }
    if (L > 0 && k == L) {
      r.warn(subject,
             who + reads + "hidden_states[" + std::to_string(L) +
                 "], the last layer's output: vLLM and SGLang capture it before the target's "
                 "final norm, Hugging Face's output_hidden_states after it",
             "make sure the features were dumped as the engines capture them (SpecForge does), "
             "or train on a lower layer");
      return;
    }
  }
}

std::optional<double> number(const json& obj, const char* key) {
  if (obj.is_object() && obj.contains(key) && obj.at(key).is_number())
    return obj.at(key).get<double>();
  return std::nullopt;
}

bool same_value(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) {
    const double x = a.get<double>(), y = b.get<double>();
    return std::fabs(x - y) <= 1e-9 * std::max(std::fabs(x), std::fabs(y));
  }
  return a == b;
}

}  // namespace

void check_rope(const json& cfg, Report& r) {
  const json scaling = cfg.contains("rope_scaling") ? cfg.at("rope_scaling") : json();
  const bool v4 = cfg.contains("rope_theta") || !scaling.is_null();
  const double theta4 = number(cfg, "rope_theta").value_or(10000.0);
  if (!scaling.is_null() && !scaling.is_object()) {
    r.error("config.json:rope_scaling", "is " + scaling.dump() + ", not an object or null",
            "write null or an object with rope_type and factor");
    return;
  }
  auto type_of = [](const json& s) -> std::string {
    if (!s.is_object()) return "default";
    if (s.contains("rope_type") && s.at("rope_type").is_string()) return s.at("rope_type");
    if (s.contains("type") && s.at("type").is_string()) return s.at("type");
    return "default";
  };
  const json* params = cfg.contains("rope_parameters") ? &cfg.at("rope_parameters") : &cfg;
  for (const json* o : {&cfg, params}) {
    if (o->is_object() && o->contains("rope_theta") && !o->at("rope_theta").is_null() &&
        !o->at("rope_theta").is_number()) {
      r.error(std::string("config.json:") + (o == &cfg ? "" : "rope_parameters.") + "rope_theta",
              "is " + o->at("rope_theta").dump() + ", not a number",
              "write the RoPE base, e.g. 10000.0");
      return;
    }
  }
  const std::string type4 = type_of(scaling);
  if (!cfg.contains("rope_parameters") || cfg.at("rope_parameters").is_null()) {
    r.ok("config.json:rope_theta", str("rope_theta ", theta4, ", rope_scaling ", type4,
                                       " (transformers v4 keys; v5 readers convert them)"));
    return;
  }
  const json& p = cfg.at("rope_parameters");
  if (!p.is_object()) {
    r.error("config.json:rope_parameters", "is " + p.dump() + ", not an object",
            "write an object with rope_type and rope_theta, or leave it out");
    return;
  }
  const std::optional<double> theta5 = number(p, "rope_theta");
  const std::string type5 = type_of(p);
  if (!v4) {
    if (type5 != "default" || (theta5 && *theta5 != 10000.0))
      r.warn("config.json:rope_parameters",
             "only transformers v5 readers see it; v4 readers use rope_theta 10000 without "
             "scaling",
             "write rope_theta and rope_scaling with the same values too (fsdp-train export "
             "writes both)");
    else
      r.ok("config.json:rope_parameters", "default RoPE (v5 schema)");
    return;
  }
  std::string diff;
  if (theta5 && !same_value(json(*theta5), json(theta4)))
    diff = str("rope_parameters.rope_theta ", *theta5, " but rope_theta ", theta4);
  else if (type5 != type4)
    diff = "rope_parameters.rope_type " + type5 + " but rope_scaling's " + type4;
  std::set<std::string> keys;
  for (const json* o : {&scaling, &p})
    if (o->is_object())
      for (auto it = o->begin(); it != o->end(); ++it) keys.insert(it.key());
  for (const auto& k : keys) {
    if (!diff.empty()) break;
    if (k == "type" || k == "rope_type" || k == "rope_theta") continue;
    const bool in4 = scaling.is_object() && scaling.contains(k), in5 = p.contains(k);
    if (!in4 || !in5 || !same_value(scaling.at(k), p.at(k)))
      diff = "rope_parameters." + k + " " + (in5 ? p.at(k).dump() : "absent") +
             " but rope_scaling." + k + " " + (in4 ? scaling.at(k).dump() : "absent");
  }
  if (!diff.empty())
    r.error("config.json:rope_parameters",
            diff + ": transformers v5 readers and v4 readers would rotate differently",
            "make rope_parameters (v5) and rope_theta + rope_scaling (v4) say the same");
  else
    r.ok("config.json:rope_parameters",
         str("agrees with rope_theta ", theta4, " and rope_scaling (", type4, ")"));
}

Engines engines_for(const json& cfg, const ExportCheckOptions& o) {
  return o.engines_from_config ? engines_from_config(cfg) : engines_named(o.engines);
}

std::optional<json> read_json(const fs::path& path, const std::string& subject, Report& r,
                              std::string* text) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    r.error(subject, "missing",
            subject == "config.json"
                ? "the engines read the draft's architecture and sizes from config.json: put the "
                  "draft config there"
                : "write it next to the shards");
    return std::nullopt;
  }
  const auto size = fs::file_size(path, ec);
  if (ec || size > kMaxJsonBytes) {
    r.error(subject, ec ? "cannot read its size (" + ec.message() + ")" : "larger than 64 MiB",
            "this is not a config file: write it again");
    return std::nullopt;
  }
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  json j;
  try {
    j = json::parse(s);
  } catch (const json::exception& e) {
    r.error(subject, std::string("not valid JSON (") + e.what() + ")",
            "fix the JSON (a cut file, a trailing comma) or write the file again");
    return std::nullopt;
  }
  if (!j.is_object()) {
    r.error(subject, "not a JSON object", "write the file again");
    return std::nullopt;
  }
  if (text) *text = s;
  return j;
}

std::optional<int64_t> positive_int(const json& cfg, const std::string& key, Report& r) {
  if (!cfg.contains(key) || cfg.at(key).is_null()) return std::nullopt;
  const json& v = cfg.at(key);
  if (v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() < (int64_t{1} << 31))
    return v.get<int64_t>();
  r.error("config.json:" + key, "is " + v.dump() + ", not a positive integer below 2^31",
          "write the draft's value");
  return std::nullopt;
}

int64_t config_aux_count(const json& cfg) {
  if (has_aux_layer_ids(cfg)) return static_cast<int64_t>(cfg.at(kAuxKey).size());
  if (has_nested_aux_layer_ids(cfg))
    return static_cast<int64_t>(cfg.at("eagle_config").at(kAuxKey).size());
  return kSglangFcLayers;
}

namespace {

// The aux ids of a config.json as each engine reads them: as written (nullopt: the engine's
// default capture) and resolved (that default filled in when the target's layer count is known).
struct AuxReadings {
  std::string subject;  // the key the findings name
  bool nested = false;  // eagle_config holds ids
  Ids def;              // the engines' default capture (nullopt: the target's layers unknown)
  Ids vllm, sglang, sglang_legacy;
  Ids vllm_hs, sglang_hs, legacy_hs;

  std::string says(const Ids& raw) const {
    if (raw) return "hidden_states " + list_text(*raw);
    return def ? "its default capture, hidden_states " + list_text(*def)
               : std::string(
                     "its default capture (hidden_states [2, L/2, L-3] of an L-layer "
                     "target)");
  }
};

// nullopt (and an ERROR) when the ids are not a list of layer numbers.
std::optional<AuxReadings> read_aux(const std::string& text, const json& cfg, int64_t L,
                                    Report& r) {
  AuxReadings a;
  const bool top = has_aux_layer_ids(cfg);
  a.nested = has_nested_aux_layer_ids(cfg);
  a.subject = std::string("config.json:") + (!top && a.nested ? "eagle_config." : "") + kAuxKey;
  try {
    a.vllm = model::vllm_reads(text);
    a.sglang = model::sglang_reads(text, /*legacy=*/false);
    a.sglang_legacy = model::sglang_reads(text, /*legacy=*/true);
  } catch (const std::exception& ex) {
    r.error(a.subject, what_of(ex), "write the ids as a list of whole layer numbers");
    return std::nullopt;
  }
  a.def = L > 0 ? Ids(model::default_hidden_state_index(L)) : std::nullopt;
  a.vllm_hs = a.vllm ? a.vllm : a.def;
  a.sglang_hs = a.sglang ? a.sglang : a.def;
  a.legacy_hs = a.sglang_legacy ? a.sglang_legacy : a.def;
  return a;
}

// Whether the engines the export is for read the same layers (and what the other would read).
void check_engines_agree(const AuxReadings& a, const Engines& e, Report& r) {
  const int vs = same_reading(a.vllm, a.sglang, a.vllm_hs, a.sglang_hs);
  const std::string both_hint =
      "write the top-level eagle_aux_hidden_state_layer_ids for vLLM (hidden_states indices) and "
      "eagle_config's for SGLang so that both name the layers of the features (fsdp-train "
      "export --for engines does; docs/serving.md)";
  if (e.vllm && e.sglang) {
    if (vs == 1)
      r.ok(a.subject, "vLLM and SGLang both read " + a.says(a.vllm ? a.vllm : a.sglang));
    else if (vs == 0)
      r.error(a.subject, "vLLM reads " + a.says(a.vllm) + " but SGLang reads " + a.says(a.sglang),
              both_hint);
    else
      r.warn(a.subject,
             "vLLM reads " + a.says(a.vllm) + " and SGLang " + a.says(a.sglang) +
                 ": the same only for the right target",
             "give --target-model-path to compare them, or write the ids explicitly");
  } else {
    const bool v = e.vllm;
    r.ok(a.subject, std::string(v ? "vLLM" : "SGLang") + " reads " + a.says(v ? a.vllm : a.sglang));
    if (vs == 0)
      r.warn(a.subject,
             std::string(v ? "SGLang" : "vLLM") + " would read " + a.says(v ? a.sglang : a.vllm) +
                 " instead (not checked for: --for " + (v ? "vllm" : "sglang") + ")",
             both_hint);
  }
  if (e.sglang && same_reading(a.sglang, a.sglang_legacy, a.sglang_hs, a.legacy_hs) == 0)
    r.warn(a.subject,
           "an SGLang from before its PR #25454 adds one to every eagle_config id and reads " +
               a.says(a.sglang_legacy),
           "serve with an SGLang that has PR #25454, or use ids whose first is 1 (read alike by "
           "both)");
}

// The layers each engine reads exist in an L-layer target; once per distinct reading.
void check_aux_range(const AuxReadings& a, const Engines& e, int64_t L, Report& r) {
  std::vector<std::pair<std::string, Ids>> readings;
  if (e.vllm) readings.push_back({"vLLM", a.vllm_hs});
  if (e.sglang) {
    if (!readings.empty() && readings.front().second == a.sglang_hs)
      readings.front().first = "vLLM and SGLang";
    else
      readings.push_back({"SGLang", a.sglang_hs});
  }
  const size_t before = r.out.size();
  for (const auto& [who, hs] : readings) {
    if (!hs) continue;
    const bool is_default = who == "SGLang" ? !a.sglang
                            : who == "vLLM" ? !a.vllm
                                            : !a.vllm && !a.sglang;
    check_range(a.subject, who, *hs, is_default, L, r);
  }
  if (r.out.size() == before)
    r.ok(a.subject, L > 0 ? "in range for a " + std::to_string(L) + "-layer target"
                          : "range not checked: give --target-model-path for the target's layers");
}

// The number of layers each engine captures and builds fc for, against fc.weight's `n`.
void check_fc_width(const AuxReadings& a, const json& cfg, const Engines& e, int64_t n, Report& r) {
  if (e.vllm) {
    const bool explicit_count = cfg.contains("num_aux_hidden_states") &&
                                cfg.at("num_aux_hidden_states").is_number_integer();
    const int64_t built = explicit_count ? cfg.at("num_aux_hidden_states").get<int64_t>()
                          : a.nested
                              ? static_cast<int64_t>(cfg.at("eagle_config").at(kAuxKey).size())
                              : kSglangFcLayers;
    if (built != n)
      r.error(explicit_count ? "config.json:num_aux_hidden_states" : a.subject,
              str("vLLM 0.32 builds fc for ", built,
                  " aux layers (num_aux_hidden_states, else the number of eagle_config's ids, "
                  "else 3) but fc.weight takes ",
                  n),
              "write eagle_config.eagle_aux_hidden_state_layer_ids (or num_aux_hidden_states) "
              "with as many layers as the features hold");
    const int64_t captured = a.vllm ? static_cast<int64_t>(a.vllm->size()) : kSglangFcLayers;
    if (captured != n)
      r.error(a.subject, str("vLLM captures ", captured, " target layers but fc.weight takes ", n),
              "list as many ids as the features hold layers");
  }
  if (e.sglang) {
    if (n != kSglangFcLayers)
      r.error("fc.weight",
              str("SGLang's LlamaForCausalLMEagle3 always builds fc for 3 aux layers, fc.weight "
                  "takes ",
                  n),
              "serve this draft with vLLM (--for vllm)");
    const int64_t captured = a.sglang ? static_cast<int64_t>(a.sglang->size()) : kSglangFcLayers;
    if (captured != n)
      r.error(a.subject,
              str("SGLang captures ", captured, " target layers but fc.weight takes ", n),
              "list as many ids as the features hold layers");
  }
}

}  // namespace

void check_aux(const std::string& text, const json& cfg, const Engines& e, int64_t L,
               std::optional<int64_t> fc_layers, Report& r) {
  const std::optional<AuxReadings> a = read_aux(text, cfg, L, r);
  if (!a) return;
  check_engines_agree(*a, e, r);
  check_aux_range(*a, e, L, r);
  if (fc_layers) check_fc_width(*a, cfg, e, *fc_layers, r);
}

void check_config_fields(const json& cfg, const Engines& e, std::optional<int64_t> lm_head_rows,
                         Report& r) {
  // vLLM 0.32's registry maps these to its llama_eagle3 model (Eagle3Qwen3ForCausalLM to
  // qwen3_eagle3); SGLang's llama_eagle3.py has EntryClass = [LlamaForCausalLMEagle3].
  static const std::set<std::string> vllm_names = {
      "LlamaForCausalLMEagle3",   "Eagle3LlamaForCausalLM",     "PEagleDraftModel",
      "PeagleLlamaForCausalLM",   "Eagle3MiniMaxM2ForCausalLM", "Eagle3Qwen2_5vlForCausalLM",
      "Eagle3Qwen3vlForCausalLM", "Eagle3Qwen3ForCausalLM"};
  std::vector<std::string> archs;
  if (cfg.contains("architectures") && cfg.at("architectures").is_array())
    for (const json& a : cfg.at("architectures"))
      if (a.is_string()) archs.push_back(a.get<std::string>());
  auto any_of = [&](auto pred) { return std::any_of(archs.begin(), archs.end(), pred); };
  const bool vllm_ok = any_of([&](const std::string& a) { return vllm_names.count(a) > 0; });
  const bool sglang_ok = any_of([](const std::string& a) { return a == "LlamaForCausalLMEagle3"; });
  const std::string arch_text =
      cfg.contains("architectures") ? cfg.at("architectures").dump() : std::string("absent");
  if ((e.vllm && !vllm_ok) || (e.sglang && !sglang_ok))
    r.error("config.json:architectures",
            arch_text + ": " +
                (e.vllm && !vllm_ok ? "vLLM 0.32 maps LlamaForCausalLMEagle3 and "
                                      "Eagle3LlamaForCausalLM to its llama_eagle3 model"
                                    : "SGLang's llama_eagle3 model is LlamaForCausalLMEagle3 only"),
            "write \"architectures\": [\"LlamaForCausalLMEagle3\"] (read by both engines)");
  else
    r.ok("config.json:architectures", arch_text);

  const int64_t V = cfg.contains("vocab_size") && cfg.at("vocab_size").is_number_integer()
                        ? cfg.at("vocab_size").get<int64_t>()
                        : 0;
  const bool vd_given = cfg.contains("draft_vocab_size") && !cfg.at("draft_vocab_size").is_null();
  if (lm_head_rows && V > 0 && *lm_head_rows < V && !vd_given)
    r.error("config.json:draft_vocab_size",
            str("absent while lm_head.weight has ", *lm_head_rows, " rows < vocab_size ", V,
                ": the engines build an LM head of vocab_size rows (SGLang even takes the "
                "target's)"),
            str("write \"draft_vocab_size\": ", *lm_head_rows));
  else
    r.ok("config.json:draft_vocab_size",
         vd_given ? cfg.at("draft_vocab_size").dump() : "absent: the draft predicts vocab_size");

  if (!cfg.contains("tie_word_embeddings"))
    r.warn("config.json:tie_word_embeddings", "absent (LlamaConfig's default is false)",
           "write \"tie_word_embeddings\": false explicitly");
  else if (cfg.at("tie_word_embeddings") != json(false))
    r.error("config.json:tie_word_embeddings",
            "is " + cfg.at("tie_word_embeddings").dump() +
                ": SGLang then uses the embedding as the LM head, not lm_head.weight",
            "write \"tie_word_embeddings\": false (an EAGLE3 draft has its own LM head)");
  else
    r.ok("config.json:tie_word_embeddings", "false");

  if (cfg.contains("eagle_config") && !cfg.at("eagle_config").is_object() &&
      !cfg.at("eagle_config").is_null())
    r.error("config.json:eagle_config", "is " + cfg.at("eagle_config").dump() + ", not an object",
            "write an object, e.g. {\"eagle_aux_hidden_state_layer_ids\": [1, 15, 26]}, or leave "
            "it out");
  check_rope(cfg, r);

  const char* dtype_key = cfg.contains("torch_dtype") ? "torch_dtype" : "dtype";
  static const std::set<std::string> dtypes = {"bfloat16", "float16", "float32"};
  if (!cfg.contains(dtype_key))
    r.warn("config.json:torch_dtype", "absent: the engines use the target's dtype",
           "write \"torch_dtype\" (bfloat16, float16 or float32)");
  else if (!cfg.at(dtype_key).is_string() || !dtypes.count(cfg.at(dtype_key).get<std::string>()))
    r.warn(std::string("config.json:") + dtype_key,
           cfg.at(dtype_key).dump() + " is not one of bfloat16, float16, float32",
           "write the dtype of the weights");
  else
    r.ok(std::string("config.json:") + dtype_key, cfg.at(dtype_key).get<std::string>());

  const bool qwen3_layers = cfg.contains("architectures") &&
                            cfg.at("architectures") == json::array({"Eagle3Qwen3ForCausalLM"});
  if (qwen3_layers && cfg.value("model_type", json()) != json("qwen3"))
    r.error("config.json:model_type",
            (cfg.contains("model_type") ? cfg.at("model_type").dump() : std::string("absent")) +
                " with Qwen3 layers: vLLM reads the file through AutoConfig by model_type and "
                "would build another config class (or none)",
            "write \"model_type\": \"qwen3\"");
  else if (!cfg.contains("model_type"))
    r.warn("config.json:model_type",
           "absent: transformers' AutoConfig, which the engines use, "
           "needs it to read the file",
           "write \"model_type\": \"llama\"");
  // SGLang's LlamaForCausalLMEagle3 builds one layer with fc over 3 captured layers and neither
  // fc_norm, norm_before_fc nor norm_output: it would serve another model than the one trained.
  const std::string variants = vllm_only_variants(cfg);
  if (e.sglang && !variants.empty())
    r.error("config.json", str("a draft variant SGLang does not build (", variants, ")"),
            "serve it with vLLM (check with --for vllm); docs/serving.md 'Draft variants'");
}

}  // namespace fsdp::checkpoint::export_check
