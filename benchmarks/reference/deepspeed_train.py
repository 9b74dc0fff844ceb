#!/usr/bin/env python3
# Second reference EAGLE3 trainer: the model, data, loss, schedule, metrics and evaluator of
# benchmarks/reference/train.py (imported from it, not copied), wrapped in DeepSpeed ZeRO-3 or
# ZeRO-2 instead of PyTorch FSDP2. For teams moving off DeepSpeed: the same step under the engine
# they know, beside fsdp-train. Never imports or calls fsdp-train code.
"""Reference EAGLE3 draft trainer under DeepSpeed ZeRO (stage 2 or 3), CPU (gloo) or CUDA (nccl).

  bash benchmarks/reference/setup_deepspeed.sh          # once: prints the python to use
  ~/.cache/fsdp-train/deepspeed-venv/bin/python -m torch.distributed.run --nproc-per-node 2 \\
      benchmarks/reference/deepspeed_train.py --zero-stage 3 \\
      --target-model-path T --draft-model-config C --train-hidden-states-path D [...]

Every flag of benchmarks/reference/train.py is accepted with the same meaning (--param-dtype is
DeepSpeed's compute dtype: bf16 = its "bf16" mode with fp32 master weights in the optimizer and
fp32 gradient reduction and accumulation; fp32 = no mixed precision). Added:
  --zero-stage 2|3        DeepSpeed ZeRO stage (default 3)
  --ds-config-out FILE    also write the generated DeepSpeed config there
Writes <output-dir>/metrics.jsonl with the keys of train.py, plus ds_config.json.
On the CPU this sets DS_ACCELERATOR=cpu (unless set) and uses the gloo backend.
"""

import argparse
import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train as ref  # noqa: E402  (the FSDP2 reference: its model, data, loss and evaluator)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--zero-stage", type=int, choices=[2, 3], default=3)
    ap.add_argument("--ds-config-out")
    ap.add_argument("-h", "--help", action="store_true")
    ours, rest = ap.parse_known_args(argv)
    if ours.help:
        print(__doc__)
        print("Flags shared with benchmarks/reference/train.py:")
        ref.parse_args(["--help"])
    args = ref.parse_args(rest)
    args.zero_stage, args.ds_config_out = ours.zero_stage, ours.ds_config_out
    return args


def ds_config(args, world, accum):
    """The DeepSpeed config of this run: the batch, clipping and precision of fsdp-train's."""
    # DeepSpeed's own defaults for everything else (bucket sizes, prefetch, ZeRO-3 keeping
    # parameters under 1e5 elements whole on every rank, ...): the reference is DeepSpeed as its
    # users run it. On the CPU there are no streams to overlap communication with.
    zero = {"stage": args.zero_stage}
    if args.device == "cpu":
        zero["overlap_comm"] = False
    cfg = {
        "train_batch_size": args.draft_global_batch_size,
        "train_micro_batch_size_per_gpu": args.draft_micro_batch_size,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": args.max_grad_norm,
        "zero_optimization": zero,
        # torch.optim.AdamW is passed in as the client optimizer (DeepSpeed's fused/CPU Adam
        # would need its C++ ops compiled): ZeRO accepts it only with this flag.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if args.param_dtype == "bf16":
        # bf16 compute, fp32 master weights and optimizer state (as FSDP2's MixedPrecisionPolicy
        # with param_dtype bf16 and fp32 sharded parameters), fp32 gradient reduction
        # (reduce_dtype fp32) and fp32 gradient accumulation across micro-batches.
        cfg["bf16"] = {"enabled": True}
        cfg["communication_data_type"] = "fp32"
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    return cfg


def init_distributed(args, deepspeed):
    if "RANK" not in os.environ:  # plain `python deepspeed_train.py`: a world of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import datetime
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    deepspeed.init_distributed(dist_backend="nccl" if args.device == "cuda" else "gloo",
                               timeout=datetime.timedelta(minutes=args.dist_timeout))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // local))
    return dist.get_rank(), dist.get_world_size()


def export_draft(engine, args, out, rank, deepspeed):
    """train.py's export (docs/reference.md §7, bf16), with ZeRO-3's partitions gathered first."""
    params = list(engine.module.parameters())
    if args.zero_stage == 3:
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            ref.export_draft(engine.module, args, out, rank)
    else:
        ref.export_draft(engine.module, args, out, rank)
    dist.barrier()


def main():
    args = parse_args()
    if args.device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    try:
        import deepspeed
    except ImportError as e:
        raise SystemExit(f"error: cannot import deepspeed ({e}); run "
                         "benchmarks/reference/setup_deepspeed.sh and use the python it prints")
    rank, world = init_distributed(args, deepspeed)
    with open(args.draft_model_config) as f:
        cfg = ref.DraftConfig(json.load(f), args.draft_model_config)
    micro = args.draft_micro_batch_size
    if args.draft_global_batch_size % (world * micro):
        raise SystemExit(f"error: --draft-global-batch-size {args.draft_global_batch_size} is "
                         f"not a multiple of world size {world} x --draft-micro-batch-size {micro}")
    accum = args.draft_global_batch_size // (world * micro)
    # Every rank builds the same full fp32 draft (seeded init or --init-weights) before DeepSpeed
    # partitions it, exactly as train.py does before fully_shard.
    model, head, train_files = ref.build_model(args, cfg, rank)
    log = ref.Logger(args.output_dir, rank)
    if args.save_init:  # before sharding: the full draft is still on every rank
        ref.export_draft(model, args, Path(args.save_init), rank)

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.learning_rate, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    conf = ds_config(args, world, accum)
    if rank == 0:
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        for path in filter(None, (Path(args.output_dir) / "ds_config.json", args.ds_config_out)):
            with open(path, "w") as f:
                json.dump(conf, f, indent=1)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=conf)
    eval_files, n, per_epoch, total = ref.run_plan(args, train_files, rank, world, micro, accum)
    T = args.ttt_length
    if rank == 0:
        print(f"[deepspeed-reference] deepspeed {deepspeed.__version__}, ZeRO-{args.zero_stage}, "
              f"accelerator {deepspeed.get_accelerator().device_name()}, world {world}, "
              f"threads/rank {torch.get_num_threads()}, train files {n}, eval files "
              f"{len(eval_files)}, micro-batches/epoch/rank {per_epoch}, accumulation {accum}, "
              f"total steps {total}, param dtype {args.param_dtype}", flush=True)

    step, micro_seen, epoch = 0, 0, 0
    book = ref.StepBook(args, world, accum, total, log)
    while step < total and not args.eval_only:
        for batch in ref.epoch_batches(train_files, epoch, rank, world, args):
            pl, co, de = _forward(engine, head, batch, args)
            # engine.backward divides by gradient_accumulation_steps itself (train.py: / accum).
            loss = sum((0.8 ** i) * pl[i] for i in range(T))
            engine.backward(loss)
            book.add(pl, co, de, batch)
            micro_seen += 1
            boundary = micro_seen % accum == 0
            if boundary:
                lr = ref.lr_at(step + 1, args.learning_rate, total, args.warmup_ratio)
                for g in engine.optimizer.param_groups:
                    g["lr"] = lr
            # At every micro-batch (DeepSpeed counts them): only the accumulation boundary
            # clips and steps the optimizer.
            engine.step()
            if not boundary:
                continue
            step += 1
            gn = engine.get_global_grad_norm()
            book.step_done(step, epoch, lr, float(gn) if gn is not None else None)
            if step >= total:
                break
        epoch += 1

    summary = book.summary(step, trainer=f"deepspeed-zero{args.zero_stage}")
    if eval_files:
        engine.eval()
        summary.update(ref.evaluate(_EvalView(engine), head, eval_files, args, rank, world))
    summary["mem/peak_rss_mib"] = book.rss_all()
    if args.save_final and not args.eval_only:
        export_draft(engine, args, Path(args.output_dir) / f"epoch_{max(epoch - 1, 0)}_step_{step}",
                     rank, deepspeed)
    log.write(summary)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # as train.py: skip an interpreter teardown that can abort in a c10d thread


def _forward(engine, head, batch, args):
    """train.py's run_batch through the engine (its forward hooks gather ZeRO-3 partitions)."""
    batch = ref.to_device(batch, args)
    tp, pm = ref.target_distribution(batch["target_hidden"], batch["loss_mask"], head,
                                     engine.module.t2d, args.ttt_length)
    return engine(batch, tp, pm, args.ttt_length)


class _EvalView:
    """What train.py's evaluate needs of a model: t2d and a forward, here through the engine."""

    def __init__(self, engine):
        self.engine, self.t2d = engine, engine.module.t2d

    def __call__(self, *a):
        return self.engine(*a)


if __name__ == "__main__":
    main()
