#include "server/connection.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>

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

}  // namespace

bool shutdown_reads(const std::string& remote_addr, int remote_port, int local_port) {
  // note: a scan of /proc/self/fd: a few hundred getpeername calls at most, and only on this rare path.
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return false;
  bool done = false;
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
    if (ph == remote_addr && pp == remote_port && lp == local_port) {
      shutdown(static_cast<int>(fd), SHUT_RD);
      done = true;
      break;
    }
  }
  closedir(dir);
  return done;
}

}  // namespace mxq::server
