// The server's disconnect check for non-streaming requests, on real loopback TCP connections.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "server/peer_socket.h"

using namespace kvslim::server;

namespace {

int port_of(int fd) {
  sockaddr_in a{};
  socklen_t n = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  return ntohs(a.sin_port);
}

}  // namespace

TEST(PeerSocket, FindsTheConnectionAndSeesTheClientGo) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  a.sin_port = htons(static_cast<uint16_t>(port_of(listener)));

  int clients[2], accepted[2];
  for (int i = 0; i < 2; ++i) {
    clients[i] = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_EQ(connect(clients[i], reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    accepted[i] = accept(listener, nullptr, nullptr);
    ASSERT_GE(accepted[i], 0);
  }
  // Each connection is told apart by the client's port.
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(find_connection_fd("127.0.0.1", port_of(listener), "127.0.0.1", port_of(clients[i])), accepted[i]);
  EXPECT_EQ(find_connection_fd("127.0.0.1", port_of(listener), "127.0.0.1", 1), -1);
  EXPECT_EQ(find_connection_fd("127.0.0.1", port_of(listener), "::ffff:127.0.0.1", port_of(clients[0])), accepted[0]);

  // A client that sent a request and waits is not gone; data waiting to be read is not a close.
  EXPECT_FALSE(peer_closed(accepted[0]));
  ASSERT_EQ(write(clients[0], "GET", 3), 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(peer_closed(accepted[0]));

  close(clients[0]);
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = peer_closed(accepted[0]);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(gone);
  EXPECT_FALSE(peer_closed(accepted[1]));  // the other connection is untouched
  EXPECT_FALSE(peer_closed(-1));

  close(clients[1]);
  close(accepted[0]);
  close(accepted[1]);
  close(listener);
}
