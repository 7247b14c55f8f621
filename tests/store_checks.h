/* Assertions on store calls, with the store's own explanation in the failure message;
 * raw sockets to a store server (connect, wait for it to close). */
#ifndef TH_STORE_CHECKS_H
#define TH_STORE_CHECKS_H

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <tutti/store.h>

#include "harness.h"

#define OK(s, call)                                                                                \
    do {                                                                                           \
        int st_ = (call);                                                                          \
        ck_assert_msg(st_ == 0, "%s -> %s: %s", #call, tutti_status_name(st_),                     \
                      tutti_store_last_error(s));                                                  \
    } while (0)

#define EXPECT(s, call, want)                                                                      \
    do {                                                                                           \
        int st_ = (call);                                                                          \
        ck_assert_msg(st_ == (want), "%s -> %s, wanted %s: %s", #call, tutti_status_name(st_),     \
                      tutti_status_name(want), tutti_store_last_error(s));                         \
    } while (0)

/* A TCP connection to ip:port with a 3 s receive timeout (and a receive buffer of rcvbuf
 * bytes, 0: the default); -errno when connect fails. */
static inline int raw_connect_buf(const char *ip, int port, int rcvbuf)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    if (rcvbuf) /* before connect: the window is set then */
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
    inet_pton(AF_INET, ip, &a.sin_addr);
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    struct timeval tv = { 3, 0 };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* raw_connect_buf with the default receive buffer. */
static inline int raw_connect_to(const char *ip, int port)
{
    return raw_connect_buf(ip, port, 0);
}

/* raw_connect_to 127.0.0.1, which must succeed. */
static inline int raw_connect(int port)
{
    int fd = raw_connect_to("127.0.0.1", port);
    ck_assert_msg(fd >= 0, "connect: %s", strerror(-fd));
    return fd;
}

/* 1 when the server closed fd (EOF or reset) within 3 s; bytes it sends first are read
 * past when replies_ok, else they make it 0 (it must close without replying). */
static inline int raw_closed(int fd, int replies_ok)
{
    char buf[256];
    for (;;) {
        ssize_t r = recv(fd, buf, sizeof(buf), 0);
        if (r == 0 || (r < 0 && errno == ECONNRESET))
            return 1;
        if (r < 0 && errno == EINTR)
            continue;
        if (r > 0 && replies_ok)
            continue;
        return 0;
    }
}

/* The standalone store server. */
#ifdef TT_BUILD_DIR
#define TH_STORE_TOOL TT_BUILD_DIR "/tools/tutti-store"
#else
#define TH_STORE_TOOL "tools/tutti-store"
#endif

/* Start the tool with args (args[0] is its path); the first line it prints (up to 5 s)
 * into line; its port from that line, 0 if it printed none. */
static inline int tool_start(const char *const *args, pid_t *pid_p, char *line, size_t linelen)
{
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        dup2(p[1], 1);
        close(p[0]);
        execv(args[0], (char *const *)args);
        _exit(127);
    }
    close(p[1]);
    size_t n = 0;
    line[0] = '\0';
    double end = th_now_ms() + 5000;
    while (n < linelen - 1 && !strchr(line, '\n') && th_now_ms() < end) {
        struct pollfd pf = { p[0], POLLIN, 0 };
        if (poll(&pf, 1, 100) <= 0)
            continue;
        ssize_t r = read(p[0], line + n, linelen - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
        line[n] = '\0';
    }
    close(p[0]);
    *pid_p = pid;
    const char *colon = strrchr(line, ':');
    return colon ? atoi(colon + 1) : 0;
}

#endif
