"""Feature formats of the other producers, written from samples as each producer writes them.

Shared by the e2e scripts producer_formats.sh (EAGLE3 features) and block_formats.sh (DFlash and
DSpark features); their Python imports it after putting tests/e2e/lib (from $SRC) on sys.path.
A sample is a Sample of plain tensors: input_ids [S], loss_mask [S], aux [S, n*H] (the n captured
target layers, concatenated) and last [S, H] (the last hidden state). aux and last may also be
[1, S, ...]: ModelOpt's dicts keep the shapes given, the other formats reshape to [S, ...].
"""
import collections
import gzip
import json
import os
import shutil
import struct

import datasets
import torch
from safetensors.torch import save_file

Sample = collections.namedtuple("Sample", "input_ids loss_mask aux last")


def write_specforge_gz(files, rel, out):
    """SpecForge --compress: gzip.open(path, "wb") + torch.save into it, level 6: the .ckpt bytes
    of each of files through gzip, as out/<rel>.gz."""
    for r, f in zip(rel, files):
        dst_path = os.path.join(out, r + ".gz")
        os.makedirs(os.path.dirname(dst_path), exist_ok=True)
        with open(f, "rb") as src, gzip.open(dst_path, "wb", compresslevel=6) as dst:
            dst.write(src.read())


def write_modelopt(out, samples):
    """ModelOpt (its DFlash/DSpark dumps are its EAGLE3 ones with --aux-layers dflash): one
    torch.save dict per conversation, {conversation_id}.pt with input_ids, hidden_states (the last
    state, after the norm), aux_hidden_states, loss_mask and conversation_id."""
    os.makedirs(out)
    for i, s in enumerate(samples):
        cid = f"{i:08d}"
        torch.save({"input_ids": s.input_ids, "hidden_states": s.last,
                    "aux_hidden_states": s.aux, "loss_mask": s.loss_mask,
                    "conversation_id": cid}, os.path.join(out, cid + ".pt"))


def write_deepspec(out, samples, layer_ids, **manifest_json):
    """DeepSpec: one target cache for EAGLE3, DFlash and DSpark: manifest.json (with
    target_layer_ids), samples.idx of 56-byte "<QIIQQQQQ" records (index, shard, length and the
    five offsets) and shard-00000.bin with, per sample and without padding, int32 ids, uint8
    attention and loss masks, bf16 target_hidden_states [S, L*H] and bf16
    target_last_hidden_states [S, H]. manifest_json: json.dump's options for manifest.json."""
    os.makedirs(out)
    H = samples[0].last.shape[-1]
    rec = struct.Struct("<QIIQQQQQ")
    idx, blob = bytearray(), bytearray()
    for i, s in enumerate(samples):
        S = s.input_ids.numel()
        offs = []
        for t in (s.input_ids.to(torch.int32), torch.ones(S, dtype=torch.uint8),
                  s.loss_mask.to(torch.uint8), s.aux.reshape(S, -1), s.last.reshape(S, H)):
            offs.append(len(blob))
            blob += t.contiguous().view(torch.uint8).numpy().tobytes()
        idx += rec.pack(i, 0, S, *offs)
    with open(os.path.join(out, "shard-00000.bin"), "wb") as f:
        f.write(blob)
    with open(os.path.join(out, "samples.idx"), "wb") as f:
        f.write(idx)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"version": 2, "num_samples": len(samples), "num_shards": 1,
                   "target_layer_ids": layer_ids, "hidden_dtype": "bfloat16",
                   "token_dtype": "int32", "mask_dtype": "uint8", "index_record_size": rec.size,
                   "hidden_size": H, "shards": [{"shard_id": 0, "file_name": "shard-00000.bin"}],
                   "target_model_name_or_path": "toy"}, f, **manifest_json)


def write_speculators(pre, samples, texts=None):
    """speculators: pre/hidden_states/hs_<i>.safetensors with hidden_states [S, n+1, H] (the n
    target layers, then the last layer BEFORE the target's final norm) and token_ids [S]; the loss
    mask in a datasets Arrow directory at pre (input_ids, loss_mask, seq_len and, given texts, a
    text column)."""
    os.makedirs(os.path.join(pre, "hidden_states"))
    rows = {"input_ids": [], "loss_mask": [], "seq_len": []}
    if texts is not None:
        rows["text"] = []
    for i, s in enumerate(samples):
        S = s.input_ids.numel()
        H = s.last.shape[-1]
        hs = torch.cat([s.aux.reshape(S, -1, H), s.last.reshape(S, 1, H)], dim=1).contiguous()
        save_file({"hidden_states": hs, "token_ids": s.input_ids.reshape(S).clone()},
                  os.path.join(pre, "hidden_states", f"hs_{i}.safetensors"))
        rows["input_ids"].append(s.input_ids.reshape(S).tolist())
        rows["loss_mask"].append(s.loss_mask.reshape(S).tolist())
        rows["seq_len"].append(S)
        if texts is not None:
            rows["text"].append(texts[i])
    datasets.Dataset.from_dict(rows).save_to_disk(pre)


def target_with_final_norm(src, tgt, H):
    """A copy of the toy target at tgt with a final norm weight (the toy target has none), which
    speculators' pre-norm last state goes through: model.norm.weight, bf16 in [0.5, 1.5) from
    seed 0, in model-norm.safetensors named in the index. Returns the weight and rms_norm_eps."""
    shutil.copytree(src, tgt)
    torch.manual_seed(0)
    norm_w = (torch.rand(H) + 0.5).to(torch.bfloat16)
    save_file({"model.norm.weight": norm_w}, os.path.join(tgt, "model-norm.safetensors"))
    index_path = os.path.join(tgt, "model.safetensors.index.json")
    with open(index_path) as f:
        index = json.load(f)
    index["weight_map"]["model.norm.weight"] = "model-norm.safetensors"
    with open(index_path, "w") as f:
        json.dump(index, f)
    with open(os.path.join(tgt, "config.json")) as f:
        return norm_w, json.load(f)["rms_norm_eps"]


def final_norm(x, norm_w, eps):
    """The target's final norm of a pre-norm state x, as transformers' LlamaRMSNorm computes it:
    fp32 normalisation, cast to bf16, times the bf16 weight."""
    x = x.float()
    return norm_w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)
