#include "backend/cuda/weight_streamer.h"

#include <fcntl.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>

#include "backend/cuda/check.h"
#include "fdpp/error.h"

namespace fdpp::cuda {

namespace {

using Clock = std::chrono::steady_clock;

class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes) {
    FDPP_CUDA_CHECK(cudaHostAlloc(&ptr_, bytes, cudaHostAllocDefault));
  }
  ~PinnedBuffer() { cudaFreeHost(ptr_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

class Event {
 public:
  Event() { FDPP_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  ~Event() { cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// Files opened once for pread, closed at the end of the load.
class Files {
 public:
  ~Files() {
    for (auto& [path, fd] : fds_) ::close(fd);
  }
  int fd(const std::string& path) {
    const auto it = fds_.find(path);
    if (it != fds_.end()) return it->second;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    check(fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
    // The whole file is read once, front to back.
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    fds_.emplace(path, fd);
    return fd;
  }

 private:
  std::map<std::string, int> fds_;
};

// Reads n bytes at offset into dst with `threads` threads, each a contiguous slice.
void parallel_pread(int fd, const std::string& path, const std::string& tensor, uint64_t offset, uint8_t* dst,
                    uint64_t n, int threads) {
  constexpr uint64_t kSlice = uint64_t{4} << 20;
  const int64_t slices = static_cast<int64_t>((n + kSlice - 1) / kSlice);
  int failed_errno = 0;
  bool short_read = false;
#pragma omp parallel for num_threads(std::max(1, threads)) schedule(dynamic, 1) if (slices > 1)
  for (int64_t s = 0; s < slices; ++s) {
    uint64_t at = static_cast<uint64_t>(s) * kSlice;
    const uint64_t end = std::min(n, at + kSlice);
    while (at < end) {
      const ssize_t got = ::pread(fd, dst + at, end - at, static_cast<off_t>(offset + at));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
#pragma omp critical
        {
          if (got < 0) failed_errno = errno;
          else short_read = true;
        }
        break;
      }
      at += static_cast<uint64_t>(got);
    }
  }
  check(failed_errno == 0, "{}: reading tensor '{}': {}", path, tensor, std::strerror(failed_errno));
  check(!short_read, "{}: reading tensor '{}': the file ends early", path, tensor);
}

void parallel_copy(const uint8_t* src, uint8_t* dst, uint64_t n, int threads) {
  constexpr uint64_t kSlice = uint64_t{4} << 20;
  const int64_t slices = static_cast<int64_t>((n + kSlice - 1) / kSlice);
#pragma omp parallel for num_threads(std::max(1, threads)) schedule(dynamic, 1) if (slices > 1)
  for (int64_t s = 0; s < slices; ++s) {
    const uint64_t at = static_cast<uint64_t>(s) * kSlice;
    std::memcpy(dst + at, src + at, std::min(kSlice, n - at));
  }
}

}  // namespace

StreamStats stream_weights(const std::vector<StreamJob>& jobs, DType dtype, const StreamOptions& o,
                           cudaStream_t stream) {
  const auto t0 = Clock::now();
  const gguf::GgmlType engine_type = dtype == DType::F16 ? gguf::GgmlType::F16 : gguf::GgmlType::BF16;

  // Per job: the unit a chunk is made of (elements, and bytes in the staging buffer): whole blocks,
  // or whole heads when rows are permuted (the kernel permutes within its chunk).
  struct Unit {
    int64_t elems;
    uint64_t staged_bytes;
    bool host_dequant;
  };
  std::vector<Unit> units;
  size_t largest = 0;
  StreamProgress progress;
  progress.tensors_total = static_cast<int>(jobs.size());
  for (const StreamJob& j : jobs) {
    const PlannedTensor& p = *j.tensor;
    const gguf::GgmlType t = p.src.data == nullptr ? gguf::GgmlType::F32 : p.src.type;
    check(!p.fp8() || (p.src.data != nullptr && p.stored_cols == 0 && p.permute_heads == 0 && p.add == 0.f),
          "{}: an FP8 tensor streams as its bytes in place, unsliced", p.src.name);
    check(!j.blocks || (p.src.data != nullptr && p.stored_cols == 0 && p.add == 0.f && !p.fp8() && gpu_converts(t)),
          "{}: only an unsliced GGUF tensor of a block type streams as its blocks", p.src.name);
    // FP8 bytes go to the device as they are; the engine reads e4m3 (DeviceModel::from_plan).
    const bool host = !p.fp8() && !j.blocks && !gpu_converts(t);
    const int64_t be = static_cast<int64_t>(gguf::block_elements(t));
    int64_t elems = be;
    if (p.permute_heads > 0) {
      check(p.rows() % p.permute_heads == 0 && (p.rows() / p.permute_heads) % 2 == 0,
            "{}: {} rows do not split into {} heads of an even size", p.src.name, p.rows(), p.permute_heads);
      elems = p.rows() / p.permute_heads * p.cols();
    }
    if (p.stored_cols > 0 && p.src.data != nullptr) elems = p.cols();  // a column slice: whole rows
    check(elems % be == 0 && p.numel() % elems == 0, "{}: {} elements are not whole blocks of {}", p.src.name,
          p.numel(), gguf::type_name(t));
    const uint64_t staged = host ? static_cast<uint64_t>(elems) * 4
                                 : static_cast<uint64_t>(elems / be) * gguf::block_bytes(t);
    units.push_back({elems, staged, host});
    largest = std::max<size_t>(largest, staged);
    progress.bytes_total += p.src.n_bytes;
  }
  const size_t buf_bytes = std::max(o.staging_bytes, largest);
  const int nbuf = std::clamp(o.staging_buffers, 2, 16);
  std::vector<std::unique_ptr<PinnedBuffer>> pinned;
  std::vector<DeviceBuffer> raw;
  std::vector<std::unique_ptr<Event>> done;
  for (int i = 0; i < nbuf; ++i) {
    pinned.push_back(std::make_unique<PinnedBuffer>(buf_bytes));
    raw.emplace_back(buf_bytes);
    done.push_back(std::make_unique<Event>());
  }
  bool used[16] = {};
  Files files;
  int slot = 0;
  std::vector<float> fallback;  // a tensor read through read_f32 (not in place in its file)

  try {
  for (size_t ji = 0; ji < jobs.size(); ++ji) {
    const PlannedTensor& p = *jobs[ji].tensor;
    const Unit& u = units[ji];
    const gguf::GgmlType stored = p.src.data == nullptr ? gguf::GgmlType::F32 : p.src.type;
    const uint8_t* base = p.src.data;
    bool use_file = !p.src.file.empty() && o.read_threads > 0;
    if (p.src.data == nullptr) {
      fallback.assign(static_cast<size_t>(p.numel()), 0.f);
      p.src.read_f32(fallback);
      base = reinterpret_cast<const uint8_t*>(fallback.data());
      use_file = false;
    }
    const int64_t be = static_cast<int64_t>(gguf::block_elements(stored));
    const uint64_t bb = gguf::block_bytes(stored);
    const int64_t units_per_chunk = std::max<int64_t>(1, static_cast<int64_t>(buf_bytes / u.staged_bytes));
    const int64_t chunk_elems = units_per_chunk * u.elems;
    const bool blocks = jobs[ji].blocks;
    const bool direct =
        p.fp8() || (blocks && p.permute_heads == 0) || (!u.host_dequant && stored == engine_type && p.permute_heads == 0);
    // Bytes per element at the destination: e4m3 bytes, else the engine's 16-bit type (blocks: the
    // offset of element e0, whole blocks, is e0 / be blocks).
    const int64_t dst_elem = p.fp8() ? 1 : 2;
    auto dst_at = [&](int64_t e0) {
      return static_cast<uint8_t*>(jobs[ji].dst) +
             (blocks ? static_cast<int64_t>(e0 / be * static_cast<int64_t>(bb)) : e0 * dst_elem);
    };
    for (int64_t e0 = 0; e0 < p.numel(); e0 += chunk_elems) {
      const int64_t n = std::min(chunk_elems, p.numel() - e0);
      const uint64_t src_off = static_cast<uint64_t>(e0 / be) * bb, src_len = static_cast<uint64_t>(n / be) * bb;
      // Wait until this buffer's last copy and conversion are done, then fill it.
      if (used[slot]) FDPP_CUDA_CHECK(cudaEventSynchronize(done[slot]->get()));
      uint8_t* host = pinned[slot]->get();
      uint64_t staged = src_len;
      if (p.stored_cols > 0 && base == p.src.data) {
        // A column slice: gather each row's columns from the mapping (the staged chunk is then
        // whole rows of the slice, contiguous, as for any other tensor).
        const int64_t cols = p.cols(), r0 = e0 / cols, rows = n / cols;
        const uint64_t slice_bytes = p.bytes_of(cols);
        auto* f = reinterpret_cast<float*>(host);
#pragma omp parallel for num_threads(std::max(1, o.read_threads)) schedule(static) if (rows > 64)
        for (int64_t r = 0; r < rows; ++r) {
          const uint8_t* row = base + (r0 + r) * p.stored_row_bytes() + p.col_byte_offset();
          if (u.host_dequant) gguf::dequantize(stored, row, f + r * cols, static_cast<uint64_t>(cols));
          else std::memcpy(host + r * slice_bytes, row, slice_bytes);
        }
        if (u.host_dequant) staged = static_cast<uint64_t>(n) * 4;
      } else if (u.host_dequant) {
        gguf::dequantize(stored, base + src_off, reinterpret_cast<float*>(host), static_cast<uint64_t>(n));
        staged = static_cast<uint64_t>(n) * 4;
      } else if (use_file) {
        parallel_pread(files.fd(p.src.file), p.src.file, p.src.name, p.src.file_offset + src_off, host, src_len,
                       o.read_threads);
      } else {
        parallel_copy(base + src_off, host, src_len, std::max(1, o.read_threads));
      }
      if (direct) {
        FDPP_CUDA_CHECK(cudaMemcpyAsync(dst_at(e0), host, staged, cudaMemcpyHostToDevice, stream));
      } else if (blocks) {  // q/k rows in llama.cpp's order: whole heads per chunk, permuted on the GPU
        FDPP_CUDA_CHECK(cudaMemcpyAsync(raw[slot].get(), host, staged, cudaMemcpyHostToDevice, stream));
        permute_stored_rows(raw[slot].get(), n / p.cols(), p.bytes_of(p.cols()), p.rows() / p.permute_heads,
                            dst_at(e0), stream);
      } else {
        FDPP_CUDA_CHECK(cudaMemcpyAsync(raw[slot].get(), host, staged, cudaMemcpyHostToDevice, stream));
        convert_stored(u.host_dequant ? gguf::GgmlType::F32 : stored, raw[slot].get(), n, p.cols(),
                       p.permute_heads > 0 ? p.rows() / p.permute_heads : 0, dst_at(e0), dtype, stream);
      }
      FDPP_CUDA_CHECK(cudaEventRecord(done[slot]->get(), stream));
      used[slot] = true;
      slot = (slot + 1) % nbuf;
      progress.bytes_done += std::min<uint64_t>(src_len, p.src.n_bytes);
      if (o.progress) {
        progress.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
        o.progress(progress);
      }
    }
    progress.tensors_done = static_cast<int>(ji + 1);
    if (o.progress) {
      progress.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
      o.progress(progress);
    }
  }
  } catch (...) {
    cudaStreamSynchronize(stream);  // no copy may still read a staging buffer being freed
    throw;
  }
  FDPP_CUDA_CHECK(cudaStreamSynchronize(stream));
  StreamStats s;
  s.tensors = static_cast<int>(jobs.size());
  s.bytes = progress.bytes_total;
  s.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return s;
}

}  // namespace fdpp::cuda
