/* tools/errfile.h: torch's error files, as torchrun reads and passes them on.
 *
 * A rank gets TORCHELASTIC_ERROR_FILE, a path of its own per attempt. A Python rank whose
 * entry point torch.distributed.elastic.multiprocessing.errors.record wraps writes its
 * uncaught exception there, as JSON:
 *
 *   {"message": {"message": "ValueError: ...",
 *                "extraInfo": {"py_callstack": "Traceback ...", "timestamp": "1764840000"}}}
 *
 * (or {"message": "text", "timestamp": N} from other writers). At a job's failure
 * tutti-run prints torchrun's summary of the failed ranks from these, the first failure
 * (by timestamp) as the root cause, and copies the root cause's file to its own
 * TORCHELASTIC_ERROR_FILE, when it has one, with the exit code as "errorCode" in the
 * message (torchrun's @record on its main does the same), for a scheduler above. */
#ifndef TT_ERRFILE_H
#define TT_ERRFILE_H

#include <stddef.h>

typedef struct tt_errfile {
    char *message;       /* what the summary shows: the traceback, else the message */
    long long timestamp; /* seconds since the epoch; 0 where the file gives none */
    int plain;           /* the message was a string (shown as it is), not torch's object */
} tt_errfile_t;

/* Reads the error file at path. 1: read (ef->message malloc'd, free it); 0: no file;
 * -1: a file that is not torch's JSON (why says what is wrong). */
int tt_errfile_read(const char *path, tt_errfile_t *ef, char *why, size_t whylen);

/* The same from the len bytes at buf (which need no NUL). */
int tt_errfile_parse(const char *buf, size_t len, tt_errfile_t *ef, char *why, size_t whylen);

/* The error file's len bytes at buf with "errorCode": code added to its message object
 * (unchanged where the message is a string, or code is 0): *out_p (malloc'd, NUL after
 * *outlen_p bytes). 0, or -1 with errno (EINVAL: not torch's JSON). */
int tt_errfile_with_code(const char *buf, size_t len, int code, char **out_p, size_t *outlen_p);

/* Writes to path (replacing it) the error file at from with "errorCode": code added to
 * its message object (kept as it is where the message is a string). 0, or -1 with errno. */
int tt_errfile_pass_on(const char *from, int code, const char *path);

/* Writes to path (replacing it) an error file of torch's form whose message is text. 0,
 * or -1 with errno. */
int tt_errfile_write(const char *path, const char *text, int code);

#endif
