//===- CheckpointTest.cpp - checksums, boxes and tiling of checkpoints ----===//
//
// The pieces of include/tdx/StateFormat/Checkpoint.h that every load and save
// relies on, tested alone: CRC-32C and its combination, torch.chunk boxes of
// layouts, the copy runs between two boxes, and the tiling check that
// refuses an index with a hole or an overlap.
//
//===----------------------------------------------------------------------===//

#include "tdx/StateFormat/Box.h"
#include "tdx/StateFormat/Checkpoint.h"
#include "tdx/StateFormat/Crc32c.h"
#include "tdx/StateFormat/Json.h"
#include "tdx/Runtime/Placement.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>

using namespace tdx::rt;

namespace {

TEST(Crc32c, KnownAnswersAndCombination) {
  EXPECT_EQ(crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  std::string a(1000, 'a'), b = "the rest of a file, of odd length";
  for (size_t i = 0; i < a.size(); ++i)
    a[i] = static_cast<char>(i * 7 + 3);
  uint32_t whole = crc32c((a + b).data(), a.size() + b.size());
  EXPECT_EQ(crc32c(b.data(), b.size(), crc32c(a.data(), a.size())), whole);
  EXPECT_EQ(crc32cCombine(crc32c(a.data(), a.size()), crc32c(b.data(), b.size()), b.size()), whole);
  EXPECT_EQ(crc32cCombine(whole, 0, 0), whole);
}

TEST(Boxes, FollowTorchChunkOnEveryAxis) {
  std::vector<int64_t> offset, size;
  // 10 rows over 4: 3, 3, 3, 1; 5 columns over 4: 2, 2, 1, 0.
  boxOf({4}, {3}, {10, 5}, parseLayout("[Shard(0)]"), offset, size);
  EXPECT_EQ(offset, (std::vector<int64_t>{9, 0}));
  EXPECT_EQ(size, (std::vector<int64_t>{1, 5}));
  boxOf({4}, {3}, {10, 5}, parseLayout("[Shard(1)]"), offset, size);
  EXPECT_EQ(size, (std::vector<int64_t>{10, 0}));
  // A dim split over two axes: the second splits the first's piece.
  boxOf({2, 2}, {1, 1}, {8, 3}, parseLayout("[Shard(0), Shard(0)]"), offset, size);
  EXPECT_EQ(offset, (std::vector<int64_t>{6, 0}));
  EXPECT_EQ(size, (std::vector<int64_t>{2, 3}));
  EXPECT_THROW(boxOf({2}, {2}, {4}, parseLayout("[Shard(0)]"), offset, size),
               std::invalid_argument);
  EXPECT_THROW(boxOf({2}, {0}, {4}, parseLayout("[Shard(1)]"), offset, size),
               std::invalid_argument);
}

TEST(Boxes, CopyRunsMoveABoxBetweenTwoLayouts) {
  // A 6x8 tensor: the box rows 1..4, columns 2..7 of chunk A (rows 1..5,
  // all columns) copied into box B (rows 0..5, columns 2..7).
  std::vector<int> global(48);
  std::iota(global.begin(), global.end(), 0);
  std::vector<int> a(5 * 8), b(6 * 6, -1);
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 8; ++c)
      a[r * 8 + c] = global[(r + 1) * 8 + c];
  forEachCopyRun({5, 8}, {0, 2}, {6, 6}, {1, 0}, {4, 6}, [&](int64_t x, int64_t y, int64_t n) {
    EXPECT_EQ(n, 6); // rows are not whole in B: one run per row
    for (int64_t i = 0; i < n; ++i)
      b[y + i] = a[x + i];
  });
  for (int r = 0; r < 6; ++r)
    for (int c = 0; c < 6; ++c)
      EXPECT_EQ(b[r * 6 + c], r >= 1 && r <= 4 ? global[r * 8 + c + 2] : -1) << r << "," << c;
  // Whole rows in both merge into one run.
  int runs = 0;
  forEachCopyRun({4, 8}, {1, 0}, {3, 8}, {0, 0}, {3, 8}, [&](int64_t, int64_t, int64_t n) {
    ++runs;
    EXPECT_EQ(n, 24);
  });
  EXPECT_EQ(runs, 1);
}

StoredChunk chunk(std::vector<int64_t> offset, std::vector<int64_t> shape) {
  StoredChunk c;
  c.file = "rank-0.safetensors";
  c.offset = std::move(offset);
  c.shape = std::move(shape);
  return c;
}

TEST(Tiling, RefusesHolesOverlapsAndOutOfBounds) {
  EXPECT_NO_THROW(checkTiling("ck", "w", {4, 4}, {chunk({0, 0}, {2, 4}), chunk({2, 0}, {2, 4})}));
  // Empty chunks of an uneven split and an empty tensor are fine.
  EXPECT_NO_THROW(checkTiling("ck", "w", {4, 0}, {chunk({0, 0}, {4, 0})}));
  EXPECT_NO_THROW(checkTiling("ck", "w", {3}, {chunk({0}, {3}), chunk({3}, {0})}));
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const std::runtime_error &e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { checkTiling("ck", "w", {4, 4}, {chunk({0, 0}, {2, 4})}); })
                .find("cover 8 of its 16 elements"),
            std::string::npos);
  EXPECT_NE(message([] {
              checkTiling("ck", "w", {4, 4}, {chunk({0, 0}, {3, 4}), chunk({2, 0}, {2, 4})});
            }).find("overlap"),
            std::string::npos);
  EXPECT_NE(message([] { checkTiling("ck", "w", {4, 4}, {chunk({3, 0}, {2, 4})}); })
                .find("outside the tensor"),
            std::string::npos);
}

TEST(Json, ParsesWhatTheFormatsHoldAndRefusesTheRest) {
  std::optional<json::Value> v = json::parse(
      R"( {"a": [1, -2, 3.5e2], "s": "x\"\u00e9\n", "o": {"t": true, "n": null}} )");
  ASSERT_TRUE(v);
  const json::Object &o = *v->getAsObject();
  EXPECT_EQ(o.getArray("a")->size(), 3u);
  EXPECT_EQ((*o.getArray("a"))[1].getAsInteger(), -2);
  EXPECT_EQ((*o.getArray("a"))[2].getAsInteger(), 350);
  EXPECT_EQ(o.getString("s"), std::string("x\"\xc3\xa9\n"));
  EXPECT_EQ(o.getObject("o")->get("t")->kind(), json::Value::Bool);
  EXPECT_FALSE(o.getInteger("missing"));
  // Printing and parsing again gives the same text.
  std::string once = json::print(*v), twice = json::print(*json::parse(once));
  EXPECT_EQ(once, twice);
  EXPECT_EQ(json::print(json::Value(json::Object{{"k", json::Array{1, 2}}}), 1), "{\n \"k\": [1, 2]\n}");
  std::string error;
  EXPECT_FALSE(json::parse("{\"a\": 1,}", &error));
  EXPECT_NE(error.find("expected a key at byte"), std::string::npos) << error;
  EXPECT_FALSE(json::parse("{\"a\": 1} x", &error));
  EXPECT_NE(error.find("trailing characters"), std::string::npos) << error;
  EXPECT_FALSE(json::parse("{\"a\": 1, \"a\": 2}", &error));
  EXPECT_NE(error.find("duplicate key"), std::string::npos) << error;
  EXPECT_FALSE(json::parse("[\"unterminated", &error));
  EXPECT_FALSE(json::parse(std::string(100, '['), &error));
  EXPECT_NE(error.find("nesting too deep"), std::string::npos) << error;
}

} // namespace
