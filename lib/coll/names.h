/* Names of the collectives and of the algorithms by id (names.c, a leaf). */
#ifndef TT_NAMES_H
#define TT_NAMES_H

#include <stdint.h>

#include "core/op.h"

/* "allreduce", "broadcast", "barrier"; NULL for an invalid value. */
const char *tt_coll_name(tt_coll_t coll);
tt_coll_t tt_coll_parse(const char *name);
/* The name of the algorithm with this id ("ring"), NULL for an unknown id. */
const char *tt_algo_name(uint32_t id);
/* The i-th algorithm of a collective in algos.def's order (by id), NULL past the last. */
const char *tt_algo_nth(tt_coll_t coll, int i);

#endif /* TT_NAMES_H */
