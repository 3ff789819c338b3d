// CUDA error tier of the three (see STYLE.md): one check macro for cudart / cuBLAS(Lt) calls, and a tiny RAII
// device buffer. Library failures come back as a Status naming the statement, file, line and error name.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string_view>
#include <utility>

#include "base/error.h"

namespace mxq::cuda {

inline const char* error_name(cudaError_t e) { return cudaGetErrorName(e); }
inline const char* error_name(cublasStatus_t s) { return cublasGetStatusName(s); }
inline bool is_ok(cudaError_t e) { return e == cudaSuccess; }
inline bool is_ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }

}  // namespace mxq::cuda

// Use inside a function returning mxq::Status or mxq::Result<T>.
#define MXQ_CUDA_CHECK(stmt)                                                  \
  do {                                                                        \
    const auto mxq_cuda_status_ = (stmt);                                     \
    if (!::mxq::cuda::is_ok(mxq_cuda_status_))                                \
      return ::mxq::fail("{} failed at {}:{}: {}", #stmt, __FILE__, __LINE__, \
                         ::mxq::cuda::error_name(mxq_cuda_status_));          \
  } while (0)

namespace mxq::cuda {

// True while `stream` is capturing a CUDA graph: nothing may be allocated or synchronised on it then.
inline Result<bool> stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus s = cudaStreamCaptureStatusNone;
  MXQ_CUDA_CHECK(cudaStreamIsCapturing(stream, &s));
  return s != cudaStreamCaptureStatusNone;
}

// Owns one cudaMalloc allocation; movable, not copyable. Bytes are uninitialised.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static Result<DeviceBuffer> alloc(size_t bytes) {
    DeviceBuffer b;
    if (bytes > 0) MXQ_CUDA_CHECK(cudaMalloc(&b.ptr_, bytes));
    b.bytes_ = bytes;
    return b;
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(o.bytes_) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);  // note: a failing free at teardown has no caller left to tell
  }

  template <class T = void>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Grows b to at least `need` bytes (a quarter more, so slow growth does not reallocate at every call);
// `drain` is synchronized first, since queued work may still read the old buffer. The contents are not kept.
inline Status grow_buffer(DeviceBuffer& b, size_t need, cudaStream_t drain, std::string_view what) {
  if (b.bytes() >= need) return {};
  MXQ_CUDA_CHECK(cudaStreamSynchronize(drain));
  b = DeviceBuffer();
  auto fresh = DeviceBuffer::alloc(need + need / 4);
  if (!fresh) return fail("{} of {} bytes: {}", what, need, fresh.error().message);
  b = std::move(*fresh);
  return {};
}

// Pinned host memory grown on demand (a quarter more than asked, so slow growth does not reallocate each
// time); get() returns null when it cannot be had. Growing frees the old block: the caller makes sure no
// queued copy still uses it.
class PinnedHost {
 public:
  PinnedHost() = default;
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;
  ~PinnedHost() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  uint8_t* get(size_t bytes) {
    if (bytes_ < bytes) {
      if (ptr_) cudaFreeHost(ptr_);
      ptr_ = nullptr, bytes_ = 0;
      if (cudaHostAlloc(&ptr_, bytes + bytes / 4, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        ptr_ = nullptr;
        return nullptr;
      }
      bytes_ = bytes + bytes / 4;
    }
    return static_cast<uint8_t*>(ptr_);
  }
  size_t capacity() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace mxq::cuda
