#include "model/tensor_parallel.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "fdpp/error.h"

namespace fdpp {

int64_t TensorParallelLayout::vocab_rows(int rank) const {
  return std::clamp<int64_t>(local.vocab_size - vocab_begin(rank), 0, vocab_per_rank);
}

TensorParallelLayout plan_tensor_parallel(const ModelConfig& c, int ranks) {
  check(ranks >= 1 && ranks <= 64, "--tensor-parallel {}: must be in [1, 64]", ranks);
  TensorParallelLayout t;
  t.ranks = ranks;
  t.local = c;
  t.vocab_per_rank = (static_cast<int64_t>(c.vocab_size) + ranks - 1) / ranks;
  if (ranks == 1) return t;
  check(c.n_heads % ranks == 0, "--tensor-parallel {}: the model's {} attention heads do not split evenly over {} GPUs",
        ranks, c.n_heads, ranks);
  check(c.n_kv_heads % ranks == 0 || ranks % c.n_kv_heads == 0,
        "--tensor-parallel {}: the model's {} KV heads neither split over {} GPUs nor divide {} (each would be "
        "replicated unevenly)",
        ranks, c.n_kv_heads, ranks, ranks);
  check(c.ffn_hidden % ranks == 0, "--tensor-parallel {}: the FFN width {} does not split evenly over {} GPUs", ranks,
        c.ffn_hidden, ranks);
  check(c.embedding_dim() == c.hidden, "--tensor-parallel: models with embedding projections (OPT-350m style) are not "
                                       "split; run them on one GPU");
  check(!c.has_moe(), "--tensor-parallel: mixture-of-experts models are not split yet");
  t.local.n_heads = c.n_heads / ranks;
  t.local.n_kv_heads = c.n_kv_heads >= ranks ? c.n_kv_heads / ranks : 1;
  t.kv_replicas = c.n_kv_heads >= ranks ? 1 : ranks / c.n_kv_heads;
  t.local.ffn_hidden = c.ffn_hidden / ranks;
  return t;
}

namespace {

// Rows [first, first + count) of a planned tensor (its first dimension), as a plan of the same
// stored bytes.
PlannedTensor row_slice(const PlannedTensor& p, int64_t first, int64_t count) {
  // The sharded engine has no FP8 weights yet (backend_select refuses it first, in one line).
  check(!p.fp8() && !p.packed(), "{}: {} checkpoints do not run under tensor parallelism yet", p.src.name,
        p.fp8() ? "FP8" : "AWQ and GPTQ");
  check(p.stored_cols == 0, "{}: cannot slice rows of a column slice", p.src.name);
  check(first >= 0 && count >= 0 && first + count <= p.rows(), "{}: rows [{}, {}) out of its {}", p.src.name, first,
        first + count, p.rows());
  PlannedTensor s = p;
  s.shape[0] = count;
  const int64_t cols = p.cols();
  if (p.src.data == nullptr) {
    // Not contiguous in its file (read element by element): read the whole tensor, keep the rows.
    auto whole = p.src.read_f32;
    const int64_t n = p.numel();
    s.src.read_f32 = [whole, n, first, count, cols](std::span<float> out) {
      std::vector<float> all(static_cast<size_t>(n));
      whole(all);
      std::copy_n(all.begin() + first * cols, count * cols, out.begin());
    };
    return s;
  }
  check(cols % static_cast<int64_t>(gguf::block_elements(p.src.type)) == 0,
        "{}: rows of {} elements are not whole {} blocks, so they cannot be split", p.src.name, cols,
        gguf::type_name(p.src.type));
  const uint64_t row_bytes = p.bytes_of(cols);
  s.src.data += first * row_bytes;
  if (!s.src.file.empty()) s.src.file_offset += first * row_bytes;
  s.src.n_bytes = count * row_bytes;
  return s;
}

// Columns [first, first + count) of every row of a 2-D planned tensor.
PlannedTensor column_slice(const PlannedTensor& p, int64_t first, int64_t count) {
  check(!p.fp8() && !p.packed(), "{}: {} checkpoints do not run under tensor parallelism yet", p.src.name,
        p.fp8() ? "FP8" : "AWQ and GPTQ");
  check(p.stored_cols == 0 && p.permute_heads == 0 && p.shape.size() == 2, "{}: cannot slice its columns", p.src.name);
  const int64_t rows = p.rows(), cols = p.cols();
  check(first >= 0 && count >= 0 && first + count <= cols, "{}: columns [{}, {}) out of its {}", p.src.name, first,
        first + count, cols);
  PlannedTensor s = p;
  s.shape[1] = count;
  if (p.src.data == nullptr) {
    auto whole = p.src.read_f32;
    s.src.read_f32 = [whole, rows, cols, first, count](std::span<float> out) {
      std::vector<float> all(static_cast<size_t>(rows * cols));
      whole(all);
      for (int64_t r = 0; r < rows; ++r) std::copy_n(all.begin() + r * cols + first, count, out.begin() + r * count);
    };
    return s;
  }
  const auto be = static_cast<int64_t>(gguf::block_elements(p.src.type));
  if (first % be != 0 || count % be != 0) {
    // The slice cuts through quantization blocks (Llama-2-7B's down projection, 11008 columns of
    // 256-element Q4_K blocks, halves at 5504): dequantize whole rows on the host, keep the columns.
    const uint64_t row_bytes = p.bytes_of(cols);
    const uint8_t* data = p.src.data;
    const gguf::GgmlType type = p.src.type;
    s.src.data = nullptr;
    s.src.file.clear();
    s.src.read_f32 = [data, type, row_bytes, rows, cols, first, count](std::span<float> out) {
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t r = 0; r < rows; ++r) {
        gguf::dequantize(type, data + r * row_bytes, row.data(), static_cast<uint64_t>(cols));
        std::copy_n(row.begin() + first, count, out.begin() + r * count);
      }
    };
    return s;
  }
  s.stored_cols = cols;
  s.col_offset = first;
  s.src.n_bytes = rows * p.bytes_of(count);
  s.src.file.clear();  // read row by row from the mapping, not with one pread
  return s;
}

}  // namespace

WeightPlan shard_plan(const WeightPlan& plan, const ModelConfig& c, const TensorParallelLayout& t, int rank) {
  check(rank >= 0 && rank < t.ranks, "shard_plan: rank {} of {}", rank, t.ranks);
  WeightPlan out;
  out.storage = plan.storage;
  if (t.ranks == 1) {
    out.tensors = plan.tensors;
    return out;
  }
  const ModelConfig& l = t.local;
  const int64_t hd = c.head_dim;
  const int64_t q0 = t.q_head_begin(rank) * hd, nq = l.n_heads * hd;
  const int64_t k0 = t.kv_head_begin(rank) * hd, nk = l.n_kv_heads * hd;
  const int64_t f0 = t.ffn_begin(rank), nf = l.ffn_hidden;
  using S = WeightSlot;
  for (const PlannedTensor& p : plan.tensors) {
    PlannedTensor s;
    switch (p.slot) {
      case S::Wq:
      case S::Bq:
        s = row_slice(p, q0, nq);
        if (p.permute_heads > 0) s.permute_heads = l.n_heads;
        break;
      case S::Wk:
      case S::Wv:
      case S::Bk:
      case S::Bv:
        s = row_slice(p, k0, nk);
        if (p.permute_heads > 0) s.permute_heads = l.n_kv_heads;
        break;
      case S::WGate:
      case S::WUp:
      case S::BGate:
      case S::BUp:
        s = row_slice(p, f0, nf);
        break;
      case S::Wo:
        s = column_slice(p, q0, nq);
        break;
      case S::WDown:
        s = column_slice(p, f0, nf);
        break;
      case S::Bo:
      case S::BDown:
        // Added once, after the all-reduce sums the ranks' partial outputs.
        if (rank != 0) continue;
        s = p;
        break;
      case S::LmHead:
        s = row_slice(p, t.vocab_begin(rank), t.vocab_rows(rank));
        break;
      default:  // norms, embeddings: every rank holds them whole
        s = p;
        break;
    }
    out.tensors.push_back(std::move(s));
  }
  if (plan.find(S::LmHead, -1) == nullptr) {
    // Tied embeddings: the rank's lm head is its rows of the token embeddings.
    const PlannedTensor* emb = plan.find(S::TokEmbeddings, -1);
    check(emb != nullptr, "shard_plan: the plan has neither an lm head nor token embeddings");
    PlannedTensor head = row_slice(*emb, t.vocab_begin(rank), t.vocab_rows(rank));
    head.slot = S::LmHead;
    out.tensors.push_back(std::move(head));
  }
  return out;
}

}  // namespace fdpp
