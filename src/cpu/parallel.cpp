#include "cpu/parallel.h"

#include <algorithm>
#include <atomic>
#include <cassert>

namespace mxq {

namespace {
// note: set while a thread runs chunks, so a nested parallel_for runs inline instead of deadlocking.
thread_local bool t_in_job = false;
}  // namespace

struct ThreadPool::Job {
  const std::function<void(int64_t, int64_t)>* fn;
  int64_t n, chunk;
  std::atomic<int64_t> next{0};
};

ThreadPool::ThreadPool(int threads) {
  assert(threads >= 1);
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::run_chunks(Job& job) {
  t_in_job = true;
  for (;;) {
    const int64_t begin = job.next.fetch_add(job.chunk);
    if (begin >= job.n) break;
    (*job.fn)(begin, std::min(job.n, begin + job.chunk));
  }
  t_in_job = false;
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    Job* job;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      if (job == nullptr) continue;  // woke after that job had finished
      ++busy_workers_;
    }
    run_chunks(*job);
    {
      std::lock_guard lock(mutex_);
      --busy_workers_;
    }
    done_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  std::unique_lock owner(owner_, std::defer_lock);
  if (workers_.empty() || n <= grain || t_in_job || !owner.try_lock()) {
    fn(0, n);
    return;
  }
  // note: ~4 chunks per thread balances uneven rows without making the atomic counter hot.
  const int64_t chunk = std::max(grain, (n + 4 * threads() - 1) / (4 * threads()));
  Job job{&fn, n, chunk};
  {
    std::lock_guard lock(mutex_);
    job_ = &job;
    ++generation_;
  }
  wake_.notify_all();
  run_chunks(job);
  // Workers that woke late find no chunks left; wait until every worker that took the job has left it.
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return busy_workers_ == 0; });
  job_ = nullptr;
}

ThreadPool& default_pool() {
  static ThreadPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  return pool;
}

}  // namespace mxq
