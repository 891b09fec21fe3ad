// libFuzzer target for the restricted state-dict unpickler (src/io/unpickler.h), the part of the
// PyTorch .bin reader that interprets the pickle: any input must either parse or throw
// fdpp::Error, with no crash, no out-of-bounds read, no UB (ASan + UBSan), no leak (values that
// contain themselves through the memo included) and no allocation out of proportion to the input
// (scripts/fuzz.sh: inputs of at most 64 KiB, -malloc_limit_mb=64). After a successful parse the
// target checks the parser's promises: unique names, each tensor's storage declared, each
// tensor's extent inside its storage.
//
// Seeds: tests/fixtures/torch_bin/pkl/*.pkl (pickles in torch.save's form, protocols 2 and 4) and
// the seed mode: FDPP_UNPICKLER_FUZZ_SEEDS=DIR unpickler_fuzz writes a few hand-made pickles.
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "fdpp/error.h"
#include "io/safetensors.h"
#include "io/unpickler.h"

namespace {

using fdpp::torch_pickle::StateDict;
using fdpp::torch_pickle::TensorRecord;

void promise(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "unpickler_fuzz: broken promise: %s\n", what);
    std::abort();
  }
}

// Pickle bytes, written opcode by opcode (string literals with \x escapes are too easy to get wrong).
struct P {
  std::string b;
  P& op(int c) {
    b.push_back(static_cast<char>(c));
    return *this;
  }
  P& raw(const std::string& s) {
    b += s;
    return *this;
  }
  P& str(const std::string& s) {  // BINUNICODE
    op('X');
    for (int i = 0; i < 4; ++i) op(static_cast<int>((s.size() >> (8 * i)) & 0xff));
    return raw(s);
  }
  P& global(const std::string& m, const std::string& n) { return op('c').raw(m + "\n" + n + "\n"); }
  P& k(int v) { return op('K').op(v); }  // BININT1
};

void write_seeds(const std::string& dir) {
  ::mkdir(dir.c_str(), 0755);
  const auto save = [&](const std::string& name, const P& p) {
    std::ofstream f(dir + "/" + name, std::ios::binary);
    f << p.b;
  };
  {  // {'w': half [2, 3] with strides (1, 2), 'v': the same tensor through the memo}
    P p;
    p.op(0x80).op(2).global("collections", "OrderedDict").op('q').op(0).op(')').op('R').op('(');
    p.str("w").global("torch._utils", "_rebuild_tensor_v2").op('(');
    p.op('(').str("storage").global("torch", "HalfStorage").str("0").str("cpu").k(6).op('t').op('Q');
    p.k(0).k(2).k(3).op(0x86).k(1).k(2).op(0x86).op(0x89).op('h').op(0).op(')').op('R').op('t').op('R');
    p.op('q').op(5).str("v").op('h').op(5).op('u').op('.');
    save("strided.pkl", p);
  }
  {  // v3 over an untyped storage, and a parameter
    P p;
    p.op(0x80).op(2).op('}').op('(').str("f8").global("torch._utils", "_rebuild_tensor_v3").op('(');
    p.op('(').str("storage").global("torch", "UntypedStorage").str("1").str("cpu").k(4).op('t').op('Q');
    p.k(0).k(4).op(0x85).k(1).op(0x85).op(0x88).op('}').global("torch", "float8_e5m2").op('t').op('R').op('q').op(9);
    p.str("p").global("torch._utils", "_rebuild_parameter").op('h').op(9).op(0x88).op('}').op(0x87).op('R');
    p.op('u').op('.');
    save("v3.pkl", p);
  }
  save("cycle_list.pkl", P().op(0x80).op(2).op(']').op('q').op(0).op('h').op(0).op('a').op('.'));
  save("cycle_dict.pkl", P().op(0x80).op(2).op('}').op('q').op(0).str("a").op('h').op(0).op('s').op('.'));
  {  // protocol 4: FRAME, SHORT_BINUNICODE, MEMOIZE, STACK_GLOBAL, BUILD of an OrderedDict's state
    P body;
    body.op(0x8c).op(11).raw("collections").op(0x94).op(0x8c).op(11).raw("OrderedDict").op(0x94).op(0x93).op(0x94);
    body.op(')').op('R').op(0x94).op('}').op('b').op('.');
    P p;
    p.op(0x80).op(4).op(0x95);
    for (int i = 0; i < 8; ++i) p.op(i == 0 ? static_cast<int>(body.b.size()) : 0);
    p.raw(body.b);
    save("p4.pkl", p);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  if (const char* dir = std::getenv("FDPP_UNPICKLER_FUZZ_SEEDS")) {
    write_seeds(dir);
    std::exit(0);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A heap copy of exactly the input's size: ASan sees a read one byte past the end.
  const std::vector<uint8_t> pickle(data, data + size);
  try {
    const StateDict sd = fdpp::torch_pickle::parse_state_dict(pickle, "fuzz.bin");
    std::set<std::string> names;
    for (const TensorRecord& t : sd.tensors) {
      promise(names.insert(t.name).second, "unique names");
      const auto it = sd.storages.find(t.storage_key);
      promise(it != sd.storages.end(), "storage declared");
      promise(t.shape.size() == t.strides.size(), "rank of strides");
      uint64_t numel = 1;
      for (size_t i = 0; i < t.shape.size(); ++i) {
        promise(t.shape[i] >= 0 && t.strides[i] >= 0, "non-negative sizes and strides");
        numel *= static_cast<uint64_t>(t.shape[i]);
      }
      promise(numel == t.n_elements, "numel is the shape's product");
      const uint64_t elem = fdpp::hf::dtype_bits(t.dtype) / 8;
      promise(elem > 0, "known dtype");
      promise(t.n_elements == 0 || (t.storage_offset + t.extent()) * elem <= it->second.n_bytes, "extent inside storage");
      (void)t.contiguous();
    }
  } catch (const fdpp::Error& e) {
    const std::string msg = e.what();
    promise(!msg.empty() && msg.find('\n') == std::string::npos, "one-line error");
    promise(msg.rfind("fuzz.bin: ", 0) == 0, "error names the file");
  }
  return 0;
}
