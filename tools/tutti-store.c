/* tutti-store: a standalone TCP store server for ranks that have no process to host one.
 *
 *   tutti-store [--host H] --port P
 *
 * Runs until SIGINT or SIGTERM. Exit status: 0 after a signal, 1 when it cannot listen,
 * 2 on bad usage. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tutti/store.h>

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [--host H] --port P\n"
            "\n"
            "Run a tutti TCP store server until SIGINT or SIGTERM.\n"
            "\n"
            "  -H, --host H   address to listen on (default 0.0.0.0; \"::\" for IPv6)\n"
            "  -p, --port P   TCP port (0 picks a free one, printed at start)\n"
            "  -h, --help     show this help\n"
            "\n"
            "Ranks connect with the store URL tcp://H:P (tcp://[H]:P for IPv6).\n"
            "Exit status: 0 after a signal, 1 when the address cannot be used, 2 on bad "
            "usage.\n",
            argv0);
}

static int parse_port(const char *s, int *port_p)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > 65535)
        return -1;
    *port_p = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"host", required_argument, NULL, 'H'},
        {"port", required_argument, NULL, 'p'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *host = "0.0.0.0";
    int port = -1, opt;
    while ((opt = getopt_long(argc, argv, "H:p:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'H':
            host = optarg;
            break;
        case 'p':
            if (parse_port(optarg, &port) < 0) {
                fprintf(stderr, "%s: bad port '%s' (0..65535)\n", argv[0], optarg);
                return 2;
            }
            break;
        case 'h':
            usage(stdout, argv[0]);
            return 0;
        default:
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", argv[0], argv[optind]);
        usage(stderr, argv[0]);
        return 2;
    }
    if (port < 0) {
        fprintf(stderr, "%s: --port is required\n", argv[0]);
        usage(stderr, argv[0]);
        return 2;
    }

    /* blocked before the server thread starts, so it inherits the mask and the signals
     * reach sigwait below */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigprocmask(SIG_BLOCK, &sigs, NULL);

    tutti_store_t *store;
    int st = tutti_store_open_tcp(&store, host, port, 1, 10000);
    if (st < 0) {
        fprintf(stderr, "%s: cannot serve on %s port %d: %s\n", argv[0], host, port,
                tutti_store_last_error(NULL)[0] ? tutti_store_last_error(NULL)
                                                : tutti_strerror(st));
        return 1;
    }
    printf("tutti-store listening on %s\n", tutti_store_url(store));
    fflush(stdout);

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0)
        ;
    fprintf(stderr, "%s: %s, stopping\n", argv[0], strsignal(sig));
    tutti_store_close(store);
    return 0;
}
