// The serving contract of the block drafts (checkpoint/block_draft_contract.h): the engines'
// rules for DFlash and DSpark exports, written once.
#include "checkpoint/block_draft_contract.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <tuple>

#include "core/error.h"

namespace fsdp::checkpoint {

using json = nlohmann::json;

namespace {

const json& section(const json& cfg, const char* key) {
  static const json empty = json::object();
  return cfg.is_object() && cfg.contains(key) && cfg.at(key).is_object() ? cfg.at(key) : empty;
}

const json* find(const json& obj, const std::string& key) {
  if (!obj.is_object() || !obj.contains(key) || obj.at(key).is_null()) return nullptr;
  return &obj.at(key);
}

// obj[key] as a whole number; nullopt when absent or null. `where` names the file in messages.
std::optional<int64_t> int_at(const json& obj, const std::string& key, const std::string& where) {
  const json* v = find(obj, key);
  if (!v) return std::nullopt;
  FSDP_USAGE_CHECK(v->is_number_integer(),
                   where + ": " + key + " is " + v->dump() + ", not a whole number",
                   "write the draft's value as an integer");
  return v->get<int64_t>();
}

int64_t positive(const json& obj, const std::string& key, const std::string& where) {
  const auto v = int_at(obj, key, where);
  FSDP_USAGE_CHECK(v && *v > 0,
                   where + ": " + key + (v ? " is " + std::to_string(*v) : " is missing") +
                       ", the engines need a positive value",
                   "write the draft's " + key + " (a Qwen3Config field)");
  return *v;
}

std::optional<bool> bool_at(const json& obj, const std::string& key, const std::string& where) {
  const json* v = find(obj, key);
  if (!v) return std::nullopt;
  FSDP_USAGE_CHECK(v->is_boolean(), where + ": " + key + " is " + v->dump() + ", not true/false",
                   "write true or false");
  return v->get<bool>();
}

std::optional<double> number_at(const json& obj, const std::string& key, const std::string& where) {
  const json* v = find(obj, key);
  if (!v) return std::nullopt;
  FSDP_USAGE_CHECK(v->is_number(), where + ": " + key + " is " + v->dump() + ", not a number",
                   "write a number");
  return v->get<double>();
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// DSpark's heads. The export writes each key in both places alike, so a config the engines read
// and one SpecForge reads cannot disagree.
struct DSparkHeads {
  int64_t markov_rank = 0;
  std::string markov_head_type = "vanilla";
  bool confidence = false;
  bool confidence_with_markov = false;
};

// Where a head key is read first: the draft's own view (dflash_config, SpecForge's place; the top
// level, where published drafts write it, when dflash_config lacks it; both given and different
// is refused) or the engines' (the top level first).
enum class HeadView { kDraft, kEngines };

template <typename Get>
auto head_key(const json& cfg, const std::string& key, HeadView view, Get get,
              const std::string& where) {
  const auto top = get(cfg, key), nested = get(section(cfg, "dflash_config"), key);
  if (view == HeadView::kEngines) return top ? top : nested;
  FSDP_USAGE_CHECK(!top || !nested || *top == *nested,
                   where + ": " + key + " differs between the top level and dflash_config",
                   "write it once (SpecForge reads dflash_config)");
  return nested ? nested : top;
}

DSparkHeads dspark_heads(const json& cfg, HeadView view, const std::string& where) {
  auto ints = [&](const json& o, const std::string& k) { return int_at(o, k, where); };
  auto bools = [&](const json& o, const std::string& k) { return bool_at(o, k, where); };
  auto names = [&](const json& o, const std::string& k) -> std::optional<std::string> {
    const json* v = find(o, k);
    if (!v) return std::nullopt;
    FSDP_USAGE_CHECK(v->is_string(), where + ": " + k + " is " + v->dump(),
                     "write vanilla, gated or rnn");
    return lower(v->get<std::string>());
  };
  DSparkHeads h;
  h.markov_rank = head_key(cfg, "markov_rank", view, ints, where).value_or(0);
  h.markov_head_type = head_key(cfg, "markov_head_type", view, names, where).value_or("vanilla");
  const auto alpha = number_at(section(cfg, "dflash_config"), "confidence_head_alpha", where);
  h.confidence = head_key(cfg, "enable_confidence_head", view, bools, where)
                     .value_or(alpha.value_or(0.0) > 0.0);
  h.confidence_with_markov =
      head_key(cfg, "confidence_head_with_markov", view, bools, where).value_or(false);
  return h;
}

void check_heads(const DSparkHeads& h, const std::string& where) {
  FSDP_USAGE_CHECK(h.markov_rank >= 0, where + ": markov_rank is " + std::to_string(h.markov_rank),
                   "write the Markov head's rank (0: none)");
  FSDP_USAGE_CHECK(h.markov_head_type == "vanilla" || h.markov_head_type == "gated" ||
                       h.markov_head_type == "rnn",
                   where + ": markov_head_type '" + h.markov_head_type + "' is not a DSpark head",
                   "write vanilla, gated or rnn");
  FSDP_USAGE_CHECK(h.markov_rank > 0 || !(h.confidence && h.confidence_with_markov),
                   where + ": confidence_head_with_markov without a Markov head (markov_rank 0)",
                   "set markov_rank, or confidence_head_with_markov false");
}

struct Sizes {
  int64_t H = 0, I = 0, L = 0, nh = 0, nkv = 0, d = 0, V = 0;
  bool bias = false;
};

// The sizes as every reader of the config builds them: transformers' Qwen3Config (SpecForge, and
// the engines through AutoConfig) fills an absent head_dim with 128 and an absent
// num_key_value_heads with 32.
Sizes sizes(const json& cfg, const std::string& where) {
  Sizes s;
  s.H = positive(cfg, "hidden_size", where);
  s.I = positive(cfg, "intermediate_size", where);
  s.L = positive(cfg, "num_hidden_layers", where);
  s.nh = positive(cfg, "num_attention_heads", where);
  s.V = positive(cfg, "vocab_size", where);
  s.nkv = find(cfg, "num_key_value_heads") ? positive(cfg, "num_key_value_heads", where) : 32;
  FSDP_USAGE_CHECK(s.nh % s.nkv == 0,
                   str(where, ": num_key_value_heads ", s.nkv, " does not divide ",
                       "num_attention_heads ", s.nh),
                   "give a key/value head count that divides the attention heads");
  s.d = find(cfg, "head_dim") ? positive(cfg, "head_dim", where) : 128;
  s.bias = bool_at(cfg, "attention_bias", where).value_or(false);
  return s;
}

std::vector<int64_t> layer_ids(const json& cfg, const std::string& where) {
  const json* ids = find(section(cfg, "dflash_config"), "target_layer_ids");
  FSDP_USAGE_CHECK(
      ids && ids->is_array() && !ids->empty(),
      where + ": dflash_config.target_layer_ids is " + (ids ? ids->dump() : std::string("missing")),
      "list the target layers the features hold (SpecForge's ids)");
  std::vector<int64_t> out;
  for (const json& v : *ids) {
    FSDP_USAGE_CHECK(v.is_number_integer(),
                     where + ": dflash_config.target_layer_ids holds " + v.dump(),
                     "list whole layer numbers");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

// layer_types as the draft trains them: absent is every layer full attention (Qwen3Config's
// default); sliding layers need a window.
json layer_types(const json& cfg, int64_t L, const std::string& where) {
  const json* t = find(cfg, "layer_types");
  if (!t) {
    // Qwen3Config then derives them from use_sliding_window and max_window_layers: the export
    // names them instead of repeating that rule.
    FSDP_USAGE_CHECK(!bool_at(cfg, "use_sliding_window", where).value_or(false),
                     where + ": use_sliding_window without layer_types",
                     "write layer_types (full_attention or sliding_attention per layer)");
    return json(std::vector<std::string>(static_cast<size_t>(L), "full_attention"));
  }
  FSDP_USAGE_CHECK(t->is_array() && static_cast<int64_t>(t->size()) == L,
                   str(where, ": layer_types ", t->dump(), " needs one entry per layer (",
                       "num_hidden_layers ", L, ")"),
                   "write full_attention or sliding_attention for every layer");
  for (const json& v : *t)
    FSDP_USAGE_CHECK(v == "full_attention" || v == "sliding_attention",
                     where + ": layer_types holds " + v.dump(),
                     "write full_attention or sliding_attention");
  return *t;
}

void set_rope(const json& in, json& out, const std::string& where) {
  const json* params = find(in, "rope_parameters");
  json p = params && params->is_object() ? *params : json::object();
  FSDP_USAGE_CHECK(!params || params->is_object(), where + ": rope_parameters is " + params->dump(),
                   "write an object or null");
  const auto theta4 = number_at(in, "rope_theta", where);
  const auto theta5 = number_at(p, "rope_theta", where);
  FSDP_USAGE_CHECK(
      !theta4 || !theta5 || *theta4 == *theta5,
      str(where, ": rope_theta ", *theta4, " but rope_parameters.rope_theta ", *theta5),
      "give the RoPE base once");
  if (!params) {
    const json* scaling = find(in, "rope_scaling");
    FSDP_USAGE_CHECK(!scaling || scaling->is_object(),
                     where + ": rope_scaling is " + scaling->dump(), "write an object or null");
    if (scaling) p = *scaling;
  }
  if (p.contains("type") && !p.contains("rope_type")) p["rope_type"] = p["type"];
  p.erase("type");
  if (!p.contains("rope_type")) p["rope_type"] = "default";
  // transformers' Qwen3Config default, which SpecForge trained with; vLLM would default a DFlash
  // draft to 1e6, so the export always says it.
  p["rope_theta"] = theta5.value_or(theta4.value_or(10000.0));
  out["rope_parameters"] = p;
  out["rope_theta"] = p["rope_theta"];
  json scaling = p;
  scaling.erase("rope_theta");
  out["rope_scaling"] = p["rope_type"] == "default" ? json() : scaling;
}

void set_heads(const DSparkHeads& h, json& out, const std::string& where) {
  json& dc = out["dflash_config"];
  const json* projector = find(dc, "projector_type");
  FSDP_USAGE_CHECK(!projector || *projector == "dspark",
                   where + ": dflash_config.projector_type is " + projector->dump(),
                   "a DSpark draft has projector_type dspark (SpecForge's DSparkDraftModel)");
  dc["projector_type"] = "dspark";
  for (json* o : {&dc, &out}) {
    (*o)["markov_rank"] = h.markov_rank;
    (*o)["markov_head_type"] = h.markov_head_type;
    (*o)["enable_confidence_head"] = h.confidence;
    (*o)["confidence_head_with_markov"] = h.confidence_with_markov;
  }
  // SpecForge's labels are anchor + 1 .. anchor + B: the anchor predicts (vLLM's default).
  out["sample_from_anchor"] = true;
}

// Sizes the engines would build otherwise: the target's vocabulary and width, no reduced head.
void check_sizes(const json& draft, const Sizes& s, const BlockDraftTraining& t,
                 const std::string& where) {
  FSDP_USAGE_CHECK(t.target_vocab_size == 0 || s.V == t.target_vocab_size,
                   str(where, ": vocab_size ", s.V, " but the target's is ", t.target_vocab_size,
                       ": the draft embeds and predicts with the target's embedding and LM head"),
                   "write the target's vocab_size in the draft config");
  FSDP_USAGE_CHECK(t.target_hidden_size == 0 || s.H == t.target_hidden_size,
                   str(where, ": hidden_size ", s.H, " but the target's is ", t.target_hidden_size,
                       ": the draft's input is the target's embedding"),
                   "write the target's hidden_size in the draft config");
  const auto vd = int_at(draft, "draft_vocab_size", where);
  FSDP_USAGE_CHECK(!vd || *vd == s.V,
                   str(where, ": draft_vocab_size ", *vd, " but vocab_size ", s.V,
                       ": a block draft predicts with the target's LM head"),
                   "drop draft_vocab_size");
  const auto ht = int_at(draft, "target_hidden_size", where);
  FSDP_USAGE_CHECK(!ht || *ht == s.H,
                   str(where, ": target_hidden_size ", *ht, " but hidden_size ", s.H,
                       ": fc reads features of the draft's width (SpecForge, SGLang)"),
                   "drop target_hidden_size");
}

// layer_types, use_sliding_window and sliding_window as the draft trains them.
void set_layer_types(const json& draft, json& out, int64_t L, const std::string& where) {
  const json types = layer_types(draft, L, where);
  const bool sliding = std::count(types.begin(), types.end(), "sliding_attention") > 0;
  const auto window = int_at(draft, "sliding_window", where);
  FSDP_USAGE_CHECK(!sliding || (window && *window > 0),
                   where + ": sliding_attention layers without a positive sliding_window",
                   "write sliding_window (the window, the current token included)");
  out["layer_types"] = types;
  out["use_sliding_window"] = sliding;
  out["sliding_window"] = sliding ? json(*window) : json();
}

void set_ids(const json& in, json& out, const Sizes& s, const BlockDraftTraining& t,
             const std::string& where) {
  FSDP_CHECK(!t.target_layer_ids.empty() && t.target_num_layers > 0,
             "block draft export without the target's layers", "this is a bug: please report it");
  const json* given = find(section(in, "dflash_config"), "target_layer_ids");
  FSDP_USAGE_CHECK(!given || *given == json(t.target_layer_ids),
                   where + ": dflash_config.target_layer_ids " + given->dump() +
                       " but the features hold layers " + json(t.target_layer_ids).dump(),
                   "write the layers the features were dumped with");
  for (int64_t id : t.target_layer_ids)
    FSDP_USAGE_CHECK(
        id >= 0 && id < t.target_num_layers,
        str(where, ": target layer id ", id, " is outside the target's ", t.target_num_layers,
            " layers (SpecForge's ids: 0 .. ", t.target_num_layers - 1, ")"),
        "list layers of the target");
  FSDP_USAGE_CHECK(
      t.mask_token_id >= 0 && t.mask_token_id < s.V,
      str(where, ": mask_token_id ", t.mask_token_id, " is outside the vocabulary [0, ", s.V, ")"),
      "choose a mask token of the target's vocabulary");
  json& dc = out["dflash_config"];
  if (!dc.is_object()) dc = json::object();
  dc["target_layer_ids"] = t.target_layer_ids;
  dc["mask_token_id"] = t.mask_token_id;
  out["num_target_layers"] = t.target_num_layers;
}

}  // namespace

std::optional<BlockDraftKind> block_draft_kind(const json& cfg) {
  const json* archs = find(cfg, "architectures");
  if (!archs || !archs->is_array()) return std::nullopt;
  for (const json& a : *archs) {
    if (a == "DFlashDraftModel") return BlockDraftKind::kDFlash;
    if (a == "DSparkDraftModel" || a == "Qwen3DSparkModel") return BlockDraftKind::kDSpark;
  }
  return std::nullopt;
}

const char* block_draft_kind_name(BlockDraftKind kind) {
  return kind == BlockDraftKind::kDFlash ? "DFlash" : "DSpark";
}

const char* block_draft_architecture(BlockDraftKind kind) {
  return kind == BlockDraftKind::kDFlash ? "DFlashDraftModel" : "DSparkDraftModel";
}

int64_t engine_draft_tokens(BlockDraftKind kind, int64_t block_size) {
  return kind == BlockDraftKind::kDFlash ? block_size - 1 : block_size;
}

ServingEngines block_draft_engines(const json& cfg) {
  if (block_draft_kind(cfg) != BlockDraftKind::kDSpark) return {true, true};
  try {
    const auto h = dspark_heads(cfg, HeadView::kEngines, "config.json");
    if (h.markov_rank == 0) return {true, false};
    if (h.markov_head_type != "vanilla") return {false, true};
  } catch (const std::exception&) {  // malformed keys: the check reports them
  }
  return {true, true};
}

json block_draft_export_config(const json& draft, const BlockDraftTraining& t) {
  const std::string& where = t.source;
  const auto kind = block_draft_kind(draft);
  FSDP_USAGE_CHECK(kind.has_value(),
                   where + ": architectures " +
                       (find(draft, "architectures") ? draft.at("architectures").dump()
                                                     : std::string("missing")) +
                       " names no block draft",
                   "write [\"DFlashDraftModel\"] or [\"DSparkDraftModel\"]");
  FSDP_USAGE_CHECK(find(draft, "num_key_value_heads"),
                   where + ": num_key_value_heads is missing (Qwen3Config would make it 32)",
                   "write the draft's key/value head count");
  const Sizes s = sizes(draft, where);
  check_sizes(draft, s, t, where);
  const auto block = int_at(draft, "block_size", where);
  FSDP_USAGE_CHECK(block && *block >= 2,
                   where + ": block_size is " + (block ? std::to_string(*block) : "missing"),
                   "write the block size the draft trains with (an integer >= 2, e.g. 16)");
  json out = draft;
  out["architectures"] = {block_draft_architecture(*kind)};
  out["model_type"] = "qwen3";
  out["num_key_value_heads"] = s.nkv;
  out["head_dim"] = s.d;
  out["tie_word_embeddings"] = false;
  out["torch_dtype"] = t.torch_dtype;
  if (out.contains("dtype")) out["dtype"] = t.torch_dtype;
  set_layer_types(draft, out, s.L, where);
  set_ids(draft, out, s, t, where);
  set_rope(draft, out, where);
  if (*kind == BlockDraftKind::kDSpark) {
    const DSparkHeads h = dspark_heads(draft, HeadView::kDraft, where);
    check_heads(h, where);
    set_heads(h, out, where);
  }
  return out;
}

namespace {

// markov_w1 [V, r], markov_w2 [V, r], and the gated or rnn head's projection (SpecForge 0.2.0).
void push_markov_head(const DSparkHeads& h, const Sizes& s, std::vector<BlockDraftTensor>& out) {
  const int64_t r = h.markov_rank;
  out.push_back({"markov_head.markov_w1.weight", {s.V, r}});
  out.push_back({"markov_head.markov_w2.weight", {s.V, r}});
  if (h.markov_head_type == "gated") {
    out.push_back({"markov_head.gate_proj.weight", {r, s.H + r}});
    out.push_back({"markov_head.gate_proj.bias", {r}});
  } else if (h.markov_head_type == "rnn") {
    out.push_back({"markov_head.joint_proj.weight", {3 * r, 2 * r + s.H}});
    out.push_back({"markov_head.joint_proj.bias", {3 * r}});
  }
}

}  // namespace

std::vector<BlockDraftTensor> block_draft_layout(const json& cfg) {
  const std::string where = "config.json";
  const auto kind = block_draft_kind(cfg);
  FSDP_USAGE_CHECK(kind.has_value(), where + ": architectures names no block draft",
                   "write [\"DFlashDraftModel\"] or [\"DSparkDraftModel\"]");
  const Sizes s = sizes(cfg, where);
  const int64_t n = static_cast<int64_t>(layer_ids(cfg, where).size());
  std::vector<BlockDraftTensor> out = {{"fc.weight", {s.H, n * s.H}},
                                       {"hidden_norm.weight", {s.H}}};
  for (int64_t i = 0; i < s.L; ++i) {
    const std::string a = str("layers.", i, ".self_attn."), m = str("layers.", i, ".mlp.");
    const int64_t q = s.nh * s.d, kv = s.nkv * s.d;
    const std::tuple<const char*, int64_t, int64_t> projections[] = {
        {"q_proj", q, s.H}, {"k_proj", kv, s.H}, {"v_proj", kv, s.H}, {"o_proj", s.H, q}};
    for (const auto& [proj, rows, cols] : projections) {
      out.push_back({a + proj + ".weight", {rows, cols}});
      if (s.bias) out.push_back({a + proj + ".bias", {rows}});
    }
    out.push_back({a + "q_norm.weight", {s.d}});
    out.push_back({a + "k_norm.weight", {s.d}});
    out.push_back({m + "gate_proj.weight", {s.I, s.H}});
    out.push_back({m + "up_proj.weight", {s.I, s.H}});
    out.push_back({m + "down_proj.weight", {s.H, s.I}});
    out.push_back({str("layers.", i, ".input_layernorm.weight"), {s.H}});
    out.push_back({str("layers.", i, ".post_attention_layernorm.weight"), {s.H}});
  }
  out.push_back({"norm.weight", {s.H}});
  if (*kind == BlockDraftKind::kDFlash) return out;
  const DSparkHeads h = dspark_heads(cfg, HeadView::kEngines, where);
  check_heads(h, where);
  const int64_t r = h.markov_rank;
  if (r > 0) push_markov_head(h, s, out);
  if (h.confidence) {
    out.push_back({"confidence_head.proj.weight", {1, s.H + (h.confidence_with_markov ? r : 0)}});
    out.push_back({"confidence_head.proj.bias", {1}});
  }
  return out;
}

}  // namespace fsdp::checkpoint
