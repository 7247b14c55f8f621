/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as iSCSI, ext4 and SCTP use it:
 * crc = tcp_crc32c(crc, buf, len) with crc 0 to start, and chaining works
 * (tcp_crc32c(tcp_crc32c(0, a, n), b, m) is the CRC of a then b). The hardware
 * instruction (SSE4.2 crc32q, ARMv8 crc32cx) is used where the CPU has it, chosen at
 * run time; otherwise slicing-by-8 tables. Part of the tcp transport (no libtutti). */
#ifndef TCP_CRC32C_H
#define TCP_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The best implementation this CPU has. */
uint32_t tcp_crc32c(uint32_t crc, const void *buf, size_t len);
/* Its name: "sse4.2", "armv8-crc" or "table". */
const char *tcp_crc32c_impl(void);

/* Each implementation on its own (tests compare them). tcp_crc32c_hw is the table one
 * where tcp_crc32c_hw_available() is 0. */
uint32_t tcp_crc32c_sw(uint32_t crc, const void *buf, size_t len);
uint32_t tcp_crc32c_hw(uint32_t crc, const void *buf, size_t len);
int tcp_crc32c_hw_available(void);

#endif /* TCP_CRC32C_H */
