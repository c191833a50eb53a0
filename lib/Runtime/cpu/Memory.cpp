//===- Memory.cpp - the step memory pool of a rank's tensors --------------===//

#include "tdx/Runtime/Runtime.h"
#include "tdx/Runtime/Arena.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <unordered_map>
#include <vector>

using namespace tdx::rt;

namespace {

std::atomic<int64_t> currentBytes{0}, peakBytes{0}, systemAllocations{0}, pooledBytes{0};

void add(int64_t n) {
  int64_t now = currentBytes.fetch_add(n) + n;
  int64_t seen = peakBytes.load();
  while (now > seen && !peakBytes.compare_exchange_weak(seen, now)) {
  }
}

/// Never destroyed: tensors may be freed during static destruction.
struct Pool {
  std::mutex mutex;
  std::unordered_map<void *, std::pair<int64_t, int64_t>> sizes; // live block -> bytes, asked
  std::unordered_map<int64_t, std::vector<void *>> idle; // bytes -> freed blocks
};
Pool &pool() {
  static Pool *p = new Pool;
  return *p;
}

/// Blocks are kept by their size rounded up to a cache line: a program's
/// steps ask for the same sizes every time. The bytes counted are those
/// asked for.
int64_t blockBytes(size_t n) { return (static_cast<int64_t>(n) + 63) / 64 * 64; }

void release(void *data) {
  if (!data)
    return;
  Pool &p = pool();
  std::lock_guard<std::mutex> lock(p.mutex);
  auto it = p.sizes.find(data);
  if (it == p.sizes.end())
    return c10::free_cpu(data); // not the pool's (cannot happen: every block is)
  if (!Arena::get().give(data))
    p.idle[it->second.first].push_back(data);
  currentBytes.fetch_sub(it->second.second);
  p.sizes.erase(it);
}

/// ATen's CPU allocator for a model binary: a tensor the step's plan placed
/// takes its slot of the arena (tdx/Runtime/Arena.h); any other takes a
/// block the pool keeps from a freed tensor of its size, so the second and
/// later steps of a program (which ask for the same sizes in the same order)
/// take every tensor from the pool or the arena. The bytes held are counted.
/// Data pointers are their own contexts, as the default allocator's are.
class PoolAllocator final : public c10::Allocator {
public:
  c10::DataPtr allocate(size_t n) override {
    if (n == 0)
      return {nullptr, nullptr, &release, c10::Device(c10::DeviceType::CPU)};
    int64_t bytes = blockBytes(n);
    void *data = Arena::get().take(static_cast<int64_t>(n));
    {
      Pool &p = pool();
      std::lock_guard<std::mutex> lock(p.mutex);
      auto bin = p.idle.find(bytes);
      if (!data && bin != p.idle.end() && !bin->second.empty()) {
        data = bin->second.back();
        bin->second.pop_back();
      }
      if (!data) {
        data = c10::alloc_cpu(static_cast<size_t>(bytes));
        systemAllocations.fetch_add(1);
        pooledBytes.fetch_add(bytes);
      }
      p.sizes[data] = {bytes, static_cast<int64_t>(n)};
    }
    add(static_cast<int64_t>(n));
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void *dest, const void *src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

} // namespace

void TensorMemory::install() {
  static PoolAllocator pool;
  static bool installed = (c10::SetCPUAllocator(&pool, /*priority=*/1), true);
  (void)installed;
}

void TensorMemory::reserveArena(int64_t bytes) {
  static void *arena = nullptr;
  Arena::get().reserve(nullptr, 0);
  c10::free_cpu(std::exchange(arena, bytes > 0 ? c10::alloc_cpu(bytes) : nullptr));
  Arena::get().reserve(static_cast<char *>(arena), bytes);
}

int64_t TensorMemory::current() { return currentBytes.load(); }
int64_t TensorMemory::peak() { return peakBytes.load(); }
void TensorMemory::resetPeak() { peakBytes.store(currentBytes.load()); }
int64_t TensorMemory::systemAllocations() { return ::systemAllocations.load(); }
int64_t TensorMemory::pooled() { return pooledBytes.load(); }

at::Tensor TensorMemory::unpooled(const at::Tensor &t) {
  at::Tensor dense = t.contiguous();
  void *data = std::malloc(std::max<size_t>(1, dense.nbytes()));
  if (!data)
    throw std::bad_alloc();
  std::memcpy(data, dense.data_ptr(), dense.nbytes());
  return at::from_blob(data, dense.sizes(), [](void *p) { std::free(p); }, dense.options());
}
