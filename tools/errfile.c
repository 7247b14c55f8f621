/* tools/errfile.c: torch's error files (errfile.h). A small JSON reader: just what
 * finding a few keys of one object needs, bounded in depth and size. */
#include "errfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ERRFILE_MAX (16u << 20) /* a traceback is kilobytes; a bigger file is not one */
#define JS_DEPTH 64

typedef struct js {
    const char *p, *end;
} js_t;

static void js_ws(js_t *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
        j->p++;
}

static int js_hex4(const char *p, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        unsigned d = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
                     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
                     : c >= 'A' && c <= 'F' ? (unsigned)(c - 'A' + 10)
                                            : 16u;
        if (d > 15)
            return -1;
        *v = *v * 16 + d;
    }
    return 0;
}

static size_t js_utf8(unsigned cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | cp >> 12);
        o[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | cp >> 18);
    o[1] = (char)(0x80 | (cp >> 12 & 0x3f));
    o[2] = (char)(0x80 | (cp >> 6 & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

#define JS_BAD (-1) /* not JSON */
#define JS_OOM (-2)

/* A string at j->p ('"'), checked (no control character, escapes JSON's); its text
 * decoded into *out (malloc'd, *len_p its length: \u0000 may be in it) unless out is
 * NULL. 0, JS_BAD or JS_OOM. */
static int js_string(js_t *j, char **out, size_t *len_p)
{
    if (j->p >= j->end || *j->p != '"')
        return JS_BAD;
    const char *s = ++j->p;
    unsigned cp;
    while (j->p < j->end && *j->p != '"') { /* the end first: the text is never longer */
        if ((unsigned char)*j->p < 0x20)
            return JS_BAD;
        if (*j->p++ != '\\')
            continue;
        if (j->p >= j->end || !strchr("\"\\/bfnrtu", *j->p) || !*j->p)
            return JS_BAD;
        if (*j->p++ == 'u' && (j->end - j->p < 4 || js_hex4(j->p, &cp) < 0))
            return JS_BAD;
    }
    if (j->p >= j->end)
        return JS_BAD;
    const char *e = j->p++;
    if (!out)
        return 0;
    char *o = malloc((size_t)(e - s) + 1), *w = o;
    if (!o)
        return JS_OOM;
    for (const char *c = s; c < e; c++) {
        if (*c != '\\') {
            *w++ = *c;
            continue;
        }
        c++;
        switch (*c) {
        case '"': *w++ = '"'; break;
        case '\\': *w++ = '\\'; break;
        case '/': *w++ = '/'; break;
        case 'b': *w++ = '\b'; break;
        case 'f': *w++ = '\f'; break;
        case 'n': *w++ = '\n'; break;
        case 'r': *w++ = '\r'; break;
        case 't': *w++ = '\t'; break;
        case 'u': {
            unsigned lo;
            js_hex4(c + 1, &cp); /* checked above */
            c += 4;
            /* a surrogate pair is one code point; a lone half becomes U+FFFD */
            if (cp >= 0xd800 && cp < 0xdc00 && e - c >= 7 && c[1] == '\\' && c[2] == 'u' &&
                js_hex4(c + 3, &lo) == 0 && lo >= 0xdc00 && lo < 0xe000) {
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                c += 6;
            } else if (cp >= 0xd800 && cp < 0xe000) {
                cp = 0xfffd;
            }
            w += js_utf8(cp, w);
            break;
        }
        }
    }
    *w = '\0';
    *out = o;
    if (len_p)
        *len_p = (size_t)(w - o);
    return 0;
}

/* Skips the value at j->p. 0, or -1 where it is not JSON. */
static int js_skip(js_t *j, int depth)
{
    js_ws(j);
    if (j->p >= j->end || depth > JS_DEPTH)
        return -1;
    char c = *j->p;
    if (c == '"')
        return js_string(j, NULL, NULL);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        js_ws(j);
        if (j->p < j->end && *j->p == close) {
            j->p++;
            return 0;
        }
        for (;;) {
            if (c == '{') {
                js_ws(j);
                if (js_string(j, NULL, NULL) < 0)
                    return -1;
                js_ws(j);
                if (j->p >= j->end || *j->p++ != ':')
                    return -1;
            }
            if (js_skip(j, depth + 1) < 0)
                return -1;
            js_ws(j);
            if (j->p >= j->end)
                return -1;
            if (*j->p == close) {
                j->p++;
                return 0;
            }
            if (*j->p++ != ',')
                return -1;
        }
    }
    /* a number, true, false or null: the characters they are made of */
    const char *s = j->p;
    while (j->p < j->end && *j->p && strchr("0123456789+-.eEtruefalsn", *j->p))
        j->p++;
    return j->p > s ? 0 : -1;
}

/* In the object at j->p, the value of key (the last one, as Python's json takes): *val
 * at its start. j->p goes past the object. 1 found, 0 not, JS_BAD or JS_OOM. */
static int js_get(js_t *j, const char *key, js_t *val)
{
    int found = 0;
    js_ws(j);
    if (j->p >= j->end || *j->p != '{')
        return -1;
    j->p++;
    js_ws(j);
    if (j->p < j->end && *j->p == '}') {
        j->p++;
        return 0;
    }
    for (;;) {
        char *k = NULL;
        size_t klen = 0;
        js_ws(j);
        int r = js_string(j, &k, &klen);
        if (r < 0)
            return r;
        js_ws(j);
        if (j->p >= j->end || *j->p++ != ':') {
            free(k);
            return -1;
        }
        js_ws(j);
        if (klen == strlen(key) && !memcmp(k, key, klen)) {
            *val = *j;
            found = 1;
        }
        free(k);
        if (js_skip(j, 1) < 0)
            return -1;
        js_ws(j);
        if (j->p >= j->end)
            return -1;
        if (*j->p == '}') {
            j->p++;
            return found;
        }
        if (*j->p++ != ',')
            return -1;
    }
}

/* The value at v, a string or a number, as seconds. */
static long long js_seconds(js_t v)
{
    char *s = NULL;
    long long t = 0;
    if (v.p < v.end && *v.p == '"') {
        if (js_string(&v, &s, NULL) == 0)
            t = strtoll(s, NULL, 10);
        free(s);
    } else if (v.p < v.end) {
        char num[32];
        size_t n = (size_t)(v.end - v.p) < sizeof(num) - 1 ? (size_t)(v.end - v.p)
                                                           : sizeof(num) - 1;
        memcpy(num, v.p, n);
        num[n] = '\0';
        double d = strtod(num, NULL);
        t = d > 0 && d < 9e18 ? (long long)d : 0; /* NaN, or out of range: none */
    }
    return t;
}

/* The whole file at path (NUL-terminated), or NULL with errno. */
static char *slurp(const char *path, size_t *len_p)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat sb;
    int e = fstat(fd, &sb) < 0                   ? errno
            : !S_ISREG(sb.st_mode)               ? EINVAL
            : (uint64_t)sb.st_size > ERRFILE_MAX ? EFBIG
                                                 : 0;
    if (e) {
        close(fd);
        errno = e;
        return NULL;
    }
    char *buf = malloc((size_t)sb.st_size + 1);
    size_t len = 0;
    ssize_t n = 0;
    while (buf && len < (size_t)sb.st_size &&
           ((n = read(fd, buf + len, (size_t)sb.st_size - len)) > 0 || (n < 0 && errno == EINTR)))
        len += n > 0 ? (size_t)n : 0;
    e = errno;
    close(fd);
    if (!buf || n < 0) {
        free(buf);
        errno = buf ? e : ENOMEM;
        return NULL;
    }
    buf[len] = '\0';
    *len_p = len;
    return buf;
}

int tt_errfile_parse(const char *buf, size_t len, tt_errfile_t *ef, char *why, size_t whylen)
{
    ef->message = NULL;
    ef->timestamp = 0;
    ef->plain = 0;
    js_t j = { buf, buf + len }, msg, v;
    int r = js_get(&j, "message", &msg);
    js_ws(&j);
    if (r == JS_OOM)
        goto oom;
    if (r < 0 || j.p != j.end) {
        snprintf(why, whylen, "not JSON");
        return -1;
    }
    if (r == 0) {
        snprintf(why, whylen, "no \"message\"");
        return -1;
    }
    if (*msg.p == '"') { /* {"message": "text", "timestamp": N} */
        if (js_string(&msg, &ef->message, NULL) < 0)
            goto oom;
        ef->plain = 1;
        js_t top = { buf, buf + len };
        if (js_get(&top, "timestamp", &v) == 1)
            ef->timestamp = js_seconds(v);
        return 1;
    }
    if (*msg.p != '{') {
        snprintf(why, whylen, "\"message\" is neither a string nor an object");
        return -1;
    }
    /* torch's: the traceback, else the message, else <N/A> */
    js_t m = msg, info = msg, x;
    if (js_get(&info, "extraInfo", &x) == 1 && *x.p == '{') {
        js_t t = x;
        if (js_get(&t, "timestamp", &v) == 1)
            ef->timestamp = js_seconds(v);
        t = x;
        if (js_get(&t, "py_callstack", &v) == 1 && *v.p == '"' &&
            js_string(&v, &ef->message, NULL) < 0)
            goto oom;
    }
    if (!ef->message && js_get(&m, "message", &v) == 1 && *v.p == '"' &&
        js_string(&v, &ef->message, NULL) < 0)
        goto oom;
    if (!ef->message && !(ef->message = strdup("<N/A>")))
        goto oom;
    return 1;
oom:
    snprintf(why, whylen, "out of memory");
    free(ef->message);
    ef->message = NULL;
    return -1;
}

int tt_errfile_read(const char *path, tt_errfile_t *ef, char *why, size_t whylen)
{
    ef->message = NULL;
    ef->timestamp = 0;
    size_t len;
    char *buf = slurp(path, &len);
    if (!buf) {
        if (errno == ENOENT)
            return 0;
        snprintf(why, whylen, "%s", strerror(errno));
        return -1;
    }
    int r = tt_errfile_parse(buf, len, ef, why, whylen);
    free(buf);
    return r;
}

/* Writes len bytes of data, then more (NULL: none), to path through a temporary file
 * renamed over it. 0, or -1 with errno. */
static int write_file(const char *path, const char *data, size_t len, const char *more)
{
    char tmp[4200];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof(tmp)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    FILE *f = fopen(tmp, "we");
    if (!f)
        return -1;
    int ok = fwrite(data, 1, len, f) == len && (!more || fputs(more, f) >= 0);
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path) < 0) {
        int e = errno;
        unlink(tmp);
        errno = e;
        return -1;
    }
    return 0;
}

int tt_errfile_with_code(const char *buf, size_t len, int code, char **out_p, size_t *outlen_p)
{
    js_t j = { buf, buf + len }, msg;
    int r = js_get(&j, "message", &msg);
    js_ws(&j);
    if (r != 1 || j.p != j.end) {
        errno = EINVAL;
        return -1;
    }
    char add[64] = "";
    const char *at = buf + len; /* where add goes: nowhere, unless the message is an object */
    if (*msg.p == '{' && code) {
        /* "errorCode" last in the message object: it stands over one already there */
        js_t end = msg;
        if (js_skip(&end, 1) < 0) {
            errno = EINVAL;
            return -1;
        }
        at = end.p - 1; /* its '}' */
        js_t in = { msg.p + 1, at };
        js_ws(&in);
        snprintf(add, sizeof(add), "%s\"errorCode\": %d", in.p == at ? "" : ", ", code);
    }
    size_t head = (size_t)(at - buf), n = strlen(add);
    char *out = malloc(len + n + 1);
    if (!out) {
        errno = ENOMEM;
        return -1;
    }
    memcpy(out, buf, head);
    memcpy(out + head, add, n);
    memcpy(out + head + n, at, len - head);
    out[len + n] = '\0';
    *out_p = out;
    *outlen_p = len + n;
    return 0;
}

int tt_errfile_pass_on(const char *from, int code, const char *path)
{
    size_t len, outlen;
    char *buf = slurp(from, &len), *out = NULL;
    if (!buf)
        return -1;
    int st = tt_errfile_with_code(buf, len, code, &out, &outlen);
    if (st == 0)
        st = write_file(path, out, outlen, NULL);
    int e = errno;
    free(buf);
    free(out);
    errno = e;
    return st;
}

/* text as a JSON string's body, appended to *b (size *cap, used *n). 0 or -1. */
static int js_escape(char **b, size_t *n, size_t *cap, const char *text)
{
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (*n + 8 > *cap) {
            size_t nc = *cap * 2 + 64;
            char *nb = realloc(*b, nc);
            if (!nb)
                return -1;
            *b = nb;
            *cap = nc;
        }
        if (*c == '"' || *c == '\\') {
            (*b)[(*n)++] = '\\';
            (*b)[(*n)++] = (char)*c;
        } else if (*c == '\n') {
            (*b)[(*n)++] = '\\';
            (*b)[(*n)++] = 'n';
        } else if (*c < 0x20) {
            *n += (size_t)snprintf(*b + *n, 8, "\\u%04x", *c);
        } else {
            (*b)[(*n)++] = (char)*c;
        }
    }
    return 0;
}

int tt_errfile_write(const char *path, const char *text, int code)
{
    size_t n = 0, cap = 256;
    char *b = malloc(cap), tail[128];
    int ok = b != NULL;
    if (ok) {
        n = (size_t)snprintf(b, cap, "{\"message\": {\"message\": \"");
        ok = js_escape(&b, &n, &cap, text) == 0;
    }
    if (ok) {
        const char *mid = "\", \"extraInfo\": {\"py_callstack\": \"";
        size_t m = strlen(mid);
        char *nb = n + m + 1 > cap ? realloc(b, (cap = n + m + 64)) : b;
        ok = nb != NULL;
        if (ok) {
            b = nb;
            memcpy(b + n, mid, m);
            n += m;
            ok = js_escape(&b, &n, &cap, text) == 0;
        }
    }
    if (!ok) {
        free(b);
        errno = ENOMEM;
        return -1;
    }
    snprintf(tail, sizeof(tail), "\", \"timestamp\": \"%lld\"}, \"errorCode\": %d}}\n",
             (long long)time(NULL), code);
    int st = write_file(path, b, n, tail);
    int e = errno;
    free(b);
    errno = e;
    return st;
}
