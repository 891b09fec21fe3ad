#include "core/npy.h"
#include "fdpp/error.h"
#include "test_util.h"

namespace fdpp {
namespace {

TEST(Npy, RoundTripsThroughTheReader) {
  const auto data = test::random_vector(3 * 7);
  const std::string path = testing::TempDir() + "/fdpp_npy_test.npy";
  write_npy_f32(path, {3, 7}, data);
  const auto a = test::read_npy(path);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{3, 7}));
  EXPECT_EQ(a.data, data);
  write_npy_f32(path, {5}, std::span<const float>(data.data(), 5));
  EXPECT_EQ(test::read_npy(path).shape, (std::vector<int64_t>{5}));
}

TEST(Npy, UnwritablePathIsAnErrorAndLeavesNothing) {
  const std::vector<float> d{1.f};
  EXPECT_THROW(write_npy_f32("/nonexistent-dir/x.npy", {1}, d), Error);
  EXPECT_THROW(write_npy_f32(testing::TempDir() + "/y.npy", {2}, d), Error);  // shape mismatch
}

}  // namespace
}  // namespace fdpp
