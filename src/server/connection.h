// What cpp-httplib 0.11 (Debian 12's) does not give a handler: its connection's socket. After a response that
// must end the connection (413 on a body still streaming in), the library would keep reading the rest as
// further requests; shutting the socket's reading side makes its next read see EOF, so the response is
// written and the connection closes (unread bytes then reset the client).
#pragma once

#include <string>

namespace mxq::server {

// Finds this process's TCP socket with the given peer and local port and shuts down its reading side.
// Returns false when none matches (the connection is already gone).
bool shutdown_reads(const std::string& remote_addr, int remote_port, int local_port);

}  // namespace mxq::server
