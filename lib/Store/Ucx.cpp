//===- Ucx.cpp - request and reply messages over UCX ----------------------===//

#include "tdx/Store/Ucx.h"

#include <ucp/api/ucp.h>
#include <ucs/config/global_opts.h>

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <list>
#include <set>
#include <stdexcept>

using namespace tdx::rt::ucx;

namespace {

std::runtime_error error(const std::string &what) { return std::runtime_error("tdx: " + what); }

void check(ucs_status_t status, const char *what) {
  if (status != UCS_OK)
    throw error(std::string("UCX: ") + what + " failed: " + ucs_status_string(status));
}

} // namespace

struct Worker::Impl {
  Worker *self;
  ucp_context_h context = nullptr;
  ucp_worker_h worker = nullptr;
  ucp_listener_h listener = nullptr;
  /// Readable when the worker has something to progress.
  int eventFd = -1;
  std::set<ucp_ep_h> endpoints, accepted;
  std::map<ucp_ep_h, std::string> failed;

  struct Send {
    Impl *impl;
    ucp_ep_h ep;
    std::string header, data;
    void *request = nullptr;
    bool done = false;
  };
  std::list<Send> sends;

  struct Receive {
    Impl *impl;
    unsigned id;
    Message message;
    /// Freed once done (a request freed earlier reports nothing).
    void *request = nullptr;
    bool done = false;
    ucs_status_t status = UCS_OK;
  };
  std::list<Receive> receives;

  /// The argument of each message id's handler.
  struct Handler {
    Impl *impl;
    unsigned id;
  };
  Handler handlers[2];

  static void onError(void *arg, ucp_ep_h ep, ucs_status_t status) {
    static_cast<Impl *>(arg)->failed[ep] = ucs_status_string(status);
  }

  static void onConnect(ucp_conn_request_h request, void *arg) {
    Impl *impl = static_cast<Impl *>(arg);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    params.conn_request = request;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = onError;
    params.err_handler.arg = impl;
    ucp_ep_h ep;
    if (ucp_ep_create(impl->worker, &params, &ep) == UCS_OK)
      impl->endpoints.insert(ep), impl->accepted.insert(ep);
  }

  static void onSent(void *, ucs_status_t status, void *user) {
    Send *s = static_cast<Send *>(user);
    s->done = true;
    if (status != UCS_OK && !s->impl->failed.count(s->ep))
      s->impl->failed[s->ep] = ucs_status_string(status);
  }

  static void onReceived(void *, ucs_status_t status, size_t, void *user) {
    Receive *r = static_cast<Receive *>(user);
    r->done = true;
    r->status = status;
  }

  static ucs_status_t onMessage(void *arg, const void *header, size_t headerLength, void *data,
                                size_t length, const ucp_am_recv_param_t *param) {
    Handler *h = static_cast<Handler *>(arg);
    Impl *impl = h->impl;
    Message m;
    if (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)
      m.replyTo = param->reply_ep;
    m.header.assign(static_cast<const char *>(header), headerLength);
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
      m.data.assign(static_cast<const char *>(data), length);
      impl->self->inbox(h->id).push_back(std::move(m));
      return UCS_OK;
    }
    // Rendezvous: the payload comes straight into the message's buffer.
    impl->receives.push_back({impl, h->id, std::move(m)});
    Receive &r = impl->receives.back();
    r.message.data.resize(length);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    p.cb.recv_am = onReceived;
    p.user_data = &r;
    ucs_status_ptr_t s =
        ucp_am_recv_data_nbx(impl->worker, data, r.message.data.data(), length, &p);
    if (s == nullptr)
      r.done = true;
    else if (UCS_PTR_IS_ERR(s))
      r.done = true, r.status = UCS_PTR_STATUS(s);
    else
      r.request = s;
    return UCS_OK;
  }

  /// Frees the request of each finished operation of `list`, hands the
  /// operation to `finish` and forgets it; true when any had finished.
  template <class List, class Fn> static bool sweep(List &list, Fn finish) {
    bool any = false;
    for (auto it = list.begin(); it != list.end();) {
      if (!it->done) {
        ++it;
        continue;
      }
      if (it->request)
        ucp_request_free(it->request);
      finish(*it);
      it = list.erase(it), any = true;
    }
    return any;
  }

  /// Hands finished receives to the inbox and forgets finished sends.
  bool collect() {
    bool any = sweep(receives, [&](Receive &r) {
      if (r.status == UCS_OK)
        self->inbox(r.id).push_back(std::move(r.message));
      else if (r.message.replyTo)
        failed[static_cast<ucp_ep_h>(r.message.replyTo)] = ucs_status_string(r.status);
    });
    any |= sweep(sends, [](Send &) {});
    // A client that went away: its endpoint is closed here.
    for (auto it = accepted.begin(); it != accepted.end();) {
      ucp_ep_h ep = *it;
      if (!failed.count(ep) || sendingOn(ep)) {
        ++it;
        continue;
      }
      it = accepted.erase(it);
      closeEp(ep);
      failed.erase(ep);
    }
    return any;
  }

  size_t sendingOn(ucp_ep_h ep) const {
    size_t n = 0;
    for (const Send &s : sends)
      n += s.ep == ep && !s.done;
    return n;
  }

  void closeEp(ucp_ep_h ep) {
    endpoints.erase(ep);
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t s = ucp_ep_close_nbx(ep, &p);
    if (s == nullptr || UCS_PTR_IS_ERR(s))
      return;
    auto until = Clock::now() + std::chrono::seconds(1);
    while (ucp_request_check_status(s) == UCS_INPROGRESS && Clock::now() < until)
      ucp_worker_progress(worker);
    ucp_request_free(s);
  }
};

Worker::Worker() : impl_(std::make_unique<Impl>()) {
  Impl &w = *impl_;
  w.self = this;
  // UCX's own log says on stderr what tdx's errors say with more context
  // (a refused connection, a busy port); UCX_LOG_LEVEL still wins.
  if (!std::getenv("UCX_LOG_LEVEL"))
    ucs_global_opts_set_value("LOG_LEVEL", "fatal");
  ucp_config_t *config;
  check(ucp_config_read(nullptr, nullptr, &config), "reading the configuration");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
  ucs_status_t status = ucp_init(&params, config, &w.context);
  ucp_config_release(config);
  check(status, "init");
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SINGLE;
  check(ucp_worker_create(w.context, &wp, &w.worker), "creating a worker");
  check(ucp_worker_get_efd(w.worker, &w.eventFd), "getting the worker's event descriptor");
  for (unsigned id : {kRequest, kReply}) {
    w.handlers[id - 1] = {&w, id};
    ucp_am_handler_param_t hp{};
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    hp.id = id;
    hp.cb = Impl::onMessage;
    hp.arg = &w.handlers[id - 1];
    hp.flags = UCP_AM_FLAG_WHOLE_MSG;
    check(ucp_worker_set_am_recv_handler(w.worker, &hp), "setting a message handler");
  }
}

Worker::~Worker() {
  Impl &w = *impl_;
  for (ucp_ep_h ep : std::set<ucp_ep_h>(w.endpoints))
    w.closeEp(ep);
  // Receives and sends still in flight die with the worker.
  for (Impl::Send &s : w.sends)
    if (s.request && !s.done)
      ucp_request_cancel(w.worker, s.request);
  while (!w.sends.empty() && w.collect())
    ucp_worker_progress(w.worker);
  if (w.listener)
    ucp_listener_destroy(w.listener);
  ucp_worker_destroy(w.worker);
  ucp_cleanup(w.context);
}

uint16_t Worker::listen(uint16_t port, const std::string &host) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = INADDR_ANY;
  if (!host.empty()) {
    addrinfo hints{}, *found = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
    if (rc != 0 || !found)
      throw error("cannot listen on '" + host + "': " + gai_strerror(rc) +
                  " (give an IPv4 address or a name of this host)");
    address.sin_addr = reinterpret_cast<sockaddr_in *>(found->ai_addr)->sin_addr;
    ::freeaddrinfo(found);
  }
  address.sin_port = htons(port);
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr *>(&address);
  params.sockaddr.addrlen = sizeof address;
  params.conn_handler.cb = Impl::onConnect;
  params.conn_handler.arg = impl_.get();
  ucs_status_t status = ucp_listener_create(impl_->worker, &params, &impl_->listener);
  if (status != UCS_OK)
    throw error("cannot listen on " + (host.empty() ? "" : host + " ") + "port " +
                std::to_string(port) + ": " +
                ucs_status_string(status) +
                (status == UCS_ERR_BUSY ? " (another process has it: pick another --port)" : ""));
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  check(ucp_listener_query(impl_->listener, &attr), "querying the listener");
  return ntohs(reinterpret_cast<const sockaddr_in &>(attr.sockaddr).sin_port);
}

void *Worker::connect(const std::string &host, uint16_t port) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0 || !found)
    throw error("cannot resolve host '" + host + "': " + gai_strerror(rc));
  sockaddr_in address;
  std::memcpy(&address, found->ai_addr, sizeof address);
  ::freeaddrinfo(found);
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr *>(&address);
  params.sockaddr.addrlen = sizeof address;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = Impl::onError;
  params.err_handler.arg = impl_.get();
  ucp_ep_h ep;
  ucs_status_t status = ucp_ep_create(impl_->worker, &params, &ep);
  if (status != UCS_OK)
    throw error("cannot connect to " + host + ":" + std::to_string(port) + ": " +
                ucs_status_string(status));
  impl_->endpoints.insert(ep);
  return ep;
}

void Worker::close(void *ep) {
  ucp_ep_h e = static_cast<ucp_ep_h>(ep);
  for (Impl::Send &s : impl_->sends)
    if (s.ep == e && s.request && !s.done)
      ucp_request_cancel(impl_->worker, s.request);
  impl_->closeEp(e);
  impl_->collect();
  impl_->failed.erase(e);
}

std::string Worker::failure(void *ep) const {
  auto it = impl_->failed.find(static_cast<ucp_ep_h>(ep));
  return it == impl_->failed.end() ? "" : it->second;
}

void Worker::send(void *ep, unsigned id, std::string header, std::string data) {
  Impl &w = *impl_;
  // A peer that went away meanwhile (its endpoint closed): nothing to send.
  if (!w.endpoints.count(static_cast<ucp_ep_h>(ep)))
    return;
  w.sends.push_back({&w, static_cast<ucp_ep_h>(ep), std::move(header), std::move(data)});
  Impl::Send &s = w.sends.back();
  ucp_request_param_t p{};
  p.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  p.cb.send = Impl::onSent;
  p.user_data = &s;
  p.flags = id == kRequest ? UCP_AM_SEND_FLAG_REPLY : 0;
  ucs_status_ptr_t r = ucp_am_send_nbx(s.ep, id, s.header.data(), s.header.size(), s.data.data(),
                                       s.data.size(), &p);
  if (r == nullptr) {
    s.done = true;
  } else if (UCS_PTR_IS_ERR(r)) {
    s.done = true;
    w.failed[s.ep] = ucs_status_string(UCS_PTR_STATUS(r));
  } else {
    s.request = r;
  }
  w.collect();
}

bool Worker::progress() {
  bool any = ucp_worker_progress(impl_->worker) != 0;
  return impl_->collect() || any;
}

void Worker::wait(Clock::time_point deadline) {
  if (progress())
    return;
  // Sleeps until the network has something (or 100 ms): an idle volume or
  // a waiting client takes no core from the ranks beside it.
  if (ucp_worker_arm(impl_->worker) != UCS_OK)
    return;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  pollfd fd{impl_->eventFd, POLLIN, 0};
  ::poll(&fd, 1, static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(100, left.count()))));
}

bool Worker::waitUntil(const std::function<bool()> &done, Clock::time_point deadline) {
  while (!done()) {
    if (Clock::now() >= deadline)
      return false;
    wait(deadline);
  }
  return true;
}
