//===- Safetensors.cpp - checked safetensors files for model binaries -----===//

#include "tdx/Runtime/Safetensors.h"
#include "tdx/Runtime/Box.h"

#include "llvm/Support/JSON.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <stdexcept>

using namespace tdx::rt;

namespace {

const std::pair<const char *, DType> kDtypes[] = {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir) {stored, DType::Name},
#include "tdx/Runtime/DTypes.def"
};

std::runtime_error error(const std::string &what) { return std::runtime_error("tdx: " + what); }

/// A file open for reading at offsets.
class File {
public:
  explicit File(const std::string &path) : path_(path), fd_(::open(path.c_str(), O_RDONLY)) {
    if (fd_ < 0)
      throw error("cannot open " + path);
  }
  ~File() { ::close(fd_); }
  File(const File &) = delete;
  File &operator=(const File &) = delete;
  /// Reads exactly `n` bytes at `offset` or throws.
  void read(uint64_t offset, uint64_t n, void *out) const {
    char *dst = static_cast<char *>(out);
    while (n > 0) {
      ssize_t got = ::pread(fd_, dst, n, static_cast<off_t>(offset));
      if (got <= 0)
        throw error(path_ + " is truncated");
      dst += got, offset += static_cast<uint64_t>(got), n -= static_cast<uint64_t>(got);
    }
  }

private:
  std::string path_;
  int fd_;
};

} // namespace

int64_t tdx::rt::dtypeSize(DType t) {
  switch (t) {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir)                                  \
  case DType::Name:                                                                        \
    return bytes;
#include "tdx/Runtime/DTypes.def"
  }
  return 0;
}

const char *tdx::rt::dtypeEnumerator(DType t) {
  switch (t) {
#define TDX_DTYPE(Name, stored, bytes, aten, ctype, mlir)                                  \
  case DType::Name:                                                                        \
    return #Name;
#include "tdx/Runtime/DTypes.def"
  }
  return "?";
}

const char *tdx::rt::dtypeName(DType t) {
  for (const auto &[name, type] : kDtypes)
    if (type == t)
      return name;
  return "?";
}

DType tdx::rt::dtypeNamed(const std::string &name) {
  for (const auto &[n, type] : kDtypes)
    if (name == n)
      return type;
  throw error("unsupported safetensors dtype " + name +
              " (model binaries store F32, F64, F16, BF16, I64, I32 and BOOL)");
}

int64_t StoredTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}

TensorStore::TensorStore(const std::string &path) : path_(path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    throw error("cannot open " + path + ": no such file or directory");
  if (!S_ISDIR(st.st_mode)) {
    addFile(path);
    return;
  }
  std::vector<std::string> files;
  if (DIR *dir = ::opendir(path.c_str())) {
    while (dirent *e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0)
        files.push_back(path + "/" + name);
    }
    ::closedir(dir);
  }
  if (files.empty())
    throw error(path + " is a directory without *.safetensors files");
  std::sort(files.begin(), files.end());
  for (const std::string &f : files)
    addFile(f);
}

void TensorStore::addFile(const std::string &file) {
  std::ifstream in(file, std::ios::binary);
  if (!in)
    throw error("cannot open " + file);
  uint64_t headerSize = 0;
  in.read(reinterpret_cast<char *>(&headerSize), 8);
  in.seekg(0, std::ios::end);
  uint64_t fileSize = static_cast<uint64_t>(in.tellg());
  if (!in || headerSize == 0 || headerSize + 8 > fileSize)
    throw error(file + " is not a safetensors file (bad header size)");
  std::string header(headerSize, '\0');
  in.seekg(8);
  in.read(header.data(), static_cast<std::streamsize>(headerSize));
  llvm::Expected<llvm::json::Value> json = llvm::json::parse(header);
  if (!json) {
    llvm::consumeError(json.takeError());
    throw error(file + " has a corrupt safetensors header");
  }
  const llvm::json::Object *root = json->getAsObject();
  if (!root)
    throw error(file + " has a corrupt safetensors header");
  uint64_t dataStart = 8 + headerSize, dataSize = fileSize - dataStart;
  for (const auto &[key, value] : *root) {
    if (key == "__metadata__")
      continue;
    const llvm::json::Object *entry = value.getAsObject();
    const llvm::json::Array *shape = entry ? entry->getArray("shape") : nullptr;
    const llvm::json::Array *offsets = entry ? entry->getArray("data_offsets") : nullptr;
    std::optional<llvm::StringRef> dtype = entry ? entry->getString("dtype") : std::nullopt;
    if (!shape || !offsets || offsets->size() != 2 || !dtype)
      throw error(file + ": entry " + key.str() + " is malformed");
    StoredTensor t;
    t.file = file;
    t.dtype = dtypeNamed(dtype->str());
    for (const llvm::json::Value &d : *shape) {
      int64_t n = d.getAsInteger().value_or(-1);
      if (n < 0)
        throw error(file + ": entry " + key.str() + " has a negative or non-integer size");
      t.shape.push_back(n);
    }
    uint64_t begin = (*offsets)[0].getAsUINT64().value_or(~0ull);
    uint64_t end = (*offsets)[1].getAsUINT64().value_or(~0ull);
    if (begin > end || end > dataSize ||
        end - begin != static_cast<uint64_t>(t.numel() * dtypeSize(t.dtype)))
      throw error(file + ": entry " + key.str() +
                  " has data offsets that do not match its shape (truncated or corrupt file)");
    t.offset = dataStart + begin;
    if (!entries_.emplace(key.str(), std::move(t)).second)
      throw error(path_ + ": '" + key.str() + "' is stored in two files");
  }
}

const StoredTensor *TensorStore::find(const std::string &name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

const StoredTensor &TensorStore::expect(const std::string &name, const std::string &what,
                                        const std::vector<int64_t> &shape) const {
  const StoredTensor *t = find(name);
  if (!t)
    throw error(path_ + " has no " + what + " '" + name + "'");
  if (t->shape != shape)
    throw error(what + " '" + name + "' in " + path_ + " has another shape than the program's");
  return *t;
}

void TensorStore::read(const StoredTensor &t, void *out) const {
  File(t.file).read(t.offset, static_cast<uint64_t>(t.numel() * dtypeSize(t.dtype)), out);
}

void TensorStore::readBox(const StoredTensor &t, const std::vector<int64_t> &offset,
                          const std::vector<int64_t> &size, void *out) const {
  if (offset.size() != t.shape.size() || size.size() != t.shape.size())
    throw error("readBox: box rank does not match the tensor's");
  int64_t item = dtypeSize(t.dtype);
  char *dst = static_cast<char *>(out);
  File file(t.file);
  forEachBoxRun(t.shape, offset, size, [&](int64_t global, int64_t local, int64_t run) {
    file.read(t.offset + static_cast<uint64_t>(global * item), static_cast<uint64_t>(run * item),
              dst + local * item);
  });
}

void tdx::rt::writeSafetensors(const std::string &path, const std::vector<TensorToWrite> &tensors) {
  llvm::json::Object header;
  uint64_t offset = 0;
  std::vector<uint64_t> bytes;
  for (const TensorToWrite &t : tensors) {
    llvm::json::Array shape;
    int64_t n = 1;
    for (int64_t d : t.shape) {
      shape.push_back(d);
      n *= d;
    }
    uint64_t size = static_cast<uint64_t>(n * dtypeSize(t.dtype));
    header[t.name] = llvm::json::Object{{"dtype", dtypeName(t.dtype)},
                                        {"shape", std::move(shape)},
                                        {"data_offsets", llvm::json::Array{offset, offset + size}}};
    offset += size;
    bytes.push_back(size);
  }
  std::string text;
  llvm::raw_string_ostream os(text);
  os << llvm::json::Value(std::move(header));
  os.flush();
  while (text.size() % 8)
    text += ' ';
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    uint64_t size = text.size();
    out.write(reinterpret_cast<const char *>(&size), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (size_t i = 0; i < tensors.size(); ++i)
      out.write(static_cast<const char *>(tensors[i].data), static_cast<std::streamsize>(bytes[i]));
    if (!out) {
      std::remove(tmp.c_str());
      throw error("cannot write " + path);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw error("cannot write " + path);
}
