// EAGLE3 draft directory checks for the serving engines (export_check.h): files, tensors and the
// vocabulary mapping. What each engine does with a tensor name or dtype mirrors vLLM 0.32's
// llama_eagle3.py load_weights and SGLang's llama_eagle3.py (docs/usage.md "Checking an export");
// the config checks are in export_check_config.cpp. Never throws for a bad directory.
#include "checkpoint/export_check.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include "checkpoint/block_draft_contract.h"
#include "checkpoint/checkpoint_dir.h"
#include "checkpoint/export_check_internal.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/log.h"
#include "model/draft_config.h"

namespace fsdp::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Level = ExportFinding::Level;

namespace export_check {

std::string list_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string what_of(const std::exception& e) {
  if (const auto* fe = dynamic_cast<const Error*>(&e)) return fe->message();
  return error_text(e);
}

}  // namespace export_check

namespace {

using export_check::list_text;
using export_check::Report;
using export_check::what_of;

using Tensor = export_check::StoredTensor;

// Config-derived shapes. `ok` false when a required key is missing (shapes are then not checked).
struct Dims {
  int64_t H = 0, I = 0, nh = 0, nkv = 0, d = 0, Ht = 0, V = 0, Vd = 0, n = 3;
  int64_t L = 1;                                 // decoder layers
  bool fc_norm = false, norm_before_fc = false;  // the variants that add tensors
  bool qk_norm = false;                          // Qwen3 layers: q_norm and k_norm [d]
  bool has_mask_token = false;                   // top-level mask_token_id (P-EAGLE)
  bool ok = false;
};

bool is_plain_file_name(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\\') == std::string::npos;
}

// The pickled weight files in `dir` (not read: unpickling can run code).
std::vector<std::string> pickled_files(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  int seen = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end && ++seen < 10000;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string ext = it->path().extension().string();
    if (ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".ckpt") out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool has_shards(const fs::path& dir) {
  std::error_code ec;
  int seen = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end && ++seen < 10000;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind("model-", 0) == 0 && it->path().extension() == ".safetensors") return true;
  }
  return false;
}

void add_file(const std::shared_ptr<SafetensorsFile>& f, std::map<std::string, Tensor>& out) {
  for (const auto& info : f->tensors()) out[info.name] = Tensor{f, &info, info.name};
}

std::shared_ptr<SafetensorsFile> open_checked(const fs::path& path, const std::string& subject,
                                              Report& r) {
  try {
    return SafetensorsFile::open(path.string());
  } catch (const std::exception& e) {
    r.error(subject, what_of(e),
            "the file is truncated or not a safetensors file: export or download it again");
  }
  return nullptr;
}

}  // namespace

std::map<std::string, Tensor> export_check::open_weights(const fs::path& dir, Report& r) {
  std::map<std::string, Tensor> out;
  std::error_code ec;
  const fs::path single = dir / layout::kModel;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::is_regular_file(single, ec)) {
    if (auto f = open_checked(single, "model.safetensors", r)) {
      add_file(f, out);
      r.ok("model.safetensors",
           str(f->tensors().size(), " tensors, ", f->file_size(), " bytes, header valid"));
    }
    return out;
  }
  if (fs::is_regular_file(index, ec)) {
    const auto j = export_check::read_json(index, "model.safetensors.index.json", r, nullptr);
    if (!j) return out;
    if (!j->contains("weight_map") || !j->at("weight_map").is_object()) {
      r.error("model.safetensors.index.json", "has no weight_map object",
              "write the index as save_pretrained does: {\"weight_map\": {tensor: file}}");
      return out;
    }
    std::map<std::string, std::shared_ptr<SafetensorsFile>> files;
    for (auto it = j->at("weight_map").begin(); it != j->at("weight_map").end(); ++it) {
      const std::string subject = "model.safetensors.index.json:" + it.key();
      if (!it.value().is_string() || !is_plain_file_name(it.value().get<std::string>())) {
        r.error(subject, "weight_map value " + it.value().dump() + " is not a file name",
                "weight_map values are file names next to the index (no directories)");
        continue;
      }
      const std::string file = it.value().get<std::string>();
      if (!files.count(file)) files[file] = open_checked(dir / file, file, r);
      const auto& f = files[file];
      if (!f) continue;
      if (!f->contains(it.key())) {
        r.error(subject, "the index names " + file + ", which holds no such tensor",
                "the index and the shards disagree: write them again together");
        continue;
      }
      out[it.key()] = Tensor{f, &f->info(it.key()), it.key()};
    }
    r.ok("model.safetensors.index.json",
         str(out.size(), " tensors in ", files.size(), " shard file(s)"));
    return out;
  }
  const auto pickled = pickled_files(dir);
  if (!pickled.empty()) {
    std::string names;
    for (const auto& p : pickled) names += (names.empty() ? "" : ", ") + p;
    r.error("model.safetensors",
            "missing; the directory holds pickled weights (" + names +
                "), which are not read (loading a pickle can run code)",
            "convert once with the safetensors library (save_file(torch.load(p, "
            "weights_only=True), 'model.safetensors')); only model.safetensors and "
            "model-*.safetensors shards with model.safetensors.index.json are read");
  } else if (has_shards(dir)) {
    r.error("model.safetensors.index.json",
            "missing: model-*.safetensors shards without their index",
            "write the index (weight_map: tensor name -> shard file) next to the shards");
  } else {
    r.error("model.safetensors", "missing (no model.safetensors nor a sharded index)",
            "point at a draft directory holding config.json and model.safetensors");
  }
  return out;
}

namespace {

// The name every engine means: "model." dropped, "layers.0." (speculators) read as "midlayer.".
std::string canonical(const std::string& name) {
  std::string c = name.rfind("model.", 0) == 0 ? name.substr(6) : name;
  if (c.rfind("layers.0.", 0) == 0) c = "midlayer." + c.substr(9);
  return c;
}

struct Expected {
  std::string name;
  std::vector<int64_t> shape;
};

// Every tensor of the draft the config describes (docs/model.md "Draft variants"): the first
// layer under its canonical name midlayer.* (layers.0.* is read as that), later layers of a
// multi-layer draft as layers.<k>.* with an H-wide q/k/v input and no hidden_norm (vLLM's
// layout), fc's norms when fc_norm or norm_before_fc is set, q_norm/k_norm in Qwen3 layers.
std::vector<Expected> expected_weights(const Dims& d) {
  std::vector<Expected> out;
  if (d.norm_before_fc) out.push_back({"input_norm.weight", {d.n * d.Ht}});
  if (d.fc_norm)
    for (int64_t j = 0; j < d.n; ++j) out.push_back({str("fc_norm.", j, ".weight"), {d.Ht}});
  out.push_back({"fc.weight", {d.H, d.n * d.Ht}});
  for (int64_t k = 0; k < std::max<int64_t>(d.L, 1); ++k) {
    const std::string l = k == 0 ? std::string("midlayer.") : str("layers.", k, ".");
    const int64_t in = k == 0 ? 2 * d.H : d.H;
    if (k == 0) out.push_back({l + "hidden_norm.weight", {d.H}});
    out.push_back({l + "input_layernorm.weight", {d.H}});
    out.push_back({l + "self_attn.q_proj.weight", {d.nh * d.d, in}});
    out.push_back({l + "self_attn.k_proj.weight", {d.nkv * d.d, in}});
    out.push_back({l + "self_attn.v_proj.weight", {d.nkv * d.d, in}});
    out.push_back({l + "self_attn.o_proj.weight", {d.H, d.nh * d.d}});
    if (d.qk_norm) {
      out.push_back({l + "self_attn.q_norm.weight", {d.d}});
      out.push_back({l + "self_attn.k_norm.weight", {d.d}});
    }
    out.push_back({l + "post_attention_layernorm.weight", {d.H}});
    out.push_back({l + "mlp.gate_proj.weight", {d.I, d.H}});
    out.push_back({l + "mlp.up_proj.weight", {d.I, d.H}});
    out.push_back({l + "mlp.down_proj.weight", {d.H, d.I}});
  }
  out.push_back({"norm.weight", {d.H}});
  out.push_back({"lm_head.weight", {d.Vd, d.H}});
  return out;
}

bool is_float_dtype(const std::string& s) {
  return s == "BF16" || s == "F16" || s == "F32";
}

// Names: what each named engine does with the stored spelling.
void check_name(const Tensor& t, const std::string& canon, const export_check::Engines& e,
                Report& r) {
  const bool prefixed = t.name.rfind("model.", 0) == 0;
  const bool speculators = t.name.find("layers.0.") != std::string::npos;
  if (canon == "lm_head.weight" && prefixed) {
    r.error(t.name, "vLLM and SGLang load the draft's LM head only as 'lm_head.weight'",
            "rename the tensor to lm_head.weight");
  } else if (prefixed && e.vllm) {
    r.error(t.name,
            "vLLM 0.32 adds 'model.' to every name but lm_head itself: it looks for "
            "'model." +
                t.name + "' and refuses to load",
            "drop the 'model.' prefix (SGLang reads both spellings)");
  } else if (speculators && e.sglang) {
    r.error(t.name,
            "SGLang knows only 'midlayer.' names and skips this tensor without a word (random "
            "weights)",
            "rename 'layers.0.' to 'midlayer.' (vLLM reads both spellings)");
  }
}

void check_weights(const std::map<std::string, Tensor>& by_canon, const Dims& d,
                   const export_check::Engines& e, Report& r) {
  for (const auto& ex : expected_weights(d)) {
    auto it = by_canon.find(ex.name);
    if (it == by_canon.end()) {
      const bool head = ex.name == "lm_head.weight";
      r.error(ex.name,
              head ? "missing: without it the engines use the target's LM head, whose rows are "
                     "not the draft's; the draft loads and serves at acceptance ~1 "
                     "(Automodel#2447, sglang#27908)"
                   : "missing",
              "export every tensor of the draft (docs/reference.md §3) except embed_tokens");
      continue;
    }
    const Tensor& t = it->second;
    check_name(t, ex.name, e, r);
    if (!is_float_dtype(t.info->dtype_str)) {
      r.error(t.name,
              "dtype " + t.info->dtype_str + ": the engines load bf16, fp16 or fp32 weights",
              "store the weights as BF16, F16 or F32");
      continue;
    }
    if (d.ok && t.info->shape != ex.shape) {
      r.error(t.name,
              "shape " + list_text(t.info->shape) + ", expected " + list_text(ex.shape) +
                  " from config.json" +
                  (ex.name == "fc.weight" ? str(" (hidden_size ", d.H, " x ", d.n,
                                                " aux layers x target_hidden_size ", d.Ht, ")")
                                          : ""),
              ex.name == "fc.weight"
                  ? "the number of eagle_aux_hidden_state_layer_ids and target_hidden_size must "
                    "match the features the draft was trained on"
                  : "config.json must describe these weights (hidden_size, intermediate_size, "
                    "heads, head_dim, draft_vocab_size)");
      continue;
    }
    r.ok(t.name, list_text(t.info->shape) + " " + t.info->dtype_str);
  }
  auto emb = by_canon.find("embed_tokens.weight");
  if (emb == by_canon.end()) {
    r.ok("embed_tokens.weight", "absent: the engines share the target's embedding");
  } else if (!is_float_dtype(emb->second.info->dtype_str) ||
             (d.ok && emb->second.info->shape != std::vector<int64_t>{d.V, d.H})) {
    r.error(emb->second.name,
            str(emb->second.info->dtype_str, " ", list_text(emb->second.info->shape),
                ", expected a float [", d.V, ", ", d.H, "]"),
            "leave embed_tokens out (the engines share the target's) or store the target's");
  } else {
    check_name(emb->second, "embed_tokens.weight", e, r);
    r.ok(emb->second.name, "present: the engines load it instead of sharing the target's");
  }
  // P-EAGLE (docs/model.md "P-EAGLE"): mask_hidden, the stand-in for the captured layers that
  // vLLM's parallel drafting feeds fc at depths >= 1 (loaded as a [1, n * Ht] buffer), and the
  // mask token it embeds there. SGLang has no parallel drafting.
  auto mask = by_canon.find("mask_hidden");
  if (mask == by_canon.end()) mask = by_canon.find("mask_hidden.weight");
  if (mask != by_canon.end()) {
    const Tensor& t = mask->second;
    if (!is_float_dtype(t.info->dtype_str) || (d.ok && t.info->numel() != d.n * d.Ht))
      r.error(t.name,
              str(t.info->dtype_str, " ", list_text(t.info->shape), ", expected ", d.n * d.Ht,
                  " float values (n x target_hidden_size: what fc reads)"),
              "export the P-EAGLE draft's mask_hidden as trained");
    else
      r.ok(t.name, "P-EAGLE's mask_hidden: vLLM reads it with parallel_drafting");
    if (!d.has_mask_token)
      r.error("config.json:mask_token_id",
              "missing: vLLM's parallel drafting embeds this token at depths >= 1",
              "write the mask token the draft was trained with (\"mask_token_id\": N)");
    if (e.sglang)
      r.error(t.name, "a P-EAGLE draft: SGLang has no parallel drafting",
              "serve it with vLLM (--for vllm)");
  }
  // Tensors no engine expects: vLLM refuses unknown names, SGLang skips them.
  const auto expected = expected_weights(d);
  for (const auto& [canon, t] : by_canon) {
    const bool known = canon == "d2t" || canon == "t2d" || canon == "embed_tokens.weight" ||
                       canon == "mask_hidden" || canon == "mask_hidden.weight" ||
                       std::any_of(expected.begin(), expected.end(),
                                   [&](const Expected& x) { return x.name == canon; });
    if (known) continue;
    // rotary_emb buffers: vLLM drops them; input_norm without norm_before_fc: vLLM drops it.
    const bool dropped =
        t.name.find("rotary_emb.") != std::string::npos || canon.rfind("input_norm.", 0) == 0;
    if (e.vllm && !dropped) {
      r.error(t.name,
              "not a tensor of the draft config.json describes: vLLM 0.32 refuses to load "
              "unknown names",
              "drop the tensor, or check its spelling and config.json (num_hidden_layers, "
              "fc_norm; docs/model.md 'Draft variants')");
    } else {
      r.warn(t.name, "not a tensor of the draft config.json describes (not checked)",
             "drop it unless your engine expects it");
    }
  }
}

// d2t and t2d are read into memory: a (hostile, sparse) file cannot make that unbounded.
constexpr int64_t kMaxVocab = int64_t{1} << 28;

// A small integer or bool tensor's values (d2t, t2d), converted to int64.
std::vector<int64_t> read_ints(const Tensor& t) {
  const std::string& dt = t.info->dtype_str;
  const int64_t n = t.info->numel();
  std::vector<int64_t> v(static_cast<size_t>(n));
  const uint8_t* p = t.file->data(*t.info);
  for (int64_t i = 0; i < n; ++i) {
    if (dt == "I64") {
      std::memcpy(&v[i], p + 8 * i, 8);
    } else if (dt == "I32") {
      int32_t x;
      std::memcpy(&x, p + 4 * i, 4);
      v[i] = x;
    } else {
      v[i] = p[i] != 0;  // BOOL, U8
    }
  }
  return v;
}

// What a missing mapping means for this draft, and what to do about a bad one.
struct MappingRule {
  bool required = false;  // the draft vocabulary is smaller than the target's
  std::string why;        // what a missing tensor does then
  std::string hint;
};

MappingRule mapping_rule(const Dims& d) {
  return {d.ok && d.Vd < d.V,
          "while the draft vocabulary (" + std::to_string(d.Vd) +
              ") is smaller than the target's (" + std::to_string(d.V) +
              "): the draft loads and serves at acceptance ~1 (Automodel#2447, sglang#27908)",
          "export the training's vocabulary mapping: d2t int64 [draft_vocab_size] "
          "and t2d bool [vocab_size]"};
}

// A missing d2t or t2d: an ERROR when the mapping is required, else fine.
void check_absent(const char* name, const MappingRule& rule, Report& r) {
  if (rule.required)
    r.error(name, "missing " + rule.why, rule.hint);
  else
    r.ok(name, "absent: the draft and target vocabularies are the same");
}

// d2t's values: j + d2t[j] strictly increasing inside the target vocabulary. Returns those
// target ids, empty when they are not.
std::vector<int64_t> check_d2t_values(const Tensor& t, const Dims& d, Report& r) {
  const auto v = read_ints(t);
  std::vector<int64_t> targets;
  std::string bad;
  for (size_t j = 0; j < v.size() && bad.empty(); ++j) {
    const int64_t id = static_cast<int64_t>(j) + v[j];
    if (id < 0 || (d.ok && id >= d.V))
      bad = str("j + d2t[j] = ", id, " at j = ", j, " is outside the target vocabulary [0, ", d.V,
                ")");
    else if (!targets.empty() && id <= targets.back())
      bad = str("j + d2t[j] is not strictly increasing at j = ", j, " (", targets.back(), " then ",
                id, ")");
    targets.push_back(id);
  }
  if (bad.empty()) {
    r.ok(t.name, str("[", v.size(), "] maps the draft ids to increasing target ids"));
    return targets;
  }
  r.error(t.name, bad,
          "d2t[j] is the offset target_id - j of draft index j, for draft ids sorted by "
          "target id: rebuild the vocabulary mapping");
  return {};
}

// d2t (int64 [Vd]: target id of draft index j is j + d2t[j]). Returns its target ids when usable.
std::vector<int64_t> check_d2t(const Tensor& t, const Dims& d, const export_check::Engines& e,
                               const MappingRule& rule, Report& r) {
  const std::string& dt = t.info->dtype_str;
  if (dt != "I64" && dt != "I32") {
    r.error(t.name, "dtype " + dt + ", expected I64 (int64)", rule.hint);
    return {};
  }
  if (d.ok && t.info->shape != std::vector<int64_t>{d.Vd}) {
    r.error(t.name,
            "shape " + list_text(t.info->shape) + ", expected [" + std::to_string(d.Vd) +
                "] (draft_vocab_size)",
            rule.hint);
    return {};
  }
  if (t.info->numel() > kMaxVocab) {
    r.error(t.name, str(t.info->numel(), " entries: no vocabulary is that large"), rule.hint);
    return {};
  }
  if (t.info->shape.size() != 1) return {};
  if (dt != "I64") r.warn(t.name, "dtype " + dt + ": engines expect I64", "store d2t as int64");
  std::vector<int64_t> targets = check_d2t_values(t, d, r);
  if (d.ok && d.Vd == d.V && e.vllm)
    r.warn(t.name,
           "present although draft_vocab_size equals vocab_size: vLLM 0.32 then has no "
           "draft_id_to_target_id and refuses the tensor",
           "leave d2t and t2d out when the draft predicts the whole target vocabulary");
  return targets;
}

// t2d (bool [V]): true exactly at the Vd target ids d2t maps to (`targets`, when known).
void check_t2d(const Tensor& t, const Dims& d, const MappingRule& rule,
               const std::vector<int64_t>& targets, Report& r) {
  const std::string& dt = t.info->dtype_str;
  if (dt != "BOOL" && dt != "U8") {
    r.error(t.name, "dtype " + dt + ", expected BOOL", rule.hint);
    return;
  }
  if (d.ok && t.info->shape != std::vector<int64_t>{d.V}) {
    r.error(t.name,
            "shape " + list_text(t.info->shape) + ", expected [" + std::to_string(d.V) +
                "] (vocab_size)",
            rule.hint);
    return;
  }
  if (t.info->shape.size() != 1) return;
  if (t.info->numel() > kMaxVocab) {
    r.error(t.name, str(t.info->numel(), " entries: no vocabulary is that large"), rule.hint);
    return;
  }
  const auto v = read_ints(t);
  const int64_t count = std::count(v.begin(), v.end(), 1);
  if (d.ok && count != d.Vd) {
    r.error(t.name, str(count, " true entries, expected draft_vocab_size = ", d.Vd),
            "t2d[v] is true exactly for the target ids the draft predicts: rebuild the mapping");
    return;
  }
  for (size_t j = 0; j < targets.size(); ++j) {
    if (targets[j] >= static_cast<int64_t>(v.size()) || !v[targets[j]]) {
      r.error(t.name, str("t2d[", targets[j], "] is false, but d2t maps draft index ", j, " to it"),
              "t2d must be the inverse of d2t: t2d[j + d2t[j]] true for every j; rebuild them "
              "together");
      return;
    }
  }
  r.ok(t.name, str("[", v.size(), "] with ", count, " true entries, the inverse of d2t"));
}

// The vocabulary mapping: d2t and t2d, each the inverse of the other.
void check_mapping(const std::map<std::string, Tensor>& by_canon, const Dims& d,
                   const export_check::Engines& e, Report& r) {
  const MappingRule rule = mapping_rule(d);
  const auto d2t = by_canon.find("d2t"), t2d = by_canon.find("t2d");
  std::vector<int64_t> targets;  // j + d2t[j], when d2t is usable
  if (d2t == by_canon.end())
    check_absent("d2t", rule, r);
  else
    targets = check_d2t(d2t->second, d, e, rule, r);
  if (t2d == by_canon.end())
    check_absent("t2d", rule, r);
  else
    check_t2d(t2d->second, d, rule, targets, r);
}

Dims config_dims(const json& cfg, Report& r) {
  Dims d;
  auto req = [&](const char* key) -> int64_t {
    const auto v = export_check::positive_int(cfg, key, r);
    if (!v && (!cfg.contains(key) || cfg.at(key).is_null()))
      r.error(std::string("config.json:") + key, "missing",
              "config.json must give the draft's dimensions (an HF LlamaConfig)");
    return v.value_or(0);
  };
  d.H = req("hidden_size");
  d.I = req("intermediate_size");
  d.nh = req("num_attention_heads");
  d.V = req("vocab_size");
  d.ok = d.H && d.I && d.nh && d.V;
  d.nkv = export_check::positive_int(cfg, "num_key_value_heads", r).value_or(d.nh);
  d.qk_norm = cfg.contains("architectures") &&
              cfg.at("architectures") == json::array({model::kEagle3Qwen3Architecture});
  // Qwen3Config, which vLLM builds Qwen3 layers from, defaults head_dim to 128.
  d.d = export_check::positive_int(cfg, "head_dim", r)
            .value_or(d.qk_norm ? model::kQwen3DefaultHeadDim : (d.nh ? d.H / d.nh : 0));
  d.Ht = export_check::positive_int(cfg, "target_hidden_size", r).value_or(d.H);
  d.Vd = export_check::positive_int(cfg, "draft_vocab_size", r).value_or(d.V);
  d.n = export_check::config_aux_count(cfg);
  d.L = export_check::positive_int(cfg, "num_hidden_layers", r).value_or(1);
  d.has_mask_token = cfg.contains("mask_token_id") && cfg.at("mask_token_id").is_number_integer();
  d.fc_norm = variant_flag(cfg, "fc_norm");
  d.norm_before_fc = variant_flag(cfg, "norm_before_fc");
  return d;
}

}  // namespace

std::vector<ExportFinding> check_export(const std::string& dir, const ExportCheckOptions& options) {
  Report r;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    r.error(dir, "not a directory", "give a draft directory (config.json + model.safetensors)");
    return r.out;
  }
  std::string text;
  const auto cfg =
      export_check::read_json(fs::path(dir) / layout::kConfig, layout::kConfig, r, &text);
  const auto tensors = open_weights(dir, r);
  if (cfg && block_draft_kind(*cfg)) {
    export_check::check_block_draft(dir, *cfg, tensors, options, r);
    return r.out;
  }
  const json cfg_or_empty = cfg ? *cfg : json::object();
  const export_check::Engines e = export_check::engines_for(cfg_or_empty, options);
  const Dims d = cfg ? config_dims(*cfg, r) : Dims{};
  std::map<std::string, Tensor> by_canon;
  for (const auto& [name, t] : tensors) {
    const std::string c = canonical(name);
    auto [it, fresh] = by_canon.emplace(c, t);
    if (!fresh)
      r.error(name, "the same tensor as '" + it->second.name + "' under another spelling",
              "keep one of the two");
  }
  if (!tensors.empty()) {
    check_weights(by_canon, d, e, r);
    check_mapping(by_canon, d, e, r);
  }
  if (cfg) {
    std::optional<int64_t> fc_layers;
    auto fc = by_canon.find("fc.weight");
    if (fc != by_canon.end() && fc->second.info->shape.size() == 2 && d.Ht > 0 &&
        fc->second.info->shape[1] % d.Ht == 0)
      fc_layers = fc->second.info->shape[1] / d.Ht;
    auto head = by_canon.find("lm_head.weight");
    std::optional<int64_t> head_rows;
    if (head != by_canon.end() && !head->second.info->shape.empty())
      head_rows = head->second.info->shape[0];
    export_check::check_aux(text, *cfg, e, options.target_num_layers, fc_layers, r);
    export_check::check_config_fields(*cfg, e, head_rows, r);
  }
  return r.out;
}

bool has_errors(const std::vector<ExportFinding>& findings) {
  return std::any_of(findings.begin(), findings.end(),
                     [](const ExportFinding& f) { return f.level == Level::kError; });
}

const char* level_name(ExportFinding::Level level) {
  switch (level) {
    case Level::kOk:
      return "OK";
    case Level::kWarn:
      return "WARN";
    case Level::kError:
      return "ERROR";
  }
  return "?";
}

std::string finding_line(const ExportFinding& f) {
  std::string s = level_name(f.level);
  s.resize(6, ' ');
  s += f.subject + ": " + f.message;
  if (!f.hint.empty() && f.level != Level::kOk) s += " ---> HINT: " + f.hint;
  return s;
}

void verify_export(const std::string& dir) {
  ExportCheckOptions o;
  o.engines_from_config = true;
  const auto start = std::chrono::steady_clock::now();
  const auto findings = check_export(dir, o);
  FSDP_LOG(kDebug)
      << "export check of " << dir << ": " << findings.size() << " findings in "
      << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count()
      << " ms";
  if (!has_errors(findings)) return;
  std::string errors;
  for (const auto& f : findings)
    if (f.level == Level::kError) errors += "; " + f.subject + ": " + f.message;
  throw_error(__FILE__, __LINE__,
              "the export in " + dir + " fails its serving check (" + errors.substr(2) + ")",
              "a config.json key named here comes from the draft config (--draft-model-config): "
              "fix it there; a tensor named here is a bug in fsdp-train: please report it. "
              "fsdp-train check-export DIR prints the whole report");
}

namespace {

// config.json of a target: the top level, then text_config (multimodal targets).
json target_config(const std::string& target_dir) {
  const fs::path path = fs::path(target_dir) / "config.json";
  export_check::Report r;
  const auto cfg = export_check::read_json(path, "config.json", r, nullptr);
  FSDP_USAGE_CHECK(cfg.has_value(),
                   "--target-model-path " + target_dir + ": config.json " +
                       (r.out.empty() ? std::string("unreadable") : r.out.back().message),
                   "give the target model's directory (it holds config.json)");
  return *cfg;
}

int64_t target_value(const json& cfg, const char* key) {
  for (const json* c : {&cfg, cfg.contains("text_config") ? &cfg.at("text_config") : nullptr}) {
    if (c && c->is_object() && c->contains(key) && c->at(key).is_number_integer() &&
        c->at(key).get<int64_t>() > 0)
      return c->at(key).get<int64_t>();
  }
  return 0;
}

}  // namespace

int64_t target_num_hidden_layers(const std::string& target_dir) {
  return read_target_facts(target_dir).num_layers;
}

TargetFacts read_target_facts(const std::string& target_dir) {
  const json cfg = target_config(target_dir);
  TargetFacts t;
  t.num_layers = target_value(cfg, "num_hidden_layers");
  t.vocab_size = target_value(cfg, "vocab_size");
  t.hidden_size = target_value(cfg, "hidden_size");
  FSDP_USAGE_CHECK(t.num_layers > 0,
                   "--target-model-path " + target_dir +
                       ": config.json has no num_hidden_layers (nor text_config.num_hidden_layers)",
                   "give the target model's directory");
  return t;
}

}  // namespace fsdp::checkpoint
