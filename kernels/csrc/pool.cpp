// fusionlens::empty_pooled and the pool's controls (see pool.h for why it exists).
#include "pool.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/Allocator.h>
#include <torch/library.h>

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <list>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sys/mman.h>
#endif

namespace fusionlens {
namespace {

constexpr size_t kGranule = size_t{2} << 20;  // blocks the pool keeps: multiples of 2 MiB, so aligned
constexpr size_t kSmallAlign = 64;            // requests under the minimum (a resize to small)

class OutputPool final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    const c10::Device cpu(c10::DeviceType::CPU);
    if (n == 0) return {nullptr, nullptr, nullptr, cpu};
    void* p = take(n);
    return {p, p, &OutputPool::give_back, cpu};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &OutputPool::give_back; }
  void copy_data(void* dest, const void* src, size_t count) const override { std::memcpy(dest, src, count); }

  void configure(int64_t cap, int64_t min_bytes, bool hugepages) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> g(mu_);
      cap_ = static_cast<size_t>(std::max<int64_t>(cap, 0));
      min_ = static_cast<size_t>(std::max<int64_t>(min_bytes, 1));
      hugepages_ = hugepages;
      evict_to(cap_, drop);
    }
    release(drop);
  }

  // The configured minimum block size and huge-page advice (empty_output's decision).
  std::pair<size_t, bool> settings() {
    std::lock_guard<std::mutex> g(mu_);
    return {min_, hugepages_};
  }

  int64_t empty() {
    std::vector<void*> drop;
    int64_t freed;
    {
      std::lock_guard<std::mutex> g(mu_);
      freed = static_cast<int64_t>(held_);
      evict_to(0, drop);
    }
    release(drop);
    return freed;
  }

  // held bytes, held blocks, live pooled bytes, hits, misses, bytes evicted, cap, min bytes
  std::vector<int64_t> stats() {
    std::lock_guard<std::mutex> g(mu_);
    return {static_cast<int64_t>(held_), static_cast<int64_t>(lru_.size()), static_cast<int64_t>(live_bytes_),
            hits_, misses_, evicted_, static_cast<int64_t>(cap_), static_cast<int64_t>(min_)};
  }

  // After fork() the child has one thread: a lock held by another thread of the parent would
  // never be released, so the child starts with a fresh mutex (the blocks are its own copies).
  void reset_lock_after_fork() { new (&mu_) std::mutex(); }

 private:
  using Lru = std::list<std::pair<size_t, void*>>;  // (bytes, block), most recently freed first

  void* take(size_t n) {
    size_t bytes;
    bool large, hugepages;
    {
      std::lock_guard<std::mutex> g(mu_);
      large = n >= min_;
      bytes = large ? (n + kGranule - 1) / kGranule * kGranule : n;
      hugepages = hugepages_;
      if (large) {
        // The smallest idle size that fits with at most 25% to spare (shapes that vary a little);
        // of several blocks of that size the most recently freed, whose lines may still be cached
        // (the multimap keeps equal keys in insertion order: the last is the newest).
        auto it = free_.lower_bound(bytes);
        if (it != free_.end() && it->first <= bytes + bytes / 4) {
          it = std::prev(free_.upper_bound(it->first));
          const auto node = it->second;
          void* p = node->second;
          held_ -= node->first;
          live_[p] = node->first;
          live_bytes_ += node->first;
          lru_.erase(node);
          free_.erase(it);
          ++hits_;
          return p;
        }
        ++misses_;
      }
    }
    void* p = nullptr;
    if (posix_memalign(&p, large ? kGranule : kSmallAlign, bytes) != 0 || p == nullptr) {
      empty();  // idle blocks are the first thing to give up under memory pressure; then retry once
      if (posix_memalign(&p, large ? kGranule : kSmallAlign, bytes) != 0 || p == nullptr) {
        TORCH_CHECK(false, "fusionlens: out of memory allocating ", bytes, " bytes for a kernel output");
      }
    }
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    if (large && hugepages) madvise(p, bytes, MADV_HUGEPAGE);  // advice only: a failure changes nothing
#endif
    std::lock_guard<std::mutex> g(mu_);
    live_[p] = bytes;
    live_bytes_ += bytes;
    return p;
  }

  void put(void* p) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> g(mu_);
      const auto it = live_.find(p);
      const size_t bytes = it == live_.end() ? 0 : it->second;
      if (it != live_.end()) {
        live_.erase(it);
        live_bytes_ -= bytes;
      }
      if (bytes >= min_ && bytes % kGranule == 0 && bytes <= cap_) {
        lru_.emplace_front(bytes, p);
        free_.emplace(bytes, lru_.begin());
        held_ += bytes;
        evict_to(cap_, drop);
      } else {
        drop.push_back(p);
      }
    }
    release(drop);
  }

  // Drop least recently freed blocks until at most `limit` bytes are idle (caller holds mu_).
  void evict_to(size_t limit, std::vector<void*>& drop) {
    while (held_ > limit && !lru_.empty()) {
      const auto node = std::prev(lru_.end());
      auto range = free_.equal_range(node->first);
      for (auto it = range.first; it != range.second; ++it) {
        if (it->second == node) {
          free_.erase(it);
          break;
        }
      }
      held_ -= node->first;
      evicted_ += static_cast<int64_t>(node->first);
      drop.push_back(node->second);
      lru_.erase(node);
    }
  }

  static void release(const std::vector<void*>& drop) {
    for (void* p : drop) std::free(p);  // outside the lock: munmap of a large block takes a while
  }

  static void give_back(void* p);

  std::mutex mu_;
  Lru lru_;
  std::multimap<size_t, Lru::iterator> free_;  // idle blocks by size
  std::unordered_map<void*, size_t> live_;      // every block handed out, with its size
  size_t held_ = 0, live_bytes_ = 0;
  size_t cap_ = 0, min_ = size_t{4} << 20;      // kernels/_alloc.py configures both at load
  bool hugepages_ = false;
  int64_t hits_ = 0, misses_ = 0, evicted_ = 0;
};

// Never destroyed: tensors still alive when the process exits call give_back after static
// destructors have run.
OutputPool& pool() {
  static OutputPool* const p = [] {
    auto* created = new OutputPool();
#if defined(__linux__)
    pthread_atfork(nullptr, nullptr, [] { pool().reset_lock_after_fork(); });
#endif
    return created;
  }();
  return *p;
}

void OutputPool::give_back(void* p) { pool().put(p); }

at::Tensor empty_pooled_op(at::IntArrayRef shape, at::ScalarType dtype) { return empty_pooled(shape, dtype); }

// An on/off environment switch as kernels/_alloc.py reads it, per call: on unless 0/false/off/no.
bool switched_on(const char* var) {
  const char* raw = std::getenv(var);
  if (raw == nullptr) return true;
  std::string v(raw);
  const auto first = v.find_first_not_of(" \t\n\r"), last = v.find_last_not_of(" \t\n\r");
  v = first == std::string::npos ? std::string() : v.substr(first, last - first + 1);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return v != "0" && v != "false" && v != "off" && v != "no";
}

// The run-time allocation of a kernel output traced under torch.compile (kernels/_alloc.py,
// `_traced_empty`): the pool for a large one, as eager calls get, else a plain allocation (huge-page
// advised when large and the pool is off). In C++ because a compiled graph with dynamic shapes
// calls it for every output: 3 us a call against 10 us for the Python impl it replaces.
at::Tensor empty_output(c10::SymIntArrayRef sym_shape, at::ScalarType dtype) {
  const at::IntArrayRef shape = C10_AS_INTARRAYREF_SLOW(sym_shape);
  const auto nbytes = static_cast<size_t>(c10::multiply_integers(shape)) * c10::elementSize(dtype);
  const auto [min_bytes, hugepages] = pool().settings();
  const bool large = nbytes >= min_bytes;
  if (large && switched_on("FUSIONLENS_CPU_POOL")) return empty_pooled(shape, dtype);
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype));
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (large && hugepages && switched_on("FUSIONLENS_HUGEPAGES")) {  // the aligned interior, as _alloc does
    const auto p = reinterpret_cast<uintptr_t>(out.data_ptr());
    const uintptr_t start = (p + kGranule - 1) / kGranule * kGranule, end = (p + nbytes) / kGranule * kGranule;
    if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
  }
#endif
  return out;
}

void pool_configure(int64_t cap_bytes, int64_t min_bytes, bool hugepages) {
  pool().configure(cap_bytes, min_bytes, hugepages);
}

int64_t pool_empty() { return pool().empty(); }

std::vector<int64_t> pool_stats() { return pool().stats(); }

}  // namespace

at::Tensor empty_pooled(at::IntArrayRef shape, at::ScalarType dtype) {
  return at::detail::empty_generic(shape, &pool(), c10::DispatchKeySet(c10::DispatchKey::CPU), dtype,
                                   c10::nullopt);
}

}  // namespace fusionlens

TORCH_LIBRARY_FRAGMENT(fusionlens, m) {
  m.def("empty_pooled(int[] shape, ScalarType dtype) -> Tensor", &fusionlens::empty_pooled_op);
  m.def("pool_configure(int cap_bytes, int min_bytes, bool hugepages) -> ()", &fusionlens::pool_configure);
  m.def("pool_empty() -> int", &fusionlens::pool_empty);
  m.def("pool_stats() -> int[]", &fusionlens::pool_stats);
  m.def("empty_output(SymInt[] shape, ScalarType dtype) -> Tensor");  // traced: its fake is in _alloc.py
}

TORCH_LIBRARY_IMPL(fusionlens, CompositeExplicitAutograd, m) {  // no tensor argument: one impl for every key
  m.impl("empty_output", TORCH_FN(fusionlens::empty_output));
}
