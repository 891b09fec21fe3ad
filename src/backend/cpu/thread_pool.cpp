#include "backend/cpu/thread_pool.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fdpp::cpu {

namespace {

inline void cpu_relax() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// How long an idle thread polls before it sleeps on a futex. Inside a decode step the gaps between
// parallel loops (norms, RoPE, activation quantization) last a few microseconds, so a worker that
// polls across them skips the wake-up syscall (~5-20 us round trip here). Between steps (sampling,
// detokenizing) or when the machine is idle the workers sleep after this long, so they do not burn
// a core that another process wants. 100 us: SmolLM2-135M decode at 2 threads was within noise of
// 1 ms of polling (and well above 10 us) on the 2-core dev machine.
constexpr auto kSpin = std::chrono::microseconds(100);

// Sleeping on raw futexes (Linux): wakers check a sleeper count or flag first (seq_cst on both
// sides, so no wake-up is lost), so a wake costs a syscall only when someone sleeps.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected) {
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

template <class Pred>
bool spin_until(Pred ready) {
  const auto until = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    if (ready()) return true;
    cpu_relax();
    if ((i & 63) == 0 && std::chrono::steady_clock::now() > until) return ready();
  }
}

class Pool {
 public:
  explicit Pool(int n_threads) : n_threads_(std::max(1, n_threads)) {
    for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker(); });
  }
  ~Pool() {
    stop_.store(true);
    epoch_.fetch_add(1);
    futex_wake_all(&epoch_);
    for (auto& t : workers_) t.join();
  }
  int size() const { return n_threads_; }

  void run(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
    done_.store(0, std::memory_order_relaxed);
    fn_.store(&fn, std::memory_order_relaxed);
    const uint32_t ep = ++last_epoch_;
    // The counter packs (epoch, next task) so that a worker still holding the previous epoch can
    // never take a task of this one. It is replaced before the new task count is published: a
    // worker of the previous epoch that read its (exhausted) counter and then this call's larger
    // count fails its compare-exchange, because the count's release orders the new counter before
    // it. (Published the other way round, such a worker claimed task n_previous of the old counter
    // and ran it as a task of this call, twice, and its done_ could end this call with a task still
    // running on the caller's stack: heap corruption under 16 threads, in the GPU suite's CPU
    // reference engine. ThreadPool.BackToBackCalls... reproduces it.)
    counter_.store(static_cast<uint64_t>(ep) << 32, std::memory_order_release);
    n_tasks_.store(n_tasks, std::memory_order_release);
    epoch_.store(ep);  // seq_cst, paired with the workers' sleepers_ increment (no lost wake-up)
    if (sleepers_.load() > 0) futex_wake_all(&epoch_);
    take_tasks(ep);
    // Wait only for tasks that others took and have not finished.
    const auto all = static_cast<uint32_t>(n_tasks);
    if (!spin_until([&] { return done_.load(std::memory_order_acquire) >= all; })) {
      caller_waiting_.store(true);
      for (uint32_t d = done_.load(); d < all; d = done_.load()) futex_wait(&done_, d);
      caller_waiting_.store(false);
    }
  }

 private:
  void take_tasks(uint32_t ep) {
    uint64_t c = counter_.load(std::memory_order_acquire);
    for (;;) {
      if (static_cast<uint32_t>(c >> 32) != ep) return;
      const int64_t idx = static_cast<int64_t>(c & 0xFFFFFFFFu);
      if (idx >= n_tasks_.load(std::memory_order_acquire)) return;
      if (!counter_.compare_exchange_weak(c, c + 1, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
      (*fn_.load(std::memory_order_relaxed))(idx);
      // seq_cst: against the caller's caller_waiting_ store then done_ load (no lost wake-up).
      const uint32_t d = done_.fetch_add(1) + 1;
      if (d == static_cast<uint32_t>(n_tasks_.load(std::memory_order_relaxed)) && caller_waiting_.load())
        futex_wake_all(&done_);
      c = counter_.load(std::memory_order_acquire);
    }
  }

  void worker() {
    // Epoch 0 is the pool's state at construction (jobs start at 1): a worker that starts late
    // still sees the first job, and one that starts after the destructor began sees stop_.
    uint32_t seen = 0;
    for (;;) {
      if (!spin_until([&] { return epoch_.load(std::memory_order_acquire) != seen || stop_.load(); })) {
        sleepers_.fetch_add(1);
        while (epoch_.load() == seen && !stop_.load()) futex_wait(&epoch_, seen);
        sleepers_.fetch_sub(1);
      }
      if (stop_.load()) return;
      seen = epoch_.load(std::memory_order_acquire);
      take_tasks(seen);
    }
  }

  const int n_threads_;
  std::vector<std::thread> workers_;
  uint32_t last_epoch_ = 0;  // the caller's copy
  std::atomic<uint32_t> epoch_{0};
  std::atomic<uint64_t> counter_{0};
  std::atomic<int64_t> n_tasks_{0};
  std::atomic<const std::function<void(int64_t)>*> fn_{nullptr};
  std::atomic<uint32_t> done_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> caller_waiting_{false};
  std::atomic<bool> stop_{false};
};

std::mutex g_mutex;  // guards creation and replacement of the pool
// Shared: a parallel_for holds its pool until it returns, so set_num_threads on another thread
// replaces the pool without destroying one in use (the last holder destroys it). (A plain owner
// freed a pool under a running parallel_for: a use-after-free ThreadSanitizer reported and a
// hang, e.g. two Python models with different thread counts used from two threads.)
std::shared_ptr<Pool> g_pool;
std::atomic<bool> g_busy{false};  // a parallel_for is running: nested or concurrent calls go serial

std::shared_ptr<Pool> pool() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_pool) g_pool = std::make_shared<Pool>(physical_cores());
  return g_pool;
}

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

}  // namespace

int physical_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return std::max(1u, std::thread::hardware_concurrency());
  std::set<std::pair<std::string, std::string>> cores;
  int logical = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    ++logical;
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    const std::string core = read_line(base + "core_id"), package = read_line(base + "physical_package_id");
    // Without topology (some containers) every logical CPU counts as a core.
    cores.emplace(package, core.empty() ? "cpu" + std::to_string(cpu) : core);
  }
  return std::max(1, std::min(logical, static_cast<int>(cores.size())));
}

void set_num_threads(int n) {
  if (n <= 0) n = physical_cores();
  std::shared_ptr<Pool> old;  // released after the lock: joins its workers unless still in use
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_pool && g_pool->size() == n) return;
    old = std::move(g_pool);
    g_pool = std::make_shared<Pool>(n);
  }
}

int num_threads() { return pool()->size(); }

void parallel_for(int64_t n_tasks, const std::function<void(int64_t)>& fn) {
  if (n_tasks <= 0) return;
  // Held until the tasks are done. A worker never holds the last reference to its own pool: a
  // nested parallel_for inside a task takes the current pool, so ~Pool never joins itself.
  const std::shared_ptr<Pool> p = pool();
  bool expected = false;
  if (n_tasks == 1 || p->size() == 1 || !g_busy.compare_exchange_strong(expected, true)) {
    for (int64_t t = 0; t < n_tasks; ++t) fn(t);
    return;
  }
  struct Release {
    ~Release() { g_busy.store(false); }
  } release;
  p->run(n_tasks, fn);
}

int64_t task_count(int64_t n_items, int64_t min_items) {
  if (n_items <= 0) return 0;
  const int64_t by_size = std::max<int64_t>(1, n_items / std::max<int64_t>(1, min_items));
  return std::min<int64_t>(by_size, 4 * static_cast<int64_t>(num_threads()));
}

}  // namespace fdpp::cpu
