#!/usr/bin/env python3
"""Serving check of a block draft (DFlash or DSpark, docs/serving.md) with vLLM's CPU build.

Subcommands (the serving venv runs `generate` and `load-check`; the others run anywhere with
torch, safetensors and transformers):
  random-export  a DFlash or DSpark draft directory with random weights for a target, written
                 in the layout fsdp-train exports (config.json + model.safetensors): what the
                 engine checks below run on before a trained draft exists
  generate       greedy generation with vLLM, with or without the draft (method dflash or
                 dspark); with the draft, the engine's acceptance counters
  check          runs `generate` in fresh processes (the target alone, unless --base gives the
                 serving cache's outputs, then with the draft), prints the engine's acceptance
                 metrics and whether the greedy outputs are identical (also into
                 WORK/report.json); exit 1 when they differ,
                 or when the engine refuses the draft (its last error lines are printed), or
                 when `fsdp-train check-export` (--check-export) finds an ERROR
  load-check     builds vLLM's own model class for the draft (qwen3_dflash.py or
                 qwen3_dspark.py) beside the target's config and calls its load_weights on the
                 export: every tensor named and shaped as vLLM reads it, no tensor left random
                 (for a method the CPU runner refuses to serve)

Never downloads anything; writes only under --out.
"""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def fail(msg, hint):
    sys.exit(f"error: {msg}\n---> HINT: {hint}")


def read_json(path):
    return json.loads(Path(path).read_text())


# ---------------------------------------------------------------------------------------------
# random-export: the layout of lib/checkpoint/block_draft_contract.h, from the target's config.

def export_config(kind, target_cfg, a):
    """config.json of a block draft as fsdp-train writes it (block_draft_contract.h)."""
    layers = a.layers
    rope_theta = target_cfg.get("rope_theta") or (target_cfg.get("rope_parameters") or {}).get(
        "rope_theta", 10000.0)
    heads = target_cfg["num_attention_heads"]
    cfg = {
        "architectures": ["DFlashDraftModel" if kind == "dflash" else "DSparkDraftModel"],
        "model_type": "qwen3",
        "hidden_size": target_cfg["hidden_size"],
        "intermediate_size": target_cfg["intermediate_size"],
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": target_cfg.get("num_key_value_heads", heads),
        "head_dim": target_cfg.get("head_dim") or target_cfg["hidden_size"] // heads,
        "hidden_act": "silu",
        "rms_norm_eps": target_cfg.get("rms_norm_eps", 1e-6),
        "vocab_size": target_cfg["vocab_size"],
        "max_position_embeddings": target_cfg.get("max_position_embeddings", 4096),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        "rope_theta": rope_theta,
        "rope_scaling": None,
        "rope_parameters": {"rope_type": "default", "rope_theta": rope_theta},
        "block_size": a.block_size,
        "num_target_layers": target_cfg["num_hidden_layers"],
        "layer_types": ["full_attention"] * layers,
        "sliding_window": None,
        "use_sliding_window": False,
        "torch_dtype": "float32",
        "dflash_config": {"target_layer_ids": a.target_layer_ids,
                          "mask_token_id": a.mask_token_id},
    }
    if kind == "dspark":
        heads_cfg = {"markov_rank": a.markov_rank, "markov_head_type": "vanilla",
                     "enable_confidence_head": a.confidence,
                     "confidence_head_with_markov": a.confidence}
        cfg["dflash_config"].update({"projector_type": "dspark", "attention_mode": "gqa",
                                     **heads_cfg})
        cfg.update(heads_cfg)
    return cfg


def export_tensors(kind, cfg, n_features, generator):
    """Every tensor of the draft as SpecForge 0.2.0's DFlashDraftModel/DSparkDraftModel names
    it, random normal * 0.02 (norm weights 1)."""
    import torch
    H, I = cfg["hidden_size"], cfg["intermediate_size"]
    nh, nkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def w(*shape):
        return (torch.randn(*shape, generator=generator) * 0.02).contiguous()

    def norm(n):
        return 1.0 + w(n)

    out = {"fc.weight": w(H, n_features * H), "hidden_norm.weight": norm(H),
           "norm.weight": norm(H)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        out.update({
            p + "self_attn.q_proj.weight": w(nh * d, H), p + "self_attn.k_proj.weight": w(nkv * d, H),
            p + "self_attn.v_proj.weight": w(nkv * d, H), p + "self_attn.o_proj.weight": w(H, nh * d),
            p + "self_attn.q_norm.weight": norm(d), p + "self_attn.k_norm.weight": norm(d),
            p + "mlp.gate_proj.weight": w(I, H), p + "mlp.up_proj.weight": w(I, H),
            p + "mlp.down_proj.weight": w(H, I), p + "input_layernorm.weight": norm(H),
            p + "post_attention_layernorm.weight": norm(H)})
    if kind == "dspark":
        V, r = cfg["vocab_size"], cfg["markov_rank"]
        out["markov_head.markov_w1.weight"] = w(V, r)
        out["markov_head.markov_w2.weight"] = w(V, r)
        if cfg["enable_confidence_head"]:
            width = H + (r if cfg["confidence_head_with_markov"] else 0)
            out["confidence_head.proj.weight"] = w(1, width)
            out["confidence_head.proj.bias"] = w(1)
    return out


def cmd_random_export(a):
    import torch
    from safetensors.torch import save_file
    target_cfg = read_json(Path(a.target) / "config.json")
    L = target_cfg["num_hidden_layers"]
    a.target_layer_ids = json.loads(a.target_layer_ids) if a.target_layer_ids else [
        1, L // 2 - 1, L - 4]
    if a.mask_token_id is None:
        a.mask_token_id = target_cfg.get("pad_token_id") or 0
    cfg = export_config(a.kind, target_cfg, a)
    g = torch.Generator().manual_seed(a.seed)
    tensors = export_tensors(a.kind, cfg, len(a.target_layer_ids), g)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    print(json.dumps({"export": str(out), "kind": a.kind, "tensors": len(tensors),
                      "target_layer_ids": a.target_layer_ids, "block_size": a.block_size}))


# ---------------------------------------------------------------------------------------------
# generate / check: the engine itself.

def engine_tokens(method, block_size):
    """Tokens the engine drafts per step for a draft trained with this block size: DFlash
    blocks are [anchor, mask x (B-1)] predicting B-1 tokens; DSpark's anchor predicts too
    (SpecForge's labels anchor+1..anchor+B), vLLM's sample_from_anchor layout."""
    return block_size - 1 if method == "dflash" else block_size


def counter(metrics, name):
    return sum(m.value for m in metrics if m.name == name and hasattr(m, "value"))


def vector(metrics, name):
    out = []
    for m in metrics:
        if m.name == name and hasattr(m, "values"):
            out += [0] * (len(m.values) - len(out))
            for i, v in enumerate(m.values):
                out[i] += v
    return out


def load_prompts(a):
    """Token ids: the serving cache's prompts.json (its `eval` set), or two chat prompts."""
    if a.prompts:
        return [p["prompt_ids"] for p in read_json(a.prompts)["eval"]][: a.num_prompts]
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.target)
    texts = ["Tell me about the sea.", "What is the capital of France, and why?"]
    out = []
    for t in texts[: a.num_prompts]:
        msgs = [{"role": "user", "content": t}]
        prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append(tok(prompt, add_special_tokens=False)["input_ids"])
    return out


def cmd_generate(a):
    t0 = time.time()
    from vllm import LLM, SamplingParams
    prompts = load_prompts(a)
    kwargs = dict(model=a.target, dtype="float32", enforce_eager=True, seed=0,
                  max_model_len=a.max_model_len, disable_log_stats=False, max_num_seqs=8,
                  kv_cache_memory_bytes=a.kv_cache_mib << 20)
    if a.draft:
        kwargs["speculative_config"] = {"method": a.method, "model": a.draft,
                                        "num_speculative_tokens": a.k}
    llm = LLM(**kwargs)
    load_s = time.time() - t0
    t1 = time.time()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0.0, max_tokens=a.max_tokens), use_tqdm=False)
    result = {"method": a.method if a.draft else None, "k": a.k if a.draft else 0,
              "load_s": round(load_s, 1), "generate_s": round(time.time() - t1, 1),
              "outputs": [list(o.outputs[0].token_ids) for o in outs]}
    if a.draft:
        m = llm.get_metrics()
        drafts = counter(m, "vllm:spec_decode_num_drafts")
        accepted = counter(m, "vllm:spec_decode_num_accepted_tokens")
        per_pos = vector(m, "vllm:spec_decode_num_accepted_tokens_per_pos")
        result["spec"] = {
            "num_drafts": drafts,
            "num_draft_tokens": counter(m, "vllm:spec_decode_num_draft_tokens"),
            "num_accepted_tokens": accepted,
            "mean_acceptance_length": 1.0 + accepted / drafts if drafts else None,
            "acceptance_rate_per_position": [x / drafts for x in per_pos] if drafts else None}
    Path(a.out).write_text(json.dumps(result))
    print(json.dumps({k: v for k, v in result.items() if k != "outputs"}))


def engine_errors(log_text, n=6):
    """The engine's own error lines (exception messages), last first-seen order."""
    keep = [l for l in log_text.splitlines()
            if any(s in l for s in ("Error", "error:", "NotImplemented", "does not support",
                                    "refuse", "Exception"))]
    return keep[-n:]


def run_generate(a, out, draft, log):
    cmd = [sys.executable, __file__, "generate", "--target", a.target, "--out", str(out),
           "--max-tokens", str(a.max_tokens), "--num-prompts", str(a.num_prompts),
           "--max-model-len", str(a.max_model_len), "--kv-cache-mib", str(a.kv_cache_mib)]
    if a.prompts:
        cmd += ["--prompts", a.prompts]
    if draft:
        cmd += ["--draft", draft, "--method", a.method, "--k", str(a.k)]
    t0 = time.time()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    return rc, time.time() - t0


def run_check_export(a, report):
    """fsdp-train check-export on the draft for vLLM (--check-export BIN): its summary goes into
    the report; its ERROR lines end the check before the engine starts."""
    if not a.check_export:
        return
    cmd = [a.check_export, "check-export", a.draft, "--for", "vllm", "--target-model-path",
           a.target]
    p = subprocess.run(cmd, capture_output=True, text=True)
    lines = p.stdout.splitlines()
    report["check_export"] = next((l for l in reversed(lines) if l.startswith("check-export:")),
                                  p.stderr.strip()[-500:])
    if p.returncode != 0:
        report["check_export_errors"] = [l for l in lines if l.startswith("ERROR")]
        print(json.dumps(report, indent=1))
        sys.exit(1)


def base_outputs(a, work, report):
    """The target's greedy outputs: the serving cache's base.json (--base: its `eval` set,
    generated with the same prompts and --max-tokens), else a run of vLLM without the draft."""
    if a.base:
        return [r["generated_ids"] for r in read_json(a.base)["outputs"]["eval"]][: a.num_prompts]
    rc, s = run_generate(a, work / "base.json", None, work / "base.log")
    if rc:
        print(Path(work / "base.log").read_text()[-3000:])
        fail("vLLM without speculation failed", "see the log above")
    report["base_s"] = round(s, 1)
    return read_json(work / "base.json")["outputs"]


def cmd_check(a):
    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    draft_cfg = read_json(Path(a.draft) / "config.json")
    if a.k is None:
        a.k = engine_tokens(a.method, int(draft_cfg["block_size"]))
    if a.base and not a.prompts:
        fail("--base without --prompts", "give the prompts.json the base outputs were made from")
    report = {"draft": a.draft, "method": a.method, "k": a.k}
    run_check_export(a, report)
    base = base_outputs(a, work, report)
    rc, s = run_generate(a, work / "spec.json", a.draft, work / "spec.log")
    report["spec_s"] = round(s, 1)
    if rc:
        report["engine_refused"] = engine_errors((work / "spec.log").read_text())
        print(json.dumps(report, indent=1))
        sys.exit(1)
    spec = read_json(work / "spec.json")
    same = sum(x == y for x, y in zip(base, spec["outputs"]))
    report.update({"identical_outputs": f"{same}/{len(base)}", **spec["spec"]})
    print(json.dumps(report, indent=1))
    (work / "report.json").write_text(json.dumps(report, indent=1))
    sys.exit(0 if same == len(base) == len(spec["outputs"]) else 1)


# ---------------------------------------------------------------------------------------------
# load-check: vLLM's model class loads our weights.

def cmd_load_check(a):
    import torch
    from safetensors.torch import load_file
    from vllm.config import (CacheConfig, DeviceConfig, LoadConfig, ModelConfig, ParallelConfig,
                             SpeculativeConfig, VllmConfig, set_current_vllm_config)
    from vllm.distributed import (ensure_model_parallel_initialized,
                                  init_distributed_environment)
    draft_cfg = read_json(Path(a.draft) / "config.json")
    k = a.k or engine_tokens(a.method, int(draft_cfg["block_size"]))
    pre = {"draft": a.draft, "method": a.method}
    run_check_export(a, pre)
    target = ModelConfig(model=a.target, dtype="float32", max_model_len=a.max_model_len,
                         enforce_eager=True)
    parallel = ParallelConfig()
    spec = SpeculativeConfig(method=a.method, model=a.draft, num_speculative_tokens=k,
                             target_model_config=target, target_parallel_config=parallel)
    vcfg = VllmConfig(model_config=target, parallel_config=parallel, cache_config=CacheConfig(),
                      load_config=LoadConfig(), device_config=DeviceConfig(device="cpu"))
    # Attached after validation: the CPU build's V1 model runner refuses method dspark when the
    # config is validated ("Model Runner V1 does not support: dspark speculative decoding");
    # the model class itself is the one vLLM's V2 runner (GPU) builds.
    object.__setattr__(vcfg, "speculative_config", spec)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    from vllm.model_executor.model_loader.utils import get_model_architecture
    with set_current_vllm_config(vcfg):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method="env://")
        ensure_model_parallel_initialized(1, 1)
        cls, arch = get_model_architecture(spec.draft_model_config)
        model = cls(vllm_config=vcfg, prefix="draft")
    weights = load_file(str(Path(a.draft) / "model.safetensors"))
    # NaN everywhere first: a parameter (or a slice of a fused one, e.g. k_proj's rows of
    # qkv_proj) the loader does not fill keeps a NaN.
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.fill_(float("nan"))
    with set_current_vllm_config(vcfg):
        model.load_weights(iter(weights.items()))
    names = [n for n, p in model.named_parameters() if p.is_floating_point()]
    untouched = sorted(n for n, p in model.named_parameters()
                       if p.is_floating_point() and torch.isnan(p).any())
    changed = [n for n in names if n not in untouched]
    # Parameters the engine takes from the target (embedding, LM head when the draft has none)
    # or keeps as zeros by design are not the draft's to load.
    shared = [n for n in untouched if any(s in n for s in ("embed_tokens", "lm_head",
                                                            "mask_embedding"))]
    missing = [n for n in untouched if n not in shared]
    report = {**pre, "vllm_architecture": arch,
              "model_class": cls.__name__, "draft_tensors": len(weights),
              "parameters_loaded": len(changed), "parameters_shared_from_target": shared,
              "parameters_not_loaded": missing}
    print(json.dumps(report, indent=1))
    sys.exit(1 if missing else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("random-export")
    p.add_argument("--kind", choices=["dflash", "dspark"], required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--block-size", type=int, default=4)
    p.add_argument("--target-layer-ids", default=None, help="JSON list (SpecForge's ids)")
    p.add_argument("--mask-token-id", type=int, default=None)
    p.add_argument("--markov-rank", type=int, default=16)
    p.add_argument("--confidence", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--seed", type=int, default=0)
    for name in ("generate", "check", "load-check"):
        p = sub.add_parser(name)
        p.add_argument("--target", required=True)
        p.add_argument("--draft", required=name != "generate", default=None)
        p.add_argument("--method", choices=["dflash", "dspark"], default="dflash")
        p.add_argument("--k", type=int, default=None,
                       help="num_speculative_tokens (default: from block_size)")
        p.add_argument("--max-model-len", type=int, default=512)
        if name != "generate":
            p.add_argument("--check-export", default=None, metavar="FSDP_TRAIN",
                           help="run FSDP_TRAIN check-export --for vllm on the draft first")
        if name == "load-check":
            continue
        p.add_argument("--prompts", default=None, help="a serving-cache prompts.json")
        p.add_argument("--num-prompts", type=int, default=2)
        p.add_argument("--max-tokens", type=int, default=32)
        p.add_argument("--kv-cache-mib", type=int, default=256)
        if name == "generate":
            p.add_argument("--out", required=True)
        else:
            p.add_argument("--work", required=True, help="logs and results go here")
            p.add_argument("--base", default=None,
                           help="the serving cache's base.json (no run without the draft)")
    a = ap.parse_args()
    {"random-export": cmd_random_export, "generate": cmd_generate, "check": cmd_check,
     "load-check": cmd_load_check}[a.cmd](a)


if __name__ == "__main__":
    main()
