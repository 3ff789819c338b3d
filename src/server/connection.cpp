#include "server/connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <string>

namespace mxq::server {
namespace {

// The printable address and the port of a socket address, as cpp-httplib writes them into a Request.
bool address_of(const sockaddr_storage& a, std::string& host, int& port) {
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &v4.sin_addr, buf, sizeof(buf));
    port = ntohs(v4.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &v6.sin6_addr, buf, sizeof(buf));
    port = ntohs(v6.sin6_port);
  } else {
    return false;
  }
  host = buf;
  return true;
}

// Calls visit(fd, peer "addr:port") for each TCP connection of this process on `local_port` until it
// returns true.
template <class Visit>
void for_each_connection(int local_port, Visit&& visit) {
  // note: a scan of /proc/self/fd: a few hundred getpeername calls at most.
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    struct stat st {};
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, local{};
    socklen_t pl = sizeof(peer), ll = sizeof(local);
    if (getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    std::string ph, lh;
    int pp = 0, lp = 0;
    if (!address_of(peer, ph, pp) || !address_of(local, lh, lp)) continue;
    if (lp == local_port && visit(static_cast<int>(fd), ph + ":" + std::to_string(pp))) break;
  }
  closedir(dir);
}

std::string peer_key(const std::string& addr, int port) { return addr + ":" + std::to_string(port); }

}  // namespace

bool shutdown_reads(const std::string& remote_addr, int remote_port, int local_port) {
  const std::string want = peer_key(remote_addr, remote_port);
  bool done = false;
  for_each_connection(local_port, [&](int fd, const std::string& peer) {
    if (peer != want) return false;
    shutdown(fd, SHUT_RD);
    return done = true;
  });
  return done;
}

HeaderWatchdog::HeaderWatchdog(int local_port, std::chrono::seconds deadline)
    : local_port_(local_port), deadline_(deadline), thread_([this] { run(); }) {}

HeaderWatchdog::~HeaderWatchdog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void HeaderWatchdog::request_started(const std::string& remote_addr, int remote_port) {
  std::lock_guard lock(mu_);
  peers_[peer_key(remote_addr, remote_port)].in_request = true;
}

void HeaderWatchdog::request_ended(const std::string& remote_addr, int remote_port) {
  std::lock_guard lock(mu_);
  State& s = peers_[peer_key(remote_addr, remote_port)];
  s.in_request = false;
  s.since = std::chrono::steady_clock::now();
}

void HeaderWatchdog::run() {
  std::unique_lock lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::seconds(1), [&] { return stop_; })) {
    const auto now = std::chrono::steady_clock::now();
    std::map<std::string, State> open;
    lock.unlock();
    std::map<std::string, int> fds;
    for_each_connection(local_port_, [&](int fd, const std::string& peer) {
      fds[peer] = fd;
      return false;
    });
    lock.lock();
    // note: connections no longer open are forgotten; new ones start their clock now.
    for (const auto& [peer, fd] : fds) {
      auto it = peers_.find(peer);
      State s = it == peers_.end() ? State{now, false} : it->second;
      if (!s.in_request && now - s.since > deadline_) {
        shutdown(fd, SHUT_RDWR);
        continue;
      }
      open.emplace(peer, s);
    }
    peers_.swap(open);
  }
}

}  // namespace mxq::server
