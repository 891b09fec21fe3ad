// The CPU backend against HF transformers on the default model (SmolLM2-135M-Instruct Q4_1):
// logits of every position (NMSE <= 1e-4) and a 32-token greedy continuation (identical ids).
// Fixtures: tests/fixtures/smollm2/, made by tests/fixtures/make_reference.py on the GPU machine.
#include <nlohmann/json.hpp>

#include <fstream>

#include "backend/cpu/cpu_runner.h"
#include "engine/generate.h"
#include "engine/sampler.h"
#include "model/model_loader.h"
#include "test_util.h"

namespace fdpp {
namespace {

class SmolLM2Reference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test::default_model_or_empty();
    if (path.empty()) return;
    model_ = new LoadedModel(load_model(path));
    std::ifstream f(test::fixture("smollm2/reference.json"));
    reference_ = new nlohmann::json(nlohmann::json::parse(f));
  }
  static void TearDownTestSuite() {
    delete model_;
    delete reference_;
    model_ = nullptr;
    reference_ = nullptr;
  }
  void SetUp() override {
    if (model_ == nullptr) GTEST_SKIP() << "default model not fetched (scripts/fetch-default-model.sh)";
  }
  static LoadedModel* model_;
  static nlohmann::json* reference_;
};

LoadedModel* SmolLM2Reference::model_ = nullptr;
nlohmann::json* SmolLM2Reference::reference_ = nullptr;

TEST_F(SmolLM2Reference, LogitsOfEveryPositionMatchTransformers) {
  for (const auto& p : (*reference_)["prompts"]) {
    const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    const auto ref = test::read_npy(test::fixture("smollm2/" + p["logits"].get<std::string>()));
    const int vocab = model_->config().vocab_size;
    ASSERT_EQ(ref.shape, (std::vector<int64_t>{static_cast<int64_t>(ids.size()), vocab}));

    CpuRunner runner(model_->config(), model_->weights, static_cast<int>(ids.size()));
    std::vector<float> logits(ids.size() * vocab);
    runner.forward(ids, 0, /*all_positions=*/true, logits);
    const double e = test::nmse(logits, ref.data);
    std::printf("prompt '%s': %zu positions, logits NMSE %.3e\n", p["text"].get<std::string>().substr(0, 24).c_str(),
                ids.size(), e);
    EXPECT_LE(e, 1e-4);
    // The argmax agrees at every position (where HF's top two are not within fp16 rounding).
    for (size_t t = 0; t < ids.size(); ++t) {
      std::span<const float> ours(&logits[t * vocab], vocab), theirs(&ref.data[t * vocab], vocab);
      std::vector<float> sorted(theirs.begin(), theirs.end());
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
      if (sorted[0] - sorted[1] > 1e-2f) EXPECT_EQ(argmax(ours), argmax(theirs)) << "position " << t;
    }
  }
}

TEST_F(SmolLM2Reference, IncrementalDecodeEqualsFullForward) {
  // The KV-cache path (one token at a time) computes the same logits as one prefill pass.
  const auto& p = (*reference_)["prompts"][1];
  const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
  const int vocab = model_->config().vocab_size;
  CpuRunner full(model_->config(), model_->weights, static_cast<int>(ids.size()));
  std::vector<float> all(ids.size() * vocab);
  full.forward(ids, 0, true, all);
  CpuRunner step(model_->config(), model_->weights, static_cast<int>(ids.size()));
  std::vector<float> one(vocab);
  step.forward(std::span<const int32_t>(ids.data(), 3), 0, false, one);  // a 3-token prefill first
  for (size_t t = 3; t < ids.size(); ++t) step.forward(std::span<const int32_t>(&ids[t], 1), static_cast<int>(t), false, one);
  std::span<const float> last(&all[(ids.size() - 1) * vocab], vocab);
  EXPECT_LE(test::nmse(one, last), 1e-10);
}

TEST_F(SmolLM2Reference, GreedyContinuationMatchesTransformers) {
  for (const auto& p : (*reference_)["prompts"]) {
    if (!p.contains("greedy_ids")) continue;
    const std::vector<int32_t> ids = p["ids"].get<std::vector<int32_t>>();
    const std::vector<int32_t> expected = p["greedy_ids"].get<std::vector<int32_t>>();
    CpuRunner runner(model_->config(), model_->weights, static_cast<int>(ids.size() + expected.size()));
    GenerateOptions opt;
    opt.max_tokens = static_cast<int>(expected.size());
    opt.ignore_eos = true;
    opt.sampling.temperature = 0;
    const GenerateResult r = generate(runner, *model_->tokenizer, ids, opt);
    EXPECT_EQ(r.tokens, expected);
    EXPECT_EQ(r.finish_reason, "length");
  }
}

TEST_F(SmolLM2Reference, PromptsTokenizeLikeTransformers) {
  for (const auto& p : (*reference_)["prompts"]) {
    const auto ids = model_->tokenizer->encode(p["rendered"].get<std::string>(), model_->tokenizer->add_bos_by_default(),
                                               /*parse_special=*/true);
    EXPECT_EQ(ids, p["ids"].get<std::vector<int32_t>>()) << p["rendered"];
    if (p["chat"].get<bool>()) {
      std::vector<ChatMessage> msgs{{"user", p["text"].get<std::string>()}};
      EXPECT_EQ(model_->tokenizer->apply_chat_template(msgs, true), p["rendered"].get<std::string>());
    }
  }
}

}  // namespace
}  // namespace fdpp
