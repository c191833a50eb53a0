//===- Memory.cpp - counting the tensor bytes a rank holds ----------------===//

#include "tdx/Runtime/Runtime.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

using namespace tdx::rt;

namespace {

std::atomic<int64_t> currentBytes{0}, peakBytes{0};

void add(int64_t n) {
  int64_t now = currentBytes.fetch_add(n) + n;
  int64_t seen = peakBytes.load();
  while (now > seen && !peakBytes.compare_exchange_weak(seen, now)) {
  }
}

std::mutex sizesMutex;
std::unordered_map<void *, int64_t> sizes; // live allocation -> bytes
c10::DeleterFnPtr baseDeleter = nullptr;

void release(void *data) {
  int64_t n = 0;
  {
    std::lock_guard<std::mutex> lock(sizesMutex);
    auto it = sizes.find(data);
    if (it != sizes.end()) {
      n = it->second;
      sizes.erase(it);
    }
  }
  currentBytes.fetch_sub(n);
  baseDeleter(data);
}

/// ATen's CPU allocator with every allocation counted until it is freed.
/// Its data pointers are their own contexts, as the default allocator's
/// are (ATen's raw_allocate users require it).
class CountingAllocator final : public c10::Allocator {
public:
  explicit CountingAllocator(c10::Allocator *base) : base(base) {}

  c10::DataPtr allocate(size_t n) const override {
    c10::DataPtr inner = base->allocate(n);
    void *data = inner.get();
    if (!data || inner.get_context() != data || inner.get_deleter() != baseDeleter)
      return inner; // not the default allocator's kind of pointer: not counted
    c10::Device device = inner.device();
    inner.release_context();
    {
      std::lock_guard<std::mutex> lock(sizesMutex);
      sizes[data] = static_cast<int64_t>(n);
    }
    add(static_cast<int64_t>(n));
    return {data, data, &release, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

private:
  c10::Allocator *base;
};

} // namespace

void TensorMemory::install() {
  c10::Allocator *base = c10::GetCPUAllocator();
  baseDeleter = base->raw_deleter();
  if (!baseDeleter)
    return; // an allocator whose pointers are not their own contexts: not counted
  static CountingAllocator counting(base);
  static bool installed = (c10::SetCPUAllocator(&counting, /*priority=*/1), true);
  (void)installed;
}

int64_t TensorMemory::current() { return currentBytes.load(); }
int64_t TensorMemory::peak() { return peakBytes.load(); }
void TensorMemory::resetPeak() { peakBytes.store(currentBytes.load()); }
