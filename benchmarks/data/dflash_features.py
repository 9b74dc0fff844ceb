"""DFlash/DSpark features and a block-draft config made from gen-toy-data's EAGLE3 features.

  python benchmarks/data/dflash_features.py TOY OUT [--layers L] [--block-size B] [--dspark]

TOY is a `fsdp-train gen-toy-data` directory. OUT receives SpecForge's offline DFlash layout
(.ckpt files holding input_ids, loss_mask and hidden_states, the aux layers concatenated) for
hidden_states/ and eval_hidden_states/, a copy of the target whose config claims 8 layers (the
three captured layers stand for target layers 1, 3 and 5), and draft_config.json: a DFlash draft
of L layers with the target's hidden size and vocabulary, the last token id as the mask token.
With --dspark the files also hold target_last_hidden_states (the target's last hidden state) and
the config is a DSpark draft (DSparkDraftModel, model_type qwen3) with a vanilla Markov head of
rank 8 and a confidence head. Used by tests/e2e/dflash_train.sh, tests/e2e/dspark_train.sh and
the GPU plan's dflash stage.
"""
import argparse
import json
import os
import shutil

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("toy")
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2, help="draft decoder layers")
    ap.add_argument("--block-size", type=int, default=4)
    ap.add_argument("--dspark", action="store_true", help="DSpark features and draft config")
    a = ap.parse_args()
    for split in ("hidden_states", "eval_hidden_states"):
        for root, _, names in os.walk(os.path.join(a.toy, split)):
            for n in sorted(names):
                if not n.endswith(".ckpt"):
                    continue
                d = torch.load(os.path.join(root, n))
                dest = os.path.join(a.out, split, os.path.relpath(root, os.path.join(a.toy, split)))
                os.makedirs(dest, exist_ok=True)
                rec = {"input_ids": d["input_ids"], "loss_mask": d["loss_mask"],
                       "hidden_states": d["aux_hidden_state"]}
                if a.dspark:
                    rec["target_last_hidden_states"] = d["hidden_state"]
                torch.save(rec, os.path.join(dest, n))
    target = os.path.join(a.out, "target")
    shutil.copytree(os.path.join(a.toy, "target"), target, dirs_exist_ok=True)
    with open(os.path.join(target, "config.json")) as f:
        tc = json.load(f)
    tc["num_hidden_layers"] = 8
    with open(os.path.join(target, "config.json"), "w") as f:
        json.dump(tc, f, indent=1)
    h, v = tc["hidden_size"], tc["vocab_size"]
    heads = max(1, h // 128) if h >= 1024 else 4
    draft = {"architectures": ["DFlashDraftModel"], "hidden_size": h, "intermediate_size": 2 * h,
             "num_attention_heads": heads, "num_key_value_heads": max(1, heads // 2),
             "head_dim": h // heads, "num_hidden_layers": a.layers, "vocab_size": v,
             "rms_norm_eps": 1e-6, "max_position_embeddings": 65536, "rope_theta": 10000.0,
             "block_size": a.block_size, "num_target_layers": 8, "tie_word_embeddings": False,
             "dflash_config": {"target_layer_ids": [1, 3, 5], "mask_token_id": v - 1}}
    if a.dspark:
        draft["architectures"] = ["DSparkDraftModel"]
        draft["model_type"] = "qwen3"
        draft["dflash_config"].update({"markov_rank": 8, "markov_head_type": "vanilla",
                                       "enable_confidence_head": True})
    with open(os.path.join(a.out, "draft_config.json"), "w") as f:
        json.dump(draft, f, indent=1)


if __name__ == "__main__":
    main()
