#!/usr/bin/env python3
# Writes a tiny synthetic EAGLE3 setup (target dir, draft config, SpecForge .ckpt features) so the
# reference trainer and the comparison scripts can be exercised in seconds. Random numbers only:
# never use it for quality claims.
"""Tiny toy features: make_toy.py OUT [--samples N] [--seed S]."""

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", type=Path)
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--eval-samples", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--draft-vocab", type=int, default=128)
    ap.add_argument("--max-len", type=int, default=48)
    args = ap.parse_args()
    g = torch.Generator().manual_seed(args.seed)
    H, V = args.hidden, args.vocab
    out = args.out
    (out / "target").mkdir(parents=True, exist_ok=True)
    emb = torch.randn(V, H, generator=g) * 0.5
    head = torch.randn(V, H, generator=g) * 0.5
    save_file({"model.embed_tokens.weight": emb.to(torch.bfloat16),
               "lm_head.weight": head.to(torch.bfloat16)},
              str(out / "target" / "model.safetensors"))
    with open(out / "target" / "config.json", "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "hidden_size": H, "vocab_size": V}, f)
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": 2 * H, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_hidden_layers": 1, "vocab_size": V, "draft_vocab_size": args.draft_vocab,
           "rms_norm_eps": 1e-5, "max_position_embeddings": 256, "rope_theta": 10000.0,
           "hidden_act": "silu", "pad_token_id": 0, "tie_word_embeddings": False,
           "torch_dtype": "bfloat16"}
    with open(out / "draft-config.json", "w") as f:
        json.dump(cfg, f, indent=2)
    # Token ids follow a skewed distribution so the vocab mapping has a real top set.
    weights = 1.0 / torch.arange(1, V + 1, dtype=torch.float64)
    for split, count in (("train", args.samples), ("eval", args.eval_samples)):
        for i in range(count):
            s = int(torch.randint(args.max_len // 2, args.max_len + 1, (1,), generator=g))
            ids = torch.multinomial(weights, s, replacement=True, generator=g)
            mask = torch.zeros(s, dtype=torch.int64)
            mask[s // 3:] = 1
            hidden = torch.randn(1, s, H, generator=g)
            aux = torch.randn(1, s, 3 * H, generator=g)
            p = out / split / "rows_0-1000" / f"data_{i}.ckpt"
            p.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"input_ids": ids, "loss_mask": mask,
                        "hidden_state": hidden.to(torch.bfloat16),
                        "aux_hidden_state": aux.to(torch.bfloat16)}, p)
    print(out)


if __name__ == "__main__":
    main()
