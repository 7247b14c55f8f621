/* The collectives suite's second file (collectives_others.c): reduce, allgather(v),
 * reduce_scatter(v), gather(v), scatter(v), alltoall(v) and their async forms. */
#ifndef TH_COLLECTIVES_H
#define TH_COLLECTIVES_H

#include <check.h>

/* Add collectives_others.c's test cases to the collectives suite. */
void collectives_others_add(Suite *s);

#endif
