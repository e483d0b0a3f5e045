#include "server/connection_gate.h"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "kvslim/error.h"
#include "server/api.h"

namespace kvslim::server {

using Clock = std::chrono::steady_clock;

namespace {

int poll_one(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  for (;;) {
    int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR) continue;
    return r > 0 ? p.revents : r;
  }
}

void address(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if ((peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) : getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len)) != 0)
    return;
  if (ss.ss_family == AF_INET)
    port = ntohs(reinterpret_cast<sockaddr_in&>(ss).sin_port);
  else if (ss.ss_family == AF_INET6)
    port = ntohs(reinterpret_cast<sockaddr_in6&>(ss).sin6_port);
  char host[NI_MAXHOST] = {};
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST) == 0) ip = host;
}

bool iequals(const std::string& a, const char* b) {
  const size_t n = std::strlen(b);
  if (a.size() != n) return false;
  for (size_t i = 0; i < n; ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != b[i]) return false;
  return true;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

const char* reason_phrase(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 431: return "Request Header Fields Too Large";
    default: return "Error";
  }
}

}  // namespace

bool ConnectionStream::is_readable() const { return c_.pending() > 0 || poll_one(c_.fd, POLLIN, read_ms_) > 0; }

bool ConnectionStream::is_writable() const {
  if (poll_one(c_.fd, POLLOUT, write_ms_) <= 0) return false;
  // A peer that closed its end reads as end of file: the response (or stream) is for nobody.
  if (poll_one(c_.fd, POLLIN, 0) > 0) {
    char b;
    if (::recv(c_.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0) return false;
  }
  return true;
}

ssize_t ConnectionStream::read(char* ptr, size_t size) {
  if (c_.pending() == 0) {
    c_.buf.clear();
    c_.pos = 0;
    if (poll_one(c_.fd, POLLIN, read_ms_) <= 0) return -1;
    char tmp[16384];
    ssize_t n;
    do n = ::recv(c_.fd, tmp, sizeof tmp, 0);
    while (n < 0 && errno == EINTR);
    if (n <= 0) return n;
    c_.buf.assign(tmp, static_cast<size_t>(n));
  }
  const size_t n = std::min(size, c_.pending());
  std::memcpy(ptr, c_.buf.data() + c_.pos, n);
  c_.pos += n;
  return static_cast<ssize_t>(n);
}

ssize_t ConnectionStream::write(const char* ptr, size_t size) {
  if (poll_one(c_.fd, POLLOUT, write_ms_) <= 0) return -1;
  ssize_t n;
  do n = ::send(c_.fd, ptr, size, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n;
}

void ConnectionStream::get_remote_ip_and_port(std::string& ip, int& port) const { address(c_.fd, true, ip, port); }
void ConnectionStream::get_local_ip_and_port(std::string& ip, int& port) const { address(c_.fd, false, ip, port); }

ConnectionGate::ConnectionGate(GateOptions opt, Dispatch dispatch, Refused refused)
    : opt_(opt), dispatch_(std::move(dispatch)), refused_(std::move(refused)) {
  epfd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epfd_ < 0 || wake_fd_ < 0) throw Error(fmt::format("cannot start the connection gate: {}", std::strerror(errno)));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  epoll_ctl(epfd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] { loop(); });
}

ConnectionGate::~ConnectionGate() {
  stop_ = true;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  for (auto& [fd, c] : conns_) ::close(fd);
  for (int fd : new_fds_) ::close(fd);
  for (auto& c : returned_) ::close(c->fd);
  ::close(epfd_);
  ::close(wake_fd_);
}

void ConnectionGate::add(int fd) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    new_fds_.push_back(fd);
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake_fd_, &one, sizeof one);
}

void ConnectionGate::give_back(std::unique_ptr<Connection> c) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    returned_.push_back(std::move(c));
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake_fd_, &one, sizeof one);
}

void ConnectionGate::drain() {
  draining_ = true;
  uint64_t one = 1;
  [[maybe_unused]] ssize_t w = ::write(wake_fd_, &one, sizeof one);
}

void ConnectionGate::unlist(Connection* c) {
  auto& l = c->state == Connection::State::Header ? header_ : c->state == Connection::State::Body ? body_ : linger_;
  l.erase(c->where);
}

void ConnectionGate::watch(Connection* c, Connection::State s, double timeout_s) {
  unlist(c);
  c->state = s;
  c->deadline = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6));
  auto& l = s == Connection::State::Header ? header_ : s == Connection::State::Body ? body_ : linger_;
  c->where = l.insert(l.end(), c);
}

void ConnectionGate::drop(Connection* c) {
  unlist(c);
  epoll_ctl(epfd_, EPOLL_CTL_DEL, c->fd, nullptr);
  ::close(c->fd);
  conns_.erase(c->fd);
}

void ConnectionGate::take(std::unique_ptr<Connection> c) {
  if (draining_ && c->pending() == 0 && c->served > 0) {
    ::close(c->fd);
    return;
  }
  if (conns_.size() >= opt_.max_connections) {
    // Full: the oldest connection still waiting for a header makes room (a slow or idle client
    // loses its place rather than every new client being turned away).
    if (header_.empty()) {
      ::close(c->fd);
      return;
    }
    drop(header_.front());
  }
  Connection* p = c.get();
  const int fd = c->fd;
  conns_[fd] = std::move(c);
  p->state = Connection::State::Header;
  p->where = header_.insert(header_.end(), p);
  p->deadline = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(opt_.header_timeout_s * 1e6));
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = fd;
  if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    drop(p);
    return;
  }
  if (p->pending() > 0) advance(p);  // a pipelined request may already be whole
}

void ConnectionGate::refuse(Connection* c, int status, const std::string& reason, const std::string& message) {
  const std::string body = dump(error_json(ApiError(status, message, "", "invalid_request_error", reason)));
  const std::string out = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}", status,
      reason_phrase(status), body.size(), body);
  [[maybe_unused]] ssize_t n = ::send(c->fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (refused_) refused_(status, reason);
  // Closing with unread bytes would reset the connection and could destroy the response before
  // the client reads it: the write side is shut, and what the client still sends is read and
  // dropped for a moment.
  ::shutdown(c->fd, SHUT_WR);
  c->buf.clear();
  c->pos = 0;
  watch(c, Connection::State::Linger, 2.0);
}

void ConnectionGate::advance(Connection* c) {
  using State = Connection::State;
  if (c->state == State::Linger) {
    c->buf.clear();
    c->pos = 0;
    return;
  }
  if (c->state == State::Header) {
    // Empty lines before a request line are allowed (RFC 9112 2.2).
    while (c->pending() >= 2 && c->buf.compare(c->pos, 2, "\r\n") == 0) c->pos += 2;
    const size_t end = c->buf.find("\r\n\r\n", c->pos);
    if (end == std::string::npos || end + 4 - c->pos > opt_.max_header) {
      if (c->pending() > opt_.max_header)
        refuse(c, 431, "header_too_large",
               fmt::format("the request header is larger than the server's limit of {} bytes", opt_.max_header));
      return;
    }
    const size_t head = end + 4 - c->pos;
    bool chunked = false, expect_continue = false, has_length = false;
    uint64_t length = 0;
    size_t expect_at = std::string::npos, expect_len = 0;
    size_t line = c->buf.find("\r\n", c->pos) + 2;  // past the request line
    while (line < end + 2) {
      const size_t eol = c->buf.find("\r\n", line);
      const size_t colon = c->buf.find(':', line);
      if (colon != std::string::npos && colon < eol) {
        const std::string name = trim(c->buf.substr(line, colon - line));
        const std::string value = trim(c->buf.substr(colon + 1, eol - colon - 1));
        if (iequals(name, "content-length")) {
          const bool digits = !value.empty() && value.size() <= 19 &&
                              std::all_of(value.begin(), value.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
          const uint64_t v = digits ? std::stoull(value) : 0;
          if (!digits || (has_length && v != length)) {
            refuse(c, 400, "content_length",
                   fmt::format("the request's Content-Length '{}' is not one number of bytes", printable(value, 40)));
            return;
          }
          has_length = true;
          length = v;
        } else if (iequals(name, "transfer-encoding")) {
          chunked = !iequals(value, "identity");
        } else if (iequals(name, "expect")) {
          expect_continue = true;
          expect_at = line;
          expect_len = eol + 2 - line;
        }
      }
      line = eol + 2;
    }
    if (chunked) {
      // A chunked body would be read by a worker, a chunk at a time: a slow one would hold it.
      refuse(c, 411, "length_required",
             "the request body must come with a Content-Length (chunked request bodies are not accepted)");
      return;
    }
    if (has_length && length > opt_.max_body) {
      refuse(c, 413, "body_too_large",
             fmt::format("the request body ({} bytes, from its Content-Length) is larger than the server's limit of "
                         "{} bytes (--max-body)",
                         length, opt_.max_body));
      return;
    }
    if (!has_length || length == 0) {
      c->need = head;
    } else {
      c->need = head + static_cast<size_t>(length);
      if (c->pending() < c->need) {
        if (expect_continue) {
          // The client waits for this before it sends the body; httplib must not send it again.
          static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
          [[maybe_unused]] ssize_t n = ::send(c->fd, cont, sizeof cont - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
          c->buf.erase(expect_at, expect_len);
          c->need -= expect_len;
        }
        watch(c, State::Body, opt_.body_timeout_s);
        return;
      }
    }
  }
  if (c->pending() < c->need) return;
  // Whole: to a worker.
  unlist(c);
  epoll_ctl(epfd_, EPOLL_CTL_DEL, c->fd, nullptr);
  auto it = conns_.find(c->fd);
  std::unique_ptr<Connection> owned = std::move(it->second);
  conns_.erase(it);
  owned->buf.erase(0, owned->pos);
  owned->pos = 0;
  owned->state = State::Header;
  dispatch_(std::move(owned));
}

void ConnectionGate::count_partial() {
  size_t n = body_.size();
  for (Connection* c : header_) n += c->pending() > 0 || c->served == 0 ? 1 : 0;
  partial_ = n;
}

void ConnectionGate::loop() {
  std::vector<epoll_event> events(256);
  while (!stop_) {
    // The earliest deadline bounds the wait.
    auto next = Clock::now() + std::chrono::seconds(1);
    for (auto* l : {&header_, &body_, &linger_})
      if (!l->empty()) next = std::min(next, l->front()->deadline);
    const auto wait_ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count() + 1;
    const int n = epoll_wait(epfd_, events.data(), static_cast<int>(events.size()),
                             static_cast<int>(std::clamp<int64_t>(wait_ms, 0, 1000)));
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_, &v, sizeof v);
        continue;
      }
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      Connection* c = it->second.get();
      bool closed = false;
      char tmp[65536];
      for (int reads = 0; reads < 4; ++reads) {
        const ssize_t got = ::recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
        if (got > 0) {
          if (c->state != Connection::State::Linger) c->buf.append(tmp, static_cast<size_t>(got));
          if (static_cast<size_t>(got) < sizeof tmp) break;
        } else if (got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          closed = true;
          break;
        } else {
          break;
        }
      }
      advance(c);
      // A client that closed its end before its request was whole is gone (one that half-closed
      // after a whole request had it dispatched just above).
      if (closed && conns_.count(fd)) drop(c);
    }
    // New and returned connections.
    std::vector<int> fds;
    std::vector<std::unique_ptr<Connection>> back;
    {
      std::lock_guard<std::mutex> lk(mu_);
      fds.swap(new_fds_);
      back.swap(returned_);
    }
    for (int fd : fds) {
      auto c = std::make_unique<Connection>();
      c->fd = fd;
      take(std::move(c));
    }
    for (auto& c : back) take(std::move(c));
    // Deadlines.
    const auto now = Clock::now();
    while (!header_.empty() && header_.front()->deadline <= now) {
      Connection* c = header_.front();
      if (c->pending() > 0)
        refuse(c, 408, "header_timeout",
               fmt::format("the request header did not arrive within {} s (--header-timeout)", opt_.header_timeout_s));
      else
        drop(c);  // idle: closed without a word, as after a keep-alive timeout
    }
    while (!body_.empty() && body_.front()->deadline <= now)
      refuse(body_.front(), 408, "body_timeout",
             fmt::format("the request body did not arrive within {} s of its header (--body-timeout)",
                         opt_.body_timeout_s));
    while (!linger_.empty() && linger_.front()->deadline <= now) drop(linger_.front());
    if (draining_) {
      std::vector<Connection*> idle;
      // Idle keep-alive connections close; one accepted before the listener closed but not yet
      // heard from keeps its header timeout, as its client has a request on the way.
      for (Connection* c : header_)
        if (c->pending() == 0 && c->served > 0) idle.push_back(c);
      for (Connection* c : idle) drop(c);
      count_partial();
      drain_counted_ = true;
    }
    held_ = conns_.size();
  }
}

}  // namespace kvslim::server
