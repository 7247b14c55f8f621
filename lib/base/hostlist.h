/* Slurm's host lists ("gpu[07-09,12],cpu3", "rack[2-3]-ib[0-1]"): the library's (a
 * step's first node) and tutti-run's (a batch allocation's nodes). Plain C and libc
 * only: tutti-run compiles this file too, since the library keeps its internals hidden. */
#ifndef TT_HOSTLIST_H
#define TT_HOSTLIST_H

#include <stddef.h>

/* Calls each(ctx, host) for the hosts of list in order, as `scontrol show hostnames`
 * gives them: items between commas, each a name with any number of [RANGES] (a
 * product, left to right), RANGES numbers and LO-HI ranges between commas, a number
 * as wide as its range's first (leading zeros kept). each returns nonzero to stop.
 * Returns how many hosts each was given, or -1 where the list does not parse (an
 * empty item or range, a bracket unclosed or unopened, a range whose end is below its
 * start, a space) or a host would be 256 bytes or more. The whole list is checked
 * before the first call. */
int tt_hostlist_each(const char *list, int (*each)(void *ctx, const char *host), void *ctx);

/* The first host of list into out (len bytes). 0, or -1 as tt_hostlist_each's, or
 * where it does not fit. */
int tt_hostlist_first(const char *list, char *out, size_t len);

#endif
