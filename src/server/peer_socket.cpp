#include "server/peer_socket.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>

namespace kvslim::server {

namespace {

// Numeric text and port of a socket address (IPv4-mapped IPv6 addresses as plain IPv4, as httplib
// writes them).
bool address_of(const sockaddr_storage& ss, std::string& addr, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(ss);
    if (!inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf)) return false;
    port = ntohs(a.sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(ss);
    if (!inet_ntop(AF_INET6, &a.sin6_addr, buf, sizeof buf)) return false;
    port = ntohs(a.sin6_port);
  } else {
    return false;
  }
  addr = buf;
  if (addr.rfind("::ffff:", 0) == 0 && addr.find('.') != std::string::npos) addr = addr.substr(7);
  return true;
}

bool same_host(const std::string& a, const std::string& b) {
  auto plain = [](const std::string& s) {
    return s.rfind("::ffff:", 0) == 0 && s.find('.') != std::string::npos ? s.substr(7) : s;
  };
  return plain(a) == plain(b);
}

}  // namespace

int find_connection_fd(const std::string& local_addr, int local_port, const std::string& remote_addr,
                       int remote_port) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    sockaddr_storage peer {}, self {};
    socklen_t lp = sizeof peer, ls = sizeof self;
    // getsockname fails at once (ENOTSOCK) for descriptors that are not sockets.
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&self), &ls) != 0) continue;
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &lp) != 0) continue;
    std::string pa, sa;
    int pp = -1, sp = -1;
    if (!address_of(peer, pa, pp) || !address_of(self, sa, sp)) continue;
    if (pp == remote_port && sp == local_port && same_host(pa, remote_addr) &&
        (local_addr.empty() || same_host(sa, local_addr))) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

bool peer_closed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace kvslim::server
