// What cpp-httplib 0.11 (Debian 12's) does not give a handler: its connection's socket. After a response that
// must end the connection (413 on a body still streaming in), the library would keep reading the rest as
// further requests; shutting the socket's reading side makes its next read see EOF, so the response is
// written and the connection closes (unread bytes then reset the client).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace mxq::server {

// Finds this process's TCP socket with the given peer and local port and shuts down its reading side.
// Returns false when none matches (the connection is already gone).
bool shutdown_reads(const std::string& remote_addr, int remote_port, int local_port);

// A total deadline for a request's headers, which cpp-httplib 0.11 lacks (its read timeout restarts on
// every byte, so a client sending one byte per second holds a connection for ever: bad_inputs H-02). Once a
// second it lists the connections on `local_port`; one that has waited longer than `deadline` for a whole
// request (since it was accepted, or since its last response was written) is shut down. The HTTP server
// reports each request's start (its headers are in) and end.
class HeaderWatchdog {
 public:
  HeaderWatchdog(int local_port, std::chrono::seconds deadline);
  ~HeaderWatchdog();
  void request_started(const std::string& remote_addr, int remote_port);
  void request_ended(const std::string& remote_addr, int remote_port);

 private:
  void run();
  struct State {
    std::chrono::steady_clock::time_point since;  // accepted, or last response written
    bool in_request = false;
  };
  int local_port_;
  std::chrono::seconds deadline_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::map<std::string, State> peers_;  // "addr:port" of connections seen open
  std::thread thread_;
};

}  // namespace mxq::server
