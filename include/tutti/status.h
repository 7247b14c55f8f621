/* tutti status codes: 0 is success, errors are negative. */
#ifndef TUTTI_STATUS_H
#define TUTTI_STATUS_H

#include <tutti/export.h>

TUTTI_BEGIN_DECLS

/* The whole status list: XX(NAME, value, description). Generates the enum,
 * tutti_strerror() and tutti_status_name(). */
#define TUTTI_STATUS_MAP(XX)                                                                       \
    XX(OK, 0, "success")                                                                           \
    XX(ERR_INVALID_ARG, -1, "invalid argument")                                                    \
    XX(ERR_NOMEM, -2, "out of memory")                                                             \
    XX(ERR_TIMEOUT, -3, "timed out")                                                               \
    XX(ERR_PEER, -4, "peer failed or closed its connection")                                       \
    XX(ERR_MISMATCH, -5, "ranks called mismatched collectives")                                    \
    XX(ERR_ABORTED, -6, "communicator aborted")                                                    \
    XX(ERR_IO, -7, "I/O error")                                                                    \
    XX(ERR_PROTOCOL, -8, "protocol error: malformed or unexpected data")                           \
    XX(ERR_NOT_FOUND, -9, "not found")                                                             \
    XX(ERR_STORE, -10, "store error")                                                              \
    XX(ERR_UNSUPPORTED, -11, "not supported")                                                      \
    XX(ERR_PLUGIN, -12, "transport plugin rejected")                                               \
    XX(ERR_CONFIG, -13, "bad configuration")                                                       \
    XX(ERR_NO_DEVICE, -14, "no such device or interface")                                          \
    XX(ERR_FAILED, -15, "communicator failed earlier")                                             \
    XX(ERR_INTERNAL, -16, "internal error")                                                        \
    XX(ERR_AUTH, -17, "authentication failed: wrong or missing job secret or store password")      \
    XX(ERR_IN_USE, -18, "store already used by another job")                                       \
    XX(ERR_REVOKED, -19, "communicator revoked by a rank (tutti_comm_revoke)")                     \
    XX(ERR_DEVICE, -20, "device error: device memory could not be read or written")                \
    XX(ERR_CANCELLED, -21, "operation cancelled (tutti_cancel)")

typedef enum tutti_status {
#define TUTTI_STATUS_ENUM_(name, val, desc) TUTTI_##name = (val),
    TUTTI_STATUS_MAP(TUTTI_STATUS_ENUM_)
#undef TUTTI_STATUS_ENUM_
        TUTTI_STATUS_LAST_ = -22
} tutti_status_t;

/* Description of a status code ("timed out"); never NULL. */
const char *tutti_strerror(int status);
/* Symbolic name of a status code ("TUTTI_ERR_TIMEOUT"); never NULL. */
const char *tutti_status_name(int status);

TUTTI_END_DECLS
#endif /* TUTTI_STATUS_H */
