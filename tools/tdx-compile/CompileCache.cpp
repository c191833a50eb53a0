//===- CompileCache.cpp - model binaries by the content they come from ----===//

#include "CompileCache.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <chrono>
#include <unistd.h>

using namespace llvm;
using namespace tdx;

std::string CompileCache::defaultDir() {
  if (std::optional<std::string> dir = sys::Process::GetEnv("TDX_CACHE_DIR"))
    return *dir;
  SmallString<256> path;
  if (std::optional<std::string> xdg = sys::Process::GetEnv("XDG_CACHE_HOME"); xdg && !xdg->empty())
    path = *xdg;
  else if (std::optional<std::string> home = sys::Process::GetEnv("HOME"); home && !home->empty())
    sys::path::append(path, *home, ".cache");
  else
    return "";
  sys::path::append(path, "tdx", "compile");
  return std::string(path);
}

std::string CompileCache::key(StringRef source, ArrayRef<std::string> command) const {
  SHA256 hash;
  auto add = [&](StringRef s) {
    hash.update(s);
    hash.update(StringRef("\0", 1));
  };
  add(source);
  // The compiler behind a wrapper (mpicxx runs g++) by what it says it is.
  if (!command.empty()) {
    if (auto it = compilerVersions.find(command.front()); it == compilerVersions.end()) {
      SmallString<128> out;
      sys::fs::createTemporaryFile("tdx-compiler-version", "txt", out);
      std::optional<StringRef> redirects[] = {std::nullopt, StringRef(out), StringRef(out)};
      StringRef args[] = {command.front(), "--version"};
      sys::ExecuteAndWait(command.front(), args, std::nullopt, redirects);
      auto text = MemoryBuffer::getFile(out);
      compilerVersions[command.front()] = text ? (*text)->getBuffer().str() : "";
      sys::fs::remove(out);
    }
    add(compilerVersions[command.front()]);
  }
  // Libraries named by -lNAME, found in the -L folders and the system's.
  SmallVector<std::string> libraryDirs = {"/usr/lib/x86_64-linux-gnu", "/usr/lib"};
  for (const std::string &arg : command)
    if (StringRef(arg).starts_with("-L"))
      libraryDirs.insert(libraryDirs.begin(), arg.substr(2));
  SmallVector<std::string> files;
  for (const std::string &arg : command) {
    if (!StringRef(arg).starts_with("-l"))
      continue;
    for (const std::string &d : libraryDirs) {
      std::string lib = d + "/lib" + arg.substr(2) + ".so";
      if (sys::fs::exists(lib)) {
        files.push_back(lib);
        break;
      }
    }
  }
  for (const std::string &lib : files) {
    sys::fs::file_status status;
    if (!sys::fs::status(lib, status))
      add(lib + ":" + std::to_string(status.getSize()) + ":" +
          std::to_string(status.getLastModificationTime().time_since_epoch().count()));
  }
  for (const std::string &arg : command) {
    add(arg);
    // A file the command reads by name (the compiler, a library, the
    // precompiled header) enters by its size and modification time.
    SmallVector<std::string, 2> files = {arg};
    if (StringRef(arg).ends_with(".h"))
      files.push_back(arg + ".gch");
    // GCC's precompiled header may be a folder of variants (one per
    // option set and CPU capability: O0-avx512.gch, O2-avx512.gch, ...):
    // each of the command's capability enters (another capability's,
    // precompiled later, leaves this one's objects cached). A runtime
    // header change rebuilds them, so an object compiled against the old
    // headers (Program.h's layout, say) is never linked with the new
    // runtime.
    std::error_code ec;
    if (sys::fs::is_directory(arg + ".gch")) {
      std::string capability = "default";
      for (StringRef a : command)
        if (a.consume_front("-DCPU_CAPABILITY="))
          capability = a.lower();
      SmallVector<std::string> variants;
      for (sys::fs::directory_iterator it(arg + ".gch", ec), end; !ec && it != end;
           it.increment(ec))
        if (StringRef(it->path()).ends_with("-" + capability + ".gch"))
          variants.push_back(it->path());
      llvm::sort(variants);
      files.append(variants.begin(), variants.end());
    }
    for (const std::string &file : files) {
      sys::fs::file_status status;
      if (sys::fs::status(file, status) || !sys::fs::is_regular_file(status))
        continue;
      add(std::to_string(status.getSize()) + ":" +
          std::to_string(status.getLastModificationTime().time_since_epoch().count()));
    }
  }
  return toHex(hash.final(), /*LowerCase=*/true);
}

std::string CompileCache::entry(StringRef key) const {
  SmallString<256> path(dir);
  sys::path::append(path, key);
  return std::string(path);
}

bool CompileCache::fetch(StringRef key, StringRef output) const {
  if (!enabled())
    return false;
  std::string cached = entry(key);
  if (!sys::fs::exists(cached))
    return false;
  // Written beside the output and renamed: an interrupted copy leaves no
  // half binary at `output`.
  std::string partial = (output + ".partial").str();
  if (sys::fs::copy_file(cached, partial) ||
      sys::fs::setPermissions(partial, sys::fs::all_read | sys::fs::all_exe |
                                           sys::fs::owner_write) ||
      sys::fs::rename(partial, output)) {
    sys::fs::remove(partial);
    return false;
  }
  // The newest entries are kept: a hit counts as new.
  if (int fd; !sys::fs::openFileForWrite(cached, fd, sys::fs::CD_OpenExisting,
                                         sys::fs::OF_Append)) {
    (void)sys::fs::setLastAccessAndModificationTime(fd, sys::TimePoint<>(
                                                            std::chrono::system_clock::now()));
    ::close(fd);
  }
  return true;
}

CompileCache::Lock::Lock(const CompileCache &cache, StringRef key) {
  if (!cache.enabled() || sys::fs::create_directories(cache.dir))
    return;
  path = cache.entry(key) + ".lock";
  if (sys::fs::openFileForWrite(path, fd, sys::fs::CD_OpenAlways)) {
    fd = -1;
    return;
  }
  if (sys::fs::lockFile(fd)) {
    ::close(fd);
    fd = -1;
  }
}

CompileCache::Lock::~Lock() {
  if (fd < 0)
    return;
  // Removed before it is released: a process waiting on it re-checks the
  // cache once it has it, and one arriving later opens a new file.
  sys::fs::remove(path);
  (void)sys::fs::unlockFile(fd);
  ::close(fd);
}

void CompileCache::store(StringRef key, StringRef output) const {
  if (!enabled())
    return;
  std::string cached = entry(key);
  std::string partial = cached + "." + std::to_string(::getpid()) + ".partial";
  std::error_code ec = sys::fs::create_directories(dir);
  if (!ec)
    ec = sys::fs::copy_file(output, partial);
  if (!ec)
    ec = sys::fs::rename(partial, cached);
  if (ec) {
    sys::fs::remove(partial);
    errs() << "tdx-compile: warning: cannot keep the binary in the cache " << dir << ": "
           << ec.message() << " (set TDX_CACHE_DIR to another directory, or to nothing to "
           << "compile without a cache)\n";
    return;
  }
  trim();
}

/// An entry's name: a key, 64 lowercase hex digits. Nothing else in the
/// directory is the cache's to remove.
static bool isEntry(StringRef name) {
  return name.size() == 64 && llvm::all_of(name, [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

void CompileCache::trim() const {
  std::vector<std::pair<sys::TimePoint<>, std::string>> entries;
  std::error_code ec;
  auto now = std::chrono::system_clock::now();
  for (sys::fs::directory_iterator it(dir, ec), end; it != end && !ec; it.increment(ec)) {
    ErrorOr<sys::fs::basic_file_status> status = it->status();
    if (!status || !sys::fs::is_regular_file(*status))
      continue;
    StringRef name = sys::path::filename(it->path());
    // What a killed compile left half written, an hour later.
    if (name.ends_with(".partial") && isEntry(name.take_front(64)) &&
        now - status->getLastModificationTime() > std::chrono::hours(1)) {
      sys::fs::remove(it->path());
      continue;
    }
    if (isEntry(name))
      entries.push_back({status->getLastModificationTime(), it->path()});
  }
  if (static_cast<int>(entries.size()) <= kMaxEntries)
    return;
  std::sort(entries.begin(), entries.end());
  for (size_t i = 0; i + kMaxEntries < entries.size(); ++i)
    sys::fs::remove(entries[i].second);
}
