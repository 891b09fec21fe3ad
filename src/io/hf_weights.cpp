// open_hf_weights (weight_source.h): finds the weights of an HF model directory — one file or an
// index with shards, safetensors or PyTorch .bin — validates every shard's header and the index's
// claims about them, and serves the tensors through one WeightSource.
#include <fmt/format.h>

#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <system_error>
#include <unordered_map>

#include "core/mapped_file.h"
#include "fdpp/error.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "io/torch_bin.h"
#include "io/weight_source.h"

namespace fdpp {

namespace {

namespace fs = std::filesystem;
using hf::shown;
using nlohmann::json;

// An index lists a few thousand tensors at most (a few hundred KB); anything near this is not one.
constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;

enum class Format { Safetensors, Pytorch };

class HfWeights final : public WeightSource {
 public:
  HfWeights(std::string origin, Format format) : origin_(std::move(origin)), format_(format) {}

  const std::string& origin() const override { return origin_; }
  std::string format() const override { return format_ == Format::Safetensors ? "safetensors" : "pytorch"; }
  const std::vector<SourceTensor>& tensors() const override { return tensors_; }

  const SourceTensor* find(std::string_view name) const override {
    const auto it = index_.find(std::string(name));
    return it == index_.end() ? nullptr : &tensors_[it->second];
  }

  void read_f32(const SourceTensor& tensor, std::span<float> dst) const override {
    const auto it = index_.find(tensor.name);
    if (it == index_.end()) fail("{}: no tensor '{}'", origin_, shown(tensor.name));
    const size_t shard = shard_of_[it->second];
    if (format_ == Format::Safetensors) {
      const safetensors::SafetensorsFile& f = *st_[shard];
      f.read_f32(*f.find(tensor.name), dst);
    } else {
      const torch_bin::TorchBinFile& f = *pt_[shard];
      f.read_f32(*f.find(tensor.name), dst);
    }
  }

  RawTensorBytes raw_bytes(const SourceTensor& tensor) const override {
    const auto it = index_.find(tensor.name);
    if (it == index_.end()) fail("{}: no tensor '{}'", origin_, shown(tensor.name));
    const size_t shard = shard_of_[it->second];
    RawTensorBytes r;
    if (format_ == Format::Safetensors) {
      const safetensors::SafetensorsFile& f = *st_[shard];
      const safetensors::TensorInfo& info = *f.find(tensor.name);
      const auto bytes = f.tensor_bytes(info);
      r.data = bytes.data();
      r.n_bytes = bytes.size();
      if (f.on_disk()) r.file = f.path(), r.file_offset = info.offset;
    } else {
      const torch_bin::TorchBinFile& f = *pt_[shard];
      const auto bytes = f.contiguous_bytes(*f.find(tensor.name));
      if (bytes.data() == nullptr) return {};
      r.data = bytes.data();
      r.n_bytes = bytes.size();
      if (f.on_disk()) r.file = f.path(), r.file_offset = f.file_offset_of(bytes.data());
    }
    return r;
  }

  // Opens one shard and adds its tensors; returns the shard's number.
  size_t add_shard(const std::string& path) {
    const size_t shard = format_ == Format::Safetensors ? st_.size() : pt_.size();
    if (format_ == Format::Safetensors) {
      st_.push_back(std::make_unique<safetensors::SafetensorsFile>(safetensors::SafetensorsFile::open(path)));
      for (const safetensors::TensorInfo& t : st_.back()->tensors()) add(path, shard, t.name, t.shape, t.dtype, t.n_bytes);
    } else {
      pt_.push_back(std::make_unique<torch_bin::TorchBinFile>(torch_bin::TorchBinFile::open(path)));
      for (const torch_bin::TensorRecord& t : pt_.back()->tensors()) {
        const uint64_t n_bytes = t.n_elements * (hf::dtype_bits(t.dtype) / 8);  // inside the file: checked
        add(path, shard, t.name, t.shape, t.dtype, n_bytes);
      }
    }
    return shard;
  }

  bool shard_holds(size_t shard, const std::string& name) const {
    return format_ == Format::Safetensors ? st_[shard]->find(name) != nullptr : pt_[shard]->find(name) != nullptr;
  }

 private:
  void add(const std::string& path, size_t shard, const std::string& name, const std::vector<int64_t>& shape,
           const std::string& dtype, uint64_t n_bytes) {
    if (const auto it = index_.find(name); it != index_.end())
      fail("{}: tensor '{}' is in both {} and {}", origin_, shown(name), tensors_[it->second].file, path);
    index_.emplace(name, tensors_.size());
    shard_of_.push_back(shard);
    tensors_.push_back(SourceTensor{name, shape, dtype, n_bytes, path});
  }

  std::string origin_;
  Format format_;
  std::vector<SourceTensor> tensors_;
  std::vector<size_t> shard_of_;  // per tensor
  std::unordered_map<std::string, size_t> index_;
  std::vector<std::unique_ptr<safetensors::SafetensorsFile>> st_;
  std::vector<std::unique_ptr<torch_bin::TorchBinFile>> pt_;
};

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);  // follows symlinks (the HF cache links snapshots to blobs)
}

// A weight_map value must name a file inside the directory: a relative path whose components are
// plain names (no "..", no ".", no empty component, no absolute path, no backslash or NUL).
bool is_inside_name(std::string_view name) {
  if (name.empty() || name.front() == '/') return false;
  size_t start = 0;
  while (true) {
    const size_t slash = name.find('/', start);
    const std::string_view part = name.substr(start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (part.empty() || part == "." || part == "..") return false;
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return name.find('\\') == std::string_view::npos && name.find('\0') == std::string_view::npos;
}

std::unique_ptr<WeightSource> open_single(const fs::path& file, Format format, const std::string& origin) {
  auto w = std::make_unique<HfWeights>(origin, format);
  w->add_shard(file.string());
  return w;
}

std::unique_ptr<WeightSource> open_index(const fs::path& dir, const fs::path& index_path, Format format,
                                         const std::string& origin) {
  const std::string ipath = index_path.string();
  const std::string iname = index_path.filename().string();
  json index;
  {
    const MappedFile f(ipath);
    if (f.size() == 0) fail("{}: empty file", ipath);
    if (f.size() > kMaxIndexBytes) fail("{}: {} bytes is too large for a weight index", ipath, f.size());
    try {
      index = parse_json(std::string_view(reinterpret_cast<const char*>(f.data()), f.size()));
    } catch (const JsonSyntaxError& e) {
      fail("{}: not valid JSON: {}", ipath, shown(e.what()));
    }
  }
  if (!index.is_object()) fail("{}: is a JSON {}, not an object", ipath, index.type_name());
  const auto wm = index.find("weight_map");
  if (wm == index.end()) fail("{}: has no weight_map", ipath);
  if (!wm->is_object()) fail("{}: weight_map is a {}, not an object", ipath, wm->type_name());
  if (wm->empty()) fail("{}: weight_map names no tensors", ipath);

  // Shards in the order of their names (model-00001-of-00002 before model-00002-of-00002).
  std::map<std::string, std::vector<std::string>> shards;  // shard -> tensors it should hold
  for (const auto& [tensor, file] : wm->items()) {
    if (!file.is_string())
      fail("{}: weight_map entry '{}' is a {}, not a file name", ipath, shown(tensor), file.type_name());
    const std::string& name = file.get_ref<const std::string&>();
    if (!is_inside_name(name))
      fail("{}: weight_map puts tensor '{}' in '{}', which is not a file inside {}", ipath, shown(tensor), shown(name),
           dir.string());
    shards[name].push_back(tensor);
  }
  for (const auto& [name, tensors] : shards)
    if (!is_file(dir / name))
      fail("{}: shard {} named by {} is missing", dir.string(), shown(name), iname);

  auto w = std::make_unique<HfWeights>(origin, format);
  std::map<std::string, size_t> shard_number;
  for (const auto& [name, tensors] : shards) shard_number[name] = w->add_shard((dir / name).string());
  for (const auto& [name, tensors] : shards) {
    for (const std::string& tensor : tensors) {
      if (w->shard_holds(shard_number[name], tensor)) continue;
      const SourceTensor* elsewhere = w->find(tensor);
      if (elsewhere != nullptr)
        fail("{}: {} puts tensor '{}' in {}, but it is in {}", dir.string(), iname, shown(tensor), shown(name),
             elsewhere->file);
      fail("{}: {} puts tensor '{}' in {}, which does not hold it", dir.string(), iname, shown(tensor), shown(name));
    }
  }
  return w;
}

}  // namespace

std::unique_ptr<WeightSource> open_hf_weights(const std::string& directory) {
  const fs::path dir(directory);
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec || !fs::exists(st)) fail("{}: no such file or directory", directory);

  // A file rather than a directory: open it as what its name says it is.
  if (fs::is_regular_file(st)) {
    const std::string name = dir.filename().string();
    const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
    if (name.ends_with(".safetensors.index.json")) return open_index(parent, dir, Format::Safetensors, directory);
    if (name.ends_with(".bin.index.json")) return open_index(parent, dir, Format::Pytorch, directory);
    if (name.ends_with(".safetensors")) return open_single(dir, Format::Safetensors, directory);
    return open_single(dir, Format::Pytorch, directory);
  }
  if (!fs::is_directory(st)) fail("{}: not a directory", directory);

  if (is_file(dir / "model.safetensors")) return open_single(dir / "model.safetensors", Format::Safetensors, directory);
  if (is_file(dir / "model.safetensors.index.json"))
    return open_index(dir, dir / "model.safetensors.index.json", Format::Safetensors, directory);
  if (is_file(dir / "pytorch_model.bin")) return open_single(dir / "pytorch_model.bin", Format::Pytorch, directory);
  if (is_file(dir / "pytorch_model.bin.index.json"))
    return open_index(dir, dir / "pytorch_model.bin.index.json", Format::Pytorch, directory);
  fail("{}: no weights found (looked for model.safetensors, model.safetensors.index.json, pytorch_model.bin, "
       "pytorch_model.bin.index.json)",
       directory);
}

}  // namespace fdpp
