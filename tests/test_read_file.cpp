// Bounded whole-file reads (src/core/read_file.h) and the readers built on them: a directory, a
// missing file, an endless device and a stream one byte over the bound are each one-line errors.
#include <gtest/gtest.h>

#include <sstream>

#include "attention/calibration.h"
#include "core/read_file.h"
#include "engine/dispatch_table.h"
#include "engine/prompt_file.h"
#include "io/json_file.h"
#include "test_util.h"

namespace fdpp {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

TEST(ReadFile, TheBoundIsExact) {
  // Past a chunk (1 MiB) on purpose: the bound must hold across chunks.
  std::istringstream exact(std::string(2 * kMiB, 'x'));
  EXPECT_EQ(read_all(exact, 2 * kMiB, "exact").size(), 2 * kMiB);
  std::istringstream over(std::string(2 * kMiB + 1, 'x'));
  EXPECT_EQ(test::error_of([&] { read_all(over, 2 * kMiB, "over"); }),
            "over: longer than 2 MiB (the most fdpp reads from it)");
  std::istringstream empty("");
  EXPECT_EQ(read_all(empty, kMiB, "empty"), "");
}

TEST(ReadFile, DirectoriesMissingFilesAndEndlessDevices) {
  const auto d = test::scratch_dir("read_file");
  EXPECT_EQ(test::error_of([&] { read_file(d.string(), kMiB, "the list"); }),
            d.string() + ": is a directory, not the list");
  EXPECT_EQ(test::error_of([&] { read_file((d / "none").string(), kMiB, "the list"); }),
            (d / "none").string() + ": cannot open the list (No such file or directory)");
  EXPECT_EQ(test::error_of([&] { read_file("/dev/zero", kMiB, "the list"); }),
            "/dev/zero: longer than 1 MiB (the most fdpp reads from it)");
  test::write_text(d / "ok.txt", "two\nlines\n");
  EXPECT_EQ(read_file((d / "ok.txt").string(), kMiB, "the list"), "two\nlines\n");
}

TEST(ReadFile, EveryReaderNamesADirectory) {
  const auto d = test::scratch_dir("read_file_readers");
  const std::string p = d.string();
  EXPECT_EQ(test::error_of([&] { read_prompt_file(p); }), p + ": is a directory, not the prompts file");
  EXPECT_EQ(test::error_of([&] { read_calibration(p); }), p + ": is a directory, not the calibration file");
  EXPECT_EQ(test::error_of([&] { read_dispatch_file(p); }), p + ": is a directory, not the dispatch table");
  EXPECT_EQ(test::error_of([&] { read_json_file(p); }), p + ": is a directory, not a JSON file");
  // An endless device as a JSON file stops at the JSON bound, not at the end of memory.
  EXPECT_EQ(test::error_of([] { read_calibration("/dev/zero"); }),
            fmt::format("/dev/zero: longer than {} MiB (the most fdpp reads from it)", kMaxJsonFileBytes >> 20));
}

}  // namespace
}  // namespace fdpp
