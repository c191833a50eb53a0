//===- Memory.cpp - counting the tensor bytes a rank holds ----------------===//

#include "tdx/Runtime/Runtime.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>

using namespace tdx::rt;

namespace {

std::atomic<int64_t> currentBytes{0}, peakBytes{0};

void add(int64_t n) {
  int64_t now = currentBytes.fetch_add(n) + n;
  int64_t seen = peakBytes.load();
  while (now > seen && !peakBytes.compare_exchange_weak(seen, now)) {
  }
}

/// ATen's CPU allocator with every allocation counted until it is freed.
class CountingAllocator final : public c10::Allocator {
public:
  explicit CountingAllocator(c10::Allocator *base) : base(base) {}

  c10::DataPtr allocate(size_t n) const override {
    c10::DataPtr inner = base->allocate(n);
    void *data = inner.get();
    c10::Device device = inner.device();
    auto *held = new Held{std::move(inner), static_cast<int64_t>(n)};
    add(held->bytes);
    return {data, held, &release, device};
  }

private:
  struct Held {
    c10::DataPtr inner;
    int64_t bytes;
  };
  static void release(void *context) {
    auto *held = static_cast<Held *>(context);
    currentBytes.fetch_sub(held->bytes);
    delete held;
  }
  c10::Allocator *base;
};

} // namespace

void TensorMemory::install() {
  static CountingAllocator counting(c10::GetCPUAllocator());
  static bool installed = (c10::SetCPUAllocator(&counting, /*priority=*/1), true);
  (void)installed;
}

int64_t TensorMemory::current() { return currentBytes.load(); }
int64_t TensorMemory::peak() { return peakBytes.load(); }
void TensorMemory::resetPeak() { peakBytes.store(currentBytes.load()); }
