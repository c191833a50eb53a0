//===- CaptureInternal.h - shared by the capture fallbacks -------*- C++ -*-===//

#ifndef TDX_LIB_CAPTURE_CAPTUREINTERNAL_H
#define TDX_LIB_CAPTURE_CAPTUREINTERNAL_H

#include "tdx/Capture/Capture.h"

namespace mlir {
class MLIRContext;
} // namespace mlir

namespace tdx::capture {

/// A fake tensor with `meta`'s sizes, strides and dtype on `device`, sharing
/// `storage` when given (a view) or with a new empty storage, which belongs
/// to `recording` when given (the tensor is deferred).
at::Tensor makeFake(const at::Tensor &meta, c10::Device device,
                    c10::optional<c10::Storage> storage, Recording *recording);

/// The recording ops on this thread go to, or null.
Recording *currentRecording();
/// Makes `recording` the one ops on this thread go to, until destroyed.
class RecordingScope {
public:
  explicit RecordingScope(Recording *recording);
  ~RecordingScope();
  RecordingScope(const RecordingScope &) = delete;
  RecordingScope &operator=(const RecordingScope &) = delete;

private:
  Recording *previous_;
};
/// The DataPtr of a new fake storage: no data; for a deferred tensor its
/// context refers (weakly) to the recording the tensor belongs to.
c10::DataPtr fakeDataPtr(c10::Device device, Recording *recording);
/// Whether `data` is a fake storage's (made by fakeDataPtr).
bool isFakeData(const c10::DataPtr &data);
/// The recording a deferred tensor among the op's arguments on `stack`
/// belongs to, or null.
std::shared_ptr<Recording> recordingOfArguments(const c10::FunctionSchema &schema,
                                                const std::vector<c10::IValue> &stack);
bool fakeCudaEnabled();
/// Loads the dialects tdx programs use into `ctx`.
void registerProgramDialects(mlir::MLIRContext &ctx);
/// The trace ops on this thread go to, or null.
Trace *currentTrace();

/// Calls `fn` on every tensor of `values` in order, a list's elements in its
/// place (undefined tensors included: an output mask's absent gradient).
template <typename Fn> void forEachTensor(const std::vector<c10::IValue> &values, Fn fn) {
  for (const c10::IValue &v : values) {
    if (v.isTensor())
      fn(v.toTensor());
    else if (v.isTensorList())
      for (const at::Tensor &t : v.toTensorVector())
        fn(t);
    else if (v.isList())
      for (const c10::IValue &e : v.toListRef())
        if (e.isTensor())
          fn(e.toTensor());
  }
}

} // namespace tdx::capture

#endif // TDX_LIB_CAPTURE_CAPTUREINTERNAL_H
