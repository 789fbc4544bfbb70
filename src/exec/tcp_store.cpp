// The TCP store: a star rendezvous through rank 0 with deadlines on every wait.
// Wire format: every message is an 8-byte little-endian length, then the bytes.
// A connecting rank first sends "cuboid-store/1 <rank> <world_size>" and
// rank 0 answers "ok" once everyone is there, or the reason it refuses.
#include "cuboid/exec/tcp_store.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <thread>
#include <utility>

#include "cuboid/core/error.hpp"
#include "cuboid/exec/exec_error.hpp"

namespace cuboid::exec {

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

int Socket::release() noexcept { return std::exchange(fd_, -1); }

void Socket::reset() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kHello = "cuboid-store/1";

std::string errno_text(int err) { return std::strerror(err); }

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

std::string seconds(std::chrono::milliseconds t) {
  std::ostringstream s;
  s << static_cast<double>(t.count()) / 1000.0 << " s";
  return s.str();
}

// Waits until `fd` is readable (events = POLLIN) or writable (POLLOUT).
// false on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

// What went wrong with one transfer; the caller adds who and which op.
struct IoResult {
  bool ok = true;
  std::string why;
};

IoResult write_all(int fd, const char* data, std::size_t n, Clock::time_point deadline) {
  while (n > 0) {
    if (!wait_fd(fd, POLLOUT, deadline)) return {false, "timed out sending"};
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return {false, "connection lost (" + errno_text(errno) + ")"};
    }
    data += w;
    n -= static_cast<std::size_t>(w);
  }
  return {};
}

IoResult read_all(int fd, char* data, std::size_t n, Clock::time_point deadline) {
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, deadline)) return {false, "timed out waiting"};
    const ssize_t r = ::recv(fd, data, n, 0);
    if (r == 0) return {false, "it closed the connection (did it exit?)"};
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return {false, "connection lost (" + errno_text(errno) + ")"};
    }
    data += r;
    n -= static_cast<std::size_t>(r);
  }
  return {};
}

IoResult write_message(int fd, const std::string& bytes, Clock::time_point deadline) {
  char header[8];
  std::uint64_t n = bytes.size();
  for (char& c : header) {
    c = static_cast<char>(n & 0xff);
    n >>= 8;
  }
  IoResult r = write_all(fd, header, sizeof(header), deadline);
  if (r.ok) r = write_all(fd, bytes.data(), bytes.size(), deadline);
  return r;
}

IoResult read_message(int fd, std::string& out, Clock::time_point deadline) {
  unsigned char header[8];
  IoResult r = read_all(fd, reinterpret_cast<char*>(header), sizeof(header), deadline);
  if (!r.ok) return r;
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | header[i];
  // A stray client (a port scanner, another job on the port) must not make us allocate terabytes.
  if (n > (std::uint64_t{1} << 34)) return {false, "sent a malformed message (not a cuboid run rank?)"};
  out.assign(static_cast<std::size_t>(n), '\0');
  return read_all(fd, out.data(), out.size(), deadline);
}

// Vector of strings <-> one string (each entry framed by its length).
std::string pack(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) {
    std::uint64_t n = p.size();
    for (int i = 0; i < 8; ++i) {
      out.push_back(static_cast<char>(n & 0xff));
      n >>= 8;
    }
    out += p;
  }
  return out;
}

std::vector<std::string> unpack(const std::string& all) {
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at + 8 <= all.size()) {
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(all[at + static_cast<std::size_t>(i)]);
    at += 8;
    out.push_back(all.substr(at, static_cast<std::size_t>(n)));
    at += static_cast<std::size_t>(n);
  }
  return out;
}

std::string endpoint(const TcpStoreOptions& o) {
  return o.master_addr + ":" + std::to_string(o.master_port);
}

// The addresses of MASTER_ADDR:MASTER_PORT; InputError naming MASTER_ADDR when it does not resolve.
struct AddrList {
  addrinfo* head = nullptr;
  AddrList() = default;
  AddrList(const AddrList&) = delete;
  AddrList& operator=(const AddrList&) = delete;
  ~AddrList() {
    if (head != nullptr) ::freeaddrinfo(head);
  }
};

void resolve(const TcpStoreOptions& o, AddrList& out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  const std::string port = std::to_string(o.master_port);
  const int rc = ::getaddrinfo(o.master_addr.c_str(), port.c_str(), &hints, &out.head);
  if (rc != 0)
    throw InputError("environment", "MASTER_ADDR",
                     "'" + o.master_addr + "' does not resolve (" + ::gai_strerror(rc) + ")",
                     "set MASTER_ADDR to rank 0's host name or IP address");
}

void set_nodelay(int fd) {
  int one = 1;
  (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

// ---------------------------------------------------------------------------
TcpStore::TcpStore(const TcpStoreOptions& o) : rank_(o.rank), size_(o.world_size), timeout_(o.timeout) {
  if (size_ < 1 || rank_ < 0 || rank_ >= size_)
    throw InputError("environment", o.rank_var,
                     o.rank_var + "=" + std::to_string(rank_) + " is not below " + o.size_var + "=" +
                         std::to_string(size_),
                     "launch with a consistent rank and world size");
  if (o.master_port <= 0 || o.master_port > 65535)
    throw InputError("environment", o.port_var, std::to_string(o.master_port) + " is not a TCP port",
                     o.port_var == "CUBOID_STORE_PORT"
                         ? "set CUBOID_STORE_PORT to a free port between 1024 and 65535 on rank 0's host"
                         : "set MASTER_PORT to a free port between 1024 and 65534 on rank 0's host (cuboid's store "
                           "uses the next one), or CUBOID_STORE_PORT");
  if (o.master_addr.empty())
    throw InputError("environment", "MASTER_ADDR", "is not set",
                     "set MASTER_ADDR to rank 0's host name or IP address (torchrun sets it)");
  if (size_ == 1) return;
  if (rank_ == 0)
    serve(o);
  else
    connect(o);
}

Clock::time_point TcpStore::deadline() const { return Clock::now() + timeout_; }

void TcpStore::serve(const TcpStoreOptions& o) {
  // Listen on every interface (as PyTorch's TCPStore does): MASTER_ADDR may
  // name any of this host's addresses. Dual-stack IPv6 when the host has it.
  Socket listener(::socket(AF_INET6, SOCK_STREAM, 0));
  bool v6 = static_cast<bool>(listener);
  if (!v6) listener = Socket(::socket(AF_INET, SOCK_STREAM, 0));
  if (!listener) throw ExecError(__FILE__, __LINE__, rank_, "TCP store listen", "socket(): " + errno_text(errno));
  int one = 1;
  (void)::setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  int rc = -1;
  if (v6) {
    int zero = 0;
    (void)::setsockopt(listener.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_any;
    a.sin6_port = htons(static_cast<std::uint16_t>(o.master_port));
    rc = ::bind(listener.fd(), reinterpret_cast<sockaddr*>(&a), sizeof(a));
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<std::uint16_t>(o.master_port));
    rc = ::bind(listener.fd(), reinterpret_cast<sockaddr*>(&a), sizeof(a));
  }
  if (rc != 0)
    throw InputError("environment", o.port_var,
                     "rank 0 cannot listen on port " + std::to_string(o.master_port) + " (" + o.port_var +
                         "): " + errno_text(errno),
                     "set CUBOID_STORE_PORT to a free port (is another job using this one?)");
  if (::listen(listener.fd(), 128) != 0)
    throw ExecError(__FILE__, __LINE__, rank_, "TCP store listen", "listen(): " + errno_text(errno));

  peers_.resize(static_cast<std::size_t>(size_));
  const Clock::time_point until = deadline();
  std::string refusal;  // the first inconsistent rank, reported to everyone
  int arrived = 1;
  while (arrived < size_) {
    if (!wait_fd(listener.fd(), POLLIN, until)) {
      std::string missing;
      int count = 0;
      for (int r = 1; r < size_; ++r)
        if (!peers_[static_cast<std::size_t>(r)]) {
          if (count < 8) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
          ++count;
        }
      if (count > 8) missing += ", ...";
      throw ExecError(__FILE__, __LINE__, rank_, "TCP store rendezvous",
                      std::to_string(count) + " rank(s) (" + missing + ") did not connect to " + endpoint(o) +
                          " within " + seconds(timeout_) + " (were they started, with the same MASTER_ADDR and " + o.port_var + "?)");
    }
    Socket peer(::accept(listener.fd(), nullptr, nullptr));
    if (!peer) continue;
    set_nodelay(peer.fd());
    std::string hello;
    // A connection that does not introduce itself is not one of ours: drop it.
    if (!read_message(peer.fd(), hello, until).ok) continue;
    std::istringstream in(hello);
    std::string magic;
    int r = -1, n = -1;
    in >> magic >> r >> n;
    if (magic != kHello || !in) continue;
    if (n != size_) {
      refusal = "rank " + std::to_string(r) + " was launched with " + o.size_var + "=" + std::to_string(n) +
                " but rank 0 with " + o.size_var + "=" + std::to_string(size_);
      (void)write_message(peer.fd(), refusal, until);
      break;
    }
    if (r < 1 || r >= size_ || peers_[static_cast<std::size_t>(r)]) {
      refusal = "two ranks say they are rank " + std::to_string(r) + " (or it is out of range) of " +
                std::to_string(size_);
      (void)write_message(peer.fd(), refusal, until);
      break;
    }
    peers_[static_cast<std::size_t>(r)] = std::move(peer);
    ++arrived;
  }
  const std::string answer = refusal.empty() ? "ok" : refusal;
  for (int r = 1; r < size_; ++r)
    if (peers_[static_cast<std::size_t>(r)]) (void)write_message(peers_[static_cast<std::size_t>(r)].fd(), answer, until);
  if (!refusal.empty())
    throw InputError("environment", o.size_var, refusal, "launch every rank with the same " + o.size_var +
                                                             " and distinct " + o.rank_var + " values");
}

void TcpStore::connect(const TcpStoreOptions& o) {
  AddrList addrs;
  resolve(o, addrs);
  const Clock::time_point until = deadline();
  std::string last_error = "no address";
  auto pause = std::chrono::milliseconds(50);
  // Rank 0 may start later than we do: retry until the deadline.
  while (Clock::now() < until) {
    for (addrinfo* a = addrs.head; a != nullptr; a = a->ai_next) {
      Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK, a->ai_protocol));
      if (!s) {
        last_error = errno_text(errno);
        continue;
      }
      int rc = ::connect(s.fd(), a->ai_addr, a->ai_addrlen);
      if (rc != 0 && errno == EINPROGRESS) {
        const auto attempt = std::min(until, Clock::now() + std::chrono::seconds(5));
        if (!wait_fd(s.fd(), POLLOUT, attempt)) {
          last_error = "connect timed out";
          continue;
        }
        int err = 0;
        socklen_t len = sizeof(err);
        (void)::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      }
      if (rc != 0) {
        last_error = errno_text(errno);
        continue;
      }
      set_nodelay(s.fd());
      const std::string hello =
          std::string(kHello) + " " + std::to_string(rank_) + " " + std::to_string(size_);
      std::string answer;
      IoResult io = write_message(s.fd(), hello, until);
      if (io.ok) io = read_message(s.fd(), answer, until);
      if (!io.ok)
        throw ExecError(__FILE__, __LINE__, rank_, "TCP store rendezvous",
                        "rank 0 at " + endpoint(o) + ": " + io.why + " (within " + seconds(timeout_) +
                            " not every rank connected, or rank 0 failed)");
      if (answer != "ok")
        throw InputError("environment", o.size_var, answer,
                         "launch every rank with the same " + o.size_var + " and distinct " + o.rank_var + " values");
      peers_.push_back(std::move(s));
      return;
    }
    std::this_thread::sleep_for(std::min(pause, std::chrono::milliseconds(remaining_ms(until))));
    pause = std::min(pause * 2, std::chrono::milliseconds(1000));
  }
  throw ExecError(__FILE__, __LINE__, rank_, "TCP store rendezvous",
                  "could not connect to rank 0's store at MASTER_ADDR:" + o.port_var + " = " + endpoint(o) + " within " +
                      seconds(timeout_) + " (last error: " + last_error +
                      "); is rank 0 running, and MASTER_ADDR its address?");
}

void TcpStore::send_to(int peer, const std::string& bytes, const char* op) {
  const Socket& s = peers_[rank_ == 0 ? static_cast<std::size_t>(peer) : 0];
  const IoResult r = write_message(s.fd(), bytes, deadline());
  if (!r.ok)
    throw ExecError(__FILE__, __LINE__, rank_, std::string("TCP store ") + op,
                    "sending to rank " + std::to_string(peer) + ": " + r.why + " (timeout " + seconds(timeout_) + ")");
}

std::string TcpStore::recv_from(int peer, const char* op) {
  const Socket& s = peers_[rank_ == 0 ? static_cast<std::size_t>(peer) : 0];
  std::string out;
  const IoResult r = read_message(s.fd(), out, deadline());
  if (!r.ok)
    throw ExecError(__FILE__, __LINE__, rank_, std::string("TCP store ") + op,
                    "no message from rank " + std::to_string(peer) + ": " + r.why + " (timeout " +
                        seconds(timeout_) + "; did that rank die or hang?)");
  return out;
}

// Rank 0 relays everything: a message between two other ranks goes through it.
void TcpStore::broadcast(std::string& bytes, int root) {
  if (size_ == 1) return;
  if (root != 0) {
    if (rank_ == root) send_to(0, bytes, "broadcast");
    if (rank_ == 0) bytes = recv_from(root, "broadcast");
  }
  if (rank_ == 0) {
    for (int r = 1; r < size_; ++r) send_to(r, bytes, "broadcast");
  } else {
    bytes = recv_from(0, "broadcast");
  }
}

std::vector<std::string> TcpStore::gather(const std::string& mine, int root) {
  if (size_ == 1) return {mine};
  std::vector<std::string> all;
  if (rank_ == 0) {
    all.push_back(mine);
    for (int r = 1; r < size_; ++r) all.push_back(recv_from(r, "gather"));
  } else {
    send_to(0, mine, "gather");
  }
  if (root == 0) return all;
  if (rank_ == 0) send_to(root, pack(all), "gather");
  if (rank_ == root) return unpack(recv_from(0, "gather"));
  return {};
}

std::vector<std::string> TcpStore::all_gather(const std::string& mine) {
  std::vector<std::string> all = gather(mine, 0);
  std::string packed = rank_ == 0 ? pack(all) : std::string();
  broadcast(packed, 0);
  return unpack(packed);
}

void TcpStore::barrier() { (void)all_gather(std::string()); }

}  // namespace cuboid::exec
