// PyTorch .bin reader (see torch_bin.h).
#include "io/torch_bin.h"

#include <fmt/format.h>
#include <minizip/unzip.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "fdpp/error.h"
#include "io/safetensors.h"

namespace fdpp::torch_bin {

using hf::shown;

namespace {

// ---- minizip over a byte span: the mapped file (or a test's buffer) is the zip, no second open.

struct MemStream {
  std::span<const uint8_t> bytes;
  uint64_t pos = 0;
};

voidpf ZCALLBACK mem_open(voidpf opaque, const void* /*filename*/, int mode) {
  if ((mode & ZLIB_FILEFUNC_MODE_WRITE) != 0) return nullptr;
  static_cast<MemStream*>(opaque)->pos = 0;
  return opaque;
}

uLong ZCALLBACK mem_read(voidpf /*opaque*/, voidpf stream, void* buf, uLong size) {
  auto* s = static_cast<MemStream*>(stream);
  const uint64_t left = s->bytes.size() - s->pos;
  const uint64_t n = std::min<uint64_t>(size, left);
  if (n > 0) std::memcpy(buf, s->bytes.data() + s->pos, n);
  s->pos += n;
  return static_cast<uLong>(n);
}

uLong ZCALLBACK mem_write(voidpf, voidpf, const void*, uLong) { return 0; }

ZPOS64_T ZCALLBACK mem_tell(voidpf /*opaque*/, voidpf stream) { return static_cast<MemStream*>(stream)->pos; }

long ZCALLBACK mem_seek(voidpf /*opaque*/, voidpf stream, ZPOS64_T offset, int origin) {
  auto* s = static_cast<MemStream*>(stream);
  const uint64_t size = s->bytes.size();
  uint64_t base;
  switch (origin) {
    case ZLIB_FILEFUNC_SEEK_SET: base = 0; break;
    case ZLIB_FILEFUNC_SEEK_CUR: base = s->pos; break;
    case ZLIB_FILEFUNC_SEEK_END: base = size; break;
    default: return -1;
  }
  // Offsets are unsigned here; minizip seeks backwards only with SEEK_SET.
  if (offset > size || base > size - offset) return -1;
  s->pos = base + offset;
  return 0;
}

int ZCALLBACK mem_close(voidpf, voidpf) { return 0; }
int ZCALLBACK mem_error(voidpf, voidpf) { return 0; }

// RAII for the unzFile.
class Zip {
 public:
  Zip(std::span<const uint8_t> bytes, const std::string& path) : stream_{bytes, 0} {
    zlib_filefunc64_def io{};
    io.zopen64_file = mem_open;
    io.zread_file = mem_read;
    io.zwrite_file = mem_write;
    io.ztell64_file = mem_tell;
    io.zseek64_file = mem_seek;
    io.zclose_file = mem_close;
    io.zerror_file = mem_error;
    io.opaque = &stream_;
    zip_ = unzOpen2_64(path.c_str(), &io);
    if (zip_ == nullptr) fail("{}: not a readable zip archive (bad or missing central directory)", path);
  }
  ~Zip() {
    if (zip_ != nullptr) unzClose(zip_);
  }
  Zip(const Zip&) = delete;
  Zip& operator=(const Zip&) = delete;
  unzFile get() const { return zip_; }

 private:
  MemStream stream_;
  unzFile zip_ = nullptr;
};

struct Entry {
  std::string name;
  uint64_t method = 0;
  uint64_t compressed = 0;
  uint64_t size = 0;
  uint64_t data_offset = 0;  // where the (stored) data starts in the file
  unz64_file_pos pos{};      // to return to it
};

const char* zip_error(int err) {
  switch (err) {
    case UNZ_ERRNO: return "read error";
    case UNZ_PARAMERROR: return "bad parameter";
    case UNZ_BADZIPFILE: return "corrupt zip structure";
    case UNZ_INTERNALERROR: return "internal error";
    case UNZ_CRCERROR: return "CRC mismatch";
    default: return "error";
  }
}

// Zip central-directory records take at least 46 bytes: more entries than that cannot fit.
constexpr uint64_t kMinCentralEntry = 46;
constexpr uint64_t kMaxSmallEntry = 4096;  // byteorder and the like

// Reads a whole (small) entry through minizip, which inflates if needed and checks the CRC.
std::vector<uint8_t> read_entry(unzFile zip, const Entry& e, uint64_t max_bytes, const std::string& path) {
  if (e.size > max_bytes) fail("{}: zip entry {} is {} bytes, more than the {} allowed", path, shown(e.name), e.size, max_bytes);
  unz64_file_pos pos = e.pos;
  int err = unzGoToFilePos64(zip, &pos);
  if (err == UNZ_OK) err = unzOpenCurrentFile(zip);
  if (err != UNZ_OK) fail("{}: cannot open zip entry {}: {}", path, shown(e.name), zip_error(err));
  std::vector<uint8_t> out(static_cast<size_t>(e.size));
  uint64_t got = 0;
  while (got < e.size) {
    const unsigned chunk = static_cast<unsigned>(std::min<uint64_t>(e.size - got, 1u << 30));
    const int n = unzReadCurrentFile(zip, out.data() + got, chunk);
    if (n <= 0) {
      unzCloseCurrentFile(zip);
      fail("{}: zip entry {} is truncated or corrupt ({} of {} bytes read: {})", path, shown(e.name), got, e.size,
           n < 0 ? zip_error(n) : "end of data");
    }
    got += static_cast<uint64_t>(n);
  }
  uint8_t extra;
  const int more = unzReadCurrentFile(zip, &extra, 1);
  err = unzCloseCurrentFile(zip);
  if (more != 0) fail("{}: zip entry {} holds more than the {} bytes it declares", path, shown(e.name), e.size);
  if (err != UNZ_OK) fail("{}: zip entry {}: {}", path, shown(e.name), zip_error(err));
  return out;
}

}  // namespace

TorchBinFile TorchBinFile::open(const std::string& path) {
  TorchBinFile f;
  f.image_ = FileImage::map(path);
  f.parse();
  return f;
}

TorchBinFile TorchBinFile::from_bytes(std::string name, std::vector<uint8_t> bytes) {
  TorchBinFile f;
  f.image_ = FileImage::from_bytes(std::move(name), std::move(bytes));
  f.parse();
  return f;
}

void TorchBinFile::parse() {
  const std::string& path = image_.name();
  const uint64_t size = image_.bytes().size();
  if (size == 0) fail("{}: empty file", path);
  if (size < 4 || std::memcmp(image_.bytes().data(), "PK\x03\x04", 4) != 0) {
    if (image_.bytes()[0] == 0x80)
      fail("{}: legacy torch.save format (PyTorch before 1.6, not a zip) is not supported; re-save it with a newer "
           "torch or convert it to safetensors",
           path);
    fail("{}: not a PyTorch checkpoint (torch.save writes a zip archive, which starts with PK\\x03\\x04)", path);
  }

  // The end-of-central-directory record (22 bytes + comment) must end the file. minizip takes a
  // read past the end for zeros, so a file cut inside that record would otherwise still open.
  constexpr uint64_t kEocd = 22;
  bool eocd_ok = false;
  for (uint64_t back = kEocd; back <= size && back <= kEocd + 0xffff && !eocd_ok; ++back) {
    const uint8_t* p = image_.bytes().data() + size - back;
    if (std::memcmp(p, "PK\x05\x06", 4) != 0) continue;
    const uint64_t comment = p[20] | (uint64_t{p[21]} << 8);
    eocd_ok = back == kEocd + comment;
  }
  if (!eocd_ok) fail("{}: incomplete zip archive (no end-of-central-directory record at its end: truncated?)", path);

  Zip zip(image_.bytes(), path);
  unz_global_info64 info{};
  if (const int err = unzGetGlobalInfo64(zip.get(), &info); err != UNZ_OK)
    fail("{}: cannot read the zip directory: {}", path, zip_error(err));
  if (info.number_entry > size / kMinCentralEntry)
    fail("{}: zip directory claims {} entries, more than a {}-byte file can hold", path, info.number_entry, size);

  // Every entry: name, sizes, and where its data starts (minizip's unzOpenCurrentFile reads the
  // local header and checks it against the central directory before giving the position).
  std::vector<Entry> entries;
  std::map<std::string, size_t> by_name;
  int err = unzGoToFirstFile(zip.get());
  while (err == UNZ_OK) {
    unz_file_info64 fi{};
    err = unzGetCurrentFileInfo64(zip.get(), &fi, nullptr, 0, nullptr, 0, nullptr, 0);
    if (err != UNZ_OK) break;
    std::string name(fi.size_filename, '\0');  // at most 65535 (a 16-bit field)
    err = unzGetCurrentFileInfo64(zip.get(), &fi, name.data(), static_cast<uLong>(name.size()), nullptr, 0, nullptr, 0);
    if (err != UNZ_OK) break;
    Entry e;
    e.name = std::move(name);
    e.method = fi.compression_method;
    e.compressed = fi.compressed_size;
    e.size = fi.uncompressed_size;
    if ((fi.flag & 1u) != 0) fail("{}: zip entry {} is encrypted", path, shown(e.name));
    if ((err = unzGetFilePos64(zip.get(), &e.pos)) != UNZ_OK) break;
    if ((err = unzOpenCurrentFile(zip.get())) != UNZ_OK)
      fail("{}: zip entry {} has a bad local header: {}", path, shown(e.name), zip_error(err));
    e.data_offset = unzGetCurrentFileZStreamPos64(zip.get());
    unzCloseCurrentFile(zip.get());  // nothing was read: no CRC verdict to take
    if (e.data_offset > size || e.compressed > size - e.data_offset)
      fail("{}: zip entry {} ({} bytes at offset {}) runs past the end of the file ({} bytes)", path, shown(e.name),
           e.compressed, e.data_offset, size);
    if (!by_name.emplace(e.name, entries.size()).second) fail("{}: zip holds entry {} twice", path, shown(e.name));
    entries.push_back(std::move(e));
    err = unzGoToNextFile(zip.get());
  }
  if (err != UNZ_END_OF_LIST_OF_FILE) fail("{}: corrupt zip directory: {}", path, zip_error(err));

  // The pickle: exactly one "<archive>/data.pkl".
  const Entry* pkl = nullptr;
  for (const Entry& e : entries) {
    const size_t slash = e.name.find('/');
    if (slash == std::string::npos || slash == 0 || e.name.compare(slash, std::string::npos, "/data.pkl") != 0) continue;
    if (pkl != nullptr) fail("{}: zip holds two pickles ({} and {})", path, shown(pkl->name), shown(e.name));
    pkl = &e;
  }
  if (pkl == nullptr) {
    for (const Entry& e : entries)
      if (e.name.ends_with("/constants.pkl") || e.name.find("/code/") != std::string::npos)
        fail("{}: a TorchScript archive (torch.jit.save), not a state dict saved by torch.save", path);
    fail("{}: zip has no <archive>/data.pkl entry: not a torch.save checkpoint", path);
  }
  archive_ = pkl->name.substr(0, pkl->name.find('/'));
  const std::string prefix = archive_ + "/";

  if (const auto it = by_name.find(prefix + "byteorder"); it != by_name.end()) {
    const std::vector<uint8_t> order = read_entry(zip.get(), entries[it->second], kMaxSmallEntry, path);
    const std::string_view text(reinterpret_cast<const char*>(order.data()), order.size());
    if (text != "little")
      fail("{}: tensors are stored in byte order '{}'; fdpp reads little-endian checkpoints only", path, shown(text));
  }

  const std::vector<uint8_t> pickle = read_entry(zip.get(), *pkl, torch_pickle::kMaxPickleBytes, path);
  state_ = torch_pickle::parse_state_dict(pickle, path, pkl->name);

  for (const auto& [key, storage] : state_.storages) {
    const std::string name = prefix + "data/" + key;
    const auto it = by_name.find(name);
    if (it == by_name.end()) fail("{}: storage '{}' named by the pickle has no zip entry {}", path, shown(key), shown(name));
    const Entry& e = entries[it->second];
    if (e.method != 0)
      fail("{}: zip entry {} is compressed (method {}); torch.save stores tensor data uncompressed", path, shown(name),
           e.method);
    if (e.compressed != e.size) fail("{}: stored zip entry {} has two different sizes", path, shown(name));
    if (e.size != storage.n_bytes)
      fail("{}: zip entry {} holds {} bytes, but the pickle declares storage '{}' as {} bytes of {}", path, shown(name),
           e.size, shown(key), storage.n_bytes, storage.dtype);
    storage_data_.emplace(key, image_.bytes().subspan(e.data_offset, e.size));
  }
  index_.reserve(state_.tensors.size());
  for (size_t i = 0; i < state_.tensors.size(); ++i) index_.emplace(state_.tensors[i].name, i);
}

const TensorRecord* TorchBinFile::find(std::string_view name) const {
  const auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &state_.tensors[it->second];
}

std::span<const uint8_t> TorchBinFile::storage_bytes(const std::string& key) const {
  const auto it = storage_data_.find(key);
  if (it == storage_data_.end()) fail("{}: no storage '{}'", image_.name(), shown(key));
  return it->second;
}

void TorchBinFile::read_f32(const TensorRecord& t, std::span<float> dst) const {
  if (dst.size() != t.n_elements)
    fail("{}: tensor '{}' has {} elements, but the destination holds {}", image_.name(), shown(t.name), t.n_elements,
         dst.size());
  if (!hf::dtype_readable(t.dtype))
    fail("{}: tensor '{}': dtype {} not supported (fdpp converts F32, F16 and BF16)", image_.name(), shown(t.name), t.dtype);
  if (t.n_elements == 0) return;
  const std::span<const uint8_t> storage = storage_bytes(t.storage_key);
  const uint64_t elem = hf::dtype_bits(t.dtype) / 8;
  // The parser checked (offset + extent) * elem against the storage size the pickle declares, and
  // parse() the entry's size against that; check again here, where the bytes are read.
  check((t.storage_offset + t.extent()) * elem <= storage.size(), "{}: tensor '{}' reaches past its storage", image_.name(),
        shown(t.name));
  const uint8_t* base = storage.data() + t.storage_offset * elem;
  if (t.contiguous()) {
    hf::to_f32(t.dtype, base, dst.data(), t.n_elements);
    return;
  }
  // General strides: walk the index space row-major (an odometer over the outer dimensions),
  // gathering one innermost row into a packed buffer and converting it at once.
  const size_t nd = t.shape.size();
  const uint64_t inner = static_cast<uint64_t>(t.shape[nd - 1]);
  const uint64_t inner_stride = static_cast<uint64_t>(t.strides[nd - 1]) * elem;
  std::vector<uint8_t> packed(inner * elem);
  std::vector<int64_t> idx(nd, 0);
  float* out = dst.data();
  for (uint64_t done = 0; done < t.n_elements; done += inner, out += inner) {
    uint64_t off = 0;
    for (size_t d = 0; d + 1 < nd; ++d) off += static_cast<uint64_t>(idx[d]) * static_cast<uint64_t>(t.strides[d]);
    const uint8_t* row = base + off * elem;
    for (uint64_t j = 0; j < inner; ++j) std::memcpy(packed.data() + j * elem, row + j * inner_stride, elem);
    hf::to_f32(t.dtype, packed.data(), out, inner);
    for (size_t d = nd - 1; d-- > 0;) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace fdpp::torch_bin

namespace fdpp::torch_bin {

std::span<const uint8_t> TorchBinFile::contiguous_bytes(const TensorRecord& t) const {
  if (!t.contiguous() || !hf::dtype_readable(t.dtype) || t.n_elements == 0) return {};
  const std::span<const uint8_t> storage = storage_bytes(t.storage_key);
  const uint64_t elem = hf::dtype_bits(t.dtype) / 8;
  check((t.storage_offset + t.n_elements) * elem <= storage.size(), "{}: tensor '{}' reaches past its storage",
        image_.name(), shown(t.name));
  return storage.subspan(t.storage_offset * elem, t.n_elements * elem);
}

}  // namespace fdpp::torch_bin
