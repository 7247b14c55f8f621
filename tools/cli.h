/* Command-line number parsing shared by tutti-run, tutti-store and tutti-bench. */
#ifndef TT_CLI_H
#define TT_CLI_H

#include <errno.h>
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

#endif /* TT_CLI_H */
