/* Fuzz target: tutti-run's reader of torch's error files (tools/errfile.h), which a
 * rank writes and tutti-run reads at a failure. Whatever the bytes, no crash; and a file
 * read as torch's reads the same once tutti-run has added its errorCode (what it passes
 * on to a scheduler above). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "errfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 20))
        return 0;
    const char *buf = (const char *)data;
    tt_errfile_t ef, again;
    char why[128], *out = NULL;
    size_t outlen = 0;
    int r = tt_errfile_parse(buf, size, &ef, why, sizeof(why));
    int w = tt_errfile_with_code(buf, size, 7, &out, &outlen);
    if (r == 1 && w != 0)
        abort();
    if (w == 0) {
        int r2 = tt_errfile_parse(out, outlen, &again, why, sizeof(why));
        if (r == 1 &&
            (r2 != 1 || strcmp(ef.message, again.message) != 0 || ef.timestamp != again.timestamp))
            abort();
        if (r2 == 1)
            free(again.message);
        free(out);
    }
    if (r == 1)
        free(ef.message);
    return 0;
}
