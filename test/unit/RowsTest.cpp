//===- RowsTest.cpp - the CUDA backend's row kernels, run on CPU vs ATen ---===//
//
// The functions of tdx/Runtime/Rows.h are what lib/Runtime/cuda launches one
// thread block per row; here the same functions run on the host against
// ATen, with one lane per row and with blocks of 3 and 4 lanes emulated by
// threads that combine between barriers as a block's warps do.

#include "tdx/StateFormat/Box.h"
#include "tdx/Runtime/Rows.h"

#include "AtenTestUtil.h"

#include <condition_variable>
#include <mutex>
#include <thread>

using namespace tdx::kern;
using tdx::test::expectClose;
using tdx::test::randn;

namespace {

/// A block of lanes emulated by host threads: each combine writes its
/// lane's slot, waits for every lane, reads all slots in lane order and
/// waits again before the slots are reused (BlockLanes' __syncthreads).
class ThreadLanes {
public:
  struct Shared {
    explicit Shared(int count) : count(count), slots(count) {}
    int count;
    std::vector<double> slots;
    std::mutex mutex;
    std::condition_variable cv;
    int arrived = 0;
    int64_t phase = 0;
  };
  ThreadLanes(Shared &shared, int lane) : s_(shared), lane_(lane) {}
  int lane() const { return lane_; }
  int count() const { return s_.count; }
  double sum(double v) const { return combine(v, false); }
  double max(double v) const { return combine(v, true); }

private:
  void barrier() const {
    std::unique_lock<std::mutex> lock(s_.mutex);
    int64_t phase = s_.phase;
    if (++s_.arrived == s_.count) {
      s_.arrived = 0;
      ++s_.phase;
      s_.cv.notify_all();
    } else {
      s_.cv.wait(lock, [&] { return s_.phase != phase; });
    }
  }
  double combine(double v, bool isMax) const {
    s_.slots[lane_] = v;
    barrier();
    double r = isMax ? -INFINITY : 0.0;
    for (double x : s_.slots)
      r = isMax ? maxNaN(r, x) : r + x;
    barrier();
    return r;
  }
  Shared &s_;
  int lane_;
};

/// Runs fn(lanes) for one row: on OneLane, or on `count` emulated lanes.
/// Returns lane 0's result.
template <class Fn> double onLanes(int count, Fn fn) {
  if (count == 1)
    return fn(OneLane{});
  ThreadLanes::Shared shared(count);
  std::vector<std::thread> threads;
  for (int lane = 1; lane < count; ++lane)
    threads.emplace_back([&, lane] { fn(ThreadLanes(shared, lane)); });
  double result = fn(ThreadLanes(shared, 0));
  for (std::thread &t : threads)
    t.join();
  return result;
}

const int kLaneCounts[] = {1, 3, 4};

} // namespace

TEST(RowsTest, SoftmaxAndLogSoftmaxAlongEveryDim) {
  at::Tensor x = randn({3, 5, 7}, 1) * 4;
  for (int lanes : kLaneCounts)
    for (int64_t dim = 0; dim < 3; ++dim)
      for (bool log : {false, true}) {
        at::Tensor y = at::empty_like(x);
        int64_t n = x.size(dim), stride = x.stride(dim);
        // Every row along `dim`: the elements whose index there is 0.
        for (int64_t i = 0; i < x.numel(); ++i)
          if ((i / stride) % n == 0)
            onLanes(lanes, [&](const auto &g) {
              softmaxRow(g, x.data_ptr<float>() + i, y.data_ptr<float>() + i, n, stride, log);
              return 0.0;
            });
        expectClose(y, log ? at::log_softmax(x, dim) : at::softmax(x, dim));
      }
}

TEST(RowsTest, LayerNormWithAndWithoutAffine) {
  at::Tensor x = randn({6, 32}, 2) * 3 + 1, w = randn({32}, 3), b = randn({32}, 4);
  for (int lanes : kLaneCounts) {
    at::Tensor y = at::empty_like(x), z = at::empty_like(x);
    for (int64_t r = 0; r < 6; ++r)
      onLanes(lanes, [&](const auto &g) {
        layerNormRow(g, x.data_ptr<float>() + r * 32, w.data_ptr<float>(), b.data_ptr<float>(),
                     y.data_ptr<float>() + r * 32, 32, 1e-5);
        layerNormRow<float>(g, x.data_ptr<float>() + r * 32, nullptr, nullptr,
                            z.data_ptr<float>() + r * 32, 32, 1e-5);
        return 0.0;
      });
    expectClose(y, at::layer_norm(x, {32}, w, b, 1e-5));
    expectClose(z, at::layer_norm(x, {32}, {}, {}, 1e-5));
  }
}

TEST(RowsTest, RmsNorm) {
  at::Tensor x = randn({4, 16}, 5), w = randn({16}, 6);
  for (int lanes : kLaneCounts) {
    at::Tensor y = at::empty_like(x);
    for (int64_t r = 0; r < 4; ++r)
      onLanes(lanes, [&](const auto &g) {
        rmsNormRow(g, x.data_ptr<float>() + r * 16, w.data_ptr<float>(),
                   y.data_ptr<float>() + r * 16, 16, 1e-6);
        return 0.0;
      });
    expectClose(y, x * at::rsqrt(x.pow(2).mean({-1}, true) + 1e-6) * w);
  }
}

TEST(RowsTest, Reductions) {
  at::Tensor x = randn({5, 9}, 7);
  for (int lanes : kLaneCounts) {
    for (int kind : {RowSum, RowMean, RowMax}) {
      at::Tensor y = at::empty({9});
      for (int64_t c = 0; c < 9; ++c)
        y[c] = onLanes(lanes, [&](const auto &g) {
          return reduceRow(g, kind, x.data_ptr<float>() + c, 5, 9);
        });
      at::Tensor want = kind == RowSum ? x.sum(0) : kind == RowMean ? x.mean(0) : x.amax(0);
      expectClose(y, want);
    }
    // A NaN in any lane's elements makes the max NaN.
    for (int at = 0; at < 5; ++at) {
      float row[] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
      row[at] = NAN;
      EXPECT_TRUE(std::isnan(
          onLanes(lanes, [&](const auto &g) { return reduceRow(g, RowMax, row, 5, 1); })));
    }
  }
}

TEST(RowsTest, CrossEntropyWithSmoothingAndIgnoredTargets) {
  at::Tensor logits = randn({8, 11}, 8) * 2;
  at::Tensor target = at::randint(0, 11, {8}, at::make_generator<at::CPUGeneratorImpl>(9));
  target[3] = -100;
  for (int lanes : kLaneCounts)
    for (double smoothing : {0.0, 0.1}) {
      // Each sample's loss (NaN: ignored), then their mean over the counted
      // ones, as the CUDA backend's two kernels compute them.
      std::vector<double> losses(8);
      for (int64_t r = 0; r < 8; ++r) {
        int64_t t = target[r].item<int64_t>();
        losses[r] = t == -100 ? NAN : onLanes(lanes, [&](const auto &g) {
          return crossEntropyRow(g, logits.data_ptr<float>() + r * 11, 11, 1, t, smoothing);
        });
      }
      double mean = onLanes(lanes, [&](const auto &g) {
        double sum, counted;
        countedSum(g, losses.data(), 8, sum, counted);
        return sum / counted;
      });
      double want = at::cross_entropy_loss(logits, target, {}, at::Reduction::Mean, -100, smoothing)
                        .item<double>();
      EXPECT_NEAR(mean, want, 1e-5 * std::abs(want));
    }
}

/// How many bf16 ulps apart two bf16 tensors are, at most: their bit
/// patterns as ordered integers (no NaN here).
static int64_t bf16UlpsApart(const at::Tensor &a, const at::Tensor &b) {
  auto ordered = [](const at::Tensor &t) {
    at::Tensor bits = t.contiguous().view(at::kShort).to(at::kLong);
    // Sign-magnitude to two's complement order: negatives count down.
    return at::where(bits < 0, -(bits + 32768), bits);
  };
  return (ordered(a) - ordered(b)).abs().max().item<int64_t>();
}

/// The bf16 softmax, log_softmax, layer and RMS norms and cross entropy a
/// mixed-precision step runs on CUDA: the row functions compute in double
/// and round once to bf16 (narrow: through float). They equal the float64
/// op on the same bf16 inputs rounded the same way (but where the two
/// double results straddle a rounding boundary: none here), and are within
/// one bf16 ulp of ATen's bf16 kernels, which compute in float and, for
/// softmax, round exp(x - max) to bf16 before dividing (about a tenth of
/// the elements one ulp off the correctly rounded result).
TEST(RowsTest, Bf16RowsComputeWideAndRoundOnceAsAten) {
  using B = at::BFloat16;
  at::Tensor x = (randn({16, 64}, 21) * 3).to(at::kBFloat16);
  at::Tensor w = (randn({64}, 22) * 0.5 + 1).to(at::kBFloat16);
  at::Tensor b = randn({64}, 23).to(at::kBFloat16);
  at::Tensor xd = x.to(at::kDouble), wd = w.to(at::kDouble), bd = b.to(at::kDouble);
  auto rows = [&](auto fn) {
    at::Tensor y = at::empty_like(x);
    for (int64_t r = 0; r < 16; ++r)
      fn(OneLane{}, x.data_ptr<B>() + r * 64, y.data_ptr<B>() + r * 64);
    return y;
  };
  auto roundedOnce = [](const at::Tensor &wide) {
    return wide.to(at::kFloat).to(at::kBFloat16);
  };
  auto expectRoundedOnce = [](const at::Tensor &got, const at::Tensor &exact,
                              const at::Tensor &aten, const char *op) {
    EXPECT_EQ(got.scalar_type(), at::kBFloat16) << op;
    EXPECT_TRUE(got.equal(exact)) << op << ": " << bf16UlpsApart(got, exact)
                                  << " ulps from the float64 op rounded once";
    EXPECT_LE(bf16UlpsApart(got, aten), 1) << op << " against ATen's bf16 kernel";
  };
  for (bool log : {false, true})
    expectRoundedOnce(rows([&](auto g, const B *in, B *out) { softmaxRow(g, in, out, 64, 1, log); }),
                      roundedOnce(log ? at::log_softmax(xd, 1) : at::softmax(xd, 1)),
                      log ? at::log_softmax(x, 1) : at::softmax(x, 1), "softmax");
  expectRoundedOnce(rows([&](auto g, const B *in, B *out) {
                      layerNormRow(g, in, w.data_ptr<B>(), b.data_ptr<B>(), out, 64, 1e-5);
                    }),
                    roundedOnce(at::layer_norm(xd, {64}, wd, bd, 1e-5)),
                    at::layer_norm(x, {64}, w, b, 1e-5), "layer_norm");
  expectRoundedOnce(rows([&](auto g, const B *in, B *out) {
                      rmsNormRow(g, in, w.data_ptr<B>(), out, 64, 1e-6);
                    }),
                    roundedOnce(at::rms_norm(xd, {64}, wd, 1e-6)), at::rms_norm(x, {64}, w, 1e-6),
                    "rms_norm");
  // Cross entropy: each sample's loss in double from bf16 logits; the mean
  // rounded once to bf16.
  at::Tensor target = at::randint(0, 64, {16}, at::make_generator<at::CPUGeneratorImpl>(24));
  double sum = 0;
  for (int64_t r = 0; r < 16; ++r)
    sum += crossEntropyRow(OneLane{}, x.data_ptr<B>() + r * 64, 64, 1,
                           target[r].item<int64_t>(), 0.0);
  at::Tensor loss = at::scalar_tensor(static_cast<float>(narrow<B>(sum / 16))).to(at::kBFloat16);
  expectRoundedOnce(loss, roundedOnce(at::cross_entropy_loss(xd, target)),
                    at::cross_entropy_loss(x, target), "cross_entropy");
}

TEST(RowsTest, SoftmaxBackwardIsAtensBackwardData) {
  at::Tensor x = randn({4, 9}, 11) * 3, dy = randn({4, 9}, 12);
  for (int lanes : kLaneCounts)
    for (bool log : {false, true}) {
      at::Tensor y = log ? at::log_softmax(x, 1) : at::softmax(x, 1), dx = at::empty_like(x);
      for (int64_t r = 0; r < 4; ++r)
        onLanes(lanes, [&](const auto &g) {
          softmaxBackwardRow(g, dy.data_ptr<float>() + r * 9, y.data_ptr<float>() + r * 9,
                             dx.data_ptr<float>() + r * 9, 9, log);
          return 0.0;
        });
      expectClose(dx, log ? at::_log_softmax_backward_data(dy, y, 1, at::kFloat)
                          : at::_softmax_backward_data(dy, y, 1, at::kFloat));
    }
}

TEST(RowsTest, NativeLayerNormAndItsBackward) {
  const int64_t rows = 6, n = 16;
  at::Tensor x = randn({rows, n}, 13) * 2 + 1, w = randn({n}, 14), b = randn({n}, 15);
  at::Tensor dy = randn({rows, n}, 16);
  auto [y0, mean0, rstd0] = at::native_layer_norm(x, {n}, w, b, 1e-5);
  auto [dx0, dw0, db0] =
      at::native_layer_norm_backward(dy, x, {n}, mean0, rstd0, w, b, {true, true, true});
  for (int lanes : kLaneCounts) {
    at::Tensor y = at::empty_like(x), mean = at::empty({rows, 1}), rstd = at::empty({rows, 1});
    at::Tensor dx = at::empty_like(x), dw = at::empty({n}), db = at::empty({n});
    for (int64_t r = 0; r < rows; ++r)
      onLanes(lanes, [&](const auto &g) {
        layerNormRow(g, x.data_ptr<float>() + r * n, w.data_ptr<float>(), b.data_ptr<float>(),
                     y.data_ptr<float>() + r * n, n, 1e-5, mean.data_ptr<float>() + r,
                     rstd.data_ptr<float>() + r);
        return 0.0;
      });
    expectClose(y, y0);
    expectClose(mean, mean0);
    expectClose(rstd, rstd0);
    for (int64_t r = 0; r < rows; ++r)
      onLanes(lanes, [&](const auto &g) {
        layerNormBackwardRow(g, dy.data_ptr<float>() + r * n, x.data_ptr<float>() + r * n,
                             static_cast<double>(mean0[r][0].item<float>()),
                             static_cast<double>(rstd0[r][0].item<float>()), w.data_ptr<float>(),
                             dx.data_ptr<float>() + r * n, n);
        return 0.0;
      });
    expectClose(dx, dx0);
  }
  at::Tensor dw = at::empty({n}), db = at::empty({n});
  for (int64_t j = 0; j < n; ++j)
    layerNormParamGradColumn(dy.data_ptr<float>(), x.data_ptr<float>(), mean0.data_ptr<float>(),
                             rstd0.data_ptr<float>(), rows, n, j, dw.data_ptr<float>(),
                             db.data_ptr<float>());
  expectClose(dw, dw0);
  expectClose(db, db0);
  // Without an affine weight the input gradient is the normalization's alone.
  auto [dxPlain, unusedW, unusedB] =
      at::native_layer_norm_backward(dy, x, {n}, mean0, rstd0, {}, {}, {true, false, false});
  at::Tensor dx = at::empty_like(x);
  for (int64_t r = 0; r < rows; ++r)
    layerNormBackwardRow<float>(OneLane{}, dy.data_ptr<float>() + r * n,
                                x.data_ptr<float>() + r * n, mean0[r][0].item<float>(),
                                rstd0[r][0].item<float>(), nullptr, dx.data_ptr<float>() + r * n,
                                n);
  expectClose(dx, dxPlain);
}

/// Batch norm's rows run on the input moved channel-major, as the CUDA
/// backend runs them: native_batch_norm in training (its saved statistics
/// and the running statistics it moves) and outside it, and
/// native_batch_norm_backward in both modes.
TEST(RowsTest, NativeBatchNormAndItsBackwardPerChannel) {
  const int64_t channels = 3;
  at::Tensor x = randn({4, channels, 5, 3}, 30) * 2 + 1, dy = randn({4, channels, 5, 3}, 31);
  at::Tensor w = randn({channels}, 32), b = randn({channels}, 33);
  at::Tensor runMean0 = randn({channels}, 34), runVar0 = randn({channels}, 35).abs() + 0.5;
  at::Tensor cx = x.transpose(0, 1).contiguous(), cdy = dy.transpose(0, 1).contiguous();
  const int64_t n = cx.numel() / channels;
  const double momentum = 0.1, eps = 1e-5;
  for (bool training : {true, false}) {
    at::Tensor runMean = runMean0.clone(), runVar = runVar0.clone();
    auto [y0, mean0, invstd0] =
        at::native_batch_norm(x, w, b, runMean, runVar, training, momentum, eps);
    // ATen's backward reads the saved statistics in training, else the
    // running ones.
    auto [dx0, dw0, db0] = at::native_batch_norm_backward(
        dy, x, w, runMean0, runVar0, mean0, invstd0, training, eps, {true, true, true});
    for (int lanes : kLaneCounts) {
      at::Tensor y = at::empty_like(cx), mean = at::empty({channels}),
                 invstd = at::empty({channels}), unbiased = at::empty({channels}, at::kDouble);
      at::Tensor dx = at::empty_like(cx), dw = at::empty({channels}), db = at::empty({channels});
      for (int64_t c = 0; c < channels; ++c) {
        onLanes(lanes, [&](const auto &g) {
          batchNormRow(g, cx.data_ptr<float>() + c * n, y.data_ptr<float>() + c * n, n, training,
                       runMean0[c].item<double>(), runVar0[c].item<double>(),
                       w[c].item<double>(), b[c].item<double>(), eps,
                       mean.data_ptr<float>() + c, invstd.data_ptr<float>() + c,
                       unbiased.data_ptr<double>() + c);
          return 0.0;
        });
        double m = training ? mean[c].item<double>() : runMean0[c].item<double>();
        double is = training ? invstd[c].item<double>()
                             : 1.0 / std::sqrt(runVar0[c].item<double>() + eps);
        onLanes(lanes, [&](const auto &g) {
          batchNormBackwardRow(g, cdy.data_ptr<float>() + c * n, cx.data_ptr<float>() + c * n,
                               dx.data_ptr<float>() + c * n, n, training, m, is,
                               w[c].item<double>(), dw.data_ptr<float>() + c,
                               db.data_ptr<float>() + c);
          return 0.0;
        });
      }
      expectClose(y.transpose(0, 1), y0);
      expectClose(dx.transpose(0, 1), dx0);
      expectClose(dw, dw0, 1e-5, 1e-5);
      expectClose(db, db0, 1e-5, 1e-5);
      if (training) {
        expectClose(mean, mean0);
        expectClose(invstd, invstd0);
        // The running statistics move towards the batch's unbiased variance.
        expectClose((momentum * unbiased + (1 - momentum) * runVar0).to(at::kFloat), runVar);
        expectClose(momentum * mean + (1 - momentum) * runMean0, runMean);
      }
    }
  }
}

TEST(RowsTest, NllLossGradientAtTheTargetForEveryReduction) {
  at::Tensor logp = at::log_softmax(randn({5, 7}, 17), 1);
  at::Tensor target = at::randint(0, 7, {5}, at::make_generator<at::CPUGeneratorImpl>(18));
  target[2] = -100;
  at::Tensor weight = at::rand({7}, at::make_generator<at::CPUGeneratorImpl>(19)) + 0.5;
  for (int64_t reduction : {0, 1, 2}) {
    auto [loss, total] = at::nll_loss_forward(logp, target, weight, reduction, -100);
    at::Tensor dy = reduction == 0 ? randn({5}, 20) : at::full({}, 0.7);
    at::Tensor want = at::nll_loss_backward(dy, logp, target, weight, reduction, -100, total);
    at::Tensor got = at::zeros_like(logp);
    for (int64_t r = 0; r < 5; ++r) {
      int64_t t = target[r].item<int64_t>();
      if (t == -100)
        continue;
      got[r][t] = nllLossGrad(reduction, (reduction == 0 ? dy[r] : dy).item<double>(),
                              weight[t].item<double>(), total.item<double>());
    }
    expectClose(got, want);
  }
}

TEST(RowsTest, EmbeddingBackwardSumsEachRowsTokensInOrder) {
  const int64_t vocab = 10, dim = 6;
  at::Tensor ids = at::tensor({3, 1, 3, 0, 9, 3, 1, 5}, at::kLong).reshape({2, 4});
  at::Tensor grad = randn({2, 4, dim}, 21);
  for (int64_t padding : {-1, 3}) {
    std::vector<int64_t> start(vocab + 1), tokens(8);
    ASSERT_TRUE(embeddingBackwardOrder(ids.data_ptr<int64_t>(), 8, vocab, padding, start.data(),
                                       tokens.data()));
    at::Tensor got = at::empty({vocab, dim});
    for (int lanes : kLaneCounts) {
      for (int64_t v = 0; v < vocab; ++v)
        onLanes(lanes, [&](const auto &g) {
          embeddingBackwardRow(g, grad.data_ptr<float>(), dim, tokens.data() + start[v],
                               start[v + 1] - start[v], got.data_ptr<float>() + v * dim);
          return 0.0;
        });
      expectClose(got, at::embedding_dense_backward(grad, ids, vocab, padding, false));
    }
  }
  // An index outside the table is reported, not read.
  int64_t bad[] = {2, 10};
  std::vector<int64_t> start(vocab + 1), tokens(2);
  EXPECT_FALSE(embeddingBackwardOrder(bad, 2, vocab, -1, start.data(), tokens.data()));
}

TEST(RowsTest, IterWalksBroadcastAndTransposedOperands) {
  at::Tensor a = randn({4, 6}, 10).t(), b = randn({6, 1}, 11);
  Iter it;
  it.rank = 2;
  it.operands = 2;
  it.shape[0] = 6, it.shape[1] = 4;
  it.numel = 24;
  at::Tensor bx = b.expand({6, 4});
  for (int d = 0; d < 2; ++d) {
    it.strides[0][d] = a.stride(d);
    it.strides[1][d] = bx.stride(d);
  }
  it.data[0] = a.data_ptr();
  it.data[1] = b.data_ptr();
  at::Tensor y = at::empty({6, 4});
  for (int64_t i = 0; i < 24; ++i)
    y.data_ptr<float>()[i] = it.at<float>(0, i) * it.at<float>(1, i);
  expectClose(y, a * b);
}

TEST(RowsTest, BoxRunsCoverTheBoxInOrder) {
  at::Tensor g = at::arange(4 * 6 * 5, at::kFloat).reshape({4, 6, 5});
  std::vector<std::vector<int64_t>> offsets = {{1, 2, 0}, {0, 0, 0}, {2, 0, 0}, {0, 3, 1}};
  std::vector<std::vector<int64_t>> sizes = {{2, 3, 5}, {4, 6, 5}, {1, 6, 5}, {4, 2, 3}};
  for (size_t c = 0; c < offsets.size(); ++c) {
    at::Tensor want = g;
    for (int64_t d = 0; d < 3; ++d)
      want = want.narrow(d, offsets[c][d], sizes[c][d]);
    at::Tensor got = at::empty(sizes[c]);
    tdx::rt::forEachBoxRun({4, 6, 5}, offsets[c], sizes[c], [&](int64_t gl, int64_t lo, int64_t n) {
      std::memcpy(got.data_ptr<float>() + lo, g.data_ptr<float>() + gl, n * sizeof(float));
    });
    EXPECT_TRUE(at::equal(got, want.contiguous())) << "case " << c;
  }
}
