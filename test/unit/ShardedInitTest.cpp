//===- ShardedInitTest.cpp - layout-independent random init ---------------===//
//
// Every rank evaluates only its shard of a parameter's init program; the
// shards of all ranks, put together, must be bitwise the one-rank tensor,
// for every random op and every layout (1-D and 2-D meshes, Shard(0),
// Shard(1), a dim split over two axes, uneven torch.chunk splits).
//
//===----------------------------------------------------------------------===//

#include "tdx/Target/InitEvaluator.h"
#include "tdx/Runtime/Philox.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

using namespace mlir;
using namespace mlir::tdx;

namespace {

TEST(Philox, KnownAnswers) {
  // Random123's known-answer vectors for philox4x32-10.
  ::tdx::rng::Block zero = ::tdx::rng::philox4x32_10(0, 0, 0, 0, 0, 0);
  EXPECT_EQ(zero.w[0], 0x6627e8d5u);
  EXPECT_EQ(zero.w[1], 0xe169c58du);
  EXPECT_EQ(zero.w[2], 0xbc57ac4cu);
  EXPECT_EQ(zero.w[3], 0x9b00dbd8u);
  ::tdx::rng::Block ones = ::tdx::rng::philox4x32_10(~0u, ~0u, ~0u, ~0u, ~0u, ~0u);
  EXPECT_EQ(ones.w[0], 0x408f276du);
  EXPECT_EQ(ones.w[1], 0x41c83b0eu);
  EXPECT_EQ(ones.w[2], 0xa20bc7c6u);
  EXPECT_EQ(ones.w[3], 0x6d5451fdu);
  ::tdx::rng::Block pi = ::tdx::rng::philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu,
                                               0x03707344u, 0xa4093822u, 0x299f31d0u);
  EXPECT_EQ(pi.w[0], 0xd16cfe09u);
  EXPECT_EQ(pi.w[1], 0x94fdccebu);
  EXPECT_EQ(pi.w[2], 0x5001e420u);
  EXPECT_EQ(pi.w[3], 0x24126ea1u);
}

TEST(Philox, DistributionsLookRight) {
  const int n = 20000;
  double sum = 0, sq = 0, umin = 1, umax = 0;
  for (int i = 0; i < n; ++i) {
    double z = ::tdx::rng::standardNormal(7, 3, i);
    sum += z;
    sq += z * z;
    double u = ::tdx::rng::uniform01(7, 4, i);
    umin = std::min(umin, u);
    umax = std::max(umax, u);
    double t = ::tdx::rng::truncNormal(7, 5, i, 0.0, 1.0, -0.5, 2.0);
    ASSERT_GE(t, -0.5);
    ASSERT_LE(t, 2.0);
  }
  EXPECT_NEAR(sum / n, 0.0, 0.03);
  EXPECT_NEAR(sq / n, 1.0, 0.05);
  EXPECT_GE(umin, 0.0);
  EXPECT_LT(umax, 1.0);
  EXPECT_LT(umin, 0.001);
  EXPECT_GT(umax, 0.999);
  // Streams and seeds are independent.
  EXPECT_NE(::tdx::rng::uniform01(7, 4, 0), ::tdx::rng::uniform01(7, 5, 0));
  EXPECT_NE(::tdx::rng::uniform01(7, 4, 0), ::tdx::rng::uniform01(8, 4, 0));
}

const char *kParams = R"mlir(
tdx.parameter @uniform : tensor<5x7xf32> init {
  %0 = tdx.uniform(-0.25, 0.25) seed(42, 0) : tensor<5x7xf32>
  tdx.yield %0 : tensor<5x7xf32>
}
tdx.parameter @normal : tensor<6x4xf32> init {
  %0 = tdx.normal(0.0, 0.02) seed(42, 1) : tensor<6x4xf32>
  tdx.yield %0 : tensor<6x4xf32>
}
tdx.parameter @trunc : tensor<9x3xf64> init {
  %0 = tdx.trunc_normal(0.0, 1.0, -2.0, 2.0) seed(-1, 2) : tensor<9x3xf64>
  tdx.yield %0 : tensor<9x3xf64>
}
tdx.parameter @combined : tensor<7x5xf32> init {
  %0 = tdx.normal(1.0, 0.5) seed(42, 3) : tensor<7x5xf32>
  %1 = tdx.arange start 0.0 end 5.0 step 1.0 : tensor<5xf32>
  %2 = tdx.mul %0, %1 : (tensor<7x5xf32>, tensor<5xf32>) -> tensor<7x5xf32>
  %3 = tdx.full 2.0 : tensor<f32>
  %4 = tdx.add %2, %3 : (tensor<7x5xf32>, tensor<f32>) -> tensor<7x5xf32>
  tdx.yield %4 : tensor<7x5xf32>
}
tdx.parameter @causal : tensor<5x6xf32> init {
  %0 = tdx.full 1.0 : tensor<5x6xf32>
  %1 = tdx.arange start 0.0 end 5.0 step 1.0 : tensor<5xi64>
  %2 = tdx.reshape %1 [5, 1] : tensor<5xi64> -> tensor<5x1xi64>
  %3 = tdx.arange start 0.0 end 6.0 step 1.0 : tensor<6xi64>
  %4 = tdx.reshape %3 [1, 6] : tensor<6xi64> -> tensor<1x6xi64>
  %5 = tdx.sub %4, %2 : (tensor<1x6xi64>, tensor<5x1xi64>) -> tensor<5x6xi64>
  %6 = tdx.full 0.0 : tensor<i64>
  %7 = tdx.cmp le, %5, %6 : (tensor<5x6xi64>, tensor<i64>) -> tensor<5x6xi1>
  %8 = tdx.full -2.5 : tensor<f32>
  %9 = tdx.where %7, %0, %8 : (tensor<5x6xi1>, tensor<5x6xf32>, tensor<f32>) -> tensor<5x6xf32>
  tdx.yield %9 : tensor<5x6xf32>
}
tdx.parameter @expanded : tensor<4x3x6xf32> init {
  %0 = tdx.normal(0.0, 1.0) seed(42, 4) : tensor<3x1xf32>
  %1 = tdx.expand %0 [4, -1, 6] : tensor<3x1xf32> -> tensor<4x3x6xf32>
  tdx.yield %1 : tensor<4x3x6xf32>
}
)mlir";

struct Layout {
  std::vector<int64_t> mesh;
  std::vector<std::string> placements; // "S0", "S1", "R"
};

class ShardedInit : public ::testing::TestWithParam<Layout> {};

TEST_P(ShardedInit, GatheredShardsAreBitwiseTheOneRankTensor) {
  MLIRContext ctx;
  ctx.loadDialect<TdxDialect, arith::ArithDialect, func::FuncDialect>();
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(kParams, &ctx);
  ASSERT_TRUE(module);
  const Layout &layout = GetParam();
  SmallVector<PlacementAttr> placements;
  for (const std::string &p : layout.placements)
    placements.push_back(p == "R" ? PlacementAttr::replicate(&ctx)
                                  : PlacementAttr::shard(&ctx, p[1] - '0'));
  int64_t ranks = 1;
  for (int64_t s : layout.mesh)
    ranks *= s;
  for (ParameterOp param : module->getOps<ParameterOp>()) {
    RankedTensorType type = param.getTensorType();
    int64_t width = type.getElementTypeBitWidth() / 8;
    ShardBox whole = shardBox(type, {}, {}, {});
    FailureOr<std::vector<uint8_t>> reference = evaluateInitShard(param, whole);
    ASSERT_TRUE(succeeded(reference)) << param.getSymName().str();
    std::vector<uint8_t> gathered(reference->size(), 0xAB);
    std::vector<int> written(type.getNumElements(), 0);
    for (int64_t rank = 0; rank < ranks; ++rank) {
      SmallVector<int64_t> coords(layout.mesh.size());
      for (int64_t r = rank, d = layout.mesh.size() - 1; d >= 0; --d) {
        coords[d] = r % layout.mesh[d];
        r /= layout.mesh[d];
      }
      ShardBox box = shardBox(type, placements, layout.mesh, coords);
      FailureOr<std::vector<uint8_t>> shard = evaluateInitShard(param, box);
      ASSERT_TRUE(succeeded(shard));
      ASSERT_EQ(static_cast<int64_t>(shard->size()), box.numElements() * width);
      SmallVector<int64_t> local(box.size.size(), 0);
      for (int64_t n = 0; n < box.numElements(); ++n) {
        int64_t g = 0;
        for (size_t d = 0; d < local.size(); ++d)
          g = g * type.getDimSize(d) + box.offset[d] + local[d];
        std::memcpy(gathered.data() + g * width, shard->data() + n * width, width);
        ++written[g];
        for (int64_t d = static_cast<int64_t>(local.size()) - 1; d >= 0; --d) {
          if (++local[d] < box.size[d])
            break;
          local[d] = 0;
        }
      }
    }
    for (int count : written)
      ASSERT_GE(count, 1) << "an element no rank holds";
    EXPECT_EQ(std::memcmp(gathered.data(), reference->data(), reference->size()), 0)
        << param.getSymName().str() << " differs across layouts";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, ShardedInit,
    ::testing::Values(Layout{{1}, {"R"}}, Layout{{2}, {"S0"}}, Layout{{2}, {"S1"}},
                      Layout{{4}, {"S0"}}, Layout{{4}, {"S1"}}, Layout{{3}, {"S0"}},
                      Layout{{2, 2}, {"S0", "S1"}}, Layout{{2, 2}, {"S1", "S0"}},
                      Layout{{2, 2}, {"S0", "S0"}}, Layout{{2, 4}, {"R", "S0"}},
                      Layout{{2, 4}, {"S1", "S0"}}));

/// The whole (one-rank) value of kParams' f32 parameter `name`.
static std::vector<float> wholeInit(const char *name) {
  MLIRContext ctx;
  ctx.loadDialect<TdxDialect, arith::ArithDialect, func::FuncDialect>();
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(kParams, &ctx);
  if (!module)
    return {};
  auto param = cast<ParameterOp>(module->lookupSymbol(name));
  FailureOr<std::vector<uint8_t>> got =
      evaluateInitShard(param, shardBox(param.getTensorType(), {}, {}, {}));
  if (failed(got))
    return {};
  std::vector<float> out(got->size() / sizeof(float));
  std::memcpy(out.data(), got->data(), got->size());
  return out;
}

// torch.tril's mask as PyTorch records it (nanoGPT's causal buffer):
// arange, a comparison and where, evaluated per element.
TEST(ShardedInitShapes, ComparisonAndWhereMakeTril) {
  std::vector<float> x = wholeInit("causal");
  ASSERT_EQ(x.size(), 30u);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 6; ++j)
      EXPECT_EQ(x[i * 6 + j], j <= i ? 1.0f : -2.5f) << i << ", " << j;
}

// An expand (Hugging Face's arange(n).expand((1, -1)) buffers) reads its
// operand's element under broadcasting.
TEST(ShardedInitShapes, ExpandRepeatsItsOperand) {
  std::vector<float> x = wholeInit("expanded");
  ASSERT_EQ(x.size(), 72u);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 6; ++k)
        EXPECT_EQ(x[(i * 3 + j) * 6 + k], x[j * 6]) << i << ", " << j << ", " << k;
  EXPECT_NE(x[0], x[6]);
}

TEST(ShardedInitShapes, UnevenChunksFollowTorchChunk) {
  MLIRContext ctx;
  ctx.loadDialect<TdxDialect>();
  auto type = RankedTensorType::get({5, 3}, Float32Type::get(&ctx));
  SmallVector<PlacementAttr> shard0 = {PlacementAttr::shard(&ctx, 0)};
  std::vector<int64_t> expected = {2, 2, 1, 0};
  for (int64_t r = 0; r < 4; ++r)
    EXPECT_EQ(shardBox(type, shard0, {4}, {r}).size[0], expected[r]) << r;
}

TEST(ShardedInitShapes, NonPointwiseInitIsRefusedByName) {
  MLIRContext ctx;
  ctx.loadDialect<TdxDialect, arith::ArithDialect, func::FuncDialect>();
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(R"mlir(
tdx.parameter @w : tensor<4x4xf32> init {
  %0 = tdx.uniform(0.0, 1.0) seed(0, 0) : tensor<4x4xf32>
  %1 = tdx.transpose %0 0, 1 : tensor<4x4xf32> -> tensor<4x4xf32>
  tdx.yield %1 : tensor<4x4xf32>
}
)mlir", &ctx);
  ASSERT_TRUE(module);
  std::string diagnostics;
  ScopedDiagnosticHandler handler(&ctx, [&](Diagnostic &d) {
    diagnostics += d.str();
    return success();
  });
  auto param = *module->getOps<ParameterOp>().begin();
  EXPECT_TRUE(failed(evaluateInitShard(param, shardBox(param.getTensorType(), {}, {}, {}))));
  EXPECT_NE(diagnostics.find("is not pointwise in the global index"), std::string::npos)
      << diagnostics;
}

} // namespace
