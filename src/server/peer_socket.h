#pragma once
// Noticing that a client went away while its non-streaming request is still running. cpp-httplib
// 0.11 (Debian 12) gives a handler neither the connection's socket nor a "closed" query, and
// nothing is written to the client before the response, so the socket is found by the request's
// addresses and watched for the peer's close.
#include <string>

namespace kvslim::server {

/// The file descriptor of this process's TCP socket whose local end is `local_addr`:`local_port`
/// and remote end `remote_addr`:`remote_port` (numeric IPv4/IPv6 text, as httplib reports them),
/// or -1 when there is none. Scans /proc/self/fd: O(open descriptors), for once per request.
int find_connection_fd(const std::string& local_addr, int local_port, const std::string& remote_addr,
                       int remote_port);

/// True when the peer of socket `fd` has closed its end or the connection failed (POLLRDHUP,
/// POLLHUP or POLLERR); never blocks. A client that half-closes after sending its request counts
/// as gone, as it does for nginx's proxy.
bool peer_closed(int fd);

}  // namespace kvslim::server
