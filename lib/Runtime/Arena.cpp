//===- Arena.cpp - the planned memory of a step's tensors -----------------===//

#include "tdx/Runtime/Arena.h"

#include <iterator>

using namespace tdx::rt;

namespace {
int64_t line(int64_t bytes) { return (bytes + 63) / 64 * 64; }
} // namespace

void Arena::reserve(char *base, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  base_ = base;
  size_ = base ? bytes : 0;
  expected_.clear();
  live_.clear();
}

void Arena::expect(std::initializer_list<Slot> slots) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Slot s : expected_)
    counts_.unasked += s.offset >= 0;
  expected_.clear();
  if (!base_)
    return;
  for (Slot s : slots)
    expected_.push_back(s.offset + line(s.bytes) <= size_ ? s : Slot{-1, s.bytes});
}

bool Arena::free(int64_t offset, int64_t bytes) const {
  // The live range starting at or before `offset`, and the next one.
  auto next = live_.lower_bound(offset);
  if (next != live_.end() && next->first < offset + bytes)
    return false;
  return next == live_.begin() || std::prev(next)->second <= offset;
}

void *Arena::take(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = expected_.begin(); it != expected_.end(); ++it) {
    if (it->bytes != bytes)
      continue;
    Slot s = *it;
    expected_.erase(it);
    if (s.offset < 0)
      return nullptr; // a result the plan leaves to the pool
    if (!free(s.offset, line(s.bytes))) {
      ++counts_.busy;
      return nullptr;
    }
    live_[s.offset] = s.offset + line(s.bytes);
    ++counts_.taken;
    return base_ + s.offset;
  }
  return nullptr;
}

bool Arena::give(void *p) {
  char *c = static_cast<char *>(p);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!base_ || c < base_ || c >= base_ + size_)
    return false;
  live_.erase(c - base_);
  return true;
}

Arena::Counts Arena::counts() {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

Arena &Arena::get() {
  // Never destroyed: tensors may be freed during static destruction.
  static Arena *arena = new Arena;
  return *arena;
}
