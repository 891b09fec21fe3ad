// Tests of the PyTorch .bin reader (src/io/torch_bin.h) and its restricted unpickler
// (src/io/unpickler.h): checkpoints in torch.save's layout written by Python's own pickle and
// zipfile (tests/fixtures/torch_bin, make_fixtures.py), pickles and zips built here (minizip's
// zip writer) to reach every check, malicious pickles (nothing may run), truncations at every
// length and random corruption. Every bad input must throw a one-line fdpp::Error.
#include <gtest/gtest.h>
#include <minizip/zip.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "fdpp/error.h"
#include "io/safetensors.h"
#include "io/torch_bin.h"
#include "io/unpickler.h"
#include "io/weight_source.h"
#include "test_util.h"

namespace fdpp::torch_bin {
namespace {

using test::error_of;

namespace fs = std::filesystem;
using nlohmann::json;
using Bytes = std::vector<uint8_t>;
using torch_pickle::parse_state_dict;
using torch_pickle::StateDict;

// ---------------------------------------------------------------------------------------------
// Helpers

Bytes read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_file(const fs::path& p, const Bytes& b) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

template <class F>
void expect_error(F&& f, const std::string& needle) {
  const std::string msg = error_of(std::forward<F>(f));
  EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nexpected to contain: " << needle;
}

StateDict parse(const Bytes& pkl) { return parse_state_dict(pkl, "test.bin"); }

void expect_bad_pickle(const Bytes& pkl, const std::string& needle) {
  expect_error([&] { (void)parse(pkl); }, needle);
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("fdpp_pt_" + std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

// Pickle opcodes, written by hand the way CPython's pickler (protocol 2) writes them.
class Pickle {
 public:
  Bytes bytes;
  Pickle& op(uint8_t o) {
    bytes.push_back(o);
    return *this;
  }
  Pickle& raw(std::string_view s) {
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  Pickle& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
  Pickle& proto(int v = 2) { return op(0x80).op(static_cast<uint8_t>(v)); }
  Pickle& global(std::string_view module, std::string_view name) {
    return op('c').raw(module).raw("\n").raw(name).raw("\n");
  }
  Pickle& str(std::string_view s) { return op('X').u32(static_cast<uint32_t>(s.size())).raw(s); }
  Pickle& integer(int64_t v) {
    if (v >= 0 && v < 256) return op('K').op(static_cast<uint8_t>(v));
    if (v >= 0 && v < 65536) return op('M').op(static_cast<uint8_t>(v)).op(static_cast<uint8_t>(v >> 8));
    if (v >= INT32_MIN && v <= INT32_MAX) return op('J').u32(static_cast<uint32_t>(v));
    op(0x8a).op(8);
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
    return *this;
  }
  Pickle& mark() { return op('('); }
  Pickle& tuple() { return op('t'); }
  Pickle& ints(const std::vector<int64_t>& v) {
    mark();
    for (int64_t x : v) integer(x);
    return tuple();
  }
  Pickle& ordered_dict() { return global("collections", "OrderedDict").op(')').op('R'); }
  Pickle& stop() { return op('.'); }
};

struct TSpec {
  std::string name;
  std::string storage_class = "FloatStorage";
  std::string key = "0";
  int64_t numel = 4;
  int64_t offset = 0;
  std::vector<int64_t> shape = {4};
  std::vector<int64_t> stride = {1};
};

// Appends one tensor as torch.save writes it: _rebuild_tensor_v2(persistent storage, offset,
// size, stride, False, OrderedDict()).
void tensor(Pickle& p, const TSpec& t) {
  p.global("torch._utils", "_rebuild_tensor_v2").mark();
  p.mark().str("storage").global("torch", t.storage_class).str(t.key).str("cpu").integer(t.numel).tuple().op('Q');
  p.integer(t.offset).ints(t.shape).ints(t.stride).op(0x89).ordered_dict().tuple().op('R');
}

Bytes state_dict(const std::vector<TSpec>& tensors) {
  Pickle p;
  p.proto().ordered_dict().mark();
  for (const TSpec& t : tensors) {
    p.str(t.name);
    tensor(p, t);
  }
  p.op('u').stop();
  return p.bytes;
}

struct ZipEntry {
  std::string name;
  Bytes data;
  bool deflate = false;
};

// A zip written by minizip (a writer independent of Python's zipfile).
Bytes make_zip(const std::vector<ZipEntry>& entries) {
  TempDir d;
  const std::string path = (d.path / "x.zip").string();
  zipFile zf = zipOpen64(path.c_str(), APPEND_STATUS_CREATE);
  EXPECT_NE(zf, nullptr);
  for (const ZipEntry& e : entries) {
    zip_fileinfo zi{};
    EXPECT_EQ(zipOpenNewFileInZip64(zf, e.name.c_str(), &zi, nullptr, 0, nullptr, 0, nullptr, e.deflate ? Z_DEFLATED : 0,
                                    e.deflate ? Z_DEFAULT_COMPRESSION : 0, 0),
              ZIP_OK);
    if (!e.data.empty()) EXPECT_EQ(zipWriteInFileInZip(zf, e.data.data(), static_cast<unsigned>(e.data.size())), ZIP_OK);
    EXPECT_EQ(zipCloseFileInZip(zf), ZIP_OK);
  }
  EXPECT_EQ(zipClose(zf, nullptr), ZIP_OK);
  return read_file(path);
}

Bytes f32_bytes(const std::vector<float>& v) {
  Bytes b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A torch.save-like zip: archive/data.pkl, byteorder, the storages, version.
Bytes torch_zip(const Bytes& pkl, const std::vector<std::pair<std::string, Bytes>>& storages,
                const std::string& archive = "archive") {
  std::vector<ZipEntry> e = {{archive + "/data.pkl", pkl}, {archive + "/byteorder", {'l', 'i', 't', 't', 'l', 'e'}}};
  for (const auto& [key, data] : storages) e.push_back({archive + "/data/" + key, data});
  e.push_back({archive + "/version", {'3', '\n'}});
  return make_zip(e);
}

TorchBinFile open_bytes(const Bytes& b) { return TorchBinFile::from_bytes("test.bin", b); }

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

void check_against(const TorchBinFile& f, const json& expected) {
  ASSERT_EQ(f.tensors().size(), expected.size());
  for (const auto& [name, e] : expected.items()) {
    const TensorRecord* t = f.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, e["dtype"].get<std::string>()) << name;
    EXPECT_EQ(t->shape, e["shape"].get<std::vector<int64_t>>()) << name;
    std::vector<float> out(t->n_elements, NAN);
    if (!e.contains("values")) {
      expect_error([&] { f.read_f32(*t, out); }, "tensor '" + name + "': dtype " + t->dtype + " not supported");
      continue;
    }
    f.read_f32(*t, out);
    const auto values = e["values"].get<std::vector<double>>();
    ASSERT_EQ(values.size(), out.size()) << name;
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], static_cast<float>(values[i])) << name << "[" << i << "]";
  }
}

// ---------------------------------------------------------------------------------------------
// Reading

TEST(TorchBin, ReadsACheckpointInTorchSaveLayout) {
  const TorchBinFile f = TorchBinFile::open(test::fixture("torch_bin/tiny/pytorch_model.bin"));
  EXPECT_EQ(f.archive_name(), "pytorch_model");
  check_against(f, json::parse(std::ifstream(test::fixture("torch_bin/tiny/expected.json"))));
  // The state dict's order, and what the views are.
  std::vector<std::string> names;
  for (const TensorRecord& t : f.tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"model.w", "model.h", "model.b", "model.ids", "model.embed.weight",
                                             "lm_head.weight", "model.w_t", "model.w_row1", "model.scale",
                                             "model.empty"}));
  EXPECT_TRUE(f.find("model.w")->contiguous());
  EXPECT_FALSE(f.find("model.w_t")->contiguous());
  EXPECT_TRUE(f.find("model.w_row1")->contiguous());  // size-1 dimension: its stride does not matter
  EXPECT_EQ(f.find("lm_head.weight")->storage_key, f.find("model.embed.weight")->storage_key);
  EXPECT_EQ(f.find("model.h")->storage_offset, 2u);
  EXPECT_EQ(f.storage_bytes("0").size(), 48u);
  // Storage data is used in place, 64-byte aligned as torch writes it.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.storage_bytes("0").data()) % 64, 0u);
  EXPECT_EQ(f.find("nope"), nullptr);
  std::vector<float> small(3);
  expect_error([&] { f.read_f32(*f.find("model.w"), small); }, "has 12 elements, but the destination holds 3");
}

TEST(TorchBin, ReadsFilesWrittenByTorch) {
  // Written by torch 2.11's torch.save on the GPU machine (make_real_torch.py): a plain dict with
  // F32/F16/BF16/I64/BOOL tensors, a tensor held twice, views (offset, transposed, column), a
  // float8 and a uint16 tensor (_rebuild_tensor_v3 over torch.storage.UntypedStorage), a 0-d and
  // an empty tensor and an nn.Parameter; and a module's state_dict() (OrderedDict + BUILD).
  const json expected = json::parse(std::ifstream(test::fixture("torch_bin/real/expected.json")));
  for (const char* name : {"state_dict.bin", "module.bin"}) {
    SCOPED_TRACE(name);
    const TorchBinFile f = TorchBinFile::open(test::fixture(std::string("torch_bin/real/") + name));
    check_against(f, expected[name]);
  }
  const TorchBinFile f = TorchBinFile::open(test::fixture("torch_bin/real/state_dict.bin"));
  EXPECT_EQ(f.archive_name(), "state_dict");
  EXPECT_EQ(f.find("f8")->dtype, "F8_E4M3");
  EXPECT_FALSE(f.find("w.t")->contiguous());
  EXPECT_EQ(f.find("tied.view")->storage_offset, 3u);
  EXPECT_EQ(f.find("tied.b")->storage_key, f.find("tied.a")->storage_key);
}

TEST(TorchBin, ReadsZip64Entries) {
  // The same checkpoint with zip64 size fields in every local header (torch writes those for
  // entries of 4 GB and more).
  const TorchBinFile f = TorchBinFile::open(test::fixture("torch_bin/tiny_zip64/pytorch_model.bin"));
  check_against(f, json::parse(std::ifstream(test::fixture("torch_bin/tiny/expected.json"))));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(f.storage_bytes("1").data()) % 64, 0u);
}

TEST(TorchBin, ParsesProtocol4AndRebuildV3AndParameters) {
  const StateDict p2 = parse(read_file(test::fixture("torch_bin/pkl/tiny_p2.pkl")));
  const StateDict p4 = parse(read_file(test::fixture("torch_bin/pkl/tiny_p4.pkl")));  // FRAME, MEMOIZE, STACK_GLOBAL
  ASSERT_EQ(p2.tensors.size(), 10u);
  ASSERT_EQ(p4.tensors.size(), p2.tensors.size());
  for (size_t i = 0; i < p2.tensors.size(); ++i) {
    EXPECT_EQ(p4.tensors[i].name, p2.tensors[i].name);
    EXPECT_EQ(p4.tensors[i].dtype, p2.tensors[i].dtype);
    EXPECT_EQ(p4.tensors[i].shape, p2.tensors[i].shape);
    EXPECT_EQ(p4.tensors[i].strides, p2.tensors[i].strides);
    EXPECT_EQ(p4.tensors[i].storage_key, p2.tensors[i].storage_key);
    EXPECT_EQ(p4.tensors[i].storage_offset, p2.tensors[i].storage_offset);
  }
  EXPECT_EQ(p2.storages.at("2").dtype, "BF16");
  EXPECT_EQ(p2.storages.at("2").n_bytes, 16u);
  EXPECT_EQ(p2.storages.at("2").location, "cpu");

  const StateDict v3 = parse(read_file(test::fixture("torch_bin/pkl/v3_param.pkl")));
  ASSERT_EQ(v3.tensors.size(), 2u);
  EXPECT_EQ(v3.tensors[0].name, "q.weight");
  EXPECT_EQ(v3.tensors[0].dtype, "F8_E4M3");  // _rebuild_tensor_v3 over an untyped storage
  EXPECT_EQ(v3.tensors[0].storage_key, "9");
  EXPECT_EQ(v3.storages.at("9").dtype, "U8");
  EXPECT_EQ(v3.storages.at("9").n_bytes, 6u);
  EXPECT_EQ(v3.tensors[1].name, "p.weight");  // _rebuild_parameter(tensor, True, OrderedDict())
  EXPECT_EQ(v3.tensors[1].dtype, "F32");
  EXPECT_EQ(v3.tensors[1].shape, (std::vector<int64_t>{3, 4}));
}

TEST(TorchBin, ReadsGeneralStridesExactly) {
  // One F32 storage of 40 values; views: a permuted 3-D view with an offset, a column, a
  // broadcast (stride 0) row, and a contiguous slice.
  std::vector<float> data = test::random_vector(40);
  const Bytes pkl = state_dict({
      {.name = "perm", .numel = 40, .offset = 3, .shape = {2, 3, 4}, .stride = {1, 8, 2}},
      {.name = "col", .numel = 40, .offset = 5, .shape = {4, 1}, .stride = {10, 1}},
      {.name = "bcast", .numel = 40, .offset = 7, .shape = {3, 2}, .stride = {0, 1}},
      {.name = "slice", .numel = 40, .offset = 30, .shape = {2, 5}, .stride = {5, 1}},
  });
  const TorchBinFile f = open_bytes(torch_zip(pkl, {{"0", f32_bytes(data)}}));
  const auto at = [&](const TensorRecord& t, std::vector<int64_t> idx) {
    int64_t off = static_cast<int64_t>(t.storage_offset);
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides[d];
    return data[static_cast<size_t>(off)];
  };
  for (const TensorRecord& t : f.tensors()) {
    std::vector<float> out(t.n_elements, NAN);
    f.read_f32(t, out);
    size_t k = 0;
    std::vector<int64_t> idx(t.shape.size(), 0);
    for (; k < out.size(); ++k) {
      EXPECT_EQ(bits(out[k]), bits(at(t, idx))) << t.name << " element " << k;
      for (size_t d = idx.size(); d-- > 0;) {
        if (++idx[d] < t.shape[d]) break;
        idx[d] = 0;
      }
    }
    EXPECT_EQ(k, t.n_elements);
  }
  EXPECT_FALSE(f.find("perm")->contiguous());
  EXPECT_TRUE(f.find("slice")->contiguous());
}

TEST(TorchBin, ReadsDeflatedPicklesAndIgnoresUnknownEntries) {
  const Bytes pkl = state_dict({{.name = "w"}});
  const std::vector<float> v = {1.5f, -2.0f, 0.25f, 8.0f};
  const TorchBinFile f = open_bytes(make_zip({{"a/data.pkl", pkl, /*deflate=*/true},
                                              {"a/.data/serialization_id", {'1', '2'}},
                                              {"a/extra/whatever", {1, 2, 3}, true},
                                              {"a/data/0", f32_bytes(v)}}));
  std::vector<float> out(4);
  f.read_f32(f.tensors().at(0), out);
  EXPECT_EQ(out, v);
}

// ---------------------------------------------------------------------------------------------
// Nothing runs

TEST(TorchBin, RefusesPicklesThatCallAnythingElse) {
  TempDir d;
  const std::string marker = (d.path / "pwned").string();
  const auto call = [&](std::string_view module, std::string_view name) {
    Pickle p;
    p.proto().global(module, name).str("touch " + marker).op(0x85).op('R').stop();
    return p.bytes;
  };
  const std::vector<std::pair<std::string, std::string>> evil = {
      {"os", "system"},          {"posix", "system"},          {"builtins", "eval"},
      {"__builtin__", "exec"},   {"subprocess", "Popen"},      {"builtins", "getattr"},
      {"torch", "load"},         {"torch._utils", "_rebuild_qtensor"}, {"collections", "Counter"},
      {"torch.serialization", "_get_layout"}, {"numpy.core.multiarray", "_reconstruct"}, {"nt", "system"},
  };
  for (const auto& [module, name] : evil) {
    const Bytes pkl = call(module, name);
    expect_bad_pickle(pkl, "test.bin: refusing to load: the pickle calls " + module + "." + name +
                               ", which is not part of a state dict");
    // In a zip, opened both from memory and from a file.
    const Bytes zip = torch_zip(pkl, {});
    expect_error([&] { (void)open_bytes(zip); }, "refusing to load: the pickle calls " + module + "." + name);
    write_file(d.path / "evil.bin", zip);
    expect_error([&] { (void)TorchBinFile::open((d.path / "evil.bin").string()); },
                 (d.path / "evil.bin").string() + ": refusing to load: the pickle calls " + module + "." + name);
    EXPECT_FALSE(fs::exists(marker)) << module << "." << name;
  }
  // Protocol 4's STACK_GLOBAL names a global through strings on the stack: refused the same way.
  Pickle sg;
  sg.proto(4).op(0x8c).op(2).raw("os").op(0x8c).op(6).raw("system").op(0x93).str("touch " + marker).op(0x85).op('R').stop();
  expect_bad_pickle(sg.bytes, "refusing to load: the pickle calls os.system");
  // Hidden inside an otherwise valid state dict, as a tensor's value.
  Pickle inside;
  inside.proto().ordered_dict().mark().str("w").global("os", "system").str("touch " + marker).op(0x85).op('R').op('u').stop();
  expect_bad_pickle(inside.bytes, "refusing to load: the pickle calls os.system");
  EXPECT_FALSE(fs::exists(marker));
}

TEST(TorchBin, RefusesTheMaliciousFixture) {
  // make_fixtures.py wrote a zip whose data.pkl runs os.system('touch /tmp/fdpp-torch-bin-pwned-marker').
  const std::string marker = "/tmp/fdpp-torch-bin-pwned-marker";
  std::error_code ec;
  fs::remove(marker, ec);
  const std::string path = test::fixture("torch_bin/evil/pytorch_model.bin");
  expect_error([&] { (void)TorchBinFile::open(path); },
               path + ": refusing to load: the pickle calls os.system, which is not part of a state dict");
  expect_error([&] { (void)open_hf_weights(path); }, "refusing to load: the pickle calls os.system");
  EXPECT_FALSE(fs::exists(marker));
}

TEST(TorchBin, RejectsOpcodesAStateDictDoesNotNeed) {
  const auto with = [](std::initializer_list<uint8_t> body) {
    Bytes b(2 + body.size());
    b[0] = 0x80;
    b[1] = 0x02;
    std::copy(body.begin(), body.end(), b.begin() + 2);
    return b;
  };
  expect_bad_pickle(with({'i', 'o', 's', '\n', 's', 'y', 's', 't', 'e', 'm', '\n', '.'}), "unsupported pickle opcode INST");
  expect_bad_pickle(with({'(', 'o', '.'}), "unsupported pickle opcode OBJ");
  expect_bad_pickle(with({0x81, '.'}), "unsupported pickle opcode NEWOBJ");
  expect_bad_pickle(with({0x82, 1, '.'}), "unsupported pickle opcode EXT1");
  expect_bad_pickle(with({'P', '1', '\n', '.'}), "unsupported pickle opcode PERSID");
  expect_bad_pickle(with({'N', '2', '.'}), "unsupported pickle opcode DUP");
  expect_bad_pickle(with({'B', 1, 0, 0, 0, 'x', '.'}), "unsupported pickle opcode BINBYTES");
  expect_bad_pickle(with({'I', '1', '\n', '.'}), "unsupported pickle opcode INT");
  expect_bad_pickle(with({0xff, '.'}), "unknown pickle opcode 0xff");
  expect_bad_pickle(with({0x00}), "unknown pickle opcode 0x00");
  expect_bad_pickle({0x80, 0x06, '}', '.'}, "pickle protocol 6");
  expect_bad_pickle({0x80, 0x01, '}', '.'}, "pickle protocol 1");
  const std::string msg = error_of([&] { (void)parse(with({'N', 0xfe, '.'})); });
  EXPECT_NE(msg.find("test.bin: data.pkl offset 3: unknown pickle opcode 0xfe"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// Hostile pickles

TEST(TorchBin, EveryTruncatedPickleIsAnError) {
  for (const char* name : {"tiny_p2.pkl", "tiny_p4.pkl", "v3_param.pkl", "real_state_dict.pkl"}) {
    const Bytes pkl = read_file(test::fixture(std::string("torch_bin/pkl/") + name));
    ASSERT_GT(pkl.size(), 100u);
    EXPECT_NO_THROW((void)parse(pkl));
    for (size_t n = 0; n < pkl.size(); ++n)
      expect_error([&] { (void)parse(Bytes(pkl.begin(), pkl.begin() + n)); }, "test.bin: ");
  }
}

TEST(TorchBin, BoundsTheMemoAndTheStack) {
  // LONG_BINPUT with an index no pickler could reach in a 9-byte pickle.
  expect_bad_pickle({0x80, 2, '}', 'r', 0xff, 0xff, 0xff, 0x7f, '.'}, "memo index 2147483647 is larger than the pickle");
  expect_bad_pickle({0x80, 2, 'h', 5, '.'}, "memo index 5 was never stored");
  expect_bad_pickle({0x80, 2, 'j', 1, 0, 0, 0, '.'}, "memo index 1 was never stored");
  expect_bad_pickle({0x80, 2, 'q', 0, '.'}, "memo put on an empty stack");
  // Lengths past the end.
  expect_bad_pickle({0x80, 2, 'X', 0xff, 0xff, 0xff, 0xff, 'a', '.'}, "truncated pickle: BINUNICODE needs 4294967295 bytes");
  expect_bad_pickle({0x80, 2, 0x8d, 0, 0, 0, 0, 0, 0, 0, 0x80, '.'}, "truncated pickle: BINUNICODE8 needs");
  expect_bad_pickle({0x80, 4, 0x95, 0, 0, 0, 0, 0, 0, 1, 0, '.'}, "frame of");
  expect_bad_pickle({0x80, 2, 0x8a, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, '.'}, "does not fit in 64 bits");
  // A GLOBAL line without an end, and one too long.
  expect_bad_pickle({0x80, 2, 'c', 'o', 's'}, "has no end of line");
  Pickle longline;
  longline.proto().op('c').raw(std::string(300, 'a')).raw("\nb\n").stop();
  expect_bad_pickle(longline.bytes, "longer than 256 bytes");
  // Deeply nested marks and long stacks are only memory proportional to the pickle.
  Bytes marks = {0x80, 2};
  marks.insert(marks.end(), 200000, '(');
  marks.push_back('.');
  expect_bad_pickle(marks, "STOP with an open MARK");
  Bytes nones = {0x80, 2};
  nones.insert(nones.end(), 200000, 'N');
  nones.push_back('.');
  expect_bad_pickle(nones, "STOP with 200000 values on the stack");
}

TEST(TorchBin, SelfReferencesNeitherHangNorLeak) {
  // A list that contains itself; a dict whose value is itself. Nothing walks them recursively.
  expect_bad_pickle({0x80, 2, ']', 'q', 0, 'h', 0, 'a', '.'}, "holds a list, not a state dict");
  expect_bad_pickle({0x80, 2, '}', 'q', 0, 'X', 1, 0, 0, 0, 'a', 'h', 0, 's', '.'}, "entry 'a' is a dict, not a tensor");
  // A tuple memoized and REDUCEd into many tensors costs its dimensions each time: bounded.
  Pickle p;
  p.proto().ordered_dict().mark();
  p.str("t0");
  p.global("torch._utils", "_rebuild_tensor_v2").op('q').op(1).mark();
  p.mark().str("storage").global("torch", "FloatStorage").str("0").str("cpu").integer(1).tuple().op('Q');
  std::vector<int64_t> ones(64, 1);
  p.integer(0).ints(ones).ints(ones).op(0x89).ordered_dict().tuple().op('q').op(2).op('R');
  for (int i = 0; i < 2000; ++i) p.str("t" + std::to_string(i + 1)).op('h').op(1).op('h').op(2).op('R');
  p.op('u').stop();
  expect_bad_pickle(p.bytes, "more tensor records than its size could describe");
}

TEST(TorchBin, RejectsStructuralNonsense) {
  expect_bad_pickle({}, "is empty");
  expect_bad_pickle({0x80, 2, '.'}, "STOP with 0 values");
  expect_bad_pickle({0x80, 2, 'N', 'N', '.'}, "STOP with 2 values");
  expect_bad_pickle({0x80, 2, '}', '.', 'N'}, "1 bytes follow the STOP opcode");
  expect_bad_pickle({0x80, 2, ']', 'N', 'N', 's', '.'}, "SETITEM on a list");
  expect_bad_pickle({0x80, 2, '}', 'N', 'a', '.'}, "APPEND to a dict");
  expect_bad_pickle({0x80, 2, 'N', 't', '.'}, "TUPLE without a MARK");
  expect_bad_pickle({0x80, 2, '}', '(', 'N', 'u', '.'}, "SETITEMS with an odd number");
  expect_bad_pickle({0x80, 2, 'N', '(', 'N', 0x86, '.'}, "TUPLE2 on an empty stack");  // below the MARK: unreachable
  expect_bad_pickle({0x80, 2, 'R', '.'}, "REDUCE on an empty stack");
  expect_bad_pickle({0x80, 2, ']', 'N', 'b', '.'}, "BUILD of a list");
  expect_bad_pickle({0x80, 2, 'N', ')', 'R', '.'}, "REDUCE calls a None");
  Pickle od_args;
  od_args.proto().global("collections", "OrderedDict").op('N').op(0x85).op('R').stop();
  expect_bad_pickle(od_args.bytes, "OrderedDict called with arguments");
  Pickle call_type;
  call_type.proto().global("torch", "FloatStorage").op(')').op('R').stop();
  expect_bad_pickle(call_type.bytes, "REDUCE calls torch.FloatStorage, which only names a type");
  // The top level: a dict of unique strings to tensors.
  expect_bad_pickle({0x80, 2, ']', '.'}, "holds a list, not a state dict");
  expect_bad_pickle({0x80, 2, '}', 'K', 1, 'N', 's', '.'}, "has a int key, not a string");
  expect_bad_pickle({0x80, 2, '}', 'X', 1, 0, 0, 0, 'a', 'N', 's', '.'}, "entry 'a' is a None, not a tensor");
  expect_bad_pickle(state_dict({{.name = "w"}, {.name = "w"}}), "names 'w' twice");
  // An empty state dict (also as a plain dict) is fine.
  EXPECT_TRUE(parse({0x80, 2, '}', '.'}).tensors.empty());
  EXPECT_TRUE(parse(Pickle().proto().ordered_dict().op('}').op('b').stop().bytes).tensors.empty());
}

TEST(TorchBin, RejectsBadPersistentIds) {
  const auto pid = [](const std::function<void(Pickle&)>& body) {
    Pickle p;
    p.proto().ordered_dict().str("w").global("torch._utils", "_rebuild_tensor_v2").mark();
    body(p);
    p.op('Q').integer(0).ints({1}).ints({1}).op(0x89).ordered_dict().tuple().op('R').op('s').stop();
    return p.bytes;
  };
  expect_bad_pickle(pid([](Pickle& p) { p.str("storage"); }), "persistent id is a str of 0 items");
  expect_bad_pickle(pid([](Pickle& p) { p.mark().str("storagex").global("torch", "FloatStorage").str("0").str("cpu").integer(1).tuple(); }),
                    "does not start with 'storage'");
  expect_bad_pickle(pid([](Pickle& p) { p.mark().str("storage").global("collections", "OrderedDict").str("0").str("cpu").integer(1).tuple(); }),
                    "names a global (collections.OrderedDict), not a storage class");
  expect_bad_pickle(pid([](Pickle& p) { p.mark().str("storage").global("torch", "FloatStorage").str("../../etc/passwd").str("cpu").integer(1).tuple(); }),
                    "storage key '../../etc/passwd' is not a plain name");
  expect_bad_pickle(pid([](Pickle& p) { p.mark().str("storage").global("torch", "FloatStorage").integer(0).str("cpu").integer(1).tuple(); }),
                    "storage key is not a string");
  expect_bad_pickle(pid([](Pickle& p) { p.mark().str("storage").global("torch", "FloatStorage").str("0").str("cpu").integer(-1).tuple(); }),
                    "size is not a non-negative int");
  expect_bad_pickle(pid([](Pickle& p) { p.mark().str("storage").global("torch", "FloatStorage").str("0").str("cpu").integer(INT64_MAX).tuple(); }),
                    "impossibly large");
  // One key named with two dtypes.
  expect_bad_pickle(state_dict({{.name = "a"}, {.name = "b", .storage_class = "HalfStorage", .numel = 8}}),
                    "storage '0' is named as 16 bytes of F32 and as 16 bytes of F16");
}

TEST(TorchBin, ChecksTensorExtentsAgainstTheirStorage) {
  expect_bad_pickle(state_dict({{.name = "w", .numel = 4, .offset = 1, .shape = {4}}}),
                    "tensor of size 4 stride 1 at storage offset 1 reaches past the end of storage '0' (16 bytes of F32)");
  expect_bad_pickle(state_dict({{.name = "w", .numel = 4, .offset = INT64_MAX - 1, .shape = {4}}}), "reaches past the end");
  expect_bad_pickle(state_dict({{.name = "w", .numel = 6, .shape = {2, 3}, .stride = {4, 1}}}), "reaches past the end");
  expect_bad_pickle(state_dict({{.name = "w", .numel = 4, .shape = {2, 2}, .stride = {1}}}),
                    "size has 2 dimensions but stride has 1");
  expect_bad_pickle(state_dict({{.name = "w", .numel = 4, .shape = {-4}}}), "size is -4");
  expect_bad_pickle(state_dict({{.name = "w", .numel = 4, .shape = {4}, .stride = {-1}}}), "stride is -1");
  expect_bad_pickle(state_dict({{.name = "w", .numel = 4, .shape = {INT64_MAX, INT64_MAX, 2}, .stride = {0, 0, 0}}}),
                    "more than 2^64 elements");
  expect_bad_pickle(state_dict({{.name = "w", .numel = 4, .shape = {INT64_MAX / 2, 2}, .stride = {INT64_MAX / 2, 1}}}),
                    "strides reach past 2^64");
  // Empty tensors reach nothing, whatever their offset within the storage.
  EXPECT_EQ(parse(state_dict({{.name = "w", .numel = 0, .offset = 0, .shape = {0, 5}, .stride = {5, 1}}})).tensors[0].extent(), 0u);
  // Sizes whose product passes 2^63 before their 0: empty, contiguous, reaching nothing.
  const TensorRecord huge_empty =
      parse(state_dict({{.name = "w", .numel = 0, .shape = {0, INT64_MAX, INT64_MAX}, .stride = {1, 1, 1}}})).tensors[0];
  EXPECT_TRUE(huge_empty.contiguous());
  EXPECT_EQ(huge_empty.extent(), 0u);
  // An untyped storage needs _rebuild_tensor_v3's dtype.
  expect_bad_pickle(state_dict({{.name = "w", .storage_class = "UntypedStorage", .numel = 16}}),
                    "_rebuild_tensor_v2 with an untyped storage and no dtype");
}

// ---------------------------------------------------------------------------------------------
// Hostile zips

TEST(TorchBin, ChecksTheZipAgainstThePickle) {
  const Bytes pkl = state_dict({{.name = "w", .numel = 4}});
  const Bytes good = f32_bytes({1, 2, 3, 4});
  EXPECT_NO_THROW((void)open_bytes(torch_zip(pkl, {{"0", good}})));
  expect_error([&] { (void)open_bytes(torch_zip(pkl, {})); }, "storage '0' named by the pickle has no zip entry archive/data/0");
  expect_error([&] { (void)open_bytes(torch_zip(pkl, {{"0", Bytes(12)}})); },
               "zip entry archive/data/0 holds 12 bytes, but the pickle declares storage '0' as 16 bytes of F32");
  expect_error([&] { (void)open_bytes(torch_zip(pkl, {{"0", Bytes(20)}})); }, "holds 20 bytes");
  expect_error([&] { (void)open_bytes(make_zip({{"a/data.pkl", pkl}, {"a/data/0", good, true}})); },
               "zip entry a/data/0 is compressed");
  expect_error([&] { (void)open_bytes(make_zip({{"a/data.pkl", pkl}, {"a/byteorder", {'b', 'i', 'g'}}, {"a/data/0", good}})); },
               "byte order 'big'");
  expect_error([&] { (void)open_bytes(make_zip({{"a/other.pkl", pkl}})); }, "no <archive>/data.pkl entry");
  expect_error([&] { (void)open_bytes(make_zip({{"data.pkl", pkl}})); }, "no <archive>/data.pkl entry");
  expect_error([&] { (void)open_bytes(make_zip({{"a/data.pkl", pkl}, {"b/data.pkl", pkl}})); }, "zip holds two pickles");
  expect_error([&] { (void)open_bytes(make_zip({{"a/constants.pkl", pkl}, {"a/code/x.py", {}}})); }, "TorchScript archive");
  expect_error([&] { (void)open_bytes(make_zip({{"a/data.pkl", pkl}, {"a/data.pkl", pkl}})); }, "zip holds entry a/data.pkl twice");
  expect_error([&] { (void)open_bytes(make_zip({{"a/data.pkl", {}}})); }, "data.pkl is empty");
  expect_error([&] { (void)open_bytes(make_zip({{"a/data.pkl", {0x80, 2, ']', '.'}}})); }, "holds a list");
}

TEST(TorchBin, RejectsWhatIsNotATorchZip) {
  expect_error([&] { (void)open_bytes({}); }, "test.bin: empty file");
  expect_error([&] { (void)open_bytes({0x80, 0x02, 0x8a, 0x0a}); }, "legacy torch.save format");
  expect_error([&] { (void)open_bytes({'h', 'e', 'l', 'l', 'o'}); }, "not a PyTorch checkpoint");
  expect_error([&] { (void)open_bytes({'P', 'K', 3, 4, 0, 0, 0}); }, "incomplete zip archive");
  // An end record that points nowhere.
  Bytes eocd = {'P', 'K', 3, 4, 'P', 'K', 5, 6, 0, 0, 0, 0, 5, 0, 5, 0, 100, 0, 0, 0, 0xe8, 3, 0, 0, 0, 0};
  expect_error([&] { (void)open_bytes(eocd); }, "not a readable zip archive");
  expect_error([&] { (void)TorchBinFile::open("/nonexistent/pytorch_model.bin"); }, "/nonexistent/pytorch_model.bin");
}

TEST(TorchBin, EveryTruncatedFileIsAnError) {
  const Bytes file = read_file(test::fixture("torch_bin/tiny/pytorch_model.bin"));
  EXPECT_NO_THROW((void)open_bytes(file));
  for (size_t n = 0; n < file.size(); ++n)
    expect_error([&] { (void)open_bytes(Bytes(file.begin(), file.begin() + n)); }, "test.bin: ");
}

TEST(TorchBin, RandomCorruptionNeverCrashes) {
  for (const char* fixture : {"torch_bin/tiny/pytorch_model.bin", "torch_bin/tiny_zip64/pytorch_model.bin",
                              "torch_bin/real/state_dict.bin",
                              "torch_bin/sharded/pytorch_model-00001-of-00002.bin"}) {
    const Bytes file = read_file(test::fixture(fixture));
    std::uniform_int_distribution<size_t> pos(0, file.size() - 1);
    std::uniform_int_distribution<int> byte(0, 255);
    for (int i = 0; i < 2000; ++i) {
      Bytes b = file;
      for (int k = 0; k < 1 + i % 4; ++k) b[pos(test::rng())] = static_cast<uint8_t>(byte(test::rng()));
      try {
        const TorchBinFile f = open_bytes(b);
        for (const TensorRecord& t : f.tensors()) {
          std::vector<float> out(t.n_elements);
          if (hf::dtype_readable(t.dtype)) f.read_f32(t, out);
        }
      } catch (const Error& e) {
        ASSERT_EQ(std::string(e.what()).find('\n'), std::string::npos);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// open_hf_weights over .bin checkpoints

TEST(HfWeights, OpensAPytorchBin) {
  TempDir d;
  fs::copy_file(test::fixture("torch_bin/tiny/pytorch_model.bin"), d.path / "pytorch_model.bin");
  const auto w = open_hf_weights(d.str());
  EXPECT_EQ(w->format(), "pytorch");
  ASSERT_EQ(w->tensors().size(), 10u);
  EXPECT_EQ(w->tensors()[0].name, "model.w");
  const json expected = json::parse(std::ifstream(test::fixture("torch_bin/tiny/expected.json")));
  for (const SourceTensor& t : w->tensors()) {
    EXPECT_EQ(t.file, (d.path / "pytorch_model.bin").string());
    EXPECT_EQ(t.shape, expected[t.name]["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(t.dtype, expected[t.name]["dtype"].get<std::string>());
    uint64_t numel = 1;
    for (int64_t s : t.shape) numel *= static_cast<uint64_t>(s);
    EXPECT_EQ(t.n_bytes, numel * (t.dtype == "F32" ? 4 : t.dtype == "I64" ? 8 : 2));
    std::vector<float> out(numel);
    if (!expected[t.name].contains("values")) {
      expect_error([&] { w->read_f32(t, out); }, "dtype I64 not supported");
      continue;
    }
    w->read_f32(t, out);
    const auto values = expected[t.name]["values"].get<std::vector<double>>();
    for (size_t i = 0; i < numel; ++i) EXPECT_EQ(out[i], static_cast<float>(values[i])) << t.name;
  }
}

TEST(HfWeights, OpensShardedPytorchBins) {
  const std::string dir = test::fixture("torch_bin/sharded");
  const auto w = open_hf_weights(dir);
  EXPECT_EQ(w->format(), "pytorch");
  const json expected = json::parse(std::ifstream(test::fixture("torch_bin/sharded/expected.json")));
  ASSERT_EQ(w->tensors().size(), expected.size());
  EXPECT_EQ(w->find("c.weight")->file, dir + "/pytorch_model-00002-of-00002.bin");
  for (const auto& [name, e] : expected.items()) {
    const SourceTensor* t = w->find(name);
    ASSERT_NE(t, nullptr);
    std::vector<float> out(e["values"].size());
    w->read_f32(*t, out);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], static_cast<float>(e["values"][i].get<double>())) << name;
  }
}

TEST(HfWeights, OpensShardsWrittenByTransformers) {
  // transformers 5.17 save_pretrained(max_shard_size="1KB") of a tiny bf16 Llama (tied lm_head not
  // saved): its index and two safetensors shards, as written on the GPU machine.
  const auto w = open_hf_weights(test::fixture("torch_bin/real/llama"));
  EXPECT_EQ(w->format(), "safetensors");
  const json expected = json::parse(std::ifstream(test::fixture("torch_bin/real/expected.json")))["llama"];
  ASSERT_EQ(w->tensors().size(), expected.size());
  for (const auto& [name, e] : expected.items()) {
    const SourceTensor* t = w->find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, "BF16");
    EXPECT_EQ(t->shape, e["shape"].get<std::vector<int64_t>>());
    std::vector<float> out(e["values"].size());
    w->read_f32(*t, out);
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i], static_cast<float>(e["values"][i].get<double>())) << name;
  }
}

TEST(HfWeights, RejectsMissingAndEscapingBinShards) {
  TempDir d;
  const fs::path src = test::fixture("torch_bin/sharded");
  fs::copy_file(src / "pytorch_model-00001-of-00002.bin", d.path / "pytorch_model-00001-of-00002.bin");
  fs::copy_file(src / "pytorch_model.bin.index.json", d.path / "pytorch_model.bin.index.json");
  expect_error([&] { (void)open_hf_weights(d.str()); },
               d.str() + ": shard pytorch_model-00002-of-00002.bin named by pytorch_model.bin.index.json is missing");
  std::ofstream(d.path / "pytorch_model.bin.index.json")
      << R"({"weight_map": {"a.weight": "../sharded/pytorch_model-00001-of-00002.bin"}})";
  expect_error([&] { (void)open_hf_weights(d.str()); }, "which is not a file inside");
  // Two shards holding the same tensor.
  fs::copy_file(d.path / "pytorch_model-00001-of-00002.bin", d.path / "again.bin");
  std::ofstream(d.path / "pytorch_model.bin.index.json")
      << R"({"weight_map": {"a.weight": "pytorch_model-00001-of-00002.bin", "b.bias": "again.bin"}})";
  expect_error([&] { (void)open_hf_weights(d.str()); }, "is in both");
}

}  // namespace
}  // namespace fdpp::torch_bin
