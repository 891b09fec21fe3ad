// A restricted reader of the pickle that torch.save writes for a state dict (the data.pkl entry of a
// PyTorch .bin). It NEVER executes code: it is a stack machine that builds plain data (strings,
// ints, tuples, lists, dicts) and recognizes a fixed set of globals by name — the OrderedDict class,
// torch's tensor-rebuild functions, storage classes and dtypes — each interpreted here, never
// imported or called. Any other global (os.system, builtins.eval, subprocess.Popen, ...) is refused
// as soon as the GLOBAL opcode names it; any opcode a state dict does not need is an error.
//
// What torch.save (protocol 2, the default) writes for {name: tensor}:
//   collections.OrderedDict() REDUCE, then SETITEMS of name -> tensor, then BUILD with the dict's
//   __dict__ ({'_metadata': ...}, ignored); each tensor is
//   torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
//                                   OrderedDict() [, metadata])
//   where storage is a persistent id ('storage', torch.HalfStorage, key, location, numel) whose
//   bytes are the zip entry <archive>/data/<key>. Dtypes without a typed storage class (float8,
//   uint16..64) come as _rebuild_tensor_v3(storage, ..., dtype [, metadata]) over a persistent id
//   naming torch.storage.UntypedStorage, whose numel is in bytes. (Checked against files written by
//   torch 2.11: tests/fixtures/torch_bin/real.)
// Every length, count and index is bounded by the pickle's size; memory use is proportional to it.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace fdpp::torch_pickle {

// A storage named by a persistent id.
struct StorageRef {
  std::string key;       // the zip entry <archive>/data/<key>
  std::string dtype;     // its element type (HF/safetensors name); "U8" for an untyped storage
  uint64_t n_bytes = 0;  // the size it declares
  std::string location;  // "cpu", "cuda:0", ...
};

struct TensorRecord {
  std::string name;
  std::string dtype;              // "F32", "F16", "BF16", "I64", ... (safetensors names)
  std::vector<int64_t> shape;     // outermost first
  std::vector<int64_t> strides;   // in elements, non-negative
  std::string storage_key;
  uint64_t storage_offset = 0;    // in elements
  uint64_t n_elements = 0;
  // Whether the strides are the row-major contiguous ones (dimensions of size 1 may have any).
  bool contiguous() const;
  // Elements of the storage the tensor reaches, from its offset: 0 when empty, else
  // 1 + sum((size_i - 1) * stride_i). Already checked against the storage size by the parser.
  uint64_t extent() const;
};

struct StateDict {
  std::vector<TensorRecord> tensors;            // in the pickle's order; names unique
  std::map<std::string, StorageRef> storages;   // by key
};

// Upper bound on a data.pkl accepted (bytes); a state dict pickle needs about 100 bytes a tensor.
inline constexpr uint64_t kMaxPickleBytes = uint64_t{64} << 20;

// Parses a state-dict pickle. `origin` (the file) and `pickle_name` (the entry) name it in errors:
// "ORIGIN: PICKLE_NAME offset N: problem", or for a global outside the allow-list
// "ORIGIN: refusing to load: the pickle calls os.system, which is not part of a state dict".
// The top-level object must be a dict (or OrderedDict) mapping unique strings to tensors; each
// tensor's extent is checked against the size its storage declares.
StateDict parse_state_dict(std::span<const uint8_t> pickle, const std::string& origin,
                           const std::string& pickle_name = "data.pkl");

}  // namespace fdpp::torch_pickle
