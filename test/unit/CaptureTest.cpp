//===- CaptureTest.cpp - the capture engine from libtorch C++ -------------===//
//
// The same engine as the Python package, used on a torch::nn::Sequential
// built in a lambda: no storage while deferred, bitwise eager values after
// materialization, IR that verifies.
//
//===----------------------------------------------------------------------===//

#include "tdx/Capture/Capture.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace tdx::capture;

namespace {

torch::nn::Sequential makeModel() {
  return torch::nn::Sequential(torch::nn::Linear(16, 32), torch::nn::ReLU(),
                               torch::nn::Linear(32, 8),
                               torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
}

// From C++ alone, capture runs the keyed way; the key-free way goes through
// torch's Python dispatch, so the package's tests cover it.
#define SKIP_WITHOUT_KEYS()                                                                    \
  if (captureWay() != CaptureWay::FakeKey)                                                    \
  GTEST_SKIP() << "capture runs the key-free way (" << captureWayName()                       \
               << "), which needs Python: test/python covers it"

TEST(Capture, WithoutPythonTheKeyFreeWayNamesTheFix) {
  if (captureWay() == CaptureWay::FakeKey)
    GTEST_SKIP() << "capture runs the keyed way";
  try {
    FakeMode fake;
    FAIL() << "fake mode started without Python";
  } catch (const CaptureError &e) {
    EXPECT_NE(std::string(e.what()).find("capture from Python"), std::string::npos) << e.what();
  }
}

TEST(Capture, DeferredSequentialIsFakeAndMaterializesBitwise) {
  SKIP_WITHOUT_KEYS();
  torch::manual_seed(42);
  torch::nn::Sequential eager = makeModel();

  torch::manual_seed(42);
  torch::nn::Sequential deferred;
  std::shared_ptr<Recording> recording = deferredInit([&] { deferred = makeModel(); });
  ASSERT_TRUE(recording);
  EXPECT_GT(recording->size(), 0u);

  std::vector<at::Tensor> params;
  for (const auto &p : deferred->named_parameters()) {
    EXPECT_TRUE(isFake(p.value())) << p.key();
    EXPECT_TRUE(isDeferred(p.value())) << p.key();
    EXPECT_EQ(p.value().data_ptr(), nullptr) << p.key() << " owns storage";
    params.push_back(p.value());
  }
  torch::manual_seed(7); // whatever happens to the RNG in between
  std::vector<at::Tensor> real = recording->materialize(params);
  auto expected = eager->named_parameters();
  ASSERT_EQ(real.size(), expected.size());
  for (size_t i = 0; i < real.size(); ++i) {
    EXPECT_FALSE(isFake(real[i]));
    EXPECT_TRUE(torch::equal(real[i], expected[i].value())) << expected[i].key();
  }
}

TEST(Capture, CaptureToMlirVerifies) {
  SKIP_WITHOUT_KEYS();
  torch::manual_seed(1);
  torch::nn::Sequential deferred;
  auto recording = deferredInit([&] { deferred = makeModel(); });
  std::vector<StateEntry> entries;
  for (const auto &p : deferred->named_parameters())
    entries.push_back({p.key(), p.value(), false, ""});
  std::string mlir = captureToMlir(*recording, entries, recording->seed());
  std::shared_ptr<Module> module = Module::parse(mlir);
  EXPECT_NE(mlir.find("tdx.parameter @\"0.weight\" : tensor<32x16xf32>"), std::string::npos)
      << mlir;
  EXPECT_NE(mlir.find("tdx.uniform("), std::string::npos) << mlir;
  // A pass pipeline runs on it.
  module->runPipeline("canonicalize");
  EXPECT_NO_THROW(Module::parse(module->print()));
  EXPECT_EQ(module->state().size(), entries.size());
  // A failed pipeline leaves the program as it was.
  std::string before = module->print();
  EXPECT_THROW(module->runPipeline("tdx-partition,tdx-partition"), CaptureError);
  EXPECT_EQ(module->print(), before);
}

TEST(Capture, FakeModeReportsErrors) {
  SKIP_WITHOUT_KEYS();
  FakeMode fake;
  at::Tensor t = torch::ones({3, 4});
  EXPECT_TRUE(isFake(t));
  EXPECT_EQ(t.sizes(), (std::vector<int64_t>{3, 4}));
  EXPECT_THROW(t.item(), c10::Error);
  EXPECT_THROW(torch::poisson(t), c10::NotImplementedError);
  EXPECT_THROW(torch::nonzero(t), c10::Error); // a shape that depends on values
}

} // namespace
