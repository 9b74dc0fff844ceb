#!/usr/bin/env python3
# The reference of the block-draft speed benchmark (benchmarks/compare/block_drafts.sh): SpecForge
# 0.2.0's own DFlash/DSpark modules (DFlashDraftModel / DSparkDraftModel inside OnlineDFlashModel /
# OnlineDSparkModel, SDPA attention) sharded as SpecForge's backend shards them by default
# (SHARD_GRAD_OP, one unit per decoder layer, the target's embedding and LM head frozen and left
# out; see wrap()), gloo on the CPU, launched with torchrun. AdamW, gradient clipping at 0.5
# (SpecForge's default) and the schedule of benchmarks/reference/train.py. It never imports or
# calls fsdp-train code.
"""Reference DFlash/DSpark trainer on SpecForge 0.2.0's modules (FSDP2, gloo, CPU).

  torchrun --nproc-per-node 2 benchmarks/reference/block_draft_train.py \\
      --target-model-path T --draft-model-config C --train-hidden-states-path D \\
      --output-dir O [--save-init DIR] [...]

Reads SpecForge's offline DFlash/DSpark records (.ckpt: input_ids, loss_mask, hidden_states and,
for DSpark, target_last_hidden_states) in the sampler order of benchmarks/reference/data.py.
Writes O/metrics.jsonl: one line per optimizer step with train/loss, perf/step_s, perf/tokens
(the micro-batches' attention tokens over every rank) and mem/peak_rss_mib (per rank), then a
summary line. --save-init DIR writes the initial draft (config.json + model.safetensors, SpecForge's
names) before the first step, for fsdp-train's --init-checkpoint.
"""

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import collate, epoch_microbatches, list_feature_files  # noqa: E402
from train import init_distributed, lr_at  # noqa: E402  (the EAGLE3 reference's, shared)


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target-model-path", required=True)
    ap.add_argument("--draft-model-config", required=True)
    ap.add_argument("--train-hidden-states-path", required=True)
    ap.add_argument("--output-dir", required=True)
    ap.add_argument("--save-init", default="")
    ap.add_argument("--draft-global-batch-size", type=int, default=4)
    ap.add_argument("--draft-micro-batch-size", type=int, default=2)
    ap.add_argument("--total-steps", type=int, default=8)
    ap.add_argument("--learning-rate", type=float, default=1e-3)
    ap.add_argument("--warmup-ratio", type=float, default=0.0)
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--num-anchors", type=int, default=512)
    ap.add_argument("--objective-chunk-blocks", type=int, default=128)
    ap.add_argument("--param-dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--max-grad-norm", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    args.device, args.dist_timeout = "cpu", 20  # what train.init_distributed reads
    return args


def target_embedding(path):
    """The target's input embedding (its LM head too when the target ties them)."""
    root = Path(path)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise SystemExit(f"error: --target-model-path {path}: no *.safetensors files")
    found = {}
    for f in files:
        with safe_open(str(f), "pt") as st:
            for key in st.keys():
                if key.endswith("embed_tokens.weight") or key == "lm_head.weight":
                    found[key] = st.get_tensor(key).float()
    embed = next((v for k, v in found.items() if k.endswith("embed_tokens.weight")), None)
    if embed is None:
        raise SystemExit(f"error: --target-model-path {path}: no embed_tokens.weight")
    return embed, found.get("lm_head.weight", embed)


def load_record(path, max_length, dspark):
    d = torch.load(path, weights_only=True)
    keys = ["input_ids", "loss_mask", "hidden_states"] + (["target_last_hidden_states"] if dspark else [])
    for k in keys:
        if k not in d:
            raise SystemExit(f"error: {path}: missing key '{k}'")
    out = {}
    for k in keys:
        t = d[k]
        if k in ("hidden_states", "target_last_hidden_states") and t.dim() == 3:
            t = t[0]
        out[k] = t[:max_length]
    out["input_ids"] = out["input_ids"].long()
    out["loss_mask"] = out["loss_mask"].long()
    out["attention_mask"] = torch.ones_like(out["input_ids"])
    return out


def build(args, cfg_json, rank):
    from transformers import Qwen3Config
    dspark = cfg_json["architectures"][0] == "DSparkDraftModel"
    qc = Qwen3Config(**{k: v for k, v in cfg_json.items() if k != "architectures"})
    qc.architectures = cfg_json["architectures"]
    qc._attn_implementation = "sdpa"
    torch.manual_seed(args.seed)  # every rank builds the same initial draft
    if dspark:
        from specforge.algorithms.common.dflash_family_model import OnlineDSparkModel as Online
        from specforge.modeling.draft.dspark import DSparkDraftModel as Draft
    else:
        from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel as Online
        from specforge.modeling.draft.dflash import DFlashDraftModel as Draft
    draft = Draft(qc).float()
    if args.save_init and rank == 0:
        out = Path(args.save_init)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous() for k, v in draft.state_dict().items()},
                  str(out / "model.safetensors"))
        with open(out / "config.json", "w") as f:
            json.dump(cfg_json, f, indent=1)
    embed_w, head_w = target_embedding(args.target_model_path)
    V, H = embed_w.shape
    embed = torch.nn.Embedding(V, H)
    head = torch.nn.Linear(H, V, bias=False)
    with torch.no_grad():
        embed.weight.copy_(embed_w)
        head.weight.copy_(head_w)
    for p in list(embed.parameters()) + list(head.parameters()):
        p.requires_grad_(False)
    mask = cfg_json["dflash_config"]["mask_token_id"]
    model = Online(draft, head, embed, mask_token_id=mask, block_size=cfg_json["block_size"],
                   attention_backend="sdpa", num_anchors=args.num_anchors,
                   objective_chunk_blocks=args.objective_chunk_blocks)
    return model, draft, dspark


def wrap(model, draft, args):
    """SpecForge's default backend wrap (specforge/training/backend.py: FSDP1, SHARD_GRAD_OP, a
    unit per decoder layer, the frozen target modules ignored) in FSDP2 terms: FSDP1 refuses a
    CPU-only machine ("FSDP needs a non-CPU accelerator device"), so each decoder layer and then
    the root are fully_shard units that keep their parameters gathered from forward to backward
    (reshard_after_forward=False, SHARD_GRAD_OP's schedule)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    names = set(getattr(draft, "_no_split_modules", None) or ())
    pdt = torch.bfloat16 if args.param_dtype == "bf16" else torch.float32
    mp = MixedPrecisionPolicy(param_dtype=pdt, reduce_dtype=torch.float32,
                              cast_forward_inputs=False)
    ignored = set(model.lm_head.parameters()) | set(model.embed_tokens.parameters())
    for m in list(model.modules()):
        if type(m).__name__ in names:
            fully_shard(m, mp_policy=mp, reshard_after_forward=False, ignored_params=ignored)
    fully_shard(model, mp_policy=mp, reshard_after_forward=False, ignored_params=ignored)
    return model


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main():
    args = parse_args()
    rank, world = init_distributed(args)
    with open(args.draft_model_config) as f:
        cfg_json = json.load(f)
    micro = args.draft_micro_batch_size
    if args.draft_global_batch_size % (world * micro):
        raise SystemExit(f"error: --draft-global-batch-size {args.draft_global_batch_size} is not "
                         f"a multiple of {world} ranks x --draft-micro-batch-size {micro}")
    accum = args.draft_global_batch_size // (world * micro)
    files = list_feature_files(args.train_hidden_states_path, "--train-hidden-states-path")
    model, draft, dspark = build(args, cfg_json, rank)
    model = wrap(model, draft, args)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.learning_rate, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    os.makedirs(args.output_dir, exist_ok=True)
    log = open(os.path.join(args.output_dir, "metrics.jsonl"), "w") if rank == 0 else None
    if rank == 0:
        print(f"[reference] {cfg_json['architectures'][0]}, world {world}, threads/rank "
              f"{torch.get_num_threads()}, files {len(files)}, accumulation {accum}", flush=True)
    step, seen, epoch = 0, 0, 0
    sums = torch.zeros(2, dtype=torch.float64)  # loss over the step's micro-batches, tokens
    steady = [0.0, 0.0, 0]
    t0 = t_run = time.perf_counter()
    while step < args.total_steps:
        order = epoch_microbatches(len(files), epoch, args.seed, rank, world, micro)
        if not order:
            raise SystemExit(f"error: {len(files)} files are too few for {world} ranks x {micro}")
        for mb in order:
            b = collate([load_record(files[i], args.max_length, dspark) for i in mb])
            extra = (b["target_last_hidden_states"].float(),) if dspark else ()
            loss = model(b["input_ids"], b["hidden_states"].float(), b["loss_mask"], *extra)[0]
            (loss / accum).backward()
            sums[0] += float(loss.detach()) / accum
            sums[1] += float(b["attention_mask"].sum())
            seen += 1
            if seen % accum:
                continue
            torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            lr = lr_at(step + 1, args.learning_rate, args.total_steps, args.warmup_ratio)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            dist.all_reduce(sums)
            dt = time.perf_counter() - t0
            rss = [torch.zeros(1) for _ in range(world)]
            dist.all_gather(rss, torch.tensor([peak_rss_mib()]))
            rec = {"step": step, "train/loss": float(sums[0]) / world, "train/lr": lr,
                   "perf/step_s": dt, "perf/tokens": float(sums[1]),
                   "perf/tokens_per_s": float(sums[1]) / dt,
                   "mem/peak_rss_mib": [round(float(r), 1) for r in rss]}
            if rank == 0:
                log.write(json.dumps(rec) + "\n")
                log.flush()
                print(f"[reference] step {step} loss {rec['train/loss']:.5f} "
                      f"{rec['perf/tokens_per_s']:.1f} tokens/s", flush=True)
            if step > 1:
                steady[0] += float(sums[1])
                steady[1] += dt
                steady[2] += 1
            sums.zero_()
            t0 = time.perf_counter()
            if step >= args.total_steps:
                break
        epoch += 1
    if rank == 0:
        summary = {"summary": True, "world": world, "steps": step,
                   "wall_s": time.perf_counter() - t_run}
        if steady[2]:
            summary["steady_tokens_per_s"] = steady[0] / steady[1]
        log.write(json.dumps(summary) + "\n")
        log.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
