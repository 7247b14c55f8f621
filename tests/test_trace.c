/* The flight recorder: tutti_comm_trace_dump lists the calls each rank made, in order,
 * with the arguments the test passed (collectives, sends, receives, a receive from any
 * source with the sender it matched); a small ring keeps the last calls only; none are
 * kept with trace_entries 0; with a trace_dir, ranks whose communicator failed write
 * their record, and an idle rank whose peers failed writes its own (the one that never
 * made the call the others timed out in). tools/tutti-trace's reading of such records is
 * python/tests/test_trace.py. */
#include <check.h>
#include <fcntl.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <tutti/tutti.h>

#include "harness.h"

/* The record as a string (malloc'ed), through a memfd. */
static char *dump_of(tutti_comm_t *comm, int *st_p)
{
    int fd = memfd_create("trace", MFD_CLOEXEC);
    if (fd < 0)
        return NULL;
    *st_p = tutti_comm_trace_dump(comm, fd);
    off_t len = lseek(fd, 0, SEEK_END);
    char *s = len >= 0 ? malloc((size_t)len + 1) : NULL;
    if (s && pread(fd, s, (size_t)len, 0) != len) {
        free(s);
        s = NULL;
    }
    if (s)
        s[len] = '\0';
    close(fd);
    return s;
}

/* The op lines of a record (one "{\"id\": ...}" per line, the trailing comma cut), in
 * order, pointing into doc (which they cut into lines); n set. */
static char **op_lines(char *doc, int *n)
{
    char **lines = calloc(4096, sizeof(char *)), *save = NULL;
    *n = 0;
    for (char *l = strtok_r(doc, "\n", &save); l && lines && *n < 4096;
         l = strtok_r(NULL, "\n", &save)) {
        if (strncmp(l, "{\"id\"", 5) != 0)
            continue;
        size_t len = strlen(l);
        if (len && l[len - 1] == ',')
            l[len - 1] = '\0';
        lines[(*n)++] = l;
    }
    return lines;
}

/* line has "key": value (value as it is written, strings with their quotes) */
static int has(const char *line, const char *key, const char *value)
{
    char want[256];
    snprintf(want, sizeof(want), "\"%s\": %s", key, value);
    const char *p = strstr(line, want);
    if (!p)
        return 0;
    char after = p[strlen(want)];
    return after == ',' || after == '}';
}

typedef struct expect {
    const char *op, *dtype, *state;
    const char *extra[3]; /* "key": value pairs that must be there too */
} expect_t;

static int check_line(int rank, const char *line, const expect_t *e, int i)
{
    char q[64];
    snprintf(q, sizeof(q), "\"%s\"", e->op);
    FAIL_IF(!has(line, "op", q), "op %d: want %s: %s", i, e->op, line);
    snprintf(q, sizeof(q), "\"%s\"", e->dtype);
    FAIL_IF(!has(line, "dtype", q), "op %d: want dtype %s: %s", i, e->dtype, line);
    snprintf(q, sizeof(q), "\"%s\"", e->state);
    FAIL_IF(!has(line, "state", q), "op %d: want state %s: %s", i, e->state, line);
    for (int k = 0; k < 3 && e->extra[k]; k++) {
        char key[64];
        const char *colon = strchr(e->extra[k], '=');
        snprintf(key, sizeof(key), "%.*s", (int)(colon - e->extra[k]), e->extra[k]);
        FAIL_IF(!has(line, key, colon + 1), "op %d: want %s: %s", i, e->extra[k], line);
    }
    return 0;
}

/* Calls of every kind, then the record holds them in order with their arguments. */
static int rank_records(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    float f[100];
    int32_t i7[7];
    double d5[5], g[3], gall[9];
    for (int k = 0; k < 100; k++)
        f[k] = (float)(k + rank);
    memset(i7, 0, sizeof(i7));
    for (int k = 0; k < 5; k++)
        d5[k] = rank * 10 + k;
    for (int k = 0; k < 3; k++)
        g[k] = rank + k * 0.5;
    FAIL_IF(nranks != 3, "3 ranks");
    FAIL_IF(tutti_allreduce(comm, f, f, 100, TUTTI_FP32, TUTTI_SUM) != 0, "allreduce");
    FAIL_IF(tutti_broadcast(comm, i7, i7, 7, TUTTI_INT32, 1) != 0, "broadcast");
    FAIL_IF(tutti_reduce(comm, d5, d5, 5, TUTTI_FP64, TUTTI_MAX, 2) != 0, "reduce");
    tutti_work_t *w;
    FAIL_IF(tutti_allgather_async(comm, g, gall, 3, TUTTI_FP64, &w) != 0, "allgather");
    FAIL_IF(tutti_wait(w, -1) != 0, "allgather: %s", tutti_work_error(w));
    tutti_work_free(w);
    /* point to point: 0 -> 1 tag 5; 1 -> 2 received from any source, tag 9 */
    int8_t b[4] = { 1, 2, 3, 4 };
    if (rank == 0)
        FAIL_IF(tutti_send(comm, b, 4, TUTTI_INT8, 1, 5) != 0, "send");
    if (rank == 1) {
        FAIL_IF(tutti_recv(comm, b, 4, TUTTI_INT8, 0, 5) != 0, "recv");
        FAIL_IF(tutti_send(comm, b, 2, TUTTI_INT8, 2, 9) != 0, "send 2");
    }
    if (rank == 2) {
        FAIL_IF(tutti_recv_async(comm, b, 2, TUTTI_INT8, TUTTI_ANY_SOURCE, 9, &w) != 0, "recv");
        FAIL_IF(tutti_wait(w, -1) != 0, "recv any: %s", tutti_work_error(w));
        FAIL_IF(tutti_work_source(w) != 1, "source %d", tutti_work_source(w));
        tutti_work_free(w);
    }
    FAIL_IF(tutti_barrier(comm) != 0, "barrier");

    int st = 0;
    char *doc = dump_of(comm, &st);
    FAIL_IF(!doc || st != 0, "dump: %d", st);
    char rk[32];
    snprintf(rk, sizeof(rk), "%d", rank);
    FAIL_IF(!has(doc, "rank", rk) || !has(doc, "size", "3") || !has(doc, "tutti_trace", "1") ||
                !has(doc, "reason", "\"request\"") || !has(doc, "entries", "1024") ||
                strstr(doc, "\"failed\""),
            "header: %.400s", doc);
    int n = 0;
    char **lines = op_lines(doc, &n);
    expect_t want[8];
    int nw = 0;
    want[nw++] = (expect_t){
        "allreduce", "f32", "completed", { "count=100", "redop=\"sum\"", "seq=0" }
    };
    want[nw++] = (expect_t){ "broadcast", "i32", "completed", { "count=7", "root=1", "seq=1" } };
    want[nw++] = (expect_t){
        "reduce", "f64", "completed", { "redop=\"max\"", "root=2", "bytes=40" }
    };
    want[nw++] = (expect_t){
        "allgather", "f64", "completed", { "count=9", "async=true", "seq=3" }
    };
    if (rank == 0)
        want[nw++] = (expect_t){ "send", "i8", "completed", { "peer=1", "tag=5", "count=4" } };
    if (rank == 1) {
        want[nw++] = (expect_t){ "recv", "i8", "completed", { "peer=0", "tag=5", "seq=0" } };
        want[nw++] = (expect_t){ "send", "i8", "completed", { "peer=2", "tag=9", "count=2" } };
    }
    if (rank == 2) /* the sender it matched, and that pair's first number */
        want[nw++] = (expect_t){ "recv", "i8", "completed", { "peer=1", "tag=9", "seq=0" } };
    want[nw++] = (expect_t){ "barrier", "u8", "completed", { "seq=4", NULL } };
    FAIL_IF(n != nw, "%d ops recorded, %d made: %s", n, nw, doc);
    for (int k = 0; k < n; k++)
        if (check_line(rank, lines[k], &want[k], k))
            return 1;
    /* the algorithms that ran are named, times are in order */
    FAIL_IF(!strstr(lines[0], "\"algo\": \""), "no algorithm: %s", lines[0]);
    long long t0 = 0, t1 = 0;
    const char *p = strstr(lines[0], "\"issued_us\": ");
    FAIL_IF(!p || sscanf(p, "\"issued_us\": %lld", &t0) != 1, "issued_us: %s", lines[0]);
    p = strstr(lines[n - 1], "\"ended_us\": ");
    FAIL_IF(!p || sscanf(p, "\"ended_us\": %lld", &t1) != 1, "ended_us: %s", lines[n - 1]);
    FAIL_IF(t0 <= 1700000000000000ll || t1 < t0, "times %lld %lld", t0, t1);
    free(lines);
    free(doc);
    /* a bad descriptor is an error, not a crash */
    FAIL_IF(tutti_comm_trace_dump(comm, -1) != TUTTI_ERR_INVALID_ARG, "fd -1");
    FAIL_IF(tutti_comm_trace_dump(NULL, 1) != TUTTI_ERR_INVALID_ARG, "NULL comm");
    int ro = open("/dev/null", O_RDONLY | O_CLOEXEC);
    FAIL_IF(tutti_comm_trace_dump(comm, ro) != TUTTI_ERR_IO, "read-only fd");
    close(ro);
    return 0;
}

START_TEST(records_every_call)
{
    th_spec_t spec = { .nranks = 3, .fn = rank_records, .timeout_ms = 60000 };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* A ring of 4 keeps the last 4 of 10 calls; trace_entries 0 keeps none. */
static int rank_ring(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)nranks;
    int entries = *(int *)arg;
    for (int k = 0; k < 10; k++) {
        int64_t x = k;
        FAIL_IF(tutti_allreduce(comm, &x, &x, 1, TUTTI_INT64, TUTTI_SUM) != 0, "allreduce");
    }
    int st = 0, n = 0;
    char *doc = dump_of(comm, &st);
    FAIL_IF(!doc || st != 0, "dump");
    char e[32];
    snprintf(e, sizeof(e), "%d", entries);
    FAIL_IF(!has(doc, "entries", e), "entries: %.300s", doc);
    int empty = strstr(doc, "\"ops\": [\n]") != NULL;
    char **lines = op_lines(doc, &n);
    if (entries == 0) {
        FAIL_IF(n != 0 || !empty, "recorded with 0 entries: %s", doc);
    } else {
        FAIL_IF(!has(doc, "recorded", "10"), "recorded: %.300s", doc);
        FAIL_IF(n != 4, "%d ops kept: %s", n, doc);
        for (int k = 0; k < 4; k++) {
            char id[16], seq[16];
            snprintf(id, sizeof(id), "%d", 7 + k);
            snprintf(seq, sizeof(seq), "%d", 6 + k);
            FAIL_IF(!has(lines[k], "id", id) || !has(lines[k], "seq", seq), "kept %d: %s", k,
                    lines[k]);
        }
    }
    free(lines);
    free(doc);
    return 0;
}

START_TEST(keeps_the_last)
{
    int entries = _i == 0 ? 4 : 0;
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.trace_entries = entries;
    th_spec_t spec = {
        .nranks = 2, .fn = rank_ring, .arg = &entries, .timeout_ms = 60000, .opts = &o
    };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* A receive open while more calls than the ring holds go by is still in the record
 * (listed from the open ops, "evicted"), and the header counts the collectives. */
static int rank_open(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)nranks;
    (void)arg;
    int32_t v = 0;
    tutti_work_t *w = NULL;
    int32_t u = 0;
    tutti_work_t *wa = NULL;
    if (rank == 1)
        FAIL_IF(tutti_recv_async(comm, &v, 1, TUTTI_INT32, TUTTI_ANY_SOURCE, 3, &w) != 0 ||
                    tutti_recv_async(comm, &u, 1, TUTTI_INT32, 0, TUTTI_ANY_TAG, &wa) != 0,
                "recv");
    for (int k = 0; k < 20; k++) {
        int64_t x = k;
        FAIL_IF(tutti_allreduce(comm, &x, &x, 1, TUTTI_INT64, TUTTI_SUM) != 0, "allreduce");
    }
    if (rank == 1) {
        int st = 0, n = 0;
        char *doc = dump_of(comm, &st);
        FAIL_IF(!doc || st != 0, "dump");
        FAIL_IF(!has(doc, "collectives", "20") || !has(doc, "recorded", "22"), "header: %.400s",
                doc);
        char **lines = op_lines(doc, &n);
        FAIL_IF(n != 10, "%d ops listed (8 kept, 2 open): %s", n, doc);
        FAIL_IF(!has(lines[8], "op", "\"recv\"") || !has(lines[8], "evicted", "true") ||
                    !has(lines[8], "any_source", "true") ||
                    !has(lines[8], "state", "\"started\"") || !has(lines[8], "tag", "3") ||
                    !has(lines[8], "id", "1"),
                "the open receive: %s", lines[8]);
        /* the any-tag one says so, not UINT32_MAX */
        FAIL_IF(!has(lines[9], "op", "\"recv\"") || !has(lines[9], "tag", "\"any\"") ||
                    !has(lines[9], "peer", "0") || !has(lines[9], "unnumbered", "true"),
                "the open any-tag receive: %s", lines[9]);
        free(lines);
        free(doc);
    }
    /* rank 0 sends only after rank 1's dump: a message that came sooner would complete
     * the receive before it (seen once: 8 ops listed) */
    FAIL_IF(tutti_barrier(comm) != 0, "barrier");
    if (rank == 0)
        FAIL_IF(tutti_send(comm, &(int32_t){ 7 }, 1, TUTTI_INT32, 1, 3) != 0 ||
                    tutti_send(comm, &(int32_t){ 8 }, 1, TUTTI_INT32, 1, 9) != 0,
                "send");
    if (rank == 1) {
        FAIL_IF(tutti_wait(w, -1) != 0 || v != 7, "recv: %s", tutti_work_error(w));
        FAIL_IF(tutti_wait(wa, -1) != 0 || u != 8, "any-tag recv: %s", tutti_work_error(wa));
        tutti_work_free(w);
        tutti_work_free(wa);
    }
    return 0;
}

START_TEST(lists_open_calls)
{
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.trace_entries = 8;
    th_spec_t spec = { .nranks = 2, .fn = rank_open, .timeout_ms = 60000, .opts = &o };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

/* Rank 2 skips the second allreduce: ranks 0 and 1 time out in it and write their
 * records; rank 2, outside the library, writes its own once it sees they failed, and
 * not before (the stall checks of ranks 0 and 1, a second into their wait, read the
 * count of failed ranks too, which makes its key exist at 0). */
static char trace_dir[256];

static int rank_skip(int rank, int nranks, tutti_comm_t *comm, const char *dir, void *arg)
{
    (void)dir;
    (void)nranks;
    (void)arg;
    int64_t x = rank;
    FAIL_IF(tutti_allreduce(comm, &x, &x, 1, TUTTI_INT64, TUTTI_SUM) != 0, "allreduce");
    if (rank == 2) {
        /* until its own record is there (bounded) */
        char pattern[512];
        snprintf(pattern, sizeof(pattern), "%s/a/b/*.rank2.json", trace_dir);
        for (int k = 0; k < 300; k++) {
            glob_t g;
            int found = glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc == 1;
            globfree(&g);
            if (found)
                return 0;
            th_sleep_ms(50);
        }
        FAIL_IF(1, "no record of rank 2 after 15 s");
    }
    int st = tutti_allreduce(comm, &x, &x, 1, TUTTI_INT64, TUTTI_SUM);
    FAIL_IF(st != TUTTI_ERR_TIMEOUT && st != TUTTI_ERR_PEER, "second allreduce: %d", st);
    return 0;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *s = calloc(1, 1 << 20);
    size_t n = s ? fread(s, 1, (1 << 20) - 1, f) : 0;
    (void)n;
    fclose(f);
    return s;
}

START_TEST(written_on_failure)
{
    snprintf(trace_dir, sizeof(trace_dir), "/tmp/tutti-trace-test-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(trace_dir));
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.timeout_ms = 3000;
    char sub[300]; /* made with its parents, as mkdir -p */
    snprintf(sub, sizeof(sub), "%s/a/b", trace_dir);
    o.trace_dir = sub;
    th_spec_t spec = { .nranks = 3, .fn = rank_skip, .timeout_ms = 60000, .opts = &o };
    int codes[3];
    long long failing_start = 0, idle_wrote = 0;
    int rc = th_run_ex(&spec, codes);
    char pattern[600], path[600];
    for (int r = 0; r < 3; r++) {
        snprintf(pattern, sizeof(pattern), "%s/a/b/*.rank%d.json", trace_dir, r);
        glob_t g;
        int got = glob(pattern, 0, NULL, &g) == 0 && g.gl_pathc == 1;
        ck_assert_msg(got, "no record of rank %d in %s", r, trace_dir);
        snprintf(path, sizeof(path), "%s", g.gl_pathv[0]);
        globfree(&g);
        char *doc = read_file(path);
        ck_assert_ptr_nonnull(doc);
        int n = 0;
        char **lines = op_lines(doc, &n);
        if (r < 2) {
            ck_assert_msg(has(doc, "reason", "\"failure\"") &&
                              strstr(doc, "\"failed\": \"TUTTI_ERR_"),
                          "rank %d: %.600s", r, doc);
            ck_assert_msg(n == 2 && has(lines[1], "seq", "1") &&
                              has(lines[1], "state", "\"failed\"") &&
                              has(lines[0], "state", "\"completed\""),
                          "rank %d ops: %s", r, doc);
            const char *p = strstr(lines[1], "\"started_us\": ");
            ck_assert(p && sscanf(p, "\"started_us\": %lld", &failing_start) == 1);
        } else {
            ck_assert_msg(has(doc, "reason", "\"a peer failed\"") && !strstr(doc, "\"failed\":"),
                          "rank 2: %.600s", doc);
            const char *p = strstr(doc, "\"time_us\": ");
            ck_assert(p && sscanf(p, "\"time_us\": %lld", &idle_wrote) == 1);
            ck_assert_msg(n == 1 && has(lines[0], "seq", "0") &&
                              has(lines[0], "state", "\"completed\""),
                          "rank 2 ops: %s", doc);
        }
        free(lines);
        free(doc);
    }
    /* after the timeout of ranks 0 and 1 (3 s; the coarse clock's 4 ms and a margin) */
    ck_assert_msg(idle_wrote - failing_start > 2900000, "rank 2 wrote %lld us after the call",
                  idle_wrote - failing_start);
    th_rmtree(trace_dir);
    ck_assert_int_eq(rc, 0);
}
END_TEST

/* A key space too long for a file name (TUTTI_PREFIX of 200 bytes): the record's name
 * kept its first 159 bytes, instance id and split suffix cut off, so a split and its
 * parent, or two runs, wrote one file and one rename replaced the other. Now each of
 * the four communicators (two runs, each a parent and its split, all aborted) writes its
 * own. */
static char long_dir[64];

static void split_and_abort(tutti_comm_t *comm, void *arg)
{
    (void)arg;
    tutti_comm_t *child = NULL;
    ck_assert_int_eq(tutti_comm_split(comm, 0, 0, &child), 0);
    ck_assert_int_eq(tutti_comm_abort(child), 0);
    ck_assert_int_eq(tutti_comm_abort(comm), 0);
    ck_assert_int_eq(tutti_comm_destroy(child), 0);
}

START_TEST(long_key_space_keeps_instances_apart)
{
    snprintf(long_dir, sizeof(long_dir), "/tmp/tutti-trace-long-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(long_dir));
    char prefix[201];
    memset(prefix, 'p', 200);
    prefix[200] = '\0';
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.prefix = prefix;
    o.trace_dir = long_dir;
    char err[512];
    for (int run = 0; run < 2; run++)
        ck_assert_msg(th_init_one(&o, err, sizeof(err), split_and_abort, NULL) == 0, "%s", err);
    char pattern[128];
    snprintf(pattern, sizeof(pattern), "%s/*.rank0.json", long_dir);
    glob_t g;
    int n = glob(pattern, 0, NULL, &g) == 0 ? (int)g.gl_pathc : 0;
    for (int i = 0; i < n; i++)
        ck_assert_msg(strlen(strrchr(g.gl_pathv[i], '/')) < 200, "%s", g.gl_pathv[i]);
    globfree(&g);
    th_rmtree(long_dir);
    ck_assert_msg(n == 4, "%d records for 4 communicators", n);
}
END_TEST

TH_CASES_MAIN("trace", 120, TH_CASE(records_every_call, 1), TH_CASE(keeps_the_last, 2),
              TH_CASE(lists_open_calls, 1), TH_CASE(written_on_failure, 1),
              TH_CASE(long_key_space_keeps_instances_apart, 1))
