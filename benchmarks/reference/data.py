# Data side of the reference trainer: SpecForge .ckpt reading and per-sample processing (docs/reference.md §1.3),
# collation, the DistributedSampler-compatible order of the cross-team contract, vocab mapping
# (docs/reference.md §2) and the target head (docs/reference.md §1.2). Must never load the whole dataset before step 1.
"""Feature files, batches, sampler, vocab mapping and target head for the reference trainer."""

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open


def list_feature_files(path, flag):
    root = Path(path)
    if not root.is_dir():
        raise SystemExit(f"error: {flag} {path}: not a directory")
    files = sorted(str(p) for p in root.rglob("*.ckpt"))
    if not files:
        raise SystemExit(f"error: {flag} {path}: no *.ckpt files found (SpecForge layout expected)")
    return files


def load_sample(path, max_length):
    """One processed sample (docs/reference.md §1.3): shifted ids/targets, loss_mask with the last element 0."""
    d = torch.load(path, weights_only=True)
    for key in ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state"):
        if key not in d:
            raise SystemExit(f"error: {path}: missing key '{key}'")
    ids, mask = d["input_ids"].long(), d["loss_mask"].long()
    hs, aux = d["hidden_state"], d["aux_hidden_state"]
    if ids.dim() != 1 or hs.dim() != 3 or aux.dim() != 3 or hs.shape[1] != ids.numel() \
            or aux.shape[1] != ids.numel() or mask.shape != ids.shape:
        raise SystemExit(f"error: {path}: inconsistent shapes ids {tuple(ids.shape)}, "
                         f"hidden {tuple(hs.shape)}, aux {tuple(aux.shape)}")
    s = min(ids.numel(), max_length)
    hidden = hs[0, :s]
    target = torch.cat([hidden[1:], hidden.new_zeros(1, hidden.shape[1])])
    mask = mask[:s].clone()
    mask[-1] = 0
    return {
        "input_ids": torch.cat([ids[1:s], ids.new_zeros(1)]),
        "loss_mask": mask,
        "attention_mask": torch.ones(s, dtype=torch.int64),
        "aux": aux[0, :s],
        "target_hidden": target,
    }


def collate(samples):
    """Right-pad each tensor to the longest sample with zeros."""
    s = max(x["input_ids"].numel() for x in samples)
    out = {}
    for key in samples[0]:
        rows = []
        for x in samples:
            t = x[key]
            pad = s - t.shape[0]
            rows.append(torch.cat([t, t.new_zeros((pad,) + tuple(t.shape[1:]))]) if pad else t)
        out[key] = torch.stack(rows)
    return out


def epoch_microbatches(n, epoch, seed, rank, world, micro):
    """Sample indices per micro-batch for one rank (DistributedSampler order, drop_last)."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    perm = torch.randperm(n, generator=g).tolist()
    mine = perm[rank::world][: n // world]
    return [mine[i:i + micro] for i in range(0, len(mine) - micro + 1, micro)]


def build_vocab_mapping(files, max_length, vocab, draft_vocab):
    """docs/reference.md §2: the draft_vocab most frequent loss-masked ids (ties -> smaller id), padded with the
    smallest unused ids, sorted ascending."""
    counts = torch.zeros(vocab, dtype=torch.int64)
    for f in files:
        d = torch.load(f, weights_only=True)
        s = min(d["input_ids"].numel(), max_length)
        ids = d["input_ids"][:s].long()
        m = d["loss_mask"][:s].long()
        if ids.numel() and int(ids.max()) >= vocab:
            raise SystemExit(f"error: {f}: token id {int(ids.max())} >= vocab_size {vocab}")
        counts += torch.bincount(ids[m == 1], minlength=vocab)
    # Stable sort on -count keeps ascending id order among equal counts.
    order = torch.sort(-counts, stable=True).indices
    used = order[:draft_vocab]
    used = used[counts[used] > 0]
    if used.numel() < draft_vocab:
        taken = torch.zeros(vocab, dtype=torch.bool)
        taken[used] = True
        extra = torch.nonzero(~taken).flatten()[: draft_vocab - used.numel()]
        used = torch.cat([used, extra])
    used = torch.sort(used).values
    d2t = used - torch.arange(draft_vocab)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used] = True
    return d2t, t2d


def vocab_mapping(args, files, vocab, draft_vocab, rank):
    """Loaded from --vocab-mapping-path, else built from the training features (cached)."""
    if args.vocab_mapping_path:
        m = torch.load(args.vocab_mapping_path, weights_only=True)
        d2t, t2d = m["d2t"].long(), m["t2d"].bool()
        if d2t.numel() != draft_vocab or t2d.numel() != vocab or int(t2d.sum()) != draft_vocab:
            raise SystemExit(f"error: --vocab-mapping-path {args.vocab_mapping_path}: shapes "
                             f"d2t {tuple(d2t.shape)}, t2d {tuple(t2d.shape)} "
                             f"(sum {int(t2d.sum())})"
                             f" do not match vocab {vocab} / draft vocab {draft_vocab}")
        return d2t, t2d
    data = os.path.abspath(args.train_hidden_states_path)
    key = f"{data}|{args.max_length}|{vocab}|{draft_vocab}"
    cache = Path(args.cache_dir) / "vocab_mapping" / f"{hash_str(key):016x}.pt"
    if cache.is_file():
        m = torch.load(cache, weights_only=True)
        return m["d2t"], m["t2d"]
    d2t, t2d = build_vocab_mapping(files, args.max_length, vocab, draft_vocab)
    if rank == 0:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".tmp{os.getpid()}")
        torch.save({"d2t": d2t, "t2d": t2d}, tmp)
        os.replace(tmp, cache)
    return d2t, t2d


def hash_str(s):
    """Stable 64-bit FNV-1a (Python's hash() is salted per process)."""
    h = 0xcbf29ce484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def load_target_tensors(path, keys):
    """Read only the named tensors from a HF dir (single file or sharded index)."""
    root = Path(path)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        with open(index) as f:
            wmap = json.load(f)["weight_map"]
    elif (root / "model.safetensors").is_file():
        wmap = None
    else:
        raise SystemExit(f"error: --target-model-path {path}: no model.safetensors(.index.json)")
    out = {}
    for key in keys:
        fname = (wmap or {}).get(key, "model.safetensors")
        with safe_open(str(root / fname), framework="pt") as f:
            if key not in f.keys():
                raise SystemExit(f"error: --target-model-path {path}: tensor '{key}' not in {fname}"
                                 " (tied embeddings: pass --lm-head-key model.embed_tokens.weight)")
            out[key] = f.get_tensor(key)
    return out
