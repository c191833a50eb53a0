//===- PropagationTest.cpp - the sharding library on small graphs ---------===//
//
// lib/Sharding without the pass: propagation and decision on small
// functions (tdx/Sharding/Propagation.h), the cost model's choice between
// contested factors, and the redistribution planner for every pair of
// single-axis transitions (StepKind) on the two axes of a 2-D mesh.
//
//===----------------------------------------------------------------------===//

#include "tdx/IR/TdxOps.h"
#include "tdx/Sharding/Layout.h"
#include "tdx/Sharding/Propagation.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <map>

using namespace mlir;
using namespace mlir::tdx;

namespace {

class Propagation : public ::testing::Test {
protected:
  Propagation() { ctx.loadDialect<TdxDialect, func::FuncDialect>(); }

  /// Parses `ir`, propagates in its function @f with `cost` (default:
  /// uniform), and returns the module.
  OwningOpRef<ModuleOp> propagate(StringRef ir, std::optional<CostModel> cost = std::nullopt) {
    OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(ir, &ctx);
    EXPECT_TRUE(module);
    auto fn = module->lookupSymbol<func::FuncOp>("f");
    SymbolTableCollection symbols;
    FailureOr<MeshOp> mesh = meshOfFunction(fn, symbols);
    EXPECT_TRUE(succeeded(mesh) && *mesh);
    CostModel model = cost ? *cost : CostModel::uniform(mesh->getShape().size());
    EXPECT_TRUE(succeeded(propagateShardings(fn, *mesh, model, false, symbols)));
    return module;
  }

  /// "[Shard(0)]" of the result of the first op named `name` in @f.
  static std::string placementOf(ModuleOp module, StringRef name) {
    std::string out = "none";
    module.lookupSymbol<func::FuncOp>("f").walk([&](Operation *op) {
      if (op->getName().getStringRef() != name || out != "none")
        return;
      auto shardings = op->getAttrOfType<ArrayAttr>(TdxDialect::kShardingsAttrName);
      out = shardings ? layoutToString(layoutOf(cast<ShardingAttr>(shardings[0]))) : "unplaced";
    });
    return out;
  }
  static std::string argument(ModuleOp module, unsigned i) {
    auto fn = module.lookupSymbol<func::FuncOp>("f");
    auto s = fn.getArgAttrOfType<ShardingAttr>(i, TdxDialect::kShardingAttrName);
    return s ? layoutToString(layoutOf(s)) : "unplaced";
  }
  static int count(ModuleOp module, StringRef name) {
    int n = 0;
    module->walk([&](Operation *op) { n += op->getName().getStringRef() == name; });
    return n;
  }

  MLIRContext ctx;
};

TEST_F(Propagation, MegatronMlpNeedsOneAllReduce) {
  // Colwise then rowwise: the hidden activation stays split, the output is
  // Partial(sum) until the return wants it whole.
  auto m = propagate(R"mlir(
    tdx.mesh @mesh shape = [2] axes = ["tp"]
    tdx.parameter @w1 : tensor<8x16xf32> sharding <@mesh, [Shard(1)]> init {
      %0 = tdx.full 0.0 : tensor<8x16xf32>
      tdx.yield %0 : tensor<8x16xf32>
    }
    tdx.parameter @w2 : tensor<16x8xf32> sharding <@mesh, [Shard(0)]> init {
      %0 = tdx.full 0.0 : tensor<16x8xf32>
      tdx.yield %0 : tensor<16x8xf32>
    }
    func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
      %w1 = tdx.param_ref @w1 : tensor<8x16xf32>
      %w2 = tdx.param_ref @w2 : tensor<16x8xf32>
      %h = tdx.matmul %x, %w1 : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
      %a = tdx.relu %h : tensor<4x16xf32>
      %y = tdx.matmul %a, %w2 : (tensor<4x16xf32>, tensor<16x8xf32>) -> tensor<4x8xf32>
      %r = tdx.annotate %y <@mesh, [Replicate]> : tensor<4x8xf32>
      return %r : tensor<4x8xf32>
    })mlir");
  EXPECT_EQ(placementOf(*m, "tdx.relu"), "[Shard(1)]");
  EXPECT_EQ(argument(*m, 0), "[Replicate]");
  EXPECT_EQ(count(*m, "tdx.redistribute"), 1);
  std::string last = "none";
  m->walk([&](RedistributeOp r) {
    last = layoutToString(layoutOf(r.getSource())) + " -> " + layoutToString(layoutOf(r.getTarget()));
  });
  EXPECT_EQ(last, "[Partial(sum)] -> [Replicate]");
}

TEST_F(Propagation, ReachesBackwardToAnArgument) {
  auto m = propagate(R"mlir(
    tdx.mesh @mesh shape = [2] axes = ["dp"]
    func.func @f(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
      %t = tdx.tanh %x : tensor<8x4xf32>
      %r = tdx.annotate %t <@mesh, [Shard(0)]> : tensor<8x4xf32>
      return %r : tensor<8x4xf32>
    })mlir");
  EXPECT_EQ(argument(*m, 0), "[Shard(0)]");
  EXPECT_EQ(count(*m, "tdx.redistribute"), 0);
}

TEST_F(Propagation, AFixedPlacementBeatsAPreference) {
  auto m = propagate(R"mlir(
    tdx.mesh @mesh shape = [2] axes = ["dp"]
    func.func @f(%x: tensor<6x4xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>, tdx.sharding_priority = 0 : i64},
                 %w: tensor<4x6xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(1)]>}) -> tensor<6x6xf32> {
      %y = tdx.matmul %x, %w : (tensor<6x4xf32>, tensor<4x6xf32>) -> tensor<6x6xf32>
      return %y : tensor<6x6xf32>
    })mlir");
  EXPECT_EQ(placementOf(*m, "tdx.matmul"), "[Shard(1)]");
  auto fn = m->lookupSymbol<func::FuncOp>("f");
  EXPECT_FALSE(fn.getArgAttr(0, TdxDialect::kShardingPriorityAttrName));
}

/// Two preferences contest a matmul's factors; the decision follows the
/// cost model: gathering the (16, 4) weight is cheaper than gathering the
/// (16, 64) batch, and on a slower network the difference decides alike.
TEST_F(Propagation, TheCostModelSettlesContestedPreferences) {
  StringRef ir = R"mlir(
    tdx.mesh @mesh shape = [2] axes = ["dp"]
    func.func @f(%x: tensor<16x64xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>, tdx.sharding_priority = 0 : i64},
                 %w: tensor<64x4xf32> {tdx.sharding = #tdx.sharding<@mesh, [Shard(0)]>, tdx.sharding_priority = 0 : i64}) -> tensor<16x4xf32> {
      %y = tdx.matmul %x, %w : (tensor<16x64xf32>, tensor<64x4xf32>) -> tensor<16x4xf32>
      return %y : tensor<16x4xf32>
    })mlir";
  for (double bandwidth : {1e10, 1e6}) {
    auto m = propagate(ir, CostModel::uniform(1, bandwidth));
    // Sharding the contraction (k) leaves a Partial result, reduced at the
    // return: 16x4 floats moved. Sharding the rows (i) gathers the weight:
    // 32x4 floats. Both are cheaper than gathering x (8x64).
    std::string matmul = placementOf(*m, "tdx.matmul");
    EXPECT_TRUE(matmul == "[Partial(sum)]" || matmul == "[Shard(0)]") << matmul;
    int64_t moved = 0;
    m->walk([&](RedistributeOp r) {
      moved += cast<RankedTensorType>(r.getType()).getNumElements();
    });
    EXPECT_LE(moved, 64 * 4) << "bandwidth " << bandwidth;
  }
}

//===----------------------------------------------------------------------===//
// The redistribution planner
//===----------------------------------------------------------------------===//

struct Transition {
  StepKind kind;
  PlacementAttr from, to;
};

/// Every StepKind as one transition, splitting dim `d` (and `e` for the
/// all_to_all's other dim).
std::vector<Transition> transitions(MLIRContext *ctx, int64_t d = 0, int64_t e = 1) {
  auto S = [&](int64_t dim) { return PlacementAttr::shard(ctx, dim); };
  auto R = PlacementAttr::replicate(ctx);
  auto P = [&](ReduceKind k) { return PlacementAttr::partial(ctx, k); };
  return {{StepKind::AllGather, S(d), R},
          {StepKind::AllReduce, P(ReduceKind::Sum), R},
          {StepKind::ReduceScatter, P(ReduceKind::Sum), S(d)},
          {StepKind::AllToAll, S(d), S(e)},
          {StepKind::LocalChunk, R, S(d)},
          {StepKind::LocalZero, R, P(ReduceKind::Sum)},
          {StepKind::LocalNoop, R, P(ReduceKind::Max)}};
}

/// Every single-axis transition, alone on either axis of a 2x2 mesh.
TEST(Redistribution, EveryStepKindAlone) {
  MLIRContext ctx;
  ctx.loadDialect<TdxDialect>();
  auto type = RankedTensorType::get({8, 8}, Float32Type::get(&ctx));
  CostModel cost = CostModel::uniform(2);
  for (const Transition &t : transitions(&ctx))
    for (int64_t axis : {0, 1}) {
      Layout from = replicatedLayout(&ctx, 2), to = replicatedLayout(&ctx, 2);
      from[axis] = t.from;
      to[axis] = t.to;
      auto plan = planRedistribution(type, from, to, {2, 2}, cost);
      ASSERT_EQ(plan.size(), 1u) << stringifyStepKind(t.kind).str() << " on axis " << axis;
      EXPECT_EQ(plan[0].kind, t.kind);
      EXPECT_EQ(plan[0].axis, axis);
      // A Replicate value already is a Partial(max): nothing to do.
      if (t.kind == StepKind::LocalNoop)
        EXPECT_EQ(plan[0].seconds, 0.0);
      else
        EXPECT_GT(plan[0].seconds, 0.0);
    }
}

/// Every ordered pair of transitions, the first on axis 0 (over dims 0
/// and 1) and the second on axis 1 (over dims 2 and 3), where the two
/// placements can stand together (not both Partial of different kinds).
/// The plan takes each from its source to its target with exactly the two
/// steps named, each starting where the one before left its axis.
TEST(Redistribution, EveryPairOfStepKinds) {
  MLIRContext ctx;
  ctx.loadDialect<TdxDialect>();
  auto type = RankedTensorType::get({8, 8, 8, 8}, Float32Type::get(&ctx));
  CostModel cost = CostModel::uniform(2);
  std::vector<Transition> first = transitions(&ctx, 0, 1), second = transitions(&ctx, 2, 3);
  auto partialKind = [](PlacementAttr p) {
    return p.isPartial() ? static_cast<int>(p.getReduce()) : -1;
  };
  int planned = 0;
  for (const Transition &a : first)
    for (const Transition &b : second) {
      int pa = partialKind(a.from), pb = partialKind(b.from);
      int qa = partialKind(a.to), qb = partialKind(b.to);
      if ((pa >= 0 && pb >= 0 && pa != pb) || (qa >= 0 && qb >= 0 && qa != qb))
        continue;
      Layout from = {a.from, b.from}, to = {a.to, b.to};
      auto plan = planRedistribution(type, from, to, {2, 2}, cost);
      std::multiset<int> kinds, want = {static_cast<int>(a.kind), static_cast<int>(b.kind)};
      for (const RedistributionStep &s : plan)
        kinds.insert(static_cast<int>(s.kind));
      std::string what = stringifyStepKind(a.kind).str() + " + " + stringifyStepKind(b.kind).str();
      EXPECT_EQ(kinds, want) << what;
      // The steps compose: each starts where the one before left its axis.
      Layout at = from;
      for (const RedistributionStep &s : plan) {
        EXPECT_EQ(at[s.axis], s.from) << what;
        at[s.axis] = s.to;
      }
      EXPECT_EQ(layoutToString(at), layoutToString(to)) << what;
      double sum = 0;
      for (const RedistributionStep &s : plan)
        sum += s.seconds;
      EXPECT_DOUBLE_EQ(planSeconds(plan), sum) << what;
      ++planned;
    }
  EXPECT_GE(planned, 40);
}

/// One axis between any two placements: the elementary steps compose from
/// one to the other, never more than two, each of the kind its placements
/// name, and an avg is never reduce-scattered (the runtimes cannot).
TEST(Redistribution, AxisStepsBetweenEveryPairOfPlacements) {
  MLIRContext ctx;
  ctx.loadDialect<TdxDialect>();
  auto R = PlacementAttr::replicate(&ctx);
  std::vector<PlacementAttr> all = {R,
                                    PlacementAttr::shard(&ctx, 0),
                                    PlacementAttr::shard(&ctx, 1),
                                    PlacementAttr::partial(&ctx, ReduceKind::Sum),
                                    PlacementAttr::partial(&ctx, ReduceKind::Max),
                                    PlacementAttr::partial(&ctx, ReduceKind::Avg)};
  for (PlacementAttr from : all)
    for (PlacementAttr to : all) {
      std::string what = layoutToString({from}) + " -> " + layoutToString({to});
      SmallVector<AxisStep> steps = axisSteps(from, to);
      EXPECT_EQ(steps.empty(), from == to) << what;
      EXPECT_LE(steps.size(), 2u) << what;
      PlacementAttr at = from;
      for (const AxisStep &s : steps) {
        EXPECT_EQ(s.from, at) << what;
        switch (s.kind) {
        case StepKind::AllGather:
          EXPECT_TRUE(s.from.isShard() && s.to.isReplicate()) << what;
          break;
        case StepKind::AllReduce:
          EXPECT_TRUE(s.from.isPartial() && s.to.isReplicate()) << what;
          break;
        case StepKind::ReduceScatter:
          EXPECT_TRUE(s.from.isPartial() && s.to.isShard()) << what;
          EXPECT_NE(s.from.getReduce(), ReduceKind::Avg) << what;
          break;
        case StepKind::AllToAll:
          EXPECT_TRUE(s.from.isShard() && s.to.isShard()) << what;
          break;
        case StepKind::LocalChunk:
          EXPECT_TRUE(s.from.isReplicate() && s.to.isShard()) << what;
          break;
        case StepKind::LocalZero:
          EXPECT_TRUE(s.from.isReplicate() && s.to.isPartial() &&
                      s.to.getReduce() == ReduceKind::Sum)
              << what;
          break;
        case StepKind::LocalNoop:
          EXPECT_TRUE(s.from.isReplicate() && s.to.isPartial() &&
                      s.to.getReduce() != ReduceKind::Sum)
              << what;
          break;
        }
        at = s.to;
      }
      EXPECT_EQ(at, to) << what;
    }
}

} // namespace
