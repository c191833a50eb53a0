//===- Ucx.h - request and reply messages over UCX ----------------*- C++ -*-===//
//
// The networked tensor store's transport (tdx/Store/Volumes.h): UCX's UCP
// active messages between a client and a volume, over whatever transports
// UCX finds (TCP here, shared memory within a host, RDMA where hardware has
// it). A message is a header (JSON text) and a payload (bytes); large
// payloads go by UCX's rendezvous protocol, straight into the receiver's
// buffer. One worker, driven by one thread: the caller progresses it.
//
// Endpoints report failures (a peer gone, a connection refused or reset)
// instead of blocking: every wait has a deadline, and a failed endpoint's
// status names what happened.
//
//===----------------------------------------------------------------------===//

#ifndef TDX_STORE_UCX_H
#define TDX_STORE_UCX_H

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace tdx::rt::ucx {

/// Active message ids: a request, and the reply to one.
enum : unsigned { kRequest = 1, kReply = 2 };

/// A message received, whole.
struct Message {
  /// Where a reply goes (the endpoint it came in on).
  void *replyTo = nullptr;
  std::string header;
  std::string data;
};

using Clock = std::chrono::steady_clock;

class Worker {
public:
  Worker();
  ~Worker();
  Worker(const Worker &) = delete;
  Worker &operator=(const Worker &) = delete;

  /// Accepts connections on `port` of `host` (an IPv4 address or a name
  /// of this host; empty: every address of this host); 0 picks a free
  /// port. Returns the port.
  uint16_t listen(uint16_t port, const std::string &host = "");

  /// An endpoint to `host`:`port` (connected in the background: a failure
  /// shows in failure()).
  void *connect(const std::string &host, uint16_t port);
  /// Closes `ep` without waiting for its peer.
  void close(void *ep);
  /// Empty while `ep` works; what went wrong once it failed.
  std::string failure(void *ep) const;

  /// Sends a message; the worker keeps the bytes until it is delivered.
  /// Requests ask for a reply endpoint on the receiver.
  void send(void *ep, unsigned id, std::string header, std::string data);

  /// Progresses the worker once; true when anything happened.
  bool progress();
  /// Progresses once, or sleeps until there is something to progress
  /// (at most 100 ms, never past `deadline`).
  void wait(Clock::time_point deadline);
  /// Progresses until `done()` or `deadline`; false at the deadline.
  bool waitUntil(const std::function<bool()> &done, Clock::time_point deadline);

  /// Messages received with id `id`, oldest first.
  std::deque<Message> &inbox(unsigned id) { return inbox_[id]; }

  struct Impl;

private:
  std::unique_ptr<Impl> impl_;
  std::map<unsigned, std::deque<Message>> inbox_;
};

} // namespace tdx::rt::ucx

#endif // TDX_STORE_UCX_H
