//===- Profile.cpp - where a model binary's step time goes (--profile) ----===//

#include "tdx/Runtime/Runtime.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

using namespace tdx::rt;

namespace {

bool on = false;
/// Timed calls open on this thread: only the outermost one counts.
thread_local int depth = 0;
thread_local int64_t atenStart = 0;

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::unique_ptr<at::ObserverContext> atenBegins(const at::RecordFunction &) {
  if (depth++ == 0)
    atenStart = nowNs();
  return nullptr;
}

void atenEnds(const at::RecordFunction &fn, at::ObserverContext *) {
  if (--depth == 0) {
    double seconds = (nowNs() - atenStart) * 1e-9;
    Profile::totals().aten += seconds;
    Profile::totals().byOp[fn.name()] += seconds;
  }
}

} // namespace

Profile &Profile::totals() {
  static Profile p;
  return p;
}

void Profile::enable() {
  if (on)
    return;
  on = true;
  at::addGlobalCallback(at::RecordFunctionCallback(atenBegins, atenEnds)
                            .scopes({at::RecordScope::FUNCTION})
                            .needsInputs(false));
}

Profile::Scope::Scope(double Profile::*bucket) : bucket_(bucket) {
  if (on && depth++ == 0)
    start_ = nowNs();
  else if (on)
    start_ = -1;
}

Profile::Scope::~Scope() {
  if (!on)
    return;
  --depth;
  if (start_ >= 0)
    totals().*bucket_ += (nowNs() - start_) * 1e-9;
}

void Profile::print(double seconds, int64_t steps) const {
  double step = seconds / steps;
  double rest = step - (aten + kernels + collectives) / steps;
  std::printf("tdx: rank 0 profile per step: step %.3f ms = ATen calls %.3f ms + fused kernels "
              "%.3f ms + collectives %.3f ms + runtime overhead %.3f ms (%.2f%% over the ATen "
              "calls and kernels)\n",
              step * 1e3, aten / steps * 1e3, kernels / steps * 1e3, collectives / steps * 1e3,
              rest * 1e3, 100.0 * rest / ((aten + kernels) / steps));
  std::vector<std::pair<double, std::string>> ops;
  for (const auto &[name, total] : byOp)
    ops.push_back({total, name});
  std::sort(ops.rbegin(), ops.rend());
  std::printf("tdx: rank 0 ATen calls per step:");
  for (size_t i = 0; i < ops.size() && i < 8; ++i)
    std::printf("%s %s %.3f ms", i ? "," : "", ops[i].second.c_str(), ops[i].first / steps * 1e3);
  std::printf("\n");
  std::fflush(stdout);
}
