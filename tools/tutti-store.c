/* tutti-store: a standalone TCP store server for ranks that have no process to host one.
 *
 *   tutti-store [--host H] --port P [--auth-token-file PATH] [limits]
 *
 * Listens on loopback unless given --host: a store reachable from elsewhere lets anyone
 * who can reach it steer the job, so that takes a decision (and, better, a job secret).
 * Runs until SIGINT or SIGTERM, then stops accepting and lets connected clients finish.
 * Exit status: 0 after a signal, 1 when it cannot listen (or read its secret), 2 on bad
 * usage (options the store refuses included). */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tutti/store.h>

#include "cli.h"

static void usage(FILE *f, const char *argv0)
{
    fprintf(f,
            "usage: %s [--host H] --port P [--auth-token-file PATH] [limits]\n"
            "\n"
            "Run a tutti TCP store server until SIGINT or SIGTERM.\n"
            "\n"
            "  -H, --host H               address to listen on (default 127.0.0.1: this host\n"
            "                             only; 0.0.0.0 or \"::\" for every interface; an IPv6\n"
            "                             address bare or in brackets: ::1 or [::1])\n"
            "  -p, --port P               TCP port (0 picks a free one, printed at start)\n"
            "  -a, --auth-token-file PATH the job secret: serve only clients that prove they\n"
            "                             know it (also TUTTI_AUTH_TOKEN[_FILE])\n"
            "      --idle-timeout-ms MS   close connections idle this long (0: never; default\n"
            "                             300000; TUTTI_STORE_IDLE_TIMEOUT_MS)\n"
            "      --max-connections N    evict the idlest connection beyond N (default: 3/4\n"
            "                             of the fd limit; TUTTI_STORE_MAX_CONNECTIONS)\n"
            "      --client-quota SIZE    bytes one client may have buffered (default 64M+64K;\n"
            "                             TUTTI_STORE_CLIENT_QUOTA)\n"
            "      --memory-limit SIZE    bytes all clients may have buffered (default twice\n"
            "                             the quota; TUTTI_STORE_MEMORY_LIMIT)\n"
            "  -h, --help                 show this help\n"
            "\n"
            "Ranks connect with the store URL tcp://H:P (tcp://[H]:P for IPv6).\n"
            "Exit status: 0 after a signal, 1 when the address cannot be used or the secret\n"
            "cannot be read, 2 on bad usage (a malformed address or option included).\n",
            argv0);
}

static int is_loopback(const char *host)
{
    return !strncmp(host, "127.", 4) || !strcmp(host, "::1") || !strcmp(host, "localhost");
}

/* Returns -1 when the command line asks to serve, else the exit status (0 for --help,
 * 2 for bad usage). */
static int parse_args(int argc, char **argv, tutti_store_opts_t *opts_p, const char **host_p,
                      long *port_p)
{
    enum { OPT_IDLE = 256, OPT_MAXCONN, OPT_QUOTA, OPT_MEMORY };
    static const struct option longopts[] = {
        { "host", required_argument, NULL, 'H' },
        { "port", required_argument, NULL, 'p' },
        { "auth-token-file", required_argument, NULL, 'a' },
        { "idle-timeout-ms", required_argument, NULL, OPT_IDLE },
        { "max-connections", required_argument, NULL, OPT_MAXCONN },
        { "client-quota", required_argument, NULL, OPT_QUOTA },
        { "memory-limit", required_argument, NULL, OPT_MEMORY },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    tutti_store_opts_init(opts_p);
    opts_p->timeout_ms = 10000;
    opts_p->is_server = 1;
    *host_p = "127.0.0.1";
    *port_p = -1;
    long v;
    int opt;
    while ((opt = getopt_long(argc, argv, "H:p:a:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'H': {
            /* [v6addr] as in URLs and -H of tutti-run: the brackets are the URL's to add */
            static char host[256];
            size_t len = strlen(optarg);
            const char *h = optarg;
            if (len >= 2 && h[0] == '[' && h[len - 1] == ']')
                h++, len -= 2;
            if (len == 0 || len >= sizeof(host) || memchr(h, '[', len) || memchr(h, ']', len) ||
                strpbrk(optarg, " \t/@")) {
                fprintf(stderr, "%s: bad host '%s' (a name or an address: 10.0.0.1, ::1, [::1])\n",
                        argv[0], optarg);
                return 2;
            }
            memcpy(host, h, len);
            host[len] = '\0';
            *host_p = host;
            break;
        }
        case 'p':
            if (tt_cli_long(optarg, 0, 65535, port_p) < 0) {
                fprintf(stderr, "%s: bad port '%s' (0..65535)\n", argv[0], optarg);
                return 2;
            }
            break;
        case 'a':
            /* a file named here wins over a token in the environment */
            opts_p->auth_token = NULL;
            opts_p->auth_token_file = optarg;
            break;
        case OPT_IDLE:
        case OPT_MAXCONN:
            if (tt_cli_long(optarg, 0, 1L << 30, &v) < 0) {
                fprintf(stderr, "%s: bad number '%s'\n", argv[0], optarg);
                return 2;
            }
            *(opt == OPT_IDLE ? &opts_p->idle_timeout_ms : &opts_p->max_connections) = (int)v;
            break;
        case OPT_QUOTA:
        case OPT_MEMORY:
            if (tt_cli_size(optarg, opt == OPT_QUOTA ? &opts_p->client_quota_bytes
                                                     : &opts_p->memory_limit_bytes) < 0) {
                fprintf(stderr, "%s: bad size '%s' (like 4096, 64K, 1M, 2G)\n", argv[0], optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout, argv[0]); return 0;
        default: usage(stderr, argv[0]); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", argv[0], argv[optind]);
        usage(stderr, argv[0]);
        return 2;
    }
    if (*port_p < 0) {
        fprintf(stderr, "%s: --port is required\n", argv[0]);
        usage(stderr, argv[0]);
        return 2;
    }
    return -1;
}

/* Serve until SIGINT or SIGTERM; returns the exit status. */
static int serve(const char *argv0, const char *host, long port, const tutti_store_opts_t *opts)
{
    /* blocked before the server thread starts, so it inherits the mask and the signals
     * reach sigwait below */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigprocmask(SIG_BLOCK, &sigs, NULL);

    char url[320];
    snprintf(url, sizeof(url), strchr(host, ':') ? "tcp://[%s]:%ld" : "tcp://%s:%ld", host, port);
    tutti_store_t *store;
    int st = tutti_store_open(&store, url, opts);
    if (st < 0) {
        fprintf(stderr, "%s: cannot serve on %s port %ld: %s\n", argv0, host, port,
                tutti_store_last_error(NULL)[0] ? tutti_store_last_error(NULL)
                                                : tutti_strerror(st));
        /* options the store refuses (a limit below another, a malformed address) are bad
         * usage; an address that cannot be resolved or bound, or a secret that cannot be
         * read, is not */
        return st == TUTTI_ERR_INVALID_ARG ? 2 : 1;
    }
    if (!is_loopback(host) && !opts->auth_token && !opts->auth_token_file)
        fprintf(stderr,
                "%s: warning: listening on %s without a job secret: anyone who can "
                "reach this port can read and change the job's keys (--auth-token-file)\n",
                argv0, host);
    printf("tutti-store listening on %s\n", tutti_store_url(store));
    fflush(stdout);

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0)
        ;
    fprintf(stderr, "%s: %s, stopping\n", argv0, strsignal(sig));
    tutti_store_close(store);
    return 0;
}

int main(int argc, char **argv)
{
    tutti_store_opts_t opts;
    const char *host;
    long port;
    int st = parse_args(argc, argv, &opts, &host, &port);
    if (st >= 0)
        return st;
    if (opts.auth_token_file && getenv("TUTTI_AUTH_TOKEN"))
        unsetenv("TUTTI_AUTH_TOKEN"); /* the file given on the command line wins */
    return serve(argv[0], host, port, &opts);
}
