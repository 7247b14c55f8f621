/* Status names and descriptions, generated from TUTTI_STATUS_MAP; the version. */
#include <tutti/tutti.h>

#define TT_STR_(x) #x
#define TT_STR(x) TT_STR_(x)

int tutti_version(void)
{
    return TUTTI_VERSION_CODE;
}

const char *tutti_version_string(void)
{
    return TT_STR(TUTTI_VERSION_MAJOR) "." TT_STR(TUTTI_VERSION_MINOR) "." TT_STR(
        TUTTI_VERSION_PATCH);
}

const char *tutti_strerror(int status)
{
    switch (status) {
#define TT_DESC_(name, val, desc)                                                                  \
    case (val): return desc;
        TUTTI_STATUS_MAP(TT_DESC_)
#undef TT_DESC_
    default: return "unknown status";
    }
}

const char *tutti_status_name(int status)
{
    switch (status) {
#define TT_NAME_(name, val, desc)                                                                  \
    case (val): return "TUTTI_" #name;
        TUTTI_STATUS_MAP(TT_NAME_)
#undef TT_NAME_
    default: return "TUTTI_UNKNOWN";
    }
}
