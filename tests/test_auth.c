/* SHA-256 and HMAC-SHA256 against published vectors (FIPS 180-2 appendix B, RFC 4231),
 * the secret's sources, and challenge answers that depend on every input. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/auth.h"
#include "base/base.h"
#include "harness.h"
#include <tutti/store.h>
#include <tutti/tutti.h>

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

static void sha_hex(const void *data, size_t len, char out[65])
{
    tt_sha256_t c;
    uint8_t d[32];
    tt_sha256_init(&c);
    tt_sha256_update(&c, data, len);
    tt_sha256_final(&c, d);
    hex(d, 32, out);
}

START_TEST(sha256_vectors)
{
    char h[65];
    sha_hex("abc", 3, h);
    ck_assert_str_eq(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    sha_hex("", 0, h);
    ck_assert_str_eq(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    const char *m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
    sha_hex(m, strlen(m), h);
    ck_assert_str_eq(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    /* one million 'a', fed in uneven pieces (the buffering path) */
    char *a = malloc(1000000);
    memset(a, 'a', 1000000);
    tt_sha256_t c;
    uint8_t d[32];
    tt_sha256_init(&c);
    for (size_t off = 0, step = 1; off < 1000000; off += step, step = step * 3 % 997 + 1)
        tt_sha256_update(&c, a + off, off + step > 1000000 ? 1000000 - off : step);
    tt_sha256_final(&c, d);
    hex(d, 32, h);
    ck_assert_str_eq(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
}
END_TEST

START_TEST(hmac_vectors)
{
    uint8_t d[32];
    char h[65];
    /* RFC 4231 test case 2 */
    const char *data = "what do ya want for nothing?";
    tt_hmac_sha256("Jefe", 4, data, strlen(data), NULL, 0, d);
    hex(d, 32, h);
    ck_assert_str_eq(h, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    /* the same message in two parts */
    tt_hmac_sha256("Jefe", 4, data, 10, data + 10, strlen(data) - 10, d);
    hex(d, 32, h);
    ck_assert_str_eq(h, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    /* RFC 4231 test case 6: a 131-byte key (hashed first) */
    uint8_t key[131];
    memset(key, 0xaa, sizeof(key));
    const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
    tt_hmac_sha256(key, sizeof(key), m6, strlen(m6), NULL, 0, d);
    hex(d, 32, h);
    ck_assert_str_eq(h, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}
END_TEST

START_TEST(answers_bind_everything)
{
    uint8_t ch[TT_AUTH_CHALLENGE_LEN], ch2[TT_AUTH_CHALLENGE_LEN];
    ck_assert_int_eq(tt_auth_random(ch, sizeof(ch)), 0);
    ck_assert_int_eq(tt_auth_random(ch2, sizeof(ch2)), 0);
    ck_assert(!tt_auth_equal(ch, ch2, sizeof(ch))); /* 2^-256 */
    uint8_t a[32], b[32];
    tt_auth_answer("s3cret", 6, "store", ch, a);
    tt_auth_answer("s3cret", 6, "store", ch, b);
    ck_assert(tt_auth_equal(a, b, 32));
    tt_auth_answer("s3creT", 6, "store", ch, b);
    ck_assert(!tt_auth_equal(a, b, 32));
    tt_auth_answer("s3cret", 6, "stora", ch, b);
    ck_assert(!tt_auth_equal(a, b, 32));
    tt_auth_answer("s3cret", 6, "store", ch2, b);
    ck_assert(!tt_auth_equal(a, b, 32));
    /* the answer is HMAC over "tutti-auth\0" context "\0" challenge */
    uint8_t msg[11 + 5 + 1 + 32];
    memcpy(msg, "tutti-auth\0store\0", 17);
    memcpy(msg + 17, ch, 32);
    tt_hmac_sha256("s3cret", 6, msg, sizeof(msg), NULL, 0, b);
    ck_assert(tt_auth_equal(a, b, 32));
}
END_TEST

START_TEST(secret_sources)
{
    char err[256], *s;
    size_t n;
    unsetenv("TUTTI_AUTH_TOKEN");
    unsetenv("TUTTI_AUTH_TOKEN_FILE");
    ck_assert_int_eq(tt_auth_load_secret(NULL, NULL, &s, &n, err, sizeof(err)), 0);
    ck_assert_ptr_null(s);
    setenv("TUTTI_AUTH_TOKEN", "from-env", 1);
    ck_assert_int_eq(tt_auth_load_secret(NULL, NULL, &s, &n, err, sizeof(err)), 0);
    ck_assert_str_eq(s, "from-env");
    ck_assert_uint_eq(n, 8);
    free(s);
    ck_assert_int_eq(tt_auth_load_secret("explicit", NULL, &s, &n, err, sizeof(err)), 0);
    ck_assert_str_eq(s, "explicit");
    free(s);
    unsetenv("TUTTI_AUTH_TOKEN");
    char path[] = "/tmp/tt-auth-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "file-secret\n", 12), 12);
    close(fd);
    setenv("TUTTI_AUTH_TOKEN_FILE", path, 1);
    ck_assert_int_eq(tt_auth_load_secret(NULL, NULL, &s, &n, err, sizeof(err)), 0);
    ck_assert_str_eq(s, "file-secret");
    ck_assert_uint_eq(n, 11);
    free(s);
    unlink(path);
    ck_assert_int_eq(tt_auth_load_secret(NULL, NULL, &s, &n, err, sizeof(err)), TUTTI_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(err, path));
    ck_assert_int_eq(tt_auth_load_secret("", NULL, &s, &n, err, sizeof(err)), TUTTI_ERR_CONFIG);
    unsetenv("TUTTI_AUTH_TOKEN_FILE");
}
END_TEST

/* A secret set but empty, in TUTTI_AUTH_TOKEN or TUTTI_AUTH_TOKEN_FILE, fails closed:
 * TUTTI_ERR_CONFIG, for the communicator and for the store, naming the variable. It
 * was taken for unset (tt_env drops empty values): "TUTTI_AUTH_TOKEN= rank 0" and a rank
 * without a secret formed a communicator, unauthenticated, saying nothing. */
/* The options' init fills both fields from the environment; a file the caller then sets
 * wins over the environment's TUTTI_AUTH_TOKEN (it lost: a store server opened with
 * auth_token_file "fileB" accepted clients proving the environment's token instead). A
 * token the caller sets still wins over the environment's file, and over its own file. */
START_TEST(set_field_wins)
{
    char path[] = "/tmp/tt-auth-fileXXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "fileB\n", 6), 6);
    close(fd);
    setenv("TUTTI_AUTH_TOKEN", "envA", 1);
    unsetenv("TUTTI_AUTH_TOKEN_FILE");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    tutti_store_opts_t so;
    tutti_store_opts_init(&so);
    struct {
        const char *tok, *file, *want;
    } cases[] = {
        { o.auth_token, path, "fileB" },  /* the caller's file over the env's token */
        { so.auth_token, path, "fileB" }, /* the same through the store's options */
        { o.auth_token, NULL, "envA" },   /* nothing set: the environment's */
        { "mineC", path, "mineC" },       /* both set by the caller: the token */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char err[256] = "", *s = NULL;
        size_t n = 0;
        ck_assert_int_eq(tt_auth_load_secret(cases[i].tok, cases[i].file, &s, &n, err, sizeof(err)),
                         TUTTI_OK);
        ck_assert_msg(s && n == strlen(cases[i].want) && !memcmp(s, cases[i].want, n),
                      "case %zu: got '%.*s', want %s", i, (int)n, s ? s : "", cases[i].want);
        free(s);
    }
    /* the environment's file, the caller's token: the token */
    unsetenv("TUTTI_AUTH_TOKEN");
    setenv("TUTTI_AUTH_TOKEN_FILE", path, 1);
    tutti_comm_opts_init(&o);
    char err[256] = "", *s = NULL;
    size_t n = 0;
    ck_assert_int_eq(tt_auth_load_secret("mineD", o.auth_token_file, &s, &n, err, sizeof(err)),
                     TUTTI_OK);
    ck_assert_msg(s && n == 5 && !memcmp(s, "mineD", 5), "got '%.*s'", (int)n, s ? s : "");
    free(s);
    unsetenv("TUTTI_AUTH_TOKEN_FILE");
    unlink(path);
}
END_TEST

START_TEST(empty_secret_fails_closed)
{
    static const char *const vars[] = { "TUTTI_AUTH_TOKEN", "TUTTI_AUTH_TOKEN_FILE" };
    char dir[] = "/tmp/tt-auth-emptyXXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    for (int v = 0; v < 2; v++) {
        unsetenv("TUTTI_AUTH_TOKEN");
        unsetenv("TUTTI_AUTH_TOKEN_FILE");
        setenv(vars[v], "", 1);
        char err[256] = "", *s = NULL;
        size_t n = 0;
        ck_assert_int_eq(tt_auth_load_secret(NULL, NULL, &s, &n, err, sizeof(err)),
                         TUTTI_ERR_CONFIG);
        ck_assert_ptr_null(s);
        ck_assert_msg(strstr(err, vars[v]) && strstr(err, "empty"), "%s: %s", vars[v], err);
        /* the communicator: its options from the environment */
        tutti_store_t *store = NULL;
        ck_assert_int_eq(tutti_store_open_file(&store, dir, 5000), 0);
        tutti_comm_opts_t o;
        tutti_comm_opts_init(&o);
        tutti_comm_t *comm = NULL;
        int st = tutti_comm_init(&comm, store, 0, 1, &o);
        ck_assert_msg(st == TUTTI_ERR_CONFIG, "%s empty: comm init gave %s", vars[v],
                      tutti_status_name(st));
        ck_assert_ptr_null(comm);
        ck_assert_msg(strstr(tutti_comm_last_error(NULL), vars[v]), "%s",
                      tutti_comm_last_error(NULL));
        tutti_store_close(store);
        /* the store: a tcp server that would serve anyone */
        tutti_store_opts_t so;
        tutti_store_opts_init(&so);
        so.is_server = 1;
        st = tutti_store_open(&store, "tcp://127.0.0.1:0", &so);
        ck_assert_msg(st == TUTTI_ERR_CONFIG, "%s empty: store open gave %s", vars[v],
                      tutti_status_name(st));
        if (st == 0)
            tutti_store_close(store);
        ck_assert_msg(strstr(tutti_store_last_error(NULL), vars[v]), "%s",
                      tutti_store_last_error(NULL));
    }
    unsetenv("TUTTI_AUTH_TOKEN");
    unsetenv("TUTTI_AUTH_TOKEN_FILE");
    th_rmtree(dir);
}
END_TEST

/* Over shm and a file store, which check no secret themselves, ranks with different job
 * secrets (or one without) are refused all the same: the job record carries rank 0's
 * proof, which every rank checks against its own (session 100: before, such ranks formed
 * one job, the secret ignored). Per case, rank 0's secret and rank 1's ("" none). */
static const char *const secret_cases[][2] = {
    { "abc", "abc" }, { "abc", "xyz" }, { "", "abc" }, { "abc", "" }, { "", "" }
};

static int rank_secret(int rank, int nranks, tutti_comm_t *unused, const char *dir, void *arg)
{
    (void)unused;
    const char *const *c = arg;
    tutti_store_t *store = NULL;
    FAIL_IF(tutti_store_open_file(&store, dir, 20000) != 0, "store");
    tutti_comm_opts_t o;
    tutti_comm_opts_init(&o);
    o.transport = "shm";
    o.timeout_ms = 8000;
    o.auth_token = c[rank][0] ? c[rank] : NULL;
    o.auth_token_file = NULL;
    tutti_comm_t *comm = NULL;
    int st = tutti_comm_init(&comm, store, rank, nranks, &o);
    const int same = !strcmp(c[0], c[1]);
    if (same) {
        FAIL_IF(st != 0, "same secret: init: %s", tutti_comm_last_error(NULL));
        float x = (float)(rank + 1);
        FAIL_IF(tutti_allreduce(comm, TUTTI_IN_PLACE, &x, 1, TUTTI_FP32, TUTTI_SUM) != 0 || x != 3,
                "allreduce");
        tutti_comm_destroy(comm);
    } else {
        const char *why = tutti_comm_last_error(NULL);
        const char *want = !c[0][0]   ? "has no job secret, this rank has one"
                           : !c[1][0] ? "has a job secret, this rank none"
                                      : "has another job secret than this rank's";
        FAIL_IF(st != TUTTI_ERR_AUTH || !strstr(why, want) || !strstr(why, "TUTTI_AUTH_TOKEN"),
                "rank %d, secrets '%s' and '%s': init gave %s: %s", rank, c[0], c[1],
                tutti_status_name(st), why);
    }
    tutti_store_close(store);
    return 0;
}

START_TEST(secrets_checked_over_shm_and_file_store)
{
    th_spec_t spec = { .nranks = 2,
                       .fn = rank_secret,
                       .arg = (void *)secret_cases[_i],
                       .timeout_ms = 30000,
                       .flags = TH_NO_COMM | TH_NO_KILL_ON_FAIL };
    ck_assert_int_eq(th_run_ex(&spec, NULL), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("auth");
    th_add_tests(s, "auth", 30,
                 (const TTest *const[]){ sha256_vectors, hmac_vectors, answers_bind_everything,
                                         secret_sources, empty_secret_fails_closed, set_field_wins,
                                         NULL });
    TCase *tc = tcase_create("job");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, secrets_checked_over_shm_and_file_store, 0,
                        (int)(sizeof(secret_cases) / sizeof(secret_cases[0])));
    suite_add_tcase(s, tc);
    return th_main(s);
}
