//===- CompileCache.h - model binaries by the content they come from -*- C++ -*-===//
//
// tdx-compile's cache: a compiled object (a CPU program's, which links into
// its binary or its shared object) or a CUDA binary is kept under the SHA-256 of the
// emitted source, the compile command, what the compiler says its version
// is, and the size and modification time of every file the command names or
// links by -l (the compiler, the runtime libraries, libtorch, the
// precompiled header), so a program compiled again with the same tdx is
// copied instead of compiled. Entries are written under a temporary name
// and renamed, so concurrent compiles never see half a binary; the newest
// kMaxEntries are kept, and only files named by a key (64 hex digits) are
// ever removed from the directory. A compile of a key holds `<key>.lock`
// while it runs, so processes compiling one program at once compile it once.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_TOOLS_COMPILECACHE_H
#define TDX_TOOLS_COMPILECACHE_H

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/StringRef.h"

#include <map>
#include <string>

namespace tdx {

class CompileCache {
public:
  static constexpr int kMaxEntries = 256;

  /// The cache in `dir`; an empty `dir` disables it.
  explicit CompileCache(std::string dir) : dir(std::move(dir)) {}
  /// TDX_CACHE_DIR where it is set (empty: no cache), else
  /// $XDG_CACHE_HOME/tdx/compile, else $HOME/.cache/tdx/compile.
  static std::string defaultDir();

  bool enabled() const { return !dir.empty(); }
  /// The key of compiling `source` (the emitted text) with `command`.
  std::string key(llvm::StringRef source, llvm::ArrayRef<std::string> command) const;
  /// Copies the binary cached under `key` to `output`; false when there is
  /// none (or it cannot be copied).
  bool fetch(llvm::StringRef key, llvm::StringRef output) const;
  /// Keeps `output` as the binary of `key`; a cache that cannot be written
  /// is skipped with a warning (the compile itself succeeded).
  void store(llvm::StringRef key, llvm::StringRef output) const;

  /// Held while this process compiles `key`: another tdx-compile of the
  /// same program (N SPMD processes compiling at once) waits for it, then
  /// finds the binary in the cache instead of compiling it again. Released
  /// (and its file removed) when destroyed; a cache whose directory cannot
  /// be written locks nothing.
  class Lock {
  public:
    Lock(const CompileCache &cache, llvm::StringRef key);
    ~Lock();
    Lock(const Lock &) = delete;
    Lock &operator=(const Lock &) = delete;

  private:
    std::string path;
    int fd = -1;
  };

private:
  std::string entry(llvm::StringRef key) const;
  void trim() const;
  std::string dir;
  /// `<compiler> --version` by compiler, asked once.
  mutable std::map<std::string, std::string> compilerVersions;
};

} // namespace tdx

#endif // TDX_TOOLS_COMPILECACHE_H
