// rdma_cm's API as librdmacm programs use it, against the device the
// provider emulates and the shim's connection manager (docs/protocol.md
// "rdma_cm"): what the kernel would report, error by error. Run by
// rdma_cm.sh in guest a (10.0.0.1, fd00::1) beside guest b (10.0.0.2).
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

namespace {

sockaddr_in v4(const char* ip, uint16_t port) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    REQUIRE(inet_pton(AF_INET, ip, &a.sin_addr) == 1);
    return a;
}

bool readable(rdma_event_channel* ch, int timeout_ms = 0) {
    pollfd p{ch->fd, POLLIN, 0};
    return poll(&p, 1, timeout_ms) == 1 && (p.revents & POLLIN);
}

// The next event on `ch` (waited for up to 5 s), which must be `type`.
rdma_cm_event* expect(rdma_event_channel* ch, rdma_cm_event_type type) {
    REQUIRE(readable(ch, 5000));
    rdma_cm_event* e = nullptr;
    REQUIRE(rdma_get_cm_event(ch, &e) == 0);
    INFO("got " << rdma_event_str(e->event) << " status " << e->status);
    CHECK(e->event == type);
    return e;
}

struct Channel {
    rdma_event_channel* ch = rdma_create_event_channel();
    Channel() { REQUIRE(ch); }
    ~Channel() { rdma_destroy_event_channel(ch); }
};

rdma_cm_id* new_id(rdma_event_channel* ch, rdma_port_space ps = RDMA_PS_TCP) {
    rdma_cm_id* id = nullptr;
    REQUIRE(rdma_create_id(ch, &id, nullptr, ps) == 0);
    return id;
}

// `call` (rdma_destroy_id, rdma_leave_multicast) succeeds, and returns
// only once the event `e` it reported is acked: still waiting 200 ms
// later, done after the ack.
template <typename F>
void returns_after_ack(F call, rdma_cm_event* e) {
    std::atomic<bool> done{false};
    std::thread t([&] {
        CHECK(call() == 0);
        done = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK_FALSE(done.load());
    rdma_ack_cm_event(e);
    t.join();
    CHECK(done.load());
}

// Resolves `id`'s address and route to `to` (the ADDR_ and ROUTE_RESOLVED
// events taken and acked), as a client does before it connects.
void resolve(rdma_event_channel* ch, rdma_cm_id* id, sockaddr_in& to) {
    REQUIRE(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&to), 2000) == 0);
    rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
    REQUIRE(rdma_resolve_route(id, 2000) == 0);
    rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
}

}  // namespace

TEST_CASE("an event channel is a character device, readable exactly while events wait") {
    Channel c;
    struct stat st;
    REQUIRE(fstat(c.ch->fd, &st) == 0);
    CHECK(S_ISCHR(st.st_mode));
    CHECK_FALSE(readable(c.ch));
    rdma_cm_id* id = new_id(c.ch);
    auto dst = v4("10.0.0.1", 7470);
    REQUIRE(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000) == 0);
    rdma_cm_event* e = expect(c.ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    CHECK(e->status == 0);
    CHECK_FALSE(readable(c.ch));  // the one event was taken
    REQUIRE(rdma_ack_cm_event(e) == 0);
    REQUIRE(id->verbs);  // the guest's device, found by its GUID
    CHECK(std::string(ibv_get_device_name(id->verbs->device)) == "vrdma0");
    auto* src = reinterpret_cast<sockaddr_in*>(rdma_get_local_addr(id));
    char text[32];
    CHECK(std::string(inet_ntop(AF_INET, &src->sin_addr, text, sizeof(text))) == "10.0.0.1");
    REQUIRE(rdma_destroy_id(id) == 0);
}

TEST_CASE("a non-blocking channel with nothing pending fails GET_EVENT with EAGAIN") {
    Channel c;
    REQUIRE(fcntl(c.ch->fd, F_SETFL, fcntl(c.ch->fd, F_GETFL) | O_NONBLOCK) == 0);
    rdma_cm_event* e = nullptr;
    errno = 0;
    CHECK(rdma_get_cm_event(c.ch, &e) == -1);
    CHECK(errno == EAGAIN);
}

TEST_CASE("destroying an id drops its unread events and waits for the ack of those it reported") {
    Channel c;
    SECTION("unread: gone with the id") {
        rdma_cm_id* id = new_id(c.ch);
        auto dst = v4("10.0.0.1", 7470);
        REQUIRE(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000) == 0);
        REQUIRE(readable(c.ch, 5000));
        REQUIRE(rdma_destroy_id(id) == 0);  // would hang if the unread event counted as reported
        CHECK_FALSE(readable(c.ch));
    }
    SECTION("reported but not acked: destroy returns after the ack") {
        rdma_cm_id* id = new_id(c.ch);
        auto dst = v4("10.0.0.1", 7470);
        REQUIRE(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000) == 0);
        rdma_cm_event* e = expect(c.ch, RDMA_CM_EVENT_ADDR_RESOLVED);
        returns_after_ack([&] { return rdma_destroy_id(id); }, e);
    }
}

TEST_CASE("a guest binds only its own addresses, and a port once") {
    Channel c;
    rdma_cm_id* a = new_id(c.ch);
    rdma_cm_id* b = new_id(c.ch);
    auto other = v4("10.0.0.2", 7471);  // guest b's
    errno = 0;
    CHECK(rdma_bind_addr(a, reinterpret_cast<sockaddr*>(&other)) == -1);
    CHECK(errno == EADDRNOTAVAIL);
    auto mine = v4("10.0.0.1", 7471);
    REQUIRE(rdma_bind_addr(a, reinterpret_cast<sockaddr*>(&mine)) == 0);
    errno = 0;
    CHECK(rdma_bind_addr(b, reinterpret_cast<sockaddr*>(&mine)) == -1);
    CHECK(errno == EADDRINUSE);
    auto any = v4("0.0.0.0", 7471);
    errno = 0;
    CHECK(rdma_bind_addr(b, reinterpret_cast<sockaddr*>(&any)) == -1);
    CHECK(errno == EADDRINUSE);
    rdma_destroy_id(a);  // the port is free again
    CHECK(rdma_bind_addr(b, reinterpret_cast<sockaddr*>(&any)) == 0);
    rdma_destroy_id(b);

    SECTION("SO_REUSEADDR on both ends shares a port that nobody listens on") {
        rdma_cm_id* x = new_id(c.ch);
        rdma_cm_id* y = new_id(c.ch);
        int on = 1;
        REQUIRE(rdma_set_option(x, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on, sizeof(on)) == 0);
        REQUIRE(rdma_set_option(y, RDMA_OPTION_ID, RDMA_OPTION_ID_REUSEADDR, &on, sizeof(on)) == 0);
        REQUIRE(rdma_bind_addr(x, reinterpret_cast<sockaddr*>(&mine)) == 0);
        CHECK(rdma_bind_addr(y, reinterpret_cast<sockaddr*>(&mine)) == 0);
        rdma_destroy_id(x);
        rdma_destroy_id(y);
    }
    SECTION("port 0 gets an ephemeral port") {
        rdma_cm_id* x = new_id(c.ch);
        auto eph = v4("10.0.0.1", 0);
        REQUIRE(rdma_bind_addr(x, reinterpret_cast<sockaddr*>(&eph)) == 0);
        CHECK(ntohs(rdma_get_src_port(x)) >= 32768);
        rdma_destroy_id(x);
    }
}

TEST_CASE("an address nobody has gives ADDR_ERROR; a port nobody listens on, REJECTED") {
    Channel c;
    rdma_cm_id* id = new_id(c.ch);
    auto nowhere = v4("10.9.9.9", 7472);
    REQUIRE(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&nowhere), 2000) == 0);
    rdma_cm_event* e = expect(c.ch, RDMA_CM_EVENT_ADDR_ERROR);
    CHECK(e->status == -EHOSTUNREACH);
    rdma_ack_cm_event(e);
    rdma_destroy_id(id);

    id = new_id(c.ch);
    auto closed = v4("10.0.0.2", 7472);  // guest b, which listens on nothing
    resolve(c.ch, id, closed);
    CHECK(id->route.num_paths == 1);
    CHECK(id->route.path_rec[0].dlid != id->route.path_rec[0].slid);  // b's LID, not ours
    rdma_conn_param p{};
    p.qp_num = 0x123;
    REQUIRE(rdma_connect(id, &p) == 0);
    e = expect(c.ch, RDMA_CM_EVENT_REJECTED);
    CHECK(e->status == 8);  // IB CM: invalid service ID
    rdma_ack_cm_event(e);
    rdma_destroy_id(id);
}

TEST_CASE("connect, accept and disconnect through loopback, private data both ways") {
    Channel server, client;
    rdma_cm_id* listen = new_id(server.ch);
    auto at = v4("127.0.0.1", 7473);
    REQUIRE(rdma_bind_addr(listen, reinterpret_cast<sockaddr*>(&at)) == 0);
    REQUIRE(rdma_listen(listen, 4) == 0);

    rdma_cm_id* conn = new_id(client.ch);
    resolve(client.ch, conn, at);
    const char hello[] = "hello from the client";
    rdma_conn_param p{};
    p.qp_num = 0x111;
    p.private_data = hello;
    p.private_data_len = sizeof(hello);
    p.responder_resources = 1;
    p.initiator_depth = 1;
    REQUIRE(rdma_connect(conn, &p) == 0);

    rdma_cm_event* req = expect(server.ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    CHECK(req->listen_id == listen);
    REQUIRE(req->param.conn.private_data_len >= sizeof(hello));
    CHECK(std::memcmp(req->param.conn.private_data, hello, sizeof(hello)) == 0);
    CHECK(req->param.conn.qp_num == 0x111);
    rdma_cm_id* child = req->id;
    rdma_ack_cm_event(req);
    const char welcome[] = "welcome";
    rdma_conn_param a{};
    a.qp_num = 0x222;
    a.private_data = welcome;
    a.private_data_len = sizeof(welcome);
    REQUIRE(rdma_accept(child, &a) == 0);

    rdma_cm_event* rep = expect(client.ch, RDMA_CM_EVENT_CONNECT_RESPONSE);  // no QP: the application's turn
    CHECK(rep->param.conn.qp_num == 0x222);
    REQUIRE(rep->param.conn.private_data_len >= sizeof(welcome));
    CHECK(std::memcmp(rep->param.conn.private_data, welcome, sizeof(welcome)) == 0);
    rdma_ack_cm_event(rep);
    REQUIRE(rdma_establish(conn) == 0);
    rdma_ack_cm_event(expect(server.ch, RDMA_CM_EVENT_ESTABLISHED));

    SECTION("the client disconnects") {
        REQUIRE(rdma_disconnect(conn) == 0);
        rdma_ack_cm_event(expect(server.ch, RDMA_CM_EVENT_DISCONNECTED));
        CHECK_FALSE(readable(client.ch, 100));  // its DREP is owed by the server
        rdma_disconnect(child);
        rdma_ack_cm_event(expect(client.ch, RDMA_CM_EVENT_DISCONNECTED));
    }
    SECTION("a disconnect the peer never answers ends after the DREQ timeout") {
        REQUIRE(rdma_disconnect(conn) == 0);
        rdma_ack_cm_event(expect(server.ch, RDMA_CM_EVENT_DISCONNECTED));  // and it never disconnects
        CHECK_FALSE(readable(client.ch, 2000));
        rdma_cm_event* e = expect(client.ch, RDMA_CM_EVENT_DISCONNECTED);  // 3 s after the DREQ
        CHECK(e->status == -ETIMEDOUT);
        rdma_ack_cm_event(e);
    }
    SECTION("the server's id goes away") {
        REQUIRE(rdma_destroy_id(child) == 0);
        child = nullptr;
        rdma_ack_cm_event(expect(client.ch, RDMA_CM_EVENT_DISCONNECTED));
    }
    if (child) rdma_destroy_id(child);
    rdma_destroy_id(conn);
    rdma_destroy_id(listen);
}

TEST_CASE("a backlog full of unread requests drops the next: UNREACHABLE; a reject names its reason") {
    Channel server, client;
    rdma_cm_id* listen = new_id(server.ch);
    auto at = v4("10.0.0.1", 7474);
    REQUIRE(rdma_bind_addr(listen, reinterpret_cast<sockaddr*>(&at)) == 0);
    REQUIRE(rdma_listen(listen, 1) == 0);
    auto connect_one = [&] {
        rdma_cm_id* id = new_id(client.ch);
        resolve(client.ch, id, at);
        rdma_conn_param p{};
        p.qp_num = 0x333;
        REQUIRE(rdma_connect(id, &p) == 0);
        return id;
    };
    rdma_cm_id* first = connect_one();
    rdma_cm_id* second = connect_one();  // the backlog of 1 holds the first, not yet read
    rdma_cm_event* e = expect(client.ch, RDMA_CM_EVENT_UNREACHABLE);
    CHECK(e->id == second);
    CHECK(e->status == -ETIMEDOUT);
    rdma_ack_cm_event(e);
    rdma_cm_event* req = expect(server.ch, RDMA_CM_EVENT_CONNECT_REQUEST);
    rdma_cm_id* child = req->id;
    rdma_ack_cm_event(req);
    const char why[] = "busy";
    REQUIRE(rdma_reject(child, why, sizeof(why)) == 0);
    e = expect(client.ch, RDMA_CM_EVENT_REJECTED);
    CHECK(e->id == first);
    CHECK(e->status == 28);  // IB CM: consumer defined
    REQUIRE(e->param.conn.private_data_len >= sizeof(why));
    CHECK(std::memcmp(e->param.conn.private_data, why, sizeof(why)) == 0);
    rdma_ack_cm_event(e);
    rdma_destroy_id(child);
    rdma_destroy_id(first);
    rdma_destroy_id(second);
    rdma_destroy_id(listen);
}

TEST_CASE("rdma_migrate_id moves an id and its waiting events to another channel") {
    Channel from, to;
    rdma_cm_id* id = new_id(from.ch);
    auto dst = v4("10.0.0.1", 7475);
    REQUIRE(rdma_resolve_addr(id, nullptr, reinterpret_cast<sockaddr*>(&dst), 2000) == 0);
    REQUIRE(readable(from.ch, 5000));
    REQUIRE(rdma_migrate_id(id, to.ch) == 0);
    CHECK_FALSE(readable(from.ch));
    rdma_cm_event* e = expect(to.ch, RDMA_CM_EVENT_ADDR_RESOLVED);
    CHECK(e->id == id);
    rdma_ack_cm_event(e);
    rdma_destroy_id(id);
}

namespace {

// The kernel's UCMA ABI (include/rdma/rdma_user_cm.h, which clashes with
// librdmacm's header): the two commands written by hand below.
struct UcmaHdr {
    uint32_t cmd;  // 0: CREATE_ID, 1: DESTROY_ID, 7: LISTEN
    uint16_t in, out;
};
struct UcmaCreateId {
    uint64_t uid, response;
    uint16_t ps;
    uint8_t qp_type;
    uint8_t reserved[5];
};
struct UcmaDestroyId {
    uint64_t response;
    uint32_t id, reserved;
};

// A UCMA command written to the device by hand, as a hostile program
// would: CREATE_ID (the shim's handle comes back) and DESTROY_ID.
uint32_t raw_create(int fd) {
    struct {
        UcmaHdr hdr;
        UcmaCreateId body;
    } cmd{};
    uint32_t resp = 0;
    cmd.hdr.cmd = 0;
    cmd.hdr.in = sizeof(cmd.body);
    cmd.hdr.out = sizeof(resp);
    cmd.body.uid = 1;
    cmd.body.response = reinterpret_cast<uintptr_t>(&resp);
    cmd.body.ps = RDMA_PS_TCP;
    cmd.body.qp_type = IBV_QPT_RC;
    if (write(fd, &cmd, sizeof(cmd)) != ssize_t(sizeof(cmd))) return 0;
    return resp;
}

int raw_destroy(int fd, uint32_t handle) {
    struct {
        UcmaHdr hdr;
        UcmaDestroyId body;
    } cmd{};
    uint32_t resp = 0;  // events_reported
    cmd.hdr.cmd = 1;
    cmd.hdr.in = sizeof(cmd.body);
    cmd.hdr.out = sizeof(resp);
    cmd.body.response = reinterpret_cast<uintptr_t>(&resp);
    cmd.body.id = handle;
    return write(fd, &cmd, sizeof(cmd)) == ssize_t(sizeof(cmd)) ? 0 : errno;
}

}  // namespace

TEST_CASE("an id is reached only through its own channel") {
    Channel mine, other;
    const uint32_t h = raw_create(mine.ch->fd);
    REQUIRE(h != 0);
    CHECK(raw_destroy(other.ch->fd, h) == ENOENT);  // another channel (another process's, say)
    CHECK(raw_destroy(other.ch->fd, h + 1) == ENOENT);
    CHECK(raw_destroy(mine.ch->fd, h) == 0);
    CHECK(raw_destroy(mine.ch->fd, h) == ENOENT);  // gone
}

TEST_CASE("a guest holds at most 4096 ids; a malformed command is refused") {
    Channel c;
    std::vector<uint32_t> made;
    uint32_t h;
    while (made.size() < 5000 && (h = raw_create(c.ch->fd)) != 0) made.push_back(h);
    CHECK(made.size() <= 4096);
    CHECK(made.size() >= 4000);  // the rest are the other test cases' and librdmacm's
    CHECK(errno == ENOMEM);
    for (uint32_t id : made) raw_destroy(c.ch->fd, id);
    CHECK(raw_create(c.ch->fd) != 0);  // given back

    uint8_t junk[4] = {1, 2, 3, 4};
    errno = 0;
    CHECK(write(c.ch->fd, junk, sizeof(junk)) == -1);  // shorter than a header
    CHECK(errno == EINVAL);
    struct {
        UcmaHdr hdr;
        uint8_t body[8];
    } big{};
    big.hdr.cmd = 7;  // LISTEN
    big.hdr.in = 4000;  // more than was written
    errno = 0;
    CHECK(write(c.ch->fd, &big, sizeof(big)) == -1);
    CHECK(errno == EINVAL);
}

TEST_CASE("a multicast join names the IP group's MGID; leave drops its unread event and waits for its ack") {
    Channel c;
    rdma_cm_id* id = new_id(c.ch, RDMA_PS_UDP);
    auto src = v4("10.0.0.1", 0), group = v4("230.5.6.7", 0);
    REQUIRE(rdma_resolve_addr(id, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&group), 2000) ==
            0);
    rdma_ack_cm_event(expect(c.ch, RDMA_CM_EVENT_ADDR_RESOLVED));
    int context = 0;
    REQUIRE(rdma_join_multicast(id, reinterpret_cast<sockaddr*>(&group), &context) == 0);
    rdma_cm_event* e = expect(c.ch, RDMA_CM_EVENT_MULTICAST_JOIN);
    CHECK(e->status == 0);
    CHECK(e->param.ud.private_data == &context);
    CHECK(e->param.ud.qp_num == 0xffffff);
    CHECK(e->param.ud.qkey == 0x01234567);  // RDMA_UDP_QKEY
    const ibv_ah_attr& ah = e->param.ud.ah_attr;
    CHECK(ah.is_global == 1);
    CHECK(ah.dlid >= 0xc000);
    CHECK(ah.dlid < 0xffff);
    // IPoIB's mapping with the rdma_cm signature of the UDP port space:
    // ff12:4001:ffff::, then the group's low 28 bits.
    const uint8_t mgid[16] = {0xff, 0x12, 0x40, 0x01, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0x06, 0x05, 0x06, 0x07};
    CHECK(std::memcmp(ah.grh.dgid.raw, mgid, 16) == 0);
    const uint16_t mlid = ah.dlid;

    // A second id joining the group gets the same MGID and MLID.
    rdma_cm_id* other = new_id(c.ch, RDMA_PS_UDP);
    REQUIRE(rdma_resolve_addr(other, reinterpret_cast<sockaddr*>(&src), reinterpret_cast<sockaddr*>(&group), 2000) ==
            0);
    rdma_ack_cm_event(expect(c.ch, RDMA_CM_EVENT_ADDR_RESOLVED));
    REQUIRE(rdma_join_multicast(other, reinterpret_cast<sockaddr*>(&group), nullptr) == 0);
    rdma_cm_event* e2 = expect(c.ch, RDMA_CM_EVENT_MULTICAST_JOIN);
    CHECK(std::memcmp(e2->param.ud.ah_attr.grh.dgid.raw, mgid, 16) == 0);
    CHECK(e2->param.ud.ah_attr.dlid == mlid);
    rdma_ack_cm_event(e2);

    // Leave waits for the ack of the join's event it reported.
    returns_after_ack([&] { return rdma_leave_multicast(id, reinterpret_cast<sockaddr*>(&group)); }, e);
    // Not joined (any more): librdmacm's own answer.
    errno = 0;
    CHECK(rdma_leave_multicast(id, reinterpret_cast<sockaddr*>(&group)) == -1);
    CHECK(errno == EADDRNOTAVAIL);

    // A join whose event was never read: leave drops the event and returns.
    REQUIRE(rdma_join_multicast(id, reinterpret_cast<sockaddr*>(&group), nullptr) == 0);
    REQUIRE(readable(c.ch, 5000));
    REQUIRE(rdma_leave_multicast(id, reinterpret_cast<sockaddr*>(&group)) == 0);
    CHECK_FALSE(readable(c.ch));
    // (librdmacm frees a join only when it is left, not with its id.)
    REQUIRE(rdma_leave_multicast(other, reinterpret_cast<sockaddr*>(&group)) == 0);
    REQUIRE(rdma_destroy_id(other) == 0);
    REQUIRE(rdma_destroy_id(id) == 0);
}

TEST_CASE("a multicast join needs a UD id with an address; a guest holds at most 1024 joins") {
    Channel c;
    auto src = v4("10.0.0.1", 0), group = v4("230.5.6.8", 0);
    // An id of the TCP port space (RC QPs) takes no multicast.
    rdma_cm_id* tcp = new_id(c.ch, RDMA_PS_TCP);
    REQUIRE(rdma_bind_addr(tcp, reinterpret_cast<sockaddr*>(&src)) == 0);
    errno = 0;
    CHECK(rdma_join_multicast(tcp, reinterpret_cast<sockaddr*>(&group), nullptr) == -1);
    CHECK(errno == EINVAL);
    REQUIRE(rdma_destroy_id(tcp) == 0);
    // A UD id with no address yet has no device to join on.
    rdma_cm_id* idle = new_id(c.ch, RDMA_PS_UDP);
    errno = 0;
    CHECK(rdma_join_multicast(idle, reinterpret_cast<sockaddr*>(&group), nullptr) == -1);
    CHECK(errno == EINVAL);
    // Bound to one of its addresses, it may; up to the guest's quota.
    REQUIRE(rdma_bind_addr(idle, reinterpret_cast<sockaddr*>(&src)) == 0);
    int refused = 0, err = 0;
    auto nth = [](int i) {
        auto g = v4("230.5.7.0", 0);
        g.sin_addr.s_addr = htonl(ntohl(g.sin_addr.s_addr) + uint32_t(i));
        return g;
    };
    for (int i = 0; i < 1025 && !refused; ++i) {
        auto g = nth(i);
        if (rdma_join_multicast(idle, reinterpret_cast<sockaddr*>(&g), nullptr) != 0) {
            refused = i;
            err = errno;
        }
    }
    CHECK(refused == 1024);
    CHECK(err == ENOMEM);
    // Leaving one gives its room back (each leave drops its unread event).
    auto first = nth(0);
    REQUIRE(rdma_leave_multicast(idle, reinterpret_cast<sockaddr*>(&first)) == 0);
    auto again = nth(2000);
    CHECK(rdma_join_multicast(idle, reinterpret_cast<sockaddr*>(&again), nullptr) == 0);
    REQUIRE(rdma_leave_multicast(idle, reinterpret_cast<sockaddr*>(&again)) == 0);
    for (int i = 1; i < refused; ++i) {
        auto g = nth(i);
        REQUIRE(rdma_leave_multicast(idle, reinterpret_cast<sockaddr*>(&g)) == 0);
    }
    REQUIRE(rdma_destroy_id(idle) == 0);
    CHECK_FALSE(readable(c.ch));
}

TEST_CASE("a guest listens on at most 256 ids at once") {
    Channel c;
    std::vector<rdma_cm_id*> ids;
    int refused = -1, err = 0;
    for (int i = 0; i < 257 && refused < 0; ++i) {
        rdma_cm_id* id = new_id(c.ch);
        ids.push_back(id);
        auto at = v4("10.0.0.1", uint16_t(20000 + i));
        REQUIRE(rdma_bind_addr(id, reinterpret_cast<sockaddr*>(&at)) == 0);
        if (rdma_listen(id, 4) != 0) {
            refused = i;
            err = errno;
        }
    }
    CHECK(refused == 256);
    CHECK(err == ENOMEM);
    // A listener destroyed gives its room back.
    REQUIRE(rdma_destroy_id(ids.front()) == 0);
    CHECK(rdma_listen(ids.back(), 4) == 0);
    for (size_t i = 1; i < ids.size(); ++i) REQUIRE(rdma_destroy_id(ids[i]) == 0);
}
