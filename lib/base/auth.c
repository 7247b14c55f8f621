/* SHA-256 (FIPS 180-4), HMAC (RFC 2104), the job secret and challenge answers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/auth.h"
#include "base/base.h"

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2
};

static inline uint32_t ror(uint32_t x, int n)
{
    return (x >> n) | (x << (32 - n));
}

static void sha256_block(uint32_t h[8], const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t s1 = ror(e, 6) ^ ror(e, 11) ^ ror(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = k + s1 + ch + K[i] + w[i];
        uint32_t s0 = ror(a, 2) ^ ror(a, 13) ^ ror(a, 22);
        uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        uint32_t t2 = s0 + maj;
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

void tt_sha256_init(tt_sha256_t *c)
{
    static const uint32_t iv[8] = { 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                    0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19 };
    memcpy(c->h, iv, sizeof(iv));
    c->bytes = 0;
    c->fill = 0;
}

void tt_sha256_update(tt_sha256_t *c, const void *data, size_t len)
{
    const uint8_t *p = data;
    c->bytes += len;
    if (c->fill) {
        size_t n = TT_MIN(len, 64 - c->fill);
        memcpy(c->buf + c->fill, p, n);
        c->fill += n, p += n, len -= n;
        if (c->fill < 64)
            return;
        sha256_block(c->h, c->buf);
        c->fill = 0;
    }
    for (; len >= 64; p += 64, len -= 64)
        sha256_block(c->h, p);
    memcpy(c->buf, p, len);
    c->fill = len;
}

void tt_sha256_final(tt_sha256_t *c, uint8_t out[TT_SHA256_LEN])
{
    uint64_t bits = c->bytes * 8;
    uint8_t pad[72] = { 0x80 };
    size_t padlen = (c->fill < 56 ? 56 : 120) - c->fill;
    for (int i = 0; i < 8; i++)
        pad[padlen + (size_t)i] = (uint8_t)(bits >> (56 - 8 * i));
    tt_sha256_update(c, pad, padlen + 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(c->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(c->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(c->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)c->h[i];
    }
}

void tt_hmac_sha256(const void *key, size_t keylen, const void *part1, size_t len1,
                    const void *part2, size_t len2, uint8_t out[TT_SHA256_LEN])
{
    uint8_t k[64] = { 0 }, pad[64], inner[TT_SHA256_LEN];
    tt_sha256_t c;
    if (keylen > 64) {
        tt_sha256_init(&c);
        tt_sha256_update(&c, key, keylen);
        tt_sha256_final(&c, k);
    } else if (keylen) {
        memcpy(k, key, keylen);
    }
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x36;
    tt_sha256_init(&c);
    tt_sha256_update(&c, pad, 64);
    tt_sha256_update(&c, part1, len1);
    if (len2)
        tt_sha256_update(&c, part2, len2);
    tt_sha256_final(&c, inner);
    for (int i = 0; i < 64; i++)
        pad[i] = k[i] ^ 0x5c;
    tt_sha256_init(&c);
    tt_sha256_update(&c, pad, 64);
    tt_sha256_update(&c, inner, sizeof(inner));
    tt_sha256_final(&c, out);
}

int tt_auth_equal(const void *a, const void *b, size_t n)
{
    const volatile uint8_t *x = a, *y = b;
    uint8_t d = 0;
    for (size_t i = 0; i < n; i++)
        d |= x[i] ^ y[i];
    return d == 0;
}

int tt_auth_random(void *buf, size_t n)
{
    uint8_t *p = buf;
    while (n) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return TUTTI_ERR_IO;
        p += r, n -= (size_t)r;
    }
    return TUTTI_OK;
}

int tt_auth_load_secret(const char *token, const char *token_file, char **secret_p, size_t *len_p,
                        char *err, size_t errlen)
{
    *secret_p = NULL;
    *len_p = 0;
    /* the options' init fills both fields from the environment: a field the caller then
     * set (it differs from the environment's value) wins over one the environment filled,
     * so a file given through the API beats a TUTTI_AUTH_TOKEN in the environment, as
     * any field set afterwards does; between two the caller set (or two from the
     * environment), the token wins */
    const char *env_tok = tt_env_set("AUTH_TOKEN"), *env_file = tt_env_set("AUTH_TOKEN_FILE");
    int file_own = token_file && !(env_file && !strcmp(token_file, env_file));
    int tok_own = token && !(env_tok && !strcmp(token, env_tok));
    const char *tok = token ? token : file_own ? NULL : env_tok;
    if (tok && file_own && !tok_own)
        tok = NULL;
    if (tok) {
        if (!*tok) {
            snprintf(err, errlen,
                     "the job secret (TUTTI_AUTH_TOKEN, or the auth_token option) is set but "
                     "empty: give one, or unset it for no secret");
            return TUTTI_ERR_CONFIG;
        }
        size_t n = strlen(tok);
        if (n > TT_AUTH_MAX_SECRET) {
            snprintf(err, errlen, "the job secret is longer than %d bytes", TT_AUTH_MAX_SECRET);
            return TUTTI_ERR_CONFIG;
        }
        if (!(*secret_p = tt_strdup(tok)))
            return TUTTI_ERR_NOMEM;
        *len_p = n;
        return TUTTI_OK;
    }
    const char *path = token_file ? token_file : env_file;
    if (!path)
        return TUTTI_OK;
    if (!*path) {
        snprintf(err, errlen,
                 "the job secret's file (TUTTI_AUTH_TOKEN_FILE) is set but empty: "
                 "name a file, or unset it for no secret");
        return TUTTI_ERR_CONFIG;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot read the job secret TUTTI_AUTH_TOKEN_FILE=%s: %s", path,
                 strerror(errno));
        return TUTTI_ERR_CONFIG;
    }
    char *buf = malloc(TT_AUTH_MAX_SECRET + 2);
    if (!buf) {
        fclose(f);
        return TUTTI_ERR_NOMEM;
    }
    size_t n = fread(buf, 1, TT_AUTH_MAX_SECRET + 1, f);
    int rerr = ferror(f);
    fclose(f);
    if (n && buf[n - 1] == '\n')
        n--;
    if (n && buf[n - 1] == '\r')
        n--;
    const char *why = rerr                     ? "read error"
                      : n == 0                 ? "it is empty"
                      : n > TT_AUTH_MAX_SECRET ? "it is longer than 4096 bytes"
                                               : NULL;
    if (why) {
        snprintf(err, errlen, "the job secret TUTTI_AUTH_TOKEN_FILE=%s: %s", path, why);
        free(buf);
        return TUTTI_ERR_CONFIG;
    }
    buf[n] = '\0';
    *secret_p = buf;
    *len_p = n;
    return TUTTI_OK;
}

void tt_auth_answer(const void *secret, size_t secret_len, const char *context,
                    const uint8_t challenge[TT_AUTH_CHALLENGE_LEN], uint8_t answer[TT_SHA256_LEN])
{
    size_t clen = strlen(context);
    uint8_t msg[11 + 512 + 1 + TT_AUTH_CHALLENGE_LEN];
    if (clen > 512)
        clen = 512;
    memcpy(msg, "tutti-auth", 11); /* with its NUL */
    memcpy(msg + 11, context, clen);
    msg[11 + clen] = 0;
    memcpy(msg + 12 + clen, challenge, TT_AUTH_CHALLENGE_LEN);
    tt_hmac_sha256(secret, secret_len, msg, 12 + clen + TT_AUTH_CHALLENGE_LEN, NULL, 0, answer);
}
