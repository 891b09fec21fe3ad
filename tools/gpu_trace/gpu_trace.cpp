// libfdpp_gpu_trace.so: the GPU's kernels, copies and memsets of any CUDA program, with their start
// and end times, through CUPTI's Activity API (the machine we measure on has no Nsight Systems).
//
//   CUDA_INJECTION64_PATH=build-gpu/libfdpp_gpu_trace.so FDPP_GPU_TRACE_OUT=run.gputrace PROGRAM ...
//   python3 bench/gpu_busy.py run.gputrace --plot busy.png
//
// The CUDA driver loads the library named by CUDA_INJECTION64_PATH at cuInit and calls its
// InitializeInjection. The file format is trace_file.h's; "%p" in FDPP_GPU_TRACE_OUT becomes the
// process id. Kernels of CUDA graphs come one record per node (CONCURRENT_KERNEL does that since
// CUDA 12). The records reach the file when CUPTI hands back a full buffer and at the end: at exit
// (atexit), or at SIGTERM / SIGINT where the program leaves those to the default action (fdpp
// serve blocks them and exits normally, through atexit).
#include <cupti.h>
#include <cxxabi.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

#include "trace_file.h"

namespace {

using fdpp::gpu_trace::Kind;
using fdpp::gpu_trace::Record;
using fdpp::gpu_trace::TraceWriter;

// Host buffers handed to CUPTI: 8 MiB hold some 30,000 kernel records; fewer, larger buffers mean
// fewer hand-backs on CUPTI's thread.
constexpr size_t kBufferBytes = size_t{8} << 20;
// Demangled template names can run to kilobytes; the head says which kernel it is.
constexpr size_t kMaxNameBytes = 400;

struct State {
  std::mutex mu;  // guards everything below but finished
  TraceWriter out;
  std::string path;
  pid_t pid = 0;
  bool open = false;
  std::unordered_map<const char*, uint32_t> name_ids;  // CUPTI's name pointers are stable per kernel
  uint64_t kernels = 0, copies = 0, memsets = 0, untimed = 0, dropped = 0;
  std::atomic<bool> finished{false};
};

// Never destroyed: CUPTI's thread and the atexit handler may use it after static destructors ran.
State& state() {
  static State* s = new State;
  return *s;
}

// The signal handler's only action: wake the flushing thread (write() is async-signal-safe).
int g_signal_pipe[2] = {-1, -1};

const char* cupti_error(CUptiResult r) {
  const char* s = nullptr;
  cuptiGetResultString(r, &s);
  return s ? s : "unknown CUPTI error";
}

bool check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  std::fprintf(stderr, "fdpp_gpu_trace: %s: %s\n", what, cupti_error(r));
  return false;
}

uint64_t realtime_ns() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t cupti_ns() {
  uint64_t t = 0;
  cuptiGetTimestamp(&t);
  return t;
}

std::string demangled(const char* name) {
  if (!name) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d ? d : name;
  std::free(d);
  if (s.size() > kMaxNameBytes) s = s.substr(0, kMaxNameBytes - 3) + "...";
  return s;
}

uint32_t name_id(State& s, const char* name) {
  auto it = s.name_ids.find(name);
  if (it != s.name_ids.end()) return it->second;
  const uint32_t id = s.out.name_id(demangled(name));
  s.name_ids.emplace(name, id);
  return id;
}

// One CUPTI record into ours. The structs are those of the CUPTI we build with (CUDA 13: Kernel10,
// Memcpy6, Memset4). A CUPTI of another version would hand back its own versions: the fields read
// here sit where they sat in the versions before, so a neighbouring version reads right too.
static_assert(offsetof(CUpti_ActivityKernel10, name) == offsetof(CUpti_ActivityKernel9, name) &&
              offsetof(CUpti_ActivityKernel10, graphId) == offsetof(CUpti_ActivityKernel9, graphId) &&
              offsetof(CUpti_ActivityKernel10, streamId) == offsetof(CUpti_ActivityKernel9, streamId));
static_assert(offsetof(CUpti_ActivityMemcpy6, graphId) == offsetof(CUpti_ActivityMemcpy5, graphId) &&
              offsetof(CUpti_ActivityMemset4, graphId) == offsetof(CUpti_ActivityMemset3, graphId));
void convert(State& s, const CUpti_Activity* a) {
  Record r{};
  uint64_t* count = nullptr;
  switch (a->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(a);
      r = Record{k->start, k->end, k->streamId, name_id(s, k->name), k->graphId,
                 static_cast<uint16_t>(k->deviceId), static_cast<uint8_t>(Kind::Kernel), 0};
      count = &s.kernels;
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(a);
      r = Record{m->start, m->end, m->streamId, 0, m->graphId, static_cast<uint16_t>(m->deviceId),
                 static_cast<uint8_t>(Kind::Memcpy), m->copyKind};
      count = &s.copies;
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(a);
      r = Record{m->start, m->end, m->streamId, 0, m->graphId, static_cast<uint16_t>(m->deviceId),
                 static_cast<uint8_t>(Kind::Memset), 0};
      count = &s.memsets;
      break;
    }
    default:
      return;  // not enabled
  }
  // Both timestamps 0: CUPTI could not time it (no device buffer left, or still running at a
  // forced flush).
  if (r.start_ns == 0 && r.end_ns == 0) {
    ++s.untimed;
    return;
  }
  ++*count;
  s.out.add(r);
  if (s.out.should_flush()) s.out.flush_records();
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // Activity records must be 8-byte aligned (ACTIVITY_RECORD_ALIGNMENT).
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;  // no buffer: CUPTI drops records and counts them
  *max_records = 0;                    // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t, size_t valid) {
  State& s = state();
  {
    std::lock_guard lock(s.mu);
    if (s.open && getpid() == s.pid) {
      CUpti_Activity* record = nullptr;
      for (;;) {
        const CUptiResult r = cuptiActivityGetNextRecord(buffer, valid, &record);
        if (r == CUPTI_ERROR_MAX_LIMIT_REACHED) break;  // the end of the buffer
        if (!check(r, "cuptiActivityGetNextRecord")) break;
        convert(s, record);
      }
      s.out.flush_records();
      size_t dropped = 0;
      if (cuptiActivityGetNumDroppedRecords(context, stream, &dropped) == CUPTI_SUCCESS) s.dropped += dropped;
    }
  }
  std::free(buffer);
}

// Hands back every buffer (records of work still running have no timestamps and are counted as
// such), then closes the file. Once per process; a forked child never writes its parent's file.
void finish() {
  State& s = state();
  if (getpid() != s.pid || s.finished.exchange(true)) return;
  check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
  std::lock_guard lock(s.mu);
  if (!s.open) return;
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS) s.dropped += dropped;
  s.out.stats(s.dropped, s.untimed);
  s.out.clock(cupti_ns(), realtime_ns());
  const bool ok = s.out.close();
  s.open = false;
  std::fprintf(stderr,
               "fdpp_gpu_trace: %s%s: %llu kernels, %llu copies, %llu memsets, %zu kernel names; "
               "%llu without timestamps, %llu dropped\n",
               s.path.c_str(), ok ? "" : " (WRITE FAILED)", static_cast<unsigned long long>(s.kernels),
               static_cast<unsigned long long>(s.copies), static_cast<unsigned long long>(s.memsets),
               s.out.names(), static_cast<unsigned long long>(s.untimed),
               static_cast<unsigned long long>(s.dropped));
}

void at_exit() { finish(); }

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char b = static_cast<unsigned char>(sig);
  if (write(g_signal_pipe[1], &b, 1) < 0) {
  }
  errno = saved;
}

// Runs with every signal blocked, so the signals still reach the program's own threads.
void* flush_on_signal(void*) {
  unsigned char b = 0;
  ssize_t n;
  while ((n = read(g_signal_pipe[0], &b, 1)) < 0 && errno == EINTR) {
  }
  if (n != 1) return nullptr;
  const int sig = b;
  finish();
  // The default action now ends the process with the signal's status, as it would have without
  // the tracer. It reaches the thread that ran the handler (which had it unblocked); _exit is the
  // fallback should none take it.
  signal(sig, SIG_DFL);
  kill(getpid(), sig);
  sleep(5);
  _exit(128 + sig);
}

void install_signal_flush() {
  if (pipe(g_signal_pipe) != 0) return;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t t;
  const bool started = pthread_create(&t, nullptr, flush_on_signal, nullptr) == 0;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (!started) return;
  pthread_detach(t);
  for (int sig : {SIGTERM, SIGINT}) {
    // Only where the default action would end the process without atexit: a program with its own
    // handler (or one that ignores the signal) keeps it.
    struct sigaction cur {};
    if (sigaction(sig, nullptr, &cur) != 0 || (cur.sa_flags & SA_SIGINFO) || cur.sa_handler != SIG_DFL) continue;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(sig, &sa, nullptr);
  }
}

std::string expand_pid(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      out += std::to_string(getpid());
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

}  // namespace

// Called by the CUDA driver during cuInit. Returns 1 also when tracing could not start, so that
// the program runs on untraced (the reason is on stderr).
extern "C" __attribute__((visibility("default"))) int InitializeInjection(void) {
  static std::atomic<bool> once{false};
  if (once.exchange(true)) return 1;
  const char* env = std::getenv("FDPP_GPU_TRACE_OUT");
  if (!env || !*env) {
    std::fprintf(stderr, "fdpp_gpu_trace: FDPP_GPU_TRACE_OUT is not set; not tracing\n");
    return 1;
  }
  State& s = state();
  {
    std::lock_guard lock(s.mu);
    s.path = expand_pid(env);
    s.pid = getpid();
    if (!s.out.open(s.path)) {
      std::fprintf(stderr, "fdpp_gpu_trace: cannot write %s: %s; not tracing\n", s.path.c_str(), strerror(errno));
      return 1;
    }
    s.out.clock(cupti_ns(), realtime_ns());
    s.open = true;
  }
  if (!check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks")) {
    std::lock_guard lock(s.mu);
    s.out.close();
    s.open = false;
    return 1;
  }
  int enabled = 0;
  enabled += check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enable CONCURRENT_KERNEL");
  enabled += check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enable MEMCPY");
  enabled += check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enable MEMSET");
  std::atexit(at_exit);
  install_signal_flush();
  uint32_t version = 0;
  cuptiGetVersion(&version);
  std::fprintf(stderr, "fdpp_gpu_trace: recording %s to %s (CUPTI API %u, built with %u)\n",
               enabled == 3   ? "kernels, copies and memsets"
               : enabled == 0 ? "NOTHING (see above)"
                              : "SOME activity kinds only (see above)", s.path.c_str(),
               static_cast<unsigned>(version), static_cast<unsigned>(CUPTI_API_VERSION));
  return 1;
}
