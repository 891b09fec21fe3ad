// The file that libfdpp_gpu_trace.so writes and bench/gpu_busy.py reads: one compact record per GPU
// activity (kernel, copy, memset) with the kernel names in a table. No CUPTI here, so that the CPU
// build can write the same format in its tests.
//
// Layout (little endian): the 8 bytes "FDPPGPUT", u32 version, u32 record size (32), then chunks,
// each u32 type, u32 payload bytes, payload:
//   1 clock:   u64 CUPTI timestamp, u64 CLOCK_REALTIME ns, read together (at start and at the end):
//              maps the GPU's timestamps onto wall-clock times of other logs
//   2 name:    u32 id (from 1), the kernel's name in UTF-8 (the rest of the payload)
//   3 records: Record[n]
//   4 stats:   u64 records CUPTI dropped, u64 records without timestamps (not written)
//   5 end:     empty; the trace was closed cleanly (a file without it was cut short)
// A name chunk precedes the first record that uses its id, so a file cut short still reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <unordered_map>
#include <vector>

namespace fdpp::gpu_trace {

inline constexpr char kMagic[8] = {'F', 'D', 'P', 'P', 'G', 'P', 'U', 'T'};
inline constexpr uint32_t kVersion = 1;

enum class Kind : uint8_t { Kernel = 1, Memcpy = 2, Memset = 3 };
enum ChunkType : uint32_t { kClock = 1, kName = 2, kRecords = 3, kStats = 4, kEnd = 5 };

struct Record {
  uint64_t start_ns;  // CUPTI timestamps (ns)
  uint64_t end_ns;
  uint32_t stream;
  uint32_t name;   // kernel name id, 0 for copies and memsets
  uint32_t graph;  // id of the CUDA graph that launched it, 0 outside graphs
  uint16_t device;
  uint8_t kind;    // Kind
  uint8_t detail;  // copies: CUpti_ActivityMemcpyKind (1 HtoD, 2 DtoH, 8 DtoD, ...); else 0
};
// bench/gpu_busy.py unpacks these with struct format "<QQIIIHBB".
static_assert(sizeof(Record) == 32);
static_assert(offsetof(Record, stream) == 16 && offsetof(Record, graph) == 24 && offsetof(Record, device) == 28);

// Not thread safe: the caller serializes. Records are buffered and go out as one chunk per
// flush_records(); each chunk is flushed to the file, so that a process that dies keeps them.
class TraceWriter {
 public:
  TraceWriter() = default;
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;
  ~TraceWriter() { close(); }

  bool open(const std::string& path) {
    close();
    f_ = std::fopen(path.c_str(), "wb");
    if (!f_) return false;
    const uint32_t head[2] = {kVersion, static_cast<uint32_t>(sizeof(Record))};
    put(kMagic, sizeof kMagic);
    put(head, sizeof head);
    return std::fflush(f_) == 0;
  }
  bool is_open() const { return f_ != nullptr; }

  // The id of a kernel name, written as a name chunk the first time it is seen.
  uint32_t name_id(const std::string& name) {
    auto [it, added] = names_.try_emplace(name, static_cast<uint32_t>(names_.size() + 1));
    if (added && f_) {
      chunk_header(kName, static_cast<uint32_t>(4 + name.size()));
      put(&it->second, 4);
      put(name.data(), name.size());
    }
    return it->second;
  }

  void add(const Record& r) { pending_.push_back(r); }

  void flush_records() {
    if (!f_ || pending_.empty()) return;
    chunk_header(kRecords, static_cast<uint32_t>(pending_.size() * sizeof(Record)));
    put(pending_.data(), pending_.size() * sizeof(Record));
    written_ += pending_.size();
    pending_.clear();
    std::fflush(f_);
  }
  // The chunk's size field is 32 bits: 100,000 records (3.2 MB) at most per chunk.
  bool should_flush() const { return pending_.size() >= 100000; }

  void clock(uint64_t cupti_ns, uint64_t realtime_ns) {
    if (!f_) return;
    const uint64_t v[2] = {cupti_ns, realtime_ns};
    chunk_header(kClock, sizeof v);
    put(v, sizeof v);
    std::fflush(f_);
  }

  void stats(uint64_t dropped, uint64_t untimed) {
    if (!f_) return;
    const uint64_t v[2] = {dropped, untimed};
    chunk_header(kStats, sizeof v);
    put(v, sizeof v);
  }

  // Writes what is pending and the end chunk; true when every write reached the file.
  bool close() {
    if (!f_) return true;
    flush_records();
    chunk_header(kEnd, 0);
    const bool ok = !failed_ && std::fflush(f_) == 0;
    const bool closed = std::fclose(f_) == 0;
    f_ = nullptr;
    return ok && closed;
  }

  uint64_t written() const { return written_; }
  size_t names() const { return names_.size(); }

 private:
  void chunk_header(uint32_t type, uint32_t bytes) {
    const uint32_t h[2] = {type, bytes};
    put(h, sizeof h);
  }
  void put(const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f_) != n) failed_ = true;
  }

  std::FILE* f_ = nullptr;
  bool failed_ = false;
  uint64_t written_ = 0;
  std::unordered_map<std::string, uint32_t> names_;
  std::vector<Record> pending_;
};

}  // namespace fdpp::gpu_trace
