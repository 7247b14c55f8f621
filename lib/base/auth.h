/* Job secrets and message authentication (internal).
 *
 * A job may carry a secret (TUTTI_AUTH_TOKEN, or TUTTI_AUTH_TOKEN_FILE naming a file whose
 * content is the secret). Whoever must prove membership of the job (a store client, a
 * transport hello) answers a fresh random challenge with HMAC-SHA256(secret, context ||
 * challenge): the secret itself never travels. Peers check answers with tt_auth_equal
 * (constant time).
 */
#ifndef TT_AUTH_H
#define TT_AUTH_H

#include <stddef.h>
#include <stdint.h>

#define TT_SHA256_LEN 32
#define TT_AUTH_CHALLENGE_LEN 32
#define TT_AUTH_MAX_SECRET 4096

typedef struct tt_sha256 {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t buf[64];
    size_t fill;
} tt_sha256_t;

void tt_sha256_init(tt_sha256_t *c);
void tt_sha256_update(tt_sha256_t *c, const void *data, size_t len);
void tt_sha256_final(tt_sha256_t *c, uint8_t out[TT_SHA256_LEN]);

/* HMAC-SHA256(key, part1 || part2); part2 may be NULL with len2 0. */
void tt_hmac_sha256(const void *key, size_t keylen, const void *part1, size_t len1,
                    const void *part2, size_t len2, uint8_t out[TT_SHA256_LEN]);

/* 1 if the n bytes at a and b are equal; time independent of where they differ. */
int tt_auth_equal(const void *a, const void *b, size_t n);

/* n unpredictable bytes (getrandom); TUTTI_ERR_IO if the kernel has none. */
int tt_auth_random(void *buf, size_t n);

/* The job secret: token, else the content of token_file (one trailing newline
 * dropped); each NULL is taken from TUTTI_AUTH_TOKEN / TUTTI_AUTH_TOKEN_FILE. *secret_p
 * is malloc'ed (NULL when there is no secret: authentication off) and *len_p its
 * length. A file that cannot be read, or an empty secret, is TUTTI_ERR_CONFIG with the
 * reason in err. */
int tt_auth_load_secret(const char *token, const char *token_file, char **secret_p, size_t *len_p,
                        char *err, size_t errlen);

/* The answer to a challenge: HMAC-SHA256(secret, "tutti-auth\0" || context || '\0' ||
 * challenge). context names what is being proved ("store", "tcp-hello 3->1 <instance>")
 * so an answer cannot be replayed elsewhere. */
void tt_auth_answer(const void *secret, size_t secret_len, const char *context,
                    const uint8_t challenge[TT_AUTH_CHALLENGE_LEN], uint8_t answer[TT_SHA256_LEN]);

#endif /* TT_AUTH_H */
