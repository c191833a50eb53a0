//===- Profile.cpp - where a model binary's step time goes (--profile) ----===//

#include "tdx/Runtime/Runtime.h"

#include <ATen/record_function.h>

#include <chrono>

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

bool Profile::enabled() { return on; }

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
