#!/usr/bin/env python3
"""Writes a small vLLM speculators dump and the same samples as SpecForge .ckpt files.

Layout under OUT:
  OUT/preprocessed/                 datasets.Dataset.save_to_disk: input_ids, loss_mask, seq_len
                                    and a string column (speculators' preprocessed data)
  OUT/preprocessed/hidden_states/   hs_<i>.safetensors: token_ids [S] int64 and hidden_states
                                    [S, L, H] bf16 (or, with --fp8, float8_e4m3fn plus
                                    hidden_states_scales fp32 [S,1,1], or [S,1] with --old-scales)
  OUT/ckpt/data_<i>.ckpt            what a reader must produce for row i: input_ids, loss_mask,
                                    hidden_state [1,S,H] (slot L-1, before the final norm) and
                                    aux_hidden_state [1,S,(L-1)*H] (slots 0..L-2 flattened),
                                    fp8 dequantised as speculators does: q.to(bf16) * scale.to(bf16)

--print-arrow-test-bytes prints hex of three tiny Arrow IPC streams that
tests/unit/data/arrow_ipc.cpp embeds (no files written).

Needs torch, safetensors, pyarrow and datasets (launch/requirements.txt).
"""
import argparse
import os
import sys


def arrow_test_bytes():
    import pyarrow as pa

    def stream(batches, schema):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, schema) as w:
            for b in batches:
                w.write_batch(b)
        return sink.getvalue().to_pybytes()

    # Good: two record batches (rows 0-1 and 2), a null-free int32 list too, a string to skip.
    schema = pa.schema([("text", pa.string()), ("input_ids", pa.list_(pa.int64())),
                        ("loss_mask", pa.large_list(pa.int64())), ("seq_len", pa.int64()),
                        ("small", pa.list_(pa.int32()))])
    rows = [("a", [5, 6, 7], [0, 1, 1], 3, [1]), ("bc", [8, 9], [1, 1], 2, [2, 3]),
            ("", [10, 11, 12, 13], [0, 0, 1, 1], 4, [])]

    def batch(rs):
        cols = list(zip(*rs))
        return pa.record_batch([pa.array(c, type=f.type) for c, f in zip(cols, schema)],
                               schema=schema)

    good = stream([batch(rows[:2]), batch(rows[2:])], schema)
    # Bad: no loss_mask column, and row 1's list offsets end past the 3 values (pyarrow refuses
    # to build such an array, so the offsets are patched in the written bytes).
    bad_schema = pa.schema([("text", pa.string()), ("input_ids", pa.list_(pa.int64()))])
    bad = stream([pa.record_batch([pa.array(["x", "y"]),
                                   pa.array([[1, 2], [3]], pa.list_(pa.int64()))],
                                  schema=bad_schema)], bad_schema)
    pattern = (0).to_bytes(4, "little") + (2).to_bytes(4, "little") + (3).to_bytes(4, "little")
    assert bad.count(pattern) == 1
    bad = bad.replace(pattern, pattern[:8] + (9).to_bytes(4, "little"))
    # Compressed bodies (save_to_disk never writes them) must be refused, not misread.
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, bad_schema,
                           options=pa.ipc.IpcWriteOptions(compression="lz4")) as w:
        w.write_batch(pa.record_batch([pa.array(["x"]), pa.array([[1]], pa.list_(pa.int64()))],
                                      schema=bad_schema))
    print("good", good.hex())
    print("bad", bad.hex())
    print("compressed", sink.getvalue().to_pybytes().hex())


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?")
    ap.add_argument("--num-samples", type=int, default=6)
    ap.add_argument("--hidden-size", type=int, default=16)
    ap.add_argument("--layers", type=int, default=4, help="captured layers L incl. the last")
    ap.add_argument("--vocab-size", type=int, default=100)
    ap.add_argument("--num-shards", type=int, default=2, help="data-*.arrow files")
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--old-scales", action="store_true", help="fp8 scales of shape [S,1]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--print-arrow-test-bytes", action="store_true")
    a = ap.parse_args()
    if a.print_arrow_test_bytes:
        arrow_test_bytes()
        return
    if not a.out:
        ap.error("OUT is required")

    import datasets
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(a.seed)
    n, h, layers = a.num_samples, a.hidden_size, a.layers
    lengths = [int(torch.randint(3, 12, (1,), generator=g)) for _ in range(n)]
    ids = [torch.randint(0, a.vocab_size, (s,), generator=g) for s in lengths]
    masks = []
    for s in lengths:
        m = torch.randint(0, 2, (s,), generator=g)
        m[0] = 0
        m[-1] = 1
        masks.append(m)
    pre = os.path.join(a.out, "preprocessed")
    hs_dir = os.path.join(pre, "hidden_states")
    ckpt_dir = os.path.join(a.out, "ckpt")
    ds = datasets.Dataset.from_dict({
        "input_ids": [x.tolist() for x in ids],
        "loss_mask": [m.tolist() for m in masks],
        "seq_len": lengths,
        "text": [f"sample {i}" for i in range(n)],
    })
    ds.save_to_disk(pre, num_shards=min(a.num_shards, n))
    os.makedirs(hs_dir, exist_ok=True)
    os.makedirs(ckpt_dir, exist_ok=True)
    for i, s in enumerate(lengths):
        x = (torch.randn(s, layers, h, generator=g) * 3).to(torch.bfloat16)
        tensors = {"token_ids": ids[i].clone(), "hidden_states": x}
        if a.fp8:
            amax = x.float().abs().amax(dim=(1, 2), keepdim=True)
            scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
            q = (x.float() / scale).to(torch.float8_e4m3fn)
            tensors["hidden_states"] = q
            tensors["hidden_states_scales"] = scale.reshape(s, 1) if a.old_scales else scale
            x = q.to(torch.bfloat16) * scale.to(torch.bfloat16)
        save_file(tensors, os.path.join(hs_dir, f"hs_{i}.safetensors"))
        torch.save({
            "input_ids": ids[i].clone(),
            "loss_mask": masks[i].clone(),
            "hidden_state": x[:, -1].unsqueeze(0).contiguous(),
            "aux_hidden_state": x[:, :-1].flatten(1).unsqueeze(0).contiguous(),
        }, os.path.join(ckpt_dir, f"data_{i}.ckpt"))
    print(f"wrote {n} samples to {hs_dir} and {ckpt_dir}")


if __name__ == "__main__":
    sys.exit(main())
