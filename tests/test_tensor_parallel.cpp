// The tensor-parallel sharding plan (model/tensor_parallel.h), on the CPU: each rank's slices of a
// model, read back, are exactly the rows and columns of the whole model that the rank owns (whole
// heads of q/k/v, FFN rows of gate/up, the matching columns of o and down, vocabulary rows of the
// lm head, replicated KV heads when there are fewer than ranks, the o/down biases on rank 0 only),
// for random models, the HF fixtures and a GGUF of every stored type; a model that does not split
// is refused with one line naming why.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "io/gguf.h"
#include "model/model_loader.h"
#include "model/arch/architecture.h"
#include "model/tensor_parallel.h"
#include "model/weight_plan.h"
#include "test_util.h"
#include "tiny_gguf.h"
#include "tiny_model.h"

namespace fdpp {
namespace {

namespace fs = std::filesystem;

template <class F>
void expect_error(F f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one saying: " << part;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// rows [r0, r0 + n) x columns [c0, c0 + m) of a 2-D tensor (1-D: elements [r0, r0 + n)).
Tensor block(const Tensor& t, int64_t r0, int64_t n, int64_t c0 = 0, int64_t m = -1) {
  const int64_t cols = t.shape.size() < 2 ? 1 : t.shape[1];
  if (m < 0) m = cols;
  Tensor out(t.shape.size() < 2 ? std::vector<int64_t>{n} : std::vector<int64_t>{n, m});
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(out.ptr() + r * m, t.ptr() + (r0 + r) * cols + c0, static_cast<size_t>(m) * sizeof(float));
  return out;
}

void expect_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape, want.shape) << what;
  EXPECT_EQ(std::memcmp(got.ptr(), want.ptr(), got.data.size() * sizeof(float)), 0) << what;
}

// Every rank's materialized shard against the slices of the whole model.
void expect_shards_are_slices(const WeightPlan& plan, const ModelConfig& c, int ranks) {
  const DecoderWeights whole = materialize_plan(plan, c);
  const TensorParallelLayout t = plan_tensor_parallel(c, ranks);
  const ModelConfig& l = t.local;
  EXPECT_EQ(l.n_heads * ranks, c.n_heads);
  EXPECT_EQ(l.ffn_hidden * ranks, c.ffn_hidden);
  EXPECT_EQ(l.vocab_size, c.vocab_size);
  int64_t vocab = 0;
  for (int r = 0; r < ranks; ++r) {
    SCOPED_TRACE(fmt::format("rank {} of {}", r, ranks));
    const WeightPlan shard = shard_plan(plan, c, t, r);
    const DecoderWeights w = materialize_plan(shard, l);
    const int64_t hd = c.head_dim, q0 = t.q_head_begin(r) * hd, nq = l.n_heads * hd;
    const int64_t k0 = t.kv_head_begin(r) * hd, nk = l.n_kv_heads * hd, f0 = t.ffn_begin(r), nf = l.ffn_hidden;
    // The KV heads a rank holds are the ones its query heads read (GQA grouping).
    const int group = c.n_heads / c.n_kv_heads;
    EXPECT_EQ(t.kv_head_begin(r), t.q_head_begin(r) / group);
    for (int i = 0; i < c.n_layers; ++i) {
      const LayerWeights &a = w.layers[i], &b = whole.layers[i];
      const std::string L = fmt::format("layer {} ", i);
      expect_equal(a.wq, block(b.wq, q0, nq), L + "wq");
      expect_equal(a.wk, block(b.wk, k0, nk), L + "wk");
      expect_equal(a.wv, block(b.wv, k0, nk), L + "wv");
      expect_equal(a.wo, block(b.wo, 0, c.hidden, q0, nq), L + "wo");
      if (!b.bq.empty()) {
        expect_equal(a.bq, block(b.bq, q0, nq), L + "bq");
        expect_equal(a.bk, block(b.bk, k0, nk), L + "bk");
      }
      if (!b.w_gate.empty()) expect_equal(a.w_gate, block(b.w_gate, f0, nf), L + "w_gate");
      expect_equal(a.w_up, block(b.w_up, f0, nf), L + "w_up");
      expect_equal(a.w_down, block(b.w_down, 0, c.hidden, f0, nf), L + "w_down");
      // Row-parallel biases: added once, by rank 0, after the all-reduce.
      EXPECT_EQ(a.bo.empty(), b.bo.empty() || r != 0) << L;
      EXPECT_EQ(a.b_down.empty(), b.b_down.empty() || r != 0) << L;
      expect_equal(a.attn_norm, b.attn_norm, L + "attn_norm");  // replicated
    }
    expect_equal(w.tok_embeddings, whole.tok_embeddings, "tok_embeddings");
    const Tensor& head = whole.lm_head.empty() ? whole.tok_embeddings : whole.lm_head;
    expect_equal(w.lm_head, block(head, t.vocab_begin(r), t.vocab_rows(r)), "lm_head");
    vocab += t.vocab_rows(r);
  }
  EXPECT_EQ(vocab, c.vocab_size);  // every vocabulary row on exactly one rank
}

TEST(TensorParallel, RandomModelsSplitIntoTheirSlices) {
  for (const char* recipe : {"llama", "llama-tied", "chatglm"}) {
    SCOPED_TRACE(recipe);
    const ModelConfig c = test::tiny(recipe, 64);
    const DecoderWeights w = test::random_weights(c);
    const WeightPlan plan = plan_from_weights(w, c);
    expect_shards_are_slices(plan, c, 2);
    expect_shards_are_slices(plan, c, 4);  // 2 KV heads (chatglm: 1) over 4 ranks: replicated
  }
}

TEST(TensorParallel, HfFixturesSplitIntoTheirSlices) {
  const fs::path root(test::fixture("hf"));
  int checked = 0;
  for (const auto& e : fs::directory_iterator(root)) {
    if (!e.is_directory() || !fs::exists(e.path() / "config.json")) continue;
    const PlannedModel m = plan_model(e.path().string());
    const ModelConfig& c = m.config();
    if (c.has_moe()) {
      EXPECT_THROW(plan_tensor_parallel(c, 2), Error);  // refused by name
      continue;
    }
    if (c.embedding_dim() != c.hidden || c.n_heads % 2 != 0 || c.ffn_hidden % 2 != 0) continue;
    SCOPED_TRACE(e.path().filename().string());
    expect_shards_are_slices(m.plan, c, 2);
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

TEST(TensorParallel, GgufOfEveryStoredTypeSplitsIntoItsSlices) {
  // Column slices cut some K-quant blocks (128 of 256 columns): those rows are dequantized on the
  // host and cut there; whole-block slices are read in place.
  const auto dir = test::scratch_dir("tensor_parallel_gguf");
  const std::string path = (dir / "tiny.gguf").string();
  test::write_tiny_llama_gguf(path);
  auto file = std::make_shared<const gguf::GgufFile>(gguf::GgufFile::open(path));
  const ModelConfig c = llama_config_from_gguf(*file);
  const WeightPlan plan = plan_llama_gguf(file, c);
  expect_shards_are_slices(plan, c, 2);
  const TensorParallelLayout t = plan_tensor_parallel(c, 2);
  const WeightPlan shard = shard_plan(plan, c, t, 1);
  int in_place = 0, host = 0;
  for (const PlannedTensor& p : shard.tensors) {
    if (p.slot != WeightSlot::Wo && p.slot != WeightSlot::WDown) continue;
    if (p.stored_cols > 0) ++in_place;
    else if (p.src.data == nullptr) ++host;
  }
  EXPECT_GT(in_place, 0);
  EXPECT_GT(host, 0);
  fs::remove_all(dir);
}

TEST(TensorParallel, RefusesModelsThatDoNotSplit) {
  ModelConfig c = test::tiny("llama", 64);  // 4 heads, 2 KV heads, FFN 776
  EXPECT_NO_THROW(plan_tensor_parallel(c, 1));
  EXPECT_NO_THROW(plan_tensor_parallel(c, 4));
  expect_error([&] { plan_tensor_parallel(c, 3); }, "4 attention heads do not split evenly over 3 GPUs");
  expect_error([&] { plan_tensor_parallel(c, 0); }, "must be in [1, 64]");
  c.n_heads = 12;
  c.n_kv_heads = 3;
  c.hidden = 12 * 64;
  expect_error([&] { plan_tensor_parallel(c, 2); }, "3 KV heads");
  c = test::tiny("llama", 64);
  c.ffn_hidden = 777;
  expect_error([&] { plan_tensor_parallel(c, 2); }, "FFN width 777");
  // SmolLM2-135M, the default model: 9 heads.
  c.n_heads = 9;
  c.n_kv_heads = 3;
  expect_error([&] { plan_tensor_parallel(c, 2); }, "9 attention heads");
}

}  // namespace
}  // namespace fdpp
