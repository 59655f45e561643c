// vrdma-event-waiter: a small client for the event integration tests
// (events_port.sh, events_shim_stop.sh). It opens vrdma0, prints "ready",
// then prints every async event it gets from ibv_get_async_event, one line
// each:
//
//   event PORT_ERR port 1 state DOWN     (port events: the element and the
//   event PORT_ACTIVE port 1 state ACTIVE  port state ibv_query_port gives)
//   event DEVICE_FATAL
//   event OTHER_NAME
//
// With --cq-wait a second thread also sleeps in ibv_get_cq_event on an armed
// CQ of a completion channel and prints "cq_event: failed (ERRNO TEXT)" when
// that fails. With --count N it exits 0 after N events. Otherwise it waits
// until ibv_get_async_event fails, prints "async_event: failed (ERRNO TEXT)"
// and exits 1 (2 if no DEVICE_FATAL came before the failure).
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

namespace {
const char* port_state(ibv_port_state s) {
    switch (s) {
    case IBV_PORT_DOWN: return "DOWN";
    case IBV_PORT_INIT: return "INIT";
    case IBV_PORT_ARMED: return "ARMED";
    case IBV_PORT_ACTIVE: return "ACTIVE";
    default: return "OTHER";
    }
}

const char* short_name(ibv_event_type t) {
    switch (t) {
    case IBV_EVENT_PORT_ERR: return "PORT_ERR";
    case IBV_EVENT_PORT_ACTIVE: return "PORT_ACTIVE";
    case IBV_EVENT_DEVICE_FATAL: return "DEVICE_FATAL";
    case IBV_EVENT_QP_FATAL: return "QP_FATAL";
    case IBV_EVENT_COMM_EST: return "COMM_EST";
    default: return ibv_event_type_str(t);
    }
}
}  // namespace

int main(int argc, char** argv) {
    bool cq_wait = false;
    long count = -1;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--cq-wait") {
            cq_wait = true;
        } else if (a == "--count" && i + 1 < argc) {
            count = std::strtol(argv[++i], nullptr, 10);
        } else {
            fprintf(stderr, "usage: vrdma-event-waiter [--cq-wait] [--count N]\n");
            return 64;
        }
    }
    setvbuf(stdout, nullptr, _IOLBF, 0);
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ibv_context* ctx = nullptr;
    for (int i = 0; list && i < n && !ctx; ++i)
        if (std::string(ibv_get_device_name(list[i])) == "vrdma0") ctx = ibv_open_device(list[i]);
    if (list) ibv_free_device_list(list);
    if (!ctx) {
        fprintf(stderr, "vrdma-event-waiter: cannot open vrdma0\n");
        return 64;
    }
    ibv_comp_channel* ch = nullptr;
    ibv_cq* cq = nullptr;
    std::thread cq_thread;
    if (cq_wait) {
        ch = ibv_create_comp_channel(ctx);
        cq = ch ? ibv_create_cq(ctx, 16, nullptr, ch, 0) : nullptr;
        if (!cq || ibv_req_notify_cq(cq, 0)) {
            fprintf(stderr, "vrdma-event-waiter: cannot set up a completion channel: %s\n", strerror(errno));
            return 64;
        }
        cq_thread = std::thread([ch] {
            ibv_cq* got = nullptr;
            void* c = nullptr;
            if (ibv_get_cq_event(ch, &got, &c) == 0) {
                printf("cq_event: unexpected success\n");
                ibv_ack_cq_events(got, 1);
            } else {
                int e = errno;
                printf("cq_event: failed (%d %s)\n", e, strerror(e));
            }
        });
    }
    printf("ready\n");
    bool fatal = false;
    for (long seen = 0; count < 0 || seen < count; ++seen) {
        ibv_async_event ev{};
        if (ibv_get_async_event(ctx, &ev)) {
            int e = errno;
            printf("async_event: failed (%d %s)\n", e, strerror(e));
            if (cq_thread.joinable()) cq_thread.join();  // it must fail as well, and soon
            fflush(stdout);
            _exit(fatal ? 1 : 2);  // the shim is gone: no orderly teardown
        }
        ibv_event_type t = ev.event_type;
        if (t == IBV_EVENT_PORT_ERR || t == IBV_EVENT_PORT_ACTIVE) {
            int port = ev.element.port_num;
            ibv_port_attr pa{};
            const char* st = ibv_query_port(ctx, uint8_t(port), &pa) == 0 ? port_state(pa.state) : "UNKNOWN";
            printf("event %s port %d state %s\n", short_name(t), port, st);
        } else {
            printf("event %s\n", short_name(t));
        }
        if (t == IBV_EVENT_DEVICE_FATAL) fatal = true;
        ibv_ack_async_event(&ev);
    }
    if (cq_thread.joinable()) {  // still asleep in ibv_get_cq_event: no teardown under it
        fflush(stdout);
        _exit(0);
    }
    if (cq) ibv_destroy_cq(cq);
    if (ch) ibv_destroy_comp_channel(ch);
    ibv_close_device(ctx);
    return 0;
}
