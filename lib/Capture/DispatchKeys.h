//===- DispatchKeys.h - the two dispatch keys capture stands on -*- C++ -*-===//
//
// The one place that names them: the keys torch reserved for torchdistX,
// still in torch 2.15 (docs/capture.md, "Which dispatch keys"). Fake: fake
// tensors' boxed fallback, below autograd (FakeTensor.cpp). DeferredInit:
// module construction's record, above autograd (DeferredInit.cpp). A
// capture that needs neither key replaces these two and their uses in
// those two files; nothing above them knows which keys carry the engine.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_LIB_CAPTURE_DISPATCHKEYS_H
#define TDX_LIB_CAPTURE_DISPATCHKEYS_H

#include <c10/core/DispatchKey.h>

// For TORCH_LIBRARY_IMPL(_, TDX_FAKE_KEY, m), which takes a key's name.
#define TDX_FAKE_KEY Fake
#define TDX_DEFERRED_KEY DeferredInit

namespace tdx::capture {

constexpr c10::DispatchKey kFakeKey = c10::DispatchKey::TDX_FAKE_KEY;
constexpr c10::DispatchKey kDeferredKey = c10::DispatchKey::TDX_DEFERRED_KEY;

} // namespace tdx::capture

#endif // TDX_LIB_CAPTURE_DISPATCHKEYS_H
