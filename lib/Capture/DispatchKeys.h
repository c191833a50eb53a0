//===- DispatchKeys.h - the dispatch key the keyed capture stands on -*- C++ -*-===//
//
// The one place that names it: DispatchKey::Fake, reserved by torch for
// torchdistX and marked for deletion upstream (docs/capture.md, "Two ways
// in"). The keyed way puts the engine behind that key's boxed fallback,
// below autograd (FakeTensor.cpp). Configured with -DTDX_CAPTURE_KEYS=OFF,
// tdx is built without it: capture then runs only the key-free way, torch's
// Python dispatch (a tensor subclass and a TorchDispatchMode whose handler
// is the same engine).
//
//===----------------------------------------------------------------------===//

#ifndef TDX_LIB_CAPTURE_DISPATCHKEYS_H
#define TDX_LIB_CAPTURE_DISPATCHKEYS_H

#include <c10/core/DispatchKey.h>

#ifndef TDX_CAPTURE_KEYS
#define TDX_CAPTURE_KEYS 1
#endif

#if TDX_CAPTURE_KEYS
// For TORCH_LIBRARY_IMPL(_, TDX_FAKE_KEY, m), which takes a key's name.
#define TDX_FAKE_KEY Fake

namespace tdx::capture {
constexpr c10::DispatchKey kFakeKey = c10::DispatchKey::TDX_FAKE_KEY;
} // namespace tdx::capture
#endif

#endif // TDX_LIB_CAPTURE_DISPATCHKEYS_H
