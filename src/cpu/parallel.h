// A tiny fixed-size thread pool for the CPU backend: ops split an index range into chunks and every
// worker (plus the calling thread) takes chunks from an atomic counter until none are left.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mxq {

class ThreadPool {
 public:
  // threads = total parallelism including the caller; 1 runs everything inline.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over [0, n) in chunks of at least `grain` items and returns when all are done.
  // note: calls from inside a running job (nested) and calls while another thread owns the pool run
  // inline, so ops may call each other freely.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  struct Job;
  void worker_loop();
  void run_chunks(Job& job);

  std::vector<std::thread> workers_;
  std::mutex mutex_;  // guards job_, generation_, stop_, busy_workers_
  std::condition_variable wake_;
  std::condition_variable done_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  int busy_workers_ = 0;
  bool stop_ = false;
  std::mutex owner_;  // held by the thread whose job is running
};

// The pool ops use unless a caller passes its own: one thread per hardware thread.
ThreadPool& default_pool();

}  // namespace mxq
