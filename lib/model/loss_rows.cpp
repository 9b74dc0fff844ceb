// LossRows (loss_rows.h): which rows the TTT loss scores, built on the host from the loss mask.
// One part per concern: where a row sits in its sample, the chains' runs, the engine's drafts,
// a sequence-parallel rank's window, each step's rows, and one upload of every index list.
#include "model/loss_rows.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/ttt_attention.h"

namespace fsdp::model {
namespace {

// Where each flat row k = b*S + t sits: its position inside its sample (unpacked: t; packed:
// inside its document) and, packed, its document.
struct RowPlaces {
  std::vector<int64_t> doc_start, doc_of;  // packed only, per flat row
  int64_t sample_seq = 0;
  bool packed = false;
  int64_t pos(int64_t k) const {
    return packed ? k - doc_start[static_cast<size_t>(k)] : k % sample_seq;
  }
  // Row k follows row k - 1 in the same sample (or document).
  bool follows(int64_t k, int64_t prev) const { return k == prev + 1 && pos(k) != 0; }
};

RowPlaces row_places(const std::vector<int64_t>& documents, int64_t seq) {
  RowPlaces p;
  p.sample_seq = seq;
  p.packed = !documents.empty();
  int64_t s0 = 0;
  for (size_t d = 0; d < documents.size(); ++d) {
    for (int64_t j = 0; j < documents[d]; ++j) {
      p.doc_start.push_back(s0);
      p.doc_of.push_back(static_cast<int64_t>(d));
    }
    s0 += documents[d];
  }
  return p;
}

// The flat rows where the loss mask is set, ascending.
std::vector<int64_t> loss_positions(const at::Tensor& loss_mask) {
  at::Tensor m = loss_mask.to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* mp = m.data_ptr<int64_t>();
  std::vector<int64_t> rows;
  for (int64_t k = 0; k < m.numel(); ++k) {
    if (mp[k] != 0) rows.push_back(k);
  }
  return rows;
}

// Consecutive loss positions of one sample, from each row on, capped at T (LossRows::run).
std::vector<int64_t> chain_runs(const std::vector<int64_t>& rows, const RowPlaces& at, int64_t T) {
  std::vector<int64_t> run(rows.size(), 1);
  for (size_t j = rows.size(); j-- > 1;) {
    if (at.follows(rows[j], rows[j - 1])) run[j - 1] = std::min(run[j] + 1, T);
  }
  return run;
}

// The engine's drafts over the whole sample (see loss_rows.h). hit[i][k]: node k's step-i hit
// slot in cat(hit_i [N], pre hit_i [R], 0), global indices.
struct EngineNodes {
  std::vector<int64_t> pre, end, start, pos;
  std::vector<std::vector<int64_t>> hit;
};

// Per reply a..e (loss rows j0..j1 of one sample): the nodes p = first..e-2 with first = a-1
// (a pre row) or a at a sample's start; node p's step i is scored at row p+i while p+i <= e-2.
EngineNodes engine_nodes(const std::vector<int64_t>& rows, const RowPlaces& at, int64_t T) {
  EngineNodes g;
  g.hit.resize(static_cast<size_t>(T));
  const auto N = static_cast<int64_t>(rows.size());
  for (size_t j0 = 0; j0 < rows.size();) {
    size_t j1 = j0;
    while (j1 + 1 < rows.size() && at.follows(rows[j1 + 1], rows[j1])) ++j1;
    const int64_t a = at.pos(rows[j0]), e = at.pos(rows[j1]), first = a >= 1 ? a - 1 : a;
    if (e - 2 >= first) {
      const auto pre_index = static_cast<int64_t>(g.pre.size());
      if (a >= 1) g.pre.push_back(rows[j0] - 1);
      const auto k0 = static_cast<int64_t>(g.end.size()), k1 = k0 + (e - 2 - first + 1);
      g.start.push_back(k0);
      for (int64_t p = first; p <= e - 2; ++p) {
        g.end.push_back(k1);
        g.pos.push_back(rows[j0] - a + p);
        for (int64_t i = 0; i < T; ++i) {
          int64_t slot = -1;  // the trailing 0, set below once R is known
          if (p + i <= e - 2) {
            slot = p + i < a ? N + pre_index : static_cast<int64_t>(j0) + (p + i - a);
          }
          g.hit[static_cast<size_t>(i)].push_back(slot);
        }
      }
    }
    j0 = j1 + 1;
  }
  const auto R = static_cast<int64_t>(g.pre.size());
  for (auto& list : g.hit)
    for (int64_t& slot : list)
      if (slot < 0) slot = N + R;
  return g;
}

// This rank's part (everything, unsharded): draft positions [lo, hi_draft), loss rows [j_lo,
// j_hi) with positions in the window [lo, hi_draft + T - 1), pre rows [q_lo, q_hi) and nodes
// [k_lo, k_hi) at its draft positions.
struct Window {
  int64_t lo = 0, hi_draft = 0;
  size_t j_lo = 0, j_hi = 0, q_lo = 0, q_hi = 0, k_lo = 0, k_hi = 0;
};

Window whole_window(const std::vector<int64_t>& rows, const EngineNodes& g, int64_t numel) {
  return {0, numel, 0, rows.size(), 0, g.pre.size(), 0, g.pos.size()};
}

Window shard_window(const std::vector<int64_t>& rows, const EngineNodes& g, int64_t offset,
                    int64_t local, int64_t T) {
  const auto first_at = [](const std::vector<int64_t>& v, int64_t x) {
    return static_cast<size_t>(std::lower_bound(v.begin(), v.end(), x) - v.begin());
  };
  Window w;
  w.lo = offset;
  w.hi_draft = offset + local;
  const int64_t hi = w.hi_draft + T - 1;
  w.j_lo = first_at(rows, w.lo);
  w.j_hi = first_at(rows, hi);
  w.q_lo = first_at(g.pre, w.lo);
  w.q_hi = first_at(g.pre, w.hi_draft);
  w.k_lo = first_at(g.pos, w.lo);
  w.k_hi = first_at(g.pos, w.hi_draft);
  return w;
}

// The window's nodes' hit slots in this rank's cat(hit_i [n_loc], pre hit_i [r_loc], 0).
std::vector<std::vector<int64_t>> local_hits(const EngineNodes& g, const Window& w, int64_t N) {
  const auto R = static_cast<int64_t>(g.pre.size());
  const auto n_loc = static_cast<int64_t>(w.j_hi - w.j_lo),
             r_loc = static_cast<int64_t>(w.q_hi - w.q_lo);
  std::vector<std::vector<int64_t>> out(g.hit.size());
  for (size_t i = 0; i < g.hit.size(); ++i) {
    for (size_t k = w.k_lo; k < w.k_hi; ++k) {
      const int64_t slot = g.hit[i][k];
      int64_t mapped = n_loc + r_loc;
      if (slot < N) {
        mapped = slot - static_cast<int64_t>(w.j_lo);
      } else if (slot < N + R) {
        mapped = n_loc + (slot - N - static_cast<int64_t>(w.q_lo));
      }
      FSDP_CHECK(mapped >= 0 && mapped <= n_loc + r_loc,
                 fsdp::str("loss rows: node at ", g.pos[k], " reads outside the window"),
                 "this is a bug in fsdp-train: please report it with the command line and log");
      out[i].push_back(mapped);
    }
  }
  return out;
}

// Step i's rows: loss rows at position t >= i (in the sample or document) whose draft row t - i
// is this rank's, as indices into the window's rows (target) and draft rows (draft); packed,
// each document's count of them (doc_count [T * D]).
struct StepRows {
  std::vector<std::vector<int64_t>> target, draft;
  std::vector<int64_t> doc_count;
};

StepRows step_rows(const std::vector<int64_t>& rows, const RowPlaces& at, const Window& w,
                   int64_t T, int64_t D) {
  StepRows s;
  s.doc_count.assign(static_cast<size_t>(T * D), 0);
  for (int64_t i = 0; i < T; ++i) {
    std::vector<int64_t> target, draft;
    for (size_t j = w.j_lo; j < w.j_hi; ++j) {
      const int64_t k = rows[j];
      if (at.pos(k) < i || k - i < w.lo || k - i >= w.hi_draft) continue;
      target.push_back(static_cast<int64_t>(j - w.j_lo));
      draft.push_back(k - i - w.lo);
      if (at.packed) ++s.doc_count[static_cast<size_t>(i * D + at.doc_of[static_cast<size_t>(k)])];
    }
    s.target.push_back(std::move(target));
    s.draft.push_back(std::move(draft));
  }
  return s;
}

// Index lists gathered in one host buffer (pinned for a GPU) and sent with one asynchronous
// copy; each list is a view of the device copy. No per-list blocking copies, no stream sync.
class IndexUpload {
 public:
  size_t add(const std::vector<int64_t>& list) {
    spans_.emplace_back(all_.size(), list.size());
    all_.insert(all_.end(), list.begin(), list.end());
    return spans_.size() - 1;
  }
  void send(c10::Device device) {
    at::Tensor host =
        at::empty({static_cast<int64_t>(all_.size())},
                  at::TensorOptions().dtype(at::kLong).pinned_memory(device.is_cuda()));
    std::copy(all_.begin(), all_.end(), host.data_ptr<int64_t>());
    dev_ = host.to(device, /*non_blocking=*/true);
  }
  at::Tensor view(size_t id) const {
    const auto [offset, length] = spans_[id];
    return dev_.narrow(0, static_cast<int64_t>(offset), static_cast<int64_t>(length));
  }

 private:
  std::vector<int64_t> all_;
  std::vector<std::pair<size_t, size_t>> spans_;
  at::Tensor dev_;
};

// The window's rows and what the loss and the metrics read of them, on `device`.
void place_rows(LossRows& r, const std::vector<int64_t>& rows, const std::vector<int64_t>& run,
                const EngineNodes& g, const Window& w, const RowPlaces& at, c10::Device device,
                bool sharded) {
  const int64_t T = r.ttt_length, D = static_cast<int64_t>(r.documents.size());
  std::vector<int64_t> local_rows, local_run, local_pre, anchor, doc;
  for (size_t j = w.j_lo; j < w.j_hi; ++j) {
    local_rows.push_back(rows[j] - w.lo);
    local_run.push_back(run[j]);
    anchor.push_back(rows[j] < w.hi_draft ? 1 : 0);
  }
  for (size_t q = w.q_lo; q < w.q_hi; ++q) local_pre.push_back(g.pre[q] - w.lo);
  for (const int64_t k : rows)
    if (at.packed) doc.push_back(at.doc_of[static_cast<size_t>(k)]);
  const auto hits = local_hits(g, w, static_cast<int64_t>(rows.size()));
  const StepRows steps = step_rows(rows, at, w, T, D);
  IndexUpload up;
  const size_t id_rows = up.add(local_rows), id_run = up.add(local_run), id_pre = up.add(local_pre),
               id_end = up.add(g.end), id_start = up.add(g.start), id_anchor = up.add(anchor),
               id_doc = up.add(doc), id_doc_length = up.add(r.documents),
               id_doc_count = up.add(steps.doc_count);
  std::vector<size_t> id_hit, id_target, id_draft;
  for (const auto& list : hits) id_hit.push_back(up.add(list));
  for (int64_t i = 0; i < T; ++i) {
    id_target.push_back(up.add(steps.target[static_cast<size_t>(i)]));
    id_draft.push_back(up.add(steps.draft[static_cast<size_t>(i)]));
    r.count.push_back(static_cast<int64_t>(steps.target[static_cast<size_t>(i)].size()));
  }
  up.send(device);
  r.rows = up.view(id_rows);
  r.run = up.view(id_run);
  r.pre = up.view(id_pre);
  r.engine_end = up.view(id_end);
  r.engine_start = up.view(id_start);
  for (const size_t id : id_hit) r.engine_hit.push_back(up.view(id));
  for (int64_t i = 0; i < T; ++i) {
    r.target.push_back(up.view(id_target[static_cast<size_t>(i)]));
    r.draft.push_back(up.view(id_draft[static_cast<size_t>(i)]));
  }
  if (sharded) r.local_anchor = up.view(id_anchor).to(at::kFloat);
  if (at.packed) {
    r.doc = up.view(id_doc);
    r.doc_length = up.view(id_doc_length).to(at::kFloat);
    r.doc_count = up.view(id_doc_count).to(at::kFloat).view({T, D});
  }
}

// A sequence-parallel rank's draft positions [offset, offset + local) (LossRows::build_shard).
struct ShardSpan {
  int64_t offset = 0, local = 0;
};

LossRows build_rows(const at::Tensor& loss_mask, int64_t ttt_length, c10::Device device,
                    const std::vector<int64_t>& documents, const ShardSpan* shard) {
  FSDP_CHECK(loss_mask.dim() == 2, fsdp::str("loss_mask must be [B, S], got ", loss_mask.sizes()),
             "collate samples into a [B, S] batch");
  FSDP_CHECK(ttt_length >= 1, fsdp::str("ttt_length must be >= 1, got ", ttt_length),
             "use --ttt-length 7 (default)");
  LossRows r;
  r.batch = loss_mask.size(0);
  r.seq = loss_mask.size(1);
  r.ttt_length = ttt_length;
  r.documents = documents;
  check_layout(SeqLayout(at::Tensor(), documents), r.batch, r.seq);
  const RowPlaces at = row_places(documents, r.seq);
  const std::vector<int64_t> rows = loss_positions(loss_mask);
  const std::vector<int64_t> run = chain_runs(rows, at, ttt_length);
  const EngineNodes g = engine_nodes(rows, at, ttt_length);
  r.engine_nodes = static_cast<int64_t>(g.end.size());
  Window w = whole_window(rows, g, r.batch * r.seq);
  if (shard) {
    w = shard_window(rows, g, shard->offset, shard->local, ttt_length);
    r.shard_offset = shard->offset;
    r.shard_local = shard->local;
    r.shard_total = r.seq;
    r.seq = shard->local + ttt_length - 1;
  }
  r.engine_first = static_cast<int64_t>(w.k_lo);
  r.engine_local = static_cast<int64_t>(w.k_hi - w.k_lo);
  place_rows(r, rows, run, g, w, at, device, shard != nullptr);
  return r;
}

}  // namespace

LossRows LossRows::build(const at::Tensor& loss_mask, int64_t ttt_length, c10::Device device,
                         const std::vector<int64_t>& documents) {
  return build_rows(loss_mask, ttt_length, device, documents, nullptr);
}

LossRows LossRows::build_shard(const at::Tensor& loss_mask, int64_t ttt_length, c10::Device device,
                               int64_t offset, int64_t local) {
  FSDP_CHECK(loss_mask.dim() == 2 && loss_mask.size(0) == 1 && offset >= 0 && local >= 1,
             fsdp::str("sequence-parallel loss rows need one sample's [1, S] loss mask and a "
                       "slice; got ",
                       loss_mask.sizes(), ", offset ", offset, ", ", local, " positions"),
             "sequence parallelism runs micro-batch 1");
  const ShardSpan span{offset, local};
  return build_rows(loss_mask, ttt_length, device, {}, &span);
}

}  // namespace fsdp::model
