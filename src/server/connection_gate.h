#pragma once
// Reading requests off the worker threads. cpp-httplib 0.11 gives each accepted connection a worker
// thread from accept to close, and a worker waits up to its read timeout for every byte of a
// header: a few dozen sockets that send half a header and wait hold every worker, and /health stops
// answering. Here one thread (epoll) holds every connection that is idle or still sending its
// request; a worker gets a connection only once its header and its Content-Length body are in
// memory, and hands it back after the response when the client keeps it alive.
//
// Limits, each applied by the gate thread without a worker:
//   - header: complete within header_timeout_s of the connection's opening (or of the end of its
//     previous response); a connection that sent part of a request then gets 408, an idle one is
//     closed;
//   - body: a Content-Length above max_body gets 413 as soon as the header is read (the body is
//     not waited for); a body must arrive within body_timeout_s of the end of its header (408);
//   - header size: above max_header bytes, 431;
//   - a chunked body (Transfer-Encoding): 411, as a worker would have to read it chunk by chunk;
//   - connections held: at most max_connections; one more closes the oldest connection still
//     waiting for its header.
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <httplib.h>

namespace kvslim::server {

/// A client connection and the bytes read from it that no request has consumed yet.
struct Connection {
  int fd = -1;
  std::string buf;    ///< read, not yet consumed (the request being read, pipelined ones after it)
  size_t pos = 0;     ///< consumed bytes at the front of buf
  int served = 0;     ///< responses written on this connection
  // Gate bookkeeping.
  enum class State { Header, Body, Linger } state = State::Header;
  std::chrono::steady_clock::time_point deadline;
  size_t need = 0;    ///< Body: buf size (from pos) that holds the whole request
  std::list<Connection*>::iterator where;

  size_t pending() const { return buf.size() - pos; }
};

/// httplib::Stream over a Connection: reads its buffered bytes first, then the socket (each read
/// waits at most read_timeout_s); writes wait at most write_timeout_s.
class ConnectionStream : public httplib::Stream {
 public:
  ConnectionStream(Connection& c, double read_timeout_s, double write_timeout_s)
      : c_(c), read_ms_(static_cast<int>(read_timeout_s * 1000)), write_ms_(static_cast<int>(write_timeout_s * 1000)) {}
  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  int socket() const override { return c_.fd; }

 private:
  Connection& c_;
  int read_ms_, write_ms_;
};

/// Gate settings (`kvslim serve` flags --header-timeout, --body-timeout, --max-connections,
/// --max-body).
struct GateOptions {
  double header_timeout_s = 5;
  double body_timeout_s = 30;
  size_t max_header = 32 * 1024;
  size_t max_body = 1 << 20;
  size_t max_connections = 4096;
};

class ConnectionGate {
 public:
  /// Called on the gate thread with a connection whose request is complete in `buf`; must not
  /// block (it queues the connection for a worker).
  using Dispatch = std::function<void(std::unique_ptr<Connection>)>;
  /// Called on the gate thread for each request the gate answers itself: status (400, 408, 411,
  /// 413, 431) and a short reason label ("header_timeout", "body_too_large", ...).
  using Refused = std::function<void(int status, const std::string& reason)>;

  /// Starts the gate thread. Throws kvslim::Error when epoll or eventfd cannot be created.
  ConnectionGate(GateOptions opt, Dispatch dispatch, Refused refused);
  /// Stops the thread and closes every connection it holds.
  ~ConnectionGate();
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  /// Takes a newly accepted socket; thread-safe.
  void add(int fd);
  /// Takes back a connection after its response (keep-alive); thread-safe. Its buffer may
  /// already hold the next request.
  void give_back(std::unique_ptr<Connection> c);
  /// From now on: idle keep-alive connections are closed, given-back ones too; requests already
  /// being sent, and connections accepted but not yet heard from, may complete within their
  /// timeouts. Thread-safe.
  void drain();
  /// Connections holding part of a request (header or body under way, or none yet on a new
  /// connection), counted by the gate thread after drain(); thread-safe. drain_counted() says
  /// whether it has counted yet.
  size_t partial() const { return partial_.load(); }
  bool drain_counted() const { return drain_counted_.load(); }
  /// Connections held by the gate (idle or partial); thread-safe.
  size_t held() const { return held_.load(); }

 private:
  void loop();
  void take(std::unique_ptr<Connection> c);   // gate thread: start watching c
  void advance(Connection* c);                // gate thread: parse what is buffered
  void refuse(Connection* c, int status, const std::string& reason, const std::string& message);
  void drop(Connection* c);
  void watch(Connection* c, Connection::State s, double timeout_s);
  void unlist(Connection* c);
  void count_partial();

  GateOptions opt_;
  Dispatch dispatch_;
  Refused refused_;
  int epfd_ = -1, wake_fd_ = -1;
  std::mutex mu_;
  std::vector<int> new_fds_;                              // under mu_
  std::vector<std::unique_ptr<Connection>> returned_;     // under mu_
  std::atomic<bool> draining_{false}, stop_{false}, drain_counted_{false};
  std::atomic<size_t> partial_{0}, held_{0};
  // Gate thread only.
  std::unordered_map<int, std::unique_ptr<Connection>> conns_;
  std::list<Connection*> header_, body_, linger_;         // each in deadline order
  std::thread thread_;
};

}  // namespace kvslim::server
