//===- Safetensors.h - checked safetensors files for model binaries -*- C++ -*-===//
//
// The tensor files of model binaries (--inputs, --outputs, --params,
// --dump-params) without ATen, so the CPU and the CUDA runtime read and write
// them the same way. A reader validates the header (sizes, offsets, dtypes)
// before any data is read and can read one rank's box of an entry alone, so
// a rank never holds a global parameter it only needs a shard of.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_RUNTIME_SAFETENSORS_H
#define TDX_RUNTIME_SAFETENSORS_H

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tdx::rt {

/// Element types of stored tensors (tdx/Runtime/DTypes.def).
enum class DType {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir) Name,
#include "tdx/Runtime/DTypes.def"
};
int64_t dtypeSize(DType t);
/// The safetensors name ("F32", "BOOL").
const char *dtypeName(DType t);
/// The enumerator's name ("F32", "Bool"): emitted sources spell it so.
const char *dtypeEnumerator(DType t);
/// Throws naming the dtype when it is not one of the above.
DType dtypeNamed(const std::string &name);

struct StoredTensor {
  std::string file;
  DType dtype;
  std::vector<int64_t> shape;
  /// Byte offset of the data in `file`.
  uint64_t offset = 0;
  int64_t numel() const;
};

/// The entries of one safetensors file, or of every *.safetensors file of a
/// directory (a checkpoint split in several files, as Hugging Face writes
/// them; a name in two files is an error). Throws with the path on a
/// missing, truncated or corrupt file.
class TensorStore {
public:
  explicit TensorStore(const std::string &path);
  const std::string &path() const { return path_; }
  /// nullptr when absent.
  const StoredTensor *find(const std::string &name) const;
  /// The entry `name` (a `what`: "parameter", "input") of global `shape`;
  /// throws naming the file when it is absent or has another shape.
  const StoredTensor &expect(const std::string &name, const std::string &what,
                             const std::vector<int64_t> &shape) const;
  /// Reads the whole entry into `out` (numel * dtypeSize bytes).
  void read(const StoredTensor &t, void *out) const;
  /// Reads the box [offset, offset + size) of the entry, row-major, into
  /// `out`: only the bytes of the box are read from the file.
  void readBox(const StoredTensor &t, const std::vector<int64_t> &offset,
               const std::vector<int64_t> &size, void *out) const;

private:
  std::string path_;
  std::map<std::string, StoredTensor> entries_;
  void addFile(const std::string &file);
};

struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void *data;
};
/// Writes a temporary file and renames it over `path`: a reader never sees
/// half a file, and a failed write leaves what was there.
void writeSafetensors(const std::string &path, const std::vector<TensorToWrite> &tensors);

} // namespace tdx::rt

#endif // TDX_RUNTIME_SAFETENSORS_H
