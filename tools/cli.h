/* Command-line number parsing shared by tutti-run, tutti-store and tutti-bench. */
#ifndef TT_CLI_H
#define TT_CLI_H

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* s as a decimal integer in [lo, hi] into *v_p; -1 (and *v_p untouched) otherwise. */
static inline int tt_cli_long(const char *s, long lo, long hi, long *v_p)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *v_p = v;
    return 0;
}

static inline int tt_cli_int(const char *s, int lo, int hi, int *v_p)
{
    long v;
    if (tt_cli_long(s, lo, hi, &v) < 0)
        return -1;
    *v_p = (int)v;
    return 0;
}

/* s as a byte count into *v_p: "4096", "64K", "1M", "2G" (powers of 1024; also spelt
 * "64KiB", "64kb"); -1 (and *v_p untouched) when it is not one or does not fit. A minus
 * sign is refused after leading blanks too (strtoull skips them and takes " -1" as
 * ULLONG_MAX). */
static inline int tt_cli_size(const char *s, size_t *v_p)
{
    char *end;
    while (isspace((unsigned char)*s))
        s++;
    if (*s == '-')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    int shift = *end == 'K' || *end == 'k'   ? 10
                : *end == 'M' || *end == 'm' ? 20
                : *end == 'G' || *end == 'g' ? 30
                                             : 0;
    if (shift)
        end++;
    if (*end == 'i')
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end || v > ((unsigned long long)SIZE_MAX >> shift))
        return -1;
    *v_p = (size_t)(v << shift);
    return 0;
}

#endif /* TT_CLI_H */
