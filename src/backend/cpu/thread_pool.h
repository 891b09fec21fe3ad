// The CPU fast path's threads: one persistent pool, independent of OpenMP.
//
// Why not OpenMP: libgomp's idle threads spin (GOMP_SPINCOUNT, up to ~0.3 s by default) and its
// barriers wait for every thread, so when another process holds a core a decode step waits for a
// descheduled thread at each of its ~240 parallel regions (issue 17 measured 0.5-16 tok/s instead
// of 56-63). Here:
//  - work is handed out dynamically in small tasks through one atomic counter, and the calling
//    thread works too, so a thread the OS does not run only loses the tasks it never takes;
//  - the caller waits only for tasks that were taken, never for a thread that has not woken up;
//  - idle workers spin for a short bounded time (kSpinMicros) and then sleep on a futex
//    (std::atomic::wait), so an idle or busy machine is not burnt by spinning.
#pragma once

#include <cstdint>
#include <functional>

namespace fdpp::cpu {

// Physical cores this process may run on (sched_getaffinity, sibling hyperthreads counted once);
// at least 1.
int physical_cores();

// The pool's size (the calling thread included). 0 or less: physical_cores(). Replaces the pool;
// a parallel_for already running on another thread finishes on the old one. The default until
// called is physical_cores().
void set_num_threads(int n);
int num_threads();

// Runs fn(task) for task in [0, n_tasks) on the pool and the calling thread; returns when all are
// done. Tasks must be independent. Not reentrant: fn must not call parallel_for (it then runs
// serially on the caller, which is correct but not parallel). The fn reference is only used until
// this returns.
void parallel_for(int64_t n_tasks, const std::function<void(int64_t task)>& fn);

// A task count for n items of roughly equal cost: enough tasks that a late thread costs little
// (about 4 per thread), none smaller than min_items items.
int64_t task_count(int64_t n_items, int64_t min_items);

}  // namespace fdpp::cpu
