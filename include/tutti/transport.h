/* tutti transport plugin ABI: one header per ABI version; this one includes the newest.
 * A plugin built against version N exports tutti_transport_vN(); the loader tries the
 * newest version it knows first. */
#ifndef TUTTI_TRANSPORT_H
#define TUTTI_TRANSPORT_H

#include <tutti/transport_v2.h>

#define TUTTI_TRANSPORT_ABI_VERSION TUTTI_TRANSPORT_ABI_V2

#endif /* TUTTI_TRANSPORT_H */
