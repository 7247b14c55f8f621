/* File store: one file per key in a directory shared by the ranks.
 *
 * A value is written to a temp file in the key's directory and renamed over the key's
 * file, so a reader sees a whole old value or a whole new one, never part of one, even
 * when the writer is killed mid-write (its temp file stays behind; readers never look at
 * temp files and a later open removes those of dead writers). add, compare_set, set and
 * delete serialise per key through an OFD lock on one of a few lock files, which the
 * kernel releases when a holder dies. get polls with backoff.
 *
 * Layout: key bytes outside [A-Za-z0-9_.-] are %XX-escaped and the result prefixed with
 * 'k'; an escaped key longer than one file name is split into directories "d<part>/",
 * so no two keys share a file. Temp files start with ".tmp.", lock files with ".lock.".
 *
 * A temp file is named ".tmp.<pid>-<pidns>.<n>.<host>": the writer's pid, the inode of
 * its pid namespace (/proc/self/ns/pid; 0 when unknown), a per-process count and the host
 * name. An open removes the temp files of dead writers, in the root and in long keys'
 * directories: of a writer on this host in this pid namespace when its pid is gone, of any
 * other (another host, another pid namespace such as another container with the same
 * host name, where the pid means nothing here, or a name of the older form
 * ".tmp.<pid>.<n>.<host>", which carries no namespace) only when older than FS_STALE_TMP_S.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "store/store_impl.h"
#include "../../transports/kit/util.h"

#define FS_PART_MAX 200 /* escaped bytes per path component (NAME_MAX is 255) */
#define FS_LOCK_STRIPES 64
#define FS_PATH_MAX (TUTTI_STORE_MAX_KEY * 3 + (TUTTI_STORE_MAX_KEY * 3 / FS_PART_MAX + 1) * 2 + 64)
#define FS_STALE_TMP_S 3600 /* temp files of writers on other hosts older than this go */

typedef struct fs_store {
    char *dir; /* absolute */
    int dirfd;
    int do_fsync; /* opts.fsync (TUTTI_STORE_FSYNC=1): fsync values before they become visible */
    char host[64];
    unsigned long pidns; /* inode of this process's pid namespace, 0 if unknown */
} fs_store_t;

/* Temp names must be unique among all threads of all processes on all hosts sharing the
 * directory: host, pid namespace and pid tell processes apart, this counter the writes of
 * one process. */
static atomic_ulong fs_tmp_counter;

static fs_store_t *fs_of(tutti_store_t *s)
{
    return s->impl;
}

/* Relative path of key's file into path; *dirlen_p is the length of its directory part
 * (with the trailing '/', 0 for the root). */
static size_t fs_escape(const char *key, char *esc)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++) {
        unsigned char c = *p;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '_' || c == '-' || c == '.') {
            esc[n++] = (char)c;
        } else {
            esc[n++] = '%';
            esc[n++] = hex[c >> 4];
            esc[n++] = hex[c & 15];
        }
    }
    esc[n] = '\0';
    return n;
}

static void fs_key_path(const char *key, char *path, size_t *dirlen_p)
{
    char esc[TUTTI_STORE_MAX_KEY * 3 + 1];
    size_t n = fs_escape(key, esc);
    size_t o = 0, i = 0;
    while (n - i > FS_PART_MAX) {
        path[o++] = 'd';
        memcpy(path + o, esc + i, FS_PART_MAX);
        o += FS_PART_MAX;
        i += FS_PART_MAX;
        path[o++] = '/';
    }
    *dirlen_p = o;
    path[o++] = 'k';
    memcpy(path + o, esc + i, n - i);
    o += n - i;
    path[o] = '\0';
}

static int fs_io_error(tutti_store_t *s, tt_store_err_t *err, const char *what, const char *relpath,
                       int errnum)
{
    tt_store_err_set(err, "cannot %s %s/%s: %s", what, fs_of(s)->dir, relpath, strerror(errnum));
    return TUTTI_ERR_IO;
}

static void fs_sleep_ns(uint64_t ns)
{
    struct timespec ts = { (time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull) };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Sleep for the current backoff step (capped by the deadline), then grow it. */
static void fs_backoff(uint64_t *step_ns, uint64_t max_ns, uint64_t deadline)
{
    uint64_t now = tt_now_ns();
    uint64_t ns = *step_ns;
    if (deadline != UINT64_MAX)
        ns = deadline <= now ? 0 : TT_MIN(ns, deadline - now);
    fs_sleep_ns(ns);
    *step_ns = TT_MIN(*step_ns * 2, max_ns);
}

/* Read key's value: *exists_p 0 when there is none. */
static int fs_read(tutti_store_t *s, const char *path, void **value_p, size_t *len_p, int *exists_p,
                   tt_store_err_t *err)
{
    fs_store_t *fs = fs_of(s);
    int fd = openat(fs->dirfd, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR) {
            *exists_p = 0;
            return TUTTI_OK;
        }
        return fs_io_error(s, err, "open", path, errno);
    }
    int st = TUTTI_OK;
    struct stat sb;
    if (fstat(fd, &sb) < 0) {
        st = fs_io_error(s, err, "stat", path, errno);
        goto out_close;
    }
    if (sb.st_size < 0 || (uint64_t)sb.st_size > TUTTI_STORE_MAX_VALUE) {
        tt_store_err_set(err, "%s/%s holds %lld bytes, more than a value may have", fs->dir, path,
                         (long long)sb.st_size);
        st = TUTTI_ERR_IO;
        goto out_close;
    }
    size_t len = (size_t)sb.st_size;
    char *buf = malloc(len + 1);
    if (!buf) {
        tt_store_err_set(err, "out of memory for a value of %zu bytes", len);
        st = TUTTI_ERR_NOMEM;
        goto out_close;
    }
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, buf + got, len - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            /* values are replaced by rename, never changed in place: a short file is
             * damage from outside */
            if (r == 0)
                tt_store_err_set(err, "%s/%s shrank while being read", fs->dir, path);
            else
                fs_io_error(s, err, "read", path, errno);
            st = TUTTI_ERR_IO;
            goto out_free;
        }
        got += (size_t)r;
    }
    buf[len] = '\0';
    close(fd);
    *value_p = buf;
    *len_p = len;
    *exists_p = 1;
    return TUTTI_OK;

out_free:
    free(buf);
out_close:
    close(fd);
    return st;
}

static int fs_mkdirs(tutti_store_t *s, char *path, size_t dirlen, tt_store_err_t *err)
{
    fs_store_t *fs = fs_of(s);
    for (size_t i = 0; i < dirlen; i++) {
        if (path[i] != '/')
            continue;
        path[i] = '\0';
        int r = mkdirat(fs->dirfd, path, 0777);
        int e = errno;
        if (r < 0 && e != EEXIST) {
            fs_io_error(s, err, "create directory", path, e);
            path[i] = '/';
            return TUTTI_ERR_IO;
        }
        path[i] = '/';
    }
    return TUTTI_OK;
}

/* Write value to a fresh temp file beside path; its name goes to tmp. */
static int fs_write_tmp(tutti_store_t *s, char *path, size_t dirlen, const void *value, size_t len,
                        char *tmp, tt_store_err_t *err)
{
    fs_store_t *fs = fs_of(s);
    unsigned long n = atomic_fetch_add(&fs_tmp_counter, 1);
    memcpy(tmp, path, dirlen);
    snprintf(tmp + dirlen, FS_PATH_MAX - dirlen, ".tmp.%ld-%lu.%lu.%s", (long)getpid(), fs->pidns,
             n, fs->host);
    int fd = -1;
    /* a long key's directory that a delete removed (found empty) between our mkdir and
     * create is made again */
    for (int tries = 0; fd < 0 && tries < 8; tries++) {
        TT_CHECK(fs_mkdirs(s, path, dirlen, err));
        fd = openat(fs->dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && (errno != ENOENT || dirlen == 0))
            break;
    }
    if (fd < 0)
        return fs_io_error(s, err, "create", tmp, errno);
    const char *p = value;
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, p + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            fs_io_error(s, err, "write", tmp, w < 0 ? errno : ENOSPC);
            goto err_unlink;
        }
        done += (size_t)w;
    }
    if (fs->do_fsync && fsync(fd) < 0) {
        fs_io_error(s, err, "fsync", tmp, errno);
        goto err_unlink;
    }
    /* network file systems report write errors at close */
    if (close(fd) < 0) {
        fd = -1;
        fs_io_error(s, err, "close", tmp, errno);
        goto err_unlink;
    }
    return TUTTI_OK;

err_unlink:
    if (fd >= 0)
        close(fd);
    unlinkat(fs->dirfd, tmp, 0);
    return TUTTI_ERR_IO;
}

/* Make the temp file the key's value. Callers hold the key's lock. */
static int fs_publish(tutti_store_t *s, const char *tmp, const char *path, tt_store_err_t *err)
{
    fs_store_t *fs = fs_of(s);
    /* ext4 flushes a file renamed over another to disk first (auto_da_alloc), which made a
     * small update cost milliseconds; swapping the two names does not */
    if (renameat2(fs->dirfd, tmp, fs->dirfd, path, RENAME_EXCHANGE) == 0) {
        unlinkat(fs->dirfd, tmp, 0); /* now the old value */
        return TUTTI_OK;
    }
    if (errno != ENOENT && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP) {
        int e = errno;
        unlinkat(fs->dirfd, tmp, 0);
        return fs_io_error(s, err, "replace", path, e);
    }
    /* no old value to swap with, or a file system without exchange */
    if (renameat(fs->dirfd, tmp, fs->dirfd, path) < 0) {
        int e = errno;
        unlinkat(fs->dirfd, tmp, 0);
        return fs_io_error(s, err, "rename a temp file to", path, e);
    }
    return TUTTI_OK;
}

static unsigned fs_stripe(const char *key)
{
    uint32_t h = 2166136261u;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 16777619u;
    return h % FS_LOCK_STRIPES;
}

/* Lock key's stripe until the deadline; the returned fd holds the lock (close it). Each
 * call opens its own fd because OFD locks belong to an open file: threads and forked
 * children sharing one would share the lock. */
static int fs_lock(tutti_store_t *s, const char *key, uint64_t deadline, int *fd_p,
                   tt_store_err_t *err)
{
    fs_store_t *fs = fs_of(s);
    char name[32];
    snprintf(name, sizeof(name), ".lock.%02u", fs_stripe(key));
    int fd = openat(fs->dirfd, name, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return fs_io_error(s, err, "open lock file", name, errno);
    uint64_t start = tt_now_ns(), step = 10000;
    int use_flock = 0;
    for (;;) {
        int r, e;
        if (!use_flock) {
            struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
            r = fcntl(fd, F_OFD_SETLK, &fl);
            e = errno;
            if (r < 0 && e == EINVAL) {
                /* no OFD locks on this kernel or file system */
                use_flock = 1;
                continue;
            }
        } else {
            r = flock(fd, LOCK_EX | LOCK_NB);
            e = errno;
        }
        if (r == 0)
            break;
        if (e != EAGAIN && e != EACCES && e != EWOULDBLOCK && e != EINTR) {
            close(fd);
            return fs_io_error(s, err, "lock", name, e);
        }
        if (tt_now_ns() >= deadline) {
            close(fd);
            tt_store_err_set(err, "lock %s/%s still held by another process after %" PRIu64 " ms",
                             fs->dir, name, (tt_now_ns() - start) / 1000000u);
            return TUTTI_ERR_TIMEOUT;
        }
        fs_backoff(&step, 200000, deadline);
    }
    *fd_p = fd;
    return TUTTI_OK;
}

static int fs_set(tutti_store_t *s, const char *key, const void *value, size_t len,
                  uint64_t deadline, tt_store_err_t *err)
{
    char path[FS_PATH_MAX], tmp[FS_PATH_MAX];
    size_t dirlen;
    int lockfd, st;
    fs_key_path(key, path, &dirlen);
    /* the slow part, outside the lock */
    TT_CHECK(fs_write_tmp(s, path, dirlen, value, len, tmp, err));
    TT_CHECK_GOTO(fs_lock(s, key, deadline, &lockfd, err), st, err_unlink_tmp);
    st = fs_publish(s, tmp, path, err);
    close(lockfd);
    return st;

err_unlink_tmp:
    unlinkat(fs_of(s)->dirfd, tmp, 0);
    return st;
}

static int fs_get(tutti_store_t *s, const char *key, void **value_p, size_t *len_p,
                  uint64_t deadline, tt_store_err_t *err)
{
    char path[FS_PATH_MAX];
    size_t dirlen;
    fs_key_path(key, path, &dirlen);
    uint64_t start = tt_now_ns(), step = 50000;
    for (;;) {
        int exists = 0;
        TT_CHECK(fs_read(s, path, value_p, len_p, &exists, err));
        if (exists)
            return TUTTI_OK;
        if (tt_now_ns() >= deadline) {
            char kd[160];
            tt_store_err_set(err, "key '%s' not set after %" PRIu64 " ms (file %s/%s)",
                             tt_store_key_display(key, kd, sizeof(kd)),
                             (tt_now_ns() - start) / 1000000u, fs_of(s)->dir, path);
            return TUTTI_ERR_TIMEOUT;
        }
        fs_backoff(&step, 10000000, deadline);
    }
}

/* A key's file, locked, with its value read (cur: malloc'ed, or NULL when !exists). */
typedef struct fs_locked {
    char path[FS_PATH_MAX];
    size_t dirlen;
    int lockfd;
    int exists;
    void *cur;
    size_t curlen;
} fs_locked_t;

/* Lock key and read its value; on failure nothing is left locked or allocated. */
static int fs_lock_read(tutti_store_t *s, const char *key, uint64_t deadline, fs_locked_t *l,
                        tt_store_err_t *err)
{
    l->exists = 0;
    l->cur = NULL;
    l->curlen = 0;
    fs_key_path(key, l->path, &l->dirlen);
    TT_CHECK(fs_lock(s, key, deadline, &l->lockfd, err));
    int st = fs_read(s, l->path, &l->cur, &l->curlen, &l->exists, err);
    if (st < 0) {
        free(l->cur);
        close(l->lockfd);
    }
    return st;
}

static void fs_unlock(fs_locked_t *l)
{
    free(l->cur);
    close(l->lockfd);
}

static int fs_add(tutti_store_t *s, const char *key, int64_t delta, int64_t *result_p,
                  uint64_t deadline, tt_store_err_t *err)
{
    char tmp[FS_PATH_MAX];
    fs_locked_t l;
    int st;
    int64_t v = 0;
    TT_CHECK(fs_lock_read(s, key, deadline, &l, err));
    if (l.exists && tt_store_parse_i64(l.cur, l.curlen, &v) < 0) {
        tt_store_err_set(err, "value (%zu bytes) is not a decimal 64-bit integer", l.curlen);
        st = TUTTI_ERR_INVALID_ARG;
        goto out;
    }
    if (__builtin_add_overflow(v, delta, &v)) {
        tt_store_err_set(err, "adding %" PRId64 " overflows 64 bits", delta);
        st = TUTTI_ERR_INVALID_ARG;
        goto out;
    }
    char text[32];
    int n = snprintf(text, sizeof(text), "%" PRId64, v);
    TT_CHECK_GOTO(fs_write_tmp(s, l.path, l.dirlen, text, (size_t)n, tmp, err), st, out);
    TT_CHECK_GOTO(fs_publish(s, tmp, l.path, err), st, out);
    *result_p = v;
out:
    fs_unlock(&l);
    return st;
}

/* A malloc'ed copy of len bytes with a NUL after them; NULL when out of memory. */
static void *fs_value_copy(const void *data, size_t len)
{
    char *copy = malloc(len + 1);
    if (copy) {
        memcpy(copy, data, len);
        copy[len] = '\0';
    }
    return copy;
}

static int fs_compare_set(tutti_store_t *s, const char *key, const void *expected, size_t elen,
                          const void *desired, size_t dlen, void **current_p, size_t *curlen_p,
                          uint64_t deadline, tt_store_err_t *err)
{
    char tmp[FS_PATH_MAX];
    fs_locked_t l;
    int st;
    TT_CHECK(fs_lock_read(s, key, deadline, &l, err));
    int equal = l.exists ? (l.curlen == elen && !memcmp(l.cur, expected, elen)) : elen == 0;
    if (equal || !l.exists) {
        if (equal) {
            TT_CHECK_GOTO(fs_write_tmp(s, l.path, l.dirlen, desired, dlen, tmp, err), st, out);
            TT_CHECK_GOTO(fs_publish(s, tmp, l.path, err), st, out);
        }
        /* the value after: what was written, or empty for a key that stays absent */
        void *copy = equal ? fs_value_copy(desired, dlen) : fs_value_copy("", 0);
        if (!copy) {
            tt_store_err_set(err, "out of memory");
            st = TUTTI_ERR_NOMEM;
            goto out;
        }
        free(l.cur);
        l.cur = copy;
        l.curlen = equal ? dlen : 0;
    }
    *current_p = l.cur;
    *curlen_p = l.curlen;
    l.cur = NULL;
    st = TUTTI_OK;
out:
    fs_unlock(&l);
    return st;
}

static int fs_check(tutti_store_t *s, const char *const *keys, size_t n, int *exists_p,
                    uint64_t deadline, tt_store_err_t *err)
{
    TT_UNUSED(deadline);
    char path[FS_PATH_MAX];
    size_t dirlen;
    for (size_t i = 0; i < n; i++) {
        struct stat sb;
        fs_key_path(keys[i], path, &dirlen);
        if (fstatat(fs_of(s)->dirfd, path, &sb, 0) < 0) {
            if (errno == ENOENT || errno == ENOTDIR) {
                *exists_p = 0;
                return TUTTI_OK;
            }
            return fs_io_error(s, err, "stat", path, errno);
        }
    }
    *exists_p = 1;
    return TUTTI_OK;
}

/* After a long key's file went: its directories, deepest first, while they are empty (a
 * writer that meets one gone makes it again: fs_write_tmp). */
static void fs_rmdirs(int dirfd, char *path, size_t dirlen)
{
    for (size_t i = dirlen; i > 0; i--) {
        if (path[i - 1] != '/')
            continue;
        path[i - 1] = '\0';
        int r = unlinkat(dirfd, path, AT_REMOVEDIR);
        path[i - 1] = '/';
        if (r < 0)
            break;
    }
}

static int fs_del(tutti_store_t *s, const char *key, int *deleted_p, uint64_t deadline,
                  tt_store_err_t *err)
{
    char path[FS_PATH_MAX];
    size_t dirlen;
    int lockfd, st = TUTTI_OK;
    fs_key_path(key, path, &dirlen);
    TT_CHECK(fs_lock(s, key, deadline, &lockfd, err));
    if (unlinkat(fs_of(s)->dirfd, path, 0) == 0) {
        *deleted_p = 1;
        fs_rmdirs(fs_of(s)->dirfd, path, dirlen);
    } else if (errno == ENOENT || errno == ENOTDIR) {
        *deleted_p = 0;
    } else {
        st = fs_io_error(s, err, "delete", path, errno);
    }
    close(lockfd);
    return st;
}

/* Remove the directory tree at name in dirfd (a long key's directory); counts files. */
static void fs_rmtree_at(int dirfd, const char *name, size_t *count_p)
{
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        DIR *d = fdopendir(fd);
        if (!d) {
            close(fd);
            return;
        }
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
                continue;
            if (unlinkat(fd, e->d_name, 0) == 0)
                (*count_p)++;
            else if (errno == EISDIR)
                fs_rmtree_at(fd, e->d_name, count_p);
        }
        closedir(d);
    }
    unlinkat(dirfd, name, AT_REMOVEDIR);
}

/* Delete (del) or count the keys under dirfd whose escaped names start with esc (n
 * bytes): key files "k<name>", and long keys' directories "d<part>/" (whole, or descended
 * into). */
static int fs_prefix_at(int dirfd, const char *esc, size_t n, size_t *count_p, int del)
{
    /* a fresh open, not a dup: a dup shares its directory offset with other readers */
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        return -e;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        const char *name = e->d_name + 1;
        if (e->d_name[0] == 'k' && !strncmp(name, esc, n)) {
            if (!del || unlinkat(dirfd, e->d_name, 0) == 0)
                (*count_p)++;
        } else if (e->d_name[0] == 'd' && strlen(name) == FS_PART_MAX) {
            size_t part = TT_MIN(n, (size_t)FS_PART_MAX); /* of the prefix in this name */
            if (del && n <= FS_PART_MAX && !strncmp(name, esc, n)) {
                fs_rmtree_at(dirfd, e->d_name, count_p);
            } else if (!strncmp(name, esc, part)) {
                int sub = openat(dirfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                int r = sub >= 0 || errno == ENOENT ? 0 : -errno;
                if (sub >= 0) {
                    r = fs_prefix_at(sub, esc + part, n - part, count_p, del);
                    close(sub);
                    if (del)
                        unlinkat(dirfd, e->d_name, AT_REMOVEDIR); /* if now empty */
                }
                if (r < 0 && !del) { /* a count that left keys out is an error, not a number */
                    closedir(d);
                    return r;
                }
            }
        }
    }
    closedir(d);
    return 0;
}

static int fs_prefix(tutti_store_t *s, const char *prefix, size_t *count_p, int del,
                     tt_store_err_t *err)
{
    char esc[TUTTI_STORE_MAX_KEY * 3 + 1];
    size_t n = fs_escape(prefix, esc);
    *count_p = 0;
    int r = fs_prefix_at(fs_of(s)->dirfd, esc, n, count_p, del);
    if (r < 0)
        return fs_io_error(s, err, "list", ".", -r);
    return TUTTI_OK;
}

static int fs_del_prefix(tutti_store_t *s, const char *prefix, size_t *count_p, uint64_t deadline,
                         tt_store_err_t *err)
{
    TT_UNUSED(deadline);
    return fs_prefix(s, prefix, count_p, 1, err);
}

static int fs_count_prefix(tutti_store_t *s, const char *prefix, size_t *count_p, uint64_t deadline,
                           tt_store_err_t *err)
{
    TT_UNUSED(deadline);
    return fs_prefix(s, prefix, count_p, 0, err);
}

static int fs_compare_del(tutti_store_t *s, const char *key, const void *expected, size_t elen,
                          int *deleted_p, uint64_t deadline, tt_store_err_t *err)
{
    fs_locked_t l;
    *deleted_p = 0;
    int st = fs_lock_read(s, key, deadline, &l, err);
    if (st < 0)
        return st;
    if (l.exists && l.curlen == elen && !memcmp(l.cur, expected, elen)) {
        if (unlinkat(fs_of(s)->dirfd, l.path, 0) == 0) {
            *deleted_p = 1;
            fs_rmdirs(fs_of(s)->dirfd, l.path, l.dirlen);
        } else if (errno != ENOENT)
            st = fs_io_error(s, err, "delete", l.path, errno);
    }
    fs_unlock(&l);
    return st;
}

static void fs_close(tutti_store_t *s)
{
    fs_store_t *fs = fs_of(s);
    close(fs->dirfd);
    free(fs->dir);
    free(fs);
    s->impl = NULL;
}

/* Whether a temp file name (".tmp." already matched) is of a writer that is gone: one of
 * this host and pid namespace whose pid no longer exists, or any other older than
 * FS_STALE_TMP_S (another host, another pid namespace, the older form without one). */
static int fs_tmp_stale(const fs_store_t *fs, int dirfd, const char *name, time_t now)
{
    char *end;
    long pid = strtol(name + 5, &end, 10);
    unsigned long ns = 0;
    int has_ns = *end == '-';
    if (has_ns)
        ns = strtoul(end + 1, &end, 10);
    if (*end != '.')
        return 0; /* not one of ours */
    const char *host = strchr(end + 1, '.');
    size_t hostlen = strlen(fs->host);
    int here = host && !strncmp(host + 1, fs->host, hostlen) && host[1 + hostlen] == '\0';
    if (here && has_ns && ns != 0 && ns == fs->pidns)
        return pid > 0 && kill((pid_t)pid, 0) < 0 && errno == ESRCH;
    struct stat sb;
    return fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
           now - sb.st_mtime > FS_STALE_TMP_S;
}

/* Remove the temp files of dead writers in the directory at dirfd and in long keys'
 * directories "d<part>/" below it (depth: how far down this one is). */
static void fs_clean_tmp_at(fs_store_t *fs, int dirfd, time_t now, int depth)
{
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* own offset */
    if (fd < 0)
        return;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == 'd' && strlen(e->d_name) == FS_PART_MAX + 1 &&
            depth < TUTTI_STORE_MAX_KEY * 3 / FS_PART_MAX + 1) {
            int sub = openat(dirfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) {
                fs_clean_tmp_at(fs, sub, now, depth + 1);
                close(sub);
            }
            continue;
        }
        if (strncmp(e->d_name, ".tmp.", 5) || !fs_tmp_stale(fs, dirfd, e->d_name, now))
            continue;
        TT_TRACE("store file://%s: removing %s left by a dead writer", fs->dir, e->d_name);
        unlinkat(dirfd, e->d_name, 0);
    }
    closedir(d);
}

static void fs_clean_tmp(fs_store_t *fs)
{
    fs_clean_tmp_at(fs, fs->dirfd, time(NULL), 0);
}

/* no wait, no multi_get: store.c builds them from get */
static const tt_store_ops_t fs_ops = {
    .name = "file",
    TT_STORE_OPS_FNS(fs),
};

/* mkdir -p */
static int fs_mkdir_p(const char *dir, tt_store_err_t *err)
{
    char buf[PATH_MAX];
    size_t n = strlen(dir);
    if (n >= sizeof(buf)) {
        tt_store_err_set(err, "directory name longer than %d bytes", PATH_MAX - 1);
        return TUTTI_ERR_INVALID_ARG;
    }
    memcpy(buf, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] != '/' && buf[i] != '\0')
            continue;
        char c = buf[i];
        buf[i] = '\0';
        if (mkdir(buf, 0777) < 0 && errno != EEXIST) {
            tt_store_err_set(err, "cannot create directory %s: %s", buf, strerror(errno));
            return TUTTI_ERR_IO;
        }
        buf[i] = c;
    }
    return TUTTI_OK;
}

int tt_store_file_open(tutti_store_t **store_p, const char *dir, int timeout_ms, int do_fsync,
                       tt_store_err_t *err)
{
    int st;
    fs_store_t *fs = calloc(1, sizeof(*fs));
    if (!fs) {
        tt_store_err_set(err, "out of memory");
        return TUTTI_ERR_NOMEM;
    }
    TT_CHECK_GOTO(fs_mkdir_p(dir, err), st, err_free_fs);
    fs->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fs->dirfd < 0) {
        tt_store_err_set(err, "cannot open directory %s: %s", dir, strerror(errno));
        st = TUTTI_ERR_IO;
        goto err_free_fs;
    }
    fs->dir = realpath(dir, NULL);
    if (!fs->dir) {
        tt_store_err_set(err, "cannot resolve directory %s: %s", dir, strerror(errno));
        st = TUTTI_ERR_IO;
        goto err_close_dir;
    }
    if (gethostname(fs->host, sizeof(fs->host) - 1) < 0)
        strcpy(fs->host, "localhost");
    /* host names become part of temp file names */
    for (char *p = fs->host; *p; p++)
        if (*p == '/')
            *p = '_';
    fs->do_fsync = do_fsync;
    fs->pidns = (unsigned long)tp_pidns();
    fs_clean_tmp(fs);

    char *url = malloc(strlen(fs->dir) + 8);
    if (!url) {
        st = TUTTI_ERR_NOMEM;
        tt_store_err_set(err, "out of memory");
        goto err_free_dir;
    }
    sprintf(url, "file://%s", fs->dir);
    tutti_store_t *s = tt_store_alloc(&fs_ops, url, -1, timeout_ms);
    free(url);
    if (!s) {
        st = TUTTI_ERR_NOMEM;
        tt_store_err_set(err, "out of memory");
        goto err_free_dir;
    }
    s->impl = fs;
    *store_p = s;
    return TUTTI_OK;

err_free_dir:
    free(fs->dir);
err_close_dir:
    close(fs->dirfd);
err_free_fs:
    free(fs);
    return st;
}
