//===- ArenaTest.cpp - the step arena's slots -----------------------------===//

#include "tdx/Runtime/Arena.h"

#include <gtest/gtest.h>

#include <vector>

using tdx::rt::Arena;

namespace {

struct ArenaTest : ::testing::Test {
  std::vector<char> memory = std::vector<char>(1024);
  Arena arena;
  void SetUp() override { arena.reserve(memory.data(), 1024); }
  char *at(int64_t offset) { return memory.data() + offset; }
};

TEST_F(ArenaTest, AnAllocationTakesTheSlotOfItsResult) {
  // Results in order; -1 is a result the plan leaves to the pool, and an
  // allocation matches the first slot of exactly its bytes.
  arena.expect({{-1, 100}, {0, 100}, {128, 40}});
  EXPECT_EQ(arena.take(40), at(128));
  EXPECT_EQ(arena.take(100), nullptr); // the returned result: not planned
  EXPECT_EQ(arena.take(100), at(0));
  EXPECT_EQ(arena.take(100), nullptr); // nothing expected any more
  arena.expect({});
  EXPECT_EQ(arena.counts().taken, 2);
  EXPECT_EQ(arena.counts().unasked, 0);
}

TEST_F(ArenaTest, ASlotStillHeldIsRefused) {
  // A tensor in [64, 192) lives on past its plan (an alias the plan did not
  // see): a slot overlapping it, in whole 64-byte lines, goes to the pool.
  arena.expect({{64, 128}});
  void *held = arena.take(128);
  ASSERT_EQ(held, at(64));
  arena.expect({{0, 65}});
  EXPECT_EQ(arena.take(65), nullptr); // [0, 128) overlaps [64, 192)
  arena.expect({{192, 64}});
  EXPECT_EQ(arena.take(64), at(192)); // touches it, does not overlap
  EXPECT_EQ(arena.counts().busy, 1);
  // Once given back, the range is free for the next op.
  EXPECT_TRUE(arena.give(held));
  arena.expect({{0, 65}});
  EXPECT_EQ(arena.take(65), at(0));
}

TEST_F(ArenaTest, WhatIsNotTheArenasIsNotTaken) {
  int outside = 0;
  EXPECT_FALSE(arena.give(&outside));
  // A slot past the arena's end is never handed out.
  arena.expect({{1000, 64}});
  EXPECT_EQ(arena.take(64), nullptr);
  // Slots expected and never asked for are counted when the op is done.
  arena.expect({{0, 8}, {64, 8}});
  EXPECT_EQ(arena.take(8), at(0));
  arena.expect({});
  EXPECT_EQ(arena.counts().unasked, 1);
  // Without an arena nothing is taken.
  arena.reserve(nullptr, 0);
  arena.expect({{0, 8}});
  EXPECT_EQ(arena.take(8), nullptr);
}

} // namespace
