// Tests of the safetensors reader (src/io/safetensors.h) and of open_hf_weights (directory
// resolution, indexes, shards; src/io/hf_weights.cpp): files written by the safetensors package
// (tests/fixtures/torch_bin/st_*, made by make_fixtures.py), files built here with exact F32/F16/
// BF16 bit patterns, and hostile headers and indexes, each of which must throw fdpp::Error.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "fdpp/error.h"
#include "io/safetensors.h"
#include "io/weight_source.h"
#include "test_util.h"

namespace fdpp::safetensors {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Bytes = std::vector<uint8_t>;

// ---------------------------------------------------------------------------------------------
// Helpers

Bytes make_file(const std::string& header, const Bytes& data, size_t pad_to = 8) {
  std::string h = header;
  while (pad_to > 1 && (8 + h.size()) % pad_to != 0) h += ' ';  // the reference writer pads with spaces
  Bytes out(8 + h.size() + data.size());
  const uint64_t n = h.size();
  std::memcpy(out.data(), &n, 8);
  std::copy(h.begin(), h.end(), out.begin() + 8);
  std::copy(data.begin(), data.end(), out.begin() + 8 + static_cast<std::ptrdiff_t>(h.size()));
  return out;
}

Bytes u16_bytes(const std::vector<uint16_t>& v) {
  Bytes b(v.size() * 2);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

Bytes f32_bytes(const std::vector<float>& v) {
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Expects fdpp::Error whose message contains `needle` and is one line.
template <class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing: " << needle;
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected to contain: " << needle;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << "multi-line message: " << msg;
  }
}

void expect_bad(const Bytes& file, const std::string& needle) {
  expect_error([&] { (void)SafetensorsFile::from_bytes("bad.safetensors", file); }, needle);
}

void expect_bad_header(const std::string& header, const std::string& needle, const Bytes& data = Bytes(64)) {
  expect_bad(make_file(header, data), needle);
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("fdpp_st_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

void write_bytes(const fs::path& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

using test::write_text;

json load_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

// Checks every tensor of `expected` (name -> {dtype, shape, values?}) against a source: values
// exactly (the fixtures hold values that F16/BF16/F32 represent exactly).
void check_against(const WeightSource& w, const json& expected) {
  EXPECT_EQ(w.tensors().size(), expected.size());
  for (const auto& [name, e] : expected.items()) {
    const SourceTensor* t = w.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, e["dtype"].get<std::string>()) << name;
    EXPECT_EQ(t->shape, e["shape"].get<std::vector<int64_t>>()) << name;
    uint64_t numel = 1;
    for (int64_t d : t->shape) numel *= static_cast<uint64_t>(d);
    std::vector<float> out(numel, NAN);
    if (!e.contains("values")) {
      expect_error([&] { w.read_f32(*t, out); }, "dtype " + t->dtype + " not supported");
      continue;
    }
    w.read_f32(*t, out);
    const auto values = e["values"].get<std::vector<double>>();
    ASSERT_EQ(values.size(), out.size()) << name;
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], static_cast<float>(values[i])) << name << "[" << i << "]";
  }
}

// ---------------------------------------------------------------------------------------------
// Reading

TEST(Safetensors, ReadsFilesWrittenByTheSafetensorsPackage) {
  const std::string path = test::fixture("torch_bin/st_single/model.safetensors");
  const SafetensorsFile f = SafetensorsFile::open(path);
  const json expected = load_json(test::fixture("torch_bin/st_single/expected.json"));
  ASSERT_EQ(f.tensors().size(), expected.size());
  EXPECT_EQ(f.metadata().at("format"), "pt");
  uint64_t prev_end = 0;
  for (const TensorInfo& t : f.tensors()) {  // in file order, inside the file
    EXPECT_GE(t.offset, f.data_offset());
    EXPECT_GE(t.offset, prev_end);
    prev_end = t.offset + t.n_bytes;
    EXPECT_LE(prev_end, f.file_size());
    const json& e = expected.at(t.name);
    EXPECT_EQ(t.dtype, e["dtype"].get<std::string>());
    EXPECT_EQ(t.shape, e["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(t.n_bytes, t.n_elements * hf::dtype_bits(t.dtype) / 8);
    std::vector<float> out(t.n_elements, NAN);
    if (!e.contains("values")) {
      expect_error([&] { f.read_f32(t, out); }, "dtype " + t.dtype + " not supported");
      continue;
    }
    f.read_f32(t, out);
    const auto values = e["values"].get<std::vector<double>>();
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], static_cast<float>(values[i])) << t.name << "[" << i << "]";
  }
  ASSERT_NE(f.find("scalar"), nullptr);
  EXPECT_TRUE(f.find("scalar")->shape.empty());
  EXPECT_EQ(f.find("scalar")->n_elements, 1u);
  EXPECT_EQ(f.find("empty")->n_elements, 0u);
  EXPECT_EQ(f.find("nope"), nullptr);
}

TEST(Safetensors, ConvertsF16BF16F32Exactly) {
  // F16: 1, -2, max, smallest subnormal, -0, +inf, 1/3 rounded, largest subnormal.
  const std::vector<uint16_t> h = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x7C00, 0x3555, 0x03FF};
  const std::vector<float> h_ref = {1.0f, -2.0f, 65504.0f, std::ldexp(1.0f, -24), -0.0f, INFINITY,
                                    0.333251953125f, std::ldexp(1023.0f, -24)};
  // BF16: 1, pi rounded, smallest subnormal, -inf, largest finite, -0.5.
  const std::vector<uint16_t> b = {0x3F80, 0x4049, 0x0001, 0xFF80, 0x7F7F, 0xBF00};
  const std::vector<float> b_ref = {1.0f, 3.140625f, from_bits(0x00010000u), -INFINITY, from_bits(0x7F7F0000u), -0.5f};
  std::vector<float> f32 = test::random_vector(7);
  f32.push_back(std::numeric_limits<float>::denorm_min());
  f32.push_back(-std::numeric_limits<float>::max());

  Bytes data = u16_bytes(h);
  const uint64_t b_off = data.size();
  const Bytes bb = u16_bytes(b);
  data.insert(data.end(), bb.begin(), bb.end());
  const uint64_t f_off = data.size();
  const Bytes fb = f32_bytes(f32);
  data.insert(data.end(), fb.begin(), fb.end());
  const json header = {
      {"h", {{"dtype", "F16"}, {"shape", {2, 4}}, {"data_offsets", {0, b_off}}}},
      {"b", {{"dtype", "BF16"}, {"shape", {6}}, {"data_offsets", {b_off, f_off}}}},
      {"f", {{"dtype", "F32"}, {"shape", {f32.size()}}, {"data_offsets", {f_off, data.size()}}}},
  };
  // An odd header length puts the tensors at unaligned addresses: the reader must not care.
  const SafetensorsFile file = SafetensorsFile::from_bytes("exact.safetensors", make_file(header.dump() + " ", data, 1));
  EXPECT_NE(file.data_offset() % 2, 0u);

  std::vector<float> out(8);
  file.read_f32(*file.find("h"), out);
  for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(bits(out[i]), bits(h_ref[i])) << "F16 " << i;
  out.assign(6, NAN);
  file.read_f32(*file.find("b"), out);
  for (size_t i = 0; i < b.size(); ++i) EXPECT_EQ(bits(out[i]), bits(b_ref[i])) << "BF16 " << i;
  out.assign(f32.size(), NAN);
  file.read_f32(*file.find("f"), out);
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(bits(out[i]), bits(f32[i])) << "F32 " << i;
  // A NaN stays a NaN.
  std::vector<float> one(1);
  hf::to_f32("F16", u16_bytes({0x7E00}).data(), one.data(), 1);
  EXPECT_TRUE(std::isnan(one[0]));
  hf::to_f32("BF16", u16_bytes({0xFFC1}).data(), one.data(), 1);
  EXPECT_TRUE(std::isnan(one[0]));

  expect_error([&] { file.read_f32(*file.find("h"), std::span<float>(out.data(), 3)); }, "destination holds 3");
}

TEST(Safetensors, LargeTensorsConvertInParallelToTheSameValues) {
  // Above the OpenMP threshold; every F16 and BF16 bit pattern, twice over.
  const size_t n = 131072;
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint16_t>(i);
  const Bytes data = u16_bytes(v);
  for (const char* dtype : {"F16", "BF16"}) {
    const json header = {{"t", {{"dtype", dtype}, {"shape", {256, 512}}, {"data_offsets", {0, data.size()}}}}};
    const SafetensorsFile f = SafetensorsFile::from_bytes("big.safetensors", make_file(header.dump(), data));
    std::vector<float> out(n, -1.0f);
    f.read_f32(*f.find("t"), out);
    for (size_t i = 0; i < n; ++i) {
      const float ref = std::string(dtype) == "F16" ? fp16_to_f32(v[i]) : bf16_to_f32(v[i]);
      if (std::isnan(ref)) ASSERT_TRUE(std::isnan(out[i])) << dtype << " " << i;
      else ASSERT_EQ(bits(out[i]), bits(ref)) << dtype << " " << i;
    }
  }
}

TEST(Safetensors, ListsEveryKnownDtypeButReadsOnlyFloats) {
  const json header = {
      {"__metadata__", {{"format", "pt"}, {"note", "x"}}},
      {"i64", {{"dtype", "I64"}, {"shape", {2}}, {"data_offsets", {0, 16}}}},
      {"bool", {{"dtype", "BOOL"}, {"shape", {3}}, {"data_offsets", {16, 19}}}},
      {"f8", {{"dtype", "F8_E4M3"}, {"shape", {2}}, {"data_offsets", {19, 21}}}},
      {"f64", {{"dtype", "F64"}, {"shape", {1}}, {"data_offsets", {24, 32}}}},
      {"f4", {{"dtype", "F4"}, {"shape", {4}}, {"data_offsets", {32, 34}}}},
  };
  const SafetensorsFile f = SafetensorsFile::from_bytes("types.safetensors", make_file(header.dump(), Bytes(40)));
  EXPECT_EQ(f.metadata().size(), 2u);
  std::vector<std::string> order;
  for (const TensorInfo& t : f.tensors()) order.push_back(t.name);
  EXPECT_EQ(order, (std::vector<std::string>{"i64", "bool", "f8", "f64", "f4"}));  // file order
  for (const TensorInfo& t : f.tensors()) {
    std::vector<float> out(t.n_elements);
    expect_error([&] { f.read_f32(t, out); }, "dtype " + t.dtype + " not supported");
  }
}

// ---------------------------------------------------------------------------------------------
// Hostile files

TEST(Safetensors, RejectsBadHeaderLengths) {
  expect_bad({}, "empty file");
  expect_bad({1, 2, 3}, "only 3 bytes");
  Bytes huge(16, 0);
  const uint64_t big = uint64_t{1} << 62;
  std::memcpy(huge.data(), &big, 8);
  expect_bad(huge, "larger than the 100000000 bytes");
  Bytes past = make_file("{}", {});
  const uint64_t n = 1000;
  std::memcpy(past.data(), &n, 8);
  expect_bad(past, "runs past the end of the file");
  Bytes just_over(8 + 100);
  const uint64_t hundred_one = 101;
  std::memcpy(just_over.data(), &hundred_one, 8);
  expect_bad(just_over, "runs past the end of the file");
  expect_bad(make_file("[1,2]", {}), "does not start with '{'");
  expect_bad(make_file("{", {}, 1), "cannot hold a JSON object");
  expect_bad(make_file("{ ", {}, 1), "not valid JSON");
}

TEST(Safetensors, RejectsBadJson) {
  expect_bad_header("{\"a\": {\"dtype\": \"F32\",}", "not valid JSON");
  expect_bad_header("{\"a\": \"\x01\n\"}", "not valid JSON");   // control bytes: escaped, one line
  expect_bad_header("{\"a\": \"\xff\xfe\"}", "not valid JSON");  // not UTF-8
  expect_bad_header("{} trailing", "not valid JSON");
  std::string deep = "{\"a\":";
  for (int i = 0; i < 100000; ++i) deep += "[";
  expect_bad_header(deep, "");  // deep nesting: an error (depth or syntax), not a stack overflow
  std::string nested = "{\"a\": {\"dtype\": [[[[[[1]]]]]]}}";
  expect_bad_header(nested, "nests deeper than");
}

TEST(Safetensors, RejectsBadTensorEntries) {
  const auto entry = [](const json& e) { return json{{"t", e}}.dump(); };
  expect_bad_header(entry({{"dtype", "Q4"}, {"shape", {2}}, {"data_offsets", {0, 8}}}), "unknown dtype 'Q4'");
  expect_bad_header(entry({{"dtype", 3}, {"shape", {2}}, {"data_offsets", {0, 8}}}), "dtype is a number");
  expect_bad_header(entry({{"shape", {2}}, {"data_offsets", {0, 8}}}), "has no dtype");
  expect_bad_header(entry({{"dtype", "F32"}, {"data_offsets", {0, 8}}}), "has no shape");
  expect_bad_header(entry({{"dtype", "F32"}, {"shape", {2}}}), "has no data_offsets");
  expect_bad_header(entry({{"dtype", "F32"}, {"shape", {-2}}, {"data_offsets", {0, 8}}}), "negative number -2");
  expect_bad_header(entry({{"dtype", "F32"}, {"shape", {2.5}}, {"data_offsets", {0, 8}}}), "non-integer number");
  expect_bad_header(entry({{"dtype", "F32"}, {"shape", 2}, {"data_offsets", {0, 8}}}), "not an array");
  expect_bad_header(
      entry({{"dtype", "F32"}, {"shape", {uint64_t{1} << 32, uint64_t{1} << 32, 2}}, {"data_offsets", {0, 8}}}),
      "more elements than 2^64");
  expect_bad_header(entry({{"dtype", "F32"}, {"shape", {uint64_t{1} << 62}}, {"data_offsets", {0, 8}}}),
                    "needs more than 2^64 bits");
  expect_bad_header(entry({{"dtype", "F4"}, {"shape", {3}}, {"data_offsets", {0, 2}}}), "do not fill whole bytes");
  expect_bad_header(entry({{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0}}}), "not an array of two offsets");
  expect_bad_header(entry({{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {-8, 0}}}), "are not non-negative");
  expect_bad_header(entry({{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {8, 0}}}), "end before they begin");
  expect_bad_header(entry({{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {60, 68}}}), "run past the end of the data");
  expect_bad_header(entry({{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 12}}}),
                    "span 12 bytes, but shape [2] of F32 needs 8");
  expect_bad_header(entry({{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 4}}}), "span 4 bytes");
  expect_bad_header(entry("x"), "not an object");
  expect_bad_header(json{{"", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {0, 4}}}}}.dump(), "empty name");
  expect_bad_header(json{{"__metadata__", {{"k", 1}}}}.dump(), "__metadata__ entry 'k' is a number");
  expect_bad_header(json{{"__metadata__", "x"}}.dump(), "__metadata__ is a string");
}

TEST(Safetensors, RejectsOverlapsAndDuplicates) {
  const json overlap = {
      {"a", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}}},
      {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {8, 16}}}},
  };
  expect_bad_header(overlap.dump(), "overlap");
  const json same = {
      {"a", {{"dtype", "F16"}, {"shape", {2}}, {"data_offsets", {4, 8}}}},
      {"b", {{"dtype", "F16"}, {"shape", {2}}, {"data_offsets", {4, 8}}}},
  };
  expect_bad_header(same.dump(), "overlap");
  const json inside = {
      {"a", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 16}}}},
      {"z", {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {8, 8}}}},
  };
  expect_bad_header(inside.dump(), "overlap");
  const json adjacent = {
      {"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
      {"b", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {8, 16}}}},
      {"e", {{"dtype", "F32"}, {"shape", {0}}, {"data_offsets", {16, 16}}}},
  };
  EXPECT_NO_THROW((void)SafetensorsFile::from_bytes("ok.safetensors", make_file(adjacent.dump(), Bytes(16))));
  expect_bad_header(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                         "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
                    "names tensor 'a' twice");
}

TEST(Safetensors, EveryTruncationIsAnError) {
  const json header = {
      {"w", {{"dtype", "BF16"}, {"shape", {3, 2}}, {"data_offsets", {0, 12}}}},
      {"v", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {12, 20}}}},
  };
  const Bytes file = make_file(header.dump(), Bytes(20, 0x3f));
  EXPECT_NO_THROW((void)SafetensorsFile::from_bytes("t.safetensors", file));
  for (size_t n = 0; n < file.size(); ++n)
    expect_error([&] { (void)SafetensorsFile::from_bytes("t.safetensors", Bytes(file.begin(), file.begin() + n)); },
                 "t.safetensors: ");
}

TEST(Safetensors, RandomCorruptionNeverCrashes) {
  const json header = {
      {"__metadata__", {{"format", "pt"}}},
      {"w", {{"dtype", "F16"}, {"shape", {3, 2}}, {"data_offsets", {0, 12}}}},
      {"v", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {12, 20}}}},
  };
  const Bytes file = make_file(header.dump(), Bytes(20, 0x3c));
  std::uniform_int_distribution<size_t> pos(0, file.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 3000; ++i) {
    Bytes b = file;
    for (int k = 0; k < 1 + i % 3; ++k) b[pos(test::rng())] = static_cast<uint8_t>(byte(test::rng()));
    try {
      const SafetensorsFile f = SafetensorsFile::from_bytes("c.safetensors", b);
      for (const TensorInfo& t : f.tensors()) {
        ASSERT_LE(t.offset + t.n_bytes, b.size());
        std::vector<float> out(t.n_elements);
        if (hf::dtype_readable(t.dtype)) f.read_f32(t, out);
      }
    } catch (const Error& e) {
      ASSERT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
}

TEST(Safetensors, OpenReportsMissingFiles) {
  expect_error([] { (void)SafetensorsFile::open("/nonexistent/model.safetensors"); }, "/nonexistent/model.safetensors");
}

// ---------------------------------------------------------------------------------------------
// open_hf_weights

TEST(HfWeights, OpensASingleSafetensorsFile) {
  TempDir d;
  fs::copy_file(test::fixture("torch_bin/st_single/model.safetensors"), d.path / "model.safetensors");
  const auto w = open_hf_weights(d.str());
  EXPECT_EQ(w->format(), "safetensors");
  EXPECT_EQ(w->origin(), d.str());
  check_against(*w, load_json(test::fixture("torch_bin/st_single/expected.json")));
  for (const SourceTensor& t : w->tensors()) EXPECT_EQ(t.file, (d.path / "model.safetensors").string());
  EXPECT_EQ(w->find("missing"), nullptr);
  // The file itself works too.
  EXPECT_EQ(open_hf_weights((d.path / "model.safetensors").string())->tensors().size(), w->tensors().size());
}

TEST(HfWeights, OpensShardedSafetensors) {
  const std::string dir = test::fixture("torch_bin/st_sharded");
  const auto w = open_hf_weights(dir);
  EXPECT_EQ(w->format(), "safetensors");
  ASSERT_EQ(w->tensors().size(), 3u);
  EXPECT_EQ(w->find("a.weight")->file, dir + "/model-00001-of-00002.safetensors");
  EXPECT_EQ(w->find("b.weight")->file, dir + "/model-00002-of-00002.safetensors");
  const json st = load_json(test::fixture("torch_bin/st_single/expected.json"));
  check_against(*w, json{{"a.weight", st["f32"]}, {"b.weight", st["f16"]}, {"c.bias", st["scalar"]}});
}

TEST(HfWeights, PrefersSafetensorsAndReportsWhatItLookedFor) {
  TempDir d;
  expect_error([&] { (void)open_hf_weights(d.str()); },
               d.str() + ": no weights found (looked for model.safetensors, model.safetensors.index.json, "
                         "pytorch_model.bin, pytorch_model.bin.index.json)");
  expect_error([&] { (void)open_hf_weights(d.str() + "/nope"); }, "no such file or directory");
  fs::copy_file(test::fixture("torch_bin/tiny/pytorch_model.bin"), d.path / "pytorch_model.bin");
  EXPECT_EQ(open_hf_weights(d.str())->format(), "pytorch");
  fs::copy_file(test::fixture("torch_bin/st_single/model.safetensors"), d.path / "model.safetensors");
  EXPECT_EQ(open_hf_weights(d.str())->format(), "safetensors");
}

// A directory with an index over two shards; the index text is the test's.
struct ShardedDir {
  TempDir d;
  ShardedDir() {
    fs::copy_file(test::fixture("torch_bin/st_sharded/model-00001-of-00002.safetensors"),
                  d.path / "model-00001-of-00002.safetensors");
    fs::copy_file(test::fixture("torch_bin/st_sharded/model-00002-of-00002.safetensors"),
                  d.path / "model-00002-of-00002.safetensors");
  }
  void index(const json& weight_map) { write_text(d.path / "model.safetensors.index.json", json{{"weight_map", weight_map}}.dump()); }
};

TEST(HfWeights, RejectsIndexesNamingFilesOutsideTheDirectory) {
  for (const std::string bad : {"../model-00001-of-00002.safetensors", "/etc/passwd", "a/../b.safetensors",
                                "./model-00001-of-00002.safetensors", "", "sub//x.safetensors", "..\\x.safetensors"}) {
    ShardedDir s;
    s.index({{"a.weight", bad}});
    expect_error([&] { (void)open_hf_weights(s.d.str()); }, "which is not a file inside");
  }
}

TEST(HfWeights, RejectsMissingShards) {
  ShardedDir s;
  fs::remove(s.d.path / "model-00002-of-00002.safetensors");
  s.index({{"a.weight", "model-00001-of-00002.safetensors"}, {"b.weight", "model-00002-of-00002.safetensors"}});
  expect_error([&] { (void)open_hf_weights(s.d.str()); },
               s.d.str() + ": shard model-00002-of-00002.safetensors named by model.safetensors.index.json is missing");
}

TEST(HfWeights, RejectsIndexesThatDisagreeWithTheShards) {
  {
    ShardedDir s;  // b.weight is in shard 2
    s.index({{"a.weight", "model-00001-of-00002.safetensors"}, {"b.weight", "model-00001-of-00002.safetensors"},
             {"c.bias", "model-00002-of-00002.safetensors"}});
    expect_error([&] { (void)open_hf_weights(s.d.str()); }, "puts tensor 'b.weight' in model-00001-of-00002.safetensors, but it is in");
  }
  {
    ShardedDir s;
    s.index({{"a.weight", "model-00001-of-00002.safetensors"}, {"ghost", "model-00002-of-00002.safetensors"}});
    expect_error([&] { (void)open_hf_weights(s.d.str()); }, "puts tensor 'ghost' in model-00002-of-00002.safetensors, which does not hold it");
  }
  {
    ShardedDir s;  // the same tensor in two shards
    fs::copy_file(s.d.path / "model-00001-of-00002.safetensors", s.d.path / "copy.safetensors");
    s.index({{"a.weight", "model-00001-of-00002.safetensors"}, {"x", "copy.safetensors"}});
    expect_error([&] { (void)open_hf_weights(s.d.str()); }, "tensor 'a.weight' is in both");
  }
  {
    ShardedDir s;  // valid: the tensors of shards the index does not list in full are still served
    s.index({{"a.weight", "model-00001-of-00002.safetensors"}, {"b.weight", "model-00002-of-00002.safetensors"}});
    EXPECT_EQ(open_hf_weights(s.d.str())->tensors().size(), 3u);
  }
}

TEST(HfWeights, RejectsBadIndexFiles) {
  ShardedDir s;
  const fs::path index = s.d.path / "model.safetensors.index.json";
  const auto bad = [&](const std::string& text, const std::string& needle) {
    write_text(index, text);
    expect_error([&] { (void)open_hf_weights(s.d.str()); }, needle);
  };
  bad("", "empty file");
  bad("{\"weight_map\": ", "not valid JSON");
  bad("[]", "not an object");
  bad("{}", "has no weight_map");
  bad("{\"weight_map\": []}", "weight_map is a array");
  bad("{\"weight_map\": {}}", "names no tensors");
  bad("{\"weight_map\": {\"a\": 1}}", "weight_map entry 'a' is a number");
}

TEST(HfWeights, PassesShardErrorsThrough) {
  ShardedDir s;
  write_bytes(s.d.path / "model-00002-of-00002.safetensors", Bytes{1, 2, 3});
  s.index({{"a.weight", "model-00001-of-00002.safetensors"}, {"b.weight", "model-00002-of-00002.safetensors"}});
  expect_error([&] { (void)open_hf_weights(s.d.str()); }, "model-00002-of-00002.safetensors: not a safetensors file");
}

}  // namespace
}  // namespace fdpp::safetensors
