// libFuzzer target: the connection manager behind rdma_cm (src/shim/cm),
// as guests of one shim drive it through their rdma_cm.sock. Two guests
// (a: 10.0.0.1 and fd00::1, b: 10.0.0.2) open up to four channels; the
// input is a sequence of UCMA commands, each either raw bytes or built
// from the input with plausible fields (the handles the shim returned, the
// guests' addresses and a few ports, every port space and QP type), sent
// through the socket or straight to CmService::command, with channels
// closed and guests removed between them. Checked (besides ASan and UBSan):
// a response never exceeds what the command's header allows or
// kCmMaxResponse; a well-formed Open is accepted; once every channel is
// closed no id is left.
#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "cm_service.h"
#include "fuzz_common.h"
#include "vrdma/abi.h"
#include "vrdma_common/fd_passing.h"

using namespace vrdma::fuzz;
using vrdma::shim::cm::CmService;

namespace {

struct Chan {
    uint64_t id = 0;
    int peer = -1;    // the guest's end of the socket
    int read_end = -1;
    size_t guest = 0;
};

void put_addr(Input& in, sockaddr_in6& out) {
    static const char* const kIps[] = {"10.0.0.1", "10.0.0.2", "127.0.0.1", "0.0.0.0", "10.9.9.9"};
    static const char* const kIp6[] = {"fd00::1", "::1", "::", "fd00::9"};
    static const uint16_t kPorts[] = {0, 7174, 7471, 18515};
    std::memset(&out, 0, sizeof(out));
    const uint8_t how = in.u8();
    if (how % 4 == 3) {  // anything
        in.bytes(&out, sizeof(out));
        return;
    }
    if (how % 4 == 2) {
        out.sin6_family = AF_INET6;
        inet_pton(AF_INET6, kIp6[in.pick(4)], &out.sin6_addr);
        out.sin6_port = htons(kPorts[in.pick(4)]);
        return;
    }
    sockaddr_in sin{};
    sin.sin_family = AF_INET;
    inet_pton(AF_INET, kIps[in.pick(5)], &sin.sin_addr);
    sin.sin_port = htons(kPorts[in.pick(4)]);
    std::memcpy(&out, &sin, sizeof(sin));
}

// A command built from the input: header, then a body whose id fields
// name handles the shim gave out.
size_t build(Input& in, const std::vector<uint32_t>& handles, const std::vector<Chan>& chans, uint8_t* buf) {
    auto handle = [&]() -> uint32_t { return handles.empty() || in.u8() % 8 == 0 ? in.u32() : handles[in.pick(uint32_t(handles.size()))]; };
    rdma_ucm_cmd_hdr hdr{};
    hdr.cmd = in.pick(24);
    hdr.out = in.u8() % 8 == 0 ? in.u16() : 512;
    uint8_t* body = buf + sizeof(hdr);
    size_t len = 0;
    switch (hdr.cmd) {
    case RDMA_USER_CM_CMD_CREATE_ID: {
        rdma_ucm_create_id c{};
        c.uid = in.u64();
        c.ps = uint16_t(in.pick(2) ? RDMA_PS_TCP : in.pick(2) ? RDMA_PS_UDP : in.u16());
        c.qp_type = uint8_t(in.pick(2) ? IBV_QPT_RC : in.pick(2) ? IBV_QPT_UD : in.u8());
        std::memcpy(body, &c, len = sizeof(c));
        break;
    }
    case RDMA_USER_CM_CMD_BIND_IP: {
        rdma_ucm_bind_ip c{};
        put_addr(in, c.addr);
        c.id = handle();
        std::memcpy(body, &c, len = sizeof(c));
        break;
    }
    case RDMA_USER_CM_CMD_RESOLVE_IP: {
        rdma_ucm_resolve_ip c{};
        if (in.pick(2)) put_addr(in, c.src_addr);
        put_addr(in, c.dst_addr);
        c.id = handle();
        std::memcpy(body, &c, len = sizeof(c));
        break;
    }
    case RDMA_USER_CM_CMD_CONNECT: {
        rdma_ucm_connect c{};
        c.conn_param.qp_num = in.u32();
        c.conn_param.private_data_len = in.u8();
        c.conn_param.responder_resources = in.u8();
        c.conn_param.initiator_depth = in.u8();
        c.conn_param.retry_count = in.u8();
        c.conn_param.rnr_retry_count = in.u8();
        c.id = handle();
        std::memcpy(body, &c, len = sizeof(c));
        break;
    }
    case RDMA_USER_CM_CMD_ACCEPT: {
        rdma_ucm_accept c{};
        c.uid = in.u64();
        c.conn_param.qp_num = in.u32();
        c.conn_param.qkey = in.u32();
        c.conn_param.private_data_len = in.u8();
        c.conn_param.valid = in.u8() & 1;
        c.id = handle();
        std::memcpy(body, &c, len = sizeof(c));
        break;
    }
    case RDMA_USER_CM_CMD_MIGRATE_ID: {
        rdma_ucm_migrate_id c{};
        c.id = handle();
        c.fd = chans.empty() || in.u8() % 8 == 0 ? in.u32() : uint32_t(chans[in.pick(uint32_t(chans.size()))].id);
        std::memcpy(body, &c, len = sizeof(c));
        break;
    }
    case RDMA_USER_CM_CMD_SET_OPTION: {
        rdma_ucm_set_option c{};
        c.id = handle();
        c.level = in.pick(3);
        c.optname = in.pick(5);
        c.optlen = in.pick(2) ? 4 : in.u8();
        std::memcpy(body, &c, len = sizeof(c));
        in.bytes(body + len, c.optlen <= 256 ? c.optlen : 0);
        hdr.in = uint16_t(len);
        std::memcpy(buf, &hdr, sizeof(hdr));
        return sizeof(hdr) + len + (c.optlen <= 256 ? c.optlen : 0);
    }
    case RDMA_USER_CM_CMD_JOIN_IP_MCAST: {
        rdma_ucm_join_ip_mcast c{};
        c.uid = in.u64();
        if (in.pick(2)) {  // a multicast group, else anything put_addr gives
            sockaddr_in sin{};
            sin.sin_family = AF_INET;
            sin.sin_addr.s_addr = htonl(0xe0000000u | (in.u32() & 0x0fffffffu));
            std::memcpy(&c.addr, &sin, sizeof(sin));
        } else {
            put_addr(in, c.addr);
        }
        c.id = handle();
        std::memcpy(body, &c, len = sizeof(c));
        break;
    }
    case RDMA_USER_CM_CMD_JOIN_MCAST: {
        rdma_ucm_join_mcast c{};
        c.uid = in.u64();
        c.id = handle();
        sockaddr_in6 a{};
        put_addr(in, a);
        std::memcpy(&c.addr, &a, sizeof(a));
        c.addr_size = uint16_t(in.pick(2) ? sizeof(sockaddr_in) : in.u16());
        c.join_flags = uint16_t(in.pick(3));
        std::memcpy(body, &c, len = sizeof(c));
        break;
    }
    case RDMA_USER_CM_CMD_LEAVE_MCAST: {
        rdma_ucm_destroy_id c{};
        c.id = in.pick(2) ? in.pick(8) + 1 : handle();  // joins are numbered from 1
        std::memcpy(body, &c, len = sizeof(c));
        break;
    }
    default: {
        // The rest carry (response,) id, and a few small fields: raw bytes
        // with a handle where most of them keep their id.
        len = in.u8() % 64;
        in.bytes(body, len);
        const uint32_t h = handle();
        const size_t at = in.pick(2) ? 0 : 8;
        if (len >= at + 4) std::memcpy(body + at, &h, 4);
        break;
    }
    }
    hdr.in = uint16_t(in.u8() % 16 == 0 ? in.u16() : len);
    std::memcpy(buf, &hdr, sizeof(hdr));
    return sizeof(hdr) + len;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    quiet_logs();
    Input in(data, size);
    CmService cm;
    auto guest = [](const char* name, uint16_t lid, std::vector<const char*> ips) {
        vrdma::shim::cm::CmGuest g;
        g.name = name;
        g.lid = lid;
        g.guid = 0x1000 + lid;
        for (const char* ip : ips) {
            vrdma::shim::cm::IpAddress a;
            vrdma::shim::cm::parse_ip(ip, a);
            g.addrs.push_back(a);
        }
        return g;
    };
    cm.set_guest(0, guest("a", 1, {"10.0.0.1", "fd00::1"}));
    cm.set_guest(1, guest("b", 2, {"10.0.0.2"}));

    std::vector<Chan> chans;
    std::vector<uint32_t> handles;
    auto open_channel = [&](size_t g) {
        int sv[2];
        if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) != 0) return;
        int p[2];
        if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
            ::close(sv[0]);
            ::close(sv[1]);
            return;
        }
        const uint64_t id = cm.add_connection(g, vrdma::UniqueFd(sv[0]));
        if (!id) {
            ::close(sv[1]);
            ::close(p[0]);
            ::close(p[1]);
            return;
        }
        vrdma::abi::CmSockRequest open{vrdma::abi::kMagic, vrdma::abi::kVersion, vrdma::abi::CmSockOp::Open, 0};
        const int fds[2] = {p[1], p[0]};
        vrdma::send_with_fds(sv[1], &open, sizeof(open), std::span<const int>(fds, 2));
        ::close(p[1]);
        if (!cm.on_readable(id)) violation("a well-formed Open was refused");
        uint8_t reply[64];
        (void)::recv(sv[1], reply, sizeof(reply), MSG_DONTWAIT);
        chans.push_back({id, sv[1], p[0], g});
    };
    open_channel(0);
    open_channel(1);

    uint8_t buf[1024];
    std::vector<uint8_t> out;
    while (!in.empty()) {
        const uint8_t op = in.u8();
        if (op % 16 == 0 && chans.size() < 4) {
            open_channel(in.pick(2));
            continue;
        }
        if (chans.empty()) break;
        Chan& c = chans[in.pick(uint32_t(chans.size()))];
        if (op % 16 == 1) {  // the channel closes (its process exits)
            cm.close_channel(c.id);
            ::close(c.peer);
            ::close(c.read_end);
            c = chans.back();
            chans.pop_back();
            continue;
        }
        if (op % 32 == 2) {  // raw bytes through the socket
            const size_t n = in.u8() + in.u8();
            in.bytes(buf, n);
            ::send(c.peer, buf, n, MSG_DONTWAIT);
            if (!cm.on_readable(c.id)) {
                cm.close_channel(c.id);
                ::close(c.peer);
                ::close(c.read_end);
                c = chans.back();
                chans.pop_back();
                continue;
            }
            (void)::recv(c.peer, buf, sizeof(buf), MSG_DONTWAIT);
            continue;
        }
        const size_t len = build(in, handles, chans, buf);
        rdma_ucm_cmd_hdr hdr;
        std::memcpy(&hdr, buf, sizeof(hdr));
        const int rc = cm.command(c.id, buf, len, out);
        if (rc == 0 && (out.size() > hdr.out || out.size() > vrdma::abi::kCmMaxResponse))
            violation("a response larger than the command allows");
        if (rc == 0 && hdr.cmd == RDMA_USER_CM_CMD_CREATE_ID && out.size() >= 4) {
            uint32_t h;
            std::memcpy(&h, out.data(), 4);
            handles.push_back(h);
        }
        if (rc == 0 && hdr.cmd == RDMA_USER_CM_CMD_GET_EVENT && out.size() >= 12) {
            rdma_ucm_event_resp e{};
            std::memcpy(&e, out.data(), std::min(out.size(), sizeof(e)));
            if (e.event == 4) handles.push_back(e.id);  // a connection request's new id
            uint8_t b;
            (void)::read(c.read_end, &b, 1);  // as the provider does, after the fact
        }
        if (in.u8() % 64 == 0) cm.remove_guest(in.pick(2));
    }
    for (Chan& c : chans) {
        cm.close_channel(c.id);
        ::close(c.peer);
        ::close(c.read_end);
    }
    if (cm.id_count() != 0) violation("ids left after every channel closed");
    return 0;
}
