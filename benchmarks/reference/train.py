#!/usr/bin/env python3
# Reference EAGLE3 offline trainer: the model and loss of docs/reference.md wrapped with PyTorch FSDP2
# (fully_shard + MixedPrecisionPolicy) on gloo/CPU, launched with torchrun. The yardstick for
# fsdp-train's parity and speed; it must never import or call fsdp-train code.
"""Reference EAGLE3 draft trainer (PyTorch FSDP2, gloo, CPU).

  torchrun --nproc-per-node 2 benchmarks/reference/train.py \\
      --target-model-path T --draft-model-config C --train-hidden-states-path D [...]

Writes <output-dir>/metrics.jsonl (one line per optimizer step with train/ploss_i, train/acc_i,
train/lr, train/grad_norm, perf/tokens_per_s, mem/peak_rss_mib; then eval/ lines and a summary).
--train-data-path and --chat-template are accepted for SpecForge compatibility and unused.
"""

import argparse
import json
import math
import os
import resource
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parent))
from data import (collate, epoch_microbatches, list_feature_files, load_sample,  # noqa: E402
                  load_target_tensors, vocab_mapping)
from eagle3_model import DraftConfig, Eagle3Draft, target_distribution  # noqa: E402

EXPORT_SKIP = ("embed_tokens.weight",)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    a = ap.add_argument
    a("--target-model-path", required=True)
    a("--draft-model-config", required=True)
    a("--embedding-key", default="model.embed_tokens.weight")
    a("--lm-head-key", default="lm_head.weight")
    a("--train-hidden-states-path", required=True)
    a("--eval-hidden-states-path")
    a("--train-data-path", help="accepted for SpecForge compatibility; unused")
    a("--eval-data-path", help="accepted for SpecForge compatibility; unused")
    a("--chat-template", help="accepted for SpecForge compatibility; unused")
    a("--vocab-mapping-path", help="torch.save dict {d2t, t2d}; default: built from features")
    a("--cache-dir", default=str(Path.home() / ".cache" / "fsdp-train" / "reference"))
    a("--output-dir", default="reference-out")
    a("--num-epochs", type=int, default=10)
    a("--total-steps", type=int)
    a("--draft-global-batch-size", type=int, default=16)
    a("--draft-micro-batch-size", type=int, default=1)
    a("--learning-rate", type=float, default=1e-4)
    a("--warmup-ratio", type=float, default=0.015)
    a("--max-grad-norm", type=float, default=0.5)
    a("--max-length", type=int, default=2048)
    a("--ttt-length", type=int, default=7)
    a("--seed", type=int, default=0)
    a("--log-steps", type=int, default=1, help="print every N steps (JSONL gets every step)")
    a("--param-dtype", choices=["bf16", "fp32"], default="bf16", help="FSDP2 compute dtype")
    a("--init-weights", help="safetensors file (or dir with model.safetensors), docs/reference.md §7 names")
    a("--save-init", help="export the initial draft (config.json + model.safetensors, docs/reference.md §7) to "
      "this directory, then train as usual")
    a("--save-final", action="store_true", help="export epoch_<E>_step_<S>/ at the end")
    a("--eval-only", action="store_true", help="skip training: eval --init-weights and exit")
    a("--threads", type=int, default=0, help="torch threads per rank (0: cores / local ranks)")
    a("--device", choices=["cpu", "cuda"], default="cpu",
      help="cpu (gloo) or cuda (nccl, one GPU per rank: the GPU benchmark of benchmarks/device)")
    a("--dist-timeout", type=float, default=20, help="minutes")
    a("--loader-workers", type=int, default=0,
      help="0: load and collate each micro-batch inline, inside the timed step (the CPU "
      "benchmarks); N > 0: a torch DataLoader with N worker processes prefetches them (pinned on "
      "cuda), as SpecForge's training loop does: the GPU benchmark uses it")
    args = ap.parse_args(argv)
    for name in ("num_epochs", "draft_global_batch_size", "draft_micro_batch_size", "max_length",
                 "ttt_length"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def init_distributed(args):
    if "RANK" not in os.environ:  # plain `python train.py`: a world of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import datetime
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo",
                            timeout=datetime.timedelta(minutes=args.dist_timeout))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    torch.set_num_threads(args.threads or max(1, (os.cpu_count() or 1) // local))
    return dist.get_rank(), dist.get_world_size()


def lr_at(n, base, total, warmup_ratio):
    """docs/reference.md §6: linear warmup, then cosine to zero; n is 1-based and clamped at total."""
    n = min(n, total)
    w = int(warmup_ratio * total)
    if n <= w:
        return base * n / w
    return base * 0.5 * (1 + math.cos(math.pi * (n - 1 - w) / (total - w)))


def read_init_weights(path):
    p = Path(path)
    if p.is_dir():
        p = p / "model.safetensors"
    if not p.is_file():
        raise SystemExit(f"error: --init-weights {path}: no such safetensors file")
    return load_file(str(p))


def build_model(args, cfg, rank):
    torch.manual_seed(args.seed)  # every rank builds the same full init before sharding
    model = Eagle3Draft(cfg)
    init = read_init_weights(args.init_weights) if args.init_weights else {}
    train_files = list_feature_files(args.train_hidden_states_path, "--train-hidden-states-path")
    if not args.vocab_mapping_path and "d2t" in init and "t2d" in init:
        d2t, t2d = init["d2t"].long(), init["t2d"].bool()  # same mapping as the exporting trainer
    else:
        d2t, t2d = vocab_mapping(args, train_files, cfg.vocab, cfg.draft_vocab, rank)
    head_key, emb_key = args.lm_head_key, args.embedding_key
    target = load_target_tensors(args.target_model_path, sorted({emb_key, head_key}))
    emb, head = target[emb_key], target[head_key]
    for key, t in ((emb_key, emb), (head_key, head)):
        if tuple(t.shape) != (cfg.vocab, cfg.target_hidden):
            raise SystemExit(f"error: target tensor {key} has shape {tuple(t.shape)}, expected "
                             f"[{cfg.vocab}, {cfg.target_hidden}] (vocab_size, hidden size)")
    with torch.no_grad():
        model.embed_tokens.weight.copy_(emb.float())
        model.d2t.copy_(d2t)
        model.t2d.copy_(t2d)
        state = dict(model.named_parameters())
        for name, t in init.items():
            if name in ("d2t", "t2d"):
                continue
            if name not in state or name in EXPORT_SKIP:
                raise SystemExit(f"error: --init-weights: unexpected tensor '{name}'")
            if tuple(t.shape) != tuple(state[name].shape):
                raise SystemExit(f"error: --init-weights: {name} shape {tuple(t.shape)}, "
                                 f"expected {tuple(state[name].shape)}")
            state[name].copy_(t.float())
        missing = [n for n in state if n not in EXPORT_SKIP and n not in init]
        if init and missing:
            raise SystemExit(f"error: --init-weights lacks {missing}")
    model.float()
    dev = device_of(args)
    return model.to(dev), head.to(torch.bfloat16).to(dev), train_files


def export_weights(model, path, rank):
    """docs/reference.md §7 tensors in bf16 (d2t int64, t2d bool), gathered from the shards; rank 0 writes."""
    out = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        if name not in EXPORT_SKIP:
            out[name] = full.detach().to(torch.bfloat16).cpu().contiguous()
    out["d2t"], out["t2d"] = model.d2t.cpu().clone(), model.t2d.cpu().clone()
    if rank == 0:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        save_file(out, str(path), metadata={"format": "pt"})


def export_draft(model, args, out, rank):
    """A docs/reference.md §7 export directory: config.json (the draft config) + model.safetensors."""
    export_weights(model, out / "model.safetensors", rank)
    if rank == 0:
        with open(args.draft_model_config) as f, open(out / "config.json", "w") as g:
            raw = json.load(f)
            raw["tie_word_embeddings"] = False
            json.dump(raw, g, indent=2)


class Logger:
    def __init__(self, out_dir, rank):
        self.rank = rank
        self.f = None
        if rank == 0:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            self.f = open(Path(out_dir) / "metrics.jsonl", "w")

    def write(self, rec, echo=True):
        if self.f:
            self.f.write(json.dumps(rec) + "\n")
            self.f.flush()
            if echo:
                print(json.dumps(rec), flush=True)


def device_of(args):
    return torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")


def to_device(batch, args):
    dev = device_of(args)
    return {k: (v.to(dev, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}


class _MicroBatches(torch.utils.data.Dataset):
    """Micro-batch k of one epoch, loaded and collated (for DataLoader workers)."""

    def __init__(self, files, order, max_length):
        self.files, self.order, self.max_length = files, order, max_length

    def __len__(self):
        return len(self.order)

    def __getitem__(self, k):
        return collate([load_sample(self.files[i], self.max_length) for i in self.order[k]])


def epoch_batches(files, epoch, rank, world, args):
    """This rank's collated micro-batches of one epoch, in the sampler's order."""
    order = epoch_microbatches(len(files), epoch, args.seed, rank, world,
                               args.draft_micro_batch_size)
    if args.loader_workers <= 0:
        return (collate([load_sample(files[i], args.max_length) for i in mb]) for mb in order)
    return torch.utils.data.DataLoader(
        _MicroBatches(files, order, args.max_length), batch_size=None, shuffle=False,
        num_workers=args.loader_workers, pin_memory=args.device == "cuda", prefetch_factor=2)


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_batch(model, head, batch, args):
    batch = to_device(batch, args)
    tp, pm = target_distribution(batch["target_hidden"], batch["loss_mask"], head, model.t2d,
                                 args.ttt_length)
    return model(batch, tp, pm, args.ttt_length)


def evaluate(model, head, files, args, rank, world):
    """Token-weighted acc_i and batch-mean ploss_i over all eval files, summed over ranks."""
    idx = list(range(rank, len(files), world))
    per_rank = -(-len(files) // world)
    micro = args.draft_micro_batch_size
    mbs = [idx[i:i + micro] for i in range(0, len(idx), micro)]
    n_mb = -(-per_rank // micro)
    T = args.ttt_length
    sums = torch.zeros(3 * T + 1, dtype=torch.float64, device=device_of(args))
    with torch.no_grad():
        for k in range(n_mb):
            # Ranks with fewer files repeat one batch with weight 0: FSDP needs every rank in
            # every forward's all-gather.
            real = k < len(mbs)
            mb = mbs[k] if real else [0]
            batch = collate([load_sample(files[i], args.max_length) for i in mb])
            pl, co, de = run_batch(model, head, batch, args)
            if real:
                for i in range(T):
                    sums[i] += float(pl[i])
                    sums[T + i] += float(co[i])
                    sums[2 * T + i] += float(de[i])
                sums[3 * T] += 1
    dist.all_reduce(sums)
    rec = {}
    for i in range(T):
        rec[f"eval/ploss_{i}"] = float(sums[i] / max(sums[3 * T], 1))
        rec[f"eval/acc_{i}"] = float(sums[T + i] / max(sums[2 * T + i], 1e-6))
    rec["eval/samples"] = len(files)
    return rec


def run_plan(args, train_files, rank, world, micro, accum):
    """Evaluation files, training files, micro-batches per epoch and rank, and optimizer steps
    of the run (--total-steps, else the epochs' steps)."""
    eval_files = (list_feature_files(args.eval_hidden_states_path, "--eval-hidden-states-path")
                  if args.eval_hidden_states_path else [])
    n = len(train_files)
    per_epoch = len(epoch_microbatches(n, 0, args.seed, rank, world, micro))
    if per_epoch == 0:
        raise SystemExit(f"error: {n} training files are too few for {world} ranks x micro {micro}")
    total = args.total_steps or args.num_epochs * math.ceil(per_epoch / accum)
    return eval_files, n, per_epoch, total


class StepBook:
    """The bookkeeping of the training loop both reference trainers share: per-step sums over the
    step's micro-batches and ranks (ploss_i | correct_i | loss tokens_i | tokens; acc_i
    token-weighted over the whole step, as fsdp-train's StepMetrics), the metrics.jsonl record of
    each optimizer step, the steady-state throughput (the first step pays one-off warm-up costs)
    and the peak RSS of every rank."""

    def __init__(self, args, world, accum, total, log):
        self.args, self.world, self.accum, self.total, self.log = args, world, accum, total, log
        self.T = args.ttt_length
        self.stats = torch.zeros(3 * self.T + 1, dtype=torch.float64, device=device_of(args))
        self.steady = {"tokens": 0.0, "seconds": 0.0, "steps": 0}
        self.run_t0 = self.t0 = time.perf_counter()

    def add(self, pl, co, de, batch):
        T = self.T
        for i in range(T):
            self.stats[i] += float(pl[i].detach())
            self.stats[T + i] += float(co[i])
            self.stats[2 * T + i] += float(de[i])
        self.stats[3 * T] += float(batch["attention_mask"].sum())

    def rss_all(self):
        rss_all = [torch.zeros(1, device=device_of(self.args)) for _ in range(self.world)]
        dist.all_gather(rss_all, torch.tensor([peak_rss_mib()], device=device_of(self.args)))
        return [round(float(r), 1) for r in rss_all]

    def step_done(self, step, epoch, lr, grad_norm):
        """After optimizer step `step`: reduces the sums over ranks and writes its record."""
        T, args = self.T, self.args
        dist.all_reduce(self.stats)
        dt = time.perf_counter() - self.t0
        tokens = float(self.stats[3 * T])
        rec = {"step": step, "epoch": epoch}
        for i in range(T):
            rec[f"train/ploss_{i}"] = float(self.stats[i]) / (self.accum * self.world)
        for i in range(T):
            denom = max(float(self.stats[2 * T + i]), 1e-6)
            rec[f"train/acc_{i}"] = float(self.stats[T + i]) / denom
        rec.update({"train/lr": lr, "train/grad_norm": grad_norm, "perf/step_s": dt,
                    "perf/tokens": tokens, "perf/tokens_per_s": tokens / dt,
                    "mem/peak_rss_mib": self.rss_all()})
        if args.device == "cuda":
            rec["mem/cuda_peak_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        self.log.write(rec, echo=(step % args.log_steps == 0 or step == self.total))
        if step > 1:
            self.steady["tokens"] += tokens
            self.steady["seconds"] += dt
            self.steady["steps"] += 1
        self.stats.zero_()
        self.t0 = time.perf_counter()

    def summary(self, step, **extra):
        out = {"summary": True, **extra, "world": self.world, "steps": step,
               "wall_s": time.perf_counter() - self.run_t0,
               "threads_per_rank": torch.get_num_threads()}
        st = self.steady
        if st["steps"]:
            out.update({"steady_steps": st["steps"],
                        "steady_steps_per_s": st["steps"] / st["seconds"],
                        "steady_tokens_per_s": st["tokens"] / st["seconds"]})
        return out


def main():
    args = parse_args()
    rank, world = init_distributed(args)
    with open(args.draft_model_config) as f:
        cfg = DraftConfig(json.load(f), args.draft_model_config)
    micro = args.draft_micro_batch_size
    if args.draft_global_batch_size % (world * micro):
        raise SystemExit(f"error: --draft-global-batch-size {args.draft_global_batch_size} is "
                         f"not a multiple of world size {world} x --draft-micro-batch-size {micro}")
    accum = args.draft_global_batch_size // (world * micro)
    model, head, train_files = build_model(args, cfg, rank)

    pdt = torch.bfloat16 if args.param_dtype == "bf16" else torch.float32
    # cast_forward_inputs=False: the model casts aux itself; target_p must stay fp32 (docs/reference.md §4).
    mp = MixedPrecisionPolicy(param_dtype=pdt, reduce_dtype=torch.float32,
                              cast_forward_inputs=False)
    # One FSDP2 unit for the whole draft. Wrapping the midlayer as its own unit as well used to
    # change the results of TTT steps >= 1 (ploss_1..ploss_6 by 6e-4..3e-2 relative on toy data):
    # the unit's hooks rebuilt the list-based KV cache argument, so the appends made inside it
    # were lost. With eagle3_model.KVCache that wrap agrees exactly with this one (measured: 0
    # difference over 3 fp32 steps); the root-only wrap stays, as measured against fsdp-train.
    fully_shard(model, mp_policy=mp)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.learning_rate, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0)
    log = Logger(args.output_dir, rank)
    if args.save_init:
        export_draft(model, args, Path(args.save_init), rank)
    eval_files, n, per_epoch, total = run_plan(args, train_files, rank, world, micro, accum)
    T = args.ttt_length
    if rank == 0:
        print(f"[reference] world {world}, threads/rank {torch.get_num_threads()}, "
              f"train files {n}, eval files {len(eval_files)}, micro-batches/epoch/rank "
              f"{per_epoch}, accumulation {accum}, total steps {total}, "
              f"param dtype {args.param_dtype}", flush=True)

    step, micro_seen, epoch = 0, 0, 0
    book = StepBook(args, world, accum, total, log)
    while step < total and not args.eval_only:
        for batch in epoch_batches(train_files, epoch, rank, world, args):
            pl, co, de = run_batch(model, head, batch, args)
            loss = sum((0.8 ** i) * pl[i] for i in range(T)) / accum
            loss.backward()
            book.add(pl, co, de, batch)
            micro_seen += 1
            if micro_seen % accum:
                continue
            gn = torch.nn.utils.clip_grad_norm_(params, args.max_grad_norm)
            gn = gn.full_tensor() if hasattr(gn, "full_tensor") else gn
            lr = lr_at(step + 1, args.learning_rate, total, args.warmup_ratio)
            for g in opt.param_groups:
                g["lr"] = lr
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            book.step_done(step, epoch, lr, float(gn))
            if step >= total:
                break
        epoch += 1

    summary = book.summary(step)
    if eval_files:
        summary.update(evaluate(model, head, eval_files, args, rank, world))
    summary["mem/peak_rss_mib"] = book.rss_all()
    if args.save_final and not args.eval_only:
        export_draft(model, args, Path(args.output_dir) / f"epoch_{max(epoch - 1, 0)}_step_{step}",
                     rank)
    log.write(summary)
    dist.barrier()
    dist.destroy_process_group()
    # Interpreter teardown occasionally aborts in a c10d store thread ("terminate called without
    # an active exception", seen once in 8 runs) after all work is done: skip it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
