/* Assertions on store calls, with the store's own explanation in the failure message. */
#ifndef TH_STORE_CHECKS_H
#define TH_STORE_CHECKS_H

#include <check.h>

#include <tutti/store.h>

#define OK(s, call)                                                                      \
    do {                                                                                 \
        int st_ = (call);                                                                \
        ck_assert_msg(st_ == 0, "%s -> %s: %s", #call, tutti_status_name(st_),           \
                      tutti_store_last_error(s));                                        \
    } while (0)

#define EXPECT(s, call, want)                                                            \
    do {                                                                                 \
        int st_ = (call);                                                                \
        ck_assert_msg(st_ == (want), "%s -> %s, wanted %s: %s", #call,                   \
                      tutti_status_name(st_), tutti_status_name(want),                   \
                      tutti_store_last_error(s));                                        \
    } while (0)

#endif
