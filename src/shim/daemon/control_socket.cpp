#include "control_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <sstream>
#include <vector>

#include "listen_socket.h"
#include "vrdma_common/log.h"

namespace vrdma::shim {
namespace {

void send_reply(int fd, const std::string& text) {
    ssize_t n = ::send(fd, text.data(), text.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    (void)n;
}

std::string execute(const std::string& request, const ControlActions& actions) {
    std::istringstream in(request);
    std::vector<std::string> words;
    for (std::string w; in >> w;) words.push_back(w);
    if (words.size() == 3 && words[0] == "port" && (words[2] == "up" || words[2] == "down")) {
        std::string error;
        if (!actions.set_port || !actions.set_port(words[1], words[2] == "up", error)) return "error: " + error;
        return "ok";
    }
    if (words.size() == 3 && words[0] == "weight") {
        std::string error;
        if (!actions.set_weight || !actions.set_weight(words[1], words[2], error)) return "error: " + error;
        return "ok";
    }
    if (words.size() == 3 && words[0] == "guest" && words[1] == "add") {
        std::string error;
        std::string line = actions.add_guest ? actions.add_guest(words[2], error) : "";
        return line.empty() ? "error: " + error : line;
    }
    if (words.size() == 3 && words[0] == "guest" && words[1] == "remove") {
        std::string error;
        if (!actions.remove_guest || !actions.remove_guest(words[2], error)) return "error: " + error;
        return "ok";
    }
    if (words.size() == 1 && words[0] == "reload" && actions.reload) {
        bool ok = false;
        std::string text = actions.reload(ok);
        return ok ? text : "error: not everything was applied:\n" + text;
    }
    if (words.size() == 1 && words[0] == "peers" && actions.peers) return actions.peers();
    if (words.size() == 1 && words[0] == "counters" && actions.counters) return actions.counters();
    if (words.size() == 1 && words[0] == "load" && actions.load) return actions.load();
    if (words.size() == 1 && words[0] == "transports" && actions.transports) return actions.transports();
    return "error: unknown request (expected: port NAME up|down, weight NAME W, guest add SPEC, guest remove NAME, "
           "reload, peers, counters, load or transports)";
}

}  // namespace

bool open_control_socket(int run_fd, const std::string& path, UniqueFd& out, std::string& error) {
    // Created 0600 from the start: no window in which another user connects.
    return bind_socket_at(run_fd, path, path.substr(path.rfind('/') + 1), 077, 16, out, error);
}

bool handle_control_connection(int fd, const ControlActions& actions) {
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
        (cred.uid != 0 && cred.uid != ::geteuid())) {
        send_reply(fd, "error: permission denied");
        return true;
    }
    char buf[512];
    ssize_t n = ::recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return false;
    if (n <= 0) return true;
    buf[n] = 0;
    std::string request(buf, size_t(n));
    std::string reply = execute(request, actions);
    if (request != "peers" && request != "counters" && request != "load") LOG_INFO("control (pid %d): %s -> %s", int(cred.pid), request.c_str(), reply.c_str());
    send_reply(fd, reply);
    return true;
}

}  // namespace vrdma::shim
